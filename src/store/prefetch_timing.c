/* prefetch_timing.c - see prefetch_timing.h. */
#include "prefetch_timing.h"

#include <string.h>

/* ABBA: the arm of window w given the round's first arm */
static int arm(const pf_timing *t, int w)
{
    static const int abba[PF_TIMING_WINDOWS] = {1, 0, 0, 1, 1, 0, 0, 1};
    return abba[w] ? t->first : !t->first;
}

void pf_timing_init(pf_timing *t)
{
    memset(t, 0, sizeof *t);
    t->first = 1;
    t->last = -1;
}

int pf_timing_active(const pf_timing *t) { return t->hold ? t->choice : arm(t, t->window); }

int pf_timing_step(pf_timing *t, double sec)
{
    if (t->hold) {
        if (--t->hold == 0) {
            t->window = t->steps = 0;
            t->first = !t->first; /* the next round starts with the other arm */
        }
        return 0;
    }
    int a = arm(t, t->window);
    t->sum[a] += sec;
    t->n[a]++;
    if (++t->steps < PF_TIMING_WINDOW) return 0;
    t->steps = 0;
    if (++t->window < PF_TIMING_WINDOWS) return 0;
    double off = t->sum[0] / t->n[0], on = t->sum[1] / t->n[1];
    t->mean[0] = off;
    t->mean[1] = on;
    t->choice = !(off < on * 0.97);
    t->last = t->choice;
    t->rounds++;
    t->hold = PF_TIMING_HOLD;
    t->window = 0;
    t->sum[0] = t->sum[1] = 0;
    t->n[0] = t->n[1] = 0;
    return 1;
}
