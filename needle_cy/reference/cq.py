"""CQ quantization in plain NumPy: the executable specification of spec §3.1–§3.6.

A CQ matrix ``W[out, in]`` is stored per row in groups of ``g`` columns (the
last group zero-padded).  Each group ``w`` is rotated by the normalised
Sylvester–Hadamard matrix ``Hg``, split into a norm ``ν = ||w·Hg||`` (stored
FP16) and a unit vector whose elements are each replaced by the index of the
nearest codebook entry (stored bit-packed, LSB-first).  Decoding multiplies the
codewords by the norm and rotates back (``Hg`` is its own inverse).

Everything here is written for clarity, not speed: ``needle_cy._cq`` is the
fast twin and its tests diff against these functions.
"""
import functools
import math

import numpy as np

from ..cq_format import (  # noqa: F401 (the format facts, re-exported: tests and callers read them here)
    BINARY_LEVEL, LLOYD_MAX_LEVELS, SUPPORTED_BITS, TERNARY_BITS, TERNARY_LEVEL, CQMatrix, check_group_size,
    codebook, field_bits_of, sorted_levels,
)

NORM_EPS = 1e-12                          # u = r / max(ν, eps)


def trits_to_fields(trit_index):
    """Ternary sorted index (0 = −c, 1 = 0, 2 = +c) → 2-bit field code (3, 0, 1)."""
    return ((np.asarray(trit_index, np.int64) - 1) & 3).astype(np.uint8)


@functools.lru_cache(maxsize=32)
def _sylvester_signs(g):
    """±1 Sylvester matrix by the doubling rule S_2n = [[S, S], [S, −S]] (read-only, cached)."""
    signs = np.ones((1, 1), np.int8)
    while signs.shape[0] < g:
        signs = np.block([[signs, signs], [signs, -signs]])
    signs.setflags(write=False)
    return signs


def hadamard_matrix(group_size):
    """Sylvester–Hadamard matrix / sqrt(g), float32: Hg[i,j] = (−1)^popcount(i&j)/sqrt(g).

    Natural (Sylvester) order, each entry ±float32(1/sqrt(g)) (spec §3.1).
    """
    g = int(group_size)
    if g < 1 or g & (g - 1):
        raise ValueError(f"Hadamard size must be a power of two, got {group_size}")
    return _sylvester_signs(g) * np.float32(1.0 / math.sqrt(g))


