/* cli_trace.c - `deltafin trace VERB FILE`: route traces (either format,
 * research/trace.h) read back.
 *
 *   dump   the header, then every record as a JSON line: an evaluation as
 *          {"eval":{"pos0":P,"ids":[...]}}, a route as the older format's line
 *          plus the scores: {"pos","layer","experts","scores","weights"}, an
 *          attention dump's query and head as {"attn":{"pos","layer","head",
 *          "top":[[position, weight], ...]}}, floats with nine significant
 *          digits (each reads back to the same f32 bits)
 *   stats  per MoE layer and pooled: expert popularity (entropy, max/mean,
 *          unused, the most used), co-activated pairs, how often consecutive
 *          positions change experts, reuse at distances 1..4
 *   reuse  the share of a position's experts also routed d rows earlier,
 *          d = 1..N (--max-distance, default 16), per layer and pooled
 *   diff   A B: where two traces route differently, per layer and pooled
 *          (the last route of each position and layer compared: experts,
 *          their order, the weights' bits; research/trace_diff.c)
 *   cache  hit rates against cache size (--slots, in experts) for LRU, LFU
 *          (the engine's default), TLFU, the trace's most used experts
 *          kept (static) and Belady's optimum: pooled, then each MoE layer
 *          alone with its share of each cache (research/cachesim.c)
 *   attention  an attention dump's map of one MLA layer and head (--svg)
 *   prefetch   the router look-ahead (a trace written with --trace-lookahead)
 *          against the routes: recall and precision per distance and layer
 * (research/trace_stats.c defines the figures of stats and reuse; --json for
 * each; --svg DIR writes their plots, research/trace_plot.c).
 */
#include "cli.h"
#include "json_write.h"
#include "trace.h"

#include "research.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static void put_floats(const char *key, const float *v, int k)
{
    printf(",\"%s\":[", key);
    for (int j = 0; j < k; j++) printf("%s%.9g", j ? "," : "", (double)v[j]);
    printf("]");
}

static int trace_dump(df_trace *t, df_error *err)
{
    const df_trace_info *in = df_trace_header(t);
    json_buf b;
    json_buf_init(&b);
    json_write_string(&b, in->model, strlen(in->model));
    printf("{\"trace\":\"deltafin routes\",\"format\":\"%s\",\"model\":%s,\"layers\":%d,\"experts\":%d,\"top_k\":%d",
           in->binary ? "binary" : "jsonl", b.p ? b.p : "\"\"", in->layers, in->experts, in->top_k);
    json_buf_free(&b);
    if (in->binary) {
        printf(",\"hidden\":%d,\"vocab\":%d,\"shared_experts\":%d,\"moe_layers\":[", in->hidden, in->vocab,
               in->shared_experts);
        for (int il = 0, n = 0; il < in->layers; il++)
            if (in->moe[il]) printf("%s%d", n++ ? "," : "", il);
        printf("]");
    }
    printf("}\n");
    df_trace_rec r;
    int rc;
    while ((rc = df_trace_next(t, &r, err)) == 1) {
        if (r.tag == TRACE_EVAL) {
            printf("{\"eval\":{\"pos0\":%d,\"ids\":[", r.pos0);
            for (int i = 0; i < r.n; i++) printf("%s%d", i ? "," : "", r.ids[i]);
            printf("]}}\n");
            continue;
        }
        if (r.tag == TRACE_KDA) {
            for (int q = 0; q < r.n; q++)
                for (int h = 0; h < r.n_heads; h++) {
                    const float *x = r.weight + ((size_t)q * r.n_heads + (size_t)h) * 4;
                    printf("{\"kda\":{\"pos\":%d,\"layer\":%d,\"head\":%d,\"beta\":%.9g,\"decay_mean\":%.9g,"
                           "\"decay_min\":%.9g,\"gate_mean\":%.9g}}\n",
                           r.pos0 + q, r.layer, h, (double)x[0], (double)x[1], (double)x[2], (double)x[3]);
                }
            continue;
        }
        if (r.tag == TRACE_ATTN) {
            for (int q = 0; q < r.n; q++)
                for (int h = 0; h < r.n_heads; h++) {
                    size_t at = ((size_t)q * r.n_heads + (size_t)h) * r.k;
                    printf("{\"attn\":{\"pos\":%d,\"layer\":%d,\"head\":%d,\"top\":[", r.pos0 + q, r.layer,
                           r.head0 + h);
                    for (int j = 0, m = 0; j < r.k; j++)
                        if (r.ids[at + j] >= 0) printf("%s[%d,%.9g]", m++ ? "," : "", r.ids[at + j], (double)r.weight[at + j]);
                    printf("]}}\n");
                }
            continue;
        }
        for (int p = 0; p < r.n; p++) {
            const int32_t *ids = r.ids + (size_t)p * r.k;
            printf("{\"pos\":%d,\"layer\":%d,\"experts\":[", r.pos0 + p, r.layer);
            for (int j = 0; j < r.k; j++) printf("%s%d", j ? "," : "", ids[j]);
            printf("]");
            if (r.score) put_floats("scores", r.score + (size_t)p * r.k, r.k);
            if (r.weight) put_floats("weights", r.weight + (size_t)p * r.k, r.k);
            printf("}\n");
        }
    }
    return rc;
}

