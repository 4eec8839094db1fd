/* draft.c - see draft.h.  Each drafter owns its memory from open to free;
 * proposing allocates nothing. */
#include "draft.h"
#include "families.h"
#include "util.h"

#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------ ngram */

#define NGRAM_MAX 4

/* The longest suffix of h[0..n) (NGRAM_MAX ids down to 1) found earlier in
 * it, most recent occurrence: its length, and where what followed it
 * starts (*from); 0 when none. */
static int ngram_match(const int32_t *h, size_t n, size_t *from)
{
    for (int m = NGRAM_MAX; m >= 1; m--) {
        if ((size_t)m >= n) continue;
        const int32_t *suf = h + n - m;
        for (size_t at = n - m; at-- > 0;)
            if (h[at] == suf[0] && !memcmp(h + at, suf, (size_t)m * sizeof *h)) {
                *from = at + (size_t)m; /* < n: the occurrence is earlier */
                return m;
            }
    }
    return 0;
}

static int ngram_propose(df_drafter *d, const int32_t *h, size_t n, int32_t *out, int k, df_error *err)
{
    (void)d, (void)err;
    size_t from;
    if (!ngram_match(h, n, &from)) return 0;
    int got = 0;
    for (; got < k && from + (size_t)got < n; got++) out[got] = h[from + (size_t)got];
    return got;
}

/* ----------------------------------------------------------------- lookup */

/* A reference text's ids (lookup:FILE): the history's longest suffix (4 ids
 * down to 1) is looked up in the history (as ngram) and in the reference,
 * at its first occurrence there; what followed the longer match is
 * proposed, the history's on a tie (the more recent text).
 * The reference's 1- to 4-id contexts are indexed once at open (open
 * addressing on the context's hash, the first occurrence kept), so a
 * proposal costs four probes, not a scan. */
typedef struct lookup {
    int32_t *ref;
    size_t n;
    uint32_t *slot;           /* [cap]: position + 1 of a context's first occurrence's end, 0 = empty */
    uint64_t *key;            /* [cap] */
    size_t cap;
} lookup;

static uint64_t lk_key(const int32_t *c, int m)
{
    uint64_t h = 0x51ED27A3u + (uint64_t)m;
    for (int i = 0; i < m; i++) {
        h ^= (uint64_t)(uint32_t)c[i] + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
        h *= 0xBF58476D1CE4E5B9ull;
    }
    return h | 1;
}

/* The end of the first occurrence of c[0..m) in the reference (the index of
 * what follows it), or 0 when none. */
static size_t lk_find(const lookup *x, const int32_t *c, int m)
{
    uint64_t k = lk_key(c, m);
    for (size_t i = (size_t)(k >> 5) & (x->cap - 1);; i = (i + 1) & (x->cap - 1)) {
        if (!x->slot[i]) return 0;
        size_t end = x->slot[i];
        if (x->key[i] == k && end >= (size_t)m && !memcmp(x->ref + end - m, c, (size_t)m * sizeof *c)) return end;
    }
}

static int lookup_propose(df_drafter *d, const int32_t *h, size_t n, int32_t *out, int k, df_error *err)
{
    (void)err;
    const lookup *x = d->state;
    size_t hfrom = 0, rfrom = 0;
    int mh = ngram_match(h, n, &hfrom), mr = 0;
    for (int m = NGRAM_MAX; m > mh && !mr; m--)
        if ((size_t)m <= n && (rfrom = lk_find(x, h + n - m, m)) && rfrom < x->n) mr = m;
    const int32_t *src = mr ? x->ref : h;
    size_t from = mr ? rfrom : hfrom, end = mr ? x->n : n;
    int got = 0;
    if (mr || mh)
        for (; got < k && from + (size_t)got < end; got++) out[got] = src[from + (size_t)got];
    return got;
}

static void lookup_destroy(df_drafter *d)
{
    lookup *x = d->state;
    if (!x) return;
    free(x->ref), free(x->slot), free(x->key);
    free(x);
    d->state = NULL;
}

