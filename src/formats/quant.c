/* quant.c - format tables and the activation reorder for MXFP4 (see quant.h). */
#include "quant.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif
#include <math.h>

const float e2m1_table[16] = {
    0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f,
    -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f,
};

float e8m0_table[256];

void quant_init(void)
{
    for (int s = 0; s < 255; s++) e8m0_table[s] = ldexpf(1.0f, s - 127);
    e8m0_table[255] = NAN;
}

void mxfp4_from_ggml(const uint8_t *blocks, int rows, int cols, uint8_t *packed, uint8_t *scales)
{
    size_t nb = (size_t)rows * (size_t)(cols / MXFP4_BLOCK), b = 0;
#if defined(__SSE2__)
    /* the same permutation, 16-bit lanes w = q[2m] | q[2m+1] << 8:
     * o[m] = (w & 0xF) | (w >> 4 & 0xF0), o[m+8] = (w >> 4 & 0xF) | (w >> 8 & 0xF0) */
    const __m128i m0f = _mm_set1_epi16(0x000F), mf0 = _mm_set1_epi16(0x00F0);
    for (; b < nb; b++) {
        __m128i w = _mm_loadu_si128((const __m128i *)(const void *)(blocks + b * GGML_MXFP4_BYTES + 1));
        __m128i w4 = _mm_srli_epi16(w, 4), w8 = _mm_srli_epi16(w, 8);
        __m128i lo = _mm_or_si128(_mm_and_si128(w, m0f), _mm_and_si128(w4, mf0));
        __m128i hi = _mm_or_si128(_mm_and_si128(w4, m0f), _mm_and_si128(w8, mf0));
        _mm_storeu_si128((__m128i *)(void *)(packed + b * 16), _mm_packus_epi16(lo, hi));
        scales[b] = blocks[b * GGML_MXFP4_BYTES];
    }
#endif
    for (; b < nb; b++) {
        const uint8_t *q = blocks + b * GGML_MXFP4_BYTES + 1;
        uint8_t *o = packed + b * 16;
        scales[b] = blocks[b * GGML_MXFP4_BYTES];
        /* output byte m holds values 2m (low) and 2m+1 (high): for m < 8 both
         * are low nibbles of q[2m], q[2m+1]; for m >= 8 high nibbles of
         * q[2m-16], q[2m-15] */
        for (int m = 0; m < 8; m++) {
            o[m] = (uint8_t)((q[2 * m] & 15) | (q[2 * m + 1] & 15) << 4);
            o[m + 8] = (uint8_t)((q[2 * m] >> 4) | (q[2 * m + 1] & 0xF0));
        }
    }
}

void mxfp4_prep_x(const float *x, int C, float *xp)
{
    for (int b = 0; b < C; b += MXFP4_BLOCK)
        for (int j = 0; j < 16; j++) {
            xp[b + j] = x[b + 2 * j];
            xp[b + 16 + j] = x[b + 2 * j + 1];
        }
}
