/* mathfn.c - see mathfn.h.  Compiled with the project's common flags (no
 * fast-math, no FP contraction), so the compiler cannot reorder or fuse. */
#include "mathfn.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

double df_exp(double x)
{
    if (x != x) return x;
    if (x > 709.0) return INFINITY;
    if (x < -745.0) return 0.0;
    /* x = n*ln2 + r, |r| <= ln2/2, with ln2 split in two for an exact product */
    static const double ln2_hi = 6.93147180369123816490e-01;
    static const double ln2_lo = 1.90821492927058770002e-10;
    static const double inv_ln2 = 1.44269504088896338700e+00;
    /* round to nearest, ties to even (what nearbyint does in the default
     * rounding mode) by adding and removing 1.5 * 2^52: exact for |v| < 2^51
     * and free of nearbyint's save/restore of the floating-point state */
    const double shift = 6755399441055744.0;
    double n = (x * inv_ln2 + shift) - shift;
    double r = (x - n * ln2_hi) - n * ln2_lo;
    /* Taylor to degree 11: |r| < 0.347 so the remainder is < 3e-15 relative,
     * far below the float rounding the callers apply */
    double p = 1.0 / 39916800.0;
    p = p * r + 1.0 / 3628800.0;
    p = p * r + 1.0 / 362880.0;
    p = p * r + 1.0 / 40320.0;
    p = p * r + 1.0 / 5040.0;
    p = p * r + 1.0 / 720.0;
    p = p * r + 1.0 / 120.0;
    p = p * r + 1.0 / 24.0;
    p = p * r + 1.0 / 6.0;
    p = p * r + 0.5;
    p = p * r + 1.0;
    p = p * r + 1.0;
    int k = (int)n;
    if (k < -1021) return ldexp(p, k);   /* subnormal results */
    /* 2^k built from its bits: exact, and cheaper than ldexp */
    uint64_t bits = (uint64_t)(k + 1023) << 52;
    double scale;
    memcpy(&scale, &bits, 8);
    return p * scale;
}

float df_expf(float x) { return (float)df_exp((double)x); }

float df_tanhf(float x)
{
    double d = x, a = fabs(d);
    if (a < 1e-4) return (float)(d - d * d * d / 3.0);
    if (a > 20.0) return x > 0 ? 1.0f : -1.0f;
    /* tanh(a) = (1 - e)/(1 + e) with e = exp(-2a): no cancellation for a >= 1e-4
     * beyond ~1e-12 relative, far below a float ulp */
    double e = df_exp(-2.0 * a);
    double t = (1.0 - e) / (1.0 + e);
    return (float)(x < 0 ? -t : t);
}

float df_sigmoidf(float x)
{
    return (float)(1.0 / (1.0 + df_exp(-(double)x)));
}

float df_siluf(float x)
{
    return x * df_sigmoidf(x);
}

float df_situ(float g, float u, float b1, float b2)
{
    float gg = (df_tanhf(g / b1) * b1) * df_sigmoidf(g);
    float uu = df_tanhf(u / b2) * b2;
    return gg * uu;
}

/* ---- four lanes at once (compiler vector extension: SSE2 / NEON pairs);
 * each lane runs exactly the scalar functions' double operations, so a
 * lane's result is the scalar result bit for bit.  Only inputs where the
 * scalar code takes its main branch are done this way.  Macros, not
 * functions: 32-byte vectors are not passed by value (no ABI questions). */
typedef double v4d __attribute__((vector_size(32)));
typedef float v4f __attribute__((vector_size(16)));
typedef long long v4l __attribute__((vector_size(32)));

/* OUT = df_exp(X) lane by lane; every lane in [-708, 708] */
#define EXP4(OUT, X)                                                                              \
    do {                                                                                          \
        const double ln2_hi_ = 6.93147180369123816490e-01, ln2_lo_ = 1.90821492927058770002e-10; \
        const double inv_ln2_ = 1.44269504088896338700e+00, shift_ = 6755399441055744.0;        \
        v4d x_ = (X);                                                                             \
        v4d n_ = (x_ * inv_ln2_ + shift_) - shift_;                                               \
        v4d r_ = (x_ - n_ * ln2_hi_) - n_ * ln2_lo_;                                              \
        v4d p_ = r_ * (1.0 / 39916800.0) + 1.0 / 3628800.0;                                       \
        p_ = p_ * r_ + 1.0 / 362880.0;                                                            \
        p_ = p_ * r_ + 1.0 / 40320.0;                                                             \
        p_ = p_ * r_ + 1.0 / 5040.0;                                                              \
        p_ = p_ * r_ + 1.0 / 720.0;                                                               \
        p_ = p_ * r_ + 1.0 / 120.0;                                                               \
        p_ = p_ * r_ + 1.0 / 24.0;                                                                \
        p_ = p_ * r_ + 1.0 / 6.0;                                                                 \
        p_ = p_ * r_ + 0.5;                                                                       \
        p_ = p_ * r_ + 1.0;                                                                       \
        p_ = p_ * r_ + 1.0;                                                                       \
        v4l bits_ = (__builtin_convertvector(n_, v4l) + 1023) << 52;                              \
        v4d scale_;                                                                               \
        memcpy(&scale_, &bits_, sizeof scale_);                                                   \
        (OUT) = p_ * scale_;                                                                      \
    } while (0)

