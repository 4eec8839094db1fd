/* test_backend.c - the block-level backend seam (src/model/k3/ops.h): the
 * reference backend (ops_ref.c: one thread, plain C from the spec over the
 * scalar kernels) and the CPU backend give bit-identical logits on every
 * fixture model and path a forward pass can take: prompts in one pass and
 * in row slices, decode steps, a GGUF file (ggml expert blocks, split
 * k_b / v_b), odd shapes (kernel tails, conv width 2, several AttnRes
 * blocks), the rollback replay and checkpoints taken inside a pass.  Also:
 * --backend's spellings (cpu:scalar, --kernels as its alias, an unknown
 * name, two spellings that disagree).
 */
#define _GNU_SOURCE
#include "harness.h"
#include "engine.h"
#include "gguf.h"
#include "util.h"

#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

typedef struct run_opts {
    const char *backend, *kernels;
    int threads, chunk, max_batch;
    int rollback;          /* mark after `rollback` ids, evaluate the rest, truncate back, evaluate the rest again */
    int checkpoint_at;     /* a checkpoint inside the first pass at this position; truncate to it and go on */
    size_t cache;          /* expert cache bytes (0: planned) */
} run_opts;

static df_engine *open_with(const char *dir, const run_opts *r, df_error *err)
{
    df_engine_opts o;
    df_engine_opts_default(&o);
    o.n_threads = r->threads ? r->threads : 2;
    o.backend = r->backend;
    o.kernels = r->kernels;
    o.plan_ctx = 512;
    o.plan_rollback = 64;
    o.plan_checkpoints = 2;
    o.expert_cache_bytes = r->cache;
    o.quiet = 1;
    df_engine *eng = NULL;
    if (df_engine_open(dir, &o, &eng, err)) return NULL;
    return eng;
}

/* Logits of every row of ids[0..n), fed `chunk` at a time (with the
 * rollback or checkpoint detour when asked). */
static float *run(const char *dir, const run_opts *r, const int32_t *ids, int n, int *V)
{
    df_error err = {0};
    df_engine *eng = open_with(dir, r, &err);
    if (!eng) {
        t_fail(__FILE__, __LINE__, "open %s (%s): %s", dir, r->backend ? r->backend : "default", err.msg);
        return NULL;
    }
    df_model_info info;
    df_engine_info(eng, &info);
    *V = info.vocab;
    df_session_opts so;
    df_session_opts_default(&so);
    so.n_ctx = 512;
    so.max_batch = r->max_batch ? r->max_batch : 32;
    so.rollback_rows = 64;
    so.checkpoints = 2;
    df_session *s = NULL;
    float *out = calloc((size_t)n * info.vocab, sizeof(float));
    if (df_session_new(eng, &so, &s, &err)) {
        t_fail(__FILE__, __LINE__, "session: %s", err.msg);
        goto done;
    }
    int chunk = r->chunk ? r->chunk : n, off = 0;
    int stop = r->rollback ? r->rollback : r->checkpoint_at ? n : n;
    if (r->checkpoint_at && df_session_checkpoint_at(s, r->checkpoint_at, &err)) {
        t_fail(__FILE__, __LINE__, "checkpoint_at: %s", err.msg);
        goto done;
    }
    for (int pass = 0; pass < 2; pass++) {
        for (int k; off < stop; off += k) {
            k = stop - off < chunk ? stop - off : chunk;
            if (df_session_eval(s, ids + off, k, out + (size_t)off * info.vocab, 1, &err)) {
                t_fail(__FILE__, __LINE__, "eval: %s", err.msg);
                goto done;
            }
        }
        if (pass == 1) break;
        if (r->rollback) {
            /* a detour of other ids after a mark, taken back; then the rest */
            TCHECKF(df_session_mark(s, &err) == 0, "%s", err.msg);
            int32_t other[24];
            for (int i = 0; i < 24; i++) other[i] = (ids[i] * 13 + 7) % 200 + 1;
            TCHECKF(df_session_eval(s, other, 24, NULL, 0, &err) == 0, "%s", err.msg);
            TCHECKF(df_session_truncate(s, r->rollback, &err) == 0, "%s", err.msg);
            stop = n;
        } else if (r->checkpoint_at) {
            /* back to the checkpoint taken inside the pass, then the rest again */
            TCHECKF(df_session_truncate(s, r->checkpoint_at, &err) == 0, "%s", err.msg);
            off = r->checkpoint_at;
        } else {
            break;
        }
    }
done:
    df_session_free(s);
    df_engine_close(eng);
    return out;
}

