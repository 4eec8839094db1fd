/* trace.h - reading deltafin's route traces (the research wing: above the
 * engine, which writes them; the engine never includes this).
 *
 * Both formats the engine writes: the binary trace of trace_format.h (the
 * default of --trace) and the older JSON lines (--trace-format jsonl), told
 * apart by the first byte.  A JSON line becomes a TRACE_ROUTE record of one
 * position with no scores (that format has none) and its weights as
 * printed (seven significant digits: not the engine's bits).
 */
#ifndef DF_TRACE_H
#define DF_TRACE_H

#include <stddef.h>
#include <stdint.h>
#include "df_error.h"
#include "trace_format.h"

typedef struct df_trace df_trace;

typedef struct df_trace_info {
    int binary;                 /* 1: trace_format.h; 0: JSON lines */
    int layers, experts, top_k; /* top_k: the model's k (JSON lines: as its header says) */
    int hidden, vocab, shared_experts; /* binary only (0 in JSON lines) */
    const char *model;          /* the model the engine opened ("" in JSON lines) */
    const uint8_t *moe;         /* [layers]: 1 for an MoE layer (binary; JSON lines: all 1) */
} df_trace_info;

typedef struct df_trace_rec {
    int tag;                    /* TRACE_EVAL, TRACE_ROUTE, TRACE_ATTN, TRACE_KDA or TRACE_PREDICT */
    int pos0, n;                /* EVAL: n ids evaluated from pos0; ROUTE, ATTN: positions pos0 .. pos0+n-1 */
    int layer, k;               /* ROUTE: the MoE layer, experts per position; ATTN: the MLA layer, weights kept */
    int head0, n_heads;         /* ATTN: the heads dumped */
    int from, dist;             /* PREDICT: made after layer `from`, for `layer`, the dist-th MoE layer on
                                 * (ids: [n][k], the top k in order) */
    const int32_t *ids;         /* EVAL: [n] token ids; ROUTE: [n][k] experts; ATTN: [n][n_heads][k] positions */
    const float *score;         /* ROUTE: [n][k] router scores (NULL in JSON lines) */
    const float *weight;        /* ROUTE: [n][k] weights (NULL when a JSON line has none); ATTN: [n][n_heads][k];
                                 * KDA: [n][n_heads][4] beta, decay mean, decay min, gate mean (k = 4) */
    size_t where;               /* binary: the record's byte offset; JSON lines: its line number */
} df_trace_rec;

/* Whole-file readers; errors name the file and the byte or line. */
int df_trace_open(const char *path, df_trace **out, df_error *err);
/* The same over bytes in memory (copied); name is used in messages. */
int df_trace_from_memory(const void *data, size_t len, const char *name, df_trace **out, df_error *err);
const df_trace_info *df_trace_header(const df_trace *t);
/* The next record: 1, 0 at the end, -1 on a malformed record (err says
 * what and where).  The record's arrays live until the next call. */
int df_trace_next(df_trace *t, df_trace_rec *r, df_error *err);
/* Back to the first record. */
void df_trace_rewind(df_trace *t);
void df_trace_close(df_trace *t);

#endif
