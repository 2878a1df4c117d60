/* The Walsh–Hadamard transform (Sylvester order), the one implementation the
   package has: _cq rotates every CQ group with it (cq_fwht_scaled), _ops rotates the
   KV cache's groups with it (fwht_inplace).

   nc_wht(v, n, scale, simd) transforms n = 2^k floats in place and multiplies each
   by scale.  The AVX2 path and the portable butterflies give the same bits: every
   stage adds and subtracts the same pairs in the same order (the in-register stages
   form a + b and a − b with one exact FMA against ±1), and the scale is one product
   per element after the last stage; so a caller may choose either without changing
   a result. */
#ifndef NEEDLE_CY_WHT_H
#define NEEDLE_CY_WHT_H

#include "cpu_features.h"

#if defined(NC_CQ_X86)
/* In-place Walsh–Hadamard transform of n = 2^k ≥ 8 floats, times scale.  Blocks of
   up to 128 floats are transformed in registers (NV vectors): stages h = 1, 2, 4
   inside each register (x·sign + swapped(x) gives a + b and a − b exactly, as the
   scalar butterflies do), stages 8 … 64 between registers; longer transforms
   finish with butterfly passes over memory. */
NC_CQ_INLINE void nc_cq_fwht_block(float* v, const int NV, int scale_now, __m256 k) {
    const __m256 s1 = _mm256_setr_ps(1, -1, 1, -1, 1, -1, 1, -1);
    const __m256 s2 = _mm256_setr_ps(1, 1, -1, -1, 1, 1, -1, -1);
    const __m256 s4 = _mm256_setr_ps(1, 1, 1, 1, -1, -1, -1, -1);
    __m256 r[32];  /* NV ≤ 16 are used; the slack quiets a false -Warray-bounds */
    #pragma GCC unroll 16
    for (int i = 0; i < NV; i++) {
        __m256 a = _mm256_loadu_ps(v + 8 * i);
        a = _mm256_fmadd_ps(a, s1, _mm256_permute_ps(a, 0xB1));
        a = _mm256_fmadd_ps(a, s2, _mm256_permute_ps(a, 0x4E));
        r[i] = _mm256_fmadd_ps(a, s4, _mm256_permute2f128_ps(a, a, 1));
    }
    #pragma GCC unroll 4
    for (int h = 1; h < NV; h *= 2)
        #pragma GCC unroll 16
        for (int i = 0; i < NV; i += 2 * h)
            #pragma GCC unroll 16
            for (int j = i; j < i + h; j++) {
                const __m256 a = r[j], b = r[j + h];
                r[j] = _mm256_add_ps(a, b);
                r[j + h] = _mm256_sub_ps(a, b);
            }
    #pragma GCC unroll 16
    for (int i = 0; i < NV; i++)
        _mm256_storeu_ps(v + 8 * i, scale_now ? _mm256_mul_ps(r[i], k) : r[i]);
}

static NC_CQ_TARGET void nc_cq_fwht_avx2(float* v, ptrdiff_t n, float scale) {
    const __m256 k = _mm256_set1_ps(scale);
    const ptrdiff_t B = n < 128 ? n : 128;
    const int scale_now = (n == B);
    for (ptrdiff_t i = 0; i < n; i += B) {
        switch (B) {
        case 8: nc_cq_fwht_block(v + i, 1, scale_now, k); break;
        case 16: nc_cq_fwht_block(v + i, 2, scale_now, k); break;
        case 32: nc_cq_fwht_block(v + i, 4, scale_now, k); break;
        case 64: nc_cq_fwht_block(v + i, 8, scale_now, k); break;
        default: nc_cq_fwht_block(v + i, 16, scale_now, k); break;
        }
    }
    for (ptrdiff_t h = 128; h < n; h *= 2) {
        const int last = (2 * h == n);
        for (ptrdiff_t i = 0; i < n; i += 2 * h) {
            for (ptrdiff_t j = i; j < i + h; j += 8) {
                __m256 a = _mm256_loadu_ps(v + j), b = _mm256_loadu_ps(v + j + h);
                __m256 p = _mm256_add_ps(a, b), m = _mm256_sub_ps(a, b);
                if (last) { p = _mm256_mul_ps(p, k); m = _mm256_mul_ps(m, k); }
                _mm256_storeu_ps(v + j, p);
                _mm256_storeu_ps(v + j + h, m);
            }
        }
    }
}
#else
static void nc_cq_fwht_avx2(float* v, ptrdiff_t n, float scale) {}
#endif

/* The portable butterflies, then the scale. */
static inline void nc_wht_portable(float* v, ptrdiff_t n, float scale) {
    for (ptrdiff_t h = 1; h < n; h *= 2) {
        for (ptrdiff_t i = 0; i < n; i += 2 * h) {
            for (ptrdiff_t j = i; j < i + h; j++) {
                const float a = v[j], b = v[j + h];
                v[j] = a + b;
                v[j + h] = a - b;
            }
        }
    }
    for (ptrdiff_t j = 0; j < n; j++) v[j] *= scale;
}

/* simd: the caller's answer to "may the AVX2 kernels run" (it owns that switch);
   below 8 floats there is no whole vector, so the butterflies run. */
static inline void nc_wht(float* v, ptrdiff_t n, float scale, int simd) {
    if (n >= 8 && simd) {
        nc_cq_fwht_avx2(v, n, scale);
        return;
    }
    nc_wht_portable(v, n, scale);
}

#endif  /* NEEDLE_CY_WHT_H */
