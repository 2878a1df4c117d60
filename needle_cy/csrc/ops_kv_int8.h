/* Attention over the int8 KV cache (_ops, deploy numerics with kv_bits ≥ 8): the
   scores of int8 queries against int8 keys and the weighted sums of int8 values.

   Chosen at compile time for x86 (AVX-512 VNNI, else AVX2, else portable) and at run
   time on aarch64 (the dot product extension, nc_i8_detect at import); nc_i8_kernel()
   names the one in use.  Every variant computes the same exact integer sums. */
#ifndef NEEDLE_CY_OPS_KV_INT8_H
#define NEEDLE_CY_OPS_KV_INT8_H

#include <stddef.h>
#include <string.h>
#if defined(__AVX2__)
#include <immintrin.h>
#endif

/* ---- GQA attention over the int8 KV cache (deploy numerics, kv_bits ≥ 8) ----
   Keys: offset-binary codes (A8 code + 128, so uint8) in quads of dimensions,
   kq[(i4·k_stride + slot)·4 + c] = key dimension 4·i4 + c of that slot: the 16
   slots of one 64-byte vector are consecutive, like the transposed float layout,
   and one VNNI dot-product instruction adds four dimensions of 16 slots.  Values:
   int8 rows vc[slot·dv + i].  One float32 scale per slot each (ks, vs).  Queries:
   int8 codes q[g·q_stride + i], zero beyond dq up to the next multiple of 4, and
   one scale qs[g] per head.
   score = (float)(Σ q·(k+128) − 128·Σ q) · (qs·ks): the integer sum is exact, so
   every code path (vector, masked tail, scalar) gives the same bits, and the value
   is q̂·k̂ of the fake-quant floats up to one float32 rounding.
   out = Σ p·(vs·v) / Σ p with p = exp((score − max)·scale). */
#include <string.h>
static inline int nc_i8_qcorr(const signed char* q, ptrdiff_t dq) {
    int s = 0;
    for (ptrdiff_t i = 0; i < dq; i++) s += q[i];
    return 128 * s;
}
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#include <immintrin.h>
#define NC_I8_VNNI 1
/* scores of 16 consecutive slots from j (lanes outside mask m untouched) for GB ≤ 8 heads */
static inline __attribute__((always_inline)) void nc_i8_scores16(
        const signed char* q, ptrdiff_t q_stride, const float* qs, const int* qcorr, const int GB,
        const unsigned char* kq, ptrdiff_t k_stride, const float* ks, ptrdiff_t nq4,
        ptrdiff_t j, __mmask16 m, float* scores, ptrdiff_t score_stride) {
    __m512i acc[8];
    int g;
    for (g = 0; g < GB; g++) acc[g] = _mm512_setzero_si512();
    for (ptrdiff_t i4 = 0; i4 < nq4; i4++) {
        const __m512i kv = _mm512_maskz_loadu_epi32(m, kq + (i4 * k_stride + j) * 4);
        for (g = 0; g < GB; g++) {
            int w;
            memcpy(&w, q + g * q_stride + 4 * i4, 4);
            acc[g] = _mm512_dpbusd_epi32(acc[g], kv, _mm512_set1_epi32(w));
        }
    }
    const __m512 sk = _mm512_maskz_loadu_ps(m, ks + j);
    for (g = 0; g < GB; g++) {
        __m512 s = _mm512_cvtepi32_ps(_mm512_sub_epi32(acc[g], _mm512_set1_epi32(qcorr[g])));
        s = _mm512_mul_ps(s, _mm512_mul_ps(_mm512_set1_ps(qs[g]), sk));
        _mm512_mask_storeu_ps(scores + g * score_stride + j, m, s);
    }
}
static inline __attribute__((always_inline)) void nc_i8_scores_block(
        const signed char* q, ptrdiff_t q_stride, const float* qs, const int* qcorr, const int GB,
        const unsigned char* kq, ptrdiff_t k_stride, const float* ks, ptrdiff_t nq4,
        ptrdiff_t a, ptrdiff_t b, float* scores, ptrdiff_t score_stride) {
    ptrdiff_t j = a;
    for (; j + 16 <= b; j += 16)
        nc_i8_scores16(q, q_stride, qs, qcorr, GB, kq, k_stride, ks, nq4, j, (__mmask16)0xFFFF,
                       scores, score_stride);
    if (j < b)
        nc_i8_scores16(q, q_stride, qs, qcorr, GB, kq, k_stride, ks, nq4, j,
                       (__mmask16)((1u << (b - j)) - 1u), scores, score_stride);
}
#elif defined(__AVX2__) && defined(__FMA__)
#define NC_I8_AVX2 1
/* Without VNNI the quad bytes of 4 slots are widened to int16, multiplied by
   (q0, q1, q2, q3) and pair-summed into int32 (exact: no saturating byte product),
   two partial sums per slot folded at the end.  The heads of a KV head share its
   keys (GQA), so up to NC_I8_AVX2_HEADS of them run against each widened key vector:
   the widening is paid once per key bytes, not once per head, and each head's query
   quads are made once per call (nc_i8_qquads), not once per 8 slots. */
