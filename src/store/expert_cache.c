/* expert_cache.c - see expert_cache.h.  Eviction scans the slots (a few
 * hundred to a few thousand; the scan is small next to reading an expert). */
#define _GNU_SOURCE
#include "expert_cache.h"
#include "file.h"
#include "util.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

int expert_cache_init(expert_cache *c, int n_layers, int n_experts, int n_slots, int n_transient,
                      size_t slot_bytes, enum cache_policy policy)
{
    memset(c, 0, sizeof *c);
    CHECK(n_slots >= 1 && n_transient >= 0);
    c->n_layers = n_layers;
    c->n_experts = n_experts;
    if (policy != CACHE_TLFU) n_transient = 0;
    c->n_transient = n_transient;
    n_slots += n_transient; /* arrays below cover both kinds; n_slots counts the cache proper */
    c->n_slots = n_slots - n_transient;
    c->policy = policy;
    c->slot_bytes = (slot_bytes + 4095) & ~(size_t)4095;
    c->mem = aligned_alloc_raw((size_t)n_slots * c->slot_bytes);
    if (!c->mem) return -1;
    /* transparent huge pages where the kernel leaves the choice to us: the
     * expert kernels scan slots like the trunk's, and a 4 KiB TLB entry per
     * page (and prefetchers stopping at each page) costs bandwidth */
    uintptr_t h0 = ((uintptr_t)c->mem + (2u << 20) - 1) & ~(uintptr_t)((2u << 20) - 1);
    uintptr_t h1 = ((uintptr_t)c->mem + (size_t)n_slots * c->slot_bytes) & ~(uintptr_t)((2u << 20) - 1);
    if (h1 > h0) df_mem_hugepages((void *)h0, h1 - h0);
    c->slot_key = xmalloc((size_t)n_slots * sizeof *c->slot_key);
    c->ready = xcalloc((size_t)n_slots, 1);
    c->pending = xcalloc((size_t)n_slots, 1);
    c->pf_unused = xcalloc((size_t)n_slots, 1);
    c->pf_used_l = xcalloc((size_t)n_layers, sizeof *c->pf_used_l);
    c->pf_wasted_l = xcalloc((size_t)n_layers, sizeof *c->pf_wasted_l);
    c->pins = xcalloc((size_t)n_slots, sizeof *c->pins);
    c->last_use = xcalloc((size_t)n_slots, sizeof *c->last_use);
    size_t nk = (size_t)n_layers * (size_t)n_experts;
    c->map = xmalloc(nk * sizeof *c->map);
    c->freq = xcalloc(nk, sizeof *c->freq);
    c->soon = xcalloc(nk, 1);
    for (int s = 0; s < n_slots; s++) c->slot_key[s] = -1;
    for (size_t k = 0; k < nk; k++) c->map[k] = -1;
    /* halve the counts after about ten cache-fulls of acquires */
    c->aging_period = 10 * (uint64_t)c->n_slots > 4096 ? 10 * (uint64_t)c->n_slots : 4096;
    return 0;
}

static void *prefault_main(void *arg)
{
    expert_cache *c = arg;
#ifdef MADV_POPULATE_WRITE
    size_t total = (size_t)(c->n_slots + c->n_transient) * c->slot_bytes, step = (size_t)64 << 20;
    /* from the end: slots are handed out from the start */
    for (size_t end = total; end > 0 && !atomic_load(&c->prefault_stop);) {
        size_t begin = end > step ? end - step : 0;
        if (madvise(c->mem + begin, end - begin, MADV_POPULATE_WRITE) != 0) break;
        end = begin;
    }
#else
    (void)c;
#endif
    return NULL;
}

void expert_cache_prefault(expert_cache *c)
{
    if (c->prefault_running) return;
    atomic_store(&c->prefault_stop, 0);
    c->prefault_running = pthread_create(&c->prefault_thread, NULL, prefault_main, c) == 0;
}

