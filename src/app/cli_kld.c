/* cli_kld.c - what a quantized (or otherwise changed) model lost against a
 * base model, on a text: perplexity's KL-divergence mode (llama.cpp's
 * llama-perplexity --kl-divergence is the anchor).
 *
 * The base's distribution over the vocabulary at every scored position is
 * kept in a file (--save-logits FILE on the base's perplexity run, or, when
 * --kl-divergence names a model rather than a file, a base run into a
 * temporary file first: the two engines never hold memory at once, so each
 * is planned under --mem like any perplexity run).  The file holds, per
 * scored row, the log-softmax compressed as llama.cpp's does it: the row's
 * argmax id (int32, exact), its lowest kept log-probability lo (at least
 * -KLD_FLOOR) as f32, then V uint16 q with logprob = lo * (1 - q / 65535)
 * (65,535 steps from lo to 0: 6.1e-4 nats at the floor, far below what a
 * changed model moves).  Its
 * header names the vocabulary, the window and a hash of the text's ids, so
 * a file from another text, window or tokenizer is refused.
 *
 * Reported (text and --json): mean KL(base || model) with its standard
 * error, median, 99th and 99.9th percentiles and maximum; top-1 agreement;
 * the perplexities of both and their ratio.  KL is summed in double over the
 * vocabulary, in id order.
 */
#define _GNU_SOURCE
#include "cli.h"
#include "options.h"
#include "util.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KLD_MAGIC "DFKLD001"
#define KLD_FLOOR 40.0

typedef struct kld_header {
    char magic[8];
    uint32_t vocab, window;
    uint64_t n_ids, ids_hash;
} kld_header;

uint64_t kld_ids_hash(const int32_t *ids, size_t n)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a over the ids' bytes */
    for (size_t i = 0; i < n; i++)
        for (int b = 0; b < 4; b++) {
            h ^= (uint64_t)(((uint32_t)ids[i] >> (8 * b)) & 0xff);
            h *= 1099511628211ull;
        }
    return h;
}

/* log-softmax of a row, in double, into lp[V]; returns its argmax */
static int log_softmax(const float *x, int V, double *lp)
{
    int am = 0;
    double mx = x[0];
    for (int i = 1; i < V; i++)
        if (x[i] > mx) mx = x[i], am = i;
    double s = 0.0;
    for (int i = 0; i < V; i++) s += exp((double)x[i] - mx);
    double ls = log(s) + mx;
    for (int i = 0; i < V; i++) lp[i] = (double)x[i] - ls;
    return am;
}

int kld_writer_open(kld_writer *w, const char *path, int V, int W, const int32_t *ids, size_t n)
{
    memset(w, 0, sizeof *w);
    w->f = fopen(path, "wb");
    if (!w->f) {
        fprintf(stderr, "deltafin: --save-logits %s: %s\n", path, strerror(errno));
        return -1;
    }
    w->V = V;
    w->lp = xmalloc((size_t)V * sizeof *w->lp);
    w->q = xmalloc((size_t)V * sizeof *w->q);
    kld_header h = {.vocab = (uint32_t)V, .window = (uint32_t)W, .n_ids = n, .ids_hash = kld_ids_hash(ids, n)};
    memcpy(h.magic, KLD_MAGIC, 8);
    if (fwrite(&h, sizeof h, 1, w->f) != 1) return -1;
    return 0;
}

int kld_writer_row(kld_writer *w, const float *logits)
{
    int32_t top = log_softmax(logits, w->V, w->lp);
    double lo = 0.0;
    for (int i = 0; i < w->V; i++)
        if (w->lp[i] < lo) lo = w->lp[i];
    if (lo < -KLD_FLOOR) lo = -KLD_FLOOR;
    if (lo > -1e-30) lo = -1e-30;
    float lof = (float)lo;
    for (int i = 0; i < w->V; i++) {
        double v = w->lp[i] < lo ? lo : w->lp[i];
        double q = (1.0 - v / (double)lof) * 65535.0;
        w->q[i] = (uint16_t)(q < 0 ? 0 : q > 65535 ? 65535 : floor(q + 0.5));
    }
    if (fwrite(&top, 4, 1, w->f) != 1 || fwrite(&lof, 4, 1, w->f) != 1 ||
        fwrite(w->q, 2, (size_t)w->V, w->f) != (size_t)w->V)
        return -1;
    return 0;
}

int kld_writer_close(kld_writer *w)
{
    int rc = w->f && (ferror(w->f) | fclose(w->f)) ? -1 : 0;
    free(w->lp);
    free(w->q);
    memset(w, 0, sizeof *w);
    return rc;
}

