/* schedule.h - a chunk's forward pass as data: the ordered steps (layer,
 * rows, phase) the engine runs (schedule.c builds, forward.c runs). */
#ifndef DF_SCHEDULE_H
#define DF_SCHEDULE_H

#include <stddef.h>
#include <stdint.h>

enum {
    STEP_TRUNK,     /* make layer il's trunk present (streamed trunk; il == NL: the output head) */
    STEP_ROWS,      /* layer il, rows [t0, t0+nt): mixes, attention, dense MLP or routing (LAYER_ROWS) */
    STEP_READS,     /* layer il: start the reads its rows routed so far need (LAYER_READS) */
    STEP_EXPERTS,   /* layer il: the routed experts over all rows (LAYER_EXPERTS) */
    STEP_FINISH,    /* layer il, rows [t0, t0+nt): shared experts and routed sum (LAYER_FINISH) */
    STEP_LAYER_END, /* layer il's steps are issued: router look-ahead prefetch, observers */
    STEP_OUTPUT     /* rows [t0, t0+nt): the output mix, final norm and lm_head */
};

typedef struct sched_step {
    uint8_t kind;
    int il, t0, nt;
    int n_anc;      /* the AttnRes anchors the step's mixes see */
} sched_step;

/* The shape of a chunk. */
typedef struct sched_shape {
    int T;                  /* positions */
    int row_slice;          /* rows a layer's attention and dense work take at a time */
    int n_layers;
    int block_len;          /* AttnRes block length (config B): layer il starts a block when il % B == 0 */
    const uint8_t *moe;     /* [n_layers] 1 for a MoE layer */
    int streamed;           /* the trunk streams (two layers in memory): no wavefront */
    int all_rows;           /* the output step for every row, else the last one */
} sched_shape;

/* Steps a chunk of max_batch positions can need at most (the buffer's size). */
size_t sched_capacity(int n_layers, int max_batch, int row_slice);
/* The steps, in order, into out[cap]; returns how many (-1 if cap is short).
 * Layer by layer, each layer's rows in slices; with several slices and the
 * trunk in memory a MoE layer's slices finish inside the next layer's slice
 * loop (a wavefront: slice b of layer L+1 needs only slice b of layer L, so
 * the next layer routes and its reads start early). */
int sched_build(const sched_shape *sh, sched_step *out, size_t cap);
/* One line per step ("rows L3 0+4 anc 2"), for tests and --debug output. */
void sched_format(const sched_step *st, int n, char *buf, size_t cap);

#endif