int df_drafter_open_lookup(const int32_t *ids, size_t n, const char *name, df_drafter **out, df_error *err)
{
    *out = NULL;
    if (n < 2) return df_err_set(err, DF_ERR_ARG, -1, "--draft %s: the reference has %zu ids (at least 2)", name, n);
    if (n > ((size_t)1 << 22)) /* its index takes 96 bytes an id */
        return df_err_set(err, DF_ERR_LIMIT, -1, "--draft %s: the reference has %zu ids (at most 4,194,304)", name, n);
    lookup *x = xcalloc(1, sizeof *x);
    x->ref = xmalloc(n * sizeof *x->ref);
    memcpy(x->ref, ids, n * sizeof *ids);
    x->n = n;
    for (x->cap = 64; x->cap < 2 * NGRAM_MAX * n; x->cap *= 2) {}
    x->slot = xcalloc(x->cap, sizeof *x->slot);
    x->key = xcalloc(x->cap, sizeof *x->key);
    for (size_t end = 1; end < n; end++) /* contexts ending before the last id: something follows them */
        for (int m = 1; m <= NGRAM_MAX && (size_t)m <= end; m++) {
            const int32_t *c = ids + end - m;
            if (lk_find(x, c, m)) continue; /* the first occurrence stays */
            uint64_t k = lk_key(c, m);
            size_t i = (size_t)(k >> 5) & (x->cap - 1);
            while (x->slot[i]) i = (i + 1) & (x->cap - 1);
            x->slot[i] = (uint32_t)end;
            x->key[i] = k;
        }
    df_drafter *d = xcalloc(1, sizeof *d);
    d->name = "lookup";
    d->state = x;
    d->propose = lookup_propose;
    d->destroy = lookup_destroy;
    *out = d;
    return 0;
}

/* ----------------------------------------------------------------- suffix */

/* Open addressing over two kinds of entries: a context (the last m ids,
 * m = 1..4) with its total count and most frequent follower, and a
 * (context, follower) pair with its count.  Cleared when it fills. */
#define SUFFIX_BITS 18
#define SUFFIX_CAP ((size_t)1 << SUFFIX_BITS)

typedef struct sfx_entry {
    uint64_t key;             /* 0 = empty */
    uint32_t count;           /* pair: its count; context: the total */
    int32_t best;             /* context: most frequent follower */
    uint32_t best_count;
    uint32_t pad;
} sfx_entry;

typedef struct sfx {
    sfx_entry *tab;
    size_t used;
    size_t n_seen;            /* history ids taken in */
} sfx;

