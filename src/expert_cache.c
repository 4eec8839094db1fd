/* expert_cache.c - see expert_cache.h.  LRU by a tick stamp; eviction scans
 * the slots (n_slots is small: a few hundred to a few thousand). */
#include "expert_cache.h"
#include "util.h"

#include <stdlib.h>
#include <string.h>

int expert_cache_init(expert_cache *c, int n_layers, int n_experts, int n_slots, size_t expert_bytes)
{
    memset(c, 0, sizeof *c);
    CHECK(n_slots >= 1);
    c->n_layers = n_layers;
    c->n_experts = n_experts;
    c->n_slots = n_slots;
    c->slot_bytes = (expert_bytes + 4095) & ~(size_t)4095;
    c->mem = aligned_alloc_raw((size_t)n_slots * c->slot_bytes);
    if (!c->mem) return -1;
    c->slot_key = xmalloc((size_t)n_slots * sizeof *c->slot_key);
    c->ready = xcalloc((size_t)n_slots, 1);
    c->pins = xcalloc((size_t)n_slots, sizeof *c->pins);
    c->last_use = xcalloc((size_t)n_slots, sizeof *c->last_use);
    size_t nk = (size_t)n_layers * (size_t)n_experts;
    c->map = xmalloc(nk * sizeof *c->map);
    for (int s = 0; s < n_slots; s++) c->slot_key[s] = -1;
    for (size_t k = 0; k < nk; k++) c->map[k] = -1;
    return 0;
}

void expert_cache_deinit(expert_cache *c)
{
    if (!c) return;
    aligned_free(c->mem);
    free(c->slot_key);
    free(c->ready);
    free(c->pins);
    free(c->last_use);
    free(c->map);
    memset(c, 0, sizeof *c);
}

int expert_cache_acquire(expert_cache *c, int il, int e, uint8_t **slot)
{
    int32_t key = il * c->n_experts + e;
    int s = c->map[key];
    c->tick++;
    if (s >= 0 && c->ready[s]) {
        atomic_fetch_add(&c->pins[s], 1);
        c->last_use[s] = c->tick;
        c->hits++;
        *slot = c->mem + (size_t)s * c->slot_bytes;
        return EC_HIT;
    }
    CHECK(s < 0); /* a reserved-but-unfilled slot is never acquired twice */
    int victim = -1;
    for (int i = 0; i < c->n_slots; i++) {
        if (atomic_load(&c->pins[i])) continue;
        if (c->slot_key[i] < 0) { victim = i; break; }
        if (victim < 0 || c->last_use[i] < c->last_use[victim]) victim = i;
    }
    if (victim < 0) return EC_FULL;
    if (c->slot_key[victim] >= 0) c->map[c->slot_key[victim]] = -1;
    c->slot_key[victim] = key;
    c->map[key] = victim;
    c->ready[victim] = 0;
    c->last_use[victim] = c->tick;
    atomic_store(&c->pins[victim], 1);
    c->misses++;
    *slot = c->mem + (size_t)victim * c->slot_bytes;
    return EC_MISS;
}

void expert_cache_filled(expert_cache *c, int il, int e)
{
    int s = c->map[il * c->n_experts + e];
    CHECK(s >= 0);
    c->ready[s] = 1;
}

void expert_cache_abort(expert_cache *c, int il, int e)
{
    int32_t key = il * c->n_experts + e;
    int s = c->map[key];
    CHECK(s >= 0);
    c->map[key] = -1;
    c->slot_key[s] = -1;
    c->ready[s] = 0;
    atomic_store(&c->pins[s], 0);
}

void expert_cache_release(expert_cache *c, int il, int e)
{
    int s = c->map[il * c->n_experts + e];
    CHECK(s >= 0 && atomic_load(&c->pins[s]) > 0);
    atomic_fetch_sub(&c->pins[s], 1);
}
