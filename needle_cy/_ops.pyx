# cython: language_level=3, wraparound=True
"""Forward-pass operators of Needle 3 in C (spec §3.8–§5), float32.

Each operator exists twice: a ``cdef ... nogil`` function on raw pointers
(declared in ``_ops.pxd``; the engine in ``_model.pyx`` calls these in its hot
loop) and a Python wrapper with the same name and semantics as the NumPy twin
in ``needle_cy.reference.ops`` (the differential tests compare the two).
Wrappers check shapes and dtypes before handing pointers to the C level,
which trusts them (bounds checking is off).
"""
import numpy as np
from needle_cy.cq_format import LLOYD_MAX_LEVELS  # the Gaussian levels of every CQ codebook (spec §3.2)
cimport numpy as cnp
from libc.math cimport sqrtf, expf, logf, fabsf, rintf, cosf, sinf, INFINITY
from libc.stdint cimport uint32_t, int64_t, int8_t, uint8_t
from libc.string cimport memcpy, memset
from needle_cy._parallel cimport nc_barrier, nc_barrier_wait, nc_barrier_wait_pf, nc_pf_stream

cnp.import_array()

# The operators' vector loops in C (needle_cy/csrc/): the float operators, and attention
# over the int8 KV cache; the Walsh–Hadamard transform is the one _cq rotates with.
cdef extern from "csrc/ops_float.h":
    float nc_dot(const float* a, const float* b, Py_ssize_t n) noexcept nogil
    float nc_absmax(const float* x, Py_ssize_t n) noexcept nogil
    void nc_a8_apply(float* x, Py_ssize_t n, float s, float qmax) noexcept nogil
    void nc_a8_codes(const float* x, Py_ssize_t n, float s, float qmax, int8_t* codes) noexcept nogil
    int nc_cond_logits(const float* m, Py_ssize_t d, const float* cond_v, Py_ssize_t R, float* logit) noexcept nogil
    int nc_cond_mix(const float* w, Py_ssize_t R, const float* cond_u, Py_ssize_t N,
                    float* c, Py_ssize_t i0, Py_ssize_t i1) noexcept nogil
    float nc_exp_sum(float* x, Py_ssize_t n, float scale, float sub) noexcept nogil
    void nc_mul_sigmoid(float* o, const float* g, Py_ssize_t n) noexcept nogil
    void nc_silu(float* x, Py_ssize_t n) noexcept nogil
    int nc_kron_avx2(const float* z, const float* A, const float* B,
                     Py_ssize_t ba, Py_ssize_t bb, float* tmp, float* out,
                     Py_ssize_t k0, Py_ssize_t k1) noexcept nogil
    int nc_attend_avx2(const float* q, Py_ssize_t q_stride, Py_ssize_t G,
                       const float* kt, Py_ssize_t k_stride, const float* vc,
                       Py_ssize_t dq, Py_ssize_t dv, float scale,
                       const Py_ssize_t* ranges, int n_ranges,
                       float* scores, Py_ssize_t score_stride,
                       float* out, Py_ssize_t out_stride) noexcept nogil
    float nc_max_from(const float* x, Py_ssize_t n, float mx) noexcept nogil
    int nc_sinkhorn4(float* M, int iters) noexcept nogil


cdef extern from "csrc/ops_kv_int8.h":
    int nc_i8_qcorr(const int8_t* q, Py_ssize_t dq) noexcept nogil
    void nc_i8_scores(const int8_t* q, Py_ssize_t q_stride, const float* qs, const int* qcorr,
                      Py_ssize_t G, const uint8_t* kq, Py_ssize_t k_stride, const float* ks,
                      Py_ssize_t nq4, Py_ssize_t a, Py_ssize_t b, float* scores,
                      Py_ssize_t score_stride) noexcept nogil
    void nc_i8_pv(float* scores, Py_ssize_t score_stride, Py_ssize_t G, const int8_t* vc,
                  const float* vs, Py_ssize_t dv, const Py_ssize_t* ranges, int n_ranges,
                  const float* inv, float* out, Py_ssize_t out_stride) noexcept nogil
    void nc_i8_detect() noexcept nogil
    int nc_i8_kernel() noexcept nogil
    int nc_i8_set_dot(int on) noexcept nogil


cdef extern from "csrc/wht.h":
    void nc_wht(float* x, Py_ssize_t n, float scale, int simd) noexcept nogil


cdef float dot_c(const float* a, const float* b, Py_ssize_t n) noexcept nogil:
    """Σ a·b (vectorised; the summation order differs from a plain loop in the last bits)."""
    return nc_dot(a, b, n)


cdef float RMS_EPS = 1e-6
cdef float CQ_NORM_EPS = 1e-12
cdef Py_ssize_t KV_GROUP = 64

# ---------------------------------------------------------------------------
# quantizers (spec §3.8, §3.9)
# ---------------------------------------------------------------------------

cdef inline float _a8_scale(const float* x, Py_ssize_t n, float qmax) noexcept nogil:
    cdef float amax = nc_absmax(x, n)
    return amax / qmax if amax > 0 else <float>1.0


cdef float a8_inplace(float* x, Py_ssize_t n, float qmax) noexcept nogil:
    """Symmetric per-vector fake-quant: k = clip(rint(x/s), -qmax-1, qmax), x = k·s.
    Returns the scale s."""
    cdef float s = _a8_scale(x, n, qmax)
    nc_a8_apply(x, n, s, qmax)        # nc_a8_level(x[j], s, qmax) * s, vectorised
    return s


cdef float a8_codes_c(const float* x, Py_ssize_t n, float qmax, int8_t* codes) noexcept nogil:
    """The codes and scale of a8_inplace (same arithmetic, so codes[j]·s is exactly
    the value a8_inplace leaves in x[j]).  Returns s."""
    cdef float s = _a8_scale(x, n, qmax)
    nc_a8_codes(x, n, s, qmax, codes)  # nc_a8_level(x[j], s, qmax), eight at a time
    return s


cdef union _F32Bits:
    float f
    uint32_t u


cdef float fp16_round(float x) noexcept nogil:
    """x rounded to the nearest IEEE half (ties to even), returned as float32."""
    cdef _F32Bits v
    cdef uint32_t sign, ax, lsb
    cdef float a
    v.f = x
    sign = v.u & 0x80000000u
    ax = v.u & 0x7fffffffu
    if ax >= 0x7f800000u:                  # inf / nan stay
        return x
    if ax >= 0x477ff000u:                  # >= 65520 rounds to infinity in half
        v.u = sign | 0x7f800000u
        return v.f
    if ax < 0x38800000u:                   # below 2^-14: half subnormal, quantum 2^-24
        a = rintf(fabsf(x) * 16777216.0) * (1.0 / 16777216.0)
        return -a if sign else a
    lsb = (ax >> 13) & 1u                  # keep 10 mantissa bits, round half to even
    ax = (ax + 0xfffu + lsb) & ~<uint32_t>0x1fffu
    v.u = sign | ax
    return v.f


cdef void fwht_inplace(float* x, Py_ssize_t n) noexcept nogil:
    """Unnormalised Walsh–Hadamard butterflies (Sylvester order), n a power of two.

    csrc/wht.h's portable path: _ops has no kernel switch of its own to ask, and the
    AVX2 path would give the same bits."""
    nc_wht(x, n, <float>1.0, 0)


cdef void kv_cq_inplace(float* x, Py_ssize_t dh, const float* levels, int n_levels) noexcept nogil:
    """CQ fake-quant of one head vector over groups of 64 (spec §3.9), in place.

    Zero-pad to a multiple of 64, rotate with H64, ν = ||r||, nearest level of
    r/max(ν, 1e-12) (ties to the lower level: strict < in the scan), decode
    with ν rounded to FP16, rotate back, drop the padding."""
    cdef float buf[64]
    cdef Py_ssize_t g0, j, m, k
    cdef float nu, inv, best, dist, u
    cdef int idx
    g0 = 0
    while g0 < dh:
        m = dh - g0 if dh - g0 < KV_GROUP else KV_GROUP
        for j in range(m):
            buf[j] = x[g0 + j]
        for j in range(m, KV_GROUP):
            buf[j] = 0.0
        fwht_inplace(buf, KV_GROUP)
        nu = 0.0
        for j in range(KV_GROUP):
            buf[j] = buf[j] * <float>0.125          # H64 = butterflies / 8 (exact)
            nu = nu + buf[j] * buf[j]
        nu = sqrtf(nu)
        inv = nu if nu > CQ_NORM_EPS else CQ_NORM_EPS
        for j in range(KV_GROUP):
            u = buf[j] / inv
            idx = 0
            best = fabsf(u - levels[0])
            for k in range(1, n_levels):
                dist = fabsf(u - levels[k])
                if dist < best:
                    best = dist
                    idx = <int>k
            buf[j] = levels[idx]
        nu = fp16_round(nu)
        for j in range(KV_GROUP):
            buf[j] = nu * buf[j]
        fwht_inplace(buf, KV_GROUP)
        for j in range(m):
            x[g0 + j] = buf[j] * <float>0.125
        g0 += KV_GROUP


