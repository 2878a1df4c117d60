/* Integer CQ matvec on A8 activations: one instantiation per instruction set.

   Included by _cq.pyx once per x86 variant, with
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
            for (int i = 0; i < R; i++) v[i] = NC_INT_FN(nc_cqi_load)(packed + (r + i) * row_bytes + c * 32, end);
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
    for (int i = 0; i < R; i++) y[r + i] = _mm512_reduce_add_ps(total[i]) * scale;
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

#undef NC_INT_AI
#undef NC_INT_FN
#undef NC_INT_CAT
#undef NC_INT_CAT2
