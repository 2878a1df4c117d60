/* Integer CQ matvec and matmul on A8 activations with 256-bit vectors (AVX2, AVX-VNNI).

   Included by cq_avx2int.h once per variant, with
     NC_I2_SUF   name suffix (avx2int, avxvnni)
     NC_I2_TGT   target attribute string
     NC_I2_DPW   acc += Σ pairs of int16 products (vpmaddwd + vpaddd, or VEX vpdpwssd)

   The same numbers as cq_int_avx512_tmpl.h, bit for bit (the tests compare them): the
   same rotated codes z in the same order (z[c·C + 32·s + w] = code of field s of
   byte w of chunk c), the same integer codebook halves hi·B + lo, the same 16
   "lanes" per chunk (lane l sums bytes 2l, 2l+1 of every step in int32), the same
   conversions to float per group (or per chunk), the same fused multiply–adds per
   lane and the same lane-sum tree.  Integer sums are exact, so only the lane
   partition has to match, not the order inside a lane; the float steps are done
   lane for lane as the AVX-512 kernel does them.

   Lookup: AVX2 has no vpermw, so the 16 codewords are split into byte planes and
   looked up with vpshufb on the 4-bit indices (index bits above the field do not
   matter: the tables repeat with period 2^fb).  A chunk is handled as two halves
   of 16 bytes, each loaded into both 128-bit lanes: one vpshufb on the low-byte
   plane (low lane: hi, high lane: lo) and one on the high-byte plane, then an
   unpack of the two gives [hi | lo] words of 8 bytes, and the other unpack the
   next 8, so the two int16 halves of the codebook share every lookup and only
   two planes sit in registers.  Accumulator q (0..3) of a token holds lanes
   4q..4q+3, hi sums in its low 128 bits and lo sums in its high 128 bits, and z
   is loaded with vbroadcasti128 to match.  Per 32 fields: 2 shifts/ands, 4
   vpshufb, 4 unpacks and 4 vpmaddwd + 4 vpaddd (4 vpdpwssd with AVX-VNNI).

   Both halves of a chunk need 4 accumulators per token; 16 ymm registers hold
   them for few tokens, so the lanes are summed one half (8 lanes) at a time: for
   each conversion block, half 0 over its chunks, flush, then half 1 (the float
   totals of a tile live in L1, as in cq_int_avx512_tmpl.h). */

#ifndef NC_I2_PF_ROWS
#define NC_I2_PF_ROWS 8   /* matvec prefetch distance in rows (as NC_INT_PF_ROWS) */
#endif
/* Tokens per tile of the matmul: 2·NT accumulators, the decoded pair, the two
   planes and the index mask fit the 16 registers at 4. */
#define NC_I2_MM_TOKENS 4
/* Rows per block of the matvec (they share every z load).  1: with 2 rows the 16
   ymm registers of an AVX2 CPU spill (portable build, 768x768 4 bits: 59.6 µs at 2
   rows, 55.1 at 1; a -march=native build on an AVX-512 CPU has 32 and took 50 at 2). */
#ifndef NC_I2_MV_ROWS
#define NC_I2_MV_ROWS 1
#endif
#define NC_I2_CAT2(a, b) a##_##b
#define NC_I2_CAT(a, b) NC_I2_CAT2(a, b)
#define NC_I2_FN(name) NC_I2_CAT(name, NC_I2_SUF)
#define NC_I2_AI static inline __attribute__((always_inline, target(NC_I2_TGT)))

/* 16 packed bytes in both 128-bit lanes; never reads at or past `end`. */
NC_I2_AI __m256i NC_I2_FN(nc_cqi2_load_half)(const uint8_t* p, const uint8_t* end) {
    const ptrdiff_t left = end - p;
    if (left >= 16) return _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i*)p));
    uint8_t buf[16];
    memset(buf, 0, sizeof buf);
    if (left > 0) memcpy(buf, p, (size_t)left);
    return _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i*)buf));
}

/* 8 int16 codes in both 128-bit lanes (vbroadcasti128). */
NC_I2_AI __m256i NC_I2_FN(nc_cqi2_codes)(const int16_t* z) {
    return _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i*)z));
}

