/* Roofline probes: loops that run one instruction kind (or one memory read stream) as fast
 * as the core allows, for needle_cy/_roofline.pyx and the benchmark report.
 *
 * Compute probes keep NACC independent accumulators so the loop is bound by the
 * instruction's throughput, not its latency (latency x pipes of the widest FMA on current
 * cores is <= 8 to 10 in flight).  Each one returns the multiply-accumulates it did (one
 * MAC = one product added into an accumulator lane), and a checksum the caller keeps so
 * the compiler cannot drop the loop.  Every x86 intrinsic sits behind the macro of its
 * ISA extension and every NEON one behind its __ARM_* macro; the generic fallbacks are
 * plain C (GCC/Clang vector extensions where available), so this builds anywhere.
 */
#ifndef NEEDLE_CY_ROOFLINE_PROBES_H
#define NEEDLE_CY_ROOFLINE_PROBES_H

#include <stdint.h>
#include <stddef.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__) || defined(_M_X64)
#include <immintrin.h>
#endif
#if defined(__ARM_NEON) || defined(__aarch64__)
#include <arm_neon.h>
#endif
#ifdef _OPENMP
#include <omp.h>
#endif

/* NC_RF_OPAQUE(v): the compiler must assume the vector v changed, so a product of
 * loop-invariant operands is recomputed every pass instead of hoisted out of the loop.
 * NC_RF_CLOBBER: memory may have changed (a re-read of a buffer is not skipped). */
#if defined(__GNUC__) || defined(__clang__)
#if defined(__AVX512F__)
#define NC_RF_OPAQUE(v) __asm__ __volatile__("" : "+v"(v))
#elif defined(__x86_64__) || defined(__i386__)
#define NC_RF_OPAQUE(v) __asm__ __volatile__("" : "+x"(v))
#else
#define NC_RF_OPAQUE(v) __asm__ __volatile__("" : "+w"(v))
#endif
#define NC_RF_CLOBBER() __asm__ __volatile__("" ::: "memory")
#else
#define NC_RF_OPAQUE(v) ((void)0)
#define NC_RF_CLOBBER() ((void)0)
#endif

/* ---------------------------------------------------------------- float32 FMA */

static const char* nc_rf_fma_isa(void) {
#if defined(__AVX512F__)
    return "avx512f vfmadd231ps zmm";
#elif defined(__FMA__) && defined(__AVX__)
    return "fma vfmadd231ps ymm";
#elif defined(__aarch64__) && defined(__ARM_NEON)
    return "neon fmla v.4s";
#elif defined(__GNUC__) || defined(__clang__)
    return "generic vector a*b+c (16 B)";
#else
    return "scalar a*b+c";
#endif
}

/* iters passes of NACC vector FMAs; returns MACs (lanes x NACC x iters). */
static double nc_rf_fma_loop(int64_t iters, float* checksum) {
#if defined(__AVX512F__)
#define NACC 16
    __m512 acc[NACC];
    __m512 a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-7f);
    for (int i = 0; i < NACC; i++) acc[i] = _mm512_set1_ps((float)i);
    for (int64_t it = 0; it < iters; it++) {
        for (int i = 0; i < NACC; i++) acc[i] = _mm512_fmadd_ps(acc[i], a, b);
    }
    __m512 s = acc[0];
    for (int i = 1; i < NACC; i++) s = _mm512_add_ps(s, acc[i]);
    *checksum = _mm512_reduce_add_ps(s);
    return (double)iters * NACC * 16;
#undef NACC
#elif defined(__FMA__) && defined(__AVX__)
#define NACC 12
    __m256 acc[NACC];
    __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-7f);
    for (int i = 0; i < NACC; i++) acc[i] = _mm256_set1_ps((float)i);
    for (int64_t it = 0; it < iters; it++) {
        for (int i = 0; i < NACC; i++) acc[i] = _mm256_fmadd_ps(acc[i], a, b);
    }
    float lanes[8];
    __m256 s = acc[0];
    for (int i = 1; i < NACC; i++) s = _mm256_add_ps(s, acc[i]);
    _mm256_storeu_ps(lanes, s);
    *checksum = lanes[0] + lanes[7];
    return (double)iters * NACC * 8;
