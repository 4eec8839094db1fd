/* kernels_avx512.c - AVX-512 (F, BW, VL) versions of the kernels in
 * kernels_ref.c, which they must match bit for bit.  One __m512 holds the 16
 * lanes of the contract in kernels.h; tails use masked loads that read zeros,
 * which is what the reference's fma(0, 0, acc) does.  Up to four positions
 * share one pass over a weight row (prefill and verification reuse weights
 * from L1); each position keeps its own accumulators, so the grouping cannot
 * change any result.  Compiled with -mavx512f -mavx512bw -mavx512vl -mfma
 * (Makefile); only called after a runtime CPU check.
 */
#include "kernels.h"
#include "kernels_drivers.h"
#include "quant.h"
#include "util.h"

#if defined(DF_AVX512_SIMDE)
/* Test build: the same code over SIMDe's portable AVX-512, so that CI
 * machines without AVX-512 still check this file against the reference
 * (tests/test_kernels.c); the table is then named kernels_avx512_simde. */
#define SIMDE_NO_NATIVE
#define SIMDE_ENABLE_NATIVE_ALIASES
#include <simde/x86/avx512.h>
#include <math.h>
#include <string.h>
#define kernels_avx512 kernels_avx512_simde
#define DF_AVX512_CODE 1
/* what SIMDe 0.7 lacks, written from the instruction definitions */
typedef simde__mmask16 __mmask16;
/* a lane-by-lane conversion: STORE puts v's N lanes of EIN in b[], EXPR
 * makes lane i of the result (EOUT) from b[i], LOAD returns o[] */
#define SIMDE_CVT(NAME, TIN, TOUT, EIN, EOUT, N, STORE, LOAD, EXPR)                                 \
    static inline TOUT NAME(TIN v)                                                                \
    {                                                                                             \
        EIN b[N];                                                                                 \
        EOUT o[N];                                                                                \
        STORE;                                                                                    \
        for (int i = 0; i < N; i++) o[i] = (EXPR);                                                \
        return LOAD;                                                                              \
    }
SIMDE_CVT(df_cvtepu8_epi32, simde__m128i, simde__m512i, uint8_t, int32_t, 16,
          simde_mm_storeu_si128((simde__m128i *)b, v), simde_mm512_loadu_si512(o), b[i])
SIMDE_CVT(df_cvtepu16_epi32, simde__m256i, simde__m512i, uint16_t, int32_t, 16,
          simde_mm256_storeu_si256((simde__m256i *)b, v), simde_mm512_loadu_si512(o), b[i])
SIMDE_CVT(df_cvtph_ps, simde__m256i, simde__m512, uint16_t, float, 16, simde_mm256_storeu_si256((simde__m256i *)b, v),
          simde_mm512_loadu_ps(o), f16_to_f32(b[i]))
SIMDE_CVT(df_cvtepi8_epi32, simde__m128i, simde__m512i, int8_t, int32_t, 16,
          simde_mm_storeu_si128((simde__m128i *)b, v), simde_mm512_loadu_si512(o), b[i])
SIMDE_CVT(df_cvtepi32_ps, simde__m512i, simde__m512, int32_t, float, 16, simde_mm512_storeu_si512(b, v),
          simde_mm512_loadu_ps(o), (float)b[i])
/* the conversions of the elementwise kernels */
SIMDE_CVT(df_cvtps_pd, simde__m256, simde__m512d, float, double, 8, simde_mm256_storeu_ps(b, v),
          simde_mm512_loadu_pd(o), (double)b[i])
SIMDE_CVT(df_cvtpd_ps, simde__m512d, simde__m256, double, float, 8, simde_mm512_storeu_pd(b, v),
          simde_mm256_loadu_ps(o), (float)b[i])
/* integer-valued doubles only (exp's n) */
SIMDE_CVT(df_cvtpd_epi32, simde__m512d, simde__m256i, double, int32_t, 8, simde_mm512_storeu_pd(b, v),
          simde_mm256_loadu_si256(o), (int32_t)b[i])
SIMDE_CVT(df_cvtepi32_epi64, simde__m256i, simde__m512i, int32_t, int64_t, 8,
          simde_mm256_storeu_si256((simde__m256i *)b, v), simde_mm512_loadu_si512(o), b[i])
static inline simde__m512 df_maskz_loadu_ps(__mmask16 m, const void *p)
{
    float o[16] = {0};
    for (int i = 0; i < 16; i++)
        if ((m >> i) & 1) memcpy(&o[i], (const char *)p + 4 * i, 4);
    return simde_mm512_loadu_ps(o);
}
static inline simde__m256i df_maskz_loadu_epi16(__mmask16 m, const void *p)
{
    uint16_t o[16] = {0};
    for (int i = 0; i < 16; i++)
        if ((m >> i) & 1) memcpy(&o[i], (const char *)p + 2 * i, 2);
    return simde_mm256_loadu_si256(o);
}
/* SIMDe's portable fmadd rounds twice; the instruction rounds once */
static inline simde__m512 df_fmadd_ps(simde__m512 a, simde__m512 b, simde__m512 c)
{
    float x[16], y[16], z[16];
    simde_mm512_storeu_ps(x, a);
    simde_mm512_storeu_ps(y, b);
    simde_mm512_storeu_ps(z, c);
    for (int i = 0; i < 16; i++) z[i] = fmaf(x[i], y[i], z[i]);
    return simde_mm512_loadu_ps(z);
}
#undef _mm512_cvtps_pd
#define _mm512_cvtps_pd df_cvtps_pd
#undef _mm512_cvtpd_ps
#define _mm512_cvtpd_ps df_cvtpd_ps
#undef _mm512_cvtpd_epi32
#define _mm512_cvtpd_epi32 df_cvtpd_epi32
#undef _mm512_cvtepi32_epi64
#define _mm512_cvtepi32_epi64 df_cvtepi32_epi64
#undef _mm512_fmadd_ps
#define _mm512_fmadd_ps df_fmadd_ps
#undef _mm512_cvtepu8_epi32
#undef _mm512_cvtepu16_epi32
#define _mm512_cvtepu16_epi32 df_cvtepu16_epi32
#undef _mm512_maskz_loadu_ps
#undef _mm256_maskz_loadu_epi16
#define _mm512_cvtepu8_epi32 df_cvtepu8_epi32
#undef _mm512_cvtph_ps
#define _mm512_cvtph_ps df_cvtph_ps
#undef _mm512_cvtepi32_ps
#define _mm512_cvtepi32_ps df_cvtepi32_ps
#undef _mm512_cvtepi8_epi32
#define _mm512_cvtepi8_epi32 df_cvtepi8_epi32
#define _mm512_maskz_loadu_ps df_maskz_loadu_ps
#define _mm256_maskz_loadu_epi16 df_maskz_loadu_epi16
static inline void df_mask_storeu_ps(void *p, __mmask16 m, simde__m512 v)
{
    float b[16];
    simde_mm512_storeu_ps(b, v);
    for (int i = 0; i < 16; i++)
        if ((m >> i) & 1) memcpy((char *)p + 4 * i, &b[i], 4);
}
#undef _mm512_mask_storeu_ps
#define _mm512_mask_storeu_ps df_mask_storeu_ps
#elif defined(__x86_64__) && defined(DF_HAVE_AVX512)
#include <immintrin.h>
#define DF_AVX512_CODE 1
#endif

