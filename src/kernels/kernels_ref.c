/* kernels_ref.c - the scalar reference kernels: the specification of the
 * reduction order that every ISA file must reproduce bit for bit (the
 * contract is written out in kernels.h).  Written for clarity, not speed; it
 * also serves as the fallback on CPUs without AVX2 or NEON.  fmaf() is the correctly
 * rounded fused multiply-add, the same operation as the SIMD FMA
 * instructions.
 */
#include "kernels.h"
#include "mathfn.h"
#include "quant.h"
#include "util.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif
#if defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>
#ifndef HWCAP_FP
#define HWCAP_FP (1 << 0)
#endif
#ifndef HWCAP_ASIMD
#define HWCAP_ASIMD (1 << 1)
#endif
#endif
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* The dense order (kernels.h) over rows of esize-byte elements read by load. */
static void dense_ref(float (*load)(const void *, size_t), size_t esize, const void *W, size_t ld, int C,
                      const float *x, size_t xs, int T, float *y, size_t ys, int r0, int r1)
{
    for (int r = r0; r < r1; r++) {
        const uint8_t *row = (const uint8_t *)W + (size_t)r * ld * esize;
        for (int t = 0; t < T; t++) {
            const float *xt = x + (size_t)t * xs;
            float acc[16] = {0};
            for (int c0 = 0; c0 < C; c0 += 16)
                for (int l = 0; l < 16; l++) {
                    int c = c0 + l;
                    float w = c < C ? load(row, (size_t)c) : 0.0f;
                    float v = c < C ? xt[c] : 0.0f;
                    acc[l] = fmaf(w, v, acc[l]);
                }
            y[(size_t)t * ys + r] = lane_tree16(acc);
        }
    }
}

static float ld_f32(const void *row, size_t c) { return load_f32(row, c); }
static float ld_bf16(const void *row, size_t c) { return load_bf16(row, c); }
static float ld_f16(const void *row, size_t c) { return load_f16(row, c); }

static void matmul_f32_ref(const void *W, size_t ld, int C, const float *x, size_t xs, int T, float *y, size_t ys,
                           int r0, int r1)
{
    dense_ref(ld_f32, 4, W, ld, C, x, xs, T, y, ys, r0, r1);
}

static void matmul_bf16_ref(const void *W, size_t ld, int C, const float *x, size_t xs, int T, float *y, size_t ys,
                            int r0, int r1)
{
    dense_ref(ld_bf16, 2, W, ld, C, x, xs, T, y, ys, r0, r1);
}

static void matmul_f16_ref(const void *W, size_t ld, int C, const float *x, size_t xs, int T, float *y, size_t ys,
                           int r0, int r1)
{
    dense_ref(ld_f16, 2, W, ld, C, x, xs, T, y, ys, r0, r1);
}

/* Q8_0: the dense order over w = (float)q * d (C a multiple of 32, so no
 * column is past C) */
static void matmul_q8_0_ref(const uint8_t *blocks, const uint8_t *unused, int C, const float *x, size_t xs, int T,
                            float *y, size_t ys, int r0, int r1)
{
    (void)unused;
    size_t rb = (size_t)C / Q8_0_BLOCK * Q8_0_BYTES;
    for (int r = r0; r < r1; r++) {
        const uint8_t *row = blocks + (size_t)r * rb;
        for (int t = 0; t < T; t++) {
            const float *xt = x + (size_t)t * xs;
            float acc[16] = {0};
            for (int c0 = 0; c0 < C; c0 += 16)
                for (int l = 0; l < 16; l++) acc[l] = fmaf(load_q8_0(row, (size_t)(c0 + l)), xt[c0 + l], acc[l]);
            y[(size_t)t * ys + r] = lane_tree16(acc);
        }
    }
}

/* any block format: each block decoded (qblock.h), the dense order over its
 * values (blocks are whole multiples of 16 columns, so column c's lane is c % 16) */
