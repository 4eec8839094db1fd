/* observe_prompt.c - the prompt accounting observer: for an evaluation of
 * more than one position (a prompt), the distinct (layer, expert) pairs it
 * needed, the expert reads and bytes it caused and its time, into the
 * engine's prompt_stats (`--stats`' prompt line, bench/bench_agent.sh).
 * Subscribed to the prompt's begin and end (forward.c's eval) and to each
 * MoE layer's distinct experts (moe.c's PROBE_EXPERTS).
 */
#include "engine_impl.h"
#include "util.h"

#include <string.h>

void observe_prompt(df_session *s, const probe_ev *ev)
{
    df_engine *eng = s->eng;
    const k3_config *c = &eng->m.cfg;
    prompt_obs *o = &s->pobs;
    switch (ev->point) {
    case PROBE_PROMPT_BEGIN:
        o->on = ev->T > 1;
        if (!o->on) return;
        memset(s->b.seen, 0, (size_t)c->NL * (size_t)c->E);
        s->b.n_seen = 0;
        o->reads0 = eng->m.store.st.n_reads;
        o->bytes0 = eng->m.store.st.bytes_read;
        o->t0 = now_sec();
        break;
    case PROBE_EXPERTS:
        if (!o->on) return;
        for (int u = 0; u < ev->n_experts; u++) {
            uint8_t *seen = s->b.seen + (size_t)ev->il * (size_t)c->E + (size_t)ev->experts[u];
            if (!*seen) *seen = 1, s->b.n_seen++;
        }
        break;
    case PROBE_PROMPT_END: {
        if (!o->on) return;
        prompt_stats *ps = &eng->prompt;
        ps->positions = (uint64_t)ev->T;
        ps->chunk = s->b.max_batch;
        ps->unique = s->b.n_seen;
        ps->reads = eng->m.store.st.n_reads - o->reads0;
        ps->bytes = eng->m.store.st.bytes_read - o->bytes0;
        ps->seconds = now_sec() - o->t0;
        o->on = 0;
        break;
    }
    default: break;
    }
}
