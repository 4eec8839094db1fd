/* expert_fetch.c - see expert_fetch.h. */
#include "expert_fetch.h"
#include "prefetch.h"
#include "backend_cpu.h"
#include "util.h"

#include <string.h>

void fetch_prefetch_landed(const model_ctx *eng, int64_t tag, int ok)
{
    int il = (int)((tag >> 16) & 0x7FFF), e = (int)(tag & 0xFFFF);
    if (ok) {
        expert_cache_filled(eng->cache, il, e);
        expert_cache_release(eng->cache, il, e); /* the prefetch's own pin */
        eng->pf->landed++;
    } else {
        expert_cache_abort(eng->cache, il, e);
    }
}

/* A prefetch completion during a group: which of the group's experts
 * s->uniq[u0..u1) (not yet present) it satisfies, or -1.  A failed prefetch
 * that a group member waits for leaves the slot to that member (aborted
 * when the group ends). */
static int landed_in_group(const model_ctx *eng, session_bufs *s, int64_t tag, int ok, int cur_il, int u0, int u1)
{
    int il = (int)((tag >> 16) & 0x7FFF), e = (int)(tag & 0xFFFF);
    int waiting = -1;
    if (il == cur_il)
        for (int u = u0; u < u1; u++)
            if (s->uniq[u] == e && !s->uniq_state[u]) waiting = u;
    if (ok || waiting < 0) fetch_prefetch_landed(eng, tag, ok);
    return waiting;
}

typedef fetch_state rolling;

/* Acquire further experts, in order, as long as a slot is free (a full
 * cache stops here until computed experts give theirs back); queue the
 * misses' reads and submit them together, sorted by offset.  An expert a
 * prefetch is already reading is waited for, not read twice. */
static void acquire_more(const model_ctx *eng, session_bufs *s, int il, rolling *g, df_error *err)
{
    int queued = 0;
    for (; g->next < g->u1; g->next++) {
        int u = g->next, e = s->uniq[u];
        int r = expert_cache_acquire(eng->cache, il, e, &s->uniq_slot[u]);
        if (r == EC_FULL) break;
        s->uniq_state[u] = r == EC_HIT;
        if (r == EC_HIT) {
            s->ready_list[g->n_ready++] = u;
            continue;
        }
        g->n_wait++;
        if (r == EC_MISS && !g->rc) {
            if (expert_store_queue(eng->store, il, e, s->uniq_slot[u], u, err)) g->rc = -1;
            else queued = 1;
        }
    }
    if (queued) expert_store_flush(eng->store);
}

/* Compute the ready experts (in pieces a job list holds) and give their
 * slots back at once: the next experts' reads can take them.  After an
 * error nothing more is computed; the slots are given back all the same. */
static void run_ready(const model_ctx *eng, session_bufs *s, int il, fetch_run_fn run, rolling *g)
{
    int *ready = s->ready_list;
    for (int i = 0; !g->rc && run && i < g->n_ready; i += MM_MAX_JOBS / 2) {
        int n = g->n_ready - i < MM_MAX_JOBS / 2 ? g->n_ready - i : MM_MAX_JOBS / 2;
        run(eng, s, il, ready + i, n);
    }
    for (int i = 0; i < g->n_ready; i++) {
        expert_cache_release(eng->cache, il, s->uniq[ready[i]]);
        s->uniq_state[ready[i]] = 2; /* computed, slot given back */
    }
    g->n_ready = 0;
}

/* n completions: the group's own reads (and prefetches it waited for)
 * become ready; other prefetches hand their slots to the cache */
static void take_landed(const model_ctx *eng, session_bufs *s, rolling *g, const int64_t *tags, const int *ok, int n)
{
    int il = g->il;
    for (int i = 0; i < n; i++) {
        int u = (int)tags[i];
        if (tags[i] & FETCH_PF_TAG) {
            u = landed_in_group(eng, s, tags[i], ok[i], il, g->u0, g->next);
            if (u < 0) continue;
        } else if (ok[i]) {
            expert_cache_filled(eng->cache, il, s->uniq[u]);
        }
        g->n_wait--;
        if (!ok[i]) {
            g->rc = -1;
            continue;
        }
        s->uniq_state[u] = 1;
        s->ready_list[g->n_ready++] = u;
    }
}

void fetch_begin(session_bufs *s, int il, int u0)
{
    CHECK(!s->fg.open);
    s->fg = (fetch_state){.il = il, .u0 = u0, .u1 = u0, .next = u0, .open = 1};
}

