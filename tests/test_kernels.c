/* test_kernels.c - every kernel set against the scalar reference, bit for
 * bit, on random data with awkward shapes (column tails, odd position
 * counts, partial row ranges, unaligned weight pointers); the reference
 * against a float64 dot product; the format tables; and the project's own
 * exp / tanh / sigmoid against libm.
 */
#include "harness.h"
#include "backend_cpu.h"
#include "kernels.h"
#include "qblock.h"
#include "mathfn.h"
#include "quant.h"

#include <dlfcn.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint32_t rnd(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 16);
}
static float rndf(void) { return ((float)(rnd() & 0xFFFFFF) / 16777216.0f - 0.5f) * 4.0f; }

typedef void (*dense_fn)(const void *, size_t, int, const float *, size_t, int, float *, size_t, int, int);

static void check_dense(const char *isa, int esize, dense_fn ref, dense_fn fn)
{
    const int Cs[] = {16, 32, 40, 17, 5, 64, 96, 1000};
    for (size_t ci = 0; ci < sizeof Cs / sizeof Cs[0]; ci++) {
        int C = Cs[ci], R = C <= 96 ? 77 : 13, T = 7; /* 75 rows: the decode kernels' quarters */
        uint8_t *wbuf = malloc((size_t)R * C * esize + 3);
        uint8_t *W = wbuf + 1; /* unaligned on purpose */
        for (int i = 0; i < R * C; i++) {
            if (esize == 2) {
                float f = rndf();
                uint32_t u;
                memcpy(&u, &f, 4);
                uint16_t b = (uint16_t)(u >> 16);
                memcpy(W + 2 * i, &b, 2);
            } else {
                float f = rndf();
                memcpy(W + 4 * i, &f, 4);
            }
        }
        size_t xs = (size_t)C + 3;
        float *x = malloc((size_t)T * xs * sizeof(float));
        for (size_t i = 0; i < (size_t)T * xs; i++) x[i] = rndf();
        float *y0 = calloc((size_t)T * R, sizeof(float)), *y1 = calloc((size_t)T * R, sizeof(float));
        for (int t = 1; t <= T; t += 2) {
            ref(W, (size_t)C, C, x, xs, t, y0, (size_t)R, 2, R);
            if (!fn) continue; /* the reference alone: only the float64 check below */
            fn(W, (size_t)C, C, x, xs, t, y1, (size_t)R, 2, R);
            TCHECKF(!memcmp(y0, y1, (size_t)T * R * sizeof(float)), "%s dense esize %d C=%d T=%d: not bit-identical",
                    isa, esize, C, t);
        }
        /* reference vs float64 */
        double worst = 0;
        for (int r = 2; r < R; r++) {
            double d = 0, mag = 0;
            for (int c = 0; c < C; c++) {
                double w = esize == 2 ? load_bf16(W, (size_t)r * C + c) : load_f32(W, (size_t)r * C + c);
                d += w * x[c];
                mag += fabs(w * x[c]);
            }
            double e = fabs(d - y0[r]) / (mag + 1e-30);
            if (e > worst) worst = e;
        }
        TCHECKF(worst < 1e-5, "%s reference dot vs float64: relative error %g", isa, worst);
        free(wbuf);
        free(x);
        free(y0);
        free(y1);
    }
}

/* F16 and Q8_0 weights: the ISA's kernel equals the reference bit for bit,
 * and both equal matmul_f32 on the stored values (the dense order over the
 * dequantized matrix): a quantized matrix is exactly its F32 copy. */
static void check_f16_q8(const char *isa, const kernel_table *ref, const kernel_table *kt)
{
    const int Cs[] = {32, 64, 96, 17, 5, 1024};
    for (size_t ci = 0; ci < sizeof Cs / sizeof Cs[0]; ci++) {
        int C = Cs[ci], R = C <= 96 ? 75 : 9, T = 7, q8 = C % 32 == 0; /* 74 rows: the decode kernels' quarters */
        size_t rb16 = (size_t)C * 2, rb8 = (size_t)C / 32 * 34;
        uint8_t *H = malloc((size_t)R * rb16 + 1), *Q = malloc((size_t)R * rb8 + 1);
        float *F16v = malloc((size_t)R * C * sizeof(float)), *Q8v = malloc((size_t)R * C * sizeof(float));
        for (int i = 0; i < R * C; i++) {
            /* every class of half: normal, subnormal (exponent 0), zeros of both signs */
            uint16_t h = (uint16_t)rnd();
            if ((h & 0x7c00) == 0x7c00) h ^= 0x4000; /* no infinities or NaNs in a weight */
            if (i % 97 == 3) h = 0x8000;
            memcpy(H + 2 * (size_t)i, &h, 2);
        }
        for (int b = 0; b < R * C / 32 && q8; b++) {
            uint16_t d = (uint16_t)(rnd() & 0x3fff); /* positive scales, subnormal ones included */
            if (b % 5 == 1) d |= 0x8000;             /* and negative */
            if (b % 11 == 4) d = 0;
            memcpy(Q + (size_t)b * 34, &d, 2);
            for (int j = 0; j < 32; j++) Q[(size_t)b * 34 + 2 + j] = (uint8_t)rnd();
            Q[(size_t)b * 34 + 2] = 0x80; /* -128 */
        }
        for (int r = 0; r < R; r++) {
            wmat wh = {.type = W_F16, .cols = C}, wq = {.type = W_Q8_0, .cols = C};
            wmat_row_f32(&wh, H + (size_t)r * rb16, C, F16v + (size_t)r * C);
            if (q8) wmat_row_f32(&wq, Q + (size_t)r * rb8, C, Q8v + (size_t)r * C);
        }
        size_t xs = (size_t)C + 5;
        float *x = malloc((size_t)T * xs * sizeof(float));
        for (size_t i = 0; i < (size_t)T * xs; i++) x[i] = rndf();
        float *y0 = calloc((size_t)T * R, sizeof(float)), *y1 = calloc((size_t)T * R, sizeof(float)),
              *yf = calloc((size_t)T * R, sizeof(float));
        for (int t = 1; t <= T; t += 3) {
            ref->matmul_f32(F16v, (size_t)C, C, x, xs, t, yf, (size_t)R, 1, R);
            ref->matmul_f16(H, (size_t)C, C, x, xs, t, y0, (size_t)R, 1, R);
            kt->matmul_f16(H, (size_t)C, C, x, xs, t, y1, (size_t)R, 1, R);
            TCHECKF(!memcmp(y0, yf, (size_t)T * R * 4), "ref f16 C=%d T=%d: not matmul_f32 of its values", C, t);
            TCHECKF(!memcmp(y0, y1, (size_t)T * R * 4), "%s f16 C=%d T=%d: not bit-identical", isa, C, t);
            if (!q8) continue;
            ref->matmul_f32(Q8v, (size_t)C, C, x, xs, t, yf, (size_t)R, 1, R);
            ref->matmul_q8_0(Q, NULL, C, x, xs, t, y0, (size_t)R, 1, R);
            kt->matmul_q8_0(Q, NULL, C, x, xs, t, y1, (size_t)R, 1, R);
            TCHECKF(!memcmp(y0, yf, (size_t)T * R * 4), "ref q8_0 C=%d T=%d: not matmul_f32 of its values", C, t);
            TCHECKF(!memcmp(y0, y1, (size_t)T * R * 4), "%s q8_0 C=%d T=%d: not bit-identical", isa, C, t);
        }
        free(H), free(Q), free(F16v), free(Q8v), free(x), free(y0), free(y1), free(yf);
    }
}

