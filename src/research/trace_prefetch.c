/* trace_prefetch.c - how well the router look-ahead predicts (`deltafin
 * trace prefetch`), from a trace written with --trace-lookahead D.
 *
 * Each TRACE_PREDICT record holds, for positions after layer `from`, the
 * top k experts of the router of the d-th MoE layer on (in order, as the
 * prefetcher ranks them: it reads the first m = k/2 by default).  Each is
 * compared with the route that position finally got at that layer (the
 * last one in the trace: a rolled-back draft's rows replaced).  Per
 * distance and target layer, and pooled per distance: predictions compared,
 * and the routed experts among the first m and among all k.  Recall is
 * hits / (compared * k), precision hits / (compared * m).
 */
#include "research.h"
#include "trace.h"
#include "util.h"

#include <stdlib.h>
#include <string.h>

static int routed(const int32_t *route, int k, int32_t e)
{
    for (int j = 0; j < k; j++)
        if (route[j] == e) return 1;
    return 0;
}

int df_trace_prefetch_compute(const char *path, df_trace_prefetch *out, df_error *err)
{
    memset(out, 0, sizeof *out);
    df_trace_routes R;
    if (df_trace_last_routes(path, &R, err)) {
        df_trace_routes_free(&R);
        return -1;
    }
    df_trace *t;
    if (df_trace_open(path, &t, err)) {
        df_trace_routes_free(&R);
        return -1;
    }
    int NL = R.layers, k = R.k, m = k / 2 > 0 ? k / 2 : 1, D = 0;
    /* [d-1][layer + 1]: index 0 pooled */
    df_trace_prefetch_row *acc = xcalloc((size_t)8 * (NL + 1), sizeof *acc);
    df_trace_rec r;
    int rc;
    while ((rc = df_trace_next(t, &r, err)) == 1) {
        if (r.tag != TRACE_PREDICT) continue;
        if (r.dist > 8) continue; /* the engine writes at most 8 */
        if (r.dist > D) D = r.dist;
        df_trace_prefetch_row *P = &acc[(size_t)(r.dist - 1) * (NL + 1)], *L = P + 1 + r.layer;
        for (int q = 0; q < r.n; q++) {
            int pos = r.pos0 + q;
            if (pos >= R.max_pos) continue;
            const int32_t *route = R.ids + ((size_t)pos * NL + (size_t)r.layer) * k;
            if (route[0] < 0) continue;
            const int32_t *pred = r.ids + (size_t)q * k;
            int h = 0, hm = 0;
            for (int j = 0; j < k; j++)
                if (routed(route, k, pred[j])) h++, hm += j < m;
            L->compared++, P->compared++;
            L->hits_half += (uint64_t)hm, P->hits_half += (uint64_t)hm;
            L->hits_full += (uint64_t)h, P->hits_full += (uint64_t)h;
        }
    }
    df_trace_close(t);
    df_trace_routes_free(&R);
    if (!rc && !D) rc = df_err_set(err, DF_ERR_ARG, -1, "%s holds no look-ahead records (write it with --trace-lookahead)", path);
    if (!rc) {
        out->top_k = k;
        out->rows = xcalloc((size_t)D * (NL + 1), sizeof *out->rows);
        for (int d = 0; d < D; d++)
            for (int l = -1; l < NL; l++) {
                df_trace_prefetch_row x = acc[(size_t)d * (NL + 1) + (size_t)(l + 1)];
                if (l >= 0 && !x.compared) continue;
                x.dist = d + 1, x.layer = l;
                out->rows[out->n_rows++] = x;
            }
    }
    free(acc);
    return rc ? -1 : 0;
}

void df_trace_prefetch_free(df_trace_prefetch *p)
{
    free(p->rows);
    memset(p, 0, sizeof *p);
}
