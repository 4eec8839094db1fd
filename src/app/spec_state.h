/* spec_state.h - the --spec-state file: what the drafts' cost model and
 * guard learned (generate.h's gen_memory), one entry per model and drafter,
 * read when a generation loop starts and written after each answer. */
#ifndef DF_SPEC_STATE_H
#define DF_SPEC_STATE_H
#include "generate.h"
#include "options.h"
/* Puts this model's and drafter's entry (if any) into g; a file that cannot
 * be read as a state file is named on stderr, ignored, and never
 * overwritten.  Nothing without --spec-state, a drafter, or with --draft-k. */
void spec_state_load(const run_args *a, gen_loop *g);
/* Writes g's memory as this model's and drafter's entry, keeping the
 * others (atomically replaced).  Returns 0, or -1 after naming the error on
 * stderr (the answer itself is not affected). */
int spec_state_save(const run_args *a, const gen_loop *g);
#endif