#ifdef DF_AVX512_CODE

#define ALWAYS_INLINE static inline __attribute__((always_inline))

/* matches lane_tree16() */
ALWAYS_INLINE float tree512(__m512 a)
{
    __m256 lo = _mm512_castps512_ps256(a);
    __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1));
    __m256 s8 = _mm256_add_ps(lo, hi);
    __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
    __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    __m128 s1 = _mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1));
    return _mm_cvtss_f32(s1);
}

ALWAYS_INLINE __m512 ld_w_bf16(const uint8_t *row, int c, __mmask16 m)
{
    __m256i h = _mm256_maskz_loadu_epi16(m, row + 2 * (size_t)c);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

ALWAYS_INLINE __m512 ld_w_f32(const uint8_t *row, int c, __mmask16 m)
{
    return _mm512_maskz_loadu_ps(m, row + 4 * (size_t)c);
}

ALWAYS_INLINE __m512 ld_w_f16(const uint8_t *row, int c, __mmask16 m)
{
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, row + 2 * (size_t)c));
}

#define DENSE_ROW(NAME, LOADW, ESIZE)                                                             \
    ALWAYS_INLINE void NAME##_rows(const uint8_t *row, int C, const float *x, size_t xs, int nt,  \
                                   float *y, size_t ys)                                         \
    {                                                                                             \
        __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(),          \
                         _mm512_setzero_ps()};                                                    \
        int c = 0;                                                                                \
        for (; c + 16 <= C; c += 16) {                                                            \
            __m512 w = LOADW(row, c, 0xFFFF);                                                     \
            _Pragma("GCC unroll 4") for (int u = 0; u < nt; u++)                                                          \
                acc[u] = _mm512_fmadd_ps(w, _mm512_loadu_ps(x + (size_t)u * xs + c), acc[u]);    \
        }                                                                                         \
        if (c < C) {                                                                              \
            __mmask16 m = (__mmask16)((1u << (C - c)) - 1);                                       \
            __m512 w = LOADW(row, c, m);                                                          \
            _Pragma("GCC unroll 4") for (int u = 0; u < nt; u++)                                                          \
                acc[u] = _mm512_fmadd_ps(w, _mm512_maskz_loadu_ps(m, x + (size_t)u * xs + c), acc[u]); \
        }                                                                                         \
        _Pragma("GCC unroll 4") for (int u = 0; u < nt; u++) y[(size_t)u * ys] = tree512(acc[u]);                         \
    }                                                                                             \
    /* one position, four rows `stride` bytes apart side by side (each row as NAME##_rows       \
     * with nt = 1; their FMA chains interleave) */                                              \
    static void NAME##_rows_x4(const uint8_t *row, size_t stride, int C, const float *x, float *y, \
                               size_t ystep)                                                      \
    {                                                                                             \
        __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps(), a2 = _mm512_setzero_ps(),     \
               a3 = _mm512_setzero_ps();                                                          \
        const uint8_t *p1 = row + stride, *p2 = row + 2 * stride, *p3 = row + 3 * stride;        \
        int c = 0;                                                                                \
        for (; c + 16 <= C; c += 16) {                                                            \
            __m512 xv = _mm512_loadu_ps(x + c);                                                   \
            a0 = _mm512_fmadd_ps(LOADW(row, c, 0xFFFF), xv, a0);                                  \
            a1 = _mm512_fmadd_ps(LOADW(p1, c, 0xFFFF), xv, a1);                                   \
            a2 = _mm512_fmadd_ps(LOADW(p2, c, 0xFFFF), xv, a2);                                   \
            a3 = _mm512_fmadd_ps(LOADW(p3, c, 0xFFFF), xv, a3);                                   \
        }                                                                                         \
        if (c < C) {                                                                              \
            __mmask16 m = (__mmask16)((1u << (C - c)) - 1);                                       \
            __m512 xv = _mm512_maskz_loadu_ps(m, x + c);                                          \
            a0 = _mm512_fmadd_ps(LOADW(row, c, m), xv, a0);                                       \
            a1 = _mm512_fmadd_ps(LOADW(p1, c, m), xv, a1);                                        \
            a2 = _mm512_fmadd_ps(LOADW(p2, c, m), xv, a2);                                        \
            a3 = _mm512_fmadd_ps(LOADW(p3, c, m), xv, a3);                                        \
        }                                                                                         \
        y[0] = tree512(a0);                                                                       \
        y[ystep] = tree512(a1);                                                                   \
        y[2 * ystep] = tree512(a2);                                                               \
        y[3 * ystep] = tree512(a3);                                                               \
    }                                                                                             \
    ALWAYS_INLINE void NAME##_tiles_rows(const uint8_t *row, int C, const float *x, size_t xs, int nt, \
                                         float *y, size_t ys)                                     \
    {                                                                                             \
        NAME##_rows(row, C, x, xs, nt, y, ys);                                                    \
    }                                                                                             \
    KERNEL_DENSE_DRIVER(NAME##_tiles, ESIZE)                                                      \
    /* decode (one position): a job's four quarters of rows side by side, rows far apart (see   \
     * q8_0_rows_x4); otherwise the tiles */                                                      \
    static void NAME(const void *W, size_t ld, int C, const float *x, size_t xs, int T, float *y, \
                     size_t ys, int r0, int r1)                                                   \
    {                                                                                             \
        int q = (r1 - r0) / 4;                                                                    \
        if (T != 1 || q < 16) {                                                                   \
            NAME##_tiles(W, ld, C, x, xs, T, y, ys, r0, r1);                                      \
            return;                                                                               \
        }                                                                                         \
        size_t rb = ld * ESIZE;                                                                   \
        for (int i = 0; i < q; i++)                                                               \
            NAME##_rows_x4((const uint8_t *)W + (size_t)(r0 + i) * rb, (size_t)q * rb, C, x, y + r0 + i, \
                           (size_t)q);                                                            \
        NAME##_tiles(W, ld, C, x, xs, T, y, ys, r0 + 4 * q, r1);                                  \
    }

DENSE_ROW(matmul_bf16_avx512, ld_w_bf16, 2)
DENSE_ROW(matmul_f32_avx512, ld_w_f32, 4)
DENSE_ROW(matmul_f16_avx512, ld_w_f16, 2)

/* Q8_0: per block, 16 int8 -> f32 times the scale (exact), the 16 lanes over
 * columns 32b + 0..15, then 32b + 16..31 */