#undef NACC
#elif defined(__aarch64__) && defined(__ARM_NEON)
#define NACC 16
    float32x4_t acc[NACC];
    float32x4_t a = vdupq_n_f32(0.999999f), b = vdupq_n_f32(1e-7f);
    for (int i = 0; i < NACC; i++) acc[i] = vdupq_n_f32((float)i);
    for (int64_t it = 0; it < iters; it++) {
        for (int i = 0; i < NACC; i++) acc[i] = vfmaq_f32(b, acc[i], a);
    }
    float32x4_t s = acc[0];
    for (int i = 1; i < NACC; i++) s = vaddq_f32(s, acc[i]);
    *checksum = vaddvq_f32(s);
    return (double)iters * NACC * 4;
#undef NACC
#elif defined(__GNUC__) || defined(__clang__)
#define NACC 12
    typedef float v4f __attribute__((vector_size(16)));
    v4f acc[NACC];
    v4f a = {0.999999f, 0.999999f, 0.999999f, 0.999999f}, b = {1e-7f, 1e-7f, 1e-7f, 1e-7f};
    for (int i = 0; i < NACC; i++) { v4f z = {(float)i, (float)i, (float)i, (float)i}; acc[i] = z; }
    for (int64_t it = 0; it < iters; it++) {
        for (int i = 0; i < NACC; i++) acc[i] = acc[i] * a + b;
    }
    v4f s = acc[0];
    for (int i = 1; i < NACC; i++) s += acc[i];
    *checksum = s[0] + s[3];
    return (double)iters * NACC * 4;
#undef NACC
#else
#define NACC 8
    float acc[NACC];
    for (int i = 0; i < NACC; i++) acc[i] = (float)i;
    for (int64_t it = 0; it < iters; it++) {
        for (int i = 0; i < NACC; i++) acc[i] = acc[i] * 0.999999f + 1e-7f;
    }
    float s = 0.0f;
    for (int i = 0; i < NACC; i++) s += acc[i];
    *checksum = s;
    return (double)iters * NACC;
#undef NACC
#endif
}

/* ---------------------------------------------------------------- int8 dot products */

static const char* nc_rf_int8_isa(void) {
#if defined(__AVX512VNNI__) && defined(__AVX512F__)
    return "avx512vnni vpdpbusd zmm (u8 x s8 -> s32)";
#elif defined(__AVX512BW__)
    return "avx512bw vpmaddubsw + vpmaddwd zmm (u8 x s8)";
#elif defined(__AVXVNNI__)
    return "avxvnni vpdpbusd ymm (u8 x s8 -> s32)";
#elif defined(__AVX2__)
    return "avx2 vpmaddubsw + vpmaddwd ymm (u8 x s8)";
#elif defined(__aarch64__) && defined(__ARM_FEATURE_DOTPROD)
    return "neon sdot v.16b (s8 x s8 -> s32)";
#elif defined(__aarch64__) && defined(__ARM_NEON)
    return "neon smlal (s8 x s8 -> s16)";
#else
    return "scalar int32 multiply-add";
#endif
}

