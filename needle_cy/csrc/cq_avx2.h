/* The float CQ kernels for AVX2 + FMA (kernel "avx2"): matvec rows, the matmul's
   decoded rows and token tiles, and the gather into the lane order.

   Compiled with a target attribute (NC_CQ_TARGET, cpu_features.h) so that a portable
   build has them too; _cq runs them only where nc_cq_use_simd() says so
   (cq_dispatch.h).  Without x86 the same names are empty stubs that are never called.
   The Walsh–Hadamard transform they rotate their input with is in wht.h. */
#ifndef NEEDLE_CY_CQ_AVX2_H
#define NEEDLE_CY_CQ_AVX2_H

#include "cpu_features.h"

#if defined(NC_CQ_X86)
/* Eight 32-bit lanes of packed fields.  Never reads at or past `end`. */
NC_CQ_INLINE __m256i nc_cq_load_chunk(const uint8_t* p, const uint8_t* end, const int fb) {
    __m256i v;
    if (end - p >= 32) {
        v = _mm256_loadu_si256((const __m256i*)p);
    } else {
        uint8_t buf[32];
        memset(buf, 0, sizeof buf);
        memcpy(buf, p, (size_t)(end - p));
        v = _mm256_loadu_si256((const __m256i*)buf);
    }
    if (fb == 3) {
        /* 24 bytes = 8 runs of 3 bytes (8 fields each): run l → lane l. */
        v = _mm256_permutevar8x32_epi32(v, _mm256_setr_epi32(0, 1, 2, 2, 3, 4, 5, 5));
        v = _mm256_shuffle_epi8(v, _mm256_setr_epi8(
            0, 1, 2, -1, 3, 4, 5, -1, 6, 7, 8, -1, 9, 10, 11, -1,
            0, 1, 2, -1, 3, 4, 5, -1, 6, 7, 8, -1, 9, 10, 11, -1));
    }
    return v;
}

/* Codewords of the low field of every lane. */
NC_CQ_INLINE __m256 nc_cq_decode(__m256i v, __m256 tlo, __m256 thi, const int fb) {
    /* ≤ 2 bits: the in-lane vpermilps (reads index bits 0–1) is cheaper than vpermps */
    if (fb <= 2) return _mm256_permutevar_ps(tlo, v);
    __m256 lo = _mm256_permutevar8x32_ps(tlo, v);
    if (fb == 4) {
        __m256 hi = _mm256_permutevar8x32_ps(thi, v);
        return _mm256_blendv_ps(lo, hi, _mm256_castsi256_ps(_mm256_slli_epi32(v, 28)));
    }
    return lo;
}

/* 4 bits: codewords of 32 indices held one per byte (idx), by byte-plane lookups.
   T[b] holds byte b of the 16 float32 codewords (in both 128-bit halves); four
   vpshufb give the four bytes of each codeword and two rounds of unpacks
   reassemble them.  out[q] lane l (l < 4) is index byte 4q + l, lane l ≥ 4 is
   index byte 16 + 4q + (l − 4). */
NC_CQ_INLINE void nc_cq_decode4_bytes(__m256i idx, const __m256i T[4], __m256 out[4]) {
    const __m256i b0 = _mm256_shuffle_epi8(T[0], idx), b1 = _mm256_shuffle_epi8(T[1], idx);
    const __m256i b2 = _mm256_shuffle_epi8(T[2], idx), b3 = _mm256_shuffle_epi8(T[3], idx);
    const __m256i p01l = _mm256_unpacklo_epi8(b0, b1), p01h = _mm256_unpackhi_epi8(b0, b1);
    const __m256i p23l = _mm256_unpacklo_epi8(b2, b3), p23h = _mm256_unpackhi_epi8(b2, b3);
    out[0] = _mm256_castsi256_ps(_mm256_unpacklo_epi16(p01l, p23l));
    out[1] = _mm256_castsi256_ps(_mm256_unpackhi_epi16(p01l, p23l));
    out[2] = _mm256_castsi256_ps(_mm256_unpacklo_epi16(p01h, p23h));
    out[3] = _mm256_castsi256_ps(_mm256_unpackhi_epi16(p01h, p23h));
}

