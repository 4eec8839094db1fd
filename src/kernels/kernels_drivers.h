/* kernels_drivers.h - the loops around the per-ISA row kernels, shared by
 * kernels_avx2.c and kernels_avx512.c (each expands them with its own
 * compiler flags).  A driver walks rows and groups of up to four positions
 * and calls the ISA's NAME##_rows(row, C, x, xs, nt, y, ys) with a constant
 * nt, so the position loop inside unrolls.  The order in which (row,
 * position) pairs are visited never changes a result: each pair is one
 * complete, independent reduction (see kernels.h).
 */
#ifndef DF_KERNELS_DRIVERS_H
#define DF_KERNELS_DRIVERS_H

/* Dense F32/BF16 weights: tiles of rows whose weights stay in L2 while every
 * group of four positions (its activations in L1) passes over them. */
#define KERNEL_DENSE_DRIVER(NAME, ESIZE)                                                               \
    static void NAME(const void *W, size_t ld, int C, const float *x, size_t xs, int T, float *y,      \
                     size_t ys, int r0, int r1)                                                        \
    {                                                                                                  \
        int tile = (int)((128u << 10) / ((size_t)C * ESIZE + 1)) + 1;                                  \
        for (int rt = r0; rt < r1; rt += tile) {                                                       \
            int re = rt + tile < r1 ? rt + tile : r1;                                                  \
            int t = 0;                                                                                 \
            for (; t + 4 <= T; t += 4)                                                                 \
                for (int r = rt; r < re; r++)                                                          \
                    NAME##_rows((const uint8_t *)W + (size_t)r * ld * ESIZE, C, x + (size_t)t * xs, xs, 4, \
                                y + (size_t)t * ys + r, ys);                                           \
            for (int r = rt; r < re; r++) {                                                            \
                const uint8_t *row = (const uint8_t *)W + (size_t)r * ld * ESIZE;                      \
                switch (T - t) {                                                                       \
                case 3: NAME##_rows(row, C, x + (size_t)t * xs, xs, 3, y + (size_t)t * ys + r, ys); break; \
                case 2: NAME##_rows(row, C, x + (size_t)t * xs, xs, 2, y + (size_t)t * ys + r, ys); break; \
                case 1: NAME##_rows(row, C, x + (size_t)t * xs, xs, 1, y + (size_t)t * ys + r, ys); break; \
                }                                                                                      \
            }                                                                                          \
        }                                                                                              \
    }

/* Block-format weights (Q8_0) in row tiles, as the dense driver: a tile's
 * rows stay in L2 while every group of four positions (its activations in
 * L1) passes over them.  ROWS(prow, NULL, C, xp, xs, nt, y, ys); PB: bytes
 * per row. */
#define KERNEL_TILED_DRIVER(NAME, ROWS, PB)                                                            \
    static void NAME(const uint8_t *packed, const uint8_t *scales, int C, const float *xp, size_t xs,  \
                     int T, float *y, size_t ys, int r0, int r1)                                       \
    {                                                                                                  \
        (void)scales;                                                                                  \
        size_t pb = PB;                                                                                \
        int tile = (int)((128u << 10) / (pb + 1)) + 1;                                                 \
        for (int rt = r0; rt < r1; rt += tile) {                                                       \
            int re = rt + tile < r1 ? rt + tile : r1;                                                  \
            int t = 0;                                                                                 \
            for (; t + 4 <= T; t += 4)                                                                 \
                for (int r = rt; r < re; r++)                                                          \
                    ROWS(packed + (size_t)r * pb, NULL, C, xp + (size_t)t * xs, xs, 4, y + (size_t)t * ys + r, ys); \
            for (int r = rt; r < re; r++) {                                                            \
                const uint8_t *row = packed + (size_t)r * pb;                                          \
                switch (T - t) {                                                                       \
                case 3: ROWS(row, NULL, C, xp + (size_t)t * xs, xs, 3, y + (size_t)t * ys + r, ys); break; \
                case 2: ROWS(row, NULL, C, xp + (size_t)t * xs, xs, 2, y + (size_t)t * ys + r, ys); break; \
                case 1: ROWS(row, NULL, C, xp + (size_t)t * xs, xs, 1, y + (size_t)t * ys + r, ys); break; \
                }                                                                                      \
            }                                                                                          \
        }                                                                                              \
    }

