/* Integer CQ matvec and matmul on A8 activations: one instantiation per instruction set.

   Included by cq_avx512.h once per x86 variant, with
     NC_INT_SUF   name suffix (avx512vnni, avx512bw)
     NC_INT_TGT   target attribute string
     NC_INT_DPW   acc += Σ pairs of int16 products (vpdpwssd, or vpmaddwd + vpaddd)
   (a NEON variant would be a third instantiation with its own load/permute/dot).

   What it computes, for rows r0 ≤ r < r1 (see the module docstring of _cq.pyx):
       y_r = scale · Σ_flush ν · (B · Σ hi[i_j]·z_j + Σ lo[i_j]·z_j)
   z: the rotated A8 codes (int16, exact), in the lane order below; hi/lo: the
   codebook as integers C_k = hi_k·B + lo_k (C_k = cb_k·2^E rounded, ≥ 25 bits),
   each half a 32-entry vpermw table repeated with period 2^fb so that index
   bits above the field do not matter.

   Lane order: a chunk is 32 packed bytes (256/fb fields), zero-extended to 32
   words; step s (0 ≤ s < 8/fb) shifts every word right by s·fb and looks up
   field s of each byte.  z[c·C + 32·s + w] is the code of field s of byte w of
   chunk c, so each step is one load of 32 codes and two dot instructions.
   Dword lane l of the accumulators sums bytes 2l, 2l+1 of every step: 16/fb
   consecutive fields, all in one group (g ≥ 16/fb).  The int32 sums are
   converted to float once per group (or per chunk where a chunk spans several
   groups, with a norm per lane); _cq.pyx sizes B and E so that they cannot
   overflow (|z| ≤ 127·g).  Four rows share every code load and table. */

/* Matvec prefetch distance in rows.  In the model every decode step streams all
   matrices (≈ 45 MB at 4 bits, more than the L3), and the hardware prefetcher
   alone leaves the kernel waiting on memory: prefetching the same chunk 8 rows
   on sped whole-model decode up markedly (4 and 16 rows gained a little less;
   benchmarks/history/cq.md).  The matmul reuses each row for several token tiles
   and gained nothing from it, nor did the AVX2 float matvec, which is bound by
   its shuffles. */
#ifndef NC_INT_PF_ROWS
#define NC_INT_PF_ROWS 8
#endif
/* Tokens per tile of the matmul (≤ 8: the lane sums of a tile are taken 8 at a time). */
#define NC_INT_MM_TOKENS 6
#define NC_INT_CAT2(a, b) a##_##b
#define NC_INT_CAT(a, b) NC_INT_CAT2(a, b)
#define NC_INT_FN(name) NC_INT_CAT(name, NC_INT_SUF)
#define NC_INT_AI static inline __attribute__((always_inline, target(NC_INT_TGT)))

/* 32 packed bytes zero-extended to words; never reads at or past `end`. */
NC_INT_AI __m512i NC_INT_FN(nc_cqi_load)(const uint8_t* p, const uint8_t* end) {
    const ptrdiff_t left = end - p;
    if (left >= 32) return _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i*)p));
    /* masked-off bytes are not read (no fault past the end of the mapping) */
    const __mmask32 m = left > 0 ? (__mmask32)((1u << left) - 1u) : 0;
    return _mm512_cvtepu8_epi16(_mm256_maskz_loadu_epi8(m, p));
}

/* Lane sums of up to 8 vectors at once (missing ones zero): out[k] = Σ lanes of v[k].
   Every sum takes the same tree, halves of 256 bits, then of 128, then
   (lane 0 + lane 2) + (lane 1 + lane 3), whichever of the matvec and the matmul
   asks, so the two agree bitwise (float addition is commutative, not associative). */