/* Codewords of one step of a half chunk: w0 = [hi | lo] of bytes 0..7, w1 of bytes 8..15. */
NC_I2_AI void NC_I2_FN(nc_cqi2_decode)(__m256i bytes, __m256i plane_lo, __m256i plane_hi, __m256i nibble,
                                       __m256i* w0, __m256i* w1) {
    const __m256i idx = _mm256_and_si256(bytes, nibble);
    const __m256i l = _mm256_shuffle_epi8(plane_lo, idx), h = _mm256_shuffle_epi8(plane_hi, idx);
    *w0 = _mm256_unpacklo_epi8(l, h);
    *w1 = _mm256_unpackhi_epi8(l, h);
}

/* Σ of 16 lanes (lo: lanes 0..7, hi: 8..15) by cq_int_avx512_tmpl.h's tree:
   q_j = (v_j + v_{j+8}) + (v_{j+4} + v_{j+12}), then (q_0 + q_2) + (q_1 + q_3). */
NC_I2_AI float NC_I2_FN(nc_cqi2_hsum16)(__m256 lo, __m256 hi) {
    const __m256 a = _mm256_add_ps(lo, hi);
    const __m128 q = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    const __m128 p = _mm_add_ps(q, _mm_movehl_ps(q, q));
    return _mm_cvtss_f32(_mm_add_ss(p, _mm_movehdup_ps(p)));
}

/* The float part of a flush for 8 lanes: total += (hi·B + lo)·ν lane by lane, as
   cq_int_avx512_tmpl.h (acc0: lanes 0..3, acc1: lanes 4..7, each [hi | lo]). */
NC_I2_AI __m256 NC_I2_FN(nc_cqi2_flush)(__m256i acc0, __m256i acc1, __m256 base, __m256 nv, __m256 total) {
    const __m256 f0 = _mm256_cvtepi32_ps(acc0), f1 = _mm256_cvtepi32_ps(acc1);
    const __m256 hi = _mm256_permute2f128_ps(f0, f1, 0x20), lo = _mm256_permute2f128_ps(f0, f1, 0x31);
    return _mm256_fmadd_ps(_mm256_fmadd_ps(hi, base, lo), nv, total);
}

/* What the kernels share for one matrix: planes, lane groups, base. */
typedef struct {
    __m256i plane_lo, plane_hi, nibble, lg_lo, lg_hi;
    int lg8;     /* group of lane 8 (lanes 8..15 read their norms from there on) */
    __m256 base;
} NC_I2_FN(nc_cqi2_consts);

NC_I2_AI NC_I2_FN(nc_cqi2_consts) NC_I2_FN(nc_cqi2_setup)(const int16_t* table, float base, int fb, int g) {
    NC_I2_FN(nc_cqi2_consts) k;
    uint8_t lo[32], hi[32];
    for (int i = 0; i < 16; i++) {  /* low lane: hi half of the codebook, high lane: lo half */
        lo[i] = (uint8_t)((uint16_t)table[i] & 0xff);
        hi[i] = (uint8_t)((uint16_t)table[i] >> 8);
        lo[16 + i] = (uint8_t)((uint16_t)table[32 + i] & 0xff);
        hi[16 + i] = (uint8_t)((uint16_t)table[32 + i] >> 8);
    }
    k.plane_lo = _mm256_loadu_si256((const __m256i*)lo);
    k.plane_hi = _mm256_loadu_si256((const __m256i*)hi);
    k.nibble = _mm256_set1_epi8(0x0f);
    int lg[16];
    for (int l = 0; l < 16; l++) lg[l] = (16 * l / fb) / g;  /* lane l starts at field 16·l/fb */
    k.lg8 = lg[8];
    for (int l = 8; l < 16; l++) lg[l] -= k.lg8;               /* ≤ 7: a lane spans ≤ one group */
    k.lg_lo = _mm256_loadu_si256((const __m256i*)lg);
    k.lg_hi = _mm256_loadu_si256((const __m256i*)(lg + 8));
    k.base = _mm256_set1_ps(base);
    return k;
}

/* Norms of the 8 lanes of half h of the conversion block whose norms start at nr. */
NC_I2_AI __m256 NC_I2_FN(nc_cqi2_norms)(const float* nr, int g, ptrdiff_t C, int h,
                                        const NC_I2_FN(nc_cqi2_consts)* k) {
    if (g >= C) return _mm256_set1_ps(nr[0]);
    return h == 0 ? _mm256_permutevar8x32_ps(_mm256_loadu_ps(nr), k->lg_lo)
                  : _mm256_permutevar8x32_ps(_mm256_loadu_ps(nr + k->lg8), k->lg_hi);
}