void expert_cache_deinit(expert_cache *c)
{
    if (!c) return;
    if (c->prefault_running) {
        atomic_store(&c->prefault_stop, 1);
        pthread_join(c->prefault_thread, NULL);
    }
    aligned_free(c->mem);
    free(c->slot_key);
    free(c->ready);
    free(c->pending);
    free(c->pf_unused);
    free(c->pf_used_l);
    free(c->pf_wasted_l);
    free(c->pins);
    free(c->last_use);
    free(c->map);
    free(c->freq);
    free(c->soon);
    memset(c, 0, sizeof *c);
}

static void count_use(expert_cache *c, int32_t key)
{
    c->freq[key] += 1.0f;
    if (++c->since_aging >= c->aging_period) {
        size_t nk = (size_t)c->n_layers * (size_t)c->n_experts;
        for (size_t k = 0; k < nk; k++) c->freq[k] *= 0.5f;
        c->since_aging = 0;
    }
}

static int pick_victim(const expert_cache *c)
{
    int victim = -1;
    for (int i = 0; i < c->n_slots; i++) {
        if (atomic_load(&c->pins[i])) continue;
        if (c->slot_key[i] < 0) return i;
        if (victim < 0) {
            victim = i;
            continue;
        }
        /* an expert the look-ahead expects goes last */
        int si = c->soon[c->slot_key[i]], sv = c->soon[c->slot_key[victim]];
        if (si != sv) {
            if (si < sv) victim = i;
            continue;
        }
        if (c->policy != CACHE_LRU) {
            float fi = c->freq[c->slot_key[i]], fv = c->freq[c->slot_key[victim]];
            if (fi < fv || (fi == fv && c->last_use[i] < c->last_use[victim])) victim = i;
        } else if (c->last_use[i] < c->last_use[victim]) {
            victim = i;
        }
    }
    return victim;
}

/* Give slot `victim` to expert `key`: its old expert leaves the map (a
 * prefetched one that was never used counts as wasted); not ready yet. */
static void take_slot(expert_cache *c, int victim, int32_t key)
{
    if (c->slot_key[victim] >= 0) c->map[c->slot_key[victim]] = -1;
    if (c->pf_unused[victim]) {
        c->pf_wasted++;
        c->pf_wasted_l[c->slot_key[victim] / c->n_experts]++;
        c->pf_unused[victim] = 0;
    }
    c->slot_key[victim] = key;
    c->map[key] = victim;
    c->ready[victim] = 0;
}

void expert_cache_add_uses(expert_cache *c, int il, int e, float n)
{
    if (c->policy == CACHE_LFU || c->policy == CACHE_TLFU) c->freq[il * c->n_experts + e] += n;
}

int expert_cache_acquire(expert_cache *c, int il, int e, uint8_t **slot)
{
    int32_t key = il * c->n_experts + e;
    int s = c->map[key];
    c->tick++;
    if (s >= 0 && c->ready[s]) {
        if (c->pf_unused[s]) c->pf_used++, c->pf_used_l[il]++, c->pf_unused[s] = 0;
        atomic_fetch_add(&c->pins[s], 1);
        c->last_use[s] = c->tick;
        c->hits++;
        count_use(c, key);
        *slot = c->mem + (size_t)s * c->slot_bytes;
        return EC_HIT;
    }
    if (s >= 0 && c->pending[s]) {
        atomic_fetch_add(&c->pins[s], 1);
        c->last_use[s] = c->tick;
        c->misses++;
        c->late++;
        c->pf_used++;
        c->pf_used_l[il]++;
        c->pf_unused[s] = 2; /* claimed while reading: not "unused" when it lands */
        count_use(c, key);
        *slot = c->mem + (size_t)s * c->slot_bytes;
        return EC_PENDING;
    }
    CHECK(s < 0); /* a reserved-but-unfilled demand slot is never acquired twice */
    int victim = pick_victim(c);
    count_use(c, key);
    if (c->policy == CACHE_TLFU && (victim < 0 || (c->slot_key[victim] >= 0 &&
                                                    c->freq[key] <= c->freq[c->slot_key[victim]]))) {
        /* not admitted: stream it through a transient slot if one is free */
        for (int i = c->n_slots; i < c->n_slots + c->n_transient; i++)
            if (c->slot_key[i] < 0) {
                victim = i;
                break;
            }
    }
    if (victim < 0) return EC_FULL;
    take_slot(c, victim, key);
    c->last_use[victim] = c->tick;
    atomic_store(&c->pins[victim], 1);
    c->misses++;
    *slot = c->mem + (size_t)victim * c->slot_bytes;
    return EC_MISS;
}

