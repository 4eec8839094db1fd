/* kernels_neon.c - AArch64 Advanced SIMD (NEON) versions of the kernels in
 * kernels_ref.c, which they must match bit for bit (tests/test_kernels.c,
 * run under qemu-aarch64 by `make check`).  The 16 lanes of the contract in
 * kernels.h live in four float32x4_t registers (lanes 0-3, 4-7, 8-11,
 * 12-15); tree4x4 is the lane tree.  AArch64 has 32 vector registers, so
 * up to four positions share one pass over a weight row with all sixteen
 * accumulators in registers.  FMLA is the correctly rounded fused
 * multiply-add (fmaf); everything else is a separate rounding, and
 * -ffp-contract=off keeps the compiler from fusing a vmulq with a vaddq.
 *
 * Weights are read as bytes (vld1q_u8) and reinterpreted, so rows need no
 * alignment.  Block formats: Q8_0, MXFP4 (both layouts) and the 32-value
 * formats decode in registers; the K-quants decode a block with qblock.c's
 * scalar decoder into a buffer (exact by definition), then the dense order.
 *
 * NEON is part of every AArch64 CPU; kernels_cpu_has still asks the kernel
 * (getauxval(AT_HWCAP) & HWCAP_ASIMD) on Linux.  Off AArch64 this file
 * defines only kernels_neon(), which returns NULL.
 */
#include "kernels.h"
#include "kernels_drivers.h"
#include "mathfn.h"
#include "quant.h"
#include "util.h"

#if defined(__aarch64__) && defined(DF_HAVE_NEON)
#include <arm_neon.h>
#include <math.h>
#include <string.h>

#define ALWAYS_INLINE static inline __attribute__((always_inline))

/* lane_tree16() with lanes 0-3 in a0, 4-7 in a1, 8-11 in a2, 12-15 in a3 */
ALWAYS_INLINE float tree4x4(float32x4_t a0, float32x4_t a1, float32x4_t a2, float32x4_t a3)
{
    float32x4_t s = vaddq_f32(vaddq_f32(a0, a2), vaddq_f32(a1, a3)); /* s[i] = a[i] + a[i+8]; s[i] += s[i+4] */
    float32x2_t t = vadd_f32(vget_low_f32(s), vget_high_f32(s));    /* s[i] += s[i+2] */
    return vget_lane_f32(t, 0) + vget_lane_f32(t, 1);
}

ALWAYS_INLINE float32x4_t f32_of_u32(uint32x4_t v) { return vreinterpretq_f32_u32(v); }

/* 16 weights of each dense type -> four vectors of f32, exactly */
ALWAYS_INLINE void ld16_f32(const uint8_t *p, float32x4_t w[4])
{
    for (int k = 0; k < 4; k++) w[k] = vreinterpretq_f32_u8(vld1q_u8(p + 16 * k));
}

ALWAYS_INLINE void ld16_bf16(const uint8_t *p, float32x4_t w[4])
{
    for (int k = 0; k < 2; k++) {
        uint16x8_t h = vreinterpretq_u16_u8(vld1q_u8(p + 16 * k));
        w[2 * k] = f32_of_u32(vshll_n_u16(vget_low_u16(h), 16));
        w[2 * k + 1] = f32_of_u32(vshll_high_n_u16(h, 16));
    }
}

/* IEEE half -> f32 (FCVTL): exact, NaNs quieted with their payload kept, as
 * f16_to_f32 and F16C's VCVTPH2PS */
ALWAYS_INLINE void ld16_f16(const uint8_t *p, float32x4_t w[4])
{
    for (int k = 0; k < 2; k++) {
        float16x8_t h = vreinterpretq_f16_u8(vld1q_u8(p + 16 * k));
        w[2 * k] = vcvt_f32_f16(vget_low_f16(h));
        w[2 * k + 1] = vcvt_high_f32_f16(h);
    }
}

/* a[u][k] += w[k] * x[u][16c + 4k ..] for the nt positions (fused, lane by lane) */
ALWAYS_INLINE void fma16(float32x4_t a[4][4], const float32x4_t w[4], const float *x, size_t xs, int nt)
{
    _Pragma("GCC unroll 4") for (int u = 0; u < nt; u++) {
        const float *xu = x + (size_t)u * xs;
        _Pragma("GCC unroll 4") for (int k = 0; k < 4; k++) a[u][k] = vfmaq_f32(a[u][k], w[k], vld1q_f32(xu + 4 * k));
    }
}

