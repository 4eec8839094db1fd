/* expert_fetch.h - the one owner of the read protocol between the expert
 * cache (slots, pins; no I/O) and the expert store (reads; no policy):
 * acquire -> queue -> flush -> wait -> filled / abort -> release.  (L3)
 *
 * Its users: moe.c (a layer's distinct experts, streamed through the cache
 * and computed as their reads land), prefetch.c (look-ahead reads,
 * tagged so that a later wait can tell them apart), and the engine
 * (warming the cache at open, draining reads at close or after an error).
 *
 * Tags: a demand read carries its index into the group (s->uniq); a
 * prefetch carries FETCH_PF_TAG | layer << 16 | expert.  Every slot that
 * was acquired is given back exactly once (released when its bytes are
 * there, aborted otherwise), including after a failed read.
 */
#ifndef DF_EXPERT_FETCH_H
#define DF_EXPERT_FETCH_H

#include <stdint.h>
#include "model.h"

#define FETCH_PF_TAG ((int64_t)1 << 31)

/* Compute the experts listed in ready[0..n) (indices into s->uniq). */
typedef void (*fetch_run_fn)(const model_ctx *m, session_bufs *s, int il, const int *ready, int n);

/* The distinct experts s->uniq[u0..u1) of layer il: acquire as many as
 * the cache has free slots for, read the misses (each batch one sorted
 * submission), run the resident ones while the reads are in flight, then
 * each missed one as its read (or the prefetch it waits for) lands; a
 * computed expert gives its slot back at once and the next expert is
 * acquired into it, so a layer needing more experts than the cache holds
 * streams through it with reads, compute and slot reuse overlapping, still
 * one read per expert.  -1 when a read failed (after every started read
 * was waited for). */
int fetch_group(const model_ctx *m, session_bufs *s, int il, int u0, int u1, fetch_run_fn run,
                void (*overlap)(const model_ctx *, session_bufs *, void *), void *overlap_ctx, df_error *err);

/* fetch_group in steps, for a group whose experts become known in
 * pieces (a prompt chunk's row slices): begin the group at u0, extend it
 * to u1 (acquiring and reading as far as free slots allow; may be called
 * again with a larger u1), then finish it as fetch_group does.  A group
 * begun and not finished holds slots: fetch_abandon waits for its reads
 * and gives every slot back. */
void fetch_begin(session_bufs *s, int il, int u0);
void fetch_extend(const model_ctx *m, session_bufs *s, int u1, df_error *err);
int fetch_finish(const model_ctx *m, session_bufs *s, fetch_run_fn run,
                 void (*overlap)(const model_ctx *, session_bufs *, void *), void *overlap_ctx, df_error *err);
void fetch_abandon(const model_ctx *m, session_bufs *s);

/* Take every completion still in flight (prefetches for later layers). */
int fetch_drain(const model_ctx *m, df_error *err);

/* Read the experts keys[0..n) (layer * E + expert) into the cache, many
 * reads in flight; returns the count read, -1 on a failed read. */
long fetch_warm(const model_ctx *m, const int32_t *keys, size_t n, df_error *err);

/* A prefetch read landed (ok) or failed: hand its slot to the cache. */
void fetch_prefetch_landed(const model_ctx *m, int64_t tag, int ok);

#endif