#define NC_I8_AVX2_HEADS 6      /* 2·6 int32 accumulators + 2 widened keys: 14 of 16 ymm */
#define NC_I8_AVX2_QUADS 192    /* query quads held for a block of heads (heads of up to 768
                                   dimensions; wider ones take the portable loop) */
/* head g's quad i4 as four int16 words, repeated: the multiplier of vpmaddwd */
static inline void nc_i8_qquads(const signed char* q, ptrdiff_t nq4, __m256i* out) {
    for (ptrdiff_t i4 = 0; i4 < nq4; i4++)
        out[i4] = _mm256_set1_epi64x((long long)(
            ((unsigned long long)(unsigned short)q[4 * i4]) |
            ((unsigned long long)(unsigned short)q[4 * i4 + 1] << 16) |
            ((unsigned long long)(unsigned short)q[4 * i4 + 2] << 32) |
            ((unsigned long long)(unsigned short)q[4 * i4 + 3] << 48)));
}
/* scores of the 8 slots j … j + 7 for GB heads (their quads qq[g·nq4 + i4]) */
static inline __attribute__((always_inline)) void nc_i8_scores8_avx2(
        const __m256i* qq, const float* qs, const int* qcorr, const int GB,
        const unsigned char* kq, ptrdiff_t k_stride, const float* ks, ptrdiff_t nq4,
        ptrdiff_t j, float* scores, ptrdiff_t score_stride) {
    __m256i lo[NC_I8_AVX2_HEADS], hi[NC_I8_AVX2_HEADS];
    int g;
    for (g = 0; g < GB; g++) lo[g] = hi[g] = _mm256_setzero_si256();
    for (ptrdiff_t i4 = 0; i4 < nq4; i4++) {
        const __m256i kv = _mm256_loadu_si256((const __m256i*)(kq + (i4 * k_stride + j) * 4));
        const __m256i k0 = _mm256_cvtepu8_epi16(_mm256_castsi256_si128(kv));
        const __m256i k1 = _mm256_cvtepu8_epi16(_mm256_extracti128_si256(kv, 1));
        for (g = 0; g < GB; g++) {
            lo[g] = _mm256_add_epi32(lo[g], _mm256_madd_epi16(k0, qq[g * nq4 + i4]));
            hi[g] = _mm256_add_epi32(hi[g], _mm256_madd_epi16(k1, qq[g * nq4 + i4]));
        }
    }
    const __m256 sk = _mm256_loadu_ps(ks + j);
    for (g = 0; g < GB; g++) {
        const __m256i sum = _mm256_permute4x64_epi64(_mm256_hadd_epi32(lo[g], hi[g]), 0xD8);   /* slots in order */
        __m256 sf = _mm256_cvtepi32_ps(_mm256_sub_epi32(sum, _mm256_set1_epi32(qcorr[g])));
        sf = _mm256_mul_ps(sf, _mm256_mul_ps(_mm256_set1_ps(qs[g]), sk));
        _mm256_storeu_ps(scores + g * score_stride + j, sf);
    }
}
/* the 8-slot blocks of [a, b) for GB heads; returns where they end.  A last partial
   block runs whole when the key rows and the score rows hold 8 slots from its start:
   the slots past b get their own exact scores (the same bits any range holding them
   computes) or are read by no range. */
