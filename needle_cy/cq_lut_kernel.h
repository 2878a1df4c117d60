/* 2-bit CQ products on A8 inputs by table lookup (T-MAC style), AVX-512 F.

   Included once by _cq.pyx (kernel 7, "avx512lut").  See the module docstring of
   _cq.pyx for where it runs; needle_cy.reference.cq.matmul_lut is its executable
   specification, and every function here is tested against it bit for bit.

   What it computes.  For one token with A8 scale s and exactly rotated codes z
   (integers, |z| ≤ 127·g, held as floats), pair p of a row (fields 2p and 2p+1,
   the low and high half of a nibble of the packed row) has the table
       tab_p[e] = fma(cb[e >> 2], z[2p+1], cb[e & 3]·z[2p])      e = 0 … 15
   (16 floats, 64 bytes; 24 KB for 768 inputs), made once per token and shared by
   every row and every matrix that shares the input.  Row r then sums, per group γ,
       a[k & 3] += tab_p[nibble p of r]   for the group's dwords d in order and the
                                          nibbles k = 0 … 7 of each (p = 8d + k)
       u_γ = (a0 + a1) + (a2 + a3),   acc = fma(ν_γ, u_γ, acc) over γ in order,
       y = acc · (s · descale),        descale = float32(1/√g),
   the same float steps for every row whatever block, tile or thread computes it,
   and within float32 rounding of the float kernels (any 4-entry codebook: 2 bits
   and ternary).

   Why it is fast.  One vpermps looks up 16 rows at once (its index is the low 4
   bits of each dword), so each 32-bit lane of the layout holds one row and the
   rows of a 16-row block are interleaved.  Per 16 rows × 2 fields: a shift, a
   vpermps and an add, where the two-product integer kernel spends per row and 32
   fields 2 vpermw, 2 vpdpwssd and a shift: measured 1.7× its speed (768x768 and
   16384x768 matvec, one thread, Zen 4).  (Integer tables of ±z sums over sign
   planes are faster still, 2.1×, but exact only for a symmetric codebook, and the
   2-bit Lloyd–Max codebook is not: cb0 + cb3 ≠ 0.)

   Layout (made once by nc_cql_relayout when the engine enables it; the .cact
   mapping is left as it is):
     bits  [row block][dword d of the row][16 rows]  uint32: packed bytes 4d … 4d+3
     norms [row block][group][16 rows]               float32
   rows past the last are zero (their lanes are computed and never stored). */

#define NC_CQL_TGT "avx512f,avx512bw,avx512vl,prfchw"
#define NC_CQL_AI static inline __attribute__((always_inline, target(NC_CQL_TGT)))
#define NC_CQL_FN static __attribute__((target(NC_CQL_TGT)))
/* tokens per matmul tile: a token's 5 accumulators × 4 and the weight vectors fit
   the 32 registers */
#define NC_CQL_MM_TOKENS 4
/* weight bytes prefetched ahead of the block being read (every step streams all
   matrices from DRAM; the layout is one sequential stream per row range) */
#ifndef NC_CQL_PF_BYTES
#define NC_CQL_PF_BYTES 2048
#endif

/* The lookup layout of a matrix of 2-bit fields (portable C; bits and pnorms zeroed
   by the caller, sized for ceil(rows/16) blocks).  packed: rows × row_bytes with
   row_bytes = 4·n_dw; norms: float32 rows × norm_stride. */
static void nc_cql_relayout(const uint8_t* packed, ptrdiff_t row_bytes, ptrdiff_t rows, ptrdiff_t n_dw,
                            const float* norms, ptrdiff_t norm_stride, ptrdiff_t n_groups,
                            uint32_t* bits, float* pnorms) {
    for (ptrdiff_t r = 0; r < rows; r++) {
        const ptrdiff_t rb = r / 16, lane = r % 16;
        uint32_t* out = bits + rb * n_dw * 16 + lane;
        for (ptrdiff_t d = 0; d < n_dw; d++) {
            const uint8_t* b = packed + r * row_bytes + 4 * d;
            out[d * 16] = (uint32_t)b[0] | ((uint32_t)b[1] << 8) | ((uint32_t)b[2] << 16) | ((uint32_t)b[3] << 24);
        }
        for (ptrdiff_t g = 0; g < n_groups; g++)
            pnorms[(rb * n_groups + g) * 16 + lane] = norms[r * norm_stride + g];
    }
}

