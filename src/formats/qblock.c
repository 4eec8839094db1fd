/* qblock.c - see qblock.h.  Each decoder follows ggml's dequantization of
 * its format operation for operation (an integer code converted to float,
 * then the float products and differences in the order ggml writes them),
 * so that the values are the library's to the bit; compiled, like all of
 * src/, without floating-point contraction. */
#include "qblock.h"
#include "quant.h"

#include <math.h>
#include <string.h>

static float half_at(const uint8_t *p)
{
    uint16_t h;
    memcpy(&h, p, 2);
    return f16_to_f32(h);
}

/* Q8_0: d, 32 int8 */
static void dec_q8_0(const uint8_t *b, float *y)
{
    float d = half_at(b);
    for (int j = 0; j < 32; j++) y[j] = (float)(int8_t)b[2 + j] * d;
}

/* Q4_0: d, 16 bytes of two 4-bit codes (value j low, j + 16 high), minus 8 */
static void dec_q4_0(const uint8_t *b, float *y)
{
    float d = half_at(b);
    const uint8_t *qs = b + 2;
    for (int j = 0; j < 16; j++) {
        y[j] = (float)((qs[j] & 0x0F) - 8) * d;
        y[j + 16] = (float)((qs[j] >> 4) - 8) * d;
    }
}

/* Q4_1: d, m, 16 bytes of codes: code * d + m */
static void dec_q4_1(const uint8_t *b, float *y)
{
    float d = half_at(b), m = half_at(b + 2);
    const uint8_t *qs = b + 4;
    for (int j = 0; j < 16; j++) {
        y[j] = (float)(qs[j] & 0x0F) * d + m;
        y[j + 16] = (float)(qs[j] >> 4) * d + m;
    }
}

/* the fifth bits of Q5_0 / Q5_1: bit j of qh for value j, bit j + 16 for j + 16 */
static uint32_t qh_at(const uint8_t *p)
{
    uint32_t qh;
    memcpy(&qh, p, 4);
    return qh;
}

/* Q5_0: d, 4 bytes of fifth bits, 16 bytes of low nibbles, minus 16 */
static void dec_q5_0(const uint8_t *b, float *y)
{
    float d = half_at(b);
    uint32_t qh = qh_at(b + 2);
    const uint8_t *qs = b + 6;
    for (int j = 0; j < 16; j++) {
        int x0 = ((qs[j] & 0x0F) | (int)(((qh >> j) << 4) & 0x10)) - 16;
        int x1 = ((qs[j] >> 4) | (int)((qh >> (j + 12)) & 0x10)) - 16;
        y[j] = (float)x0 * d;
        y[j + 16] = (float)x1 * d;
    }
}

/* Q5_1: d, m, fifth bits, low nibbles: code * d + m */
static void dec_q5_1(const uint8_t *b, float *y)
{
    float d = half_at(b), m = half_at(b + 2);
    uint32_t qh = qh_at(b + 4);
    const uint8_t *qs = b + 8;
    for (int j = 0; j < 16; j++) {
        int x0 = (qs[j] & 0x0F) | (int)(((qh >> j) << 4) & 0x10);
        int x1 = (qs[j] >> 4) | (int)((qh >> (j + 12)) & 0x10);
        y[j] = (float)x0 * d + m;
        y[j + 16] = (float)x1 * d + m;
    }
}