/* the block formats of qblock.h, with the byte offsets of their F16 scales */
static const struct {
    uint32_t type;
    const char *sym; /* ggml's dequantize_row_<type> */
    int halves[2];   /* -1: none */
} qformats[] = {
    {8, "dequantize_row_q8_0", {0, -1}},  {2, "dequantize_row_q4_0", {0, -1}},  {3, "dequantize_row_q4_1", {0, 2}},
    {6, "dequantize_row_q5_0", {0, -1}},  {7, "dequantize_row_q5_1", {0, 2}},   {20, "dequantize_row_iq4_nl", {0, -1}},
    {10, "dequantize_row_q2_K", {80, 82}}, {11, "dequantize_row_q3_K", {108, -1}}, {12, "dequantize_row_q4_K", {0, 2}},
    {13, "dequantize_row_q5_K", {0, 2}},  {14, "dequantize_row_q6_K", {208, -1}},
};
#define N_QFORMATS ((int)(sizeof qformats / sizeof qformats[0]))

/* n random blocks of format i, their F16 scales finite (half of them tiny or subnormal) */
static void random_blocks(int i, const qblock_fmt *f, uint8_t *b, int n)
{
    for (int k = 0; k < n * f->bytes; k++) b[k] = (uint8_t)rnd();
    for (int k = 0; k < n; k++)
        for (int h = 0; h < 2; h++) {
            int at = qformats[i].halves[h];
            if (at < 0) continue;
            uint16_t v = (uint16_t)rnd();
            if ((v & 0x7c00) == 0x7c00) v &= 0x83ff;           /* no inf / NaN: subnormal instead */
            if (k % 3 == 1) v = (uint16_t)(v & 0x87ff);       /* small */
            memcpy(b + (size_t)k * f->bytes + at, &v, 2);
        }
}

/* ggml's own dequantization, from the llama.cpp the oracle runs (the npm
 * prebuilt's libggml-base.so), against qblock.c's: every format, bit for bit */
static void test_qblock_vs_ggml(void)
{
    char path[700];
    snprintf(path, sizeof path,
             "%s/../tests/llama/node_modules/@node-llama-cpp/linux-x64/bins/linux-x64/libggml-base.so", testdata_dir());
    void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!lib) TSKIP("ggml is not installed (npm ci --prefix tests/llama): only the kernels are checked, not the "
                    "values against ggml's");
    int checked = 0;
    for (int i = 0; i < N_QFORMATS; i++) {
        const qblock_fmt *f = qblock_fmt_of_ggml(qformats[i].type);
        void (*deq)(const void *, float *, int64_t) = (void (*)(const void *, float *, int64_t))dlsym(lib, qformats[i].sym);
        TCHECKF(f && deq, "%s: format or symbol missing", qformats[i].sym);
        if (!f || !deq) continue;
        enum { NB = 64 };
        uint8_t *b = malloc((size_t)NB * f->bytes);
        float *want = malloc((size_t)NB * f->block * sizeof(float)), *got = malloc((size_t)NB * f->block * sizeof(float));
        for (int rep = 0; rep < 20; rep++) {
            random_blocks(i, f, b, NB);
            deq(b, want, (int64_t)NB * f->block);
            for (int k = 0; k < NB; k++) f->decode(b + (size_t)k * f->bytes, got + (size_t)k * f->block);
            int bad = 0;
            for (int k = 0; k < NB * f->block; k++) bad += memcmp(&want[k], &got[k], 4) != 0;
            if (bad) {
                int k = 0;
                while (!memcmp(&want[k], &got[k], 4)) k++;
                t_fail(__FILE__, __LINE__, "%s: %d of %d values differ from ggml's (value %d: %.9g vs %.9g)", f->name,
                       bad, NB * f->block, k, want[k], got[k]);
                break;
            }
        }
        checked++;
        free(b), free(want), free(got);
    }
    printf("    %d block formats equal ggml's dequantization, bit for bit\n", checked);
    dlclose(lib);
}