/* The tables of one token: tab[16·p + e] = fma(cb[e >> 2], z[2p+1], cb[e & 3]·z[2p])
   for 0 ≤ p < n/2 (z = kf[0:n], the rotated codes). */
NC_CQL_AI void nc_cql_tables_inl(const float* kf, ptrdiff_t n, const float* codebook, float* tab) {
    float lo[16], hi[16];
    for (int e = 0; e < 16; e++) { lo[e] = codebook[e & 3]; hi[e] = codebook[e >> 2]; }
    const __m512 cl = _mm512_loadu_ps(lo), ch = _mm512_loadu_ps(hi);
    for (ptrdiff_t p = 0; 2 * p < n; p++) {
        /* the tables were evicted by the weights streamed since they were last made:
           ask for the lines to write 16 tables (1 KB) ahead, or each store waits for
           its line (store-bound: 6 % of a 2-thread decode step, all on thread 0) */
        __builtin_prefetch(tab + 16 * p + 256, 1, 3);
        _mm512_storeu_ps(tab + 16 * p, _mm512_fmadd_ps(ch, _mm512_set1_ps(kf[2 * p + 1]),
                                                       _mm512_mul_ps(cl, _mm512_set1_ps(kf[2 * p]))));
    }
}

NC_CQL_FN void nc_cql_tables(const float* kf, ptrdiff_t n, const float* codebook, float* tab) {
    nc_cql_tables_inl(kf, n, codebook, tab);
}

/* u of one group of a 16-row block: wb its first dword vector, tab its first pair's table. */
NC_CQL_AI __m512 nc_cql_group(const uint32_t* wb, const float* tab, int dpg) {
    __m512 a[4];
    for (int j = 0; j < 4; j++) a[j] = _mm512_setzero_ps();
    for (int d = 0; d < dpg; d++, wb += 16) {
        __m512i v = _mm512_loadu_si512((const void*)wb);
        _mm_prefetch((const char*)wb + NC_CQL_PF_BYTES, _MM_HINT_T0);
        const float* t = tab + d * 128;
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++) {
            a[k & 3] = _mm512_add_ps(a[k & 3], _mm512_permutexvar_ps(v, _mm512_loadu_ps(t + 16 * k)));
            v = _mm512_srli_epi32(v, 4);
        }
    }
    return _mm512_add_ps(_mm512_add_ps(a[0], a[1]), _mm512_add_ps(a[2], a[3]));
}

/* One token's sum of a 16-row block (before the scale). */
NC_CQL_AI __m512 nc_cql_block(const uint32_t* wb, const float* nb, const float* tab, ptrdiff_t n_groups,
                             int dpg) {
    __m512 acc = _mm512_setzero_ps();
    for (ptrdiff_t g = 0; g < n_groups; g++)
        acc = _mm512_fmadd_ps(_mm512_loadu_ps(nb + 16 * g), nc_cql_group(wb + g * dpg * 16, tab + g * dpg * 128, dpg), acc);
    return acc;
}

/* lanes [lo, hi) of a block whose first row is r */
static inline __mmask16 nc_cql_lanes(ptrdiff_t r, ptrdiff_t r0, ptrdiff_t r1) {
    const ptrdiff_t lo = r0 > r ? r0 - r : 0, hi = r1 < r + 16 ? r1 - r : 16;
    return (__mmask16)(((1u << hi) - 1u) & ~((1u << lo) - 1u));
}

/* y[r] for r0 ≤ r < r1 (one token; tab its tables, scale = s·descale). */
NC_CQL_FN void nc_cql_rows(const uint32_t* bits, const float* pnorms, ptrdiff_t n_dw, ptrdiff_t n_groups,
                           int g, const float* tab, float scale, ptrdiff_t r0, ptrdiff_t r1, float* y) {
    const int dpg = g / 16;
    const __m512 sc = _mm512_set1_ps(scale);
    for (ptrdiff_t rb = r0 / 16; 16 * rb < r1; rb++) {
        const __m512 acc = nc_cql_block(bits + rb * n_dw * 16, pnorms + rb * n_groups * 16, tab, n_groups, dpg);
        _mm512_mask_storeu_ps(y + 16 * rb, nc_cql_lanes(16 * rb, r0, r1), _mm512_mul_ps(acc, sc));
    }
}

