/* 2- and 4-bit CQ products on A8 inputs by table lookup (T-MAC style), AVX2 (kernel 8,
   "avx2lut"): the numbers of cq_lut.h's AVX-512 kernel bit for bit, on CPUs without
   vpermw.

   Included once, by cq_dispatch.h (x86 builds only).  needle_cy.reference.cq.matmul_lut
   is its executable specification, and every function here is tested against it bit
   for bit.  What it computes is cq_lut.h's: per token the int16 tables
       q_p[e] = rint(f_p[e] · S)        (fb 2: f_p[e] = fma(cb[e >> 2], z[2p+1], cb[e & 3]·z[2p]);
                                         fb 4: f_j[e] = cb[e]·z[j])
   at the token's one scale S = 2^k (the same rule, nc_cqs_token_scale), per row and
   group the exact integer sum of the entries its nibbles select, then
       acc = fma(ν_γ, float32(Σ_γ q), acc) over γ in order,   y = acc · ((s · descale) · 2^-k).
   Every integer sum is exact and every float step is per row, so a row's value does
   not depend on its block, tile, thread or instruction set.

   Lookups.  vpshufb looks up 16 bytes per 128-bit lane.  An entry is split into two
   unsigned bytes of u = q + 32768 = 256·H + L (L = q & 255, H = the high byte of q
   with its top bit flipped), so a nibble has a 16-byte table of low bytes and one of
   high bytes.  The rows are laid out in blocks of 32: for each byte of the packed row,
   the 32 rows' bytes side by side (one ymm).  Its low nibbles (v & 15) index the tables
   of nibble 2b, its high nibbles ((v >> 4) & 15) those of nibble 2b+1: four vpshufb
   look up 32 rows × two nibbles (32 rows × 4 fields at 2 bits, × 2 fields at 4 bits).
   A table is stored once and loaded into both lanes by vbroadcasti128 (a load, no
   shuffle µop), not stored twice for a full-width memory operand: half the bytes (a
   2048-input token's tables are 32 KB, a common L1 size), and no slower on any matvec
   shape measured (benchmarks/history/cq.md).

   Exact sums.  Byte j of a lookup is row j; the sums run down the rows' byte lanes in
   int16 words, each word holding an even row e (low byte) and an odd row o.  For the
   low bytes A += the looked-up vector (words, wrapping: Σ L_e + 256·Σ L_o mod 2^16) and
   C += vpmaddubsw(vector, (0, 1)) (Σ L_o); after at most 128 lookups (64 row bytes,
   so no sum reaches 2^15) Σ L_e = A − 256·C exactly, and the same for the high bytes.
   Per row Σ q = Σ L + 256·(Σ H − 128·n) (n lookups), formed in int32 by vpunpck{l,h}wd
   and vpmaddwd against (1, 256); groups longer than 64 row bytes (4 bits, g 256) add
   their chunks' int32 sums.  Per 32 rows × 2 nibbles: 19 vector µops (3 index ops:
   and, shift, and; 4 vpshufb, 4 vpmaddubsw, 8 vpaddw) besides the weight load and 4
   table loads (128 products at 2 bits, 64 at 4); at a group's end about 30 more.  The
   float AVX2 kernel spends about 44 on 128 products at 2 bits, about 70 at 4 bits.
   The int32 sums come out in the lane order of nc_cqs_lane_row (even rows, then odd
   ones, per half of the block); the block's norms are stored in that order, and the
   four output vectors are put back in row order once per block.

   NEON.  tbl (vqtbl1q_u8) is the same lookup as one 128-bit lane of vpshufb (16-byte
   table, out-of-range indices give 0), so the same byte tables and the same layout in
   blocks of 16 rows would run on aarch64; there uaddw / uaddw2 widen and add the
   looked-up bytes directly, without the even/odd words.

   Layout (made once by nc_cqs_relayout when the engine enables it; the .cact mapping
   is left as it is):
     bits  [row block][byte b of the row][32 rows]      uint8
     norms [row block][group][32 lanes]                  float32, lane order nc_cqs_lane_row
   rows past the last are zero (their lanes are computed and never stored).
   Tables of one token (nc_cqs_table_floats(n_dw) floats, 64-byte aligned by the
   caller): a 16-float header (float 0: 2^-k), then per row byte b 64 bytes: the 16 low
   bytes of nibble 2b, its 16 high bytes, then the same for nibble 2b+1. */

