/* The AVX-512 integer CQ kernels on A8 codes (kernels "avx512vnni" and "avx512bw"):
   cq_int_avx512_tmpl.h instantiated once per instruction set, each under its own
   target attribute.  The lookup kernel that runs 2- and 4-bit matrices on top of
   them ("avx512lut") is cq_lut.h; cq_dispatch.h chooses among them. */
#ifndef NEEDLE_CY_CQ_AVX512_H
#define NEEDLE_CY_CQ_AVX512_H

#include "cpu_features.h"

#if defined(NC_CQ_X86)
#define NC_INT_SUF avx512vnni
#define NC_INT_TGT "avx512f,avx512bw,avx512vl,avx512vnni"
#define NC_INT_DPW(acc, a, b) _mm512_dpwssd_epi32(acc, a, b)
#include "cq_int_avx512_tmpl.h"
#undef NC_INT_SUF
#undef NC_INT_TGT
#undef NC_INT_DPW
#define NC_INT_SUF avx512bw
#define NC_INT_TGT "avx512f,avx512bw,avx512vl"
#define NC_INT_DPW(acc, a, b) _mm512_add_epi32(acc, _mm512_madd_epi16(a, b))
#include "cq_int_avx512_tmpl.h"
#undef NC_INT_SUF
#undef NC_INT_TGT
#undef NC_INT_DPW
#endif

#endif  /* NEEDLE_CY_CQ_AVX512_H */
