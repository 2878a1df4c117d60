/* The one place the CQ kernel is chosen at run time.

   Every kernel header is included here; this file holds the choice and the state it
   leaves: nc_cq_use_simd() (float inputs: the AVX2 kernels or the portable loops),
   nc_cq_active_int_kernel() (A8 inputs: which integer kernel, from the CPU features
   in cpu_features.h by nc_cq_pick_int_kernel) and nc_cqa_enabled (the AMX tiles), and
   the nc_cq_int_* entry points that route a call to the chosen kernel.  _cq sets the
   state from NEEDLE_CY_CQ_KERNEL and NEEDLE_CY_CQ_AMX at import (_kernel_from_environment,
   set_kernel, set_amx), by name, through these same variables; a kernel this build or
   CPU lacks exists as a stub that is never chosen. */
#ifndef NEEDLE_CY_CQ_DISPATCH_H
#define NEEDLE_CY_CQ_DISPATCH_H

#include "cpu_features.h"
#include "cq_avx2.h"
#include "cq_avx512.h"
#include "cq_avx2int.h"
#include "cq_lut.h"
#include "cq_lut_avx2.h"
#include "cq_amx.h"
#include "cq_neon.h"

#if defined(NC_CQ_X86)
/* kernel 7 (avx512lut): 2-bit lookups (cq_lut.h) for the matrices that have the
   layout, the best AVX-512 kernel (nc_cq_lut_base: 2 avx512vnni, else 1 avx512bw) for
   every other matrix and for the A8 codes */
static int nc_cq_lut_base(void) { return nc_cq_cpu_has_avx512vnni() ? 2 : 1; }
static int nc_cq_lut_base_id = 0;
/* kernel 8 (avx2lut): 2- and 4-bit lookups (cq_lut_avx2.h) for the matrices that have
   the layout; the A8 codes, and every other matrix where nc_cq_avx2lut_base is 3, on
   avx2int (the same codes as every integer kernel) */
#define NC_CQ_BASE(kernel) ((kernel) == 7 ? (nc_cq_lut_base_id ? nc_cq_lut_base_id \
                                             : (nc_cq_lut_base_id = nc_cq_lut_base())) \
                            : (kernel) == 8 ? 3 : (kernel))
/* kernels 3 (avx2int) and 4 (avxvnni); a8 codes and packing are the same for both */
#define NC_CQ_INT2_KERNEL(kernel) ((kernel) == 3 || (kernel) == 4)
#define NC_CQ_INT2_ROWS(kernel, ...) do { if ((kernel) == 4) nc_cqi2_rows_avxvnni(__VA_ARGS__); \
                                         else nc_cqi2_rows_avx2int(__VA_ARGS__); } while (0)
#define NC_CQ_INT2_MM_ROWS(kernel, ...) do { if ((kernel) == 4) nc_cqi2_mm_rows_avxvnni(__VA_ARGS__); \
                                            else nc_cqi2_mm_rows_avx2int(__VA_ARGS__); } while (0)