/* IQ4_NL: d, 16 bytes of two 4-bit indices into a fixed non-linear table */
static const int8_t iq4nl_values[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
static void dec_iq4_nl(const uint8_t *b, float *y)
{
    float d = half_at(b);
    const uint8_t *qs = b + 2;
    for (int j = 0; j < 16; j++) {
        y[j] = d * (float)iq4nl_values[qs[j] & 0x0F];
        y[j + 16] = d * (float)iq4nl_values[qs[j] >> 4];
    }
}

/* Q2_K (256): 16 bytes of 4-bit scale | 4-bit min per 16 values, 64 bytes
 * of 2-bit codes, d, dmin.  Per 128 values, four shifts of 32 code bytes,
 * each split in two 16-value groups with their own scale and min. */
static void dec_q2_k(const uint8_t *b, float *y)
{
    const uint8_t *sc = b, *q = b + 16;
    float d = half_at(b + 80), min = half_at(b + 82);
    int is = 0;
    for (int n = 0; n < 256; n += 128) {
        for (int shift = 0; shift < 8; shift += 2) {
            for (int half = 0; half < 2; half++) {
                uint8_t s = sc[is++];
                float dl = d * (float)(s & 0xF), ml = min * (float)(s >> 4);
                for (int l = 0; l < 16; l++) *y++ = dl * (float)((q[l + 16 * half] >> shift) & 3) - ml;
            }
        }
        q += 32;
    }
}

void qblock_q3_k_scales(const uint8_t *b, int8_t scales[16])
{
    uint32_t aux[4];
    memcpy(aux, b + 96, 12);
    uint32_t tmp = aux[2];
    const uint32_t k1 = 0x03030303u, k2 = 0x0f0f0f0fu;
    aux[2] = ((aux[0] >> 4) & k2) | (((tmp >> 4) & k1) << 4);
    aux[3] = ((aux[1] >> 4) & k2) | (((tmp >> 6) & k1) << 4);
    aux[0] = (aux[0] & k2) | (((tmp >> 0) & k1) << 4);
    aux[1] = (aux[1] & k2) | (((tmp >> 2) & k1) << 4);
    memcpy(scales, aux, 16);
}

/* Q3_K (256): 32 bytes of high bits (set: no offset, clear: minus 4), 64
 * bytes of 2-bit codes, 12 bytes of sixteen 6-bit scales (minus 32), d. */
static void dec_q3_k(const uint8_t *b, float *y)
{
    const uint8_t *hm = b, *q = b + 32;
    float d_all = half_at(b + 108);
    int8_t scales[16];
    qblock_q3_k_scales(b, scales);
    int is = 0;
    uint8_t m = 1;
    for (int n = 0; n < 256; n += 128) {
        for (int shift = 0; shift < 8; shift += 2) {
            for (int half = 0; half < 2; half++) {
                float dl = d_all * (float)(scales[is++] - 32);
                for (int l = 0; l < 16; l++) {
                    int v = ((q[l + 16 * half] >> shift) & 3) - ((hm[l + 16 * half] & m) ? 0 : 4);
                    *y++ = dl * (float)v;
                }
            }
            m = (uint8_t)(m << 1);
        }
        q += 32;
    }
}

void qblock_k4_scale_min(int j, const uint8_t *q, uint8_t *d, uint8_t *m)
{
    if (j < 4) {
        *d = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *d = (uint8_t)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        *m = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

/* Q4_K (256): d, dmin, 12 bytes of scales and mins, 128 bytes of nibbles;
 * per 64 values, 32 bytes: low nibbles with one scale/min, high with the next */
static void dec_q4_k(const uint8_t *b, float *y)
{
    float d = half_at(b), min = half_at(b + 2);
    const uint8_t *scales = b + 4, *q = b + 16;
    int is = 0;
    for (int j = 0; j < 256; j += 64) {
        uint8_t sc, m;
        qblock_k4_scale_min(is, scales, &sc, &m);
        float d1 = d * (float)sc, m1 = min * (float)m;
        qblock_k4_scale_min(is + 1, scales, &sc, &m);
        float d2 = d * (float)sc, m2 = min * (float)m;
        for (int l = 0; l < 32; l++) *y++ = d1 * (float)(q[l] & 0xF) - m1;
        for (int l = 0; l < 32; l++) *y++ = d2 * (float)(q[l] >> 4) - m2;
        q += 32;
        is += 2;
    }
}

/* Q5_K (256): Q4_K's layout with 32 bytes of fifth bits (two bits per 64 values) */
static void dec_q5_k(const uint8_t *b, float *y)
{
    float d = half_at(b), min = half_at(b + 2);
    const uint8_t *scales = b + 4, *qh = b + 16, *ql = b + 48;
    int is = 0;
    uint8_t u1 = 1, u2 = 2;
    for (int j = 0; j < 256; j += 64) {
        uint8_t sc, m;
        qblock_k4_scale_min(is, scales, &sc, &m);
        float d1 = d * (float)sc, m1 = min * (float)m;
        qblock_k4_scale_min(is + 1, scales, &sc, &m);
        float d2 = d * (float)sc, m2 = min * (float)m;
        for (int l = 0; l < 32; l++) *y++ = d1 * (float)((ql[l] & 0xF) + (qh[l] & u1 ? 16 : 0)) - m1;
        for (int l = 0; l < 32; l++) *y++ = d2 * (float)((ql[l] >> 4) + (qh[l] & u2 ? 16 : 0)) - m2;
        ql += 32;
        is += 2;
        u1 = (uint8_t)(u1 << 2);
        u2 = (uint8_t)(u2 << 2);
    }
}

/* Q6_K (256): 128 bytes of low nibbles, 64 of 2-bit highs, sixteen int8
 * scales, d; value = (d * scale) * (code - 32) */
static void dec_q6_k(const uint8_t *b, float *y)
{
    const uint8_t *ql = b, *qh = b + 128;
    const int8_t *sc = (const int8_t *)(b + 192);
    float d = half_at(b + 208);
    for (int n = 0; n < 256; n += 128) {
        for (int l = 0; l < 32; l++) {
            int is = l / 16;
            int q1 = (int8_t)((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
            int q2 = (int8_t)((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
            int q3 = (int8_t)((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
            int q4 = (int8_t)((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
            y[l] = d * (float)sc[is] * (float)q1;
            y[l + 32] = d * (float)sc[is + 2] * (float)q2;
            y[l + 64] = d * (float)sc[is + 4] * (float)q3;
            y[l + 96] = d * (float)sc[is + 6] * (float)q4;
        }
        y += 128;
        ql += 64;
        qh += 32;
        sc += 8;
    }
}

void q8_0_quantize_block(const float *x, uint8_t *out)
{
    float amax = 0.0f;
    for (int j = 0; j < 32; j++) amax = fabsf(x[j]) > amax ? fabsf(x[j]) : amax;
    float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    uint16_t dh = f32_to_f16(d);
    memcpy(out, &dh, 2);
    for (int j = 0; j < 32; j++) out[2 + j] = (uint8_t)(int8_t)roundf(x[j] * id);
}

static const qblock_fmt fmts[] = {
    {"Q8_0", 8, 32, 34, dec_q8_0},     {"Q4_0", 2, 32, 18, dec_q4_0},     {"Q4_1", 3, 32, 20, dec_q4_1},
    {"Q5_0", 6, 32, 22, dec_q5_0},     {"Q5_1", 7, 32, 24, dec_q5_1},     {"IQ4_NL", 20, 32, 18, dec_iq4_nl},
    {"Q2_K", 10, 256, 84, dec_q2_k},   {"Q3_K", 11, 256, 110, dec_q3_k},  {"Q4_K", 12, 256, 144, dec_q4_k},
    {"Q5_K", 13, 256, 176, dec_q5_k},  {"Q6_K", 14, 256, 210, dec_q6_k},
};

const qblock_fmt *qblock_fmt_of_ggml(uint32_t ggml_type)
{
    for (size_t i = 0; i < sizeof fmts / sizeof fmts[0]; i++)
        if (fmts[i].ggml_type == ggml_type) return &fmts[i];
    return NULL;
}

const char *qblock_names(void) { return "Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K"; }
