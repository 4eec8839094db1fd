/* test_model.c - the K3 forward pass against the independent float64
 * reference fixtures (testdata/k3-tiny-a): teacher-forced logits for every
 * row, free-running greedy continuations, and per-layer debug values at the
 * last prompt position.  Tolerances are the fixture README's: greedy ids
 * exact, max |logit diff| <= 5e-3, max row relative L2 <= 5e-4, debug norms
 * and probabilities within 1e-3 relative.  The same checkpoint converted by
 * `k3gen --from` to llama.cpp's kimi-k3 GGUF must give the safetensors
 * logits bit for bit.
 */
#include "harness.h"
#include "json.h"
#include "engine_impl.h"
#include "util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static const char *prompts[] = {"p1_len1", "p2_len7", "p3_len33_chat"};

typedef struct {
    int32_t *prompt, *all, *cont;
    int n_prompt, n_all, n_cont;
    float *logits;   /* [n_all][V] */
    json_doc *debug;
} fixture;

static int32_t *ids_of(const json_value *a, int *n)
{
    *n = (int)a->len;
    int32_t *v = malloc((a->len + 1) * sizeof *v);
    for (size_t i = 0; i < a->len; i++) v[i] = (int32_t)a->items[i]->i;
    return v;
}

static int load_fixture(const char *name, int V, fixture *f)
{
    memset(f, 0, sizeof *f);
    char path[512];
    char *text;
    size_t len;
    df_error err = {0};
    snprintf(path, sizeof path, "%s/k3-tiny-a/fixtures/%s.json", testdata_dir(), name);
    if (read_small_file(path, &text, &len, 1 << 24, &err)) return -1;
    json_doc *d = json_parse(text, len, &err);
    free(text);
    if (!d) return -1;
    const json_value *r = json_root(d);
    f->prompt = ids_of(json_get(r, "prompt_ids"), &f->n_prompt);
    f->all = ids_of(json_get(r, "all_ids"), &f->n_all);
    f->cont = ids_of(json_get(r, "continuation_ids"), &f->n_cont);
    json_free(d);
    snprintf(path, sizeof path, "%s/k3-tiny-a/fixtures/%s.logits.f32.bin", testdata_dir(), name);
    if (read_small_file(path, &text, &len, 1 << 26, &err)) return -1;
    if (len != (size_t)f->n_all * V * 4) {
        free(text);
        return -1;
    }
    f->logits = malloc(len);
    memcpy(f->logits, text, len);
    free(text);
    snprintf(path, sizeof path, "%s/k3-tiny-a/fixtures/%s.debug.json", testdata_dir(), name);
    if (read_small_file(path, &text, &len, 1 << 24, &err)) return -1;
    f->debug = json_parse(text, len, &err);
    free(text);
    return f->debug ? 0 : -1;
}

static void free_fixture(fixture *f)
{
    free(f->prompt);
    free(f->all);
    free(f->cont);
    free(f->logits);
    json_free(f->debug);
}

/* A checkpoint directory or a .gguf file. */
static df_engine *open_model(const char *path, int threads, const char *kernels)
{
    df_engine_opts o;
    df_engine_opts_default(&o);
    o.n_threads = threads;
    o.kernels = kernels;
    o.quiet = 1;
    df_engine *eng = NULL;
    df_error err = {0};
    if (df_engine_open(path, &o, &eng, &err)) t_fail(__FILE__, __LINE__, "open %s: %s", path, err.msg);
    return eng;
}

static df_engine *open_tiny(int threads, const char *kernels)
{
    char dir[512];
    snprintf(dir, sizeof dir, "%s/k3-tiny-a/checkpoint", testdata_dir());
    return open_model(dir, threads, kernels);
}

/* Teacher-forced logits for every row of the fixture: the prompt as one
 * batch, then the continuation as one more batch.  NULL on failure. */