static void matmul_qblock_ref(const qblock_fmt *f, const uint8_t *blocks, int C, const float *x, size_t xs, int T,
                              float *y, size_t ys, int r0, int r1)
{
    size_t rb = (size_t)C / (size_t)f->block * (size_t)f->bytes;
    float w[QBLOCK_MAX];
    for (int r = r0; r < r1; r++) {
        const uint8_t *row = blocks + (size_t)r * rb;
        for (int t = 0; t < T; t++) {
            const float *xt = x + (size_t)t * xs;
            float acc[16] = {0};
            for (int b = 0; b < C / f->block; b++) {
                f->decode(row + (size_t)b * f->bytes, w);
                const float *xb = xt + (size_t)b * f->block;
                for (int c = 0; c < f->block; c++) acc[c & 15] = fmaf(w[c], xb[c], acc[c & 15]);
            }
            y[(size_t)t * ys + r] = lane_tree16(acc);
        }
    }
}

static void matmul_mxfp4_ref(const uint8_t *packed, const uint8_t *scales, int C, const float *xp,
                             size_t xs, int T, float *y, size_t ys, int r0, int r1)
{
    size_t pb = (size_t)C / 2, sb = (size_t)C / MXFP4_BLOCK;
    for (int r = r0; r < r1; r++) {
        const uint8_t *prow = packed + (size_t)r * pb;
        const uint8_t *srow = scales + (size_t)r * sb;
        for (int t = 0; t < T; t++) {
            const float *xt = xp + (size_t)t * xs;
            float acc[16] = {0};
            for (int b = 0; b < C / MXFP4_BLOCK; b++) {
                float scale = e8m0_table[srow[b]];
                const uint8_t *bytes = prow + (size_t)b * 16;
                const float *xe = xt + (size_t)b * MXFP4_BLOCK, *xo = xe + 16;
                for (int j = 0; j < 16; j++) {
                    float p = e2m1_table[bytes[j] & 15] * xe[j];
                    p = fmaf(e2m1_table[bytes[j] >> 4], xo[j], p);
                    acc[j] = fmaf(p, scale, acc[j]);
                }
            }
            y[(size_t)t * ys + r] = lane_tree16(acc);
        }
    }
}

/* ggml blocks: each block's bytes permuted into the layout above (the same
 * permutation as mxfp4_from_ggml), then exactly matmul_mxfp4_ref's steps. */
static void matmul_mxfp4_gg_ref(const uint8_t *blocks, const uint8_t *unused, int C, const float *xp,
                                size_t xs, int T, float *y, size_t ys, int r0, int r1)
{
    (void)unused;
    size_t nb = (size_t)C / MXFP4_BLOCK;
    for (int r = r0; r < r1; r++) {
        const uint8_t *row = blocks + (size_t)r * nb * GGML_MXFP4_BYTES;
        for (int t = 0; t < T; t++) {
            const float *xt = xp + (size_t)t * xs;
            float acc[16] = {0};
            for (size_t b = 0; b < nb; b++) {
                uint8_t bytes[16], scale_byte;
                mxfp4_from_ggml(row + b * GGML_MXFP4_BYTES, 1, MXFP4_BLOCK, bytes, &scale_byte);
                float scale = e8m0_table[scale_byte];
                const float *xe = xt + b * MXFP4_BLOCK, *xo = xe + 16;
                for (int j = 0; j < 16; j++) {
                    float p = e2m1_table[bytes[j] & 15] * xe[j];
                    p = fmaf(e2m1_table[bytes[j] >> 4], xo[j], p);
                    acc[j] = fmaf(p, scale, acc[j]);
                }
            }
            y[(size_t)t * ys + r] = lane_tree16(acc);
        }
    }
}

/* The contract's three steps for every head in turn (kernels.h): mla.c's
 * loop before the vector kernels.  Scores go four positions at a time: four independent sums, each in the
 * same j order as one position alone (the chains overlap instead of waiting
 * on one add's latency; this is also the fallback on CPUs without AVX2). */
