/* prefetch_timing.h - does the router look-ahead prefetch pay, in time?
 * (L2; pure: no clock, no I/O; the engine feeds it measured step times.)
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

#include <stdint.h>

#define PF_TIMING_WINDOW 4
#define PF_TIMING_WINDOWS 8
#define PF_TIMING_HOLD 256

typedef struct pf_timing {
    int window;               /* window being measured in this round, 0..PF_TIMING_WINDOWS-1 */
    int steps;                /* steps in the current window */
    int first;                /* the arm of this round's first window: 1 on, 0 off */
    double sum[2];            /* step seconds this round, [off, on] */
    int n[2];
    uint64_t hold;            /* steps left before the next round (0 = measuring) */
    int choice;               /* during a hold: the decided arm */
    int rounds;               /* rounds decided */
    int last;                 /* the last round's choice: 1 on, 0 off, -1 none yet */
    double mean[2];           /* the last round's mean step seconds, [off, on] */
} pf_timing;

void pf_timing_init(pf_timing *t);
/* Whether the next decode step runs with the prefetch on. */
int pf_timing_active(const pf_timing *t);
/* Record a decode step that ran with pf_timing_active(t) and took sec;
 * returns 1 when this step completed a round (a decision was made). */
int pf_timing_step(pf_timing *t, double sec);

#endif