ALWAYS_INLINE void zero16(float32x4_t a[4][4])
{
    _Pragma("GCC unroll 4") for (int u = 0; u < 4; u++)
        _Pragma("GCC unroll 4") for (int k = 0; k < 4; k++) a[u][k] = vdupq_n_f32(0.0f);
}

ALWAYS_INLINE void store16(float32x4_t a[4][4], int nt, float *y, size_t ys)
{
    _Pragma("GCC unroll 4") for (int u = 0; u < nt; u++) y[(size_t)u * ys] = tree4x4(a[u][0], a[u][1], a[u][2], a[u][3]);
}

/* One row over nt (constant after inlining) positions; a last partial chunk
 * of columns runs on zero-filled copies: fma(0, 0, acc), as the reference. */
#define DENSE_ROW(NAME, LOAD16, ESIZE)                                                             \
    ALWAYS_INLINE void NAME##_rows(const uint8_t *row, int C, const float *x, size_t xs, int nt,   \
                                   float *y, size_t ys)                                          \
    {                                                                                              \
        float32x4_t a[4][4], w[4];                                                                 \
        zero16(a);                                                                                 \
        int c = 0;                                                                                 \
        for (; c + 16 <= C; c += 16) {                                                             \
            LOAD16(row + (size_t)c * ESIZE, w);                                                    \
            fma16(a, w, x + c, xs, nt);                                                            \
        }                                                                                          \
        if (c < C) {                                                                               \
            uint8_t wt[16 * ESIZE];                                                                \
            float xt[4 * 16];                                                                      \
            memset(wt, 0, sizeof wt);                                                              \
            memset(xt, 0, sizeof xt);                                                              \
            memcpy(wt, row + (size_t)c * ESIZE, (size_t)(C - c) * ESIZE);                          \
            for (int u = 0; u < nt; u++) memcpy(xt + 16 * u, x + (size_t)u * xs + c, (size_t)(C - c) * 4); \
            LOAD16(wt, w);                                                                         \
            fma16(a, w, xt, 16, nt);                                                               \
        }                                                                                          \
        store16(a, nt, y, ys);                                                                     \
    }                                                                                              \
    KERNEL_DENSE_DRIVER(NAME, ESIZE)

DENSE_ROW(matmul_f32_neon, ld16_f32, 4)
DENSE_ROW(matmul_bf16_neon, ld16_bf16, 2)
DENSE_ROW(matmul_f16_neon, ld16_f16, 2)

/* ---- block formats ---- */

static float half_le(const uint8_t *p)
{
    uint16_t h;
    memcpy(&h, p, 2);
    return f16_to_f32(h);
}

/* 16 signed bytes -> four vectors of f32 (exact) */
ALWAYS_INLINE void s8x16_f32(int8x16_t v, float32x4_t w[4])
{
    int16x8_t lo = vmovl_s8(vget_low_s8(v)), hi = vmovl_high_s8(v);
    w[0] = vcvtq_f32_s32(vmovl_s16(vget_low_s16(lo)));
    w[1] = vcvtq_f32_s32(vmovl_high_s16(lo));
    w[2] = vcvtq_f32_s32(vmovl_s16(vget_low_s16(hi)));
    w[3] = vcvtq_f32_s32(vmovl_high_s16(hi));
}

/* Q8_0: per block, 16 int8 -> f32 times the scale (an exact product), the
 * dense order's lanes over columns 32b + 0..15, then 32b + 16..31 */
ALWAYS_INLINE void q8_0_rows(const uint8_t *row, const uint8_t *unused, int C, const float *x, size_t xs, int nt,
                             float *y, size_t ys)
{
    (void)unused;
    float32x4_t a[4][4], w[4];
    zero16(a);
    for (int b = 0; b < C / Q8_0_BLOCK; b++) {
        const uint8_t *blk = row + (size_t)b * Q8_0_BYTES;
        float32x4_t d = vdupq_n_f32(half_le(blk));
        for (int half = 0; half < 2; half++) {
            s8x16_f32(vreinterpretq_s8_u8(vld1q_u8(blk + 2 + 16 * half)), w);
            _Pragma("GCC unroll 4") for (int k = 0; k < 4; k++) w[k] = vmulq_f32(w[k], d);
            fma16(a, w, x + (size_t)b * Q8_0_BLOCK + 16 * half, xs, nt);
        }
    }
    store16(a, nt, y, ys);
}
KERNEL_TILED_DRIVER(matmul_q8_0_neon, q8_0_rows, (size_t)C / Q8_0_BLOCK * Q8_0_BYTES)