/* ---- matvec: R rows sharing every code load ----
   Both halves of a chunk at once (4 accumulators a row, the float totals of the
   16 lanes in two registers); TAIL: some load of the block may reach `end`. */
NC_I2_AI void NC_I2_FN(nc_cqi2_block)(const uint8_t* packed, ptrdiff_t row_bytes, const uint8_t* end,
                                      const float* norms, ptrdiff_t norm_stride, const int16_t* z,
                                      ptrdiff_t n_chunks, int g, const NC_I2_FN(nc_cqi2_consts)* k,
                                      float scale, ptrdiff_t r, float* y, const int fb, const int R,
                                      const int TAIL) {
    const int S = 8 / fb;
    const ptrdiff_t C = 256 / fb;
    const int g_shift = __builtin_ctz((unsigned)g);
    const ptrdiff_t per = g >= C ? g / C : 1;  /* chunks per conversion to float */
    __m256 total[NC_I2_MV_ROWS][2];
    for (int i = 0; i < R; i++) total[i][0] = total[i][1] = _mm256_setzero_ps();
    for (ptrdiff_t c0 = 0; c0 < n_chunks; c0 += per) {
        __m256i acc[NC_I2_MV_ROWS][4];
        for (int i = 0; i < R; i++)
            for (int q = 0; q < 4; q++) acc[i][q] = _mm256_setzero_si256();
        for (ptrdiff_t c = c0; c < c0 + per; c++) {
            __m256i v[NC_I2_MV_ROWS][2];
            for (int i = 0; i < R; i++) {
                const uint8_t* p = packed + (r + i) * row_bytes + c * 32;
                for (int h = 0; h < 2; h++)
                    v[i][h] = TAIL ? NC_I2_FN(nc_cqi2_load_half)(p + 16 * h, end)
                                   : _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i*)(p + 16 * h)));
                /* the weights stream from DRAM in the model (see NC_INT_PF_ROWS) */
                if (p + NC_I2_PF_ROWS * row_bytes < end)
                    _mm_prefetch((const char*)(p + NC_I2_PF_ROWS * row_bytes), _MM_HINT_T0);
            }
            const int16_t* zc = z + c * C;
            for (int s = 0; s < S; s++) {
                for (int h = 0; h < 2; h++) {
                    const __m256i z0 = NC_I2_FN(nc_cqi2_codes)(zc + 32 * s + 16 * h);
                    const __m256i z1 = NC_I2_FN(nc_cqi2_codes)(zc + 32 * s + 16 * h + 8);
                    for (int i = 0; i < R; i++) {
                        __m256i w0, w1;
                        NC_I2_FN(nc_cqi2_decode)(v[i][h], k->plane_lo, k->plane_hi, k->nibble, &w0, &w1);
                        acc[i][2 * h] = NC_I2_DPW(acc[i][2 * h], w0, z0);
                        acc[i][2 * h + 1] = NC_I2_DPW(acc[i][2 * h + 1], w1, z1);
                        v[i][h] = _mm256_srli_epi16(v[i][h], fb);
                    }
                }
            }
        }
        for (int i = 0; i < R; i++) {
            const float* nr = norms + (r + i) * norm_stride + ((c0 * C) >> g_shift);
            for (int h = 0; h < 2; h++)
                total[i][h] = NC_I2_FN(nc_cqi2_flush)(acc[i][2 * h], acc[i][2 * h + 1], k->base,
                                                      NC_I2_FN(nc_cqi2_norms)(nr, g, C, h, k), total[i][h]);
        }
    }
    for (int i = 0; i < R; i++) y[r + i] = NC_I2_FN(nc_cqi2_hsum16)(total[i][0], total[i][1]) * scale;
}