#ifndef NEEDLE_CY_CQ_LUT_AVX2_H
#define NEEDLE_CY_CQ_LUT_AVX2_H

#include "cpu_features.h"

#if defined(NC_CQ_X86)
#define NC_CQ_HAVE_LUT_AVX2 1

#define NC_CQS_TGT "avx2,fma"
#define NC_CQS_AI static inline __attribute__((always_inline, target(NC_CQS_TGT)))
#define NC_CQS_FN static __attribute__((target(NC_CQS_TGT)))
#define NC_CQS_ROWS 32          /* rows of a block */
#define NC_CQS_CHUNK 64         /* row bytes summed in int16 words before the int32 sums */
#define NC_CQS_MM_TOKENS 4      /* tokens per matmul tile (their tables in the thread's scratch) */
#ifndef NC_CQS_PF_BYTES
#define NC_CQS_PF_BYTES 2048    /* weight bytes prefetched ahead of the ones being read */
#endif

/* The row of a block (0 … 31) whose sums land in lane p: vector k = p / 8 of the four a
   group yields, element e = p % 8 (see the header comment). */
static inline int nc_cqs_lane_row(int p) {
    const int k = p >> 3, e = p & 7;
    return 16 * (e >> 2) + 8 * (k & 1) + 2 * (e & 3) + (k >> 1);
}

/* The lookup layout of a matrix of 2- or 4-bit fields (portable C; bits and pnorms
   zeroed by the caller, sized for ceil(rows/32) blocks).  packed: rows × row_bytes,
   row_bytes = 4·n_dw; norms: float32 rows × norm_stride. */
static void nc_cqs_relayout(const uint8_t* packed, ptrdiff_t row_bytes, ptrdiff_t rows,
                            const float* norms, ptrdiff_t norm_stride, ptrdiff_t n_groups,
                            uint8_t* bits, float* pnorms) {
    for (ptrdiff_t r = 0; r < rows; r++) {
        uint8_t* out = bits + (r / NC_CQS_ROWS) * row_bytes * NC_CQS_ROWS + r % NC_CQS_ROWS;
        const uint8_t* in = packed + r * row_bytes;
        for (ptrdiff_t b = 0; b < row_bytes; b++) out[b * NC_CQS_ROWS] = in[b];
    }
    const ptrdiff_t n_rb = (rows + NC_CQS_ROWS - 1) / NC_CQS_ROWS;
    for (ptrdiff_t rb = 0; rb < n_rb; rb++)
        for (int p = 0; p < NC_CQS_ROWS; p++) {
            const ptrdiff_t r = rb * NC_CQS_ROWS + nc_cqs_lane_row(p);
            if (r >= rows) continue;
            for (ptrdiff_t g = 0; g < n_groups; g++)
                pnorms[(rb * n_groups + g) * NC_CQS_ROWS + p] = norms[r * norm_stride + g];
        }
}

/* Floats of one token's tables for rows of n_dw dwords (the header, then 64 bytes a row
   byte): cq_lut.h's size. */
static inline ptrdiff_t nc_cqs_table_floats(ptrdiff_t n_dw) { return 16 + 64 * n_dw; }

/* The table scale S = 2^k of a token (kf[0:n], n even): cq_lut.h's nc_cql_token_scale
   (the same maxima, exact in any order, and the same rule). */