/* NT ≤ NC_CQL_MM_TOKENS tokens of one 16-row block: each token's lanes take exactly
   nc_cql_block's steps (so a token's outputs are bitwise the matvec's); the weight
   vector and its shifts are shared by the tokens. */
NC_CQL_AI void nc_cql_mm_tile(const uint32_t* wb, const float* nb, const float* tab, ptrdiff_t tab_stride,
                              ptrdiff_t n_groups, int dpg, const float* s, float descale, float* Y,
                              ptrdiff_t y_stride, ptrdiff_t r, __mmask16 lanes, const int NT) {
    __m512 acc[NC_CQL_MM_TOKENS];
    for (int t = 0; t < NT; t++) acc[t] = _mm512_setzero_ps();
    for (ptrdiff_t g = 0; g < n_groups; g++) {
        __m512 a[NC_CQL_MM_TOKENS][4];
        for (int t = 0; t < NT; t++)
            for (int j = 0; j < 4; j++) a[t][j] = _mm512_setzero_ps();
        for (int d = 0; d < dpg; d++, wb += 16) {
            __m512i v = _mm512_loadu_si512((const void*)wb);
            const float* td = tab + (g * dpg + d) * 128;
#pragma GCC unroll 8
            for (int k = 0; k < 8; k++) {
                for (int t = 0; t < NT; t++)
                    a[t][k & 3] = _mm512_add_ps(a[t][k & 3],
                                                _mm512_permutexvar_ps(v, _mm512_loadu_ps(td + t * tab_stride + 16 * k)));
                v = _mm512_srli_epi32(v, 4);
            }
        }
        const __m512 nv = _mm512_loadu_ps(nb + 16 * g);
        for (int t = 0; t < NT; t++)
            acc[t] = _mm512_fmadd_ps(nv, _mm512_add_ps(_mm512_add_ps(a[t][0], a[t][1]),
                                                       _mm512_add_ps(a[t][2], a[t][3])), acc[t]);
    }
    for (int t = 0; t < NT; t++)
        _mm512_mask_storeu_ps(Y + t * y_stride + r, lanes, _mm512_mul_ps(acc[t], _mm512_set1_ps(s[t] * descale)));
}

/* Tokens per tile whose tables fit in scratch_floats floats (0: not one token's). */
static inline ptrdiff_t nc_cql_tile_tokens(ptrdiff_t n_dw, ptrdiff_t scratch_floats) {
    const ptrdiff_t fit = scratch_floats / (128 * n_dw);
    return fit < NC_CQL_MM_TOKENS ? fit : NC_CQL_MM_TOKENS;
}

/* The tables of nt ≤ NC_CQL_MM_TOKENS tokens (rotated codes kf, one every kf_stride
   floats) for rows of n_dw dwords: token t's at tab + t·128·n_dw. */
NC_CQL_FN void nc_cql_tile_tables(const float* kf, ptrdiff_t kf_stride, ptrdiff_t n_dw, const float* codebook,
                                  int nt, float* tab) {
    for (int t = 0; t < nt; t++)
        nc_cql_tables_inl(kf + t * kf_stride, 16 * n_dw, codebook, tab + t * 128 * n_dw);
}

/* Rows r0 ≤ r < r1 of the nt tokens whose tables nc_cql_tile_tables made
   (Y[t·y_stride + r]; s[t] their A8 scales). */
