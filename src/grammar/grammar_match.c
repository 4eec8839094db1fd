/* grammar_match.c - the matcher: which tokens can follow, exactly, and
 * cheaply (see grammar.h).
 *
 * State: a set of stacks of frames (machine, state, count), each as it is
 * after the last symbol; its closure (every stack reachable by calling and
 * returning without consuming) is computed once per step and cached.
 *
 * The mask.  A token is allowed iff its symbols can be consumed from some
 * stack of the closure.  Consuming starts with a symbol edge of the stack's
 * top frame; calls and returns before the first symbol are other stacks of
 * the closure.  So for each (machine, state) the vocabulary splits, once,
 * into three classes by walking the byte trie of the vocabulary along that
 * machine's symbol edges only:
 *  - accepted: every symbol consumed by symbol edges of that machine: the
 *    token is allowed whatever lies below on the stack.  For a counted
 *    machine the walk also records the range of counts [lo, hi] for which
 *    the path stays viable, so a count near maxLength still masks exactly;
 *  - rejected: the walk fails before passing any state that can call or
 *    return: no other path exists;
 *  - uncertain: the walk failed (or, counted, may be out of range) after
 *    passing a state that can call or return; only these are simulated in
 *    full from the actual stack at run time (a token that closes a JSON
 *    string and goes on with `",` is one of them).  They are kept as
 *    subtrees of the trie and walked in preorder: a token whose simulation
 *    dies after p + 1 symbols rules out every token below its prefix of
 *    that length, so a whitespace state whose 40,000 uncertain tokens
 *    (" the", " of"...) die on their second byte costs a few hundred
 *    simulations; a counted machine's out-of-range tokens are skipped the
 *    same way.  Before a simulation, the token's own path in the machine
 *    is followed: when no state on it calls, and no state on it that
 *    returns is followed by a symbol that may come after a return from
 *    this stack (computed once per stack and step), the token cannot leave
 *    the machine and dies where its path does (a slug pattern's 28,000
 *    uncertain subtrees at 163,840 tokens cost no simulation).  A
 *    simulation copies and hashes whole stacks, so deep ones run on their
 *    top frames first, and on the whole stack only when a token returns
 *    below them.
 * Inside a free string almost every token is in the first class and the
 * step costs a copy of a bitset; the classes are computed the first time a
 * (machine, state) is met, or all at once by gr_matcher_warm, and kept in
 * the grammar for every matcher on the same vocabulary.
 *
 * Stacks live in fixed arrays (GR_MAX_STACKS x GR_MAX_DEPTH frames) owned
 * by the matcher: stepping and masking allocate nothing.  More stacks than
 * that (a grammar ambiguous beyond reason) or deeper nesting drops the
 * excess and sets the matcher's overflow flag (gr_matcher_overflow), which
 * the caller reports; it never admits an invalid token.
 */
#include "grammar.h"
#include "grammar_impl.h"
#include "util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- vocabulary --------------------------------------------------------- */

struct gr_vocab {
    int n;
    uint8_t *bytes;   /* ordinary tokens' bytes, concatenated */
    size_t *off;      /* [n + 1] */
    int *special;     /* [n] GR_SYM_*, -1 ordinary, -2 never */
    int *specials;    /* ids with special >= 0 */
    int n_specials;
    /* the byte trie in preorder: node i spells the path to it */
    int n_nodes;
    uint8_t *nb;      /* [n_nodes] its byte */
    int *nd;          /* [n_nodes] its depth (1 = first byte) */
    int *nend;        /* [n_nodes] the index past its subtree */
    int *npar;        /* [n_nodes] its parent, or -1 at depth 1 */
    int *ntok;        /* [n_nodes] a token spelled exactly so, or -1 */
    int *tnext;       /* [n] the next token with the same bytes, or -1 */
    int max_len;
};

static const gr_vocab *sort_vocab;

static int cmp_tok(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    const gr_vocab *v = sort_vocab;
    size_t lx = v->off[x + 1] - v->off[x], ly = v->off[y + 1] - v->off[y];
    size_t l = lx < ly ? lx : ly;
    int c = memcmp(v->bytes + v->off[x], v->bytes + v->off[y], l);
    if (c) return c;
    if (lx != ly) return lx < ly ? -1 : 1;
    return (x > y) - (x < y);
}

