# cython: language_level=3
"""Packed CQ matrix products (spec §3.6): y = W·x and Y = X·Wᵀ without dequantizing W.

For every input group γ the activation is rotated once, x̃_γ = Hg·x_γ (a fast
Walsh–Hadamard transform shared by all rows), and then

    y_r = Σ_γ ν_rγ · Σ_j cb[i_rγj] · x̃_γ[j]

is evaluated directly on the packed indices.  The NumPy twin is
``needle_cy.reference.cq``; tests diff the two.

Three inner loops:

* AVX2 (x86-64 CPUs with AVX2+FMA, detected at run time; compiled with a target
  attribute so a portable build has it too).  The codebook lives in a register
  and one permute turns eight packed indices into eight codewords.  A 32-byte
  chunk of a row is loaded as eight 32-bit lanes; lane l holds F consecutive
  fields (F = 32/bits; at 3 bits each 3-byte run of 8 fields is spread into a
  lane first).  Step s shifts every lane right by s·bits so its low bits are
  field s, and the permute (which reads only the low bits) looks the codeword
  up: ``vpermilps`` at 1/2 bits and ternary (the codebook repeated), ``vpermps``
  at 3 bits.  At 1/2 bits, loads at byte offsets 1–3 replace a quarter of the
  shifts.  At 4 bits the lookup is done on bytes instead: the 16 codewords are
  split into four byte planes, four ``vpshufb`` look up 32 nibbles and two
  rounds of unpacks reassemble the floats.  The rotated activation is written
  once per call in the matching lane order (``xp``, a gather through
  ``lane_perm``), so every step is one FMA with a contiguous load.  A lane never
  straddles two groups (F ≤ group size; 32 at 4 bits), so group norms are
  applied per lane once per chunk.  The matmul decodes each step once, scales
  it by the lane norms and reuses it for a block of 8 tokens (8 independent
  accumulators), row blocks of 16 sharing one block of tokens.
  The matvec is bound by the shuffle pipes (at 1/2 bits a step is a permute
  and a shift for 8 MACs, fewer shifts with the offset loads; at 4 bits three
  shuffles); the matmul amortises decoding over 8 tokens and is bound by FMA
  throughput (figures: benchmarks/history/cq.md).
* Integer, for A8 inputs (deploy numerics: every CQ input is an A8 vector
  x = s·k, k int8; the engine marks its views ``a8_input``), x86-64 with
  AVX-512 F/BW/VL (``avx512bw``: vpmaddwd) or + VNNI (``avx512vnni``: vpdpwssd).
  ``cq_rotate`` recovers s = max|x|/127 and k for every token (refusing a chunk
  with any token that is not such a vector: then the float kernels run), rotates
  the codes exactly (z = H·k, |z| ≤ 127·g, int16) and the kernels sum
  Σ C[i_j]·z_j in int32, C_k = cb_k·2^E as two int16 halves hi·B + lo looked up
  with vpermw (csrc/cq_int_avx512_tmpl.h).  A single int16 codebook (16 bits) would be an
  approximation that moves the fixtures' deploy logits by a mean 0.011 (over the
  0.01 bar, measured by rounding the codebooks); the two halves keep ≥ 25 bits,
  so the result equals the float kernels' to float32 rounding (≤ 1e-6 relative
  in the tests).  B and E are sized per matrix so the int32 sums between two
  conversions to float cannot overflow.  3-bit rows are repacked to nibbles once
  (a copy); groups of 16/width … 256 fields have tables.  The A8 check and the
  int16 packing of the rotated codes are AVX-512 too (as scalar loops they were
  a visible part of a decode step).  The matvec prefetches the rows 8 ahead: in the
  model every step streams all matrices from DRAM, and without it the kernel
  waited on memory (whole-model decode gained little over the float kernel).
  The matmul (several tokens: prefill chunks) decodes a row in registers once
  per step for a tile of 6 tokens and sums each (row, token) exactly as the
  matvec does (one lane-sum tree for both), so a token's outputs are bitwise
  the matvec's.  A
  zmm vpdpwssd makes as many int16 products a cycle as two ymm FMAs make float
  products, so with two halves the integer matmul's peak equals the float
  matmul's: it gains by what the float matmul spends around its FMAs, most
  where few tokens share a decode.  The integer matvec is faster than the float
  one at both widths, most at 4 bits, whose float decode costs the most shuffles
  (figures per matrix and for the whole model: benchmarks/history/cq.md).
  ``set_kernel``/``kernel_name``/
  ``available_kernels`` and ``NEEDLE_CY_CQ_KERNEL`` (auto, avx512lut, avx512vnni,
  avxvnni, avx512bw, avx2lut, avx2int, neon_dotprod, neon, avx2, scalar) choose and report.
* Table lookups for 2-bit fields (2 bits and ternary) and 4-bit ones on A8 inputs, AVX-512
  (csrc/cq_lut.h, row loops in csrc/cq_lut_rows_tmpl.h; kernel ``avx512lut``, what 'auto'
  takes on AVX-512 CPUs; the other matrices then run on avx512vnni, else avx512bw:
  ``lut_base_kernel``).  Per token every pair of rotated codes gets a 16-entry table
  of its codewords' products, fma(cb[b], z[2p+1], cb[a]·z[2p]) (T-MAC style), rounded
  to int16 at one power-of-two scale per token (reference.cq.lut_table_scale); one
  vpermw on the packed nibbles looks up 16 rows × 4 fields (two pairs' tables side by
  side), and vpdpwssd against ones (vpmaddwd + vpaddd without VNNI: ``lut_dot``) adds
  them into exact int32 group sums.  With AVX-512 VBMI the matvec splits each entry
  into its low and high bytes (csrc/cq_lut_bytes_tmpl.h): one vpermb looks up 16 rows × 4
  nibbles from four nibbles' tables side by side, vpdpbusd against ones adds them, and
  Σ q = 256·Σ hi + Σ lo is the same exact sum with 11 instructions per 16 rows × 8
  nibbles instead of 16 (faster on every matvec shape; benchmarks/history/cq.md);
  the matmul keeps the int16 tiles.  The rows are re-laid out at load in 16-row
  blocks of interleaved dwords (``CQWeight.enable_lut``; a copy as large as the packed
  rows, on huge pages in the engine's ``LutArena``; the .cact mapping is left alone).
  Its own numerics (reference.cq.matmul_lut, bit for bit): per group
  fma(ν, float(Σ entries), acc), then times s·descale·2^-k; the table rounding is
  ~1e-5 of a row's value.  The 2-bit Lloyd–Max codebook is not symmetric (cb0 + cb3
  ≠ 0), so integer sign-plane tables would not be exact.  Matrices of fewer than
  LUT_MIN_ROWS (64) rows keep the integer kernel: a token's tables cost what two or
  three 16-row blocks of lookups save.  cq_rotate makes one token's tables (in the
  decode step each thread its own); the matmul makes each tile of 4 tokens' tables
  in the thread's scratch, once for a list of products
  (``cq_matmul_rotated_rows_list``).  Several times the avx512vnni kernel's speed
  on the large matrices, and faster than float32 tables at half their bytes
  (benchmarks/history/cq.md).
  4-bit fields (4 bits, and 3 bits as the integer path's nibbles) take the same row
  loops: a nibble is one field, its table the 16 products cb[a]·z[j] (the scale from
  max|z|), one vpermw looks up 16 rows × 2 fields, faster than avx512vnni from
  cache and a little faster on the DRAM-bound 16384-row head.  The table
  rounding (~1e-4 of a row's value, where the two-product kernel is exact to float32)
  is amplified by the A8 roundings downstream of every body matrix, so the engine
  gives 4-bit matrices the layout only for the head (see _model.pyx's _view).
* Table lookups with AVX2 (csrc/cq_lut_avx2.h; kernel ``avx2lut``, what 'auto' takes on
  x86-64 CPUs with AVX2+FMA and without AVX-512 BW): the lookup kernel's numerics
  (reference.cq.matmul_lut) bit for bit, the same int16 table entries split into a low and a
  high byte, each a 16-byte vpshufb table.  The rows are re-laid out in 32-row blocks,
  the 32 rows' bytes of each packed byte side by side: the low and high nibbles of one
  byte vector index four vpshufb that look up 32 rows × 4 fields (2 at 4 bits), and the
  bytes are summed exactly down the rows' lanes in int16 words (vpaddw, vpmaddubsw)
  before the int32 group sums.  Its other matrices (other widths, fewer than LUT_MIN_ROWS
  rows, the engine's 3- and 4-bit body) run on the float kernels (``lut_base_kernel('avx2lut')``;
  ``set_avx2lut_base('avx2int')`` for the integer numerics).  Its matvec is about twice the
  float kernel's speed at 2 and at 4 bits, and whole-model decode is faster at both widths
  (at 4 bits only the head has the layout), prefill no slower (benchmarks/history/cq.md).
* Integer with 256-bit vectors (csrc/cq_int_avx2_tmpl.h), for x86-64 CPUs without AVX-512:
  ``avx2int`` (AVX2+FMA: vpmaddwd + vpaddd) and ``avxvnni`` (VEX vpdpwssd; cpuid
  leaf 7 subleaf 1 EAX bit 4; compiled where the compiler knows AVX-VNNI).  The
  same numbers as the AVX-512 kernels, bit for bit (tested): the same codes in the
  same order, the same 16 int32 lanes per chunk, conversions, FMAs and lane-sum
  tree.  Without vpermw the two int16 codebook halves are split into byte planes
  looked up with vpshufb: a half chunk (16 bytes) broadcast to both 128-bit lanes
  looks up hi in one lane and lo in the other, two unpacks rebuild the words, and
  the codes are loaded with vbroadcasti128 to match (per 32 fields: 8 shuffles,
  2 shifts/ands, 4 vpmaddwd + 4 vpaddd, or 4 vpdpwssd).  Running AVX2 code
  that is more work than the float kernel's decode at 4 bits (12 shuffles +
  4 FMAs) and much more at 2 bits (vpermilps, 8 fields a permute), and the matmul
  needs two int16 products and an add per MAC where the float one needs one FMA:
  measured slower than the float kernels in decode and prefill
  (benchmarks/history/cq.md), so 'auto' does not take them (``AUTO_INT256``,
  ``pick_int_kernel``: avx2lut instead); forced by name they run.  avxvnni is compiled and its
  selection tested, but no CPU it was measured on has AVX-VNNI.
* Integer on aarch64, the same numerics bit for bit (csrc/cq_neon_tmpl.h; the
  reference's ``matmul_int`` is their executable specification and every integer
  kernel is tested against it): ``neon`` on every ARMv8-A core (byte-plane
  lookups with vqtbl1q, the int16 halves by a zip, vmlal_s16), ``neon_dotprod``
  where the CPU reports asimddp (getauxval; the build stays -march=armv8-a, the
  kernel has a function target attribute): both factors split into signed
  bytes, ah = 65536·Σhh·zh + 256·(Σhh·zl + Σhl·zh) + Σhl·zl with sdot.  The
  matmul shares each decoded step between 2 tokens.  Measured only under qemu
  (correctness; no speed figures from emulation).
* Portable scalar Cython (any CPU, any width, any group size ≥ 8): byte-wise
  decoding with codebook lookups, one group at a time; the matmul decodes a
  group's codewords once (a stack buffer) and reuses them for every token.

The FWHT is a butterfly loop (AVX2: 128-point blocks in registers).  A forward
pass that multiplies one input by several matrices (q/k/v/gate; the three mHC
Φ) rotates it once: ``cq_rotate`` + ``cq_matvec_rotated``/``cq_matmul_rotated``
in the C surface, ``multiply_shared`` in Python.

Norms are converted from FP16 to float32 once, when a matrix is prepared
(``prepare``): the kernels read a float32 copy padded per row (4 bytes per
group, i.e. 1/32 bit per weight at g = 128) instead of converting on the fly.
``prepare`` caches the prepared ``CQWeight`` per ``CQMatrix`` (weakly), so the
Python-level ``matvec``/``matmul`` pay the conversion once per matrix.
"""
import math
import os
import weakref

import numpy as np
cimport numpy as cnp
from cython.parallel cimport prange, parallel, threadid
from libc.stdint cimport uint8_t, uint32_t, int8_t, int16_t, int64_t, uintptr_t
from libc.math cimport rintf, fabsf, fmaf
from libc.stdlib cimport malloc, free
from libc.string cimport memcpy, memset

from .threads import get_num_threads
from needle_cy._parallel cimport nc_team_size

cnp.import_array()

