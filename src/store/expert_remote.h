/* expert_remote.h - the routed experts of a streamed install (L2).
 *
 * `deltafin setup --stream` installs the trunk only (shards whose expert
 * ranges are holes), experts.manifest and install.json ("mode":"stream",
 * the remote: base URL, repository, pinned commit; the disk cache's cap).
 * Opening such a model attaches an expert_remote to the store: a routed
 * expert is then read from the install's disk cache when it is there, and
 * otherwise fetched from the remote by HTTP range requests (a layer's
 * misses in parallel over a keep-alive pool of 8 connections), checked
 * BEFORE it is used, and written into the disk cache.  Checked: length and
 * Content-Range always; then the SHA-256 when the manifest has it (one
 * copy).  Without one (an unverified install) the expert is fetched twice,
 * the two copies in parallel, and used only when two copies agree (their
 * df_hash128 digests; a copy that disagrees brings another, at most 6
 * copies, then the expert fails naming layer, expert and URL).  This
 * catches a copy damaged once, on the way or by a flaky mirror; it cannot
 * catch a mirror that serves the same wrong bytes every time: only a
 * SHA-256 (setup --verify, a published manifest) can.  Its price: twice
 * the network bytes for every expert fetched (counted apart in the stats).
 *
 * The disk cache (DIR/expert-cache/): `data`, slots of the store's slot
 * size, each expert at the same 4 KiB phase as in its shard (so one aligned
 * O_DIRECT read lands it where the store expects); `index`, the slot
 * owners, their last use and the digest of the bytes accepted when each
 * was fetched (what setup --check compares an expert without a SHA-256
 * with), replaced atomically with a CRC; an index in the older format
 * without digests starts an empty cache.  It holds at
 * most cap / slot bytes experts; the least recently used one that no read
 * in flight is using is evicted.  Crash safety: a slot is marked free in
 * the saved index before it is overwritten, and owned again only after its
 * bytes are synced, so the index never names bytes that are not there.
 * One process owns the disk cache (flock on expert-cache/lock); another
 * one opening the same install fetches what it misses without one.
 * Network failure: retried with backoff (bounded: 6 tries, Retry-After
 * honoured); then the read fails with the expert and the URL named, and the
 * forward pass stops with that error: never a wrong token.
 * libcurl allocates per transfer: fetches run under alloc_guard_exempt.
 */
#ifndef DF_EXPERT_REMOTE_H
#define DF_EXPERT_REMOTE_H

#include <stddef.h>
#include <stdint.h>
#include "df_error.h"
#include "file.h"

struct expert_store;
typedef struct expert_remote expert_remote;

typedef struct expert_remote_stats {
    uint64_t fetches;         /* experts fetched over the network */
    uint64_t bytes;           /* bytes received in complete transfers (every copy) */
    uint64_t compare_fetches; /* of those transfers, the copies past an expert's first, fetched only to
                                 compare (experts without a SHA-256) */
    uint64_t compare_bytes;   /* their bytes (part of bytes) */
    uint64_t copy_mismatches; /* experts without a SHA-256 whose first two copies differed */
    uint64_t retries;         /* transfers retried (errors, bad answers, hash mismatches, copies that differed) */
    uint64_t disk_hits;       /* reads served by the disk cache */
    uint64_t evictions;       /* disk cache slots reused */
    uint64_t not_cached;      /* fetched experts the disk cache could not take */
    double fetch_sec;         /* time spent fetching */
} expert_remote_stats;

typedef struct expert_remote_info {
    char base[1024], repo[512], commit[128];
    uint64_t cache_max;       /* the cap in force */
    uint64_t cache_used;      /* bytes of cached experts */
    int cache_slots, cache_filled;
    size_t hashed, listed;    /* experts with a SHA-256 in the manifest, of those listed */
} expert_remote_info;

/* 1 when DIR/install.json says "mode":"stream", 0 when there is no
 * install.json or it is another mode, -1 on a malformed one. */
int expert_remote_detect(const char *dir, df_error *err);

/* Attaches the remote to the store (after expert_store_finish): reads
 * install.json and experts.manifest, checks the manifest against the
 * store's own table (shard, offset, length of every expert), opens the
 * disk cache.  cache_max 0 = the install's recorded cap. */
int expert_remote_open(struct expert_store *s, const char *dir, uint64_t cache_max, df_error *err);
void expert_remote_close(expert_remote *r);

/* For the store: an expert in the disk cache gives 1 and where to read it
 * (fd, offset, length, whether the fd is O_DIRECT); it stays pinned until
 * expert_remote_read_done.  Otherwise 0: the fetch is queued for
 * expert_remote_flush. */
int expert_remote_lookup(expert_remote *r, int il, int e, int *fd, uint64_t *off, int *direct);
void expert_remote_queue_fetch(expert_remote *r, int il, int e, uint8_t *slot, int64_t tag);
void expert_remote_read_done(expert_remote *r, int il, int e);
/* Fetches every queued expert; for each, calls done(ud, tag, ok).  The
 * first failure's message is kept (expert_remote_error). */
void expert_remote_flush(expert_remote *r, void (*done)(void *ud, int64_t tag, int il, int e, int ok), void *ud);
const char *expert_remote_error(const expert_remote *r);
/* The disk cache's data file as the store reads it. */
const df_file *expert_remote_file(const expert_remote *r);

const expert_remote_stats *expert_remote_get_stats(const expert_remote *r);
void expert_remote_get_info(const expert_remote *r, expert_remote_info *out);

/* The disk cache slot a fetched expert goes into: the first free one, else
 * the least recently used that no read in flight pins and this flush has
 * not just filled; -1 when there is none (the expert is used uncached). */
int expert_disk_victim(int n, const int32_t *key, const uint64_t *use, const uint16_t *pins, const uint8_t *taken);

/* What DIR's install.json, manifest and disk cache index say, without
 * opening the model: 1 = a streamed install (o filled), 0 = not one. */
int expert_remote_describe(const char *dir, expert_remote_info *o, df_error *err);

/* setup --check: every expert in DIR's disk cache read back and checked:
 * against the manifest's SHA-256 when it has one, else against the digest
 * recorded in the index when the expert was fetched (the copy that two
 * fetches agreed on: this finds damage on disk since, not a mirror that
 * served the same wrong bytes twice).  Slots found wrong are freed in the
 * index, under the cache's lock, so the next run fetches them again
 * (dropped; when another process holds the cache they are left, and a log
 * line says so).  An index in the older format without digests is not
 * checked (old_index): the next run starts an empty cache over it. */
typedef struct expert_cache_check {
    int sha_ok;               /* match the manifest's SHA-256 */
    int digest_ok;            /* without a SHA-256: match the digest recorded when fetched */
    int wrong;                /* differ, or name no expert of the manifest */
    int dropped;              /* of the wrong ones, freed in the index */
    int old_index;
} expert_cache_check;
int expert_cache_verify(const char *dir, expert_cache_check *out, df_error *err);

#endif
