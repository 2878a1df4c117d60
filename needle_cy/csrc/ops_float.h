/* The float operators' vector loops (_ops): dot products, exp/silu/sigmoid, the
   Kronecker and conditioning products, A8 fake-quant, the attention scores and
   weighted sums, Sinkhorn on 4 lanes.

   Chosen at compile time, as the rest of _ops is: AVX2 + FMA where the build targets
   it (-march=native or x86-64-v3; AVX-512 widths where __AVX512F__ is set too), and a
   portable twin of every function otherwise.  Each vector loop keeps the operation
   order of the plain loop it replaces where its comment says so (the same bits);
   the others say how their sums differ. */
#ifndef NEEDLE_CY_OPS_FLOAT_H
#define NEEDLE_CY_OPS_FLOAT_H

#include <math.h>
#include <stddef.h>

/* The A8 level of v at scale s: clip(rint(v/s), -qmax-1, qmax); rintf rounds half to
   even in the default rounding mode, like np.round (the vector loops' tails) */
static inline float nc_a8_level(float v, float s, float qmax) {
    float k = rintf(v / s);
    if (k < -qmax - 1.0f) k = -qmax - 1.0f;
    if (k > qmax) k = qmax;
    return k;
}
/* nc_a8_level(v, s, qmax) * s */
static inline float nc_a8_one(float v, float s, float qmax) {
    return nc_a8_level(v, s, qmax) * s;
}
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
static inline float nc_hsum256(__m256 v) {
    __m128 lo = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
    lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
    return _mm_cvtss_f32(lo);
}
/* Σ a[i]·b[i] with 16 float32 lanes (2 AVX2 accumulators), then the tail. */
static inline float nc_dot(const float* a, const float* b, ptrdiff_t n) {
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    ptrdiff_t i = 0;
    for (; i + 16 <= n; i += 16) {
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), acc1);
    }
    if (i + 8 <= n) {
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
        i += 8;
    }
    float s = nc_hsum256(_mm256_add_ps(acc0, acc1));
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}
/* exp(x) for 8 floats (nc_exp256) or 16 (nc_exp512, where AVX-512 is built; the
   same operations lane by lane, so the same bits): Cody–Waite range reduction and the
   Cephes expf polynomial (about 1 ulp; inputs below -88.38 give ~0, as softmax of
   masked scores wants).  W: the vector width in bits; ROUND: its round-to-integer. */