static void same(const char *what, const float *a, const float *b, size_t n, int V)
{
    if (!a || !b) return;
    for (size_t i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], sizeof a[i])) {
            t_fail(__FILE__, __LINE__, "%s: logits differ at row %zu column %zu (%.9g vs %.9g)", what, i / (size_t)V,
                   i % (size_t)V, a[i], b[i]);
            return;
        }
}

/* The reference backend against the CPU backend (default kernels, two
 * threads) on one model, over the paths a pass can take. */
static void ref_vs_cpu(const char *name, const char *dir, int vocab_cap)
{
    enum { N = 40 };
    int32_t ids[N];
    for (int i = 0; i < N; i++) ids[i] = (i * 7919 + 31) % vocab_cap + 1;
    struct {
        const char *what;
        run_opts o;
    } cases[] = {
        {"one pass", {.chunk = 0, .max_batch = 64}},
        {"row slices of 8", {.chunk = 0, .max_batch = 8}},
        {"calls of 5 then decode", {.chunk = 5, .max_batch = 16}},
        {"token by token", {.chunk = 1, .max_batch = 4}},
        {"rollback replay", {.chunk = 7, .max_batch = 16, .rollback = 17}},
        {"checkpoint inside a pass", {.chunk = 0, .max_batch = 64, .checkpoint_at = 23}},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int V = 0;
        run_opts cpu = cases[c].o, ref = cases[c].o;
        ref.backend = "ref";
        float *a = run(dir, &cpu, ids, N, &V);
        float *b = run(dir, &ref, ids, N, &V);
        char what[160];
        snprintf(what, sizeof what, "%s, %s: ref vs cpu", name, cases[c].what);
        same(what, a, b, (size_t)N * V, V);
        int nonzero = 0;
        for (size_t i = 0; a && i < (size_t)N * V; i++) nonzero |= a[i] != 0.0f;
        TCHECKF(nonzero, "%s: all logits zero (nothing ran)", what);
        free(a);
        free(b);
    }
}

static void test_fixture_models(void)
{
    char dir[600];
    snprintf(dir, sizeof dir, "%s/k3-tiny-a/checkpoint", testdata_dir());
    ref_vs_cpu("k3-tiny-a", dir, 380);
    snprintf(dir, sizeof dir, "%s/../models/k3-mini", testdata_dir());
    ref_vs_cpu("k3-mini", dir, 3800);
}

static void test_generated_and_gguf(void)
{
    char dir[512], gguf[600], args[900];
    snprintf(gguf, sizeof gguf, "%s/backend-odd.gguf", test_scratch());
    snprintf(args, sizeof args,
             "--preset tiny --set hidden_size=40 --set short_conv_kernel_size=2 --set num_hidden_layers=7 "
             "--set attn_res_block_size=2 --seed 11 --gguf %s",
             gguf);
    if (gen_model("backend-odd", args, dir, sizeof dir)) return;
    ref_vs_cpu("generated (hidden 40, conv 2, 4 AttnRes blocks)", dir, 300);
    ref_vs_cpu("the same as one GGUF file", gguf, 300);
}

/* The logits of `quant` on every path (one pass; calls of 5 at one thread;
 * the reference backend; scalar kernels with a rollback; an expert cache of
 * 300 KiB) against those of `values` in one pass, bit for bit; `values` is
 * the same model with the quantized tensors written as F32 of their values.
 * Returns values' logits (caller frees). */
