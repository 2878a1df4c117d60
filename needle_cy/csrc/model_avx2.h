/* The model's own vector loop (_model): the mHC lane update of a prefill chunk,
   AVX2 + FMA where the build targets it, else nc_lane_update_avx2 returns 0 and the
   plain loops in _model run. */
#ifndef NEEDLE_CY_MODEL_AVX2_H
#define NEEDLE_CY_MODEL_AVX2_H

#include <stddef.h>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
/* _lane_update_cols' columns [c0, c1) (c1 - c0 a multiple of 8, n <= 8) eight at a
   time, every value in registers: x' = (x + a) - u, lane i' = P[i,0]·X0 + Σ_j P[i,j]·Xj
   (j in order, each term one FMA) + ph[n+i]·x', cell = (X0' + X1' + ...) / n: the
   plain loops' operations, element by element, so the same bits.  Those loops
   read and wrote each lane row n times and went through the scratch rows Xn (the
   router input, dead by now, is not written here); the prefill chunk's lanes come
   from beyond L2, and the loops were a visible part of a one-thread prefill.
   Returns 0 (nothing done) where it does not apply. */
static inline int nc_lane_update_avx2(float* x, const float* a, const float* u, float* X,
                                      const float* ph, ptrdiff_t n, ptrdiff_t d,
                                      float* cell, ptrdiff_t c0, ptrdiff_t c1) {
    if (n < 1 || n > 8 || (c1 - c0) % 8) return 0;
    const float* P = ph + 2 * n;
    const __m256 n_f = _mm256_set1_ps((float)n);
    for (ptrdiff_t c = c0; c < c1; c += 8) {
        const __m256 y = _mm256_sub_ps(_mm256_add_ps(_mm256_loadu_ps(x + c), _mm256_loadu_ps(a + c)),
                                       _mm256_loadu_ps(u + c));
        _mm256_storeu_ps(x + c, y);
        __m256 lane[8], out[8];
        for (ptrdiff_t j = 0; j < n; j++) lane[j] = _mm256_loadu_ps(X + j * d + c);
        for (ptrdiff_t i = 0; i < n; i++) {
            __m256 v = _mm256_mul_ps(_mm256_set1_ps(P[i * n]), lane[0]);
            for (ptrdiff_t j = 1; j < n; j++) v = _mm256_fmadd_ps(_mm256_set1_ps(P[i * n + j]), lane[j], v);
            out[i] = _mm256_fmadd_ps(_mm256_set1_ps(ph[n + i]), y, v);
        }
        __m256 sum = out[0];
        for (ptrdiff_t i = 0; i < n; i++) {
            _mm256_storeu_ps(X + i * d + c, out[i]);
            if (i > 0) sum = _mm256_add_ps(sum, out[i]);
        }
        _mm256_storeu_ps(cell + c, _mm256_div_ps(sum, n_f));
    }
    return 1;
}
#else
static inline int nc_lane_update_avx2(float* x, const float* a, const float* u, float* X,
                                      const float* ph, ptrdiff_t n, ptrdiff_t d,
                                      float* cell, ptrdiff_t c0, ptrdiff_t c1) {
    return 0;
}
#endif

#endif  /* NEEDLE_CY_MODEL_AVX2_H */
