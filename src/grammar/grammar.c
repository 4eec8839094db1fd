/* grammar.c - the grammar builder: NFA machines, subset construction per
 * machine, trimming, the counters' reachability bounds, and the reference
 * simulator (see grammar.h).
 *
 * Determinization keeps calls as they are: a DFA state's call edges are the
 * union of its NFA members' (callee, closure of the target, flags), so the
 * only nondeterminism left is between a state's symbol edges, its calls and
 * returning, which the matcher's stack set carries.  Symbol edges of one
 * DFA state must agree on their flags for a symbol (the constructions in
 * gr_string.c and json_schema.c flag the first byte of a character, which
 * every member agrees on); a disagreement is an internal error, reported.
 *
 * Trimming is a fixpoint over machines: a machine is productive when its
 * start can reach an accepting state through symbol edges and calls of
 * productive machines, and (a counted machine) its counter can end in
 * [min, max] on the way (minrem/maxrem: the fewest / most GR_INC edges from
 * a state to a return, UINT32_MAX for unbounded).  Edges into states that
 * cannot complete are dropped, so the matcher never offers a token after
 * which no output can be finished.  (For a counter, minrem/maxrem bound the
 * remaining count; a pattern whose possible lengths have gaps combined with
 * min/maxLength can still pass this test without a valid string: see
 * json_schema.c, which avoids building such machines.)
 */
#include "grammar.h"
#include "grammar_impl.h"
#include "util.h"

#include <stdlib.h>
#include <string.h>

/* ---- builder ----------------------------------------------------------- */

enum { E_SYM, E_EPS, E_CALL };

typedef struct nedge {
    int from, to;
    int lo, hi;       /* symbols (E_SYM) */
    int kind;
    int callee;       /* E_CALL */
    unsigned flags;
} nedge;

typedef struct nmach {
    char *name;
    int n_states;
    nedge *e;
    size_t n_e, cap_e;
    uint8_t *acc;
    size_t cap_acc;
    uint32_t cmin, cmax;
    int counted;
} nmach;

struct gr_builder {
    nmach *m;
    int n, cap;
};

gr_builder *gr_builder_new(void)
{
    return xcalloc(1, sizeof(gr_builder));
}

void gr_builder_free(gr_builder *b)
{
    if (!b) return;
    for (int i = 0; i < b->n; i++) {
        free(b->m[i].name);
        free(b->m[i].e);
        free(b->m[i].acc);
    }
    free(b->m);
    free(b);
}

int gr_state(gr_builder *b, int m)
{
    CHECK(m >= 0 && m < b->n);
    nmach *x = &b->m[m];
    if ((size_t)x->n_states >= x->cap_acc) {
        x->cap_acc = x->cap_acc ? 2 * x->cap_acc : 16;
        x->acc = xrealloc(x->acc, x->cap_acc);
    }
    x->acc[x->n_states] = 0;
    return x->n_states++;
}

int gr_machine(gr_builder *b, const char *name)
{
    if (b->n == b->cap) {
        b->cap = b->cap ? 2 * b->cap : 16;
        b->m = xrealloc(b->m, (size_t)b->cap * sizeof *b->m);
    }
    nmach *x = &b->m[b->n];
    memset(x, 0, sizeof *x);
    x->name = xstrdup(name ? name : "?");
    x->cmax = GR_COUNT_INF;
    int id = b->n++;
    gr_state(b, id);
    return id;
}

int gr_n_states(const gr_builder *b, int m)
{
    return b->m[m].n_states;
}

static void add_edge(gr_builder *b, int m, nedge e)
{
    CHECK(m >= 0 && m < b->n);
    nmach *x = &b->m[m];
    CHECK(e.from >= 0 && e.from < x->n_states && e.to >= 0 && e.to < x->n_states);
    if (x->n_e == x->cap_e) {
        x->cap_e = x->cap_e ? 2 * x->cap_e : 32;
        x->e = xrealloc(x->e, x->cap_e * sizeof *x->e);
    }
    x->e[x->n_e++] = e;
}