static float *same_as_values(const char *what, const char *quant, const char *values, const int32_t *ids, int n,
                             int *V)
{
    run_opts one = {.chunk = 0, .max_batch = 64};
    float *want = run(values, &one, ids, n, V);
    static const struct {
        const char *what;
        run_opts o;
    } cases[] = {
        {"one pass", {.chunk = 0, .max_batch = 64}},
        {"calls of 5, one thread", {.chunk = 5, .max_batch = 8, .threads = 1}},
        {"reference backend", {.backend = "ref", .chunk = 0, .max_batch = 64}},
        {"scalar kernels, rollback", {.backend = "cpu:scalar", .chunk = 6, .max_batch = 16, .rollback = 9}},
        {"an expert cache of 300 KiB", {.chunk = 4, .max_batch = 8, .cache = 300 << 10}},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        float *got = run(quant, &cases[c].o, ids, n, V);
        char label[200];
        snprintf(label, sizeof label, "%s (%s) vs their values as F32", what, cases[c].what);
        same(label, want, got, (size_t)n * *V, *V);
        free(got);
    }
    return want;
}

/* A GGUF whose trunk matrices are Q8_0 (as ggml quantizes) gives, bit for
 * bit, the logits of the same file with those matrices written as F32 of
 * the values it stores, on every backend and path; an F16 trunk runs too
 * (k3gen --gguf-trunk). */
static void test_q8_0_and_f16_trunks(void)
{
    char dq[512], dv[512], df[512], gq[600], gv[600], gf[600], args[900];
    /* MLA ranks of whole blocks: attn_k_b / attn_v_b are Q8_0 too (read by element and by row) */
    const char *base = "--preset tiny --set hidden_size=64 --set num_hidden_layers=5 --set kv_lora_rank=32 "
                       "--set qk_nope_head_dim=32 --set v_head_dim=32 --seed 21";
    snprintf(gq, sizeof gq, "%s/q8.gguf", test_scratch());
    snprintf(gv, sizeof gv, "%s/q8v.gguf", test_scratch());
    snprintf(gf, sizeof gf, "%s/f16.gguf", test_scratch());
    snprintf(args, sizeof args, "%s --gguf %s --gguf-trunk q8_0", base, gq);
    if (gen_model("q8", args, dq, sizeof dq)) return;
    snprintf(args, sizeof args, "%s --gguf %s --gguf-trunk q8_0-values", base, gv);
    if (gen_model("q8v", args, dv, sizeof dv)) return;
    snprintf(args, sizeof args, "%s --gguf %s --gguf-trunk f16", base, gf);
    if (gen_model("f16", args, df, sizeof df)) return;
    enum { N = 30 };
    int32_t ids[N];
    for (int i = 0; i < N; i++) ids[i] = (i * 131 + 7) % 290 + 1;
    int V = 0;
    run_opts one = {.chunk = 0, .max_batch = 64};
    float *want = same_as_values("Q8_0 trunk", gq, gv, ids, N, &V);
    /* the file really holds Q8_0: the attention's matrices, the MLA's k_b and v_b */
    struct stat sq, sv;
    TCHECK(stat(gq, &sq) == 0 && stat(gv, &sv) == 0 && sq.st_size < sv.st_size);
    gguf_file g;
    df_error gerr = {0};
    if (gguf_open(gq, &g, &gerr) == 0) {
        int n_q8 = 0, kb_q8 = 0, vb_q8 = 0;
        for (size_t i = 0; i < g.n_tensors; i++) {
            const gguf_tensor *t = &g.tensors[i];
            if (t->type != GGML_TYPE_Q8_0) continue;
            n_q8++;
            kb_q8 += strstr(t->name, "attn_k_b") != NULL;
            vb_q8 += strstr(t->name, "attn_v_b") != NULL;
        }
        TCHECKF(n_q8 > 10 && kb_q8 > 0 && vb_q8 > 0, "q8_0 tensors: %d (k_b %d, v_b %d)", n_q8, kb_q8, vb_q8);
        gguf_deinit(&g);
    } else {
        t_fail(__FILE__, __LINE__, "%s", gerr.msg);
    }
    float *a = run(gf, &one, ids, N, &V), *b = NULL;
    run_opts r = {.backend = "ref", .chunk = 3, .max_batch = 8};
    b = run(gf, &r, ids, N, &V);
    same("F16 trunk: ref vs cpu", a, b, (size_t)N * V, V);
    int finite = 1;
    for (size_t i = 0; a && i < (size_t)N * V; i++) finite &= a[i] == a[i] && a[i] > -1e30f && a[i] < 1e30f;
    TCHECKF(finite, "F16 trunk: non-finite logits");
    free(a), free(b), free(want);
}

