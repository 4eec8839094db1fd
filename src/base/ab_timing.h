/* ab_timing.h - the counterbalanced on/off timing controller (L0; pure: no
 * clock, no I/O, time is fed in).  One implementation behind the two
 * questions "does the router look-ahead prefetch pay?" (prefetch_timing.h)
 * and "do drafts pay?" (generate.h's draft guard).
 *
 * A feature that never changes results, only speed, is measured in rounds
 * of AB_WINDOWS windows of at least rule.window units (decode steps, or
 * tokens), on or off per window in a counterbalanced order (ABBA ABBA, and
 * the next round starts with the other arm: a trend such as a cache warming
 * up or a disk that drifts weighs on both arms alike).  A step of several
 * units is never split: window boundaries fall between steps.  After a
 * round, off is chosen when its mean seconds per unit times rule.off_scale
 * is below the on arm's times rule.on_scale (a margin for the feature:
 * off_scale 1, on_scale 0.97 is "off only when 3 % faster"), on otherwise;
 * the choice holds for hold_first units after the first round, then
 * rule.hold, doubled after each round that decides as the last did, up to
 * rule.hold_max; then the feature is measured again.
 */
#ifndef DF_AB_TIMING_H
#define DF_AB_TIMING_H

#include <stdint.h>

#define AB_WINDOWS 8

typedef struct ab_rule {
    uint64_t window;                  /* units per window */
    uint64_t hold_first, hold, hold_max; /* units held after a round (see above) */
    double off_scale, on_scale;       /* off wins when off * off_scale < on * on_scale */
} ab_rule;

typedef struct ab_timing {
    ab_rule rule;
    int window;               /* window of this round, 0..AB_WINDOWS-1 */
    uint64_t in_window;       /* units in the current window */
    int first;                /* arm of this round's first window: 1 on, 0 off */
    double sec[2];            /* this round's seconds, [off, on] */
    uint64_t n[2];            /* and units */
    uint64_t hold;            /* units left in the hold (0: measuring) */
    uint64_t hold_len;        /* the last hold's length */
    int choice;               /* the arm held */
    int rounds;               /* rounds decided */
    int last;                 /* the last round's choice: 1 on, 0 off, -1 none yet */
    double mean[2];           /* the last round's mean seconds per unit, [off, on] */
} ab_timing;

void ab_timing_init(ab_timing *t, const ab_rule *rule);
/* Whether the next step runs with the feature on. */
int ab_timing_on(const ab_timing *t);
/* A step that ran with ab_timing_on(t) covered `units` (> 0; others are
 * ignored) in sec; returns 1 when it completed a round (a decision). */
int ab_timing_step(ab_timing *t, int units, double sec);

#endif
