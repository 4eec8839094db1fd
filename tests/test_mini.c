/* test_mini.c - the bundled trained model (models/k3-mini) against its
 * third, independent reference: tools/train/reference.py's float64
 * PyTorch forward pass of the same exported BF16/MXFP4 weights
 * (testdata/k3-mini-ref); and a llama.cpp-quantized GGUF (Q8_0 trunk,
 * Q4_K experts) against the same forward pass of its stored values
 * (testdata/k3-quant-ref).  Tolerances as the k3-tiny-a fixtures: greedy
 * ids exact, max |logit diff| <= 5e-3 on every row; and deltafin's
 * perplexity on the held-out text within 0.1 % of PyTorch's. */
#define _GNU_SOURCE
#include "harness.h"
#include "json.h"
#include "engine.h"
#include "util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char dir_model[512], dir_ref[512];

static int paths(void)
{
    snprintf(dir_model, sizeof dir_model, "%s/../models/k3-mini", testdata_dir());
    snprintf(dir_ref, sizeof dir_ref, "%s/k3-mini-ref", testdata_dir());
    char p[600];
    snprintf(p, sizeof p, "%s/config.json", dir_model);
    if (access(p, R_OK)) {
        t_fail(__FILE__, __LINE__, "%s is missing: the bundled model is part of the repository", p);
        return -1;
    }
    return 0;
}

static json_doc *read_json(const char *path)
{
    char *text;
    size_t len;
    df_error err = {0};
    if (read_small_file(path, &text, &len, 1 << 26, &err)) {
        t_fail(__FILE__, __LINE__, "%s: %s", path, err.msg);
        return NULL;
    }
    json_doc *d = json_parse(text, len, &err);
    free(text);
    if (!d) t_fail(__FILE__, __LINE__, "%s: %s", path, err.msg);
    return d;
}

static int32_t *ids_of(const json_value *a, int *n)
{
    *n = a && a->type == JSON_ARRAY ? (int)a->len : 0;
    int32_t *v = malloc(((size_t)*n + 1) * sizeof *v);
    for (int i = 0; i < *n; i++) v[i] = (int32_t)a->items[i]->i;
    return v;
}

/* Every prompt of ref (prompts.json and its files) on model: each row's
 * logits within 5e-3 of the float64 reference, the greedy continuation
 * identical; cache: an expert cache of that many bytes (0: planned).
 * Returns the logits of every prompt's rows, concatenated (caller frees). */
static float *check_against(const char *model, const char *ref, size_t cache, size_t *n_out)
{
    char p[700];
    *n_out = 0;
    snprintf(p, sizeof p, "%s/prompts.json", ref);
    json_doc *pl = read_json(p);
    if (!pl) return NULL;
    df_engine_opts o;
    df_engine_opts_default(&o);
    o.quiet = 1;
    o.n_threads = 2;
    o.expert_cache_bytes = cache;
    df_engine *eng;
    df_error err = {0};
    TCHECKF(df_engine_open(model, &o, &eng, &err) == 0, "%s", err.msg);
    if (!eng) {
        json_free(pl);
        return NULL;
    }
    float *all_logits = NULL;
    df_model_info info;
    df_engine_info(eng, &info);
    const json_value *arr = json_root(pl);
    TCHECK(arr->type == JSON_ARRAY && arr->len >= 3);
    for (size_t k = 0; k < arr->len; k++) {
        const json_value *name = json_get(arr->items[k], "name");
        snprintf(p, sizeof p, "%s/%s.json", ref, name->str);
        json_doc *d = read_json(p);
        if (!d) continue;
        int n_all, n_prompt, n_cont;
        int32_t *all = ids_of(json_get(json_root(d), "all_ids"), &n_all);
        int32_t *prompt = ids_of(json_get(json_root(d), "prompt_ids"), &n_prompt);
        int32_t *cont = ids_of(json_get(json_root(d), "continuation_ids"), &n_cont);
        json_free(d);
        snprintf(p, sizeof p, "%s/%s.logits.f32.bin", ref, name->str);
        char *want;
        size_t len;
        TCHECKF(read_small_file(p, &want, &len, 1 << 28, &err) == 0, "%s", err.msg);
        TCHECK(len == (size_t)n_all * info.vocab * 4);
        float *got = malloc((size_t)n_all * info.vocab * sizeof *got);
        df_session *s;
        TCHECK(df_session_new(eng, NULL, &s, &err) == 0);
        TCHECK(df_session_eval(s, all, n_all, got, 1, &err) == 0);
        double worst = 0;
        for (size_t i = 0; i < (size_t)n_all * info.vocab && len == (size_t)n_all * info.vocab * 4; i++) {
            float w;
            memcpy(&w, want + 4 * i, 4);
            double dd = fabs((double)got[i] - (double)w);
            if (dd > worst) worst = dd;
        }
        /* free-running greedy from the prompt alone */
        df_session_reset(s);
        float *last = malloc((size_t)info.vocab * sizeof *last);
        TCHECK(df_session_eval(s, prompt, n_prompt, last, 0, &err) == 0);
        int same = 1;
        for (int i = 0; i < n_cont; i++) {
            int32_t next = (int32_t)df_argmax(last, info.vocab);
            if (next != cont[i]) same = 0;
            TCHECK(df_session_eval(s, &next, 1, last, 0, &err) == 0);
        }
        fprintf(stderr, "    %s: %d rows, max |logit diff| %.2e, greedy %d ids %s\n", name->str, n_all, worst, n_cont,
                same ? "identical" : "DIFFER");
        TCHECKF(worst <= 5e-3, "%s: max |logit diff| %.3e > 5e-3", name->str, worst);
        TCHECKF(same, "%s: greedy continuation differs from PyTorch's", name->str);
        df_session_free(s);
        free(last);
        all_logits = realloc(all_logits, (*n_out + (size_t)n_all * info.vocab) * sizeof *all_logits);
        memcpy(all_logits + *n_out, got, (size_t)n_all * info.vocab * sizeof *got);
        *n_out += (size_t)n_all * info.vocab;
        free(got);
        free(want);
        free(all);
        free(prompt);
        free(cont);
    }
    json_free(pl);
    df_engine_close(eng);
    return all_logits;
}