/* every block format's kernel: the ISA's equals the reference bit for bit,
 * and both equal matmul_f32 over the decoded values */
static void check_qblock(const char *isa, const kernel_table *ref, const kernel_table *kt)
{
    for (int i = 0; i < N_QFORMATS; i++) {
        const qblock_fmt *f = qblock_fmt_of_ggml(qformats[i].type);
        int R = 5, T = 22, C = f->block == 256 ? 512 : 96;
        int nbr = C / f->block;
        uint8_t *W = malloc((size_t)R * nbr * f->bytes);
        random_blocks(i, f, W, R * nbr);
        float *V = malloc((size_t)R * C * sizeof(float));
        wmat w = {.type = W_QB, .qb = f, .rows = R, .cols = C};
        for (int r = 0; r < R; r++) wmat_row_f32(&w, W + (size_t)r * nbr * f->bytes, C, V + (size_t)r * C);
        size_t xs = (size_t)C + 3;
        float *x = malloc((size_t)T * xs * sizeof(float));
        for (size_t k = 0; k < (size_t)T * xs; k++) x[k] = rndf();
        float *y0 = calloc((size_t)T * R, 4), *y1 = calloc((size_t)T * R, 4), *yf = calloc((size_t)T * R, 4);
        for (int t = 1; t <= T; t += 4) {
            ref->matmul_f32(V, (size_t)C, C, x, xs, t, yf, (size_t)R, 0, R);
            ref->matmul_qblock(f, W, C, x, xs, t, y0, (size_t)R, 0, R);
            kt->matmul_qblock(f, W, C, x, xs, t, y1, (size_t)R, 0, R);
            TCHECKF(!memcmp(y0, yf, (size_t)T * R * 4), "ref %s T=%d: not matmul_f32 of its values", f->name, t);
            TCHECKF(!memcmp(y0, y1, (size_t)T * R * 4), "%s %s T=%d: not bit-identical", isa, f->name, t);
        }
        free(W), free(V), free(x), free(y0), free(y1), free(yf);
    }
}

static void check_mxfp4(const char *isa, const kernel_table *ref, const kernel_table *kt)
{
    quant_init(); /* the scale table: tests may run alone */
    const int Cs[] = {32, 64, 96, 3584 / 8};
    for (size_t ci = 0; ci < sizeof Cs / sizeof Cs[0]; ci++) {
        int C = Cs[ci], R = 11, T = 9;
        uint8_t *P = malloc((size_t)R * C / 2 + 1), *S = malloc((size_t)R * C / 32 + 1);
        for (int i = 0; i < R * C / 2; i++) P[i] = (uint8_t)rnd();
        for (int i = 0; i < R * C / 32; i++) S[i] = (uint8_t)(100 + rnd() % 50);
        S[0] = 0;   /* 2^-127: subnormal scale */
        S[1] = 254; /* 2^127 */
        float *x = malloc((size_t)T * C * sizeof(float)), *xp = malloc((size_t)T * C * sizeof(float));
        for (int i = 0; i < T * C; i++) x[i] = rndf() * 1e-3f;
        for (int t = 0; t < T; t++) mxfp4_prep_x(x + (size_t)t * C, C, xp + (size_t)t * C);
        float *y0 = calloc((size_t)T * R, sizeof(float)), *y1 = calloc((size_t)T * R, sizeof(float));
        /* the same matrix as ggml blocks (scale, then byte j = value j low,
         * value j + 16 high), written here from the definition */
        size_t nb = (size_t)R * C / 32;
        uint8_t *G = malloc(nb * 17), *P2 = malloc(nb * 16), *S2 = malloc(nb);
        for (size_t b = 0; b < nb; b++) {
            G[b * 17] = S[b];
            for (int j = 0; j < 16; j++) {
                int lo = j, hi = j + 16; /* values j and j + 16 of the block, packed as 2m / 2m+1 */
                uint8_t vlo = (uint8_t)((P[b * 16 + lo / 2] >> (4 * (lo & 1))) & 15);
                uint8_t vhi = (uint8_t)((P[b * 16 + hi / 2] >> (4 * (hi & 1))) & 15);
                G[b * 17 + 1 + j] = (uint8_t)(vlo | vhi << 4);
            }
        }
        mxfp4_from_ggml(G, R, C, P2, S2);
        TCHECKF(!memcmp(P, P2, nb * 16) && !memcmp(S, S2, nb), "mxfp4_from_ggml C=%d: not the packed layout", C);
        for (int t = 1; t <= T; t += 4) {
            ref->matmul_mxfp4(P, S, C, xp, (size_t)C, t, y0, (size_t)R, 1, R);
            if (kt != ref) {
                kt->matmul_mxfp4(P, S, C, xp, (size_t)C, t, y1, (size_t)R, 1, R);
                TCHECKF(!memcmp(y0, y1, (size_t)T * R * sizeof(float)), "%s mxfp4 C=%d T=%d: not bit-identical", isa,
                        C, t);
            }
            /* the ggml-block driver is a different function, also for the reference */
            memset(y1, 0, (size_t)T * R * sizeof(float));
            kt->matmul_mxfp4_gg(G, NULL, C, xp, (size_t)C, t, y1, (size_t)R, 1, R);
            TCHECKF(!memcmp(y0, y1, (size_t)T * R * sizeof(float)), "%s mxfp4 ggml blocks C=%d T=%d: not bit-identical",
                    isa, C, t);
        }
        free(G);
        free(P2);
        free(S2);
        double worst = 0;
        for (int r = 2; r < R; r++) {
            double d = 0, mag = 0;
            for (int c = 0; c < C; c++) {
                double w = mxfp4_value(P + (size_t)r * C / 2, S + (size_t)r * C / 32, (size_t)c);
                d += w * x[c];
                mag += fabs(w * x[c]);
            }
            double e = fabs(d - y0[r]) / (mag + 1e-30);
            if (e > worst) worst = e;
        }
        TCHECKF(worst < 1e-5, "%s mxfp4 reference vs float64: relative error %g", isa, worst);
        free(P);
        free(S);
        free(x);
        free(xp);
        free(y0);
        free(y1);
    }
}

