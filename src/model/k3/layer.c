/* layer.c - one K3 layer (spec section 4.2) on a slice of a chunk's rows,
 * in the phases the engine's schedule runs it (engine/schedule.c):
 *
 *   LAYER_ROWS     rows [t0, t0+nt): the attention input mix (AttnRes over
 *                  the anchors, a new anchor at a block boundary), the
 *                  input norm, KDA or MLA attention added to the partial
 *                  sum, the MLP input mix and norm, then a dense MLP added
 *                  to the sum, or the MoE router (moe_route);
 *   LAYER_READS    start reading the experts the rows routed so far need;
 *   LAYER_EXPERTS  the routed experts over all T rows (one read each);
 *   LAYER_FINISH   rows [t0, t0+nt) of a MoE layer: the shared experts and
 *                  the routed sum added to the partial sum.
 *
 * Every number is the backend's (ops.h): this file says what runs on which
 * rows and in what order.  What an observer may want to see (the
 * mix weights, a part's output rows, the routes) is offered at fixed
 * points through session_bufs.probe; nothing here knows who looks.
 */
#include "model.h"
#include "mathfn.h"
#include "util.h"

#include <string.h>

/* Non-finite values.  A NaN or infinity in a weight (or an overflow)
 * spreads through every later layer into the logits, and greedy decoding
 * of NaN logits is token 0 forever.  So the rows a part of a layer adds to
 * the residual stream are tested where they are added (an exponent test
 * per float, integer OR: O(h) per row against the part's O(h^2) work, and
 * no effect on any value), the earliest layer and part is kept, and the
 * chunk fails at its end with an error naming it. */
static int any_nonfinite(const float *x, size_t n)
{
    uint32_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, x + i, sizeof u);
        bad |= (uint32_t)((u & 0x7f800000u) == 0x7f800000u);
    }
    return bad != 0;
}

void rows_check_finite(session_bufs *b, const float *x, size_t n, int layer, const char *part)
{
    if (b->nf_layer <= layer) return; /* already seen no later than this */
    if (any_nonfinite(x, n)) {
        b->nf_layer = layer;
        b->nf_part = part;
    }
}

/* An observation point: rows [t0, t0+nt) of width floats (and their mix
 * weights, n_probs a row, or NULL). */
static void probe_rows(session_bufs *b, const layer_call *lc, int point, const float *rows, const float *rows2,
                       int width, const float *probs, int n_probs, int moe)
{
    probe_ev ev = {.point = point, .il = lc->il, .t0 = lc->t0, .nt = lc->nt, .T = lc->T, .pos0 = lc->pos0,
                   .width = width, .rows = rows, .rows2 = rows2, .probs = probs, .n_probs = n_probs, .moe = moe};
    b->probe(b->probe_ctx, &ev);
}

/* LAYER_ROWS: the residual mix, attention (at positions pos0 + t0...), and
 * then either the dense MLP (added to H) or the MoE router (with the shared
 * experts' gate and up when the chunk is one slice). */
