/* trace_plot.c - the research wing's pictures (`--svg DIR` of `deltafin
 * trace stats|reuse|cache`), written by svg.c:
 *   popularity.svg  a row per MoE layer, a cell per expert, coloured by its
 *                   share of the layer's routes against the mean (the mean
 *                   is the middle of the scale, twice the mean or more the
 *                   top); each cell's title gives the numbers
 *   reuse.svg       the share of a position's experts routed d rows earlier,
 *                   d = 1..N: a thin line per layer, the pooled line bold
 *   cache.svg       hit rate against cache size (log scale) for LRU, LFU,
 *                   TLFU, static and Belady's optimum
 *   attention-L-H.svg  (`trace attention`) one MLA layer and head of an
 *                   attention dump: a row per query, a cell per kept weight
 * The same figures give the same bytes (fixed formats, no time stamps).
 */
#include "research.h"
#include "svg.h"
#include "trace.h"
#include "util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int svg_fail(const char *path, df_error *err)
{
    return df_err_set(err, DF_ERR_IO, -1, "%s: cannot write the plot", path);
}

/* a frame with y ticks from 0 to ymax (as percentages) */
static void axes(svg *s, double x0, double y0, double w, double h, double ymax, const char *ylabel,
                 const char *xlabel)
{
    svg_line(s, x0, y0 + h, x0 + w, y0 + h, "#333333", 1);
    svg_line(s, x0, y0, x0, y0 + h, "#333333", 1);
    char t[64];
    for (int i = 0; i <= 4; i++) {
        double y = y0 + h - h * i / 4.0;
        svg_line(s, x0 - 4, y, x0 + w, y, i ? "#dddddd" : "#333333", i ? 0.5 : 1);
        snprintf(t, sizeof t, "%.3g%%", 100.0 * ymax * i / 4.0);
        svg_text(s, x0 - 6, y + 4, 11, "end", t);
    }
    svg_text(s, x0 + w / 2, y0 + h + 34, 12, "middle", xlabel);
    svg_text(s, x0 - 46, y0 - 10, 12, "start", ylabel);
}

int df_plot_popularity(const char *path, const df_trace_stats *S, df_error *err)
{
    int E = S->experts, nl = S->n_layers;
    double cw = 1200.0 / E, ch = 600.0 / (nl ? nl : 1);
    if (cw > 14) cw = 14;
    if (cw < 1) cw = 1;
    if (ch > 22) ch = 22;
    if (ch < 4) ch = 4;
    double x0 = 70, y0 = 50, W = x0 + cw * E + 90, H = y0 + ch * nl + 50;
    if (W < 720) W = 720;
    svg s;
    if (svg_open(&s, path, (int)ceil(W), (int)ceil(H), "expert popularity per layer")) return svg_fail(path, err);
    svg_text(&s, x0, 24, 14, "start", "expert popularity: routes per expert against the layer's mean");
    char col[8], tip[160], t[32];
    for (int j = 0; j < nl; j++) {
        const df_trace_layer_stats *st = &S->layers[j];
        double mean = (double)st->uses / E;
        for (int e = 0; e < E; e++) {
            uint64_t c = S->counts[(size_t)j * E + e];
            double r = mean > 0 ? (double)c / mean : 0;
            svg_scale_colour(r / 2, col);
            snprintf(tip, sizeof tip, "layer %d, expert %d: %llu routes, %.2f of the mean", st->layer, e,
                     (unsigned long long)c, r);
            svg_rect(&s, x0 + cw * e, y0 + ch * j, cw, ch, col, "cell", tip);
        }
        if (ch >= 9 || j % (int)ceil(9 / ch) == 0) {
            snprintf(t, sizeof t, "layer %d", st->layer);
            svg_text(&s, x0 - 6, y0 + ch * j + ch / 2 + 4, ch < 11 ? ch : 11, "end", t);
        }
    }
    int step = E <= 16 ? 1 : E <= 64 ? 8 : E <= 256 ? 32 : 128;
    for (int e = 0; e < E; e += step) {
        snprintf(t, sizeof t, "%d", e);
        svg_text(&s, x0 + cw * e + cw / 2, y0 + ch * nl + 14, 10, "middle", t);
    }
    svg_text(&s, x0 + cw * E / 2, y0 + ch * nl + 34, 12, "middle", "expert");
    /* the scale */
    for (int i = 0; i <= 20; i++) {
        svg_scale_colour(i / 20.0, col);
        svg_rect(&s, W - 80, y0 + ch * nl - (ch * nl) * (i + 1) / 21.0, 12, (ch * nl) / 21.0, col, NULL, NULL);
    }
    svg_text(&s, W - 64, y0 + ch * nl, 10, "start", "0");
    svg_text(&s, W - 64, y0 + ch * nl / 2 + 4, 10, "start", "mean");
    svg_text(&s, W - 64, y0 + 8, 10, "start", "2x mean");
    return svg_close(&s) ? svg_fail(path, err) : 0;
}