ALWAYS_INLINE void q8_0_rows(const uint8_t *row, const uint8_t *unused, int C, const float *x, size_t xs, int nt,
                             float *y, size_t ys)
{
    (void)unused;
    __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
    for (int b = 0; b < C / Q8_0_BLOCK; b++) {
        const uint8_t *blk = row + (size_t)b * Q8_0_BYTES;
        uint16_t dh;
        memcpy(&dh, blk, 2);
        __m512 d = _mm512_cvtph_ps(_mm256_set1_epi16((short)dh)); /* exactly f16_to_f32 */
        for (int half = 0; half < 2; half++) {
            __m512 w = _mm512_mul_ps(
                _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(blk + 2 + 16 * half)))), d);
            int c = b * Q8_0_BLOCK + 16 * half;
            _Pragma("GCC unroll 4") for (int u = 0; u < nt; u++)
                acc[u] = _mm512_fmadd_ps(w, _mm512_loadu_ps(x + (size_t)u * xs + c), acc[u]);
        }
    }
    _Pragma("GCC unroll 4") for (int u = 0; u < nt; u++) y[(size_t)u * ys] = tree512(acc[u]);
}
KERNEL_TILED_DRIVER(matmul_q8_0_rows_avx512, q8_0_rows, (size_t)C / Q8_0_BLOCK * Q8_0_BYTES)

/* One position (decode), one row: q8_0_rows with nt = 1 as a plain loop,
 * the scale converted by VCVTPH2PS (exactly as f16_to_f32).  The rows stay
 * in memory order: interleaving neighbouring rows to overlap their FMA
 * chains read memory at a third of the speed on this machine (Zen 4: 6.5
 * against 15 Gweights/s, bench numbers in the commit). */
ALWAYS_INLINE __m512 q8_0_half(const uint8_t *blk, int half, __m512 d)
{
    return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(blk + 2 + 16 * half)))),
                         d);
}

/* four rows `stride` bytes apart, each exactly as q8_0_row_x1 computes it:
 * their FMA chains interleave (one row's chain waits on the FMA latency);
 * rows far apart in memory, since neighbouring rows read in lockstep ran at
 * a third of the speed (6.5 against 17 Gweights/s, Zen 4) */
static void q8_0_rows_x4(const uint8_t *row, size_t stride, int C, const float *x, float *y, size_t ystep)
{
    __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps(), a2 = _mm512_setzero_ps(), a3 = _mm512_setzero_ps();
    const uint8_t *p0 = row, *p1 = row + stride, *p2 = row + 2 * stride, *p3 = row + 3 * stride;
    for (int b = 0; b < C / Q8_0_BLOCK; b++) {
        size_t o = (size_t)b * Q8_0_BYTES;
        __m512 x0 = _mm512_loadu_ps(x + (size_t)b * Q8_0_BLOCK), x1 = _mm512_loadu_ps(x + (size_t)b * Q8_0_BLOCK + 16);
        uint16_t h0, h1, h2, h3;
        memcpy(&h0, p0 + o, 2), memcpy(&h1, p1 + o, 2), memcpy(&h2, p2 + o, 2), memcpy(&h3, p3 + o, 2);
        __m512 d0 = _mm512_cvtph_ps(_mm256_set1_epi16((short)h0)), d1 = _mm512_cvtph_ps(_mm256_set1_epi16((short)h1));
        __m512 d2 = _mm512_cvtph_ps(_mm256_set1_epi16((short)h2)), d3 = _mm512_cvtph_ps(_mm256_set1_epi16((short)h3));
        a0 = _mm512_fmadd_ps(q8_0_half(p0 + o, 0, d0), x0, a0);
        a1 = _mm512_fmadd_ps(q8_0_half(p1 + o, 0, d1), x0, a1);
        a2 = _mm512_fmadd_ps(q8_0_half(p2 + o, 0, d2), x0, a2);
        a3 = _mm512_fmadd_ps(q8_0_half(p3 + o, 0, d3), x0, a3);
        a0 = _mm512_fmadd_ps(q8_0_half(p0 + o, 1, d0), x1, a0);
        a1 = _mm512_fmadd_ps(q8_0_half(p1 + o, 1, d1), x1, a1);
        a2 = _mm512_fmadd_ps(q8_0_half(p2 + o, 1, d2), x1, a2);
        a3 = _mm512_fmadd_ps(q8_0_half(p3 + o, 1, d3), x1, a3);
    }
    y[0] = tree512(a0);
    y[ystep] = tree512(a1);
    y[2 * ystep] = tree512(a2);
    y[3 * ystep] = tree512(a3);
}

static void q8_0_row_x1(const uint8_t *row, int C, const float *x, float *y)
{
    __m512 a = _mm512_setzero_ps();
    for (int b = 0; b < C / Q8_0_BLOCK; b++) {
        const uint8_t *blk = row + (size_t)b * Q8_0_BYTES;
        uint16_t dh;
        memcpy(&dh, blk, 2);
        __m512 d = _mm512_cvtph_ps(_mm256_set1_epi16((short)dh));
        a = _mm512_fmadd_ps(q8_0_half(blk, 0, d), _mm512_loadu_ps(x + (size_t)b * Q8_0_BLOCK), a);
        a = _mm512_fmadd_ps(q8_0_half(blk, 1, d), _mm512_loadu_ps(x + (size_t)b * Q8_0_BLOCK + 16), a);
    }
    *y = tree512(a);
}

static void matmul_q8_0_avx512(const uint8_t *packed, const uint8_t *scales, int C, const float *xp, size_t xs, int T,
                               float *y, size_t ys, int r0, int r1)
{
    if (T != 1) {
        matmul_q8_0_rows_avx512(packed, scales, C, xp, xs, T, y, ys, r0, r1);
        return;
    }
    size_t rb = (size_t)C / Q8_0_BLOCK * Q8_0_BYTES;
    int q = (r1 - r0) / 4, r = r0;
    if (q >= 16) { /* the job's four quarters side by side */
        for (int i = 0; i < q; i++) q8_0_rows_x4(packed + (size_t)(r0 + i) * rb, (size_t)q * rb, C, xp, y + r0 + i, (size_t)q);
        r = r0 + 4 * q;
    }
    for (; r < r1; r++) q8_0_row_x1(packed + (size_t)r * rb, C, xp, y + r);
}

/* any block format: per row and group of up to four positions, each block
 * decoded once (qblock.c's exact scalar decode), then the 16 lanes over it */
/* Q4_K and Q6_K (llama.cpp's Q4_K_M files are mostly these) decoded in
 * vectors: the same float operations in the same order as qblock.c's
 * dec_q4_k / dec_q6_k, each a separate rounding (explicit multiplies and
 * subtractions, -ffp-contract=off), so the values are those of the scalar
 * decode, bit for bit (test_kernels compares every format's products). */
static float half_le(const uint8_t *p)
{
    uint16_t h;
    memcpy(&h, p, 2);
    return f16_to_f32(h);
}

