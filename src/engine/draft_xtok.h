/* draft_xtok.h - drafting with a model of another tokenizer (a Qwen3 model
 * for a K3 target; draft_xtok.c says how a proposal is made and
 * translated).  Proposals never change a token: the target verifies them. */
#ifndef DF_DRAFT_XTOK_H
#define DF_DRAFT_XTOK_H

#include "generate.h"
#include "tokenizer.h"

typedef struct xtok_stats {
    uint64_t proposals;      /* proposals of at least one id */
    uint64_t drafter_tokens; /* drafter tokens generated */
    uint64_t untranslated;   /* drafts whose bytes did not re-encode after the history's tail */
    uint64_t boundary;       /* histories ending inside a UTF-8 character (nothing proposed) */
} xtok_stats;

/* path: a Qwen3 model (qwen3.h) with its tokenizer (tokenizer.json, or the
 * GGUF's vocabulary); target_model: the target's folder or GGUF, for its
 * tokenizer; n_ctx: the target's context (the drafter's is at most
 * XT_MAX_CTX of it: it reads the current message only); mem_budget: what
 * its weights and KV cache may take (refused, with the numbers, when they
 * need more).  Errors name the spec. */
#define XT_MAX_CTX 4096
int df_drafter_open_xtok(const char *path, const char *target_model, int n_ctx, size_t mem_budget, df_drafter **out,
                         df_error *err);
/* A cross-tokenizer drafter's counters; -1 for another drafter. */
int df_drafter_xtok_stats(const df_drafter *d, xtok_stats *st);

#endif