#define NC_EXP_WIDTH(W, ROUND)                                                              \
static inline __m##W nc_exp##W(__m##W x) {                                                  \
    x = _mm##W##_min_ps(_mm##W##_max_ps(x, _mm##W##_set1_ps(-88.3762626647949f)),          \
                        _mm##W##_set1_ps(88.3762626647949f));                               \
    __m##W fx = ROUND(_mm##W##_mul_ps(x, _mm##W##_set1_ps(1.44269504088896341f)),          \
                      _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);                       \
    x = _mm##W##_fnmadd_ps(fx, _mm##W##_set1_ps(0.693359375f), x);                          \
    x = _mm##W##_fnmadd_ps(fx, _mm##W##_set1_ps(-2.12194440e-4f), x);                       \
    __m##W y = _mm##W##_set1_ps(1.9875691500E-4f);                                          \
    y = _mm##W##_fmadd_ps(y, x, _mm##W##_set1_ps(1.3981999507E-3f));                        \
    y = _mm##W##_fmadd_ps(y, x, _mm##W##_set1_ps(8.3334519073E-3f));                        \
    y = _mm##W##_fmadd_ps(y, x, _mm##W##_set1_ps(4.1665795894E-2f));                        \
    y = _mm##W##_fmadd_ps(y, x, _mm##W##_set1_ps(1.6666665459E-1f));                        \
    y = _mm##W##_fmadd_ps(y, x, _mm##W##_set1_ps(5.0000001201E-1f));                        \
    y = _mm##W##_fmadd_ps(y, _mm##W##_mul_ps(x, x), _mm##W##_add_ps(x, _mm##W##_set1_ps(1.0f))); \
    __m##W##i n = _mm##W##_slli_epi32(_mm##W##_add_epi32(_mm##W##_cvtps_epi32(fx),          \
                                                         _mm##W##_set1_epi32(127)), 23);    \
    return _mm##W##_mul_ps(y, _mm##W##_castsi##W##_ps(n));                                  \
}
NC_EXP_WIDTH(256, _mm256_round_ps)
#ifdef __AVX512F__
NC_EXP_WIDTH(512, _mm512_roundscale_ps)
#endif
#undef NC_EXP_WIDTH
/* o[i] ·= σ(g[i]) */
static inline void nc_mul_sigmoid(float* o, const float* g, ptrdiff_t n) {
    const __m256 one = _mm256_set1_ps(1.0f), zero = _mm256_setzero_ps();
    ptrdiff_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 e = nc_exp256(_mm256_sub_ps(zero, _mm256_loadu_ps(g + i)));
        _mm256_storeu_ps(o + i, _mm256_div_ps(_mm256_loadu_ps(o + i), _mm256_add_ps(one, e)));
    }
    for (; i < n; i++) o[i] = o[i] * (1.0f / (1.0f + expf(-g[i])));
}
/* x[i] = silu(x[i]) = x/(1 + e^-x) */
static inline void nc_silu(float* x, ptrdiff_t n) {
    const __m256 one = _mm256_set1_ps(1.0f), zero = _mm256_setzero_ps();
    ptrdiff_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i);
        __m256 e = nc_exp256(_mm256_sub_ps(zero, v));
        _mm256_storeu_ps(x + i, _mm256_div_ps(v, _mm256_add_ps(one, e)));
    }
    for (; i < n; i++) x[i] = x[i] / (1.0f + expf(-x[i]));
}
/* x[i] = exp(x[i]·scale − sub); returns Σ x[i] */
static inline float nc_exp_sum(float* x, ptrdiff_t n, float scale, float sub) {
    __m256 acc = _mm256_setzero_ps(), vs = _mm256_set1_ps(scale), vm = _mm256_set1_ps(sub);
    ptrdiff_t i = 0;
#ifdef __AVX512F__
    /* 16 at a time, the two halves added to the 8-lane sum in order (the same sum) */
    for (; i + 16 <= n; i += 16) {
        __m512 e = nc_exp512(_mm512_fmsub_ps(_mm512_loadu_ps(x + i), _mm512_set1_ps(scale),
                                             _mm512_set1_ps(sub)));
        _mm512_storeu_ps(x + i, e);
        acc = _mm256_add_ps(acc, _mm512_castps512_ps256(e));
        acc = _mm256_add_ps(acc, _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(e), 1)));
    }
#endif
    for (; i + 8 <= n; i += 8) {
        __m256 e = nc_exp256(_mm256_fmsub_ps(_mm256_loadu_ps(x + i), vs, vm));
        _mm256_storeu_ps(x + i, e);
        acc = _mm256_add_ps(acc, e);
    }
    float s = nc_hsum256(acc);
    for (; i < n; i++) { x[i] = expf(x[i] * scale - sub); s += x[i]; }
    return s;
}
/* out = flatten(Aᵀ·Z·B), Z = z as [ba, bb]; bb a multiple of 8 up to 64: each
   output row is accumulated in registers.  Four output rows are built side by
   side (KB, a compile-time count): with one row at a time the FMAs of a row
   form a chain (4-cycle latency each) that left the FMA units mostly idle at
   bb = 16, and the rows share their loads of Z or B.  Every accumulator still
   sums in the same order, so the result is unchanged. */
/* out[k0 + kk, :] = Σ_i M[i·m_stride + (k0 + kk)·m_step] · R[i, :] on W-bit vectors of
   LANES floats, at most KBMAX rows × NVMAX vectors: nc_kron_rows (8 floats) and, where
   AVX-512 is built, nc_kron_rows512 (16: the same FMA chain for every element, so the
   same bits; at bb = 32 one thread's FMA rate doubles over the 8-float loop, which was
   bound by it at ~70 % of the ymm peak). */