static void mla_attend_ref(const float *cache, size_t row_w, int Rkv, int dr, int n, const float *ql, size_t qls,
                           const float *qr, size_t qrs, int nh, float scale, float *sc, float *ctx)
{
    CHECK(nh >= 1 && nh <= MLA_NH_MAX && n >= 1);
    double mx[MLA_NH_MAX];
    for (int h = 0; h < nh; h++) { /* scores; head h's at sc[p * nh + h] */
        const float *qa = ql + (size_t)h * qls, *qb = qr + (size_t)h * qrs;
        float *sh = sc + h;
#define s(p) sh[(size_t)(p) * (size_t)nh]
        double m = -INFINITY;
        int p = 0;
        for (; p + 4 <= n; p += 4) {
            const float *r0 = cache + (size_t)p * row_w, *r1 = r0 + row_w, *r2 = r1 + row_w, *r3 = r2 + row_w;
            double a0 = 0.0, a1 = 0.0, a2 = 0.0, a3 = 0.0;
            for (int j = 0; j < Rkv; j++) {
                double q = qa[j];
                a0 += q * r0[j];
                a1 += q * r1[j];
                a2 += q * r2[j];
                a3 += q * r3[j];
            }
            for (int j = 0; j < dr; j++) {
                double q = qb[j];
                a0 += q * r0[Rkv + j];
                a1 += q * r1[Rkv + j];
                a2 += q * r2[Rkv + j];
                a3 += q * r3[Rkv + j];
            }
            s(p) = (float)a0 * scale;
            s(p + 1) = (float)a1 * scale;
            s(p + 2) = (float)a2 * scale;
            s(p + 3) = (float)a3 * scale;
            for (int u = 0; u < 4; u++)
                if (s(p + u) > m) m = s(p + u);
        }
        for (; p < n; p++) {
            const float *row = cache + (size_t)p * row_w;
            double acc = 0.0;
            for (int j = 0; j < Rkv; j++) acc += (double)qa[j] * row[j];
            for (int j = 0; j < dr; j++) acc += (double)qb[j] * row[Rkv + j];
            s(p) = (float)acc * scale;
            if (s(p) > m) m = s(p);
        }
        mx[h] = m;
    }
    /* ctx may overlap the queries: written only from here on */
    for (int h = 0; h < nh; h++) {
        float *sh = sc + h;
        double sum = 0.0;
        for (int p = 0; p < n; p++) {
            s(p) = (float)df_exp((double)s(p) - mx[h]);
            sum += s(p);
        }
        float inv = (float)(1.0 / sum);
        float *c = ctx + (size_t)h * Rkv;
        for (int j = 0; j < Rkv; j++) c[j] = 0.0f;
        for (int p = 0; p < n; p++) {
            const float *row = cache + (size_t)p * row_w;
            float pp = s(p) * inv;
            s(p) = pp; /* the weights stay in sc (kernels.h) */
            for (int j = 0; j < Rkv; j++) c[j] += pp * row[j];
        }
    }
#undef s
}

static void exp_n_ref(const double *x, double *y, size_t n)
{
    for (size_t i = 0; i < n; i++) y[i] = df_exp(x[i]);
}

static void sigmoid_n_ref(const float *x, size_t n, float *y)
{
    for (size_t i = 0; i < n; i++) y[i] = df_sigmoidf(x[i]);
}

static void silu_n_ref(const float *x, size_t n, float *y)
{
    for (size_t i = 0; i < n; i++) y[i] = df_siluf(x[i]);
}

static void situ_n_ref(const float *g, const float *u, size_t n, float b1, float b2, float *out)
{
    for (size_t i = 0; i < n; i++) out[i] = df_situ(g[i], u[i], b1, b2);
}

/* The specification of kernels_kda.h's passes: rows d in order, columns v */
static void kda_decay_pred_ref(float *S, int Dk, const float *dec, const float *k, float *pred)
{
    for (int d = 0; d < Dk; d++) {
        float *row = S + (size_t)d * Dk;
        for (int v = 0; v < Dk; v++) {
            row[v] = row[v] * dec[d];
            pred[v] = pred[v] + k[d] * row[v];
        }
    }
}