static void json_layer(const df_trace_layer_stats *st, int n_reuse, int full)
{
    if (st->layer >= 0) printf("{\"layer\":%d,", st->layer);
    else printf("{");
    printf("\"rows\":%llu,\"uses\":%llu", (unsigned long long)st->rows, (unsigned long long)st->uses);
    if (full) {
        printf(",\"unused\":%d,\"entropy_bits\":%.17g,\"entropy_norm\":%.17g,\"max_over_mean\":%.17g", st->unused,
               st->entropy_bits, st->entropy_norm, st->max_over_mean);
        if (st->layer >= 0) {
            printf(",\"top\":[");
            for (int t = 0, n = 0; t < DF_TRACE_TOP; t++)
                if (st->top[t] >= 0) printf("%s[%d,%llu]", n++ ? "," : "", st->top[t], (unsigned long long)st->top_count[t]);
            printf("],\"pairs\":[");
            for (int t = 0, n = 0; t < DF_TRACE_TOP; t++)
                if (st->pair[t][0] >= 0)
                    printf("%s[%d,%d,%llu]", n++ ? "," : "", st->pair[t][0], st->pair[t][1],
                           (unsigned long long)st->pair_count[t]);
            printf("]");
        }
        printf(",\"neighbours\":%llu,\"changed\":%llu,\"mean_overlap\":%.17g", (unsigned long long)st->neighbours,
               (unsigned long long)st->changed, st->mean_overlap);
    }
    printf(",\"reuse\":[");
    for (int d = 0; d < n_reuse; d++) printf("%s%.17g", d ? "," : "", st->reuse[d]);
    printf("]}");
}

static void print_stats_text(const df_trace_stats *S)
{
    printf("%d MoE layers with routes, %d experts, top %d\n", S->n_layers, S->experts, S->top_k);
    printf("%6s %8s %7s %8s %8s %8s %9s %10s  %s\n", "layer", "rows", "unused", "H bits", "H/max", "max/mean",
           "changed", "overlap", "most used (count)");
    for (int i = 0; i <= S->n_layers; i++) {
        const df_trace_layer_stats *st = i < S->n_layers ? &S->layers[i] : &S->pooled;
        char name[16];
        snprintf(name, sizeof name, i < S->n_layers ? "%d" : "all", st->layer);
        printf("%6s %8llu %7d %8.3f %8.3f %8.2f %8.1f%% %10.3f ", name, (unsigned long long)st->rows, st->unused,
               st->entropy_bits, st->entropy_norm, st->max_over_mean,
               st->neighbours ? 100.0 * (double)st->changed / (double)st->neighbours : 0.0, st->mean_overlap);
        for (int t = 0; t < DF_TRACE_TOP && st->top[t] >= 0; t++)
            printf(" %d (%llu)", st->top[t], (unsigned long long)st->top_count[t]);
        printf("\n");
    }
    printf("pairs routed together most often, per layer:\n");
    for (int i = 0; i < S->n_layers; i++) {
        const df_trace_layer_stats *st = &S->layers[i];
        printf("%6d ", st->layer);
        for (int t = 0; t < DF_TRACE_TOP && st->pair[t][0] >= 0; t++)
            printf(" %d+%d (%llu)", st->pair[t][0], st->pair[t][1], (unsigned long long)st->pair_count[t]);
        printf("\n");
    }
    printf("changed: consecutive positions whose experts differ; overlap: mean share of experts they keep\n");
}