#define NC_KRON_ROWS(NAME, W, LANES, KBMAX, NVMAX)                                          \
static inline __attribute__((always_inline)) void NAME(                                     \
        const float* M, ptrdiff_t m_stride, ptrdiff_t m_step, const float* R,             \
        ptrdiff_t n_in, ptrdiff_t bb, ptrdiff_t k0, const int KB, const int NV, float* out) { \
    __m##W acc[KBMAX][NVMAX];                                                               \
    int kk, v;                                                                              \
    for (kk = 0; kk < KB; kk++)                                                             \
        for (v = 0; v < NV; v++) acc[kk][v] = _mm##W##_setzero_ps();                        \
    for (ptrdiff_t i = 0; i < n_in; i++) {                                                 \
        __m##W r[NVMAX];                                                                    \
        for (v = 0; v < NV; v++) r[v] = _mm##W##_loadu_ps(R + i * bb + LANES * v);          \
        for (kk = 0; kk < KB; kk++) {                                                       \
            const __m##W a = _mm##W##_set1_ps(M[i * m_stride + (k0 + kk) * m_step]);        \
            for (v = 0; v < NV; v++) acc[kk][v] = _mm##W##_fmadd_ps(a, r[v], acc[kk][v]);   \
        }                                                                                   \
    }                                                                                       \
    for (kk = 0; kk < KB; kk++)                                                             \
        for (v = 0; v < NV; v++) _mm##W##_storeu_ps(out + (k0 + kk) * bb + LANES * v, acc[kk][v]); \
}
NC_KRON_ROWS(nc_kron_rows, 256, 8, 4, 8)
#ifdef __AVX512F__
NC_KRON_ROWS(nc_kron_rows512, 512, 16, 8, 2)
#endif
#undef NC_KRON_ROWS
/* Output rows [k0, k1) (each row's sums do not depend on how the rows are grouped) */
static inline void nc_kron_half(const float* M, ptrdiff_t m_stride, ptrdiff_t m_step,
                                const float* R, ptrdiff_t n_in, ptrdiff_t k0, ptrdiff_t k1,
                                ptrdiff_t bb, float* out) {
    ptrdiff_t k = k0;
#ifdef __AVX512F__
    if (bb == 32) {             /* full size (hada_n 1024): 4 rows × 2 vectors = 8 chains */
        for (; k + 4 <= k1; k += 4) nc_kron_rows512(M, m_stride, m_step, R, n_in, bb, k, 4, 2, out);
        for (; k < k1; k++) nc_kron_rows512(M, m_stride, m_step, R, n_in, bb, k, 1, 2, out);
        return;
    }
    if (bb == 16) {             /* the shipped model: 8 rows × 1 vector = 8 chains */
        for (; k + 8 <= k1; k += 8) nc_kron_rows512(M, m_stride, m_step, R, n_in, bb, k, 8, 1, out);
        for (; k < k1; k++) nc_kron_rows512(M, m_stride, m_step, R, n_in, bb, k, 1, 1, out);
        return;
    }
#endif
    if (bb == 16) {             /* the shipped geometry: 4 rows × 2 vectors = 8 chains */
        for (; k + 4 <= k1; k += 4) nc_kron_rows(M, m_stride, m_step, R, n_in, bb, k, 4, 2, out);
        for (; k < k1; k++) nc_kron_rows(M, m_stride, m_step, R, n_in, bb, k, 1, 2, out);
        return;
    }
    if (bb == 32) {             /* 2 rows × 4 vectors = 8 chains (4 rows read 4 % slower) */
        for (; k + 2 <= k1; k += 2) nc_kron_rows(M, m_stride, m_step, R, n_in, bb, k, 2, 4, out);
        for (; k < k1; k++) nc_kron_rows(M, m_stride, m_step, R, n_in, bb, k, 1, 4, out);
        return;
    }
    switch (bb / 8) {
#define NC_KR(NN) case NN: for (; k < k1; k++) nc_kron_rows(M, m_stride, m_step, R, n_in, bb, k, 1, NN, out); break;
    NC_KR(1) NC_KR(2) NC_KR(3) NC_KR(4) NC_KR(5) NC_KR(6) NC_KR(7) NC_KR(8)
#undef NC_KR
    }
}
/* Rows [k0, k1) of out = flatten(Aᵀ·Z·B): row k of out needs only row k of tmp */
static inline int nc_kron_avx2(const float* z, const float* A, const float* B,
                               ptrdiff_t ba, ptrdiff_t bb, float* tmp, float* out,
                               ptrdiff_t k0, ptrdiff_t k1) {
    if (bb % 8 || bb > 64) return 0;
    nc_kron_half(A, ba, 1, z, ba, k0, k1, bb, tmp);     /* tmp[k,:] = Σ_i A[i,k]·z[i,:] */
    nc_kron_half(tmp, 1, bb, B, bb, k0, k1, bb, out);   /* out[k,:] = Σ_j tmp[k,j]·B[j,:] */
    return 1;
}
/* logit[r] = Σ_i m[i]·cond_v[i·R + r] for R a multiple of 8 up to 32, the R sums in
   registers (the plain loop kept them in memory: a store-to-load chain per i).
   Four partial sums, term i in sum i mod 4, then (s0 + s1) + (s2 + s3): at R = 8
   one chain of d dependent FMAs had been a microsecond a token and block (4-cycle
   latency each).  The plain loop (_monarch_condition) sums in the same order, so
   the same bits. */
