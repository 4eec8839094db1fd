/* draft.h - the drafters speculative decoding can use (generate.h's
 * df_drafter interface).  Drafts only propose: the target model decides
 * every token, so a drafter changes speed, never output.
 *
 *   ngram      prompt lookup: the longest suffix of the history (4 ids down
 *              to 1) found earlier in it, most recent occurrence first;
 *              proposes what followed it there.
 *   suffix     a continuation table over every history this drafter has
 *              seen in the process (all conversations of a server): for the
 *              last 1-4 ids, the counts of what came next; proposes the most
 *              frequent continuation while it holds at least half of its
 *              context's count (the confidence), longer contexts first.
 *   model:PATH a small model with the target's tokenizer, of any family
 *              (families.h: a K3 checkpoint or GGUF as a second engine, a
 *              Qwen3 model), opened through the family table in its own
 *              memory share, greedy, its state kept in step with the
 *              history by the table's mark and truncate; after a gap of
 *              over 256 ids (drafting held off), it restarts on the last
 *              256 instead of evaluating the gap.
 *   lookup:FILE ngram over the history, then over a reference text's ids
 *              (a file the answer is likely to quote: the code being edited,
 *              a document, an earlier answer): the history's longest suffix
 *              at its first occurrence in the reference, what followed it.
 *              The front end reads and tokenizes FILE
 *              (df_drafter_open_lookup).
 * A model with another tokenizer as model:PATH drafts across tokenizers
 * instead (draft_xtok.h; the front end compares the tokenizers and opens
 * it).
 */
#ifndef DF_DRAFT_H
#define DF_DRAFT_H

#include "family.h"
#include "generate.h"

/* "none" gives *out = NULL.  `spec` is none | ngram | suffix | model:PATH;
 * for model drafters, mem_budget is the draft engine's --mem share and
 * n_ctx its context; target_vocab must match the draft model's.  Errors
 * name the spec. */
/* The family options a model:PATH drafter with the target's tokenizer
 * opens its model with (plan --draft sizes it with the same). */
void df_drafter_model_opts(size_t mem_budget, int n_ctx, int n_threads, df_family_opts *o);
int df_drafter_open(const char *spec, size_t mem_budget, int n_ctx, int n_threads, int target_vocab, df_drafter **out,
                    df_error *err);
/* lookup over ids[0..n) (copied; indexed once); name is the spec, for errors. */
int df_drafter_open_lookup(const int32_t *ids, size_t n, const char *name, df_drafter **out, df_error *err);
void df_drafter_free(df_drafter *d);
/* A model drafter's draft session: the history position it starts at
 * (0, or where a proposal after a long gap restarted it) and how many ids it
 * holds.  -1 for the other drafters. */
int df_drafter_window(const df_drafter *d, size_t *base, size_t *held);

#endif