typedef void (*mla_fn)(const float *, size_t, int, int, int, const float *, size_t, const float *, size_t, int, float,
                       float *, float *);

/* mla_attend against the reference bit for bit (fn NULL: the reference
 * against a float64 softmax), over shapes with every kind of tail: head
 * counts around the vector widths (1 .. 17, 31, MLA_NH_MAX), positions
 * around the blocks (1 .. 9, 17, 100, 300), odd Rkv / dr (tails of the
 * column chunks and of the 16 ctx columns, a chunk straddling lat and
 * rope), padded cache rows and query strides, ctx written over the
 * queries, and scales that push exp's argument outside its vector range
 * (the scalar df_exp lanes, subnormal and zero weights).  The cache sits
 * against an unreadable page. */
static void check_mla(const char *isa, mla_fn ref, mla_fn fn)
{
    static const int shapes[][3] = {{8, 4, 0}, {16, 8, 0}, {64, 32, 0}, {5, 3, 0}, {1, 1, 0}, {17, 9, 3},
                                    {33, 0, 0}, {40, 24, 1}, {128, 64, 0}, {24, 7, 2}, {70, 61, 0}};
    static const int nhs[] = {1, 2, 3, 4, 5, 7, 8, 9, 12, 13, 16, 17, 31, MLA_NH_MAX};
    static const int ns[] = {1, 2, 3, 5, 8, 9, 17, 100, 300};
    static const float scales[] = {0.25f, 1.0f, 400.0f};
    int bad = 0, cases = 0;
    double worst = 0;
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        int Rkv = shapes[si][0], dr = shapes[si][1], pad = shapes[si][2];
        size_t row_w = (size_t)Rkv + (size_t)dr + (size_t)pad, qrs = (size_t)dr + (size_t)pad;
        for (size_t hi = 0; hi < sizeof nhs / sizeof nhs[0]; hi++) {
            int nh = nhs[hi];
            size_t nl = (size_t)nh * Rkv, nr = (size_t)nh * qrs + 1;
            float *ql = malloc(nl * sizeof(float)), *qr = malloc(nr * sizeof(float)), *q2 = malloc(nl * sizeof(float));
            float *c0 = malloc(nl * sizeof(float)), *c1 = malloc(nl * sizeof(float));
            float *sc = malloc((size_t)300 * nh * sizeof(float)), *sc2 = malloc((size_t)300 * nh * sizeof(float));
            for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++) {
                int n = ns[ni];
                if ((hi + ni + si) % 3 && n > 17 && nh > 5) continue; /* a third of the long ones: time */
                size_t cn = (size_t)n * row_w;
                if (cn * sizeof(float) > (256u << 10)) continue;
                float *cb = malloc(cn * sizeof(float));
                for (size_t i = 0; i < cn; i++) cb[i] = rndf();
                const float *cache = (const float *)guard_place(cb, cn * sizeof(float));
                for (size_t k = 0; k < sizeof scales / sizeof scales[0]; k++) {
                    float scale = scales[k];
                    for (size_t i = 0; i < nl; i++) ql[i] = rndf();
                    for (size_t i = 0; i < nr; i++) qr[i] = rndf();
                    ref(cache, row_w, Rkv, dr, n, ql, (size_t)Rkv, qr, qrs, nh, scale, sc, c0);
                    cases++;
                    if (!fn) {
                        /* float64 softmax-weighted sums; at scale 400 the float
                         * scores' own rounding (~1e-3 of ~8000) moves the weights */
                        if (scale > 1.0f) continue;
                        for (int h = 0; h < nh; h++) {
                            double *s = malloc((size_t)n * sizeof(double)), mx = -INFINITY, sum = 0;
                            for (int p = 0; p < n; p++) {
                                double a = 0;
                                for (int j = 0; j < Rkv + dr; j++)
                                    a += (double)(j < Rkv ? ql[(size_t)h * Rkv + j] : qr[(size_t)h * qrs + j - Rkv]) *
                                         cache[(size_t)p * row_w + j];
                                s[p] = a * scale;
                                if (s[p] > mx) mx = s[p];
                            }
                            for (int p = 0; p < n; p++) sum += s[p] = exp(s[p] - mx);
                            for (int j = 0; j < Rkv; j++) {
                                double want = 0;
                                for (int p = 0; p < n; p++) want += s[p] / sum * cache[(size_t)p * row_w + j];
                                double e = fabs(want - c0[(size_t)h * Rkv + j]);
                                if (e > worst) worst = e;
                            }
                            free(s);
                        }
                        continue;
                    }
                    fn(cache, row_w, Rkv, dr, n, ql, (size_t)Rkv, qr, qrs, nh, scale, sc2, c1);
                    /* the weights left in sc (attention dumps read them) */
                    if (memcmp(sc, sc2, (size_t)n * nh * sizeof(float)) && bad++ < 5)
                        t_fail(__FILE__, __LINE__, "%s mla Rkv=%d dr=%d nh=%d n=%d scale=%g: the weights in sc differ",
                               isa, Rkv, dr, nh, n, scale);
                    if (memcmp(c0, c1, nl * sizeof(float)) && bad++ < 5)
                        t_fail(__FILE__, __LINE__, "%s mla Rkv=%d dr=%d row_w=%zu nh=%d n=%d scale=%g: %s", isa,
                               Rkv, dr, row_w, nh, n, scale, "not bit-identical");
                    /* ctx written over the queries (mla.c's layout) */
                    memcpy(q2, ql, nl * sizeof(float));
                    fn(cache, row_w, Rkv, dr, n, q2, (size_t)Rkv, qr, qrs, nh, scale, sc, q2);
                    if (memcmp(c0, q2, nl * sizeof(float)) && bad++ < 5)
                        t_fail(__FILE__, __LINE__, "%s mla Rkv=%d dr=%d nh=%d n=%d: ctx over q differs", isa, Rkv, dr,
                               nh, n);
                }
                free(cb);
            }
            free(ql);
            free(qr);
            free(q2);
            free(c0);
            free(c1);
            free(sc);
            free(sc2);
        }
    }
    if (!fn) {
        fprintf(stderr, "    mla reference vs float64: %d cases, worst abs error %.3g\n", cases, worst);
        TCHECKF(worst < 1e-5, "mla reference vs float64: abs error %g", worst);
    } else {
        fprintf(stderr, "    %s mla: %d cases\n", isa, cases);
    }
}

