/* cachesim.c - offline replay of a route trace through the expert cache's
 * policies and Belady's optimal policy (research surface behind
 * `deltafin cachesim`), on a trace of either format (trace.h).
 *
 * A step is what the MoE layer acquires together (pinned) and then
 * releases: one evaluated chunk's distinct experts at one layer, so a
 * binary trace's route record of T positions (a prompt chunk, a verify
 * pass) is one step with the union of their experts, and a decode step's
 * record one position; a JSON-lines trace, which has no chunks, gives a
 * step per line.  So the hit rates are the engine's true hit rates for
 * that trace and cache size.  LRU and LFU run the real
 * expert_cache code (slots are address space only, never touched); Belady
 * evicts the unpinned resident expert whose next use is farthest away;
 * "static" keeps the trace's most used experts (known in advance), the
 * ceiling of any policy that ranks experts by frequency alone.
 */
#include "research.h"
#include "expert_cache.h"
#include "heat.h"
#include "trace.h"
#include "util.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    int32_t *key;      /* [n] layer * E + expert, distinct within a step */
    int32_t *step;     /* [n] */
    float *rows;       /* [n] the step's positions that route to the expert */
    size_t n, cap;
    int32_t *step_layer;          /* [n_steps] */
    int steps_cap;
    int32_t *hkey, *hstep;        /* [n_hints] look-ahead predictions (first m of each
                                     position's), in file order: made before step hstep */
    size_t n_hints, hcap;
    int n_layers, n_experts, n_steps, top_k;
} trace_t;

static void trace_free(trace_t *t)
{
    free(t->key), free(t->step), free(t->rows), free(t->step_layer), free(t->hkey), free(t->hstep);
    memset(t, 0, sizeof *t);
}

static void add_access(trace_t *t, int32_t key, size_t start)
{
    for (size_t q = start; q < t->n; q++)
        if (t->key[q] == key) {
            t->rows[q] += 1.0f;
            return;
        }
    if (t->n == t->cap) {
        t->cap = t->cap ? t->cap * 2 : 4096;
        t->key = xrealloc(t->key, t->cap * sizeof *t->key);
        t->step = xrealloc(t->step, t->cap * sizeof *t->step);
        t->rows = xrealloc(t->rows, t->cap * sizeof *t->rows);
    }
    t->key[t->n] = key;
    t->step[t->n] = t->n_steps;
    t->rows[t->n++] = 1.0f;
}

/* A PREDICT record's first m experts per position (what the prefetcher
 * reads), distinct, as hints before the next step. */
static void add_hints(trace_t *t, const df_trace_rec *r)
{
    int m = r->k / 2 > 0 ? r->k / 2 : 1;
    size_t start = t->n_hints;
    for (int p = 0; p < r->n; p++)
        for (int j = 0; j < m; j++) {
            int32_t e = r->ids[(size_t)p * r->k + j];
            if (e < 0 || e >= t->n_experts || r->layer < 0 || r->layer >= t->n_layers) continue;
            int32_t key = (int32_t)(r->layer * t->n_experts + e);
            int dup = 0;
            for (size_t q = start; q < t->n_hints; q++) dup |= t->hkey[q] == key;
            if (dup) continue;
            if (t->n_hints == t->hcap) {
                t->hcap = t->hcap ? t->hcap * 2 : 4096;
                t->hkey = xrealloc(t->hkey, t->hcap * sizeof *t->hkey);
                t->hstep = xrealloc(t->hstep, t->hcap * sizeof *t->hstep);
            }
            t->hkey[t->n_hints] = key;
            t->hstep[t->n_hints++] = t->n_steps;
        }
}

/* Every route of the trace as steps (trace.h reads either format): one
 * step per route record (a chunk's positions at one MoE layer; a JSON line
 * is one position), its distinct experts keyed layer * E + expert with the
 * number of positions routed to each; and the look-ahead's predictions
 * (--trace-lookahead) where the trace has them. */