static inline __attribute__((always_inline)) ptrdiff_t nc_i8_scores_avx2_heads(
        const __m256i* qq, const float* qs, const int* qcorr, const int GB,
        const unsigned char* kq, ptrdiff_t k_stride, const float* ks, ptrdiff_t nq4,
        ptrdiff_t a, ptrdiff_t b, float* scores, ptrdiff_t score_stride) {
    ptrdiff_t j = a;
    for (; j + 8 <= b; j += 8)
        nc_i8_scores8_avx2(qq, qs, qcorr, GB, kq, k_stride, ks, nq4, j, scores, score_stride);
    if (j < b && j + 8 <= k_stride && j + 8 <= score_stride) {
        nc_i8_scores8_avx2(qq, qs, qcorr, GB, kq, k_stride, ks, nq4, j, scores, score_stride);
        j = b;
    }
    return j;
}
/* Ask for the key bytes of slots [a, b) up front: each quad of dimensions is its own
   row of the cache (k_stride slots apart), and the loop over 8-slot blocks would
   otherwise meet their lines' misses one block at a time. */
#define NC_I8_PREFETCH_SLOTS 512
static inline void nc_i8_prefetch_keys(const unsigned char* kq, ptrdiff_t k_stride, ptrdiff_t nq4,
                                       ptrdiff_t a, ptrdiff_t b) {
    if (b - a > NC_I8_PREFETCH_SLOTS) return;      /* long ranges: the streams' own prefetch */
    for (ptrdiff_t i4 = 0; i4 < nq4; i4++)
        for (ptrdiff_t o = (a * 4) & ~(ptrdiff_t)63; o < b * 4; o += 64)
            _mm_prefetch((const char*)(kq + i4 * k_stride * 4 + o), _MM_HINT_T0);
}
#endif
#if defined(__aarch64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(NC_OPS_NO_NEON)
/* aarch64 cores with the dot product extension (asimddp: Cortex-A76 in the Pi 5,
   not the Pi 3/4's A53/A72), detected at run time: the build stays -march=armv8-a
   and this kernel has a function target attribute, as the CQ kernels do.  sdot
   multiplies signed bytes, so each key code goes back from offset binary to the
   A8 code (kk ^ 0x80 = kk − 128) and the exact int32 sum Σ q·k needs no
   correction term: the same integer as Σ q·(k + 128) − 128·Σ q, so the same bits. */
#include <arm_neon.h>
#include <sys/auxv.h>
#ifndef HWCAP_ASIMDDP
#define HWCAP_ASIMDDP (1 << 20)
#endif
#define NC_I8_NEON 1
static int nc_i8_dot_enabled = 0;     /* set once at import (nc_i8_detect), or by tests */
static inline void nc_i8_detect(void) { nc_i8_dot_enabled = (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) != 0; }
static inline int nc_i8_dot_available(void) { return (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) != 0; }
/* scores of the 16 slots j … j + 15 for one head */
static __attribute__((target("arch=armv8.2-a+dotprod"))) void nc_i8_scores16_dot(
        const signed char* q, float qs, const unsigned char* kq, ptrdiff_t k_stride,
        const float* ks, ptrdiff_t nq4, ptrdiff_t j, float* scores) {
    int32x4_t acc[4];
    const uint8x16_t flip = vdupq_n_u8(0x80);
    for (int m = 0; m < 4; m++) acc[m] = vdupq_n_s32(0);
    for (ptrdiff_t i4 = 0; i4 < nq4; i4++) {
        int32_t quad;
        memcpy(&quad, q + 4 * i4, 4);
        const int8x16_t qv = vreinterpretq_s8_s32(vdupq_n_s32(quad));   /* 4 dims, 4 times */
        const unsigned char* base = kq + (i4 * k_stride + j) * 4;        /* 4 dims of 16 slots */
        for (int m = 0; m < 4; m++)
            acc[m] = vdotq_s32(acc[m], vreinterpretq_s8_u8(veorq_u8(vld1q_u8(base + 16 * m), flip)), qv);
    }
    int32_t sums[16];
    for (int m = 0; m < 4; m++) vst1q_s32(sums + 4 * m, acc[m]);
    for (int l = 0; l < 16; l++) scores[j + l] = (float)sums[l] * (qs * ks[j + l]);
}
#else
static int nc_i8_dot_enabled = 0;
static inline void nc_i8_detect(void) {}
static inline int nc_i8_dot_available(void) { return 0; }
#endif
/* which scores kernel runs: 2 VNNI, 3 AVX2, 4 NEON dot product, 0 portable */
static inline int nc_i8_kernel(void) {
#if defined(NC_I8_VNNI)
    return 2;
#elif defined(NC_I8_AVX2)
    return 3;
#else
    return nc_i8_dot_enabled ? 4 : 0;
#endif
}
static inline int nc_i8_set_dot(int on) {
    int was = nc_i8_dot_enabled;
    nc_i8_dot_enabled = on && nc_i8_dot_available();
    return was;
}
/* scores of slots [a, b) for G heads */
static inline void nc_i8_scores(const signed char* q, ptrdiff_t q_stride, const float* qs,
                                const int* qcorr, ptrdiff_t G, const unsigned char* kq,
                                ptrdiff_t k_stride, const float* ks, ptrdiff_t nq4,
                                ptrdiff_t a, ptrdiff_t b, float* scores, ptrdiff_t score_stride) {
    ptrdiff_t g0 = 0;
#ifdef NC_I8_VNNI
    for (; g0 < G; g0 += 8) {
        const signed char* qg = q + g0 * q_stride;
        float* sg = scores + g0 * score_stride;
        switch (G - g0 < 8 ? G - g0 : 8) {
#define NC_I8S(GG) case GG: nc_i8_scores_block(qg, q_stride, qs + g0, qcorr + g0, GG, kq, k_stride, \
                                               ks, nq4, a, b, sg, score_stride); break;
            NC_I8S(1) NC_I8S(2) NC_I8S(3) NC_I8S(4) NC_I8S(5) NC_I8S(6) NC_I8S(7) NC_I8S(8)
#undef NC_I8S
        }
    }