# ---------------------------------------------------------------------------
# norms (spec §4.2)
# ---------------------------------------------------------------------------

cdef inline float _inv_rms(const float* x, Py_ssize_t n) noexcept nogil:
    # mean square from a 16-lane float32 sum (close to NumPy's pairwise float32 sum)
    cdef float ms = nc_dot(x, x, n) / <float>n
    return <float>1.0 / sqrtf(ms + RMS_EPS)


cdef void zc_rmsnorm_c(const float* x, const float* scale, float* out, Py_ssize_t n) noexcept nogil:
    """y = (1 + s) ⊙ x / sqrt(mean(x²) + 1e-6)."""
    cdef float r = _inv_rms(x, n)
    cdef Py_ssize_t j
    for j in range(n):
        out[j] = (x[j] * r) * (<float>1.0 + scale[j])


cdef void rms_unit_c(const float* x, float* out, Py_ssize_t n) noexcept nogil:
    """y = x · rsqrt(mean(x²) + 1e-6)."""
    cdef float r = _inv_rms(x, n)
    cdef Py_ssize_t j
    for j in range(n):
        out[j] = x[j] * r


# ---------------------------------------------------------------------------
# attention pieces (spec §4.7)
# ---------------------------------------------------------------------------

cdef float sigmoid_c(float x) noexcept nogil:
    return <float>1.0 / (<float>1.0 + expf(-x))


cdef void mul_sigmoid_c(float* o, const float* g, Py_ssize_t n) noexcept nogil:
    """o ⊙= σ(g) (vectorised exp where AVX2 is available)."""
    nc_mul_sigmoid(o, g, n)


cdef void rope_c(float* x, Py_ssize_t dh, const float* cos_row, const float* sin_row) noexcept nogil:
    """Rotate-half RoPE of one head vector with the tables of its position."""
    cdef Py_ssize_t half = dh // 2, i
    cdef float a, b
    for i in range(half):
        a = x[i]
        b = x[i + half]
        x[i] = a * cos_row[i] - b * sin_row[i]
        x[i + half] = b * cos_row[i] + a * sin_row[i]


cdef void conv_step_c(const float* taps, Py_ssize_t n_taps, Py_ssize_t tap_stride,
                      Py_ssize_t channels, const float* const* history, float* out) noexcept nogil:
    """Causal depthwise conv at one position: out = Σ_j taps[j] ⊙ history[j].

    ``history[j]`` is the input vector at t − j·dilation, or NULL where that
    position does not exist or is not visible (its term is dropped).  Tap j is
    ``taps + j·tap_stride`` (tap_stride > channels: a range of a wider conv's
    channels; each channel sums its taps in the same order, so any range gives the
    whole conv's values)."""
    cdef Py_ssize_t j, c
    cdef const float* h
    cdef const float* tj
    for c in range(channels):
        out[c] = 0.0
    for j in range(n_taps):
        h = history[j]
        if h == NULL:
            continue
        tj = taps + j * tap_stride
        for c in range(channels):
            out[c] = out[c] + tj[c] * h[c]


cdef void attend_group_c(const float* q, Py_ssize_t q_stride, Py_ssize_t G,
                         const float* k_cache_t, Py_ssize_t k_stride, const float* v_cache,
                         Py_ssize_t dq, Py_ssize_t dv, float scale,
                         const Py_ssize_t* ranges, int n_ranges,
                         float* scores, Py_ssize_t score_stride,
                         float* out, Py_ssize_t out_stride) noexcept nogil:
    """G query heads (q + g·q_stride) against one KV head (GQA).

    Keys are stored transposed, ``k_cache_t[i·k_stride + slot]`` (dimension-major),
    so the scores of consecutive slots come from streaming loops with no
    horizontal sums; values are rows ``v_cache[slot·dv + i]``.  The visible slots
    are the half-open ranges [ranges[2r], ranges[2r+1]).  Scores are q·k·scale,
    softmax in float32, out = Σ p·v / Σ p.  scores: G rows of score_stride floats
    indexed by slot."""
    cdef Py_ssize_t j, i, a, b, g
    cdef int r
    cdef float qi, p, den, mx
    cdef const float* krow
    cdef const float* vj
    cdef const float* qg
    cdef float* o
    cdef float* sc
    if nc_attend_avx2(q, q_stride, G, k_cache_t, k_stride, v_cache, dq, dv, scale, ranges,
                      n_ranges, scores, score_stride, out, out_stride):
        return
    for g in range(G):
        sc = scores + g * score_stride
        qg = q + g * q_stride
        o = out + g * out_stride
        for r in range(n_ranges):
            a = ranges[2 * r]
            b = ranges[2 * r + 1]
            for j in range(a, b):
                sc[j] = 0.0
            for i in range(dq):
                qi = qg[i]
                krow = k_cache_t + i * k_stride
                for j in range(a, b):
                    sc[j] = sc[j] + qi * krow[j]
        mx = -INFINITY
        for r in range(n_ranges):
            for j in range(ranges[2 * r], ranges[2 * r + 1]):
                if sc[j] > mx:
                    mx = sc[j]
        den = 0.0
        for r in range(n_ranges):
            a = ranges[2 * r]
            den = den + nc_exp_sum(sc + a, ranges[2 * r + 1] - a, scale, mx * scale)
        for i in range(dv):
            o[i] = 0.0
        for r in range(n_ranges):
            for j in range(ranges[2 * r], ranges[2 * r + 1]):
                p = sc[j]
                vj = v_cache + j * dv
                for i in range(dv):
                    o[i] = o[i] + p * vj[i]
        p = <float>1.0 / den
        for i in range(dv):
            o[i] = o[i] * p


cdef void attend_group_i8_c(const int8_t* q, Py_ssize_t q_stride, const float* q_scales, Py_ssize_t G,
                            const uint8_t* k_codes, Py_ssize_t k_stride, const float* k_scales,
                            const int8_t* v_codes, const float* v_scales,
                            Py_ssize_t dq, Py_ssize_t dv, float scale,
                            const Py_ssize_t* ranges, int n_ranges,
                            float* scores, Py_ssize_t score_stride,
                            float* out, Py_ssize_t out_stride) noexcept nogil:
    """G ≤ 64 query heads against one KV head of the int8 cache (GQA), the twin of
    attend_group_c for A8 codes: query head g is the codes q[g·q_stride + i] (zero
    from dq up to the next multiple of 4) times q_scales[g]; key slot j is
    (k_codes[(i4·k_stride + j)·4 + c] − 128)·k_scales[j] for dimension 4·i4 + c
    (offset binary in quads of dimensions: the layout of the VNNI dot product); value
    slot j is v_codes[j·dv + i]·v_scales[j].  Scores q̂·k̂ from the exact integer sum
    times the two scales, float32 softmax, out = Σ p·v̂ / Σ p over the ranges.  The
    scores are scratch: on return they may hold p·v_scales."""
    cdef int qcorr[64]
    cdef float inv[64]
    cdef Py_ssize_t g, nq4 = (dq + 3) // 4
    cdef int r
    cdef float mx, den
    cdef float* sc
    for g in range(G):
        qcorr[g] = nc_i8_qcorr(q + g * q_stride, dq)
    for r in range(n_ranges):
        nc_i8_scores(q, q_stride, q_scales, qcorr, G, k_codes, k_stride, k_scales,
                     nq4, ranges[2 * r], ranges[2 * r + 1], scores, score_stride)
    for g in range(G):
        sc = scores + g * score_stride
        mx = -INFINITY
        for r in range(n_ranges):
            mx = nc_max_from(sc + ranges[2 * r], ranges[2 * r + 1] - ranges[2 * r], mx)
        den = 0.0
        for r in range(n_ranges):
            den = den + nc_exp_sum(sc + ranges[2 * r], ranges[2 * r + 1] - ranges[2 * r], scale, mx * scale)
        inv[g] = <float>1.0 / den
    nc_i8_pv(scores, score_stride, G, v_codes, v_scales, dv, ranges, n_ranges, inv, out, out_stride)


# ---------------------------------------------------------------------------
# engram hash (spec §4.4)
# ---------------------------------------------------------------------------

cdef uint32_t engram_hash_c(const int64_t* tokens, Py_ssize_t t, int order,
                            uint32_t seed) noexcept nogil:
    """Hash of the n-gram ending at position t (tokens before 0 read as 0), mod 2³²."""
    cdef uint32_t acc = seed, tok
    cdef int j
    for j in range(order):
        tok = <uint32_t>tokens[t - j] if t - j >= 0 else 0u
        acc = (acc ^ tok) * <uint32_t>0x01000193u
    acc = acc ^ (acc >> 15)
    return acc


# ---------------------------------------------------------------------------
# mHC (spec §4.5)
# ---------------------------------------------------------------------------