static void dec_q4_k_avx512(const uint8_t *b, float *y)
{
    float d = half_le(b), min = half_le(b + 2);
    const uint8_t *scales = b + 4, *q = b + 16;
    const __m512i lo4 = _mm512_set1_epi32(15);
    for (int j = 0; j < 4; j++) {
        uint8_t sc, m;
        qblock_k4_scale_min(2 * j, scales, &sc, &m);
        __m512 d1 = _mm512_set1_ps(d * (float)sc), m1 = _mm512_set1_ps(min * (float)m);
        qblock_k4_scale_min(2 * j + 1, scales, &sc, &m);
        __m512 d2 = _mm512_set1_ps(d * (float)sc), m2 = _mm512_set1_ps(min * (float)m);
        for (int h = 0; h < 2; h++) {
            __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(q + 32 * j + 16 * h)));
            __m512 lo = _mm512_cvtepi32_ps(_mm512_and_si512(v, lo4)), hi = _mm512_cvtepi32_ps(_mm512_srli_epi32(v, 4));
            _mm512_storeu_ps(y + 64 * j + 16 * h, _mm512_sub_ps(_mm512_mul_ps(d1, lo), m1));
            _mm512_storeu_ps(y + 64 * j + 32 + 16 * h, _mm512_sub_ps(_mm512_mul_ps(d2, hi), m2));
        }
    }
}

static void dec_q6_k_avx512(const uint8_t *b, float *y)
{
    const uint8_t *ql = b, *qh = b + 128;
    const int8_t *sc = (const int8_t *)(b + 192);
    float d = half_le(b + 208);
    const __m512i lo4 = _mm512_set1_epi32(15), two = _mm512_set1_epi32(3), off = _mm512_set1_epi32(32);
    for (int n = 0; n < 2; n++) {
        for (int h = 0; h < 2; h++) {
            __m512i l0 = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(ql + 16 * h)));
            __m512i l1 = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(ql + 32 + 16 * h)));
            __m512i hb = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(qh + 16 * h)));
            __m512i q[4] = {
                _mm512_or_si512(_mm512_and_si512(l0, lo4), _mm512_slli_epi32(_mm512_and_si512(hb, two), 4)),
                _mm512_or_si512(_mm512_and_si512(l1, lo4),
                                _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(hb, 2), two), 4)),
                _mm512_or_si512(_mm512_srli_epi32(l0, 4),
                                _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(hb, 4), two), 4)),
                _mm512_or_si512(_mm512_srli_epi32(l1, 4),
                                _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(hb, 6), two), 4)),
            };
            for (int k = 0; k < 4; k++) {
                __m512 ds = _mm512_set1_ps(d * (float)sc[h + 2 * k]);
                _mm512_storeu_ps(y + 32 * k + 16 * h, _mm512_mul_ps(ds, _mm512_cvtepi32_ps(_mm512_sub_epi32(q[k], off))));
            }
        }
        y += 128;
        ql += 64;
        qh += 32;
        sc += 8;
    }
}

/* Q5_K: Q4_K with a fifth bit per value from 32 bytes of high bits */
static void dec_q5_k_avx512(const uint8_t *b, float *y)
{
    float d = half_le(b), min = half_le(b + 2);
    const uint8_t *scales = b + 4, *qh = b + 16, *ql = b + 48;
    const __m512i lo4 = _mm512_set1_epi32(15), one = _mm512_set1_epi32(1);
    for (int j = 0; j < 4; j++) {
        uint8_t sc, m;
        qblock_k4_scale_min(2 * j, scales, &sc, &m);
        __m512 d1 = _mm512_set1_ps(d * (float)sc), m1 = _mm512_set1_ps(min * (float)m);
        qblock_k4_scale_min(2 * j + 1, scales, &sc, &m);
        __m512 d2 = _mm512_set1_ps(d * (float)sc), m2 = _mm512_set1_ps(min * (float)m);
        for (int h = 0; h < 2; h++) {
            __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(ql + 32 * j + 16 * h)));
            __m512i hb = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(qh + 16 * h)));
            __m512i b1 = _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(hb, 2 * j), one), 4);
            __m512i b2 = _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(hb, 2 * j + 1), one), 4);
            __m512 lo = _mm512_cvtepi32_ps(_mm512_add_epi32(_mm512_and_si512(v, lo4), b1));
            __m512 hi = _mm512_cvtepi32_ps(_mm512_add_epi32(_mm512_srli_epi32(v, 4), b2));
            _mm512_storeu_ps(y + 64 * j + 16 * h, _mm512_sub_ps(_mm512_mul_ps(d1, lo), m1));
            _mm512_storeu_ps(y + 64 * j + 32 + 16 * h, _mm512_sub_ps(_mm512_mul_ps(d2, hi), m2));
        }
    }
}

/* Q2_K: per 16 values a 4-bit scale and min; codes of 2 bits at four shifts */
static void dec_q2_k_avx512(const uint8_t *b, float *y)
{
    const uint8_t *sc = b, *q = b + 16;
    float d = half_le(b + 80), min = half_le(b + 82);
    const __m512i three = _mm512_set1_epi32(3);
    int is = 0;
    for (int n = 0; n < 2; n++) {
        for (int shift = 0; shift < 8; shift += 2)
            for (int half = 0; half < 2; half++) {
                uint8_t s = sc[is++];
                __m512 dl = _mm512_set1_ps(d * (float)(s & 0xF)), ml = _mm512_set1_ps(min * (float)(s >> 4));
                __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(q + 16 * half)));
                __m512 c = _mm512_cvtepi32_ps(_mm512_and_si512(_mm512_srli_epi32(v, shift), three));
                _mm512_storeu_ps(y, _mm512_sub_ps(_mm512_mul_ps(dl, c), ml));
                y += 16;
            }
        q += 32;
    }
}

/* Q3_K: 2-bit codes, minus 4 where the high bit is clear, 6-bit scales */
static void dec_q3_k_avx512(const uint8_t *b, float *y)
{
    const uint8_t *hm = b, *q = b + 32;
    float d_all = half_le(b + 108);
    int8_t scales[16];
    qblock_q3_k_scales(b, scales);
    const __m512i three = _mm512_set1_epi32(3), one = _mm512_set1_epi32(1), four = _mm512_set1_epi32(4);
    int is = 0, bit = 0;
    for (int n = 0; n < 2; n++) {
        for (int shift = 0; shift < 8; shift += 2) {
            for (int half = 0; half < 2; half++) {
                __m512 dl = _mm512_set1_ps(d_all * (float)(scales[is++] - 32));
                __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(q + 16 * half)));
                __m512i h = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(hm + 16 * half)));
                __m512i clear = _mm512_xor_si512(_mm512_and_si512(_mm512_srli_epi32(h, bit), one), one);
                __m512i c = _mm512_sub_epi32(_mm512_and_si512(_mm512_srli_epi32(v, shift), three),
                                             _mm512_mullo_epi32(clear, four));
                _mm512_storeu_ps(y, _mm512_mul_ps(dl, _mm512_cvtepi32_ps(c)));
                y += 16;
            }
            bit++;
        }
        q += 32;
    }
}

typedef void (*block_decoder)(const uint8_t *blk, float *out);

static block_decoder decoder_of(const qblock_fmt *f)
{
    switch (f->ggml_type) {
    case 10: return dec_q2_k_avx512;
    case 11: return dec_q3_k_avx512;
    case 12: return dec_q4_k_avx512;
    case 13: return dec_q5_k_avx512;
    case 14: return dec_q6_k_avx512;
    default: return f->decode;
    }
}