static void nc_cq_int_rows(int kernel, const uint8_t* packed, ptrdiff_t row_bytes, const uint8_t* end,
                           const float* norms, ptrdiff_t norm_stride, const int16_t* z,
                           ptrdiff_t n_chunks, int fb, int g, const int16_t* table, float base,
                           float scale, ptrdiff_t r0, ptrdiff_t r1, float* y) {
    kernel = NC_CQ_BASE(kernel);
    if (NC_CQ_INT2_KERNEL(kernel)) {
        NC_CQ_INT2_ROWS(kernel, packed, row_bytes, end, norms, norm_stride, z, n_chunks, fb, g,
                        table, base, scale, r0, r1, y);
        return;
    }
    if (kernel == 2)
        nc_cqi_rows_avx512vnni(packed, row_bytes, end, norms, norm_stride, z, n_chunks, fb, g,
                               table, base, scale, r0, r1, y);
    else
        nc_cqi_rows_avx512bw(packed, row_bytes, end, norms, norm_stride, z, n_chunks, fb, g,
                             table, base, scale, r0, r1, y);
}
static int nc_cq_int_a8_codes(int kernel, const float* x, ptrdiff_t n, float* kf, float* s) {
    kernel = NC_CQ_BASE(kernel);
    if (NC_CQ_INT2_KERNEL(kernel)) return nc_cqi2_a8_codes_avx2int(x, n, kf, s);
    return kernel == 2 ? nc_cqi_a8_codes_avx512vnni(x, n, kf, s) : nc_cqi_a8_codes_avx512bw(x, n, kf, s);
}
static void nc_cq_int_pack_codes(int kernel, const float* kf, ptrdiff_t n_chunks, int fb, int16_t* z) {
    kernel = NC_CQ_BASE(kernel);
    if (NC_CQ_INT2_KERNEL(kernel)) nc_cqi2_pack_codes_avx2int(kf, n_chunks, fb, z);
    else if (kernel == 2) nc_cqi_pack_codes_avx512vnni(kf, n_chunks, fb, z);
    else nc_cqi_pack_codes_avx512bw(kf, n_chunks, fb, z);
}
static void nc_cq_int_mm_rows(int kernel, const uint8_t* packed, ptrdiff_t row_bytes, const uint8_t* end,
                              const float* norms, ptrdiff_t norm_stride, const int16_t* z,
                              ptrdiff_t z_stride, ptrdiff_t n_tokens, ptrdiff_t n_chunks, int fb, int g,
                              const int16_t* table, float base, const float* s, float descale,
                              ptrdiff_t r0, ptrdiff_t r1, float* Y, ptrdiff_t y_stride) {
    kernel = NC_CQ_BASE(kernel);
    if (NC_CQ_INT2_KERNEL(kernel)) {
        NC_CQ_INT2_MM_ROWS(kernel, packed, row_bytes, end, norms, norm_stride, z, z_stride, n_tokens,
                           n_chunks, fb, g, table, base, s, descale, r0, r1, Y, y_stride);
        return;
    }
    if (kernel == 2)
        nc_cqi_mm_rows_avx512vnni(packed, row_bytes, end, norms, norm_stride, z, z_stride, n_tokens,
                                  n_chunks, fb, g, table, base, s, descale, r0, r1, Y, y_stride);
    else
        nc_cqi_mm_rows_avx512bw(packed, row_bytes, end, norms, norm_stride, z, z_stride, n_tokens,
                                n_chunks, fb, g, table, base, s, descale, r0, r1, Y, y_stride);
}
#elif defined(NC_CQ_NEON)
/* kernel: 6 neon_dotprod, 5 neon */
static void nc_cq_int_rows(int kernel, const uint8_t* packed, ptrdiff_t row_bytes, const uint8_t* end,
                           const float* norms, ptrdiff_t norm_stride, const int16_t* z,
                           ptrdiff_t n_chunks, int fb, int g, const int16_t* table, float base,
                           float scale, ptrdiff_t r0, ptrdiff_t r1, float* y) {
    if (kernel == 6)
        nc_cqn_rows_neon_dotprod(packed, row_bytes, end, norms, norm_stride, z, n_chunks, fb, g,
                                 table, base, scale, r0, r1, y);
    else
        nc_cqn_rows_neon(packed, row_bytes, end, norms, norm_stride, z, n_chunks, fb, g,
                         table, base, scale, r0, r1, y);
}
static int nc_cq_int_a8_codes(int kernel, const float* x, ptrdiff_t n, float* kf, float* s) {
    return nc_cqn_a8_codes_neon(x, n, kf, s);   /* (no dot products in it) */
}
static void nc_cq_int_pack_codes(int kernel, const float* kf, ptrdiff_t n_chunks, int fb, int16_t* z) {
    if (kernel == 6) nc_cqn_pack_codes_neon_dotprod(kf, n_chunks, fb, z);
    else nc_cqn_pack_codes_neon(kf, n_chunks, fb, z);
}
static void nc_cq_int_mm_rows(int kernel, const uint8_t* packed, ptrdiff_t row_bytes, const uint8_t* end,
                              const float* norms, ptrdiff_t norm_stride, const int16_t* z,
                              ptrdiff_t z_stride, ptrdiff_t n_tokens, ptrdiff_t n_chunks, int fb, int g,
                              const int16_t* table, float base, const float* s, float descale,
                              ptrdiff_t r0, ptrdiff_t r1, float* Y, ptrdiff_t y_stride) {
    if (kernel == 6)
        nc_cqn_mm_rows_neon_dotprod(packed, row_bytes, end, norms, norm_stride, z, z_stride, n_tokens,
                                    n_chunks, fb, g, table, base, s, descale, r0, r1, Y, y_stride);
    else
        nc_cqn_mm_rows_neon(packed, row_bytes, end, norms, norm_stride, z, z_stride, n_tokens,
                            n_chunks, fb, g, table, base, s, descale, r0, r1, Y, y_stride);
}
#else
static void nc_cq_int_rows(int kernel, const uint8_t* packed, ptrdiff_t row_bytes, const uint8_t* end,
                           const float* norms, ptrdiff_t norm_stride, const int16_t* z,
                           ptrdiff_t n_chunks, int fb, int g, const int16_t* table, float base,
                           float scale, ptrdiff_t r0, ptrdiff_t r1, float* y) {}
