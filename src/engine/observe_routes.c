/* observe_routes.c - route counts of a session (the server page's router
 * plot): per layer and expert, how many of the rows the session evaluated
 * were routed to it, since the last reset.  Every evaluated row counts once
 * per MoE layer with its k experts, whatever the chunking (routes do not
 * depend on it), so the counts are a fact about the rows evaluated: a
 * verify pass's rows count, drafts later rolled back included; a prefix
 * reused from an earlier request is not evaluated again and does not.
 * The table is allocated when counting is turned on (outside the token
 * loop); observing adds to it and allocates nothing.
 */
#include "engine_impl.h"
#include "util.h"

#include <stdlib.h>
#include <string.h>

int df_session_count_routes(df_session *s, df_error *err)
{
    if (s->route_counts) return 0;
    const k3_config *c = &s->eng->m.cfg;
    s->route_counts = calloc((size_t)c->NL * (size_t)c->E, sizeof *s->route_counts);
    if (!s->route_counts)
        return df_err_set(err, DF_ERR_NOMEM, -1, "route counts: cannot allocate %d x %d counters", c->NL, c->E);
    s->route_rows = 0;
    return 0;
}

void df_session_route_counts_reset(df_session *s)
{
    if (!s->route_counts) return;
    const k3_config *c = &s->eng->m.cfg;
    memset(s->route_counts, 0, (size_t)c->NL * (size_t)c->E * sizeof *s->route_counts);
    s->route_rows = 0;
}

const uint32_t *df_session_route_counts(const df_session *s, uint64_t *rows)
{
    if (rows) *rows = s->route_rows;
    return s->route_counts;
}

void observe_routes(df_session *s, const probe_ev *ev)
{
    const k3_config *c = &s->eng->m.cfg;
    uint32_t *row = s->route_counts + (size_t)ev->il * (size_t)c->E;
    for (int t = 0; t < ev->T; t++)
        for (int j = 0; j < ev->k; j++) {
            int32_t e = ev->ids[t * ev->k + j];
            if (e >= 0 && e < c->E) row[e]++;
        }
    /* rows: counted once, at the first MoE layer */
    int first = 0;
    while (first < c->NL && !c->layer_moe[first]) first++;
    if (ev->il == first) s->route_rows += (uint64_t)ev->T;
}