gr_vocab *gr_vocab_new(int n_vocab, const char *const *bytes, const size_t *len, const int *special)
{
    gr_vocab *v = xcalloc(1, sizeof *v);
    v->n = n_vocab;
    v->off = xcalloc((size_t)n_vocab + 1, sizeof *v->off);
    v->special = xmalloc(((size_t)n_vocab ? (size_t)n_vocab : 1) * sizeof *v->special);
    v->tnext = xmalloc(((size_t)n_vocab ? (size_t)n_vocab : 1) * sizeof *v->tnext);
    size_t total = 0;
    for (int i = 0; i < n_vocab; i++) {
        int sp = special ? special[i] : -1;
        if (sp == -1 && (!bytes[i] || !len[i])) sp = -2;
        if (sp >= 0 && sp < 256) sp = -2;
        v->special[i] = sp;
        v->tnext[i] = -1;
        if (sp == -1) total += len[i];
        if (sp >= 0) v->n_specials++;
    }
    v->bytes = xmalloc(total ? total : 1);
    v->specials = xmalloc(((size_t)v->n_specials ? (size_t)v->n_specials : 1) * sizeof *v->specials);
    size_t at = 0;
    int ns = 0, n_ord = 0;
    for (int i = 0; i < n_vocab; i++) {
        v->off[i] = at;
        if (v->special[i] == -1) {
            memcpy(v->bytes + at, bytes[i], len[i]);
            at += len[i];
            if ((int)len[i] > v->max_len) v->max_len = (int)len[i];
            n_ord++;
        } else if (v->special[i] >= 0) {
            v->specials[ns++] = i;
        }
    }
    v->off[n_vocab] = at;
    int *ids = xmalloc(((size_t)n_ord ? (size_t)n_ord : 1) * sizeof *ids);
    int k = 0;
    for (int i = 0; i < n_vocab; i++)
        if (v->special[i] == -1) ids[k++] = i;
    sort_vocab = v;
    qsort(ids, (size_t)n_ord, sizeof *ids, cmp_tok);
    sort_vocab = NULL;
    /* nodes: each token adds the bytes past its common prefix with the
     * previous one (sorted order = preorder) */
    size_t cap = 1024;
    v->nb = xmalloc(cap);
    v->nd = xmalloc(cap * sizeof *v->nd);
    v->ntok = xmalloc(cap * sizeof *v->ntok);
    v->npar = xmalloc(cap * sizeof *v->npar);
    int *path = xmalloc(((size_t)v->max_len + 1) * sizeof *path); /* node index per depth */
    int prev = -1;
    for (int j = 0; j < n_ord; j++) {
        int id = ids[j];
        const uint8_t *p = v->bytes + v->off[id];
        size_t l = v->off[id + 1] - v->off[id];
        size_t lcp = 0;
        if (prev >= 0) {
            const uint8_t *q = v->bytes + v->off[prev];
            size_t lq = v->off[prev + 1] - v->off[prev];
            while (lcp < l && lcp < lq && p[lcp] == q[lcp]) lcp++;
            if (lcp == l && lq == l) { /* same bytes: chain */
                int node = path[l - 1];
                int t = v->ntok[node];
                while (v->tnext[t] >= 0) t = v->tnext[t];
                v->tnext[t] = id;
                prev = id;
                continue;
            }
        }
        for (size_t d = lcp; d < l; d++) {
            if ((size_t)v->n_nodes == cap) {
                cap *= 2;
                v->nb = xrealloc(v->nb, cap);
                v->nd = xrealloc(v->nd, cap * sizeof *v->nd);
                v->ntok = xrealloc(v->ntok, cap * sizeof *v->ntok);
                v->npar = xrealloc(v->npar, cap * sizeof *v->npar);
            }
            int node = v->n_nodes++;
            v->nb[node] = p[d];
            v->nd[node] = (int)d + 1;
            v->ntok[node] = -1;
            v->npar[node] = d ? path[d - 1] : -1;
            path[d] = node;
        }
        v->ntok[path[l - 1]] = id;
        prev = id;
    }
    free(path);
    free(ids);
    v->nend = xmalloc(((size_t)v->n_nodes ? (size_t)v->n_nodes : 1) * sizeof *v->nend);
    /* subtree ends: the next node at the same depth or shallower */
    int *open = xmalloc(((size_t)v->max_len + 2) * sizeof *open);
    int top = 0;
    for (int i = 0; i < v->n_nodes; i++) {
        while (top > 0 && v->nd[open[top - 1]] >= v->nd[i]) v->nend[open[--top]] = i;
        open[top++] = i;
    }
    while (top > 0) v->nend[open[--top]] = v->n_nodes;
    free(open);
    return v;
}