static int nc_cq_int_a8_codes(int kernel, const float* x, ptrdiff_t n, float* kf, float* s) { return 0; }
static void nc_cq_int_pack_codes(int kernel, const float* kf, ptrdiff_t n_chunks, int fb, int16_t* z) {}
static void nc_cq_int_mm_rows(int kernel, const uint8_t* packed, ptrdiff_t row_bytes, const uint8_t* end,
                              const float* norms, ptrdiff_t norm_stride, const int16_t* z,
                              ptrdiff_t z_stride, ptrdiff_t n_tokens, ptrdiff_t n_chunks, int fb, int g,
                              const int16_t* table, float base, const float* s, float descale,
                              ptrdiff_t r0, ptrdiff_t r1, float* Y, ptrdiff_t y_stride) {}
#endif

#if !defined(NC_CQ_HAVE_LUT)   /* no AVX-512: kernel 7 is never chosen, the layout never made */
#define NC_CQ_HAVE_LUT 0
static int nc_cq_lut_base(void) { return 0; }
static int nc_cql_dot = 0;
static inline int nc_cql_dot_mode(void) { return 0; }
static void nc_cql_relayout(const uint8_t* packed, ptrdiff_t row_bytes, ptrdiff_t rows, ptrdiff_t n_dw,
                            const float* norms, ptrdiff_t norm_stride, ptrdiff_t n_groups,
                            uint32_t* bits, float* pnorms) {}
static void nc_cql_tables(const float* kf, ptrdiff_t n, const float* codebook, int fb, float* tab) {}
static void nc_cql_rows(const uint32_t* bits, const float* pnorms, ptrdiff_t n_dw, ptrdiff_t n_groups,
                        int g, int fb, const float* tab, float scale, ptrdiff_t r0, ptrdiff_t r1, float* y) {}
static void nc_cql_mm_rows(const uint32_t* bits, const float* pnorms, ptrdiff_t n_dw, ptrdiff_t n_groups,
                           int g, int fb, const float* kf, ptrdiff_t kf_stride, const float* codebook,
                           ptrdiff_t n_tokens, const float* s, float descale, ptrdiff_t r0, ptrdiff_t r1,
                           float* Y, ptrdiff_t y_stride, float* scratch, ptrdiff_t scratch_floats) {}