NC_CQ_INLINE void nc_cq_byte_planes(const float* table, __m256i T[4]) {
    /* table + 16 holds the 64 plane bytes: plane b = bytes [16b, 16b + 16) */
    const uint8_t* planes = (const uint8_t*)(table + 16);
    for (int b = 0; b < 4; b++)
        T[b] = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i*)(planes + 16 * b)));
}

NC_CQ_INLINE float nc_cq_hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* Lane l of a chunk covers fields l·F ... l·F + F − 1, all inside group (l·F)/g of the chunk. */
NC_CQ_INLINE __m256i nc_cq_lane_groups(const int F, int g) {
    return _mm256_setr_epi32(0, F / g, 2 * F / g, 3 * F / g, 4 * F / g, 5 * F / g, 6 * F / g, 7 * F / g);
}

/* Group norm of each lane of chunk c (g is a power of two: g_shift = log2 g). */
NC_CQ_INLINE __m256 nc_cq_norm_lanes(const float* nrow, ptrdiff_t c, const int C, int g,
                                     int g_shift, __m256i lane_groups) {
    if (g >= C) return _mm256_broadcast_ss(nrow + ((c * C) >> g_shift));
    return _mm256_permutevar8x32_ps(_mm256_loadu_ps(nrow + ((c * C) >> g_shift)), lane_groups);
}