static int load_trace(const char *path, trace_t *t, df_error *err)
{
    memset(t, 0, sizeof *t);
    df_trace *tr;
    if (df_trace_open(path, &tr, err)) return -1;
    const df_trace_info *in = df_trace_header(tr);
    t->n_layers = in->layers;
    t->n_experts = in->experts;
    t->top_k = in->top_k;
    df_trace_rec r;
    int rc;
    while ((rc = df_trace_next(tr, &r, err)) == 1) {
        if (r.tag == TRACE_PREDICT) add_hints(t, &r);
        if (r.tag != TRACE_ROUTE) continue;
        size_t start = t->n;
        for (int p = 0; p < r.n; p++)
            for (int j = 0; j < r.k; j++) add_access(t, (int32_t)(r.layer * t->n_experts + r.ids[(size_t)p * r.k + j]), start);
        if (t->n_steps == t->steps_cap) {
            t->steps_cap = t->steps_cap ? 2 * t->steps_cap : 4096;
            t->step_layer = xrealloc(t->step_layer, (size_t)t->steps_cap * sizeof *t->step_layer);
        }
        t->step_layer[t->n_steps++] = r.layer;
    }
    df_trace_close(tr);
    if (!rc && !t->n) rc = df_err_set(err, DF_ERR_FORMAT, -1, "%s: the trace holds no routes", path);
    return rc;
}

/* How a replay runs the real cache code: the policy, counts seeded from a
 * prior (a heat file or another trace's counts), the look-ahead's
 * predictions spared from eviction. */
typedef struct {
    enum cache_policy pol;
    int lookahead;
    const float *prior;
} sim_cfg;

/* Replay through the real cache code; groups larger than the cache are
 * processed slot-count at a time, as moe does. */
static uint64_t replay_policy(const trace_t *t, int slots, const sim_cfg *cfg)
{
    if (slots < 1) return 0;
    expert_cache c;
    enum cache_policy pol = cfg->pol;
    /* as the engine: TLFU's transient slots (top_k) come out of the same budget */
    int n_transient = pol == CACHE_TLFU && slots > t->top_k ? t->top_k : 0;
    slots -= n_transient;
    if (pol == CACHE_TLFU && !n_transient) pol = CACHE_LFU;
    CHECK(expert_cache_init(&c, t->n_layers, t->n_experts, slots, n_transient, 1, pol) == 0);
    size_t nk = (size_t)t->n_layers * (size_t)t->n_experts;
    if (cfg->prior) memcpy(c.freq, cfg->prior, nk * sizeof *c.freq);
    /* hints set and not yet cleared (cleared when their layer's step ends) */
    size_t hi = 0, n_live = 0, *live = cfg->lookahead && t->n_hints ? xmalloc(t->n_hints * sizeof *live) : NULL;
    size_t i = 0;
    while (i < t->n) {
        int s = t->step[i];
        while (live && hi < t->n_hints && t->hstep[hi] <= s) {
            c.soon[t->hkey[hi]] = 1;
            live[n_live++] = hi++;
        }
        size_t end = i;
        while (end < t->n && t->step[end] == s) end++;
        for (size_t g = i; g < end; g += (size_t)slots) {
            size_t ge = g + (size_t)slots < end ? g + (size_t)slots : end;
            for (size_t q = g; q < ge; q++) {
                uint8_t *slot;
                int il = t->key[q] / t->n_experts, e = t->key[q] % t->n_experts;
                if (expert_cache_acquire(&c, il, e, &slot) == EC_MISS) expert_cache_filled(&c, il, e);
            }
            for (size_t q = g; q < ge; q++) expert_cache_release(&c, t->key[q] / t->n_experts, t->key[q] % t->n_experts);
        }
        /* as moe.c: once the chunk's routes are all known, each expert's rows
         * over the mean rows of the chunk's experts, less the one counted */
        float all = 0;
        for (size_t q = i; q < end; q++) all += t->rows[q];
        for (size_t q = i; q < end; q++) {
            float w = t->rows[q] * (float)(end - i) / all;
            if (w != 1.0f) expert_cache_add_uses(&c, t->key[q] / t->n_experts, t->key[q] % t->n_experts, w - 1.0f);
        }
        if (live) {
            size_t w = 0;
            for (size_t h = 0; h < n_live; h++) {
                int32_t key = t->hkey[live[h]];
                if (key / t->n_experts == t->step_layer[s]) c.soon[key] = 0;
                else live[w++] = live[h];
            }
            n_live = w;
        }
        i = end;
    }
    free(live);
    uint64_t hits = c.hits;
    expert_cache_deinit(&c);
    return hits;
}

static const uint64_t *static_cnt;
static int cmp_count_desc(const void *a, const void *b)
{
    uint64_t x = static_cnt[*(const int32_t *)a], y = static_cnt[*(const int32_t *)b];
    if (x != y) return x > y ? -1 : 1;
    return *(const int32_t *)a - *(const int32_t *)b;
}