cdef void sinkhorn_c(float* M, int n, int iters) noexcept nogil:
    """Log-domain Sinkhorn on an n×n matrix in place; on return M = exp(M).

    Subtracting a row's (column's) logsumexp is dividing exp(M) by its row
    (column) sum, so when the entries span less than 60 (no exp under- or
    overflows) the iterations run on P = exp(M − max) with sums and divisions:
    n² exps instead of 2·iters·n·(n + 1) exps and logs, same result up to float
    rounding.  Wider inputs take the log-domain path.  At n = 4 the iterations run
    in vector registers where the build has them (nc_sinkhorn4, same bits)."""
    _sinkhorn(M, n, iters, True)


cdef void _sinkhorn(float* M, int n, int iters, bint vector) noexcept nogil:
    """sinkhorn_c; ``vector`` False keeps the scalar loop at n = 4 (the tests' twin)."""
    cdef int it, i, j
    cdef float mx, mn
    mx = M[0]
    mn = M[0]
    for i in range(1, n * n):
        if M[i] > mx:
            mx = M[i]
        if M[i] < mn:
            mn = M[i]
    if mx - mn < 60.0:
        for i in range(n * n):
            M[i] = expf(M[i] - mx)
        if vector and n == 4 and nc_sinkhorn4(M, iters):
            return
        for it in range(iters):
            for i in range(n):
                _sum_normalise(M, i * n, 1, n)      # row i
            for j in range(n):
                _sum_normalise(M, j, n, n)          # column j
        return
    _sinkhorn_log(M, n, iters)


cdef inline void _sum_normalise(float* M, int first, int stride, int n) noexcept nogil:
    """Divide the n entries M[first + k*stride] by their sum (multiply by its inverse)."""
    cdef int k
    cdef float acc = 0.0
    cdef float inv
    for k in range(n):
        acc = acc + M[first + k * stride]
    inv = <float>1.0 / acc
    for k in range(n):
        M[first + k * stride] = M[first + k * stride] * inv


cdef void _lse_normalise(float* M, int first, int stride, int n) noexcept nogil:
    """Subtract the log-sum-exp of the n entries M[first + k*stride] from each of them."""
    cdef int k
    cdef float mx = -INFINITY
    cdef float acc = 0.0
    cdef float lse
    for k in range(n):
        if M[first + k * stride] > mx:
            mx = M[first + k * stride]
    for k in range(n):
        acc = acc + expf(M[first + k * stride] - mx)
    lse = mx + logf(acc)
    for k in range(n):
        M[first + k * stride] = M[first + k * stride] - lse


cdef void _sinkhorn_log(float* M, int n, int iters) noexcept nogil:
    """The log-domain iterations (spec §4.5) for inputs with a wide range."""
    cdef int it, i, j
    for it in range(iters):
        for i in range(n):
            _lse_normalise(M, i * n, 1, n)      # row i
        for j in range(n):
            _lse_normalise(M, j, n, n)          # column j
    for i in range(n * n):
        M[i] = expf(M[i])


# ---------------------------------------------------------------------------
# Monarch Hadamard MLP (spec §4.8)
# ---------------------------------------------------------------------------

cdef void kron_apply_c(const float* z, const float* A, const float* B,
                       Py_ssize_t ba, Py_ssize_t bb, float* tmp, float* out) noexcept nogil:
    """out = flatten(Aᵀ · Z · B) with Z = z viewed [ba, bb] row-major.

    Two small matmuls whose inner loops run along contiguous rows (they
    vectorise): tmp = Aᵀ·Z, then out = tmp·B."""
    kron_apply_rows_c(z, A, B, ba, bb, tmp, out, 0, ba)


cdef void kron_apply_rows_c(const float* z, const float* A, const float* B, Py_ssize_t ba,
                            Py_ssize_t bb, float* tmp, float* out, Py_ssize_t k0,
                            Py_ssize_t k1) noexcept nogil:
    """Rows [k0, k1) of kron_apply_c's out (bb floats each) and of its tmp.  Row k of
    out reads only row k of tmp (which reads all of z), and each row sums in the same
    order whatever the range, so any split of the rows gives the same bits."""
    cdef Py_ssize_t i, j, k, l
    cdef float a
    cdef const float* zrow
    cdef float* trow
    cdef const float* brow
    cdef float* orow
    if nc_kron_avx2(z, A, B, ba, bb, tmp, out, k0, k1):
        return
    for k in range(k0 * bb, k1 * bb):
        tmp[k] = 0.0
    for i in range(ba):
        zrow = z + i * bb
        for k in range(k0, k1):
            a = A[i * ba + k]
            trow = tmp + k * bb
            for j in range(bb):
                trow[j] = trow[j] + a * zrow[j]
    for k in range(k0 * bb, k1 * bb):
        out[k] = 0.0
    for k in range(k0, k1):
        trow = tmp + k * bb
        orow = out + k * bb
        for j in range(bb):
            a = trow[j]
            brow = B + j * bb
            for l in range(bb):
                orow[l] = orow[l] + a * brow[l]


cdef void _monarch_condition(const float* m, Py_ssize_t d, Py_ssize_t N, Py_ssize_t R,
                             const float* cond_v, const float* cond_u, float* logit,
                             float* c, Py_ssize_t i0, Py_ssize_t i1) noexcept nogil:
    """The MLP's conditioning, c = 1 + softmax(m · cond_v) · cond_u, for c[i0:i1]
    (logit: R floats of the caller's own; every element sums over r in order)."""
    cdef Py_ssize_t i, r
    cdef int p
    cdef float mx, den, v, w
    cdef float part[4][32]
    if not nc_cond_logits(m, d, cond_v, R, logit):
        if R <= 32:       # nc_cond_logits' order: term i in partial sum i mod 4
            for p in range(4):
                for r in range(R):
                    part[p][r] = 0.0
            for i in range(d):
                v = m[i]
                p = i % 4
                for r in range(R):
                    part[p][r] = part[p][r] + v * cond_v[i * R + r]
            for r in range(R):
                logit[r] = (part[0][r] + part[1][r]) + (part[2][r] + part[3][r])
        else:
            for r in range(R):
                logit[r] = 0.0
            for i in range(d):
                v = m[i]
                for r in range(R):
                    logit[r] = logit[r] + v * cond_v[i * R + r]
    mx = logit[0]
    for r in range(1, R):
        if logit[r] > mx:
            mx = logit[r]
    den = 0.0
    for r in range(R):
        logit[r] = expf(logit[r] - mx)
        den = den + logit[r]
    for r in range(R):
        logit[r] = logit[r] / den
    if nc_cond_mix(logit, R, cond_u, N, c, i0, i1):
        return
    for i in range(i0, i1):
        c[i] = 0.0
    for r in range(R):
        w = logit[r]
        for i in range(i0, i1):
            c[i] = c[i] + w * cond_u[r * N + i]
    for i in range(i0, i1):
        c[i] = <float>1.0 + c[i]


cdef inline void _monarch_mid(float* z, const float* k, const int64_t* p1, const float* d2,
                              const float* c, const float* b2, Py_ssize_t i0,
                              Py_ssize_t i1) noexcept nogil:
    """z[i] = silu(d2 ⊙ c ⊙ k[p1] + b2)[i] for i in [i0, i1) (i0 a multiple of 8, so
    nc_silu's vector/tail split of the range is the whole vector's)."""
    cdef Py_ssize_t i
    for i in range(i0, i1):
        z[i] = d2[i] * c[i] * k[p1[i]] + b2[i]
    nc_silu(z + i0, i1 - i0)


