/* schedule.c - the order of a chunk's work as a list of steps (schedule.h).
 *
 * The forward pass of a chunk of T positions is: the embedding, then per
 * layer its rows in slices of row_slice (mixes, attention, dense MLP or the
 * router), its routed experts over all T rows at once (each distinct
 * expert read once per chunk), its slices finished (shared experts and the
 * routed sum), then the output step.  Every row's result is the same
 * whatever T and the row slice are (HACKING.md); the schedule only decides
 * when each piece runs:
 *   - READS after a MoE layer's slice when more slices follow: the experts
 *     those rows need start reading while the next slices' attention runs;
 *   - the wavefront (several slices, trunk in memory): a MoE layer's
 *     slices finish one by one inside the next layer's slice loop, since
 *     slice b of layer L+1 needs only slice b of layer L;
 *   - a streamed trunk (TRUNK steps: a layer present before its first
 *     step, the next one loading meanwhile) holds two layers' weights, so
 *     each layer finishes before the next starts.
 * Anchors: layer il's mixes see the anchors of the AttnRes blocks started
 * before it; a block boundary layer adds one (its partial sum) during its rows,
 * so its FINISH steps and later layers see one more.
 */
#include "schedule.h"

#include <stdio.h>
#include <string.h>

size_t sched_capacity(int n_layers, int max_batch, int row_slice)
{
    /* slices: at most max_batch / row_slice + 1, a bound linear in the
     * batch (not the ceiling, a step), as the planner's model of a
     * session's scratch is (engine_plan.c: the line through 256 and 512
     * rows must not fall under any batch's real size) */
    size_t nb = (size_t)(max_batch / row_slice) + 1;
    /* per layer: TRUNK, nb ROWS, nb READS, EXPERTS, nb FINISH, LAYER_END; then TRUNK and nb OUTPUT */
    return (size_t)n_layers * (3 * nb + 3) + nb + 1;
}

int sched_build(const sched_shape *sh, sched_step *out, size_t cap)
{
    size_t n = 0;
#define PUT(k, l, a, b, c)                                                                  \
    do {                                                                                    \
        if (n >= cap) return -1;                                                            \
        out[n++] = (sched_step){.kind = (uint8_t)(k), .il = (l), .t0 = (a), .nt = (b), .n_anc = (c)}; \
    } while (0)
    int T = sh->T, RB = sh->row_slice;
    int one_slice = T <= RB;
    int wave = !one_slice && !sh->streamed;
    int n_anc = 0, pend = -1, pend_anc = 0;
    for (int il = 0; il < sh->n_layers; il++) {
        if (sh->streamed) PUT(STEP_TRUNK, il, 0, 0, 0);
        for (int t0 = 0; t0 < T; t0 += RB) {
            int nt = T - t0 < RB ? T - t0 : RB;
            if (pend >= 0) PUT(STEP_FINISH, pend, t0, nt, pend_anc);
            PUT(STEP_ROWS, il, t0, nt, n_anc);
            if (sh->moe[il] && t0 + nt < T) PUT(STEP_READS, il, 0, 0, 0);
        }
        pend = -1;
        if (il % sh->block_len == 0) n_anc++;
        if (sh->moe[il]) {
            PUT(STEP_EXPERTS, il, 0, T, n_anc);
            if (wave && il + 1 < sh->n_layers) {
                pend = il;
                pend_anc = n_anc;
            } else {
                for (int t0 = 0; t0 < T; t0 += RB) PUT(STEP_FINISH, il, t0, T - t0 < RB ? T - t0 : RB, n_anc);
            }
        }
        PUT(STEP_LAYER_END, il, 0, T, n_anc);
    }
    if (sh->streamed) PUT(STEP_TRUNK, sh->n_layers, 0, 0, 0);
    /* the output mix and norm, by slice; the last position alone when only
     * its logits are wanted */
    for (int t0 = sh->all_rows ? 0 : T - 1; t0 < T; t0 += RB) PUT(STEP_OUTPUT, sh->n_layers, t0, T - t0 < RB ? T - t0 : RB, n_anc);
#undef PUT
    return (int)n;
}

void sched_format(const sched_step *st, int n, char *buf, size_t cap)
{
    static const char *const names[] = {"trunk", "rows", "reads", "experts", "finish", "end", "output"};
    size_t o = 0;
    if (cap) buf[0] = 0;
    for (int i = 0; i < n && o < cap; i++) {
        const sched_step *s = &st[i];
        int w;
        if (s->kind == STEP_ROWS || s->kind == STEP_FINISH || s->kind == STEP_OUTPUT)
            w = snprintf(buf + o, cap - o, "%s L%d %d+%d anc %d\n", names[s->kind], s->il, s->t0, s->nt, s->n_anc);
        else
            w = snprintf(buf + o, cap - o, "%s L%d\n", names[s->kind], s->il);
        if (w < 0) return;
        o += (size_t)w;
    }
}