/* The slots most used experts of the whole trace, resident from their
 * first use on: every later use hits. */
static uint64_t replay_static(const trace_t *t, int slots)
{
    size_t nk = (size_t)t->n_layers * (size_t)t->n_experts;
    uint64_t *cnt = xcalloc(nk, sizeof *cnt);
    int32_t *order = xmalloc(nk * sizeof *order);
    for (size_t i = 0; i < t->n; i++) cnt[t->key[i]]++;
    for (size_t k = 0; k < nk; k++) order[k] = (int32_t)k;
    static_cnt = cnt;
    qsort(order, nk, sizeof *order, cmp_count_desc);
    uint64_t hits = 0;
    for (size_t k = 0; k < nk && k < (size_t)slots; k++)
        if (cnt[order[k]]) hits += cnt[order[k]] - 1;
    free(cnt);
    free(order);
    return hits;
}

static uint64_t replay_belady(const trace_t *t, int slots)
{
    size_t nk = (size_t)t->n_layers * (size_t)t->n_experts;
    size_t *next = xmalloc(t->n * sizeof *next), *last = xmalloc(nk * sizeof *last);
    for (size_t k = 0; k < nk; k++) last[k] = SIZE_MAX;
    for (size_t i = t->n; i-- > 0;) {
        next[i] = last[t->key[i]];
        last[t->key[i]] = i;
    }
    int32_t *res = xmalloc((size_t)slots * sizeof *res);     /* resident keys */
    size_t *res_next = xmalloc((size_t)slots * sizeof *res_next);
    int32_t *res_step = xmalloc((size_t)slots * sizeof *res_step);
    int32_t *where = xmalloc(nk * sizeof *where);
    for (size_t k = 0; k < nk; k++) where[k] = -1;
    int n_res = 0;
    uint64_t hits = 0;
    for (size_t i = 0; i < t->n; i++) {
        int32_t key = t->key[i];
        int w = where[key];
        if (w >= 0) {
            hits++;
            res_next[w] = next[i];
            res_step[w] = t->step[i];
            continue;
        }
        if (n_res < slots) {
            w = n_res++;
        } else {
            /* farthest next use among experts not pinned by this step */
            w = -1;
            for (int s = 0; s < n_res; s++) {
                if (res_step[s] == t->step[i]) continue;
                if (w < 0 || res_next[s] > res_next[w]) w = s;
            }
            if (w < 0) continue; /* every slot pinned: streamed through, never resident */
            /* not caching at all is better when this expert's next use is later still */
            if (next[i] > res_next[w]) continue;
            where[res[w]] = -1;
        }
        res[w] = key;
        res_next[w] = next[i];
        res_step[w] = t->step[i];
        where[key] = w;
    }
    free(next), free(last), free(res), free(res_next), free(res_step), free(where);
    return hits;
}

/* keep[k] = 1 for the (at most) slots experts the prior ranks highest
 * (counts above 0; ties to the lower key); keep is [layers * experts]. */
static void prior_top(const trace_t *t, int slots, const float *prior, uint8_t *keep)
{
    size_t nk = (size_t)t->n_layers * (size_t)t->n_experts;
    for (int s = 0; s < slots; s++) {
        size_t best = nk;
        for (size_t k = 0; k < nk; k++)
            if (!keep[k] && prior[k] > 0 && (best == nk || prior[k] > prior[best])) best = k;
        if (best == nk) break;
        keep[best] = 1;
    }
}

/* The slots experts ranked highest by a prior (another run's heat), kept
 * from their first use: a fixed set chosen without this trace. */
static uint64_t replay_prior_static(const trace_t *t, int slots, const float *prior)
{
    size_t nk = (size_t)t->n_layers * (size_t)t->n_experts;
    uint64_t *cnt = xcalloc(nk, sizeof *cnt), hits = 0;
    uint8_t *keep = xcalloc(nk, 1);
    for (size_t i = 0; i < t->n; i++) cnt[t->key[i]]++;
    prior_top(t, slots, prior, keep);
    for (size_t k = 0; k < nk; k++)
        if (keep[k] && cnt[k]) hits += cnt[k] - 1;
    free(cnt);
    free(keep);
    return hits;
}

static size_t layer_trace(const trace_t *t, int il, trace_t *o);

