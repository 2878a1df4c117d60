/* The 256-bit integer CQ kernels on A8 codes for CPUs without AVX-512 (kernels
   "avx2int" and "avxvnni"): cq_int_avx2_tmpl.h instantiated once per instruction
   set.  Where the compiler lacks AVX-VNNI the avxvnni names alias the avx2int ones;
   nc_cq_cpu_has_avxvnni() is then 0, so they are never chosen. */
#ifndef NEEDLE_CY_CQ_AVX2INT_H
#define NEEDLE_CY_CQ_AVX2INT_H

#include "cpu_features.h"

#if defined(NC_CQ_X86)
#define NC_I2_SUF avx2int
#define NC_I2_TGT "avx2,fma"
#define NC_I2_DPW(acc, a, b) _mm256_add_epi32(acc, _mm256_madd_epi16(a, b))
#include "cq_int_avx2_tmpl.h"
#undef NC_I2_SUF
#undef NC_I2_TGT
#undef NC_I2_DPW
#if NC_CQ_HAVE_AVXVNNI
#define NC_I2_SUF avxvnni
#define NC_I2_TGT "avx2,fma,avxvnni"
#define NC_I2_DPW(acc, a, b) _mm256_dpwssd_avx_epi32(acc, a, b)
#include "cq_int_avx2_tmpl.h"
#undef NC_I2_SUF
#undef NC_I2_TGT
#undef NC_I2_DPW
#else  /* never chosen: nc_cq_cpu_has_avxvnni() is 0 */
#define nc_cqi2_rows_avxvnni nc_cqi2_rows_avx2int
#define nc_cqi2_mm_rows_avxvnni nc_cqi2_mm_rows_avx2int
#endif
#endif

#endif  /* NEEDLE_CY_CQ_AVX2INT_H */