static inline int nc_cond_logits(const float* m, ptrdiff_t d, const float* cond_v,
                                 ptrdiff_t R, float* logit) {
    if (R % 8 || R > 32 || R < 8) return 0;
    __m256 acc[4][4];
    ptrdiff_t i, nv = R / 8, v;
    int p;
    for (p = 0; p < 4; p++)
        for (v = 0; v < nv; v++) acc[p][v] = _mm256_setzero_ps();
    for (i = 0; i + 4 <= d; i += 4)
        for (p = 0; p < 4; p++) {
            const __m256 mi = _mm256_set1_ps(m[i + p]);
            for (v = 0; v < nv; v++)
                acc[p][v] = _mm256_fmadd_ps(mi, _mm256_loadu_ps(cond_v + (i + p) * R + 8 * v), acc[p][v]);
        }
    for (p = 0; i < d; i++, p++) {
        const __m256 mi = _mm256_set1_ps(m[i]);
        for (v = 0; v < nv; v++)
            acc[p][v] = _mm256_fmadd_ps(mi, _mm256_loadu_ps(cond_v + i * R + 8 * v), acc[p][v]);
    }
    for (v = 0; v < nv; v++)
        _mm256_storeu_ps(logit + 8 * v, _mm256_add_ps(_mm256_add_ps(acc[0][v], acc[1][v]),
                                                     _mm256_add_ps(acc[2][v], acc[3][v])));
    return 1;
}
/* c[i] = 1 + Σ_r w[r]·cond_u[r·N + i] for i in [i0, i1) ((i1 - i0) a multiple of 8),
   32 columns at a time with the R sums in registers: the plain loop's FMA chain
   from 0 over r in order, element by element, so the same bits; the loop made R
   read-modify-write passes over c (in decode the largest part of the conditioning's
   time).  Returns 0 (nothing done) where it does not apply. */
static inline int nc_cond_mix(const float* w, ptrdiff_t R, const float* cond_u, ptrdiff_t N,
                              float* c, ptrdiff_t i0, ptrdiff_t i1) {
    if ((i1 - i0) % 8) return 0;
    const __m256 one = _mm256_set1_ps(1.0f);
    ptrdiff_t i = i0, r;
    for (; i + 32 <= i1; i += 32) {
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (r = 0; r < R; r++) {
            const __m256 wr = _mm256_set1_ps(w[r]);
            const float* u = cond_u + r * N + i;
            a0 = _mm256_fmadd_ps(wr, _mm256_loadu_ps(u), a0);
            a1 = _mm256_fmadd_ps(wr, _mm256_loadu_ps(u + 8), a1);
            a2 = _mm256_fmadd_ps(wr, _mm256_loadu_ps(u + 16), a2);
            a3 = _mm256_fmadd_ps(wr, _mm256_loadu_ps(u + 24), a3);
        }
        _mm256_storeu_ps(c + i, _mm256_add_ps(one, a0));
        _mm256_storeu_ps(c + i + 8, _mm256_add_ps(one, a1));
        _mm256_storeu_ps(c + i + 16, _mm256_add_ps(one, a2));
        _mm256_storeu_ps(c + i + 24, _mm256_add_ps(one, a3));
    }
    for (; i < i1; i += 8) {
        __m256 a0 = _mm256_setzero_ps();
        for (r = 0; r < R; r++)
            a0 = _mm256_fmadd_ps(_mm256_set1_ps(w[r]), _mm256_loadu_ps(cond_u + r * N + i), a0);
        _mm256_storeu_ps(c + i, _mm256_add_ps(one, a0));
    }
    return 1;
}
/* nc_a8_level's arithmetic on the 8 lanes at x (vdivps and round-to-nearest-even are
   the scalar divss and rintf; min/max in the order that lets a NaN through, as the
   scalar comparisons do) */