NC_CQS_FN float nc_cqs_token_scale(const float* kf, ptrdiff_t n, const float* codebook, int fb) {
    const __m256 absm = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    __m256 vm = _mm256_setzero_ps();
    float m = 0.0f, cbmax = 0.0f, lanes[8];
    int e;
    ptrdiff_t j = 0;
    if (fb == 2) {
        /* each lane plus its neighbour: both lanes of a pair hold the pair's sum */
        for (; j + 8 <= n; j += 8) {
            const __m256 v = _mm256_and_ps(absm, _mm256_loadu_ps(kf + j));
            vm = _mm256_max_ps(vm, _mm256_add_ps(v, _mm256_permute_ps(v, 0xB1)));
        }
    } else {
        for (; j + 8 <= n; j += 8) vm = _mm256_max_ps(vm, _mm256_and_ps(absm, _mm256_loadu_ps(kf + j)));
    }
    _mm256_storeu_ps(lanes, vm);
    for (int i = 0; i < 8; i++) m = lanes[i] > m ? lanes[i] : m;
    if (fb == 2) {
        for (; j + 1 < n; j += 2) {
            const float v = fabsf(kf[j]) + fabsf(kf[j + 1]);
            m = v > m ? v : m;
        }
    } else {
        for (; j < n; j++) m = fabsf(kf[j]) > m ? fabsf(kf[j]) : m;
    }
    for (int i = 0; i < 16; i++) cbmax = fabsf(codebook[i]) > cbmax ? fabsf(codebook[i]) : cbmax;
    if (!(m > 0.0f && cbmax > 0.0f)) return 1.0f;
    frexp(32767.0 / ((double)cbmax * (double)m), &e);     /* 2^(e-1) ≤ limit < 2^e */
    e = e - 1 < -126 ? -126 : (e - 1 > 100 ? 100 : e - 1);
    return ldexpf(1.0f, e);
}

/* The byte tables of nibbles [0, n_nib) of a token at table scale S (kf: its rotated
   codes from the first nibble's first field), 32 bytes a nibble (low bytes, high
   bytes) at out + 32·p: nibble p is pair p (fields 2p, 2p+1) at fb 2, field p at fb 4. */
NC_CQS_AI void nc_cqs_entries_at(const float* kf, ptrdiff_t n_nib, const float* codebook, int fb, float S,
                                 uint8_t* out) {
    const __m256 vs = _mm256_set1_ps(S);
    /* fb 2: entries 0–7 and 8–15 share cb[e & 3]; cb[e >> 2] is cb0, cb1 then cb2, cb3 */
    const __m256 cl = fb == 2 ? _mm256_setr_ps(codebook[0], codebook[1], codebook[2], codebook[3],
                                               codebook[0], codebook[1], codebook[2], codebook[3])
                              : _mm256_loadu_ps(codebook);
    const __m256 ch0 = _mm256_setr_ps(codebook[0], codebook[0], codebook[0], codebook[0],
                                      codebook[1], codebook[1], codebook[1], codebook[1]);
    const __m256 ch1 = fb == 2 ? _mm256_setr_ps(codebook[2], codebook[2], codebook[2], codebook[2],
                                                codebook[3], codebook[3], codebook[3], codebook[3])
                               : _mm256_loadu_ps(codebook + 8);
    /* the words' low bytes, then their high bytes, per lane */
    const __m256i split = _mm256_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15,
                                           0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
    const __m256i flip = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                                          -128, -128, -128, -128, -128, -128, -128, -128,
                                          -128, -128, -128, -128, -128, -128, -128, -128);
    for (ptrdiff_t p = 0; p < n_nib; p++) {
        __m256 fa, fz;
        if (fb == 2) {
            const __m256 z1 = _mm256_set1_ps(kf[2 * p + 1]);
            const __m256 low = _mm256_mul_ps(cl, _mm256_set1_ps(kf[2 * p]));
            fa = _mm256_fmadd_ps(ch0, z1, low);
            fz = _mm256_fmadd_ps(ch1, z1, low);
        } else {
            const __m256 z = _mm256_set1_ps(kf[p]);
            fa = _mm256_mul_ps(cl, z);
            fz = _mm256_mul_ps(ch1, z);
        }
        /* q[0:16] as words in order, then [L | H] (H: the high byte, top bit flipped) */
        const __m256i q = _mm256_permute4x64_epi64(
            _mm256_packs_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(fa, vs)), _mm256_cvtps_epi32(_mm256_mul_ps(fz, vs))),
            0xD8);
        const __m256i lh = _mm256_xor_si256(_mm256_permute4x64_epi64(_mm256_shuffle_epi8(q, split), 0xD8), flip);
        uint8_t* at = out + 32 * p;
        /* the tables were evicted by the weights streamed since they were last made:
           ask for the lines 1 KB ahead, or each store waits for its line */
        __builtin_prefetch(at + 1024, 1, 3);
        _mm256_storeu_si256((__m256i*)at, lh);
    }
}