NC_I2_AI void NC_I2_FN(nc_cqi2_rows_fb)(const uint8_t* packed, ptrdiff_t row_bytes, const uint8_t* end,
                                        const float* norms, ptrdiff_t norm_stride, const int16_t* z,
                                        ptrdiff_t n_chunks, int g, const int16_t* table, float base,
                                        float scale, ptrdiff_t r0, ptrdiff_t r1, float* y, const int fb) {
    const NC_I2_FN(nc_cqi2_consts) k = NC_I2_FN(nc_cqi2_setup)(table, base, fb, g);
    /* rows whose chunks all end before `end` load without checks */
    const ptrdiff_t span = end - packed, chunk_bytes = n_chunks * 32;
    ptrdiff_t r = r0;
    for (; r + NC_I2_MV_ROWS <= r1; r += NC_I2_MV_ROWS) {
        if ((r + NC_I2_MV_ROWS - 1) * row_bytes + chunk_bytes <= span)
            NC_I2_FN(nc_cqi2_block)(packed, row_bytes, end, norms, norm_stride, z, n_chunks, g, &k, scale, r, y,
                                    fb, NC_I2_MV_ROWS, 0);
        else
            NC_I2_FN(nc_cqi2_block)(packed, row_bytes, end, norms, norm_stride, z, n_chunks, g, &k, scale, r, y,
                                    fb, NC_I2_MV_ROWS, 1);
    }
    for (; r < r1; r++)
        NC_I2_FN(nc_cqi2_block)(packed, row_bytes, end, norms, norm_stride, z, n_chunks, g, &k, scale, r, y,
                                fb, 1, 1);
}

static __attribute__((target(NC_I2_TGT))) void NC_I2_FN(nc_cqi2_rows)(
        const uint8_t* packed, ptrdiff_t row_bytes, const uint8_t* end, const float* norms,
        ptrdiff_t norm_stride, const int16_t* z, ptrdiff_t n_chunks, int fb, int g,
        const int16_t* table, float base, float scale, ptrdiff_t r0, ptrdiff_t r1, float* y) {
    switch (fb) {
    case 1: NC_I2_FN(nc_cqi2_rows_fb)(packed, row_bytes, end, norms, norm_stride, z, n_chunks, g, table, base, scale, r0, r1, y, 1); break;
    case 2: NC_I2_FN(nc_cqi2_rows_fb)(packed, row_bytes, end, norms, norm_stride, z, n_chunks, g, table, base, scale, r0, r1, y, 2); break;
    default: NC_I2_FN(nc_cqi2_rows_fb)(packed, row_bytes, end, norms, norm_stride, z, n_chunks, g, table, base, scale, r0, r1, y, 4); break;
    }
}

/* ---- the A8 codes of one token: nc_cqi_a8_codes of cq_int_avx512_tmpl.h, 8 lanes at a time ----
   (the same operations element by element, so the same acceptance, s and codes) */
NC_I2_AI int NC_I2_FN(nc_cqi2_a8_codes_inl)(const float* x, ptrdiff_t n, float* kf, float* s_out) {
    const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    const __m256i iota = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    __m256 vmax = _mm256_setzero_ps();
    ptrdiff_t j;
    for (j = 0; j + 8 <= n; j += 8) vmax = _mm256_max_ps(vmax, _mm256_and_ps(abs_mask, _mm256_loadu_ps(x + j)));
    if (j < n) {
        const __m256i m = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(n - j)), iota);
        vmax = _mm256_max_ps(vmax, _mm256_and_ps(abs_mask, _mm256_maskload_ps(x + j, m)));
    }
    float lanes[8];
    _mm256_storeu_ps(lanes, vmax);
    float amax = lanes[0];
    for (int l = 1; l < 8; l++) amax = lanes[l] > amax ? lanes[l] : amax;
    const float s = amax > 0 ? amax / 127.0f : 1.0f;
    const __m256 vs = _mm256_set1_ps(s), tol = _mm256_set1_ps(amax * 9.5367431640625e-07f);  /* 2^-20 */
    const __m256 kmax = _mm256_set1_ps(127.0f);
    for (j = 0; j < n; j += 8) {
        const __m256i m = n - j >= 8 ? _mm256_set1_epi32(-1) : _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(n - j)), iota);
        const __m256 xv = _mm256_maskload_ps(x + j, m);
        const __m256 k = _mm256_round_ps(_mm256_div_ps(xv, vs), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        const __m256 ok = _mm256_and_ps(_mm256_cmp_ps(_mm256_and_ps(abs_mask, k), kmax, _CMP_LE_OQ),
                                        _mm256_cmp_ps(_mm256_and_ps(abs_mask, _mm256_sub_ps(xv, _mm256_mul_ps(k, vs))),
                                                      tol, _CMP_LE_OQ));
        const int need = _mm256_movemask_ps(_mm256_castsi256_ps(m));
        if ((_mm256_movemask_ps(ok) & need) != need) return 0;
        _mm256_maskstore_ps(kf + j, m, k);
    }
    *s_out = s;
    return 1;
}