/* exp_n against df_exp bit for bit in double: a million arguments over
 * [-720, 720] at every scale, the edges of the vector range and of df_exp's
 * branches, and groups mixing those with ordinary lanes */
static void check_exp(const char *isa, const kernel_table *kt)
{
    enum { N = 1 << 20 };
    double *x = malloc(N * sizeof(double)), *y0 = malloc(N * sizeof(double)), *y1 = malloc(N * sizeof(double));
    static const double odd[] = {0.0, -0.0, -708.0, -708.0000001, 708.0, 708.0000001, 709.0, 709.5, -745.0, -745.1,
                                 -1e300, 1e-310, -1e-300, INFINITY, -INFINITY, NAN, -1021.5 * 0.6931471805599453};
    for (int i = 0; i < N; i++) {
        double u = ((double)rnd() / 4294967296.0 + (double)rnd() / 18446744073709551616.0) * 2.0 - 1.0;
        x[i] = u * ldexp(1.0, (int)(rnd() % 20) - 10) * (i % 3 ? 1.0 : 700.0);
        if (i % 97 == 0) x[i] = odd[(i / 97) % (sizeof odd / sizeof odd[0])];
    }
    for (int i = 0; i < N; i++) y0[i] = df_exp(x[i]);
    for (int off = 0; off < 3; off++) kt->exp_n(x + off, y1 + off, (size_t)(N - off));
    int bad = 0;
    for (int i = 0; i < N; i++) bad += memcmp(&y0[i], &y1[i], sizeof(double)) != 0;
    TCHECKF(bad == 0, "%s exp_n: %d of %d values differ from df_exp", isa, bad, N);
    free(x);
    free(y0);
    free(y1);
}

/* The table's elementwise functions against mathfn.c's scalar ones, bit for
 * bit: values over every magnitude, dense around the activations' range,
 * the edges of each branch (1e-4 and 20 for tanh, +-708 for exp), zeros,
 * subnormals, inf and NaN mixed into groups of ordinary lanes; every start
 * offset (tails and unaligned groups) and in place. */
/* The KDA delta rule's two passes against the reference bit for bit: S,
 * pred and o, over head sizes around every ISA's block widths (4, 8, 16
 * lanes, blocks of four vectors), with decays and gates near 0 and 1,
 * zeros, negative values, subnormal products and infinities in S. */
