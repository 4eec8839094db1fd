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