void gr_range(gr_builder *b, int m, int from, int to, int lo, int hi, unsigned flags)
{
    if (lo < 0) lo = 0;
    if (hi >= GR_NSYM) hi = GR_NSYM - 1;
    if (lo > hi) return;
    add_edge(b, m, (nedge){from, to, lo, hi, E_SYM, -1, flags});
}

void gr_sym(gr_builder *b, int m, int from, int to, int sym, unsigned flags)
{
    gr_range(b, m, from, to, sym, sym, flags);
}

void gr_eps(gr_builder *b, int m, int from, int to)
{
    add_edge(b, m, (nedge){from, to, 0, 0, E_EPS, -1, 0});
}

void gr_call(gr_builder *b, int m, int from, int to, int callee, unsigned flags)
{
    CHECK(callee >= 0 && callee < b->n);
    add_edge(b, m, (nedge){from, to, 0, 0, E_CALL, callee, flags});
}

void gr_lit(gr_builder *b, int m, int from, int to, const char *s, size_t n)
{
    if (!n) {
        gr_eps(b, m, from, to);
        return;
    }
    int cur = from;
    for (size_t i = 0; i < n; i++) {
        int nx = i + 1 == n ? to : gr_state(b, m);
        gr_sym(b, m, cur, nx, (unsigned char)s[i], 0);
        cur = nx;
    }
}

void gr_accept(gr_builder *b, int m, int state)
{
    CHECK(m >= 0 && m < b->n && state >= 0 && state < b->m[m].n_states);
    b->m[m].acc[state] = 1;
}

void gr_counter(gr_builder *b, int m, uint32_t min, uint32_t max)
{
    CHECK(m >= 0 && m < b->n);
    b->m[m].counted = 1;
    b->m[m].cmin = min;
    b->m[m].cmax = max;
}

/* ---- subset construction ------------------------------------------------ */

typedef struct ivec {
    int *v;
    size_t n, cap;
} ivec;

static void ipush(ivec *a, int x)
{
    if (a->n == a->cap) {
        a->cap = a->cap ? 2 * a->cap : 16;
        a->v = xrealloc(a->v, a->cap * sizeof *a->v);
    }
    a->v[a->n++] = x;
}