static inline __m256 nc_a8_level8(const float* x, __m256 vs, __m256 lo, __m256 hi) {
    const __m256 k = _mm256_round_ps(_mm256_div_ps(_mm256_loadu_ps(x), vs),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    return _mm256_min_ps(hi, _mm256_max_ps(lo, k));
}
/* x[j] = nc_a8_level(x[j], s, qmax)·s, eight at a time */
static inline void nc_a8_apply(float* x, ptrdiff_t n, float s, float qmax) {
    const __m256 vs = _mm256_set1_ps(s), lo = _mm256_set1_ps(-qmax - 1.0f), hi = _mm256_set1_ps(qmax);
    ptrdiff_t j = 0;
    for (; j + 8 <= n; j += 8)
        _mm256_storeu_ps(x + j, _mm256_mul_ps(nc_a8_level8(x + j, vs, lo, hi), vs));
    for (; j < n; j++) x[j] = nc_a8_one(x[j], s, qmax);
}
/* codes[j] = (int8) nc_a8_level(x[j], s, qmax), eight at a time: the integral floats
   go to int32 and their low bytes are kept (as the scalar conversion stores them) */
static inline void nc_a8_codes(const float* x, ptrdiff_t n, float s, float qmax, signed char* codes) {
    const __m256 vs = _mm256_set1_ps(s), lo = _mm256_set1_ps(-qmax - 1.0f), hi = _mm256_set1_ps(qmax);
    const __m128i low_bytes = _mm_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
    ptrdiff_t j = 0;
    for (; j + 8 <= n; j += 8) {
        const __m256i ki = _mm256_cvtps_epi32(nc_a8_level8(x + j, vs, lo, hi));
        const __m128i a = _mm_shuffle_epi8(_mm256_castsi256_si128(ki), low_bytes);
        const __m128i b = _mm_shuffle_epi8(_mm256_extracti128_si256(ki, 1), low_bytes);
        _mm_storel_epi64((__m128i*)(codes + j), _mm_unpacklo_epi32(a, b));
    }
    for (; j < n; j++) codes[j] = (signed char)nc_a8_level(x[j], s, qmax);
}
/* max |x[i]| (0 for n = 0; NaNs ignored, as the scalar comparison does) */
static inline float nc_absmax(const float* x, ptrdiff_t n) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 m = _mm256_setzero_ps();
    ptrdiff_t i = 0;
    float lanes[8], amax = 0.f;
    /* maxps returns its second operand when either is NaN: keep the running max there */
    for (; i + 8 <= n; i += 8) m = _mm256_max_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(x + i)), m);
    _mm256_storeu_ps(lanes, m);
    for (int l = 0; l < 8; l++) if (lanes[l] > amax) amax = lanes[l];
    for (; i < n; i++) if (fabsf(x[i]) > amax) amax = fabsf(x[i]);
    return amax;
}
/* Scores of 8 consecutive slots for G query heads (G a compile-time constant
   after inlining, so the accumulators stay in registers). */
static inline __attribute__((always_inline)) void nc_scores8(
        const float* q, ptrdiff_t q_stride, const int G, const float* kt, ptrdiff_t k_stride,
        ptrdiff_t j, ptrdiff_t dq, float* scores, ptrdiff_t score_stride) {
    __m256 acc[8];
    int g;
    for (g = 0; g < G; g++) acc[g] = _mm256_setzero_ps();
    for (ptrdiff_t i = 0; i < dq; i++) {
        __m256 kv = _mm256_loadu_ps(kt + i * k_stride + j);
        for (g = 0; g < G; g++)
            acc[g] = _mm256_fmadd_ps(_mm256_broadcast_ss(q + g * q_stride + i), kv, acc[g]);
    }
    for (g = 0; g < G; g++) _mm256_storeu_ps(scores + g * score_stride + j, acc[g]);
}
/* Scores of 32 consecutive slots for G ≤ 2 heads: with 8 slots and G = 2 there are
   only two dependent FMA chains of dq links (latency-bound); four slot vectors give
   4·G chains and share the q broadcasts.  Each score sums in the same order. */