#else
#ifdef NC_I8_AVX2
    /* heads a block: as many as the held quads allow (6 up to 128 dimensions) */
    const int hb = nq4 <= NC_I8_AVX2_QUADS / NC_I8_AVX2_HEADS ? NC_I8_AVX2_HEADS : (int)(NC_I8_AVX2_QUADS / nq4);
    ptrdiff_t done[NC_I8_AVX2_HEADS];
    __m256i qq[NC_I8_AVX2_QUADS];
    nc_i8_prefetch_keys(kq, k_stride, nq4, a, b);
#endif
    for (; g0 < G; g0++) {
        const signed char* qg = q + g0 * q_stride;
        ptrdiff_t j = a;
#ifdef NC_I8_AVX2
        if (hb > 0) {
            /* the block of heads g0 … g0 + gb − 1 runs when g0 is its first head */
            const int k = (int)(g0 % hb);
            if (k == 0) {
                const int gb = (int)(G - g0 < hb ? G - g0 : hb);
                for (int h = 0; h < gb; h++) nc_i8_qquads(qg + h * q_stride, nq4, qq + h * nq4);
                ptrdiff_t end = a;
                switch (gb) {
#define NC_I8S2(GG) case GG: end = nc_i8_scores_avx2_heads(qq, qs + g0, qcorr + g0, GG, kq, k_stride, ks, \
                                                           nq4, a, b, scores + g0 * score_stride, score_stride); break;
                    NC_I8S2(1) NC_I8S2(2) NC_I8S2(3) NC_I8S2(4) NC_I8S2(5) NC_I8S2(6)
#undef NC_I8S2
                }
                for (int h = 0; h < gb; h++) done[h] = end;
            }
            j = done[k];
        }
#endif
#ifdef NC_I8_NEON
        if (nc_i8_dot_enabled)
            for (; j + 16 <= b; j += 16)
                nc_i8_scores16_dot(qg, qs[g0], kq, k_stride, ks, nq4, j, scores + g0 * score_stride);
#endif
        for (; j < b; j++) {
            int acc = 0;
            for (ptrdiff_t i4 = 0; i4 < nq4; i4++) {
                const unsigned char* kk = kq + (i4 * k_stride + j) * 4;
                const signed char* qq = qg + 4 * i4;
                acc += (int)kk[0] * qq[0] + (int)kk[1] * qq[1] + (int)kk[2] * qq[2] + (int)kk[3] * qq[3];
            }
            scores[g0 * score_stride + j] = (float)(acc - qcorr[g0]) * (qs[g0] * ks[j]);
        }
    }
#endif
}
#ifdef NC_I8_VNNI
/* out[g] = inv[g] · Σ_j p_g(j)·vs(j)·v(j) over the ranges for GB heads, dv = 16·NV,
   the GB·NV accumulators (≤ 24) in registers: each value row is converted once
   for all GB heads. */