static __attribute__((target(NC_I2_TGT))) int NC_I2_FN(nc_cqi2_a8_codes)(const float* x, ptrdiff_t n, float* kf,
                                                                        float* s_out) {
    return NC_I2_FN(nc_cqi2_a8_codes_inl)(x, n, kf, s_out);
}

/* The rotated codes as int16 in the lane order above (the same as cq_int_avx512_tmpl.h's):
   z[c·C + 32·s + w] = kf[c·C + S·w + s].  At 4 bits (S = 2) a chunk is two
   de-interleaves of 64 words; at 1–2 bits a gather by index. */
NC_I2_AI void NC_I2_FN(nc_cqi2_pack_codes_fb)(const float* kf, ptrdiff_t n_chunks, int16_t* z, const int fb) {
    const int S = 8 / fb;
    const ptrdiff_t C = 32 * S;
    for (ptrdiff_t c = 0; c < n_chunks; c++) {
        const float* src = kf + c * C;
        int16_t* dst = z + c * C;
        if (S == 2) {
            /* 16 floats → words of 8 even then 8 odd fields (of bytes w0..w0+7) */
            const __m256i even_odd = _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15,
                                                      0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15);
            for (int w0 = 0; w0 < 32; w0 += 8) {
                const __m256i a = _mm256_cvtps_epi32(_mm256_loadu_ps(src + 2 * w0));
                const __m256i b = _mm256_cvtps_epi32(_mm256_loadu_ps(src + 2 * w0 + 8));
                /* packs: [a0..3 b0..3 | a4..7 b4..7] as words; fields 2w0 + 0..15 in order after the permute */
                const __m256i words = _mm256_permute4x64_epi64(_mm256_packs_epi32(a, b), 0xD8);
                const __m256i split = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(words, even_odd), 0xD8);
                _mm_storeu_si128((__m128i*)(dst + w0), _mm256_castsi256_si128(split));
                _mm_storeu_si128((__m128i*)(dst + 32 + w0), _mm256_extracti128_si256(split, 1));
            }
        } else {
            for (int s = 0; s < S; s++)
                for (int w = 0; w < 32; w++) dst[32 * s + w] = (int16_t)(int)src[S * w + s];
        }
    }
}

static __attribute__((target(NC_I2_TGT))) void NC_I2_FN(nc_cqi2_pack_codes)(const float* kf, ptrdiff_t n_chunks,
                                                                           int fb, int16_t* z) {
    switch (fb) {
    case 1: NC_I2_FN(nc_cqi2_pack_codes_fb)(kf, n_chunks, z, 1); break;
    case 2: NC_I2_FN(nc_cqi2_pack_codes_fb)(kf, n_chunks, z, 2); break;
    default: NC_I2_FN(nc_cqi2_pack_codes_fb)(kf, n_chunks, z, 4); break;
    }
}

/* ---- integer matmul: one row times NT tokens (NT ≤ NC_I2_MM_TOKENS) ----
   Each (row, token) takes exactly the matvec's arithmetic (same halves, chunk
   loop, flushes and lane-sum tree), so a token's outputs are bitwise the
   matvec's.  A step of a half chunk is decoded once for the tile's tokens. */
