/* family.h - the model-family seam: which family a model on disk belongs
 * to, and the one interface every family answers to.
 *
 * src/model/ holds what is general (this interface, a model's weight files
 * in weights.h, the memory planner);
 * each family lives in its own folder below it (src/model/k3/: Kimi K3,
 * the MoE target whose forward passes the engine schedules and streams;
 * src/model/qwen3/: Qwen3 dense, the drafters K3 users have).  Nothing
 * outside a family's folder includes its headers except the engine, which
 * is K3's (tools/check_layers.sh enforces it): every other caller reaches
 * a family through this table.
 *
 * A family is chosen from what the model says it is: config.json's
 * "model_type" for a Hugging Face folder, "general.architecture" for a
 * GGUF file (family_of).  An unknown type is an error naming the type and
 * the families known; nothing is guessed from shapes.
 *
 * Two kinds of family:
 *   - engine families (engine = 1: K3): the engine (src/engine/) opens
 *     them, plans their memory and schedules their passes (streamed
 *     experts, checkpoints, ranks); here they answer `info` only;
 *   - dense families (engine = 0: Qwen3): opened, evaluated, marked and
 *     truncated through this table, on one thread, in a fixed reduction
 *     order (the same bits at any chunking and on every kernel table).
 *     A drafter of another tokenizer (engine/draft_xtok.c) runs on them.
 */
#ifndef DF_FAMILY_H
#define DF_FAMILY_H

#include <stddef.h>
#include <stdint.h>
#include "df_error.h"

struct kernel_table;
typedef struct df_family_model df_family_model; /* a dense family's opened model */
typedef struct df_family_state df_family_state; /* its positions (a KV cache) */

/* What a model is, read from its configuration and headers alone (no
 * weights read): for the plan, `plan --draft` and setup's summary. */
typedef struct df_family_info {
    int layers, hidden, vocab;
    uint64_t weight_bytes;     /* in memory once opened (engine families: the weight files on disk) */
    uint64_t state_fixed;      /* a state's bytes whatever its positions */
    uint64_t state_per_pos;    /* and per position (engine families: 0, the engine plans it) */
    char summary[160];         /* "Qwen3, 2 layers, 64 wide, tied head: f32 weights" */
} df_family_info;

typedef struct df_family {
    const char *name;          /* "kimi_k3", "qwen3" */
    const char *title;         /* for messages: "Kimi K3 (MoE)" */
    const char *const *types;  /* the model_type / general.architecture values it reads, NULL-ended */
    int engine;                /* 1: the engine runs it (see the file comment); 0: dense, below */
    int (*info)(const char *path, df_family_info *out, df_error *err);
    /* dense families only (NULL for engine families): */
    /* kt: the kernel table of its products; n_threads: the workers they may split over (1: the caller's) */
    int (*open)(const char *path, const struct kernel_table *kt, int n_threads, df_family_model **out, df_error *err);
    void (*close)(df_family_model *m);
    int (*vocab)(const df_family_model *m);
    int (*state_new)(const df_family_model *m, int n_ctx, df_family_state **out, df_error *err);
    void (*state_free)(df_family_state *s);
    /* the positions evaluated so far (a mark to truncate back to) */
    int (*pos)(const df_family_state *s);
    /* forget the positions from pos on (pos <= the current position) */
    void (*truncate)(df_family_state *s, int pos);
    /* evaluate n ids at the state's position; logits (or NULL) gets
     * [n][vocab], or [vocab] for the last id when last_only */
    int (*forward)(const df_family_model *m, df_family_state *s, const int32_t *ids, int n, float *logits,
                   int last_only, df_error *err);
} df_family;

/* The families deltafin knows, each defined in its folder. */
extern const df_family df_family_k3, df_family_qwen3;

/* The type a model states: config.json's model_type (path a folder) or
 * the GGUF's general.architecture (path a file), into out.  -1 with the
 * file and field named when neither can be read. */
int family_type_of(const char *path, char *out, size_t n_out, df_error *err);
/* The model_type of a config.json's text (label names it in errors) into
 * out, "" when it states none; -1 when it is not JSON. */
int family_config_type(const char *text, size_t len, const char *label, char *out, size_t n_out, df_error *err);
/* The family of a type name; NULL when none reads it. */
const df_family *family_named(const char *type);
/* The family of the model at path: NULL with an error naming the type
 * found and the families known. */
const df_family *family_of(const char *path, df_error *err);
/* Bytes a dense family's model and a state of n_ctx positions take. */
uint64_t family_bytes(const df_family_info *fi, int n_ctx);

#endif