int df_plot_reuse(const char *path, const df_trace_stats *S, df_error *err)
{
    int n = S->n_reuse;
    double ymax = 0;
    for (int j = 0; j <= S->n_layers; j++) {
        const df_trace_layer_stats *st = j < S->n_layers ? &S->layers[j] : &S->pooled;
        for (int d = 0; d < n; d++)
            if (st->reuse[d] > ymax) ymax = st->reuse[d];
    }
    ymax = ymax > 0 ? ceil(ymax * 10) / 10 : 1;
    double x0 = 80, y0 = 50, w = 640, h = 360;
    svg s;
    if (svg_open(&s, path, 760, 470, "expert reuse by distance")) return svg_fail(path, err);
    svg_text(&s, x0, 24, 14, "start", "reuse: the share of a position's experts routed d rows earlier (same layer)");
    axes(&s, x0, y0, w, h, ymax, "share", "distance d (rows of the same layer)");
    double xs[DF_TRACE_REUSE_MAX], ys[DF_TRACE_REUSE_MAX];
    char t[32];
    for (int d = 0; d < n; d++) {
        xs[d] = x0 + (n > 1 ? w * d / (n - 1) : w / 2);
        if (n <= 16 || d % 4 == 3 || d == 0) {
            snprintf(t, sizeof t, "%d", d + 1);
            svg_text(&s, xs[d], y0 + h + 16, 10, "middle", t);
        }
    }
    for (int j = 0; j <= S->n_layers; j++) {
        const df_trace_layer_stats *st = j < S->n_layers ? &S->layers[j] : &S->pooled;
        for (int d = 0; d < n; d++) ys[d] = y0 + h - h * st->reuse[d] / ymax;
        if (j < S->n_layers) svg_polyline(&s, xs, ys, n, "#9bb7d4", 1, "layer");
        else svg_polyline(&s, xs, ys, n, "#1f3a93", 3, "pooled");
    }
    svg_text(&s, x0 + w, y0 - 10, 11, "end", "thin: one layer each; bold: all layers");
    return svg_close(&s) ? svg_fail(path, err) : 0;
}

/* The policies a row has, in the order cli_trace.c prints them */
static int cache_lines(const df_cachesim_row *r, const char **names, uint64_t *hits)
{
    int n = 0;
#define LINE(nm, h, on) \
    do {                \
        if (on) names[n] = nm, hits[n++] = h; \
    } while (0)
    LINE("LRU", r->hits_lru, 1);
    LINE("LFU-steps", r->hits_lfu_steps, 1);
    LINE("LFU", r->hits_lfu, 1);
    LINE("TLFU", r->hits_tlfu, 1);
    LINE("LFU+look-ahead", r->hits_lookahead, r->has_lookahead);
    LINE("prior-LFU", r->hits_prior, r->has_prior);
    LINE("prior-static", r->hits_prior_static, r->has_prior);
    LINE("prior-layers", r->hits_prior_layers, r->has_prior);
    LINE("static", r->hits_static, 1);
    LINE("Belady-demand", r->hits_belady_demand, 1);
    LINE("Belady", r->hits_belady, 1);
#undef LINE
    return n;
}

