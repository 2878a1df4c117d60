/* Integer CQ matvec and matmul on A8 activations for aarch64 NEON (cq_int_avx512_tmpl.h's x86
   kernels, with the same numerics).

   Included by cq_neon.h once per variant, with
     NC_NEON_SUF   name suffix (neon, neon_dotprod)
     NC_NEON_TGT   target attribute string ("+dotprod", or "" for the baseline)
     NC_NEON_DOT   1: int8 byte planes and vdotq_s32 (sdot); 0: int16 halves and vmlal_s16
   The build target stays -march=armv8-a (Raspberry Pi 3/4 have no dotprod), so the
   dotprod variant is compiled with a function target attribute and chosen at run
   time (getauxval, see cpu_features.h).

   What both compute is exactly the x86 kernels' arithmetic (cq_int_avx512_tmpl.h):
   chunks of 32 packed bytes (256/fb fields), lane l (0 ≤ l < 16) of a chunk holding
   the fields of bytes 2l and 2l + 1 (16/fb consecutive fields, one group); per lane
   and per flush (a group, or a chunk where a chunk spans several groups) the int32
   sums ah = Σ hi[i_j]·z_j and al = Σ lo[i_j]·z_j, then in float
       sum = fma(float(ah), B, float(al)),  total_l = fma(sum, ν_l, total_l),
   and the same lane-sum tree of the 16 totals, (q0 + q2) + (q1 + q3) with
   q_i = (t_i + t_{i+8}) + (t_{i+4} + t_{i+12}), times scale.  The int32 sums are
   exact (_cq.pyx sizes B and E so that no lane's sum overflows), so the order in
   which the products are added does not matter, only that each int32 sum holds the
   products of one lane and one flush; every float operation is the x86 one in the
   same order, so results are bitwise those of the AVX-512 kernels.

   NC_NEON_DOT 0 (every ARMv8-A core): z is int16 in the x86 lane order
   (z[c·C + 32·s + w] = code of field s of byte w of chunk c).  Per half chunk
   (16 bytes, lanes 8h … 8h + 7) and step s the indices (byte >> s·fb) & mask look up
   the byte planes of hi and lo (vqtbl1q_u8), a zip makes them int16, and vmlal_s16
   accumulates one int32 per byte; the flush adds byte pairs (vpaddq_s32).

   NC_NEON_DOT 1 (cores with the dot product extension, e.g. Cortex-A76 in the
   Pi 5): sdot multiplies int8, so both factors are split into signed bytes,
   hi = 256·hh + hl and z = 256·zh + zl, and
       ah = 65536·Σ hh·zh + 256·(Σ hh·zl + Σ hl·zh) + Σ hl·zl
   (three int32 accumulators per half, recombined per flush; the wrap-around int32
   arithmetic gives ah exactly since ah itself fits).  An sdot lane sums 4 bytes:
   the indices of steps s and s + 1 are interleaved by 16-bit pairs (vzip1q_u16), so
   each 4-byte group is bytes 2l, 2l + 1 at both steps, i.e. one lane.  z is stored
   as those byte planes in that order (nc_cqn_pack_codes).  Per 16 fields and
   codebook half both variants take 2 table lookups and 4 multiply instructions
   (4 sdot of 16 byte products, or 4 vmlal of 4 int16 products), the vmlal one 2
   zips more (the dotprod one a zip of the indices per 2 steps); which is faster
   depends on the core's sdot and vmlal throughput, not measured (no aarch64
   hardware here, only qemu). */

#ifndef NC_NEON_PF_ROWS
#define NC_NEON_PF_ROWS 8    /* matvec prefetch distance in rows, as the x86 kernels */
#endif
/* Tokens per tile of the matmul: they share every decoded step. */
#define NC_NEON_MM_TOKENS 2
#define NC_NEON_CAT2(a, b) a##_##b
#define NC_NEON_CAT(a, b) NC_NEON_CAT2(a, b)
#define NC_NEON_FN(name) NC_NEON_CAT(name, NC_NEON_SUF)
#define NC_NEON_AI static inline __attribute__((always_inline, target(NC_NEON_TGT)))

