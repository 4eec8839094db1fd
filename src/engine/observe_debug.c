/* observe_debug.c - the debug record observer: per layer, the norms of the
 * chunk's last position's mixes and outputs, its mix weights and its
 * routes (test_model compares them with the PyTorch fixtures), from the
 * probe points (observe.c dispatches).
 */
#include "engine_impl.h"
#include "mathfn.h"
#include "util.h"

/* The chunk's last position, when it is among the event's rows: its offset
 * in them, else -1. */
static int last_row(const probe_ev *ev)
{
    int dt = ev->T - 1;
    return dt >= ev->t0 && dt < ev->t0 + ev->nt ? dt - ev->t0 : -1;
}

static double row_norm(const probe_ev *ev, const float *rows, int r)
{
    return l2norm(rows + (size_t)r * (size_t)ev->width, ev->width);
}

static void copy_probs(double *dst, int *n_dst, const probe_ev *ev, int r)
{
    int n = ev->n_probs <= DBG_MAX_ANCHORS + 1 ? ev->n_probs : DBG_MAX_ANCHORS + 1;
    *n_dst = ev->n_probs;
    for (int j = 0; j < n; j++) dst[j] = ev->probs ? ev->probs[(size_t)r * (size_t)ev->n_probs + (size_t)j] : 1.0;
}

void observe_debug(dbg_record *d, const probe_ev *ev)
{
    int r = last_row(ev);
    if (ev->point == PROBE_ROUTE) {
        dbg_layer *dl = &d->layers[ev->il];
        int dt = ev->T - 1;
        dl->n_experts = ev->k;
        for (int j = 0; j < ev->k && j < DBG_MAX_K; j++) {
            dl->expert_ids[j] = ev->ids[(size_t)dt * (size_t)ev->k + (size_t)j];
            dl->expert_weights[j] = ev->w[(size_t)dt * (size_t)ev->k + (size_t)j];
        }
        return;
    }
    if (r < 0) return;
    dbg_layer *dl = ev->il >= 0 && ev->rows && ev->point >= PROBE_ATTN_MIX && ev->point <= PROBE_MLP_OUT
                        ? &d->layers[ev->il] : NULL;
    switch (ev->point) {
    case PROBE_EMBED: d->embedding_norm = row_norm(ev, ev->rows, r); break;
    case PROBE_ATTN_MIX:
        copy_probs(dl->attn_probs, &dl->n_attn_probs, ev, r);
        dl->attn_input_norm = row_norm(ev, ev->rows, r);
        break;
    case PROBE_ATTN_OUT: dl->attn_output_norm = row_norm(ev, ev->rows, r); break;
    case PROBE_MLP_MIX:
        copy_probs(dl->mlp_probs, &dl->n_mlp_probs, ev, r);
        dl->mlp_input_norm = row_norm(ev, ev->rows, r);
        break;
    case PROBE_MLP_OUT:
        dl->mlp_output_norm = row_norm(ev, ev->rows, r);
        dl->partial_sum_norm = row_norm(ev, ev->rows2, r);
        if (!ev->moe) dl->n_experts = 0;
        break;
    case PROBE_FINAL_MIX: d->final_mix_norm = row_norm(ev, ev->rows, r); break;
    case PROBE_FINAL_NORM: d->final_normed_norm = row_norm(ev, ev->rows, r); break;
    case PROBE_LOGITS: d->logits_norm = row_norm(ev, ev->rows, r); break;
    default: break;
    }
}

