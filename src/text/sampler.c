/* sampler.c - see sampler.h. */
#include "sampler.h"
#include "mathfn.h"
#include "util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static uint64_t splitmix64(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

void sampler_init(sampler *s, int vocab, double temperature, double top_p, int top_k, uint64_t seed)
{
    memset(s, 0, sizeof *s);
    s->vocab = vocab;
    s->work = xmalloc((size_t)vocab * sizeof *s->work);
    s->pairs = xmalloc((size_t)vocab * sizeof *s->pairs);
    sampler_reset(s, temperature, top_p, top_k, seed);
}

void sampler_reset(sampler *s, double temperature, double top_p, int top_k, uint64_t seed)
{
    s->temperature = temperature;
    s->top_p = top_p > 0 && top_p < 1 ? top_p : 1;
    s->top_k = top_k > 0 && top_k < s->vocab ? top_k : 0;
    s->rng = seed;
}

void sampler_free(sampler *s)
{
    free(s->work);
    free(s->pairs);
    memset(s, 0, sizeof *s);
}

/* x before y: more probable first, ties to the lower id (a total order, so
 * any correct sort gives the same sequence) */
static int before(const sampler_pair *x, const sampler_pair *y)
{
    return x->p != y->p ? x->p > y->p : x->id < y->id;
}

static void sift(sampler_pair *a, size_t i, size_t n)
{
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) return;
        /* a max-heap of "after": the root is the last in order */
        if (c + 1 < n && before(&a[c], &a[c + 1])) c++;
        if (!before(&a[i], &a[c])) return;
        sampler_pair t = a[i];
        a[i] = a[c];
        a[c] = t;
        i = c;
    }
}

static void sort_pairs(sampler_pair *a, size_t n)
{
    for (size_t i = n / 2; i-- > 0;) sift(a, i, n);
    for (size_t end = n; end > 1; end--) {
        sampler_pair t = a[0];
        a[0] = a[end - 1];
        a[end - 1] = t;
        sift(a, 0, end - 1);
    }
}

/* s->work[0..vocab) holds the weights, `sum` their total: sort them into
 * s->pairs, keep the top_k, then the smallest prefix whose mass reaches
 * top_p of theirs; returns its length, *mass its weight. */
static int nucleus(sampler *s, double sum, double *mass)
{
    int V = s->vocab;
    for (int i = 0; i < V; i++) s->pairs[i] = (sampler_pair){s->work[i], i};
    sort_pairs(s->pairs, (size_t)V);
    int n = s->top_k ? s->top_k : V;
    if (s->top_k) {
        sum = 0;
        for (int i = 0; i < n; i++) sum += s->pairs[i].p;
    }
    double acc = 0, cut = s->top_p * sum;
    int k = 0;
    while (k < n && acc < cut) acc += s->pairs[k++].p;
    *mass = acc;
    return k;
}

int32_t sampler_next(sampler *s, const float *lg)
{
    int V = s->vocab;
    if (s->temperature <= 0) {
        int best = 0;
        for (int i = 1; i < V; i++)
            if (lg[i] > lg[best]) best = i;
        return (int32_t)best;
    }
    double m = -INFINITY, sum = 0;
    for (int i = 0; i < V; i++)
        if (lg[i] > m) m = lg[i];
    for (int i = 0; i < V; i++) sum += s->work[i] = exp(((double)lg[i] - m) / s->temperature);
    double u = (double)(splitmix64(&s->rng) >> 11) * 0x1.0p-53;
    if (s->top_p < 1 || s->top_k) {
        double acc;
        int k = nucleus(s, sum, &acc);
        double t = u * acc, c = 0;
        for (int i = 0; i < k; i++) {
            c += s->pairs[i].p;
            if (t < c) return (int32_t)s->pairs[i].id;
        }
        return (int32_t)s->pairs[k - 1].id;
    }
    double t = u * sum, c = 0;
    int last = 0;
    for (int i = 0; i < V; i++) {
        if (s->work[i] > 0) last = i;
        c += s->work[i];
        if (t < c) return (int32_t)i;
    }
    return (int32_t)last;
}

/* Speculative verification with a drafted id (a point-mass proposal):
 * greedy takes the argmax (accepted when it is the draft); sampling
 * accepts the draft with its probability p(draft) under the same
 * distribution sampler_next draws from, and otherwise draws from that
 * distribution with the draft removed.  Either way the id returned has
 * exactly the distribution sampler_next's has: p(d) * 1[x = d] + (1 - p(d))
 * * p(x) / (1 - p(d)) * 1[x != d] = p(x).  Two uniforms from the stream
 * when rejected, one when accepted. */
int32_t sampler_verify(sampler *s, const float *lg, int32_t draft, int *accepted)
{
    int V = s->vocab;
    if (s->temperature <= 0) {
        int32_t best = sampler_next(s, lg);
        *accepted = best == draft;
        return best;
    }
    double m = -INFINITY, sum = 0;
    for (int i = 0; i < V; i++)
        if (lg[i] > m) m = lg[i];
    for (int i = 0; i < V; i++) sum += s->work[i] = exp(((double)lg[i] - m) / s->temperature);
    double u = (double)(splitmix64(&s->rng) >> 11) * 0x1.0p-53;
    int n = V;
    const sampler_pair *pr = NULL;
    double total = sum, wd = draft >= 0 && draft < V ? s->work[draft] : 0;
    if (s->top_p < 1 || s->top_k) {
        n = nucleus(s, sum, &total);
        pr = s->pairs;
        wd = 0;
        for (int i = 0; i < n; i++)
            if (pr[i].id == draft) wd = pr[i].p;
    }
    if (u * total < wd) {
        *accepted = 1;
        return draft;
    }
    *accepted = 0;
    double v = (double)(splitmix64(&s->rng) >> 11) * 0x1.0p-53;
    double t = v * (total - wd), c = 0;
    int32_t last = -1;
    for (int i = 0; i < n; i++) {
        int id = pr ? pr[i].id : i;
        double w = pr ? pr[i].p : s->work[i];
        if (id == draft || w <= 0) continue;
        last = id;
        c += w;
        if (t < c) return id;
    }
    return last >= 0 ? last : draft;
}

double sampler_logsumexp(const float *lg, int V)
{
    double m = -INFINITY, sum = 0;
    for (int i = 0; i < V; i++)
        if (lg[i] > m) m = lg[i];
    for (int i = 0; i < V; i++) sum += exp((double)lg[i] - m);
    return m + log(sum);
}

int sampler_top_ids(const float *lg, int V, int k, int *top) { return df_topk(lg, V, k, top); }