void gr_vocab_free(gr_vocab *v)
{
    if (!v) return;
    free(v->bytes);
    free(v->off);
    free(v->special);
    free(v->specials);
    free(v->nb);
    free(v->nd);
    free(v->nend);
    free(v->ntok);
    free(v->npar);
    free(v->tnext);
    free(v);
}

int gr_vocab_n(const gr_vocab *v)
{
    return v->n;
}

/* the symbols of token id into out (at most v->max_len + 1); returns the count, 0 if never allowed */
static int token_syms(const gr_vocab *v, int32_t id, int *out)
{
    if (id < 0 || id >= v->n || v->special[id] == -2) return 0;
    if (v->special[id] >= 0) {
        out[0] = v->special[id];
        return 1;
    }
    int n = 0;
    for (size_t i = v->off[id]; i < v->off[id + 1]; i++) out[n++] = v->bytes[i];
    return n;
}

/* ---- token classes ------------------------------------------------------ */

typedef struct crange {
    int id;
    int node;       /* its node in the byte trie (-1: a special) */
    int64_t lo, hi; /* counts for which the pure path stays viable */
    int exits;      /* the path passed a state that can call or return */
} crange;

typedef struct gr_classes {
    uint64_t *acc;  /* accepted (counted: when the count is in [all_lo, all_hi]) */
    int *unc;       /* uncertain subtrees: roots in the byte trie, in preorder */
    int n_unc;
    crange *cr;     /* counted machines: every accepted token's range */
    int n_cr;
    int64_t all_lo, all_hi;
} gr_classes;

static void classes_free_one(gr_classes *c)
{
    if (!c) return;
    free(c->acc);
    free(c->unc);
    free(c->cr);
    free(c);
}

void gr_classes_free(gr_grammar *g)
{
    if (!g->cls) return;
    for (int i = 0; i < g->n_m; i++) {
        if (!g->cls[i]) continue;
        for (int s = 0; s < g->m[i].n; s++) classes_free_one(g->cls[i][s]);
        free(g->cls[i]);
    }
    free(g->cls);
    g->cls = NULL;
    g->cls_vocab = NULL;
}

typedef struct ibuf {
    int *v;
    int n, cap;
} ibuf;

static void ib_push(ibuf *b, int x)
{
    if (b->n == b->cap) {
        b->cap = b->cap ? 2 * b->cap : 64;
        b->v = xrealloc(b->v, (size_t)b->cap * sizeof *b->v);
    }
    b->v[b->n++] = x;
}

static int exits_at(const gr_dfa *d, int s)
{
    return d->acc[s] || d->call_off[s + 1] > d->call_off[s];
}

/* One transition of the pure walk for a counted machine: the count range
 * [lo, hi] (of the count before the token) narrowed by taking edge e with
 * `need` counted so far; returns the new need. */
static int64_t narrow(const gr_dfa *d, int32_t e, int64_t need, int64_t *lo, int64_t *hi)
{
    unsigned fl = GR_FLAGS(e);
    int t = GR_TARGET(e);
    if ((fl & GR_NEEDMIN) && (int64_t)d->cmin - need > *lo) *lo = (int64_t)d->cmin - need;
    if (fl & GR_INC) need++;
    int64_t h = (int64_t)d->cmax - (int64_t)d->minrem[t] - need;
    if (h < *hi) *hi = h;
    if (d->maxrem[t] != GR_UNBOUNDED && d->maxrem[t] != UINT32_MAX) {
        int64_t l = (int64_t)d->cmin - need - (int64_t)d->maxrem[t];
        if (l > *lo) *lo = l;
    }
    return need;
}

