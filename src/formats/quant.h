/* quant.h - number formats of the weights: BF16, F32 and MXFP4 (E2M1 + E8M0).
 *
 * (Also F16, for the small vectors a GGUF may store that way.)
 * This file is the specification of the formats; kernels must decode exactly
 * as these functions do.  MXFP4 layout (compressed-tensors
 * mxfp4-pack-quantized): a logical [R, C] matrix is `packed` U8 [R, C/2]
 * (byte j of a row holds column 2j in its low nibble and 2j+1 in its high
 * nibble) plus `scales` U8 [R, C/32] (E8M0: 2^(s-127) for 32 consecutive
 * columns).  All decodes are exact in fp32; E8M0 0 is 2^-127 (subnormal, as
 * OCP says) and 255 is NaN.
 */
#ifndef DF_QUANT_H
#define DF_QUANT_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#define MXFP4_BLOCK 32

extern const float e2m1_table[16];
extern float e8m0_table[256];   /* filled by quant_init() */

void quant_init(void);

static inline float bf16_to_f32(uint16_t b)
{
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Load a possibly unaligned BF16 / F32 element (weights live at arbitrary
 * byte offsets inside mapped shards). */
static inline float load_bf16(const void *base, size_t i)
{
    uint16_t b;
    memcpy(&b, (const uint8_t *)base + 2 * i, 2);
    return bf16_to_f32(b);
}

/* IEEE half to f32, exactly as the F16C instruction (VCVTPH2PS) converts:
 * every finite value exact, infinities kept, a NaN's payload shifted into
 * place with the quiet bit set. */
static inline float f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 31, m = h & 1023, u;
    if (e == 31) {
        u = sign | 0x7f800000u | (m << 13) | (m ? 0x400000u : 0);
    } else if (e == 0) {
        float v = ldexpf((float)m, -24); /* zero or subnormal: exact */
        memcpy(&u, &v, 4);
        u |= sign;
    } else {
        u = sign | ((e + 112) << 23) | (m << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* f32 to IEEE half, rounding to nearest even (VCVTPS2PH with rounding mode
 * 0, and ggml's software conversion); NaN stays NaN, overflow is infinity */
static inline uint16_t f32_to_f16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t sign = (u >> 16) & 0x8000, e = (u >> 23) & 255, m = u & 0x7fffff;
    if (e == 255) return (uint16_t)(sign | 0x7c00 | (m ? 0x200 | (m >> 13) : 0));
    int ee = (int)e - 127 + 15;
    if (ee >= 31) return (uint16_t)(sign | 0x7c00);
    if (ee <= 0) {
        if (ee < -10) return (uint16_t)sign;
        m |= 0x800000;
        int shift = 14 - ee;
        uint32_t h = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (h & 1))) h++;
        return (uint16_t)(sign | h);
    }
    uint32_t h = ((uint32_t)ee << 10) | (m >> 13), rem = m & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) h++;
    return (uint16_t)(sign | h);
}

/* IEEE half (GGUF's F16 tensors): exact in f32 */
static inline float load_f16(const void *base, size_t i)
{
    uint16_t h;
    memcpy(&h, (const uint8_t *)base + 2 * i, 2);
    return f16_to_f32(h);
}

/* ggml's Q8_0 (GGUF): per 32 values an F16 scale d, then 32 int8 q; the
 * value is (float)q * d, as ggml's dequantize_row_q8_0 computes it (an
 * exact product: d has 11 significant bits, q at most 8). */
#define Q8_0_BLOCK 32
#define Q8_0_BYTES 34
static inline float load_q8_0(const void *row, size_t c)
{
    const uint8_t *b = (const uint8_t *)row + c / Q8_0_BLOCK * Q8_0_BYTES;
    uint16_t d;
    memcpy(&d, b, 2);
    return (float)(int8_t)b[2 + c % Q8_0_BLOCK] * f16_to_f32(d);
}

static inline float load_f32(const void *base, size_t i)
{
    float f;
    memcpy(&f, (const uint8_t *)base + 4 * i, 4);
    return f;
}

static inline float mxfp4_value(const uint8_t *packed_row, const uint8_t *scale_row, size_t c)
{
    uint8_t byte = packed_row[c / 2];
    uint8_t code = (c & 1) ? (byte >> 4) : (byte & 15);
    return e2m1_table[code] * e8m0_table[scale_row[c / MXFP4_BLOCK]];
}

/* Reorder an activation vector for the MXFP4 kernels: for every block of 32,
 * the 16 even columns first, then the 16 odd ones (the order in which one
 * 16-byte group of packed weights yields its low and high nibbles).
 * C must be a multiple of 32.  xp must not alias x. */
void mxfp4_prep_x(const float *x, int C, float *xp);

/* ggml's MXFP4 (block_mxfp4, used by GGUF files): per 32 values, the E8M0
 * scale byte, then 16 bytes where byte j holds value j in its low nibble
 * and value j + 16 in its high nibble.  Repacks a [rows, cols] matrix of
 * such blocks into the layout above: an exact byte permutation (same codes,
 * same scales).  cols must be a multiple of 32. */
#define GGML_MXFP4_BYTES 17
void mxfp4_from_ggml(const uint8_t *blocks, int rows, int cols, uint8_t *packed, uint8_t *scales);

#endif