static int layer_rows(const model_ctx *mc, session_bufs *b, const k3_layer *L, const layer_call *lc, df_error *err)
{
    const k3_config *c = &mc->cfg;
    int t0 = lc->t0, nt = lc->nt, n_anc = lc->n_anc, il = lc->il;
    size_t h = (size_t)c->h, nh = (size_t)nt * h;
    size_t astride = (size_t)b->max_batch * h;
    float *H = b->H + (size_t)t0 * h;
    const float *anc = b->anchors + (size_t)t0 * h;
    int boundary = il % c->B == 0;
    const float *ain = H;
    if (n_anc) {
        mc->bk->ops->mix_rows(mc, anc, n_anc, astride, H, nt, (int)h, L->attn_res_nwpw, c->eps, b->ain, b->probs);
        ain = b->ain;
    }
    if (b->probe) probe_rows(b, lc, PROBE_ATTN_MIX, ain, NULL, (int)h, n_anc ? b->probs : NULL, n_anc + 1, 0);
    if (boundary) mc->bk->ops->copy_rows(mc, b->anchors + (size_t)n_anc++ * astride + (size_t)t0 * h, H, nh);
    mc->bk->ops->norm_rows(mc, ain, L->input_ln, nt, (int)h, c->eps, b->xn);
    b->pos = lc->pos0 + t0;
    int rc = 0;
    if (L->kind == LAYER_KDA) mc->bk->ops->kda_rows(mc, b, L, b->xn, nt, b->att);
    else rc = mc->bk->ops->mla_rows(mc, b, L, b->xn, nt, b->att, err);
    b->pos = lc->pos0;
    if (rc) return -1;
    if (b->probe && b->attn_on && b->attn_on[il]) {
        int mla = L->kind == LAYER_MLA;
        probe_ev ev = {.point = PROBE_ATTN_PROBS, .il = il, .t0 = t0, .nt = nt, .T = nt, .pos0 = lc->pos0 + t0,
                       .ids = mla ? b->attn_pos : NULL, .w = mla ? b->attn_p : b->kda_stat, .k = b->attn_top,
                       .n_probs = mla ? b->attn_nh : c->Hk, .width = mla ? b->attn_h0 : 0};
        b->probe(b->probe_ctx, &ev);
    }
    if (boundary) mc->bk->ops->copy_rows(mc, H, b->att, nh);
    else mc->bk->ops->add_rows(mc, H, b->att, nh);
    rows_check_finite(b, H, nh, il, L->kind == LAYER_KDA ? "KDA attention" : "MLA attention");
    if (b->probe) probe_rows(b, lc, PROBE_ATTN_OUT, b->att, NULL, (int)h, NULL, 0, 0);
    mc->bk->ops->mix_rows(mc, anc, n_anc, astride, H, nt, (int)h, L->mlp_res_nwpw, c->eps, b->min, b->probs);
    if (b->probe) probe_rows(b, lc, PROBE_MLP_MIX, b->min, NULL, (int)h, b->probs, n_anc + 1, 0);
    mc->bk->ops->norm_rows(mc, b->min, L->post_ln, nt, (int)h, c->eps, b->y);
    if (L->moe) {
        moe_route(mc, b, L, b->y, t0, nt, lc->one_slice);
    } else {
        mc->bk->ops->dense_mlp(mc, b, L, b->y, nt, b->ffn);
        mc->bk->ops->add_rows(mc, H, b->ffn, nh);
        rows_check_finite(b, H, nh, il, "dense MLP");
        if (b->probe) probe_rows(b, lc, PROBE_MLP_OUT, b->ffn, H, (int)h, NULL, 0, 0);
    }
    return 0;
}

/* LAYER_FINISH: the shared experts (unless one_slice: done during the
 * reads) and the routed sum, added to H; n_anc counts this layer's own
 * boundary anchor. */
static void layer_finish(const model_ctx *mc, session_bufs *b, const k3_layer *L, const layer_call *lc)
{
    const k3_config *c = &mc->cfg;
    int t0 = lc->t0, nt = lc->nt;
    size_t h = (size_t)c->h, astride = (size_t)b->max_batch * h;
    float *H = b->H + (size_t)t0 * h;
    if (!lc->one_slice) {
        /* the slice's MoE input again, from the unchanged H and anchors */
        mc->bk->ops->mix_rows(mc, b->anchors + (size_t)t0 * h, lc->n_anc, astride, H, nt, (int)h, L->mlp_res_nwpw, c->eps,
                 b->min, b->probs);
        mc->bk->ops->norm_rows(mc, b->min, L->post_ln, nt, (int)h, c->eps, b->y);
    }
    moe_finish(mc, b, L, b->y, t0, nt, b->ffn, lc->one_slice);
    mc->bk->ops->add_rows(mc, H, b->ffn, (size_t)nt * h);
    rows_check_finite(b, H, (size_t)nt * h, lc->il, "MoE (router, shared or routed experts)");
    if (b->probe) probe_rows(b, lc, PROBE_MLP_OUT, b->ffn, H, (int)h, NULL, 0, 1);
}

int k3_layer_forward(const model_ctx *mc, session_bufs *b, const k3_layer *L, const layer_call *lc, df_error *err)
{
    switch (lc->phase) {
    case LAYER_ROWS: return layer_rows(mc, b, L, lc, err);
    case LAYER_READS: moe_start(mc, b, lc->il, err); return 0;
    case LAYER_EXPERTS: {
        /* one slice: the shared experts' down-projection overlaps the
         * first reads; several: each slice's shared experts run at its finish */
        if (moe_experts(mc, b, lc->il, L, lc->T, lc->one_slice ? b->ffn : NULL, err)) return -1;
        if (b->probe) {
            /* before the next layer's routing takes these rows */
            probe_ev ev = {.point = PROBE_ROUTE, .il = lc->il, .t0 = 0, .nt = lc->T, .T = lc->T, .pos0 = lc->pos0,
                           .ids = b->route_ids, .w = b->route_w, .score = b->route_s, .k = mc->cfg.k,
                           .moe = 1};
            b->probe(b->probe_ctx, &ev);
        }
        return 0;
    }
    case LAYER_FINISH: layer_finish(mc, b, L, lc); return 0;
    default: return df_err_set(err, DF_ERR_ARG, -1, "layer %d: unknown phase %d", lc->il, lc->phase);
    }
}