/* one row over nt (a constant after inlining: the accumulators stay in
 * registers) positions */
ALWAYS_INLINE void qblock_rows(const qblock_fmt *f, block_decoder dec, const uint8_t *row, int C, const float *x,
                               size_t xs, int nt, float *y, size_t ys)
{
    float w[QBLOCK_MAX] __attribute__((aligned(64)));
    __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
    for (int b = 0; b < C / f->block; b++) {
        dec(row + (size_t)b * f->bytes, w);
        int c0 = b * f->block;
        for (int k = 0; k < f->block; k += 16) {
            __m512 wv = _mm512_load_ps(w + k);
            _Pragma("GCC unroll 4") for (int u = 0; u < nt; u++)
                acc[u] = _mm512_fmadd_ps(wv, _mm512_loadu_ps(x + (size_t)u * xs + c0 + k), acc[u]);
        }
    }
    _Pragma("GCC unroll 4") for (int u = 0; u < nt; u++) y[(size_t)u * ys] = tree512(acc[u]);
}

/* The 32-value formats (Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL: llama.cpp's
 * fallbacks where a row is not whole 256-blocks, and Q4_0 files) fused: a
 * block's two halves of 16 values made in registers with the scalar
 * decode's float operations (code -> f32 exactly, then * d, + m), then the
 * lanes' FMAs over columns 32b + 0..15 and 32b + 16..31 as the dense order
 * has them.  `type` is a constant after inlining. */
static const float iq4nl_table[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

ALWAYS_INLINE void qb32_halves(int type, const uint8_t *blk, __m512 *w0, __m512 *w1)
{
    const __m512i lo4 = _mm512_set1_epi32(15), lanes = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3,
                                                                           2, 1, 0);
    int has_m = type == 3 || type == 7, has_h = type == 6 || type == 7;
    const uint8_t *qs = blk + 2 + (has_m ? 2 : 0) + (has_h ? 4 : 0);
    __m512 d = _mm512_cvtph_ps(_mm256_set1_epi16((short)(blk[0] | blk[1] << 8)));
    __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)qs));
    __m512i c0 = _mm512_and_si512(v, lo4), c1 = _mm512_srli_epi32(v, 4);
    if (has_h) {
        uint32_t qh;
        memcpy(&qh, blk + 2 + (has_m ? 2 : 0), 4);
        __m512i h = _mm512_set1_epi32((int)qh), one = _mm512_set1_epi32(1);
        c0 = _mm512_or_si512(c0, _mm512_slli_epi32(_mm512_and_si512(_mm512_srlv_epi32(h, lanes), one), 4));
        c1 = _mm512_or_si512(
            c1, _mm512_slli_epi32(_mm512_and_si512(_mm512_srlv_epi32(h, _mm512_add_epi32(lanes, _mm512_set1_epi32(16))),
                                                   one),
                                  4));
    }
    if (type == 20) {
        const __m512 tab = _mm512_loadu_ps(iq4nl_table);
        *w0 = _mm512_mul_ps(d, _mm512_permutexvar_ps(c0, tab));
        *w1 = _mm512_mul_ps(d, _mm512_permutexvar_ps(c1, tab));
        return;
    }
    if (type == 2 || type == 6) { /* signed codes: minus 8 (Q4_0) or 16 (Q5_0) */
        __m512i off = _mm512_set1_epi32(type == 2 ? 8 : 16);
        c0 = _mm512_sub_epi32(c0, off);
        c1 = _mm512_sub_epi32(c1, off);
    }
    *w0 = _mm512_mul_ps(_mm512_cvtepi32_ps(c0), d);
    *w1 = _mm512_mul_ps(_mm512_cvtepi32_ps(c1), d);
    if (has_m) {
        __m512 m = _mm512_cvtph_ps(_mm256_set1_epi16((short)(blk[2] | blk[3] << 8)));
        *w0 = _mm512_add_ps(*w0, m);
        *w1 = _mm512_add_ps(*w1, m);
    }
}

ALWAYS_INLINE void qb32_rows(int type, int bytes, const uint8_t *row, int C, const float *x, size_t xs, int nt,
                             float *y, size_t ys)
{
    __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
    for (int b = 0; b < C / 32; b++) {
        __m512 w0, w1;
        qb32_halves(type, row + (size_t)b * (size_t)bytes, &w0, &w1);
        _Pragma("GCC unroll 4") for (int u = 0; u < nt; u++) {
            const float *xu = x + (size_t)u * xs + (size_t)b * 32;
            acc[u] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(xu), acc[u]);
            acc[u] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(xu + 16), acc[u]);
        }
    }
    _Pragma("GCC unroll 4") for (int u = 0; u < nt; u++) y[(size_t)u * ys] = tree512(acc[u]);
}

KERNEL_QB32_DRIVER(matmul_q4_0_avx512, 2, 18)
KERNEL_QB32_DRIVER(matmul_q4_1_avx512, 3, 20)
KERNEL_QB32_DRIVER(matmul_q5_0_avx512, 6, 22)
KERNEL_QB32_DRIVER(matmul_q5_1_avx512, 7, 24)
KERNEL_QB32_DRIVER(matmul_iq4_nl_avx512, 20, 18)

static void matmul_qblock_avx512(const qblock_fmt *f, const uint8_t *blocks, int C, const float *x, size_t xs, int T,
                                 float *y, size_t ys, int r0, int r1)
{
    switch (f->ggml_type) {
    case 2: matmul_q4_0_avx512(blocks, C, x, xs, T, y, ys, r0, r1); return;
    case 3: matmul_q4_1_avx512(blocks, C, x, xs, T, y, ys, r0, r1); return;
    case 6: matmul_q5_0_avx512(blocks, C, x, xs, T, y, ys, r0, r1); return;
    case 7: matmul_q5_1_avx512(blocks, C, x, xs, T, y, ys, r0, r1); return;
    case 20: matmul_iq4_nl_avx512(blocks, C, x, xs, T, y, ys, r0, r1); return;
    default: break;
    }
    size_t rb = (size_t)C / (size_t)f->block * (size_t)f->bytes;
    block_decoder dec = decoder_of(f);
    for (int r = r0; r < r1; r++) {
        const uint8_t *row = blocks + (size_t)r * rb;
        int t = 0;
        for (; t + 4 <= T; t += 4) qblock_rows(f, dec, row, C, x + (size_t)t * xs, xs, 4, y + (size_t)t * ys + r, ys);
        switch (T - t) {
        case 3: qblock_rows(f, dec, row, C, x + (size_t)t * xs, xs, 3, y + (size_t)t * ys + r, ys); break;
        case 2: qblock_rows(f, dec, row, C, x + (size_t)t * xs, xs, 2, y + (size_t)t * ys + r, ys); break;
        case 1: qblock_rows(f, dec, row, C, x + (size_t)t * xs, xs, 1, y + (size_t)t * ys + r, ys); break;
        }
    }
}

KERNEL_GG_TO_PACKED()

