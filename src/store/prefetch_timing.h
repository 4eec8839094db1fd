/* prefetch_timing.h - does the router look-ahead prefetch pay, in time?
 * (L2; the counterbalanced controller of ab_timing.h with the prefetch's
 * rule; pure: the engine feeds it measured step times.)
 *
 * Precision alone does not say: with a large cache a wrong prediction
 * evicts a useful expert, and a prefetch in flight delays the next layer's
 * demand reads.  So decode steps are measured in windows of
 * PF_TIMING_WINDOW steps, with the prefetch on or off per window in a
 * counterbalanced order (ABBA ABBA, and the next round starts with the
 * other arm: a trend such as a cache warming up from cold, or a disk that
 * drifts, weighs on both arms alike), and every step counts (a step that
 * read nothing because prefetch served it is exactly what "on" buys).
 * After a round the prefetch stays off for PF_TIMING_HOLD steps when the
 * off windows were faster by more than 3 %, on otherwise; then it is
 * measured again.  The choice never changes results: prefetching only
 * moves reads earlier.
 */
#ifndef DF_PREFETCH_TIMING_H
#define DF_PREFETCH_TIMING_H

#include "ab_timing.h"

#define PF_TIMING_WINDOW 4
#define PF_TIMING_WINDOWS AB_WINDOWS
#define PF_TIMING_HOLD 256

typedef ab_timing pf_timing;

static inline void pf_timing_init(pf_timing *t)
{
    /* off only when faster by more than 3 %; the same hold after every round */
    const ab_rule rule = {.window = PF_TIMING_WINDOW, .hold_first = PF_TIMING_HOLD, .hold = PF_TIMING_HOLD,
                          .hold_max = PF_TIMING_HOLD, .off_scale = 1.0, .on_scale = 0.97};
    ab_timing_init(t, &rule);
}
/* Whether the next decode step runs with the prefetch on. */
static inline int pf_timing_active(const pf_timing *t) { return ab_timing_on(t); }
/* Record a decode step that ran with pf_timing_active(t) and took sec;
 * returns 1 when this step completed a round (a decision was made). */
static inline int pf_timing_step(pf_timing *t, double sec) { return ab_timing_step(t, 1, sec); }

#endif
