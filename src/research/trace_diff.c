/* trace_diff.c - where two route traces differ (`deltafin trace diff A B`):
 * two prompts, two models of the same shape, a lossy trunk against the
 * exact one, two runs that should agree.
 *
 * Each trace is reduced to its last route for every (position, MoE layer)
 * (a rolled-back draft's rows are replaced by what the position finally
 * got).  Where both traces hold a route: the expert sets compared (and
 * their overlap |A n B| / k), the order compared where the sets agree, and
 * the weights' bits where the experts and order agree.  The traces must
 * share the layer count, the expert count and k.
 */
#include "research.h"
#include "trace.h"
#include "util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { DIFF_MAX_POS = 1 << 22 }; /* positions a diff holds (4M: 16 GB of K3 routes would be more) */

int df_trace_last_routes(const char *path, df_trace_routes *L, df_error *err)
{
    memset(L, 0, sizeof *L);
    df_trace *t;
    if (df_trace_open(path, &t, err)) return -1;
    const df_trace_info *in = df_trace_header(t);
    L->layers = in->layers;
    L->experts = in->experts;
    df_trace_rec r;
    int rc;
    while ((rc = df_trace_next(t, &r, err)) == 1) {
        if (r.tag != TRACE_ROUTE) continue;
        if (!L->k) L->k = r.k;
        if (r.k != L->k) {
            rc = df_err_set(err, DF_ERR_FORMAT, -1, "%s: routes of %d and of %d experts", path, L->k, r.k);
            break;
        }
        size_t per = (size_t)L->layers * L->k;
        if (r.pos0 + r.n > DIFF_MAX_POS) {
            rc = df_err_set(err, DF_ERR_LIMIT, -1, "%s: position %d: trace diff compares the first %d positions only",
                            path, r.pos0 + r.n - 1, DIFF_MAX_POS);
            break;
        }
        if (r.pos0 + r.n > L->max_pos) {
            int np = r.pos0 + r.n + 256;
            L->ids = xrealloc(L->ids, (size_t)np * per * sizeof *L->ids);
            L->w = xrealloc(L->w, (size_t)np * per * sizeof *L->w);
            memset(L->ids + (size_t)L->max_pos * per, 0xff, (size_t)(np - L->max_pos) * per * sizeof *L->ids);
            L->max_pos = np;
        }
        for (int p = 0; p < r.n; p++) {
            size_t at = ((size_t)(r.pos0 + p) * L->layers + (size_t)r.layer) * L->k;
            memcpy(L->ids + at, r.ids + (size_t)p * r.k, (size_t)r.k * sizeof *L->ids);
            if (r.weight) memcpy(L->w + at, r.weight + (size_t)p * r.k, (size_t)r.k * sizeof *L->w);
            else
                for (int j = 0; j < r.k; j++) L->w[at + j] = NAN;
        }
    }
    df_trace_close(t);
    if (!rc && !L->k) rc = df_err_set(err, DF_ERR_FORMAT, -1, "%s: the trace holds no routes", path);
    return rc ? -1 : 0;
}

void df_trace_routes_free(df_trace_routes *L)
{
    free(L->ids);
    free(L->w);
}

static int in_row(const int32_t *row, int k, int32_t e)
{
    for (int j = 0; j < k; j++)
        if (row[j] == e) return 1;
    return 0;
}

static void add_pair(df_trace_diff_layer *d, const int32_t *a, const int32_t *b, const float *wa, const float *wb,
                     int k, int pos, uint64_t *ovl)
{
    int o = 0, same_order = 1;
    for (int j = 0; j < k; j++) {
        o += in_row(b, k, a[j]);
        same_order &= a[j] == b[j];
    }
    d->compared++;
    *ovl += (uint64_t)o;
    if (o != k) {
        d->set_differs++;
        if (d->first_pos < 0 || pos < d->first_pos) d->first_pos = pos;
        return;
    }
    if (!same_order) {
        d->order_differs++;
        return;
    }
    if (memcmp(wa, wb, (size_t)k * sizeof *wa)) d->weight_differs++;
    for (int j = 0; j < k; j++) {
        double x = fabs((double)wa[j] - (double)wb[j]);
        if (x > d->max_weight_diff) d->max_weight_diff = x;
    }
}

int df_trace_diff_compute(const char *a, const char *b, df_trace_diff *out, df_error *err)
{
    memset(out, 0, sizeof *out);
    df_trace_routes A, B;
    if (df_trace_last_routes(a, &A, err)) {
        df_trace_routes_free(&A);
        return -1;
    }
    if (df_trace_last_routes(b, &B, err)) {
        df_trace_routes_free(&A);
        df_trace_routes_free(&B);
        return -1;
    }
    int rc = 0;
    if (A.layers != B.layers || A.experts != B.experts || A.k != B.k)
        rc = df_err_set(err, DF_ERR_ARG, -1,
                        "%s and %s are traces of other shapes (%d/%d layers, %d/%d experts, top %d/%d)", a, b,
                        A.layers, B.layers, A.experts, B.experts, A.k, B.k);
    if (!rc) {
        int NL = A.layers, k = A.k, np = A.max_pos > B.max_pos ? A.max_pos : B.max_pos;
        out->top_k = k;
        out->layers = xcalloc((size_t)NL, sizeof *out->layers);
        uint64_t *ovl = xcalloc((size_t)NL, sizeof *ovl);
        df_trace_diff_layer *P = &out->pooled;
        P->layer = -1, P->first_pos = -1;
        for (int il = 0; il < NL; il++) out->layers[il].layer = il, out->layers[il].first_pos = -1;
        for (int p = 0; p < np; p++)
            for (int il = 0; il < NL; il++) {
                size_t at = ((size_t)p * NL + (size_t)il) * k;
                int ha = p < A.max_pos && A.ids[at] >= 0, hb = p < B.max_pos && B.ids[at] >= 0;
                if (ha && hb) add_pair(&out->layers[il], A.ids + at, B.ids + at, A.w + at, B.w + at, k, p, &ovl[il]);
                else if (ha) out->only_a++;
                else if (hb) out->only_b++;
            }
        uint64_t povl = 0;
        int n = 0;
        for (int il = 0; il < NL; il++) {
            df_trace_diff_layer *d = &out->layers[il];
            if (!d->compared) continue;
            d->mean_overlap = (double)ovl[il] / (double)d->compared / k;
            P->compared += d->compared, P->set_differs += d->set_differs, P->order_differs += d->order_differs;
            P->weight_differs += d->weight_differs;
            povl += ovl[il];
            if (d->max_weight_diff > P->max_weight_diff) P->max_weight_diff = d->max_weight_diff;
            if (d->first_pos >= 0 && (P->first_pos < 0 || d->first_pos < P->first_pos)) P->first_pos = d->first_pos;
            out->layers[n++] = *d;
        }
        out->n_layers = n;
        P->mean_overlap = P->compared ? (double)povl / (double)P->compared / k : 0.0;
        free(ovl);
        if (!P->compared) rc = df_err_set(err, DF_ERR_ARG, -1, "%s and %s hold no position and layer in common", a, b);
    }
    df_trace_routes_free(&A);
    df_trace_routes_free(&B);
    if (rc) df_trace_diff_free(out);
    return rc ? -1 : 0;
}

void df_trace_diff_free(df_trace_diff *d)
{
    free(d->layers);
    memset(d, 0, sizeof *d);
}
