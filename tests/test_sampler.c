/* test_sampler.c - src/text/sampler.c: greedy is the first maximum, a seed
 * repeats its draws, the draws follow softmax(logits / T), top-k and top-p
 * keep exactly the ids they should, and the allocation-free nucleus order
 * equals a plain sort's. */
#include "harness.h"
#include "sampler.h"
#include "util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static void test_greedy_and_seeds(void)
{
    float lg[6] = {0.5f, 2.0f, 2.0f, -1.0f, 1.5f, 0.0f};
    sampler s;
    sampler_init(&s, 6, 0, 1, 0, 7);
    TCHECK(sampler_next(&s, lg) == 1); /* ties: the first maximum */
    sampler_reset(&s, 0.9, 0.95, 0, 123);
    int32_t a[64], b[64];
    for (int i = 0; i < 64; i++) a[i] = sampler_next(&s, lg);
    sampler_reset(&s, 0.9, 0.95, 0, 123);
    for (int i = 0; i < 64; i++) b[i] = sampler_next(&s, lg);
    TCHECK(!memcmp(a, b, sizeof a));
    sampler_reset(&s, 0.9, 0.95, 0, 124);
    int differ = 0;
    for (int i = 0; i < 64; i++) differ += sampler_next(&s, lg) != a[i];
    TCHECK(differ > 0);
    /* top_k = 1 is greedy at any temperature */
    sampler_reset(&s, 5.0, 1, 1, 9);
    for (int i = 0; i < 32; i++) TCHECK(sampler_next(&s, lg) == 1);
    sampler_free(&s);
}

static void test_distribution(void)
{
    float lg[3] = {(float)log(0.5), (float)log(0.3), (float)log(0.2)};
    sampler s;
    sampler_init(&s, 3, 1.0, 1, 0, 42);
    int n[3] = {0};
    const int N = 40000;
    for (int i = 0; i < N; i++) n[sampler_next(&s, lg)]++;
    for (int i = 0; i < 3; i++) TCHECKF(fabs((double)n[i] / N - exp(lg[i])) < 0.01, "id %d: %d of %d", i, n[i], N);
    /* top_p 0.5: the nucleus is id 0 alone; 0.75: ids 0 and 1 */
    sampler_reset(&s, 1.0, 0.5, 0, 1);
    for (int i = 0; i < 2000; i++) TCHECK(sampler_next(&s, lg) == 0);
    sampler_reset(&s, 1.0, 0.75, 0, 1);
    int seen[3] = {0};
    for (int i = 0; i < 4000; i++) seen[sampler_next(&s, lg)]++;
    TCHECK(seen[0] && seen[1] && !seen[2]);
    TCHECKF(fabs((double)seen[0] / 4000 - 0.625) < 0.03, "%d", seen[0]);
    /* top_k 2 renormalizes over ids 0 and 1 */
    sampler_reset(&s, 1.0, 1, 2, 3);
    memset(seen, 0, sizeof seen);
    for (int i = 0; i < 4000; i++) seen[sampler_next(&s, lg)]++;
    TCHECK(!seen[2] && fabs((double)seen[0] / 4000 - 0.625) < 0.03);
    sampler_free(&s);
}

/* Speculative verification (sampler_verify) against a drafted id draws from
 * the same distribution as sampler_next, for a likely and an unlikely draft,
 * with and without a nucleus / top-k cut (a draft outside it is never
 * accepted); greedy accepts exactly the argmax. */