NC_CQL_FN void nc_cql_tile_rows(const uint32_t* bits, const float* pnorms, ptrdiff_t n_dw, ptrdiff_t n_groups,
                                int g, const float* tab, int nt, const float* s, float descale,
                                ptrdiff_t r0, ptrdiff_t r1, float* Y, ptrdiff_t y_stride) {
    const int dpg = g / 16;
    const ptrdiff_t per_token = 128 * n_dw;
    for (ptrdiff_t rb = r0 / 16; 16 * rb < r1; rb++) {
        const uint32_t* wb = bits + rb * n_dw * 16;
        const float* nb = pnorms + rb * n_groups * 16;
        const __mmask16 lanes = nc_cql_lanes(16 * rb, r0, r1);
        switch (nt) {
        case 1: nc_cql_mm_tile(wb, nb, tab, per_token, n_groups, dpg, s, descale, Y, y_stride, 16 * rb, lanes, 1); break;
        case 2: nc_cql_mm_tile(wb, nb, tab, per_token, n_groups, dpg, s, descale, Y, y_stride, 16 * rb, lanes, 2); break;
        case 3: nc_cql_mm_tile(wb, nb, tab, per_token, n_groups, dpg, s, descale, Y, y_stride, 16 * rb, lanes, 3); break;
        default: nc_cql_mm_tile(wb, nb, tab, per_token, n_groups, dpg, s, descale, Y, y_stride, 16 * rb, lanes, 4); break;
        }
    }
}

/* Y[t·y_stride + r] for r0 ≤ r < r1 and 0 ≤ t < n_tokens, from the tokens' rotated
   codes (kf: token 0's, one token every kf_stride floats; s[t] their A8 scales).  A
   tile of up to NC_CQL_MM_TOKENS tokens gets its tables in scratch (scratch_floats
   floats, 8·cols_padded per token: in L2 while the row blocks stream past), made by
   every thread that runs a share of the rows: making them costs about what 3 row
   blocks of lookups do, and written out for a whole chunk they left L2 (64 tokens
   × 24 KB) and were read back from L3 (that was 17 % of a prefill).  Without room
   for one token (scratch NULL) each group's tables are made on the stack for each
   row block: the same bits, slowly. */
NC_CQL_FN void nc_cql_mm_rows(const uint32_t* bits, const float* pnorms, ptrdiff_t n_dw, ptrdiff_t n_groups,
                              int g, const float* kf, ptrdiff_t kf_stride, const float* codebook,
                              ptrdiff_t n_tokens, const float* s, float descale, ptrdiff_t r0, ptrdiff_t r1,
                              float* Y, ptrdiff_t y_stride, float* scratch, ptrdiff_t scratch_floats) {
    const int dpg = g / 16;
    const ptrdiff_t per_token = 128 * n_dw;          /* table floats of one token */
    const ptrdiff_t fit = scratch ? nc_cql_tile_tokens(n_dw, scratch_floats) : 0;
    if (fit < 1) {
        __attribute__((aligned(64))) float tab[128 * 16];   /* one group (≤ 256 fields) */
        for (ptrdiff_t t = 0; t < n_tokens; t++) {
            const __m512 sc = _mm512_set1_ps(s[t] * descale);
            for (ptrdiff_t rb = r0 / 16; 16 * rb < r1; rb++) {
                __m512 acc = _mm512_setzero_ps();
                for (ptrdiff_t gi = 0; gi < n_groups; gi++) {
                    nc_cql_tables_inl(kf + t * kf_stride + gi * g, g, codebook, tab);
                    acc = _mm512_fmadd_ps(_mm512_loadu_ps(pnorms + (rb * n_groups + gi) * 16),
                                          nc_cql_group(bits + (rb * n_dw + gi * dpg) * 16, tab, dpg), acc);
                }
                _mm512_mask_storeu_ps(Y + t * y_stride + 16 * rb, nc_cql_lanes(16 * rb, r0, r1), _mm512_mul_ps(acc, sc));
            }
        }
        return;
    }
    for (ptrdiff_t t0 = 0; t0 < n_tokens; t0 += fit) {
        const ptrdiff_t left = n_tokens - t0;
        const int nt = (int)(left < fit ? left : fit);
        nc_cql_tile_tables(kf + t0 * kf_stride, kf_stride, n_dw, codebook, nt, scratch);
        nc_cql_tile_rows(bits, pnorms, n_dw, n_groups, g, scratch, nt, s + t0, descale, r0, r1,
                         Y + t0 * y_stride, y_stride);
    }
}

#undef NC_CQL_FN
#undef NC_CQL_AI
#undef NC_CQL_TGT