static void check_kda(const char *isa, const kernel_table *kt)
{
    static const int dks[] = {1, 3, 4, 5, 8, 15, 16, 17, 31, 32, 33, 63, 64, 65, 100, 128, 129};
    const kernel_table *ref = kernels_ref();
    int bad = 0, cases = 0;
    for (size_t di = 0; di < sizeof dks / sizeof dks[0]; di++) {
        int Dk = dks[di];
        size_t nS = (size_t)Dk * Dk;
        float *S0 = malloc(nS * sizeof(float)), *S1 = malloc(nS * sizeof(float));
        float *dec = malloc((size_t)Dk * 4), *k = malloc((size_t)Dk * 4), *p = malloc((size_t)Dk * 4);
        float *a0 = malloc((size_t)Dk * 4), *a1 = malloc((size_t)Dk * 4);
        for (int rep = 0; rep < 3; rep++) {
            for (size_t i = 0; i < nS; i++) S0[i] = rndf();
            if (rep == 2) S0[nS / 2] = INFINITY, S0[nS - 1] = 1e-38f, S0[0] = -0.0f;
            for (int i = 0; i < Dk; i++) {
                dec[i] = rep == 1 ? (i % 2 ? 0.999999f : 1e-30f) : (float)(rnd() & 0xFFFF) / 65536.0f;
                k[i] = rndf(), p[i] = rndf();
                a0[i] = rep ? rndf() : 0.0f;
            }
            for (int pass = 0; pass < 2; pass++) {
                memcpy(S1, S0, nS * sizeof(float));
                memcpy(a1, a0, (size_t)Dk * 4);
                float *r0 = malloc(nS * sizeof(float)), *o0 = malloc((size_t)Dk * 4);
                memcpy(r0, S0, nS * sizeof(float));
                memcpy(o0, a0, (size_t)Dk * 4);
                if (pass == 0) {
                    ref->kda_decay_pred(r0, Dk, dec, k, o0);
                    kt->kda_decay_pred(S1, Dk, dec, k, a1);
                } else {
                    ref->kda_update_out(r0, Dk, dec, p, k, o0);
                    kt->kda_update_out(S1, Dk, dec, p, k, a1);
                }
                cases++;
                if ((memcmp(r0, S1, nS * sizeof(float)) || memcmp(o0, a1, (size_t)Dk * 4)) && bad++ < 5)
                    t_fail(__FILE__, __LINE__, "%s kda %s Dk=%d rep %d: not bit-identical", isa,
                           pass ? "update_out" : "decay_pred", Dk, rep);
                free(r0);
                free(o0);
            }
        }
        free(S0), free(S1), free(dec), free(k), free(p), free(a0), free(a1);
    }
    fprintf(stderr, "    %s kda: %d cases\n", isa, cases);
}

static void check_elementwise(const char *isa, const kernel_table *kt)
{
    enum { N = 40003 };
    float *gv = malloc(N * sizeof(float)), *uv = malloc(N * sizeof(float)), *o = malloc(N * sizeof(float));
    float *w = malloc(N * sizeof(float));
    static const float odd[] = {0.0f,    -0.0f,   1e-6f,    -3e-5f,   90.0f,   -95.0f, 1e4f,      -2e3f,
                                800.0f,  -750.0f, 1e30f,    708.0f,   -708.0f, 708.1f, -708.01f,  709.5f,
                                -746.0f, 1e-40f,  -1e-42f,  2e-4f,    -2e-4f,  20.0f,  -20.0f,    20.01f,
                                1e-4f,   -1e-4f,  9.99e-5f, 30.0f,    -60.0f,  5e3f,   -1.5e-45f, 3.4e38f};
    const int nodd = (int)(sizeof odd / sizeof odd[0]);
    for (int i = 0; i < N; i++) {
        /* mostly activations in the vector range (|g| <= 16, |u| <= 8), so
         * most groups run in vectors; sparse odd values and bit patterns */
        gv[i] = rndf() * (float)(1 << (i % 4)) * 2.0f;
        uv[i] = rndf() * (float)(1 << (i % 3));
        if (i % 101 == 0) {
            uint32_t b = rnd(); /* any bit pattern: every exponent */
            memcpy(&gv[i], &b, 4);
            b = rnd();
            memcpy(&uv[i], &b, 4);
        }
        if (i % 137 == 0) gv[i] = odd[(i / 137) % nodd];
        if (i % 139 == 0) uv[i] = odd[(i / 139) % nodd];
    }
    gv[5] = INFINITY, uv[9] = -INFINITY, gv[13] = NAN, uv[17] = -NAN;
    int bad_sig = 0, bad_silu = 0, bad_situ = 0;
    for (int off = 0; off < 9; off++) {
        size_t n = (size_t)(N - off);
        kt->sigmoid_n(gv + off, n, o + off);
        for (int i = off; i < N; i++) {
            float want = df_sigmoidf(gv[i]);
            bad_sig += memcmp(&want, &o[i], 4) != 0;
        }
        memcpy(w, gv, N * sizeof(float));
        kt->silu_n(w + off, n, w + off); /* in place */
        for (int i = off; i < N; i++) {
            float want = df_siluf(gv[i]);
            bad_silu += memcmp(&want, &w[i], 4) != 0;
        }
        for (int b1i = 0; b1i < 2; b1i++) {
            float b1 = b1i ? 4.0f : 1.5f, b2 = b1i ? 25.0f : 0.75f;
            memcpy(w, gv, N * sizeof(float));
            kt->situ_n(w + off, uv + off, n, b1, b2, w + off); /* out = g */
            for (int i = off; i < N; i++) {
                float want = df_situ(gv[i], uv[i], b1, b2);
                bad_situ += memcmp(&want, &w[i], 4) != 0;
            }
        }
    }
    TCHECKF(bad_sig == 0 && bad_silu == 0 && bad_situ == 0,
            "%s elementwise: %d sigmoid, %d silu, %d situ values differ from mathfn.c's", isa, bad_sig, bad_silu,
            bad_situ);
    free(gv);
    free(uv);
    free(o);
    free(w);
}

static void test_isa(enum kernel_isa isa, const kernel_table *kt, const char *name)
{
    if (!kt) TSKIP("%s not compiled in", name);
    if (!kernels_cpu_has(isa)) TSKIP("%s not supported by this CPU", name);
    const kernel_table *ref = kernels_ref();
    check_dense(name, 2, ref->matmul_bf16, kt->matmul_bf16);
    check_dense(name, 4, ref->matmul_f32, kt->matmul_f32);
    check_mxfp4(name, ref, kt);
    check_f16_q8(name, ref, kt);
    check_qblock(name, ref, kt);
    check_mla(name, ref->mla_attend, kt->mla_attend);
    check_exp(name, kt);
    check_elementwise(name, kt);
    check_kda(name, kt);
}

