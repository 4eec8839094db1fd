/* bench_qwen3.c - a Qwen3 drafter's decode step: the double scalar
 * reference against the matrix products on the kernel tables (qwen3.c,
 * qwen3_set_kernels), side by side in one run, the kernel tables' products
 * over --threads workers (default 1; qwen3_set_threads).
 *
 *   bench_qwen3 MODEL_DIR [--steps N] [--reps N] [--prefix N] [--threads N]
 *
 * Each round evaluates --prefix ids, then --steps ids one at a time (a
 * drafter's proposals), per variant in turn (the reference, then each
 * kernel table this CPU runs); a variant's figure is its median over
 * --reps rounds of the milliseconds per decoded id.  Each table runs twice:
 * on the weights as the file stores them (BF16 for bench_qwen3.sh's model)
 * and on the same weights widened to f32 at load (qwen3_open_f32).  The
 * logits of every kernel run are compared bit for bit (they must be
 * equal), and with the reference's (the largest difference).  Prints the
 * speed-up of each over the reference, and of stored over widened, and
 * the prefix's ms per id (one call: its rows share each weight read).
 */
#define _GNU_SOURCE
#include "kernels.h"
#include "qwen3.h"
#include "util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdarg.h>
#include <string.h>

static _Noreturn void die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    exit(2);
}

/* ms per decoded id (and per prefix id, evaluated in one call, into
 * *pre_ms); the last step's logits into out */
static double run(qwen3_model *m, int prefix, int steps, float *out, double *pre_ms)
{
    const qwen3_config *c = qwen3_cfg(m);
    qwen3_state *s;
    df_error err = {0};
    if (qwen3_state_new(m, prefix + steps + 1, &s, &err)) die("%s", err.msg);
    int32_t *ids = xmalloc((size_t)(prefix + steps) * sizeof *ids);
    for (int i = 0; i < prefix + steps; i++) ids[i] = (int32_t)((i * 2654435761u >> 8) % (unsigned)c->vocab);
    double tp = now_sec();
    if (qwen3_eval_last(m, s, ids, prefix, out, &err)) die("%s", err.msg);
    *pre_ms = (now_sec() - tp) * 1e3 / prefix;
    double t0 = now_sec();
    for (int i = 0; i < steps; i++)
        if (qwen3_eval_last(m, s, ids + prefix + i, 1, out, &err)) die("%s", err.msg);
    double ms = (now_sec() - t0) * 1e3 / steps;
    qwen3_state_free(s);
    free(ids);
    return ms;
}

int main(int argc, char **argv)
{
    if (argc < 2) die("usage: bench_qwen3 MODEL_DIR [--steps N] [--reps N] [--prefix N]");
    int steps = 8, reps = 3, prefix = 16, threads = 1;
    for (int i = 2; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--steps")) steps = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--reps")) reps = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--prefix")) prefix = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--threads")) threads = atoi(argv[i + 1]);
        else die("bench_qwen3: unknown option %s", argv[i]);
    }
    if (steps < 1 || reps < 1 || reps > 15 || prefix < 1 || threads < 1 || threads > 256)
        die("bench_qwen3: bad --steps, --reps, --prefix or --threads");
    qwen3_model *m, *w;
    df_error err = {0};
    if (qwen3_open(argv[1], &m, &err) || qwen3_open_f32(argv[1], &w, &err)) die("%s", err.msg);
    qwen3_set_threads(m, threads);
    qwen3_set_threads(w, threads);
    const qwen3_config *c = qwen3_cfg(m);
    printf("qwen3: %d layers, hidden %d, %d heads of %d over %d kv heads, ffn %d, vocab %d; %d ids, then %d one at a "
           "time, %d rounds, %d thread%s (the reference: one); weights %.1f MiB as stored, %.1f MiB widened to f32\n",
           c->layers, c->hidden, c->heads, c->head_dim, c->kv_heads, c->ffn, c->vocab, prefix, steps, reps, threads,
           threads > 1 ? "s" : "",
           qwen3_model_bytes(m) / 1048576.0, qwen3_model_bytes(w) / 1048576.0);
    static const enum kernel_isa isas[] = {KERNEL_REF, KERNEL_AVX2, KERNEL_AVX512, KERNEL_NEON};
    const kernel_table *tabs[] = {kernels_ref(), kernels_avx2(), kernels_avx512(), kernels_neon()};
    /* variants: the reference, then each table on the stored and on the widened weights */
    int nv = 0;
    const kernel_table *v[9];
    qwen3_model *vm[9];
    v[nv] = NULL, vm[nv++] = m;
    for (int k = 0; k < 4; k++)
        if (tabs[k] && kernels_cpu_has(isas[k])) {
            v[nv] = tabs[k], vm[nv++] = m;
            v[nv] = tabs[k], vm[nv++] = w;
        }
    double t[9][15], tp[9][15];
    float *lg[9];
    for (int i = 0; i < nv; i++) lg[i] = xmalloc((size_t)c->vocab * sizeof *lg[i]);
    for (int r = 0; r < reps; r++)
        for (int i = 0; i < nv; i++) {
            qwen3_set_kernels(vm[i], v[i]);
            t[i][r] = run(vm[i], prefix, steps, lg[i], &tp[i][r]);
        }
    double ref = median_d(t[0], reps);
    printf("  %-34s %9.2f ms per id\n", "double scalar reference", ref);
    int same = 1;
    for (int i = 1; i < nv; i++) {
        double md = median_d(t[i], reps), dmax = 0;
        for (int o = 0; o < c->vocab; o++) {
            double d = fabs((double)lg[i][o] - (double)lg[0][o]);
            if (!(d <= dmax)) dmax = d;
        }
        same &= !memcmp(lg[i], lg[1], (size_t)c->vocab * sizeof *lg[i]);
        char label[64];
        snprintf(label, sizeof label, "%s, %s", v[i]->name, vm[i] == m ? "weights as stored" : "widened to f32");
        printf("  %-34s %9.2f ms per id  %5.2fx the reference", label, md, ref / md);
        if (vm[i] == w) printf(", stored %.2fx as fast", md / median_d(t[i - 1], reps));
        printf("  (max |logit - reference's| %.2e); the prefix in one call %.2f ms per id\n", dmax,
               median_d(tp[i], reps));
    }
    printf("  kernel tables' logits, stored and widened: %s\n", same ? "bit-identical" : "DIFFER");
    for (int i = 0; i < nv; i++) free(lg[i]);
    qwen3_free(m);
    qwen3_free(w);
    return same ? 0 : 1;
}
