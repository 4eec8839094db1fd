/* prefetch.c - see prefetch.h. */
#include "prefetch.h"
#include "expert_fetch.h"
#include "mathfn.h"
#include "util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

void prefetch_init(prefetch *p, int n_layers, int n_experts, int k_model, int k_opt, int enabled)
{
    memset(p, 0, sizeof *p);
    pf_timing_init(&p->timing);
    p->on = enabled;
    p->active = enabled && pf_timing_active(&p->timing);
    p->k = k_opt > 0 ? k_opt : (k_model + 1) / 2;
    if (p->k > k_model) p->k = k_model;
    size_t nl = (size_t)n_layers;
    p->layer_on = xmalloc(nl);
    memset(p->layer_on, 1, nl);
    p->pred = xcalloc(nl * (size_t)n_experts, 1);
    p->npred = xcalloc(nl, sizeof *p->npred);
    p->tries = xcalloc(nl, sizeof *p->tries);
    p->predicted = xcalloc(nl, sizeof *p->predicted);
    p->correct = xcalloc(nl, sizeof *p->correct);
    p->actual = xcalloc(nl, sizeof *p->actual);
}

void prefetch_deinit(prefetch *p)
{
    free(p->layer_on);
    free(p->pred);
    free(p->npred);
    free(p->tries);
    free(p->predicted);
    free(p->correct);
    free(p->actual);
    memset(p, 0, sizeof *p);
}

void prefetch_step_timed(prefetch *p, int T, double sec, int quiet)
{
    if (!p->on || T != 1) return;
    if (pf_timing_step(&p->timing, sec) && !quiet)
        df_log("prefetch %s for the next %d tokens: decode steps took %.1f ms with it, %.1f ms without",
               p->timing.last ? "on" : "off", PF_TIMING_HOLD, 1e3 * p->timing.mean[1], 1e3 * p->timing.mean[0]);
    p->active = pf_timing_active(&p->timing);
}

void prefetch_after_layer(const model_ctx *eng, session_bufs *s, int il, int T, const float *H)
{
    const k3_config *c = &eng->cfg;
    int nl = il + 1;
    while (nl < c->NL && !c->layer_moe[nl]) nl++;
    /* decode steps only: a prompt chunk reads each next layer's union once,
     * sorted, when it gets there; predicting it per row only adds reads */
    if (T > 1 || !eng->pf->active || eng->all_resident || nl >= c->NL || !eng->pf->layer_on[nl]) return;
    if (expert_store_in_flight(eng->store) >= eng->io_depth) return;
    /* streamed trunk: the next layer's router is in the buffer being loaded;
     * a layer further away is not loaded yet, so no prediction for it */
    if (eng->trunk_streamed && (nl != il + 1 || eng->trunk_ready(eng->eng, nl))) return;
    const k3_layer *N = &eng->layers[nl];
    int E = c->E, h = c->h, npf = eng->pf->k;
    for (int t = 0; t < T; t++) rmsnorm(H + (size_t)t * h, N->post_ln, h, c->eps, s->big0 + (size_t)t * h);
    eng->bk->ops->project(eng, N->router, s->big0, T, s->big1);
    /* never pin so many slots that the next layer's demand group cannot fit */
    int group = T * c->k < MM_MAX_JOBS / 2 ? T * c->k : MM_MAX_JOBS / 2;
    int room = eng->cache->n_slots - group - eng->cache->n_pending;
    if (room <= 0) return;
    uint8_t *pred = eng->pf->pred + (size_t)nl * E;
    memset(pred, 0, (size_t)E);
    int n_pred = 0;
    for (int t = 0; t < T; t++) {
        float *choice = s->big2;
        df_router_score(s->big1 + (size_t)t * E, N->router_bias, E, NULL, choice);
        int *top = s->uniq_first; /* [T*k] >= npf ints; free between layers */
        int got = df_topk(choice, E, npf, top);
        for (int j = 0; j < got; j++) {
            if (!pred[top[j]]) {
                pred[top[j]] = 1;
                n_pred++;
            }
        }
    }
    eng->pf->npred[nl] = n_pred;
    df_error qerr = {0};
    for (int e = 0; e < E && room > 0; e++) {
        if (!pred[e]) continue;
        uint8_t *slot;
        if (expert_cache_acquire_prefetch(eng->cache, nl, e, &slot) != EC_MISS) continue;
        if (expert_store_queue(eng->store, nl, e, slot, FETCH_PF_TAG | (int64_t)nl << 16 | e, &qerr)) {
            expert_cache_abort(eng->cache, nl, e);
            break; /* a prefetch failure is not an error: the demand read will report it */
        }
        eng->pf->issued++;
        room--;
    }
    expert_store_flush(eng->store);
}

/* Score the prediction made for layer il against its real route. */
void prefetch_score(const model_ctx *eng, session_bufs *s, int il, int n_u)
{
    if (!eng->pf->on || !eng->pf->npred[il]) return;
    const uint8_t *pred = eng->pf->pred + (size_t)il * eng->cfg.E;
    int correct = 0;
    for (int u = 0; u < n_u; u++) correct += pred[s->uniq[u]];
    eng->pf->tries[il]++;
    eng->pf->predicted[il] += (uint64_t)eng->pf->npred[il];
    eng->pf->correct[il] += (uint64_t)correct;
    eng->pf->actual[il] += (uint64_t)n_u;
    eng->pf->npred[il] = 0;
    /* it does not pay when predictions are mostly wrong, or when more of the
     * experts it read were evicted unused than were ever used */
    uint32_t used = eng->cache->pf_used_l[il], wasted = eng->cache->pf_wasted_l[il];
    if (eng->pf->tries[il] >= 16 && eng->pf->layer_on[il] &&
        (eng->pf->correct[il] * 4 < eng->pf->predicted[il] || wasted > used)) {
        eng->pf->layer_on[il] = 0;
        if (!eng->quiet)
            df_log("prefetch off for layer %d after %llu tokens: precision %.2f, %u prefetched experts used, %u "
                   "evicted unused",
                   il, (unsigned long long)eng->pf->tries[il],
                   (double)eng->pf->correct[il] / (double)eng->pf->predicted[il], used, wasted);
    }
}

