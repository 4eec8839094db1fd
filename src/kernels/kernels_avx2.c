/* kernels_avx2.c - AVX2 + FMA versions of the kernels in kernels_ref.c, which
 * they must match bit for bit.  The 16 lanes of the contract in kernels.h
 * live in two __m256 registers (lanes 0-7 and 8-15); their sum is the first
 * step of the lane tree.  Tails are handled with zero-filled copies of the
 * last partial chunk, the same fma(0, 0, acc) as the reference.  Up to four
 * positions share one pass over a weight row.  Compiled with -mavx2 -mfma.
 */
#include "kernels.h"
#include "kernels_drivers.h"
#include "mathfn.h"
#include "quant.h"
#include "util.h"

#if defined(__x86_64__) && defined(DF_HAVE_AVX2)
#include <immintrin.h>
#include <math.h>
#include <string.h>

#define ALWAYS_INLINE static inline __attribute__((always_inline))

/* matches lane_tree16() with lanes 0-7 in a and 8-15 in b */
ALWAYS_INLINE float tree2x256(__m256 a, __m256 b)
{
    __m256 s8 = _mm256_add_ps(a, b);
    __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
    __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    __m128 s1 = _mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1));
    return _mm_cvtss_f32(s1);
}

ALWAYS_INLINE __m256 ld8_bf16(const uint8_t *p)
{
    __m128i h = _mm_loadu_si128((const __m128i *)p);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

ALWAYS_INLINE __m256 ld8_f32(const uint8_t *p) { return _mm256_loadu_ps((const float *)p); }

/* 8 halves -> f32, exact (F16C, which every AVX2 CPU has; kernels_cpu_has checks) */
ALWAYS_INLINE __m256 ld8_f16(const uint8_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }

#define DENSE_ROW(NAME, LOAD8, ESIZE)                                                              \
    ALWAYS_INLINE void NAME##_rows(const uint8_t *row, int C, const float *x, size_t xs, int nt,   \
                                   float *y, size_t ys)                                          \
    {                                                                                              \
        __m256 a0[4], a1[4];                                                                       \
        _Pragma("GCC unroll 4") for (int u = 0; u < 4; u++) a0[u] = a1[u] = _mm256_setzero_ps();                           \
        int c = 0;                                                                                 \
        for (; c + 16 <= C; c += 16) {                                                             \
            __m256 w0 = LOAD8(row + (size_t)c * ESIZE), w1 = LOAD8(row + (size_t)(c + 8) * ESIZE); \
            _Pragma("GCC unroll 4") for (int u = 0; u < nt; u++) {                                                         \
                const float *xu = x + (size_t)u * xs + c;                                          \
                a0[u] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(xu), a0[u]);                           \
                a1[u] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(xu + 8), a1[u]);                       \
            }                                                                                      \
        }                                                                                          \
        if (c < C) {                                                                               \
            uint8_t wt[16 * ESIZE] __attribute__((aligned(32)));                                   \
            float xt[16] __attribute__((aligned(32)));                                             \
            memset(wt, 0, sizeof wt);                                                              \
            memcpy(wt, row + (size_t)c * ESIZE, (size_t)(C - c) * ESIZE);                          \
            __m256 w0 = LOAD8(wt), w1 = LOAD8(wt + 8 * ESIZE);                                     \
            _Pragma("GCC unroll 4") for (int u = 0; u < nt; u++) {                                                         \
                memset(xt, 0, sizeof xt);                                                          \
                memcpy(xt, x + (size_t)u * xs + c, (size_t)(C - c) * 4);                           \
                a0[u] = _mm256_fmadd_ps(w0, _mm256_load_ps(xt), a0[u]);                            \
                a1[u] = _mm256_fmadd_ps(w1, _mm256_load_ps(xt + 8), a1[u]);                        \
            }                                                                                      \
        }                                                                                          \
        _Pragma("GCC unroll 4") for (int u = 0; u < nt; u++) y[(size_t)u * ys] = tree2x256(a0[u], a1[u]);                  \
    }                                                                                              \
    KERNEL_DENSE_DRIVER(NAME, ESIZE)

/* Two rows at a time for up to three positions: 12 accumulators and the
 * two rows' weights fill the 16 registers, and each activation load feeds
 * two FMAs (the one-row form above needs a load per FMA).  Every (row,
 * position) still sums its own lanes in the contract's order, so results
 * are those of the one-row form. */
/* position u's low / high eight activations into both rows' accumulators */
#define ROW2_FMA(U, XL, XH)                                                                        \
    do {                                                                                           \
        __m256 xl_ = (XL), xh_ = (XH);                                                             \
        a0[U] = _mm256_fmadd_ps(v0, xl_, a0[U]);                                                   \
        a1[U] = _mm256_fmadd_ps(v1, xh_, a1[U]);                                                   \
        b0[U] = _mm256_fmadd_ps(w0, xl_, b0[U]);                                                   \
        b1[U] = _mm256_fmadd_ps(w1, xh_, b1[U]);                                                   \
    } while (0)
#define DENSE_ROW2(NAME, LOAD8, ESIZE)                                                             \
    ALWAYS_INLINE void NAME##_rows2(const uint8_t *r0p, const uint8_t *r1p, int C, const float *x, \
                                    size_t xs, int nt, float *y, size_t ys)                        \
    {                                                                                              \
        __m256 a0[3], a1[3], b0[3], b1[3];                                                         \
        _Pragma("GCC unroll 3") for (int u = 0; u < 3; u++) a0[u] = a1[u] = b0[u] = b1[u] = _mm256_setzero_ps(); \
        int c = 0;                                                                                 \
        for (; c + 16 <= C; c += 16) {                                                             \
            __m256 v0 = LOAD8(r0p + (size_t)c * ESIZE), v1 = LOAD8(r0p + (size_t)(c + 8) * ESIZE);  \
            __m256 w0 = LOAD8(r1p + (size_t)c * ESIZE), w1 = LOAD8(r1p + (size_t)(c + 8) * ESIZE);  \
            _Pragma("GCC unroll 3") for (int u = 0; u < nt; u++) {                                 \
                const float *xu = x + (size_t)u * xs + c;                                          \
                ROW2_FMA(u, _mm256_loadu_ps(xu), _mm256_loadu_ps(xu + 8));                         \
            }                                                                                      \
        }                                                                                          \
        if (c < C) {                                                                               \
            uint8_t vt[16 * ESIZE] __attribute__((aligned(32))), wt[16 * ESIZE] __attribute__((aligned(32))); \
            float xt[16] __attribute__((aligned(32)));                                             \
            memset(vt, 0, sizeof vt);                                                              \
            memset(wt, 0, sizeof wt);                                                              \
            memcpy(vt, r0p + (size_t)c * ESIZE, (size_t)(C - c) * ESIZE);                          \
            memcpy(wt, r1p + (size_t)c * ESIZE, (size_t)(C - c) * ESIZE);                          \
            __m256 v0 = LOAD8(vt), v1 = LOAD8(vt + 8 * ESIZE), w0 = LOAD8(wt), w1 = LOAD8(wt + 8 * ESIZE); \
            _Pragma("GCC unroll 3") for (int u = 0; u < nt; u++) {                                 \
                memset(xt, 0, sizeof xt);                                                          \
                memcpy(xt, x + (size_t)u * xs + c, (size_t)(C - c) * 4);                           \
                ROW2_FMA(u, _mm256_load_ps(xt), _mm256_load_ps(xt + 8));                           \
            }                                                                                      \
        }                                                                                          \
        _Pragma("GCC unroll 3") for (int u = 0; u < nt; u++) {                                     \
            y[(size_t)u * ys] = tree2x256(a0[u], a1[u]);                                           \
            y[(size_t)u * ys + 1] = tree2x256(b0[u], b1[u]);                                       \
        }                                                                                          \
    }