static void print_reuse_text(const df_trace_stats *S)
{
    printf("share of a position's experts routed d rows earlier at the same layer\n%6s", "layer");
    for (int d = 1; d <= S->n_reuse; d++) printf(" %6d", d);
    printf("\n");
    for (int i = 0; i <= S->n_layers; i++) {
        const df_trace_layer_stats *st = i < S->n_layers ? &S->layers[i] : &S->pooled;
        if (i < S->n_layers) printf("%6d", st->layer);
        else printf("%6s", "all");
        for (int d = 0; d < S->n_reuse; d++) printf(" %6.3f", st->reuse[d]);
        printf("\n");
    }
}

/* --svg DIR: made when missing; the plot's path in it */
static void svg_path(const char *dir, const char *name, char *out, size_t n)
{
    struct stat st;
    if (stat(dir, &st) != 0 && mkdir(dir, 0755) != 0) die("--svg %s: cannot make the directory: %s", dir, strerror(errno));
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) die("--svg %s: not a directory", dir);
    if ((size_t)snprintf(out, n, "%s/%s", dir, name) >= n) die("--svg %s: the path is too long", dir);
}

static int write_plot(int rc, const df_error *err)
{
    if (rc) fprintf(stderr, "deltafin: %s\n", err->msg);
    return rc ? 1 : 0;
}

static int trace_stats(const char *verb, const char *path, int argc, char **argv)
{
    int json = 0, reuse = !strcmp(verb, "reuse"), n = reuse ? 16 : 4;
    const char *svgdir = NULL;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--json")) json = 1;
        else if (!strcmp(argv[i], "--svg") && i + 1 < argc) svgdir = argv[++i];
        else if (reuse && !strcmp(argv[i], "--max-distance") && i + 1 < argc)
            n = (int)parse_long(argv[++i], "--max-distance", 1, DF_TRACE_REUSE_MAX);
        else die("trace %s: unknown option \"%s\"", verb, argv[i]);
    }
    df_trace_stats S;
    df_error err = {0};
    if (df_trace_stats_compute(path, n, &S, &err)) {
        fprintf(stderr, "deltafin: %s\n", err.msg);
        return 1;
    }
    if (json) {
        printf("{\"experts\":%d,\"top_k\":%d,\"layers\":[", S.experts, S.top_k);
        for (int i = 0; i < S.n_layers; i++) {
            if (i) printf(",");
            json_layer(&S.layers[i], n, !reuse);
        }
        printf("],\"pooled\":");
        json_layer(&S.pooled, n, !reuse);
        printf("}\n");
    } else if (reuse) {
        print_reuse_text(&S);
    } else {
        print_stats_text(&S);
    }
    int rc = 0;
    if (svgdir) {
        char f[4096];
        if (!reuse) {
            svg_path(svgdir, "popularity.svg", f, sizeof f);
            rc |= write_plot(df_plot_popularity(f, &S, &err), &err);
        }
        svg_path(svgdir, "reuse.svg", f, sizeof f);
        rc |= write_plot(df_plot_reuse(f, &S, &err), &err);
    }
    df_trace_stats_free(&S);
    return fflush(stdout) || rc ? 1 : 0;
}

static void diff_row(const df_trace_diff_layer *d, int json)
{
    if (json) {
        if (d->layer >= 0) printf("{\"layer\":%d,", d->layer);
        else printf("{");
        printf("\"compared\":%llu,\"set_differs\":%llu,\"order_differs\":%llu,\"weight_differs\":%llu,"
               "\"mean_overlap\":%.17g,\"max_weight_diff\":%.17g,\"first_pos\":%d}",
               (unsigned long long)d->compared, (unsigned long long)d->set_differs,
               (unsigned long long)d->order_differs, (unsigned long long)d->weight_differs, d->mean_overlap,
               d->max_weight_diff, d->first_pos);
        return;
    }
    char name[16], first[16];
    snprintf(name, sizeof name, d->layer >= 0 ? "%d" : "all", d->layer);
    snprintf(first, sizeof first, d->first_pos >= 0 ? "%d" : "-", d->first_pos);
    printf("%6s %9llu %8.2f%% %8.2f%% %8.2f%% %9.4f %11.3g %9s\n", name, (unsigned long long)d->compared,
           100.0 * (double)d->set_differs / (double)d->compared, 100.0 * (double)d->order_differs / (double)d->compared,
           100.0 * (double)d->weight_differs / (double)d->compared, d->mean_overlap, d->max_weight_diff, first);
}