static uint64_t mix(uint64_t z)
{
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static uint64_t ctx_key(const int32_t *c, int m)
{
    uint64_t h = mix((uint64_t)m);
    for (int i = 0; i < m; i++) h = mix(h ^ (uint64_t)(uint32_t)c[i]);
    return h | 1; /* never 0 */
}

static uint64_t pair_key(uint64_t ctx, int32_t next) { return mix(ctx ^ ((uint64_t)(uint32_t)next << 1)) | 1; }

static sfx_entry *sfx_slot(sfx *x, uint64_t key, int create)
{
    size_t i = (size_t)(key >> 7) & (SUFFIX_CAP - 1);
    for (;;) {
        sfx_entry *e = &x->tab[i];
        if (e->key == key) return e;
        if (!e->key) {
            if (!create) return NULL;
            e->key = key;
            x->used++;
            return e;
        }
        i = (i + 1) & (SUFFIX_CAP - 1);
    }
}

static void sfx_add(sfx *x, const int32_t *h, size_t i)
{
    if (x->used * 10 > SUFFIX_CAP * 7) {
        memset(x->tab, 0, SUFFIX_CAP * sizeof *x->tab);
        x->used = 0;
    }
    for (int m = 1; m <= NGRAM_MAX && (size_t)m <= i; m++) {
        uint64_t ck = ctx_key(h + i - m, m);
        sfx_entry *p = sfx_slot(x, pair_key(ck, h[i]), 1);
        p->count++;
        sfx_entry *c = sfx_slot(x, ck, 1);
        c->count++;
        if (p->count > c->best_count) {
            c->best_count = p->count;
            c->best = h[i];
        }
    }
}

static int sfx_propose(df_drafter *d, const int32_t *h, size_t n, int32_t *out, int k, df_error *err)
{
    (void)err;
    sfx *x = d->state;
    if (x->n_seen > n) x->n_seen = n;
    for (; x->n_seen < n; x->n_seen++) sfx_add(x, h, x->n_seen);
    /* the context window: the history's last ids, then the drafts */
    int32_t win[NGRAM_MAX + GEN_MAX_DRAFT];
    int w = 0;
    for (size_t i = n > NGRAM_MAX ? n - NGRAM_MAX : 0; i < n; i++) win[w++] = h[i];
    int got = 0;
    while (got < k) {
        int32_t next = -1;
        for (int m = w < NGRAM_MAX ? w : NGRAM_MAX; m >= 1 && next < 0; m--) {
            const sfx_entry *c = sfx_slot(x, ctx_key(win + w - m, m), 0);
            /* confident: seen twice, and the follower holds half of it */
            if (c && c->count >= 2 && 2 * c->best_count >= c->count) next = c->best;
        }
        if (next < 0) break;
        out[got++] = next;
        win[w++] = next;
    }
    return got;
}

static void sfx_reset(df_drafter *d) { ((sfx *)d->state)->n_seen = 0; }

static void sfx_destroy(df_drafter *d)
{
    sfx *x = d->state;
    free(x->tab);
    free(x);
}

/* ------------------------------------------------------------------ model */

typedef struct mdraft {
    const df_family *fam;
    df_family_model *fm;
    df_family_state *s;
    int V;
    float *logits;            /* [V] */
    int32_t *held;            /* ids in the draft state (history from `base`), then drafts */
    size_t n_held, cap;
    size_t base;              /* the history position of held[0] */
    int fresh;                /* logits is the distribution after held[n_held - 1] */
} mdraft;

/* A proposal after a gap longer than this (the drafter was held off, and
 * the draft state did not follow the history) restarts the draft state on
 * the last MD_WINDOW ids instead of evaluating the whole gap: a held-off
 * draft model then costs a bounded amount at each retry, not its own pass
 * over every token of the run. */
#define MD_GAP_MAX 256
#define MD_WINDOW 256

/* Evaluate what the draft state lacks of h[0..n) (`win` > 0: at most win
 * ids after a long gap or past the draft context): afterwards it holds
 * h[base..n) and m->logits is the distribution after it. */
static int md_catch_up(mdraft *m, const int32_t *h, size_t n, size_t win, df_error *err)
{
    size_t L = 0;
    if (m->base < n)
        while (L < m->n_held && m->base + L < n && m->held[L] == h[m->base + L]) L++;
    if (m->base + L == n && m->n_held == L && m->fresh) return 0;
    if (L && m->base + L == n) L--; /* evaluate the last id again: its logits are needed */
    size_t gap = n - (m->base + L);
    int restart = !L && m->base > 0;
    if (win && (gap > MD_GAP_MAX || n - m->base + 1 > m->cap)) restart = 1;
    if (restart) {
        m->fam->truncate(m->s, 0);
        m->base = win && n > win ? n - win : 0;
        L = 0;
    } else if (L < m->n_held) {
        L = (size_t)m->fam->truncate(m->s, (int)L); /* less where the state cannot go back to L */
    }
    m->n_held = L;
    m->fresh = 0;
    if (m->fam->forward(m->fm, m->s, h + m->base + L, (int)(n - m->base - L), m->logits, 1, err)) {
        df_err_prefix(err, "draft model");
        return -1;
    }
    memcpy(m->held + L, h + m->base + L, (n - m->base - L) * sizeof *h);
    m->n_held = n - m->base;
    m->fresh = 1;
    return 0;
}

/* A prompt: evaluated by the draft model now, as part of the prompt, so
 * that drafting later pays only for the ids that follow. */
static int md_sync(df_drafter *d, const int32_t *h, size_t n, df_error *err)
{
    mdraft *m = d->state;
    if (!n || n + 1 > m->cap) return 0;
    return md_catch_up(m, h, n, 0, err);
}

static int md_propose(df_drafter *d, const int32_t *h, size_t n, int32_t *out, int k, df_error *err)
{
    mdraft *m = d->state;
    if (!n) return 0;
    /* the window restarted on: MD_WINDOW ids, fewer when the draft context
     * (the target's --ctx) is smaller, so that k drafts still fit */
    size_t win = MD_WINDOW;
    if (win + (size_t)k + 1 > m->cap) {
        if (m->cap < (size_t)k + 2) return 0; /* no room for one id and k drafts */
        win = m->cap - (size_t)k - 1;
    }
    if (md_catch_up(m, h, n, win, err)) return -1;
    if (n - m->base + (size_t)k + 1 > m->cap) return 0; /* past the draft context: no drafts */
    if (m->fam->mark(m->s, err)) return -1;
    for (int i = 0; i < k; i++) {
        out[i] = (int32_t)df_argmax(m->logits, m->V);
        if (i + 1 == k) break;
        if (m->fam->forward(m->fm, m->s, &out[i], 1, m->logits, 1, err)) {
            df_err_prefix(err, "draft model");
            return -1;
        }
        m->held[m->n_held++] = out[i];
    }
    return k;
}

static void md_reset(df_drafter *d)
{
    mdraft *m = d->state;
    m->fam->truncate(m->s, 0);
    m->n_held = 0;
    m->base = 0;
    m->fresh = 0;
}

static void md_destroy(df_drafter *d)
{
    mdraft *m = d->state;
    if (m->s) m->fam->state_free(m->s);
    if (m->fm) m->fam->close(m->fm);
    free(m->logits);
    free(m->held);
    free(m);
}

void df_drafter_model_opts(size_t mem_budget, int n_ctx, int n_threads, df_family_opts *o)
{
    /* the kernels: the family's choice (the same bits on each) */
    *o = (df_family_opts){.n_threads = n_threads, .mem_budget = mem_budget, .n_ctx = n_ctx, .max_rows = 64,
                          .rollback = GEN_MAX_DRAFT + 2};
}

static int model_open(const char *path, size_t mem_budget, int n_ctx, int n_threads, int target_vocab, df_drafter *d,
                      df_error *err)
{
    mdraft *m = xcalloc(1, sizeof *m);
    d->state = m;
    d->destroy = md_destroy;
    df_family_opts o;
    df_drafter_model_opts(mem_budget, n_ctx, n_threads, &o);
    if (!(m->fam = family_of(path, err)) || m->fam->open(path, &o, &m->fm, err))
        goto fail;
    m->V = m->fam->vocab(m->fm);
    if (m->V != target_vocab) {
        df_err_set(err, DF_ERR_ARG, -1,
                   "its vocabulary has %d ids, the target's %d (a draft model must share the target's tokenizer)",
                   m->V, target_vocab);
        goto fail;
    }
    if (m->fam->state_new(m->fm, n_ctx, &m->s, err)) goto fail;
    m->logits = xmalloc((size_t)m->V * sizeof *m->logits);
    m->cap = (size_t)n_ctx;
    m->held = xmalloc(m->cap * sizeof *m->held);
    d->propose = md_propose;
    d->sync = md_sync;
    d->reset = md_reset;
    return 0;
fail:
    df_err_prefix(err, "--draft model:%s", path);
    md_destroy(d);
    d->state = NULL;
    d->destroy = NULL;
    return -1;
}

/* ------------------------------------------------------------------- open */

int df_drafter_open(const char *spec, size_t mem_budget, int n_ctx, int n_threads, int target_vocab, df_drafter **out,
                    df_error *err)
{
    *out = NULL;
    if (!spec || !strcmp(spec, "none")) return 0;
    df_drafter *d = xcalloc(1, sizeof *d);
    if (!strcmp(spec, "ngram")) {
        d->name = "ngram";
        d->propose = ngram_propose;
    } else if (!strcmp(spec, "suffix")) {
        d->name = "suffix";
        sfx *x = xcalloc(1, sizeof *x);
        x->tab = xmalloc(SUFFIX_CAP * sizeof *x->tab);
        /* touched now, not by the first proposals (page faults in decode) */
        memset(x->tab, 0, SUFFIX_CAP * sizeof *x->tab);
        d->state = x;
        d->propose = sfx_propose;
        d->reset = sfx_reset;
        d->destroy = sfx_destroy;
    } else if (!strncmp(spec, "model:", 6) && spec[6]) {
        d->name = "model";
        if (model_open(spec + 6, mem_budget, n_ctx, n_threads, target_vocab, d, err)) {
            free(d);
            return -1;
        }
    } else {
        free(d);
        return df_err_set(err, DF_ERR_ARG, -1, "--draft \"%s\": expected none, ngram, suffix or model:PATH", spec);
    }
    *out = d;
    return 0;
}

int df_drafter_window(const df_drafter *d, size_t *base, size_t *held)
{
    if (!d || d->propose != md_propose) return -1;
    const mdraft *m = d->state;
    *base = m->base;
    *held = m->n_held;
    return 0;
}

void df_drafter_free(df_drafter *d)
{
    if (!d) return;
    if (d->destroy) d->destroy(d);
    free(d);
}