/* cpu:scalar is the CPU backend on the scalar kernels; --kernels is a
 * spelling of cpu:ISA; unknown names and disagreeing spellings fail. */
static void test_spellings(void)
{
    char dir[600];
    snprintf(dir, sizeof dir, "%s/k3-tiny-a/checkpoint", testdata_dir());
    int32_t ids[12];
    for (int i = 0; i < 12; i++) ids[i] = i * 29 % 370 + 1;
    int V = 0;
    run_opts d = {.chunk = 0}, sc = {.backend = "cpu:scalar"}, k = {.kernels = "ref"}, same_two = {
        .backend = "cpu:scalar", .kernels = "ref"};
    float *a = run(dir, &d, ids, 12, &V), *b = run(dir, &sc, ids, 12, &V), *c = run(dir, &k, ids, 12, &V),
          *e = run(dir, &same_two, ids, 12, &V);
    same("cpu:scalar vs cpu", a, b, (size_t)12 * V, V);
    same("--kernels ref vs cpu", a, c, (size_t)12 * V, V);
    same("--backend cpu:scalar with --kernels ref", a, e, (size_t)12 * V, V);
    free(a), free(b), free(c), free(e);

    df_error err = {0};
    run_opts bad = {.backend = "gpu"};
    df_engine *eng = open_with(dir, &bad, &err);
    TCHECKF(!eng && err.code == DF_ERR_ARG && strstr(err.msg, "'gpu'") && strstr(err.msg, "cpu:scalar"),
            "unknown backend: %s", err.msg);
    if (eng) df_engine_close(eng);
    memset(&err, 0, sizeof err);
    run_opts clash = {.backend = "ref", .kernels = "avx2"};
    eng = open_with(dir, &clash, &err);
    TCHECKF(!eng && err.code == DF_ERR_ARG && strstr(err.msg, "--backend ref") && strstr(err.msg, "--kernels avx2"),
            "disagreeing spellings: %s", err.msg);
    if (eng) df_engine_close(eng);
    /* the environment's spellings: $DF_BACKEND alone is honoured, a flag beats it, and
     * $DF_BACKEND and $DF_KERNELS that disagree are refused naming both */
    setenv("DF_BACKEND", "ref", 1);
    memset(&err, 0, sizeof err);
    run_opts none = {0};
    eng = open_with(dir, &none, &err);
    df_model_info ei;
    if (eng) df_engine_info(eng, &ei);
    TCHECKF(eng && !strcmp(ei.backend, "ref"), "$DF_BACKEND=ref: %s", eng ? ei.backend : err.msg);
    if (eng) df_engine_close(eng);
    run_opts flag = {.backend = "cpu:scalar"};
    eng = open_with(dir, &flag, &err);
    if (eng) df_engine_info(eng, &ei);
    TCHECKF(eng && !strcmp(ei.backend, "cpu:scalar"), "--backend over $DF_BACKEND: %s", eng ? ei.backend : err.msg);
    if (eng) df_engine_close(eng);
    setenv("DF_KERNELS", "avx2", 1);
    memset(&err, 0, sizeof err);
    eng = open_with(dir, &none, &err);
    TCHECKF(!eng && strstr(err.msg, "$DF_BACKEND") && strstr(err.msg, "$DF_KERNELS"), "env clash: %s", err.msg);
    if (eng) df_engine_close(eng);
    unsetenv("DF_BACKEND");
    unsetenv("DF_KERNELS");
    /* the engine reports what it runs on */
    memset(&err, 0, sizeof err);
    run_opts r = {.backend = "ref"};
    eng = open_with(dir, &r, &err);
    TCHECKF(eng != NULL, "%s", err.msg);
    if (eng) {
        df_model_info info;
        df_engine_info(eng, &info);
        TCHECKF(!strcmp(info.backend, "ref") && !strcmp(info.kernels, "ref"), "info: backend %s kernels %s",
                info.backend, info.kernels);
        df_engine_close(eng);
    }
}