/* gg = 0: packed + scales rows; gg = 1: a row of ggml blocks in prow */
ALWAYS_INLINE void mxfp4_rows_any(const uint8_t *prow, const uint8_t *srow, int C, const float *xp,
                                  size_t xs, int nt, float *y, size_t ys, int gg)
{
    const __m512 tab = _mm512_loadu_ps(e2m1_table);
    __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
    for (int b = 0; b < C / MXFP4_BLOCK; b++) {
        __m128i bytes = gg ? gg_to_packed(_mm_loadu_si128((const __m128i *)(prow + (size_t)b * GGML_MXFP4_BYTES + 1)))
                           : _mm_loadu_si128((const __m128i *)(prow + (size_t)b * 16));
        __m512i v = _mm512_cvtepu8_epi32(bytes);
        __m512 we = _mm512_permutexvar_ps(v, tab); /* vpermps reads the low 4 index bits only */
        __m512 wo = _mm512_permutexvar_ps(_mm512_srli_epi32(v, 4), tab);
        __m512 sc = _mm512_set1_ps(e8m0_table[gg ? prow[(size_t)b * GGML_MXFP4_BYTES] : srow[b]]);
        _Pragma("GCC unroll 4") for (int u = 0; u < nt; u++) {
            const float *xe = xp + (size_t)u * xs + (size_t)b * MXFP4_BLOCK;
            __m512 p = _mm512_mul_ps(we, _mm512_loadu_ps(xe));
            p = _mm512_fmadd_ps(wo, _mm512_loadu_ps(xe + 16), p);
            acc[u] = _mm512_fmadd_ps(p, sc, acc[u]);
        }
    }
    _Pragma("GCC unroll 4") for (int u = 0; u < nt; u++) y[(size_t)u * ys] = tree512(acc[u]);
}

KERNEL_MXFP4_DRIVERS(matmul_mxfp4_avx512, matmul_mxfp4_gg_avx512, mxfp4_rows_any)

/* ---- elementwise kernels (kernels_elementwise.h) on eight double lanes:
 * df_exp's main branch as in kernels_avx2.c's exp4_pd, twice as wide ---- */
ALWAYS_INLINE __m512d exp8_pd(__m512d x)
{
    const __m512d shift = _mm512_set1_pd(DF_EXP_SHIFT);
    __m512d n = _mm512_sub_pd(_mm512_add_pd(_mm512_mul_pd(x, _mm512_set1_pd(DF_EXP_INV_LN2)), shift), shift);
    __m512d r = _mm512_sub_pd(_mm512_sub_pd(x, _mm512_mul_pd(n, _mm512_set1_pd(DF_EXP_LN2_HI))),
                              _mm512_mul_pd(n, _mm512_set1_pd(DF_EXP_LN2_LO)));
    __m512d p = _mm512_set1_pd(DF_EXP_LEAD);
#define EXP_STEP(C) p = _mm512_add_pd(_mm512_mul_pd(p, r), _mm512_set1_pd(C))
    DF_EXP_STEPS(EXP_STEP);
#undef EXP_STEP
    __m512i k = _mm512_cvtepi32_epi64(_mm512_cvtpd_epi32(n)); /* n is an integer: exact */
    __m512i bits = _mm512_slli_epi64(_mm512_add_epi64(k, _mm512_set1_epi64(1023)), 52);
    return _mm512_mul_pd(p, _mm512_castsi512_pd(bits));
}

typedef __m512d ew_d;
typedef __m256 ew_f;
#define EW_W 8
#define EW_FN(name) name##_avx512
#define ew_loadf(p) _mm256_loadu_ps(p)
#define ew_storef(p, v) _mm256_storeu_ps((p), (v))
#define ew_loadd(p) _mm512_loadu_pd(p)
#define ew_stored(p, v) _mm512_storeu_pd((p), (v))
#define ew_f2d(v) _mm512_cvtps_pd(v)
#define ew_d2f(v) _mm512_cvtpd_ps(v)
#define ew_setd(c) _mm512_set1_pd(c)
#define ew_setf(c) _mm256_set1_ps(c)
#define ew_addd _mm512_add_pd
#define ew_subd _mm512_sub_pd
#define ew_muld _mm512_mul_pd
#define ew_divd _mm512_div_pd
#define ew_mulf _mm256_mul_ps
#define ew_divf _mm256_div_ps
#define ew_absd(v) _mm512_castsi512_pd(_mm512_and_epi64(_mm512_castpd_si512(v), _mm512_set1_epi64(INT64_MAX)))
#define ew_neg_if_neg(t, d)                                                                                      \
    _mm512_castsi512_pd(_mm512_mask_xor_epi64(_mm512_castpd_si512(t),                                           \
                                              _mm512_cmp_pd_mask((d), _mm512_setzero_pd(), _CMP_LT_OQ),          \
                                              _mm512_castpd_si512(t), _mm512_set1_epi64(INT64_MIN)))
#define ew_all_in(v, lo, hi)                                                                                    \
    ((_mm512_cmp_pd_mask((v), _mm512_set1_pd(lo), _CMP_GE_OQ) & _mm512_cmp_pd_mask((v), _mm512_set1_pd(hi),   \
                                                                                    _CMP_LE_OQ)) == 0xFF)
#define ew_exp_main exp8_pd
#include "kernels_elementwise.h"

/* ---- MLA attention: mla_attend_ref's contract (kernels.h), bit for bit,
 * on eight double lanes.
 *
 * Queries: every head's query is transposed once per call into qf
 * ([column][nhp] doubles, nhp = the heads rounded up to eight, padding
 * lanes zero; all queries are read before ctx is written, so ctx may
 * overlap them).
 * Scores: lanes are heads.  A block of 32 positions is taken in chunks of
 * 64 columns, the chunk of each row widened to double once (rt, [position]
 * [column]); then per block of sixteen heads (two vectors), or the last
 * one to eight (one vector, idle lanes on zero queries), eight positions at
 * a time: per column, the heads' queries, a broadcast of each position's
 * value and eight or sixteen independent FMA chains, each lane one (head,
 * position) sum in j order.  A product of two floats is exact in double, so
 * the FMA rounds as the reference's product-then-add.  Sums run on from
 * chunk to chunk through `acc`; a block's rows serve every head of the
 * call.  Finished: s = (float)sum * scale, and mx by `if (s > mx) mx = s`
 * per lane in position order.
 * Softmax: the scores, stored [p][head], are one flat array for exp8 (the
 * scalar df_exp for any group with a lane outside [-708, 708]); then each
 * head's sum over p in order.
 * Context: lanes are j; per tile of positions (kept in L2) and block of four
 * heads, 32 columns of ctx stay in registers while p runs in order:
 * multiply, then add (-ffp-contract=off keeps the intrinsics apart).
 * Calls of fewer than eight heads (idle lanes; the AVX2 code puts positions
 * in its lanes then) and calls whose transposed queries would not fit in
 * MLA5_QMAX doubles (K3's 576 columns x 32 heads do) take the AVX2 code,
 * with the same results. */
enum { MLA5_PB = 32, MLA5_JC = 64, MLA5_QMAX = 18432 };

/* df_exp on eight lanes: exp8_pd when every lane is in its range, else the
 * scalar function lane by lane */