static double nc_rf_int8_loop(int64_t iters, int64_t* checksum) {
#if defined(__AVX512VNNI__) && defined(__AVX512F__)
#define NACC 16
    __m512i acc[NACC];
    __m512i a = _mm512_set1_epi8(3), b = _mm512_set1_epi8(-2);
    for (int i = 0; i < NACC; i++) acc[i] = _mm512_set1_epi32(i);
    for (int64_t it = 0; it < iters; it++) {
        for (int i = 0; i < NACC; i++) acc[i] = _mm512_dpbusd_epi32(acc[i], a, b);
    }
    __m512i s = acc[0];
    for (int i = 1; i < NACC; i++) s = _mm512_add_epi32(s, acc[i]);
    *checksum = _mm512_reduce_add_epi32(s);
    return (double)iters * NACC * 64;
#undef NACC
#elif defined(__AVX512BW__)
#define NACC 12
    __m512i acc[NACC];
    __m512i a = _mm512_set1_epi8(3), b = _mm512_set1_epi8(-2), one = _mm512_set1_epi16(1);
    for (int i = 0; i < NACC; i++) acc[i] = _mm512_set1_epi32(i);
    for (int64_t it = 0; it < iters; it++) {
        for (int i = 0; i < NACC; i++)
            acc[i] = _mm512_add_epi32(acc[i], _mm512_madd_epi16(_mm512_maddubs_epi16(a, b), one));
        NC_RF_OPAQUE(a);
    }
    __m512i s = acc[0];
    for (int i = 1; i < NACC; i++) s = _mm512_add_epi32(s, acc[i]);
    *checksum = _mm512_reduce_add_epi32(s);
    return (double)iters * NACC * 64;
#undef NACC
#elif defined(__AVXVNNI__)
#define NACC 12
    __m256i acc[NACC];
    __m256i a = _mm256_set1_epi8(3), b = _mm256_set1_epi8(-2);
    for (int i = 0; i < NACC; i++) acc[i] = _mm256_set1_epi32(i);
    for (int64_t it = 0; it < iters; it++) {
        for (int i = 0; i < NACC; i++) acc[i] = _mm256_dpbusd_avx_epi32(acc[i], a, b);
    }
    __m256i s = acc[0];
    for (int i = 1; i < NACC; i++) s = _mm256_add_epi32(s, acc[i]);
    int32_t lanes[8];
    _mm256_storeu_si256((__m256i*)lanes, s);
    *checksum = lanes[0] + lanes[7];
    return (double)iters * NACC * 32;
#undef NACC
#elif defined(__AVX2__)
#define NACC 10
    __m256i acc[NACC];
    __m256i a = _mm256_set1_epi8(3), b = _mm256_set1_epi8(-2), one = _mm256_set1_epi16(1);
    for (int i = 0; i < NACC; i++) acc[i] = _mm256_set1_epi32(i);
    for (int64_t it = 0; it < iters; it++) {
        for (int i = 0; i < NACC; i++)
            acc[i] = _mm256_add_epi32(acc[i], _mm256_madd_epi16(_mm256_maddubs_epi16(a, b), one));
        NC_RF_OPAQUE(a);
    }
    __m256i s = acc[0];
    for (int i = 1; i < NACC; i++) s = _mm256_add_epi32(s, acc[i]);
    int32_t lanes[8];
    _mm256_storeu_si256((__m256i*)lanes, s);
    *checksum = lanes[0] + lanes[7];
    return (double)iters * NACC * 32;
#undef NACC
#elif defined(__aarch64__) && defined(__ARM_FEATURE_DOTPROD)
#define NACC 16
    int32x4_t acc[NACC];
    int8x16_t a = vdupq_n_s8(3), b = vdupq_n_s8(-2);
    for (int i = 0; i < NACC; i++) acc[i] = vdupq_n_s32(i);
    for (int64_t it = 0; it < iters; it++) {
        for (int i = 0; i < NACC; i++) acc[i] = vdotq_s32(acc[i], a, b);
    }
    int32x4_t s = acc[0];
    for (int i = 1; i < NACC; i++) s = vaddq_s32(s, acc[i]);
    *checksum = vaddvq_s32(s);
    return (double)iters * NACC * 16;
#undef NACC
#elif defined(__aarch64__) && defined(__ARM_NEON)
#define NACC 16
    int16x8_t acc[NACC];
    int8x8_t a = vdup_n_s8(3), b = vdup_n_s8(-2);
    for (int i = 0; i < NACC; i++) acc[i] = vdupq_n_s16((int16_t)i);
    for (int64_t it = 0; it < iters; it++) {
        for (int i = 0; i < NACC; i++) acc[i] = vmlal_s8(acc[i], a, b);
    }
    int16x8_t s = acc[0];
    for (int i = 1; i < NACC; i++) s = vaddq_s16(s, acc[i]);
    *checksum = vaddvq_s16(s);
    return (double)iters * NACC * 8;
#undef NACC
#else
#define NACC 8
    int32_t acc[NACC];
    volatile int32_t va = 3, vb = -2;
    int32_t a = va, b = vb;
    for (int i = 0; i < NACC; i++) acc[i] = i;
    for (int64_t it = 0; it < iters; it++) {
        for (int i = 0; i < NACC; i++) acc[i] += a * b;
    }
    int64_t s = 0;
    for (int i = 0; i < NACC; i++) s += acc[i];
    *checksum = s;
    return (double)iters * NACC;
#undef NACC
#endif
}

