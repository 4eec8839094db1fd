/* kernels_avx2.c - AVX2 + FMA versions of the kernels in kernels_ref.c, which
 * they must match bit for bit.  The 16 lanes of the contract in kernels.h
 * live in two __m256 registers (lanes 0-7 and 8-15); their sum is the first
 * step of the lane tree.  Tails are handled with zero-filled copies of the
 * last partial chunk, the same fma(0, 0, acc) as the reference.  Up to four
 * positions share one pass over a weight row.  Compiled with -mavx2 -mfma.
 */
#include "kernels.h"
#include "kernels_drivers.h"
#include "quant.h"

#if defined(__x86_64__) && defined(DF_HAVE_AVX2)
#include <immintrin.h>
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

static const kernel_table avx2_table = {
    .name = "avx2",
    .matmul_f32 = matmul_f32_avx2,
    .matmul_bf16 = matmul_bf16_avx2,
    .matmul_mxfp4 = matmul_mxfp4_avx2,
    .matmul_mxfp4_gg = matmul_mxfp4_gg_avx2,
};

const kernel_table *kernels_avx2(void) { return &avx2_table; }

#else
const kernel_table *kernels_avx2(void) { return 0; }
#endif