static void kda_update_out_ref(float *S, int Dk, const float *b, const float *p, const float *q, float *o)
{
    for (int d = 0; d < Dk; d++) {
        float *row = S + (size_t)d * Dk;
        for (int v = 0; v < Dk; v++) {
            row[v] = row[v] + b[d] * p[v];
            o[v] = o[v] + q[d] * row[v];
        }
    }
}

static const kernel_table ref_table = {
    .name = "ref",
    .matmul_f32 = matmul_f32_ref,
    .matmul_bf16 = matmul_bf16_ref,
    .matmul_mxfp4 = matmul_mxfp4_ref,
    .matmul_mxfp4_gg = matmul_mxfp4_gg_ref,
    .matmul_f16 = matmul_f16_ref,
    .matmul_q8_0 = matmul_q8_0_ref,
    .matmul_qblock = matmul_qblock_ref,
    .mla_attend = mla_attend_ref,
    .exp_n = exp_n_ref,
    .sigmoid_n = sigmoid_n_ref,
    .silu_n = silu_n_ref,
    .situ_n = situ_n_ref,
    .kda_decay_pred = kda_decay_pred_ref,
    .kda_update_out = kda_update_out_ref,
};

const kernel_table *kernels_ref(void) { return &ref_table; }

#if defined(__x86_64__) || defined(__i386__)
/* F16C (the half conversions the AVX2 and AVX-512 kernels use): CPUID leaf
 * 1, ECX bit 29 (not every compiler's __builtin_cpu_supports names it) */
static int cpu_has_f16c(void)
{
    unsigned a, b, c, d;
    return __get_cpuid(1, &a, &b, &c, &d) && (c >> 29 & 1u);
}
#endif

int kernels_cpu_has(enum kernel_isa isa)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    switch (isa) {
    case KERNEL_REF: return 1;
    case KERNEL_AVX2:
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && cpu_has_f16c();
    case KERNEL_AVX512:
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512vl");
    case KERNEL_NEON: return 0;
    }
    return 0;
#elif defined(__aarch64__)
    /* Advanced SIMD and FP are part of every AArch64 CPU Linux runs on;
     * the kernel's HWCAP says so (macOS on Apple Silicon: always) */
    if (isa == KERNEL_REF) return 1;
    if (isa != KERNEL_NEON) return 0;
#if defined(__linux__)
    unsigned long hw = getauxval(AT_HWCAP);
    return (hw & HWCAP_ASIMD) && (hw & HWCAP_FP);
#else
    return 1;
#endif
#else
    return isa == KERNEL_REF;
#endif
}

const kernel_table *kernels_select(const char *force, df_error *err)
{
    if (force && *force) {
        enum kernel_isa isa;
        const kernel_table *t;
        if (!strcmp(force, "ref")) { isa = KERNEL_REF; t = kernels_ref(); }
        else if (!strcmp(force, "avx2")) { isa = KERNEL_AVX2; t = kernels_avx2(); }
        else if (!strcmp(force, "avx512")) { isa = KERNEL_AVX512; t = kernels_avx512(); }
        else if (!strcmp(force, "neon")) { isa = KERNEL_NEON; t = kernels_neon(); }
        else {
            df_err_set(err, DF_ERR_ARG, -1, "unknown kernel set \"%s\" (expected ref, avx2, avx512 or neon)", force);
            return NULL;
        }
        if (!t || !kernels_cpu_has(isa)) {
            df_err_set(err, DF_ERR_UNSUPPORTED, -1, "kernel set \"%s\" is not available on this CPU or build", force);
            return NULL;
        }
        return t;
    }
    if (kernels_avx512() && kernels_cpu_has(KERNEL_AVX512)) return kernels_avx512();
    if (kernels_avx2() && kernels_cpu_has(KERNEL_AVX2)) return kernels_avx2();
    if (kernels_neon() && kernels_cpu_has(KERNEL_NEON)) return kernels_neon();
    return kernels_ref();
}
