/* research.h - the research wing's analyses (src/research/): offline work
 * on route traces that the engine does not need.  trace.h reads traces. */
#ifndef DF_RESEARCH_H
#define DF_RESEARCH_H

#include <stdint.h>
#include "df_error.h"

/* Offline replay of a route trace (either format, trace.h) through the
 * cache policies and Belady's optimal, at several cache sizes (in experts). */
typedef struct df_cachesim_row {
    int slots;
    uint64_t steps, accesses;     /* (position, layer) steps; distinct experts used per step, summed */
    uint64_t hits_lru, hits_lfu, hits_tlfu, hits_belady; /* LFU, TLFU: counting rows (the engine's) */
    uint64_t hits_static;         /* the best fixed set (the trace's most used experts, known in
                                     advance, each missed once): the ceiling of any policy that
                                     ranks experts by frequency alone */
    uint64_t hits_lfu_steps;      /* LFU counting one use per acquire (chunk), not its rows */
    uint64_t hits_belady_demand;  /* Belady where every expert used is read into the budget
                                     (hits_belady streams one through outside it for free) */
    int has_lookahead;            /* the trace has look-ahead predictions (--trace-lookahead) */
    uint64_t hits_lookahead;      /* LFU sparing the look-ahead's predicted experts */
    int has_prior;                /* a prior was given (another run's heat or trace) */
    uint64_t hits_prior;          /* LFU with its counts seeded from the prior */
    uint64_t hits_prior_static;   /* the prior's hottest experts kept (a fixed set) */
    uint64_t hits_prior_layers;   /* LFU per layer, each sized by its share of the prior's hottest */
} df_cachesim_row;
int df_cachesim(const char *trace_path, const int *slots, int n, df_cachesim_row *rows, df_error *err);
/* The same, and (per_layer != NULL) each MoE layer alone with its share of
 * each cache, slots / (layers with routes) (at least 1): per_layer gets a
 * malloc'd [n_layers][n], layer_ids (room for the trace's layer count) the
 * layers in order.  prior_path (or NULL): a heat file (--heat) or another
 * trace of the same model, the counts the prior columns start from. */
int df_cachesim_layers(const char *trace_path, const char *prior_path, const int *slots, int n, df_cachesim_row *rows,
                       df_cachesim_row **per_layer, int *layer_ids, int *n_layers, df_error *err);

/* What a route trace says about the router, per MoE layer and pooled
 * (trace_stats.c defines each figure). */
#define DF_TRACE_TOP 5
#define DF_TRACE_REUSE_MAX 64
typedef struct df_trace_layer_stats {
    int layer;                     /* -1: pooled */
    uint64_t rows, uses;           /* routes (positions) at the layer; rows * k */
    int unused;                    /* experts never routed */
    double entropy_bits, entropy_norm, max_over_mean;
    int top[DF_TRACE_TOP];         /* the most used experts (-1: none), count descending */
    uint64_t top_count[DF_TRACE_TOP];
    int pair[DF_TRACE_TOP][2];     /* the pairs routed together most often */
    uint64_t pair_count[DF_TRACE_TOP];
    uint64_t neighbours, changed;  /* consecutive positions' rows; those whose experts differ */
    double mean_overlap;           /* mean |A n B| / k over the neighbours */
    double reuse[DF_TRACE_REUSE_MAX]; /* [d-1]: share of a row's experts in the row d earlier */
} df_trace_layer_stats;
typedef struct df_trace_stats {
    int experts, top_k, n_reuse;
    int n_layers;                  /* MoE layers with routes */
    df_trace_layer_stats *layers;  /* [n_layers], in layer order */
    df_trace_layer_stats pooled;
    uint64_t *counts;              /* [n_layers][experts]: each expert's routes at the layer */
} df_trace_stats;
int df_trace_stats_compute(const char *path, int n_reuse, df_trace_stats *out, df_error *err);
void df_trace_stats_free(df_trace_stats *s);

/* The last route a trace holds for every (position, MoE layer)
 * (trace_diff.c; a rolled-back draft's rows replaced by what the position
 * finally got), up to 4M positions. */
typedef struct df_trace_routes {
    int layers, experts, k, max_pos;   /* max_pos: positions held, [0, max_pos) */
    int32_t *ids;                      /* [max_pos][layers][k]; -1: no route */
    float *w;                          /* same shape */
} df_trace_routes;
int df_trace_last_routes(const char *path, df_trace_routes *L, df_error *err);
void df_trace_routes_free(df_trace_routes *L);

/* The router look-ahead against the routes (trace_prefetch.c), from a
 * trace written with --trace-lookahead: per distance d and target layer,
 * the predictions compared and, for the prefetcher's top m = k/2 and for
 * all k, the predicted experts the position then routed to. */
typedef struct df_trace_prefetch_row {
    int dist, layer;               /* layer -1: every layer at that distance */
    uint64_t compared;             /* predictions whose position has a route there */
    uint64_t hits_half, hits_full; /* |top m n routed|, |top k n routed|, summed */
} df_trace_prefetch_row;
typedef struct df_trace_prefetch {
    int top_k, n_rows;
    df_trace_prefetch_row *rows;   /* pooled rows first for each distance, then its layers */
} df_trace_prefetch;
int df_trace_prefetch_compute(const char *path, df_trace_prefetch *out, df_error *err);
void df_trace_prefetch_free(df_trace_prefetch *p);

/* Where two traces route differently (trace_diff.c): the last route each
 * trace holds for a (position, MoE layer), compared where both have one. */
typedef struct df_trace_diff_layer {
    int layer;                     /* -1: pooled */
    uint64_t compared;             /* (position, layer) routes both traces hold */
    uint64_t set_differs;          /* other experts */
    uint64_t order_differs;        /* the same experts in another order */
    uint64_t weight_differs;       /* the same experts and order, some weight's bits differ */
    double mean_overlap;           /* mean |A n B| / k */
    double max_weight_diff;        /* largest |w_a - w_b| where the experts and order agree */
    int first_pos;                 /* the first position whose experts differ (-1: none) */
} df_trace_diff_layer;
typedef struct df_trace_diff {
    int top_k, n_layers;
    uint64_t only_a, only_b;       /* routes one trace holds and the other not */
    df_trace_diff_layer *layers;   /* [n_layers] */
    df_trace_diff_layer pooled;
} df_trace_diff;
int df_trace_diff_compute(const char *a, const char *b, df_trace_diff *out, df_error *err);
void df_trace_diff_free(df_trace_diff *d);

/* Plots as SVG (trace_plot.c): the layer x expert popularity heat map, the
 * reuse curves (a line a layer, the pooled one bold), hit rate against
 * cache size per policy with Belady's optimum.  0, or -1 with err set. */
int df_plot_popularity(const char *path, const df_trace_stats *S, df_error *err);
int df_plot_reuse(const char *path, const df_trace_stats *S, df_error *err);
int df_plot_cache(const char *path, const df_cachesim_row *rows, int n, df_error *err);
/* An attention map of one MLA layer and head from an attention dump
 * (--dump-attention): query positions down, key positions across, each kept
 * weight a cell (its share of the largest weight in the map sets the
 * colour); *cells gets the number drawn. */
int df_plot_attention(const char *dump, int layer, int head, const char *path, int *cells, df_error *err);

#endif