static gr_classes *classify(const gr_dfa *d, int s, const gr_vocab *v)
{
    gr_classes *c = xcalloc(1, sizeof *c);
    size_t words = ((size_t)v->n + 63) / 64;
    c->acc = xcalloc(words ? words : 1, sizeof *c->acc);
    ibuf unc = {0};
    crange *cr = NULL;
    int n_cr = 0, cap_cr = 0;
    int L = v->max_len + 1;
    int *st = xmalloc((size_t)L * sizeof *st);
    int *ex = xmalloc((size_t)L * sizeof *ex);
    int64_t *need = xmalloc((size_t)L * sizeof *need), *lo = xmalloc((size_t)L * sizeof *lo),
            *hi = xmalloc((size_t)L * sizeof *hi);
    st[0] = s;
    ex[0] = 0;
    need[0] = 0;
    lo[0] = 0;
    hi[0] = d->counted ? (int64_t)d->cmax : INT64_MAX;
    c->all_lo = 0;
    c->all_hi = hi[0];
    const int32_t *next = d->next;
    for (int i = 0; i < v->n_nodes;) {
        int dep = v->nd[i];
        int32_t e = next[(size_t)st[dep - 1] * GR_NSYM + v->nb[i]];
        int ok = e >= 0;
        if (ok && d->counted) {
            lo[dep] = lo[dep - 1];
            hi[dep] = hi[dep - 1];
            need[dep] = narrow(d, e, need[dep - 1], &lo[dep], &hi[dep]);
            if (lo[dep] > hi[dep] && !ex[dep - 1]) ok = 0; /* never viable, no other way: rejected */
        }
        if (!ok) {
            if (ex[dep - 1]) ib_push(&unc, i); /* every token below i */
            i = v->nend[i];
            continue;
        }
        int t = GR_TARGET(e);
        st[dep] = t;
        ex[dep] = ex[dep - 1] || exits_at(d, t);
        for (int tok = v->ntok[i]; tok >= 0; tok = v->tnext[tok]) {
            c->acc[tok >> 6] |= 1ull << (tok & 63);
            if (d->counted) {
                if (n_cr == cap_cr) {
                    cap_cr = cap_cr ? 2 * cap_cr : 256;
                    cr = xrealloc(cr, (size_t)cap_cr * sizeof *cr);
                }
                cr[n_cr++] = (crange){tok, i, lo[dep], hi[dep], ex[dep - 1]};
                if (lo[dep] > c->all_lo) c->all_lo = lo[dep];
                if (hi[dep] < c->all_hi) c->all_hi = hi[dep];
            }
        }
        i++;
    }
    for (int k = 0; k < v->n_specials; k++) {
        int tok = v->specials[k];
        int32_t e = next[(size_t)s * GR_NSYM + (size_t)v->special[tok]];
        if (e < 0) continue;
        c->acc[tok >> 6] |= 1ull << (tok & 63);
        if (d->counted) {
            int64_t l = 0, h = (int64_t)d->cmax;
            narrow(d, e, 0, &l, &h);
            if (n_cr == cap_cr) {
                cap_cr = cap_cr ? 2 * cap_cr : 256;
                cr = xrealloc(cr, (size_t)cap_cr * sizeof *cr);
            }
            cr[n_cr++] = (crange){tok, -1, l, h, 0};
            if (l > c->all_lo) c->all_lo = l;
            if (h < c->all_hi) c->all_hi = h;
        }
    }
    c->unc = unc.v;
    c->n_unc = unc.n;
    c->cr = cr;
    c->n_cr = n_cr;
    free(st);
    free(ex);
    free(need);
    free(lo);
    free(hi);
    return c;
}

static gr_classes *classes_of(gr_grammar *g, const gr_vocab *v, int m, int s)
{
    if (g->cls_vocab != v) {
        gr_classes_free(g);
        g->cls = xcalloc((size_t)g->n_m, sizeof *g->cls);
        g->cls_vocab = v;
    }
    if (!g->cls[m]) g->cls[m] = xcalloc((size_t)g->m[m].n, sizeof *g->cls[m]);
    if (!g->cls[m][s]) g->cls[m][s] = classify(&g->m[m], s, v);
    return g->cls[m][s];
}

/* ---- stack sets --------------------------------------------------------- */

typedef struct sset {
    int n;
    int depth[GR_MAX_STACKS];
    gr_frame *f; /* [GR_MAX_STACKS][GR_MAX_DEPTH] */
} sset;

#define HT 1024