DENSE_ROW(matmul_bf16_avx2_1, ld8_bf16, 2)
DENSE_ROW(matmul_f32_avx2_1, ld8_f32, 4)
DENSE_ROW2(matmul_bf16_avx2, ld8_bf16, 2)
DENSE_ROW2(matmul_f32_avx2, ld8_f32, 4)
DENSE_ROW(matmul_f16_avx2_1, ld8_f16, 2)
DENSE_ROW2(matmul_f16_avx2, ld8_f16, 2)

/* Batches (T > 1): row tiles kept in L2 as in KERNEL_DENSE_DRIVER, rows in
 * pairs, positions in threes; an odd last row takes the one-row form.
 * One position (decode): the one-row driver, which streams weights at
 * memory speed already. */
#define DENSE_DRIVER2(NAME, ESIZE)                                                                 \
    static void NAME(const void *W, size_t ld, int C, const float *x, size_t xs, int T, float *y,  \
                     size_t ys, int r0, int r1)                                                    \
    {                                                                                              \
        if (T == 1) {                                                                              \
            NAME##_1(W, ld, C, x, xs, T, y, ys, r0, r1);                                           \
            return;                                                                                \
        }                                                                                          \
        int tile = (int)((128u << 10) / ((size_t)C * ESIZE + 1)) + 2;                              \
        for (int rt = r0; rt < r1; rt += tile) {                                                   \
            int re = rt + tile < r1 ? rt + tile : r1;                                              \
            for (int t = 0; t < T; t += 3) {                                                       \
                int nt = T - t < 3 ? T - t : 3;                                                    \
                const float *xt = x + (size_t)t * xs;                                              \
                float *yt = y + (size_t)t * ys;                                                    \
                int r = rt;                                                                        \
                for (; r + 2 <= re; r += 2) {                                                      \
                    const uint8_t *p0 = (const uint8_t *)W + (size_t)r * ld * ESIZE;               \
                    const uint8_t *p1 = p0 + ld * ESIZE;                                           \
                    switch (nt) {                                                                  \
                    case 3: NAME##_rows2(p0, p1, C, xt, xs, 3, yt + r, ys); break;                 \
                    case 2: NAME##_rows2(p0, p1, C, xt, xs, 2, yt + r, ys); break;                 \
                    default: NAME##_rows2(p0, p1, C, xt, xs, 1, yt + r, ys); break;                \
                    }                                                                              \
                }                                                                                  \
                if (r < re) NAME##_1(W, ld, C, xt, xs, nt, yt, ys, r, re);                         \
            }                                                                                      \
        }                                                                                          \
    }

DENSE_DRIVER2(matmul_bf16_avx2, 2)
DENSE_DRIVER2(matmul_f32_avx2, 4)
DENSE_DRIVER2(matmul_f16_avx2, 2)

/* Q8_0: per block, 8 int8 -> f32 times the scale (exact), the dense order's
 * lanes 0-7 and 8-15 over columns 32b + 0..15, then 32b + 16..31 */
ALWAYS_INLINE __m256 q8_8(const uint8_t *q, __m256 d)
{
    return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)q))), d);
}

ALWAYS_INLINE void q8_0_rows(const uint8_t *row, const uint8_t *unused, int C, const float *x, size_t xs, int nt,
                             float *y, size_t ys)
{
    (void)unused;
    __m256 a0[4], a1[4];
    _Pragma("GCC unroll 4") for (int u = 0; u < 4; u++) a0[u] = a1[u] = _mm256_setzero_ps();
    for (int b = 0; b < C / Q8_0_BLOCK; b++) {
        const uint8_t *blk = row + (size_t)b * Q8_0_BYTES;
        uint16_t dh;
        memcpy(&dh, blk, 2);
        __m256 d = _mm256_set1_ps(f16_to_f32(dh));
        for (int half = 0; half < 2; half++) {
            __m256 w0 = q8_8(blk + 2 + 16 * half, d), w1 = q8_8(blk + 10 + 16 * half, d);
            int c = b * Q8_0_BLOCK + 16 * half;
            _Pragma("GCC unroll 4") for (int u = 0; u < nt; u++) {
                const float *xu = x + (size_t)u * xs + c;
                a0[u] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(xu), a0[u]);
                a1[u] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(xu + 8), a1[u]);
            }
        }
    }
    _Pragma("GCC unroll 4") for (int u = 0; u < nt; u++) y[(size_t)u * ys] = tree2x256(a0[u], a1[u]);
}
KERNEL_TILED_DRIVER(matmul_q8_0_avx2, q8_0_rows, (size_t)C / Q8_0_BLOCK * Q8_0_BYTES)

/* any block format: per row and group of up to four positions, each block
 * decoded once (the scalar decode of qblock.c: exact) into an aligned
 * buffer, then the dense order's two 8-lane halves over it */
/* Q4_K and Q6_K decoded in vectors, 8 values at a time: the same float
 * operations in the same order as qblock.c's dec_q4_k / dec_q6_k (and the
 * AVX-512 ones), each a separate rounding, so bit for bit the scalar
 * decode's values. */
static float half_le(const uint8_t *p)
{
    uint16_t h;
    memcpy(&h, p, 2);
    return f16_to_f32(h);
}

ALWAYS_INLINE __m256i bytes8(const uint8_t *p)
{
    return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p));
}

static void dec_q4_k_avx2(const uint8_t *b, float *y)
{
    float d = half_le(b), min = half_le(b + 2);
    const uint8_t *scales = b + 4, *q = b + 16;
    const __m256i lo4 = _mm256_set1_epi32(15);
    for (int j = 0; j < 4; j++) {
        uint8_t sc, m;
        qblock_k4_scale_min(2 * j, scales, &sc, &m);
        __m256 d1 = _mm256_set1_ps(d * (float)sc), m1 = _mm256_set1_ps(min * (float)m);
        qblock_k4_scale_min(2 * j + 1, scales, &sc, &m);
        __m256 d2 = _mm256_set1_ps(d * (float)sc), m2 = _mm256_set1_ps(min * (float)m);
        for (int h = 0; h < 4; h++) {
            __m256i v = bytes8(q + 32 * j + 8 * h);
            __m256 lo = _mm256_cvtepi32_ps(_mm256_and_si256(v, lo4)), hi = _mm256_cvtepi32_ps(_mm256_srli_epi32(v, 4));
            _mm256_storeu_ps(y + 64 * j + 8 * h, _mm256_sub_ps(_mm256_mul_ps(d1, lo), m1));
            _mm256_storeu_ps(y + 64 * j + 32 + 8 * h, _mm256_sub_ps(_mm256_mul_ps(d2, hi), m2));
        }
    }
}