/* The tables of one token (kf[0:n], n = n_dw·32/fb): header and entries. */
NC_CQS_AI void nc_cqs_tables_inl(const float* kf, ptrdiff_t n, const float* codebook, int fb, float* tab) {
    const float S = nc_cqs_token_scale(kf, n, codebook, fb);
    for (int i = 0; i < 16; i++) tab[i] = 0.0f;
    tab[0] = 1.0f / S;                                   /* exact: a power of two */
    nc_cqs_entries_at(kf, fb == 2 ? n / 2 : n, codebook, fb, S, (uint8_t*)(tab + 16));
}

NC_CQS_FN void nc_cqs_tables(const float* kf, ptrdiff_t n, const float* codebook, int fb, float* tab) {
    nc_cqs_tables_inl(kf, n, codebook, fb, tab);
}

/* The lookups of nb row bytes (nb even, ≤ NC_CQS_CHUNK) of a 32-row block (wb: the
   first byte vector; t: its tables), their exact Σ q added to the four int32 vectors s. */
NC_CQS_AI void nc_cqs_chunk(const uint8_t* wb, const uint8_t* t, int nb, __m256i* s) {
    const __m256i nib = _mm256_set1_epi8(0x0F);
    const __m256i odd = _mm256_set1_epi16(0x0100);        /* bytes (0, 1): a word's high byte */
    __m256i al = _mm256_setzero_si256(), cl = _mm256_setzero_si256();
    __m256i ah = _mm256_setzero_si256(), ch = _mm256_setzero_si256();
    for (int b = 0; b < nb; b += 2, wb += 2 * NC_CQS_ROWS, t += 128) {
        _mm_prefetch((const char*)wb + NC_CQS_PF_BYTES, _MM_HINT_T0);
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            const __m256i v = _mm256_loadu_si256((const __m256i*)(wb + h * NC_CQS_ROWS));
            const uint8_t* th = t + 64 * h;
            const __m256i i0 = _mm256_and_si256(v, nib);
            const __m256i i1 = _mm256_and_si256(_mm256_srli_epi16(v, 4), nib);
#define NC_CQS_TAB(i) _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i*)(th + 16 * (i))))
            const __m256i l0 = _mm256_shuffle_epi8(NC_CQS_TAB(0), i0);
            const __m256i h0 = _mm256_shuffle_epi8(NC_CQS_TAB(1), i0);
            const __m256i l1 = _mm256_shuffle_epi8(NC_CQS_TAB(2), i1);
            const __m256i h1 = _mm256_shuffle_epi8(NC_CQS_TAB(3), i1);
#undef NC_CQS_TAB
            al = _mm256_add_epi16(al, _mm256_add_epi16(l0, l1));
            ah = _mm256_add_epi16(ah, _mm256_add_epi16(h0, h1));
            cl = _mm256_add_epi16(cl, _mm256_add_epi16(_mm256_maddubs_epi16(l0, odd), _mm256_maddubs_epi16(l1, odd)));
            ch = _mm256_add_epi16(ch, _mm256_add_epi16(_mm256_maddubs_epi16(h0, odd), _mm256_maddubs_epi16(h1, odd)));
        }
    }
    /* even rows' sums (exact: below 2^15), the bias of the high bytes off, then per
       row L + 256·H in int32 */
    const __m256i k = _mm256_set1_epi32(0x01000001);      /* words (1, 256) */
    const __m256i bias = _mm256_set1_epi16((short)(256 * nb));   /* 128 · (2·nb lookups) */
    const __m256i le = _mm256_sub_epi16(al, _mm256_slli_epi16(cl, 8));
    const __m256i he = _mm256_sub_epi16(_mm256_sub_epi16(ah, _mm256_slli_epi16(ch, 8)), bias);
    const __m256i ho = _mm256_sub_epi16(ch, bias);
    s[0] = _mm256_add_epi32(s[0], _mm256_madd_epi16(_mm256_unpacklo_epi16(le, he), k));
    s[1] = _mm256_add_epi32(s[1], _mm256_madd_epi16(_mm256_unpackhi_epi16(le, he), k));
    s[2] = _mm256_add_epi32(s[2], _mm256_madd_epi16(_mm256_unpacklo_epi16(cl, ho), k));
    s[3] = _mm256_add_epi32(s[3], _mm256_madd_epi16(_mm256_unpackhi_epi16(cl, ho), k));
}