/* One row · one rotated activation (matvec). */
NC_CQ_INLINE float nc_cq_row_dot_fb(const uint8_t* row, const uint8_t* end, const float* nrow,
                                    const float* xp, ptrdiff_t n_chunks, int g,
                                    const float* table, const int fb) {
    const int F = (fb == 3) ? 8 : 32 / fb;
    const int C = 8 * F;
    const int CB = (fb == 3) ? 24 : 32;
    const __m256 tlo = _mm256_loadu_ps(table), thi = _mm256_loadu_ps(table + 8);
    const int g_shift = __builtin_ctz((unsigned)g);
    const __m256i lane_groups = nc_cq_lane_groups(F, g);
    __m256 total = _mm256_setzero_ps();
    if (fb == 4) {
        /* even fields (low nibbles) then odd fields (high nibbles), 32 of each */
        __m256i T[4];
        nc_cq_byte_planes(table, T);
        const __m256i low4 = _mm256_set1_epi8(0x0f);
        for (ptrdiff_t c = 0; c < n_chunks; c++) {
            const __m256i v = nc_cq_load_chunk(row + c * CB, end, fb);
            const float* xc = xp + c * C;
            __m256 d[4];
            nc_cq_decode4_bytes(_mm256_and_si256(v, low4), T, d);
            __m256 a0 = _mm256_mul_ps(d[0], _mm256_loadu_ps(xc));
            __m256 a1 = _mm256_mul_ps(d[1], _mm256_loadu_ps(xc + 8));
            __m256 a2 = _mm256_mul_ps(d[2], _mm256_loadu_ps(xc + 16));
            __m256 a3 = _mm256_mul_ps(d[3], _mm256_loadu_ps(xc + 24));
            nc_cq_decode4_bytes(_mm256_and_si256(_mm256_srli_epi16(v, 4), low4), T, d);
            a0 = _mm256_fmadd_ps(d[0], _mm256_loadu_ps(xc + 32), a0);
            a1 = _mm256_fmadd_ps(d[1], _mm256_loadu_ps(xc + 40), a1);
            a2 = _mm256_fmadd_ps(d[2], _mm256_loadu_ps(xc + 48), a2);
            a3 = _mm256_fmadd_ps(d[3], _mm256_loadu_ps(xc + 56), a3);
            __m256 nv = nc_cq_norm_lanes(nrow, c, C, g, g_shift, lane_groups);
            total = _mm256_fmadd_ps(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)),
                                    nv, total);
        }
        return nc_cq_hsum(total);
    }
    if (fb <= 2) {
        /* Byte-offset loads instead of some shifts: loading the chunk at byte offset k
           puts field (8/fb)·k of every lane into its low bits, so only the fields
           inside a byte need shifting (12 shifts per 16 steps instead of 15; shifts and
           vpermilps compete for the same two vector pipes).  The bytes a load takes from
           past the chunk only reach lane bits that are never shifted down. */
        const int J = 8 / fb;  /* fields per byte */
        for (ptrdiff_t c = 0; c < n_chunks; c++) {
            const uint8_t* p = row + c * CB;
            uint8_t buf[40];
            if (end - p < 35) {
                memset(buf, 0, sizeof buf);
                memcpy(buf, p, (size_t)(end - p < 32 ? end - p : 32));
                p = buf;
            }
            const float* xc = xp + c * C;
            __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
            __m256 a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
            for (int k = 0; k < 4; k++) {
                __m256i v = _mm256_loadu_si256((const __m256i*)(p + k));
                const float* xk = xc + 8 * J * k;
                for (int j = 0; j < J; j += 4) {
                    a0 = _mm256_fmadd_ps(nc_cq_decode(v, tlo, thi, fb), _mm256_loadu_ps(xk + 8 * j), a0);
                    v = _mm256_srli_epi32(v, fb);
                    a1 = _mm256_fmadd_ps(nc_cq_decode(v, tlo, thi, fb), _mm256_loadu_ps(xk + 8 * j + 8), a1);
                    v = _mm256_srli_epi32(v, fb);
                    a2 = _mm256_fmadd_ps(nc_cq_decode(v, tlo, thi, fb), _mm256_loadu_ps(xk + 8 * j + 16), a2);
                    v = _mm256_srli_epi32(v, fb);
                    a3 = _mm256_fmadd_ps(nc_cq_decode(v, tlo, thi, fb), _mm256_loadu_ps(xk + 8 * j + 24), a3);
                    v = _mm256_srli_epi32(v, fb);
                }
            }
            __m256 nv = nc_cq_norm_lanes(nrow, c, C, g, g_shift, lane_groups);
            total = _mm256_fmadd_ps(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)),
                                    nv, total);
        }
        return nc_cq_hsum(total);
    }
    for (ptrdiff_t c = 0; c < n_chunks; c++) {
        __m256i v = nc_cq_load_chunk(row + c * CB, end, fb);
        const float* xc = xp + c * C;
        /* four accumulators: the FMA latency chain would otherwise bound the loop */
        __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
        __m256 a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
        for (int s = 0; s < F; s += 4) {
            a0 = _mm256_fmadd_ps(nc_cq_decode(v, tlo, thi, fb), _mm256_loadu_ps(xc + 8 * s), a0);
            v = _mm256_srli_epi32(v, fb);
            a1 = _mm256_fmadd_ps(nc_cq_decode(v, tlo, thi, fb), _mm256_loadu_ps(xc + 8 * s + 8), a1);
            v = _mm256_srli_epi32(v, fb);
            a2 = _mm256_fmadd_ps(nc_cq_decode(v, tlo, thi, fb), _mm256_loadu_ps(xc + 8 * s + 16), a2);
            v = _mm256_srli_epi32(v, fb);
            a3 = _mm256_fmadd_ps(nc_cq_decode(v, tlo, thi, fb), _mm256_loadu_ps(xc + 8 * s + 24), a3);
            v = _mm256_srli_epi32(v, fb);
        }
        __m256 nv = nc_cq_norm_lanes(nrow, c, C, g, g_shift, lane_groups);
        total = _mm256_fmadd_ps(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)),
                                nv, total);
    }
    return nc_cq_hsum(total);
}

/* One row · NT rotated activations (matmul), ADDED to y[t·y_stride]: each step is
   decoded once and scaled by the lane norms, then used by NT independent
   accumulators.  The matmul's path for wide slices at 1–2 bits (see
   _matmul_rows_simd): there decoding is cheap, and reading the packed row
   beats streaming a decoded float32 copy through L1 next to the tokens. */