int expert_cache_acquire_prefetch(expert_cache *c, int il, int e, uint8_t **slot)
{
    int32_t key = il * c->n_experts + e;
    if (c->map[key] >= 0) return EC_HIT;
    int victim = pick_victim(c);
    if (victim < 0) return EC_FULL;
    /* a prediction is not evidence of use: it may take a free slot, or evict
     * an expert no more used than the predicted one, never a hotter one */
    if (c->slot_key[victim] >= 0 && c->freq[key] < c->freq[c->slot_key[victim]]) return EC_FULL;
    if (c->policy == CACHE_TLFU && c->slot_key[victim] >= 0 && c->freq[key] <= c->freq[c->slot_key[victim]])
        return EC_FULL;
    take_slot(c, victim, key);
    c->pending[victim] = 1;
    c->n_pending++;
    c->last_use[victim] = ++c->tick;
    atomic_store(&c->pins[victim], 1);
    *slot = c->mem + (size_t)victim * c->slot_bytes;
    return EC_MISS;
}

void expert_cache_filled(expert_cache *c, int il, int e)
{
    int s = c->map[il * c->n_experts + e];
    CHECK(s >= 0);
    c->pf_unused[s] = c->pending[s] && c->pf_unused[s] != 2;
    c->n_pending -= c->pending[s];
    c->ready[s] = 1;
    c->pending[s] = 0;
}

void expert_cache_abort(expert_cache *c, int il, int e)
{
    int32_t key = il * c->n_experts + e;
    int s = c->map[key];
    CHECK(s >= 0);
    c->map[key] = -1;
    c->slot_key[s] = -1;
    c->ready[s] = 0;
    c->n_pending -= c->pending[s];
    c->pending[s] = 0;
    c->pf_unused[s] = 0;
    atomic_store(&c->pins[s], 0);
}

void expert_cache_release(expert_cache *c, int il, int e)
{
    int32_t key = il * c->n_experts + e;
    int s = c->map[key];
    CHECK(s >= 0 && atomic_load(&c->pins[s]) > 0);
    if (atomic_fetch_sub(&c->pins[s], 1) == 1 && s >= c->n_slots) {
        /* a transient slot forgets its expert once nobody uses it */
        c->map[key] = -1;
        c->slot_key[s] = -1;
        c->ready[s] = 0;
    }
}

int expert_cache_resident(const expert_cache *c, int il, int e)
{
    int s = c->map[il * c->n_experts + e];
    return s >= 0 && c->ready[s];
}

const char *expert_cache_policy_name(enum cache_policy p)
{
    return p == CACHE_LFU ? "lfu" : p == CACHE_TLFU ? "tlfu" : p == CACHE_LFU_STEPS ? "lfu-steps" : "lru";
}

int expert_cache_policy_parse(const char *s, enum cache_policy *out)
{
    if (!s || !*s || !strcmp(s, "lfu")) *out = CACHE_LFU;
    else if (!strcmp(s, "lru")) *out = CACHE_LRU;
    else if (!strcmp(s, "tlfu")) *out = CACHE_TLFU;
    else if (!strcmp(s, "lfu-steps")) *out = CACHE_LFU_STEPS;
    else return -1;
    return 0;
}
