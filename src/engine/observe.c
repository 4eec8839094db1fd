/* observe.c - who watches a forward pass, at the points it offers.
 *
 * The schedule runner (forward.c) and the layer function (model/layer.c)
 * hold no observation code: at fixed points (a chunk's start and end, the
 * embedding, a layer's mixes and outputs, its routes, a layer's end, the
 * output rows, the logits) they hand a probe_ev to observe_probe when some
 * observer is on.  The observers:
 *   - the debug record (test_model's per-layer norms, mix weights and
 *     routes of the chunk's last position, against the PyTorch fixtures);
 *   - the route trace (--trace: one JSON line per position and MoE layer,
 *     the input of `deltafin cachesim`);
 *   - the events line (--events: one JSON line per forward call, with the
 *     expert cache, I/O and prefetch counters and each layer's time).
 * A new observer is a case here, not a line in the forward pass.
 */
#include "engine_impl.h"
#include "mathfn.h"
#include "util.h"

#include <stdio.h>

int observe_wanted(const df_session *s)
{
    return (s->dbg && s->dbg->enabled) || s->eng->trace || s->eng->events;
}

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

static void debug_record(dbg_record *d, const probe_ev *ev)
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

static void trace_routes(df_engine *eng, const probe_ev *ev)
{
    for (int t = 0; t < ev->T; t++) {
        fprintf(eng->trace, "{\"pos\":%d,\"layer\":%d,\"experts\":[", ev->pos0 + t, ev->il);
        for (int j = 0; j < ev->k; j++) fprintf(eng->trace, "%s%d", j ? "," : "", ev->ids[t * ev->k + j]);
        fprintf(eng->trace, "],\"weights\":[");
        for (int j = 0; j < ev->k; j++) fprintf(eng->trace, "%s%.7g", j ? "," : "", (double)ev->w[t * ev->k + j]);
        fprintf(eng->trace, "]}\n");
    }
}

static void events_line(df_engine *eng, chunk_obs *o, const probe_ev *ev)
{
    switch (ev->point) {
    case PROBE_CHUNK_BEGIN:
        o->t_start = o->t_layer = now_sec();
        o->hits0 = eng->cache.hits;
        o->miss0 = eng->cache.misses;
        o->bytes0 = eng->m.store.st.bytes_io;
        o->pfi0 = eng->pf.issued;
        o->pfu0 = eng->cache.pf_used;
        o->late0 = eng->cache.late;
        o->wait0 = eng->m.store.st.wait_sec;
        break;
    case PROBE_LAYER_END: {
        double t = now_sec();
        eng->layer_sec[ev->il] = t - o->t_layer;
        o->t_layer = t;
        break;
    }
    case PROBE_CHUNK_END: {
        /* one JSON line per forward call (per token while decoding) */
        double dt_s = now_sec() - o->t_start, wait = eng->m.store.st.wait_sec - o->wait0;
        uint64_t hits = eng->cache.hits - o->hits0, miss = eng->cache.misses - o->miss0;
        uint64_t bytes = eng->m.store.st.bytes_io - o->bytes0;
        fprintf(eng->events,
                "{\"pos\":%d,\"tokens\":%d,\"ms\":%.3f,\"expert_hits\":%llu,\"expert_misses\":%llu,"
                "\"hit_rate\":%.4f,\"bytes_read\":%llu,\"io_wait_ms\":%.3f,\"io_wait_share\":%.4f,"
                "\"read_gbps\":%.3f,\"prefetch\":%d,\"prefetch_issued\":%llu,\"prefetch_used\":%llu,"
                "\"prefetch_late\":%llu,\"layer_ms\":[",
                ev->pos0, ev->T, 1e3 * dt_s, (unsigned long long)hits, (unsigned long long)miss,
                hits + miss ? (double)hits / (double)(hits + miss) : 1.0, (unsigned long long)bytes, 1e3 * wait,
                dt_s > 0 ? wait / dt_s : 0.0, dt_s > 0 ? (double)bytes / dt_s / 1e9 : 0.0, eng->pf.active,
                (unsigned long long)(eng->pf.issued - o->pfi0), (unsigned long long)(eng->cache.pf_used - o->pfu0),
                (unsigned long long)(eng->cache.late - o->late0));
        for (int il = 0; il < eng->m.cfg.NL; il++) fprintf(eng->events, "%s%.3f", il ? "," : "", 1e3 * eng->layer_sec[il]);
        fprintf(eng->events, "]}\n");
        fflush(eng->events);
        break;
    }
    default: break;
    }
}

void observe_probe(void *ctx, const probe_ev *ev)
{
    df_session *s = ctx;
    df_engine *eng = s->eng;
    if (s->dbg && s->dbg->enabled) debug_record(s->dbg, ev);
    if (eng->trace && ev->point == PROBE_ROUTE) trace_routes(eng, ev);
    if (eng->events) events_line(eng, &s->obs, ev);
}