/* The 32-value block formats (Q4_0 ... IQ4_NL) of ggml type TYPE, BYTES a
 * block: the ISA's qb32_rows(TYPE, BYTES, row, C, x, xs, nt, y, ys) per row
 * and group of up to four positions. */
#define KERNEL_QB32_DRIVER(NAME, TYPE, BYTES)                                                          \
    static void NAME(const uint8_t *blocks, int C, const float *x, size_t xs, int T, float *y, size_t ys, \
                     int r0, int r1)                                                                   \
    {                                                                                                  \
        size_t rb = (size_t)C / 32 * (BYTES);                                                          \
        for (int r = r0; r < r1; r++) {                                                                \
            const uint8_t *row = blocks + (size_t)r * rb;                                              \
            int t = 0;                                                                                 \
            for (; t + 4 <= T; t += 4)                                                                 \
                qb32_rows(TYPE, BYTES, row, C, x + (size_t)t * xs, xs, 4, y + (size_t)t * ys + r, ys); \
            switch (T - t) {                                                                           \
            case 3: qb32_rows(TYPE, BYTES, row, C, x + (size_t)t * xs, xs, 3, y + (size_t)t * ys + r, ys); break; \
            case 2: qb32_rows(TYPE, BYTES, row, C, x + (size_t)t * xs, xs, 2, y + (size_t)t * ys + r, ys); break; \
            case 1: qb32_rows(TYPE, BYTES, row, C, x + (size_t)t * xs, xs, 1, y + (size_t)t * ys + r, ys); break; \
            }                                                                                          \
        }                                                                                              \
    }

/* MXFP4 weights: ROWS(prow, srow, C, xp, xs, nt, y, ys) per row and group;
 * PB / SB: bytes per row of packed / scales (ggml blocks: scales unused). */
#define KERNEL_MXFP4_DRIVER(NAME, ROWS) KERNEL_MXFP4_DRIVER_S(NAME, ROWS, (size_t)C / 2, (size_t)C / MXFP4_BLOCK)
#define KERNEL_MXFP4_GG_DRIVER(NAME, ROWS) \
    KERNEL_MXFP4_DRIVER_S(NAME, ROWS, (size_t)C / MXFP4_BLOCK * GGML_MXFP4_BYTES, 0)
#define KERNEL_MXFP4_DRIVER_S(NAME, ROWS, PB, SB)                                                      \
    static void NAME(const uint8_t *packed, const uint8_t *scales, int C, const float *xp, size_t xs,  \
                     int T, float *y, size_t ys, int r0, int r1)                                       \
    {                                                                                                  \
        size_t pb = PB, sb = SB;                                                                       \
        for (int r = r0; r < r1; r++) {                                                                \
            const uint8_t *prow = packed + (size_t)r * pb, *srow = sb ? scales + (size_t)r * sb : NULL; \
            int t = 0;                                                                                 \
            for (; t + 4 <= T; t += 4) ROWS(prow, srow, C, xp + (size_t)t * xs, xs, 4, y + (size_t)t * ys + r, ys); \
            switch (T - t) {                                                                           \
            case 3: ROWS(prow, srow, C, xp + (size_t)t * xs, xs, 3, y + (size_t)t * ys + r, ys); break; \
            case 2: ROWS(prow, srow, C, xp + (size_t)t * xs, xs, 2, y + (size_t)t * ys + r, ys); break; \
            case 1: ROWS(prow, srow, C, xp + (size_t)t * xs, xs, 1, y + (size_t)t * ys + r, ys); break; \
            }                                                                                          \
        }                                                                                              \
    }

/* Both MXFP4 drivers (packed + scales, and ggml blocks) around one ISA row
 * function ANY(prow, srow, C, xp, xs, nt, y, ys, gg) that takes the layout
 * as a constant last argument. */
