/* 2- and 4-bit CQ products on A8 inputs by table lookup (T-MAC style), AVX-512 F/BW.

   fb (2 or 4) is the field width the rows are read in.  Everything below is written
   for fb 2, where a nibble of the packed row is a pair of fields; at fb 4 a nibble is
   one field j, its table is q_j[e] = rint((cb[e]·z[j]) · S) and M = max_j |z[j]|,
   and a dword holds 8 fields instead of 16 (dwords per group g·fb/32).  The lookups,
   the layout and the sums are the same code.

   Included once, by cq_dispatch.h (kernel 7, "avx512lut"; x86 builds only).  See the module docstring of
   _cq.pyx for where it runs; needle_cy.reference.cq.matmul_lut is its executable
   specification, and every function here is tested against it bit for bit.

   What it computes.  For one token with A8 scale s and exactly rotated codes z
   (integers, |z| ≤ 127·g, held as floats), pair p of a row (fields 2p and 2p+1,
   the low and high half of a nibble of the packed row) has the table
       f_p[e] = fma(cb[e >> 2], z[2p+1], cb[e & 3]·z[2p])      e = 0 … 15  (float32)
       q_p[e] = rint(f_p[e] · S)                                (int16)
   where S = 2^k is the token's one table scale, the largest power of two with
   max|cb| · M · S ≤ 32767, M = max_p (|z[2p]| + |z[2p+1]|) (S = 1 when that is 0):
   every entry fits an int16 and keeps 14–15 bits.  Made once per token (12 KB for
   768 inputs), shared by every row and every matrix that shares the input.  Row r
   then sums, per group γ, the entries of its nibbles exactly (int32),
       acc = fma(ν_γ, float32(Σ_γ q), acc) over γ in order,
       y = acc · ((s · descale) · 2^-k),   descale = float32(1/√g),
   the same steps for every row whatever block, tile, thread or instruction set
   computes it.  The table rounding costs a relative error of about 2^-15 of the
   token's largest entry per lookup (about 1e-5 of a row's value, against the A8
   input's 4e-3); any 4-entry codebook (2 bits and ternary).

   Why it is fast.  One vpermw looks up 32 words: for 16 rows, the low word of a
   row's dword holds pairs 8d … 8d+3 and the high word pairs 8d+4 … 8d+7, and step k
   looks up pair 8d+k in the low words and 8d+4+k in the high words at once (32
   entries: the two pairs' tables side by side, the index bit 4 set in the high
   words).  vpdpwssd against ones then adds each row's two words into its int32
   lane.  Per 16 rows × 4 fields: a shift, a ternary op, a vpermw and a vpdpwssd
   (vpmaddwd + vpaddd without VNNI), against a shift, a vpermps and a float add per
   16 rows × 2 fields for float32 tables (an earlier form of this kernel): about twice
   its speed from L2 and from L3 (benchmarks/history/cq.md), and half its table bytes.  (Integer tables of ±z sums over sign planes would need a
   symmetric codebook, and the 2-bit Lloyd–Max codebook is not: cb0 + cb3 ≠ 0.)

   Layout (made once by nc_cql_relayout when the engine enables it; the .cact
   mapping is left as it is):
     bits  [row block][dword d of the row][16 rows]  uint32: packed bytes 4d … 4d+3
     norms [row block][group][16 rows]               float32
   rows past the last are zero (their lanes are computed and never stored).
   Tables of one token (nc_cql_table_floats(n_dw) floats, 64-byte aligned by the
   caller): a 16-float header (float 0: 2^-k), then per dword d and step k the 32
   int16 entries [q_{8d+k}[0:16], q_{8d+4+k}[0:16]]. */

#ifndef NEEDLE_CY_CQ_LUT_H
#define NEEDLE_CY_CQ_LUT_H

#include "cpu_features.h"

#if defined(NC_CQ_X86)
#define NC_CQ_HAVE_LUT 1

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