static int trace_diff(const char *a, const char *b, int argc, char **argv)
{
    int json = 0;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--json")) json = 1;
        else die("trace diff: unknown option \"%s\"", argv[i]);
    }
    df_trace_diff D;
    df_error err = {0};
    if (df_trace_diff_compute(a, b, &D, &err)) {
        fprintf(stderr, "deltafin: %s\n", err.msg);
        return 1;
    }
    if (json) {
        printf("{\"top_k\":%d,\"only_a\":%llu,\"only_b\":%llu,\"layers\":[", D.top_k, (unsigned long long)D.only_a,
               (unsigned long long)D.only_b);
        for (int i = 0; i < D.n_layers; i++) {
            if (i) printf(",");
            diff_row(&D.layers[i], 1);
        }
        printf("],\"pooled\":");
        diff_row(&D.pooled, 1);
        printf("}\n");
    } else {
        printf("%s against %s: %llu routes compared, %llu only in the first, %llu only in the second\n", a, b,
               (unsigned long long)D.pooled.compared, (unsigned long long)D.only_a, (unsigned long long)D.only_b);
        printf("%6s %9s %9s %9s %9s %9s %11s %9s\n", "layer", "compared", "experts", "order", "weights", "overlap",
               "max |dw|", "first pos");
        for (int i = 0; i < D.n_layers; i++) diff_row(&D.layers[i], 0);
        diff_row(&D.pooled, 0);
        printf("experts: routes whose experts differ; order: the same experts in another order; weights: the same\n"
               "experts and order, some weight's bits differ; overlap: mean share of experts in common; first pos:\n"
               "the first position whose experts differ\n");
    }
    df_trace_diff_free(&D);
    return fflush(stdout) ? 1 : 0;
}

static double pct(uint64_t h, uint64_t n) { return n ? 100.0 * (double)h / (double)n : 0.0; }

/* The policies of a row: name, hits, whether the row has them */
typedef struct {
    const char *name;
    uint64_t hits;
    int on;
} cache_col;

static int cache_cols(const df_cachesim_row *r, cache_col *c)
{
    int n = 0;
    c[n++] = (cache_col){"lru", r->hits_lru, 1};
    c[n++] = (cache_col){"lfu_steps", r->hits_lfu_steps, 1};
    c[n++] = (cache_col){"lfu", r->hits_lfu, 1};
    c[n++] = (cache_col){"tlfu", r->hits_tlfu, 1};
    c[n++] = (cache_col){"lfu_lookahead", r->hits_lookahead, r->has_lookahead};
    c[n++] = (cache_col){"prior_lfu", r->hits_prior, r->has_prior};
    c[n++] = (cache_col){"prior_static", r->hits_prior_static, r->has_prior};
    c[n++] = (cache_col){"prior_layers", r->hits_prior_layers, r->has_prior};
    c[n++] = (cache_col){"static", r->hits_static, 1};
    c[n++] = (cache_col){"belady_demand", r->hits_belady_demand, 1};
    c[n++] = (cache_col){"belady", r->hits_belady, 1};
    return n;
}

static void cache_json(const df_cachesim_row *r)
{
    cache_col c[16];
    int n = cache_cols(r, c);
    printf("{\"slots\":%d,\"steps\":%llu,\"accesses\":%llu", r->slots, (unsigned long long)r->steps,
           (unsigned long long)r->accesses);
    for (int i = 0; i < n; i++)
        if (c[i].on) printf(",\"hits_%s\":%llu", c[i].name, (unsigned long long)c[i].hits);
    printf("}");
}

