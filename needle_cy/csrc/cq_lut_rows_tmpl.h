/* The row loops of the lookup kernel (cq_lut.h): one instantiation per
   instruction set, included by cq_lut.h with
     NC_CQL_SUF   name suffix (vnni, bw)
     NC_CQL_RTGT  target attribute string
     NC_CQL_DOT(acc, x)  acc += the sums of adjacent int16 pairs of x (vpdpwssd with
                  ones, or vpmaddwd + vpaddd).
   What they compute is cq_lut.h's: every sum is an exact integer, so both
   instantiations give the same bits. */

#define NC_CQL_CAT2(a, b) a##_##b
#define NC_CQL_CAT(a, b) NC_CQL_CAT2(a, b)
#define NC_CQL_RFN(name) NC_CQL_CAT(name, NC_CQL_SUF)
#define NC_CQL_RAI static inline __attribute__((always_inline, target(NC_CQL_RTGT)))

/* One step of a dword vector v (16 rows): k = 0 … 3 looks up pairs 8d + k (the low word
   of each row's dword) and 8d + 4 + k (the high word) in one vpermw of the step's 32
   entries: index = nibble k of the word, plus 16 in the high words. */
NC_CQL_RAI __m512i NC_CQL_RFN(nc_cql_step)(__m512i v, const int16_t* t, int k, __m512i acc) {
    const __m512i nib = _mm512_set1_epi16(0x000F);
    const __m512i high = _mm512_set1_epi32(0x00100000);
    const __m512i ones = _mm512_set1_epi16(1);
    /* (v >> 4k) & 15 | high in one ternary op (0xEA: c | (a & b)) */
    const __m512i idx = _mm512_ternarylogic_epi32(_mm512_srli_epi16(v, (unsigned)(4 * k)), nib, high, 0xEA);
    return NC_CQL_DOT(acc, _mm512_permutexvar_epi16(idx, _mm512_loadu_si512((const void*)(t + 32 * k))));
}

/* The integer sums of one group of a 16-row block (wb: its first dword vector; t: the
   group's first table step), as 16 exact floats. */
NC_CQL_RAI __m512 NC_CQL_RFN(nc_cql_group)(const uint32_t* wb, const int16_t* t, int dpg) {
    __m512i a = _mm512_setzero_si512(), b = _mm512_setzero_si512();
    for (int d = 0; d < dpg; d++, wb += 16, t += 128) {
        const __m512i v = _mm512_loadu_si512((const void*)wb);
        _mm_prefetch((const char*)wb + NC_CQL_PF_BYTES, _MM_HINT_T0);
        a = NC_CQL_RFN(nc_cql_step)(v, t, 0, a);
        b = NC_CQL_RFN(nc_cql_step)(v, t, 1, b);
        a = NC_CQL_RFN(nc_cql_step)(v, t, 2, a);
        b = NC_CQL_RFN(nc_cql_step)(v, t, 3, b);
    }
    return _mm512_cvtepi32_ps(_mm512_add_epi32(a, b));
}

/* y[r] for r0 ≤ r < r1 (one token; tab its tables, scale = s·descale). */
static __attribute__((target(NC_CQL_RTGT))) void NC_CQL_RFN(nc_cql_rows)(
        const uint32_t* bits, const float* pnorms, ptrdiff_t n_dw, ptrdiff_t n_groups, int g, int fb,
        const float* tab, float scale, ptrdiff_t r0, ptrdiff_t r1, float* y) {
    const int dpg = g * fb / 32;
    const int16_t* t = nc_cql_entries(tab);
    const __m512 sc = _mm512_set1_ps(scale * tab[0]);
    NC_CQL_ROW_BLOCKS(NC_CQL_RFN(nc_cql_group), t, dpg * 128)
}

/* nc_cql_rows without a token's tables: each group's entries made in `entries` (room
   for one group) for every row block, at the token's scale S (scale = s·descale·2^-k):
   the same bits, slowly (the matmul's fallback when it has no scratch). */
static __attribute__((target(NC_CQL_RTGT))) void NC_CQL_RFN(nc_cql_rows_by_group)(
        const uint32_t* bits, const float* pnorms, ptrdiff_t n_dw, ptrdiff_t n_groups, int g, int fb,
        const float* z, const float* codebook, float S, float scale, ptrdiff_t r0, ptrdiff_t r1, float* y,
        int16_t* entries) {
    const int dpg = g * fb / 32;
    const __m512 sc = _mm512_set1_ps(scale);
    for (ptrdiff_t rb = r0 / 16; 16 * rb < r1; rb++) {
        const uint32_t* wb = bits + rb * n_dw * 16;
        const float* nb = pnorms + rb * n_groups * 16;
        __m512 acc = _mm512_setzero_ps();
        for (ptrdiff_t gi = 0; gi < n_groups; gi++) {
            nc_cql_entries_at(z + gi * g, g, codebook, fb, S, entries, 0);
            acc = _mm512_fmadd_ps(_mm512_loadu_ps(nb + 16 * gi),
                                  NC_CQL_RFN(nc_cql_group)(wb + gi * dpg * 16, entries, dpg), acc);
        }
        _mm512_mask_storeu_ps(y + 16 * rb, nc_cql_lanes(16 * rb, r0, r1), _mm512_mul_ps(acc, sc));
    }
}