static ptrdiff_t nc_cql_tile_tokens(ptrdiff_t n_dw, ptrdiff_t scratch_floats) { return 0; }
static void nc_cql_tile_tables(const float* kf, ptrdiff_t kf_stride, ptrdiff_t n_dw, const float* codebook,
                               int fb, int nt, float* tab) {}
static void nc_cql_tile_rows(const uint32_t* bits, const float* pnorms, ptrdiff_t n_dw, ptrdiff_t n_groups,
                             int g, int fb, const float* tab, int nt, const float* s, float descale,
                             ptrdiff_t r0, ptrdiff_t r1, float* Y, ptrdiff_t y_stride) {}
#endif

#if !defined(NC_CQ_HAVE_LUT_AVX2)   /* not x86: kernel 8 is never chosen, the layout never made */
#define NC_CQ_HAVE_LUT_AVX2 0
static void nc_cqs_relayout(const uint8_t* packed, ptrdiff_t row_bytes, ptrdiff_t rows,
                            const float* norms, ptrdiff_t norm_stride, ptrdiff_t n_groups,
                            uint8_t* bits, float* pnorms) {}
static inline ptrdiff_t nc_cqs_table_floats(ptrdiff_t n_dw) { return 16 + 64 * n_dw; }
static void nc_cqs_tables(const float* kf, ptrdiff_t n, const float* codebook, int fb, float* tab) {}
static void nc_cqs_rows(const uint8_t* bits, const float* pnorms, ptrdiff_t n_dw, ptrdiff_t n_groups,
                        int g, int fb, const float* tab, float scale, ptrdiff_t r0, ptrdiff_t r1, float* y) {}
static void nc_cqs_mm_rows(const uint8_t* bits, const float* pnorms, ptrdiff_t n_dw, ptrdiff_t n_groups,
                           int g, int fb, const float* kf, ptrdiff_t kf_stride, const float* codebook,
                           ptrdiff_t n_tokens, const float* s, float descale, ptrdiff_t r0, ptrdiff_t r1,
                           float* Y, ptrdiff_t y_stride, float* scratch, ptrdiff_t scratch_floats) {}
static ptrdiff_t nc_cqs_tile_tokens(ptrdiff_t n_dw, ptrdiff_t scratch_floats) { return 0; }
static void nc_cqs_tile_tables(const float* kf, ptrdiff_t kf_stride, ptrdiff_t n_dw, const float* codebook,
                               int fb, int nt, float* tab) {}
static void nc_cqs_tile_rows(const uint8_t* bits, const float* pnorms, ptrdiff_t n_dw, ptrdiff_t n_groups,
                             int g, int fb, const float* tab, int nt, const float* s, float descale,
                             ptrdiff_t r0, ptrdiff_t r1, float* Y, ptrdiff_t y_stride) {}
#endif
/* What kernel 8 runs the matrices without its layout on (other widths, fewer than
   LUT_MIN_ROWS rows, the engine's 3- and 4-bit body): 0 the float AVX2 kernels, 3 the
   256-bit integer kernel (avx2int); set by _cq (set_avx2lut_base).  The float ones:
   avx2int's matvec measured slower than theirs at every shape (benchmarks/history/cq.md). */
#ifndef NC_CQ_AVX2LUT_BASE
#define NC_CQ_AVX2LUT_BASE 0
#endif
static int nc_cq_avx2lut_base = NC_CQ_AVX2LUT_BASE;