/* ---------------------------------------------------------------- int16 dot products
 * The engine's exact integer CQ kernels multiply int16 codes by int16 activations
 * (vpdpwssd / vpmaddwd), so this is the ceiling they work under. */

static const char* nc_rf_int16_isa(void) {
#if defined(__AVX512VNNI__) && defined(__AVX512F__)
    return "avx512vnni vpdpwssd zmm (s16 x s16 -> s32)";
#elif defined(__AVX512BW__)
    return "avx512bw vpmaddwd zmm";
#elif defined(__AVX2__)
    return "avx2 vpmaddwd ymm";
#elif defined(__aarch64__) && defined(__ARM_NEON)
    return "neon smlal (s16 x s16 -> s32)";
#else
    return "scalar int32 multiply-add";
#endif
}

static double nc_rf_int16_loop(int64_t iters, int64_t* checksum) {
#if defined(__AVX512VNNI__) && defined(__AVX512F__)
#define NACC 16
    __m512i acc[NACC];
    __m512i a = _mm512_set1_epi16(3), b = _mm512_set1_epi16(-2);
    for (int i = 0; i < NACC; i++) acc[i] = _mm512_set1_epi32(i);
    for (int64_t it = 0; it < iters; it++) {
        for (int i = 0; i < NACC; i++) acc[i] = _mm512_dpwssd_epi32(acc[i], a, b);
    }
    __m512i s = acc[0];
    for (int i = 1; i < NACC; i++) s = _mm512_add_epi32(s, acc[i]);
    *checksum = _mm512_reduce_add_epi32(s);
    return (double)iters * NACC * 32;
#undef NACC
#elif defined(__AVX512BW__)
#define NACC 12
    __m512i acc[NACC];
    __m512i a = _mm512_set1_epi16(3), b = _mm512_set1_epi16(-2);
    for (int i = 0; i < NACC; i++) acc[i] = _mm512_set1_epi32(i);
    for (int64_t it = 0; it < iters; it++) {
        for (int i = 0; i < NACC; i++) acc[i] = _mm512_add_epi32(acc[i], _mm512_madd_epi16(a, b));
        NC_RF_OPAQUE(a);
    }
    __m512i s = acc[0];
    for (int i = 1; i < NACC; i++) s = _mm512_add_epi32(s, acc[i]);
    *checksum = _mm512_reduce_add_epi32(s);
    return (double)iters * NACC * 32;
#undef NACC
#elif defined(__AVX2__)
#define NACC 10
    __m256i acc[NACC];
    __m256i a = _mm256_set1_epi16(3), b = _mm256_set1_epi16(-2);
    for (int i = 0; i < NACC; i++) acc[i] = _mm256_set1_epi32(i);
    for (int64_t it = 0; it < iters; it++) {
        for (int i = 0; i < NACC; i++) acc[i] = _mm256_add_epi32(acc[i], _mm256_madd_epi16(a, b));
        NC_RF_OPAQUE(a);
    }
    __m256i s = acc[0];
    for (int i = 1; i < NACC; i++) s = _mm256_add_epi32(s, acc[i]);
    int32_t lanes[8];
    _mm256_storeu_si256((__m256i*)lanes, s);
    *checksum = lanes[0] + lanes[7];
    return (double)iters * NACC * 16;
#undef NACC
#elif defined(__aarch64__) && defined(__ARM_NEON)
#define NACC 16
    int32x4_t acc[NACC];
    int16x4_t a = vdup_n_s16(3), b = vdup_n_s16(-2);
    for (int i = 0; i < NACC; i++) acc[i] = vdupq_n_s32(i);
    for (int64_t it = 0; it < iters; it++) {
        for (int i = 0; i < NACC; i++) acc[i] = vmlal_s16(acc[i], a, b);
    }
    int32x4_t s = acc[0];
    for (int i = 1; i < NACC; i++) s = vaddq_s32(s, acc[i]);
    *checksum = vaddvq_s32(s);
    return (double)iters * NACC * 4;
#undef NACC
#else
#define NACC 8
    int32_t acc[NACC];
    volatile int32_t va = 3, vb = -2;
    int32_t a = va, b = vb;
    for (int i = 0; i < NACC; i++) acc[i] = i;
    for (int64_t it = 0; it < iters; it++) {
        for (int i = 0; i < NACC; i++) acc[i] += a * b;
    }
    int64_t s = 0;
    for (int i = 0; i < NACC; i++) s += acc[i];
    *checksum = s;
    return (double)iters * NACC;
#undef NACC
#endif
}

