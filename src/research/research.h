/* research.h - the research wing's analyses (src/research/): offline work
 * on route traces that the engine does not need.  trace.h reads traces. */
#ifndef DF_RESEARCH_H
#define DF_RESEARCH_H

#include <stdint.h>
#include "df_error.h"

/* Offline replay of a route trace (either format, trace.h) through the
 * cache policies and Belady's optimal, at several cache sizes (in experts). */
typedef struct df_cachesim_row {
    int slots;
    uint64_t steps, accesses;     /* (position, layer) steps; distinct experts used per step, summed */
    uint64_t hits_lru, hits_lfu, hits_tlfu, hits_belady;
    uint64_t hits_static;         /* the best fixed set (the trace's most used experts, known in
                                     advance, each missed once): the ceiling of any policy that
                                     ranks experts by frequency alone */
} df_cachesim_row;
int df_cachesim(const char *trace_path, const int *slots, int n, df_cachesim_row *rows, df_error *err);

#endif