int df_plot_cache(const char *path, const df_cachesim_row *rows, int n, df_error *err)
{
    static const char *cols[11] = {"#d95f02", "#a6cee3", "#1b9e77", "#7570b3", "#e7298a", "#66a61e",
                                   "#e6ab02", "#a6761d", "#999999", "#555555", "#000000"};
    double x0 = 80, y0 = 50, w = 640, h = 360, lo = log2(rows[0].slots), hi = log2(rows[n - 1].slots);
    svg s;
    if (svg_open(&s, path, 760, 470, "hit rate against cache size")) return svg_fail(path, err);
    svg_text(&s, x0, 24, 14, "start", "expert cache hit rate against its size, by policy, with Belady's optimum");
    axes(&s, x0, y0, w, h, 1.0, "hit rate", "cache size (experts, log scale)");
    double xs[64], ys[64];
    char t[32];
    for (int i = 0; i < n; i++) {
        xs[i] = x0 + (hi > lo ? w * (log2(rows[i].slots) - lo) / (hi - lo) : w / 2);
        snprintf(t, sizeof t, "%d", rows[i].slots);
        svg_text(&s, xs[i], y0 + h + 16, 10, "middle", t);
    }
    const char *names[11];
    uint64_t hits[11];
    int np = cache_lines(&rows[0], names, hits);
    for (int p = 0; p < np; p++) {
        for (int i = 0; i < n; i++) {
            const df_cachesim_row *r = &rows[i];
            cache_lines(r, names, hits);
            ys[i] = y0 + h - h * (r->accesses ? (double)hits[p] / (double)r->accesses : 0);
        }
        int belady = !strcmp(names[p], "Belady");
        svg_polyline(&s, xs, ys, n, cols[p], belady ? 2.5 : 1.5, names[p]);
        svg_rect(&s, x0 + w - 120, y0 + 10 + 16 * p, 12, 3, cols[p], NULL, NULL);
        svg_text(&s, x0 + w - 102, y0 + 15 + 16 * p, 11, "start", names[p]);
    }
    return svg_close(&s) ? svg_fail(path, err) : 0;
}

typedef struct {
    int q, k;
    float w;
} attn_cell;

int df_plot_attention(const char *dump, int layer, int head, const char *path, int *cells, df_error *err)
{
    *cells = 0;
    df_trace *t;
    if (df_trace_open(dump, &t, err)) return -1;
    attn_cell *c = NULL;
    size_t n = 0, cap = 0;
    int maxq = -1, rc, found = 0;
    float wmax = 0;
    df_trace_rec r;
    while ((rc = df_trace_next(t, &r, err)) == 1) {
        if (r.tag != TRACE_ATTN || r.layer != layer || head < r.head0 || head >= r.head0 + r.n_heads) continue;
        found = 1;
        for (int q = 0; q < r.n; q++) {
            size_t at = ((size_t)q * r.n_heads + (size_t)(head - r.head0)) * r.k;
            for (int j = 0; j < r.k; j++) {
                if (r.ids[at + j] < 0) continue;
                if (n == cap) c = xrealloc(c, (cap = cap ? 2 * cap : 1024) * sizeof *c);
                c[n++] = (attn_cell){r.pos0 + q, r.ids[at + j], r.weight[at + j]};
                if (r.weight[at + j] > wmax) wmax = r.weight[at + j];
            }
            if (r.pos0 + q > maxq) maxq = r.pos0 + q;
        }
    }
    df_trace_close(t);
    if (!rc && !found)
        rc = df_err_set(err, DF_ERR_ARG, -1, "%s holds no attention of layer %d, head %d", dump, layer, head);
    if (rc) {
        free(c);
        return -1;
    }
    int N = maxq + 1;
    double cs = 600.0 / N;
    if (cs > 16) cs = 16;
    double x0 = 70, y0 = 50, side = cs * N, W = x0 + side + 90, H = y0 + side + 50;
    if (W < 480) W = 480;
    char title[96], col[8], tip[96];
    snprintf(title, sizeof title, "attention of layer %d, head %d", layer, head);
    svg s;
    if (svg_open(&s, path, (int)ceil(W), (int)ceil(H), title)) {
        free(c);
        return svg_fail(path, err);
    }
    svg_text(&s, x0, 24, 14, "start", title);
    svg_rect(&s, x0, y0, side, side, "#f4f4f4", NULL, NULL);
    for (size_t i = 0; i < n; i++) {
        svg_scale_colour(wmax > 0 ? c[i].w / wmax : 0, col);
        snprintf(tip, sizeof tip, "query %d, key %d: %.6g", c[i].q, c[i].k, (double)c[i].w);
        svg_rect(&s, x0 + cs * c[i].k, y0 + cs * c[i].q, cs, cs, col, "cell", tip);
    }
    svg_text(&s, x0 + side / 2, y0 + side + 30, 12, "middle", "key position");
    svg_text(&s, x0 - 8, y0 + 12, 11, "end", "query");
    char t0[32];
    snprintf(t0, sizeof t0, "%d", maxq);
    svg_text(&s, x0 - 8, y0 + side, 10, "end", t0);
    svg_text(&s, x0 + side, y0 + side + 14, 10, "middle", t0);
    svg_text(&s, x0, y0 + side + 14, 10, "middle", "0");
    free(c);
    *cells = (int)n;
    return svg_close(&s) ? svg_fail(path, err) : 0;
}