/* 16 packed bytes; never reads at or past `end` (the bytes past it read as zero). */
NC_NEON_AI uint8x16_t NC_NEON_FN(nc_cqn_load)(const uint8_t* p, const uint8_t* end) {
    if (end - p >= 16) return vld1q_u8(p);
    uint8_t buf[16];
    memset(buf, 0, sizeof buf);
    if (end > p) memcpy(buf, p, (size_t)(end - p));
    return vld1q_u8(buf);
}

/* The lane-sum tree of cq_int_avx512_tmpl.h's nc_cqi_hsum8 for one set of 16 totals. */
NC_NEON_AI float NC_NEON_FN(nc_cqn_hsum16)(const float32x4_t t[4]) {
    const float32x4_t q = vaddq_f32(vaddq_f32(t[0], t[2]), vaddq_f32(t[1], t[3]));
    const float a = vgetq_lane_f32(q, 0) + vgetq_lane_f32(q, 2);
    const float b = vgetq_lane_f32(q, 1) + vgetq_lane_f32(q, 3);
    return a + b;
}

/* Norms of lanes 8h + 4k … 8h + 4k + 3 for the flush starting at field f0 of the row. */
NC_NEON_AI float32x4_t NC_NEON_FN(nc_cqn_norms)(const float* nrow, ptrdiff_t f0, int g_shift, int per_chunk_norm,
                                                const int* lane_groups) {
    const float* nr = nrow + (f0 >> g_shift);
    if (per_chunk_norm) return vdupq_n_f32(nr[0]);
    float v[4];
    for (int i = 0; i < 4; i++) v[i] = nr[lane_groups[i]];
    return vld1q_f32(v);
}