static void dec_q6_k_avx2(const uint8_t *b, float *y)
{
    const uint8_t *ql = b, *qh = b + 128;
    const int8_t *sc = (const int8_t *)(b + 192);
    float d = half_le(b + 208);
    const __m256i lo4 = _mm256_set1_epi32(15), two = _mm256_set1_epi32(3), off = _mm256_set1_epi32(32);
    for (int n = 0; n < 2; n++) {
        for (int h = 0; h < 4; h++) {
            __m256i l0 = bytes8(ql + 8 * h), l1 = bytes8(ql + 32 + 8 * h), hb = bytes8(qh + 8 * h);
            __m256i q[4] = {
                _mm256_or_si256(_mm256_and_si256(l0, lo4), _mm256_slli_epi32(_mm256_and_si256(hb, two), 4)),
                _mm256_or_si256(_mm256_and_si256(l1, lo4),
                                _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(hb, 2), two), 4)),
                _mm256_or_si256(_mm256_srli_epi32(l0, 4),
                                _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(hb, 4), two), 4)),
                _mm256_or_si256(_mm256_srli_epi32(l1, 4),
                                _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(hb, 6), two), 4)),
            };
            for (int k = 0; k < 4; k++) {
                __m256 ds = _mm256_set1_ps(d * (float)sc[h / 2 + 2 * k]);
                _mm256_storeu_ps(y + 32 * k + 8 * h, _mm256_mul_ps(ds, _mm256_cvtepi32_ps(_mm256_sub_epi32(q[k], off))));
            }
        }
        y += 128;
        ql += 64;
        qh += 32;
        sc += 8;
    }
}

/* Q5_K: Q4_K with a fifth bit per value from 32 bytes of high bits */
static void dec_q5_k_avx2(const uint8_t *b, float *y)
{
    float d = half_le(b), min = half_le(b + 2);
    const uint8_t *scales = b + 4, *qh = b + 16, *ql = b + 48;
    const __m256i lo4 = _mm256_set1_epi32(15), one = _mm256_set1_epi32(1);
    for (int j = 0; j < 4; j++) {
        uint8_t sc, m;
        qblock_k4_scale_min(2 * j, scales, &sc, &m);
        __m256 d1 = _mm256_set1_ps(d * (float)sc), m1 = _mm256_set1_ps(min * (float)m);
        qblock_k4_scale_min(2 * j + 1, scales, &sc, &m);
        __m256 d2 = _mm256_set1_ps(d * (float)sc), m2 = _mm256_set1_ps(min * (float)m);
        for (int h = 0; h < 4; h++) {
            __m256i v = bytes8(ql + 32 * j + 8 * h), hb = bytes8(qh + 8 * h);
            __m256i b1 = _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(hb, 2 * j), one), 4);
            __m256i b2 = _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(hb, 2 * j + 1), one), 4);
            __m256 lo = _mm256_cvtepi32_ps(_mm256_add_epi32(_mm256_and_si256(v, lo4), b1));
            __m256 hi = _mm256_cvtepi32_ps(_mm256_add_epi32(_mm256_srli_epi32(v, 4), b2));
            _mm256_storeu_ps(y + 64 * j + 8 * h, _mm256_sub_ps(_mm256_mul_ps(d1, lo), m1));
            _mm256_storeu_ps(y + 64 * j + 32 + 8 * h, _mm256_sub_ps(_mm256_mul_ps(d2, hi), m2));
        }
    }
}

/* Q2_K: per 16 values a 4-bit scale and min; codes of 2 bits at four shifts */
static void dec_q2_k_avx2(const uint8_t *b, float *y)
{
    const uint8_t *sc = b, *q = b + 16;
    float d = half_le(b + 80), min = half_le(b + 82);
    const __m256i three = _mm256_set1_epi32(3);
    int is = 0;
    for (int n = 0; n < 2; n++) {
        for (int shift = 0; shift < 8; shift += 2)
            for (int half = 0; half < 2; half++) {
                uint8_t s = sc[is++];
                __m256 dl = _mm256_set1_ps(d * (float)(s & 0xF)), ml = _mm256_set1_ps(min * (float)(s >> 4));
                for (int p = 0; p < 2; p++) {
                    __m256 c = _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srli_epi32(bytes8(q + 16 * half + 8 * p), shift),
                                                                   three));
                    _mm256_storeu_ps(y + 8 * p, _mm256_sub_ps(_mm256_mul_ps(dl, c), ml));
                }
                y += 16;
            }
        q += 32;
    }
}

/* Q3_K: 2-bit codes, minus 4 where the high bit is clear, 6-bit scales */
static void dec_q3_k_avx2(const uint8_t *b, float *y)
{
    const uint8_t *hm = b, *q = b + 32;
    float d_all = half_le(b + 108);
    int8_t scales[16];
    qblock_q3_k_scales(b, scales);
    const __m256i three = _mm256_set1_epi32(3), one = _mm256_set1_epi32(1);
    int is = 0, bit = 0;
    for (int n = 0; n < 2; n++) {
        for (int shift = 0; shift < 8; shift += 2) {
            for (int half = 0; half < 2; half++) {
                __m256 dl = _mm256_set1_ps(d_all * (float)(scales[is++] - 32));
                for (int p = 0; p < 2; p++) {
                    __m256i v = bytes8(q + 16 * half + 8 * p), h = bytes8(hm + 16 * half + 8 * p);
                    __m256i clear = _mm256_xor_si256(_mm256_and_si256(_mm256_srli_epi32(h, bit), one), one);
                    __m256i c = _mm256_sub_epi32(_mm256_and_si256(_mm256_srli_epi32(v, shift), three),
                                                 _mm256_slli_epi32(clear, 2));
                    _mm256_storeu_ps(y + 8 * p, _mm256_mul_ps(dl, _mm256_cvtepi32_ps(c)));
                }
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
    case 10: return dec_q2_k_avx2;
    case 11: return dec_q3_k_avx2;
    case 12: return dec_q4_k_avx2;
    case 13: return dec_q5_k_avx2;
    case 14: return dec_q6_k_avx2;
    default: return f->decode;
    }
}

/* one row over nt (a constant after inlining: the accumulators stay in
 * registers) positions */
ALWAYS_INLINE void qblock_rows(const qblock_fmt *f, block_decoder dec, const uint8_t *row, int C, const float *x,
                               size_t xs, int nt, float *y, size_t ys)
{
    float w[QBLOCK_MAX] __attribute__((aligned(32)));
    __m256 a0[4], a1[4];
    _Pragma("GCC unroll 4") for (int u = 0; u < 4; u++) a0[u] = a1[u] = _mm256_setzero_ps();
    for (int b = 0; b < C / f->block; b++) {
        dec(row + (size_t)b * f->bytes, w);
        int c0 = b * f->block;
        for (int k = 0; k < f->block; k += 16) {
            __m256 w0 = _mm256_load_ps(w + k), w1 = _mm256_load_ps(w + k + 8);
            _Pragma("GCC unroll 4") for (int u = 0; u < nt; u++) {
                const float *xu = x + (size_t)u * xs + c0 + k;
                a0[u] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(xu), a0[u]);
                a1[u] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(xu + 8), a1[u]);
            }
        }
    }
    _Pragma("GCC unroll 4") for (int u = 0; u < nt; u++) y[(size_t)u * ys] = tree2x256(a0[u], a1[u]);
}