NC_I2_AI void NC_I2_FN(nc_cqi2_mm_tile)(const uint8_t* row, const uint8_t* end, const float* nrow,
                                        const int16_t* z, ptrdiff_t z_stride, ptrdiff_t n_chunks, int g,
                                        const NC_I2_FN(nc_cqi2_consts)* k, const float* s, float descale,
                                        float* y, ptrdiff_t y_stride, const int fb, const int NT) {
    const int S = 8 / fb;
    const ptrdiff_t C = 256 / fb;
    const int g_shift = __builtin_ctz((unsigned)g);
    const ptrdiff_t per = g >= C ? g / C : 1;
    __attribute__((aligned(32))) float total[NC_I2_MM_TOKENS][16];
    for (int t = 0; t < NT; t++) {
        _mm256_store_ps(total[t], _mm256_setzero_ps());
        _mm256_store_ps(total[t] + 8, _mm256_setzero_ps());
    }
    for (ptrdiff_t c0 = 0; c0 < n_chunks; c0 += per) {
        const float* nr = nrow + ((c0 * C) >> g_shift);
        for (int h = 0; h < 2; h++) {
            __m256i a0[NC_I2_MM_TOKENS], a1[NC_I2_MM_TOKENS];
            for (int t = 0; t < NT; t++) a0[t] = a1[t] = _mm256_setzero_si256();
            for (ptrdiff_t c = c0; c < c0 + per; c++) {
                __m256i v = NC_I2_FN(nc_cqi2_load_half)(row + c * 32 + 16 * h, end);
                const int16_t* zc = z + c * C + 16 * h;
                for (int st = 0; st < S; st++) {
                    __m256i w0, w1;
                    NC_I2_FN(nc_cqi2_decode)(v, k->plane_lo, k->plane_hi, k->nibble, &w0, &w1);
                    v = _mm256_srli_epi16(v, fb);
                    for (int t = 0; t < NT; t++) {
                        const int16_t* zt = zc + t * z_stride + 32 * st;
                        a0[t] = NC_I2_DPW(a0[t], w0, NC_I2_FN(nc_cqi2_codes)(zt));
                        a1[t] = NC_I2_DPW(a1[t], w1, NC_I2_FN(nc_cqi2_codes)(zt + 8));
                    }
                }
            }
            const __m256 nv = NC_I2_FN(nc_cqi2_norms)(nr, g, C, h, k);
            for (int t = 0; t < NT; t++)
                _mm256_store_ps(total[t] + 8 * h, NC_I2_FN(nc_cqi2_flush)(a0[t], a1[t], k->base, nv,
                                                                         _mm256_load_ps(total[t] + 8 * h)));
        }
    }
    for (int t = 0; t < NT; t++)
        y[t * y_stride] = NC_I2_FN(nc_cqi2_hsum16)(_mm256_load_ps(total[t]), _mm256_load_ps(total[t] + 8))
                          * (s[t] * descale);
}

#define NC_I2_MM_CASE(FB, N) case N: NC_I2_FN(nc_cqi2_mm_tile)(packed + r * row_bytes, end, norms + r * norm_stride, \
    zt, z_stride, n_chunks, g, &k, s + t0, descale, Y + t0 * y_stride + r, y_stride, FB, N); break;
#define NC_I2_MM_SWITCH(FB) switch (nt) { NC_I2_MM_CASE(FB, 1) NC_I2_MM_CASE(FB, 2) NC_I2_MM_CASE(FB, 3) \
    default: NC_I2_MM_CASE(FB, 4) }

/* Y[t·y_stride + r] for rows r0 ≤ r < r1 and tokens 0 ≤ t < n_tokens: token tiles
   outside (their codes stay in L1 while the rows stream past), rows inside. */
static __attribute__((target(NC_I2_TGT))) void NC_I2_FN(nc_cqi2_mm_rows)(
        const uint8_t* packed, ptrdiff_t row_bytes, const uint8_t* end, const float* norms,
        ptrdiff_t norm_stride, const int16_t* z, ptrdiff_t z_stride, ptrdiff_t n_tokens, ptrdiff_t n_chunks,
        int fb, int g, const int16_t* table, float base, const float* s, float descale,
        ptrdiff_t r0, ptrdiff_t r1, float* Y, ptrdiff_t y_stride) {
    const int ifb = fb == 1 ? 1 : (fb == 2 ? 2 : 4);
    const NC_I2_FN(nc_cqi2_consts) k = NC_I2_FN(nc_cqi2_setup)(table, base, ifb, g);
    for (ptrdiff_t t0 = 0; t0 < n_tokens; t0 += NC_I2_MM_TOKENS) {
        const int nt = (int)(n_tokens - t0 < NC_I2_MM_TOKENS ? n_tokens - t0 : NC_I2_MM_TOKENS);
        const int16_t* zt = z + t0 * z_stride;
        for (ptrdiff_t r = r0; r < r1; r++) {
            if (ifb == 1) { NC_I2_MM_SWITCH(1) }
            else if (ifb == 2) { NC_I2_MM_SWITCH(2) }
            else { NC_I2_MM_SWITCH(4) }
        }
    }
}
#undef NC_I2_MM_SWITCH
#undef NC_I2_MM_CASE

#undef NC_I2_AI
#undef NC_I2_FN
#undef NC_I2_CAT
#undef NC_I2_CAT2