static float *eval_all(df_engine *eng, const fixture *f, int V)
{
    df_session *s;
    df_error err = {0};
    if (df_session_new(eng, NULL, &s, &err)) {
        t_fail(__FILE__, __LINE__, "session: %s", err.msg);
        return NULL;
    }
    float *out = malloc((size_t)f->n_all * V * sizeof(float));
    int rc = df_session_eval(s, f->all, f->n_prompt, out, 1, &err);
    if (!rc)
        rc = df_session_eval(s, f->all + f->n_prompt, f->n_all - f->n_prompt, out + (size_t)f->n_prompt * V, 1, &err);
    df_session_free(s);
    if (rc) {
        t_fail(__FILE__, __LINE__, "eval: %s", err.msg);
        free(out);
        return NULL;
    }
    return out;
}

/* Free-running greedy continuation of the prompt must be the fixture's. */
static void check_greedy(df_engine *eng, const char *name, const fixture *f, int V)
{
    df_session *s;
    df_error err = {0};
    if (df_session_new(eng, NULL, &s, &err)) {
        t_fail(__FILE__, __LINE__, "session: %s", err.msg);
        return;
    }
    float *logits = malloc((size_t)V * sizeof(float));
    TCHECK(df_session_eval(s, f->prompt, f->n_prompt, logits, 0, &err) == 0);
    int same = 1;
    for (int i = 0; i < f->n_cont; i++) {
        int32_t next = df_argmax(logits, V);
        if (next != f->cont[i]) {
            t_fail(__FILE__, __LINE__, "%s: generated token %d is %d, expected %d", name, i, next, f->cont[i]);
            same = 0;
            break;
        }
        TCHECK(df_session_eval(s, &next, 1, logits, 0, &err) == 0);
    }
    if (same) fprintf(stderr, "    %s: %d greedy tokens identical\n", name, f->n_cont);
    df_session_free(s);
    free(logits);
}

static void compare_rows(const char *name, const float *got, const float *want, int rows, int V)
{
    double max_abs = 0, max_rel = 0;
    for (int t = 0; t < rows; t++) {
        double dd = 0, ww = 0;
        for (int i = 0; i < V; i++) {
            double d = (double)got[(size_t)t * V + i] - want[(size_t)t * V + i];
            if (fabs(d) > max_abs) max_abs = fabs(d);
            dd += d * d;
            ww += (double)want[(size_t)t * V + i] * want[(size_t)t * V + i];
        }
        double rel = sqrt(dd / (ww > 0 ? ww : 1));
        if (rel > max_rel) max_rel = rel;
    }
    fprintf(stderr, "    %s: max|d| %.3g, max row rel L2 %.3g\n", name, max_abs, max_rel);
    TCHECKF(max_abs <= 5e-3, "%s: max |logit diff| %g > 5e-3", name, max_abs);
    TCHECKF(max_rel <= 5e-4, "%s: max row relative L2 %g > 5e-4", name, max_rel);
}

static void test_teacher_forced(void)
{
    df_engine *eng = open_tiny(0, NULL);
    if (!eng) return;
    df_model_info info;
    df_engine_info(eng, &info);
    for (int p = 0; p < 3; p++) {
        fixture f;
        if (load_fixture(prompts[p], info.vocab, &f)) {
            t_fail(__FILE__, __LINE__, "cannot load fixture %s", prompts[p]);
            continue;
        }
        float *out = eval_all(eng, &f, info.vocab);
        if (out) compare_rows(prompts[p], out, f.logits, f.n_all, info.vocab);
        free(out);
        free_fixture(&f);
    }
    df_engine_close(eng);
}

static void test_free_running(void)
{
    df_engine *eng = open_tiny(0, NULL);
    if (!eng) return;
    df_model_info info;
    df_engine_info(eng, &info);
    for (int p = 0; p < 3; p++) {
        fixture f;
        if (load_fixture(prompts[p], info.vocab, &f)) {
            t_fail(__FILE__, __LINE__, "cannot load fixture %s", prompts[p]);
            continue;
        }
        check_greedy(eng, prompts[p], &f, info.vocab);
        free_fixture(&f);
    }
    df_engine_close(eng);
}