/* acc[0:4] = fma(ν, float(Σ q), acc) for one group of a block (wb: the group's first
   byte vector, t: its first table byte, gb: row bytes a group, nv: the group's norms) */
NC_CQS_AI void nc_cqs_group(const uint8_t* wb, const uint8_t* t, int gb, const float* nv, __m256* acc) {
    __m256i s[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(),
                    _mm256_setzero_si256()};
    for (int c = 0; c < gb; c += NC_CQS_CHUNK) {
        const int nb = gb - c < NC_CQS_CHUNK ? gb - c : NC_CQS_CHUNK;
        nc_cqs_chunk(wb + c * NC_CQS_ROWS, t + 64 * c, nb, s);
    }
    for (int i = 0; i < 4; i++)
        acc[i] = _mm256_fmadd_ps(_mm256_loadu_ps(nv + 8 * i), _mm256_cvtepi32_ps(s[i]), acc[i]);
}

/* y[r] for the rows r0 ≤ r < r1 of the block whose first row is r: acc · sc, back in row order */
NC_CQS_AI void nc_cqs_store(const __m256* acc, __m256 sc, ptrdiff_t r, ptrdiff_t r0, ptrdiff_t r1, float* y) {
    const __m256 v0 = _mm256_mul_ps(acc[0], sc), v1 = _mm256_mul_ps(acc[1], sc);
    const __m256 v2 = _mm256_mul_ps(acc[2], sc), v3 = _mm256_mul_ps(acc[3], sc);
    const __m256 a = _mm256_unpacklo_ps(v0, v2), b = _mm256_unpackhi_ps(v0, v2);   /* rows 0–7 | 16–23 */
    const __m256 c = _mm256_unpacklo_ps(v1, v3), d = _mm256_unpackhi_ps(v1, v3);   /* rows 8–15 | 24–31 */
    __m256 out[4];
    out[0] = _mm256_permute2f128_ps(a, b, 0x20);
    out[1] = _mm256_permute2f128_ps(c, d, 0x20);
    out[2] = _mm256_permute2f128_ps(a, b, 0x31);
    out[3] = _mm256_permute2f128_ps(c, d, 0x31);
    if (r >= r0 && r + NC_CQS_ROWS <= r1) {
        for (int i = 0; i < 4; i++) _mm256_storeu_ps(y + r + 8 * i, out[i]);
        return;
    }
    float tmp[NC_CQS_ROWS];
    for (int i = 0; i < 4; i++) _mm256_storeu_ps(tmp + 8 * i, out[i]);
    for (ptrdiff_t i = r < r0 ? r0 : r; i < r + NC_CQS_ROWS && i < r1; i++) y[i] = tmp[i - r];
}

/* y[r] for r0 ≤ r < r1 (one token; tab its tables, scale = s·descale). */
NC_CQS_FN void nc_cqs_rows(const uint8_t* bits, const float* pnorms, ptrdiff_t n_dw, ptrdiff_t n_groups,
                           int g, int fb, const float* tab, float scale, ptrdiff_t r0, ptrdiff_t r1, float* y) {
    const int gb = g * fb / 8;
    const ptrdiff_t row_bytes = 4 * n_dw;
    const uint8_t* t = (const uint8_t*)(tab + 16);
    const __m256 sc = _mm256_set1_ps(scale * tab[0]);
    for (ptrdiff_t rb = r0 / NC_CQS_ROWS; NC_CQS_ROWS * rb < r1; rb++) {
        const uint8_t* wb = bits + rb * row_bytes * NC_CQS_ROWS;
        const float* nb = pnorms + rb * n_groups * NC_CQS_ROWS;
        __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
        for (ptrdiff_t gi = 0; gi < n_groups; gi++)
            nc_cqs_group(wb + gi * gb * NC_CQS_ROWS, t + gi * gb * 64, gb, nb + gi * NC_CQS_ROWS, acc);
        nc_cqs_store(acc, sc, NC_CQS_ROWS * rb, r0, r1, y);
    }
}

