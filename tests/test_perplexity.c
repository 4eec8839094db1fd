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
    const char *t[] = {build_bin("deltafin"), "tokenize", "--model", tiny, "--", text, NULL};
    TCHECK(t_run(t, out_, sizeof out_, err_, sizeof err_) == 0);
    int32_t ids[1024];
    int n = 0;
    for (char *p = out_; *p && n < 1024;) {
        ids[n++] = (int32_t)strtol(p, &p, 10);
        if (*p == ',') p++;
        else break;
    }
    double nll = 0;
    long cnt = 0;
    for (int start = 0; start < n; start += W) {
        int m = n - start < W ? n - start : W;
        if (m < 2) break;
        char list[4096];
        size_t k = 0;
        for (int i = 0; i < m; i++) k += (size_t)snprintf(list + k, sizeof list - k, "%s%d", i ? "," : "", ids[start + i]);
        const char *r[] = {build_bin("deltafin"), "run", "--model", tiny, "--prompt-ids", list, "--max-new", "0",
                           "--dump-logits", dump, NULL};
        TCHECKF(t_run(r, NULL, 0, err_, sizeof err_) == 0, "%s", err_);
        FILE *g = fopen(dump, "rb");
        TCHECK(g != NULL);
        if (!g) return;
        static float lg[64 * 640];
        size_t got = fread(lg, sizeof(float) * 640, 64, g);
        fclose(g);
        TCHECK(got == (size_t)m);
        for (int t2 = 0; t2 + 1 < m; t2++) {
            const float *row = lg + (size_t)t2 * 640;
            double mx = row[0], sum = 0;
            for (int i = 1; i < 640; i++) mx = row[i] > mx ? row[i] : mx;
            for (int i = 0; i < 640; i++) sum += exp((double)row[i] - mx);
            nll += log(sum) + mx - row[ids[start + t2 + 1]];
            cnt++;
        }
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

static const test_case tests[] = {
    {"window_within_mem", test_window_within_mem},
    {"matches_dumped_logits", test_matches_dumped_logits},
    {"bad_input", test_bad_input},
};

int main(int argc, char **argv)
{
    int rc = test_main(tests, NTESTS(tests), argc, argv);
    test_scratch_remove();
    return rc;
}