struct gr_matcher {
    gr_grammar *g;
    const gr_vocab *v;
    sset cur;     /* after the last symbol */
    sset ready;   /* closure of cur (valid when ready_ok) */
    int ready_ok, done;
    sset a, b, c; /* scratch */
    int overflow;
    /* dedup while a set is built */
    uint32_t gen;
    uint32_t stamp[HT];
    int slot[HT];
    sset *building;
    uint64_t *bits;
    int *syms;    /* [max_len + 1] */
    int *path;    /* [max_len + 1] trie nodes by depth while masking */
    int dbase;    /* frames below the stacks being simulated (sim_part) */
};

static gr_frame *SF(const sset *s, int i)
{
    return s->f + (size_t)i * GR_MAX_DEPTH;
}

static void set_begin(gr_matcher *m, sset *s)
{
    s->n = 0;
    m->building = s;
    if (++m->gen == 0) {
        memset(m->stamp, 0, sizeof m->stamp);
        m->gen = 1;
    }
}

static uint32_t hash_stack(const gr_frame *f, int depth)
{
    uint32_t h = 2166136261u ^ (uint32_t)depth;
    for (int i = 0; i < depth; i++) {
        h = (h ^ f[i].m) * 16777619u;
        h = (h ^ f[i].s) * 16777619u;
        h = (h ^ f[i].c) * 16777619u;
    }
    return h;
}

/* add a stack to the set being built; returns its index, or -1 (a
 * duplicate, or overflow) */
static int set_add(gr_matcher *m, const gr_frame *f, int depth)
{
    sset *s = m->building;
    uint32_t h = hash_stack(f, depth) & (HT - 1);
    for (int probe = 0; probe < HT; probe++, h = (h + 1) & (HT - 1)) {
        if (m->stamp[h] != m->gen) break;
        int j = m->slot[h];
        if (s->depth[j] == depth && !memcmp(SF(s, j), f, (size_t)depth * sizeof *f)) return -1;
    }
    if (s->n >= GR_MAX_STACKS) {
        m->overflow = 1;
        return -1;
    }
    int j = s->n++;
    s->depth[j] = depth;
    memcpy(SF(s, j), f, (size_t)depth * sizeof *f);
    m->stamp[h] = m->gen;
    m->slot[h] = j;
    return j;
}

/* closure of `in` into `out`: every stack reachable by calls and returns;
 * returns 1 when one of them is empty (the grammar can be finished) */
static int close_set(gr_matcher *m, const sset *in, sset *out)
{
    const gr_grammar *g = m->g;
    int done = 0;
    set_begin(m, out);
    for (int i = 0; i < in->n; i++) set_add(m, SF(in, i), in->depth[i]);
    gr_frame tmp[GR_MAX_DEPTH];
    for (int j = 0; j < out->n; j++) {
        int depth = out->depth[j];
        if (!depth) {
            done = 1;
            continue;
        }
        const gr_frame *t = &SF(out, j)[depth - 1];
        const gr_dfa *d = &g->m[t->m];
        for (int k = d->call_off[t->s]; k < d->call_off[t->s + 1]; k++) {
            const gr_call_edge *e = &d->calls[k];
            if ((e->flags & GR_NEEDMIN) && t->c < d->cmin) continue;
            uint32_t c2 = t->c + ((e->flags & GR_INC) ? 1u : 0u);
            if (!gr_viable(d, e->to, c2)) continue;
            if (depth + m->dbase >= GR_MAX_DEPTH) {
                m->overflow = 1;
                continue;
            }
            memcpy(tmp, SF(out, j), (size_t)depth * sizeof *tmp);
            tmp[depth - 1].s = (uint32_t)e->to;
            tmp[depth - 1].c = c2;
            tmp[depth] = (gr_frame){(uint32_t)e->callee, 0, 0};
            set_add(m, tmp, depth + 1);
            t = &SF(out, j)[depth - 1]; /* out may not move, but keep t fresh */
        }
        if (d->acc[t->s] && t->c >= d->cmin) set_add(m, SF(out, j), depth - 1);
    }
    return done;
}