/* One row times NT tokens: y[t·y_stride] = dot · scale[t].  z_stride: int16 per token. */
NC_NEON_AI void NC_NEON_FN(nc_cqn_tile)(const uint8_t* row, const uint8_t* end, ptrdiff_t row_bytes,
                                        const float* nrow, const int16_t* z, ptrdiff_t z_stride,
                                        ptrdiff_t n_chunks, int g, const uint8x16_t tab[4],
                                        const int lane_groups[16], float base, const float* scale,
                                        float* y, ptrdiff_t y_stride, const int fb, const int NT,
                                        const int prefetch) {
    const int S = 8 / fb;
    const ptrdiff_t C = 256 / fb;
    const int g_shift = __builtin_ctz((unsigned)g);
    const ptrdiff_t per = g >= C ? g / C : 1;  /* chunks per flush */
    const int per_chunk_norm = g >= C;
    const uint8x16_t mask = vdupq_n_u8((uint8_t)((1u << fb) - 1u));
    /* right shifts by fb and 2·fb (ushl by a negative count: fine for any fb, where
       vshrq_n_u8 needs an immediate) */
    const int8x16_t down1 = vdupq_n_s8((int8_t)-fb), down2 = vdupq_n_s8((int8_t)(-2 * fb));
    (void)down2;  /* (the vmlal variant shifts by fb only) */
    const float32x4_t vbase = vdupq_n_f32(base);
    float32x4_t total[NC_NEON_MM_TOKENS][4];
    for (int t = 0; t < NT; t++)
        for (int k = 0; k < 4; k++) total[t][k] = vdupq_n_f32(0.0f);
    for (ptrdiff_t c0 = 0; c0 < n_chunks; c0 += per) {
        for (int h = 0; h < 2; h++) {  /* bytes 16h … 16h + 15: lanes 8h … 8h + 7 */
#if NC_NEON_DOT
            /* [q][0..2]: Σ hh·zh, Σ hh·zl + hl·zh, Σ hl·zl of hi; [q][3..5] the same of lo */
            int32x4_t acc[NC_NEON_MM_TOKENS][2][6];
            for (int t = 0; t < NT; t++)
                for (int q = 0; q < 2; q++)
                    for (int k = 0; k < 6; k++) acc[t][q][k] = vdupq_n_s32(0);
            for (ptrdiff_t c = c0; c < c0 + per; c++) {
                const uint8_t* p = row + c * 32 + 16 * h;
                uint8x16_t v = NC_NEON_FN(nc_cqn_load)(p, end);
                if (prefetch && p + NC_NEON_PF_ROWS * row_bytes < end)
                    __builtin_prefetch(p + NC_NEON_PF_ROWS * row_bytes);
                /* this half chunk's z planes: S/2 step pairs × 2 zips × (zl, zh) × 16 bytes */
                const int8_t* zc = (const int8_t*)(z + c * C) + h * (32 * S);
                for (int sp = 0; sp < S / 2; sp++) {
                    const uint8x16_t a = vandq_u8(v, mask);
                    const uint8x16_t b = vandq_u8(vshlq_u8(v, down1), mask);
                    v = vshlq_u8(v, down2);
                    const uint16x8_t a16 = vreinterpretq_u16_u8(a), b16 = vreinterpretq_u16_u8(b);
                    for (int q = 0; q < 2; q++) {
                        const uint8x16_t idx = vreinterpretq_u8_u16(q == 0 ? vzip1q_u16(a16, b16) : vzip2q_u16(a16, b16));
                        const int8x16_t hh = vreinterpretq_s8_u8(vqtbl1q_u8(tab[0], idx));
                        const int8x16_t hl = vreinterpretq_s8_u8(vqtbl1q_u8(tab[1], idx));
                        const int8x16_t lh = vreinterpretq_s8_u8(vqtbl1q_u8(tab[2], idx));
                        const int8x16_t ll = vreinterpretq_s8_u8(vqtbl1q_u8(tab[3], idx));
                        for (int t = 0; t < NT; t++) {
                            const int8_t* zq = zc + t * 2 * z_stride + (2 * sp + q) * 32;
                            const int8x16_t zl = vld1q_s8(zq), zh = vld1q_s8(zq + 16);
                            int32x4_t* A = acc[t][q];
                            A[0] = vdotq_s32(A[0], hh, zh);
                            A[1] = vdotq_s32(vdotq_s32(A[1], hh, zl), hl, zh);
                            A[2] = vdotq_s32(A[2], hl, zl);
                            A[3] = vdotq_s32(A[3], lh, zh);
                            A[4] = vdotq_s32(vdotq_s32(A[4], lh, zl), ll, zh);
                            A[5] = vdotq_s32(A[5], ll, zl);
                        }
                    }
                }
            }
#else
            /* [0..3]: one int32 per byte of hi·z (bytes 4k … 4k + 3), [4..7] of lo·z */
            int32x4_t acc[NC_NEON_MM_TOKENS][8];
            for (int t = 0; t < NT; t++)
                for (int k = 0; k < 8; k++) acc[t][k] = vdupq_n_s32(0);
            for (ptrdiff_t c = c0; c < c0 + per; c++) {
                const uint8_t* p = row + c * 32 + 16 * h;
                uint8x16_t v = NC_NEON_FN(nc_cqn_load)(p, end);
                if (prefetch && p + NC_NEON_PF_ROWS * row_bytes < end)
                    __builtin_prefetch(p + NC_NEON_PF_ROWS * row_bytes);
                const int16_t* zc = z + c * C + 16 * h;
                for (int s = 0; s < S; s++) {
                    const uint8x16_t idx = vandq_u8(v, mask);
                    v = vshlq_u8(v, down1);
                    const uint8x16_t hl = vqtbl1q_u8(tab[0], idx), hh = vqtbl1q_u8(tab[1], idx);
                    const uint8x16_t ll = vqtbl1q_u8(tab[2], idx), lh = vqtbl1q_u8(tab[3], idx);
                    const int16x8_t h0 = vreinterpretq_s16_u8(vzip1q_u8(hl, hh));
                    const int16x8_t h1 = vreinterpretq_s16_u8(vzip2q_u8(hl, hh));
                    const int16x8_t l0 = vreinterpretq_s16_u8(vzip1q_u8(ll, lh));
                    const int16x8_t l1 = vreinterpretq_s16_u8(vzip2q_u8(ll, lh));
                    for (int t = 0; t < NT; t++) {
                        const int16_t* zs = zc + t * z_stride + 32 * s;
                        const int16x8_t z0 = vld1q_s16(zs), z1 = vld1q_s16(zs + 8);
                        int32x4_t* A = acc[t];
                        A[0] = vmlal_s16(A[0], vget_low_s16(h0), vget_low_s16(z0));
                        A[1] = vmlal_high_s16(A[1], h0, z0);
                        A[2] = vmlal_s16(A[2], vget_low_s16(h1), vget_low_s16(z1));
                        A[3] = vmlal_high_s16(A[3], h1, z1);
                        A[4] = vmlal_s16(A[4], vget_low_s16(l0), vget_low_s16(z0));
                        A[5] = vmlal_high_s16(A[5], l0, z0);
                        A[6] = vmlal_s16(A[6], vget_low_s16(l1), vget_low_s16(z1));
                        A[7] = vmlal_high_s16(A[7], l1, z1);
                    }
                }
            }
#endif
            const ptrdiff_t f0 = c0 * C;
            for (int k = 0; k < 2; k++) {  /* lanes 8h + 4k … 8h + 4k + 3 */
                const float32x4_t nv = NC_NEON_FN(nc_cqn_norms)(nrow, f0, g_shift, per_chunk_norm,
                                                                lane_groups + 8 * h + 4 * k);
                for (int t = 0; t < NT; t++) {
#if NC_NEON_DOT
                    const int32x4_t* A = acc[t][k];
                    const int32x4_t ah = vaddq_s32(vshlq_n_s32(A[0], 16), vaddq_s32(vshlq_n_s32(A[1], 8), A[2]));
                    const int32x4_t al = vaddq_s32(vshlq_n_s32(A[3], 16), vaddq_s32(vshlq_n_s32(A[4], 8), A[5]));
#else
                    const int32x4_t ah = vpaddq_s32(acc[t][2 * k], acc[t][2 * k + 1]);
                    const int32x4_t al = vpaddq_s32(acc[t][4 + 2 * k], acc[t][4 + 2 * k + 1]);
#endif
                    const float32x4_t sum = vfmaq_f32(vcvtq_f32_s32(al), vcvtq_f32_s32(ah), vbase);
                    total[t][2 * h + k] = vfmaq_f32(total[t][2 * h + k], sum, nv);
                }
            }
        }
    }
    for (int t = 0; t < NT; t++) y[t * y_stride] = NC_NEON_FN(nc_cqn_hsum16)(total[t]) * scale[t];
}

