/* forward.c - the forward pass over a chunk of positions (spec section 4.2):
 * the embedding, then the chunk's schedule (schedule.c: the steps in order)
 * run step by step, each layer step by the layer function (model/layer.c
 * k3_layer_forward), the streamed trunk's layers made present and the
 * router look-ahead prefetch between them, then the output mix, norm and
 * lm_head; and df_session_eval, which cuts an input into chunks and runs
 * them under the allocation guard.  Observers (debug records, the route
 * trace, the events line) see the pass only at the points it offers
 * (observe.c); the prompt's accounting is an observer's (observe_prompt.c).
 */
#define _GNU_SOURCE
#include "heat.h"
#include "expert_fetch.h"
#include "plan.h"
#include "prefetch.h"
#include "engine_impl.h"
#include "expert_remote.h"
#include "mathfn.h"
#include "quant.h"
#include "util.h"
#include "schedule.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Embedding rows.  A resident trunk keeps the embedding mapped (counted in
 * the plan); a streamed one reads each row from the file into H (a row of
 * BF16, F16 or Q8_0 lands at the start of its f32 row and is widened from
 * the end, so no byte is overwritten before it is read): touching rows of a
 * mapping would grow the resident set with every new token, outside the
 * budget. */
static int embed_rows(const df_engine *eng, const int32_t *ids, int T, float *H, df_error *err)
{
    const k3_config *c = &eng->m.cfg;
    const wmat *E = &eng->m.embed;
    size_t rb = wmat_row_bytes(E);
    for (int t = 0; t < T; t++) {
        float *row = H + (size_t)t * c->h;
        if (eng->ts.on) {
            uint64_t off = eng->m.embed_off + (uint64_t)ids[t] * rb;
            if (model_pread_fd(eng->m.shards[eng->m.embed_shard].fd, (uint8_t *)row, rb, off))
                return df_err_set(err, DF_ERR_IO, (int64_t)off, "%s: reading the embedding row of token %d failed",
                                  eng->m.shards[eng->m.embed_shard].path, ids[t]);
            wmat_row_widen(E, row, c->h);
            continue;
        }
        wmat_row_f32(E, (const uint8_t *)E->data + (size_t)ids[t] * rb, c->h, row);
    }
    return 0;
}

/* One chunk of T <= max_batch positions: the embedding, then the steps of
 * its schedule (schedule.c: per layer its rows in row slices, its routed
 * experts over all T rows, its slices finished, in the wavefront order),
 * then the output rows.  Each layer step is k3_layer_forward's (layer.c);
 * what observers see is offered at the schedule's fixed points
 * (observe.c).  Every row's result is the same whatever the chunk and
 * block widths (HACKING.md).  logits: NULL, or [T][V] when all_rows, or
 * [V] for the last position. */
