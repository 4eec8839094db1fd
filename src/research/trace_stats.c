/* trace_stats.c - what a route trace says about the router (`deltafin trace
 * stats` and `trace reuse`), per MoE layer and pooled.
 *
 * A layer's rows are its routes in file order (a rolled-back draft's rows
 * included, as the engine evaluated them).  Per layer:
 *   popularity: each expert's count over the rows; the entropy of that
 *     distribution in bits (p_e = count_e / (rows * k)) and over log2(E);
 *     the largest count over the mean; the experts never routed; the five
 *     most used (ties: the lower id);
 *   co-activation: the five pairs of experts routed together most often
 *     (up to 4,096 experts a layer: K3 has 896);
 *   neighbours: pairs of consecutive rows whose positions are consecutive,
 *     those whose expert sets differ, and the mean share |A n B| / k;
 *   reuse at distance d (1 .. n_reuse): the share of a row's experts also
 *     in the row d earlier (same layer, file order).
 * Pooled: counts summed; entropy, its normalised form and max/mean
 * weighted by rows; overlap and reuse from the summed counts.
 * tools/router/dftrace.py computes the same from its own reader (a test
 * compares the two).
 */
#include "research.h"
#include "trace.h"
#include "util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    int32_t *ids;   /* [rows][k] */
    int32_t *pos;   /* [rows] */
    size_t rows, cap;
} layer_rows;

