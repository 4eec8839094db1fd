/* expert_cache.h - fixed slots for routed experts, pinned by acquire/release.
 *
 * Owns: one aligned block of n_slots * slot_bytes, the (layer, expert) ->
 * slot map, pin counts, per-expert use counts, and the replacement policy:
 *   LRU - evict the least recently used unpinned slot;
 *   LFU - evict the unpinned slot whose expert has the lowest decayed use
 *         count (ties: least recently used).  Counts live per (layer,
 *         expert), not per slot, so they survive eviction; every
 *         `aging_period` acquires all counts are halved, so the policy
 *         follows shifts in what the model routes to.
 *         Counts grow by the rows that route to the expert in the acquiring
 *         chunk (expert_cache_add_uses), one for a decode step.
 *   LFU_STEPS - LFU whose counts grow by one per acquire whatever the rows
 *         (the policy before rows were counted; kept for comparisons).
 *   TLFU - LFU eviction plus TinyLFU-style admission: a missed expert whose
 *         count does not exceed the victim's is read into one of the
 *         n_transient extra slots and dropped on release, so one-off experts
 *         do not push out hot ones.
 * Every policy spares experts marked `soon` (the router look-ahead's
 * predictions for the next layers) while any other slot is unpinned.
 * Does no I/O: on a miss it hands back a reserved slot that the caller fills
 * (from the expert_store) and publishes with expert_cache_filled, or drops
 * with expert_cache_abort.  A hit is counted only when the expert was
 * resident before the acquire (a read that lands later is never a hit).
 * The use counts can be exported and imported (the heat file).
 * Thread: the session thread owns the cache; pins are atomic so that later
 * prefetch threads can share it.
 */
#ifndef DF_EXPERT_CACHE_H
#define DF_EXPERT_CACHE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

enum { EC_MISS = 0, EC_HIT = 1, EC_FULL = -1, EC_PENDING = 2 };
enum cache_policy { CACHE_LRU, CACHE_LFU, CACHE_TLFU, CACHE_LFU_STEPS };

typedef struct expert_cache {
    int n_layers, n_experts, n_slots;
    int n_transient;          /* extra slots [n_slots, n_slots + n_transient) for non-admitted reads */
    enum cache_policy policy;
    size_t slot_bytes;        /* rounded up to 4096 */
    uint8_t *mem;             /* [n_slots][slot_bytes] */
    int32_t *slot_key;        /* slot -> il * n_experts + e, or -1 */
    int32_t *map;             /* key -> slot, or -1 */
    uint8_t *ready;           /* slot holds valid bytes */
    uint8_t *pending;         /* slot reserved by a prefetch whose read is in flight */
    uint8_t *pf_unused;       /* 1: filled by a prefetch, not used yet; 2: claimed while reading */
    atomic_int *pins;
    uint64_t *last_use;
    float *freq;              /* [n_layers * n_experts] decayed use counts */
    uint8_t *soon;            /* [n_layers * n_experts] 1: the router look-ahead expects it within the
                               * next layers; eviction takes such an expert only when nothing else
                               * is unpinned (the caller sets and clears these) */
    uint64_t aging_period, since_aging;
    uint64_t tick;
    uint64_t hits, misses;
    int n_pending;            /* slots reserved by prefetches still reading */
    uint64_t late;            /* misses that found a prefetch still in flight */
    uint64_t pf_used;         /* prefetched experts later used (hit or late) */
    uint64_t pf_wasted;       /* prefetched experts evicted unused */
    uint32_t *pf_used_l, *pf_wasted_l;   /* [n_layers] the same per layer */
    /* background prefault of the slot memory (see expert_cache_prefault) */
    pthread_t prefault_thread;
    int prefault_running;
    atomic_int prefault_stop;
} expert_cache;

/* Returns 0, or -1 if the slots cannot be allocated. */
int expert_cache_init(expert_cache *c, int n_layers, int n_experts, int n_slots, int n_transient,
                      size_t slot_bytes, enum cache_policy policy);
void expert_cache_deinit(expert_cache *c);
/* EC_HIT: *slot points at the expert.  EC_MISS: *slot is reserved and pinned;
 * fill it, then call expert_cache_filled.  EC_PENDING: a prefetch is reading
 * it; *slot is pinned, wait for that read (counted as a miss: the expert was
 * not resident when asked for).  EC_FULL: every slot is pinned. */
int expert_cache_acquire(expert_cache *c, int il, int e, uint8_t **slot);
/* An acquired expert served n more rows of the evaluated chunk than the one
 * its acquire counted: LFU and TLFU add them to its use count (a prompt
 * chunk's routed rows say how much each expert is wanted; a decode step is
 * one row, so nothing to add); LFU_STEPS and LRU ignore them. */
void expert_cache_add_uses(expert_cache *c, int il, int e, float n);
/* A prefetch: EC_MISS reserves a pinned slot marked pending (fill it, then
 * expert_cache_filled and release); EC_HIT means resident or already
 * pending (nothing to do, nothing pinned); EC_FULL: no unpinned slot.
 * Prefetches count neither as uses nor as hits or misses. */
int expert_cache_acquire_prefetch(expert_cache *c, int il, int e, uint8_t **slot);
void expert_cache_filled(expert_cache *c, int il, int e);
void expert_cache_abort(expert_cache *c, int il, int e);
void expert_cache_release(expert_cache *c, int il, int e);
int expert_cache_resident(const expert_cache *c, int il, int e);
/* Fault the slot memory in from a background thread (MADV_POPULATE_WRITE,
 * which never touches contents, so it is safe while slots are being
 * filled).  On some VMs first-touching fresh memory runs below disk speed;
 * this moves that cost out of the token loop.  No-op where unsupported. */
void expert_cache_prefault(expert_cache *c);
const char *expert_cache_policy_name(enum cache_policy p);
int expert_cache_policy_parse(const char *s, enum cache_policy *out);

#endif