NC_CQ_INLINE void nc_cq_row_tokens_fb(const uint8_t* row, const uint8_t* end, const float* nrow,
                                      const float* xp, ptrdiff_t xp_stride, ptrdiff_t n_chunks,
                                      int g, const float* table, float* y, ptrdiff_t y_stride,
                                      const int fb, const int NT) {
    const int F = (fb == 3) ? 8 : 32 / fb;
    const int C = 8 * F;
    const int CB = (fb == 3) ? 24 : 32;
    const __m256 tlo = _mm256_loadu_ps(table), thi = _mm256_loadu_ps(table + 8);
    const int g_shift = __builtin_ctz((unsigned)g);
    const __m256i lane_groups = nc_cq_lane_groups(F, g);
    __m256 acc[8];
    for (int t = 0; t < NT; t++) acc[t] = _mm256_setzero_ps();
    if (fb == 4) {
        __m256i T[4];
        nc_cq_byte_planes(table, T);
        const __m256i low4 = _mm256_set1_epi8(0x0f);
        for (ptrdiff_t c = 0; c < n_chunks; c++) {
            const __m256i v = nc_cq_load_chunk(row + c * CB, end, fb);
            const __m256 nv = nc_cq_norm_lanes(nrow, c, C, g, g_shift, lane_groups);
            const float* xc = xp + c * C;
            __m256 w[8];
            nc_cq_decode4_bytes(_mm256_and_si256(v, low4), T, w);
            nc_cq_decode4_bytes(_mm256_and_si256(_mm256_srli_epi16(v, 4), low4), T, w + 4);
            for (int s = 0; s < 8; s++) {
                const __m256 ws = _mm256_mul_ps(w[s], nv);
                for (int t = 0; t < NT; t++)
                    acc[t] = _mm256_fmadd_ps(ws, _mm256_loadu_ps(xc + t * xp_stride + 8 * s), acc[t]);
            }
        }
        for (int t = 0; t < NT; t++) y[t * y_stride] += nc_cq_hsum(acc[t]);
        return;
    }
    for (ptrdiff_t c = 0; c < n_chunks; c++) {
        __m256i v = nc_cq_load_chunk(row + c * CB, end, fb);
        const __m256 nv = nc_cq_norm_lanes(nrow, c, C, g, g_shift, lane_groups);
        const float* xc = xp + c * C;
        if (g >= C) {
            /* one norm for the whole chunk: scale the register codebook once
               instead of every decoded step */
            const __m256 tl = _mm256_mul_ps(tlo, nv), th = _mm256_mul_ps(thi, nv);
            for (int s = 0; s < F; s++) {
                const __m256 w = nc_cq_decode(v, tl, th, fb);
                for (int t = 0; t < NT; t++)
                    acc[t] = _mm256_fmadd_ps(w, _mm256_loadu_ps(xc + t * xp_stride + 8 * s), acc[t]);
                v = _mm256_srli_epi32(v, fb);
            }
        } else {
            for (int s = 0; s < F; s++) {
                const __m256 w = _mm256_mul_ps(nc_cq_decode(v, tlo, thi, fb), nv);
                for (int t = 0; t < NT; t++)
                    acc[t] = _mm256_fmadd_ps(w, _mm256_loadu_ps(xc + t * xp_stride + 8 * s), acc[t]);
                v = _mm256_srli_epi32(v, fb);
            }
        }
    }
    for (int t = 0; t < NT; t++) y[t * y_stride] += nc_cq_hsum(acc[t]);
}

/* The matmul's weights, decoded: chunks c0 … c0 + nc − 1 of one row into float32
   in the lane order of the rotated activation (xp), every codeword times its
   group norm.  These are exactly the scaled steps the per-row loop of earlier
   versions multiplied with; decoding them once per row and block of up to
   64 tokens (instead of once per 8 tokens) takes the shuffles out of the
   token loop.  c is the absolute chunk index (norms and packed bytes are
   addressed from the row start), so a slice need not start at a group. */