/* Which row loops run, and so which table layout the tables take (read once, or set
   by _cq.lut_dot for a test): NC_CQL_VBMI (cq_lut_bytes_tmpl.h, byte tables) where the CPU
   has AVX-512 VBMI and VNNI (cpu_features.h), else NC_CQL_VNNI (vpdpwssd), else NC_CQL_BW (vpmaddwd +
   vpaddd); the last two read int16 tables (cq_lut_rows_tmpl.h).  The same bits all three. */
#define NC_CQL_BW 0
#define NC_CQL_VNNI 1
#define NC_CQL_VBMI 2
static int nc_cql_dot = -1;
static inline int nc_cql_dot_mode(void) {
    if (nc_cql_dot < 0)
        nc_cql_dot = nc_cq_cpu_has_avx512vbmi() ? NC_CQL_VBMI : (nc_cq_cpu_has_avx512vnni() ? NC_CQL_VNNI : NC_CQL_BW);
    return nc_cql_dot;
}
/* the matmul's row loops: the int16 tables always (VBMI's take VNNI's, see cq_lut_bytes_tmpl.h) */
static inline int nc_cql_mm_dot(void) { return nc_cql_dot_mode() == NC_CQL_VBMI ? NC_CQL_VNNI : nc_cql_dot_mode(); }

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

/* Floats of one token's tables for rows of n_dw dwords (the header, then the entries). */
static inline ptrdiff_t nc_cql_table_floats(ptrdiff_t n_dw) { return 16 + 64 * n_dw; }

static inline const int16_t* nc_cql_entries(const float* tab) { return (const int16_t*)(tab + 16); }

/* The table scale S = 2^k of a token (kf[0:n], n even): the largest power of two with
   max|cb| · M · S ≤ 32767 (max over the 16 codewords), M = max_p |kf[2p]| + |kf[2p+1]|
   for 2-bit fields (fb 2: a nibble is a pair), max_j |kf[j]| for 4-bit ones (fb 4: a
   nibble is a field); exact (small integers).  1 when that product is 0.  k is kept
   within [-126, 100] (a float, never reached by A8 codes). */
NC_CQL_FN float nc_cql_token_scale(const float* kf, ptrdiff_t n, const float* codebook, int fb) {
    float m = 0.0f, cbmax = 0.0f;
    int e;
    ptrdiff_t j = 0;
    /* 8 pairs a vector: each lane plus its neighbour (both lanes of a pair get the pair's
       sum), or 16 fields; the maximum is exact whatever the order (as a scalar loop it
       was a visible part of a prefill) */
    __m512 vm = _mm512_setzero_ps();
    if (fb == 2) {
        for (; j + 16 <= n; j += 16) {
            const __m512 v = _mm512_abs_ps(_mm512_loadu_ps(kf + j));
            vm = _mm512_max_ps(vm, _mm512_add_ps(v, _mm512_permute_ps(v, 0xB1)));
        }
        m = _mm512_reduce_max_ps(vm);
        for (; j + 1 < n; j += 2) {
            const float v = fabsf(kf[j]) + fabsf(kf[j + 1]);
            m = v > m ? v : m;
        }
    } else {
        for (; j + 16 <= n; j += 16) vm = _mm512_max_ps(vm, _mm512_abs_ps(_mm512_loadu_ps(kf + j)));
        m = _mm512_reduce_max_ps(vm);
        for (; j < n; j++) m = fabsf(kf[j]) > m ? fabsf(kf[j]) : m;
    }
    for (int i = 0; i < 16; i++) cbmax = fabsf(codebook[i]) > cbmax ? fabsf(codebook[i]) : cbmax;
    if (!(m > 0.0f && cbmax > 0.0f)) return 1.0f;
    frexp(32767.0 / ((double)cbmax * (double)m), &e);     /* 2^(e-1) ≤ limit < 2^e */
    e = e - 1 < -126 ? -126 : (e - 1 > 100 ? 100 : e - 1);
    return ldexpf(1.0f, e);
}