# The kernels in C (needle_cy/csrc/): cq_dispatch.h includes every kernel header and
# holds the run-time choice of kernel; the declarations below are what _cq calls.
cdef extern from "csrc/cq_dispatch.h":
    int nc_cq_cpu_has_avx2() nogil
    int nc_cq_simd_enabled
    int nc_cq_use_simd(int view_simd) noexcept nogil
    void nc_cq_gather_chunks(const float* xt, float* xp, const int* perm,
                             Py_ssize_t C, Py_ssize_t n_chunks) noexcept nogil
    void nc_cq_avx2_rows_dot(const uint8_t* packed, Py_ssize_t row_bytes, const uint8_t* end,
                             const float* norms, Py_ssize_t norm_stride, const float* xp,
                             Py_ssize_t n_chunks, int fb, int g, const float* table,
                             Py_ssize_t r0, Py_ssize_t r1, float* y) noexcept nogil
    void nc_cq_avx2_row_tokens(const uint8_t* row, const uint8_t* end, const float* nrow,
                               const float* xp, Py_ssize_t xp_stride, Py_ssize_t n_chunks,
                               int fb, int g, const float* table, int nt,
                               float* y, Py_ssize_t y_stride) noexcept nogil
    void nc_cq_avx2_decode_scaled(const uint8_t* row, const uint8_t* end, const float* nrow,
                                  Py_ssize_t c0, Py_ssize_t nc, int fb, int g, const float* table,
                                  float* out) noexcept nogil
    void nc_cq_dot_tiles(const float* wd, Py_ssize_t ws, int nr, const float* x, Py_ssize_t xs,
                         int nt, Py_ssize_t n_vec, float* tile, Py_ssize_t ts) noexcept nogil
    int nc_cq_cpu_has_avx512bw() nogil
    int nc_cq_cpu_has_avx512vnni() nogil
    int nc_cq_cpu_has_avxvnni() nogil
    int nc_cq_pick_int_kernel(int avx512bw, int avx512vnni, int avxvnni, int avx2fma, int int256) noexcept nogil
    int NC_CQ_AUTO_INT256
    int nc_cq_cpu_has_neon() nogil
    int nc_cq_cpu_has_neon_dotprod() nogil
    int nc_cq_int_kernel
    int NC_CQ_HAVE_LUT
    int nc_cql_dot
    int nc_cq_cpu_has_avx512vbmi() nogil
    int nc_cql_dot_mode() nogil
    int nc_cq_lut_base() noexcept nogil
    void nc_cql_relayout(const uint8_t* packed, Py_ssize_t row_bytes, Py_ssize_t rows, Py_ssize_t n_dw,
                         const float* norms, Py_ssize_t norm_stride, Py_ssize_t n_groups,
                         uint32_t* bits, float* pnorms) noexcept nogil
    void nc_cql_tables(const float* kf, Py_ssize_t n, const float* codebook, int fb, float* tab) noexcept nogil
    void nc_cql_rows(const uint32_t* bits, const float* pnorms, Py_ssize_t n_dw, Py_ssize_t n_groups,
                     int g, int fb, const float* tab, float scale, Py_ssize_t r0, Py_ssize_t r1, float* y) noexcept nogil
    void nc_cql_mm_rows(const uint32_t* bits, const float* pnorms, Py_ssize_t n_dw, Py_ssize_t n_groups,
                        int g, int fb, const float* kf, Py_ssize_t kf_stride, const float* codebook,
                        Py_ssize_t n_tokens, const float* s, float descale, Py_ssize_t r0, Py_ssize_t r1,
                        float* Y, Py_ssize_t y_stride, float* scratch, Py_ssize_t scratch_floats) noexcept nogil
    Py_ssize_t nc_cql_tile_tokens(Py_ssize_t n_dw, Py_ssize_t scratch_floats) noexcept nogil
    void nc_cql_tile_tables(const float* kf, Py_ssize_t kf_stride, Py_ssize_t n_dw, const float* codebook,
                            int fb, int nt, float* tab) noexcept nogil
    void nc_cql_tile_rows(const uint32_t* bits, const float* pnorms, Py_ssize_t n_dw, Py_ssize_t n_groups,
                          int g, int fb, const float* tab, int nt, const float* s, float descale,
                          Py_ssize_t r0, Py_ssize_t r1, float* Y, Py_ssize_t y_stride) noexcept nogil
    int NC_CQ_HAVE_LUT_AVX2
    int nc_cq_avx2lut_base
    void nc_cqs_relayout(const uint8_t* packed, Py_ssize_t row_bytes, Py_ssize_t rows,
                         const float* norms, Py_ssize_t norm_stride, Py_ssize_t n_groups,
                         uint8_t* bits, float* pnorms) noexcept nogil
    void nc_cqs_tables(const float* kf, Py_ssize_t n, const float* codebook, int fb, float* tab) noexcept nogil
    void nc_cqs_rows(const uint8_t* bits, const float* pnorms, Py_ssize_t n_dw, Py_ssize_t n_groups,
                     int g, int fb, const float* tab, float scale, Py_ssize_t r0, Py_ssize_t r1, float* y) noexcept nogil
    void nc_cqs_mm_rows(const uint8_t* bits, const float* pnorms, Py_ssize_t n_dw, Py_ssize_t n_groups,
                        int g, int fb, const float* kf, Py_ssize_t kf_stride, const float* codebook,
                        Py_ssize_t n_tokens, const float* s, float descale, Py_ssize_t r0, Py_ssize_t r1,
                        float* Y, Py_ssize_t y_stride, float* scratch, Py_ssize_t scratch_floats) noexcept nogil
    Py_ssize_t nc_cqs_tile_tokens(Py_ssize_t n_dw, Py_ssize_t scratch_floats) noexcept nogil
    void nc_cqs_tile_tables(const float* kf, Py_ssize_t kf_stride, Py_ssize_t n_dw, const float* codebook,
                            int fb, int nt, float* tab) noexcept nogil
    void nc_cqs_tile_rows(const uint8_t* bits, const float* pnorms, Py_ssize_t n_dw, Py_ssize_t n_groups,
                          int g, int fb, const float* tab, int nt, const float* s, float descale,
                          Py_ssize_t r0, Py_ssize_t r1, float* Y, Py_ssize_t y_stride) noexcept nogil
    int nc_cq_best_int_kernel() noexcept nogil
    int nc_cq_active_int_kernel() noexcept nogil
    int NC_CQ_HAVE_AMX
    int nc_cqa_enabled
    int nc_cqa_cpu_supported() noexcept nogil
    void nc_cqa_pack_token(const float* kf, Py_ssize_t Pa, int8_t* zh, int8_t* zl) noexcept nogil
    Py_ssize_t nc_cqa_scratch_floats(Py_ssize_t n_groups) noexcept nogil
    void nc_cqa_mm_rows(const uint8_t* packed, Py_ssize_t row_bytes, const float* norms,
                        Py_ssize_t norm_stride, Py_ssize_t n_groups, int g, int fb, const int8_t* pieces,
                        const int8_t* zh, const int8_t* zl, Py_ssize_t Pa, Py_ssize_t nt, const float* s,
                        float descale, Py_ssize_t r0, Py_ssize_t r1, float* Y, Py_ssize_t y_stride,
                        float* scratch) noexcept nogil
    void nc_cq_int_rows(int kernel, const uint8_t* packed, Py_ssize_t row_bytes, const uint8_t* end,
                        const float* norms, Py_ssize_t norm_stride, const int16_t* z,
                        Py_ssize_t n_chunks, int fb, int g, const int16_t* table, float base,
                        float scale, Py_ssize_t r0, Py_ssize_t r1, float* y) noexcept nogil
    int nc_cq_int_a8_codes(int kernel, const float* x, Py_ssize_t n, float* kf, float* s) noexcept nogil
    void nc_cq_int_pack_codes(int kernel, const float* kf, Py_ssize_t n_chunks, int fb, int16_t* z) noexcept nogil
    void nc_cq_int_mm_rows(int kernel, const uint8_t* packed, Py_ssize_t row_bytes, const uint8_t* end,
                           const float* norms, Py_ssize_t norm_stride, const int16_t* z,
                           Py_ssize_t z_stride, Py_ssize_t n_tokens, Py_ssize_t n_chunks, int fb, int g,
                           const int16_t* table, float base, const float* s, float descale,
                           Py_ssize_t r0, Py_ssize_t r1, float* Y, Py_ssize_t y_stride) noexcept nogil


cdef extern from "csrc/wht.h":
    void nc_wht(float* v, Py_ssize_t n, float scale, int simd) noexcept nogil

TERNARY_BITS = 5
# Below this many multiply–adds per thread an OpenMP fork costs more than it saves.
cdef Py_ssize_t MIN_MACS_PER_THREAD = 65536
# Matmul blocking: rows that share one block of rotated tokens while it is in L1/L2.
cdef Py_ssize_t ROW_BLOCK = 16     # the tile in _matmul_rows_simd holds TOKEN_TILE × ROW_BLOCK
cdef enum:
    # compile-time sizes (an enum, not DEF, which Cython 3 deprecates)
    TOKEN_TILE = 64                # tokens per pass over a block of decoded rows (one prefill chunk)
    DECODE_FLOATS = 12288          # decoded-weight buffer: 16 rows × 768 fields (48 KB, per thread on the heap)
    SCRATCH_FLOATS = 4 * (16 + 8 * 768)  # a thread's scratch (cq_decode_scratch): the decode buffer, or
                                   # the lookup tables of a tile of 4 tokens (a 16-float header and
                                   # 8 floats per input at 4 bits, 4 at 2 bits; 768 inputs)
cdef Py_ssize_t AMX_MIN_TOKENS = 8   # fewest tokens the tile form takes (a tile holds 16)
cdef long long AMX_CODE_MAX = 127 * 65536 - 32896  # |C| with a top signed byte ≤ 127 (reference.cq)
cdef Py_ssize_t MATVEC_ROW_BLOCK = 32  # rows per parallel task of the matvec
cdef Py_ssize_t SLICE_FIELDS = 768   # matmul column slice (see _matmul_rows_simd)
cdef Py_ssize_t LOW_BIT_DECODE_FIELDS = 384  # widest slice decoded once at 1–2 bits (_decode_once)
cdef Py_ssize_t SCALAR_PIECE = 1024  # stack buffer of the scalar matmul (vals in _matmul_row_scalar)
cdef Py_ssize_t WORK_HEADER = 16     # floats before the rotated tokens in a workspace (64 bytes)


# ---------------------------------------------------------------------------
# rotation (spec §3.1): x̃ = Hg·x per group, shared by every row
# ---------------------------------------------------------------------------

cdef void cq_fwht_scaled(float* v, Py_ssize_t n, float scale) noexcept nogil:
    """In-place Walsh–Hadamard transform (Sylvester order) of length n, times scale
    (csrc/wht.h: the AVX2 path where this module's kernel switch allows it)."""
    nc_wht(v, n, scale, nc_cq_use_simd(1))


cdef inline float _hadamard_scale(int g) noexcept nogil:
    # float32(1/sqrt(g)), the entry magnitude of Hg as the package builds it
    return <float>(1.0 / (<double>g) ** 0.5)


cdef void _rotate_token(const CQView* w, const float* x, float* xt, float* xp,
                        bint simd) noexcept nogil:
    """xt = zero-padded x with every group rotated; xp = xt in the AVX2 lane order."""
    cdef Py_ssize_t g = w.group_size, P = w.padded_len, C = w.chunk_fields
    cdef Py_ssize_t gamma
    cdef float scale = _hadamard_scale(w.group_size)
    memcpy(xt, x, w.cols * sizeof(float))
    memset(xt + w.cols, 0, (P - w.cols) * sizeof(float))
    for gamma in range(w.n_groups):
        cq_fwht_scaled(xt + gamma * g, g, scale)
    if simd:
        nc_cq_gather_chunks(xt, xp, w.lane_perm, C, w.n_chunks)


# ---------------------------------------------------------------------------
# portable scalar inner loops
# ---------------------------------------------------------------------------

cdef inline float _group_dot_scalar(const uint8_t* p, const float* cb, const float* x,
                                    Py_ssize_t g, int fb) noexcept nogil:
    """Σ_j cb[field_j] · x[j] over one group of g fields starting at byte p."""
    cdef float acc0 = 0, acc1 = 0
    cdef Py_ssize_t k
    cdef uint32_t b
    if fb == 4:
        for k in range(g >> 1):
            b = p[k]
            acc0 = acc0 + cb[b & 15] * x[2 * k]
            acc1 = acc1 + cb[b >> 4] * x[2 * k + 1]
    elif fb == 2:
        for k in range(g >> 2):
            b = p[k]
            acc0 = acc0 + cb[b & 3] * x[4 * k] + cb[(b >> 2) & 3] * x[4 * k + 1]
            acc1 = acc1 + cb[(b >> 4) & 3] * x[4 * k + 2] + cb[b >> 6] * x[4 * k + 3]
    elif fb == 1:
        for k in range(g >> 3):
            b = p[k]
            acc0 = (acc0 + cb[b & 1] * x[8 * k] + cb[(b >> 1) & 1] * x[8 * k + 1]
                    + cb[(b >> 2) & 1] * x[8 * k + 2] + cb[(b >> 3) & 1] * x[8 * k + 3])
            acc1 = (acc1 + cb[(b >> 4) & 1] * x[8 * k + 4] + cb[(b >> 5) & 1] * x[8 * k + 5]
                    + cb[(b >> 6) & 1] * x[8 * k + 6] + cb[b >> 7] * x[8 * k + 7])
    else:  # 3 bits: 3 bytes hold 8 fields
        for k in range(g >> 3):
            b = p[3 * k] | (<uint32_t>p[3 * k + 1] << 8) | (<uint32_t>p[3 * k + 2] << 16)
            acc0 = (acc0 + cb[b & 7] * x[8 * k] + cb[(b >> 3) & 7] * x[8 * k + 1]
                    + cb[(b >> 6) & 7] * x[8 * k + 2] + cb[(b >> 9) & 7] * x[8 * k + 3])
            acc1 = (acc1 + cb[(b >> 12) & 7] * x[8 * k + 4] + cb[(b >> 15) & 7] * x[8 * k + 5]
                    + cb[(b >> 18) & 7] * x[8 * k + 6] + cb[(b >> 21) & 7] * x[8 * k + 7])
    return acc0 + acc1