/* NT ≤ NC_CQL_MM_TOKENS tokens of one 16-row block: each token's lanes take exactly
   nc_cql_rows's steps (so a token's outputs are bitwise the matvec's); the weight
   vector and its index vectors are shared by the tokens. */
NC_CQL_RAI void NC_CQL_RFN(nc_cql_mm_tile)(const uint32_t* wb, const float* nb, const float* tab,
                                           ptrdiff_t tab_stride, ptrdiff_t n_groups, int dpg, const float* s,
                                           float descale, float* Y, ptrdiff_t y_stride, ptrdiff_t r,
                                           __mmask16 lanes, const int NT) {
    const __m512i nib = _mm512_set1_epi16(0x000F);
    const __m512i high = _mm512_set1_epi32(0x00100000);
    const __m512i ones = _mm512_set1_epi16(1);
    __m512 acc[NC_CQL_MM_TOKENS];
    for (int t = 0; t < NT; t++) acc[t] = _mm512_setzero_ps();
    for (ptrdiff_t gi = 0; gi < n_groups; gi++) {
        __m512i a[NC_CQL_MM_TOKENS];
        for (int t = 0; t < NT; t++) a[t] = _mm512_setzero_si512();
        for (int d = 0; d < dpg; d++, wb += 16) {
            const __m512i v = _mm512_loadu_si512((const void*)wb);
            const ptrdiff_t at = (gi * dpg + d) * 128;
#pragma GCC unroll 4
            for (int k = 0; k < 4; k++) {
                const __m512i idx = _mm512_ternarylogic_epi32(_mm512_srli_epi16(v, (unsigned)(4 * k)), nib, high, 0xEA);
                for (int t = 0; t < NT; t++) {
                    const int16_t* e = nc_cql_entries(tab + t * tab_stride) + at + 32 * k;
                    a[t] = NC_CQL_DOT(a[t], _mm512_permutexvar_epi16(idx, _mm512_loadu_si512((const void*)e)));
                }
            }
        }
        const __m512 nv = _mm512_loadu_ps(nb + 16 * gi);
        for (int t = 0; t < NT; t++)
            acc[t] = _mm512_fmadd_ps(nv, _mm512_cvtepi32_ps(a[t]), acc[t]);
    }
    for (int t = 0; t < NT; t++)
        _mm512_mask_storeu_ps(Y + t * y_stride + r, lanes,
                              _mm512_mul_ps(acc[t], _mm512_set1_ps((s[t] * descale) * tab[t * tab_stride])));
}

/* Rows r0 ≤ r < r1 of the nt tokens whose tables nc_cql_tile_tables made
   (Y[t·y_stride + r]; s[t] their A8 scales). */
static __attribute__((target(NC_CQL_RTGT))) void NC_CQL_RFN(nc_cql_tile_rows)(
        const uint32_t* bits, const float* pnorms, ptrdiff_t n_dw, ptrdiff_t n_groups, int g, int fb,
        const float* tab, int nt, const float* s, float descale, ptrdiff_t r0, ptrdiff_t r1, float* Y,
        ptrdiff_t y_stride) {
    const int dpg = g * fb / 32;
    const ptrdiff_t per_token = nc_cql_table_floats(n_dw);
    for (ptrdiff_t rb = r0 / 16; 16 * rb < r1; rb++) {
        const uint32_t* wb = bits + rb * n_dw * 16;
        const float* nb = pnorms + rb * n_groups * 16;
        const __mmask16 lanes = nc_cql_lanes(16 * rb, r0, r1);
        switch (nt) {
        case 1: NC_CQL_RFN(nc_cql_mm_tile)(wb, nb, tab, per_token, n_groups, dpg, s, descale, Y, y_stride, 16 * rb, lanes, 1); break;
        case 2: NC_CQL_RFN(nc_cql_mm_tile)(wb, nb, tab, per_token, n_groups, dpg, s, descale, Y, y_stride, 16 * rb, lanes, 2); break;
        case 3: NC_CQL_RFN(nc_cql_mm_tile)(wb, nb, tab, per_token, n_groups, dpg, s, descale, Y, y_stride, 16 * rb, lanes, 3); break;
        default: NC_CQL_RFN(nc_cql_mm_tile)(wb, nb, tab, per_token, n_groups, dpg, s, descale, Y, y_stride, 16 * rb, lanes, 4); break;
        }
    }
}

#undef NC_CQL_RAI
#undef NC_CQL_RFN
#undef NC_CQL_CAT
#undef NC_CQL_CAT2