static void cache_text(const char *path, const df_cachesim_row *rows, const df_cachesim_row *pl, int n,
                       const int *ids, int nl)
{
    cache_col c[16];
    int nc = cache_cols(&rows[0], c);
    printf("%s: %llu steps (an evaluated chunk x MoE layer), %llu expert uses; hit %% by policy\n", path,
           (unsigned long long)rows[0].steps, (unsigned long long)rows[0].accesses);
    printf("%6s %7s", "layer", "slots");
    for (int i = 0; i < nc; i++)
        if (c[i].on) printf(" %*s", (int)(strlen(c[i].name) > 7 ? strlen(c[i].name) : 7), c[i].name);
    printf("\n");
    for (int j = -1; j < nl; j++)
        for (int i = 0; i < n; i++) {
            const df_cachesim_row *r = j < 0 ? &rows[i] : &pl[(size_t)j * n + i];
            cache_col v[16];
            cache_cols(r, v);
            char name[16];
            snprintf(name, sizeof name, j < 0 ? "all" : "%d", j < 0 ? 0 : ids[j]);
            printf("%6s %7d", name, r->slots);
            for (int q = 0; q < nc; q++)
                if (c[q].on) {
                    int w = (int)(strlen(c[q].name) > 7 ? strlen(c[q].name) : 7);
                    if (v[q].on) printf(" %*.2f", w, pct(v[q].hits, r->accesses));
                    else printf(" %*s", w, "-");
                }
            printf("\n");
        }
    printf("fraction of Belady's hits (all layers, one cache):\n%7s", "slots");
    for (int i = 0; i < nc - 1; i++)
        if (c[i].on) printf(" %*s", (int)(strlen(c[i].name) > 7 ? strlen(c[i].name) : 7), c[i].name);
    printf("\n");
    for (int i = 0; i < n; i++) {
        cache_col v[16];
        cache_cols(&rows[i], v);
        printf("%7d", rows[i].slots);
        for (int q = 0; q < nc - 1; q++)
            if (c[q].on)
                printf(" %*.3f", (int)(strlen(c[q].name) > 7 ? strlen(c[q].name) : 7),
                       rows[i].hits_belady ? (double)v[q].hits / (double)rows[i].hits_belady : 0.0);
        printf("\n");
    }
    printf("all: one cache of `slots` experts for every layer; a layer: that layer alone in slots / %d\n"
           "lfu_rows: counts grow by the positions routed to the expert in the chunk (one in decode);\n"
           "lfu_lookahead: the router look-ahead's predicted experts (first k/2 a position) evicted last;\n"
           "prior_*: from --prior (another run's heat file or trace): LFU seeded with it, its hottest kept\n"
           "fixed, LFU per layer sized by the layer's share of its hottest; static: this trace's most used\n"
           "experts kept (frequencies known in advance); Belady: the optimum (the future known)\n",
           nl);
}

static int trace_cache(const char *path, int argc, char **argv)
{
    int json = 0, slots[64];
    const char *list = NULL, *svgdir = NULL, *prior = NULL;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--json")) json = 1;
        else if (!strcmp(argv[i], "--svg") && i + 1 < argc) svgdir = argv[++i];
        else if (!strcmp(argv[i], "--slots") && i + 1 < argc) list = argv[++i];
        else if (!strcmp(argv[i], "--prior") && i + 1 < argc) prior = argv[++i];
        else die("trace cache: unknown option \"%s\"", argv[i]);
    }
    int n = parse_slots(list, slots);
    df_cachesim_row rows[64], *pl = NULL;
    int *ids = malloc(65536 * sizeof *ids), nl = 0; /* a trace has at most 65,535 layers */
    df_error err = {0};
    if (!ids) die("out of memory");
    if (df_cachesim_layers(path, prior, slots, n, rows, &pl, ids, &nl, &err)) {
        fprintf(stderr, "deltafin: %s\n", err.msg);
        free(ids);
        return 1;
    }
    if (json) {
        printf("{\"pooled\":[");
        for (int i = 0; i < n; i++) printf("%s", i ? "," : ""), cache_json(&rows[i]);
        printf("],\"layers\":[");
        for (int j = 0; j < nl; j++) {
            printf("%s{\"layer\":%d,\"rows\":[", j ? "," : "", ids[j]);
            for (int i = 0; i < n; i++) printf("%s", i ? "," : ""), cache_json(&pl[(size_t)j * n + i]);
            printf("]}");
        }
        printf("]}\n");
    } else {
        cache_text(path, rows, pl, n, ids, nl);
    }
    int rc = 0;
    if (svgdir) {
        char f[4096];
        svg_path(svgdir, "cache.svg", f, sizeof f);
        rc = write_plot(df_plot_cache(f, rows, n, &err), &err);
    }
    free(pl);
    free(ids);
    return fflush(stdout) || rc ? 1 : 0;
}