/* The int16 entries of the nibbles [0, n·fb/4) of a token at table scale S (kf[0:n], n
   a multiple of 32/fb: whole dwords), in the layout above (bytes = 0) or split into
   low and high bytes for the VBMI row loops (bytes = 1, cq_lut_bytes_tmpl.h): nibble p is
   pair p (fields 2p, 2p+1) at fb 2, field p at fb 4. */
NC_CQL_AI void nc_cql_entries_at(const float* kf, ptrdiff_t n, const float* codebook, int fb, float S,
                                 int16_t* out, int bytes) {
    const __m512 vs = _mm512_set1_ps(S);
    const ptrdiff_t n_nib = fb == 2 ? n / 2 : n;
    float lo[16], hi[16];
    for (int e = 0; e < 16; e++) { lo[e] = codebook[e & 3]; hi[e] = codebook[e >> 2]; }
    const __m512 cl = _mm512_loadu_ps(fb == 2 ? lo : codebook), ch = _mm512_loadu_ps(hi);
    for (ptrdiff_t p = 0; p < n_nib; p++) {
        const ptrdiff_t d = p / 8, k = p % 8;
        const __m512 f = fb == 2
            ? _mm512_fmadd_ps(ch, _mm512_set1_ps(kf[2 * p + 1]), _mm512_mul_ps(cl, _mm512_set1_ps(kf[2 * p])))
            : _mm512_mul_ps(cl, _mm512_set1_ps(kf[p]));
        const __m512i q = _mm512_cvtps_epi32(_mm512_mul_ps(f, vs));
        /* the tables were evicted by the weights streamed since they were last made:
           ask for the lines 1 KB ahead, or each store waits for its line */
        if (bytes) {
            uint8_t* at = (uint8_t*)out + d * 256 + 128 * (k & 1) + 16 * (k >> 1);
            __builtin_prefetch(at + 1024, 1, 3);
            _mm_storeu_si128((__m128i*)at, _mm512_cvtepi32_epi8(q));
            _mm_storeu_si128((__m128i*)(at + 64), _mm512_cvtepi32_epi8(_mm512_srai_epi32(q, 8)));
        } else {
            int16_t* at = out + (d * 4 + (k & 3)) * 32 + (k >= 4 ? 16 : 0);
            __builtin_prefetch(at + 512, 1, 3);
            _mm256_storeu_si256((__m256i*)at, _mm512_cvtepi32_epi16(q));
        }
    }
}

/* The tables of one token (kf[0:n], n = n_dw·32/fb): header and entries. */
NC_CQL_AI void nc_cql_tables_inl(const float* kf, ptrdiff_t n, const float* codebook, int fb, float* tab,
                                 int bytes) {
    const float S = nc_cql_token_scale(kf, n, codebook, fb);
    for (int i = 0; i < 16; i++) tab[i] = 0.0f;
    tab[0] = 1.0f / S;                                   /* exact: a power of two */
    nc_cql_entries_at(kf, n, codebook, fb, S, (int16_t*)(tab + 16), bytes);
}

NC_CQL_FN void nc_cql_tables(const float* kf, ptrdiff_t n, const float* codebook, int fb, float* tab) {
    nc_cql_tables_inl(kf, n, codebook, fb, tab, nc_cql_dot_mode() == NC_CQL_VBMI);
}

/* lanes [lo, hi) of a block whose first row is r */
static inline __mmask16 nc_cql_lanes(ptrdiff_t r, ptrdiff_t r0, ptrdiff_t r1) {
    const ptrdiff_t lo = r0 > r ? r0 - r : 0, hi = r1 < r + 16 ? r1 - r : 16;
    return (__mmask16)(((1u << hi) - 1u) & ~((1u << lo) - 1u));
}

/* The row-block loop of one token's matvec, shared by the row loops of every instruction
   set: per 16-row block, acc = fma(ν_γ, GROUP_SUMS(the group's first dword vector, its
   first table entry, dpg), acc) over the groups γ in order, then y = acc · sc in lanes
   [r0, r1).  Expects bits, pnorms, n_dw, n_groups, dpg, sc, r0, r1 and y in scope; t: the
   token's entries, per_group: entries per group. */