void fetch_extend(const model_ctx *eng, session_bufs *s, int u1, df_error *err)
{
    rolling *g = &s->fg;
    CHECK(g->open && u1 >= g->u1);
    g->u1 = u1;
    if (!g->rc) acquire_more(eng, s, g->il, g, err);
    /* take what has landed since, so that reads queued behind the I/O
     * queue's depth go out now rather than when the group is finished */
    int64_t tags[64];
    int ok[64], n;
    while (g->n_wait && (n = expert_store_poll(eng->store, tags, ok, 64, err)) > 0) take_landed(eng, s, g, tags, ok, n);
}

int fetch_finish(const model_ctx *eng, session_bufs *s, fetch_run_fn run,
                 void (*overlap)(const model_ctx *, session_bufs *, void *), void *overlap_ctx, df_error *err)
{
    expert_cache *cache = eng->cache;
    rolling *g = &s->fg;
    int il = g->il;
    int64_t tags[64];
    int ok[64];
    CHECK(g->open);
    if (g->next < g->u1 && !g->rc) acquire_more(eng, s, il, g, err);
    if (overlap) overlap(eng, s, overlap_ctx);
    for (;;) {
        if (g->n_ready) run_ready(eng, s, il, run, g);
        if (g->next < g->u1 && !g->rc) acquire_more(eng, s, il, g, err);
        if (g->n_ready) continue;
        if (!g->n_wait && (g->next == g->u1 || g->rc)) break;
        /* our reads, or (when every slot is held by earlier prefetches
         * still reading) theirs, which unpin their slots as they land */
        int n = expert_store_wait(eng->store, tags, ok, 64, err);
        if (!n) {
            /* nothing in flight: only after a queue error (a cache whose
             * every slot is held by others cannot happen: the session
             * holds every pin) */
            CHECK(g->rc);
            break;
        }
        take_landed(eng, s, g, tags, ok, n);
    }
    /* slots still held: present but not computed (after an error), or never filled */
    for (int u = g->u0; u < g->next; u++) {
        if (s->uniq_state[u] == 2) continue;
        if (s->uniq_state[u] == 1) expert_cache_release(cache, il, s->uniq[u]);
        else expert_cache_abort(cache, il, s->uniq[u]);
    }
    g->open = 0;
    return g->rc;
}

void fetch_abandon(const model_ctx *eng, session_bufs *s)
{
    if (!s->fg.open) return;
    df_error e = {0};
    s->fg.rc = -1; /* compute nothing, acquire nothing more; wait for the reads, give every slot back */
    (void)fetch_finish(eng, s, NULL, NULL, NULL, &e);
}

int fetch_group(const model_ctx *eng, session_bufs *s, int il, int u0, int u1, fetch_run_fn run,
                void (*overlap)(const model_ctx *, session_bufs *, void *), void *overlap_ctx, df_error *err)
{
    fetch_begin(s, il, u0);
    s->fg.u1 = u1;
    return fetch_finish(eng, s, run, overlap, overlap_ctx, err);
}

int fetch_drain(const model_ctx *eng, df_error *err)
{
    int64_t tags[64];
    int ok[64], n, rc = 0;
    while ((n = expert_store_wait(eng->store, tags, ok, 64, err)) > 0)
        for (int i = 0; i < n; i++) {
            CHECK(tags[i] & FETCH_PF_TAG);
            fetch_prefetch_landed(eng, tags[i], ok[i]);
            if (!ok[i]) rc = -1;
        }
    return rc;
}

long fetch_warm(const model_ctx *eng, const int32_t *keys, size_t n, df_error *err)
{
    const k3_config *c = &eng->cfg;
    if (n > (size_t)eng->cache->n_slots) n = (size_t)eng->cache->n_slots;
    size_t done = 0;
    int rc = 0;
    for (size_t b = 0; b < n && !rc; b += EXPERT_BATCH_MAX / 4) {
        size_t e_ = b + EXPERT_BATCH_MAX / 4 < n ? b + EXPERT_BATCH_MAX / 4 : n;
        for (size_t i = b; i < e_; i++) {
            uint8_t *slot;
            int il = keys[i] / c->E, e = keys[i] % c->E;
            CHECK(expert_cache_acquire(eng->cache, il, e, &slot) == EC_MISS);
            if (expert_store_queue(eng->store, il, e, slot, (int64_t)i, err)) {
                expert_cache_abort(eng->cache, il, e);
                rc = -1;
                break;
            }
        }
        expert_store_flush(eng->store);
        int64_t tags[64];
        int ok[64], got;
        while ((got = expert_store_wait(eng->store, tags, ok, 64, err)) > 0)
            for (int j = 0; j < got; j++) {
                int il = keys[tags[j]] / c->E, e = keys[tags[j]] % c->E;
                if (ok[j]) {
                    expert_cache_filled(eng->cache, il, e);
                    expert_cache_release(eng->cache, il, e);
                    done++;
                } else {
                    expert_cache_abort(eng->cache, il, e);
                    rc = -1;
                }
            }
    }
    return rc ? -1 : (long)done;
}