NC_CQ_INLINE void nc_cq_decode_scaled_fb(const uint8_t* row, const uint8_t* end, const float* nrow,
                                         ptrdiff_t c0, ptrdiff_t nc, int g, const float* table,
                                         float* out, const int fb) {
    const int F = (fb == 3) ? 8 : 32 / fb;
    const int C = 8 * F;
    const int CB = (fb == 3) ? 24 : 32;
    const __m256 tlo = _mm256_loadu_ps(table), thi = _mm256_loadu_ps(table + 8);
    const int g_shift = __builtin_ctz((unsigned)g);
    const __m256i lane_groups = nc_cq_lane_groups(F, g);
    if (fb == 4) {
        __m256i T[4];
        nc_cq_byte_planes(table, T);
        const __m256i low4 = _mm256_set1_epi8(0x0f);
        for (ptrdiff_t c = c0; c < c0 + nc; c++) {
            const __m256i v = nc_cq_load_chunk(row + c * CB, end, fb);
            const __m256 nv = nc_cq_norm_lanes(nrow, c, C, g, g_shift, lane_groups);
            float* oc = out + (c - c0) * C;
            __m256 w[8];
            nc_cq_decode4_bytes(_mm256_and_si256(v, low4), T, w);
            nc_cq_decode4_bytes(_mm256_and_si256(_mm256_srli_epi16(v, 4), low4), T, w + 4);
            for (int s = 0; s < 8; s++) _mm256_storeu_ps(oc + 8 * s, _mm256_mul_ps(w[s], nv));
        }
        return;
    }
    for (ptrdiff_t c = c0; c < c0 + nc; c++) {
        __m256i v = nc_cq_load_chunk(row + c * CB, end, fb);
        const __m256 nv = nc_cq_norm_lanes(nrow, c, C, g, g_shift, lane_groups);
        float* oc = out + (c - c0) * C;
        if (g >= C) {
            /* one norm for the whole chunk: scale the register codebook once */
            const __m256 tl = _mm256_mul_ps(tlo, nv), th = _mm256_mul_ps(thi, nv);
            for (int s = 0; s < F; s++) {
                _mm256_storeu_ps(oc + 8 * s, nc_cq_decode(v, tl, th, fb));
                v = _mm256_srli_epi32(v, fb);
            }
        } else {
            for (int s = 0; s < F; s++) {
                _mm256_storeu_ps(oc + 8 * s, _mm256_mul_ps(nc_cq_decode(v, tlo, thi, fb), nv));
                v = _mm256_srli_epi32(v, fb);
            }
        }
    }
}

/* tile[t·ts] += Σ_k wd[k] · x[t·xs + k] for one decoded row and TT ≤ 8 tokens, k over
   n_vec steps of 8: one weight load feeds TT FMAs.  Each lane accumulates its
   products in the same order as the single-row loop of earlier versions, then
   one horizontal sum, so a matmul gives the same bits as before.  (1 row × 8
   tokens measured faster on an AVX2 core than 2×4, 2×6, 3×3 or 4×3 register
   tiles, close to the two-FMA-per-cycle peak.) */
NC_CQ_INLINE void nc_cq_dot_row(const float* wd, const float* x, ptrdiff_t xs, ptrdiff_t n_vec,
                                float* tile, ptrdiff_t ts, const int TT) {
    __m256 acc[8];
    for (int t = 0; t < TT; t++) acc[t] = _mm256_setzero_ps();
    for (ptrdiff_t k = 0; k < 8 * n_vec; k += 8) {
        const __m256 wv = _mm256_loadu_ps(wd + k);
        for (int t = 0; t < TT; t++)
            acc[t] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + t * xs + k), acc[t]);
    }
    for (int t = 0; t < TT; t++) tile[t * ts] += nc_cq_hsum(acc[t]);
}

NC_CQ_INLINE void nc_cq_dot_rows(const float* wd, ptrdiff_t ws, int nr, const float* x, ptrdiff_t xs,
                                 ptrdiff_t n_vec, float* tile, ptrdiff_t ts, const int TT) {
    for (int r = 0; r < nr; r++)
        nc_cq_dot_row(wd + r * ws, x, xs, n_vec, tile + r, ts, TT);
}

/* tile[t·ts + r] += decoded row r · token t for nr rows (row stride ws) and nt tokens
   (row stride xs), eight tokens at a time: their slice of x stays in L1 while
   every decoded row passes over it. */