static int forward_chunk(df_session *s, const int32_t *ids, int T, float *logits, int all_rows, df_error *err)
{
    df_engine *eng = s->eng;
    const model_ctx *mc = &eng->mc;
    const k3_config *c = &eng->m.cfg;
    size_t h = (size_t)c->h;
    size_t astride = (size_t)s->b.max_batch * h;
    int RB = s->b.row_slice, pos0 = s->b.pos;
    double t_start = now_sec();
    CHECK(T >= 1 && T <= s->b.max_batch);
    sched_shape shape = {.T = T, .row_slice = RB, .n_layers = c->NL, .block_len = c->B, .moe = c->layer_moe,
                         .streamed = eng->ts.on, .all_rows = all_rows};
    int n_steps = sched_build(&shape, s->sched, s->sched_cap);
    CHECK(n_steps > 0);
    s->b.probe = observe_probe;
    s->b.probe_ctx = s;
    probe_ev ev = {.point = PROBE_CHUNK_BEGIN, .il = -1, .nt = T, .T = T, .pos0 = pos0};
    if (s->b.probe) s->b.probe(s, &ev);
    if (embed_rows(eng, ids, T, s->b.H, err)) goto fail;
    s->b.nf_layer = INT_MAX;
    s->b.nf_part = NULL;
    rows_check_finite(&s->b, s->b.H, (size_t)T * h, -1, "token embedding");
    ev = (probe_ev){.point = PROBE_EMBED, .il = -1, .nt = T, .T = T, .pos0 = pos0, .width = (int)h, .rows = s->b.H};
    if (s->b.probe) s->b.probe(s, &ev);
    for (int i = 0; i < n_steps; i++) {
        const sched_step *st = &s->sched[i];
        switch (st->kind) {
        case STEP_TRUNK:
            if (trunk_stream_layer(eng, st->il, err)) goto fail;
            break;
        case STEP_ROWS:
        case STEP_READS:
        case STEP_EXPERTS:
        case STEP_FINISH: {
            static const int phase[] = {[STEP_ROWS] = LAYER_ROWS, [STEP_READS] = LAYER_READS,
                                        [STEP_EXPERTS] = LAYER_EXPERTS, [STEP_FINISH] = LAYER_FINISH};
            layer_call lc = {.il = st->il, .phase = phase[st->kind], .t0 = st->t0, .nt = st->nt, .n_anc = st->n_anc,
                             .T = T, .pos0 = pos0, .one_slice = T <= RB};
            if (k3_layer_forward(mc, &s->b, &eng->m.layers[st->il], &lc, err)) goto fail;
            break;
        }
        case STEP_LAYER_END:
            prefetch_after_layer(mc, &s->b, st->il, T, s->b.H);
            ev = (probe_ev){.point = PROBE_LAYER_END, .il = st->il, .nt = T, .T = T, .pos0 = pos0};
            if (s->b.probe) s->b.probe(s, &ev);
            break;
        case STEP_OUTPUT: {
            int t0 = st->t0, nt = st->nt;
            const k3_ops *ops = eng->bk.ops;
            ops->mix_rows(mc, s->b.anchors + (size_t)t0 * h, st->n_anc, astride, s->b.H + (size_t)t0 * h, nt, (int)h,
                          eng->m.out_res_nwpw, c->eps, s->b.ain, NULL);
            ops->norm_rows(mc, s->b.ain, eng->m.final_norm, nt, (int)h, c->eps, s->b.xn);
            if (s->b.probe) {
                ev = (probe_ev){.point = PROBE_FINAL_MIX, .il = c->NL, .t0 = t0, .nt = nt, .T = T, .pos0 = pos0,
                                .width = (int)h, .rows = s->b.ain};
                s->b.probe(s, &ev);
                ev.point = PROBE_FINAL_NORM;
                ev.rows = s->b.xn;
                s->b.probe(s, &ev);
            }
            if (logits) {
                float *lr = all_rows ? logits + (size_t)t0 * c->V : logits;
                ops->project(mc, eng->m.lm_head, s->b.xn, nt, lr);
                rows_check_finite(&s->b, lr, (size_t)(all_rows ? nt : 1) * c->V, c->NL, "output norm and lm_head");
            }
            break;
        }
        default: CHECK(!"a schedule step of an unknown kind");
        }
    }
    if (s->b.nf_layer != INT_MAX) {
        /* the session's state past this chunk's start is not usable: its
         * position stays where it was and the caller resets or truncates */
        if (s->b.nf_layer < 0 || s->b.nf_layer >= c->NL)
            df_err_set(err, DF_ERR_NUMERIC, -1,
                       "non-finite values (NaN or infinity) at positions %d-%d, first in the %s: the model's "
                       "weights hold a NaN or infinity there, or the values overflowed",
                       pos0, pos0 + T - 1, s->b.nf_part);
        else
            df_err_set(err, DF_ERR_NUMERIC, -1,
                       "non-finite values (NaN or infinity) at positions %d-%d, first in layer %d's %s "
                       "(model.layers.%d): the model's weights hold a NaN or infinity there, or the values overflowed",
                       pos0, pos0 + T - 1, s->b.nf_layer, s->b.nf_part, s->b.nf_layer);
        goto fail;
    }
    if (s->b.probe) {
        if (logits) {
            ev = (probe_ev){.point = PROBE_LOGITS, .il = c->NL, .t0 = T - 1, .nt = 1, .T = T, .pos0 = pos0,
                            .width = c->V, .rows = all_rows ? logits + (size_t)(T - 1) * c->V : logits};
            s->b.probe(s, &ev);
        }
        ev = (probe_ev){.point = PROBE_CHUNK_END, .il = c->NL, .nt = T, .T = T, .pos0 = pos0};
        s->b.probe(s, &ev);
    }
    prefetch_step_timed(&eng->pf, T, now_sec() - t_start, eng->mc.quiet);
    s->b.pos += T;
    eng->tokens += (uint64_t)T;
    /* predictions may still be reading: they are taken in by later waits
     * (or when a group needs their slots), never waited for here */
    return 0;
fail:
    moe_abandon(&eng->mc, &s->b);
    fetch_drain(&eng->mc, NULL);
    return -1;
}