static void test_verify_distribution(void)
{
    float lg[4] = {(float)log(0.4), (float)log(0.3), (float)log(0.2), (float)log(0.1)};
    struct { double top_p; int top_k; double want[4]; } cases[] = {
        {1, 0, {0.4, 0.3, 0.2, 0.1}},
        {0.75, 0, {0.4 / 0.9, 0.3 / 0.9, 0.2 / 0.9, 0}},  /* nucleus: ids 0, 1, 2 */
        {1, 2, {4.0 / 7, 3.0 / 7, 0, 0}},
    };
    const int N = 60000;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
        for (int draft = 0; draft < 4; draft += 3) {
            sampler s;
            sampler_init(&s, 4, 1.0, cases[c].top_p, cases[c].top_k, 7 + c * 10 + (uint64_t)draft);
            int n[4] = {0}, acc = 0;
            for (int i = 0; i < N; i++) {
                int ok = 0;
                int32_t x = sampler_verify(&s, lg, draft, &ok);
                n[x]++;
                acc += ok;
                if (ok && x != draft) t_fail(__FILE__, __LINE__, "accepted but returned %d", x);
            }
            for (int i = 0; i < 4; i++)
                TCHECKF(fabs((double)n[i] / N - cases[c].want[i]) < 0.01, "case %zu draft %d: id %d %d of %d", c, draft,
                        i, n[i], N);
            TCHECKF(fabs((double)acc / N - cases[c].want[draft]) < 0.01, "case %zu draft %d accepted %d of %d", c, draft,
                    acc, N);
            sampler_free(&s);
        }
    sampler s;
    sampler_init(&s, 4, 0, 1, 0, 1);
    int ok = 1;
    TCHECK(sampler_verify(&s, lg, 2, &ok) == 0 && !ok);
    TCHECK(sampler_verify(&s, lg, 0, &ok) == 0 && ok);
    sampler_free(&s);
}

static int cmp_ref(const void *a, const void *b)
{
    const sampler_pair *x = a, *y = b;
    if (x->p != y->p) return x->p > y->p ? -1 : 1;
    return x->id - y->id;
}

/* The nucleus of a large vocabulary with many ties equals the one a qsort
 * order gives (draw by draw). */
static void test_nucleus_order(void)
{
    enum { V = 5000 };
    float *lg = malloc(V * sizeof *lg);
    uint64_t r = 99;
    for (int i = 0; i < V; i++) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        lg[i] = (float)((r >> 40) % 64) / 8.0f; /* many equal logits */
    }
    sampler s;
    sampler_init(&s, V, 0.7, 0.9, 0, 5);
    /* the reference: the same draw over a qsort order */
    double m = -INFINITY, sum = 0;
    for (int i = 0; i < V; i++) m = lg[i] > m ? lg[i] : m;
    sampler_pair *ref = malloc(V * sizeof *ref);
    for (int i = 0; i < V; i++) {
        ref[i] = (sampler_pair){exp(((double)lg[i] - m) / 0.7), i};
        sum += ref[i].p;
    }
    double *w = malloc(V * sizeof *w);
    for (int i = 0; i < V; i++) w[i] = ref[i].p;
    sum = 0;
    for (int i = 0; i < V; i++) sum += w[i];
    qsort(ref, V, sizeof *ref, cmp_ref);
    uint64_t rng = 5;
    for (int d = 0; d < 50; d++) {
        int32_t got = sampler_next(&s, lg);
        uint64_t z = (rng += 0x9E3779B97F4A7C15ull);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        z ^= z >> 31;
        double u = (double)(z >> 11) * 0x1.0p-53, acc = 0, cut = 0.9 * sum;
        int k = 0;
        while (k < V && acc < cut) acc += ref[k++].p;
        double t = u * acc, c = 0;
        int32_t want = ref[k - 1].id;
        for (int i = 0; i < k; i++) {
            c += ref[i].p;
            if (t < c) {
                want = ref[i].id;
                break;
            }
        }
        TCHECKF(got == want, "draw %d: %d vs %d", d, got, want);
    }
    /* and a draw allocates nothing */
    alloc_guard_enter();
    (void)sampler_next(&s, lg);
    alloc_guard_leave();
    sampler_free(&s);
    free(lg);
    free(ref);
    free(w);
}

static void test_logprob_helpers(void)
{
    float lg[5] = {1.0f, 3.0f, 3.0f, -2.0f, 0.5f};
    int top[3];
    TCHECK(sampler_top_ids(lg, 5, 3, top) == 3);
    TCHECK(top[0] == 1 && top[1] == 2 && top[2] == 0);
    double lse = sampler_logsumexp(lg, 5), s = 0;
    for (int i = 0; i < 5; i++) s += exp(lg[i] - lse);
    TCHECK(fabs(s - 1) < 1e-12);
}

static const test_case tests[] = {
    {"greedy_and_seeds", test_greedy_and_seeds},
    {"distribution", test_distribution},
    {"verify_distribution", test_verify_distribution},
    {"nucleus_order", test_nucleus_order},
    {"logprob_helpers", test_logprob_helpers},
};

int main(int argc, char **argv) { return test_main(tests, NTESTS(tests), argc, argv); }