NC_INT_AI void NC_INT_FN(nc_cqi_hsum8)(const __m512 v[8], float out[8]) {
    __m512 p[4];
    for (int k = 0; k < 4; k++)  /* [lo+hi of v[2k] (8 lanes), lo+hi of v[2k+1]] */
        p[k] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * k], v[2 * k + 1], 0x44),
                             _mm512_shuffle_f32x4(v[2 * k], v[2 * k + 1], 0xEE));
    /* 128-bit block k: the 4-lane partial of v[k] (u) and of v[4 + k] (w) */
    const __m512 u = _mm512_add_ps(_mm512_shuffle_f32x4(p[0], p[1], 0x88), _mm512_shuffle_f32x4(p[0], p[1], 0xDD));
    const __m512 w = _mm512_add_ps(_mm512_shuffle_f32x4(p[2], p[3], 0x88), _mm512_shuffle_f32x4(p[2], p[3], 0xDD));
    __m512 x = _mm512_add_ps(_mm512_shuffle_ps(u, w, 0x44), _mm512_shuffle_ps(u, w, 0xEE));
    x = _mm512_add_ps(x, _mm512_shuffle_ps(x, x, 0xB1));   /* block k: lane 0 = Σ v[k], lane 2 = Σ v[4 + k] */
    float lanes[16];
    _mm512_storeu_ps(lanes, x);
    for (int k = 0; k < 4; k++) { out[k] = lanes[4 * k]; out[4 + k] = lanes[4 * k + 2]; }
}

NC_INT_AI void NC_INT_FN(nc_cqi_block)(const uint8_t* packed, ptrdiff_t row_bytes, const uint8_t* end,
                                       const float* norms, ptrdiff_t norm_stride, const int16_t* z,
                                       ptrdiff_t n_chunks, int g, __m512i th, __m512i tl,
                                       __m512i lane_groups, __m512 base, float scale, ptrdiff_t r,
                                       float* y, const int fb, const int R) {
    const int S = 8 / fb;
    const ptrdiff_t C = 256 / fb;
    const int g_shift = __builtin_ctz((unsigned)g);
    const ptrdiff_t per = g >= C ? g / C : 1;  /* chunks per conversion to float */
    __m512 total[4];
    for (int i = 0; i < R; i++) total[i] = _mm512_setzero_ps();
    for (ptrdiff_t c0 = 0; c0 < n_chunks; c0 += per) {
        __m512i ah[4], al[4];
        for (int i = 0; i < R; i++) { ah[i] = _mm512_setzero_si512(); al[i] = _mm512_setzero_si512(); }
        for (ptrdiff_t c = c0; c < c0 + per; c++) {
            __m512i v[4];
            for (int i = 0; i < R; i++) {
                const uint8_t* p = packed + (r + i) * row_bytes + c * 32;
                v[i] = NC_INT_FN(nc_cqi_load)(p, end);
                /* the same chunk NC_INT_PF_ROWS rows on: in the model the weights stream
                   from DRAM (all matrices together exceed the L3) */
                if (p + NC_INT_PF_ROWS * row_bytes < end) _mm_prefetch((const char*)(p + NC_INT_PF_ROWS * row_bytes), _MM_HINT_T0);
            }
            const int16_t* zc = z + c * C;
            for (int s = 0; s < S; s++) {
                const __m512i zs = _mm512_loadu_si512((const void*)(zc + 32 * s));
                for (int i = 0; i < R; i++) {
                    ah[i] = NC_INT_DPW(ah[i], _mm512_permutexvar_epi16(v[i], th), zs);
                    al[i] = NC_INT_DPW(al[i], _mm512_permutexvar_epi16(v[i], tl), zs);
                    v[i] = _mm512_srli_epi16(v[i], fb);
                }
            }
        }
        for (int i = 0; i < R; i++) {
            const float* nrow = norms + (r + i) * norm_stride + ((c0 * C) >> g_shift);
            const __m512 nv = g >= C ? _mm512_set1_ps(nrow[0])
                                     : _mm512_permutexvar_ps(lane_groups, _mm512_loadu_ps(nrow));
            const __m512 sum = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ah[i]), base, _mm512_cvtepi32_ps(al[i]));
            total[i] = _mm512_fmadd_ps(sum, nv, total[i]);
        }
    }
    __m512 sums[8];
    float dot[8];
    for (int k = 0; k < 8; k++) sums[k] = k < R ? total[k] : _mm512_setzero_ps();
    NC_INT_FN(nc_cqi_hsum8)(sums, dot);
    for (int i = 0; i < R; i++) y[r + i] = dot[i] * scale;
}

