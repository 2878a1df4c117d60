/* CQ matmul on AMX int8 tiles (x86 with AMX-TILE + AMX-INT8, Linux), deploy numerics.

   Included by cq_dispatch.h; compiled on x86-64 Linux builds.  What it computes is specified bit for
   bit by needle_cy.reference.cq.matmul_amx: per token the rotated A8 codes z (exact
   integers, |z| ≤ 127·g) as two signed bytes z = 256·zh + zl, per codeword
   C = rint(cb·2^E) = c2·2^16 + c1·2^8 + c0 three signed bytes, and per (token, row,
   group) the four int32 tile sums
       T3 = Σ zh·c2,  T2 = Σ zh·c1 + zl·c2,  T1 = Σ zh·c0 + zl·c1,  T0 = Σ zl·c0
   (six `tdpbssd`, 16 tokens × 16 rows × 64 fields each), combined exactly into
   U = 256·T3 + T2 and V = 256·T1 + T0, then sum = fma(float(U), 2^16, float(V)) and
   acc = fma(sum, ν, acc) over the groups in order.

   Why AMX: a `tdpbssd` is 16K int8 products, and the tile unit issues them tens of
   times faster than the vector kernels reach.  Six of them per 64 fields leave the
   tile unit far ahead: the kernel is bound by the tile operations (eight tile
   registers hold four accumulators, zh, zl and two pieces, so every tile is loaded
   once a step: five loads, six products), then by the weight decode and the
   conversions, all amortised over the token tiles of a chunk (figures:
   benchmarks/history/cq.md).

   Layouts.  A tiles (tokens): zh and zl as int8 [T + 16][Pa] (Pa = cols_padded, rows
   past T zero), tile step j reads bytes [64j, 64j + 64) of 16 tokens.  B tiles
   (weights): for 16 rows n and 64 fields k, tile row r holds dword n = the piece bytes
   of fields 4r … 4r+3 of row n (the VNNI order `tdpbssd` reads); made here per row
   block from the packed fields (an index byte per field, a dword gather per tile row,
   one `vpshufb` per piece) into the caller's scratch, once per row block and token
   block of up to NC_AMX_MAX_TILES × 16 tokens. */

#ifndef NEEDLE_CY_CQ_AMX_H
#define NEEDLE_CY_CQ_AMX_H

#include "cpu_features.h"

/* Linux only (the tile state needs the kernel's per-process permission), compilers
   that know the tile intrinsics; elsewhere cq_dispatch.h's stubs stand in. */
#if defined(NC_CQ_X86) && defined(__linux__) && !defined(NC_CQ_NO_AMX) && \
    ((defined(__clang__) && __clang_major__ >= 12) || (!defined(__clang__) && __GNUC__ >= 11))
#define NC_CQ_HAVE_AMX 1

#include <sys/syscall.h>
#include <unistd.h>

#define NC_AMX_TGT "avx512f,avx512bw,avx512vl,avx512dq,amx-tile,amx-int8"
#define NC_AMX_KSTEP 64          /* fields per tile step */
#define NC_AMX_SLICE_STEPS 12    /* tile steps of B decoded at once: 768 fields, 36 KB */
#define NC_AMX_MAX_TILES 48      /* token tiles summed per pass over the rows (the totals' scratch) */

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} nc_amx_tilecfg;

#define NC_AMX_ARCH_REQ_XCOMP_PERM 0x1023
#define NC_AMX_XFEATURE_XTILEDATA 18

/* 1 when the CPU has AMX-TILE + AMX-INT8 (+ AVX-512 BW for the decode), the OS enables
   the tile state (XCR0 bits 17, 18) and grants this process its use (Linux asks each
   process to request it; one request covers every thread). */
static int nc_cqa_cpu_supported(void) {
    static int cached = -1;
    if (cached >= 0) return cached;
    unsigned a, b, c, d;
    cached = 0;
    __cpuid(0, a, b, c, d);
    if (a < 7) return 0;
    __cpuid(1, a, b, c, d);
    if (!(c & (1u << 27))) return 0;               /* OSXSAVE */
    __cpuid_count(7, 0, a, b, c, d);
    if (!(d & (1u << 24)) || !(d & (1u << 25))) return 0;   /* AMX-TILE, AMX-INT8 */
    if (!(b & (1u << 16)) || !(b & (1u << 30)) || !(b & (1u << 31))) return 0;  /* AVX-512 F, BW, VL */
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    if ((lo & 0x60000u) != 0x60000u || (lo & 0xE6u) != 0xE6u) return 0;  /* tile cfg + data, zmm state */
    if (syscall(SYS_arch_prctl, NC_AMX_ARCH_REQ_XCOMP_PERM, NC_AMX_XFEATURE_XTILEDATA) != 0) return 0;
    cached = 1;
    return 1;
}

