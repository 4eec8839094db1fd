/* test_prefetch.c - the prefetch timing controller (src/store/prefetch_timing.c)
 * on synthetic decode-step times: it keeps the prefetch where it pays and
 * turns it off where it costs, also when the times drift (a cache warming
 * up from cold, a disk getting slower) while it measures. */
#include "harness.h"
#include "prefetch_timing.h"

#include <math.h>
#include <string.h>

typedef struct {
    double on_ms, off_ms;     /* the true cost of a step with / without prefetch */
    double cold_ms, tau;      /* a warm-up trend: + cold_ms * exp(-step / tau) */
    double drift_ms;          /* a linear drift per 100 steps */
} scenario;

/* Runs steps; returns the share of decided rounds that chose "on". */
static double run(const scenario *sc, int steps, int *rounds)
{
    pf_timing t;
    pf_timing_init(&t);
    int on_votes = 0;
    uint32_t seed = 12345;
    *rounds = 0;
    for (int i = 0; i < steps; i++) {
        int a = pf_timing_active(&t);
        seed = seed * 1664525u + 1013904223u;
        double noise = ((double)(seed >> 8) / (double)(1u << 24) - 0.5) * 0.04; /* +-2 % */
        double ms = (a ? sc->on_ms : sc->off_ms) + sc->cold_ms * exp(-i / sc->tau) + sc->drift_ms * i / 100.0;
        if (pf_timing_step(&t, 1e-3 * ms * (1 + noise))) {
            (*rounds)++;
            on_votes += t.last;
        }
    }
    return *rounds ? (double)on_votes / *rounds : -1;
}

static void test_keeps_prefetch_that_pays(void)
{
    /* prefetch saves 10 % of a step, and the first steps run on a cold
     * cache (+20 ms fading over ~15 steps): the controller that always
     * measured "on" first blamed the cold start on it */
    scenario sc = {.on_ms = 9.0, .off_ms = 10.0, .cold_ms = 20.0, .tau = 15};
    int rounds;
    double share = run(&sc, 2000, &rounds);
    TCHECKF(rounds >= 5 && share == 1.0, "rounds %d, on in %.2f of them", rounds, share);
    /* a disk that gets slower while it measures */
    scenario dr = {.on_ms = 9.0, .off_ms = 10.0, .drift_ms = 3.0, .tau = 1};
    share = run(&dr, 2000, &rounds);
    TCHECKF(rounds >= 5 && share == 1.0, "drift: rounds %d, on in %.2f of them", rounds, share);
}

static void test_turns_off_prefetch_that_costs(void)
{
    scenario sc = {.on_ms = 11.5, .off_ms = 10.0, .cold_ms = 20.0, .tau = 15};
    int rounds;
    double share = run(&sc, 2000, &rounds);
    TCHECKF(rounds >= 5 && share == 0.0, "rounds %d, on in %.2f of them", rounds, share);
    scenario dr = {.on_ms = 11.5, .off_ms = 10.0, .drift_ms = -1.0, .tau = 1};
    share = run(&dr, 1000, &rounds);
    TCHECKF(rounds >= 2 && share == 0.0, "drift: rounds %d, on in %.2f of them", rounds, share);
}

static void test_no_difference_keeps_it_on(void)
{
    scenario sc = {.on_ms = 10.0, .off_ms = 10.0, .cold_ms = 5.0, .tau = 10};
    int rounds;
    double share = run(&sc, 2000, &rounds);
    TCHECKF(rounds >= 5 && share == 1.0, "rounds %d, on in %.2f of them", rounds, share);
}

/* Both arms are measured equally often, and a round's order is mirrored
 * in the next (ABBA, then BAAB). */
static void test_counterbalanced(void)
{
    pf_timing t;
    pf_timing_init(&t);
    int seq[2][PF_TIMING_WINDOWS], n_on = 0;
    for (int r = 0; r < 2; r++) {
        for (int w = 0; w < PF_TIMING_WINDOWS; w++) {
            seq[r][w] = pf_timing_active(&t);
            n_on += seq[r][w];
            for (int s = 0; s < PF_TIMING_WINDOW; s++) pf_timing_step(&t, 0.01);
        }
        for (int s = 0; s < PF_TIMING_HOLD; s++) pf_timing_step(&t, 0.01);
    }
    TCHECK(n_on == PF_TIMING_WINDOWS);
    for (int w = 0; w < PF_TIMING_WINDOWS; w++) TCHECK(seq[0][w] == !seq[1][w]);
    TCHECK(seq[0][0] == 1 && seq[0][1] == 0 && seq[0][2] == 0 && seq[0][3] == 1);
}

static const test_case tests[] = {
    {"keeps_prefetch_that_pays", test_keeps_prefetch_that_pays},
    {"turns_off_prefetch_that_costs", test_turns_off_prefetch_that_costs},
    {"no_difference_keeps_it_on", test_no_difference_keeps_it_on},
    {"counterbalanced", test_counterbalanced},
};

int main(int argc, char **argv) { return test_main(tests, NTESTS(tests), argc, argv); }
