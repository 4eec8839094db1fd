/* expert_fetch.c - see expert_fetch.h. */
#include "expert_fetch.h"
#include "prefetch.h"
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

/* Acquire experts uniq[u0..u1) and queue the misses' reads (submitted
 * together, sorted by offset).  An expert a prefetch is already reading is
 * waited for, not read twice.  Returns how many experts must still arrive;
 * *failed = -1 when a read could not even be queued. */
static int group_begin(const model_ctx *eng, session_bufs *s, int il, int u0, int u1, int *n_ready, int *failed, df_error *err)
{
    int n_wait = 0, rc = 0;
    *n_ready = 0;
    for (int u = u0; u < u1; u++) {
        int e = s->uniq[u], r;
        while ((r = expert_cache_acquire(eng->cache, il, e, &s->uniq_slot[u])) == EC_FULL) {
            /* every free slot is held by prefetches still reading (from an
             * earlier call): take their completions, which unpin them */
            int64_t tags[64];
            int ok[64], n = expert_store_wait(eng->store, tags, ok, 64, err);
            CHECK(n > 0); /* a group never exceeds the slot count */
            for (int i = 0; i < n; i++) {
                CHECK(tags[i] & FETCH_PF_TAG); /* this group's own reads are not submitted yet */
                int w = landed_in_group(eng, s, tags[i], ok[i], il, u0, u);
                if (w < 0) continue;
                n_wait--;
                if (ok[i]) {
                    s->uniq_state[w] = 1;
                    s->ready_list[(*n_ready)++] = w;
                } else {
                    rc = -1;
                }
            }
        }
        s->uniq_state[u] = r == EC_HIT;
        if (r == EC_HIT) {
            s->ready_list[(*n_ready)++] = u;
        } else {
            n_wait++;
            if (r == EC_MISS && !rc && expert_store_queue(eng->store, il, e, s->uniq_slot[u], u, err)) rc = -1;
        }
    }
    expert_store_flush(eng->store);
    *failed = rc;
    return n_wait;
}

int fetch_group(const model_ctx *eng, session_bufs *s, int il, int u0, int u1, fetch_run_fn run,
                void (*overlap)(const model_ctx *, session_bufs *, void *), void *overlap_ctx, df_error *err)
{
    expert_cache *cache = eng->cache;
    int n_ready, rc;
    int n_wait = group_begin(eng, s, il, u0, u1, &n_ready, &rc, err);
    if (overlap) overlap(eng, s, overlap_ctx);
    int *ready = s->ready_list;
    if (!rc && n_ready) run(eng, s, il, ready, n_ready);
    int64_t tags[64];
    int ok[64];
    while (n_wait > 0) {
        int n = expert_store_wait(eng->store, tags, ok, 64, err);
        if (!n) break; /* nothing in flight: only after a queue error */
        n_ready = 0;
        for (int i = 0; i < n; i++) {
            int u = (int)tags[i];
            if (tags[i] & FETCH_PF_TAG) {
                u = landed_in_group(eng, s, tags[i], ok[i], il, u0, u1);
                if (u < 0) continue;
            } else if (ok[i]) {
                expert_cache_filled(cache, il, s->uniq[u]);
            }
            n_wait--;
            if (!ok[i]) {
                rc = -1;
                continue;
            }
            s->uniq_state[u] = 1;
            ready[n_ready++] = u;
        }
        if (!rc && n_ready) run(eng, s, il, ready, n_ready);
    }
    for (int u = u0; u < u1; u++) {
        if (s->uniq_state[u]) expert_cache_release(cache, il, s->uniq[u]);
        else expert_cache_abort(cache, il, s->uniq[u]);
    }
    return rc;
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