static void near(const char *what, int il, double got, double want)
{
    double rel = fabs(got - want) / (fabs(want) > 1e-12 ? fabs(want) : 1.0);
    TCHECKF(rel <= 1e-3, "%s layer %d: %.9g vs reference %.9g (rel %.2g)", what, il, got, want, rel);
}

/* A fixture number that must be there: a missing key is a failure, not
 * whatever the variable held before. */
static int fixture_num(const json_value *obj, const char *key, int il, double *v)
{
    if (json_get_num(obj, key, v) == 0) return 1;
    t_fail(__FILE__, __LINE__, "fixture debug record (layer %d) has no number \"%s\"", il, key);
    return 0;
}

static void test_debug_norms(void)
{
    df_engine *eng = open_tiny(0, NULL);
    if (!eng) return;
    df_model_info info;
    df_engine_info(eng, &info);
    for (int p = 0; p < 3; p++) {
        fixture f;
        if (load_fixture(prompts[p], info.vocab, &f)) {
            t_fail(__FILE__, __LINE__, "cannot load fixture %s", prompts[p]);
            continue;
        }
        df_session *s;
        df_error err = {0};
        df_session_opts so;
        df_session_opts_default(&so);
        so.max_batch = 64; /* the whole prompt in one chunk: debug is recorded at its last position */
        TCHECK(df_session_new(eng, &so, &s, &err) == 0);
        dbg_record dbg = {.enabled = 1, .t = -1};
        dbg.layers = calloc((size_t)info.n_layers, sizeof *dbg.layers);
        s->dbg = &dbg;
        float *logits = malloc((size_t)info.vocab * sizeof(float));
        TCHECK(df_session_eval(s, f.prompt, f.n_prompt, logits, 0, &err) == 0);
        const json_value *r = json_root(f.debug);
        double v;
        if (fixture_num(r, "embedding_norm", -1, &v)) near("embedding_norm", -1, dbg.embedding_norm, v);
        if (fixture_num(r, "final_mix_norm", -1, &v)) near("final_mix_norm", -1, dbg.final_mix_norm, v);
        if (fixture_num(r, "final_normed_norm", -1, &v)) near("final_normed_norm", -1, dbg.final_normed_norm, v);
        if (fixture_num(r, "logits_norm", -1, &v)) near("logits_norm", -1, dbg.logits_norm, v);
        const json_value *layers = json_get(r, "layers");
        TCHECK(layers && (int)layers->len == info.n_layers);
        for (int il = 0; layers && il < (int)layers->len && il < info.n_layers; il++) {
            const json_value *L = layers->items[il];
            const dbg_layer *d = &dbg.layers[il];
            static const char *keys[] = {"attn_input_norm", "attn_output_norm", "mlp_input_norm", "mlp_output_norm",
                                         "partial_sum_norm"};
            const double got[] = {d->attn_input_norm, d->attn_output_norm, d->mlp_input_norm, d->mlp_output_norm,
                                   d->partial_sum_norm};
            for (int k = 0; k < 5; k++)
                if (fixture_num(L, keys[k], il, &v)) near(keys[k], il, got[k], v);
            const json_value *ap = json_get(L, "attn_res_probs"), *mp = json_get(L, "mlp_res_probs");
            TCHECKF(ap && (int)ap->len == d->n_attn_probs, "layer %d: attn_res_probs count", il);
            TCHECKF(mp && (int)mp->len == d->n_mlp_probs, "layer %d: mlp_res_probs count", il);
            for (int j = 0; ap && j < (int)ap->len && j < d->n_attn_probs; j++)
                TCHECKF(fabs(d->attn_probs[j] - ap->items[j]->num) <= 1e-3, "layer %d attn prob %d", il, j);
            for (int j = 0; mp && j < (int)mp->len && j < d->n_mlp_probs; j++)
                TCHECKF(fabs(d->mlp_probs[j] - mp->items[j]->num) <= 1e-3, "layer %d mlp prob %d", il, j);
            const json_value *ids = json_get(L, "expert_ids"), *ws = json_get(L, "expert_weights");
            if (ids) {
                TCHECKF((int)ids->len == d->n_experts, "layer %d: expert count", il);
                TCHECKF(ws && ws->len == ids->len, "layer %d: expert_weights missing or of another length", il);
                if (!ws || ws->len != ids->len) continue;
                for (int j = 0; j < (int)ids->len && j < d->n_experts; j++) {
                    TCHECKF(d->expert_ids[j] == ids->items[j]->i, "layer %d route slot %d: expert %d, reference %lld",
                            il, j, d->expert_ids[j], (long long)ids->items[j]->i);
                    TCHECKF(fabs(d->expert_weights[j] - ws->items[j]->num) <= 1e-3 * ws->items[j]->num,
                            "layer %d route slot %d weight", il, j);
                }
            }
        }
        /* the same records when the chunk runs in row slices of 3 (the
         * blocks' finish interleaved with the next layer's: engine.c's
         * wavefront), filled from the last block */
        df_session *s3 = NULL;
        so.row_slice = 3;
        if (f.n_prompt > 3 && df_session_new(eng, &so, &s3, &err) == 0) {
            dbg_record d3 = {.enabled = 1, .t = -1};
            d3.layers = calloc((size_t)info.n_layers, sizeof *d3.layers);
            s3->dbg = &d3;
            TCHECK(df_session_eval(s3, f.prompt, f.n_prompt, logits, 0, &err) == 0);
            TCHECKF(d3.embedding_norm == dbg.embedding_norm && d3.final_mix_norm == dbg.final_mix_norm &&
                        d3.final_normed_norm == dbg.final_normed_norm && d3.logits_norm == dbg.logits_norm,
                    "prompt %d: blocks of 3 rows give other final norms", p);
            TCHECKF(!memcmp(d3.layers, dbg.layers, (size_t)info.n_layers * sizeof *d3.layers),
                    "prompt %d: blocks of 3 rows give other per-layer records", p);
            free(d3.layers);
            df_session_free(s3);
        }
        TCHECKF(f.n_prompt <= 3 || s3, "prompt %d: no session in blocks of 3 rows: %s", p, err.msg);
        free(logits);
        free(dbg.layers);
        df_session_free(s);
        free_fixture(&f);
    }
    df_engine_close(eng);
}

