/* test_perplexity.c - `deltafin perplexity` against the same sum computed
 * here from the logits `run --dump-logits` writes for each window, and its
 * bad-input errors.  (The trained model's perplexity against PyTorch's is
 * in test_mini.) */
#define _GNU_SOURCE
#include "harness.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static char out_[1 << 20], err_[1 << 16];

static double json_num(const char *s, const char *key)
{
    char k[64];
    snprintf(k, sizeof k, "\"%s\":", key);
    const char *p = strstr(s, k);
    return p ? strtod(p + strlen(k), NULL) : NAN;
}

/* the ids `deltafin tokenize` gives text (at most cap) */
static int tokenize_ids(const char *model, const char *text, int32_t *ids, int cap)
{
    const char *t[] = {build_bin("deltafin"), "tokenize", "--model", model, "--", text, NULL};
    TCHECK(t_run(t, out_, sizeof out_, err_, sizeof err_) == 0);
    int n = 0;
    for (char *p = out_; *p && n < cap;) {
        ids[n++] = (int32_t)strtol(p, &p, 10);
        if (*p == ',') p++;
        else break;
    }
    return n;
}

/* the logits of ids[0..m) as `run --dump-logits` writes them (malloc'd, *nb bytes) */
static float *window_logits(const char *model, const int32_t *ids, int m, const char *dump, size_t *nb)
{
    char list[4096];
    size_t k = 0;
    for (int i = 0; i < m; i++) k += (size_t)snprintf(list + k, sizeof list - k, "%s%d", i ? "," : "", ids[i]);
    const char *r[] = {build_bin("deltafin"), "run", "--model", model, "--prompt-ids", list, "--max-new", "0",
                       "--dump-logits", dump, NULL};
    TCHECKF(t_run(r, NULL, 0, err_, sizeof err_) == 0, "%s", err_);
    *nb = 0;
    return (float *)t_slurp(dump, nb);
}

static void test_matches_dumped_logits(void)
{
    char tiny[512], txt[600], dump[600];
    snprintf(tiny, sizeof tiny, "%s/k3-tiny-a/checkpoint", testdata_dir());
    snprintf(txt, sizeof txt, "%s/ppl.txt", test_scratch());
    snprintf(dump, sizeof dump, "%s/ppl.logits", test_scratch());
    const char *text = "The quick brown fox jumps over the lazy dog. A tokenizer splits text into tokens, "
                       "and a model predicts the next one. 12 + 34 = 46.";
    FILE *f = fopen(txt, "w");
    fputs(text, f);
    fclose(f);
    const int W = 16;
    char wbuf[16];
    snprintf(wbuf, sizeof wbuf, "%d", W);
    const char *a[] = {build_bin("deltafin"), "perplexity", "--model", tiny, "--file", txt, "--window", wbuf, "--json",
                       NULL};
    TCHECKF(t_run(a, out_, sizeof out_, err_, sizeof err_) == 0, "%s", err_);
    double ppl = json_num(out_, "perplexity"), scored = json_num(out_, "scored_tokens");
    /* the same windows through run --prompt-ids --dump-logits */
    int32_t ids[1024];
    int n = tokenize_ids(tiny, text, ids, 1024);
    double nll = 0;
    long cnt = 0;
    for (int start = 0; start < n; start += W) {
        int m = n - start < W ? n - start : W;
        if (m < 2) break;
        size_t nb;
        float *lg = window_logits(tiny, ids + start, m, dump, &nb);
        TCHECK(lg && nb == (size_t)m * 640 * sizeof(float));
        if (!lg) return;
        for (int t2 = 0; t2 + 1 < m; t2++) {
            const float *row = lg + (size_t)t2 * 640;
            double mx = row[0], sum = 0;
            for (int i = 1; i < 640; i++) mx = row[i] > mx ? row[i] : mx;
            for (int i = 0; i < 640; i++) sum += exp((double)row[i] - mx);
            nll += log(sum) + mx - row[ids[start + t2 + 1]];
            cnt++;
        }
        free(lg);
    }
    fprintf(stderr, "    %d ids, %ld scored: perplexity %.6f (CLI %.6f)\n", n, cnt, exp(nll / cnt), ppl);
    TCHECK(cnt == (long)scored);
    TCHECKF(fabs(exp(nll / cnt) / ppl - 1) < 1e-9, "perplexity %.9f vs %.9f", exp(nll / cnt), ppl);
}

