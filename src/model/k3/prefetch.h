/* prefetch.h - the router look-ahead prefetch (L3): prediction, issuing,
 * scoring, the on/off timing controller (prefetch_timing.c) and its stats.
 *
 * After layer il, the next MoE layer's router is applied to the hidden
 * state (normalized with that layer's post-attention norm) and its
 * top-scoring experts that are not resident start reading, when the disk
 * is idle (demand reads done), never more than the queue depth, never so
 * many slots that the next layer's group cannot fit.  Each prediction is
 * scored against the real route; a layer whose predictions do not pay
 * (after 16 tries: precision below 1/4, or more prefetched experts evicted
 * unused than used) is switched off, and decode steps are timed with it on
 * and off (prefetch_timing.h).  Reads go through expert_fetch's protocol,
 * tagged FETCH_PF_TAG.  Nothing here changes results: it only moves reads
 * earlier.
 */
#ifndef DF_PREFETCH_H
#define DF_PREFETCH_H

#include <stdint.h>
#include "model.h"
#include "prefetch_timing.h"

struct prefetch {
    int on;                   /* enabled (no --no-prefetch) */
    int active;               /* on and the timing controller's current choice */
    int k;                    /* experts predicted per position and layer */
    pf_timing timing;
    uint8_t *layer_on;        /* [NL] turned off where it does not pay */
    uint8_t *pred;            /* [NL][E] the last prediction for each layer */
    int *npred;               /* [NL] size of that prediction (0 = none pending) */
    uint64_t *tries, *predicted, *correct, *actual;   /* [NL] */
    uint64_t issued, landed;
};
typedef struct prefetch prefetch;

void prefetch_init(prefetch *p, int n_layers, int n_experts, int k_model, int k_opt, int enabled);
void prefetch_deinit(prefetch *p);

/* After layer il of a T-row pass whose hidden state is H [T][h]. */
void prefetch_after_layer(const model_ctx *m, session_bufs *s, int il, int T, const float *H);
/* Layer il's distinct experts are s->uniq[0..n_u): score its prediction. */
void prefetch_score(const model_ctx *m, session_bufs *s, int il, int n_u);
/* A decode step (T == 1) took sec: feed the timing controller. */
void prefetch_step_timed(prefetch *p, int T, double sec, int quiet);

#endif