static inline __attribute__((always_inline)) void nc_scores32(
        const float* q, ptrdiff_t q_stride, const int G, const float* kt, ptrdiff_t k_stride,
        ptrdiff_t j, ptrdiff_t dq, float* scores, ptrdiff_t score_stride) {
    __m256 acc[2][4];
    int g, v;
    for (g = 0; g < G; g++)
        for (v = 0; v < 4; v++) acc[g][v] = _mm256_setzero_ps();
    for (ptrdiff_t i = 0; i < dq; i++) {
        const float* krow = kt + i * k_stride + j;
        const __m256 k0 = _mm256_loadu_ps(krow), k1 = _mm256_loadu_ps(krow + 8);
        const __m256 k2 = _mm256_loadu_ps(krow + 16), k3 = _mm256_loadu_ps(krow + 24);
        for (g = 0; g < G; g++) {
            const __m256 qi = _mm256_broadcast_ss(q + g * q_stride + i);
            acc[g][0] = _mm256_fmadd_ps(qi, k0, acc[g][0]);
            acc[g][1] = _mm256_fmadd_ps(qi, k1, acc[g][1]);
            acc[g][2] = _mm256_fmadd_ps(qi, k2, acc[g][2]);
            acc[g][3] = _mm256_fmadd_ps(qi, k3, acc[g][3]);
        }
    }
    for (g = 0; g < G; g++)
        for (v = 0; v < 4; v++) _mm256_storeu_ps(scores + g * score_stride + j + 8 * v, acc[g][v]);
}
/* sinkhorn_c's iterations on a 4×4 P = exp(M − max) (the mHC router of 4 lanes), in
   SSE registers: the row sums of all four rows at once from the columns, lane i =
   ((P[i][0] + P[i][1]) + P[i][2]) + P[i][3], one division and four products, then the
   column sums from the rows (a transpose between), the scalar loop's operations
   element by element, so the same bits.  Its chain of dependent scalar sums and
   divisions took 0.53 us a matrix, on thread 0's serial path of every block. */
static inline int nc_sinkhorn4(float* M, int iters) {
    __m128 r0 = _mm_loadu_ps(M), r1 = _mm_loadu_ps(M + 4), r2 = _mm_loadu_ps(M + 8),
           r3 = _mm_loadu_ps(M + 12);
    const __m128 one = _mm_set1_ps(1.0f);
    __m128 inv;
    _MM_TRANSPOSE4_PS(r0, r1, r2, r3);            /* now columns */
    for (int it = 0; it < iters; it++) {
        inv = _mm_div_ps(one, _mm_add_ps(_mm_add_ps(_mm_add_ps(r0, r1), r2), r3));
        r0 = _mm_mul_ps(r0, inv); r1 = _mm_mul_ps(r1, inv);
        r2 = _mm_mul_ps(r2, inv); r3 = _mm_mul_ps(r3, inv);
        _MM_TRANSPOSE4_PS(r0, r1, r2, r3);        /* rows */
        inv = _mm_div_ps(one, _mm_add_ps(_mm_add_ps(_mm_add_ps(r0, r1), r2), r3));
        r0 = _mm_mul_ps(r0, inv); r1 = _mm_mul_ps(r1, inv);
        r2 = _mm_mul_ps(r2, inv); r3 = _mm_mul_ps(r3, inv);
        _MM_TRANSPOSE4_PS(r0, r1, r2, r3);        /* columns */
    }
    _MM_TRANSPOSE4_PS(r0, r1, r2, r3);            /* rows */
    _mm_storeu_ps(M, r0); _mm_storeu_ps(M + 4, r1);
    _mm_storeu_ps(M + 8, r2); _mm_storeu_ps(M + 12, r3);
    return 1;
}
/* max(mx, x[0], …, x[n−1]), NaNs ignored like the scalar comparison (maxps returns
   its second operand when either is NaN).  The scalar loop was a vmaxss chain:
   about a seventh of the attention time in prefill. */