NC_INT_AI void NC_INT_FN(nc_cqi_rows_fb)(const uint8_t* packed, ptrdiff_t row_bytes, const uint8_t* end,
                                         const float* norms, ptrdiff_t norm_stride, const int16_t* z,
                                         ptrdiff_t n_chunks, int g, const int16_t* table, float base,
                                         float scale, ptrdiff_t r0, ptrdiff_t r1, float* y, const int fb) {
    const __m512i th = _mm512_loadu_si512((const void*)table);
    const __m512i tl = _mm512_loadu_si512((const void*)(table + 32));
    int lg[16];
    for (int l = 0; l < 16; l++) lg[l] = (16 * l / fb) / g;  /* lane l starts at field 16·l/fb */
    const __m512i lane_groups = _mm512_loadu_si512((const void*)lg);
    const __m512 b = _mm512_set1_ps(base);
    ptrdiff_t r = r0;
    for (; r + 4 <= r1; r += 4)
        NC_INT_FN(nc_cqi_block)(packed, row_bytes, end, norms, norm_stride, z, n_chunks, g, th, tl,
                                lane_groups, b, scale, r, y, fb, 4);
    for (; r < r1; r++)
        NC_INT_FN(nc_cqi_block)(packed, row_bytes, end, norms, norm_stride, z, n_chunks, g, th, tl,
                                lane_groups, b, scale, r, y, fb, 1);
}

static __attribute__((target(NC_INT_TGT))) void NC_INT_FN(nc_cqi_rows)(
        const uint8_t* packed, ptrdiff_t row_bytes, const uint8_t* end, const float* norms,
        ptrdiff_t norm_stride, const int16_t* z, ptrdiff_t n_chunks, int fb, int g,
        const int16_t* table, float base, float scale, ptrdiff_t r0, ptrdiff_t r1, float* y) {
    switch (fb) {
    case 1: NC_INT_FN(nc_cqi_rows_fb)(packed, row_bytes, end, norms, norm_stride, z, n_chunks, g, table, base, scale, r0, r1, y, 1); break;
    case 2: NC_INT_FN(nc_cqi_rows_fb)(packed, row_bytes, end, norms, norm_stride, z, n_chunks, g, table, base, scale, r0, r1, y, 2); break;
    default: NC_INT_FN(nc_cqi_rows_fb)(packed, row_bytes, end, norms, norm_stride, z, n_chunks, g, table, base, scale, r0, r1, y, 4); break;
    }
}

/* ---- the A8 codes of one token (what cq_rotate needs before the FWHT) ----
   k_j = rint(x_j / s), s = max|x|/127 (1 for a zero vector), accepted when every
   |k_j| ≤ 127 and |x_j − k_j·s| ≤ max|x|·2⁻²⁰ (a NaN or an infinity fails the
   comparisons).  kf[0:n] = k as floats; returns 0 (x is not an A8 vector) or 1. */
