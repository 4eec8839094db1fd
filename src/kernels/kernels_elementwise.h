/* kernels_elementwise.h - the elementwise kernels of the table (kernels.h:
 * exp_n, sigmoid_n, silu_n, situ_n) written once, over a handful of vector
 * operations that each ISA file defines before including this header.
 *
 * Every lane runs exactly the double and float operations of mathfn.c's
 * scalar function (df_exp, df_sigmoidf, df_siluf, df_situ) in the same
 * order: multiply, then add, never fused (the files are compiled with
 * -ffp-contract=off and the operations are separate intrinsics); IEEE
 * division and the double -> float conversion round as the scalar code
 * does.  So a lane's result is the scalar result bit for bit.  Only groups
 * whose every lane takes the scalar code's main branch are done in vectors
 * (exp's argument in [-708, 708], where 2^k is a normal number; tanh's |x| in
 * [1e-4, 20]); any other group (zeros, tiny or huge values, inf, NaN) goes
 * through the scalar functions lane by lane, so the result cannot differ
 * there either.
 *
 * The including file defines, for W lanes (EW_W):
 *   ew_d, ew_f             W doubles, W floats
 *   EW_FN(name)            the ISA's function name (name##_avx2, ...)
 *   ew_loadf(p), ew_storef(p, v), ew_loadd(p), ew_stored(p, v)   unaligned
 *   ew_f2d(v), ew_d2f(v)   exact widening; rounding to nearest narrowing
 *   ew_setd(c), ew_setf(c)
 *   ew_addd, ew_subd, ew_muld, ew_divd, ew_mulf, ew_divf
 *   ew_absd(v)             |v| (the sign bit cleared)
 *   ew_neg_if_neg(t, d)    -t in the lanes where d < 0, t elsewhere
 *   ew_all_in(v, lo, hi)   whether every lane has lo <= v <= hi (NaN: no)
 *   ew_exp_main(v)         df_exp's main branch on every lane
 */
#ifndef EW_W
#error "define the ISA's vector operations before including kernels_elementwise.h"
#endif

#include "mathfn.h"

/* df_sigmoidf on lanes already widened to double, every lane in [-708, 708] */
ALWAYS_INLINE ew_d EW_FN(ew_sigmoid_d)(ew_d d)
{
    ew_d e = ew_exp_main(ew_muld(ew_setd(-1.0), d)); /* -(double)x, exactly */
    return ew_divd(ew_setd(1.0), ew_addd(ew_setd(1.0), e));
}

/* df_tanhf's main branch on lanes widened to double, every |lane| in [1e-4, 20] */
ALWAYS_INLINE ew_d EW_FN(ew_tanh_d)(ew_d d)
{
    ew_d e = ew_exp_main(ew_muld(ew_setd(-2.0), ew_absd(d)));
    ew_d t = ew_divd(ew_subd(ew_setd(1.0), e), ew_addd(ew_setd(1.0), e));
    return ew_neg_if_neg(t, d);
}

static void EW_FN(exp_n)(const double *x, double *y, size_t n)
{
    size_t i = 0;
    for (; i + EW_W <= n; i += EW_W) {
        ew_d v = ew_loadd(x + i);
        if (__builtin_expect(ew_all_in(v, -708.0, 708.0), 1)) {
            ew_stored(y + i, ew_exp_main(v));
        } else {
            for (int l = 0; l < EW_W; l++) y[i + l] = df_exp(x[i + l]);
        }
    }
    for (; i < n; i++) y[i] = df_exp(x[i]);
}

static void EW_FN(sigmoid_n)(const float *x, size_t n, float *y)
{
    size_t i = 0;
    for (; i + EW_W <= n; i += EW_W) {
        ew_d d = ew_f2d(ew_loadf(x + i));
        if (__builtin_expect(ew_all_in(d, -708.0, 708.0), 1)) {
            ew_storef(y + i, ew_d2f(EW_FN(ew_sigmoid_d)(d)));
        } else {
            for (int l = 0; l < EW_W; l++) y[i + l] = df_sigmoidf(x[i + l]);
        }
    }
    for (; i < n; i++) y[i] = df_sigmoidf(x[i]);
}

static void EW_FN(silu_n)(const float *x, size_t n, float *y)
{
    size_t i = 0;
    for (; i + EW_W <= n; i += EW_W) {
        ew_f xf = ew_loadf(x + i);
        ew_d d = ew_f2d(xf);
        if (__builtin_expect(ew_all_in(d, -708.0, 708.0), 1)) {
            ew_storef(y + i, ew_mulf(xf, ew_d2f(EW_FN(ew_sigmoid_d)(d))));
        } else {
            for (int l = 0; l < EW_W; l++) y[i + l] = df_siluf(x[i + l]);
        }
    }
    for (; i < n; i++) y[i] = df_siluf(x[i]);
}

static void EW_FN(situ_n)(const float *g, const float *u, size_t n, float b1, float b2, float *out)
{
    size_t i = 0;
    const ew_f vb1 = ew_setf(b1), vb2 = ew_setf(b2);
    for (; i + EW_W <= n; i += EW_W) {
        ew_f gf = ew_loadf(g + i), uf = ew_loadf(u + i);
        ew_d dgb = ew_f2d(ew_divf(gf, vb1)), dub = ew_f2d(ew_divf(uf, vb2)), dg = ew_f2d(gf);
        if (__builtin_expect(ew_all_in(ew_absd(dgb), 1e-4, 20.0) && ew_all_in(ew_absd(dub), 1e-4, 20.0) &&
                                 ew_all_in(dg, -708.0, 708.0),
                             1)) {
            ew_f sig = ew_d2f(EW_FN(ew_sigmoid_d)(dg));
            ew_f tg = ew_d2f(EW_FN(ew_tanh_d)(dgb)), tu = ew_d2f(EW_FN(ew_tanh_d)(dub));
            ew_f gg = ew_mulf(ew_mulf(tg, vb1), sig), uu = ew_mulf(tu, vb2);
            ew_storef(out + i, ew_mulf(gg, uu));
        } else {
            for (int l = 0; l < EW_W; l++) out[i + l] = df_situ(g[i + l], u[i + l], b1, b2);
        }
    }
    for (; i < n; i++) out[i] = df_situ(g[i], u[i], b1, b2);
}
