/* expert_cache.h - fixed slots for routed experts, pinned by acquire/release.
 *
 * Owns: one aligned block of n_slots * slot_bytes, the (layer, expert) ->
 * slot map, pin counts and the replacement policy (LRU for now).  Does no
 * I/O: on a miss it hands back a reserved slot that the caller fills from the
 * expert_store and then publishes with expert_cache_filled (or drops with
 * expert_cache_abort).  Hits are counted only for experts resident before
 * the acquire.  Thread: the session thread owns the cache; pins are atomic so
 * that later prefetch threads can share it.
 */
#ifndef DF_EXPERT_CACHE_H
#define DF_EXPERT_CACHE_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

enum { EC_MISS = 0, EC_HIT = 1, EC_FULL = -1 };

typedef struct expert_cache {
    int n_layers, n_experts, n_slots;
    size_t slot_bytes;        /* rounded up to 4096 */
    uint8_t *mem;             /* [n_slots][slot_bytes] */
    int32_t *slot_key;        /* slot -> il * n_experts + e, or -1 */
    int32_t *map;             /* key -> slot, or -1 */
    uint8_t *ready;           /* slot holds valid bytes */
    atomic_int *pins;
    uint64_t *last_use;
    uint64_t tick;
    uint64_t hits, misses;
} expert_cache;

/* Returns 0, or -1 if the slots cannot be allocated. */
int expert_cache_init(expert_cache *c, int n_layers, int n_experts, int n_slots, size_t expert_bytes);
void expert_cache_deinit(expert_cache *c);
/* EC_HIT: *slot points at the expert.  EC_MISS: *slot is reserved and pinned;
 * fill it, then call expert_cache_filled.  EC_FULL: every slot is pinned. */
int expert_cache_acquire(expert_cache *c, int il, int e, uint8_t **slot);
void expert_cache_filled(expert_cache *c, int il, int e);
void expert_cache_abort(expert_cache *c, int il, int e);
void expert_cache_release(expert_cache *c, int il, int e);

#endif
