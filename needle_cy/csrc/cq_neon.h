/* The aarch64 integer CQ kernels on A8 codes (kernels "neon_dotprod" and "neon"):
   cq_neon_tmpl.h instantiated once with the dot product extension (sdot, under its
   own target attribute) and once in plain NEON. */
#ifndef NEEDLE_CY_CQ_NEON_H
#define NEEDLE_CY_CQ_NEON_H

#include "cpu_features.h"

#if defined(NC_CQ_NEON)
#define NC_NEON_SUF neon_dotprod
#define NC_NEON_TGT "arch=armv8.2-a+dotprod"  /* (GCC 12 arm_neon.h wraps vdotq_s32 in this target) */
#define NC_NEON_DOT 1
#include "cq_neon_tmpl.h"
#undef NC_NEON_SUF
#undef NC_NEON_TGT
#undef NC_NEON_DOT
#define NC_NEON_SUF neon
#define NC_NEON_TGT "+simd"
#define NC_NEON_DOT 0
#include "cq_neon_tmpl.h"
#undef NC_NEON_SUF
#undef NC_NEON_TGT
#undef NC_NEON_DOT
#endif

#endif  /* NEEDLE_CY_CQ_NEON_H */
