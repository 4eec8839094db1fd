/* draft_xtok.h - drafting with a model of another tokenizer (a Qwen3 model
 * for a K3 target, or any family's; draft_xtok.c says how a proposal is made and
 * translated).  Proposals never change a token: the target verifies them. */
#ifndef DF_DRAFT_XTOK_H
#define DF_DRAFT_XTOK_H

#include "family.h"
#include "generate.h"
#include "tokenizer.h"

typedef struct xtok_stats {
    uint64_t proposals;      /* proposals of at least one id */
    uint64_t drafter_tokens; /* drafter tokens generated */
    uint64_t untranslated;   /* drafts whose bytes did not re-encode after the history's tail */
    uint64_t boundary;       /* histories ending inside a UTF-8 character (nothing proposed) */
    uint64_t cut_char;       /* drafts whose bytes ended inside a character (the partial one cut) */
    int wide;                /* 1: a wide drafter is on */
    uint64_t wide_asked;     /* proposals the first drafter was unsure of, where the wide one was asked */
    uint64_t wide_used;      /* ... and the wide one's proposal was taken */
    uint64_t wide_tokens;    /* the wide drafter's tokens (drafter_tokens: the first one's) */
} xtok_stats;

/* path: a model of any family (families.h: Qwen3, or K3) with its tokenizer (tokenizer.json,
 * tiktoken.model, or the GGUF's vocabulary); wide: NULL, or a second such model asked when the
 * first is unsure (draft_xtok.c); target_model: the target's folder or GGUF, for its
 * tokenizer; n_ctx: the target's context (the drafter's is at most
 * XT_MAX_CTX of it: it reads the current message only); mem_budget: what
 * its weights and KV cache may take, both drafters' (refused, with the numbers, when they
 * need more); n_threads: the workers its matrix products split over (the
 * target's: the two never run at once).  Errors name the spec. */
#define XT_MAX_CTX 4096
/* The family options each of its drafters is planned with (at the whole
 * share; opened, of two, the first with what its plan takes and the
 * second with the rest), its context cut to XT_MAX_CTX; plan --draft
 * sizes them with the same. */
void df_drafter_xtok_opts(size_t mem_budget, int n_ctx, int n_threads, df_family_opts *o);
int df_drafter_open_xtok(const char *path, const char *wide, const char *target_model, int n_ctx, size_t mem_budget,
                         int n_threads, df_drafter **out, df_error *err);
/* A cross-tokenizer drafter's counters; -1 for another drafter. */
int df_drafter_xtok_stats(const df_drafter *d, xtok_stats *st);

/* Step 4 of a proposal on its own (tests): the drafter ids gen[0..g) after
 * the target ids tail[0..nt) as at most k target ids in out: their bytes
 * less a trailing partial character, encoded by the target after the
 * tail's bytes, the last id held back (an unfinished word).  Returns the
 * count (0 when the tail is not reproduced), -1 with err; st (may be NULL)
 * gets the counters this call moved.  Allocates: not for the token loop. */
int xtok_translate(const tokenizer *target, const tokenizer *drafter, const int32_t *tail, size_t nt,
                   const int32_t *gen, int g, int k, int32_t *out, xtok_stats *st, df_error *err);

#endif
