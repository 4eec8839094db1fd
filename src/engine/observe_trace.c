/* observe_trace.c - the route trace observer (--trace): one JSON line per
 * position and MoE layer with its experts and weights, at each layer's
 * PROBE_ROUTE (the input of `deltafin cachesim`).
 */
#include "engine_impl.h"

#include <stdio.h>

void observe_trace(df_engine *eng, const probe_ev *ev)
{
    for (int t = 0; t < ev->T; t++) {
        fprintf(eng->trace, "{\"pos\":%d,\"layer\":%d,\"experts\":[", ev->pos0 + t, ev->il);
        for (int j = 0; j < ev->k; j++) fprintf(eng->trace, "%s%d", j ? "," : "", ev->ids[t * ev->k + j]);
        fprintf(eng->trace, "],\"weights\":[");
        for (int j = 0; j < ev->k; j++) fprintf(eng->trace, "%s%.7g", j ? "," : "", (double)ev->w[t * ev->k + j]);
        fprintf(eng->trace, "]}\n");
    }
}