def fwht(x):
    """Normalised fast Walsh–Hadamard transform along the last axis (= x · Hg).

    Computed in float64 butterflies; returns float32 for float32/float16 input,
    float64 otherwise.
    """
    x = np.asarray(x)
    n = x.shape[-1]
    if n < 1 or n & (n - 1):
        raise ValueError(f"fwht length must be a power of two, got {n}")
    out_dtype = np.float32 if x.dtype in (np.float32, np.float16) else np.float64
    y = np.array(x, dtype=np.float64, copy=True)
    lead = y.shape[:-1]
    h = 1
    while h < n:
        # pairs (a, b) at distance h inside blocks of 2h: (a + b, a − b)
        blocks = y.reshape(lead + (n // (2 * h), 2, h))
        a = blocks[..., 0, :].copy()
        b = blocks[..., 1, :]
        blocks[..., 0, :] = a + b
        blocks[..., 1, :] = a - b
        h *= 2
    return (y / math.sqrt(n)).astype(out_dtype)


def pack_indices(fields, bits):
    """Pack raw field values [rows, n] into LSB-first bit streams [rows, n·fb/8] uint8.

    ``fields`` are the values stored in the file (for ternary: the 2-bit codes,
    see ``trits_to_fields``).  Field k of a row occupies bits [k·fb, (k+1)·fb)
    counted from bit 0 of the row's byte 0; equivalently each run of 8 fields is
    OR-ed into an 8·fb-bit word at bit offsets i·fb and emitted as fb
    little-endian bytes (spec §3.4).
    """
    fb = field_bits_of(bits)
    fields = np.asarray(fields)
    if fields.ndim != 2:
        raise ValueError("pack_indices expects a 2-D [rows, n] array")
    rows, n = fields.shape
    if n % 8:
        raise ValueError(f"pack_indices packs runs of 8 fields; {n} is not a multiple of 8")
    if fields.size and (fields.min() < 0 or fields.max() >= (1 << fb)):
        raise ValueError(f"field values must lie in [0, {1 << fb})")
    runs = fields.astype(np.uint32).reshape(rows, n // 8, 8)
    words = (runs << (fb * np.arange(8, dtype=np.uint32))).sum(axis=2, dtype=np.uint32)
    word_bytes = words.astype("<u4").view(np.uint8).reshape(rows, n // 8, 4)
    return np.ascontiguousarray(word_bytes[:, :, :fb]).reshape(rows, n * fb // 8)


def unpack_indices(packed, bits, n=None):
    """Inverse of ``pack_indices``: raw field values [rows, n] (uint8) of a packed array."""
    fb = field_bits_of(bits)
    packed = np.asarray(packed, dtype=np.uint8)
    if packed.ndim != 2:
        raise ValueError("unpack_indices expects a 2-D [rows, row_bytes] array")
    rows, row_bytes = packed.shape
    if row_bytes % fb:
        raise ValueError(f"{row_bytes} bytes per row are not whole runs of {fb} bytes")
    total = row_bytes * 8 // fb
    n = total if n is None else int(n)
    if n > total:
        raise ValueError(f"{row_bytes} bytes hold {total} fields of {fb} bits, asked for {n}")
    runs = packed.reshape(rows, row_bytes // fb, fb).astype(np.uint32)
    words = (runs << (8 * np.arange(fb, dtype=np.uint32))).sum(axis=2, dtype=np.uint32)
    fields = (words[:, :, None] >> (fb * np.arange(8, dtype=np.uint32))) & ((1 << fb) - 1)
    return fields.reshape(rows, total)[:, :n].astype(np.uint8)


def nearest_index(u, levels):
    """Index of the nearest level (ascending ``levels``); ties go to the lower index.

    ``pos`` = left-bisection position (the number of levels strictly below u);
    the candidates are levels[pos−1] and levels[pos], clamped into range; the
    left one wins when it is no farther.
    """
    levels = np.asarray(levels, np.float32)
    u = np.asarray(u, np.float32)
    pos = np.zeros(u.shape, np.int16)
    for level in levels:               # ≤ 16 vectorised compares beat a per-element bisection
        pos += u > level
    left = np.clip(pos - 1, 0, len(levels) - 2)
    right = left + 1
    pick_left = np.abs(u - levels[left]) <= np.abs(u - levels[right])
    return np.where(pick_left, left, right)


def quantize(W, bits, group_size=128):
    """Encode a float matrix [rows, cols] as a CQMatrix (spec §3.3), like the exporter.

    Vectorised over all groups of a block of rows (no Python loop per group).
    """
    W = np.asarray(W, dtype=np.float32)
    if W.ndim != 2:
        raise ValueError(f"quantize expects a 2-D [rows, cols] matrix, got shape {W.shape}")
    if not np.isfinite(W).all():
        raise ValueError("quantize: matrix contains NaN or infinity")
    g = check_group_size(group_size)
    fb = field_bits_of(bits)
    rows, cols = W.shape
    if rows < 1 or cols < 1:
        raise ValueError(f"quantize: empty matrix {W.shape}")
    n_groups = -(-cols // g)
    cols_padded = n_groups * g
    levels = sorted_levels(bits, g)
    Hg = hadamard_matrix(g)

    packed = np.empty((rows, cols_padded * fb // 8), np.uint8)
    norms = np.empty((rows, n_groups), np.float16)
    block = max(1, (1 << 21) // cols_padded)  # rows per block: bounds temporary memory
    for r0 in range(0, rows, block):
        r1 = min(rows, r0 + block)
        w = np.zeros((r1 - r0, cols_padded), np.float32)
        w[:, :cols] = W[r0:r1]
        groups = w.reshape(-1, g)                         # [blockrows·n_groups, g]
        rotated = groups @ Hg                             # r = w·Hg, float32
        nu = np.sqrt(np.sum(rotated * rotated, axis=1, dtype=np.float32))
        unit = rotated / np.maximum(nu, np.float32(NORM_EPS))[:, None]
        index = nearest_index(unit, levels)
        fields = trits_to_fields(index) if bits == TERNARY_BITS else index.astype(np.uint8)
        packed[r0:r1] = pack_indices(fields.reshape(r1 - r0, cols_padded), bits)
        if nu.max() > np.finfo(np.float16).max:
            raise ValueError("quantize: a group norm overflows float16 (|w| too large)")
        norms[r0:r1] = nu.astype(np.float16).reshape(r1 - r0, n_groups)
    return CQMatrix(rows=rows, cols=cols, bits=int(bits), group_size=g,
                    packed=packed, norms=norms, codebook=codebook(bits, g))


def _scaled_codewords(W, row_ids=None):
    """ν · cb[field] for the selected rows: float32 [n, n_groups, g]."""
    packed = W.packed if row_ids is None else W.packed[row_ids]
    norms = W.norms if row_ids is None else W.norms[row_ids]
    fields = unpack_indices(packed, W.bits, W.cols_padded)
    u = W.codebook[fields].reshape(len(packed), W.n_groups, W.group_size)
    return norms.astype(np.float32)[:, :, None] * u


def dequantize_rows(W, ids):
    """Decode selected rows (an embedding gather): float32 [len(ids), cols] (spec §3.5)."""
    ids = np.asarray(ids, dtype=np.int64).reshape(-1)
    if ids.size and (ids.min() < 0 or ids.max() >= W.rows):
        raise IndexError(f"row ids must lie in [0, {W.rows})")
    scaled = _scaled_codewords(W, ids)
    rows = scaled @ hadamard_matrix(W.group_size)      # w = (ν·u)·Hg, float32 like the exporter's reader
    return np.ascontiguousarray(rows.reshape(len(ids), W.cols_padded)[:, : W.cols])


def dequantize(W):
    """Decode the whole matrix: float32 [rows, cols]."""
    return dequantize_rows(W, np.arange(W.rows))


def _rotated_input(W, X):
    """X [T, cols] zero-padded to cols_padded, every group rotated: float64 [T, n_groups, g]."""
    X = np.asarray(X, dtype=np.float64)
    T = X.shape[0]
    padded = np.zeros((T, W.cols_padded), np.float64)
    padded[:, : W.cols] = X
    return fwht(padded.reshape(T, W.n_groups, W.group_size))


def matmul(W, X):
    """Y = X · Wᵀ for X [T, cols] → float32 [T, rows], via the rotated input (spec §3.6).

    y[t, r] = Σ_γ ν[r,γ] · Σ_j cb[field[r,γ,j]] · x̃[t,γ,j], accumulated in float64.
    """
    X = np.asarray(X)
    if X.ndim != 2 or X.shape[1] != W.cols:
        raise ValueError(f"matmul expects X of shape [T, {W.cols}], got {X.shape}")
    x_rot = _rotated_input(W, X)
    Y = np.empty((X.shape[0], W.rows), np.float64)
    block = 1024  # rows at a time keeps the decoded codewords small
    for r0 in range(0, W.rows, block):
        ids = np.arange(r0, min(W.rows, r0 + block))
        fields = unpack_indices(W.packed[ids], W.bits, W.cols_padded)
        u = W.codebook[fields].astype(np.float64).reshape(len(ids), W.n_groups, W.group_size)
        per_group = np.einsum("rgj,tgj->trg", u, x_rot)        # Σ_j cb·x̃ per (row, group)
        Y[:, ids] = np.einsum("trg,rg->tr", per_group, W.norms[ids].astype(np.float64))
    return Y.astype(np.float32)


def matvec(W, x):
    """y = W · x for x [cols] → float32 [rows]."""
    x = np.asarray(x)
    if x.ndim != 1 or x.shape[0] != W.cols:
        raise ValueError(f"matvec expects x of shape [{W.cols}], got {x.shape}")
    return matmul(W, x[None, :])[0]


# ---------------------------------------------------------------------------
# the integer kernels' numerics (A8 inputs; _cq's csrc/cq_int_avx512_tmpl.h / csrc/cq_neon_tmpl.h)
# ---------------------------------------------------------------------------

def int_tables(W):
    """The integer kernels' codebook as exact integers C_k = hi_k·B + lo_k ≈ cb_k·2^E.

    Returns (hi, lo, B, E) as _cq.CQWeight sizes them, or None for a group size
    without tables (outside 16/width … 256; 3-bit fields count as 4-bit nibbles).
    B and E are the largest that keep every lane's int32 sum between two
    conversions to float (a group, or a chunk of 256/width fields) from overflowing
    with |z| ≤ 127·g."""
    fb = field_bits_of(W.bits)
    int_fb = 4 if fb == 3 else fb
    g = W.group_size
    if not 16 // int_fb <= g <= 256:
        return None
    C, steps = 256 // int_fb, 8 // int_fb
    per = g // C if g >= C else 1
    products = 2 * steps * per            # int32 products a lane sums between conversions
    M = min(16384, (2 ** 31 - 1) // (products * 127 * g))
    B = 1 << M.bit_length()
    cb = np.asarray(W.codebook, np.float64)
    top = float(np.abs(cb).max())
    E = 0 if top == 0 else int(math.floor(math.log2((M - 1) * B / top)))
    code = np.rint(np.ldexp(cb, E))
    hi = np.rint(code / B)
    return hi.astype(np.int64), (code - hi * B).astype(np.int64), B, E


def a8_codes(x):
    """(k, s) with x = k·s, k integers |k| ≤ 127, s = max|x|/127 (float32, as the kernels
    recover them), or None when x is not such a vector (within max|x|·2⁻²⁰; NaN/inf)."""
    x = np.asarray(x, np.float32)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        amax = np.float32(np.abs(x).max()) if x.size else np.float32(0)
        s = amax / np.float32(127) if amax > 0 else np.float32(1)
        k = np.rint(x / s)
        ok = (np.abs(k) <= 127) & (np.abs(x - k * s) <= amax * np.float32(2.0 ** -20))
    return (k.astype(np.int64), np.float32(s)) if ok.all() else None


def _fma32(a, b, c):
    """float32 fma(a, b, c) = a·b + c rounded once: the float64 product is exact (48
    bits); the float64 sum is rounded to odd (TwoSum gives its error), after which the
    rounding to float32 is the correct one."""
    p = np.asarray(a, np.float64) * np.asarray(b, np.float64)
    c = np.asarray(c, np.float64)
    s = p + c
    bp = s - p
    err = (p - (s - bp)) + (c - bp)
    even = (s.view(np.int64) & 1) == 0
    s = np.where((err != 0) & even, np.nextafter(s, np.where(err > 0, np.inf, -np.inf)), s)
    return s.astype(np.float32)


def matmul_int(W, X):
    """Y = X · Wᵀ as the integer kernels compute it for A8 rows of X, bit for bit (float32 [T, rows]).

    Every token x = s·k (a8_codes) is rotated exactly, z = k·(Hg·√g) per group
    (integers, |z| ≤ 127·g).  A chunk of C = 256/w fields (w the field width; 3-bit
    fields as 4-bit nibbles) has 16 lanes of 16/w consecutive fields.  Per lane and
    per flush (a group, or a chunk where a chunk spans several groups) the exact sums
    ah = Σ hi[i]·z and al = Σ lo[i]·z become float32 once:
        sum = fma(ah, B, al),  total_lane = fma(sum, ν_lane, total_lane);
    the 16 totals are added in the kernels' tree,
        (q0 + q2) + (q1 + q3),  q_i = (t_i + t_{i+8}) + (t_{i+4} + t_{i+12}),
    and times s·(2^−E/√g).  Raises ValueError for a row of X that is not an A8 vector
    or a matrix without integer tables."""
    X = np.asarray(X, np.float32)
    if X.ndim != 2 or X.shape[1] != W.cols:
        raise ValueError(f"matmul_int expects X of shape [T, {W.cols}], got {X.shape}")
    tables = int_tables(W)
    if tables is None:
        raise ValueError(f"group size {W.group_size} at {W.bits} bits has no integer tables")
    hi, lo, B, E = tables
    int_fb = 4 if field_bits_of(W.bits) == 3 else field_bits_of(W.bits)
    g, C = W.group_size, 256 // int_fb
    per = g // C if g >= C else 1
    n_chunks = -(-W.cols_padded // C)
    P = n_chunks * C
    n_flush = n_chunks // per
    lane_fields = 16 // int_fb
    codes = [a8_codes(x) for x in X]
    if any(c is None for c in codes):
        raise ValueError("matmul_int: a row of X is not an A8 vector")
    k = np.zeros((len(X), W.cols_padded), np.int64)
    k[:, : W.cols] = np.stack([c[0] for c in codes]) if len(codes) else k[:, : W.cols]
    z = np.zeros((len(X), P), np.int64)
    z[:, : W.cols_padded] = (k.reshape(len(X), W.n_groups, g) @ _sylvester_signs(g).astype(np.int64)).reshape(len(X), -1)
    fields = np.zeros((W.rows, P), np.int64)
    fields[:, : W.cols_padded] = unpack_indices(W.packed, W.bits, W.cols_padded)
    shape = (n_flush, per, C // lane_fields, lane_fields)   # flush, chunk of it, lane, field of lane
    ah = np.einsum("rfclj,tfclj->trfl", hi[fields].reshape((W.rows,) + shape), z.reshape((len(X),) + shape))
    al = np.einsum("rfclj,tfclj->trfl", lo[fields].reshape((W.rows,) + shape), z.reshape((len(X),) + shape))
    # each lane's norm: the group of its first field
    first = (np.arange(n_flush)[:, None] * per * C + np.arange(16)[None, :] * lane_fields) // g
    norms = np.zeros((W.rows, P // g + 1), np.float32)
    norms[:, : W.n_groups] = W.norms
    nu = norms[:, first]                                    # [rows, flush, lane]
    total = np.zeros((len(X), W.rows, 16), np.float32)
    for f in range(n_flush):
        # ah·B is exact in float32 (B a power of two): fma(ah, B, al) is one rounded sum
        s = ah[:, :, f].astype(np.float32) * np.float32(B) + al[:, :, f].astype(np.float32)
        total = _fma32(s, nu[None, :, f], total)
    q = (total[..., 0:4] + total[..., 8:12]) + (total[..., 4:8] + total[..., 12:16])
    dot = (q[..., 0] + q[..., 2]) + (q[..., 1] + q[..., 3])
    descale = np.float32(math.ldexp(1.0, -E) / math.sqrt(g))
    scale = np.array([c[1] for c in codes], np.float32) * descale
    return (dot * scale[:, None]).astype(np.float32)



# ---------------------------------------------------------------------------
# the tile kernel's numerics (AMX int8 tiles; _cq's csrc/cq_amx.h)
# ---------------------------------------------------------------------------

AMX_CODE_MAX = 127 * 65536 - 32896   # |C| of a codeword such that its top signed byte stays ≤ 127


def amx_applies(bits, group_size):
    """Whether the tile kernel runs a matrix: integer tables exist (int_tables) and a
    group is whole 64-field tile steps, 64 … 256."""
    return group_size in (64, 128, 256) and bits in (1, 2, 3, 4, TERNARY_BITS)


def signed_bytes(v):
    """v = 256·hi + lo with lo a signed byte in [-128, 127] (integers, elementwise)."""
    v = np.asarray(v, np.int64)
    lo = ((v + 128) & 255) - 128
    return (v - lo) >> 8, lo


def amx_tables(W):
    """The tile kernel's codebook as integers C_k = rint(cb_k·2^E) = c2·2^16 + c1·2^8 + c0,
    three signed bytes (c2, c1, c0 arrays over the codewords) and E, the largest with
    max|C| ≤ AMX_CODE_MAX (≥ 23 significant bits)."""
    cb = np.asarray(W.codebook, np.float64)
    top = float(np.abs(cb).max()) if cb.size else 0.0
    E = 0 if top == 0 else int(math.floor(math.log2(AMX_CODE_MAX / top)))
    C = np.rint(np.ldexp(cb, E)).astype(np.int64)
    r, c0 = signed_bytes(C)
    c2, c1 = signed_bytes(r)
    return c2, c1, c0, E


def _rotated_a8_tokens(name, W, X, applies, kernel):
    """The A8 tokens of X rotated exactly per group, for the lookup and tile numerics:
    (z [T, n_groups, g] int64, s [T] float32 A8 scales).  ValueError where X is not
    [T, cols], the kernel (named `kernel`) does not run W (`applies`) or a row is not
    an A8 vector."""
    X = np.asarray(X, np.float32)
    if X.ndim != 2 or X.shape[1] != W.cols:
        raise ValueError(f"{name} expects X of shape [T, {W.cols}], got {X.shape}")
    if not applies(W.bits, W.group_size):
        raise ValueError(f"the {kernel} kernel does not run {W.bits}-bit rows in groups of {W.group_size}")
    codes = [a8_codes(x) for x in X]
    if any(c is None for c in codes):
        raise ValueError(f"{name}: a row of X is not an A8 vector")
    T, g = len(X), W.group_size
    k = np.zeros((T, W.cols_padded), np.int64)
    if T:
        k[:, : W.cols] = np.stack([c[0] for c in codes])
    z = (k.reshape(T, W.n_groups, g) @ _sylvester_signs(g).astype(np.int64)).reshape(T, W.n_groups, g)
    return z, np.array([c[1] for c in codes], np.float32)


def matmul_amx(W, X):
    """Y = X · Wᵀ as the tile kernel (AMX) computes it for A8 rows of X, bit for bit (float32 [T, rows]).

    Every token x = s·k (a8_codes) is rotated exactly, z = k·(Hg·√g) per group
    (integers, |z| ≤ 127·g), and split into signed bytes z = 256·zh + zl (signed_bytes);
    each codeword C = c2·2^16 + c1·2^8 + c0 (amx_tables).  Per group the four exact sums
        T3 = Σ zh·c2,  T2 = Σ zh·c1 + zl·c2,  T1 = Σ zh·c0 + zl·c1,  T0 = Σ zl·c0
    (int8 tile products into int32) become U = 256·T3 + T2 and V = 256·T1 + T0 (int32), then
        sum = fma(float32(U), 2^16, float32(V)),   acc = fma(sum, ν, acc)
    over the groups in order, and y = acc · float32(s · float32(2^-E/√g)).  Raises
    ValueError for a row of X that is not an A8 vector or a matrix the kernel does not
    run (amx_applies)."""
    z, s = _rotated_a8_tokens("matmul_amx", W, X, amx_applies, "tile")
    T, g, n_groups = len(z), W.group_size, W.n_groups
    zh, zl = signed_bytes(z)
    c2, c1, c0, E = amx_tables(W)
    fields = unpack_indices(W.packed, W.bits, W.cols_padded).astype(np.int64).reshape(W.rows, n_groups, g)
    w2, w1, w0 = c2[fields], c1[fields], c0[fields]

    def dot(a, b):                        # [T, n_groups, g] · [rows, n_groups, g] -> [T, rows, n_groups]
        return np.einsum("tgj,rgj->trg", a, b)
    T3 = dot(zh, w2)
    T2 = dot(zh, w1) + dot(zl, w2)
    T1 = dot(zh, w0) + dot(zl, w1)
    T0 = dot(zl, w0)
    U = (256 * T3 + T2).astype(np.float32)
    V = (256 * T1 + T0).astype(np.float32)
    sums = _fma32(U, np.float32(65536), V)
    norms = np.asarray(W.norms, np.float32)[:, :n_groups]
    acc = np.zeros((T, W.rows), np.float32)
    for gi in range(n_groups):
        acc = _fma32(sums[:, :, gi], norms[None, :, gi], acc)
    descale = np.float32(math.ldexp(1.0, -E) / math.sqrt(g))
    scale = (s * descale).astype(np.float32)
    return (acc * scale[:, None]).astype(np.float32)

# ---------------------------------------------------------------------------
# the lookup kernels' numerics (2- and 4-bit fields, A8 inputs; _cq's csrc/cq_lut.h, csrc/cq_lut_avx2.h)
# ---------------------------------------------------------------------------

def lut_applies(bits, group_size):
    """Whether the lookup kernels (avx512lut, avx2lut) run a matrix of this width and group size:
    2-bit fields (2 bits or ternary) or 4-bit ones (4 bits, and 3 bits as the integer
    path's nibbles), and a group of whole dwords, 16 … 256."""
    return bits in (2, 3, 4, TERNARY_BITS) and 16 <= group_size <= 256


def lut_nibble_bits(bits):
    """The field width the lookups read a matrix in: 2 (a nibble of the row is a pair of
    fields) or 4 (a nibble is one field; 3-bit rows are read as nibbles)."""
    return 2 if field_bits_of(bits) == 2 else 4


def lut_table_scale(z, codebook, fb=2):
    """The lookup kernel's table scale S = 2^k of one token's rotated codes z (float32
    integers): the largest power of two with max|cb| · M · S ≤ 32767, k within
    [-126, 100]; 1 when max|cb| · M is 0.  M is the largest |z| a table entry scales:
    max over the pairs of |z[2p]| + |z[2p+1]| for 2-bit fields (fb 2), max_j |z[j]| for
    4-bit ones (fb 4).  So every table entry rint(f·S) fits an int16 (|f| ≤ max|cb|·M,
    to float32 rounding)."""
    z = np.asarray(z, np.float32)
    if not z.size:
        m = 0.0
    elif fb == 2:
        m = float(np.max(np.abs(z[0::2]) + np.abs(z[1::2])))
    else:
        m = float(np.max(np.abs(z)))
    cbmax = float(np.max(np.abs(np.asarray(codebook, np.float32)[:16])))
    if not (m > 0 and cbmax > 0):
        return np.float32(1.0)
    e = math.frexp(32767.0 / (cbmax * m))[1] - 1            # 2^e ≤ limit < 2^(e+1)
    return np.float32(2.0 ** min(max(e, -126), 100))


def matmul_lut(W, X):
    """Y = X · Wᵀ as the lookup kernel computes it for A8 rows of X, bit for bit (float32 [T, rows]).

    Every token x = s·k (a8_codes) is rotated exactly, z = k·(Hg·√g) per group (integers,
    exact as float32).  Each nibble of a row reads its token's int16 table entry: at 2
    bits the pair p (fields 2p, 2p+1, raw values a and b)
        q = rint(fma(cb[b], z[2p+1], cb[a]·z[2p]) · S),
    at 4 bits (and 3) the field j (raw value a)
        q = rint((cb[a]·z[j]) · S),
    S = lut_table_scale(z, cb, fb) = 2^k; per group the entries are summed exactly, then
        acc = fma(ν, float32(Σ q), acc) over the groups in order,
        y = acc · ((s · float32(1/√g)) · 2^-k).
    Raises ValueError for a row of X that is not an A8 vector or a matrix the kernel
    does not run (lut_applies)."""
    z, s = _rotated_a8_tokens("matmul_lut", W, X, lut_applies, "lookup")
    T, g, n_groups = len(z), W.group_size, W.n_groups
    fb = lut_nibble_bits(W.bits)
    z = z.reshape(T, -1).astype(np.float32)
    fields = unpack_indices(W.packed, W.bits, W.cols_padded).astype(np.int64)
    cb = np.zeros(16, np.float32)
    cb[: len(W.codebook)] = np.asarray(W.codebook, np.float32)
    S = np.array([lut_table_scale(zt, cb, fb) for zt in z], np.float32).reshape(T, 1, 1)
    if fb == 2:
        low = cb[fields[:, 0::2]][None] * z[:, None, 0::2]                 # [T, rows, pairs], float32
        f = _fma32(cb[fields[:, 1::2]][None], z[:, None, 1::2], low)
    else:
        f = cb[fields][None] * z[:, None, :]                               # [T, rows, fields], float32
    q = np.rint(f * S).astype(np.int64)                                    # exact: S is a power of two
    per = g * fb // 4                                                      # nibbles per group
    sums = q.reshape(T, W.rows, n_groups, per).sum(axis=3).astype(np.float32)   # exact (< 2^24)
    norms = np.asarray(W.norms, np.float32)
    acc = np.zeros((T, W.rows), np.float32)
    for gi in range(n_groups):
        acc = _fma32(norms[None, :, gi], sums[:, :, gi], acc)
    descale = np.float32(1.0 / math.sqrt(g))
    scale = (s * descale) * (np.float32(1.0) / S[:, 0, 0])
    return (acc * scale[:, None]).astype(np.float32)