/* one symbol from the stacks of `in` (a closure) into `out` */
static void step_set(gr_matcher *m, const sset *in, int sym, sset *out)
{
    set_begin(m, out);
    if (sym < 0 || sym >= GR_NSYM) return;
    gr_frame tmp[GR_MAX_DEPTH];
    for (int j = 0; j < in->n; j++) {
        int depth = in->depth[j];
        if (!depth) continue;
        const gr_frame *t = &SF(in, j)[depth - 1];
        const gr_dfa *d = &m->g->m[t->m];
        int32_t e = d->next[(size_t)t->s * GR_NSYM + (size_t)sym];
        if (e < 0) continue;
        unsigned fl = GR_FLAGS(e);
        if ((fl & GR_NEEDMIN) && t->c < d->cmin) continue;
        uint32_t c2 = t->c + ((fl & GR_INC) ? 1u : 0u);
        if (!gr_viable(d, GR_TARGET(e), c2)) continue;
        memcpy(tmp, SF(in, j), (size_t)depth * sizeof *tmp);
        tmp[depth - 1].s = (uint32_t)GR_TARGET(e);
        tmp[depth - 1].c = c2;
        set_add(m, tmp, depth);
    }
}

static void copy_set(sset *dst, const sset *src)
{
    dst->n = src->n;
    for (int i = 0; i < src->n; i++) {
        dst->depth[i] = src->depth[i];
        memcpy(SF(dst, i), SF(src, i), (size_t)src->depth[i] * sizeof(gr_frame));
    }
}

static void ensure_ready(gr_matcher *m)
{
    if (m->ready_ok) return;
    m->done = close_set(m, &m->cur, &m->ready);
    m->ready_ok = 1;
}

/* ---- the matcher --------------------------------------------------------- */

static void set_alloc(sset *s)
{
    s->f = xmalloc((size_t)GR_MAX_STACKS * GR_MAX_DEPTH * sizeof *s->f);
    s->n = 0;
}

gr_matcher *gr_matcher_new(gr_grammar *g, const gr_vocab *v)
{
    gr_matcher *m = xcalloc(1, sizeof *m);
    m->g = g;
    m->v = v;
    set_alloc(&m->cur);
    set_alloc(&m->ready);
    set_alloc(&m->a);
    set_alloc(&m->b);
    set_alloc(&m->c);
    m->bits = xcalloc(((size_t)v->n + 63) / 64 + 1, sizeof *m->bits);
    m->syms = xmalloc(((size_t)v->max_len + 2) * sizeof *m->syms);
    m->path = xmalloc(((size_t)v->max_len + 2) * sizeof *m->path);
    gr_matcher_reset(m);
    return m;
}

void gr_matcher_free(gr_matcher *m)
{
    if (!m) return;
    free(m->cur.f);
    free(m->ready.f);
    free(m->a.f);
    free(m->b.f);
    free(m->c.f);
    free(m->bits);
    free(m->syms);
    free(m->path);
    free(m);
}

void gr_matcher_reset(gr_matcher *m)
{
    m->cur.n = 1;
    m->cur.depth[0] = 1;
    SF(&m->cur, 0)[0] = (gr_frame){(uint32_t)m->g->start, 0, 0};
    m->ready_ok = 0;
    m->overflow = 0;
}

int gr_matcher_overflow(const gr_matcher *m)
{
    return m->overflow;
}

size_t gr_matcher_warm(gr_matcher *m)
{
    size_t n = 0;
    for (int i = 0; i < m->g->n_m; i++)
        for (int s = 0; s < m->g->m[i].n; s++)
            if (m->g->m[i].has_sym[s]) {
                classes_of(m->g, m->v, i, s);
                n++;
            }
    return n;
}

void gr_matcher_copy(gr_matcher *dst, const gr_matcher *src)
{
    CHECK(dst->g == src->g && dst->v == src->v);
    copy_set(&dst->cur, &src->cur);
    copy_set(&dst->ready, &src->ready);
    dst->ready_ok = src->ready_ok;
    dst->done = src->done;
    dst->overflow = src->overflow;
}

int gr_matcher_feed(gr_matcher *m, const int *syms, size_t n)
{
    if (!n) return 0;
    ensure_ready(m);
    step_set(m, &m->ready, syms[0], &m->a);
    if (!m->a.n) return -1;
    for (size_t i = 1; i < n; i++) {
        close_set(m, &m->a, &m->b);
        step_set(m, &m->b, syms[i], &m->a);
        if (!m->a.n) return -1;
    }
    copy_set(&m->cur, &m->a);
    m->ready_ok = 0;
    return 0;
}

int gr_matcher_accept(gr_matcher *m, int32_t id)
{
    int n = token_syms(m->v, id, m->syms);
    if (!n) return -1;
    return gr_matcher_feed(m, m->syms, (size_t)n);
}