NC_INT_AI int NC_INT_FN(nc_cqi_a8_codes_inl)(const float* x, ptrdiff_t n, float* kf, float* s_out) {
    __m512 vmax = _mm512_setzero_ps();
    ptrdiff_t j;
    for (j = 0; j + 16 <= n; j += 16) vmax = _mm512_max_ps(vmax, _mm512_abs_ps(_mm512_loadu_ps(x + j)));
    if (j < n) {
        const __mmask16 m = (__mmask16)((1u << (n - j)) - 1u);
        vmax = _mm512_max_ps(vmax, _mm512_abs_ps(_mm512_maskz_loadu_ps(m, x + j)));
    }
    const float amax = _mm512_reduce_max_ps(vmax);
    const float s = amax > 0 ? amax / 127.0f : 1.0f;
    const __m512 vs = _mm512_set1_ps(s), tol = _mm512_set1_ps(amax * 9.5367431640625e-07f);  /* 2^-20 */
    const __m512 kmax = _mm512_set1_ps(127.0f);
    for (j = 0; j < n; j += 16) {
        const __mmask16 m = n - j >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - j)) - 1u);
        const __m512 xv = _mm512_maskz_loadu_ps(m, x + j);
        const __m512 k = _mm512_roundscale_ps(_mm512_div_ps(xv, vs), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        const __mmask16 ok = _mm512_cmp_ps_mask(_mm512_abs_ps(k), kmax, _CMP_LE_OQ)
                           & _mm512_cmp_ps_mask(_mm512_abs_ps(_mm512_sub_ps(xv, _mm512_mul_ps(k, vs))), tol, _CMP_LE_OQ);
        if ((ok & m) != m) return 0;
        _mm512_mask_storeu_ps(kf + j, m, k);
    }
    *s_out = s;
    return 1;
}

/* The rotated codes (small integers held exactly as floats, kf[0 : n_chunks·C]) as
   int16 in the kernels' lane order: z[c·C + 32·s + w] = kf[c·C + S·w + s]
   (S = 8/fb steps, C = 32·S).  A chunk is converted into S vectors of 32 words in
   natural order; output step s gathers word S·w + s with vpermt2w from the pair of
   vectors that holds it (pair p holds words 64p … 64p + 63). */