/* The codebook halves as byte tables for vqtbl1q_u8 (indices < 16).
   DOT 0: {low byte of hi, high byte of hi, low byte of lo, high byte of lo};
   DOT 1: {hh, hl, lh, ll}: hi = 256·hh + hl with hl the signed low byte. */
NC_NEON_AI void NC_NEON_FN(nc_cqn_tables)(const int16_t* table, uint8x16_t tab[4]) {
    uint8_t b[4][16];
    for (int i = 0; i < 16; i++) {
        for (int half = 0; half < 2; half++) {
            const int v = table[32 * half + i];
#if NC_NEON_DOT
            const int low = (int)(int8_t)(uint8_t)(v & 0xff);
            b[2 * half][i] = (uint8_t)(int8_t)((v - low) / 256);
            b[2 * half + 1][i] = (uint8_t)(int8_t)low;
#else
            b[2 * half][i] = (uint8_t)(v & 0xff);
            b[2 * half + 1][i] = (uint8_t)((v >> 8) & 0xff);
#endif
        }
    }
    for (int k = 0; k < 4; k++) tab[k] = vld1q_u8(b[k]);
}

NC_NEON_AI void NC_NEON_FN(nc_cqn_lane_groups)(int fb, int g, int lg[16]) {
    for (int l = 0; l < 16; l++) lg[l] = (16 * l / fb) / g;  /* lane l starts at field 16·l/fb */
}

#define NC_NEON_ROWS_CASE(FB) \
    for (ptrdiff_t r = r0; r < r1; r++) \
        NC_NEON_FN(nc_cqn_tile)(packed + r * row_bytes, end, row_bytes, norms + r * norm_stride, z, 0, n_chunks, \
                                g, tab, lg, base, &scale, y + r, 0, FB, 1, 1);