int gr_matcher_done(gr_matcher *m)
{
    ensure_ready(m);
    return m->done;
}

int gr_matcher_ended(gr_matcher *m)
{
    gr_matcher *mm = m;
    ensure_ready(mm);
    if (!mm->done) return 0;
    for (int j = 0; j < mm->ready.n; j++) {
        int depth = mm->ready.depth[j];
        if (!depth) continue;
        const gr_frame *t = &SF(&mm->ready, j)[depth - 1];
        if (mm->g->m[t->m].has_sym[t->s]) return 0;
    }
    return 1;
}

/* how many of the token's symbols can be consumed starting with a symbol
 * edge of ready stack j: n when all of them, else the index of the symbol
 * after which no stack is left (every token starting with syms[0..p] fails
 * alike) */
#define SIM_KEEP 6
/* sim_from on the top depth - skip frames of stack j only; -1 when a stack
 * returned past them (the frames below would decide) */
static int sim_part(gr_matcher *m, int j, int skip, const int *syms, int n)
{
    sset *x = &m->a, *y = &m->b;
    set_begin(m, x);
    {
        int depth = m->ready.depth[j] - skip;
        const gr_frame *t = &SF(&m->ready, j)[skip + depth - 1];
        const gr_dfa *d = &m->g->m[t->m];
        int32_t e = d->next[(size_t)t->s * GR_NSYM + (size_t)syms[0]];
        if (e < 0) return 0;
        unsigned fl = GR_FLAGS(e);
        if ((fl & GR_NEEDMIN) && t->c < d->cmin) return 0;
        uint32_t c2 = t->c + ((fl & GR_INC) ? 1u : 0u);
        if (!gr_viable(d, GR_TARGET(e), c2)) return 0;
        gr_frame tmp[GR_MAX_DEPTH];
        memcpy(tmp, SF(&m->ready, j) + skip, (size_t)depth * sizeof *tmp);
        tmp[depth - 1].s = (uint32_t)GR_TARGET(e);
        tmp[depth - 1].c = c2;
        set_add(m, tmp, depth);
    }
    m->dbase = skip;
    for (int i = 1; i < n; i++) {
        if (close_set(m, x, y) && skip) {
            m->dbase = 0;
            return -1;
        }
        step_set(m, y, syms[i], x);
        if (!x->n) {
            m->dbase = 0;
            return i;
        }
    }
    m->dbase = 0;
    return n;
}

/* Deep stacks are simulated on their top SIM_KEEP frames first (copying
 * and hashing cost their depth); what a token does below them is decided
 * on the whole stack. */
static int sim_from(gr_matcher *m, int j, const int *syms, int n)
{
    int depth = m->ready.depth[j];
    if (depth > SIM_KEEP) {
        int p = sim_part(m, j, depth - SIM_KEEP, syms, n);
        if (p >= 0) return p;
    }
    return sim_part(m, j, 0, syms, n);
}

/* the symbols that can follow a return from the top frame of ready stack
 * j (a superset: the counters of the frames below are not checked) */
static void follow_after_return(gr_matcher *m, int j, uint64_t *follow)
{
    memset(follow, 0, ((GR_NSYM + 63) / 64) * sizeof *follow);
    int depth = m->ready.depth[j];
    if (depth < 2) return;
    sset *x = &m->a, *y = &m->b;
    set_begin(m, x);
    set_add(m, SF(&m->ready, j), depth - 1);
    close_set(m, x, y);
    for (int i = 0; i < y->n; i++) {
        if (!y->depth[i]) continue;
        const gr_frame *t = &SF(y, i)[y->depth[i] - 1];
        const int32_t *row = m->g->m[t->m].next + (size_t)t->s * GR_NSYM;
        for (int sym = 0; sym < GR_NSYM; sym++)
            if (row[sym] >= 0) follow[sym >> 6] |= 1ull << (sym & 63);
    }
}

/* An uncertain token, or a counted machine's token out of its count range,
 * dies on its own path; another path must leave the machine where the path
 * passes a state that calls or returns.  Returns the index of the symbol after which no path
 * is left when none can (no call there, and a return is not followed by
 * the token's next symbol), the position sim_from would return; -1 when
 * only a simulation can tell. */
