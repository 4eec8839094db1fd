/* family.h - the model-family seam: the one interface every family
 * answers to, and what type a model on disk states.
 *
 * src/model/ holds what is general (this interface, a model's weight files
 * in weights.h, the memory planner);
 * each family lives in its own folder below it (src/model/k3/: Kimi K3,
 * the MoE target whose forward passes the engine schedules and streams;
 * src/model/qwen3/: Qwen3 dense, the drafters K3 users have).  Nothing
 * outside a family's folder includes its headers except the engine, which
 * is K3's (tools/check_layers.sh enforces it): every other caller reaches
 * a family through its table.
 *
 * A family is chosen from what the model says it is: config.json's
 * "model_type" for a Hugging Face folder, "general.architecture" for a
 * GGUF file (family_type_of here; the registry, family_of in the engine's
 * families.h, holds every family's table: K3's is the engine's own
 * sessions behind this interface).  An unknown type is an error naming the
 * type and the families known; nothing is guessed from shapes.
 *
 * Every family answers the whole table: info and plan from the files'
 * headers alone; open, states, forward rows, mark and truncate on an
 * opened model, in a fixed reduction order (the same bits at any chunking,
 * thread count and kernel table).  Any family's model can draft (the
 * engine's draft.c with the target's tokenizer, draft_xtok.c with another);
 * `target` says which families deltafin also runs as the model itself.
 */
#ifndef DF_FAMILY_H
#define DF_FAMILY_H

#include <stddef.h>
#include <stdint.h>
#include "df_error.h"

struct kernel_table;
typedef struct df_family_model df_family_model; /* an opened model */
typedef struct df_family_state df_family_state; /* its positions (KV cache, recurrent state) */

/* What a model is, read from its configuration and headers alone (no
 * weights read): for messages and setup's summary. */
typedef struct df_family_info {
    int layers, hidden, vocab;
    uint64_t weight_bytes;     /* the weight files (a dense family: in memory once opened) */
    uint64_t state_fixed;      /* a dense family's state: its bytes whatever its positions */
    uint64_t state_per_pos;    /* and per position (K3: 0, its plan sizes the state) */
    char summary[160];         /* "Qwen3, 2 layers, 64 wide, tied head: f32 weights" */
} df_family_info;

/* How a model is opened and what its memory plan is sized for. */
typedef struct df_family_opts {
    const struct kernel_table *kt; /* its products' kernels (NULL: the family's choice: Qwen3 the best
                                      table for this CPU, K3 the engine's: $DF_BACKEND / $DF_KERNELS, else the best) */
    int n_threads;             /* the workers its products may split over (<= 1: the caller's thread) */
    uint64_t mem_budget;       /* what the model and one state may take (0: the machine's default) */
    int n_ctx;                 /* the positions that state holds (0: 4096) */
    int max_rows;              /* ids per forward call planned for (0: 64; longer calls are cut) */
    int rollback;              /* positions after a mark that truncate must reach (0: none) */
} df_family_opts;

typedef struct df_family {
    const char *name;          /* "kimi_k3", "qwen3" */
    const char *title;         /* for messages: "Kimi K3 (MoE)" */
    const char *const *types;  /* the model_type / general.architecture values it reads, NULL-ended */
    int target;                /* 1: deltafin also runs it as the model (run, serve); 0: it drafts only */
    int (*info)(const char *path, df_family_info *out, df_error *err);
    /* The bytes the model and one state take opened with o (*bytes), and
     * a line saying what they are (what); -1 when it cannot open within
     * o->mem_budget, with the reason. */
    int (*plan)(const char *path, const df_family_opts *o, uint64_t *bytes, char *what, size_t n_what, df_error *err);
    int (*open)(const char *path, const df_family_opts *o, df_family_model **out, df_error *err);
    void (*close)(df_family_model *m);
    int (*vocab)(const df_family_model *m);
    int (*state_new)(df_family_model *m, int n_ctx, df_family_state **out, df_error *err);
    void (*state_free)(df_family_state *s);
    /* the positions evaluated so far */
    int (*pos)(const df_family_state *s);
    /* remember the current position: truncate reaches any position from
     * here on (up to the open's rollback ahead) */
    int (*mark)(df_family_state *s, df_error *err);
    /* forget the positions from pos on (pos <= the current position) and
     * return the position kept: pos, or less where the state cannot go
     * back to pos (K3's recurrent layers before the mark: 0, the state
     * emptied); the caller evaluates again from there */
    int (*truncate)(df_family_state *s, int pos);
    /* evaluate n ids at the state's position; logits (or NULL) gets
     * [n][vocab], or [vocab] for the last id when last_only; nothing is
     * allocated here */
    int (*forward)(const df_family_model *m, df_family_state *s, const int32_t *ids, int n, float *logits,
                   int last_only, df_error *err);
} df_family;

/* The dense families' tables, each defined in its folder (K3's is the
 * engine's: families.h). */
extern const df_family df_family_qwen3;

/* The type a model states: config.json's model_type (path a folder) or
 * the GGUF's general.architecture (path a file), into out.  -1 with the
 * file and field named when neither can be read. */
int family_type_of(const char *path, char *out, size_t n_out, df_error *err);
/* The model_type of a config.json's text (label names it in errors) into
 * out, "" when it states none; -1 when it is not JSON. */
int family_config_type(const char *text, size_t len, const char *label, char *out, size_t n_out, df_error *err);
/* Bytes a dense family's model and a state of n_ctx positions take. */
uint64_t family_bytes(const df_family_info *fi, int n_ctx);

#endif