/* OUT = df_tanhf(XF) lane by lane; every |lane| in [1e-4, 20] */
#define TANH4(OUT, XF)                                                                            \
    do {                                                                                          \
        v4f xf_ = (XF);                                                                           \
        v4d d_ = __builtin_convertvector(xf_, v4d), a_ = d_, e_;                                  \
        for (int l_ = 0; l_ < 4; l_++) a_[l_] = d_[l_] < 0 ? -d_[l_] : d_[l_];                    \
        EXP4(e_, -2.0 * a_);                                                                      \
        v4d t_ = (1.0 - e_) / (1.0 + e_);                                                         \
        for (int l_ = 0; l_ < 4; l_++)                                                            \
            if (xf_[l_] < 0) t_[l_] = -t_[l_];                                                    \
        (OUT) = __builtin_convertvector(t_, v4f);                                                 \
    } while (0)

void df_situ_n(const float *g, const float *u, size_t n, float b1, float b2, float *out)
{
    size_t i = 0;
    for (; i + 4 <= n; i += 4) {
        v4f g4, u4;
        memcpy(&g4, g + i, sizeof g4);
        memcpy(&u4, u + i, sizeof u4);
        v4f gb = g4 / b1, ub = u4 / b2;
        int ok = 1;
        for (int l = 0; l < 4; l++) {
            double a = fabs((double)gb[l]), b = fabs((double)ub[l]), c = (double)g4[l];
            ok &= a >= 1e-4 && a <= 20.0 && b >= 1e-4 && b <= 20.0 && c >= -708.0 && c <= 708.0;
        }
        if (!ok) {
            for (int l = 0; l < 4; l++) out[i + l] = df_situ(g[i + l], u[i + l], b1, b2);
            continue;
        }
        v4d eg, dg = __builtin_convertvector(g4, v4d);
        EXP4(eg, -dg);
        v4d sg = 1.0 / (1.0 + eg);
        v4f sig = __builtin_convertvector(sg, v4f), tg, tu;
        TANH4(tg, gb);
        TANH4(tu, ub);
        v4f gg = (tg * b1) * sig;
        v4f uu = tu * b2;
        v4f r = gg * uu;
        memcpy(out + i, &r, sizeof r);
    }
    for (; i < n; i++) out[i] = df_situ(g[i], u[i], b1, b2);
}

void rmsnorm(const float *x, const float *w, int n, float eps, float *y)
{
    double ss = 0.0;
    for (int i = 0; i < n; i++) ss += (double)x[i] * (double)x[i];
    float r = (float)(1.0 / sqrt(ss / n + (double)eps));
    for (int i = 0; i < n; i++) {
        float v = x[i] * r;
        y[i] = w ? w[i] * v : v;
    }
}

double l2norm(const float *x, int n)
{
    double ss = 0.0;
    for (int i = 0; i < n; i++) ss += (double)x[i] * (double)x[i];
    return sqrt(ss);
}

int df_topk(const float *v, int n, int k, int *ids)
{
    int m = 0;
    for (int i = 0; i < n; i++) {
        if (m == k && (!m || !(v[i] > v[ids[m - 1]]))) continue;
        int p = m < k ? m++ : m - 1;
        while (p > 0 && v[ids[p - 1]] < v[i]) {
            ids[p] = ids[p - 1];
            p--;
        }
        ids[p] = i;
    }
    return m;
}

void df_router_score(const float *logits, const float *bias, int n, float *sig, float *choice)
{
    for (int e = 0; e < n; e++) {
        float g = df_sigmoidf(logits[e]);
        if (sig) sig[e] = g;
        choice[e] = g + bias[e];
    }
}