static int pure_death(const gr_dfa *d, int s, uint32_t c, const int *syms, int n, const uint64_t *follow)
{
    for (int i = 0; i < n; i++) {
        if (i > 0 && d->call_off[s + 1] > d->call_off[s]) return -1;
        if (i > 0 && d->acc[s] && c >= d->cmin && (follow[syms[i] >> 6] >> (syms[i] & 63) & 1)) return -1;
        int32_t e = d->next[(size_t)s * GR_NSYM + (size_t)syms[i]];
        if (e < 0) return i;
        unsigned fl = GR_FLAGS(e);
        if ((fl & GR_NEEDMIN) && c < d->cmin) return i;
        uint32_t c2 = c + ((fl & GR_INC) ? 1u : 0u);
        if (!gr_viable(d, GR_TARGET(e), c2)) return i;
        s = GR_TARGET(e);
        c = c2;
    }
    return -1;
}

size_t gr_matcher_mask(gr_matcher *m, uint64_t *bits)
{
    ensure_ready(m);
    const gr_vocab *v = m->v;
    size_t words = ((size_t)v->n + 63) / 64;
    memset(bits, 0, words * sizeof *bits);
    for (int j = 0; j < m->ready.n; j++) {
        int depth = m->ready.depth[j];
        if (!depth) continue;
        gr_frame t = SF(&m->ready, j)[depth - 1];
        const gr_dfa *d = &m->g->m[t.m];
        if (!d->has_sym[t.s]) continue;
        gr_classes *c = classes_of(m->g, v, (int)t.m, (int)t.s);
        int64_t cnt = t.c;
        uint64_t follow[(GR_NSYM + 63) / 64];
        if (c->n_unc || (d->counted && (cnt < c->all_lo || cnt > c->all_hi))) follow_after_return(m, j, follow);
        if (!d->counted || (cnt >= c->all_lo && cnt <= c->all_hi)) {
            for (size_t w = 0; w < words; w++) bits[w] |= c->acc[w];
        } else {
            /* tokens in trie preorder: one that fails after p + 1 symbols
             * rules out the rest of its ancestor's subtree at depth p + 1 */
            int skip_end = -1;
            for (int k = 0; k < c->n_cr; k++) {
                const crange *r = &c->cr[k];
                if (bits[r->id >> 6] >> (r->id & 63) & 1) continue;
                int ok = cnt >= r->lo && cnt <= r->hi;
                if (!ok && r->exits && (r->node < 0 || r->node >= skip_end)) {
                    int n = token_syms(v, r->id, m->syms);
                    int p = pure_death(d, (int)t.s, t.c, m->syms, n, follow);
                    if (p < 0) p = sim_from(m, j, m->syms, n);
                    ok = p == n;
                    if (!ok) {
                        int a = r->node;
                        while (v->nd[a] > p + 1) a = v->npar[a];
                        skip_end = v->nend[a];
                    }
                }
                if (ok) bits[r->id >> 6] |= 1ull << (r->id & 63);
            }
        }
        /* the uncertain subtrees in preorder: a token that fails after p + 1
         * symbols rules out the whole subtree of its ancestor at depth p + 1
         * (never above the root: all its tokens share the root's prefix) */
        int *path = m->path;
        for (int q = 0; q < c->n_unc; q++) {
            int r = c->unc[q], base = v->nd[r];
            for (int k = r; k < v->nend[r];) {
                int dep = v->nd[k], id = v->ntok[k];
                path[dep] = k;
                if (id < 0 || (bits[id >> 6] >> (id & 63) & 1)) {
                    k++;
                    continue;
                }
                int n = token_syms(v, id, m->syms);
                int p = pure_death(d, (int)t.s, t.c, m->syms, n, follow);
                if (p < 0) p = sim_from(m, j, m->syms, n);
                if (p == n) {
                    for (int u = id; u >= 0; u = v->tnext[u]) bits[u >> 6] |= 1ull << (u & 63);
                    k++;
                    continue;
                }
                k = v->nend[path[p + 1 < base ? base : p + 1]];
            }
        }
    }
    size_t count = 0;
    for (size_t w = 0; w < words; w++) count += (size_t)__builtin_popcountll(bits[w]);
    return count;
}

size_t gr_matcher_apply(gr_matcher *m, float *logits)
{
    size_t n = gr_matcher_mask(m, m->bits);
    for (int i = 0; i < m->v->n; i++)
        if (!(m->bits[i >> 6] >> (i & 63) & 1)) logits[i] = -INFINITY;
    return n;
}