static inline __attribute__((always_inline)) void nc_i8_pv_block(
        float* scores, ptrdiff_t score_stride, const int GB, const int NV,
        const signed char* vc, const float* vs, ptrdiff_t dv,
        const ptrdiff_t* ranges, int n_ranges, const float* inv, float* out, ptrdiff_t out_stride) {
    __m512 acc[8][4];
    int g, v, r;
    /* the weights p(j)·vs(j) first, in place, 16 slots a vector: the loop below then
       broadcasts each from memory (a load) instead of a multiply and a shuffle on the
       vector ports per head and slot, 6 of its 44 instructions a slot each (the same
       products, so the same bits) */
    for (g = 0; g < GB; g++) {
        float* sg = scores + g * score_stride;
        for (r = 0; r < n_ranges; r++) {
            ptrdiff_t j = ranges[2 * r];
            const ptrdiff_t j1 = ranges[2 * r + 1];
            for (; j + 16 <= j1; j += 16)
                _mm512_storeu_ps(sg + j, _mm512_mul_ps(_mm512_loadu_ps(sg + j), _mm512_loadu_ps(vs + j)));
            if (j < j1) {
                const __mmask16 m = (__mmask16)((1u << (j1 - j)) - 1u);
                _mm512_mask_storeu_ps(sg + j, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, sg + j),
                                                               _mm512_maskz_loadu_ps(m, vs + j)));
            }
        }
    }
    for (g = 0; g < GB; g++)
        for (v = 0; v < NV; v++) acc[g][v] = _mm512_setzero_ps();
    for (r = 0; r < n_ranges; r++) {
        for (ptrdiff_t j = ranges[2 * r]; j < ranges[2 * r + 1]; j++) {
            __m512 x[4];
            for (v = 0; v < NV; v++)
                x[v] = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
                    _mm_loadu_si128((const __m128i*)(vc + j * dv + 16 * v))));
            for (g = 0; g < GB; g++) {
                const __m512 w = _mm512_set1_ps(scores[g * score_stride + j]);
                for (v = 0; v < NV; v++) acc[g][v] = _mm512_fmadd_ps(w, x[v], acc[g][v]);
            }
        }
    }
    for (g = 0; g < GB; g++)
        for (v = 0; v < NV; v++)
            _mm512_storeu_ps(out + g * out_stride + 16 * v, _mm512_mul_ps(acc[g][v], _mm512_set1_ps(inv[g])));
}
#elif defined(NC_I8_AVX2)
/* out[g] = inv[g] · Σ_j p_g(j)·vs(j)·v(j) for GB ≤ NC_I8_AVX2_HEADS heads over dimensions
   [8·v0, 8·v0 + 8·NV) (NV ≤ 2): each value vector is converted once for all GB heads.
   The weights p·vs are already in the scores (nc_i8_pv). */
static inline __attribute__((always_inline)) void nc_i8_pv_avx2(
        const float* scores, ptrdiff_t score_stride, const int GB, const int NV, ptrdiff_t v0,
        const signed char* vc, ptrdiff_t dv, const ptrdiff_t* ranges, int n_ranges,
        const float* inv, float* out, ptrdiff_t out_stride) {
    __m256 acc[NC_I8_AVX2_HEADS][2];
    int g, v, r;
    for (g = 0; g < GB; g++)
        for (v = 0; v < NV; v++) acc[g][v] = _mm256_setzero_ps();
    for (r = 0; r < n_ranges; r++) {
        for (ptrdiff_t j = ranges[2 * r]; j < ranges[2 * r + 1]; j++) {
            __m256 x[2];
            for (v = 0; v < NV; v++)
                x[v] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(
                    _mm_loadl_epi64((const __m128i*)(vc + j * dv + 8 * (v0 + v)))));
            for (g = 0; g < GB; g++) {
                const __m256 w = _mm256_broadcast_ss(scores + g * score_stride + j);
                for (v = 0; v < NV; v++) acc[g][v] = _mm256_fmadd_ps(w, x[v], acc[g][v]);
            }
        }
    }
    for (g = 0; g < GB; g++)
        for (v = 0; v < NV; v++)
            _mm256_storeu_ps(out + g * out_stride + 8 * (v0 + v), _mm256_mul_ps(acc[g][v], _mm256_set1_ps(inv[g])));
}
#endif
static inline void nc_i8_pv(float* scores, ptrdiff_t score_stride, ptrdiff_t G,
                            const signed char* vc, const float* vs, ptrdiff_t dv,
                            const ptrdiff_t* ranges, int n_ranges, const float* inv,
                            float* out, ptrdiff_t out_stride) {
    ptrdiff_t g0 = 0;
#ifdef NC_I8_VNNI
    if (dv % 16 == 0 && dv <= 64) {
        const int nv = (int)(dv / 16), gb = nv == 4 ? 6 : 8;
        for (; g0 < G; g0 += gb) {
            const int n = (int)(G - g0 < gb ? G - g0 : gb);
            float* sg = scores + g0 * score_stride;
            float* og = out + g0 * out_stride;
            switch (nv * 16 + n) {
#define NC_I8PV(NN, GG) case NN * 16 + GG: nc_i8_pv_block(sg, score_stride, GG, NN, vc, vs, dv, ranges, \
                                                          n_ranges, inv + g0, og, out_stride); break;
#define NC_I8PV6(NN) NC_I8PV(NN, 1) NC_I8PV(NN, 2) NC_I8PV(NN, 3) NC_I8PV(NN, 4) NC_I8PV(NN, 5) NC_I8PV(NN, 6)
                NC_I8PV6(1) NC_I8PV(1, 7) NC_I8PV(1, 8)
                NC_I8PV6(2) NC_I8PV(2, 7) NC_I8PV(2, 8)
                NC_I8PV6(3) NC_I8PV(3, 7) NC_I8PV(3, 8)
                NC_I8PV6(4)
#undef NC_I8PV6
#undef NC_I8PV
            }
        }
        return;
    }