ALWAYS_INLINE __m512d exp8_any(__m512d x)
{
    unsigned ok = (unsigned)(_mm512_cmp_pd_mask(x, _mm512_set1_pd(-708.0), _CMP_GE_OQ) &
                             _mm512_cmp_pd_mask(x, _mm512_set1_pd(708.0), _CMP_LE_OQ));
    if (__builtin_expect(ok == 0xFF, 1)) return exp8_pd(x);
    double xs[8], es[8];
    _mm512_storeu_pd(xs, x);
    for (int l = 0; l < 8; l++) es[l] = df_exp(xs[l]);
    return _mm512_loadu_pd(es);
}

/* the first k floats of v to p (k < 8: through a buffer) */
ALWAYS_INLINE void store_first8(float *p, __m256 v, int k)
{
    if (k >= 8) {
        _mm256_storeu_ps(p, v);
        return;
    }
    float b[8];
    _mm256_storeu_ps(b, v);
    memcpy(p, b, (size_t)k * sizeof(float));
}

/* Score sums of block positions u0 .. u0+7 for the heads h0 .. h0+8*nv-1
 * over the chunk's jn columns (j0 ..), from acc (first: from +0) back to
 * acc, or (last chunk) finished into sc and mx for the np live positions.
 * nv is 1 or 2, constant. */
ALWAYS_INLINE void mla5_scores(const double *rt, const double *qf, int nhp, int j0, int jn, int nv, int u0,
                               double *acc, int h0, int first, int last, int np, int nh, float scale, float *sc,
                               double *mx)
{
    __m512d a[8][2];
    _Pragma("GCC unroll 8") for (int u = 0; u < 8; u++) _Pragma("GCC unroll 2") for (int v = 0; v < nv; v++)
        a[u][v] = first ? _mm512_setzero_pd() : _mm512_load_pd(acc + (size_t)(u0 + u) * nhp + h0 + 8 * v);
    const double *q = qf + (size_t)j0 * nhp + h0;
    const double *r = rt + (size_t)u0 * MLA5_JC;
    for (int jj = 0; jj < jn; jj++, q += nhp, r++) {
        __m512d q0 = _mm512_load_pd(q);
        __m512d q1 = nv == 2 ? _mm512_load_pd(q + 8) : q0;
        _Pragma("GCC unroll 8") for (int u = 0; u < 8; u++) {
            __m512d x = _mm512_set1_pd(r[u * MLA5_JC]);
            a[u][0] = _mm512_fmadd_pd(q0, x, a[u][0]);
            if (nv == 2) a[u][1] = _mm512_fmadd_pd(q1, x, a[u][1]);
        }
    }
    if (!last) {
        _Pragma("GCC unroll 8") for (int u = 0; u < 8; u++) _Pragma("GCC unroll 2") for (int v = 0; v < nv; v++)
            _mm512_store_pd(acc + (size_t)(u0 + u) * nhp + h0 + 8 * v, a[u][v]);
        return;
    }
    const __m256 vs = _mm256_set1_ps(scale);
    _Pragma("GCC unroll 2") for (int v = 0; v < nv; v++) {
        int hv = h0 + 8 * v, k = nh - hv;
        __m512d mxd = _mm512_loadu_pd(mx + hv);
        _Pragma("GCC unroll 8") for (int u = 0; u < 8; u++) {
            if (u0 + u >= np) break;
            __m256 s = _mm256_mul_ps(_mm512_cvtpd_ps(a[u][v]), vs);
            if (k > 0) store_first8(sc + (size_t)(u0 + u) * nh + hv, s, k);
            __m512d sd = _mm512_cvtps_pd(s);
            mxd = _mm512_mask_blend_pd(_mm512_cmp_pd_mask(sd, mxd, _CMP_GT_OQ), mxd, sd); /* if (s > mx) mx = s */
        }
        _mm512_storeu_pd(mx + hv, mxd);
    }
}

/* columns j0 .. j0+jn-1 of rows p0 .. p0+np-1 as doubles, rt[u][jj]; the
 * rows of the last group of eight past np are zeros */
static void mla5_rows_tile(const float *cache, size_t row_w, int p0, int np, int n, int j0, int jn, double *rt)
{
    for (int u = 0; u < np; u++) {
        const float *r = cache + (size_t)(p0 + u) * row_w + j0;
        double *d = rt + (size_t)u * MLA5_JC;
        if (p0 + MLA5_PB + u < n) /* the next block's chunk, into L2 meanwhile */
            for (int k = 0; k < jn; k += 16) _mm_prefetch((const char *)(r + MLA5_PB * row_w + k), _MM_HINT_T1);
        int jj = 0;
        for (; jj + 8 <= jn; jj += 8) _mm512_store_pd(d + jj, _mm512_cvtps_pd(_mm256_loadu_ps(r + jj)));
        for (; jj < jn; jj++) d[jj] = r[jj];
    }
    int ne = (np + 7) & ~7;
    if (ne > np) memset(rt + (size_t)np * MLA5_JC, 0, (size_t)(ne - np) * MLA5_JC * sizeof(double));
}

/* ctx[h0 + u][j0 .. j0+31] (nu heads, the columns live in m0 / m1)
 * accumulated over positions p0 .. pe-1; first: start from +0; pn: prefetch
 * the same columns of the rows pn positions on */
ALWAYS_INLINE void mla5_ctx32(const float *cache, size_t row_w, int Rkv, const float *sc, int nh, int h0, int nu,
                              int j0, int p0, int pe, int first, __mmask16 m0, __mmask16 m1, size_t pn, float *ctx)
{
    __m512 a[4][2];
    _Pragma("GCC unroll 4") for (int u = 0; u < nu; u++) {
        float *c = ctx + (size_t)(h0 + u) * Rkv + j0;
        a[u][0] = first ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(m0, c);
        a[u][1] = first ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(m1, c + 16);
    }
    const float *row = cache + (size_t)p0 * row_w + j0, *pp = sc + (size_t)p0 * nh + h0;
    for (int p = p0; p < pe; p++, row += row_w, pp += nh) {
        if (pn) _mm_prefetch((const char *)(row + pn * row_w), _MM_HINT_T1);
        __m512 r0 = _mm512_maskz_loadu_ps(m0, row), r1 = _mm512_maskz_loadu_ps(m1, row + 16);
        _Pragma("GCC unroll 4") for (int u = 0; u < nu; u++) {
            __m512 b = _mm512_set1_ps(pp[u]);
            a[u][0] = _mm512_add_ps(a[u][0], _mm512_mul_ps(b, r0));
            a[u][1] = _mm512_add_ps(a[u][1], _mm512_mul_ps(b, r1));
        }
    }
    _Pragma("GCC unroll 4") for (int u = 0; u < nu; u++) {
        float *c = ctx + (size_t)(h0 + u) * Rkv + j0;
        _mm512_mask_storeu_ps(c, m0, a[u][0]);
        _mm512_mask_storeu_ps(c + 16, m1, a[u][1]);
    }
}

/* lanes < k of a 16-lane mask (k may be <= 0 or > 16) */
static inline __mmask16 mask16_below(int k)
{
    return k <= 0 ? 0 : k >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << k) - 1);
}

