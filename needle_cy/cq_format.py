"""The CQ format's facts (spec §3.1–§3.4) that the reader, the kernels and the NumPy reference share.

Widths and their field sizes, group sizes, the §3.2 codebooks, ``CQMatrix`` (a packed matrix,
validated once because the kernels index it without bounds checks) and the blob length of a
CQ record.  A leaf module: it imports only ``numpy``, so ``archive`` and ``reference.cq`` both
import it and neither imports the other at import time.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

TERNARY_BITS = 5  # record bits value of the 1.58-bit ternary width

# Lloyd–Max levels of a standard Gaussian (spec §3.2), float64, ascending.  The
# codebook for group size g is float32(level / sqrt(g)), computed in float64.
LLOYD_MAX_LEVELS = {
    2: (-1.5066708475715247, -0.45144060939344055, 0.4529474939511613, 1.5099326242547164),
    3: (-2.141247862845774, -1.3337164609389895, -0.7483982925010272, -0.23774016363616235,
        0.2500446195658646, 0.7555868210708537, 1.3379826350451236, 2.1476362705161423),
    4: (-2.709990028558534, -2.0444556051349227, -1.5947570221842273, -1.233336191082712,
        -0.9222139662739897, -0.6395373737252813, -0.37266394934485414, -0.11445072030649898,
        0.14380628677643073, 0.4039889754802918, 0.6726933686864701, 0.9614053009735016,
        1.2755257831234952, 1.6370587960592824, 2.0844263722579237, 2.7410141261982846),
}
BINARY_LEVEL = math.sqrt(2.0 / math.pi)  # E|x| of a standard Gaussian
TERNARY_LEVEL = 1.2240064                # spec §3.2, "1.58-bit"
SUPPORTED_BITS = (1, 2, 3, 4, TERNARY_BITS)


def check_group_size(group_size):
    """Group sizes are powers of two with whole bytes per group at every width."""
    g = int(group_size)
    if g < 8 or g & (g - 1):
        raise ValueError(f"CQ group size must be a power of two >= 8, got {group_size}")
    return g


def field_bits_of(bits):
    """Bits per stored field: the width itself, or 2 for ternary (bits = 5)."""
    if bits not in SUPPORTED_BITS:
        raise ValueError(f"CQ width must be one of {SUPPORTED_BITS}, got {bits}")
    return 2 if bits == TERNARY_BITS else int(bits)


def sorted_levels(bits, group_size):
    """The distinct codewords of a width, ascending, float32 (what quantize searches)."""
    g = check_group_size(group_size)
    if bits in LLOYD_MAX_LEVELS:
        return (np.array(LLOYD_MAX_LEVELS[bits], np.float64) / math.sqrt(g)).astype(np.float32)
    if bits == 1:
        c = BINARY_LEVEL / math.sqrt(g)
        return np.array([-c, c], np.float64).astype(np.float32)
    if bits == TERNARY_BITS:
        c = TERNARY_LEVEL / math.sqrt(g)
        return np.array([-c, 0.0, c], np.float64).astype(np.float32)
    raise ValueError(f"CQ width must be one of {SUPPORTED_BITS}, got {bits}")


def codebook(bits, group_size):
    """Lookup table indexed by the RAW packed field value (float32).

    Widths 1–4: ``2**bits`` ascending entries (field value = index).  Ternary
    (bits = 5): 4 entries for the 2-bit field read as a signed trit,
    ``[0, +c, 0, -c]`` (field code 2 is never written; it decodes as 0).
    """
    levels = sorted_levels(bits, group_size)
    if bits == TERNARY_BITS:
        minus_c, zero, plus_c = levels
        return np.array([zero, plus_c, zero, minus_c], np.float32)
    return levels


# ---------------------------------------------------------------------------------------
# CQMatrix


@dataclass(frozen=True, eq=False)
class CQMatrix:
    """A CQ-quantized matrix [rows, cols] (spec §3.3–§3.5), usually viewing the mmap.

    packed: uint8 [rows, row_bytes], LSB-first fields of ``field_bits`` each.
    norms: float16 [rows, n_groups], one norm per group of ``group_size`` columns.
    codebook: float32 lookup indexed by the RAW field value (ternary: [0, +c, 0, −c]).
    Arrays read from an archive are copy-on-write views of the file mapping
    (writable, so Cython memoryviews accept them; writes never reach the file).
    """

    rows: int
    cols: int
    bits: int
    group_size: int
    packed: np.ndarray
    norms: np.ndarray
    codebook: np.ndarray

    def __post_init__(self):
        # The Cython kernels index these arrays without bounds checks: refuse any
        # inconsistent combination here, once.
        if self.bits not in (1, 2, 3, 4, TERNARY_BITS):
            raise ValueError(f"CQMatrix bits must be 1, 2, 3, 4 or 5 (ternary), got {self.bits}")
        g = self.group_size
        if g < 8 or g & (g - 1):
            raise ValueError(f"CQMatrix group_size must be a power of two >= 8, got {g}")
        if self.rows < 1 or self.cols < 1:
            raise ValueError(f"CQMatrix shape must be positive, got ({self.rows}, {self.cols})")
        checks = (
            ("packed", self.packed, np.uint8, (self.rows, self.row_bytes)),
            ("norms", self.norms, np.float16, (self.rows, self.n_groups)),
            ("codebook", self.codebook, np.float32, (1 << self.field_bits,)),
        )
        for name, arr, dtype, shape in checks:
            if not isinstance(arr, np.ndarray) or arr.dtype != dtype or arr.shape != shape:
                found = (getattr(arr, "dtype", type(arr).__name__), getattr(arr, "shape", None))
                raise ValueError(f"CQMatrix.{name}: expected {np.dtype(dtype).name} {shape}, found {found}")
            if not arr.flags.c_contiguous:
                raise ValueError(f"CQMatrix.{name} must be C-contiguous")

    @property
    def n_groups(self):
        return -(-self.cols // self.group_size)

    @property
    def cols_padded(self):
        return self.n_groups * self.group_size

    @property
    def field_bits(self):
        return 2 if self.bits == TERNARY_BITS else self.bits

    @property
    def row_bytes(self):
        return self.cols_padded * self.field_bits // 8

    @property
    def nbytes(self):
        """Blob size in the container: packed rows then FP16 norms."""
        return cq_nbytes(self.rows, self.cols, self.bits, self.group_size)

    @property
    def shape(self):
        return (self.rows, self.cols)

    def __repr__(self):
        bits = "ternary" if self.bits == TERNARY_BITS else f"{self.bits}-bit"
        return f"CQMatrix({self.rows}x{self.cols}, {bits}, group {self.group_size})"


def cq_nbytes(rows: int, cols: int, bits: int, group_size: int) -> int:
    """Blob length of a CQ record: out·row_bytes + out·n_groups·2 (spec §2.4)."""
    field_bits = 2 if bits == TERNARY_BITS else bits
    n_groups = -(-cols // group_size)
    return rows * (n_groups * group_size * field_bits // 8) + rows * n_groups * 2