/* Each layer its own LFU cache (seeded by the prior), sized by the prior:
 * the layer's share of the prior's `slots` hottest experts. */
static uint64_t replay_prior_layers(const trace_t *t, int slots, const float *prior)
{
    size_t nk = (size_t)t->n_layers * (size_t)t->n_experts;
    uint8_t *keep = xcalloc(nk, 1);
    int *quota = xcalloc((size_t)t->n_layers, sizeof *quota);
    prior_top(t, slots, prior, keep);
    for (size_t k = 0; k < nk; k++) quota[k / (size_t)t->n_experts] += keep[k];
    uint64_t hits = 0;
    sim_cfg cfg = {.pol = CACHE_LFU, .prior = prior};
    for (int il = 0; il < t->n_layers; il++) {
        trace_t lt;
        if (layer_trace(t, il, &lt) && quota[il]) hits += replay_policy(&lt, quota[il], &cfg);
        free(lt.key), free(lt.step), free(lt.rows);
    }
    free(keep);
    free(quota);
    return hits;
}

/* Belady's choice where every expert used must be read into the budget
 * (as the engine's own policies must: no buffer outside the cache to stream
 * one through): a step larger than the cache in groups of `slots`, as
 * replay_policy; a miss evicts the unpinned resident used farthest ahead. */
static uint64_t replay_belady_demand(const trace_t *t, int slots)
{
    size_t nk = (size_t)t->n_layers * (size_t)t->n_experts;
    size_t *next = xmalloc((t->n ? t->n : 1) * sizeof *next), *last = xmalloc(nk * sizeof *last);
    for (size_t k = 0; k < nk; k++) last[k] = SIZE_MAX;
    for (size_t i = t->n; i-- > 0;) {
        next[i] = last[t->key[i]];
        last[t->key[i]] = i;
    }
    int32_t *res = xmalloc((size_t)slots * sizeof *res), *where = xmalloc(nk * sizeof *where);
    size_t *res_next = xmalloc((size_t)slots * sizeof *res_next), *res_group = xmalloc((size_t)slots * sizeof *res_group);
    for (size_t k = 0; k < nk; k++) where[k] = -1;
    int n_res = 0;
    uint64_t hits = 0;
    for (size_t i = 0, start = 0; i < t->n; i++) {
        if (i && t->step[i] != t->step[i - 1]) start = i;
        size_t group = start + (i - start) / (size_t)slots * (size_t)slots; /* first access of i's group */
        int32_t key = t->key[i];
        int w = where[key];
        if (w >= 0) {
            hits++;
        } else if (n_res < slots) {
            w = n_res++;
        } else {
            for (int s = 0; s < n_res; s++)
                if (res_group[s] != group && (w < 0 || res_next[s] > res_next[w])) w = s;
            CHECK(w >= 0); /* a group has at most `slots` experts */
            where[res[w]] = -1;
        }
        res[w] = key;
        res_next[w] = next[i];
        res_group[w] = group;
        where[key] = w;
    }
    free(next), free(last), free(res), free(res_next), free(res_group), free(where);
    return hits;
}

static void replay_all(const trace_t *t, int slots, const float *prior, df_cachesim_row *r)
{
    memset(r, 0, sizeof *r);
    r->slots = slots < 1 ? 1 : slots;
    r->accesses = t->n;
    r->steps = (uint64_t)t->n_steps;
    sim_cfg lru = {.pol = CACHE_LRU}, lfu = {.pol = CACHE_LFU}, tlfu = {.pol = CACHE_TLFU};
    sim_cfg steps = {.pol = CACHE_LFU_STEPS}, la = {.pol = CACHE_LFU, .lookahead = 1};
    r->hits_lru = replay_policy(t, r->slots, &lru);
    r->hits_lfu = replay_policy(t, r->slots, &lfu);
    r->hits_tlfu = replay_policy(t, r->slots, &tlfu);
    r->hits_lfu_steps = replay_policy(t, r->slots, &steps);
    r->has_lookahead = t->n_hints > 0;
    if (r->has_lookahead) r->hits_lookahead = replay_policy(t, r->slots, &la);
    r->has_prior = prior != NULL;
    if (prior) {
        sim_cfg pl = {.pol = CACHE_LFU, .prior = prior};
        r->hits_prior = replay_policy(t, r->slots, &pl);
        r->hits_prior_static = replay_prior_static(t, r->slots, prior);
        r->hits_prior_layers = replay_prior_layers(t, r->slots, prior);
    }
    r->hits_belady_demand = replay_belady_demand(t, r->slots);
    r->hits_belady = replay_belady(t, r->slots);
    r->hits_static = replay_static(t, r->slots);
}