#if !defined(NC_CQ_HAVE_AMX)   /* no tile kernel in this build: never enabled */
#define NC_CQ_HAVE_AMX 0
static int nc_cqa_cpu_supported(void) { return 0; }
static void nc_cqa_pack_token(const float* kf, ptrdiff_t Pa, int8_t* zh, int8_t* zl) {}
static ptrdiff_t nc_cqa_scratch_floats(ptrdiff_t n_groups) { return 0; }
static void nc_cqa_mm_rows(const uint8_t* packed, ptrdiff_t row_bytes, const float* norms,
                           ptrdiff_t norm_stride, ptrdiff_t n_groups, int g, int fb, const int8_t* pieces,
                           const int8_t* zh, const int8_t* zl, ptrdiff_t Pa, ptrdiff_t nt, const float* s,
                           float descale, ptrdiff_t r0, ptrdiff_t r1, float* Y, ptrdiff_t y_stride,
                           float* scratch) {}
#endif
/* Whether A8 matmuls of AMX_MIN_TOKENS or more tokens run on the tiles (set by _cq at
   import from the CPU and NEEDLE_CY_CQ_AMX; set_amx). */
static int nc_cqa_enabled = 0;

/* Run-time switch for tests and comparisons (1 = use AVX2 where possible). */
static int nc_cq_simd_enabled = -1;
static int nc_cq_use_simd(int view_simd) {
    if (nc_cq_simd_enabled < 0) nc_cq_simd_enabled = nc_cq_cpu_has_avx2();
    return view_simd && nc_cq_simd_enabled;
}
/* Integer kernel in use for A8 inputs: 0 none (float kernels), 1 avx512bw, 2 avx512vnni,
   3 avx2int, 4 avxvnni, 5 neon, 6 neon_dotprod, 7 avx512lut (2-bit lookups, else 2 or 1),
   8 avx2lut (2-bit lookups, else nc_cq_avx2lut_base). */
static int nc_cq_int_kernel = -1;
/* The choice from CPU features (a pure function: the tests try feature sets this CPU lacks).
   AVX-512 BW: the AVX-512 lookups.  AVX2+FMA without it: the AVX2 lookups (their other
   matrices on the float kernels), measured faster than the float kernels in whole-model
   decode at 2 and 4 bits (at 4 bits only the head has the layout) and no slower in
   prefill (benchmarks/history/cq.md); with int256, AVX-VNNI before them. */
static int nc_cq_pick_int_kernel(int avx512bw, int avx512vnni, int avxvnni, int avx2fma, int int256) {
    if (avx512bw) return 7;   /* the 2-bit lookups; every other matrix on avx512vnni or avx512bw */
    if (int256 && avxvnni && avx2fma) return 4;
    if (avx2fma) return 8;    /* the 2-bit lookups; every other matrix on the float kernels */
    return 0;
}
/* Whether 'auto' takes the 256-bit integer kernel avxvnni: not yet.  Measured on a
   portable (AVX2) build, avx2int is slower than the float AVX2 kernels in decode
   and prefill, most at 2 bits (benchmarks/history/cq.md): without vpermw its
   lookups cost as many shuffles as the float decode saves, and each MAC is two
   int16 products plus an add; 'auto' never takes it (avx2lut is faster than both).
   avxvnni fuses the add; no CPU it was measured on has it.  Forced by name they run
   (NEEDLE_CY_CQ_KERNEL, set_kernel). */
#ifndef NC_CQ_AUTO_INT256
#define NC_CQ_AUTO_INT256 0
#endif
static int nc_cq_best_int_kernel(void) {
    if (nc_cq_cpu_has_neon()) return nc_cq_cpu_has_neon_dotprod() ? 6 : 5;
    return nc_cq_pick_int_kernel(nc_cq_cpu_has_avx512bw(), nc_cq_cpu_has_avx512vnni(),
                                 nc_cq_cpu_has_avxvnni(), nc_cq_cpu_has_avx2(), NC_CQ_AUTO_INT256);
}
static int nc_cq_active_int_kernel(void) {
    if (nc_cq_int_kernel < 0) nc_cq_int_kernel = nc_cq_best_int_kernel();
    return nc_cq_int_kernel;
}

#endif  /* NEEDLE_CY_CQ_DISPATCH_H */