/* Runs k3gen (stdout and stderr captured into out); returns its exit status. */
static int run_k3gen(const char *args, char *out, size_t n)
{
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s %s 2>&1", build_bin("k3gen"), args);
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    size_t len = fread(out, 1, n - 1, p);
    out[len] = 0;
    int rc = pclose(p);
    return rc;
}

/* The fixture checkpoint converted by `k3gen --from` into llama.cpp's
 * kimi-k3 GGUF (experts repacked to ggml MXFP4, kv_b split per head, res
 * norm folded into the res score, -exp(A_log)): opened by the engine, it
 * gives the safetensors checkpoint's teacher-forced logits bit for bit and
 * the fixture's greedy tokens.  k3gen refuses options that do not describe
 * the checkpoint, naming the tensor. */
static void test_gguf_from_checkpoint(void)
{
    char ckpt[512], gguf[600], args[1600], msg[4096];
    snprintf(ckpt, sizeof ckpt, "%s/k3-tiny-a/checkpoint", testdata_dir());
    snprintf(gguf, sizeof gguf, "%s/tiny-a.gguf", test_scratch());
    snprintf(args, sizeof args, "--preset tiny-a-shape --from %s --gguf %s", ckpt, gguf);
    df_engine *st = NULL, *gg = NULL;
    if (run_k3gen(args, msg, sizeof msg) != 0)
        t_fail(__FILE__, __LINE__, "k3gen %s failed: %s", args, msg);
    else if ((st = open_model(ckpt, 0, NULL)))
        gg = open_model(gguf, 0, NULL);
    if (st && gg) {
        df_model_info is, ig;
        df_engine_info(st, &is);
        df_engine_info(gg, &ig);
        TCHECKF(is.vocab == ig.vocab && is.n_layers == ig.n_layers && is.n_mla_layers == ig.n_mla_layers &&
                    is.n_experts == ig.n_experts && is.n_experts_used == ig.n_experts_used,
                "GGUF model info differs: vocab %d/%d layers %d/%d mla %d/%d experts %d/%d used %d/%d", is.vocab,
                ig.vocab, is.n_layers, ig.n_layers, is.n_mla_layers, ig.n_mla_layers, is.n_experts, ig.n_experts,
                is.n_experts_used, ig.n_experts_used);
        const int V = is.vocab;
        for (int p = 0; p < 3 && V == ig.vocab; p++) {
            fixture f;
            if (load_fixture(prompts[p], V, &f)) {
                t_fail(__FILE__, __LINE__, "cannot load fixture %s", prompts[p]);
                continue;
            }
            float *a = eval_all(st, &f, V), *b = eval_all(gg, &f, V);
            if (a && b) {
                size_t n = (size_t)f.n_all * V, i = 0;
                while (i < n && !memcmp(&a[i], &b[i], sizeof(float))) i++;
                TCHECKF(i == n, "%s: GGUF logits differ from the safetensors checkpoint's, first at row %zu token %zu: "
                        "GGUF %.9g, safetensors %.9g", prompts[p], i / V, i % V, (double)b[i < n ? i : 0], (double)a[i < n ? i : 0]);
                if (i == n)
                    fprintf(stderr, "    %s: %d x %d GGUF logits bit-identical to safetensors\n", prompts[p], f.n_all, V);
            }
            free(a);
            free(b);
            check_greedy(gg, prompts[p], &f, V);
            free_fixture(&f);
        }
    }
    if (gg) df_engine_close(gg);
    if (st) df_engine_close(st);
    /* options that do not describe the checkpoint: refused, tensor named, no file left */
    static const struct {
        const char *set, *want1, *want2;
    } bad[] = {
        {"--set kda_heads=3", "layers.0.self_attn.q_proj.weight", "shape mismatch"},
        {"--set mla_every=3", "layers.2.self_attn.q_a_proj.weight", "not in"},
        {"--set num_hidden_layers=12", "layers.12.", "not part of the model"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char bad_gguf[600];
        snprintf(bad_gguf, sizeof bad_gguf, "%s/bad%zu.gguf", test_scratch(), i);
        snprintf(args, sizeof args, "--preset tiny-a-shape %s --from %s --gguf %s", bad[i].set, ckpt, bad_gguf);
        int rc = run_k3gen(args, msg, sizeof msg);
        struct stat sb;
        TCHECKF(rc != 0 && strstr(msg, bad[i].want1) && strstr(msg, bad[i].want2) && stat(bad_gguf, &sb) != 0,
                "k3gen %s: rc %d, message: %s", args, rc, msg);
    }
    test_scratch_remove();
}

static const test_case tests[] = {
    {"fixture_teacher_forced_logits", test_teacher_forced},
    {"fixture_free_running_greedy", test_free_running},
    {"fixture_debug_norms_and_routes", test_debug_norms},
    {"fixture_gguf_from_checkpoint_bit_identical", test_gguf_from_checkpoint},
};

int main(int argc, char **argv) { return test_main(tests, NTESTS(tests), argc, argv); }