#define NC_CQL_ROW_BLOCKS(GROUP_SUMS, t, per_group)                                                  \
    for (ptrdiff_t rb = r0 / 16; 16 * rb < r1; rb++) {                                             \
        const uint32_t* wb = bits + rb * n_dw * 16;                                                 \
        const float* nb = pnorms + rb * n_groups * 16;                                              \
        __m512 acc = _mm512_setzero_ps();                                                           \
        for (ptrdiff_t gi = 0; gi < n_groups; gi++)                                                 \
            acc = _mm512_fmadd_ps(_mm512_loadu_ps(nb + 16 * gi),                                    \
                                  GROUP_SUMS(wb + gi * dpg * 16, (t) + gi * (per_group), dpg), acc); \
        _mm512_mask_storeu_ps(y + 16 * rb, nc_cql_lanes(16 * rb, r0, r1), _mm512_mul_ps(acc, sc));  \
    }

/* the row loops, once per instruction set (cq_lut_rows_tmpl.h) */
#define NC_CQL_SUF vnni
#define NC_CQL_RTGT "avx512f,avx512bw,avx512vl,avx512vnni,prfchw"
#define NC_CQL_DOT(acc, x) _mm512_dpwssd_epi32(acc, x, ones)
#include "cq_lut_rows_tmpl.h"
#undef NC_CQL_SUF
#undef NC_CQL_RTGT
#undef NC_CQL_DOT
#define NC_CQL_SUF bw
#define NC_CQL_RTGT NC_CQL_TGT
#define NC_CQL_DOT(acc, x) _mm512_add_epi32(acc, _mm512_madd_epi16(x, ones))
#include "cq_lut_rows_tmpl.h"
#undef NC_CQL_SUF
#undef NC_CQL_RTGT
#undef NC_CQL_DOT

#include "cq_lut_bytes_tmpl.h"

/* y[r] for r0 ≤ r < r1 (one token; tab its tables, scale = s·descale). */
static void nc_cql_rows(const uint32_t* bits, const float* pnorms, ptrdiff_t n_dw, ptrdiff_t n_groups,
                        int g, int fb, const float* tab, float scale, ptrdiff_t r0, ptrdiff_t r1, float* y) {
    switch (nc_cql_dot_mode()) {
    case NC_CQL_VBMI: nc_cql_rows_vbmi(bits, pnorms, n_dw, n_groups, g, fb, tab, scale, r0, r1, y); break;
    case NC_CQL_VNNI: nc_cql_rows_vnni(bits, pnorms, n_dw, n_groups, g, fb, tab, scale, r0, r1, y); break;
    default: nc_cql_rows_bw(bits, pnorms, n_dw, n_groups, g, fb, tab, scale, r0, r1, y); break;
    }
}

/* Rows r0 ≤ r < r1 of the nt ≤ NC_CQL_MM_TOKENS tokens whose tables nc_cql_tile_tables
   made (Y[t·y_stride + r]; s[t] their A8 scales). */
static void nc_cql_tile_rows(const uint32_t* bits, const float* pnorms, ptrdiff_t n_dw, ptrdiff_t n_groups,
                             int g, int fb, const float* tab, int nt, const float* s, float descale,
                             ptrdiff_t r0, ptrdiff_t r1, float* Y, ptrdiff_t y_stride) {
    switch (nc_cql_mm_dot()) {
    case NC_CQL_VNNI:
        nc_cql_tile_rows_vnni(bits, pnorms, n_dw, n_groups, g, fb, tab, nt, s, descale, r0, r1, Y, y_stride); break;
    default:
        nc_cql_tile_rows_bw(bits, pnorms, n_dw, n_groups, g, fb, tab, nt, s, descale, r0, r1, Y, y_stride); break;
    }
}