static void test_bad_input(void)
{
    char tiny[512];
    snprintf(tiny, sizeof tiny, "%s/k3-tiny-a/checkpoint", testdata_dir());
    const char *a[] = {build_bin("deltafin"), "perplexity", "--model", tiny, "--file", "/nonexistent/text", NULL};
    TCHECK(t_run(a, NULL, 0, err_, sizeof err_) == 2 && strstr(err_, "/nonexistent/text"));
    const char *b[] = {build_bin("deltafin"), "perplexity", "--model", tiny, NULL};
    TCHECK(t_run(b, NULL, 0, err_, sizeof err_) == 2 && strstr(err_, "--file"));
    const char *c[] = {build_bin("deltafin"), "perplexity", "--model", tiny, "--file", "x", "--window", "1", NULL};
    TCHECK(t_run(c, NULL, 0, err_, sizeof err_) == 2 && strstr(err_, "--window"));
}

/* A window costs a prompt chunk's logits, not its own: a 4,096-token
 * window of the default model (4,096 ids: 64 MiB of logits when a window's
 * rows were kept; it peaked at 92 MiB) under --mem 60M peaks within it;
 * the sums equal those of the rows `run` dumps (the test below). */
static void test_window_within_mem(void)
{
    if (getenv("DF_SANITIZED")) TSKIP("sanitizer runtimes inflate RSS");
    char mini[600], text[600];
    snprintf(mini, sizeof mini, "%s/../models/k3-mini", testdata_dir());
    snprintf(text, sizeof text, "%s/ppl-long.txt", test_scratch());
    FILE *f = fopen(text, "w");
    if (!f) TSKIP("cannot write %s", text);
    static const char *w[] = {"the", "cat", "sat", "on", "a", "mat", "and", "then", "went", "home", "because", "it",
                              "was", "raining"};
    for (unsigned i = 0; i < 5200; i++) fprintf(f, "%s ", w[(i * 2654435761u >> 7) % 14]);
    fclose(f);
    const char *a[] = {build_bin("deltafin"), "perplexity", "--model", mini, "--file", text, "--window", "4096",
                       "--mem", "60M", "--json", NULL};
    TCHECKF(t_run(a, out_, sizeof out_, err_, sizeof err_) == 0, "%s", err_);
    double kb = json_num(out_, "peak_rss_kb"), scored = json_num(out_, "scored_tokens");
    fprintf(stderr, "    window 4096, %.0f tokens scored: peak RSS %.1f MiB with --mem 60M\n", scored, kb / 1024);
    TCHECKF(scored >= 4095 && kb > 0 && kb * 1024 <= 60.0 * 1024 * 1024, "peak %.0f kB, %.0f scored", kb, scored);
    test_scratch_remove();
}

/* log-softmax of a row in double */
static void lsm(const float *x, int V, double *out)
{
    double mx = x[0], sum = 0;
    for (int i = 1; i < V; i++) mx = x[i] > mx ? x[i] : mx;
    for (int i = 0; i < V; i++) sum += exp((double)x[i] - mx);
    for (int i = 0; i < V; i++) out[i] = (double)x[i] - mx - log(sum);
}

/* --kl-divergence: a model against itself gives KL 0 and full top-1
 * agreement; the fixture against its Q8_0-trunk GGUF (k3gen --from, the
 * same vocabulary) gives the KL, agreement and perplexity ratio computed
 * here from both models' dumped logits; a base file from another text or
 * window, and both options at once, are refused by name. */