static void test_logits_match_pytorch(void)
{
    if (paths()) return;
    size_t n;
    free(check_against(dir_model, dir_ref, 0, &n));
}

/* A K3-shaped model quantized by llama.cpp's own quantizer (Q8_0 trunk,
 * Q4_K experts: testdata/k3-quant, made by tools/train/make_quant_fixture.sh)
 * against the float64 reference of the values the file stores
 * (tools/train/gguf_reference.py: gguf-py's dequantization, k3.py's
 * forward pass); the same logits, bit for bit, with every expert cached and
 * with a cache of a few experts. */
static void test_quantized_gguf_matches_pytorch(void)
{
    char model[600], ref[600];
    snprintf(model, sizeof model, "%s/k3-quant/model.gguf", testdata_dir());
    snprintf(ref, sizeof ref, "%s/k3-quant-ref", testdata_dir());
    size_t n1, n2;
    float *a = check_against(model, ref, 0, &n1);
    float *b = check_against(model, ref, 300 << 10, &n2);
    TCHECKF(a && b && n1 == n2 && !memcmp(a, b, n1 * sizeof *a), "the logits differ with a 300 KiB expert cache");
    free(a);
    free(b);
}

static void test_perplexity_matches_pytorch(void)
{
    if (getenv("DF_SANITIZED")) TSKIP("the held-out text takes minutes under the sanitizers: run in the plain suite");
    if (paths()) return;
    char p[700], txt[700], w[32];
    snprintf(p, sizeof p, "%s/perplexity.json", dir_ref);
    json_doc *d = read_json(p);
    if (!d) return;
    double want = 0, window = 0;
    TCHECK(json_get_num(json_root(d), "perplexity", &want) == 0 && json_get_num(json_root(d), "window", &window) == 0);
    json_free(d);
    snprintf(txt, sizeof txt, "%s/heldout.txt", dir_ref);
    snprintf(w, sizeof w, "%d", (int)window);
    static char out[1 << 16], err[1 << 16];
    const char *a[] = {build_bin("deltafin"), "perplexity", "--model", dir_model, "--file", txt, "--window", w,
                       "--json", NULL};
    TCHECKF(t_run(a, out, sizeof out, err, sizeof err) == 0, "%s", err);
    const char *q = strstr(out, "\"perplexity\":");
    double got = q ? strtod(q + 13, NULL) : NAN;
    fprintf(stderr, "    held-out perplexity: deltafin %.5f, PyTorch float64 %.5f (rel %.2e)\n", got, want,
            fabs(got / want - 1));
    TCHECKF(fabs(got / want - 1) <= 1e-3, "perplexity %.5f vs PyTorch %.5f", got, want);
}

static const test_case tests[] = {
    {"logits_match_pytorch", test_logits_match_pytorch},
    {"quantized_gguf_matches_pytorch", test_quantized_gguf_matches_pytorch},
    {"perplexity_matches_pytorch", test_perplexity_matches_pytorch},
};

int main(int argc, char **argv) { return test_main(tests, NTESTS(tests), argc, argv); }