static NC_CQ_TARGET void nc_cq_dot_tiles(const float* wd, ptrdiff_t ws, int nr, const float* x,
                                         ptrdiff_t xs, int nt, ptrdiff_t n_vec, float* tile,
                                         ptrdiff_t ts) {
    int t = 0;
    for (; t + 8 <= nt; t += 8)
        nc_cq_dot_rows(wd, ws, nr, x + t * xs, xs, n_vec, tile + t * ts, ts, 8);
    switch (nt - t) {  /* the remaining tokens, as a compile-time count each */
    case 7: nc_cq_dot_rows(wd, ws, nr, x + t * xs, xs, n_vec, tile + t * ts, ts, 7); break;
    case 6: nc_cq_dot_rows(wd, ws, nr, x + t * xs, xs, n_vec, tile + t * ts, ts, 6); break;
    case 5: nc_cq_dot_rows(wd, ws, nr, x + t * xs, xs, n_vec, tile + t * ts, ts, 5); break;
    case 4: nc_cq_dot_rows(wd, ws, nr, x + t * xs, xs, n_vec, tile + t * ts, ts, 4); break;
    case 3: nc_cq_dot_rows(wd, ws, nr, x + t * xs, xs, n_vec, tile + t * ts, ts, 3); break;
    case 2: nc_cq_dot_rows(wd, ws, nr, x + t * xs, xs, n_vec, tile + t * ts, ts, 2); break;
    case 1: nc_cq_dot_rows(wd, ws, nr, x + t * xs, xs, n_vec, tile + t * ts, ts, 1); break;
    default: break;
    }
}

#define NC_CQ_SPECIALISE(FB)                                                               \
static NC_CQ_TARGET void nc_cq_rows_dot_##FB(const uint8_t* packed, ptrdiff_t row_bytes,    \
        const uint8_t* end, const float* norms, ptrdiff_t norm_stride, const float* xp,    \
        ptrdiff_t n_chunks, int g, const float* table, ptrdiff_t r0, ptrdiff_t r1, float* y) { \
    for (ptrdiff_t r = r0; r < r1; r++)                                                    \
        y[r] = nc_cq_row_dot_fb(packed + r * row_bytes, end, norms + r * norm_stride,      \
                                xp, n_chunks, g, table, FB);                               \
}                                                                                          \
static NC_CQ_TARGET void nc_cq_decode_scaled_##FB(const uint8_t* row, const uint8_t* end,  \
        const float* nrow, ptrdiff_t c0, ptrdiff_t nc, int g, const float* table, float* out) { \
    nc_cq_decode_scaled_fb(row, end, nrow, c0, nc, g, table, out, FB);                     \
}                                                                                          \
static NC_CQ_TARGET void nc_cq_row_tokens_##FB(const uint8_t* row, const uint8_t* end,     \
        const float* nrow, const float* xp, ptrdiff_t xp_stride, ptrdiff_t n_chunks, int g, \
        const float* table, int nt, float* y, ptrdiff_t y_stride) {                        \
    for (; nt >= 8; nt -= 8, xp += 8 * xp_stride, y += 8 * y_stride)                      \
        nc_cq_row_tokens_fb(row, end, nrow, xp, xp_stride, n_chunks, g, table, y, y_stride, FB, 8); \
    if (nt >= 4) {                                                                         \
        nc_cq_row_tokens_fb(row, end, nrow, xp, xp_stride, n_chunks, g, table, y, y_stride, FB, 4); \
        nt -= 4; xp += 4 * xp_stride; y += 4 * y_stride;                                   \
    }                                                                                      \
    if (nt >= 2) {                                                                         \
        nc_cq_row_tokens_fb(row, end, nrow, xp, xp_stride, n_chunks, g, table, y, y_stride, FB, 2); \
        nt -= 2; xp += 2 * xp_stride; y += 2 * y_stride;                                   \
    }                                                                                      \
    if (nt) /* one accumulator, as every token of a block: the same sum whatever */        \
            /* the count (a thread's share of a chunk's tokens decides the count) */       \
        nc_cq_row_tokens_fb(row, end, nrow, xp, xp_stride, n_chunks, g, table, y, y_stride, FB, 1); \
}
NC_CQ_SPECIALISE(1)
NC_CQ_SPECIALISE(2)
NC_CQ_SPECIALISE(3)
NC_CQ_SPECIALISE(4)

/* y[r] for rows r0 ≤ r < r1 (one call per block of rows: the row loop is inlined) */
static void nc_cq_avx2_rows_dot(const uint8_t* packed, ptrdiff_t row_bytes, const uint8_t* end,
                                const float* norms, ptrdiff_t norm_stride, const float* xp,
                                ptrdiff_t n_chunks, int fb, int g, const float* table,
                                ptrdiff_t r0, ptrdiff_t r1, float* y) {
    switch (fb) {
    case 1: nc_cq_rows_dot_1(packed, row_bytes, end, norms, norm_stride, xp, n_chunks, g, table, r0, r1, y); break;
    case 2: nc_cq_rows_dot_2(packed, row_bytes, end, norms, norm_stride, xp, n_chunks, g, table, r0, r1, y); break;
    case 3: nc_cq_rows_dot_3(packed, row_bytes, end, norms, norm_stride, xp, n_chunks, g, table, r0, r1, y); break;
    default: nc_cq_rows_dot_4(packed, row_bytes, end, norms, norm_stride, xp, n_chunks, g, table, r0, r1, y); break;
    }
}

