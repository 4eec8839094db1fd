/* ab_timing.c - see ab_timing.h. */
#include "ab_timing.h"

#include <string.h>

void ab_timing_init(ab_timing *t, const ab_rule *rule)
{
    memset(t, 0, sizeof *t);
    t->rule = *rule;
    t->first = 1;
    t->last = -1;
}

/* ABBA ABBA from the round's first arm */
static int arm(const ab_timing *t)
{
    static const int flip[AB_WINDOWS] = {0, 1, 1, 0, 0, 1, 1, 0};
    return flip[t->window] ? !t->first : t->first;
}

int ab_timing_on(const ab_timing *t) { return t->hold ? t->choice : arm(t); }

int ab_timing_step(ab_timing *t, int units, double sec)
{
    if (units <= 0) return 0;
    if (t->hold) {
        t->hold = t->hold > (uint64_t)units ? t->hold - (uint64_t)units : 0;
        return 0;
    }
    int a = arm(t);
    t->sec[a] += sec;
    t->n[a] += (uint64_t)units;
    t->in_window += (uint64_t)units;
    if (t->in_window < t->rule.window) return 0;
    t->in_window = 0;
    if (++t->window < AB_WINDOWS) return 0;
    const ab_rule *r = &t->rule;
    double off = t->n[0] ? t->sec[0] / (double)t->n[0] : 0, on = t->n[1] ? t->sec[1] / (double)t->n[1] : 0;
    t->choice = !(off * r->off_scale < on * r->on_scale);
    t->mean[0] = off;
    t->mean[1] = on;
    /* the same answer again: measure less often */
    t->hold_len = !t->rounds                             ? r->hold_first
                  : t->choice == t->last && t->hold_len ? (t->hold_len * 2 < r->hold_max ? t->hold_len * 2 : r->hold_max)
                                                        : r->hold;
    t->last = t->choice;
    t->rounds++;
    t->hold = t->hold_len;
    t->window = 0;
    t->first = !t->first;
    memset(t->sec, 0, sizeof t->sec);
    memset(t->n, 0, sizeof t->n);
    return 1;
}