int kld_reader_open(kld_reader *r, const char *path, int V, int W, const int32_t *ids, size_t n, char *why,
                    size_t nwhy)
{
    memset(r, 0, sizeof *r);
    r->f = fopen(path, "rb");
    if (!r->f) {
        snprintf(why, nwhy, "%s: %s", path, strerror(errno));
        return -1;
    }
    kld_header h;
    if (fread(&h, sizeof h, 1, r->f) != 1 || memcmp(h.magic, KLD_MAGIC, 8)) {
        snprintf(why, nwhy, "%s: not a deltafin base-logits file (perplexity --save-logits)", path);
        goto bad;
    }
    if (h.vocab != (uint32_t)V) {
        snprintf(why, nwhy, "%s: its vocabulary is %u, the model's %d", path, h.vocab, V);
        goto bad;
    }
    if (h.window != (uint32_t)W || h.n_ids != n || h.ids_hash != kld_ids_hash(ids, n)) {
        snprintf(why, nwhy, "%s: written for another text or window (%llu ids in windows of %u; this run: %zu in "
                 "windows of %d)", path, (unsigned long long)h.n_ids, h.window, n, W);
        goto bad;
    }
    r->V = V;
    r->lp = xmalloc((size_t)V * sizeof *r->lp);
    r->mlp = xmalloc((size_t)V * sizeof *r->mlp);
    r->q = xmalloc((size_t)V * sizeof *r->q);
    return 0;
bad:
    fclose(r->f);
    r->f = NULL;
    return -1;
}

/* the base's next row against the model's logits: KL(base || model), the
 * base's NLL of next, and whether the two argmaxes agree */
int kld_reader_row(kld_reader *r, const float *logits, int32_t next, double *kl, double *base_nll, int *same_top)
{
    float lof;
    int32_t bam;
    if (fread(&bam, 4, 1, r->f) != 1 || fread(&lof, 4, 1, r->f) != 1 ||
        fread(r->q, 2, (size_t)r->V, r->f) != (size_t)r->V)
        return -1;
    for (int i = 0; i < r->V; i++) r->lp[i] = (double)lof * (1.0 - (double)r->q[i] / 65535.0);
    /* the stored values are rounded: renormalise so the base sums to 1 */
    double s = 0.0;
    for (int i = 0; i < r->V; i++) s += exp(r->lp[i]);
    double ls = log(s);
    int mam = log_softmax(logits, r->V, r->mlp);
    double k = 0.0;
    for (int i = 0; i < r->V; i++) {
        double b = r->lp[i] - ls;
        k += exp(b) * (b - r->mlp[i]);
    }
    *kl = k < 0 ? 0 : k;
    *base_nll = -(r->lp[next] - ls);
    *same_top = bam == mam;
    return 0;
}

void kld_reader_close(kld_reader *r)
{
    if (r->f) fclose(r->f);
    free(r->lp);
    free(r->mlp);
    free(r->q);
    memset(r, 0, sizeof *r);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double pct(const double *s, size_t n, double p)
{
    size_t i = (size_t)(p * (double)(n - 1) + 0.5);
    return s[i < n ? i : n - 1];
}

void kld_report(const char *file, double *kls, size_t n, uint64_t same_top, double nll, double base_nll, int json)
{
    double sum = 0, sq = 0;
    for (size_t i = 0; i < n; i++) sum += kls[i], sq += kls[i] * kls[i];
    double mean = n ? sum / (double)n : 0, var = n > 1 ? (sq - sum * mean) / (double)(n - 1) : 0;
    double se = n > 1 && var > 0 ? sqrt(var / (double)n) : 0;
    qsort(kls, n, sizeof *kls, cmp_double);
    double ppl = exp(nll / (double)n), bppl = exp(base_nll / (double)n);
    if (json)
        printf("{\"file\":\"%s\",\"scored_tokens\":%zu,\"kld_mean\":%.10g,\"kld_stderr\":%.10g,\"kld_median\":%.10g,"
               "\"kld_p99\":%.10g,\"kld_p999\":%.10g,\"kld_max\":%.10g,\"top1_agreement\":%.10g,"
               "\"perplexity\":%.10g,\"base_perplexity\":%.10g,\"perplexity_ratio\":%.10g}\n",
               file, n, mean, se, pct(kls, n, 0.5), pct(kls, n, 0.99), pct(kls, n, 0.999), kls[n - 1],
               (double)same_top / (double)n, ppl, bppl, ppl / bppl);
    else
        printf("%s: %zu tokens: KL divergence from the base mean %.6f +- %.6f nats, median %.6f, 99%% %.6f, "
               "99.9%% %.6f, max %.6f; top-1 agreement %.2f%%; perplexity %.4f against the base's %.4f (ratio "
               "%.5f)\n",
               file, n, mean, se, pct(kls, n, 0.5), pct(kls, n, 0.99), pct(kls, n, 0.999), kls[n - 1],
               100.0 * (double)same_top / (double)n, ppl, bppl, ppl / bppl);
}