/* The steps of one layer (keys kept, steps renumbered from 0) */
static size_t layer_trace(const trace_t *t, int il, trace_t *o)
{
    *o = *t;
    o->key = xmalloc((t->n ? t->n : 1) * sizeof *o->key);
    o->step = xmalloc((t->n ? t->n : 1) * sizeof *o->step);
    o->rows = xmalloc((t->n ? t->n : 1) * sizeof *o->rows);
    o->step_layer = NULL, o->hkey = o->hstep = NULL, o->n_hints = 0;
    o->n = 0;
    o->n_steps = 0;
    int last = -1;
    for (size_t i = 0; i < t->n; i++) {
        if (t->key[i] / t->n_experts != il) continue;
        if (t->step[i] != last) last = t->step[i], o->n_steps++;
        o->key[o->n] = t->key[i];
        o->rows[o->n] = t->rows[i];
        o->step[o->n++] = o->n_steps - 1;
    }
    return o->n;
}

/* The prior's counts: a heat file of the trace's shape, or another trace
 * (its experts' uses, one per step). */
static int load_prior(const char *path, const trace_t *t, float **out, df_error *err)
{
    size_t nk = (size_t)t->n_layers * (size_t)t->n_experts;
    float *p = xcalloc(nk, sizeof *p);
    df_error herr = {0};
    if (heat_load(path, t->n_layers, t->n_experts, p, &herr) == 0) {
        *out = p;
        return 0;
    }
    trace_t o;
    df_error terr = {0};
    if (load_trace(path, &o, &terr)) {
        trace_free(&o);
        free(p);
        if (herr.code == DF_ERR_IO) return df_err_set(err, herr.code, -1, "%s", herr.msg);
        return df_err_set(err, DF_ERR_FORMAT, -1, "%s: neither a heat file for this model (%s) nor a trace (%s)", path,
                          herr.msg, terr.msg);
    }
    int same = o.n_layers == t->n_layers && o.n_experts == t->n_experts;
    if (same)
        for (size_t i = 0; i < o.n; i++) p[o.key[i]] += 1.0f;
    trace_free(&o);
    if (!same) {
        free(p);
        return df_err_set(err, DF_ERR_FORMAT, -1, "%s: a trace of another shape (layers x experts) than the one replayed",
                          path);
    }
    *out = p;
    return 0;
}

int df_cachesim_layers(const char *trace_path, const char *prior_path, const int *slots, int n, df_cachesim_row *rows,
                       df_cachesim_row **per_layer, int *layer_ids, int *n_layers, df_error *err)
{
    trace_t t;
    float *prior = NULL;
    if (per_layer) *per_layer = NULL;
    if (n_layers) *n_layers = 0;
    if (load_trace(trace_path, &t, err) || (prior_path && load_prior(prior_path, &t, &prior, err))) {
        trace_free(&t);
        return -1;
    }
    for (int i = 0; i < n; i++) replay_all(&t, slots[i], prior, &rows[i]);
    if (per_layer) {
        int nl = 0;
        uint8_t *has = xcalloc((size_t)t.n_layers, 1);
        for (size_t i = 0; i < t.n; i++) has[t.key[i] / t.n_experts] = 1;
        for (int il = 0; il < t.n_layers; il++) nl += has[il];
        df_cachesim_row *pl = xcalloc((size_t)nl * (size_t)n, sizeof *pl);
        for (int il = 0, j = 0; il < t.n_layers; il++) {
            if (!has[il]) continue;
            trace_t lt;
            layer_trace(&t, il, &lt);
            for (int i = 0; i < n; i++) replay_all(&lt, slots[i] / nl, prior, &pl[(size_t)j * n + i]);
            free(lt.key), free(lt.step), free(lt.rows);
            if (layer_ids) layer_ids[j] = il;
            j++;
        }
        free(has);
        *per_layer = pl;
        *n_layers = nl;
    }
    free(prior);
    trace_free(&t);
    return 0;
}

int df_cachesim(const char *trace_path, const int *slots, int n, df_cachesim_row *rows, df_error *err)
{
    return df_cachesim_layers(trace_path, NULL, slots, n, rows, NULL, NULL, NULL, err);
}
