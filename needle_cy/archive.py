"""The ``.cact`` container (spec §2): memory-mapped reader with full validation, writer.

Placeholder while the reader lands: only CQMatrix is defined here yet.
"""
from dataclasses import dataclass

import numpy as np

TERNARY_BITS = 5  # record bits value of the 1.58-bit ternary width


@dataclass(frozen=True, eq=False)
class CQMatrix:
    """A CQ-quantized matrix [rows, cols] (spec §3.3–§3.5), usually viewing the mmap.

    packed: uint8 [rows, row_bytes], LSB-first fields of ``field_bits`` each.
    norms: float16 [rows, n_groups], one norm per group of ``group_size`` columns.
    codebook: float32 lookup indexed by the RAW field value (ternary: [0, +c, 0, −c]).
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
        return self.rows * self.row_bytes + self.rows * self.n_groups * 2

    def __repr__(self):
        bits = "ternary" if self.bits == TERNARY_BITS else f"{self.bits}-bit"
        return f"CQMatrix({self.rows}x{self.cols}, {bits}, group {self.group_size})"