#ifdef DF_TEST_SIMDE
const kernel_table *kernels_avx512_simde(void);
/* kernels_avx512.c compiled over SIMDe: its logic checked on any CPU */
static void test_avx512_simde(void)
{
    const kernel_table *ref = kernels_ref(), *kt = kernels_avx512_simde();
    check_dense("avx512 (SIMDe)", 2, ref->matmul_bf16, kt->matmul_bf16);
    check_dense("avx512 (SIMDe)", 4, ref->matmul_f32, kt->matmul_f32);
    check_mxfp4("avx512 (SIMDe)", ref, kt);
    check_f16_q8("avx512 (SIMDe)", ref, kt);
    check_qblock("avx512 (SIMDe)", ref, kt);
    check_mla("avx512 (SIMDe)", ref->mla_attend, kt->mla_attend);
    check_exp("avx512 (SIMDe)", kt);
    check_elementwise("avx512 (SIMDe)", kt);
    check_kda("avx512 (SIMDe)", kt);
}
#else
static void test_avx512_simde(void) { t_skip("built without SIMDe (libsimde-dev)"); }
#endif

/* The reference is the specification: it is checked against float64 dot
 * products (and its ggml-block driver against its packed one), never
 * against itself. */
static void test_ref_vs_float64(void)
{
    const kernel_table *ref = kernels_ref();
    check_dense("ref", 2, ref->matmul_bf16, NULL);
    check_dense("ref", 4, ref->matmul_f32, NULL);
    check_mxfp4("ref", ref, ref);
    check_mla("ref", ref->mla_attend, NULL);
    check_exp("ref", ref);
    check_elementwise("ref", ref);
}
static void test_avx2(void) { test_isa(KERNEL_AVX2, kernels_avx2(), "avx2"); }
static void test_avx512(void) { test_isa(KERNEL_AVX512, kernels_avx512(), "avx512"); }
/* AArch64 only (on x86-64 machines: `make qemu-check` runs this file's
 * aarch64 build under qemu-aarch64) */
static void test_neon(void) { test_isa(KERNEL_NEON, kernels_neon(), "neon"); }

static void test_formats(void)
{
    quant_init();
    static const float want[16] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6, -0.0f, -0.5f, -1, -1.5f, -2, -3, -4, -6};
    TCHECK(!memcmp(e2m1_table, want, sizeof want));
    TCHECK(e8m0_table[127] == 1.0f && e8m0_table[128] == 2.0f && e8m0_table[100] == ldexpf(1, -27));
    TCHECK(e8m0_table[0] == ldexpf(1, -127) && e8m0_table[0] > 0);
    TCHECK(isnan(e8m0_table[255]));
    uint8_t packed[16] = {0x21}, scales[1] = {128};
    TCHECK(mxfp4_value(packed, scales, 0) == 1.0f); /* low nibble 1 = 0.5, scale 2 */
    TCHECK(mxfp4_value(packed, scales, 1) == 2.0f); /* high nibble 2 = 1.0, scale 2 */
    TCHECK(bf16_to_f32(0x3F80) == 1.0f && bf16_to_f32(0xC000) == -2.0f);
    float x[32], xp[32];
    for (int i = 0; i < 32; i++) x[i] = (float)i;
    mxfp4_prep_x(x, 32, xp);
    TCHECK(xp[0] == 0 && xp[1] == 2 && xp[15] == 30 && xp[16] == 1 && xp[31] == 31);
}

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
__attribute__((target("f16c"))) static void cvtph8(const uint16_t *h, float *f)
{
    _mm256_storeu_ps(f, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)h)));
}
#endif

/* f16_to_f32 is VCVTPH2PS: every one of the 65,536 halves, bit for bit
 * (NaNs quieted, payloads kept), where the CPU has F16C; known values
 * everywhere; Q8_0's value is q times the scale. */
static void test_half_and_q8(void)
{
    TCHECK(f16_to_f32(0x3c00) == 1.0f && f16_to_f32(0xc000) == -2.0f && f16_to_f32(0x0001) == ldexpf(1, -24));
    TCHECK(f16_to_f32(0x7bff) == 65504.0f && isinf(f16_to_f32(0x7c00)) && f16_to_f32(0xfc00) < 0);
    TCHECK(isnan(f16_to_f32(0x7e00)) && isnan(f16_to_f32(0x7c01)) && signbit(f16_to_f32(0x8000)));
    uint8_t blk[34] = {0x00, 0x38}; /* d = 0.5 */
    blk[2 + 3] = (uint8_t)-7;
    blk[2 + 31] = 0x80;
    TCHECK(load_q8_0(blk, 3) == -3.5f && load_q8_0(blk, 31) == -64.0f && load_q8_0(blk, 0) == 0.0f);
#if defined(__x86_64__)
    unsigned ca, cb, cc, cd;
    if (!__get_cpuid(1, &ca, &cb, &cc, &cd) || !(cc >> 29 & 1u)) TSKIP("no F16C here: only the known values checked");
    int bad = 0;
    for (uint32_t h0 = 0; h0 < 65536; h0 += 8) {
        uint16_t h[8];
        float hw[8];
        for (int i = 0; i < 8; i++) h[i] = (uint16_t)(h0 + (uint32_t)i);
        cvtph8(h, hw);
        for (int i = 0; i < 8; i++) {
            float sw = f16_to_f32(h[i]);
            bad += memcmp(&sw, &hw[i], 4) != 0;
        }
    }
    TCHECKF(bad == 0, "f16_to_f32 differs from VCVTPH2PS on %d halves", bad);
#endif
}