/* y[r] for rows r0 ≤ r < r1 (the matvec); same signature as nc_cqi_rows_*. */
static __attribute__((target(NC_NEON_TGT))) void NC_NEON_FN(nc_cqn_rows)(
        const uint8_t* packed, ptrdiff_t row_bytes, const uint8_t* end, const float* norms,
        ptrdiff_t norm_stride, const int16_t* z, ptrdiff_t n_chunks, int fb, int g,
        const int16_t* table, float base, float scale, ptrdiff_t r0, ptrdiff_t r1, float* y) {
    uint8x16_t tab[4];
    int lg[16];
    NC_NEON_FN(nc_cqn_tables)(table, tab);
    NC_NEON_FN(nc_cqn_lane_groups)(fb, g, lg);
    if (fb == 1) { NC_NEON_ROWS_CASE(1) }
    else if (fb == 2) { NC_NEON_ROWS_CASE(2) }
    else { NC_NEON_ROWS_CASE(4) }
}
#undef NC_NEON_ROWS_CASE

#define NC_NEON_MM_CASE(FB) \
    for (ptrdiff_t r = r0; r < r1; r++) { \
        if (nt == 2) \
            NC_NEON_FN(nc_cqn_tile)(packed + r * row_bytes, end, row_bytes, norms + r * norm_stride, zt, z_stride, \
                                    n_chunks, g, tab, lg, base, sc, Y + t0 * y_stride + r, y_stride, FB, 2, 0); \
        else \
            NC_NEON_FN(nc_cqn_tile)(packed + r * row_bytes, end, row_bytes, norms + r * norm_stride, zt, z_stride, \
                                    n_chunks, g, tab, lg, base, sc, Y + t0 * y_stride + r, y_stride, FB, 1, 0); \
    }

/* Y[t·y_stride + r] for rows r0 ≤ r < r1 and every token (the matmul; same signature as
   nc_cqi_mm_rows_*): token tiles outside, rows inside, each (row, token) summed as the
   matvec sums it, so a token's outputs are bitwise the matvec's. */
static __attribute__((target(NC_NEON_TGT))) void NC_NEON_FN(nc_cqn_mm_rows)(
        const uint8_t* packed, ptrdiff_t row_bytes, const uint8_t* end, const float* norms,
        ptrdiff_t norm_stride, const int16_t* z, ptrdiff_t z_stride, ptrdiff_t n_tokens, ptrdiff_t n_chunks,
        int fb, int g, const int16_t* table, float base, const float* s, float descale,
        ptrdiff_t r0, ptrdiff_t r1, float* Y, ptrdiff_t y_stride) {
    uint8x16_t tab[4];
    int lg[16];
    NC_NEON_FN(nc_cqn_tables)(table, tab);
    NC_NEON_FN(nc_cqn_lane_groups)(fb, g, lg);
    for (ptrdiff_t t0 = 0; t0 < n_tokens; t0 += NC_NEON_MM_TOKENS) {
        const int nt = (int)(n_tokens - t0 < NC_NEON_MM_TOKENS ? n_tokens - t0 : NC_NEON_MM_TOKENS);
        const int16_t* zt = z + t0 * z_stride;
        float sc[NC_NEON_MM_TOKENS];
        for (int t = 0; t < nt; t++) sc[t] = s[t0 + t] * descale;  /* as the matvec's scale */
        if (fb == 1) { NC_NEON_MM_CASE(1) }
        else if (fb == 2) { NC_NEON_MM_CASE(2) }
        else { NC_NEON_MM_CASE(4) }
    }
}
#undef NC_NEON_MM_CASE

/* The A8 codes of one token, as nc_cqi_a8_codes (same tests, same float operations:
   an unfused x − k·s, a division by s, round to nearest even); 0 when x is not an
   A8 vector, else 1 with kf[0:n] = k and *s_out = s. */