/* trace prefetch FILE [--json]: the look-ahead's recall and precision */
static int trace_prefetch(const char *path, int argc, char **argv)
{
    int json = 0;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--json")) json = 1;
        else die("trace prefetch: unknown option \"%s\"", argv[i]);
    }
    df_trace_prefetch P;
    df_error err = {0};
    if (df_trace_prefetch_compute(path, &P, &err)) {
        fprintf(stderr, "deltafin: %s\n", err.msg);
        return 1;
    }
    int k = P.top_k, m = k / 2 > 0 ? k / 2 : 1;
    if (json) printf("{\"top_k\":%d,\"m\":%d,\"rows\":[", k, m);
    else
        printf("the router look-ahead: the d-th MoE layer's router on the hidden state, its top %d (what the\n"
               "prefetcher reads) and top %d against the experts each position then routed to\n"
               "%4s %6s %9s %12s %15s %12s\n",
               m, k, "d", "layer", "compared", "recall@m", "precision@m", "recall@k");
    for (int i = 0; i < P.n_rows; i++) {
        const df_trace_prefetch_row *r = &P.rows[i];
        double n = (double)r->compared;
        if (json)
            printf("%s{\"d\":%d,\"layer\":%d,\"compared\":%llu,\"hits_m\":%llu,\"hits_k\":%llu}", i ? "," : "", r->dist,
                   r->layer, (unsigned long long)r->compared, (unsigned long long)r->hits_half,
                   (unsigned long long)r->hits_full);
        else {
            char name[16];
            snprintf(name, sizeof name, r->layer < 0 ? "all" : "%d", r->layer);
            printf("%4d %6s %9llu %12.3f %15.3f %12.3f\n", r->dist, name, (unsigned long long)r->compared,
                   n ? (double)r->hits_half / (n * k) : 0, n ? (double)r->hits_half / (n * m) : 0,
                   n ? (double)r->hits_full / (n * k) : 0);
        }
    }
    if (json) printf("]}\n");
    df_trace_prefetch_free(&P);
    return fflush(stdout) ? 1 : 0;
}

/* trace attention DUMP --layer L --head H --svg DIR */
static int trace_attention(const char *path, int argc, char **argv)
{
    int layer = -1, head = 0;
    const char *svgdir = NULL;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--layer") && i + 1 < argc) layer = (int)parse_long(argv[++i], "--layer", 0, 65535);
        else if (!strcmp(argv[i], "--head") && i + 1 < argc) head = (int)parse_long(argv[++i], "--head", 0, 65535);
        else if (!strcmp(argv[i], "--svg") && i + 1 < argc) svgdir = argv[++i];
        else die("trace attention: unknown option \"%s\"", argv[i]);
    }
    if (layer < 0 || !svgdir) die("trace attention needs --layer L and --svg DIR (and --head H, default 0)");
    char name[64], f[4096];
    snprintf(name, sizeof name, "attention-%d-%d.svg", layer, head);
    svg_path(svgdir, name, f, sizeof f);
    df_error err = {0};
    int cells = 0;
    if (df_plot_attention(path, layer, head, f, &cells, &err)) return write_plot(-1, &err);
    printf("%s: %d weights of layer %d, head %d\n", f, cells, layer, head);
    return fflush(stdout) ? 1 : 0;
}

int cmd_trace(int argc, char **argv)
{
    if (argc >= 4 && (!strcmp(argv[2], "stats") || !strcmp(argv[2], "reuse")))
        return trace_stats(argv[2], argv[3], argc - 4, argv + 4);
    if (argc >= 5 && !strcmp(argv[2], "diff")) return trace_diff(argv[3], argv[4], argc - 5, argv + 5);
    if (argc >= 4 && !strcmp(argv[2], "cache")) return trace_cache(argv[3], argc - 4, argv + 4);
    if (argc >= 4 && !strcmp(argv[2], "attention")) return trace_attention(argv[3], argc - 4, argv + 4);
    if (argc >= 4 && !strcmp(argv[2], "prefetch")) return trace_prefetch(argv[3], argc - 4, argv + 4);
    if (argc != 4 || strcmp(argv[2], "dump"))
        die("usage: deltafin trace dump|stats|reuse|cache|prefetch FILE [--json], deltafin trace diff A B [--json], deltafin "
            "trace attention FILE --layer L [--head H] --svg DIR (traces written by 'deltafin run --trace FILE' or "
            "--dump-attention FILE)");
    df_error err = {0};
    df_trace *t;
    if (df_trace_open(argv[3], &t, &err)) {
        fprintf(stderr, "deltafin: %s\n", err.msg);
        return 1;
    }
    int rc = trace_dump(t, &err);
    df_trace_close(t);
    if (fflush(stdout) || rc) {
        fprintf(stderr, "deltafin: %s\n", rc ? err.msg : "cannot write the dump");
        return 1;
    }
    return 0;
}