static int cmp_int(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

typedef struct subsets {
    ivec members;      /* concatenated sorted member lists */
    ivec off;          /* [n+1] */
    int *table;        /* hash: dfa id + 1, 0 empty */
    size_t tcap;
} subsets;

static uint64_t hash_ints(const int *v, size_t n)
{
    uint64_t h = 1469598103934665603ull ^ n;
    for (size_t i = 0; i < n; i++) h = (h ^ (uint64_t)(unsigned)v[i]) * 1099511628211ull;
    return h;
}

static int subset_find(subsets *s, const int *v, size_t n, int add)
{
    if (!s->tcap || (s->off.n) * 2 >= s->tcap) {
        size_t ncap = s->tcap ? 2 * s->tcap : 256;
        int *nt = xcalloc(ncap, sizeof *nt);
        for (size_t id = 0; id + 1 < s->off.n; id++) {
            const int *m = s->members.v + s->off.v[id];
            size_t k = (size_t)(s->off.v[id + 1] - s->off.v[id]);
            size_t h = (size_t)hash_ints(m, k) & (ncap - 1);
            while (nt[h]) h = (h + 1) & (ncap - 1);
            nt[h] = (int)id + 1;
        }
        free(s->table);
        s->table = nt;
        s->tcap = ncap;
    }
    size_t h = (size_t)hash_ints(v, n) & (s->tcap - 1);
    while (s->table[h]) {
        int id = s->table[h] - 1;
        size_t k = (size_t)(s->off.v[id + 1] - s->off.v[id]);
        if (k == n && !memcmp(s->members.v + s->off.v[id], v, n * sizeof *v)) return id;
        h = (h + 1) & (s->tcap - 1);
    }
    if (!add) return -1;
    int id = (int)s->off.n - 1;
    for (size_t i = 0; i < n; i++) ipush(&s->members, v[i]);
    ipush(&s->off, (int)s->members.n);
    s->table[h] = id + 1;
    return id;
}

/* eps closure of set (in place, sorted, unique); mark is scratch [n_states] */
static void closure(const nmach *x, const int *eoff, const int *eidx, ivec *set, uint8_t *mark)
{
    for (size_t i = 0; i < set->n; i++) mark[set->v[i]] = 1;
    for (size_t i = 0; i < set->n; i++) {
        int s = set->v[i];
        for (int k = eoff[s]; k < eoff[s + 1]; k++) {
            const nedge *e = &x->e[eidx[k]];
            if (e->kind == E_EPS && !mark[e->to]) {
                mark[e->to] = 1;
                ipush(set, e->to);
            }
        }
    }
    for (size_t i = 0; i < set->n; i++) mark[set->v[i]] = 0;
    qsort(set->v, set->n, sizeof *set->v, cmp_int);
}

typedef struct cedge {
    int callee, to;
    unsigned flags;
} cedge;

static int determinize(const nmach *x, gr_dfa *d, int budget, df_error *err)
{
    int ns = x->n_states;
    int *eoff = xcalloc((size_t)ns + 1, sizeof *eoff);
    int *eidx = xmalloc((x->n_e ? x->n_e : 1) * sizeof *eidx);
    for (size_t i = 0; i < x->n_e; i++) eoff[x->e[i].from + 1]++;
    for (int s = 0; s < ns; s++) eoff[s + 1] += eoff[s];
    int *fill = xmalloc(((size_t)ns + 1) * sizeof *fill);
    memcpy(fill, eoff, ((size_t)ns + 1) * sizeof *fill);
    for (size_t i = 0; i < x->n_e; i++) eidx[fill[x->e[i].from]++] = (int)i;
    free(fill);
    uint8_t *mark = xcalloc((size_t)ns, 1);
    subsets ss = {0};
    ipush(&ss.off, 0);
    ivec set = {0}, pts = {0}, tgt = {0};
    ivec next = {0}; /* [n][GR_NSYM] grown as states appear */
    ivec acc = {0};
    ivec coff = {0};
    cedge *calls = NULL;
    size_t n_calls = 0, cap_calls = 0;
    int rc = 0;
    ipush(&set, 0);
    closure(x, eoff, eidx, &set, mark);
    subset_find(&ss, set.v, set.n, 1);
    for (int id = 0; id + 1 < (int)ss.off.n; id++) {
        if (id >= budget) {
            rc = df_err_set(err, DF_ERR_LIMIT, -1, "grammar: too large (machine %s takes it past %d states in all: "
                            "simplify the schema or its patterns)", x->name, GR_MAX_DFA_STATES);
            goto done;
        }
        int lo_m = ss.off.v[id], hi_m = ss.off.v[id + 1];
        /* copy: the member array may move while subsets are added */
        size_t nm = (size_t)(hi_m - lo_m);
        int *mem = xmalloc((nm ? nm : 1) * sizeof *mem);
        memcpy(mem, ss.members.v + lo_m, nm * sizeof *mem);
        int a = 0;
        pts.n = 0;
        for (size_t i = 0; i < nm; i++) {
            int s = mem[i];
            if (x->acc[s]) a = 1;
            for (int k = eoff[s]; k < eoff[s + 1]; k++) {
                const nedge *e = &x->e[eidx[k]];
                if (e->kind == E_SYM) {
                    ipush(&pts, e->lo);
                    ipush(&pts, e->hi + 1);
                }
            }
        }
        ipush(&acc, a);
        size_t row = next.n;
        for (int sym = 0; sym < GR_NSYM; sym++) ipush(&next, -1);
        if (pts.n) qsort(pts.v, pts.n, sizeof *pts.v, cmp_int);
        for (size_t p = 0; p + 1 < pts.n; p++) {
            int lo = pts.v[p], hi = pts.v[p + 1] - 1;
            if (lo > hi) continue;
            tgt.n = 0;
            int fl = -1;
            for (size_t i = 0; i < nm; i++) {
                int s = mem[i];
                for (int k = eoff[s]; k < eoff[s + 1]; k++) {
                    const nedge *e = &x->e[eidx[k]];
                    if (e->kind != E_SYM || e->lo > lo || e->hi < hi) continue;
                    if (fl >= 0 && (unsigned)fl != e->flags) {
                        free(mem);
                        rc = df_err_set(err, DF_ERR_ARG, -1,
                                        "grammar: machine %s has edges on symbol %d that disagree on counting",
                                        x->name, lo);
                        goto done;
                    }
                    fl = (int)e->flags;
                    ipush(&tgt, e->to);
                }
            }
            if (!tgt.n) continue;
            closure(x, eoff, eidx, &tgt, mark);
            size_t u = 0;
            for (size_t i = 0; i < tgt.n; i++)
                if (!u || tgt.v[u - 1] != tgt.v[i]) tgt.v[u++] = tgt.v[i];
            tgt.n = u;
            int t = subset_find(&ss, tgt.v, tgt.n, 1);
            for (int sym = lo; sym <= hi; sym++) next.v[row + (size_t)sym] = GR_EDGE(t, (unsigned)fl);
        }
        ipush(&coff, (int)n_calls);
        for (size_t i = 0; i < nm; i++) {
            int s = mem[i];
            for (int k = eoff[s]; k < eoff[s + 1]; k++) {
                const nedge *e = &x->e[eidx[k]];
                if (e->kind != E_CALL) continue;
                tgt.n = 0;
                ipush(&tgt, e->to);
                closure(x, eoff, eidx, &tgt, mark);
                int t = subset_find(&ss, tgt.v, tgt.n, 1);
                int dup = 0;
                for (size_t c = (size_t)coff.v[coff.n - 1]; c < n_calls; c++)
                    if (calls[c].callee == e->callee && calls[c].to == t && calls[c].flags == e->flags) dup = 1;
                if (dup) continue;
                if (n_calls == cap_calls) {
                    cap_calls = cap_calls ? 2 * cap_calls : 16;
                    calls = xrealloc(calls, cap_calls * sizeof *calls);
                }
                calls[n_calls++] = (cedge){e->callee, t, e->flags};
            }
        }
        free(mem);
    }
    ipush(&coff, (int)n_calls);
    d->n = (int)ss.off.n - 1;
    d->next = (int32_t *)next.v;
    next.v = NULL;
    d->acc = xmalloc((size_t)d->n);
    for (int i = 0; i < d->n; i++) d->acc[i] = (uint8_t)acc.v[i];
    d->call_off = coff.v;
    coff.v = NULL;
    d->calls = xmalloc((n_calls ? n_calls : 1) * sizeof *d->calls);
    for (size_t i = 0; i < n_calls; i++) d->calls[i] = (gr_call_edge){calls[i].callee, calls[i].to, calls[i].flags};
done:
    free(eoff);
    free(eidx);
    free(mark);
    free(ss.members.v);
    free(ss.off.v);
    free(ss.table);
    free(set.v);
    free(pts.v);
    free(tgt.v);
    free(next.v);
    free(acc.v);
    free(coff.v);
    free(calls);
    return rc;
}

/* ---- trimming ----------------------------------------------------------- */

/* co[s]: s can return (through symbol edges and calls of productive
 * machines); for a counted machine also minrem/maxrem. */
static void coreach(gr_dfa *d, const uint8_t *prod)
{
    int n = d->n;
    /* reverse edges, built fresh (small machines; building happens once) */
    int *roff = xcalloc((size_t)n + 1, sizeof *roff);
    for (int s = 0; s < n; s++) {
        const int32_t *row = d->next + (size_t)s * GR_NSYM;
        for (int y = 0; y < GR_NSYM; y++)
            if (row[y] >= 0) roff[GR_TARGET(row[y]) + 1]++;
        for (int c = d->call_off[s]; c < d->call_off[s + 1]; c++)
            if (prod[d->calls[c].callee]) roff[d->calls[c].to + 1]++;
    }
    for (int s = 0; s < n; s++) roff[s + 1] += roff[s];
    size_t ne = (size_t)roff[n];
    int *rsrc = xmalloc((ne ? ne : 1) * sizeof *rsrc);
    uint8_t *rinc = xmalloc(ne ? ne : 1);
    int *fill = xmalloc(((size_t)n + 1) * sizeof *fill);
    memcpy(fill, roff, ((size_t)n + 1) * sizeof *fill);
    for (int s = 0; s < n; s++) {
        const int32_t *row = d->next + (size_t)s * GR_NSYM;
        for (int y = 0; y < GR_NSYM; y++)
            if (row[y] >= 0) {
                int k = fill[GR_TARGET(row[y])]++;
                rsrc[k] = s;
                rinc[k] = (GR_FLAGS(row[y]) & GR_INC) != 0;
            }
        for (int c = d->call_off[s]; c < d->call_off[s + 1]; c++)
            if (prod[d->calls[c].callee]) {
                int k = fill[d->calls[c].to]++;
                rsrc[k] = s;
                rinc[k] = (d->calls[c].flags & GR_INC) != 0;
            }
    }
    free(fill);
    /* 0-1 BFS from the accepting states backwards: minrem */
    uint32_t *mn = d->minrem, *mx = d->maxrem;
    for (int s = 0; s < n; s++) mn[s] = mx[s] = UINT32_MAX;
    size_t qcap = 2 * (ne + (size_t)n) + 2, qh = qcap / 2, qt = qcap / 2;
    int *dq = xmalloc(qcap * sizeof *dq);
    for (int s = 0; s < n; s++)
        if (d->acc[s]) {
            mn[s] = 0;
            dq[qt++] = s;
        }
    while (qh < qt) {
        int s = dq[qh++];
        for (int k = roff[s]; k < roff[s + 1]; k++) {
            int p = rsrc[k];
            uint32_t w = mn[s] + rinc[k];
            if (w < mn[p]) {
                mn[p] = w;
                if (rinc[k]) dq[qt++] = p;
                else dq[--qh] = p;
            }
        }
    }
    free(dq);
    for (int s = 0; s < n; s++) d->co[s] = mn[s] != UINT32_MAX;
    /* maxrem: the longest INC path to a return, by relaxation; still
     * growing after n rounds means an INC cycle: unbounded (for every
     * state, conservatively: the bound only prunes, never admits) */
    if (d->counted) {
        int64_t *len = xmalloc((size_t)n * sizeof *len);
        for (int s = 0; s < n; s++) len[s] = d->acc[s] ? 0 : -1;
        int changed = 1;
        for (int round = 0; changed && round <= n; round++) {
            changed = 0;
            for (int s = 0; s < n; s++) {
                if (len[s] < 0) continue;
                for (int k = roff[s]; k < roff[s + 1]; k++) {
                    int64_t w = len[s] + rinc[k];
                    if (w > len[rsrc[k]]) {
                        len[rsrc[k]] = w;
                        changed = 1;
                    }
                }
            }
        }
        for (int s = 0; s < n; s++)
            mx[s] = len[s] < 0 ? UINT32_MAX : changed || len[s] >= GR_UNBOUNDED ? GR_UNBOUNDED : (uint32_t)len[s];
        free(len);
    }
    free(roff);
    free(rsrc);
    free(rinc);
}

int gr_viable(const gr_dfa *d, int s, uint32_t c)
{
    if (!d->co[s]) return 0;
    if (!d->counted) return 1;
    if (c > d->cmax) return 0;
    if (d->minrem[s] > d->cmax - c) return 0;
    if (d->maxrem[s] != GR_UNBOUNDED && (uint64_t)c + d->maxrem[s] < d->cmin) return 0;
    return 1;
}

int gr_build(const gr_builder *b, int start, gr_grammar **out, df_error *err)
{
    *out = NULL;
    if (start < 0 || start >= b->n) return df_err_set(err, DF_ERR_ARG, -1, "grammar: no start machine");
    gr_grammar *g = xcalloc(1, sizeof *g);
    g->n_m = b->n;
    g->start = start;
    g->m = xcalloc((size_t)b->n, sizeof *g->m);
    for (int i = 0; i < b->n; i++) {
        const nmach *x = &b->m[i];
        gr_dfa *d = &g->m[i];
        d->name = xstrdup(x->name);
        d->counted = x->counted;
        d->cmin = x->counted ? x->cmin : 0;
        d->cmax = x->counted ? x->cmax : GR_COUNT_INF;
        if (x->counted && d->cmin > d->cmax) {
            int rc = df_err_set(err, DF_ERR_ARG, -1, "grammar: %s allows no count (minimum %u > maximum %u)",
                                x->name, d->cmin, d->cmax);
            gr_grammar_free(g);
            return rc;
        }
        if (determinize(x, d, GR_MAX_DFA_STATES - (int)g->n_states, err)) {
            gr_grammar_free(g);
            return -1;
        }
        d->co = xcalloc((size_t)d->n, 1);
        d->minrem = xcalloc((size_t)d->n, sizeof *d->minrem);
        d->maxrem = xcalloc((size_t)d->n, sizeof *d->maxrem);
        g->n_states += (size_t)d->n;
    }
    uint8_t *prod = xcalloc((size_t)g->n_m, 1);
    for (int changed = 1; changed;) {
        changed = 0;
        for (int i = 0; i < g->n_m; i++) {
            gr_dfa *d = &g->m[i];
            coreach(d, prod);
            int p = gr_viable(d, 0, 0);
            if (p != prod[i]) {
                prod[i] = (uint8_t)p;
                changed = 1;
            }
        }
    }
    if (!prod[start]) {
        /* name the culprit: a machine reachable from the start that is empty
         * by itself (every machine it calls could complete) */
        int culprit = start;
        uint8_t *seen = xcalloc((size_t)g->n_m, 1);
        int *queue = xmalloc((size_t)g->n_m * sizeof *queue), qh = 0, qt = 0;
        queue[qt++] = start;
        seen[start] = 1;
        while (qh < qt && culprit == start) {
            int i = queue[qh++];
            const gr_dfa *d = &g->m[i];
            int own = 1;
            for (int k = 0; k < d->call_off[d->n]; k++) {
                int cal = d->calls[k].callee;
                if (!prod[cal]) own = 0;
                if (!seen[cal]) {
                    seen[cal] = 1;
                    queue[qt++] = cal;
                }
            }
            if (own && !prod[i]) culprit = i;
        }
        free(seen);
        free(queue);
        int rc = df_err_set(err, DF_ERR_ARG, -1, "grammar: %s allows no value (its constraints contradict each other)",
                            g->m[culprit].name);
        free(prod);
        gr_grammar_free(g);
        return rc;
    }
    /* drop edges into dead states and calls of unproductive machines */
    for (int i = 0; i < g->n_m; i++) {
        gr_dfa *d = &g->m[i];
        d->has_sym = xcalloc((size_t)d->n ? (size_t)d->n : 1, 1);
        int w = 0;
        for (int s = 0; s < d->n; s++) {
            int32_t *row = d->next + (size_t)s * GR_NSYM;
            for (int y = 0; y < GR_NSYM; y++) {
                if (row[y] >= 0 && !d->co[GR_TARGET(row[y])]) row[y] = -1;
                if (row[y] >= 0) d->has_sym[s] = 1;
            }
            int from = d->call_off[s], end = d->call_off[s + 1];
            d->call_off[s] = w;
            for (int c = from; c < end; c++) {
                gr_call_edge e = d->calls[c];
                if (prod[e.callee] && d->co[e.to]) d->calls[w++] = e;
            }
        }
        d->call_off[d->n] = w;
    }
    free(prod);
    *out = g;
    return 0;
}

void gr_grammar_free(gr_grammar *g)
{
    if (!g) return;
    gr_classes_free(g);
    for (int i = 0; i < g->n_m; i++) {
        gr_dfa *d = &g->m[i];
        free(d->name);
        free(d->next);
        free(d->acc);
        free(d->call_off);
        free(d->calls);
        free(d->co);
        free(d->minrem);
        free(d->maxrem);
        free(d->has_sym);
    }
    free(g->m);
    free(g);
}

int gr_grammar_n_machines(const gr_grammar *g)
{
    return g->n_m;
}

size_t gr_grammar_n_states(const gr_grammar *g)
{
    return g->n_states;
}

/* ---- the reference simulator ------------------------------------------- */

/* Plain and slow on purpose: configurations are malloc'd stacks, the set a
 * list compared linearly, the closure a recursive walk.  It shares the DFA
 * tables with the matcher but none of its stepping, closure or token
 * classes. */
typedef struct rconf {
    int depth;
    gr_frame f[GR_MAX_DEPTH];
} rconf;

typedef struct rset {
    rconf *c;
    size_t n, cap;
} rset;

static void radd(rset *s, const rconf *c)
{
    for (size_t i = 0; i < s->n; i++)
        if (s->c[i].depth == c->depth && !memcmp(s->c[i].f, c->f, (size_t)c->depth * sizeof c->f[0])) return;
    if (s->n == s->cap) {
        s->cap = s->cap ? 2 * s->cap : 8;
        s->c = xrealloc(s->c, s->cap * sizeof *s->c);
    }
    s->c[s->n++] = *c;
}

static int rin(const rset *s, const rconf *c)
{
    for (size_t i = 0; i < s->n; i++)
        if (s->c[i].depth == c->depth && !memcmp(s->c[i].f, c->f, (size_t)c->depth * sizeof c->f[0])) return 1;
    return 0;
}

/* every configuration reachable from c without consuming (c included);
 * *done when the network can be finished */
static void rclose(const gr_grammar *g, const rconf *c, rset *out, int *done)
{
    if (rin(out, c)) return;
    radd(out, c);
    if (c->depth == 0) {
        *done = 1;
        return;
    }
    const gr_frame *t = &c->f[c->depth - 1];
    const gr_dfa *d = &g->m[t->m];
    for (int k = d->call_off[t->s]; k < d->call_off[t->s + 1]; k++) {
        const gr_call_edge *e = &d->calls[k];
        if ((e->flags & GR_NEEDMIN) && t->c < d->cmin) continue;
        uint32_t c2 = t->c + ((e->flags & GR_INC) ? 1u : 0u);
        if (!gr_viable(d, e->to, c2) || c->depth >= GR_MAX_DEPTH) continue;
        rconf n = *c;
        n.f[n.depth - 1].s = (uint32_t)e->to;
        n.f[n.depth - 1].c = c2;
        n.f[n.depth++] = (gr_frame){(uint32_t)e->callee, 0, 0};
        rclose(g, &n, out, done);
    }
    if (d->acc[t->s] && t->c >= d->cmin) {
        rconf n = *c;
        n.depth--;
        rclose(g, &n, out, done);
    }
}

int gr_reference_accepts(const gr_grammar *g, const int *syms, size_t n, int complete)
{
    rset cur = {0}, cl = {0}, nx = {0};
    rconf c0;
    c0.depth = 1;
    c0.f[0] = (gr_frame){(uint32_t)g->start, 0, 0};
    radd(&cur, &c0);
    int ok = 1;
    for (size_t i = 0; i < n && ok; i++) {
        cl.n = 0;
        nx.n = 0;
        int done = 0;
        for (size_t k = 0; k < cur.n; k++) rclose(g, &cur.c[k], &cl, &done);
        for (size_t k = 0; k < cl.n; k++) {
            rconf c = cl.c[k];
            if (!c.depth || syms[i] < 0 || syms[i] >= GR_NSYM) continue;
            gr_frame *t = &c.f[c.depth - 1];
            const gr_dfa *d = &g->m[t->m];
            int32_t e = d->next[(size_t)t->s * GR_NSYM + (size_t)syms[i]];
            if (e < 0) continue;
            unsigned fl = GR_FLAGS(e);
            if ((fl & GR_NEEDMIN) && t->c < d->cmin) continue;
            uint32_t c2 = t->c + ((fl & GR_INC) ? 1u : 0u);
            if (!gr_viable(d, GR_TARGET(e), c2)) continue;
            t->s = (uint32_t)GR_TARGET(e);
            t->c = c2;
            radd(&nx, &c);
        }
        rset tmp = cur;
        cur = nx;
        nx = tmp;
        if (!cur.n) ok = 0;
    }
    if (ok && complete) {
        cl.n = 0;
        int done = 0;
        for (size_t k = 0; k < cur.n; k++) rclose(g, &cur.c[k], &cl, &done);
        ok = done;
    }
    free(cur.c);
    free(cl.c);
    free(nx.c);
    return ok;
}
