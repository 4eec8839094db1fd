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
#include "trace.h"
#include "util.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    int32_t *key;      /* [n] layer * E + expert, distinct within a step */
    int32_t *step;     /* [n] */
    size_t n, cap;
    int n_layers, n_experts, n_steps, top_k;
} trace_t;

/* Every route of the trace as steps (trace.h reads either format): one
 * step per route record (a chunk's positions at one MoE layer; a JSON line
 * is one position), its distinct experts keyed layer * E + expert. */
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
        if (r.tag != TRACE_ROUTE) continue;
        size_t start = t->n;
        for (int p = 0; p < r.n; p++) {
            for (int j = 0; j < r.k; j++) {
                int32_t key = (int32_t)(r.layer * t->n_experts + r.ids[(size_t)p * r.k + j]);
                int dup = 0;
                for (size_t q = start; q < t->n; q++) dup |= t->key[q] == key;
                if (dup) continue;
                if (t->n == t->cap) {
                    t->cap = t->cap ? t->cap * 2 : 4096;
                    t->key = xrealloc(t->key, t->cap * sizeof *t->key);
                    t->step = xrealloc(t->step, t->cap * sizeof *t->step);
                }
                t->key[t->n] = key;
                t->step[t->n] = t->n_steps;
                t->n++;
            }
        }
        t->n_steps++;
    }
    df_trace_close(tr);
    if (!rc && !t->n) rc = df_err_set(err, DF_ERR_FORMAT, -1, "%s: the trace holds no routes", path);
    return rc;
}

/* Replay through the real cache code; groups larger than the cache are
 * processed slot-count at a time, as moe does. */
static uint64_t replay_policy(const trace_t *t, int slots, enum cache_policy pol)
{
    expert_cache c;
    /* as the engine: TLFU's transient slots (top_k) come out of the same budget */
    int n_transient = pol == CACHE_TLFU && slots > t->top_k ? t->top_k : 0;
    slots -= n_transient;
    if (pol == CACHE_TLFU && !n_transient) pol = CACHE_LFU;
    CHECK(expert_cache_init(&c, t->n_layers, t->n_experts, slots, n_transient, 1, pol) == 0);
    size_t i = 0;
    while (i < t->n) {
        size_t end = i;
        while (end < t->n && t->step[end] == t->step[i]) end++;
        for (size_t g = i; g < end; g += (size_t)slots) {
            size_t ge = g + (size_t)slots < end ? g + (size_t)slots : end;
            for (size_t q = g; q < ge; q++) {
                uint8_t *slot;
                int il = t->key[q] / t->n_experts, e = t->key[q] % t->n_experts;
                if (expert_cache_acquire(&c, il, e, &slot) == EC_MISS) expert_cache_filled(&c, il, e);
            }
            for (size_t q = g; q < ge; q++) expert_cache_release(&c, t->key[q] / t->n_experts, t->key[q] % t->n_experts);
        }
        i = end;
    }
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

static void replay_all(const trace_t *t, int slots, df_cachesim_row *r)
{
    memset(r, 0, sizeof *r);
    r->slots = slots < 1 ? 1 : slots;
    r->accesses = t->n;
    r->steps = (uint64_t)t->n_steps;
    r->hits_lru = replay_policy(t, r->slots, CACHE_LRU);
    r->hits_lfu = replay_policy(t, r->slots, CACHE_LFU);
    r->hits_tlfu = replay_policy(t, r->slots, CACHE_TLFU);
    r->hits_belady = replay_belady(t, r->slots);
    r->hits_static = replay_static(t, r->slots);
}

/* The steps of one layer (keys kept, steps renumbered from 0) */
static size_t layer_trace(const trace_t *t, int il, trace_t *o)
{
    *o = *t;
    o->key = xmalloc((t->n ? t->n : 1) * sizeof *o->key);
    o->step = xmalloc((t->n ? t->n : 1) * sizeof *o->step);
    o->n = 0;
    o->n_steps = 0;
    int last = -1;
    for (size_t i = 0; i < t->n; i++) {
        if (t->key[i] / t->n_experts != il) continue;
        if (t->step[i] != last) last = t->step[i], o->n_steps++;
        o->key[o->n] = t->key[i];
        o->step[o->n++] = o->n_steps - 1;
    }
    return o->n;
}

int df_cachesim_layers(const char *trace_path, const int *slots, int n, df_cachesim_row *rows,
                       df_cachesim_row **per_layer, int *layer_ids, int *n_layers, df_error *err)
{
    trace_t t;
    if (per_layer) *per_layer = NULL;
    if (n_layers) *n_layers = 0;
    if (load_trace(trace_path, &t, err)) {
        free(t.key);
        free(t.step);
        return -1;
    }
    for (int i = 0; i < n; i++) replay_all(&t, slots[i], &rows[i]);
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
            for (int i = 0; i < n; i++) replay_all(&lt, slots[i] / nl, &pl[(size_t)j * n + i]);
            free(lt.key);
            free(lt.step);
            if (layer_ids) layer_ids[j] = il;
            j++;
        }
        free(has);
        *per_layer = pl;
        *n_layers = nl;
    }
    free(t.key);
    free(t.step);
    return 0;
}

int df_cachesim(const char *trace_path, const int *slots, int n, df_cachesim_row *rows, df_error *err)
{
    return df_cachesim_layers(trace_path, slots, n, rows, NULL, NULL, NULL, err);
}