static int eval_impl(df_session *s, const int32_t *ids, int n, float *logits, int all_rows, df_rows_fn each,
                     void *each_ctx, df_error *err);

int df_session_eval(df_session *s, const int32_t *ids, int n, float *logits, int all_rows, df_error *err)
{
    return eval_impl(s, ids, n, logits, all_rows, NULL, NULL, err);
}

int df_session_eval_each(df_session *s, const int32_t *ids, int n, float *rows, df_rows_fn each, void *ctx,
                         df_error *err)
{
    return eval_impl(s, ids, n, rows, 1, each, ctx, err);
}

static int eval_impl(df_session *s, const int32_t *ids, int n, float *logits, int all_rows, df_rows_fn each,
                     void *each_ctx, df_error *err)
{
    const k3_config *c = &s->eng->m.cfg;
    if (n <= 0) return df_err_set(err, DF_ERR_ARG, -1, "no tokens to evaluate");
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= c->V)
            return df_err_set(err, DF_ERR_ARG, i, "token id %d at index %d is outside the vocabulary [0, %d)", ids[i],
                              i, c->V);
    if (n > s->b.n_ctx - s->b.pos)
        return df_err_set(err, DF_ERR_LIMIT, -1, "context full: %d tokens held, %d more requested, capacity %d",
                          s->b.pos, n, s->b.n_ctx);
    /* rows past what the mark can take back: the mark is dropped */
    if (s->b.rb_mark >= 0 && s->b.pos + n - s->b.rb_mark > s->b.rb_rows) s->b.rb_mark = -1;
    int rc = 0;
    probe_ev pev = {.point = PROBE_PROMPT_BEGIN, .il = -1, .nt = n, .T = n, .pos0 = s->b.pos, .ids = ids};
    observe_probe(s, &pev);
    alloc_guard_enter();
    for (int off = 0; off < n && !rc; off += s->b.max_batch) {
        int T = n - off < s->b.max_batch ? n - off : s->b.max_batch;
        int last = off + T == n;
        float *dst = NULL;
        if (logits && each) dst = logits; /* one chunk's rows at a time, handed to each */
        else if (logits && all_rows) dst = logits + (size_t)off * c->V;
        else if (logits && last) dst = logits;
        int p0 = s->b.pos;
        rc = forward_chunk(s, ids + off, T, dst, all_rows, err);
        session_ck_settle(s, p0, p0 + T, !rc);
        if (!rc && each) {
            alloc_guard_leave();
            if (each(each_ctx, dst, T)) rc = df_err_set(err, DF_ERR_IO, off, "the rows' consumer failed");
            alloc_guard_enter();
        }
        if (!rc && s->progress && off + T < n) {
            alloc_guard_leave();
            s->progress(s->progress_ctx, off + T, n);
            alloc_guard_enter();
        }
    }
    alloc_guard_leave();
    pev.point = PROBE_PROMPT_END;
    observe_probe(s, &pev);
    return rc;
}
