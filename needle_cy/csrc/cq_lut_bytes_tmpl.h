/* The row loops of the lookup kernel (cq_lut.h) on byte tables: AVX-512 VBMI +
   VNNI (Ice Lake, Sapphire Rapids and later Intel cores; AMD from Zen 4).  Included once by
   cq_lut.h, inside its x86 section and after its NC_CQL_* macros and helpers (no
   defines of its own); what they compute is the same exact integer group sums as
   cq_lut_rows_tmpl.h's, so the same bits.

   Why.  cq_lut_rows_tmpl.h spends four instructions per vpermw of 32 words (16 rows × 2
   nibbles): a shift and a ternary op to make the indices, the lookup, the vpdpwssd.
   Here an int16 entry q is split into its low byte (q & 255, unsigned) and its high
   byte (q >> 8, signed): q = 256·hi + lo, so a group's Σ q is 256·Σ hi + Σ lo, both
   exact int32 sums.  One vpermb looks up 64 bytes from a 64-byte table, indexed by six
   bits: the nibble (bits 0–3) and the byte's place j in its dword (bits 4–5: four
   nibbles' tables side by side).  For a dword vector (16 rows × 8 nibbles) the low
   nibbles of its bytes (nibbles 0, 2, 4, 6 of each row) make one index vector and the
   high nibbles (1, 3, 5, 7) the other; each index vector looks up its low bytes and
   its high bytes (4 vpermb), and vpdpbusd against ones adds each row's four bytes into
   its int32 lane.  11 instructions per 16 rows × 8 nibbles instead of 16: faster than
   the vpdpwssd loops on every matvec shape, most from cache (benchmarks/history/cq.md).
   The matmul keeps the int16 tables and cq_lut_rows_tmpl.h's tiles, where the index vectors
   are shared by 4 tokens anyway: byte tiles were slower in a whole-model prefill.

   Table layout (nc_cql_entries_at with bytes = 1; the same 256 bytes a dword as the
   int16 layout): for dword d, at byte d·256 + 128·(k & 1), nibble k = 2j + (k & 1) of
   the dword has its 16 low bytes at + 16·j and its 16 high bytes at + 64 + 16·j. */

#define NC_CQB_TGT "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,prfchw"
#define NC_CQB_AI static inline __attribute__((always_inline, target(NC_CQB_TGT)))
#define NC_CQB_FN static __attribute__((target(NC_CQB_TGT)))

/* The lookups of one dword vector v of 16 rows (t: the dword's 256 table bytes) into
   four int32 accumulators: low and high bytes of the even and the odd nibbles. */
NC_CQB_AI void nc_cqb_dword(__m512i v, const uint8_t* t, __m512i* lo_e, __m512i* hi_e, __m512i* lo_o,
                            __m512i* hi_o) {
    const __m512i nib = _mm512_set1_epi8(0x0F);
    const __m512i slot = _mm512_set1_epi32(0x30201000);    /* byte j of a dword: j << 4 */
    const __m512i ones = _mm512_set1_epi8(1);
    /* (v & 15) | slot and ((v >> 4) & 15) | slot per byte, one ternary op each (0xEA: c | (a & b)) */
    const __m512i ie = _mm512_ternarylogic_epi32(v, nib, slot, 0xEA);
    const __m512i io = _mm512_ternarylogic_epi32(_mm512_srli_epi16(v, 4), nib, slot, 0xEA);
    *lo_e = _mm512_dpbusd_epi32(*lo_e, _mm512_permutexvar_epi8(ie, _mm512_loadu_si512((const void*)t)), ones);
    *hi_e = _mm512_dpbusd_epi32(*hi_e, ones, _mm512_permutexvar_epi8(ie, _mm512_loadu_si512((const void*)(t + 64))));
    *lo_o = _mm512_dpbusd_epi32(*lo_o, _mm512_permutexvar_epi8(io, _mm512_loadu_si512((const void*)(t + 128))), ones);
    *hi_o = _mm512_dpbusd_epi32(*hi_o, ones, _mm512_permutexvar_epi8(io, _mm512_loadu_si512((const void*)(t + 192))));
}

/* 256·Σ hi + Σ lo: the group's exact integer sums, as 16 floats */
NC_CQB_AI __m512 nc_cqb_sum(__m512i lo_e, __m512i hi_e, __m512i lo_o, __m512i hi_o) {
    return _mm512_cvtepi32_ps(_mm512_add_epi32(_mm512_slli_epi32(_mm512_add_epi32(hi_e, hi_o), 8),
                                               _mm512_add_epi32(lo_e, lo_o)));
}

/* The integer sums of one group of a 16-row block (wb: its first dword vector; t: the
   group's first table byte), as 16 exact floats. */
NC_CQB_AI __m512 nc_cqb_group(const uint32_t* wb, const uint8_t* t, int dpg) {
    __m512i lo_e = _mm512_setzero_si512(), hi_e = _mm512_setzero_si512();
    __m512i lo_o = _mm512_setzero_si512(), hi_o = _mm512_setzero_si512();
    for (int d = 0; d < dpg; d++, wb += 16, t += 256) {
        const __m512i v = _mm512_loadu_si512((const void*)wb);
        _mm_prefetch((const char*)wb + NC_CQL_PF_BYTES, _MM_HINT_T0);
        nc_cqb_dword(v, t, &lo_e, &hi_e, &lo_o, &hi_o);
    }
    return nc_cqb_sum(lo_e, hi_e, lo_o, hi_o);
}

/* y[r] for r0 ≤ r < r1 (one token; tab its byte tables, scale = s·descale). */
NC_CQB_FN void nc_cql_rows_vbmi(const uint32_t* bits, const float* pnorms, ptrdiff_t n_dw, ptrdiff_t n_groups,
                                int g, int fb, const float* tab, float scale, ptrdiff_t r0, ptrdiff_t r1,
                                float* y) {
    const int dpg = g * fb / 32;
    const uint8_t* t = (const uint8_t*)nc_cql_entries(tab);
    const __m512 sc = _mm512_set1_ps(scale * tab[0]);
    NC_CQL_ROW_BLOCKS(nc_cqb_group, t, dpg * 256)
}

#undef NC_CQB_FN
#undef NC_CQB_AI
#undef NC_CQB_TGT