/* The 32-value formats fused (as the AVX-512 file's qb32_*): a block's
 * values 0-7, 8-15, 16-23, 24-31 made in registers with the scalar
 * decode's float operations, then the dense order's two 8-lane halves. */
static const float iq4nl_table[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

ALWAYS_INLINE __m256 qb32_part(int type, __m256i c, __m256 d, __m256 m)
{
    if (type == 20) {
        /* the table's 16 entries in two halves, chosen by bit 3 */
        __m256 lo = _mm256_loadu_ps(iq4nl_table), hi = _mm256_loadu_ps(iq4nl_table + 8);
        __m256 v = _mm256_blendv_ps(_mm256_permutevar8x32_ps(lo, c), _mm256_permutevar8x32_ps(hi, c),
                                    _mm256_castsi256_ps(_mm256_slli_epi32(c, 28)));
        return _mm256_mul_ps(d, v);
    }
    if (type == 2 || type == 6) c = _mm256_sub_epi32(c, _mm256_set1_epi32(type == 2 ? 8 : 16));
    __m256 w = _mm256_mul_ps(_mm256_cvtepi32_ps(c), d);
    return type == 3 || type == 7 ? _mm256_add_ps(w, m) : w;
}

ALWAYS_INLINE void qb32_values(int type, const uint8_t *blk, __m256 *v)
{
    int has_m = type == 3 || type == 7, has_h = type == 6 || type == 7;
    const uint8_t *qs = blk + 2 + (has_m ? 2 : 0) + (has_h ? 4 : 0);
    uint16_t dh, mh = 0;
    memcpy(&dh, blk, 2);
    if (has_m) memcpy(&mh, blk + 2, 2);
    __m256 d = _mm256_set1_ps(f16_to_f32(dh)), m = _mm256_set1_ps(f16_to_f32(mh));
    const __m256i lo4 = _mm256_set1_epi32(15), lanes = _mm256_set_epi32(7, 6, 5, 4, 3, 2, 1, 0);
    uint32_t qh = 0;
    if (has_h) memcpy(&qh, blk + 2 + (has_m ? 2 : 0), 4);
    for (int k = 0; k < 4; k++) {
        /* values 8k .. 8k+7: bytes 8(k % 2) .. +7, low nibbles for k < 2, high for k >= 2 */
        __m256i b = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(qs + 8 * (k % 2))));
        __m256i c = k < 2 ? _mm256_and_si256(b, lo4) : _mm256_srli_epi32(b, 4);
        if (has_h) {
            __m256i sh = _mm256_add_epi32(lanes, _mm256_set1_epi32(8 * k));
            __m256i bit = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32((int)qh), sh), _mm256_set1_epi32(1));
            c = _mm256_or_si256(c, _mm256_slli_epi32(bit, 4));
        }
        v[k] = qb32_part(type, c, d, m);
    }
}

ALWAYS_INLINE void qb32_rows(int type, int bytes, const uint8_t *row, int C, const float *x, size_t xs, int nt,
                             float *y, size_t ys)
{
    __m256 a0[4], a1[4];
    _Pragma("GCC unroll 4") for (int u = 0; u < 4; u++) a0[u] = a1[u] = _mm256_setzero_ps();
    for (int b = 0; b < C / 32; b++) {
        __m256 v[4];
        qb32_values(type, row + (size_t)b * (size_t)bytes, v);
        _Pragma("GCC unroll 4") for (int u = 0; u < nt; u++) {
            const float *xu = x + (size_t)u * xs + (size_t)b * 32;
            a0[u] = _mm256_fmadd_ps(v[0], _mm256_loadu_ps(xu), a0[u]);
            a1[u] = _mm256_fmadd_ps(v[1], _mm256_loadu_ps(xu + 8), a1[u]);
            a0[u] = _mm256_fmadd_ps(v[2], _mm256_loadu_ps(xu + 16), a0[u]);
            a1[u] = _mm256_fmadd_ps(v[3], _mm256_loadu_ps(xu + 24), a1[u]);
        }
    }
    _Pragma("GCC unroll 4") for (int u = 0; u < nt; u++) y[(size_t)u * ys] = tree2x256(a0[u], a1[u]);
}

KERNEL_QB32_DRIVER(matmul_q4_0_avx2, 2, 18)
KERNEL_QB32_DRIVER(matmul_q4_1_avx2, 3, 20)
KERNEL_QB32_DRIVER(matmul_q5_0_avx2, 6, 22)
KERNEL_QB32_DRIVER(matmul_q5_1_avx2, 7, 24)
KERNEL_QB32_DRIVER(matmul_iq4_nl_avx2, 20, 18)