static inline float nc_max_from(const float* x, ptrdiff_t n, float mx) {
    ptrdiff_t i = 0;
    if (n >= 8) {
        __m256 m = _mm256_set1_ps(mx);
        float lanes[8];
        for (; i + 8 <= n; i += 8) m = _mm256_max_ps(_mm256_loadu_ps(x + i), m);
        _mm256_storeu_ps(lanes, m);
        for (int l = 0; l < 8; l++) if (lanes[l] > mx) mx = lanes[l];
    }
    for (; i < n; i++) if (x[i] > mx) mx = x[i];
    return mx;
}
/* out[0:8·NV] = Σ_j p_j · v_j over slots [a, b), the row held in registers. */
static inline __attribute__((always_inline)) void nc_pv(
        const float* sc, const float* vc, ptrdiff_t a, ptrdiff_t b, ptrdiff_t dv,
        const int NV, float inv, float* out) {
    __m256 acc[8];
    int v;
    for (v = 0; v < NV; v++) acc[v] = _mm256_setzero_ps();
    for (ptrdiff_t j = a; j < b; j++) {
        __m256 p = _mm256_broadcast_ss(sc + j);
        const float* vj = vc + j * dv;
        for (v = 0; v < NV; v++) acc[v] = _mm256_fmadd_ps(p, _mm256_loadu_ps(vj + 8 * v), acc[v]);
    }
    for (v = 0; v < NV; v++) _mm256_storeu_ps(out + 8 * v, acc[v]);
}
/* GQA attention of G ≤ 8 query heads against one KV head (keys transposed
   [dq][k_stride], values [slot][dv], dv a multiple of 8 up to 64): scores of 8
   slots for all G heads per pass over the key dimensions, the softmax, then
   Σ p·v with the output row in registers (one ring range at a time). */