/* The 32-value formats (Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL) made in registers
 * with the scalar decode's float operations: codes 0-31 of a block as two
 * byte vectors (values 0-15, 16-31), widened to f32 four at a time. */
static const float iq4nl_values[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

ALWAYS_INLINE void u8x16_f32(uint8x16_t v, float32x4_t w[4])
{
    uint16x8_t lo = vmovl_u8(vget_low_u8(v)), hi = vmovl_high_u8(v);
    w[0] = vcvtq_f32_u32(vmovl_u16(vget_low_u16(lo)));
    w[1] = vcvtq_f32_u32(vmovl_high_u16(lo));
    w[2] = vcvtq_f32_u32(vmovl_u16(vget_low_u16(hi)));
    w[3] = vcvtq_f32_u32(vmovl_high_u16(hi));
}

/* bit i of the 32-bit qh as 16 at byte i (i in 16*part .. 16*part + 15) */
ALWAYS_INLINE uint8x16_t qh_bits16(uint32_t qh, int part)
{
    static const uint8_t bitsel[16] = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
    uint16_t h = (uint16_t)(qh >> (16 * part));
    uint8x16_t bytes = vcombine_u8(vdup_n_u8((uint8_t)(h & 0xFF)), vdup_n_u8((uint8_t)(h >> 8)));
    uint8x16_t set = vtstq_u8(bytes, vld1q_u8(bitsel));
    return vandq_u8(set, vdupq_n_u8(16));
}

/* the block's 32 values, v[8k .. 8k+3] in w[2k], v[8k+4 ..] in w[2k+1] */
ALWAYS_INLINE void qb32_values(int type, const uint8_t *blk, float32x4_t w[8])
{
    int has_m = type == 3 || type == 7, has_h = type == 6 || type == 7;
    const uint8_t *qs = blk + 2 + (has_m ? 2 : 0) + (has_h ? 4 : 0);
    float32x4_t d = vdupq_n_f32(half_le(blk)), m = vdupq_n_f32(has_m ? half_le(blk + 2) : 0.0f);
    uint8x16_t q = vld1q_u8(qs);
    uint8x16_t c[2] = {vandq_u8(q, vdupq_n_u8(15)), vshrq_n_u8(q, 4)}; /* values 0-15, 16-31 */
    if (has_h) {
        uint32_t qh;
        memcpy(&qh, blk + 2 + (has_m ? 2 : 0), 4);
        c[0] = vorrq_u8(c[0], qh_bits16(qh, 0));
        c[1] = vorrq_u8(c[1], qh_bits16(qh, 1));
    }
    for (int part = 0; part < 2; part++) {
        float32x4_t v[4];
        if (type == 20) {
            /* the table by index: exact copies of its floats */
            uint8_t idx[16];
            vst1q_u8(idx, c[part]);
            float t[16];
            for (int i = 0; i < 16; i++) t[i] = iq4nl_values[idx[i]];
            for (int k = 0; k < 4; k++) w[4 * part + k] = vmulq_f32(d, vld1q_f32(t + 4 * k));
            continue;
        }
        u8x16_f32(c[part], v);
        float32x4_t off = vdupq_n_f32(type == 2 ? 8.0f : type == 6 ? 16.0f : 0.0f);
        for (int k = 0; k < 4; k++) {
            /* (float)(code - off) is exact, as the scalar decode's int subtraction then conversion */
            float32x4_t cv = type == 2 || type == 6 ? vsubq_f32(v[k], off) : v[k];
            float32x4_t x = vmulq_f32(cv, d);
            w[4 * part + k] = has_m ? vaddq_f32(x, m) : x;
        }
    }
}

ALWAYS_INLINE void qb32_rows(int type, int bytes, const uint8_t *row, int C, const float *x, size_t xs, int nt,
                             float *y, size_t ys)
{
    float32x4_t a[4][4], w[8];
    zero16(a);
    for (int b = 0; b < C / 32; b++) {
        qb32_values(type, row + (size_t)b * (size_t)bytes, w);
        fma16(a, w, x + (size_t)b * 32, xs, nt);
        fma16(a, w + 4, x + (size_t)b * 32 + 16, xs, nt);
    }
    store16(a, nt, y, ys);
}

KERNEL_QB32_DRIVER(matmul_q4_0_neon, 2, 18)
KERNEL_QB32_DRIVER(matmul_q4_1_neon, 3, 20)
KERNEL_QB32_DRIVER(matmul_q5_0_neon, 6, 22)
KERNEL_QB32_DRIVER(matmul_q5_1_neon, 7, 24)
KERNEL_QB32_DRIVER(matmul_iq4_nl_neon, 20, 18)

/* any other format: each block decoded once per row and group of up to four
 * positions by qblock.c's decoder, then the dense order over its values */
ALWAYS_INLINE void qblock_rows(const qblock_fmt *f, const uint8_t *row, int C, const float *x, size_t xs, int nt,
                               float *y, size_t ys)
{
    float wv[QBLOCK_MAX] __attribute__((aligned(16)));
    float32x4_t a[4][4], w[4];
    zero16(a);
    for (int b = 0; b < C / f->block; b++) {
        f->decode(row + (size_t)b * f->bytes, wv);
        for (int k = 0; k < f->block; k += 16) {
            for (int i = 0; i < 4; i++) w[i] = vld1q_f32(wv + k + 4 * i);
            fma16(a, w, x + (size_t)b * f->block + k, xs, nt);
        }
    }
    store16(a, nt, y, ys);
}

static void matmul_qblock_neon(const qblock_fmt *f, const uint8_t *blocks, int C, const float *x, size_t xs, int T,
                               float *y, size_t ys, int r0, int r1)
{
    switch (f->ggml_type) {
    case 2: matmul_q4_0_neon(blocks, C, x, xs, T, y, ys, r0, r1); return;
    case 3: matmul_q4_1_neon(blocks, C, x, xs, T, y, ys, r0, r1); return;
    case 6: matmul_q5_0_neon(blocks, C, x, xs, T, y, ys, r0, r1); return;
    case 7: matmul_q5_1_neon(blocks, C, x, xs, T, y, ys, r0, r1); return;
    case 20: matmul_iq4_nl_neon(blocks, C, x, xs, T, y, ys, r0, r1); return;
    default: break;
    }
    size_t rb = (size_t)C / (size_t)f->block * (size_t)f->bytes;
    for (int r = r0; r < r1; r++) {
        const uint8_t *row = blocks + (size_t)r * rb;
        int t = 0;
        for (; t + 4 <= T; t += 4) qblock_rows(f, row, C, x + (size_t)t * xs, xs, 4, y + (size_t)t * ys + r, ys);
        switch (T - t) {
        case 3: qblock_rows(f, row, C, x + (size_t)t * xs, xs, 3, y + (size_t)t * ys + r, ys); break;
        case 2: qblock_rows(f, row, C, x + (size_t)t * xs, xs, 2, y + (size_t)t * ys + r, ys); break;
        case 1: qblock_rows(f, row, C, x + (size_t)t * xs, xs, 1, y + (size_t)t * ys + r, ys); break;
        }
    }
}

/* ---- MXFP4 ----
 * An E2M1 code's f32 has only its top two bytes set: two byte-table
 * lookups (TBL) give them, zipped into halves and shifted up: exact, and
 * -0 for code 8 as in e2m1_table. */
static const uint8_t e2m1_b3[16] = {0x00, 0x3F, 0x3F, 0x3F, 0x40, 0x40, 0x40, 0x40,
                                    0x80, 0xBF, 0xBF, 0xBF, 0xC0, 0xC0, 0xC0, 0xC0};
static const uint8_t e2m1_b2[16] = {0x00, 0x00, 0x80, 0xC0, 0x00, 0x40, 0x80, 0xC0,
                                    0x00, 0x00, 0x80, 0xC0, 0x00, 0x40, 0x80, 0xC0};

/* 16 codes (0-15) -> their values in four vectors */
ALWAYS_INLINE void e2m1_16(uint8x16_t codes, uint8x16_t t3, uint8x16_t t2, float32x4_t w[4])
{
    uint8x16_t b3 = vqtbl1q_u8(t3, codes), b2 = vqtbl1q_u8(t2, codes);
    uint16x8_t lo = vreinterpretq_u16_u8(vzip1q_u8(b2, b3)), hi = vreinterpretq_u16_u8(vzip2q_u8(b2, b3));
    w[0] = f32_of_u32(vshll_n_u16(vget_low_u16(lo), 16));
    w[1] = f32_of_u32(vshll_high_n_u16(lo, 16));
    w[2] = f32_of_u32(vshll_n_u16(vget_low_u16(hi), 16));
    w[3] = f32_of_u32(vshll_high_n_u16(hi, 16));
}

/* gg = 0: packed + scales rows (byte j: value 2j low, 2j + 1 high); gg = 1:
 * a row of ggml blocks (scale byte, then byte j: value j low, j + 16 high) */
ALWAYS_INLINE void mxfp4_rows_any(const uint8_t *prow, const uint8_t *srow, int C, const float *xp, size_t xs,
                                  int nt, float *y, size_t ys, int gg)
{
    const uint8x16_t t3 = vld1q_u8(e2m1_b3), t2 = vld1q_u8(e2m1_b2), m15 = vdupq_n_u8(15);
    float32x4_t a[4][4];
    zero16(a);
    for (int b = 0; b < C / MXFP4_BLOCK; b++) {
        uint8x16_t ev, od; /* codes of values 2j and 2j + 1 */
        float s;
        if (gg) {
            const uint8_t *blk = prow + (size_t)b * GGML_MXFP4_BYTES;
            uint8x16_t q = vld1q_u8(blk + 1), lo = vandq_u8(q, m15), hi = vshrq_n_u8(q, 4);
            ev = vuzp1q_u8(lo, hi);
            od = vuzp2q_u8(lo, hi);
            s = e8m0_table[blk[0]];
        } else {
            uint8x16_t q = vld1q_u8(prow + (size_t)b * 16);
            ev = vandq_u8(q, m15);
            od = vshrq_n_u8(q, 4);
            s = e8m0_table[srow[b]];
        }
        float32x4_t we[4], wo[4], sc = vdupq_n_f32(s);
        e2m1_16(ev, t3, t2, we);
        e2m1_16(od, t3, t2, wo);
        _Pragma("GCC unroll 4") for (int u = 0; u < nt; u++) {
            const float *xe = xp + (size_t)u * xs + (size_t)b * MXFP4_BLOCK, *xo = xe + 16;
            _Pragma("GCC unroll 4") for (int k = 0; k < 4; k++) {
                float32x4_t p = vmulq_f32(we[k], vld1q_f32(xe + 4 * k));
                p = vfmaq_f32(p, wo[k], vld1q_f32(xo + 4 * k));
                a[u][k] = vfmaq_f32(a[u][k], p, sc);
            }
        }
    }
    store16(a, nt, y, ys);
}

KERNEL_MXFP4_DRIVERS(matmul_mxfp4_neon, matmul_mxfp4_gg_neon, mxfp4_rows_any)

/* ---- exp: df_exp (mathfn.c) on two lanes, the same double operations in
 * the same order (mul, then add: never fused); only for lanes in [-708,
 * 708], where df_exp takes its main branch and 2^k is normal ---- */
ALWAYS_INLINE float64x2_t exp2_pd(float64x2_t x)
{
    const float64x2_t shift = vdupq_n_f64(DF_EXP_SHIFT);
    float64x2_t n = vsubq_f64(vaddq_f64(vmulq_f64(x, vdupq_n_f64(DF_EXP_INV_LN2)), shift), shift);
    float64x2_t r = vsubq_f64(vsubq_f64(x, vmulq_f64(n, vdupq_n_f64(DF_EXP_LN2_HI))),
                              vmulq_f64(n, vdupq_n_f64(DF_EXP_LN2_LO)));
    float64x2_t p = vdupq_n_f64(DF_EXP_LEAD);
#define EXP_STEP(C) p = vaddq_f64(vmulq_f64(p, r), vdupq_n_f64(C))
    DF_EXP_STEPS(EXP_STEP);
#undef EXP_STEP
    int64x2_t k = vcvtq_s64_f64(n); /* n is an integer: exact */
    int64x2_t bits = vshlq_n_s64(vaddq_s64(k, vdupq_n_s64(1023)), 52);
    return vmulq_f64(p, vreinterpretq_f64_s64(bits));
}

/* df_exp on two lanes: exp2_pd when both are in its range, else the scalar
 * function lane by lane */
ALWAYS_INLINE float64x2_t exp2_any(float64x2_t x)
{
    uint64x2_t ok = vandq_u64(vcgeq_f64(x, vdupq_n_f64(-708.0)), vcleq_f64(x, vdupq_n_f64(708.0)));
    if (__builtin_expect((vgetq_lane_u64(ok, 0) & vgetq_lane_u64(ok, 1)) != 0, 1)) return exp2_pd(x);
    double e[2] = {df_exp(vgetq_lane_f64(x, 0)), df_exp(vgetq_lane_f64(x, 1))};
    return vld1q_f64(e);
}

/* ---- elementwise kernels (kernels_elementwise.h) on two double lanes ---- */
typedef float64x2_t ew_d;
typedef float32x2_t ew_f;
#define EW_W 2
#define EW_FN(name) name##_neon
#define ew_loadf(p) vld1_f32(p)
#define ew_storef(p, v) vst1_f32((p), (v))
#define ew_loadd(p) vld1q_f64(p)
#define ew_stored(p, v) vst1q_f64((p), (v))
#define ew_f2d(v) vcvt_f64_f32(v)
#define ew_d2f(v) vcvt_f32_f64(v)
#define ew_setd(c) vdupq_n_f64(c)
#define ew_setf(c) vdup_n_f32(c)
#define ew_addd vaddq_f64
#define ew_subd vsubq_f64
#define ew_muld vmulq_f64
#define ew_divd vdivq_f64
#define ew_mulf vmul_f32
#define ew_divf vdiv_f32
#define ew_absd(v) vabsq_f64(v)
#define ew_neg_if_neg(t, d) vbslq_f64(vcltzq_f64(d), vnegq_f64(t), (t))
ALWAYS_INLINE int ew_all_in(float64x2_t v, double lo, double hi)
{
    uint64x2_t ok = vandq_u64(vcgeq_f64(v, vdupq_n_f64(lo)), vcleq_f64(v, vdupq_n_f64(hi)));
    return (vgetq_lane_u64(ok, 0) & vgetq_lane_u64(ok, 1)) != 0;
}
#define ew_exp_main exp2_pd
#include "kernels_elementwise.h"

/* ---- MLA attention: mla_attend_ref's contract (kernels.h), bit for bit.
 *
 * Scores: lanes are heads, eight at a time in four float64x2_t (missing
 * heads are zero queries whose lanes are never stored).  Per block of 32
 * positions and chunk of 64 columns, the eight heads' queries are
 * converted to double once ([column][head], qt); then four positions x
 * eight heads are sixteen independent FMA chains: per two columns, each
 * position's two cache values converted to double and FMLA by lane into
 * its four head vectors.  A product of two floats is exact in double, so
 * the FMA rounds as the reference's product-then-add.  Sums run on from
 * chunk to chunk through `acc`; the last chunk makes s = (float)sum *
 * scale and the running maximum (positions in order).
 * Softmax: exp2_any over the scores as one flat array, then each head's sum
 * in position order.  Context: lanes are columns; per tile of positions and
 * block of four heads, 16 columns of ctx stay in registers while p runs in
 * order: multiply, then add. */
enum { MLA_PB = 32, MLA_JC = 64, MLA_HB = 8 };

/* qt[jj][l] = head h0 + l's query at column j0 + jj (l < hl; zero beyond) */
static void mla_q_tile(const float *ql, size_t qls, const float *qr, size_t qrs, int Rkv, int h0, int hl, int j0,
                       int jn, double *qt)
{
    for (int jj = 0; jj < jn; jj++) {
        int j = j0 + jj;
        for (int l = 0; l < MLA_HB; l++)
            qt[jj * MLA_HB + l] = l >= hl ? 0.0
                                  : j < Rkv ? (double)ql[(size_t)(h0 + l) * qls + j]
                                            : (double)qr[(size_t)(h0 + l) * qrs + (j - Rkv)];
    }
}

/* score sums of the four positions rows[0..3] (live of them real) for the
 * block's eight heads over the chunk's jn columns; acc: [u][MLA_NH_MAX] at
 * the heads' first */
ALWAYS_INLINE void mla_scores4(const float *const rows[4], const double *qt, int jn, double *acc, int first)
{
    float64x2_t a[4][4];
    _Pragma("GCC unroll 4") for (int u = 0; u < 4; u++) _Pragma("GCC unroll 4") for (int v = 0; v < 4; v++)
        a[u][v] = first ? vdupq_n_f64(0.0) : vld1q_f64(acc + (size_t)u * MLA_NH_MAX + 2 * v);
    int jj = 0;
    for (; jj + 2 <= jn; jj += 2) {
        float64x2_t q0[4], q1[4];
        _Pragma("GCC unroll 4") for (int v = 0; v < 4; v++) {
            q0[v] = vld1q_f64(qt + jj * MLA_HB + 2 * v);
            q1[v] = vld1q_f64(qt + (jj + 1) * MLA_HB + 2 * v);
        }
        _Pragma("GCC unroll 4") for (int u = 0; u < 4; u++) {
            float64x2_t r = vcvt_f64_f32(vld1_f32(rows[u] + jj));
            _Pragma("GCC unroll 4") for (int v = 0; v < 4; v++) {
                a[u][v] = vfmaq_laneq_f64(a[u][v], q0[v], r, 0);
                a[u][v] = vfmaq_laneq_f64(a[u][v], q1[v], r, 1);
            }
        }
    }
    if (jj < jn) {
        _Pragma("GCC unroll 4") for (int u = 0; u < 4; u++) {
            double r = rows[u][jj];
            _Pragma("GCC unroll 4") for (int v = 0; v < 4; v++)
                a[u][v] = vfmaq_n_f64(a[u][v], vld1q_f64(qt + jj * MLA_HB + 2 * v), r);
        }
    }
    _Pragma("GCC unroll 4") for (int u = 0; u < 4; u++) _Pragma("GCC unroll 4") for (int v = 0; v < 4; v++)
        vst1q_f64(acc + (size_t)u * MLA_NH_MAX + 2 * v, a[u][v]);
}

/* ctx[h0 + u][j0 .. j0 + 4*nv - 1] (nu heads) over positions p0 .. pe-1;
 * first: from +0.  sc: weights [p][nh]. */
ALWAYS_INLINE void mla_ctx(const float *cache, size_t row_w, int Rkv, const float *sc, int nh, int h0, int nu, int j0,
                           int nv, int p0, int pe, int first, float *ctx)
{
    float32x4_t a[4][4];
    _Pragma("GCC unroll 4") for (int u = 0; u < nu; u++) {
        const float *c = ctx + (size_t)(h0 + u) * Rkv + j0;
        _Pragma("GCC unroll 4") for (int k = 0; k < nv; k++) a[u][k] = first ? vdupq_n_f32(0.0f) : vld1q_f32(c + 4 * k);
    }
    const float *row = cache + (size_t)p0 * row_w + j0, *pp = sc + (size_t)p0 * nh + h0;
    for (int p = p0; p < pe; p++, row += row_w, pp += nh) {
        float32x4_t r[4];
        _Pragma("GCC unroll 4") for (int k = 0; k < nv; k++) r[k] = vld1q_f32(row + 4 * k);
        _Pragma("GCC unroll 4") for (int u = 0; u < nu; u++)
            _Pragma("GCC unroll 4") for (int k = 0; k < nv; k++) a[u][k] = vaddq_f32(a[u][k], vmulq_n_f32(r[k], pp[u]));
    }
    _Pragma("GCC unroll 4") for (int u = 0; u < nu; u++) {
        float *c = ctx + (size_t)(h0 + u) * Rkv + j0;
        _Pragma("GCC unroll 4") for (int k = 0; k < nv; k++) vst1q_f32(c + 4 * k, a[u][k]);
    }
}

static void mla_attend_neon(const float *cache, size_t row_w, int Rkv, int dr, int n, const float *ql, size_t qls,
                            const float *qr, size_t qrs, int nh, float scale, float *sc, float *ctx)
{
    CHECK(nh >= 1 && nh <= MLA_NH_MAX && n >= 1);
    double mx[MLA_NH_MAX];
    double qt[MLA_JC * MLA_HB] __attribute__((aligned(16)));
    double acc[MLA_PB * MLA_NH_MAX] __attribute__((aligned(16))); /* [u][head] */
    int w = Rkv + dr;
    for (int h = 0; h < MLA_NH_MAX; h++) mx[h] = -INFINITY;

    for (int p0 = 0; p0 < n; p0 += MLA_PB) {
        int np = n - p0 < MLA_PB ? n - p0 : MLA_PB;
        for (int j0 = 0; j0 < w; j0 += MLA_JC) {
            int jn = w - j0 < MLA_JC ? w - j0 : MLA_JC;
            for (int h0 = 0; h0 < nh; h0 += MLA_HB) {
                int hl = nh - h0 < MLA_HB ? nh - h0 : MLA_HB;
                mla_q_tile(ql, qls, qr, qrs, Rkv, h0, hl, j0, jn, qt);
                for (int u0 = 0; u0 < np; u0 += 4) {
                    const float *rows[4];
                    for (int u = 0; u < 4; u++) /* positions past np read a live row; never stored */
                        rows[u] = cache + (size_t)(p0 + (u0 + u < np ? u0 + u : u0)) * row_w + j0;
                    mla_scores4(rows, qt, jn, acc + (size_t)u0 * MLA_NH_MAX + h0, j0 == 0);
                }
            }
        }
        /* the block's sums are complete: scores and maxima, positions in order */
        for (int u = 0; u < np; u++)
            for (int h = 0; h < nh; h++) {
                float s = (float)acc[(size_t)u * MLA_NH_MAX + h] * scale;
                sc[(size_t)(p0 + u) * nh + h] = s;
                if (s > mx[h]) mx[h] = s;
            }
    }

    /* softmax weights: the exp over sc as one flat array (lane i is head
     * i mod nh; mxe repeats mx so that two lanes' maxima are one load) */
    double mxe[MLA_NH_MAX + 2];
    for (int k = 0; k < nh + 2; k++) mxe[k] = mx[k % nh];
    size_t nall = (size_t)n * nh, i = 0;
    for (int h = 0; i + 2 <= nall; i += 2) {
        float64x2_t x = vsubq_f64(vcvt_f64_f32(vld1_f32(sc + i)), vld1q_f64(mxe + h));
        vst1_f32(sc + i, vcvt_f32_f64(exp2_any(x)));
        for (h += 2; h >= nh;) h -= nh;
    }
    for (; i < nall; i++) sc[i] = (float)df_exp((double)sc[i] - mx[i % nh]);
    mla_weights_normalise(sc, n, nh);

    /* context: tiles of positions that stay in L2 while every head block
     * and column block passes over them; 16 columns at a time, then 4,
     * then one by one */
    int pt = (int)((256u << 10) / (row_w * sizeof(float) + 1));
    if (pt < 16) pt = 16;
    int j16 = Rkv / 16 * 16, j4 = Rkv / 4 * 4;
    for (int p0 = 0; p0 < n; p0 += pt) {
        int pe = n - p0 < pt ? n : p0 + pt, first = p0 == 0;
        for (int h0 = 0; h0 < nh; h0 += 4) {
            int nu = nh - h0 < 4 ? nh - h0 : 4;
#define CTX_CASES(J0, NV)                                                                       \
    switch (nu) {                                                                               \
    case 4: mla_ctx(cache, row_w, Rkv, sc, nh, h0, 4, J0, NV, p0, pe, first, ctx); break;       \
    case 3: mla_ctx(cache, row_w, Rkv, sc, nh, h0, 3, J0, NV, p0, pe, first, ctx); break;       \
    case 2: mla_ctx(cache, row_w, Rkv, sc, nh, h0, 2, J0, NV, p0, pe, first, ctx); break;       \
    default: mla_ctx(cache, row_w, Rkv, sc, nh, h0, 1, J0, NV, p0, pe, first, ctx); break;      \
    }
            for (int j0 = 0; j0 < j16; j0 += 16) CTX_CASES(j0, 4)
            for (int j0 = j16; j0 < j4; j0 += 4) CTX_CASES(j0, 1)
#undef CTX_CASES
            for (int j = j4; j < Rkv; j++)
                for (int u = 0; u < nu; u++) {
                    float *c = ctx + (size_t)(h0 + u) * Rkv + j;
                    float a = first ? 0.0f : *c;
                    for (int p = p0; p < pe; p++) a += sc[(size_t)p * nh + h0 + u] * cache[(size_t)p * row_w + j];
                    *c = a;
                }
        }
    }
}

/* ---- the KDA delta rule's passes (kernels_kda.h) on four floats ---- */
#define KV float32x4_t
#define KW 4
#define kv_load vld1q_f32
#define kv_store vst1q_f32
#define kv_set1 vdupq_n_f32
#define kv_mul vmulq_f32
#define kv_add vaddq_f32
#define KDA_FN(name) name##_neon
#include "kernels_kda.h"

static const kernel_table neon_table = {
    .name = "neon",
    .matmul_f32 = matmul_f32_neon,
    .matmul_bf16 = matmul_bf16_neon,
    .matmul_mxfp4 = matmul_mxfp4_neon,
    .matmul_mxfp4_gg = matmul_mxfp4_gg_neon,
    .matmul_f16 = matmul_f16_neon,
    .matmul_q8_0 = matmul_q8_0_neon,
    .matmul_qblock = matmul_qblock_neon,
    .mla_attend = mla_attend_neon,
    .exp_n = exp_n_neon,
    .sigmoid_n = sigmoid_n_neon,
    .silu_n = silu_n_neon,
    .situ_n = situ_n_neon,
    .kda_decay_pred = kda_decay_pred_neon,
    .kda_update_out = kda_update_out_neon,
};

const kernel_table *kernels_neon(void) { return &neon_table; }

#else
const kernel_table *kernels_neon(void) { return 0; }
#endif