/* The AVX2 code, for the calls above (every AVX-512 CPU has AVX2 and FMA);
 * the SIMDe test build takes the reference where AVX2 is absent. */
static const kernel_table *mla_table(void)
{
    const kernel_table *t = kernels_avx2();
    return t && kernels_cpu_has(KERNEL_AVX2) ? t : kernels_ref();
}

static void mla_attend_avx512(const float *cache, size_t row_w, int Rkv, int dr, int n, const float *ql, size_t qls,
                              const float *qr, size_t qrs, int nh, float scale, float *sc, float *ctx)
{
    CHECK(nh >= 1 && nh <= MLA_NH_MAX && n >= 1);
    int nhp = (nh + 7) & ~7, w = Rkv + dr;
    if (nh < 8 || (size_t)w * (size_t)nhp > MLA5_QMAX) {
        mla_table()->mla_attend(cache, row_w, Rkv, dr, n, ql, qls, qr, qrs, nh, scale, sc, ctx);
        return;
    }
    double qf[MLA5_QMAX] __attribute__((aligned(64)));
    double rt[MLA5_PB * MLA5_JC] __attribute__((aligned(64)));
    double acc[MLA5_PB * MLA_NH_MAX] __attribute__((aligned(64))); /* [u][nhp], lanes = heads */
    double mx[MLA_NH_MAX];
    for (int h = 0; h < MLA_NH_MAX; h++) mx[h] = -INFINITY;
    for (int h = 0; h < nhp; h++) {
        double *d = qf + h;
        if (h >= nh) {
            for (int j = 0; j < w; j++) d[(size_t)j * nhp] = 0.0;
            continue;
        }
        const float *a = ql + (size_t)h * qls, *b = qr + (size_t)h * qrs;
        for (int j = 0; j < Rkv; j++) d[(size_t)j * nhp] = a[j];
        for (int j = 0; j < dr; j++) d[(size_t)(Rkv + j) * nhp] = b[j];
    }

    /* scores: heads in pairs of vectors, then the last one to eight */
    for (int p0 = 0; p0 < n; p0 += MLA5_PB) {
        int np = n - p0 < MLA5_PB ? n - p0 : MLA5_PB;
        float *scb = sc + (size_t)p0 * nh;
        for (int j0 = 0; j0 < w; j0 += MLA5_JC) {
            int jn = w - j0 < MLA5_JC ? w - j0 : MLA5_JC, first = j0 == 0, last = j0 + jn == w;
            mla5_rows_tile(cache, row_w, p0, np, n, j0, jn, rt);
            int h0 = 0;
            for (; h0 + 16 <= nhp; h0 += 16)
                for (int u0 = 0; u0 < np; u0 += 8)
                    mla5_scores(rt, qf, nhp, j0, jn, 2, u0, acc, h0, first, last, np, nh, scale, scb, mx);
            if (h0 < nhp)
                for (int u0 = 0; u0 < np; u0 += 8)
                    mla5_scores(rt, qf, nhp, j0, jn, 1, u0, acc, h0, first, last, np, nh, scale, scb, mx);
        }
    }

    /* softmax weights: the exp over sc as one flat array (lane i is head
     * i mod nh; mxe repeats mx so that eight lanes' maxima are one load),
     * then each head's sum over p in order */
    double mxe[MLA_NH_MAX + 8];
    for (int k = 0; k < nh + 8; k++) mxe[k] = mx[k % nh];
    size_t nall = (size_t)n * nh, i = 0;
    for (int h = 0; i + 8 <= nall; i += 8) {
        __m512d x = _mm512_sub_pd(_mm512_cvtps_pd(_mm256_loadu_ps(sc + i)), _mm512_loadu_pd(mxe + h));
        _mm256_storeu_ps(sc + i, _mm512_cvtpd_ps(exp8_any(x)));
        for (h += 8; h >= nh;) h -= nh;
    }
    for (; i < nall; i++) sc[i] = (float)df_exp((double)sc[i] - mx[i % nh]);
    mla_weights_normalise(sc, n, nh);

    /* context: tiles of positions that stay in L2 while every head block
     * and column block passes over them; the first head block fetches the
     * next tile */
    int pt = (int)((256u << 10) / (row_w * sizeof(float) + 1));
    if (pt < 16) pt = 16;
    for (int p0 = 0; p0 < n; p0 += pt) {
        int pe = n - p0 < pt ? n : p0 + pt, first = p0 == 0;
        for (int h0 = 0; h0 < nh; h0 += 4) {
            int nu = nh - h0 < 4 ? nh - h0 : 4;
            size_t pn = h0 == 0 && pe + pt <= n ? (size_t)pt : 0;
            for (int j0 = 0; j0 < Rkv; j0 += 32) {
                __mmask16 m0 = mask16_below(Rkv - j0), m1 = mask16_below(Rkv - j0 - 16);
                switch (nu) {
                case 4: mla5_ctx32(cache, row_w, Rkv, sc, nh, h0, 4, j0, p0, pe, first, m0, m1, pn, ctx); break;
                case 3: mla5_ctx32(cache, row_w, Rkv, sc, nh, h0, 3, j0, p0, pe, first, m0, m1, pn, ctx); break;
                case 2: mla5_ctx32(cache, row_w, Rkv, sc, nh, h0, 2, j0, p0, pe, first, m0, m1, pn, ctx); break;
                default: mla5_ctx32(cache, row_w, Rkv, sc, nh, h0, 1, j0, p0, pe, first, m0, m1, pn, ctx); break;
                }
            }
        }
    }
}

/* ---- the KDA delta rule's passes (kernels_kda.h) on 16 floats ---- */
#define KV __m512
#define KW 16
#define kv_load _mm512_loadu_ps
#define kv_store _mm512_storeu_ps
#define kv_set1 _mm512_set1_ps
#define kv_mul _mm512_mul_ps
#define kv_add _mm512_add_ps
#define KDA_FN(name) name##_avx512
#include "kernels_kda.h"

static const kernel_table avx512_table = {
    .name = "avx512",
    .matmul_f32 = matmul_f32_avx512,
    .matmul_bf16 = matmul_bf16_avx512,
    .matmul_mxfp4 = matmul_mxfp4_avx512,
    .matmul_mxfp4_gg = matmul_mxfp4_gg_avx512,
    .matmul_f16 = matmul_f16_avx512,
    .matmul_q8_0 = matmul_q8_0_avx512,
    .matmul_qblock = matmul_qblock_avx512,
    .mla_attend = mla_attend_avx512,
    .exp_n = exp_n_avx512,
    .sigmoid_n = sigmoid_n_avx512,
    .silu_n = silu_n_avx512,
    .situ_n = situ_n_avx512,
    .kda_decay_pred = kda_decay_pred_avx512,
    .kda_update_out = kda_update_out_avx512,
};

const kernel_table *kernels_avx512(void);
const kernel_table *kernels_avx512(void) { return &avx512_table; }

#else
const kernel_table *kernels_avx512(void) { return 0; }
#endif