NC_INT_AI void NC_INT_FN(nc_cqi_pack_codes_fb)(const float* kf, ptrdiff_t n_chunks, int16_t* z, const int fb) {
    const int S = 8 / fb;
    const ptrdiff_t C = 32 * S;
    __m512i idx[8];
    __mmask32 pick[8][4];
    /* (vector arithmetic: scalar loops here cost as much as the packing itself) */
    const __m512i iota = _mm512_set_epi16(31, 30, 29, 28, 27, 26, 25, 24, 23, 22, 21, 20, 19, 18, 17, 16,
                                          15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    for (int s = 0; s < S; s++) {
        const __m512i word = _mm512_add_epi16(_mm512_mullo_epi16(iota, _mm512_set1_epi16((short)S)),
                                              _mm512_set1_epi16((short)s));   /* S·w + s */
        idx[s] = _mm512_and_si512(word, _mm512_set1_epi16(63));
        for (int p = 0; p < S / 2; p++)
            pick[s][p] = _mm512_cmpeq_epi16_mask(_mm512_srli_epi16(word, 6), _mm512_set1_epi16((short)p));
    }
    for (ptrdiff_t c = 0; c < n_chunks; c++) {
        const float* src = kf + c * C;
        __m512i nat[8];
        for (int k = 0; k < S; k++) {
            const __m256i lo = _mm512_cvtepi32_epi16(_mm512_cvtps_epi32(_mm512_loadu_ps(src + 32 * k)));
            const __m256i hi = _mm512_cvtepi32_epi16(_mm512_cvtps_epi32(_mm512_loadu_ps(src + 32 * k + 16)));
            nat[k] = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
        }
        for (int s = 0; s < S; s++) {
            __m512i out = _mm512_setzero_si512();
            for (int p = 0; p < S / 2; p++)
                out = _mm512_mask_mov_epi16(out, pick[s][p], _mm512_permutex2var_epi16(nat[2 * p], idx[s], nat[2 * p + 1]));
            _mm512_storeu_si512((void*)(z + c * C + 32 * s), out);
        }
    }
}

static __attribute__((target(NC_INT_TGT))) int NC_INT_FN(nc_cqi_a8_codes)(const float* x, ptrdiff_t n, float* kf,
                                                                         float* s_out) {
    return NC_INT_FN(nc_cqi_a8_codes_inl)(x, n, kf, s_out);
}

static __attribute__((target(NC_INT_TGT))) void NC_INT_FN(nc_cqi_pack_codes)(const float* kf, ptrdiff_t n_chunks,
                                                                            int fb, int16_t* z) {
    switch (fb) {
    case 1: NC_INT_FN(nc_cqi_pack_codes_fb)(kf, n_chunks, z, 1); break;
    case 2: NC_INT_FN(nc_cqi_pack_codes_fb)(kf, n_chunks, z, 2); break;
    default: NC_INT_FN(nc_cqi_pack_codes_fb)(kf, n_chunks, z, 4); break;
    }
}

/* ---- integer matmul: one row times NT tokens (NT ≤ NC_INT_MM_TOKENS) ----
   Exactly the matvec's arithmetic for each (row, token) (same chunk loop, same
   int32 flushes, same conversion, same lane-sum tree), so a token's output is
   bitwise the matvec's.  The row is decoded in registers once per step (a shift
   and two vpermw) for NT tokens, each token's codes loaded once into a register
   for its two dots.  A zmm vpdpwssd makes as many int16 products a cycle as
   two ymm FMAs make float products, so with the two halves the peak equals the
   float matmul's; what is won is the float kernel's work around its FMAs.  Of the
   tiles measured (1 row × 6, 1×4, 2×3, 2×4, 2×2 tokens; benchmarks/history/cq.md)
   1 row × 6 tokens was the fastest; at 8 tokens the accumulators no longer fit
   the 32 registers. */
NC_INT_AI void NC_INT_FN(nc_cqi_mm_tile)(const uint8_t* row, const uint8_t* end, const float* nrow,
                                         const int16_t* z, ptrdiff_t z_stride, ptrdiff_t n_chunks, int g,
                                         __m512i th, __m512i tl, __m512i lane_groups, __m512 base,
                                         const float* s, float descale, float* y, ptrdiff_t y_stride,
                                         const int fb, const int NT) {
    const int S = 8 / fb;
    const ptrdiff_t C = 256 / fb;
    const int g_shift = __builtin_ctz((unsigned)g);
    const ptrdiff_t per = g >= C ? g / C : 1;
    /* the float totals live in L1, touched once per flush: in registers beside
       the 2·NT int32 accumulators they would spill in the inner loop instead */
    __attribute__((aligned(64))) float total[NC_INT_MM_TOKENS][16];
    for (int t = 0; t < NT; t++) _mm512_store_ps(total[t], _mm512_setzero_ps());
    for (ptrdiff_t c0 = 0; c0 < n_chunks; c0 += per) {
        __m512i ah[NC_INT_MM_TOKENS], al[NC_INT_MM_TOKENS];
        for (int t = 0; t < NT; t++) { ah[t] = _mm512_setzero_si512(); al[t] = _mm512_setzero_si512(); }
        for (ptrdiff_t c = c0; c < c0 + per; c++) {
            __m512i v = NC_INT_FN(nc_cqi_load)(row + c * 32, end);
            const int16_t* zc = z + c * C;
            for (int st = 0; st < S; st++) {
                const __m512i h = _mm512_permutexvar_epi16(v, th), l = _mm512_permutexvar_epi16(v, tl);
                v = _mm512_srli_epi16(v, fb);
                for (int t = 0; t < NT; t++) {
                    __m512i zs = _mm512_loadu_si512((const void*)(zc + t * z_stride + 32 * st));
                    /* one load in a register for both dots: left to itself the compiler
                       folds the load into each vpdpwssd (two 64-byte loads, slower) */
                    __asm__("" : "+v"(zs));
                    ah[t] = NC_INT_DPW(ah[t], h, zs);
                    al[t] = NC_INT_DPW(al[t], l, zs);
                }
            }
        }
        const float* nr = nrow + ((c0 * C) >> g_shift);
        const __m512 nv = g >= C ? _mm512_set1_ps(nr[0]) : _mm512_permutexvar_ps(lane_groups, _mm512_loadu_ps(nr));
        for (int t = 0; t < NT; t++) {
            const __m512 sum = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ah[t]), base, _mm512_cvtepi32_ps(al[t]));
            _mm512_store_ps(total[t], _mm512_fmadd_ps(sum, nv, _mm512_load_ps(total[t])));
        }
    }
    __m512 sums[8];
    float dot[8];
    for (int k = 0; k < 8; k++) sums[k] = k < NT ? _mm512_load_ps(total[k]) : _mm512_setzero_ps();
    NC_INT_FN(nc_cqi_hsum8)(sums, dot);
    for (int t = 0; t < NT; t++) y[t * y_stride] = dot[t] * (s[t] * descale);
}