/* Tokens per tile whose tables fit in scratch_floats floats (0: not one token's). */
static inline ptrdiff_t nc_cqs_tile_tokens(ptrdiff_t n_dw, ptrdiff_t scratch_floats) {
    const ptrdiff_t fit = scratch_floats / nc_cqs_table_floats(n_dw);
    return fit < NC_CQS_MM_TOKENS ? fit : NC_CQS_MM_TOKENS;
}

/* The tables of nt ≤ NC_CQS_MM_TOKENS tokens (rotated codes kf, one every kf_stride
   floats) for rows of n_dw dwords: token t's at tab + t·nc_cqs_table_floats(n_dw). */
NC_CQS_FN void nc_cqs_tile_tables(const float* kf, ptrdiff_t kf_stride, ptrdiff_t n_dw, const float* codebook,
                                  int fb, int nt, float* tab) {
    for (int t = 0; t < nt; t++)
        nc_cqs_tables_inl(kf + t * kf_stride, 32 / fb * n_dw, codebook, fb, tab + t * nc_cqs_table_floats(n_dw));
}

/* NT tokens of one block: per group, each token's lookups over the group's bytes (in
   L1 after the first token), so each token's lanes take exactly nc_cqs_rows's steps. */
NC_CQS_AI void nc_cqs_mm_block(const uint8_t* wb, const float* nb, const float* tab, ptrdiff_t tab_stride,
                               ptrdiff_t n_groups, int gb, const float* s, float descale, float* Y,
                               ptrdiff_t y_stride, ptrdiff_t r, ptrdiff_t r0, ptrdiff_t r1, const int NT) {
    __m256 acc[NC_CQS_MM_TOKENS][4];
    for (int t = 0; t < NT; t++)
        for (int i = 0; i < 4; i++) acc[t][i] = _mm256_setzero_ps();
    for (ptrdiff_t gi = 0; gi < n_groups; gi++)
        for (int t = 0; t < NT; t++)
            nc_cqs_group(wb + gi * gb * NC_CQS_ROWS, (const uint8_t*)(tab + t * tab_stride + 16) + gi * gb * 64,
                         gb, nb + gi * NC_CQS_ROWS, acc[t]);
    for (int t = 0; t < NT; t++)
        nc_cqs_store(acc[t], _mm256_set1_ps((s[t] * descale) * tab[t * tab_stride]), r, r0, r1, Y + t * y_stride);
}

/* Rows r0 ≤ r < r1 of the nt tokens whose tables nc_cqs_tile_tables made
   (Y[t·y_stride + r]; s[t] their A8 scales). */
NC_CQS_FN void nc_cqs_tile_rows(const uint8_t* bits, const float* pnorms, ptrdiff_t n_dw, ptrdiff_t n_groups,
                                int g, int fb, const float* tab, int nt, const float* s, float descale,
                                ptrdiff_t r0, ptrdiff_t r1, float* Y, ptrdiff_t y_stride) {
    const int gb = g * fb / 8;
    const ptrdiff_t row_bytes = 4 * n_dw, per_token = nc_cqs_table_floats(n_dw);
    for (ptrdiff_t rb = r0 / NC_CQS_ROWS; NC_CQS_ROWS * rb < r1; rb++) {
        const uint8_t* wb = bits + rb * row_bytes * NC_CQS_ROWS;
        const float* nb = pnorms + rb * n_groups * NC_CQS_ROWS;
        const ptrdiff_t r = NC_CQS_ROWS * rb;
        switch (nt) {
        case 1: nc_cqs_mm_block(wb, nb, tab, per_token, n_groups, gb, s, descale, Y, y_stride, r, r0, r1, 1); break;
        case 2: nc_cqs_mm_block(wb, nb, tab, per_token, n_groups, gb, s, descale, Y, y_stride, r, r0, r1, 2); break;
        case 3: nc_cqs_mm_block(wb, nb, tab, per_token, n_groups, gb, s, descale, Y, y_stride, r, r0, r1, 3); break;
        default: nc_cqs_mm_block(wb, nb, tab, per_token, n_groups, gb, s, descale, Y, y_stride, r, r0, r1, 4); break;
        }
    }
}