/* Routed experts requantized (k3gen --gguf-experts q8_0, ggml's rounding of
 * their MXFP4 values) give, bit for bit, the logits of the same file with
 * the experts as F32 of the values it stores: on every backend, in calls,
 * with rollback, and with a cache too small to hold the experts a pass
 * needs; info, the plan and the file say they are requantized. */
static void test_q8_0_experts(void)
{
    char dq[512], dv[512], gq[600], gv[600], args[900];
    const char *base = "--preset tiny --set hidden_size=64 --set num_hidden_layers=5 --set kv_lora_rank=32 "
                       "--set qk_nope_head_dim=32 --set v_head_dim=32 --seed 23";
    snprintf(gq, sizeof gq, "%s/q8e.gguf", test_scratch());
    snprintf(gv, sizeof gv, "%s/q8ev.gguf", test_scratch());
    snprintf(args, sizeof args, "%s --gguf %s --gguf-experts q8_0", base, gq);
    if (gen_model("q8e", args, dq, sizeof dq)) return;
    snprintf(args, sizeof args, "%s --gguf %s --gguf-experts q8_0-values", base, gv);
    if (gen_model("q8ev", args, dv, sizeof dv)) return;
    enum { N = 24 };
    int32_t ids[N];
    for (int i = 0; i < N; i++) ids[i] = (i * 97 + 11) % 290 + 1;
    int V = 0;
    run_opts one = {.chunk = 0, .max_batch = 64};
    float *want = same_as_values("Q8_0 experts", gq, gv, ids, N, &V);
    /* the MXFP4 model they came from gives other logits (the requantization is real) */
    float *mx = run(dq, &one, ids, N, &V);
    int differ = 0;
    for (size_t i = 0; mx && want && i < (size_t)N * V; i++) differ |= mx[i] != want[i];
    TCHECKF(differ, "the requantized experts give the MXFP4 model's logits: the file did not change them");
    free(mx);
    df_error err = {0};
    run_opts r = {.chunk = 0};
    df_engine *eng = open_with(gq, &r, &err);
    TCHECKF(eng != NULL, "%s", err.msg);
    if (eng) {
        df_model_info info;
        df_engine_info(eng, &info);
        TCHECKF(!strcmp(info.experts, "q8_0") && info.experts_requantized, "info: experts %s (requantized %d)",
                info.experts, info.experts_requantized);
        df_engine_close(eng);
    }
    eng = open_with(dq, &r, &err);
    if (eng) {
        df_model_info info;
        df_engine_info(eng, &info);
        TCHECKF(!strcmp(info.experts, "mxfp4") && !info.experts_requantized, "info (MXFP4 model): experts %s (%d)",
                info.experts, info.experts_requantized);
        df_engine_close(eng);
    }
    free(want);
}

static const test_case tests[] = {
    {"backend_spellings", test_spellings},
    {"ref_vs_cpu_fixture_models", test_fixture_models},
    {"ref_vs_cpu_generated_and_gguf", test_generated_and_gguf},
    {"q8_0_trunk_is_its_values_f16_trunk_runs", test_q8_0_and_f16_trunks},
    {"q8_0_experts_are_their_values", test_q8_0_experts},
};

int main(int argc, char **argv) { return test_main(tests, NTESTS(tests), argc, argv); }