#elif defined(NC_I8_AVX2)
    if (dv % 8 == 0) {
        /* the weights p(j)·vs(j) in place first (the same products as the loop below
           would make per head and slot, so the same bits) */
        for (g0 = 0; g0 < G; g0++) {
            float* sg = scores + g0 * score_stride;
            for (int r = 0; r < n_ranges; r++) {
                ptrdiff_t j = ranges[2 * r];
                const ptrdiff_t j1 = ranges[2 * r + 1];
                for (; j + 8 <= j1; j += 8)
                    _mm256_storeu_ps(sg + j, _mm256_mul_ps(_mm256_loadu_ps(sg + j), _mm256_loadu_ps(vs + j)));
                for (; j < j1; j++) sg[j] = sg[j] * vs[j];
            }
        }
        for (g0 = 0; g0 < G; g0 += NC_I8_AVX2_HEADS) {
            const int gb = (int)(G - g0 < NC_I8_AVX2_HEADS ? G - g0 : NC_I8_AVX2_HEADS);
            const float* sg = scores + g0 * score_stride;
            float* og = out + g0 * out_stride;
            for (ptrdiff_t v0 = 0; v0 < dv / 8; v0 += 2) {
                const int nv = dv / 8 - v0 < 2 ? 1 : 2;
                switch (gb * 2 + nv - 1) {
#define NC_I8PV2(GG, NN) case GG * 2 + NN - 1: nc_i8_pv_avx2(sg, score_stride, GG, NN, v0, vc, dv, ranges, \
                                                             n_ranges, inv + g0, og, out_stride); break;
                    NC_I8PV2(1, 1) NC_I8PV2(1, 2) NC_I8PV2(2, 1) NC_I8PV2(2, 2) NC_I8PV2(3, 1) NC_I8PV2(3, 2)
                    NC_I8PV2(4, 1) NC_I8PV2(4, 2) NC_I8PV2(5, 1) NC_I8PV2(5, 2) NC_I8PV2(6, 1) NC_I8PV2(6, 2)
#undef NC_I8PV2
                }
            }
        }
        return;
    }
#endif
    for (; g0 < G; g0++) {
        float* o = out + g0 * out_stride;
        const float* sc = scores + g0 * score_stride;
        for (ptrdiff_t i = 0; i < dv; i++) o[i] = 0.f;
        for (int r = 0; r < n_ranges; r++) {
            for (ptrdiff_t j = ranges[2 * r]; j < ranges[2 * r + 1]; j++) {
                const float w = sc[j] * vs[j];
                const signed char* vj = vc + j * dv;
                for (ptrdiff_t i = 0; i < dv; i++) o[i] += w * (float)vj[i];
            }
        }
        for (ptrdiff_t i = 0; i < dv; i++) o[i] *= inv[g0];
    }
}

#endif  /* NEEDLE_CY_OPS_KV_INT8_H */