/* nc_cqs_rows without a token's tables: each group's tables made in `entries` (room
   for one group: 64 bytes a row byte) for every block, at the token's scale S (scale
   = s·descale·2^-k): the same bits, slowly (the matmul's fallback without scratch). */
NC_CQS_FN void nc_cqs_rows_by_group(const uint8_t* bits, const float* pnorms, ptrdiff_t n_dw, ptrdiff_t n_groups,
                                    int g, int fb, const float* z, const float* codebook, float S, float scale,
                                    ptrdiff_t r0, ptrdiff_t r1, float* y, uint8_t* entries) {
    const int gb = g * fb / 8;
    const ptrdiff_t row_bytes = 4 * n_dw;
    const __m256 sc = _mm256_set1_ps(scale);
    for (ptrdiff_t rb = r0 / NC_CQS_ROWS; NC_CQS_ROWS * rb < r1; rb++) {
        const uint8_t* wb = bits + rb * row_bytes * NC_CQS_ROWS;
        const float* nb = pnorms + rb * n_groups * NC_CQS_ROWS;
        __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
        for (ptrdiff_t gi = 0; gi < n_groups; gi++) {
            nc_cqs_entries_at(z + gi * g, 2 * gb, codebook, fb, S, entries);
            nc_cqs_group(wb + gi * gb * NC_CQS_ROWS, entries, gb, nb + gi * NC_CQS_ROWS, acc);
        }
        nc_cqs_store(acc, sc, NC_CQS_ROWS * rb, r0, r1, y);
    }
}

/* Y[t·y_stride + r] for r0 ≤ r < r1 and 0 ≤ t < n_tokens, from the tokens' rotated
   codes (kf: token 0's, one token every kf_stride floats; s[t] their A8 scales): tiles
   of up to NC_CQS_MM_TOKENS tokens with their tables in scratch (scratch_floats
   floats), made by every thread that runs a share of the rows (as cq_lut.h's); without
   room for one token (scratch NULL) each group's tables are made on the stack for
   each block. */
NC_CQS_FN void nc_cqs_mm_rows(const uint8_t* bits, const float* pnorms, ptrdiff_t n_dw, ptrdiff_t n_groups,
                              int g, int fb, const float* kf, ptrdiff_t kf_stride, const float* codebook,
                              ptrdiff_t n_tokens, const float* s, float descale, ptrdiff_t r0, ptrdiff_t r1,
                              float* Y, ptrdiff_t y_stride, float* scratch, ptrdiff_t scratch_floats) {
    const ptrdiff_t fit = scratch ? nc_cqs_tile_tokens(n_dw, scratch_floats) : 0;
    if (fit < 1) {
        /* one group's tables (≤ 128 row bytes: 256 fields at 4 bits) */
        __attribute__((aligned(64))) uint8_t entries[128 * 64];
        for (ptrdiff_t t = 0; t < n_tokens; t++) {
            const float* z = kf + t * kf_stride;
            const float S = nc_cqs_token_scale(z, 32 / fb * n_dw, codebook, fb);
            nc_cqs_rows_by_group(bits, pnorms, n_dw, n_groups, g, fb, z, codebook, S,
                                 (s[t] * descale) * (1.0f / S), r0, r1, Y + t * y_stride, entries);
        }
        return;
    }
    for (ptrdiff_t t0 = 0; t0 < n_tokens; t0 += fit) {
        const ptrdiff_t left = n_tokens - t0;
        const int nt = (int)(left < fit ? left : fit);
        nc_cqs_tile_tables(kf + t0 * kf_stride, kf_stride, n_dw, codebook, fb, nt, scratch);
        nc_cqs_tile_rows(bits, pnorms, n_dw, n_groups, g, fb, scratch, nt, s + t0, descale, r0, r1,
                         Y + t0 * y_stride, y_stride);
    }
}

#undef NC_CQS_FN
#undef NC_CQS_AI
#undef NC_CQS_TGT

#endif  /* NC_CQ_X86 */

#endif  /* NEEDLE_CY_CQ_LUT_AVX2_H */