/* kind 0 = float32 FMA, 1 = int8 dot, 2 = int16 dot; on `threads` OpenMP threads at once
 * (each its own accumulators).  Returns the MACs of all threads together. */
static double nc_rf_compute(int kind, int64_t iters, int threads, double* checksum) {
    double macs = 0.0, sum = 0.0;
#ifdef _OPENMP
    #pragma omp parallel num_threads(threads) reduction(+:macs, sum)
#endif
    {
        if (kind == 0) {
            float c = 0.0f;
            macs += nc_rf_fma_loop(iters, &c);
            sum += c;
        } else if (kind == 1) {
            int64_t c = 0;
            macs += nc_rf_int8_loop(iters, &c);
            sum += (double)c;
        } else {
            int64_t c = 0;
            macs += nc_rf_int16_loop(iters, &c);
            sum += (double)c;
        }
    }
    (void)threads;
    *checksum = sum;
    return macs;
}

/* ---------------------------------------------------------------- read bandwidth
 * Sum a buffer's 64-bit words `reps` times; with OpenMP each thread reads its own
 * contiguous share (the split a kernel's prange makes).  Four independent vector
 * accumulators keep the adds far below the load rate, so the loop is bound by the
 * memory level the buffer lives in.  buf must be 64-byte aligned; each share is read in
 * whole 256-byte blocks and *bytes_read says how many bytes were read in all. */
static uint64_t nc_rf_read_chunk(const uint64_t* p, size_t words) {
#if defined(__GNUC__) || defined(__clang__)
    typedef uint64_t v8u __attribute__((vector_size(64)));
    const v8u* v = (const v8u*)p;
    v8u a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
    size_t nv = words / 8;
    for (size_t i = 0; i + 4 <= nv; i += 4) {
        a0 += v[i]; a1 += v[i + 1]; a2 += v[i + 2]; a3 += v[i + 3];
    }
    v8u s = a0 + a1 + a2 + a3;
    uint64_t out = 0;
    for (int i = 0; i < 8; i++) out += s[i];
    return out;
#else
    uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0;
    for (size_t i = 0; i + 4 <= words; i += 4) {
        a0 += p[i]; a1 += p[i + 1]; a2 += p[i + 2]; a3 += p[i + 3];
    }
    return a0 + a1 + a2 + a3;
#endif
}

static uint64_t nc_rf_read(const unsigned char* buf, size_t n_bytes, int64_t reps, int threads,
                           double* bytes_read) {
    uint64_t total = 0;
    double bytes = 0.0;
    size_t words = n_bytes / 8;
#ifdef _OPENMP
    #pragma omp parallel num_threads(threads) reduction(+:total, bytes)
    {
        int t = omp_get_thread_num(), nt = omp_get_num_threads();
        size_t share = words / (size_t)nt / 32 * 32;
        bytes += 8.0 * (double)share * (double)reps;
        const uint64_t* p = (const uint64_t*)buf + (size_t)t * share;
        for (int64_t r = 0; r < reps; r++) {
            total += nc_rf_read_chunk(p, share);
            NC_RF_CLOBBER();
        }
    }
#else
    (void)threads;
    for (int64_t r = 0; r < reps; r++) {
        total += nc_rf_read_chunk((const uint64_t*)buf, words);
        NC_RF_CLOBBER();
    }
    bytes = 8.0 * (double)(words / 32 * 32) * (double)reps;
#endif
    *bytes_read = bytes;
    return total;
}

#endif
