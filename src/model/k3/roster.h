/* roster.h - the one list of a K3 layer's tensors that both loaders bind.
 *
 * Owns: for every k3_layer weight field, one entry saying where it goes
 * (offsetof), whether it is a mapped matrix (wmat) or a small vector upcast
 * to owned f32, which layers have it (all / KDA / MLA / dense MLP / MoE), its
 * name in the safetensors release and in a llama.cpp GGUF, its shape in
 * terms of the config (roster_dim), and a fix tag where a format stores it
 * transformed.  model.c and model_gguf.c each walk this list with their own
 * binder; a new per-layer tensor is one line here (and its fix, if any, in
 * each binder).
 * Does not own: finding, checking or reading tensors (the loaders); the
 * routed experts (storage layout, registered per format); the model-level
 * tensors (embedding, lm_head, final norm, output residual score); the GGUF
 * names and shapes of llama.cpp's per-head kv_b split (model_gguf.c, under
 * ROSTER_FIX_KV_B).
 * Invariants: the list order is the order a layer's tensors are looked up
 * (so the first error reported and the trunk's per-layer read order are
 * fixed); matrix shapes are common to both formats ([rows, cols] is GGUF's
 * ne {cols, rows}); vector shapes are per format because the converter
 * reshapes them.  Read-only, no state: any thread.
 */
#ifndef DF_ROSTER_H
#define DF_ROSTER_H

#include <stddef.h>
#include <stdint.h>
#include "model.h"

/* A size in terms of the config; roster_dim gives its value. */
enum roster_dim {
    RD_NONE,        /* 0: no such axis (a safetensors shape ends at the first) */
    RD_ONE,         /* 1 */
    RD_H,
    RD_P,           /* Hk * Dk */
    RD_DK,
    RD_HK,
    RD_WC,
    RD_RQ,
    RD_RKV,
    RD_RKV_DR,      /* Rkv + dr */
    RD_HM_QK,       /* Hm * (dn + dr) */
    RD_HM_KV,       /* Hm * (dn + dv) */
    RD_HM_DV,       /* Hm * dv */
    RD_DFF,
    RD_E,
    RD_LT,
    RD_NS_I,        /* Ns * I */
};

enum roster_kind {
    ROSTER_MAT,     /* a wmat: a trunk matrix, mapped (or streamed) */
    ROSTER_VEC,     /* a float *: read once and upcast to owned f32 */
};

/* Which layers have the tensor. */
enum roster_when { ROSTER_ALL, ROSTER_KDA, ROSTER_MLA, ROSTER_DENSE, ROSTER_MOE };

/* How a format stores the tensor differently from what the engine keeps. */
enum roster_fix {
    ROSTER_FIX_NONE,
    /* AttnRes score: safetensors has norm (st) [h] and proj (st2) [1, h]
     * and the engine keeps their product; the GGUF stores the product */
    ROSTER_FIX_RES_SCORE,
    /* KDA decay: safetensors A_log -> exp(A_log) for the Hk heads; the GGUF's
     * ssm_a holds -exp(A_log), which must be < 0, and is negated */
    ROSTER_FIX_DECAY,
    /* MLA kv_b: a GGUF may store it split per head (attn_k_b / attn_v_b,
     * bound to k_b, v_b with kv_split = 1) instead of fused */
    ROSTER_FIX_KV_B,
};

typedef struct roster_entry {
    size_t field;           /* offsetof(k3_layer, ...): a wmat (MAT) or a float * (VEC) */
    uint8_t kind;           /* enum roster_kind */
    uint8_t when;           /* enum roster_when */
    uint8_t fix;            /* enum roster_fix */
    uint8_t rows, cols;     /* MAT: [rows, cols] in both formats (enum roster_dim) */
    uint8_t st_shape[3];    /* VEC: safetensors shape, RD_NONE past the last axis */
    uint8_t gg_ne[3];       /* VEC: GGUF ne, RD_ONE past the last axis */
    const char *st;         /* safetensors name after "model.layers.N." */
    const char *st2;        /* ROSTER_FIX_RES_SCORE: the proj factor's name */
    const char *gg;         /* GGUF name after "blk.N." */
} roster_entry;

extern const roster_entry roster[];
extern const int roster_n;

/* The value of a roster_dim for config c (as int, like the config's fields). */
int roster_dim(const k3_config *c, int d);
/* Whether layer of this kind (LAYER_KDA / LAYER_MLA) and MoE flag has r. */
int roster_applies(const roster_entry *r, int kind, int moe);
/* The field r names in L (r->kind must match). */
wmat *roster_mat(k3_layer *L, const roster_entry *r);
float **roster_vec(k3_layer *L, const roster_entry *r);

#endif