/* One token's rotated codes (exact integers as floats, Pa of them) as zh, zl bytes. */
static __attribute__((target(NC_AMX_TGT))) void nc_cqa_pack_token(const float* kf, ptrdiff_t Pa,
                                                                  int8_t* zh, int8_t* zl) {
    const __m512i c128 = _mm512_set1_epi32(128), c255 = _mm512_set1_epi32(255);
    for (ptrdiff_t i = 0; i < Pa; i += 16) {
        const __m512i z = _mm512_cvtps_epi32(_mm512_loadu_ps(kf + i));
        const __m512i l = _mm512_sub_epi32(_mm512_and_si512(_mm512_add_epi32(z, c128), c255), c128);
        const __m512i h = _mm512_srai_epi32(_mm512_sub_epi32(z, l), 8);
        _mm_storeu_si128((__m128i*)(zl + i), _mm512_cvtepi32_epi8(l));
        _mm_storeu_si128((__m128i*)(zh + i), _mm512_cvtepi32_epi8(h));
    }
}

/* The 64 field values of fields [64j, 64j + 64) of a packed row (fb = 1, 2 or 4), one a byte. */
static inline __attribute__((always_inline, target(NC_AMX_TGT))) __m512i
nc_cqa_fields(const uint8_t* row, ptrdiff_t j, int fb) {
    if (fb == 4) {
        const __m512i w = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i*)(row + 32 * j)));
        return _mm512_or_si512(_mm512_and_si512(w, _mm512_set1_epi16(0x0F)),
                               _mm512_slli_epi16(_mm512_and_si512(w, _mm512_set1_epi16(0xF0)), 4));
    }
    if (fb == 2) {
        const __m512i d = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)(row + 16 * j)));
        const __m512i t = _mm512_or_si512(_mm512_or_si512(d, _mm512_slli_epi32(d, 6)),
                                          _mm512_or_si512(_mm512_slli_epi32(d, 12), _mm512_slli_epi32(d, 18)));
        return _mm512_and_si512(t, _mm512_set1_epi32(0x03030303));
    }
    uint64_t bits;
    memcpy(&bits, row + 8 * j, 8);
    return _mm512_and_si512(_mm512_movm_epi8((__mmask64)bits), _mm512_set1_epi8(1));
}

/* Rows [r0, r1) (r1 - r0 ≤ 16) of the matmul of nt tokens: Y[t][r] for t < nt.
   scratch: at least nc_cqa_scratch_floats(n_groups) floats, 64-byte aligned. */
static ptrdiff_t nc_cqa_scratch_floats(ptrdiff_t n_groups) {
    return (NC_AMX_SLICE_STEPS * 3 * 1024 + 6 * 1024 + 1024 + NC_AMX_MAX_TILES * 1024) / 4 + n_groups * 16 + 16;
}