cdef inline void _group_decode(const uint8_t* p, const float* cb, float* out,
                               Py_ssize_t g, int fb) noexcept nogil:
    """out[j] = cb[field_j] for one group (the unit codewords, no norm, no rotation)."""
    cdef Py_ssize_t k, s
    cdef uint32_t b, mask = (1u << fb) - 1
    if fb == 3:
        for k in range(g >> 3):
            b = p[3 * k] | (<uint32_t>p[3 * k + 1] << 8) | (<uint32_t>p[3 * k + 2] << 16)
            for s in range(8):
                out[8 * k + s] = cb[(b >> (3 * s)) & 7]
    else:
        for k in range(g * fb // 8):
            b = p[k]
            for s in range(8 // fb):
                out[k * (8 // fb) + s] = cb[(b >> (s * fb)) & mask]


cdef float _row_dot_scalar(const CQView* w, Py_ssize_t r, const float* xt) noexcept nogil:
    cdef Py_ssize_t g = w.group_size, gamma
    cdef Py_ssize_t group_bytes = g * w.field_bits // 8
    cdef const uint8_t* row = w.packed + r * w.row_bytes
    cdef const float* nrow = w.norms + r * w.norm_stride
    cdef float y = 0
    for gamma in range(w.n_groups):
        y = y + nrow[gamma] * _group_dot_scalar(row + gamma * group_bytes, w.codebook,
                                                xt + gamma * g, g, w.field_bits)
    return y


# ---------------------------------------------------------------------------
# the C surface (declared in _cq.pxd)
# ---------------------------------------------------------------------------

cdef Py_ssize_t cq_work_floats(const CQView* w, Py_ssize_t n_tokens, int threads) noexcept nogil:
    """Workspace the kernels need: a header (WORK_HEADER floats: which form the
    rotation took), then the rotated tokens twice (plain and lane order), or in the
    integer form the int16 codes, the A8 scales and one token's float scratch (which
    fit in the same space; 32 spare floats cover the rounding of the scales' block),
    or in the lookup form (a view with a lookup layout) the rotated codes as floats,
    one token's tables (16 floats per pair of codes, either lookup kernel), the scales
    and the scratch.  Independent of threads
    (kept in the signature so callers need not change)."""
    cdef Py_ssize_t plain = WORK_HEADER + 2 * n_tokens * w.padded_len + 32
    cdef Py_ssize_t lut = WORK_HEADER + (n_tokens + 9) * w.padded_len + (n_tokens + 15) // 16 * 16 + 64
    return lut if w.lut_ok and lut > plain else plain


cdef inline Py_ssize_t _lut_block_rows(const CQView* w) noexcept nogil:
    """Rows of a block of the lookup layout: 16 (avx512lut) or 32 (avx2lut)."""
    return 32 if w.lut_kernel == 8 else 16


cdef int cq_effective_threads(const CQView* w, Py_ssize_t n_tokens, int threads) noexcept nogil:
    cdef Py_ssize_t by_work = w.rows * w.cols * n_tokens // MIN_MACS_PER_THREAD
    cdef Py_ssize_t n = threads
    if n > by_work:
        n = by_work
    if n > w.rows:
        n = w.rows
    if n < 1:
        n = 1
    return <int>n


cdef bint cq_same_rotation(const CQView* a, const CQView* b) noexcept nogil:
    """True when a workspace rotated for a serves b too (same cols, group, field width, path)."""
    return (a.cols == b.cols and a.group_size == b.group_size
            and a.field_bits == b.field_bits and a.simd == b.simd
            and a.a8_input == b.a8_input and a.int_ok == b.int_ok and a.lut_ok == b.lut_ok
            and a.lut_kernel == b.lut_kernel and a.amx_ok == b.amx_ok
            and (not a.lut_ok or _same_codebook(a, b)))


cdef inline bint _same_codebook(const CQView* a, const CQView* b) noexcept nogil:
    """(The lookup tables hold codewords: a 2-bit and a ternary matrix rotate alike but
    look up different tables.)"""
    cdef int i
    for i in range(16):
        if a.codebook[i] != b.codebook[i]:
            return False
    return True


cdef void cq_matmul_rotated_rows_list(const CQView** ws, int count, float* work, Py_ssize_t n_tokens,
                                      const Py_ssize_t* r0, const Py_ssize_t* r1, float** ys,
                                      const Py_ssize_t* ystr, float* wdec) noexcept nogil:
    """cq_matmul_rotated_rows(ws[i], work, T, 0, T, ys[i], ystr[i], r0[i], r1[i], wdec) for
    every i < count, for matrices that share the rotation in work (cq_same_rotation).
    In the lookup form the token tiles go outside the list, so a tile's tables are made
    once for all the matrices (made per matrix, for the q/k/v/gate share of a thread
    they were 2–3 times the work).  The same bits as the calls one by one."""
    cdef int i, nt
    cdef Py_ssize_t t0, fit = 0, P = ws[0].padded_len
    cdef const float* scales
    cdef bint byte_tables = ws[0].lut_kernel == 8
    if ws[0].lut_ok:
        if byte_tables:
            fit = nc_cqs_tile_tokens(ws[0].lut_n_dw, SCRATCH_FLOATS)
        else:
            fit = nc_cql_tile_tokens(ws[0].lut_n_dw, SCRATCH_FLOATS)
    if (<const int*>work)[0] != 2 or n_tokens == 1 or wdec == NULL or fit < 1:
        for i in range(count):
            cq_matmul_rotated_rows(ws[i], work, n_tokens, 0, n_tokens, ys[i], ystr[i], r0[i], r1[i], wdec)
        return
    scales = _int_scales(ws[0], work, n_tokens)
    t0 = 0
    while t0 < n_tokens:
        nt = <int>min(fit, n_tokens - t0)
        if byte_tables:
            nc_cqs_tile_tables(_lut_codes(work) + t0 * P, P, ws[0].lut_n_dw, ws[0].codebook, ws[0].int_fb, nt, wdec)
        else:
            nc_cql_tile_tables(_lut_codes(work) + t0 * P, P, ws[0].lut_n_dw, ws[0].codebook, ws[0].int_fb, nt, wdec)
        for i in range(count):
            if r0[i] >= r1[i]:
                continue
            if byte_tables:
                nc_cqs_tile_rows(<const uint8_t*>ws[i].lut_bits, ws[i].lut_norms, ws[i].lut_n_dw, ws[i].n_groups,
                                 ws[i].group_size, ws[i].int_fb, wdec, nt, scales + t0, ws[i].lut_descale, r0[i], r1[i],
                                 ys[i] + t0 * ystr[i], ystr[i])
            else:
                nc_cql_tile_rows(ws[i].lut_bits, ws[i].lut_norms, ws[i].lut_n_dw, ws[i].n_groups,
                                 ws[i].group_size, ws[i].int_fb, wdec, nt, scales + t0, ws[i].lut_descale, r0[i], r1[i],
                                 ys[i] + t0 * ystr[i], ystr[i])
        t0 += nt


cdef inline bint _int_path(const CQView* w, Py_ssize_t n_tokens) noexcept nogil:
    """Whether cq_rotate tries the integer form: A8 tokens, tables, a kernel on this CPU
    (under avx2lut with the float kernels as its base, only for its lookup layout)."""
    cdef int k = nc_cq_active_int_kernel()
    if not (n_tokens >= 1 and w.a8_input and w.int_ok and k > 0):
        return False
    return k != 8 or nc_cq_avx2lut_base != 0 or _lut_path(w)


cdef inline bint _lut_path(const CQView* w) noexcept nogil:
    """Whether an integer rotation for w takes the lookup form (kernel avx512lut or
    avx2lut, w's layout made for that kernel)."""
    return w.lut_ok and nc_cq_active_int_kernel() == w.lut_kernel


cdef inline bint _amx_path(const CQView* w, Py_ssize_t n_tokens) noexcept nogil:
    """Whether an integer rotation of n_tokens for w takes the tile form (csrc/cq_amx.h):
    the tiles enabled (an AVX-512 integer kernel active) or the portable loop of the
    same numerics forced (set_amx('portable')), tables made, AMX_MIN_TOKENS or more,
    and no lookup layout running w.  The 2-bit lookups stay: whole-model prefill on the
    tiles measured no faster than on them (the 4-bit body gains most;
    benchmarks/history/cq.md), and so prefill keeps the step's numerics."""
    cdef int k
    if not (nc_cqa_enabled and w.amx_ok and n_tokens >= AMX_MIN_TOKENS) or _lut_path(w):
        return False
    if nc_cqa_enabled == 2:
        return True
    k = nc_cq_active_int_kernel()
    return k == 1 or k == 2 or k == 7


cdef inline int _int_form(const CQView* w, Py_ssize_t n_tokens) noexcept nogil:
    """The workspace form an integer rotation of n_tokens takes: 3 tiles, 2 lookups, 1 int16 codes."""
    if _amx_path(w, n_tokens):
        return 3
    return 2 if _lut_path(w) else 1


# Integer forms of a workspace, for T tokens of padded length P.  Word 0 = 3 (tile
#   form): the rotated codes as signed bytes zh [T + 16, P] at WORK_HEADER and zl
#   [T + 16, P] after them (z = 256·zh + zl; the 16 rows past T zero: a tile reads 16
#   tokens), then the scales and the scratch as below.  Header word 0 = 1:
#   int16 codes [T, P] at WORK_HEADER, then the A8 scales [T] (a block of 16-float
#   multiples), then P floats of scratch for one token's float codes.  Word 0 = 2
#   (lookup form): the rotated codes as floats [T, P] at WORK_HEADER, one token's
#   tables (csrc/cq_lut.h's header and int16 entries, made when T = 1: the matvec's,
#   shared by every matrix that shares the rotation; a matmul makes each tile's own),
#   then the scales and the scratch as above.
cdef inline int16_t* _int_codes(float* work) noexcept nogil:
    return <int16_t*>(work + WORK_HEADER)


cdef inline float* _lut_codes(float* work) noexcept nogil:
    return work + WORK_HEADER


cdef inline float* _lut_tables(const CQView* w, float* work, Py_ssize_t n_tokens) noexcept nogil:
    # on a cache line (16 spare floats): every lookup reads 64 bytes of it
    return _align64(work + WORK_HEADER + n_tokens * w.padded_len)


cdef inline float* _int_scales(const CQView* w, float* work, Py_ssize_t n_tokens) noexcept nogil:
    return _int_scales_of(w, work, n_tokens, (<const int*>work)[0])


cdef inline float* _int_scales_of(const CQView* w, float* work, Py_ssize_t n_tokens, int form) noexcept nogil:
    if form == 2:
        return work + WORK_HEADER + (n_tokens + 8) * w.padded_len + 32
    if form == 3:
        return work + WORK_HEADER + (n_tokens + 16) * w.padded_len // 2
    return work + WORK_HEADER + n_tokens * w.padded_len // 2   # P is a multiple of 64


cdef inline int8_t* _amx_zh(float* work) noexcept nogil:
    return <int8_t*>(work + WORK_HEADER)


cdef inline int8_t* _amx_zl(const CQView* w, float* work, Py_ssize_t n_tokens) noexcept nogil:
    return <int8_t*>(work + WORK_HEADER) + (n_tokens + 16) * w.padded_len


cdef inline void _amx_clear_tail(const CQView* w, float* work, Py_ssize_t n_tokens) noexcept nogil:
    """Zero the 16 rows past the last token of both byte planes (the tiles read them)."""
    memset(_amx_zh(work) + n_tokens * w.padded_len, 0, 16 * w.padded_len)
    memset(_amx_zl(w, work, n_tokens) + n_tokens * w.padded_len, 0, 16 * w.padded_len)


cdef inline void _amx_pack_token(const float* kf, Py_ssize_t P, int8_t* zh, int8_t* zl) noexcept nogil:
    """z = 256·zh + zl, zl a signed byte (reference.cq.signed_bytes); AVX-512 where the tiles run."""
    cdef Py_ssize_t i
    cdef int z, lo
    if nc_cqa_enabled == 1:
        nc_cqa_pack_token(kf, P, zh, zl)
        return
    for i in range(P):
        z = <int>kf[i]
        lo = ((z + 128) & 255) - 128
        zl[i] = <int8_t>lo
        zh[i] = <int8_t>((z - lo) >> 8)


cdef bint _rotate_int(const CQView* w, const float* X, Py_ssize_t n_tokens, Py_ssize_t x_stride,
                      float* work, int threads) noexcept nogil:
    """The integer form of T tokens, if every one is an A8 vector (x_j = k_j·s, |k_j| ≤ 127).

    s is recovered as max|x|/127 (as the quantizer computed it, to the last bit or
    one ulp off) and k_j = rint(x_j/s); any x_j further than max|x|·2⁻²⁰ from k_j·s
    (or a NaN/inf) refuses the whole chunk, and the caller rotates the floats as
    usual.  The codes are rotated exactly (an unscaled FWHT of small integers in
    float32) and stored as int16 in the integer kernels' lane order (AVX-512:
    nc_cqi_a8_codes and nc_cqi_pack_codes in csrc/cq_int_avx512_tmpl.h).  Several tokens are
    split between up to `threads` threads, each with its own float scratch (on one
    thread the rotation kept the other waiting, a visible share of a 2-thread prefill);
    a refused token marks its scale -1.  In the lookup form (_lut_path) each token's
    rotated codes stay floats (and become the tables, nc_cql_tables, for one token)
    instead of int16 codes."""
    cdef Py_ssize_t t, P = w.padded_len
    cdef int form = _int_form(w, n_tokens)
    (<int*>work)[0] = form     # the form, read by _int_scales from here on
    cdef float* scales = _int_scales(w, work, n_tokens)
    cdef float* kf
    if form == 3:
        _amx_clear_tail(w, work, n_tokens)
    if threads <= 1 or n_tokens < 2:
        _rotate_int_tokens(w, X, 0, n_tokens, x_stride, work, n_tokens,
                           scales + (n_tokens + 15) // 16 * 16, form)
    else:
        with parallel(num_threads=threads if threads < n_tokens else <int>n_tokens):
            kf = <float*>malloc(P * sizeof(float))
            cq_rotate_tokens(w, X, n_tokens, x_stride, work, threadid(), nc_team_size(), kf,
                             P if kf != NULL else 0)
            free(kf)
    for t in range(n_tokens):
        if scales[t] < 0:
            return False
    if (<int*>work)[0] == 2 and n_tokens == 1:
        if w.lut_kernel == 8:
            nc_cqs_tables(_lut_codes(work), P, w.codebook, w.int_fb, _lut_tables(w, work, 1))
        else:
            nc_cql_tables(_lut_codes(work), P, w.codebook, w.int_fb, _lut_tables(w, work, 1))
    return True


cdef void _rotate_int_tokens(const CQView* w, const float* X, Py_ssize_t t0, Py_ssize_t t1,
                             Py_ssize_t x_stride, float* work, Py_ssize_t n_tokens,
                             float* kf, int form) noexcept nogil:
    """Tokens [t0, t1) of _rotate_int in `form` (_int_form), which the header need not
    hold yet (cq_rotate_tokens: another thread writes it); kf: P floats of scratch
    (the int16 and tile forms)."""
    cdef Py_ssize_t t, c, P = w.padded_len, g = w.group_size
    cdef int kernel = nc_cq_active_int_kernel()
    cdef int16_t* z = _int_codes(work)
    cdef float* scales = _int_scales_of(w, work, n_tokens, form)
    for t in range(t0, t1):
        if form == 2:
            kf = _lut_codes(work) + t * P      # the rotated codes are kept as they are
        if not nc_cq_int_a8_codes(kernel, X + t * x_stride, w.cols, kf, &scales[t]):
            scales[t] = -1.0
            continue
        memset(kf + w.cols, 0, (P - w.cols) * sizeof(float))
        for c in range(w.n_groups):
            cq_fwht_scaled(kf + c * g, g, <float>1.0)
        if form == 1:
            nc_cq_int_pack_codes(kernel, kf, w.n_chunks, w.int_fb, z + t * P)
        elif form == 3:
            _amx_pack_token(kf, P, _amx_zh(work) + t * P, _amx_zl(w, work, n_tokens) + t * P)


cdef void cq_rotate(const CQView* w, const float* X, Py_ssize_t n_tokens, Py_ssize_t x_stride,
                    float* work, int threads) noexcept nogil:
    """Rotate T = n_tokens inputs (row stride x_stride) into work, once for every matrix
    that cq_same_rotation accepts.  work: cq_work_floats(w, n_tokens, threads) floats."""
    cdef bint simd = nc_cq_use_simd(w.simd)
    cdef Py_ssize_t P = w.padded_len, t
    cdef float* xt = work + WORK_HEADER
    cdef float* xp = xt + n_tokens * P
    cdef int n = cq_effective_threads(w, n_tokens, threads)
    if _int_path(w, n_tokens) and _rotate_int(w, X, n_tokens, x_stride, work, n):
        return
    (<int*>work)[0] = 0
    if n == 1 or n_tokens == 1:
        for t in range(n_tokens):
            _rotate_token(w, X + t * x_stride, xt + t * P, xp + t * P, simd)
    else:
        for t in prange(n_tokens, num_threads=n, schedule="static"):
            _rotate_token(w, X + t * x_stride, xt + t * P, xp + t * P, simd)


cdef bint cq_rotate_tokens(const CQView* w, const float* X, Py_ssize_t n_tokens, Py_ssize_t x_stride,
                           float* work, int tid, int nt, float* kf, Py_ssize_t kf_floats) noexcept nogil:
    """Thread tid of nt's share of cq_rotate of n_tokens ≥ 2 tokens in the integer forms
    (tokens T·tid/nt … T·(tid+1)/nt), for a team that meets before anyone reads work;
    kf: kf_floats floats of this thread's own (the int16 form needs padded_len; without
    them, or NULL, its tokens are marked refused).
    False, having written nothing, where the integer form does not apply (then thread 0 calls cq_rotate alone).  After the
    meeting cq_rotate_tokens_ok tells whether every token was an A8 vector; when not,
    thread 0 calls cq_rotate.  The same bits as cq_rotate (the prefill chunk's one
    parallel region: a region per rotation added to libgomp's fork and join costs)."""
    cdef int form
    cdef Py_ssize_t t0 = n_tokens * tid // nt, t1 = n_tokens * (tid + 1) // nt, t
    if n_tokens < 2 or not _int_path(w, n_tokens):
        return False
    form = _int_form(w, n_tokens)
    if (kf == NULL or kf_floats < w.padded_len) and form != 2:   # (its tokens fail the verdict)
        for t in range(t0, t1):
            _int_scales_of(w, work, n_tokens, form)[t] = -1.0
    else:
        _rotate_int_tokens(w, X, t0, t1, x_stride, work, n_tokens, kf, form)
    if tid == 0:
        (<int*>work)[0] = form
        if form == 3:
            _amx_clear_tail(w, work, n_tokens)
    return True


cdef bint cq_rotate_tokens_ok(const CQView* w, float* work, Py_ssize_t n_tokens) noexcept nogil:
    """After cq_rotate_tokens and a meeting: whether work holds every token's rotation."""
    cdef const float* scales = _int_scales(w, work, n_tokens)
    cdef Py_ssize_t t
    for t in range(n_tokens):
        if scales[t] < 0:
            return False
    return True


cdef void _matmul_int(const CQView* w, float* work, Py_ssize_t n_tokens, float* Y,
                      Py_ssize_t y_stride, int threads) noexcept nogil:
    """Y[t, r] from the integer form of T tokens (cq_rotate took it): blocks of
    MATVEC_ROW_BLOCK rows, each token's row sums exactly the matvec's (bitwise)."""
    cdef int kernel = nc_cq_active_int_kernel()
    cdef const int16_t* z = _int_codes(work)
    cdef const float* scales = _int_scales(w, work, n_tokens)
    cdef int n = cq_effective_threads(w, n_tokens, threads)
    cdef Py_ssize_t rb, n_blocks = (w.rows + MATVEC_ROW_BLOCK - 1) // MATVEC_ROW_BLOCK
    cdef int i
    if (<const int*>work)[0] >= 2:
        # the lookup and tile forms: one contiguous share of 16-row blocks per thread,
        # token tiles outside
        if n == 1:
            _block_mm_share(w, work, n_tokens, 0, 1, Y, y_stride)
        else:
            for i in prange(n, num_threads=n, schedule="static"):
                _block_mm_share(w, work, n_tokens, i, n, Y, y_stride)
        return
    # block by block also on one thread: a block's rows stay in cache across token tiles
    if n == 1:
        for rb in range(n_blocks):
            _matmul_int_block(w, kernel, z, scales, n_tokens, rb, Y, y_stride)
    else:
        for rb in prange(n_blocks, num_threads=n, schedule="static"):
            _matmul_int_block(w, kernel, z, scales, n_tokens, rb, Y, y_stride)


cdef inline void _block_mm_share(const CQView* w, float* work, Py_ssize_t n_tokens, int i, int n,
                                 float* Y, Py_ssize_t y_stride) noexcept nogil:
    """Share i of n (whole 16-row blocks) of the lookup or tile matmul, every token (the
    lookups make each tile's tables in this thread's scratch)."""
    cdef Py_ssize_t B = _lut_block_rows(w) if (<const int*>work)[0] == 2 else 16
    cdef Py_ssize_t n_rb = (w.rows + B - 1) // B
    cdef Py_ssize_t r0 = B * (n_rb * i // n), r1 = min(B * (n_rb * (i + 1) // n), w.rows)
    cdef float* scratch
    if r0 >= r1:
        return
    if (<const int*>work)[0] == 3:
        _amx_rows(w, work, n_tokens, 0, n_tokens, Y, y_stride, r0, r1, NULL)
        return
    scratch = cq_decode_scratch()
    _lut_mm_rows(w, work, n_tokens, 0, n_tokens, r0, r1, Y, y_stride, scratch)
    cq_free_decode_scratch(scratch)


cdef inline void _lut_mm_rows(const CQView* w, float* work, Py_ssize_t n_tokens, Py_ssize_t t0,
                              Py_ssize_t t1, Py_ssize_t r0, Py_ssize_t r1, float* Y, Py_ssize_t y_stride,
                              float* scratch) noexcept nogil:
    """Rows [r0, r1) of tokens [t0, t1) of the lookup form of n_tokens (Y: token t0's row),
    each tile's tables in scratch (SCRATCH_FLOATS floats, or NULL), on w's lookup kernel."""
    cdef Py_ssize_t P = w.padded_len, nt = t1 - t0
    if w.lut_kernel == 8:
        nc_cqs_mm_rows(<const uint8_t*>w.lut_bits, w.lut_norms, w.lut_n_dw, w.n_groups, w.group_size, w.int_fb,
                       _lut_codes(work) + t0 * P, P, w.codebook, nt, _int_scales(w, work, n_tokens) + t0,
                       w.lut_descale, r0, r1, Y, y_stride, scratch, SCRATCH_FLOATS if scratch != NULL else 0)
    else:
        nc_cql_mm_rows(w.lut_bits, w.lut_norms, w.lut_n_dw, w.n_groups, w.group_size, w.int_fb,
                       _lut_codes(work) + t0 * P, P, w.codebook, nt, _int_scales(w, work, n_tokens) + t0,
                       w.lut_descale, r0, r1, Y, y_stride, scratch, SCRATCH_FLOATS if scratch != NULL else 0)


cdef void _amx_rows(const CQView* w, float* work, Py_ssize_t n_tokens, Py_ssize_t t0, Py_ssize_t t1,
                    float* Y, Py_ssize_t y_stride, Py_ssize_t r0, Py_ssize_t r1,
                    float* scratch) noexcept nogil:
    """Rows [r0, r1) of tokens [t0, t1) from the tile form (Y: token 0's row), on the
    tiles in 16-row blocks (scratch: a decode scratch, else one of its own), or in the
    portable loop of the same numerics (set_amx('portable'), or no scratch)."""
    cdef Py_ssize_t P = w.padded_len, b0
    cdef float* own = NULL
    cdef const float* scales = _int_scales(w, work, n_tokens)
    cdef bint tiles = nc_cqa_enabled == 1 and SCRATCH_FLOATS >= nc_cqa_scratch_floats(w.n_groups)
    if tiles and scratch == NULL:
        own = cq_decode_scratch()
        scratch = own
    if not tiles or scratch == NULL:
        _amx_rows_portable(w, work, n_tokens, t0, t1, Y, y_stride, r0, r1)
        return
    b0 = r0
    while b0 < r1:
        nc_cqa_mm_rows(w.int_packed, w.int_row_bytes, w.norms, w.norm_stride, w.n_groups,
                       w.group_size, w.int_fb, w.amx_pieces, _amx_zh(work) + t0 * P,
                       _amx_zl(w, work, n_tokens) + t0 * P, P, t1 - t0, scales + t0,
                       w.amx_descale, b0, min(b0 + 16, r1), Y + t0 * y_stride, y_stride, scratch)
        b0 += 16
    cq_free_decode_scratch(own)


cdef void _amx_rows_portable(const CQView* w, float* work, Py_ssize_t n_tokens, Py_ssize_t t0,
                             Py_ssize_t t1, float* Y, Py_ssize_t y_stride, Py_ssize_t r0,
                             Py_ssize_t r1) noexcept nogil:
    """The tile kernel's numerics (reference.cq.matmul_amx) one product at a time."""
    cdef Py_ssize_t P = w.padded_len, r, t, gi, k, bit
    cdef int fb = w.int_fb, g = w.group_size, f
    cdef uint32_t mask = (1u << fb) - 1
    cdef const uint8_t* row
    cdef const int8_t* zh
    cdef const int8_t* zl
    cdef const int8_t* pc = w.amx_pieces
    cdef const float* scales = _int_scales(w, work, n_tokens)
    cdef int T3, T2, T1, T0, a, b
    cdef float acc, total
    for r in range(r0, r1):
        row = w.int_packed + r * w.int_row_bytes
        for t in range(t0, t1):
            zh = _amx_zh(work) + t * P
            zl = _amx_zl(w, work, n_tokens) + t * P
            acc = 0
            for gi in range(w.n_groups):
                T3 = T2 = T1 = T0 = 0
                for k in range(gi * g, (gi + 1) * g):
                    bit = k * fb
                    f = (row[bit >> 3] >> (bit & 7)) & mask
                    a = zh[k]
                    b = zl[k]
                    T3 += a * pc[f]
                    T2 += a * pc[16 + f] + b * pc[f]
                    T1 += a * pc[32 + f] + b * pc[16 + f]
                    T0 += b * pc[32 + f]
                total = fmaf(<float>(256 * T3 + T2), <float>65536.0, <float>(256 * T1 + T0))
                acc = fmaf(total, w.norms[r * w.norm_stride + gi], acc)
            Y[t * y_stride + r] = acc * (scales[t] * w.amx_descale)


cdef inline void _matmul_int_block(const CQView* w, int kernel, const int16_t* z, const float* scales,
                                   Py_ssize_t n_tokens, Py_ssize_t rb, float* Y,
                                   Py_ssize_t y_stride) noexcept nogil:
    """Rows [rb·MATVEC_ROW_BLOCK, +MATVEC_ROW_BLOCK) of _matmul_int for every token."""
    cdef Py_ssize_t r0 = rb * MATVEC_ROW_BLOCK
    cdef Py_ssize_t r1 = min(r0 + MATVEC_ROW_BLOCK, w.rows)
    nc_cq_int_mm_rows(kernel, w.int_packed, w.int_row_bytes, w.int_packed_end, w.norms,
                      w.norm_stride, z, w.padded_len, n_tokens, w.n_chunks, w.int_fb,
                      w.group_size, w.int_table, w.int_base, scales, w.int_descale,
                      r0, r1, Y, y_stride)


cdef void cq_matvec_rotated_rows(const CQView* w, const float* work, float* y,
                                 Py_ssize_t r0, Py_ssize_t r1) noexcept nogil:
    """Rows [r0, r1) of y = W · x from a workspace that cq_rotate filled for one token,
    on the calling thread.  A row's value does not depend on the range it is computed
    in, so any split of the rows gives cq_matvec_rotated's result bit for bit (the
    engine's one-region decode step hands out blocks of rows to its threads)."""
    cdef const float* xt = work + WORK_HEADER
    cdef const float* xp = xt + w.padded_len
    cdef Py_ssize_t r
    cdef float scale
    if r0 >= r1:
        return
    if (<const int*>work)[0] == 2:
        # the lookup form (kernel avx512lut or avx2lut)
        scale = _int_scales(w, <float*>work, 1)[0] * w.lut_descale
        _lut_rows(w, _lut_tables(w, <float*>work, 1), scale, r0, r1, y)
    elif (<const int*>work)[0] == 1:
        # the integer form (cq_rotate took it for this view's rotation family)
        scale = _int_scales(w, <float*>work, 1)[0] * w.int_descale
        nc_cq_int_rows(nc_cq_active_int_kernel(), w.int_packed, w.int_row_bytes, w.int_packed_end,
                       w.norms, w.norm_stride, _int_codes(<float*>work), w.n_chunks, w.int_fb,
                       w.group_size, w.int_table, w.int_base, scale, r0, r1, y)
    elif nc_cq_use_simd(w.simd):
        nc_cq_avx2_rows_dot(w.packed, w.row_bytes, w.packed_end, w.norms, w.norm_stride, xp,
                            w.n_chunks, w.field_bits, w.group_size, w.simd_table, r0, r1, y)
    else:
        for r in range(r0, r1):
            y[r] = _row_dot_scalar(w, r, xt)


cdef inline void _lut_rows(const CQView* w, const float* tab, float scale, Py_ssize_t r0, Py_ssize_t r1,
                           float* y) noexcept nogil:
    """Rows [r0, r1) of one token from its tables (scale = s·descale), on w's lookup kernel."""
    if w.lut_kernel == 8:
        nc_cqs_rows(<const uint8_t*>w.lut_bits, w.lut_norms, w.lut_n_dw, w.n_groups, w.group_size, w.int_fb,
                    tab, scale, r0, r1, y)
    else:
        nc_cql_rows(w.lut_bits, w.lut_norms, w.lut_n_dw, w.n_groups, w.group_size, w.int_fb,
                    tab, scale, r0, r1, y)


cdef extern from "csrc/prefetch_stream.h":
    void _prefetch_bytes "nc_prefetch_bytes_l2"(const char* p, Py_ssize_t n) noexcept nogil


cdef void cq_row_bytes(const CQView* w, Py_ssize_t r0, Py_ssize_t r1, const char** at0, Py_ssize_t* n0,
                       const char** at1, Py_ssize_t* n1) noexcept nogil:
    """The two byte ranges rows [r0, r1) of w occupy in the layout the one-token product
    of an A8 input reads (lookup, integer or packed fields, then their norms); empty
    (n0 = n1 = 0) when r0 >= r1."""
    cdef Py_ssize_t b0, b1
    n0[0] = 0
    n1[0] = 0
    if r0 >= r1:
        return
    cdef Py_ssize_t B
    if w.a8_input and _lut_path(w):
        B = _lut_block_rows(w)         # a block: B rows of 4·lut_n_dw bytes, B norms a group
        b0 = r0 // B
        b1 = (r1 + B - 1) // B
        at0[0] = <const char*>w.lut_bits + b0 * B * 4 * w.lut_n_dw
        n0[0] = (b1 - b0) * B * 4 * w.lut_n_dw
        at1[0] = <const char*>(w.lut_norms + b0 * w.n_groups * B)
        n1[0] = (b1 - b0) * w.n_groups * B * 4
    elif _int_path(w, 1):
        at0[0] = <const char*>(w.int_packed + r0 * w.int_row_bytes)
        n0[0] = (r1 - r0) * w.int_row_bytes
        at1[0] = <const char*>(w.norms + r0 * w.norm_stride)
        n1[0] = (r1 - r0) * w.norm_stride * 4
    else:
        at0[0] = <const char*>(w.packed + r0 * w.row_bytes)
        n0[0] = (r1 - r0) * w.row_bytes
        at1[0] = <const char*>(w.norms + r0 * w.norm_stride)
        n1[0] = (r1 - r0) * w.norm_stride * 4


cdef void cq_prefetch_rows(const CQView* w, Py_ssize_t r0, Py_ssize_t r1) noexcept nogil:
    """Ask for rows [r0, r1) of w (cq_row_bytes) into this core's L2.
    For small matrices read by a step: the kernels prefetch a matrix's rows 8 ahead of
    the row they multiply, so the first rows of each matrix, and all of a matrix of a
    few rows, were read at one memory latency after another."""
    cdef const char* at0 = NULL
    cdef const char* at1 = NULL
    cdef Py_ssize_t n0, n1
    cq_row_bytes(w, r0, r1, &at0, &n0, &at1, &n1)
    if n0 > 0:
        _prefetch_bytes(at0, n0)
    if n1 > 0:
        _prefetch_bytes(at1, n1)


cdef void cq_matvec_rotated(const CQView* w, const float* work, float* y,
                            int threads) noexcept nogil:
    """y[rows] = W · x from a workspace that cq_rotate filled for one token."""
    cdef int n = cq_effective_threads(w, 1, threads)
    cdef Py_ssize_t rb, r0, r1, n_blocks = (w.rows + MATVEC_ROW_BLOCK - 1) // MATVEC_ROW_BLOCK
    if n == 1:
        cq_matvec_rotated_rows(w, work, y, 0, w.rows)
    else:
        for rb in prange(n_blocks, num_threads=n, schedule="static"):
            r0 = rb * MATVEC_ROW_BLOCK
            r1 = r0 + MATVEC_ROW_BLOCK
            if r1 > w.rows:
                r1 = w.rows
            cq_matvec_rotated_rows(w, work, y, r0, r1)


cdef void cq_matvec(const CQView* w, const float* x, float* y, float* work,
                    int threads) noexcept nogil:
    """y[rows] = W · x[cols].  work: cq_work_floats(w, 1, threads) floats."""
    cq_rotate(w, x, 1, w.cols, work, threads)
    cq_matvec_rotated(w, work, y, threads)


cdef inline bint _decode_once(const CQView* w, Py_ssize_t nc) noexcept nogil:
    """Whether _matmul_rows_simd decodes a slice of nc chunks once per token tile
    (True) or multiplies straight from the packed bytes, once per 8 tokens (False).

    Decoding once costs a store and a reload of every weight vector: one extra load
    per 8 FMAs (9 loads, near the two-vector-loads-per-cycle limit of AVX2 cores).  At
    3–4 bits decoding inside the token loop costs more than that (4 bits: ~3
    shuffle µops per vector), so the decoded copy wins at every width (128x768
    0.87, 16384x768 0.84, 320x3072 0.87 of the old time).  At 1–2 bits the
    in-loop decode is one shuffle + one shift, which run beside the FMAs, and the
    copy only wins on short rows (256x256 0.90, 384x384 0.95, 1024x256 0.95) but
    loses on wide slices (128x768 1.02–1.06, 256x1024 1.06–1.11, 80x3072 and
    320x3072 1.11–1.18: time ratios, 64 tokens, 1 thread, in-process A/B)."""
    cdef Py_ssize_t fields = nc * w.chunk_fields
    # a slice wider than the decode buffer (only with groups > DECODE_FLOATS fields,
    # slices being whole groups) always takes the packed path
    return fields <= DECODE_FLOATS and (w.field_bits >= 3 or fields <= LOW_BIT_DECODE_FIELDS)


cdef void _matmul_rows_simd(const CQView* w, Py_ssize_t r0, Py_ssize_t r1, const float* xp,
                            Py_ssize_t n_tokens, float* Y, Py_ssize_t y_stride,
                            float* wdec) noexcept nogil:
    """Rows r0..r1 (≤ ROW_BLOCK) for every token, TOKEN_TILE tokens at a time.
    wdec: DECODE_FLOATS floats of scratch for the decoded rows, or NULL (then every
    slice takes the packed path).

    Where _decode_once says so, for each column slice the rows are decoded once
    into float32 (codeword × norm, in the lane order of xp), then each decoded row
    is multiplied with every token of the tile, eight tokens per pass
    (nc_cq_dot_tiles).  Decoding costs about as much as 8 FMAs per weight vector at
    4 bits, so doing it once per 64 tokens instead of once per 8 is most of the
    gain.  Otherwise every row is multiplied from its packed bytes with 8 tokens at
    a time (nc_cq_avx2_row_tokens), all rows of the block per 8 tokens, so the
    8 tokens' slice stays in L1 while the rows use it.  Both sum each lane in the
    same order and reduce it with the same hsum per slice, so which path a slice
    takes does not change the result, and neither does the number of tokens (a
    lone trailing token is summed as a block of one, not by the matvec formula, whose
    four partial sums per chunk round differently): any split of the tokens between
    threads gives the same bits.

    Long rows go in column slices of about SLICE_FIELDS (8 tokens × 768 fields =
    24 KB; 16 decoded rows of 768 fields: 48 KB, mostly L1/L2 resident); the
    partial sums of the slices are added in a small tile, which also keeps the
    outputs of a row for several tokens (y_stride apart) out of one L1 set."""
    cdef Py_ssize_t t0, t, t8, r, ra, P = w.padded_len, nr = r1 - r0
    cdef Py_ssize_t C = w.chunk_fields, g = w.group_size, c0, nc, slice_chunks, unit
    cdef Py_ssize_t rows_per_decode, n_dec
    cdef int nt, n8
    cdef float tile[TOKEN_TILE * 16]  # TOKEN_TILE × ROW_BLOCK (4 KB on the stack)
    if nr > ROW_BLOCK:  # never for the callers below; keeps the tile in bounds regardless
        r = r0
        while r < r1:
            _matmul_rows_simd(w, r, r + ROW_BLOCK if r + ROW_BLOCK < r1 else r1, xp,
                              n_tokens, Y, y_stride, wdec)
            r += ROW_BLOCK
        return
    # slices start at whole groups and whole chunks (both powers of two): the packed
    # path addresses a slice's norms from its first group
    unit = g if g > C else C
    slice_chunks = (SLICE_FIELDS + unit - 1) // unit * unit // C
    t0 = 0
    while t0 < n_tokens:
        nt = <int>(n_tokens - t0 if n_tokens - t0 < TOKEN_TILE else TOKEN_TILE)
        memset(tile, 0, sizeof(tile))
        c0 = 0
        while c0 < w.n_chunks:
            nc = w.n_chunks - c0 if w.n_chunks - c0 < slice_chunks else slice_chunks
            if wdec != NULL and _decode_once(w, nc):
                rows_per_decode = DECODE_FLOATS // (nc * C)
                ra = r0
                while ra < r1:
                    n_dec = r1 - ra if r1 - ra < rows_per_decode else rows_per_decode
                    for r in range(ra, ra + n_dec):
                        nc_cq_avx2_decode_scaled(w.packed + r * w.row_bytes, w.packed_end,
                                                 w.norms + r * w.norm_stride, c0, nc,
                                                 w.field_bits, w.group_size, w.simd_table,
                                                 wdec + (r - ra) * nc * C)
                    nc_cq_dot_tiles(wdec, nc * C, <int>n_dec, xp + t0 * P + c0 * C, P, nt,
                                    nc * C // 8, tile + (ra - r0), ROW_BLOCK)
                    ra += n_dec
            else:
                t8 = 0
                while t8 < nt:
                    n8 = <int>(nt - t8 if nt - t8 < 8 else 8)
                    for r in range(r0, r1):
                        nc_cq_avx2_row_tokens(w.packed + r * w.row_bytes + c0 * w.chunk_bytes,
                                              w.packed_end, w.norms + r * w.norm_stride + (c0 * C) // g,
                                              xp + (t0 + t8) * P + c0 * C, P, nc,
                                              w.field_bits, w.group_size, w.simd_table, n8,
                                              tile + t8 * ROW_BLOCK + (r - r0), ROW_BLOCK)
                    t8 += 8
            c0 += nc
        for t in range(nt):
            memcpy(Y + (t0 + t) * y_stride + r0, tile + t * ROW_BLOCK, nr * sizeof(float))
        t0 += nt


cdef void _matmul_row_scalar(const CQView* w, Py_ssize_t r, const float* xt, Py_ssize_t n_tokens,
                             float* Y, Py_ssize_t y_stride) noexcept nogil:
    """One row for every token; each group's codewords are decoded once (in pieces of
    at most SCALAR_PIECE fields, on the stack) and reused for every token."""
    cdef Py_ssize_t g = w.group_size, gamma, t, j, piece, start, P = w.padded_len
    cdef const uint8_t* row = w.packed + r * w.row_bytes
    cdef const float* nrow = w.norms + r * w.norm_stride
    cdef const float* xg
    cdef float acc
    cdef float vals[1024]  # SCALAR_PIECE
    piece = g if g < SCALAR_PIECE else SCALAR_PIECE
    for t in range(n_tokens):
        Y[t * y_stride + r] = 0
    for gamma in range(w.n_groups):
        start = gamma * g
        while start < (gamma + 1) * g:  # a group is a whole number of pieces (powers of two)
            _group_decode(row + start * w.field_bits // 8, w.codebook, vals, piece, w.field_bits)
            for t in range(n_tokens):
                xg = xt + t * P + start
                acc = 0
                for j in range(piece):
                    acc = acc + vals[j] * xg[j]
                Y[t * y_stride + r] += nrow[gamma] * acc
            start += piece


cdef inline float* _align64(void* raw) noexcept nogil:
    """raw rounded up to a cache line (NULL stays NULL).  malloc gives 16-byte
    alignment; the decoded rows are read with 32-byte loads, and a buffer that
    is not 32-byte aligned makes every other load span two lines (measured 2–6 %
    slower at 4 bits than the 32-byte-aligned stack array it replaces)."""
    if raw == NULL:
        return NULL
    return <float*>((<uintptr_t>raw + 63) & ~(<uintptr_t>63))


cdef void cq_matmul_rotated(const CQView* w, float* work, Py_ssize_t n_tokens,
                            float* Y, Py_ssize_t y_stride, int threads) noexcept nogil:
    """Y[t, r] for T = n_tokens inputs that cq_rotate put into work (Y row stride y_stride)."""
    cdef bint simd = nc_cq_use_simd(w.simd)
    cdef Py_ssize_t P = w.padded_len, rb, r, r0, r1
    cdef Py_ssize_t n_blocks = (w.rows + ROW_BLOCK - 1) // ROW_BLOCK
    cdef const float* xt = work + WORK_HEADER
    cdef const float* xp = xt + n_tokens * P
    cdef int n = cq_effective_threads(w, n_tokens, threads)
    cdef void* raw = NULL
    if n_tokens < 1:
        return
    if (<const int*>work)[0] >= 1:      # an integer form (codes or lookup tables)
        if n_tokens == 1:
            cq_matvec_rotated(w, work, Y, threads)
        else:
            _matmul_int(w, work, n_tokens, Y, y_stride, threads)
        return
    if simd:
        # The decode scratch (48 KB) is one heap block per thread per call rather than
        # a stack array: OpenMP worker threads may have small stacks (musl: 128 KB,
        # OMP_STACKSIZE).  If malloc fails the kernel takes the packed path instead.
        if n == 1:
            raw = malloc(DECODE_FLOATS * sizeof(float) + 64)
            for rb in range(n_blocks):
                r0 = rb * ROW_BLOCK
                r1 = r0 + ROW_BLOCK
                if r1 > w.rows:
                    r1 = w.rows
                _matmul_rows_simd(w, r0, r1, xp, n_tokens, Y, y_stride, _align64(raw))
            free(raw)
        else:
            with parallel(num_threads=n):
                raw = malloc(DECODE_FLOATS * sizeof(float) + 64)
                for rb in prange(n_blocks, schedule="static"):
                    r0 = rb * ROW_BLOCK
                    r1 = r0 + ROW_BLOCK
                    if r1 > w.rows:
                        r1 = w.rows
                    _matmul_rows_simd(w, r0, r1, xp, n_tokens, Y, y_stride, _align64(raw))
                free(raw)
    else:
        if n == 1:
            for r in range(w.rows):
                _matmul_row_scalar(w, r, xt, n_tokens, Y, y_stride)
        else:
            for r in prange(w.rows, num_threads=n, schedule="static"):
                _matmul_row_scalar(w, r, xt, n_tokens, Y, y_stride)


cdef void cq_matmul_rotated_rows(const CQView* w, float* work, Py_ssize_t n_tokens,
                                 Py_ssize_t t0, Py_ssize_t t1, float* Y, Py_ssize_t y_stride,
                                 Py_ssize_t r0, Py_ssize_t r1, float* wdec) noexcept nogil:
    """Rows [r0, r1) of tokens [t0, t1) of cq_matmul_rotated's Y (work: the rotation of
    n_tokens inputs; Y: token 0's row), on the calling thread, for a caller that splits
    one or several products between the threads of its own parallel region.  Each
    (row, token) sums exactly as in cq_matmul_rotated (the integer kernels: as the
    matvec; the float ones: the same FMAs per token whatever the tile), so any split
    of rows or tokens gives its result bit for bit.  r0 should be a multiple of
    ROW_BLOCK, as the float kernel's blocks are.  wdec: this thread's decode scratch
    for the float kernel (DECODE_FLOATS floats, 64-byte aligned), or NULL."""
    cdef Py_ssize_t P = w.padded_len, b0, b1, r, nt = t1 - t0
    cdef const float* xt = work + WORK_HEADER
    cdef int kernel
    if nt < 1 or r0 >= r1:
        return
    if (<const int*>work)[0] == 3:
        _amx_rows(w, work, n_tokens, t0, t1, Y, y_stride, r0, r1, wdec)
    elif (<const int*>work)[0] == 2:
        if n_tokens == 1:       # the tables cq_rotate made
            _lut_rows(w, _lut_tables(w, work, 1), _int_scales(w, work, 1)[0] * w.lut_descale, r0, r1, Y)
        else:                   # each tile's tables in wdec (SCRATCH_FLOATS floats)
            _lut_mm_rows(w, work, n_tokens, t0, t1, r0, r1, Y + t0 * y_stride, y_stride, wdec)
    elif (<const int*>work)[0] == 1:
        kernel = nc_cq_active_int_kernel()
        b0 = r0
        while b0 < r1:      # blocks of rows that stay in cache across the token tiles
            b1 = min(b0 + MATVEC_ROW_BLOCK, r1)
            if nt == 1:
                nc_cq_int_rows(kernel, w.int_packed, w.int_row_bytes, w.int_packed_end, w.norms,
                               w.norm_stride, _int_codes(work) + t0 * P, w.n_chunks, w.int_fb,
                               w.group_size, w.int_table, w.int_base,
                               _int_scales(w, work, n_tokens)[t0] * w.int_descale, b0, b1, Y + t0 * y_stride)
            else:
                nc_cq_int_mm_rows(kernel, w.int_packed, w.int_row_bytes, w.int_packed_end, w.norms,
                                  w.norm_stride, _int_codes(work) + t0 * P, P, nt, w.n_chunks, w.int_fb,
                                  w.group_size, w.int_table, w.int_base,
                                  _int_scales(w, work, n_tokens) + t0, w.int_descale, b0, b1,
                                  Y + t0 * y_stride, y_stride)
            b0 = b1
    elif nc_cq_use_simd(w.simd):
        b0 = r0
        while b0 < r1:
            b1 = min(b0 + ROW_BLOCK, r1)
            _matmul_rows_simd(w, b0, b1, xt + n_tokens * P + t0 * P, nt, Y + t0 * y_stride, y_stride, wdec)
            b0 = b1
    else:
        for r in range(r0, r1):
            _matmul_row_scalar(w, r, xt + t0 * P, nt, Y + t0 * y_stride, y_stride)


cdef Py_ssize_t cq_decode_scratch_floats() noexcept nogil:
    """Floats of a cq_decode_scratch."""
    return SCRATCH_FLOATS


cdef float* cq_decode_scratch() noexcept nogil:
    """A thread's decode scratch for cq_matmul_rotated_rows (free it with
    cq_free_decode_scratch); NULL if malloc fails (the float kernel then reads the
    packed rows directly)."""
    cdef void* raw = malloc(SCRATCH_FLOATS * sizeof(float) + 64 + sizeof(void*))
    cdef float* aligned
    if raw == NULL:
        return NULL
    aligned = _align64(<char*>raw + sizeof(void*))
    (<void**>aligned - 1)[0] = raw
    return aligned


cdef void cq_free_decode_scratch(float* scratch) noexcept nogil:
    if scratch != NULL:
        free((<void**>scratch - 1)[0])


cdef void cq_matmul(const CQView* w, const float* X, Py_ssize_t n_tokens, Py_ssize_t x_stride,
                    float* Y, Py_ssize_t y_stride, float* work, int threads) noexcept nogil:
    """Y[t, r] = Σ_c W[r, c]·X[t, c] for T = n_tokens rows of X (row stride x_stride)
    into Y (row stride y_stride).  work: cq_work_floats(w, n_tokens, threads) floats."""
    if n_tokens < 1:
        return
    cq_rotate(w, X, n_tokens, x_stride, work, threads)
    cq_matmul_rotated(w, work, n_tokens, Y, y_stride, threads)


cdef void cq_dequantize_row(const CQView* w, Py_ssize_t row, float* out,
                            float* scratch) noexcept nogil:
    """out[cols] = row of W (spec §3.5): (ν·cb[fields])·Hg per group.  scratch: g floats."""
    cdef Py_ssize_t g = w.group_size, gamma, j, n
    cdef Py_ssize_t group_bytes = g * w.field_bits // 8
    cdef const uint8_t* prow = w.packed + row * w.row_bytes
    cdef const float* nrow = w.norms + row * w.norm_stride
    cdef float scale = _hadamard_scale(w.group_size)
    cdef float nu
    for gamma in range(w.n_groups):
        _group_decode(prow + gamma * group_bytes, w.codebook, scratch, g, w.field_bits)
        nu = nrow[gamma]
        for j in range(g):
            scratch[j] = scratch[j] * nu
        cq_fwht_scaled(scratch, g, scale)
        n = w.cols - gamma * g
        if n > g:
            n = g
        memcpy(out + gamma * g, scratch, n * sizeof(float))


# ---------------------------------------------------------------------------
# prepared matrices
# ---------------------------------------------------------------------------

def _fail(what, expected, found):
    raise ValueError(f"{what}: expected {expected}, found {found}")


def _describe(arr):
    if isinstance(arr, np.ndarray):
        return f"{arr.dtype} array of shape {arr.shape}"
    return type(arr).__name__


cdef class CQWeight:
    """A CQ matrix made ready for the kernels: validated, float32 norms, C view.

    Build it with ``prepare(cq_matrix)`` (cached) or ``CQWeight(cq_matrix)``.
    It keeps the packed bytes alive but not the ``CQMatrix`` object.
    """

    def __init__(self, W):
        cdef Py_ssize_t rows, cols, g, fb, n_groups, cols_padded, row_bytes, F, C, n_chunks, norm_stride
        cdef int bits, i
        for name in ("rows", "cols", "bits", "group_size", "packed", "norms", "codebook"):
            if not hasattr(W, name):
                raise ValueError(f"CQWeight: expected a CQMatrix (with .{name}), found {type(W).__name__}")
        rows, cols, bits, g = int(W.rows), int(W.cols), int(W.bits), int(W.group_size)
        if bits not in (1, 2, 3, 4, TERNARY_BITS):
            _fail("CQ bits", "1, 2, 3, 4 or 5 (ternary)", bits)
        if g < 8 or g & (g - 1):
            _fail("CQ group_size", "a power of two >= 8", g)
        if rows < 1 or cols < 1:
            _fail("CQ shape", "rows >= 1 and cols >= 1", (rows, cols))
        fb = 2 if bits == TERNARY_BITS else bits
        n_groups = (cols + g - 1) // g  # typed C ints: no -(-a // b) ceil
        cols_padded = n_groups * g
        row_bytes = cols_padded * fb // 8
        packed, norms, codebook = W.packed, W.norms, W.codebook
        if (not isinstance(packed, np.ndarray) or packed.dtype != np.uint8
                or packed.shape != (rows, row_bytes) or not packed.flags.c_contiguous):
            _fail("CQ packed", f"C-contiguous uint8 array of shape {(rows, row_bytes)}", _describe(packed))
        if (not isinstance(norms, np.ndarray) or norms.dtype not in (np.float16, np.float32)
                or norms.shape != (rows, n_groups)):
            _fail("CQ norms", f"float16 array of shape {(rows, n_groups)}", _describe(norms))
        if (not isinstance(codebook, np.ndarray) or codebook.dtype != np.float32
                or codebook.shape != (1 << fb,)):
            _fail("CQ codebook", f"float32 array of shape {(1 << fb,)}", _describe(codebook))
        if not np.isfinite(codebook).all():
            _fail("CQ codebook", "finite values", codebook)

        # SIMD chunk geometry: 8 lanes of F fields (F = 32/fb, or 8 at 3 bits)
        F = 8 if fb == 3 else 32 // fb
        C = 8 * F
        n_chunks = (cols_padded + C - 1) // C
        norm_stride = (n_chunks * C + g - 1) // g
        # (16 spare floats: the integer kernel loads 16 lane norms at a time)
        norms32 = np.zeros(rows * norm_stride + 16, np.float32)
        norms32[: rows * norm_stride].reshape(rows, norm_stride)[:, :n_groups] = norms
        if not np.isfinite(norms32).all():
            _fail("CQ norms", "finite values", "NaN or infinity")

        self._packed = packed
        self._norms32 = norms32
        self._codebook = np.ascontiguousarray(codebook)
        cdef const cnp.uint8_t[:, ::1] pv = packed
        cdef float[::1] nv = norms32
        cdef CQView* v = &self.view
        v.packed = &pv[0, 0]
        v.packed_end = v.packed + rows * row_bytes
        v.norms = &nv[0]
        v.rows = rows
        v.cols = cols
        v.cols_padded = cols_padded
        v.n_groups = n_groups
        v.row_bytes = row_bytes
        v.norm_stride = norm_stride
        v.chunk_fields = C
        v.chunk_bytes = C * fb // 8
        v.n_chunks = n_chunks
        v.padded_len = n_chunks * C
        v.bits = bits
        v.field_bits = fb
        v.group_size = g
        # a lane's F fields must lie in one group for the per-lane norms
        v.simd = 1 if (nc_cq_cpu_has_avx2() and g >= (32 if fb == 4 else F)) else 0
        for i in range(16):
            v.codebook[i] = codebook[i] if i < (1 << fb) else 0.0
        # register tables: vpermps reads the low 3 bits of an index, so narrow
        # codebooks are repeated; 4 bits use entries 0–7 and 8–15 plus a blend
        for i in range(16):
            if fb == 4:
                v.simd_table[i] = codebook[i]
            elif i < 8:
                v.simd_table[i] = codebook[i & ((1 << fb) - 1)]
            else:
                v.simd_table[i] = 0.0
        # 4 bits: byte planes of the codebook for vpshufb (plane b = byte b of every codeword)
        # lane order of the rotated activation: chunk position s·8 + l ← field
        # offset of lane l at step s (see _rotate_token and the kernels)
        cdef Py_ssize_t s, l, b
        for s in range(F):
            for l in range(8):
                if fb == 4:
                    # byte planes: step s = 4h + q, lane l reads packed byte
                    # b = 4q + l (l < 4) or 16 + 4q + l − 4, whose nibble h is field 2b + h
                    b = 4 * (s & 3) + (l if l < 4 else 12 + l)
                    v.lane_perm[s * 8 + l] = <int>(2 * b + (s >> 2))
                else:
                    # lane l holds fields l·F .. l·F + F − 1; step s reads field s of every lane
                    v.lane_perm[s * 8 + l] = <int>(l * F + s)
        # (copied as bytes: a float round trip could alter NaN-like bit patterns)
        planes = np.zeros(64, np.uint8)
        if fb == 4:
            cb_bytes = np.ascontiguousarray(codebook, dtype="<f4").view(np.uint8).reshape(16, 4)
            planes = np.ascontiguousarray(cb_bytes.T).reshape(64)
        cdef const uint8_t[::1] plane_view = planes
        memcpy(<void*>&v.simd_table[16], &plane_view[0], 64)
        self._init_int(codebook, fb)

    def _init_int(self, codebook, Py_ssize_t fb):
        """Tables of the integer kernel (A8 inputs); see the module docstring."""
        cdef CQView* v = &self.view
        cdef Py_ssize_t g = v.group_size, int_fb = 4 if fb == 3 else fb, i
        v.a8_input = 0
        v.lut_ok = 0
        v.lut_kernel = 0
        v.amx_ok = 0
        self._lut_bits = self._lut_norms = None
        self._lut_old = []
        v.int_fb = <int>int_fb
        v.int_packed = v.packed
        v.int_packed_end = v.packed_end
        v.int_row_bytes = v.row_bytes
        self._int_packed = None
        # a lane sums 16/int_fb consecutive fields (one group); |z| <= 127·g fits int16
        v.int_ok = 1 if (16 // int_fb <= g <= 256) else 0
        if not v.int_ok:
            return
        if fb == 3:  # 8 fields per 3 bytes → one field per nibble (a copy, once)
            runs = np.asarray(self._packed).reshape(v.rows, -1, 3).astype(np.uint32)
            words = runs[:, :, 0] | (runs[:, :, 1] << 8) | (runs[:, :, 2] << 16)
            fields = (words[:, :, None] >> (3 * np.arange(8, dtype=np.uint32))) & 7
            fields = fields.reshape(v.rows, -1).astype(np.uint8)
            nib = np.ascontiguousarray(fields[:, 0::2] | (fields[:, 1::2] << 4))
            self._int_packed = nib
            v.int_row_bytes = nib.shape[1]
            v.int_packed = <const uint8_t*>cnp.PyArray_DATA(nib)
            v.int_packed_end = v.int_packed + v.rows * v.int_row_bytes
        cdef Py_ssize_t C = 256 // int_fb, steps = 8 // int_fb
        # int32 products a lane sums between two conversions to float (a group, or a chunk)
        cdef Py_ssize_t per = g // C if g >= C else 1
        cdef Py_ssize_t products = 2 * steps * per
        cdef long long M = min(16384, (2 ** 31 - 1) // (products * 127 * g))  # |hi|, |lo| <= M
        B = 1 << M.bit_length()                    # lo in [-B/2, B/2], B/2 <= M
        cb = np.asarray(codebook, np.float64)
        top = float(np.abs(cb).max())
        E = 0 if top == 0 else int(math.floor(math.log2((M - 1) * B / top)))
        code = np.rint(np.ldexp(cb, E))            # codeword·2^E, ≥ 25 significant bits
        hi = np.rint(code / B)
        lo = code - hi * B
        n_cb = len(cb)
        for i in range(32):
            j = i & ((1 << int_fb) - 1)
            v.int_table[i] = <int16_t>(hi[j] if j < n_cb else 0)
            v.int_table[32 + i] = <int16_t>(lo[j] if j < n_cb else 0)
        v.int_base = <float>B
        v.int_descale = <float>(math.ldexp(1.0, -E) / math.sqrt(g))
        self._init_amx(cb, int_fb)
        for i in range(C):  # step s = i // 32 reads field s of byte w = i % 32
            v.int_perm[i] = <int16_t>((i % 32) * (8 // int_fb) + i // 32)

    def _init_amx(self, cb, Py_ssize_t int_fb):
        """Tables of the tile kernel (reference.cq.amx_tables): each codeword as three
        signed bytes, repeated with period 2^int_fb like the integer tables."""
        cdef CQView* v = &self.view
        cdef Py_ssize_t i, j
        v.amx_ok = 0
        if v.group_size not in (64, 128, 256) or v.int_row_bytes * 8 < v.cols_padded * int_fb:
            return
        top = float(np.abs(cb).max())
        E = 0 if top == 0 else int(math.floor(math.log2(AMX_CODE_MAX / top)))
        C = np.rint(np.ldexp(cb, E)).astype(np.int64)
        c0 = ((C + 128) & 255) - 128
        r = (C - c0) >> 8
        c1 = ((r + 128) & 255) - 128
        c2 = (r - c1) >> 8
        for i in range(16):
            j = i & ((1 << int_fb) - 1)
            v.amx_pieces[i] = <int8_t>(c2[j] if j < len(cb) else 0)
            v.amx_pieces[16 + i] = <int8_t>(c1[j] if j < len(cb) else 0)
            v.amx_pieces[32 + i] = <int8_t>(c0[j] if j < len(cb) else 0)
        v.amx_descale = <float>(math.ldexp(1.0, -E) / math.sqrt(v.group_size))
        v.amx_ok = 1

    def _lut_possible(self, int kernel=7):
        """Whether enable_lut would make the layout of lookup kernel `kernel` (7
        avx512lut, 8 avx2lut), or made it: the one rule, for enable_lut and for kernel()."""
        cdef CQView* v = &self.view
        if v.lut_ok and v.lut_kernel == kernel:
            return True
        if not (lut_applies(v.bits, v.group_size) and v.int_ok and v.rows >= LUT_MIN_ROWS):
            return False
        if kernel == 7:
            return bool(NC_CQ_HAVE_LUT and nc_cq_cpu_has_avx512bw())
        return kernel == 8 and bool(NC_CQ_HAVE_LUT_AVX2 and nc_cq_cpu_has_avx2())

    def enable_lut(self, arena=None, kernel=None):
        """Make the lookup layout of a lookup kernel if this matrix can take it
        (lut_applies: 2- or 4-bit fields, a group size of 16 … 256, LUT_MIN_ROWS rows)
        and the CPU runs the kernel: kernel 'avx512lut' (csrc/cq_lut.h, AVX-512 F/BW/VL)
        or 'avx2lut' (csrc/cq_lut_avx2.h, AVX2+FMA); by default the one in force, else
        the CPU's (avx512lut where it has AVX-512 F/BW/VL).  A copy as large as the
        packed rows (3-bit ones as nibbles) plus the norms again, made once; the engine
        asks for it in deploy numerics, the a8=True wrappers below too.  arena: a
        LutArena to place it in (the engine's, on huge pages), else its own arrays.
        A layout of the other kernel is replaced (and kept alive: views copied before
        still read it).  Returns whether the matrix has it (idempotent)."""
        cdef CQView* v = &self.view
        cdef int k = _lut_kernel_id(kernel)
        if v.lut_ok and v.lut_kernel == k:
            return True
        if not self._lut_possible(k):
            return False
        cdef Py_ssize_t B = 32 if k == 8 else 16, n_dw = v.cols_padded * v.int_fb // 32
        cdef Py_ssize_t n_rb = (v.rows + B - 1) // B
        if v.int_row_bytes != 4 * n_dw:   # (whole dwords: a group is 16 fields or more)
            raise ValueError(f"enable_lut: {v.int_row_bytes} bytes a row, expected {4 * n_dw}")
        # the same bytes in both layouts: B rows of 4·n_dw bytes a block
        bits = (arena.zeros if arena is not None else np.zeros)(n_rb * n_dw * B, np.uint32)
        pnorms = (arena.zeros if arena is not None else np.zeros)(n_rb * v.n_groups * B, np.float32)
        cdef uint32_t[::1] bv = bits
        cdef float[::1] pv = pnorms
        with nogil:
            if k == 8:
                nc_cqs_relayout(v.int_packed, v.int_row_bytes, v.rows, v.norms, v.norm_stride, v.n_groups,
                                <uint8_t*>&bv[0], &pv[0])
            else:
                nc_cql_relayout(v.int_packed, v.int_row_bytes, v.rows, n_dw, v.norms, v.norm_stride, v.n_groups,
                                &bv[0], &pv[0])
        if self._lut_bits is not None:
            self._lut_old.append((self._lut_bits, self._lut_norms))
        self._lut_bits, self._lut_norms = bits, pnorms
        v.lut_bits = &bv[0]
        v.lut_norms = &pv[0]
        v.lut_n_dw = n_dw
        v.lut_descale = <float>(1.0 / math.sqrt(v.group_size))
        v.lut_kernel = k
        v.lut_ok = 1
        return True

    @property
    def lut_layout(self):
        """True once enable_lut made a lookup layout (lut_kernel: whose)."""
        return bool(self.view.lut_ok)

    @property
    def lut_kernel(self):
        """The lookup kernel whose layout enable_lut made last ('avx512lut' or 'avx2lut'), or None."""
        return _INT_NAMES[self.view.lut_kernel] if self.view.lut_ok else None

    @property
    def rows(self):
        return self.view.rows

    @property
    def cols(self):
        return self.view.cols

    @property
    def bits(self):
        return self.view.bits

    @property
    def group_size(self):
        return self.view.group_size

    @property
    def simd(self):
        """True when the AVX2 kernels run this matrix (CPU support and group size permitting)."""
        return bool(nc_cq_use_simd(self.view.simd))

    @property
    def int_tables(self):
        """True when this matrix has integer-kernel tables (group size 16/width .. 256)."""
        return bool(self.view.int_ok)

    def kernel(self, a8=False):
        """Name of the inner loop a matvec of this matrix runs now (A8 input or float input)."""
        cdef int k = nc_cq_active_int_kernel()
        if a8 and self.view.int_ok and k > 0:
            # (the wrappers make the layout when they can)
            if k == 7 and not self._lut_possible(7):
                return _INT_NAMES[nc_cq_lut_base()]
            if not (k == 8 and not self._lut_possible(8)):
                return _INT_NAMES[k]
            if nc_cq_avx2lut_base:      # avx2lut's other matrices: its base kernel
                return _INT_NAMES[nc_cq_avx2lut_base]
        return "avx2" if self.simd else "scalar"

    def __repr__(self):
        return (f"CQWeight({self.view.rows}x{self.view.cols}, bits={self.view.bits}, "
                f"group_size={self.view.group_size}, kernel={self.kernel()}, "
                f"a8_kernel={self.kernel(True)})")


# Fewer rows than this keep the two-product kernel: a token's tables (64 bytes per two
# inputs, 96 KB for the 3072 inputs of the mHC Φ) cost about what two or three 16-row
# blocks of lookups save, and the Φ matrices have 4 and 16 rows.
LUT_MIN_ROWS = int(os.environ.get("NEEDLE_CY_LUT_MIN_ROWS", "64"))


class LutArena:
    """Memory for the lookup layouts of one model, on transparent huge pages where the
    OS has them (Linux madvise; elsewhere plain pages).  A decode step streams every
    layout from DRAM, and with 4 KB pages the TLB misses cost about a quarter of the
    streaming speed (benchmarks/history/cq.md, lookup-kernel notes).  Blocks of `block` bytes (a whole number of
    2 MB pages), carved in 64-byte aligned pieces; each piece keeps its block alive."""

    PAGE = 1 << 21

    def __init__(self, block=32 << 20):
        self.block = -(-int(block) // self.PAGE) * self.PAGE
        self._buf = None
        self._used = 0

    def _new_block(self, nbytes):
        import mmap
        size = max(self.block, -(-nbytes // self.PAGE) * self.PAGE)
        # private and anonymous (zeroed): a shared anonymous map is shmem, whose huge
        # pages are a separate switch that is usually off
        flags = getattr(mmap, "MAP_PRIVATE", 0) | getattr(mmap, "MAP_ANONYMOUS", 0)
        mm = mmap.mmap(-1, size + self.PAGE, flags=flags) if flags else mmap.mmap(-1, size + self.PAGE)
        buf = np.frombuffer(mm, np.uint8)
        start = (-buf.ctypes.data) % self.PAGE         # the first 2 MB boundary inside
        advice = getattr(mmap, "MADV_HUGEPAGE", None)
        if advice is not None:
            try:
                mm.madvise(advice, start, size)
            except (OSError, ValueError):              # no THP here: plain pages
                pass
        self._buf, self._used = buf[start:start + size], 0

    def zeros(self, n, dtype):
        """A zeroed 1-D array of n elements of dtype in the arena."""
        dtype = np.dtype(dtype)
        nbytes = int(n) * dtype.itemsize
        if self._buf is None or self._used + nbytes > len(self._buf):
            self._new_block(nbytes)
        piece = self._buf[self._used:self._used + nbytes].view(dtype)
        self._used += -(-nbytes // 64) * 64
        return piece


_prepared = weakref.WeakKeyDictionary()


def prepare(W):
    """The CQWeight of a CQMatrix (built once per matrix and cached weakly)."""
    if isinstance(W, CQWeight):
        return W
    try:
        cached = _prepared.get(W)
    except TypeError:  # not weak-referenceable / hashable: no caching
        return CQWeight(W)
    if cached is None:
        cached = CQWeight(W)
        _prepared[W] = cached
    return cached


def simd_kernel():
    """Name of the inner loop in use: 'avx2' or 'scalar'."""
    return "avx2" if nc_cq_use_simd(1) else "scalar"


_INT_NAMES = {1: "avx512bw", 2: "avx512vnni", 3: "avx2int", 4: "avxvnni", 5: "neon", 6: "neon_dotprod",
              7: "avx512lut", 8: "avx2lut"}
_INT_IDS = {name: k for k, name in _INT_NAMES.items()}
KERNELS = ("avx512lut", "avx512vnni", "avxvnni", "avx512bw", "avx2lut", "avx2int", "neon_dotprod", "neon", "avx2",
           "scalar")  # best first
LUT_KERNELS = ("avx512lut", "avx2lut")   # the table lookups (reference.cq.matmul_lut's numerics)


def lut_applies(bits, group_size):
    """Whether the lookup kernels (avx512lut, avx2lut) run matrices of this width and
    group size: 2-bit fields (2 bits or ternary) or 4-bit ones (4 bits, 3 bits as
    nibbles) and a group of whole dwords within the integer path's 16 … 256
    (needle_cy.reference.cq.lut_applies is the same rule)."""
    return bits in (2, 3, 4, TERNARY_BITS) and 16 <= group_size <= 256
INT_KERNELS = tuple(k for k in KERNELS if k in _INT_IDS)   # the integer ones (A8 inputs)


def _lut_kernel_id(name=None):
    """The id of lookup kernel `name` ('avx512lut' 7, 'avx2lut' 8); None: the one in
    force, else this CPU's (7 where it has AVX-512 F/BW/VL, else 8)."""
    if name is None:
        k = nc_cq_active_int_kernel()
        if k == 7 or k == 8:
            return k
        return 7 if (NC_CQ_HAVE_LUT and nc_cq_cpu_has_avx512bw()) else 8
    if name not in LUT_KERNELS:
        raise ValueError(f"expected a lookup kernel, one of {LUT_KERNELS}, got {name!r}")
    return _INT_IDS[name]


def available_kernels():
    """Kernels this CPU can run, best first: 'avx512lut' (2- and 4-bit matrices by table
    lookup, the others on the next AVX-512 kernel), 'avx512vnni', 'avxvnni', 'avx512bw',
    'avx2lut' (2- and 4-bit matrices by table lookup with AVX2, the others on its base:
    lut_base_kernel('avx2lut')) and 'avx2int' (integer, A8 inputs; float inputs then take
    'avx2'), 'neon_dotprod' and 'neon' (integer, aarch64; float inputs take 'scalar'),
    'avx2' (float), 'scalar' (portable)."""
    found = []
    if NC_CQ_HAVE_LUT and nc_cq_cpu_has_avx512bw():
        found.append("avx512lut")
    if nc_cq_cpu_has_avx512vnni():
        found.append("avx512vnni")
    if nc_cq_cpu_has_avxvnni():
        found.append("avxvnni")
    if nc_cq_cpu_has_avx512bw():
        found.append("avx512bw")
    if nc_cq_cpu_has_neon_dotprod():
        found.append("neon_dotprod")
    if nc_cq_cpu_has_neon():
        found.append("neon")
    if nc_cq_cpu_has_avx2():
        found += (["avx2lut"] if NC_CQ_HAVE_LUT_AVX2 else []) + ["avx2int", "avx2"]
    return found + ["scalar"]


AUTO_INT256 = bool(NC_CQ_AUTO_INT256)   # whether 'auto' takes avxvnni (see pick_int_kernel)


def pick_int_kernel(avx512bw=False, avx512vnni=False, avxvnni=False, avx2=False, int256=None):
    """The integer kernel 'auto' takes on a CPU with these features (AVX-512 BW meaning
    F/BW/VL, avx2 meaning AVX2+FMA), or None (float kernels): avx512lut with AVX-512 BW,
    else (with int256) avxvnni, else avx2lut with AVX2+FMA.  int256 (default AUTO_INT256,
    False in this build: no AVX-VNNI CPU was measured, and avx2int is slower than the
    float kernels) says whether 'auto' takes avxvnni; avx2int it never takes.  The
    selection rule on its own, so that tests can try CPUs other than this one."""
    if int256 is None:
        int256 = AUTO_INT256
    k = nc_cq_pick_int_kernel(bool(avx512bw), bool(avx512vnni), bool(avxvnni), bool(avx2), bool(int256))
    return _INT_NAMES.get(k)


def lut_base_kernel(kernel="avx512lut"):
    """The kernel a lookup kernel runs the matrices that its lookups do not (lut_applies,
    LUT_MIN_ROWS) on.  avx512lut: 'avx512vnni' where the CPU has VNNI, else 'avx512bw'
    (None without AVX-512).  avx2lut: 'avx2' (the float kernels) or 'avx2int'
    (set_avx2lut_base; None without AVX2)."""
    if kernel == "avx2lut":
        if not (NC_CQ_HAVE_LUT_AVX2 and nc_cq_cpu_has_avx2()):
            return None
        return _INT_NAMES[nc_cq_avx2lut_base] if nc_cq_avx2lut_base else "avx2"
    if kernel != "avx512lut":
        raise ValueError(f"lut_base_kernel: expected 'avx512lut' or 'avx2lut', got {kernel!r}")
    if not (NC_CQ_HAVE_LUT and nc_cq_cpu_has_avx512bw()):
        return None
    return _INT_NAMES.get(nc_cq_lut_base())


def set_avx2lut_base(name):
    """What avx2lut runs the matrices without its layout on: 'avx2' (the float kernels,
    the default: faster than avx2int on the AVX2 CPUs measured, benchmarks/history/cq.md)
    or 'avx2int' (the integer numerics).  For tests and comparisons; returns the previous
    lut_base_kernel('avx2lut')."""
    global nc_cq_avx2lut_base
    if name not in ("avx2", "avx2int"):
        raise ValueError(f"set_avx2lut_base: expected 'avx2' or 'avx2int', got {name!r}")
    previous = "avx2int" if nc_cq_avx2lut_base else "avx2"
    nc_cq_avx2lut_base = 3 if name == "avx2int" else 0
    return previous


_LUT_DOTS = ("bw", "vnni", "vbmi")     # nc_cql_dot's values 0, 1, 2 (csrc/cq_lut.h)


def lut_dot(name=None):
    """Which row loops of the lookups run: 'vbmi' (byte tables, vpermb + vpdpbusd;
    csrc/cq_lut_bytes_tmpl.h), 'vnni' (int16 tables, vpermw + vpdpwssd) or 'bw' (vpermw +
    vpmaddwd + vpaddd; csrc/cq_lut_rows_tmpl.h), all three the same bits; by default the first
    this CPU has.  name: force one for a test or a comparison ('vnni' only where the CPU
    has AVX-512 VNNI, 'vbmi' where it also has VBMI).  Returns the previous one (None
    without the lookup kernel)."""
    if not (NC_CQ_HAVE_LUT and nc_cq_cpu_has_avx512bw()):
        return None
    global nc_cql_dot
    previous = _LUT_DOTS[nc_cql_dot_mode()]     # (the CPU's default on first use)
    if name is not None:
        if not lut_dot_available(name):
            raise ValueError(f"lut_dot: expected 'bw', 'vnni' (with AVX-512 VNNI) or 'vbmi' (with AVX-512 "
                             f"VNNI and VBMI), got {name!r}")
        nc_cql_dot = _LUT_DOTS.index(name)
    return previous


def lut_dot_available(name):
    """Whether this CPU (and build) can run the lookups' row loops `name` (see lut_dot)."""
    if not (NC_CQ_HAVE_LUT and nc_cq_cpu_has_avx512bw()) or not isinstance(name, str):
        return False
    return {"bw": True, "vnni": bool(nc_cq_cpu_has_avx512vnni()),
            "vbmi": bool(nc_cq_cpu_has_avx512vbmi())}.get(name, False)


def kernel_name(a8=True):
    """The kernel a matvec takes now: for an A8 input (deploy numerics) by default,
    for a float input with a8=False.  (A matrix without integer tables, see
    CQWeight.kernel, takes the float one.)"""
    k = nc_cq_active_int_kernel()
    if a8 and k > 0:
        return _INT_NAMES[k]
    return simd_kernel()


def set_kernel(name):
    """Force a kernel ('avx512lut', 'avx512vnni', 'avxvnni', 'avx512bw', 'avx2lut', 'avx2int',
    'neon_dotprod', 'neon' = integer or lookups on A8 inputs, float AVX2 (x86) or scalar
    (aarch64) otherwise;
    'avx2' = float AVX2 only, 'scalar' = the portable float loops) or go back to the
    best one ('auto').  Returns the
    previous kernel_name().  For tests and comparisons; the environment variable
    NEEDLE_CY_CQ_KERNEL does the same at import."""
    global nc_cq_int_kernel, nc_cq_simd_enabled
    previous = kernel_name()
    if name == "auto":
        nc_cq_int_kernel = nc_cq_best_int_kernel()
        nc_cq_simd_enabled = nc_cq_cpu_has_avx2()
        return previous
    if name not in KERNELS:
        raise ValueError(f"CQ kernel must be 'auto' or one of {KERNELS}, got {name!r}")
    if name not in available_kernels():
        raise ValueError(f"CQ kernel {name!r} needs an instruction set this CPU lacks "
                         f"(available: {available_kernels()})")
    nc_cq_int_kernel = _INT_IDS.get(name, 0)
    nc_cq_simd_enabled = 0 if name == "scalar" else nc_cq_cpu_has_avx2()
    return previous


def _kernel_from_environment():
    import warnings
    name = os.environ.get("NEEDLE_CY_CQ_KERNEL", "auto").strip() or "auto"
    try:
        set_kernel(name)
    except ValueError as exc:
        warnings.warn(f"NEEDLE_CY_CQ_KERNEL ignored: {exc}", RuntimeWarning)
        set_kernel("auto")


_kernel_from_environment()


def amx_available():
    """Whether this build and CPU can run the tile kernel (AMX-TILE + AMX-INT8, AVX-512
    BW, the OS's tile state granted to this process)."""
    return bool(NC_CQ_HAVE_AMX and nc_cqa_cpu_supported())


def amx_mode():
    """'tiles' when A8 matmuls of AMX_MIN_TOKENS or more tokens run on the AMX tiles
    (with an AVX-512 integer kernel active), 'portable' when the tile kernel's numerics
    run in the portable loop (tests), 'off' otherwise."""
    return {0: "off", 1: "tiles", 2: "portable"}[nc_cqa_enabled]


def set_amx(mode):
    """Set the tile kernel: True/'tiles' (where amx_available), False/'off', or
    'portable' (its numerics in a scalar loop, on any CPU: for tests).  Returns the
    previous amx_mode().  NEEDLE_CY_CQ_AMX=0 turns it off at import."""
    global nc_cqa_enabled
    previous = amx_mode()
    if mode is True or mode == "tiles":
        if not amx_available():
            raise ValueError("the AMX tile kernel needs AMX-TILE + AMX-INT8 and AVX-512 BW on "
                             "x86-64 Linux, with the OS's tile state; this CPU or build lacks them")
        nc_cqa_enabled = 1
    elif mode is False or mode == "off":
        nc_cqa_enabled = 0
    elif mode == "portable":
        nc_cqa_enabled = 2
    else:
        raise ValueError(f"set_amx takes True/'tiles', False/'off' or 'portable', got {mode!r}")
    return previous


AMX_MIN = AMX_MIN_TOKENS
nc_cqa_enabled = 1 if (os.environ.get("NEEDLE_CY_CQ_AMX", "1").strip() not in ("0", "off")
                       and NC_CQ_HAVE_AMX and nc_cqa_cpu_supported()) else 0


def set_simd(enabled):
    """Allow (True, the default where the CPU has AVX2+FMA) or forbid the AVX2 kernels.

    For tests and comparisons; returns the previous setting."""
    global nc_cq_simd_enabled
    previous = bool(nc_cq_use_simd(1))
    nc_cq_simd_enabled = 1 if (enabled and nc_cq_cpu_has_avx2()) else 0
    return previous


# ---------------------------------------------------------------------------
# Python wrappers: validate, then run the nogil kernels
# ---------------------------------------------------------------------------

def _as_float32(name, a, shape):
    arr = np.asarray(a)
    if arr.dtype.kind != "f":
        _fail(name, "a float array", _describe(arr))
    if arr.shape != shape:
        _fail(f"{name} shape", shape, arr.shape)
    return np.ascontiguousarray(arr, dtype=np.float32)


def _check_out(name, out, shape):
    if out is None:
        return np.empty(shape, np.float32)
    if (not isinstance(out, np.ndarray) or out.dtype != np.float32 or out.shape != shape
            or not out.flags.c_contiguous or not out.flags.writeable):
        _fail(name, f"writeable C-contiguous float32 array of shape {shape}", _describe(out))
    return out


cdef inline bint _is_f32_vector(object a, Py_ssize_t n, bint writeable):
    """Fast path: already a C-contiguous float32 ndarray of length n (no conversion needed)."""
    cdef cnp.ndarray arr
    if type(a) is not np.ndarray:
        return False
    arr = <cnp.ndarray>a
    return (cnp.PyArray_TYPE(arr) == cnp.NPY_FLOAT32 and cnp.PyArray_NDIM(arr) == 1
            and cnp.PyArray_DIM(arr, 0) == n and cnp.PyArray_IS_C_CONTIGUOUS(arr)
            and (not writeable or cnp.PyArray_ISWRITEABLE(arr)))


cdef CQView _call_view(CQWeight cw, bint a8):
    """cw's view for one call of the wrappers below: a8, the inputs are A8 vectors
    (deploy numerics: the integer kernels, the lookup layout made where it applies)."""
    cdef int k = nc_cq_active_int_kernel()
    if a8 and (k == 7 or k == 8) and not (cw.view.lut_ok and cw.view.lut_kernel == k):
        cw.enable_lut()
    cdef CQView va = cw.view
    va.a8_input = 1 if a8 else 0
    return va


def matvec(W, x, out=None, threads=None, a8=False):
    """y = W · x: W a CQMatrix (or CQWeight) [rows, cols], x [cols] → float32 [rows].

    a8=True: x is an A8 vector (deploy numerics); the integer kernel runs where it
    can (an x that is not one takes the float kernel)."""
    cdef CQWeight cw = W if type(W) is CQWeight else prepare(W)
    cdef CQView va = _call_view(cw, a8)
    cdef const CQView* v = &va
    cdef cnp.ndarray xa = x if _is_f32_vector(x, v.cols, False) else _as_float32("matvec x", x, (v.cols,))
    cdef cnp.ndarray y
    cdef cnp.npy_intp n_rows = v.rows
    if out is None:
        y = cnp.PyArray_EMPTY(1, &n_rows, cnp.NPY_FLOAT32, 0)
    elif _is_f32_vector(out, v.rows, True):
        y = out
    else:
        y = _check_out("matvec out", out, (v.rows,))
    cdef int n = get_num_threads(threads)
    cdef const float* xp = <const float*>cnp.PyArray_DATA(xa)
    cdef float* yp = <float*>cnp.PyArray_DATA(y)
    cdef Py_ssize_t nwork = cq_work_floats(v, 1, n)
    cdef float* work = <float*>malloc(nwork * sizeof(float))
    if work == NULL:
        raise MemoryError(f"matvec: cannot allocate {nwork * 4} bytes of workspace")
    with nogil:
        cq_matvec(v, xp, yp, work, n)
    free(work)
    return y


def matmul(W, X, out=None, threads=None, a8=False):
    """Y = X · Wᵀ: X [T, cols] → float32 [T, rows] (every token in one pass over W).
    a8: as for matvec (the integer matmul runs when every row of X is an A8 vector)."""
    cdef CQWeight cw = prepare(W)
    cdef CQView va = _call_view(cw, a8)
    cdef const CQView* v = &va
    Xa = np.asarray(X)
    if Xa.ndim != 2:
        _fail("matmul X", f"a 2-D [T, {v.cols}] array", _describe(Xa))
    Xa = _as_float32("matmul X", Xa, (Xa.shape[0], v.cols))
    cdef Py_ssize_t T = Xa.shape[0]
    Y = _check_out("matmul out", out, (T, v.rows))
    if T == 0:
        return Y
    cdef int n = get_num_threads(threads)
    cdef const float[:, ::1] xv = Xa
    cdef float[:, ::1] yv = Y
    cdef Py_ssize_t nwork = cq_work_floats(v, T, n)
    cdef float* work = <float*>malloc(nwork * sizeof(float))
    if work == NULL:
        raise MemoryError(f"matmul: cannot allocate {nwork * 4} bytes of workspace")
    try:
        with nogil:
            cq_matmul(v, &xv[0, 0], T, v.cols, &yv[0, 0], v.rows, work, n)
    finally:
        free(work)
    return Y


def _matmul_pieces(W, X, row_cut, token_cut, a8=False, scratch=True):
    """matmul computed in four pieces on one thread, rows [0, row_cut) / [row_cut, rows)
    × tokens [0, token_cut) / [token_cut, T), by cq_matmul_rotated_rows (the split the
    engine's parallel regions make; for tests: it must equal matmul bit for bit).
    row_cut: a multiple of 16 (the float kernel's row block).  scratch=False: no
    thread scratch (what a failed malloc leaves), for the kernels' fallbacks."""
    cdef CQWeight cw = prepare(W)
    cdef CQView va = _call_view(cw, a8)
    cdef const CQView* v = &va
    Xa = _as_float32("matmul X", np.asarray(X), (np.asarray(X).shape[0], v.cols))
    cdef Py_ssize_t T = Xa.shape[0], rc = row_cut, tc = token_cut
    if not (0 <= rc <= v.rows and rc % 16 == 0 and 0 <= tc <= T and T > 0):
        raise ValueError("row_cut must be a multiple of 16 in [0, rows], token_cut in [0, T]")
    Y = np.full((T, v.rows), np.nan, np.float32)
    cdef const float[:, ::1] xv = Xa
    cdef float[:, ::1] yv = Y
    cdef float* work = <float*>malloc(cq_work_floats(v, T, 1) * sizeof(float))
    cdef float* wdec = cq_decode_scratch() if scratch else NULL
    try:
        with nogil:
            cq_rotate(v, &xv[0, 0], T, v.cols, work, 1)
            cq_matmul_rotated_rows(v, work, T, 0, tc, &yv[0, 0], v.rows, 0, rc, wdec)
            cq_matmul_rotated_rows(v, work, T, 0, tc, &yv[0, 0], v.rows, rc, v.rows, wdec)
            cq_matmul_rotated_rows(v, work, T, tc, T, &yv[0, 0], v.rows, 0, rc, wdec)
            cq_matmul_rotated_rows(v, work, T, tc, T, &yv[0, 0], v.rows, rc, v.rows, wdec)
    finally:
        free(work)
        cq_free_decode_scratch(wdec)
    return Y


def _matmul_token_shares(W, X, nt, a8=True, scratch=True):
    """matmul with the rotation made as a team of nt threads makes it in a prefill chunk
    (cq_rotate_tokens for each tid in turn, each with its own scratch, then the verdict;
    thread 0's cq_rotate where it fails), then the products on one thread.  Returns (Y,
    whether the shares stood).  For tests: Y must equal matmul bit for bit.
    scratch=False: no thread scratch (a failed malloc)."""
    cdef CQWeight cw = prepare(W)
    cdef CQView va = _call_view(cw, a8)
    cdef const CQView* v = &va
    Xa = _as_float32("matmul X", np.asarray(X), (np.asarray(X).shape[0], v.cols))
    cdef Py_ssize_t T = Xa.shape[0]
    cdef int n = int(nt), tid
    if T < 2 or n < 1:
        raise ValueError("_matmul_token_shares: expects at least 2 tokens and 1 thread")
    Y = np.full((T, v.rows), np.nan, np.float32)
    cdef const float[:, ::1] xv = Xa
    cdef float[:, ::1] yv = Y
    cdef float* work = <float*>malloc(cq_work_floats(v, T, 1) * sizeof(float))
    cdef float* kf = cq_decode_scratch() if scratch else NULL
    cdef bint shared = True, stood
    try:
        with nogil:
            for tid in range(n):
                shared = cq_rotate_tokens(v, &xv[0, 0], T, v.cols, work, tid, n, kf,
                                          SCRATCH_FLOATS if kf != NULL else 0) and shared
            stood = shared and cq_rotate_tokens_ok(v, work, T)
            if not stood:
                cq_rotate(v, &xv[0, 0], T, v.cols, work, 1)
            cq_matmul_rotated(v, work, T, &yv[0, 0], v.rows, 1)
    finally:
        free(work)
        cq_free_decode_scratch(kf)
    return Y, bool(stood)


def _matvec_pieces(W, x, row_cut, a8=False):
    """matvec computed as rows [0, row_cut) and [row_cut, rows) by cq_matvec_rotated_rows
    (the decode step's split; for tests: it must equal matvec bit for bit)."""
    cdef CQWeight cw = prepare(W)
    cdef CQView va = _call_view(cw, a8)
    cdef const CQView* v = &va
    xa = _as_float32("matvec x", np.asarray(x), (v.cols,))
    cdef Py_ssize_t rc = row_cut
    if not 0 <= rc <= v.rows:
        raise ValueError("row_cut must lie in [0, rows]")
    y = np.full(v.rows, np.nan, np.float32)
    cdef const float[::1] xv = xa
    cdef float[::1] yv = y
    cdef float* work = <float*>malloc(cq_work_floats(v, 1, 1) * sizeof(float))
    try:
        with nogil:
            cq_rotate(v, &xv[0], 1, v.cols, work, 1)
            cq_matvec_rotated_rows(v, work, &yv[0], 0, rc)
            cq_matvec_rotated_rows(v, work, &yv[0], rc, v.rows)
    finally:
        free(work)
    return y


def multiply_shared(weights, x, threads=None, a8=False):
    """Several matrices times one input, rotating the input once (cq_rotate + cq_*_rotated).

    weights: CQMatrix/CQWeight objects with equal cols, group size and field width;
    x: [cols] (→ list of float32 [rows_i]) or [T, cols] (→ list of float32 [T, rows_i]).
    """
    cdef list cws = [prepare(W) for W in weights]
    if not cws:
        return []
    if a8 and nc_cq_active_int_kernel() in (7, 8):
        for each in cws:
            each.enable_lut()
    cdef CQWeight first = cws[0], other
    cdef CQView va0 = first.view, vb
    va0.a8_input = 1 if a8 else 0
    cdef const CQView* v0 = &va0
    for other in cws[1:]:
        vb = other.view
        if (vb.cols, vb.group_size, vb.field_bits) != (v0.cols, v0.group_size, v0.field_bits):
            _fail("multiply_shared weights",
                  f"equal cols / group_size / field width ({v0.cols}, {v0.group_size}, {v0.field_bits})",
                  (other.view.cols, other.view.group_size, other.view.field_bits))
    xa = np.asarray(x)
    vector = xa.ndim == 1
    if xa.ndim not in (1, 2):
        _fail("multiply_shared x", f"[{v0.cols}] or [T, {v0.cols}]", _describe(xa))
    X = _as_float32("multiply_shared x", xa.reshape(1, -1) if vector else xa,
                    (1 if vector else xa.shape[0], v0.cols))
    cdef Py_ssize_t T = X.shape[0]
    cdef int n = get_num_threads(threads)
    results = [np.empty((T, cw.rows), np.float32) for cw in cws]
    if T == 0:
        return results
    cdef const float* xp = <const float*>cnp.PyArray_DATA(X)
    cdef Py_ssize_t nwork = 0
    for other in cws:
        nwork = max(nwork, cq_work_floats(&other.view, T, n))
    cdef float* work = <float*>malloc(nwork * sizeof(float))
    cdef float* yp
    cdef CQView vr = va0       # the view the workspace was rotated for
    if work == NULL:
        raise MemoryError(f"multiply_shared: cannot allocate {nwork * 4} bytes of workspace")
    try:
        with nogil:
            cq_rotate(v0, xp, T, v0.cols, work, n)
        for other, Y in zip(cws, results):
            yp = <float*>cnp.PyArray_DATA(Y)
            vb = other.view
            vb.a8_input = va0.a8_input
            with nogil:
                if not cq_same_rotation(&vr, &vb):
                    # a lookup view after an integer one or the reverse (2-bit matrices
                    # of fewer than LUT_MIN_ROWS rows keep the integer kernel): rotate again
                    vr = vb
                    cq_rotate(&vr, xp, T, vr.cols, work, n)
                if T == 1:
                    cq_matvec_rotated(&vb, work, yp, n)
                else:
                    cq_matmul_rotated(&vb, work, T, yp, vb.rows, n)
    finally:
        free(work)
    return [Y[0] for Y in results] if vector else results


def dequantize_rows(W, ids, out=None):
    """Decode the rows ``ids`` of W (an embedding gather): float32 [len(ids), cols]."""
    cdef CQWeight cw = prepare(W)
    cdef const CQView* v = &cw.view
    ida = np.asarray(ids)
    if ida.size and ida.dtype.kind not in "iu":
        _fail("dequantize_rows ids", "integer row indices", _describe(ida))
    ida = np.ascontiguousarray(ida.reshape(-1), dtype=np.int64)
    if ida.size and (ida.min() < 0 or ida.max() >= v.rows):
        raise IndexError(f"dequantize_rows: row ids must lie in [0, {v.rows}), "
                         f"found {int(ida.min())}..{int(ida.max())}")
    cdef Py_ssize_t n = ida.shape[0], k
    rows_out = _check_out("dequantize_rows out", out, (n, v.cols))
    if n == 0:
        return rows_out
    cdef int64_t[::1] idv = ida
    cdef float[:, ::1] ov = rows_out
    cdef float* scratch = <float*>malloc(v.group_size * sizeof(float))
    if scratch == NULL:
        raise MemoryError("dequantize_rows: cannot allocate scratch")
    try:
        with nogil:
            for k in range(n):
                cq_dequantize_row(v, idv[k], &ov[k, 0], scratch)
    finally:
        free(scratch)
    return rows_out


def dequantize(W):
    """Decode the whole matrix: float32 [rows, cols] (tests and tools; kernels never do this)."""
    cdef CQWeight cw = prepare(W)
    return dequantize_rows(cw, np.arange(cw.view.rows))