static __attribute__((target(NC_NEON_TGT))) int NC_NEON_FN(nc_cqn_a8_codes)(const float* x, ptrdiff_t n,
                                                                          float* kf, float* s_out) {
    float32x4_t vmax = vdupq_n_f32(0.0f);
    ptrdiff_t j;
    float tail[4];
    for (j = 0; j + 4 <= n; j += 4) vmax = vmaxq_f32(vmax, vabsq_f32(vld1q_f32(x + j)));
    if (j < n) {
        memset(tail, 0, sizeof tail);
        memcpy(tail, x + j, (size_t)(n - j) * sizeof(float));
        vmax = vmaxq_f32(vmax, vabsq_f32(vld1q_f32(tail)));
    }
    const float amax = vmaxvq_f32(vmax);   /* NaN propagates: every test below then fails */
    const float s = amax > 0 ? amax / 127.0f : 1.0f;
    const float32x4_t vs = vdupq_n_f32(s), tol = vdupq_n_f32(amax * 9.5367431640625e-07f);  /* 2^-20 */
    const float32x4_t kmax = vdupq_n_f32(127.0f);
    for (j = 0; j < n; j += 4) {
        const ptrdiff_t m = n - j >= 4 ? 4 : n - j;
        float32x4_t xv;
        if (m == 4) {
            xv = vld1q_f32(x + j);
        } else {
            memset(tail, 0, sizeof tail);
            memcpy(tail, x + j, (size_t)m * sizeof(float));
            xv = vld1q_f32(tail);
        }
        const float32x4_t k = vrndnq_f32(vdivq_f32(xv, vs));
        const uint32x4_t ok = vandq_u32(vcleq_f32(vabsq_f32(k), kmax),
                                        vcleq_f32(vabsq_f32(vsubq_f32(xv, vmulq_f32(k, vs))), tol));
        if (vminvq_u32(ok) != 0xffffffffu) return 0;   /* (padding lanes are zeros: they pass) */
        if (m == 4) {
            vst1q_f32(kf + j, k);
        } else {
            vst1q_f32(tail, k);
            memcpy(kf + j, tail, (size_t)m * sizeof(float));
        }
    }
    *s_out = s;
    return 1;
}

/* The rotated codes (exact small integers as floats, kf[0 : n_chunks·C]) in the
   kernel's layout.  DOT 0: int16, z[c·C + 32·s + w] = kf[c·C + S·w + s] (the x86
   order).  DOT 1: per chunk, half h, step pair sp, zip q: 16 bytes zl then 16 bytes
   zh, position i holding byte w = 16h + 8q + 2(i/4) + i%2 at step s = 2sp + (i/2)%2
   (the order of the interleaved indices in nc_cqn_tile); the same 2 bytes a field. */
static __attribute__((target(NC_NEON_TGT))) void NC_NEON_FN(nc_cqn_pack_codes)(const float* kf, ptrdiff_t n_chunks,
                                                                             int fb, int16_t* z) {
    const int S = 8 / (fb == 1 ? 1 : (fb == 2 ? 2 : 4));
    const ptrdiff_t C = 32 * S;
    for (ptrdiff_t c = 0; c < n_chunks; c++) {
        const float* src = kf + c * C;
#if NC_NEON_DOT
        int8_t* out = (int8_t*)(z + c * C);
        for (int h = 0; h < 2; h++)
            for (int sp = 0; sp < S / 2; sp++)
                for (int q = 0; q < 2; q++) {
                    int8_t* blk = out + h * (32 * S) + (2 * sp + q) * 32;
                    for (int i = 0; i < 16; i++) {
                        const int w = 16 * h + 8 * q + 2 * (i / 4) + i % 2, s = 2 * sp + (i / 2) % 2;
                        const int v = (int)src[S * w + s];
                        const int low = (int)(int8_t)(uint8_t)(v & 0xff);
                        blk[i] = (int8_t)low;
                        blk[16 + i] = (int8_t)((v - low) / 256);
                    }
                }
#else
        for (int s = 0; s < S; s++)
            for (int w = 0; w < 32; w++) z[c * C + 32 * s + w] = (int16_t)(int)src[S * w + s];
#endif
    }
}

#undef NC_NEON_AI
#undef NC_NEON_FN
#undef NC_NEON_CAT
#undef NC_NEON_CAT2