/* Tokens per tile whose tables fit in scratch_floats floats (0: not one token's). */
static inline ptrdiff_t nc_cql_tile_tokens(ptrdiff_t n_dw, ptrdiff_t scratch_floats) {
    const ptrdiff_t fit = scratch_floats / nc_cql_table_floats(n_dw);
    return fit < NC_CQL_MM_TOKENS ? fit : NC_CQL_MM_TOKENS;
}

/* The tables of nt ≤ NC_CQL_MM_TOKENS tokens (rotated codes kf, one every kf_stride
   floats) for rows of n_dw dwords: token t's at tab + t·nc_cql_table_floats(n_dw). */
NC_CQL_FN void nc_cql_tile_tables(const float* kf, ptrdiff_t kf_stride, ptrdiff_t n_dw, const float* codebook,
                                  int fb, int nt, float* tab) {
    for (int t = 0; t < nt; t++)
        nc_cql_tables_inl(kf + t * kf_stride, 32 / fb * n_dw, codebook, fb, tab + t * nc_cql_table_floats(n_dw), 0);
}

/* Y[t·y_stride + r] for r0 ≤ r < r1 and 0 ≤ t < n_tokens, from the tokens' rotated
   codes (kf: token 0's, one token every kf_stride floats; s[t] their A8 scales).  A
   tile of up to NC_CQL_MM_TOKENS tokens gets its tables in scratch (scratch_floats
   floats, 4·cols_padded per token: in L2 while the row blocks stream past), made by
   every thread that runs a share of the rows: making them costs about what 3 row
   blocks of lookups do, and written out for a whole chunk they left L2 and were
   read back from L3, a large share of a prefill.  Without room for one token
   (scratch NULL) each group's tables are made on the stack for each row block, at
   the token's one scale: the same bits, slowly. */
NC_CQL_FN void nc_cql_mm_rows(const uint32_t* bits, const float* pnorms, ptrdiff_t n_dw, ptrdiff_t n_groups,
                              int g, int fb, const float* kf, ptrdiff_t kf_stride, const float* codebook,
                              ptrdiff_t n_tokens, const float* s, float descale, ptrdiff_t r0, ptrdiff_t r1,
                              float* Y, ptrdiff_t y_stride, float* scratch, ptrdiff_t scratch_floats) {
    const ptrdiff_t fit = scratch ? nc_cql_tile_tokens(n_dw, scratch_floats) : 0;
    if (fit < 1) {
        /* one group's entries (≤ 256 fields: 32 dwords at 4 bits) */
        __attribute__((aligned(64))) int16_t entries[128 * 32];
        for (ptrdiff_t t = 0; t < n_tokens; t++) {
            const float* z = kf + t * kf_stride;
            const float S = nc_cql_token_scale(z, 32 / fb * n_dw, codebook, fb);
            const float scale = (s[t] * descale) * (1.0f / S);
            switch (nc_cql_mm_dot()) {
            case NC_CQL_VNNI:
                nc_cql_rows_by_group_vnni(bits, pnorms, n_dw, n_groups, g, fb, z, codebook, S, scale, r0, r1,
                                          Y + t * y_stride, entries); break;
            default:
                nc_cql_rows_by_group_bw(bits, pnorms, n_dw, n_groups, g, fb, z, codebook, S, scale, r0, r1,
                                        Y + t * y_stride, entries); break;
            }
        }
        return;
    }
    for (ptrdiff_t t0 = 0; t0 < n_tokens; t0 += fit) {
        const ptrdiff_t left = n_tokens - t0;
        const int nt = (int)(left < fit ? left : fit);
        nc_cql_tile_tables(kf + t0 * kf_stride, kf_stride, n_dw, codebook, fb, nt, scratch);
        nc_cql_tile_rows(bits, pnorms, n_dw, n_groups, g, fb, scratch, nt, s + t0, descale, r0, r1,
                         Y + t0 * y_stride, y_stride);
    }
}

#undef NC_CQL_ROW_BLOCKS
#undef NC_CQL_FN
#undef NC_CQL_AI
#undef NC_CQL_TGT

#endif  /* NC_CQ_X86 */

#endif  /* NEEDLE_CY_CQ_LUT_H */