static void matmul_qblock_avx2(const qblock_fmt *f, const uint8_t *blocks, int C, const float *x, size_t xs, int T,
                               float *y, size_t ys, int r0, int r1)
{
    switch (f->ggml_type) {
    case 2: matmul_q4_0_avx2(blocks, C, x, xs, T, y, ys, r0, r1); return;
    case 3: matmul_q4_1_avx2(blocks, C, x, xs, T, y, ys, r0, r1); return;
    case 6: matmul_q5_0_avx2(blocks, C, x, xs, T, y, ys, r0, r1); return;
    case 7: matmul_q5_1_avx2(blocks, C, x, xs, T, y, ys, r0, r1); return;
    case 20: matmul_iq4_nl_avx2(blocks, C, x, xs, T, y, ys, r0, r1); return;
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

/* 8 nibble codes (bits 0-3 of each 32-bit lane; higher bits are ignored)
 * -> E2M1 values: magnitude from a table of 8 (vpermps reads only the low
 * three index bits), sign from bit 3; exact, and -0 for code 8 as in
 * e2m1_table */
ALWAYS_INLINE __m256 e2m1_8(__m256i codes, __m256 mag)
{
    __m256i sgn = _mm256_slli_epi32(_mm256_and_si256(codes, _mm256_set1_epi32(8)), 28);
    return _mm256_xor_ps(_mm256_permutevar8x32_ps(mag, codes), _mm256_castsi256_ps(sgn));
}

KERNEL_GG_TO_PACKED()

/* gg = 0: packed + scales rows; gg = 1: a row of ggml blocks in prow */
ALWAYS_INLINE void mxfp4_rows_any(const uint8_t *prow, const uint8_t *srow, int C, const float *xp,
                                  size_t xs, int nt, float *y, size_t ys, int gg)
{
    const __m256 mag = _mm256_loadu_ps(e2m1_table);
    __m256 a0[4], a1[4];
    _Pragma("GCC unroll 4") for (int u = 0; u < 4; u++) a0[u] = a1[u] = _mm256_setzero_ps();
    for (int b = 0; b < C / MXFP4_BLOCK; b++) {
        __m128i bytes = gg ? gg_to_packed(_mm_loadu_si128((const __m128i *)(prow + (size_t)b * GGML_MXFP4_BYTES + 1)))
                           : _mm_loadu_si128((const __m128i *)(prow + (size_t)b * 16));
        __m256i v0 = _mm256_cvtepu8_epi32(bytes);
        __m256i v1 = _mm256_cvtepu8_epi32(_mm_srli_si128(bytes, 8));
        __m256 we0 = e2m1_8(v0, mag), we1 = e2m1_8(v1, mag);
        __m256 wo0 = e2m1_8(_mm256_srli_epi32(v0, 4), mag), wo1 = e2m1_8(_mm256_srli_epi32(v1, 4), mag);
        __m256 sc = _mm256_set1_ps(e8m0_table[gg ? prow[(size_t)b * GGML_MXFP4_BYTES] : srow[b]]);
        _Pragma("GCC unroll 4") for (int u = 0; u < nt; u++) {
            const float *xe = xp + (size_t)u * xs + (size_t)b * MXFP4_BLOCK;
            __m256 p0 = _mm256_mul_ps(we0, _mm256_loadu_ps(xe));
            __m256 p1 = _mm256_mul_ps(we1, _mm256_loadu_ps(xe + 8));
            p0 = _mm256_fmadd_ps(wo0, _mm256_loadu_ps(xe + 16), p0);
            p1 = _mm256_fmadd_ps(wo1, _mm256_loadu_ps(xe + 24), p1);
            a0[u] = _mm256_fmadd_ps(p0, sc, a0[u]);
            a1[u] = _mm256_fmadd_ps(p1, sc, a1[u]);
        }
    }
    _Pragma("GCC unroll 4") for (int u = 0; u < nt; u++) y[(size_t)u * ys] = tree2x256(a0[u], a1[u]);
}

KERNEL_MXFP4_DRIVERS(matmul_mxfp4_avx2, matmul_mxfp4_gg_avx2, mxfp4_rows_any)


/* ---- MLA attention: mla_attend_ref's contract (kernels.h), bit for bit.
 *
 * Scores: lanes are heads.  A block of 32 positions is taken in chunks of
 * 64 columns: the chunk of each row converted to double once (rt, [column]
 * [position]), and per sub-block of eight heads their queries for the chunk
 * as doubles (qt, [column][head]).
 * Then four positions x two head vectors (or eight positions x one head
 * vector of four) are eight independent FMA chains: per column, two q
 * loads, four broadcasts and eight double FMAs, each lane one (head,
 * position) sum in j order; a last one to three heads take the positions
 * in the lanes instead (q broadcast, eight vectors of four positions), so
 * no lane idles.  A product of two floats is exact in double, so the FMA
 * rounds as the reference's product-then-add.  Sums run on from chunk to
 * chunk through `acc`; a block's rows serve every head of the call, so the
 * cache is read once per call, not once per head.
 * Softmax: the scores, stored [p][head], are one flat array for the exp:
 * df_exp's operations on four lanes (mul, then add, never fused) where every
 * lane is in its main branch, the scalar df_exp otherwise; then each head's
 * sum over p in order.
 * Context: lanes are j; per tile of positions (kept in L2) and block of four
 * heads, sixteen columns of ctx stay in registers while p runs in order:
 * multiply, then add (-ffp-contract=off keeps the intrinsics apart). */

/* df_exp (mathfn.c) on four lanes, the same double operations in the same
 * order; only for lanes in [-708, 708], where df_exp takes its main branch
 * and 2^k is normal.  The constants are mathfn.c's. */
ALWAYS_INLINE __m256d exp4_pd(__m256d x)
{
    const __m256d shift = _mm256_set1_pd(DF_EXP_SHIFT);
    __m256d n = _mm256_sub_pd(_mm256_add_pd(_mm256_mul_pd(x, _mm256_set1_pd(DF_EXP_INV_LN2)), shift), shift);
    __m256d r = _mm256_sub_pd(_mm256_sub_pd(x, _mm256_mul_pd(n, _mm256_set1_pd(DF_EXP_LN2_HI))),
                              _mm256_mul_pd(n, _mm256_set1_pd(DF_EXP_LN2_LO)));
    __m256d p = _mm256_set1_pd(DF_EXP_LEAD);
#define EXP_STEP(C) p = _mm256_add_pd(_mm256_mul_pd(p, r), _mm256_set1_pd(C))
    DF_EXP_STEPS(EXP_STEP);
#undef EXP_STEP
    __m256i k = _mm256_cvtepi32_epi64(_mm256_cvtpd_epi32(n)); /* n is an integer: exact */
    __m256i bits = _mm256_slli_epi64(_mm256_add_epi64(k, _mm256_set1_epi64x(1023)), 52);
    return _mm256_mul_pd(p, _mm256_castsi256_pd(bits));
}

/* df_exp on four lanes: exp4_pd when every lane is in its range, else the
 * scalar function lane by lane */
ALWAYS_INLINE __m256d exp4_any(__m256d x)
{
    __m256d ok = _mm256_and_pd(_mm256_cmp_pd(x, _mm256_set1_pd(-708.0), _CMP_GE_OQ),
                               _mm256_cmp_pd(x, _mm256_set1_pd(708.0), _CMP_LE_OQ));
    if (__builtin_expect(_mm256_movemask_pd(ok) == 15, 1)) return exp4_pd(x);
    double xs[4], es[4];
    _mm256_storeu_pd(xs, x);
    for (int l = 0; l < 4; l++) es[l] = df_exp(xs[l]);
    return _mm256_loadu_pd(es);
}

/* ---- elementwise kernels (kernels_elementwise.h) on four double lanes ---- */
typedef __m256d ew_d;
typedef __m128 ew_f;
#define EW_W 4
#define EW_FN(name) name##_avx2
#define ew_loadf(p) _mm_loadu_ps(p)
#define ew_storef(p, v) _mm_storeu_ps((p), (v))
#define ew_loadd(p) _mm256_loadu_pd(p)
#define ew_stored(p, v) _mm256_storeu_pd((p), (v))
#define ew_f2d(v) _mm256_cvtps_pd(v)
#define ew_d2f(v) _mm256_cvtpd_ps(v)
#define ew_setd(c) _mm256_set1_pd(c)
#define ew_setf(c) _mm_set1_ps(c)
#define ew_addd _mm256_add_pd
#define ew_subd _mm256_sub_pd
#define ew_muld _mm256_mul_pd
#define ew_divd _mm256_div_pd
#define ew_mulf _mm_mul_ps
#define ew_divf _mm_div_ps
#define ew_absd(v) _mm256_andnot_pd(_mm256_set1_pd(-0.0), (v))
#define ew_neg_if_neg(t, d) \
    _mm256_xor_pd((t), _mm256_and_pd(_mm256_set1_pd(-0.0), _mm256_cmp_pd((d), _mm256_setzero_pd(), _CMP_LT_OQ)))
#define ew_all_in(v, lo, hi)                                                                 \
    (_mm256_movemask_pd(_mm256_and_pd(_mm256_cmp_pd((v), _mm256_set1_pd(lo), _CMP_GE_OQ),    \
                                      _mm256_cmp_pd((v), _mm256_set1_pd(hi), _CMP_LE_OQ))) == 15)
#define ew_exp_main exp4_pd
#include "kernels_elementwise.h"

enum { MLA_PB = 32, MLA_JC = 64 }; /* positions per block, columns per chunk */

/* Score sums of block positions u0 .. u0+g-1 (g = 8 / nv) for the heads
 * h0 .. h0 + 4*nv - 1 (lanes = heads) over the chunk's jn columns, from acc
 * (first: from +0) back to acc, or (last chunk) finished: s = (float)sum *
 * scale into sc for the np live positions, and into mx.  nv is 1 or 2,
 * constant.  rt: the chunk, [jj][u] doubles; qt: [jj][8] doubles. */
ALWAYS_INLINE void mla_scores_heads(const double *rt, const double *qt, int jn, int nv, int u0, double *acc,
                                    int nhp, int h0, int first, int last, int np, float scale, float *sc, int nh,
                                    double *mx)
{
    const int g = 8 / nv;
    __m256d a[8][2];
    _Pragma("GCC unroll 8") for (int u = 0; u < g; u++) _Pragma("GCC unroll 2") for (int v = 0; v < nv; v++)
        a[u][v] = first ? _mm256_setzero_pd() : _mm256_load_pd(acc + (size_t)(u0 + u) * nhp + h0 + 4 * v);
    for (int jj = 0; jj < jn; jj++) {
        __m256d q0 = _mm256_load_pd(qt + jj * 8), q1 = _mm256_load_pd(qt + jj * 8 + 4);
        _Pragma("GCC unroll 8") for (int u = 0; u < g; u++) {
            __m256d x = _mm256_broadcast_sd(rt + jj * MLA_PB + u0 + u);
            a[u][0] = _mm256_fmadd_pd(q0, x, a[u][0]);
            if (nv == 2) a[u][1] = _mm256_fmadd_pd(q1, x, a[u][1]);
        }
    }
    if (!last) {
        _Pragma("GCC unroll 8") for (int u = 0; u < g; u++) _Pragma("GCC unroll 2") for (int v = 0; v < nv; v++)
            _mm256_store_pd(acc + (size_t)(u0 + u) * nhp + h0 + 4 * v, a[u][v]);
        return;
    }
    /* constant trip counts only, so that a[][] stays in registers */
    const __m128 vs = _mm_set1_ps(scale);
    _Pragma("GCC unroll 2") for (int v = 0; v < nv; v++) {
        __m256d mxd = _mm256_loadu_pd(mx + h0 + 4 * v);
        _Pragma("GCC unroll 8") for (int u = 0; u < g; u++) {
            if (u0 + u >= np) break;
            __m128 s = _mm_mul_ps(_mm256_cvtpd_ps(a[u][v]), vs);
            _mm_storeu_ps(sc + (size_t)(u0 + u) * nh + h0 + 4 * v, s);
            __m256d sd = _mm256_cvtps_pd(s);
            mxd = _mm256_blendv_pd(mxd, sd, _mm256_cmp_pd(sd, mxd, _CMP_GT_OQ)); /* if (s > mx) mx = s */
        }
        _mm256_storeu_pd(mx + h0 + 4 * v, mxd);
    }
}

/* The same for one head h (the last one to three heads, which would leave
 * head lanes idle): lanes are the block's positions, eight vectors of four;
 * q: that head's column of qt (stride 8). */
ALWAYS_INLINE void mla_scores_positions(const double *rt, const double *q, int jn, double *acc, int h, int first,
                                        int last, int np, float scale, float *sc, int nh, double *mx)
{
    __m256d a[8];
    _Pragma("GCC unroll 8") for (int k = 0; k < 8; k++)
        a[k] = first ? _mm256_setzero_pd() : _mm256_load_pd(acc + 4 * k);
    for (int jj = 0; jj < jn; jj++) {
        __m256d qv = _mm256_broadcast_sd(q + jj * 8);
        _Pragma("GCC unroll 8") for (int k = 0; k < 8; k++)
            a[k] = _mm256_fmadd_pd(qv, _mm256_load_pd(rt + jj * MLA_PB + 4 * k), a[k]);
    }
    if (!last) {
        _Pragma("GCC unroll 8") for (int k = 0; k < 8; k++) _mm256_store_pd(acc + 4 * k, a[k]);
        return;
    }
    float s[MLA_PB];
    const __m128 vs = _mm_set1_ps(scale);
    _Pragma("GCC unroll 8") for (int k = 0; k < 8; k++) _mm_storeu_ps(s + 4 * k, _mm_mul_ps(_mm256_cvtpd_ps(a[k]), vs));
    double m = mx[h];
    for (int u = 0; u < np; u++) {
        sc[(size_t)u * nh + h] = s[u];
        if (s[u] > m) m = s[u];
    }
    mx[h] = m;
}

/* columns j0 .. j0+jn-1 of rows p0 .. p0+np-1 as doubles, transposed:
 * rt[jj][u]; positions past np are zeros */
static void mla_rows_tile(const float *cache, size_t row_w, int p0, int np, int n, int j0, int jn, double *rt)
{
    if (np < MLA_PB) memset(rt, 0, (size_t)jn * MLA_PB * sizeof(double));
    int u = 0;
    for (; u + 4 <= np; u += 4) {
        const float *r0 = cache + (size_t)(p0 + u) * row_w + j0, *r1 = r0 + row_w, *r2 = r1 + row_w, *r3 = r2 + row_w;
        if (p0 + MLA_PB + u + 3 < n) /* the next block's chunk, into L2 meanwhile */
            for (int k = 0; k < jn; k += 16)
                for (int i = 0; i < 4; i++) _mm_prefetch((const char *)(r0 + (MLA_PB + i) * row_w + k), _MM_HINT_T1);
        int jj = 0;
        for (; jj + 4 <= jn; jj += 4) {
            __m256d x0 = _mm256_cvtps_pd(_mm_loadu_ps(r0 + jj)), x1 = _mm256_cvtps_pd(_mm_loadu_ps(r1 + jj));
            __m256d x2 = _mm256_cvtps_pd(_mm_loadu_ps(r2 + jj)), x3 = _mm256_cvtps_pd(_mm_loadu_ps(r3 + jj));
            __m256d t0 = _mm256_unpacklo_pd(x0, x1), t1 = _mm256_unpackhi_pd(x0, x1);
            __m256d t2 = _mm256_unpacklo_pd(x2, x3), t3 = _mm256_unpackhi_pd(x2, x3);
            double *d = rt + jj * MLA_PB + u;
            _mm256_store_pd(d, _mm256_permute2f128_pd(t0, t2, 0x20));
            _mm256_store_pd(d + MLA_PB, _mm256_permute2f128_pd(t1, t3, 0x20));
            _mm256_store_pd(d + 2 * MLA_PB, _mm256_permute2f128_pd(t0, t2, 0x31));
            _mm256_store_pd(d + 3 * MLA_PB, _mm256_permute2f128_pd(t1, t3, 0x31));
        }
        for (; jj < jn; jj++) {
            double *d = rt + jj * MLA_PB + u;
            d[0] = r0[jj], d[1] = r1[jj], d[2] = r2[jj], d[3] = r3[jj];
        }
    }
    for (; u < np; u++) {
        const float *r = cache + (size_t)(p0 + u) * row_w + j0;
        for (int jj = 0; jj < jn; jj++) rt[jj * MLA_PB + u] = r[jj];
    }
}

/* qt[jj][l] = head h0 + l's query at column j0 + jj as double (l < hl <=
 * 8); heads in fours are transposed four columns at a time */
static void mla_q_tile(const float *ql, size_t qls, const float *qr, size_t qrs, int Rkv, int h0, int hl, int j0,
                       int jn, double *qt)
{
    for (int part = 0; part < 2; part++) { /* the chunk's columns of ql, then of qr */
        int a = part ? (j0 > Rkv ? j0 : Rkv) : j0, b = part ? j0 + jn : (j0 + jn < Rkv ? j0 + jn : Rkv);
        if (a >= b) continue;
        const float *base = part ? qr + (a - Rkv) : ql + a;
        size_t hs = part ? qrs : qls;
        double *d0 = qt + (a - j0) * 8;
        int l = 0;
        for (; l + 4 <= hl; l += 4) {
            const float *q0 = base + (size_t)(h0 + l) * hs, *q1 = q0 + hs, *q2 = q1 + hs, *q3 = q2 + hs;
            int k = 0;
            for (; k + 4 <= b - a; k += 4) {
                __m256d x0 = _mm256_cvtps_pd(_mm_loadu_ps(q0 + k)), x1 = _mm256_cvtps_pd(_mm_loadu_ps(q1 + k));
                __m256d x2 = _mm256_cvtps_pd(_mm_loadu_ps(q2 + k)), x3 = _mm256_cvtps_pd(_mm_loadu_ps(q3 + k));
                __m256d t0 = _mm256_unpacklo_pd(x0, x1), t1 = _mm256_unpackhi_pd(x0, x1);
                __m256d t2 = _mm256_unpacklo_pd(x2, x3), t3 = _mm256_unpackhi_pd(x2, x3);
                double *d = d0 + k * 8 + l;
                _mm256_store_pd(d, _mm256_permute2f128_pd(t0, t2, 0x20));
                _mm256_store_pd(d + 8, _mm256_permute2f128_pd(t1, t3, 0x20));
                _mm256_store_pd(d + 16, _mm256_permute2f128_pd(t0, t2, 0x31));
                _mm256_store_pd(d + 24, _mm256_permute2f128_pd(t1, t3, 0x31));
            }
            for (; k < b - a; k++) {
                double *d = d0 + k * 8 + l;
                d[0] = q0[k], d[1] = q1[k], d[2] = q2[k], d[3] = q3[k];
            }
        }
        for (; l < hl; l++) {
            const float *q = base + (size_t)(h0 + l) * hs;
            for (int k = 0; k < b - a; k++) d0[k * 8 + l] = q[k];
        }
    }
}

/* ctx[h0 + u][j0 .. j0+15] (nu heads, the columns live in m0 / m1 when
 * `masked`) accumulated over positions p0 .. pe-1; first: start from +0;
 * pf: prefetch the same columns of the rows pn positions on */
ALWAYS_INLINE void mla_ctx16(const float *cache, size_t row_w, int Rkv, const float *sc, int nh, int h0, int nu,
                             int j0, int p0, int pe, int first, int masked, __m256i m0, __m256i m1, size_t pn,
                             float *ctx)
{
    __m256 a[4][2];
    _Pragma("GCC unroll 4") for (int u = 0; u < nu; u++) {
        float *c = ctx + (size_t)(h0 + u) * Rkv + j0;
        a[u][0] = first ? _mm256_setzero_ps() : masked ? _mm256_maskload_ps(c, m0) : _mm256_loadu_ps(c);
        a[u][1] = first ? _mm256_setzero_ps() : masked ? _mm256_maskload_ps(c + 8, m1) : _mm256_loadu_ps(c + 8);
    }
    const float *row = cache + (size_t)p0 * row_w + j0, *pp = sc + (size_t)p0 * nh + h0;
    for (int p = p0; p < pe; p++, row += row_w, pp += nh) {
        if (pn) _mm_prefetch((const char *)(row + pn * row_w), _MM_HINT_T1);
        __m256 r0 = masked ? _mm256_maskload_ps(row, m0) : _mm256_loadu_ps(row);
        __m256 r1 = masked ? _mm256_maskload_ps(row + 8, m1) : _mm256_loadu_ps(row + 8);
        _Pragma("GCC unroll 4") for (int u = 0; u < nu; u++) {
            __m256 b = _mm256_broadcast_ss(pp + u);
            a[u][0] = _mm256_add_ps(a[u][0], _mm256_mul_ps(b, r0));
            a[u][1] = _mm256_add_ps(a[u][1], _mm256_mul_ps(b, r1));
        }
    }
    _Pragma("GCC unroll 4") for (int u = 0; u < nu; u++) {
        float *c = ctx + (size_t)(h0 + u) * Rkv + j0;
        if (masked) {
            _mm256_maskstore_ps(c, m0, a[u][0]);
            _mm256_maskstore_ps(c + 8, m1, a[u][1]);
        } else {
            _mm256_storeu_ps(c, a[u][0]);
            _mm256_storeu_ps(c + 8, a[u][1]);
        }
    }
}

/* lanes < k of a mask (k may be <= 0 or > 8) */
ALWAYS_INLINE __m256i lanes_below(int k)
{
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(k), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

static void mla_attend_avx2(const float *cache, size_t row_w, int Rkv, int dr, int n, const float *ql, size_t qls,
                            const float *qr, size_t qrs, int nh, float scale, float *sc, float *ctx)
{
    CHECK(nh >= 1 && nh <= MLA_NH_MAX && n >= 1);
    double mx[MLA_NH_MAX];
    double rt[MLA_JC * MLA_PB] __attribute__((aligned(32)));
    double qt[MLA_JC * 8] __attribute__((aligned(32)));
    double acc[MLA_PB * MLA_NH_MAX] __attribute__((aligned(32))); /* [u][nhp], lanes = heads */
    double acct[3 * MLA_PB] __attribute__((aligned(32)));         /* [h][u], lanes = positions */
    int nhp = (nh + 3) & ~3, w = Rkv + dr;
    for (int h = 0; h < MLA_NH_MAX; h++) mx[h] = -INFINITY;

    /* scores: heads in vectors of eight, then of four; the last one to
     * three heads with positions in the lanes */
    for (int p0 = 0; p0 < n; p0 += MLA_PB) {
        int np = n - p0 < MLA_PB ? n - p0 : MLA_PB;
        float *scb = sc + (size_t)p0 * nh;
        for (int j0 = 0; j0 < w; j0 += MLA_JC) {
            int jn = w - j0 < MLA_JC ? w - j0 : MLA_JC, first = j0 == 0, last = j0 + jn == w;
            mla_rows_tile(cache, row_w, p0, np, n, j0, jn, rt);
            int h0 = 0;
            for (; h0 + 8 <= nh; h0 += 8) {
                mla_q_tile(ql, qls, qr, qrs, Rkv, h0, 8, j0, jn, qt);
                for (int u0 = 0; u0 < np; u0 += 4)
                    mla_scores_heads(rt, qt, jn, 2, u0, acc, nhp, h0, first, last, np, scale, scb, nh, mx);
            }
            if (nh - h0 >= 4) {
                mla_q_tile(ql, qls, qr, qrs, Rkv, h0, 4, j0, jn, qt);
                for (int u0 = 0; u0 < np; u0 += 8)
                    mla_scores_heads(rt, qt, jn, 1, u0, acc, nhp, h0, first, last, np, scale, scb, nh, mx);
                h0 += 4;
            }
            if (h0 < nh) {
                mla_q_tile(ql, qls, qr, qrs, Rkv, h0, nh - h0, j0, jn, qt);
                for (int h = h0; h < nh; h++)
                    mla_scores_positions(rt, qt + (h - h0), jn, acct + (size_t)(h - h0) * MLA_PB, h, first, last, np,
                                         scale, scb, nh, mx);
            }
        }
    }

    /* softmax weights: the exp over sc as one flat array (lane i is head
     * i mod nh; mxe repeats mx so that four lanes' maxima are one load),
     * then each head's sum over p in order */
    double mxe[MLA_NH_MAX + 4];
    for (int k = 0; k < nh + 4; k++) mxe[k] = mx[k % nh];
    size_t nall = (size_t)n * nh, i = 0;
    for (int h = 0; i + 4 <= nall; i += 4) {
        __m256d x = _mm256_sub_pd(_mm256_cvtps_pd(_mm_loadu_ps(sc + i)), _mm256_loadu_pd(mxe + h));
        _mm_storeu_ps(sc + i, _mm256_cvtpd_ps(exp4_any(x)));
        for (h += 4; h >= nh;) h -= nh;
    }
    for (; i < nall; i++) sc[i] = (float)df_exp((double)sc[i] - mx[i % nh]);
    mla_weights_normalise(sc, n, nh);

    /* context: tiles of positions that stay in L2 while every head block
     * and column block passes over them; the first head block fetches the
     * next tile */
    int pt = (int)((256u << 10) / (row_w * sizeof(float) + 1));
    if (pt < 16) pt = 16;
    int jf = Rkv / 16 * 16;
    __m256i m0 = lanes_below(Rkv - jf), m1 = lanes_below(Rkv - jf - 8);
    for (int p0 = 0; p0 < n; p0 += pt) {
        int pe = n - p0 < pt ? n : p0 + pt, first = p0 == 0;
        for (int h0 = 0; h0 < nh; h0 += 4) {
            int nu = nh - h0 < 4 ? nh - h0 : 4;
            size_t pn = h0 == 0 && pe + pt <= n ? (size_t)pt : 0;
#define CTX_CASES(J0, M)                                                                                       \
    switch (nu) {                                                                                              \
    case 4: mla_ctx16(cache, row_w, Rkv, sc, nh, h0, 4, J0, p0, pe, first, M, m0, m1, pn, ctx); break;         \
    case 3: mla_ctx16(cache, row_w, Rkv, sc, nh, h0, 3, J0, p0, pe, first, M, m0, m1, pn, ctx); break;         \
    case 2: mla_ctx16(cache, row_w, Rkv, sc, nh, h0, 2, J0, p0, pe, first, M, m0, m1, pn, ctx); break;         \
    default: mla_ctx16(cache, row_w, Rkv, sc, nh, h0, 1, J0, p0, pe, first, M, m0, m1, pn, ctx); break;        \
    }
            for (int j0 = 0; j0 < jf; j0 += 16) CTX_CASES(j0, 0)
            if (jf < Rkv) CTX_CASES(jf, 1)
#undef CTX_CASES
        }
    }
}

/* ---- the KDA delta rule's passes (kernels_kda.h) on 8 floats ---- */
#define KV __m256
#define KW 8
#define kv_load _mm256_loadu_ps
#define kv_store _mm256_storeu_ps
#define kv_set1 _mm256_set1_ps
#define kv_mul _mm256_mul_ps
#define kv_add _mm256_add_ps
#define KDA_FN(name) name##_avx2
#include "kernels_kda.h"

static const kernel_table avx2_table = {
    .name = "avx2",
    .matmul_f32 = matmul_f32_avx2,
    .matmul_bf16 = matmul_bf16_avx2,
    .matmul_mxfp4 = matmul_mxfp4_avx2,
    .matmul_mxfp4_gg = matmul_mxfp4_gg_avx2,
    .matmul_f16 = matmul_f16_avx2,
    .matmul_q8_0 = matmul_q8_0_avx2,
    .matmul_qblock = matmul_qblock_avx2,
    .mla_attend = mla_attend_avx2,
    .exp_n = exp_n_avx2,
    .sigmoid_n = sigmoid_n_avx2,
    .silu_n = silu_n_avx2,
    .situ_n = situ_n_avx2,
    .kda_decay_pred = kda_decay_pred_avx2,
    .kda_update_out = kda_update_out_avx2,
};

const kernel_table *kernels_avx2(void) { return &avx2_table; }

#else
const kernel_table *kernels_avx2(void) { return 0; }
#endif