static __attribute__((target(NC_AMX_TGT))) void nc_cqa_mm_rows(
        const uint8_t* packed, ptrdiff_t row_bytes, const float* norms, ptrdiff_t norm_stride,
        ptrdiff_t n_groups, int g, int fb, const int8_t* pieces /* c2[16], c1[16], c0[16] */,
        const int8_t* zh, const int8_t* zl, ptrdiff_t Pa, ptrdiff_t nt, const float* s, float descale,
        ptrdiff_t r0, ptrdiff_t r1, float* Y, ptrdiff_t y_stride, float* scratch) {
    uint8_t* bbuf = (uint8_t*)scratch;                                   /* [slice step][piece][16][64] */
    int32_t* abuf = (int32_t*)(bbuf + NC_AMX_SLICE_STEPS * 3 * 1024);    /* 4 accumulators [16][16] (room for 6) */
    uint8_t* ibuf = (uint8_t*)(abuf + 6 * 256);                          /* [16 rows][64 field bytes] */
    float* tot = (float*)(ibuf + 1024);                                  /* [tile][16 tokens][16 rows] */
    float* nbuf = tot + NC_AMX_MAX_TILES * 256;                          /* [group][16 rows] */
    const int steps_per_group = g / NC_AMX_KSTEP;
    const ptrdiff_t n_steps = n_groups * steps_per_group;
    const __m512i t2 = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i*)pieces));
    const __m512i t1 = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i*)(pieces + 16)));
    const __m512i t0 = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i*)(pieces + 32)));
    const __m512i row_offsets = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4,
                                                                    3, 2, 1, 0), _mm512_set1_epi32(64));
    const __m512 two16 = _mm512_set1_ps(65536.0f);
    const int n_rows = (int)(r1 - r0);
    const __mmask16 row_mask = (__mmask16)((1u << n_rows) - 1u);

    nc_amx_tilecfg cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int i = 0; i < 8; i++) { cfg.rows[i] = 16; cfg.colsb[i] = 64; }
    _tile_loadconfig(&cfg);

    for (int n = 0; n < 16; n++)
        for (ptrdiff_t gi = 0; gi < n_groups; gi++)
            nbuf[gi * 16 + n] = n < n_rows ? norms[(r0 + n) * norm_stride + gi] : 0.0f;

    for (ptrdiff_t tb = 0; tb < nt; tb += 16 * NC_AMX_MAX_TILES) {
        const ptrdiff_t tiles = (nt - tb + 15) / 16 < NC_AMX_MAX_TILES ? (nt - tb + 15) / 16 : NC_AMX_MAX_TILES;
        memset(tot, 0, (size_t)tiles * 1024);
        for (ptrdiff_t j0 = 0; j0 < n_steps; j0 += NC_AMX_SLICE_STEPS) {
            const ptrdiff_t j1 = j0 + NC_AMX_SLICE_STEPS < n_steps ? j0 + NC_AMX_SLICE_STEPS : n_steps;
            /* the slice's B tiles: three pieces of every field of the 16 rows */
            for (ptrdiff_t j = j0; j < j1; j++) {
                for (int n = 0; n < 16; n++) {
                    const __m512i f = n < n_rows ? nc_cqa_fields(packed + (r0 + n) * row_bytes, j, fb)
                                                 : _mm512_set1_epi8((char)0x80);   /* vpshufb: 0 */
                    _mm512_store_si512((__m512i*)(ibuf + 64 * n), f);
                }
                uint8_t* b = bbuf + (j - j0) * 3 * 1024;
                for (int r = 0; r < 16; r++) {
                    const __m512i d = _mm512_i32gather_epi32(row_offsets, (const void*)(ibuf + 4 * r), 1);
                    _mm512_store_si512((__m512i*)(b + 64 * r), _mm512_shuffle_epi8(t2, d));
                    _mm512_store_si512((__m512i*)(b + 1024 + 64 * r), _mm512_shuffle_epi8(t1, d));
                    _mm512_store_si512((__m512i*)(b + 2048 + 64 * r), _mm512_shuffle_epi8(t0, d));
                }
            }
            for (ptrdiff_t tile = 0; tile < tiles; tile++) {
                const ptrdiff_t t = tb + 16 * tile;
                float* tt = tot + tile * 256;
                for (ptrdiff_t j = j0; j < j1; j += steps_per_group) {
                    /* four accumulators, one per sum (T2's and T1's two products
                       chained in one tile: int32 sums, exact in any order); zh in tmm4
                       and zl in tmm5 for the whole step, the three pieces in tmm6 and
                       tmm7, so each tile is loaded once and a load never waits for the
                       product just issued to read its tile */
                    _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
                    for (int k = 0; k < steps_per_group; k++) {
                        const uint8_t* b = bbuf + (j + k - j0) * 3 * 1024;
                        _tile_loadd(4, zh + t * Pa + (j + k) * NC_AMX_KSTEP, Pa);
                        _tile_loadd(6, b, 64);
                        _tile_dpbssd(0, 4, 6);          /* T3 += zh·c2 */
                        _tile_loadd(5, zl + t * Pa + (j + k) * NC_AMX_KSTEP, Pa);
                        _tile_dpbssd(1, 5, 6);          /* T2 += zl·c2 */
                        _tile_loadd(7, b + 1024, 64);
                        _tile_dpbssd(2, 5, 7);          /* T1 += zl·c1 */
                        _tile_dpbssd(1, 4, 7);          /* T2 += zh·c1 */
                        _tile_loadd(6, b + 2048, 64);
                        _tile_dpbssd(3, 5, 6);          /* T0 += zl·c0 */
                        _tile_dpbssd(2, 4, 6);          /* T1 += zh·c0 */
                    }
                    _tile_stored(0, abuf, 64);
                    _tile_stored(1, abuf + 256, 64);
                    _tile_stored(2, abuf + 512, 64);
                    _tile_stored(3, abuf + 768, 64);
                    const __m512 nu = _mm512_loadu_ps(nbuf + (j / steps_per_group) * 16);
                    for (int m = 0; m < 16; m++) {
                        /* U = 256·T3 + T2, V = 256·T1 + T0 (exact) */
                        const __m512i u = _mm512_add_epi32(_mm512_slli_epi32(_mm512_load_si512(abuf + 16 * m), 8),
                                                           _mm512_load_si512(abuf + 256 + 16 * m));
                        const __m512i v = _mm512_add_epi32(_mm512_slli_epi32(_mm512_load_si512(abuf + 512 + 16 * m), 8),
                                                           _mm512_load_si512(abuf + 768 + 16 * m));
                        const __m512 sum = _mm512_fmadd_ps(_mm512_cvtepi32_ps(u), two16, _mm512_cvtepi32_ps(v));
                        _mm512_store_ps(tt + 16 * m, _mm512_fmadd_ps(sum, nu, _mm512_load_ps(tt + 16 * m)));
                    }
                }
            }
        }
        for (ptrdiff_t tile = 0; tile < tiles; tile++)
            for (int m = 0; m < 16; m++) {
                const ptrdiff_t t = tb + 16 * tile + m;
                if (t >= nt) break;
                const __m512 y = _mm512_mul_ps(_mm512_load_ps(tot + tile * 256 + 16 * m), _mm512_set1_ps(s[t] * descale));
                _mm512_mask_storeu_ps(Y + t * y_stride + r0, row_mask, y);
            }
    }
    _tile_release();
}

#endif  /* NC_CQ_HAVE_AMX */

#endif  /* NEEDLE_CY_CQ_AMX_H */