static void nc_cq_avx2_row_tokens(const uint8_t* row, const uint8_t* end, const float* nrow,
                                  const float* xp, ptrdiff_t xp_stride, ptrdiff_t n_chunks,
                                  int fb, int g, const float* table, int nt,
                                  float* y, ptrdiff_t y_stride) {
    switch (fb) {
    case 1: nc_cq_row_tokens_1(row, end, nrow, xp, xp_stride, n_chunks, g, table, nt, y, y_stride); break;
    case 2: nc_cq_row_tokens_2(row, end, nrow, xp, xp_stride, n_chunks, g, table, nt, y, y_stride); break;
    case 3: nc_cq_row_tokens_3(row, end, nrow, xp, xp_stride, n_chunks, g, table, nt, y, y_stride); break;
    default: nc_cq_row_tokens_4(row, end, nrow, xp, xp_stride, n_chunks, g, table, nt, y, y_stride); break;
    }
}
static void nc_cq_avx2_decode_scaled(const uint8_t* row, const uint8_t* end, const float* nrow,
                                     ptrdiff_t c0, ptrdiff_t nc, int fb, int g, const float* table,
                                     float* out) {
    switch (fb) {
    case 1: nc_cq_decode_scaled_1(row, end, nrow, c0, nc, g, table, out); break;
    case 2: nc_cq_decode_scaled_2(row, end, nrow, c0, nc, g, table, out); break;
    case 3: nc_cq_decode_scaled_3(row, end, nrow, c0, nc, g, table, out); break;
    default: nc_cq_decode_scaled_4(row, end, nrow, c0, nc, g, table, out); break;
    }
}

/* xp[c·C + k] = xt[c·C + perm[k]]: the rotated activation in lane order. */
static NC_CQ_TARGET void nc_cq_gather_chunks(const float* xt, float* xp, const int* perm,
                                             ptrdiff_t C, ptrdiff_t n_chunks) {
    for (ptrdiff_t c = 0; c < n_chunks; c++) {
        const float* src = xt + c * C;
        float* dst = xp + c * C;
        for (ptrdiff_t k = 0; k < C; k += 8)
            _mm256_storeu_ps(dst + k, _mm256_i32gather_ps(
                src, _mm256_loadu_si256((const __m256i*)(perm + k)), 4));
    }
}
#else
static void nc_cq_avx2_row_tokens(const uint8_t* row, const uint8_t* end, const float* nrow,
                                  const float* xp, ptrdiff_t xp_stride, ptrdiff_t n_chunks,
                                  int fb, int g, const float* table, int nt,
                                  float* y, ptrdiff_t y_stride) {}
static void nc_cq_avx2_decode_scaled(const uint8_t* row, const uint8_t* end, const float* nrow,
                                     ptrdiff_t c0, ptrdiff_t nc, int fb, int g, const float* table,
                                     float* out) {}
static void nc_cq_dot_tiles(const float* wd, ptrdiff_t ws, int nr, const float* x,
                            ptrdiff_t xs, int nt, ptrdiff_t n_vec, float* tile, ptrdiff_t ts) {}
static void nc_cq_avx2_rows_dot(const uint8_t* packed, ptrdiff_t row_bytes, const uint8_t* end,
                                const float* norms, ptrdiff_t norm_stride, const float* xp,
                                ptrdiff_t n_chunks, int fb, int g, const float* table,
                                ptrdiff_t r0, ptrdiff_t r1, float* y) {}
static void nc_cq_gather_chunks(const float* xt, float* xp, const int* perm,
                                ptrdiff_t C, ptrdiff_t n_chunks) {}
#endif

#endif  /* NEEDLE_CY_CQ_AVX2_H */