cdef void team_cols(Py_ssize_t d, int tid, int nt, Py_ssize_t* c0, Py_ssize_t* c1) noexcept nogil:
    """Thread tid's share [c0, c1) of d columns split between nt threads: contiguous,
    in order, boundaries on multiples of 16 floats (one 64-byte line: no line is
    written by two threads); the last share takes the rest."""
    c0[0] = (d * tid // nt) // 16 * 16
    c1[0] = d if tid == nt - 1 else (d * (tid + 1) // nt) // 16 * 16


cdef void monarch_mlp_c(const float* m, Py_ssize_t d, Py_ssize_t N, Py_ssize_t R,
                        const float* d1, const float* d2, const float* b2,
                        const float* d3, const float* d4,
                        const float* w1a, const float* w1b, const float* w2a,
                        const float* w2b, const float* w3a, const float* w3b,
                        Py_ssize_t ba, Py_ssize_t bb,
                        const float* cond_v, const float* cond_u,
                        const int64_t* p1, const int64_t* p2,
                        float* work, float* logit, float* out, int tid, int nt,
                        nc_barrier* bar, nc_pf_stream* pf) noexcept nogil:
    """MLP(m) → out[d], run by every thread tid of an nt-thread team (tid 0 of 1 on
    its own; ``bar``: the team's barrier, unused and may be NULL for one thread; ``pf``:
    the thread's prefetch stream, pumped while it waits, or NULL): one
    shared ``work`` of 4·N floats, ``m`` and ``out``; ``logit``: R floats of this
    thread's own.

    Each thread computes the conditioning's R logits itself (d·R multiply-adds) and
    then its range of every elementwise stage (ranges that are multiples of 8); each
    Kronecker product is split by rows (kron_apply_rows_c); a team barrier separates
    dependent stages, so every value is the one-thread value bit for bit.  After the
    last barrier each thread writes its share ``team_cols(d, tid, nt)`` of ``out``, so
    on return a thread may read only that share (the caller's next meeting makes the
    whole of it visible): the lane update that follows splits the same columns
    without a meeting between them."""
    cdef float* z = work
    cdef float* c = work + N
    cdef float* k = work + 2 * N
    cdef float* tmp = work + 3 * N
    cdef Py_ssize_t i, c0, c1
    cdef Py_ssize_t k0 = ba * tid // nt, k1 = ba * (tid + 1) // nt
    cdef Py_ssize_t i0 = (N * tid // nt) // 8 * 8
    cdef Py_ssize_t i1 = N if tid == nt - 1 else (N * (tid + 1) // nt) // 8 * 8
    _monarch_condition(m, d, N, R, cond_v, cond_u, logit, c, i0, i1)
    # z = K(d1 ⊙ [m, 0…]; A1, B1)[p1]
    for i in range(i0, i1):
        z[i] = d1[i] * m[i] if i < d else <float>0.0
    if nt > 1:
        nc_barrier_wait_pf(bar, pf)
    kron_apply_rows_c(z, w1a, w1b, ba, bb, tmp, k, k0, k1)
    if nt > 1:
        nc_barrier_wait_pf(bar, pf)
    # z = K(silu(d2 ⊙ c ⊙ z + b2); A2, B2)[p2]
    _monarch_mid(z, k, p1, d2, c, b2, i0, i1)
    if nt > 1:
        nc_barrier_wait_pf(bar, pf)
    kron_apply_rows_c(z, w2a, w2b, ba, bb, tmp, k, k0, k1)
    if nt > 1:
        nc_barrier_wait_pf(bar, pf)
    # z = K(d3 ⊙ z; A3, B3); out = (d4 ⊙ z)[:d]
    for i in range(i0, i1):
        z[i] = d3[i] * k[p2[i]]
    if nt > 1:
        nc_barrier_wait_pf(bar, pf)
    kron_apply_rows_c(z, w3a, w3b, ba, bb, tmp, k, k0, k1)
    if nt > 1:
        nc_barrier_wait_pf(bar, pf)
    team_cols(d, tid, nt, &c0, &c1)
    for i in range(c0, c1):
        out[i] = d4[i] * k[i]


# ---------------------------------------------------------------------------
# probe pooling (spec §5.2, §5.5)
# ---------------------------------------------------------------------------

cdef void pool_update_c(const float* cell, Py_ssize_t d, float score,
                        float* run_max, float* run_den, float* run_sum) noexcept nogil:
    """Fold one token into an online softmax-weighted sum over tokens.

    Keeps the running max m, denominator Σ e^(s−m) and Σ e^(s−m)·cell, so the
    pooled vector Σ π_t cell_t = run_sum / run_den at any time."""
    cdef float old = run_max[0], w, rescale
    cdef Py_ssize_t i
    if score > old:
        rescale = expf(old - score)       # 0 for the first token (old = -inf)
        run_den[0] = run_den[0] * rescale + 1.0
        for i in range(d):
            run_sum[i] = run_sum[i] * rescale + cell[i]
        run_max[0] = score
    else:
        w = expf(score - old)
        run_den[0] = run_den[0] + w
        for i in range(d):
            run_sum[i] = run_sum[i] + w * cell[i]


# ===========================================================================
# Python wrappers: same names, arguments and semantics as needle_cy.reference.ops
# (the differential tests compare each pair).  Arguments are converted to
# contiguous float32 and checked here; the C functions above trust them.
# ===========================================================================

F32 = np.float32
RMS_EPS_PY = 1e-6
CQ_NORM_FLOOR = 1e-12
L2_EPS = 1e-12
SINKHORN_ITERS = 20
ENGRAM_SEED = 0x9E3779B9
ENGRAM_PRIME = 0x01000193
ENGRAM_SHIFT = 15
MHC_PRE_OWN, MHC_PRE_OTHER = 4.0, -4.0
MHC_POST_OWN, MHC_POST_OTHER = 0.0, -4.0
KV_CQ_GROUP = 64


def _f32(x):
    return np.asarray(x, dtype=np.float32)


def _as_rows(x):
    """Fresh float32 C-contiguous copy of x and a [rows, last] view of it."""
    a = np.array(x, dtype=np.float32, copy=True, order="C")
    if a.ndim == 0:
        raise ValueError("expected an array with at least one axis, got a scalar")
    n = a.shape[-1]
    return a, a.reshape(-1, n) if n else a.reshape(-1, 1)[:0]


# --- elementwise -----------------------------------------------------------

def sigmoid(x):
    """σ(x) = 1 / (1 + e^-x), float32."""
    shape = np.shape(x)
    out, rows = _as_rows(np.reshape(np.asarray(x, np.float32), (-1,)))
    cdef float[:, ::1] v = rows
    cdef Py_ssize_t j
    for j in range(v.shape[1]):
        v[0, j] = sigmoid_c(v[0, j])
    return out.reshape(shape)


def silu(x):
    """silu(x) = x · σ(x), float32."""
    x = _f32(x)
    return (x * sigmoid(x)).astype(np.float32)


def softmax(x, axis=-1):
    """Numerically stable softmax over ``axis``, float32; −inf entries get 0."""
    a = np.moveaxis(np.asarray(x, dtype=np.float32), axis, -1)
    out, rows = _as_rows(a)
    cdef float[:, ::1] v = rows
    cdef Py_ssize_t r, j, n = v.shape[1]
    cdef float mx, den
    with nogil:
        for r in range(v.shape[0]):
            mx = -INFINITY
            for j in range(n):
                if v[r, j] > mx:
                    mx = v[r, j]
            den = 0.0
            for j in range(n):
                v[r, j] = expf(v[r, j] - mx)
                den = den + v[r, j]
            for j in range(n):
                v[r, j] = v[r, j] / den
    return np.moveaxis(out, -1, axis)


# --- quantizers -------------------------------------------------------------

def a8(x, bits=8):
    """Symmetric per-vector activation fake-quant over the last axis (spec §3.8)."""
    cdef float qmax = float((1 << (int(bits) - 1)) - 1)
    out, rows = _as_rows(x)
    cdef float[:, ::1] v = rows
    cdef Py_ssize_t r
    with nogil:
        for r in range(v.shape[0]):
            a8_inplace(&v[r, 0], v.shape[1], qmax)
    return out


def a8_codes(x, bits=8):
    """The integer form of a8: (codes int8 [..., n], scales float32 [...]) with
    ``codes · scales[..., None]`` equal to ``a8(x, bits)`` bit for bit."""
    if not 2 <= int(bits) <= 8:
        raise ValueError(f"a8_codes: bits must lie in [2, 8], got {bits}")
    cdef float qmax = float((1 << (int(bits) - 1)) - 1)
    a, rows = _as_rows(x)
    codes = np.zeros(rows.shape, np.int8)
    scales = np.empty(rows.shape[0], np.float32)
    cdef float[:, ::1] v = rows
    cdef int8_t[:, ::1] c = codes
    cdef float[::1] sv = scales
    cdef Py_ssize_t r
    if v.shape[1]:
        with nogil:
            for r in range(v.shape[0]):
                sv[r] = a8_codes_c(&v[r, 0], v.shape[1], qmax, &c[r, 0])
    else:
        scales[:] = 1.0
    return codes.reshape(a.shape), scales.reshape(a.shape[:-1])


def hadamard(g):
    """Orthonormal Sylvester–Hadamard matrix H_g (float32 entries ±1/sqrt(g))."""
    g = int(g)
    if g < 1 or g & (g - 1):
        raise ValueError(f"hadamard: size must be a power of two, got {g}")
    i = np.arange(g)
    both = i[:, None] & i[None, :]
    parity = np.zeros_like(both)
    while both.any():
        parity ^= both & 1
        both >>= 1
    s = np.float32(1.0 / np.sqrt(g))
    return np.where(parity == 1, -s, s).astype(np.float32)


def kv_codebook(bits, group=KV_CQ_GROUP):
    """KV-cache CQ codebook float32(level / sqrt(group)) for widths 2, 3, 4 (spec §3.9)."""
    if bits not in LLOYD_MAX_LEVELS:
        raise ValueError(f"kv_codebook: KV CQ width must be 2, 3 or 4, got {bits}")
    return (np.array(LLOYD_MAX_LEVELS[bits], np.float64) / np.sqrt(group)).astype(np.float32)


def nearest_codeword(u, codebook):
    """Index of the nearest entry of an ascending codebook; ties go to the lower index."""
    uu = np.ascontiguousarray(u, dtype=np.float32)
    cb = np.ascontiguousarray(codebook, dtype=np.float32)
    out = np.empty(uu.shape, np.int64)
    flat_u = uu.reshape(-1)
    flat_o = out.reshape(-1)
    cdef float[::1] uv = flat_u
    cdef float[::1] cv = cb
    cdef int64_t[::1] ov = flat_o
    cdef Py_ssize_t i, k, n_cb = cb.shape[0]
    cdef float best, dist
    with nogil:
        for i in range(uv.shape[0]):
            ov[i] = 0
            best = fabsf(uv[i] - cv[0])
            for k in range(1, n_cb):
                dist = fabsf(uv[i] - cv[k])
                if dist < best:
                    best = dist
                    ov[i] = k
    return out


def kv_quant_int8(x):
    """KV quantizer at kv_bits ≥ 8: A8 per head vector (last axis)."""
    return a8(x)


def kv_quant_cq(x, bits, group=KV_CQ_GROUP):
    """KV quantizer at kv_bits ∈ {2, 3, 4}: CQ fake-quant over groups of 64 (spec §3.9)."""
    if int(group) != KV_CQ_GROUP:
        raise ValueError(f"kv_quant_cq: only group {KV_CQ_GROUP} is implemented, got {group}")
    cdef float[::1] lv = kv_codebook(int(bits))
    out, rows = _as_rows(x)
    cdef float[:, ::1] v = rows
    cdef Py_ssize_t r
    cdef int nl = lv.shape[0]
    with nogil:
        for r in range(v.shape[0]):
            kv_cq_inplace(&v[r, 0], v.shape[1], &lv[0], nl)
    return out


def kv_quantize(x, kv_bits):
    """Dispatch: int8 A8 for kv_bits ≥ 8, CQ group-64 for 2/3/4."""
    if kv_bits >= 8:
        return kv_quant_int8(x)
    return kv_quant_cq(x, kv_bits)


def fp16_round_array(x):
    """float32 → nearest half (ties to even) → float32, elementwise (the ν rounding)."""
    out, rows = _as_rows(x)
    cdef float[:, ::1] v = rows
    cdef Py_ssize_t r, j
    for r in range(v.shape[0]):
        for j in range(v.shape[1]):
            v[r, j] = fp16_round(v[r, j])
    return out


# --- norms ------------------------------------------------------------------

def rms_unit(x):
    """RMS-unit over the last axis: x · rsqrt(mean(x²) + 1e-6)."""
    out, rows = _as_rows(x)
    cdef float[:, ::1] v = rows
    cdef Py_ssize_t r
    with nogil:
        for r in range(v.shape[0]):
            rms_unit_c(&v[r, 0], &v[r, 0], v.shape[1])
    return out


def zc_rmsnorm(x, scale):
    """Zero-centred RMSNorm over the last axis: (1 + scale) ⊙ x / sqrt(mean(x²) + 1e-6)."""
    out, rows = _as_rows(x)
    sc = np.ascontiguousarray(scale, dtype=np.float32).reshape(-1)
    if sc.shape[0] != rows.shape[1]:
        raise ValueError(f"zc_rmsnorm: scale has {sc.shape[0]} entries, expected {rows.shape[1]}")
    cdef float[:, ::1] v = rows
    cdef float[::1] s = sc
    cdef Py_ssize_t r
    with nogil:
        for r in range(v.shape[0]):
            zc_rmsnorm_c(&v[r, 0], &s[0], &v[r, 0], v.shape[1])
    return out


# --- embedding and output ---------------------------------------------------

def embed_scale(rows, d_model):
    """Scaled input embedding E[tok] · sqrt(d)."""
    return (_f32(rows) * np.float32(np.sqrt(d_model))).astype(np.float32)


def linear(x, w):
    """Dense product y = x @ W.T with W float32 [out, in]."""
    return (_f32(x) @ _f32(w).T).astype(np.float32)


def tied_logits(h, embedding):
    """Output logits h · E[:out_vocab]ᵀ."""
    return linear(h, embedding)


def lane_mean(lanes):
    """Mean over the lane axis ([..., n, d] → [..., d])."""
    a = np.ascontiguousarray(lanes, dtype=np.float32)
    n, d = a.shape[-2], a.shape[-1]
    src = a.reshape(-1, n, d)
    out = np.empty((src.shape[0], d), np.float32)
    cdef float[:, :, ::1] sv = src
    cdef float[:, ::1] ov = out
    cdef Py_ssize_t r, m, c, nl = n, dd = d
    cdef float acc, fn = <float>n
    with nogil:
        for r in range(sv.shape[0]):
            for c in range(dd):
                acc = 0.0
                for m in range(nl):
                    acc = acc + sv[r, m, c]
                ov[r, c] = acc / fn
    return out.reshape(a.shape[:-2] + (d,))


# --- context visibility (spec §9.2) -----------------------------------------

def context_visible(t, j, recent=None, sinks=0, band=None):
    """Whether key position j is visible from query position t (broadcasts)."""
    t = np.asarray(t, dtype=np.int64)
    j = np.asarray(j, dtype=np.int64)
    ok = (j >= 0) & (j <= t)
    if recent is not None:
        ok &= ((t - j) < recent) | (j < sinks)
    if band is not None:
        ok &= (t - j) < band
    return ok


def attention_mask(q_pos, k_pos, recent=None, sinks=0, band=None):
    """Boolean [Tq, Tk] mask of query positions against key positions."""
    q_pos = np.asarray(q_pos, dtype=np.int64)[:, None]
    k_pos = np.asarray(k_pos, dtype=np.int64)[None, :]
    return context_visible(q_pos, k_pos, recent, sinks, band)


def conv_tap_ok(positions, n_taps, dilation=1, recent=None, sinks=0, band=None):
    """[T, n_taps] mask: tap j of position t is used iff t − j·dilation is visible from t."""
    t = np.asarray(positions, dtype=np.int64)[:, None]
    j = t - dilation * np.arange(n_taps, dtype=np.int64)[None, :]
    return context_visible(t, j, recent, sinks, band)


# --- causal depthwise convolution -------------------------------------------

def causal_conv(x, taps, dilation=1, tap_ok=None):
    """Causal depthwise conv: y[t] = Σ_j taps[j] ⊙ x[t − j·dil] · ok[t, j] (x [T, C])."""
    xs = np.ascontiguousarray(x, dtype=np.float32)
    tp = np.ascontiguousarray(taps, dtype=np.float32)
    if xs.ndim != 2 or tp.ndim != 2 or tp.shape[1] != xs.shape[1]:
        raise ValueError(f"causal_conv: x [T, C] and taps [n, C] expected, got {xs.shape}, {tp.shape}")
    T = xs.shape[0]
    n_taps = tp.shape[0]
    if n_taps > 64:
        raise ValueError("causal_conv: at most 64 taps")
    ok = conv_tap_ok(np.arange(T), n_taps, dilation) if tap_ok is None else np.asarray(tap_ok, bool)
    if ok.shape != (T, n_taps):
        raise ValueError(f"causal_conv: tap_ok must be [{T}, {n_taps}], got {ok.shape}")
    out = np.empty_like(xs)
    cdef const float* hist[64]
    cdef float[:, ::1] xv = xs
    cdef float[:, ::1] ov = out
    cdef float[:, ::1] tv = tp
    cdef Py_ssize_t t, j, src, dil = int(dilation), C = xs.shape[1]
    for t in range(T):
        for j in range(n_taps):
            src = t - j * dil
            hist[j] = &xv[src, 0] if (src >= 0 and ok[t, j]) else NULL
        conv_step_c(&tv[0, 0], n_taps, C, C, hist, &ov[t, 0])
    return out


def causal_conv_step(history, taps, tap_ok=None):
    """One position of causal_conv: history[j] = x at t − j·dilation ([n_taps, C])."""
    hs = np.ascontiguousarray(history, dtype=np.float32)
    tp = np.ascontiguousarray(taps, dtype=np.float32)
    if hs.shape != tp.shape or hs.ndim != 2 or hs.shape[0] > 64:
        raise ValueError(f"causal_conv_step: history and taps must both be [n_taps ≤ 64, C], got {hs.shape}, {tp.shape}")
    ok = np.ones(tp.shape[0], bool) if tap_ok is None else np.asarray(tap_ok, bool)
    out = np.empty(tp.shape[1], np.float32)
    cdef const float* hist[64]
    cdef float[:, ::1] hv = hs
    cdef float[:, ::1] tv = tp
    cdef float[::1] ov = out
    cdef Py_ssize_t j
    for j in range(tp.shape[0]):
        hist[j] = &hv[j, 0] if ok[j] else NULL
    conv_step_c(&tv[0, 0], tp.shape[0], tp.shape[1], tp.shape[1], hist, &ov[0])
    return out


# --- RoPE ---------------------------------------------------------------------

def rope_frequencies(head_dim, theta):
    """f_i = 1 / θ^(2i/dq), i = 0..dq/2−1, float32."""
    i2 = np.arange(0, head_dim, 2, dtype=np.float32)
    return (np.float32(1.0) / (np.float32(theta) ** (i2 / np.float32(head_dim)))).astype(np.float32)


def rope_tables(n_positions, head_dim, theta):
    """cos/sin tables [n_positions, dh/2] computed exactly as ``rope`` computes its
    angles (float32 position × float32 frequency, NumPy cos/sin)."""
    freqs = rope_frequencies(head_dim, theta)
    ang = (np.arange(int(n_positions), dtype=np.float32)[:, None] * freqs).astype(np.float32)
    return np.ascontiguousarray(np.cos(ang), np.float32), np.ascontiguousarray(np.sin(ang), np.float32)


def rope(x, positions, theta):
    """Rotate-half RoPE on the last axis: x [T, heads, dh] with positions [T], or
    x [heads, dh] with a scalar position."""
    xa = np.asarray(x, dtype=np.float32)
    pos = np.asarray(positions, dtype=np.int64)
    single = pos.ndim == 0
    if single:
        xa = xa[None]
        pos = pos.reshape(1)
    if xa.ndim != 3 or pos.shape[0] != xa.shape[0] or xa.shape[2] % 2:
        raise ValueError(f"rope: x [T, heads, dh] (dh even) with positions [T] expected, got {np.shape(x)}")
    if pos.size and pos.min() < 0:
        raise ValueError("rope: positions must be >= 0")
    out = np.array(xa, dtype=np.float32, copy=True, order="C")
    n_pos = int(pos.max()) + 1 if pos.size else 1
    cos_t, sin_t = rope_tables(n_pos, xa.shape[2], theta)
    cdef float[:, :, ::1] v = out
    cdef float[:, ::1] ct = cos_t
    cdef float[:, ::1] st = sin_t
    cdef int64_t[::1] p = np.ascontiguousarray(pos)
    cdef Py_ssize_t t, h
    with nogil:
        for t in range(v.shape[0]):
            for h in range(v.shape[1]):
                rope_c(&v[t, h, 0], v.shape[2], &ct[p[t], 0], &st[p[t], 0])
    return out[0] if single else out


# --- attention ----------------------------------------------------------------

def split_heads(x, n_heads):
    """[..., n_heads·dh] → [..., n_heads, dh]."""
    x = _f32(x)
    return x.reshape(x.shape[:-1] + (n_heads, x.shape[-1] // n_heads))


def gqa_attention(q, k, v, mask):
    """Grouped-query softmax attention: q [Tq, H, dq], k [Tk, K, dq], v [Tk, K, dv],
    mask [Tq, Tk] bool; query head h reads KV head h // (H/K).  Returns [Tq, H, dv].
    Every query must see at least one key."""
    qa = np.ascontiguousarray(q, dtype=np.float32)
    ka = np.ascontiguousarray(np.asarray(k, np.float32).transpose(1, 0, 2))   # [K, Tk, dq]
    va = np.ascontiguousarray(np.asarray(v, np.float32).transpose(1, 0, 2))   # [K, Tk, dv]
    mk = np.asarray(mask, dtype=bool)
    if qa.ndim != 3 or ka.ndim != 3 or va.ndim != 3:
        raise ValueError("gqa_attention: q [Tq, H, dq], k [Tk, K, dq], v [Tk, K, dv] expected")
    Tq, H, dq = qa.shape
    K, Tk, dv = va.shape
    if ka.shape[:2] != (K, Tk) or ka.shape[2] != dq or H % K or mk.shape != (Tq, Tk):
        raise ValueError("gqa_attention: shapes of q, k, v and mask do not agree")
    if Tq and not mk.any(axis=1).all():
        raise ValueError("gqa_attention: a query sees no key")
    G_ = H // K
    out = np.empty((Tq, H, dv), np.float32)
    scores = np.empty(G_ * max(Tk, 1), np.float32)
    kbuf = np.empty((dq, max(Tk, 1)), np.float32)      # keys transposed: [dim, key]
    vbuf = np.empty((Tk, dv), np.float32)
    cdef float[:, :, ::1] qv = qa
    cdef float[:, :, ::1] ov = out
    cdef float[::1] sv = scores
    cdef float[:, ::1] kb = kbuf
    cdef float[:, ::1] vb = vbuf
    cdef Py_ssize_t t, h, G = H // K, n_vis, kh
    cdef Py_ssize_t rng[2]
    cdef float scale = <float>1.0 / np.float32(np.sqrt(dq))
    for t in range(Tq):
        idx = np.flatnonzero(mk[t])
        n_vis = idx.shape[0]
        for kh in range(K):
            # gather the visible keys so the C kernel sees one contiguous range
            kbuf[:, :n_vis] = ka[kh, idx].T
            vbuf[:n_vis] = va[kh, idx]
            rng[0] = 0
            rng[1] = n_vis
            attend_group_c(&qv[t, kh * G, 0], dq, G, &kb[0, 0], kbuf.shape[1], &vb[0, 0],
                           dq, dv, scale, rng, 1, &sv[0], max(Tk, 1), &ov[t, kh * G, 0], dv)
    return out


def gqa_attention_int8(q_codes, q_scales, k_codes, k_scales, v_codes, v_scales, mask):
    """gqa_attention of the dequantized A8 codes (q̂ = q_codes·q_scales, likewise k̂, v̂)
    through the engine's int8-cache kernel: q_codes [Tq, H, dq] int8, q_scales [Tq, H],
    k_codes [Tk, K, dq] int8, k_scales [Tk, K], v_codes [Tk, K, dv] int8, v_scales [Tk, K],
    mask [Tq, Tk] bool.  Returns [Tq, H, dv] float32."""
    qc = np.ascontiguousarray(q_codes, dtype=np.int8)
    qs = np.ascontiguousarray(q_scales, dtype=np.float32)
    kc = np.asarray(k_codes, dtype=np.int8)
    ks = np.asarray(k_scales, dtype=np.float32)
    vc = np.asarray(v_codes, dtype=np.int8)
    vs = np.asarray(v_scales, dtype=np.float32)
    mk = np.asarray(mask, dtype=bool)
    if qc.ndim != 3 or kc.ndim != 3 or vc.ndim != 3:
        raise ValueError("gqa_attention_int8: q [Tq, H, dq], k [Tk, K, dq], v [Tk, K, dv] codes expected")
    Tq, H, dq = qc.shape
    Tk, K, dv = vc.shape
    if kc.shape != (Tk, K, dq) or qs.shape != (Tq, H) or ks.shape != (Tk, K) or vs.shape != (Tk, K) \
            or K == 0 or H % K or H // K > 64 or mk.shape != (Tq, Tk):
        raise ValueError("gqa_attention_int8: shapes of the codes, scales and mask do not agree")
    if Tq and not mk.any(axis=1).all():
        raise ValueError("gqa_attention_int8: a query sees no key")
    nq4 = (dq + 3) // 4
    G_ = H // K
    qpad = np.zeros((Tq, H, 4 * nq4), np.int8)          # queries zero-padded to whole quads
    qpad[:, :, :dq] = qc
    out = np.empty((Tq, H, dv), np.float32)
    n = max(Tk, 1)
    scores = np.empty(G_ * n, np.float32)
    kbuf = np.empty((nq4, n, 4), np.uint8)              # the cache's key layout: quads of dims
    ksb = np.empty(n, np.float32)
    vbuf = np.empty((n, dv), np.int8)
    vsb = np.empty(n, np.float32)
    cdef int8_t[:, :, ::1] qv = qpad
    cdef float[:, ::1] qsv = qs
    cdef float[:, :, ::1] ov = out
    cdef float[::1] sv = scores
    cdef uint8_t[:, :, ::1] kb = kbuf
    cdef float[::1] ksv = ksb
    cdef int8_t[:, ::1] vb = vbuf
    cdef float[::1] vsv = vsb
    cdef Py_ssize_t t, G = G_, n_vis, kh
    cdef Py_ssize_t rng[2]
    cdef float scale = <float>1.0 / np.float32(np.sqrt(dq))
    for t in range(Tq):
        idx = np.flatnonzero(mk[t])
        n_vis = idx.shape[0]
        for kh in range(K):
            # gather the visible keys so the C kernel sees one contiguous range
            keys = np.full((n_vis, 4 * nq4), 128, np.int16)
            keys[:, :dq] = kc[idx, kh].astype(np.int16) + 128
            kbuf[:, :n_vis] = keys.reshape(n_vis, nq4, 4).transpose(1, 0, 2).astype(np.uint8)
            ksb[:n_vis] = ks[idx, kh]
            vbuf[:n_vis] = vc[idx, kh]
            vsb[:n_vis] = vs[idx, kh]
            rng[0] = 0
            rng[1] = n_vis
            attend_group_i8_c(&qv[t, kh * G, 0], 4 * nq4, &qsv[t, kh * G], G, &kb[0, 0, 0], n, &ksv[0],
                              &vb[0, 0], &vsv[0], dq, dv, scale, rng, 1, &sv[0], n, &ov[t, kh * G, 0], dv)
    return out


I8_KERNELS = {2: "avx512vnni", 3: "avx2", 4: "neon_dotprod", 0: "portable"}
nc_i8_detect()


def i8_attention_kernel():
    """The kernel of the int8-KV attention scores on this CPU: ``avx512vnni`` or ``avx2``
    (chosen when the module is compiled), ``neon_dotprod`` (aarch64 with asimddp,
    detected at import), or ``portable`` (the exact scalar loop)."""
    return I8_KERNELS[nc_i8_kernel()]


def _set_i8_dot(enabled):
    """Turn the aarch64 dot-product scores kernel on (where the CPU has it) or off;
    returns whether it was on.  For tests: both paths must give the same bits."""
    return bool(nc_i8_set_dot(1 if enabled else 0))


def output_gate(o, g):
    """Gated attention output o ⊙ σ(g)."""
    return (_f32(o) * sigmoid(g)).astype(np.float32)


# --- engram memory --------------------------------------------------------------

def engram_hash(tokens, orders, heads, seed_stride, slots):
    """Slot of every (position, table) for the n-grams ending at each position
    (uint32 arithmetic, order-major tables).  Returns int64 [T, len(orders)·heads]."""
    tok = np.ascontiguousarray(np.asarray(tokens, dtype=np.int64).astype(np.uint32).astype(np.int64)).reshape(-1)
    orders = tuple(int(o) for o in orders)
    E = int(heads)
    stride = int(seed_stride) or E
    out = np.empty((tok.shape[0], len(orders) * E), np.int64)
    cdef int64_t[::1] tv = tok
    cdef int64_t[:, ::1] ov = out
    cdef Py_ssize_t t, oi, h, T = tok.shape[0]
    cdef uint32_t seed, n_slots = <uint32_t>int(slots)
    cdef int order
    for oi in range(len(orders)):
        order = orders[oi]
        for h in range(E):
            seed = <uint32_t>((ENGRAM_SEED * (oi * stride + h + 1)) & 0xFFFFFFFF)
            for t in range(T):
                ov[t, oi * E + h] = engram_hash_c(&tv[0], t, order, seed) % n_slots
    return out


def engram_row_ids(slot_ids, slots):
    """Table row of each (position, table): table·slots + slot."""
    slot_ids = np.asarray(slot_ids, dtype=np.int64)
    return slot_ids + np.arange(slot_ids.shape[-1], dtype=np.int64) * slots


def engram_ngram_ok(positions, orders, heads, recent=None, sinks=0):
    """[T, NT] float32 validity: the n-gram's earliest position exists and is visible."""
    t = np.asarray(positions, dtype=np.int64)[:, None]
    first = t - (np.repeat(np.asarray(orders, dtype=np.int64), heads)[None, :] - 1)
    return context_visible(t, first, recent, sinks).astype(np.float32)


def engram_fetch(rows, ngram_ok):
    """Concatenate fetched rows [..., NT, sub] masked by ngram_ok [..., NT] → [..., NT·sub]."""
    r = _f32(rows) * _f32(ngram_ok)[..., None]
    return r.reshape(r.shape[:-2] + (r.shape[-2] * r.shape[-1],)).astype(np.float32)


cdef float engram_alpha_c(const float* u, const float* key, Py_ssize_t d) noexcept nogil:
    """σ(Σ RMSunit(u)·RMSunit(key) / sqrt(d)) without materialising the normed vectors."""
    cdef float ru = _inv_rms(u, d), rk = _inv_rms(key, d)
    return sigmoid_c((nc_dot(u, key, d) * ru * rk) / sqrtf(<float>d))


def engram_inject(u, key, value):
    """Engram gate inside the block: u + σ(Σ RMSunit(u)·RMSunit(key) / sqrt(d)) · value."""
    ua, urows = _as_rows(u)
    kr = np.ascontiguousarray(np.broadcast_to(_f32(key), ua.shape)).reshape(urows.shape)
    vr = np.ascontiguousarray(np.broadcast_to(_f32(value), ua.shape)).reshape(urows.shape)
    cdef float[:, ::1] uv = urows
    cdef const float[:, ::1] kv = kr
    cdef const float[:, ::1] vv = vr
    cdef Py_ssize_t r, c, d = urows.shape[1]
    cdef float alpha
    with nogil:
        for r in range(uv.shape[0]):
            alpha = engram_alpha_c(&uv[r, 0], &kv[r, 0], d)
            for c in range(d):
                uv[r, c] = uv[r, c] + alpha * vv[r, c]
    return ua


# --- multi-lane hyper-connection --------------------------------------------------

def mhc_router_input(lanes, quant=True):
    """nx = A8(RMSunit(flatten(X))) of the lane state [..., n, d] → [..., n·d]."""
    a = _f32(lanes)
    flat = a.reshape(a.shape[:-2] + (a.shape[-2] * a.shape[-1],))
    nx = rms_unit(flat)
    return a8(nx) if quant else nx


def mhc_offsets(n_lanes, lane):
    """(pre_off, post_off) [n]: +4/−4 and 0/−4 for own/other lanes."""
    own = np.arange(n_lanes) == lane
    pre = np.where(own, MHC_PRE_OWN, MHC_PRE_OTHER).astype(np.float32)
    post = np.where(own, MHC_POST_OWN, MHC_POST_OTHER).astype(np.float32)
    return pre, post


def mhc_pre_weights(phi_x, a, b, lane):
    """hpre = σ(a·(Φpre·nx) + b + pre_off)."""
    phi_x = _f32(phi_x)
    pre_off, _ = mhc_offsets(phi_x.shape[-1], lane)
    return sigmoid(np.float32(a) * phi_x + _f32(b) + pre_off)


def mhc_post_weights(phi_x, a, b, lane):
    """hpost = 2·σ(a·(Φpost·nx) + b + post_off)."""
    phi_x = _f32(phi_x)
    _, post_off = mhc_offsets(phi_x.shape[-1], lane)
    return (np.float32(2.0) * sigmoid(np.float32(a) * phi_x + _f32(b) + post_off)).astype(np.float32)


def logsumexp(x, axis):
    """max + log Σ exp(x − max) along ``axis`` (keepdims), float32."""
    x = _f32(x)
    m = np.max(x, axis=axis, keepdims=True)
    return (m + np.log(np.sum(np.exp(x - m), axis=axis, keepdims=True))).astype(np.float32)


def sinkhorn(z, iters=SINKHORN_ITERS):
    """Log-domain Sinkhorn on [..., n, n] (rows, then columns, ``iters`` times), then exp."""
    return _sinkhorn_batch(z, iters, True)


def _sinkhorn_scalar(z, iters=SINKHORN_ITERS):
    """sinkhorn with the scalar loop at every n (the tests compare nc_sinkhorn4 with it)."""
    return _sinkhorn_batch(z, iters, False)


def _sinkhorn_batch(z, iters, bint vector):
    out = np.array(z, dtype=np.float32, copy=True, order="C")
    if out.ndim < 2 or out.shape[-1] != out.shape[-2]:
        raise ValueError(f"sinkhorn: square matrices expected, got {out.shape}")
    n = out.shape[-1]
    flat = out.reshape(-1, n * n)
    cdef float[:, ::1] v = flat
    cdef Py_ssize_t r
    cdef int nn = n, it = int(iters)
    with nogil:
        for r in range(v.shape[0]):
            _sinkhorn(&v[r, 0], nn, it, vector)
    return out


def mhc_res_weights(phi_x, a, b):
    """P = Sinkhorn(a·reshape(Φres·nx) + b)."""
    phi_x = _f32(phi_x)
    n = int(round(np.sqrt(phi_x.shape[-1])))
    zz = np.float32(a) * phi_x.reshape(phi_x.shape[:-1] + (n, n)) + _f32(b)
    return sinkhorn(zz)


def mhc_collapse(lanes, hpre):
    """Block input u = Σ_m hpre[m] · X[m]."""
    return np.sum(_f32(hpre)[..., None] * _f32(lanes), axis=-2, dtype=np.float32).astype(np.float32)


def mhc_expand(lanes, P, hpost, y):
    """New lanes X'[i] = Σ_j P[i,j] X[j] + hpost[i] · y."""
    mixed = np.einsum("...ij,...jd->...id", _f32(P), _f32(lanes)).astype(np.float32)
    return (mixed + _f32(hpost)[..., None] * _f32(y)[..., None, :]).astype(np.float32)


# --- Monarch Hadamard MLP ------------------------------------------------------------

def monarch_factor_sizes(n):
    """(ba, bb) with ba = 1 << (bit_length(N−1) // 2), bb = N / ba."""
    ba = 1 << ((n - 1).bit_length() // 2)
    return ba, n // ba


def kron_apply(z, a, b):
    """K(z; A, B): view z [..., N] as Z [ba, bb] and return flatten(Aᵀ Z B)."""
    za = np.ascontiguousarray(z, dtype=np.float32)
    Aa = np.ascontiguousarray(a, dtype=np.float32)
    Ba = np.ascontiguousarray(b, dtype=np.float32)
    ba, bb = Aa.shape[0], Ba.shape[0]
    if Aa.shape != (ba, ba) or Ba.shape != (bb, bb) or za.shape[-1] != ba * bb:
        raise ValueError("kron_apply: A [ba, ba], B [bb, bb], z [..., ba·bb] expected")
    rows = za.reshape(-1, ba * bb)
    out = np.empty_like(rows)
    tmp = np.empty(ba * bb, np.float32)
    cdef float[:, ::1] zv = rows
    cdef float[:, ::1] ov = out
    cdef float[:, ::1] av = Aa
    cdef float[:, ::1] bv = Ba
    cdef float[::1] tv = tmp
    cdef Py_ssize_t r, nba = ba, nbb = bb
    with nogil:
        for r in range(zv.shape[0]):
            kron_apply_c(&zv[r, 0], &av[0, 0], &bv[0, 0], nba, nbb, &tv[0], &ov[r, 0])
    return out.reshape(za.shape)


def monarch_condition(m, cond_v, cond_u):
    """c = 1 + softmax(m · cond_v) · cond_u."""
    w = softmax(_f32(m) @ _f32(cond_v), axis=-1)
    return (np.float32(1.0) + w @ _f32(cond_u)).astype(np.float32)


class MonarchArrays:
    """Contiguous float32/int64 copies of one layer's Monarch parameters (any
    object with the reference MonarchParams attributes)."""
    names = ("d1", "d2", "b2", "d3", "d4", "w1a", "w1b", "w2a", "w2b", "w3a", "w3b", "cond_v", "cond_u")

    def __init__(self, p):
        for k in self.names:
            setattr(self, k, np.ascontiguousarray(getattr(p, k), dtype=np.float32))
        self.p1 = np.ascontiguousarray(np.asarray(p.p1).astype(np.int64))
        self.p2 = np.ascontiguousarray(np.asarray(p.p2).astype(np.int64))
        self.N = self.d1.shape[0]
        self.R = self.cond_u.shape[0]
        self.d = self.cond_v.shape[0]
        self.ba, self.bb = self.w1a.shape[0], self.w1b.shape[0]
        N = self.N
        if (self.ba * self.bb != N or self.cond_v.shape != (self.d, self.R)
                or self.cond_u.shape != (self.R, N) or self.d > N
                or self.w2a.shape != self.w1a.shape or self.w3a.shape != self.w1a.shape
                or self.w2b.shape != self.w1b.shape or self.w3b.shape != self.w1b.shape
                or any(getattr(self, k).shape != (N,) for k in ("d1", "d2", "b2", "d3", "d4"))):
            raise ValueError("monarch_mlp: inconsistent MLP parameter shapes")
        for perm in (self.p1, self.p2):
            if perm.shape != (N,) or perm.min() < 0 or perm.max() >= N:
                raise ValueError("monarch_mlp: permutations must be [N] indices in range")


def monarch_mlp(m, p):
    """Monarch Hadamard MLP of m [..., d] → [..., d] (spec §4.8)."""
    q = p if isinstance(p, MonarchArrays) else MonarchArrays(p)
    ma = np.ascontiguousarray(m, dtype=np.float32)
    if ma.shape[-1] != q.d:
        raise ValueError(f"monarch_mlp: input width {ma.shape[-1]}, expected {q.d}")
    rows = ma.reshape(-1, q.d)
    out = np.empty_like(rows)
    work = np.empty(4 * q.N + q.R, np.float32)
    cdef float[:, ::1] mv = rows
    cdef float[:, ::1] ov = out
    cdef float[::1] wv = work
    cdef float[::1] d1 = q.d1, d2 = q.d2, b2 = q.b2, d3 = q.d3, d4 = q.d4
    cdef float[:, ::1] w1a = q.w1a, w1b = q.w1b, w2a = q.w2a, w2b = q.w2b
    cdef float[:, ::1] w3a = q.w3a, w3b = q.w3b, cv = q.cond_v, cu = q.cond_u
    cdef int64_t[::1] q1 = q.p1, q2 = q.p2
    cdef Py_ssize_t r, d = q.d, N = q.N, R = q.R, ba = q.ba, bb = q.bb
    with nogil:
        for r in range(mv.shape[0]):
            monarch_mlp_c(&mv[r, 0], d, N, R, &d1[0], &d2[0], &b2[0], &d3[0], &d4[0],
                          &w1a[0, 0], &w1b[0, 0], &w2a[0, 0], &w2b[0, 0], &w3a[0, 0], &w3b[0, 0],
                          ba, bb, &cv[0, 0], &cu[0, 0], &q1[0], &q2[0], &wv[0], &wv[4 * N], &ov[r, 0], 0, 1, NULL, NULL)
    return out.reshape(ma.shape)


# --- probe heads -------------------------------------------------------------------

def probe_scores(cells, probes):
    """score[..., r, j] = cells[..., r, :] · P[r, j, :] / sqrt(d)."""
    c = _f32(cells)
    d = c.shape[-1]
    return (np.einsum("...rd,rjd->...rj", c, _f32(probes)) / np.float32(np.sqrt(d))).astype(np.float32)


class ProbePoolState:
    """Online token pooling (spec §5.5): per (row, probe) running max [R, k],
    denominator [R, k] and weighted sum [R, k, d]."""

    def __init__(self, max, denom, weighted):
        self.max = max
        self.denom = denom
        self.weighted = weighted

    @classmethod
    def empty(cls, rows, probes_per_row, d):
        return cls(np.full((rows, probes_per_row), -np.inf, np.float32),
                   np.zeros((rows, probes_per_row), np.float32),
                   np.zeros((rows, probes_per_row, d), np.float32))

    def copy(self):
        return ProbePoolState(self.max.copy(), self.denom.copy(), self.weighted.copy())

    @property
    def count_empty(self):
        return bool(np.all(np.isneginf(self.max)))


def probe_pool_update(state, cells_t, probes, keep=True):
    """Fold one token's cells [R, d] into the online pool (in place; returns state)."""
    if not keep:
        return state
    c = np.ascontiguousarray(cells_t, dtype=np.float32)
    pr = np.ascontiguousarray(probes, dtype=np.float32)
    R, k, d = pr.shape
    if c.shape != (R, d) or state.weighted.shape != (R, k, d):
        raise ValueError("probe_pool_update: cells [R, d], probes [R, k, d], state [R, k, d] must agree")
    cdef float[:, ::1] cv = c
    cdef float[:, :, ::1] pv = pr
    cdef float[:, ::1] mx = state.max
    cdef float[:, ::1] den = state.denom
    cdef float[:, :, ::1] sm = state.weighted
    cdef Py_ssize_t r, j, i, nR = R, nk = k, nd = d
    cdef float s, sqrt_d = np.float32(np.sqrt(d))
    with nogil:
        for r in range(nR):
            for j in range(nk):
                s = 0.0
                for i in range(nd):
                    s = s + cv[r, i] * pv[r, j, i]
                pool_update_c(&cv[r, 0], nd, s / sqrt_d, &mx[r, j], &den[r, j], &sm[r, j, 0])
    return state


def probe_pool_tokens_online(state):
    """The pooled cells [R, k, d] of an online state (weighted / denom)."""
    return (state.weighted / state.denom[..., None]).astype(np.float32)


def probe_pool_tokens(cells, probes, keep=None):
    """Token pooling for a whole sequence: cells [T, R, d], probes [R, k, d] → [R, k, d]."""
    c = _f32(cells)
    pr = np.ascontiguousarray(probes, dtype=np.float32)
    T, R, d = c.shape
    st = ProbePoolState.empty(R, pr.shape[1], d)
    kp = np.ones(T, bool) if keep is None else np.asarray(keep, bool)
    for t in range(T):
        probe_pool_update(st, c[t], pr, bool(kp[t]))
    return probe_pool_tokens_online(st)


def probe_pool_rows(token_pooled, gain, query, row_bias):
    """Row/probe pooling after the token pooling (spec §5.2) → z [q·d]."""
    tp = _f32(token_pooled)
    R, k, d = tp.shape
    rho = (rms_unit(tp) * _f32(gain)[..., None]).astype(np.float32).reshape(R * k, d)
    u = (_f32(query) @ rho.T) / np.float32(np.sqrt(d)) + _f32(row_bias).reshape(-1, R * k)
    omega = softmax(u.astype(np.float32), axis=-1)
    return (omega @ rho).astype(np.float32).reshape(-1)


def probe_pool(cells, probes, gain, query, row_bias, keep=None):
    """Whole-sequence probe pooling (spec §5.2): cells [T, R, d] → z [q·d]."""
    return probe_pool_rows(probe_pool_tokens(cells, probes, keep), gain, query, row_bias)


def probe_head_output(z, proj, bias):
    """out = Wproj · z + bias (proj dequantized [out, q·d])."""
    return (linear(z, proj) + _f32(bias)).astype(np.float32)


def embedding_head_post(out):
    """Embedding head: L2-normalise p / sqrt(Σp² + 1e-12)."""
    o = _f32(out)
    return (o / np.sqrt(np.sum(o * o, dtype=np.float32) + np.float32(L2_EPS))).astype(np.float32)


def confidence_head_post(out):
    """Confidence head: the raw logit out[0] as a Python float."""
    return float(_f32(out).reshape(-1)[0])


def router_head_post(out):
    """Router head: the 3 raw logits, float32."""
    return _f32(out).copy()


HEAD_POST = {
    "embedding": embedding_head_post,
    "confidence": confidence_head_post,
    "router": router_head_post,
}