#define KERNEL_MXFP4_DRIVERS(NAME, NAME_GG, ANY)                                                    \
    ALWAYS_INLINE void NAME##_rows(const uint8_t *prow, const uint8_t *srow, int C, const float *xp, \
                                   size_t xs, int nt, float *y, size_t ys)                        \
    {                                                                                             \
        ANY(prow, srow, C, xp, xs, nt, y, ys, 0);                                                 \
    }                                                                                             \
    ALWAYS_INLINE void NAME_GG##_rows(const uint8_t *prow, const uint8_t *srow, int C, const float *xp, \
                                      size_t xs, int nt, float *y, size_t ys)                     \
    {                                                                                             \
        ANY(prow, srow, C, xp, xs, nt, y, ys, 1);                                                 \
    }                                                                                             \
    KERNEL_MXFP4_DRIVER(NAME, NAME##_rows)                                                        \
    KERNEL_MXFP4_GG_DRIVER(NAME_GG, NAME_GG##_rows)

/* The ISA files' gg_to_packed(): a ggml MXFP4 block's 16 nibble bytes
 * (byte j: value j low, value j + 16 high) permuted into the packed order
 * (byte m: value 2m low, 2m + 1 high), as mxfp4_from_ggml does.  SSE2, in
 * 16-bit lanes w = q[2m] | q[2m+1] << 8.  Expanded after the file's
 * intrinsics header. */
#define KERNEL_GG_TO_PACKED()                                                                     \
    ALWAYS_INLINE __m128i gg_to_packed(__m128i w)                                                 \
    {                                                                                             \
        const __m128i m0f = _mm_set1_epi16(0x000F), mf0 = _mm_set1_epi16(0x00F0);                 \
        __m128i w4 = _mm_srli_epi16(w, 4), w8 = _mm_srli_epi16(w, 8);                             \
        __m128i lo = _mm_or_si128(_mm_and_si128(w, m0f), _mm_and_si128(w4, mf0));                 \
        __m128i hi = _mm_or_si128(_mm_and_si128(w4, m0f), _mm_and_si128(w8, mf0));                \
        return _mm_packus_epi16(lo, hi);                                                          \
    }

/* df_exp's main branch (mathfn.c) for the vector files: n = round(x / ln2)
 * by adding and removing DF_EXP_SHIFT, r = (x - n*ln2_hi) - n*ln2_lo, then
 * p = DF_EXP_LEAD and DF_EXP_STEPS(STEP), each STEP(C) being p = p * r + C
 * as a multiply, then an add; the result p * 2^n.  One list of constants for
 * every ISA, the scalar code's. */
#define DF_EXP_SHIFT 6755399441055744.0
#define DF_EXP_INV_LN2 1.44269504088896338700e+00
#define DF_EXP_LN2_HI 6.93147180369123816490e-01
#define DF_EXP_LN2_LO 1.90821492927058770002e-10
#define DF_EXP_LEAD (1.0 / 39916800.0)
#define DF_EXP_STEPS(STEP)                                                                           \
    STEP(1.0 / 3628800.0);                                                                           \
    STEP(1.0 / 362880.0);                                                                            \
    STEP(1.0 / 40320.0);                                                                             \
    STEP(1.0 / 5040.0);                                                                              \
    STEP(1.0 / 720.0);                                                                               \
    STEP(1.0 / 120.0);                                                                               \
    STEP(1.0 / 24.0);                                                                                \
    STEP(1.0 / 6.0);                                                                                 \
    STEP(0.5);                                                                                       \
    STEP(1.0);                                                                                       \
    STEP(1.0)

/* The end of the MLA softmax (kernels.h) in the vector files, whose scores
 * are stored [p][nh] with e_p already in place: each head's sum of its e_p
 * over p in order (double, from +0), inv = (float)(1.0 / sum), then
 * pp_p = e_p * inv in float. */
static inline void mla_weights_normalise(float *sc, int n, int nh)
{
    double sum[MLA_NH_MAX];
    float inv[MLA_NH_MAX];
    for (int h = 0; h < nh; h++) sum[h] = 0.0;
    for (int p = 0; p < n; p++)
        for (int h = 0; h < nh; h++) sum[h] += sc[(size_t)p * nh + h];
    for (int h = 0; h < nh; h++) inv[h] = (float)(1.0 / sum[h]);
    for (int p = 0; p < n; p++)
        for (int h = 0; h < nh; h++) sc[(size_t)p * nh + h] *= inv[h];
}

#endif