static inline int nc_attend_avx2(const float* q, ptrdiff_t q_stride, ptrdiff_t G,
                                 const float* kt, ptrdiff_t k_stride, const float* vc,
                                 ptrdiff_t dq, ptrdiff_t dv, float scale,
                                 const ptrdiff_t* ranges, int n_ranges,
                                 float* scores, ptrdiff_t score_stride,
                                 float* out, ptrdiff_t out_stride) {
    if (G > 8 || G < 1 || dv % 8 || dv > 64) return 0;
    ptrdiff_t nv = dv / 8, i, j, g, v;
    int r;
    float part[64];
    for (r = 0; r < n_ranges; r++) {
        ptrdiff_t a = ranges[2 * r], b = ranges[2 * r + 1];
        j = a;
        if (G == 1) for (; j + 32 <= b; j += 32) nc_scores32(q, q_stride, 1, kt, k_stride, j, dq, scores, score_stride);
        if (G == 2) for (; j + 32 <= b; j += 32) nc_scores32(q, q_stride, 2, kt, k_stride, j, dq, scores, score_stride);
        switch (G) {
#define NC_SC(GG) case GG: \
            for (; j + 8 <= b; j += 8) nc_scores8(q, q_stride, GG, kt, k_stride, j, dq, scores, score_stride); \
            break;
            NC_SC(1) NC_SC(2) NC_SC(3) NC_SC(4) NC_SC(5) NC_SC(6) NC_SC(7) NC_SC(8)
#undef NC_SC
        }
        for (; j < b; j++) {
            for (g = 0; g < G; g++) {
                float s = 0.f;
                for (i = 0; i < dq; i++) s += q[g * q_stride + i] * kt[i * k_stride + j];
                scores[g * score_stride + j] = s;
            }
        }
    }
    for (g = 0; g < G; g++) {
        float* sc = scores + g * score_stride;
        float* o = out + g * out_stride;
        float mx = -INFINITY, den = 0.f;
        for (r = 0; r < n_ranges; r++)
            mx = nc_max_from(sc + ranges[2 * r], ranges[2 * r + 1] - ranges[2 * r], mx);
        for (r = 0; r < n_ranges; r++)
            den += nc_exp_sum(sc + ranges[2 * r], ranges[2 * r + 1] - ranges[2 * r], scale, mx * scale);
        for (v = 0; v < dv; v++) o[v] = 0.f;
        for (r = 0; r < n_ranges; r++) {
            ptrdiff_t a = ranges[2 * r], b = ranges[2 * r + 1];
            switch (nv) {
#define NC_PV(NN) case NN: nc_pv(sc, vc, a, b, dv, NN, 1.f, part); break;
                NC_PV(1) NC_PV(2) NC_PV(3) NC_PV(4) NC_PV(5) NC_PV(6) NC_PV(7) NC_PV(8)
#undef NC_PV
            }
            for (v = 0; v < dv; v++) o[v] += part[v];
        }
        float inv = 1.0f / den;
        for (v = 0; v < dv; v++) o[v] *= inv;
    }
    return 1;
}
#else
static inline void nc_mul_sigmoid(float* o, const float* g, ptrdiff_t n) {
    for (ptrdiff_t i = 0; i < n; i++) o[i] = o[i] * (1.0f / (1.0f + expf(-g[i])));
}
static inline void nc_silu(float* x, ptrdiff_t n) {
    for (ptrdiff_t i = 0; i < n; i++) x[i] = x[i] / (1.0f + expf(-x[i]));
}
static inline int nc_attend_avx2(const float* q, ptrdiff_t q_stride, ptrdiff_t G,
                                 const float* kt, ptrdiff_t k_stride, const float* vc,
                                 ptrdiff_t dq, ptrdiff_t dv, float scale,
                                 const ptrdiff_t* ranges, int n_ranges,
                                 float* scores, ptrdiff_t score_stride,
                                 float* out, ptrdiff_t out_stride) {
    return 0;
}
static inline float nc_exp_sum(float* x, ptrdiff_t n, float scale, float sub) {
    float s = 0.f;
    for (ptrdiff_t i = 0; i < n; i++) { x[i] = expf(x[i] * scale - sub); s += x[i]; }
    return s;
}
static inline int nc_kron_avx2(const float* z, const float* A, const float* B,
                               ptrdiff_t ba, ptrdiff_t bb, float* tmp, float* out,
                               ptrdiff_t k0, ptrdiff_t k1) {
    return 0;
}
static inline int nc_cond_mix(const float* w, ptrdiff_t R, const float* cond_u, ptrdiff_t N,
                              float* c, ptrdiff_t i0, ptrdiff_t i1) {
    return 0;
}
static inline int nc_cond_logits(const float* m, ptrdiff_t d, const float* cond_v,
                                 ptrdiff_t R, float* logit) {
    return 0;
}
static inline float nc_absmax(const float* x, ptrdiff_t n) {
    float amax = 0.f;
    for (ptrdiff_t i = 0; i < n; i++) if (fabsf(x[i]) > amax) amax = fabsf(x[i]);
    return amax;
}
static inline void nc_a8_apply(float* x, ptrdiff_t n, float s, float qmax) {
    for (ptrdiff_t j = 0; j < n; j++) x[j] = nc_a8_one(x[j], s, qmax);
}
static inline void nc_a8_codes(const float* x, ptrdiff_t n, float s, float qmax, signed char* codes) {
    for (ptrdiff_t j = 0; j < n; j++) codes[j] = (signed char)nc_a8_level(x[j], s, qmax);
}
/* portable: 4 independent accumulators so the adds pipeline */
static inline float nc_dot(const float* a, const float* b, ptrdiff_t n) {
    float s0 = 0.f, s1 = 0.f, s2 = 0.f, s3 = 0.f;
    ptrdiff_t i = 0;
    for (; i + 4 <= n; i += 4) {
        s0 += a[i] * b[i]; s1 += a[i + 1] * b[i + 1];
        s2 += a[i + 2] * b[i + 2]; s3 += a[i + 3] * b[i + 3];
    }
    for (; i < n; i++) s0 += a[i] * b[i];
    return (s0 + s1) + (s2 + s3);
}
static inline float nc_max_from(const float* x, ptrdiff_t n, float mx) {
    for (ptrdiff_t i = 0; i < n; i++) if (x[i] > mx) mx = x[i];
    return mx;
}
static inline int nc_sinkhorn4(float* M, int iters) {
    return 0;                                     /* the scalar loop runs */
}
#endif

#endif  /* NEEDLE_CY_OPS_FLOAT_H */
