/* CPU features the CQ kernels are chosen by, and the target macros of the x86 kernels.

   The features are read at run time (__builtin_cpu_supports, cpuid, getauxval), not
   taken from the compiler's -march, so that one build carries every kernel the
   compiler can emit and runs the best one this CPU has.  cq_dispatch.h is the one
   place that turns these answers into a choice; the kernel headers include this file
   for NC_CQ_X86 / NC_CQ_NEON and the target macros.  Where a family is not compiled
   (another architecture, or -DNC_CQ_NO_SIMD) its tests exist and answer 0, so callers
   need no #if of their own. */
#ifndef NEEDLE_CY_CPU_FEATURES_H
#define NEEDLE_CY_CPU_FEATURES_H

#include <stdint.h>
#include <stddef.h>
#include <string.h>
#include <math.h>

/* x86: the AVX2 kernels are compiled with a target attribute so that even a portable
   build (no -march) has them; they run only when the CPU reports AVX2+FMA. */
#if (defined(__x86_64__) || defined(_M_X64)) && (defined(__GNUC__) || defined(__clang__)) \
    && !defined(NC_CQ_NO_SIMD)  /* -DNC_CQ_NO_SIMD: build the portable loops only */
#include <immintrin.h>
#define NC_CQ_X86 1
#define NC_CQ_TARGET __attribute__((target("avx2,fma")))
#define NC_CQ_INLINE static inline __attribute__((always_inline, target("avx2,fma")))

static int nc_cq_cpu_has_avx2(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

static int nc_cq_cpu_has_avx512bw(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw")
        && __builtin_cpu_supports("avx512vl");
}
static int nc_cq_cpu_has_avx512vnni(void) {
    return nc_cq_cpu_has_avx512bw() && __builtin_cpu_supports("avx512vnni");
}

static int nc_cq_cpu_has_avx512vbmi(void) {
    return nc_cq_cpu_has_avx512vnni() && __builtin_cpu_supports("avx512vbmi");
}

/* AVX-VNNI where the compiler knows it (GCC 11, clang 12, Apple clang 13). */
#if (defined(__clang__) && ((defined(__apple_build_version__) && __clang_major__ >= 13) \
                            || (!defined(__apple_build_version__) && __clang_major__ >= 12))) \
    || (!defined(__clang__) && __GNUC__ >= 11)
#define NC_CQ_HAVE_AVXVNNI 1
#else
#define NC_CQ_HAVE_AVXVNNI 0
#endif
#include <cpuid.h>
/* AVX-VNNI: cpuid leaf 7 subleaf 1, EAX bit 4 (with AVX2+FMA, whose check covers the OS ymm state) */
static int nc_cq_cpu_has_avxvnni(void) {
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!NC_CQ_HAVE_AVXVNNI || !nc_cq_cpu_has_avx2() || __get_cpuid_max(0, 0) < 7) return 0;
    __cpuid_count(7, 1, a, b, c, d);
    return (int)((a >> 4) & 1u);
}
#endif

/* aarch64: NEON is part of every ARMv8-A core; the dot product extension (sdot) is
   detected at run time. */
#if defined(__aarch64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(NC_CQ_NO_SIMD)
#include <arm_neon.h>
#define NC_CQ_NEON 1
#if defined(__linux__)
#include <sys/auxv.h>
#ifndef HWCAP_ASIMDDP
#define HWCAP_ASIMDDP (1 << 20)
#endif
static int nc_cq_cpu_has_neon_dotprod(void) { return (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) != 0; }
#else
static int nc_cq_cpu_has_neon_dotprod(void) { return 0; }  /* no detection here yet */
#endif
static int nc_cq_cpu_has_neon(void) { return 1; }
#endif

#if !defined(NC_CQ_X86)
static int nc_cq_cpu_has_avx2(void) { return 0; }
static int nc_cq_cpu_has_avx512bw(void) { return 0; }
static int nc_cq_cpu_has_avx512vnni(void) { return 0; }
static int nc_cq_cpu_has_avx512vbmi(void) { return 0; }
static int nc_cq_cpu_has_avxvnni(void) { return 0; }
#endif
#if !defined(NC_CQ_NEON)
static int nc_cq_cpu_has_neon(void) { return 0; }
static int nc_cq_cpu_has_neon_dotprod(void) { return 0; }
#endif

#endif  /* NEEDLE_CY_CPU_FEATURES_H */
