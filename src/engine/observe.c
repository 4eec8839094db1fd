/* observe.c - who watches a forward pass, at the points it offers.
 *
 * The evaluation (forward.c), the schedule runner (forward.c) and the
 * layer blocks (model/layer.c, model/moe.c) hold no observation code: at
 * fixed points (a prompt's begin and end, a chunk's begin and end, the
 * embedding, a layer's mixes and outputs, its distinct experts, its routes,
 * a layer's end, the output rows, the logits) they hand a probe_ev to
 * observe_probe, which passes it to the subscribers, each in its own file:
 *   - the debug record (observe_debug.c: test_model's per-layer norms, mix
 *     weights and routes of the chunk's last position);
 *   - the route trace (observe_trace.c, --trace);
 *   - a session's route counts (observe_routes.c: the server page's router plot);
 *   - the events line with layer timings (observe_events.c, --events);
 *   - prompt accounting (observe_prompt.c: distinct experts, reads and
 *     time of a prompt, for --stats);
 *   - the prefetcher's scoring of its predictions against a layer's
 *     distinct experts (prefetch.c's prefetch_score).
 * A new observer is a file and a line here, not a line in the forward pass.
 * Points later work will want: per-head attention probabilities from
 * inside the MLA op, progress per piece of a prompt (the page's live view:
 * today the session's progress hook between passes).
 */
#include "engine_impl.h"
#include "prefetch.h"

void observe_probe(void *ctx, const probe_ev *ev)
{
    df_session *s = ctx;
    df_engine *eng = s->eng;
    switch (ev->point) {
    case PROBE_ATTN_PROBS: observe_attn(eng, ev); return;
    case PROBE_PROMPT_BEGIN:
        if (eng->trace) observe_trace(eng, ev);
        if (eng->attn) observe_attn(eng, ev);
        observe_prompt(s, ev);
        return;
    case PROBE_PROMPT_END: observe_prompt(s, ev); return;
    case PROBE_EXPERTS:
        observe_prompt(s, ev);
        prefetch_score(&eng->mc, &s->b, ev->il, ev->n_experts);
        return;
    default: break;
    }
    if (s->dbg && s->dbg->enabled) observe_debug(s->dbg, ev);
    if (eng->trace && ev->point == PROBE_ROUTE) observe_trace(eng, ev);
    if (s->route_counts && ev->point == PROBE_ROUTE) observe_routes(s, ev);
    if (eng->trace_lookahead && ev->point == PROBE_MLP_OUT) observe_lookahead(eng, ev);
    if (eng->events) observe_events(eng, &s->obs, ev);
}