#define NC_INT_MM_CASE(FB, N) case N: NC_INT_FN(nc_cqi_mm_tile)(packed + r * row_bytes, end, norms + r * norm_stride, \
    zt, z_stride, n_chunks, g, th, tl, lane_groups, b, s + t0, descale, Y + t0 * y_stride + r, y_stride, FB, N); break;
#define NC_INT_MM_SWITCH(FB) switch (nt) { NC_INT_MM_CASE(FB, 1) NC_INT_MM_CASE(FB, 2) NC_INT_MM_CASE(FB, 3) \
    NC_INT_MM_CASE(FB, 4) NC_INT_MM_CASE(FB, 5) default: NC_INT_MM_CASE(FB, 6) }

/* Y[t·y_stride + r] for rows r0 ≤ r < r1 and tokens 0 ≤ t < n_tokens: token tiles
   outside (their codes stay in L1 while the rows stream past), rows inside. */
static __attribute__((target(NC_INT_TGT))) void NC_INT_FN(nc_cqi_mm_rows)(
        const uint8_t* packed, ptrdiff_t row_bytes, const uint8_t* end, const float* norms,
        ptrdiff_t norm_stride, const int16_t* z, ptrdiff_t z_stride, ptrdiff_t n_tokens, ptrdiff_t n_chunks,
        int fb, int g, const int16_t* table, float base, const float* s, float descale,
        ptrdiff_t r0, ptrdiff_t r1, float* Y, ptrdiff_t y_stride) {
    const __m512i th = _mm512_loadu_si512((const void*)table);
    const __m512i tl = _mm512_loadu_si512((const void*)(table + 32));
    const int ifb = fb == 1 ? 1 : (fb == 2 ? 2 : 4);
    int lg[16];
    for (int l = 0; l < 16; l++) lg[l] = (16 * l / ifb) / g;
    const __m512i lane_groups = _mm512_loadu_si512((const void*)lg);
    const __m512 b = _mm512_set1_ps(base);
    for (ptrdiff_t t0 = 0; t0 < n_tokens; t0 += NC_INT_MM_TOKENS) {
        const int nt = (int)(n_tokens - t0 < NC_INT_MM_TOKENS ? n_tokens - t0 : NC_INT_MM_TOKENS);
        const int16_t* zt = z + t0 * z_stride;
        for (ptrdiff_t r = r0; r < r1; r++) {
            if (ifb == 1) { NC_INT_MM_SWITCH(1) }
            else if (ifb == 2) { NC_INT_MM_SWITCH(2) }
            else { NC_INT_MM_SWITCH(4) }
        }
    }
}
#undef NC_INT_MM_SWITCH
#undef NC_INT_MM_CASE

#undef NC_INT_AI
#undef NC_INT_FN
#undef NC_INT_CAT
#undef NC_INT_CAT2