static double ulps(float a, double ref)
{
    float r = (float)ref;
    if (a == r) return 0;
    float next = nextafterf(r, a > r ? INFINITY : -INFINITY);
    return fabs((double)a - ref) / fabs((double)next - (double)r);
}

static void test_mathfn(void)
{
    double we = 0, wt = 0, ws = 0;
    for (int i = 0; i < 200000; i++) {
        float x = (float)((i - 100000) * 0.00087);
        double e = ulps(df_expf(x), exp((double)x));
        double t = ulps(df_tanhf(x), tanh((double)x));
        double s = ulps(df_sigmoidf(x), 1.0 / (1.0 + exp(-(double)x)));
        if (e > we) we = e;
        if (t > wt) wt = t;
        if (s > ws) ws = s;
    }
    float tiny[] = {1e-30f, -3e-8f, 1e-5f, 2e-4f, -0.3f};
    for (int i = 0; i < 5; i++) {
        double t = ulps(df_tanhf(tiny[i]), tanh((double)tiny[i]));
        if (t > wt) wt = t;
    }
    fprintf(stderr, "    worst ulps: exp %.2f tanh %.2f sigmoid %.2f\n", we, wt, ws);
    TCHECK(we <= 1.0 && wt <= 1.0 && ws <= 1.0);
    TCHECK(df_expf(-200.0f) == 0.0f && isinf(df_expf(200.0f)));
    TCHECK(df_tanhf(30.0f) == 1.0f && df_tanhf(-30.0f) == -1.0f);
    TCHECK(df_sigmoidf(-200.0f) == 0.0f && df_sigmoidf(200.0f) == 1.0f);
    float g = 0.7f, u = -3.0f;
    double want = (4.0 * tanh(g / 4.0) / (1 + exp(-g))) * (25.0 * tanh(u / 25.0));
    TCHECK(fabs(df_situ(g, u, 4.0f, 25.0f) - want) < 1e-6);
}

/* Slow tier (DF_SLOW=1, make check-slow): every f32 bit pattern through
 * each compiled-in ISA's sigmoid_n, silu_n and situ_n (g = the pattern,
 * u = another pattern by a bijection, K3's b1 = 4 and b2 = 25), against
 * mathfn.c's scalar functions bit for bit. */
static void test_elementwise_every_float(void)
{
    if (!getenv("DF_SLOW")) TSKIP("2^32 values: DF_SLOW=1 (make check-slow) runs it");
    const kernel_table *kts[4];
    int nk = 0;
    if (kernels_avx2() && kernels_cpu_has(KERNEL_AVX2)) kts[nk++] = kernels_avx2();
    if (kernels_avx512() && kernels_cpu_has(KERNEL_AVX512)) kts[nk++] = kernels_avx512();
    if (kernels_neon() && kernels_cpu_has(KERNEL_NEON)) kts[nk++] = kernels_neon();
    if (!nk) TSKIP("no vector ISA compiled in and supported here");
    enum { CH = 1 << 20 };
    float *x = malloc(CH * sizeof(float)), *u = malloc(CH * sizeof(float));
    float *r = malloc(3 * (size_t)CH * sizeof(float)), *o = malloc(CH * sizeof(float));
    long long bad[4][3] = {{0}};
    for (uint64_t c0 = 0; c0 < (1ull << 32); c0 += CH) {
        for (uint32_t i = 0; i < CH; i++) {
            uint32_t b = (uint32_t)(c0 + i), bu = b * 2654435761u;
            memcpy(&x[i], &b, 4);
            memcpy(&u[i], &bu, 4);
            r[i] = df_sigmoidf(x[i]);
            r[CH + i] = df_siluf(x[i]);
            r[2 * (size_t)CH + i] = df_situ(x[i], u[i], 4.0f, 25.0f);
        }
        for (int k = 0; k < nk; k++) {
            kts[k]->sigmoid_n(x, CH, o);
            bad[k][0] += memcmp(o, r, CH * sizeof(float)) != 0;
            kts[k]->silu_n(x, CH, o);
            bad[k][1] += memcmp(o, r + CH, CH * sizeof(float)) != 0;
            kts[k]->situ_n(x, u, CH, 4.0f, 25.0f, o);
            bad[k][2] += memcmp(o, r + 2 * (size_t)CH, CH * sizeof(float)) != 0;
        }
    }
    for (int k = 0; k < nk; k++) {
        fprintf(stderr, "    %s: 2^32 patterns, chunks differing: sigmoid %lld, silu %lld, situ %lld\n",
                kts[k]->name, bad[k][0], bad[k][1], bad[k][2]);
        TCHECKF(!bad[k][0] && !bad[k][1] && !bad[k][2], "%s elementwise differs on some f32 patterns",
                kts[k]->name);
    }
    free(x);
    free(u);
    free(r);
    free(o);
}

static const test_case tests[] = {
    {"formats", test_formats},
    {"half_and_q8_0_values", test_half_and_q8},
    {"block_formats_equal_ggml", test_qblock_vs_ggml},
    {"mathfn_within_one_ulp", test_mathfn},
    {"ref_vs_float64", test_ref_vs_float64},
    {"avx2_matches_ref_bitwise", test_avx2},
    {"avx512_matches_ref_bitwise", test_avx512},
    {"neon_matches_ref_bitwise", test_neon},
    {"avx512_code_via_simde_matches_ref_bitwise", test_avx512_simde},
    {"elementwise_every_float", test_elementwise_every_float},
};

int main(int argc, char **argv) { return test_main(tests, NTESTS(tests), argc, argv); }