static void test_kl_divergence(void)
{
    char tiny[512], q8[600], txt[600], base[600], dump[600], args[1200];
    snprintf(tiny, sizeof tiny, "%s/k3-tiny-a/checkpoint", testdata_dir());
    snprintf(q8, sizeof q8, "%s/tiny-q8.gguf", test_scratch());
    snprintf(txt, sizeof txt, "%s/kld.txt", test_scratch());
    snprintf(base, sizeof base, "%s/kld.base", test_scratch());
    snprintf(dump, sizeof dump, "%s/kld.logits", test_scratch());
    snprintf(args, sizeof args, "%s --from %s --preset tiny-a-shape --gguf %s --gguf-trunk q8_0 >/dev/null",
             build_bin("k3gen"), tiny, q8);
    TCHECKF(system(args) == 0, "k3gen: %s", args);
    const char *text = "The quick brown fox jumps over the lazy dog. A tokenizer splits text into tokens, and a "
                       "model predicts the next one. 12 + 34 = 46. The end of the text comes after this sentence.";
    FILE *f = fopen(txt, "w");
    fputs(text, f);
    fclose(f);
    /* itself: KL 0 (up to the base file's rounding), agreement 1 */
    const char *self[] = {build_bin("deltafin"), "perplexity", "--model", tiny, "--file", txt, "--window", "12",
                          "--kl-divergence", tiny, "--json", NULL};
    TCHECKF(t_run(self, out_, sizeof out_, err_, sizeof err_) == 0, "%s", err_);
    TCHECKF(json_num(out_, "kld_max") < 1e-6 && json_num(out_, "top1_agreement") == 1.0 &&
                fabs(json_num(out_, "perplexity_ratio") - 1) < 1e-4,
            "a model against itself: %s", out_);
    /* the base's file, then the Q8_0 model against it */
    const char *sv[] = {build_bin("deltafin"), "perplexity", "--model", tiny, "--file", txt, "--window", "12",
                        "--save-logits", base, NULL};
    TCHECKF(t_run(sv, out_, sizeof out_, err_, sizeof err_) == 0, "%s", err_);
    const char *kq[] = {build_bin("deltafin"), "perplexity", "--model", q8, "--file", txt, "--window", "12",
                        "--kl-divergence", base, "--json", NULL};
    TCHECKF(t_run(kq, out_, sizeof out_, err_, sizeof err_) == 0, "%s", err_);
    double kl_cli = json_num(out_, "kld_mean"), agree_cli = json_num(out_, "top1_agreement");
    double ratio_cli = json_num(out_, "perplexity_ratio"), n_cli = json_num(out_, "scored_tokens");
    /* the same from both models' logits, window by window */
    int32_t ids[1024];
    int n = tokenize_ids(tiny, text, ids, 1024);
    double kl = 0, nll_b = 0, nll_q = 0;
    long cnt = 0, agree = 0;
    const int W = 12;
    for (int start = 0; start < n; start += W) {
        int m = n - start < W ? n - start : W;
        if (m < 2) break;
        size_t nb = 0;
        float *rows[2] = {window_logits(tiny, ids + start, m, dump, &nb), window_logits(q8, ids + start, m, dump, &nb)};
        int V = (int)(nb / sizeof(float) / (size_t)m);
        double *lb = malloc((size_t)V * sizeof(double)), *lq = malloc((size_t)V * sizeof(double));
        for (int r = 0; r + 1 < m && rows[0] && rows[1]; r++) {
            lsm(rows[0] + (size_t)r * V, V, lb);
            lsm(rows[1] + (size_t)r * V, V, lq);
            int ab = 0, aq = 0;
            for (int i = 0; i < V; i++) {
                kl += exp(lb[i]) * (lb[i] - lq[i]);
                ab = lb[i] > lb[ab] ? i : ab;
                aq = lq[i] > lq[aq] ? i : aq;
            }
            agree += ab == aq;
            nll_b -= lb[ids[start + r + 1]];
            nll_q -= lq[ids[start + r + 1]];
            cnt++;
        }
        free(lb), free(lq), free(rows[0]), free(rows[1]);
    }
    double kl_mean = kl / (double)cnt, ratio = exp((nll_q - nll_b) / (double)cnt);
    fprintf(stderr, "    %ld tokens: mean KL %.6g (CLI %.6g), agreement %.4f (CLI %.4f), ppl ratio %.6f (CLI %.6f)\n",
            cnt, kl_mean, kl_cli, (double)agree / (double)cnt, agree_cli, ratio, ratio_cli);
    TCHECKF(n_cli == (double)cnt, "scored %g vs %ld", n_cli, cnt);
    TCHECKF(kl_mean > 1e-6, "the Q8_0 model is not different: KL %g", kl_mean);
    TCHECKF(fabs(kl_cli - kl_mean) < 2e-4 + 0.02 * kl_mean, "mean KL %.9g vs %.9g", kl_cli, kl_mean);
    TCHECKF(fabs(agree_cli - (double)agree / (double)cnt) < 1e-9, "agreement %.9g vs %.9g", agree_cli, (double)agree / (double)cnt);
    TCHECKF(fabs(ratio_cli / ratio - 1) < 1e-3, "perplexity ratio %.9g vs %.9g", ratio_cli, ratio);
    /* refusals: another window, both options */
    const char *ow[] = {build_bin("deltafin"), "perplexity", "--model", q8, "--file", txt, "--window", "13",
                        "--kl-divergence", base, NULL};
    TCHECKF(t_run(ow, NULL, 0, err_, sizeof err_) != 0 && strstr(err_, "another text or window"), "%s", err_);
    const char *both[] = {build_bin("deltafin"), "perplexity", "--model", q8, "--file", txt, "--kl-divergence", base,
                          "--save-logits", dump, NULL};
    TCHECKF(t_run(both, NULL, 0, err_, sizeof err_) != 0 && strstr(err_, "give one"), "%s", err_);
}

static const test_case tests[] = {
    {"window_within_mem", test_window_within_mem},
    {"matches_dumped_logits", test_matches_dumped_logits},
    {"bad_input", test_bad_input},
    {"kl_divergence", test_kl_divergence},
};

int main(int argc, char **argv)
{
    int rc = test_main(tests, NTESTS(tests), argc, argv);
    test_scratch_remove();
    return rc;
}