static int cmp_i32(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* |A n B| for two rows of k distinct ids, each sorted */
static int overlap(const int32_t *a, const int32_t *b, int k)
{
    int i = 0, j = 0, n = 0;
    while (i < k && j < k) {
        if (a[i] == b[j]) n++, i++, j++;
        else if (a[i] < b[j]) i++;
        else j++;
    }
    return n;
}

static void layer_compute(const layer_rows *lr, int E, int k, int n_reuse, uint32_t *pairs, uint64_t *cnt,
                          df_trace_layer_stats *st, uint64_t *hits, uint64_t *tot, uint64_t *ovl)
{
    memset(cnt, 0, (size_t)E * sizeof *cnt);
    if (pairs) memset(pairs, 0, (size_t)E * E * sizeof *pairs);
    for (size_t r = 0; r < lr->rows; r++) {
        const int32_t *a = lr->ids + r * k;
        for (int i = 0; i < k; i++) {
            cnt[a[i]]++;
            for (int j = i + 1; pairs && j < k; j++) pairs[(size_t)a[i] * E + a[j]]++; /* sorted: a[i] < a[j] */
        }
        if (r && lr->pos[r] == lr->pos[r - 1] + 1) {
            int o = overlap(a, a - k, k);
            st->neighbours++;
            st->changed += o != k;
            *ovl += (uint64_t)o;
        }
        for (int d = 1; d <= n_reuse && (size_t)d <= r; d++) {
            hits[d - 1] += (uint64_t)overlap(a, a - (size_t)d * k, k);
            tot[d - 1] += (uint64_t)k;
        }
    }
    st->rows = lr->rows;
    st->uses = lr->rows * (uint64_t)k;
    uint64_t mx = 0;
    double h = 0.0;
    for (int e = 0; e < E; e++) {
        if (!cnt[e]) st->unused++;
        if (cnt[e] > mx) mx = cnt[e];
        if (cnt[e]) {
            double p = (double)cnt[e] / (double)st->uses;
            h -= p * log2(p);
        }
    }
    st->entropy_bits = st->uses ? h : 0.0;
    st->entropy_norm = E > 1 && st->uses ? h / log2((double)E) : 0.0;
    st->max_over_mean = st->uses ? (double)mx / ((double)st->uses / E) : 0.0;
    for (int t = 0; t < DF_TRACE_TOP; t++) st->top[t] = st->pair[t][0] = st->pair[t][1] = -1;
    for (int e = 0; e < E; e++) /* insertion into the top list: count desc, id asc */
        for (int t = 0; t < DF_TRACE_TOP; t++)
            if (cnt[e] && (st->top[t] < 0 || cnt[e] > st->top_count[t])) {
                memmove(st->top + t + 1, st->top + t, (size_t)(DF_TRACE_TOP - 1 - t) * sizeof st->top[0]);
                memmove(st->top_count + t + 1, st->top_count + t, (size_t)(DF_TRACE_TOP - 1 - t) * sizeof st->top_count[0]);
                st->top[t] = e, st->top_count[t] = cnt[e];
                break;
            }
    for (int i = 0; pairs && i < E; i++)
        for (int j = i + 1; j < E; j++) {
            uint32_t c = pairs[(size_t)i * E + j];
            for (int t = 0; c && t < DF_TRACE_TOP; t++)
                if (st->pair[t][0] < 0 || c > st->pair_count[t]) {
                    memmove(st->pair + t + 1, st->pair + t, (size_t)(DF_TRACE_TOP - 1 - t) * sizeof st->pair[0]);
                    memmove(st->pair_count + t + 1, st->pair_count + t,
                            (size_t)(DF_TRACE_TOP - 1 - t) * sizeof st->pair_count[0]);
                    st->pair[t][0] = i, st->pair[t][1] = j, st->pair_count[t] = c;
                    break;
                }
        }
}

int df_trace_stats_compute(const char *path, int n_reuse, df_trace_stats *out, df_error *err)
{
    memset(out, 0, sizeof *out);
    if (n_reuse < 1 || n_reuse > DF_TRACE_REUSE_MAX)
        return df_err_set(err, DF_ERR_ARG, -1, "reuse distances: 1 to %d", DF_TRACE_REUSE_MAX);
    df_trace *t;
    if (df_trace_open(path, &t, err)) return -1;
    const df_trace_info *in = df_trace_header(t);
    int NL = in->layers, E = in->experts, k = 0;
    layer_rows *lr = xcalloc((size_t)NL, sizeof *lr);
    df_trace_rec r;
    int rc;
    while ((rc = df_trace_next(t, &r, err)) == 1) {
        if (r.tag != TRACE_ROUTE) continue;
        if (!k) k = r.k;
        if (r.k != k) {
            rc = df_err_set(err, DF_ERR_FORMAT, -1, "%s: routes of %d and of %d experts in one trace", path, k, r.k);
            break;
        }
        layer_rows *L = &lr[r.layer];
        for (int p = 0; p < r.n; p++) {
            if (L->rows == L->cap) {
                L->cap = L->cap ? 2 * L->cap : 256;
                L->ids = xrealloc(L->ids, L->cap * (size_t)k * sizeof *L->ids);
                L->pos = xrealloc(L->pos, L->cap * sizeof *L->pos);
            }
            int32_t *row = L->ids + L->rows * k;
            memcpy(row, r.ids + (size_t)p * k, (size_t)k * sizeof *row);
            qsort(row, (size_t)k, sizeof *row, cmp_i32);
            for (int j = 1; j < k && rc == 1; j++)
                if (row[j] == row[j - 1])
                    rc = df_err_set(err, DF_ERR_FORMAT, -1, "%s: position %d layer %d routes expert %d twice", path,
                                    r.pos0 + p, r.layer, row[j]);
            L->pos[L->rows++] = r.pos0 + p;
        }
        if (rc != 1) break;
    }
    df_trace_close(t);
    if (!rc && !k) rc = df_err_set(err, DF_ERR_FORMAT, -1, "%s: the trace holds no routes", path);
    if (!rc) {
        out->experts = E;
        out->top_k = k;
        out->n_reuse = n_reuse;
        out->layers = xcalloc((size_t)NL, sizeof *out->layers);
        out->counts = xcalloc((size_t)NL * E, sizeof *out->counts);
        /* co-activation counts: E x E, up to 4,096 experts (64 MiB); none past that */
        uint32_t *pairs = E <= 4096 ? xmalloc((size_t)E * E * sizeof *pairs) : NULL;
        uint64_t *cnt = xmalloc((size_t)E * sizeof *cnt);
        uint64_t phits[DF_TRACE_REUSE_MAX] = {0}, ptot[DF_TRACE_REUSE_MAX] = {0}, povl = 0;
        df_trace_layer_stats *P = &out->pooled;
        P->layer = -1;
        for (int il = 0; il < NL; il++) {
            if (!lr[il].rows) continue;
            df_trace_layer_stats *st = &out->layers[out->n_layers++];
            uint64_t hits[DF_TRACE_REUSE_MAX] = {0}, tot[DF_TRACE_REUSE_MAX] = {0}, ovl = 0;
            st->layer = il;
            layer_compute(&lr[il], E, k, n_reuse, pairs, cnt, st, hits, tot, &ovl);
            memcpy(out->counts + (size_t)(out->n_layers - 1) * E, cnt, (size_t)E * sizeof *cnt);
            st->mean_overlap = st->neighbours ? (double)ovl / (double)st->neighbours / k : 0.0;
            for (int d = 0; d < n_reuse; d++) {
                st->reuse[d] = tot[d] ? (double)hits[d] / (double)tot[d] : 0.0;
                phits[d] += hits[d], ptot[d] += tot[d];
            }
            P->rows += st->rows, P->uses += st->uses, P->unused += st->unused;
            P->neighbours += st->neighbours, P->changed += st->changed;
            povl += ovl;
            P->entropy_bits += st->entropy_bits * (double)st->rows;
            P->entropy_norm += st->entropy_norm * (double)st->rows;
            P->max_over_mean += st->max_over_mean * (double)st->rows;
        }
        if (P->rows) {
            P->entropy_bits /= (double)P->rows;
            P->entropy_norm /= (double)P->rows;
            P->max_over_mean /= (double)P->rows;
        }
        P->mean_overlap = P->neighbours ? (double)povl / (double)P->neighbours / k : 0.0;
        for (int d = 0; d < n_reuse; d++) P->reuse[d] = ptot[d] ? (double)phits[d] / (double)ptot[d] : 0.0;
        for (int j = 0; j < DF_TRACE_TOP; j++) P->top[j] = P->pair[j][0] = P->pair[j][1] = -1;
        free(pairs);
        free(cnt);
    }
    for (int il = 0; il < NL; il++) free(lr[il].ids), free(lr[il].pos);
    free(lr);
    if (rc) df_trace_stats_free(out);
    return rc ? -1 : 0;
}

void df_trace_stats_free(df_trace_stats *s)
{
    free(s->layers);
    free(s->counts);
    memset(s, 0, sizeof *s);
}
