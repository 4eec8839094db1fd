/* qwen3.h - Qwen3 dense models (Qwen3-0.6B / 1.7B, the drafters K3 users
 * have; issue 42), as transformers' modeling_qwen3.py defines them:
 * pre-norm blocks, RMSNorm, GQA with per-head QK-norm before NeoX
 * (rotate-half) RoPE, scale head_dim^-0.5, SiLU MLP, tied or untied
 * lm_head.
 *
 * Owns: reading a Hugging Face folder (config.json with model_type "qwen3";
 * model.safetensors or model.safetensors.index.json shards; F32, BF16 or
 * F16 tensors) or a llama.cpp GGUF (general.architecture "qwen3"; F32, F16,
 * BF16 or any block format qblock.h reads, Q8_0 included), each matrix
 * kept in memory in its file's type (norms in f32); the KV cache;
 * evaluation.
 * Every product and sum runs in a fixed order per row with double
 * accumulation (the scalar reference), so logits are the same bits
 * whatever the chunking of the ids: a prefill, one id at a time, or a
 * truncation and re-evaluation.  qwen3_set_kernels moves the matrix
 * products (every projection and the head) onto a kernel table
 * (kernels.h): float lanes in the table's one reduction order, the same
 * bits on every ISA and at any chunking; norms, RoPE and attention stay in
 * double.  Callers outside this folder reach it through the family
 * interface (family.h: df_family_qwen3, defined at the end of qwen3.c);
 * the tests and tools that check it include this header.
 */
#ifndef DF_QWEN3_H
#define DF_QWEN3_H

#include <stddef.h>
#include <stdint.h>
#include "df_error.h"

typedef struct qwen3_config {
    int hidden, layers, heads, kv_heads, head_dim, ffn, vocab;
    double eps, theta;
    int tied;        /* lm_head is embed_tokens */
} qwen3_config;

typedef struct qwen3_model qwen3_model;
struct kernel_table;
typedef struct qwen3_state qwen3_state;

/* path: a folder (safetensors) or a GGUF file.  Every error names the file
 * and the field or tensor. */
int qwen3_open(const char *dir, qwen3_model **out, df_error *err);
/* The same with every matrix widened to F32 at load (the memory of the
 * old loader; the same bits on a kernel table: tests compare the two). */
int qwen3_open_f32(const char *dir, qwen3_model **out, df_error *err);
/* The configuration alone (no weights read); the bytes qwen3_open's
 * weights take, from the headers alone (matrices in the file's type, F32,
 * BF16, F16 or a ggml block format; vectors in F32); the bytes of a state
 * of n_ctx positions (the KV cache); an opened model's weight bytes. */
int qwen3_read_config(const char *path, qwen3_config *c, df_error *err);
int qwen3_weight_bytes(const char *path, uint64_t *bytes, df_error *err);
size_t qwen3_state_bytes(const qwen3_config *c, int n_ctx);
size_t qwen3_model_bytes(const qwen3_model *m);
void qwen3_free(qwen3_model *m);
/* The matrix products on kt (kernels.h: ISA-independent bits) instead of
 * the double scalar reference; NULL returns to the reference.  Set it
 * before qwen3_state_new (a state made under one mode works in the other). */
void qwen3_set_kernels(qwen3_model *m, const struct kernel_table *kt);
/* The kernel path's matrix products split by rows over a pool of n_threads
 * (the caller included; 1: none): the same bits at any count. */
void qwen3_set_threads(qwen3_model *m, int n_threads);
const qwen3_config *qwen3_cfg(const qwen3_model *m);

/* A KV cache of n_ctx positions. */
int qwen3_state_new(const qwen3_model *m, int n_ctx, qwen3_state **out, df_error *err);
void qwen3_state_free(qwen3_state *s);
int qwen3_state_pos(const qwen3_state *s);
/* Forget the positions from pos on (pos <= the current position). */
void qwen3_truncate(qwen3_state *s, int pos);
/* Evaluate n ids at the state's position; logits (or NULL) gets [n][vocab]. */
int qwen3_eval(const qwen3_model *m, qwen3_state *s, const int32_t *ids, int n, float *logits, df_error *err);
/* The same, the logits of the last id only (last: [vocab]; n >= 1). */
int qwen3_eval_last(const qwen3_model *m, qwen3_state *s, const int32_t *ids, int n, float *last, df_error *err);

#endif
