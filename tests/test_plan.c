/* test_plan.c - --mem as a promise: the planner (pure), the plan of a model
 * from its config or headers alone (K3's own config included), peak RSS of
 * real runs against the budget, and the command line's option tables. */
#define _GNU_SOURCE
#include "harness.h"
#include "engine_impl.h"
#include "plan.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MiB (1ull << 20)
#define GiB (1ull << 30)

static plan_sizes k3ish(void)
{
    plan_sizes z = {.trunk_bytes = 800 * MiB, .embed_bytes = 40 * MiB, .vec_bytes = 2 * MiB,
                    .stream_buf_bytes = 40 * MiB, .expert_bytes = 3 * MiB, .slot_bytes = 3 * MiB + 8192,
                    .n_experts = 4000, .k = 8, .n_moe_layers = 20, .state_bytes = 30 * MiB,
                    .scratch_bytes = 10 * MiB, .reserve_bytes = 20 * MiB, .n_ctx = 4096, .max_batch = 32};
    return z;
}

/* Every plan that is accepted fits; every refusal is a budget below the
 * cheapest configuration, and its message carries the numbers. */
static void test_plan_never_over_budget(void)
{
    plan_sizes z = k3ish();
    int ok = 0, refused = 0;
    for (int ts = -1; ts <= 1; ts++)
        for (uint64_t b = 16 * MiB; b < 64 * GiB; b = b * 5 / 4) {
            for (int forced = 0; forced < 3; forced++) {
                plan_request rq = {.budget = b, .budget_given = 1, .trunk_stream = ts,
                                   .expert_cache_bytes = forced == 0 ? 0 : forced == 1 ? 100 * MiB : 2 * GiB,
                                   .tlfu = forced == 2};
                df_plan p;
                df_error err = {0};
                if (plan_compute(&z, &rq, &p, &err) == 0) {
                    ok++;
                    TCHECKF(p.used <= b, "budget %llu: used %llu", (unsigned long long)b, (unsigned long long)p.used);
                    TCHECK(p.n_slots + p.n_transient >= (uint64_t)z.k);
                    if (rq.expert_cache_bytes) TCHECK(p.cache_bytes <= rq.expert_cache_bytes);
                    if (ts < 0) TCHECK(p.trunk_mode == DF_TRUNK_RESIDENT);
                    if (ts > 0) TCHECK(p.trunk_mode == DF_TRUNK_STREAMED);
                } else {
                    refused++;
                    TCHECK(err.code == DF_ERR_NOMEM);
                    TCHECKF(p.used > b, "refused at %llu although the minimum %llu fits", (unsigned long long)b,
                            (unsigned long long)p.used);
                    TCHECKF(strstr(err.msg, "needs") && strstr(err.msg, "GiB"), "message without numbers: %s",
                            err.msg);
                }
            }
        }
    TCHECK(ok > 50 && refused > 10);
}

static void test_plan_modes(void)
{
    plan_sizes z = k3ish();
    df_plan p;
    df_error err = {0};
    /* everything fits: resident trunk, cache capped at every expert */
    plan_request big = {.budget = 64 * GiB, .budget_given = 1};
    TCHECK(plan_compute(&z, &big, &p, &err) == 0);
    TCHECK(p.trunk_mode == DF_TRUNK_RESIDENT && p.n_slots == z.n_experts && p.trunk_read_per_token == 0);
    /* the trunk does not fit beside the minimum: streamed, re-read each token */
    plan_request mid = {.budget = 300 * MiB, .budget_given = 1};
    TCHECK(plan_compute(&z, &mid, &p, &err) == 0);
    TCHECK(p.trunk_mode == DF_TRUNK_STREAMED && p.trunk_used == 2 * z.stream_buf_bytes);
    TCHECK(p.trunk_read_per_token == z.trunk_bytes);
    /* never streamed: refused, naming the option */
    plan_request off = {.budget = 300 * MiB, .budget_given = 1, .trunk_stream = -1};
    memset(&err, 0, sizeof err);
    TCHECK(plan_compute(&z, &off, &p, &err) != 0 && strstr(err.msg, "--trunk-stream"));
    /* --expert-cache larger than what is left: refused, naming the option */
    plan_request cache = {.budget = 1 * GiB, .budget_given = 1, .expert_cache_bytes = 900 * MiB};
    memset(&err, 0, sizeof err);
    TCHECK(plan_compute(&z, &cache, &p, &err) != 0 && strstr(err.msg, "--expert-cache"));
    /* a context too large for the budget names --ctx */
    plan_sizes wide = z;
    wide.state_bytes = 4 * GiB;
    memset(&err, 0, sizeof err);
    TCHECK(plan_compute(&wide, &mid, &p, &err) != 0 && strstr(err.msg, "--ctx"));
}

/* Sizes from a config.json alone equal the sizes from the headers. */
static void same_sizes(const char *dir)
{
    char cfg[600];
    snprintf(cfg, sizeof cfg, "%s/config.json", dir);
    df_plan_opts o = {.mem_budget = 4 * GiB, .n_threads = 2};
    df_plan a, b;
    df_model_info ia, ib;
    df_error err = {0};
    TCHECKF(df_plan_model(dir, &o, &a, &ia, &err) == 0, "%s: %s", dir, err.msg);
    TCHECKF(df_plan_model(cfg, &o, &b, &ib, &err) == 0, "%s: %s", cfg, err.msg);
    TCHECKF(a.trunk_bytes == b.trunk_bytes, "trunk %llu vs %llu", (unsigned long long)a.trunk_bytes,
            (unsigned long long)b.trunk_bytes);
    TCHECK(a.embed_bytes == b.embed_bytes);
    TCHECK(a.vec_bytes == b.vec_bytes);
    TCHECK(a.state_bytes == b.state_bytes && a.scratch_bytes == b.scratch_bytes);
    TCHECK(a.expert_bytes == b.expert_bytes && a.n_experts == b.n_experts && a.n_slots == b.n_slots);
    TCHECK(ia.n_layers == ib.n_layers && ia.vocab == ib.vocab && ia.n_experts == ib.n_experts);
}

static void test_plan_config_equals_headers(void)
{
    char dir[512];
    snprintf(dir, sizeof dir, "%s/k3-tiny-a/checkpoint", testdata_dir());
    same_sizes(dir);
    if (gen_model("plan_small", "--preset small --seed 3", dir, sizeof dir) == 0) same_sizes(dir);
}

/* K3 itself, from the spec's config: the trunk counted independently here
 * from the tensor roster (spec 3.1), BF16. */
/* K3's streaming minimum: one token's 16 experts in each of 92 MoE layers */
static uint64_t plan_k3_min_slots(void) { return 16 * 92; }

static void test_plan_k3_config(void)
{
    char cfg[512];
    snprintf(cfg, sizeof cfg, "%s/k3/config.json", testdata_dir());
    const uint64_t h = 7168, V = 163840, P = 96 * 128, Dk = 128, Hk = 96, Hm = 96, Rq = 1536, Rkv = 512, dn = 128,
                   dr = 64, dv = 128, Dff = 33792, E = 896, Ns = 2, I = 3072, Lt = 3584;
    uint64_t kda = 4 * P * h + Dk * h + P * Dk + Hk * h + h * P;
    uint64_t mla = Rq * h + Hm * (dn + dr) * Rq + (Rkv + dr) * h + Hm * (dn + dv) * Rkv + Hm * dv * h + h * Hm * dv;
    uint64_t moe = E * h + Lt * h + h * Lt + 3 * Ns * I * h;
    uint64_t trunk = 2 * (69 * kda + 24 * mla + 3 * Dff * h + 92 * moe + V * h);
    uint64_t expert = 3 * I * Lt / 2 + 3 * I * Lt / 32;
    TCHECK(expert == 17547264); /* the spec's figure */
    static const uint64_t mem[] = {24, 64, 128, 512};
    for (int i = 0; i < 4; i++) {
        df_plan_opts o = {.mem_budget = mem[i] * GiB, .n_threads = 16};
        df_plan p;
        df_error err = {0};
        TCHECKF(df_plan_model(cfg, &o, &p, NULL, &err) == 0, "%llu GiB: %s", (unsigned long long)mem[i], err.msg);
        TCHECKF(p.trunk_bytes == trunk, "trunk %llu, expected %llu", (unsigned long long)p.trunk_bytes,
                (unsigned long long)trunk);
        TCHECK(p.embed_bytes == 2 * V * h);
        TCHECK(p.expert_bytes == expert && p.n_experts == 92 * E);
        TCHECK(p.expert_read_cold == 92ull * 16 * expert); /* ~25.8 GB a token with nothing cached */
        TCHECK(p.used <= p.budget);
        /* ~105 GiB of trunk: streamed below it (partly resident: as many
         * layers as lower a token's reads), resident above */
        TCHECK(p.trunk_mode == (mem[i] < 128 ? DF_TRUNK_STREAMED : DF_TRUNK_RESIDENT));
        TCHECK(p.trunk_read_per_token == (mem[i] < 128 ? trunk - p.trunk_resident_bytes : 0));
        if (mem[i] < 128) {
            TCHECKF(p.trunk_resident_n > 0 && p.trunk_layers == 94 &&
                        p.trunk_read_per_token + p.expert_read_est < p.alt_stream_all_read,
                    "%llu GiB: %d of %d layers resident, %.2f + %.2f GiB a token vs %.2f streaming it all",
                    (unsigned long long)mem[i], p.trunk_resident_n, p.trunk_layers, p.trunk_read_per_token / 1073741824.0,
                    p.expert_read_est / 1073741824.0, p.alt_stream_all_read / 1073741824.0);
            uint64_t n = 0;
            for (int L = 0; L < p.trunk_layers; L++) n += p.trunk_resident_layer[L];
            TCHECK(n == (uint64_t)p.trunk_resident_n);
        }
        /* the figure: 64 GiB streaming the whole trunk reads 103.5 GiB of it a token beside
         * a 57.75 GiB cache; partial residency keeps what pays and the cache its streaming minimum */
        if (mem[i] == 64)
            TCHECKF(p.trunk_resident_bytes > 30 * GiB && p.n_slots + p.n_transient >= plan_k3_min_slots() &&
                        p.alt_stream_all_cache > 57 * GiB,
                    "64 GiB: %.2f GiB resident, %llu slots, whole-stream cache %.2f GiB",
                    p.trunk_resident_bytes / 1073741824.0, (unsigned long long)(p.n_slots + p.n_transient),
                    p.alt_stream_all_cache / 1073741824.0);
    }
    /* a prompt chunk's working rows: a layer's attention, dense and shared
     * work runs in blocks of 256 rows and its routed experts in batches of
     * gathered rows, so a position holds only its residual stream, anchors,
     * routing and routed-expert outputs: ~0.48 MiB at K3's size (1.34 MiB
     * with every buffer per position, ~2.2 with Dff-wide buffers and every
     * gathered row held at once) */
    uint64_t sc[2];
    for (int i = 0; i < 2; i++) {
        df_plan_opts o = {.mem_budget = 512 * GiB, .n_threads = 16, .max_batch = 512 << i};
        df_plan q;
        df_error e = {0};
        TCHECKF(df_plan_model(cfg, &o, &q, NULL, &e) == 0, "%s", e.msg);
        sc[i] = q.scratch_bytes;
    }
    double per_pos = (double)(sc[1] - sc[0]) / 512.0;
    fprintf(stderr, "    K3 prompt chunk: %.3f MiB of scratch per position\n", per_pos / (1 << 20));
    TCHECKF(per_pos < 0.55 * (1 << 20) && per_pos > 0.3 * (1 << 20), "%.3f MiB per position", per_pos / (1 << 20));
    /* below two layer buffers + one token's experts + the context: refused */
    df_plan_opts tiny = {.mem_budget = 3 * GiB, .n_threads = 16};
    df_plan p;
    df_error err = {0};
    TCHECK(df_plan_model(cfg, &tiny, &p, NULL, &err) != 0 && err.code == DF_ERR_NOMEM);
}

/* serve's default context (plan_serve_ctx) on k3ish sizes whose session
 * grows with the context like K3's MLA cache: 64K where it fits, else the
 * largest power of two above 4K that leaves the expert cache its streaming
 * minimum (k x MoE layers = 160 slots here), else 4K; never a context that
 * takes the cache below the minimum or streams a trunk 4K keeps resident. */
typedef struct { plan_sizes base; uint64_t per_token; } ctx_model;

static int ctx_sizes(void *arg, int n_ctx, plan_sizes *sz, df_error *err)
{
    (void)err;
    const ctx_model *m = arg;
    *sz = m->base;
    sz->n_ctx = n_ctx;
    sz->state_bytes = m->base.state_bytes + (uint64_t)n_ctx * m->per_token;
    return 0;
}

static void test_plan_serve_ctx_rule(void)
{
    ctx_model m = {k3ish(), 16 * 1024}; /* 16 KiB a token: 1 GiB at 64K */
    m.base.state_bytes = 30 * MiB;
    plan_sizes z = m.base;
    const uint64_t min = plan_stream_min_slots(&z);
    TCHECK(min == 160);
    df_plan p;
    df_error err = {0};
    char why[320];
    /* plenty: 64K beside the whole cache */
    plan_request big = {.budget = 64 * GiB, .budget_given = 1};
    TCHECK(plan_serve_ctx(ctx_sizes, &m, 0, &big, &p, &err) == 0);
    df_plan_ctx_reason(&p, why, sizeof why);
    TCHECKF(p.n_ctx == 65536 && p.ctx_rule == DF_CTX_SERVE_FITS, "ctx %d rule %d", p.n_ctx, p.ctx_rule);
    TCHECKF(strstr(why, "default for serve: 64K fits"), "%s", why);
    /* the model's maximum caps it */
    TCHECK(plan_serve_ctx(ctx_sizes, &m, 20000, &big, &p, &err) == 0);
    df_plan_ctx_reason(&p, why, sizeof why);
    TCHECKF(p.n_ctx == 20000 && strstr(why, "20000 (the model's maximum) fits"), "%d: %s", p.n_ctx, why);
    /* a budget sweep: each answer is the largest candidate that passes */
    int seen[4] = {0};
    for (uint64_t b = 300 * MiB; b < 4 * GiB; b += 16 * MiB) {
        plan_request rq = {.budget = b, .budget_given = 1};
        memset(&err, 0, sizeof err);
        if (plan_serve_ctx(ctx_sizes, &m, 0, &rq, &p, &err)) {
            TCHECK(err.code == DF_ERR_NOMEM);
            continue;
        }
        TCHECK(p.used <= b && p.stream_min_slots == min && p.ctx_want == 65536);
        TCHECKF(p.n_ctx >= 4096 && p.n_ctx <= 65536 && (p.n_ctx & (p.n_ctx - 1)) == 0, "ctx %d", p.n_ctx);
        df_plan_ctx_reason(&p, why, sizeof why);
        seen[p.ctx_rule]++;
        if (p.ctx_rule != DF_CTX_SERVE_FLOOR) TCHECKF(p.n_slots + p.n_transient >= min, "%d: %s", p.n_ctx, why);
        if (p.ctx_rule == DF_CTX_SERVE_FITS) TCHECK(p.n_ctx == 65536);
        else TCHECKF(strstr(why, "default for serve: 64K ") && strstr(why, "--mem"), "%s", why);
        /* the same plan as plan_compute at that context, and the next power
         * of two up takes the cache below the minimum or streams the trunk */
        plan_sizes at;
        df_plan q;
        ctx_sizes(&m, p.n_ctx, &at, NULL);
        TCHECK(plan_compute(&at, &rq, &q, NULL) == 0 && q.n_slots == p.n_slots && q.trunk_mode == p.trunk_mode);
        if (p.n_ctx < 65536) {
            ctx_sizes(&m, p.n_ctx * 2, &at, NULL);
            int fits = plan_compute(&at, &rq, &q, NULL) == 0;
            TCHECKF(!fits || q.n_slots + q.n_transient < min || q.trunk_mode != p.trunk_mode ||
                        p.ctx_rule == DF_CTX_SERVE_FLOOR,
                    "budget %llu: %d chosen but %d passes", (unsigned long long)b, p.n_ctx, p.n_ctx * 2);
        }
    }
    TCHECKF(seen[DF_CTX_SERVE_FITS] && seen[DF_CTX_SERVE_SMALLER] && seen[DF_CTX_SERVE_FLOOR], "fits %d smaller %d floor %d",
            seen[DF_CTX_SERVE_FITS], seen[DF_CTX_SERVE_SMALLER], seen[DF_CTX_SERVE_FLOOR]);
    /* with the trunk streamed, a budget that leaves the cache 100 slots at
     * 64K (below 160) takes 16K or 32K and says why */
    plan_request mid = {.budget = (uint64_t)(z.state_bytes + z.scratch_bytes + z.reserve_bytes + z.vec_bytes +
                                             2 * z.stream_buf_bytes) + 65536ull * m.per_token + 100 * z.slot_bytes,
                        .budget_given = 1, .trunk_stream = 1};
    TCHECK(plan_serve_ctx(ctx_sizes, &m, 0, &mid, &p, &err) == 0);
    df_plan_ctx_reason(&p, why, sizeof why);
    TCHECKF(p.ctx_rule == DF_CTX_SERVE_SMALLER && p.n_ctx < 65536 && p.n_slots >= min, "ctx %d: %s", p.n_ctx, why);
    TCHECKF(strstr(why, "below its streaming minimum (160 experts"), "%s", why);
    /* --expert-cache fixes the cache: the context has only to fit */
    plan_request forced = mid;
    forced.expert_cache_bytes = 20 * z.slot_bytes;
    TCHECK(plan_serve_ctx(ctx_sizes, &m, 0, &forced, &p, &err) == 0 && p.n_ctx == 65536);
}

/* The rule on real configs, from the config alone (df_plan_model with
 * .serve): K3 at a few machine sizes, and the bundled model. */
static void test_plan_serve_ctx_models(void)
{
    char cfg[512], mini[512];
    snprintf(cfg, sizeof cfg, "%s/k3/config.json", testdata_dir());
    snprintf(mini, sizeof mini, "%s/k3-tiny-a/checkpoint", testdata_dir());
    const struct { const char *path; uint64_t mem; int ctx; const char *why; } c[] = {
        /* K3: the streaming minimum is 16 x 92 = 1472 experts (24.06 GiB) */
        /* at 24 GiB the whole-stream cache is below it already, so partial residency takes that
         * memory (a trunk GiB saves a GiB a token); the context comes before residency, and the
         * reason says what 64K cost */
        {cfg, 24 * GiB, 65536, "64K fits beside the expert cache (it keeps"},
        {cfg, 128 * GiB, 32768, "and 64K would take more than an eighth of it"},
        {cfg, 64 * GiB, 65536, "64K fits beside the expert cache"},
        {cfg, 512 * GiB, 65536, "64K fits"},
        /* the small model: 64K where the budget holds it, halved below */
        {mini, 1 * GiB, 65536, "64K fits"},
        {mini, 50 * MiB, 16384, "64K does not fit --mem 50 MiB"},
    };
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        df_plan_opts o = {.mem_budget = c[i].mem, .n_threads = 16, .serve = 1};
        df_plan p;
        df_error err = {0};
        TCHECKF(df_plan_model(c[i].path, &o, &p, NULL, &err) == 0, "%s: %s", c[i].path, err.msg);
        char why[320];
        df_plan_ctx_reason(&p, why, sizeof why);
        fprintf(stderr, "    serve at --mem %.2f GiB: context %d (%s)\n", (double)c[i].mem / GiB, p.n_ctx, why);
        TCHECKF(p.n_ctx == c[i].ctx && strstr(why, c[i].why), "%s at %llu: %d, %s", c[i].path,
                (unsigned long long)c[i].mem, p.n_ctx, why);
        if (p.ctx_rule != DF_CTX_SERVE_FLOOR)
            TCHECK(p.n_slots + p.n_transient >= p.stream_min_slots || strstr(why, "more than an eighth of it") ||
                   (p.trunk_resident_n > 0 && p.alt_stream_all_cache < p.stream_min_slots * p.slot_bytes));
        /* --ctx wins, and without .serve the default stays 4096 */
        o.n_ctx = 8192;
        TCHECK(df_plan_model(c[i].path, &o, &p, NULL, &err) == 0 && p.n_ctx == 8192 && p.ctx_rule == DF_CTX_GIVEN);
        o.n_ctx = 0;
        o.serve = 0;
        TCHECK(df_plan_model(c[i].path, &o, &p, NULL, &err) == 0 && p.n_ctx == 4096);
    }
    /* --parallel N counts N sessions: K3 at 64 GiB keeps 64K for 4 (15 GiB
     * of MLA cache), not for 12 */
    df_plan_opts par = {.mem_budget = 64 * GiB, .n_threads = 16, .serve = 1, .n_sessions = 4};
    df_plan p;
    df_error err = {0};
    TCHECK(df_plan_model(cfg, &par, &p, NULL, &err) == 0 && p.n_ctx == 65536);
    par.n_sessions = 12;
    TCHECK(df_plan_model(cfg, &par, &p, NULL, &err) == 0);
    TCHECKF(p.n_ctx < 65536 && p.n_slots >= p.stream_min_slots, "12 sessions: %d", p.n_ctx);
    /* the model's maximum context from its config (max_position_embeddings) */
    FILE *f = fopen(cfg, "rb");
    static char text[1 << 16];
    size_t n = f ? fread(text, 1, sizeof text - 1, f) : 0;
    if (f) fclose(f);
    text[n] = 0;
    char *at = strstr(text, "\"max_position_embeddings\": 1048576");
    TCHECK(at != NULL);
    if (!at) return;
    memcpy(at + 27, "  32768", 7);
    char small[600];
    snprintf(small, sizeof small, "%s/k3-ctx32k.json", test_scratch());
    f = fopen(small, "wb");
    TCHECK(f && fwrite(text, 1, n, f) == n);
    if (f) fclose(f);
    df_plan_opts o = {.mem_budget = 512 * GiB, .n_threads = 16, .serve = 1};
    char why[320];
    TCHECKF(df_plan_model(small, &o, &p, NULL, &err) == 0, "%s", err.msg);
    df_plan_ctx_reason(&p, why, sizeof why);
    TCHECKF(p.n_ctx == 32768 && strstr(why, "32K (the model's maximum) fits"), "%d: %s", p.n_ctx, why);
}

/* ---------------------------------------------------------------- CLI */

static char out_[1 << 16], err_[1 << 16];

static int cli(const char *const *args)
{
    return t_run(args, out_, sizeof out_, err_, sizeof err_);
}

static long peak_kb(void)
{
    const char *p = strstr(out_, "\"peak_rss_kb\":");
    return p ? strtol(p + 14, NULL, 10) : -1;
}

#define DF build_bin("deltafin")

static void check_peak(const char *what, const char *mem_s, uint64_t mem)
{
    long kb = peak_kb();
    fprintf(stderr, "    %s: peak RSS %.1f MiB with --mem %s\n", what, kb / 1024.0, mem_s);
    TCHECKF(kb > 0 && (uint64_t)kb * 1024 <= mem + mem / 20, "%s: peak %ld kB over --mem %s + 5%%", what, kb, mem_s);
}

/* The audit's three ways past --mem, and a long generation. */
static void test_cli_mem_is_a_promise(void)
{
    if (getenv("DF_SANITIZED")) TSKIP("sanitizer runtimes inflate RSS");
    char tiny[512], dir[512];
    snprintf(tiny, sizeof tiny, "%s/k3-tiny-a/checkpoint", testdata_dir());
    /* 1. the context is planned before anything is allocated: --ctx caps it */
    const char *a1[] = {DF, "run", "--model", tiny, "--prompt-ids", "1,2,3", "--ctx", "64", "--max-new", "1000000",
                        "--mem", "40M", "--bench-json", NULL};
    TCHECKF(cli(a1) == 0, "%s", err_);
    check_peak("--ctx 64 --max-new 1000000", "40M", 40 * MiB);
    TCHECK(strstr(err_, "context is full") != NULL);
    TCHECK(strstr(err_, "plan: --mem") != NULL); /* the one-line plan is always shown */
    /* a draft model takes its share out of the same budget */
    char self[600];
    snprintf(self, sizeof self, "model:%s", tiny);
    const char *a1d[] = {DF, "run", "--model", tiny, "--prompt-ids", "1,2,3", "--ctx", "200", "--max-new", "150",
                         "--mem", "48M", "--draft", self, "--draft-k", "4", "--draft-mem", "22M", "--bench-json", NULL};
    TCHECKF(cli(a1d) == 0, "%s", err_);
    check_peak("--draft model:(itself), --draft-mem 22M", "48M", 48 * MiB);
    /* ... and drafts in it (a --ctx under the draft model's 256-id window
     * used to turn its proposals off): the model drafting for itself is
     * right every time */
    const char *dp = strstr(out_, "\"draft_proposed\":"), *da = strstr(out_, "\"draft_accepted\":");
    long n_prop = dp ? strtol(dp + 17, NULL, 10) : -1, n_acc = da ? strtol(da + 17, NULL, 10) : -1;
    TCHECKF(n_prop > 0 && n_acc == n_prop, "a draft model at --ctx 200: %ld proposed, %ld accepted", n_prop, n_acc);
    const char *a1e[] = {DF, "run", "--model", tiny, "--prompt-ids", "1,2,3", "--ctx", "200", "--mem", "40M",
                         "--draft", self, "--draft-mem", "1M", NULL};
    TCHECKF(cli(a1e) == 1 && strstr(err_, "--draft model:"), "a draft model in 1M: %s", err_);
    /* without --ctx the context is prompt + --max-new: refused with the numbers */
    const char *a2[] = {DF, "run", "--model", tiny, "--prompt-ids", "1,2,3", "--max-new", "1000000", "--mem", "40M",
                        NULL};
    TCHECK(cli(a2) == 1);
    TCHECKF(strstr(err_, "1000004") && strstr(err_, "needs") && strstr(err_, "--ctx"), "%s", err_);

    if (gen_model("plan_rss", "--preset small --set num_experts=512 --seed 9", dir, sizeof dir)) return;
    /* 2. a budget that holds neither the trunk nor its two stream buffers is
     * refused (it used to be paged by the kernel, outside the budget) */
    const char *a3[] = {DF, "run", "--model", dir, "--prompt-ids", "1,2,3", "--mem", "20M", "--ctx", "64", NULL};
    TCHECK(cli(a3) == 1 && strstr(err_, "cannot hold this model"));
    const char *a4[] = {DF, "run", "--model", dir, "--prompt-ids", "1,2,3", "--mem", "30M", "--ctx", "64",
                        "--trunk-stream", "off", NULL};
    TCHECK(cli(a4) == 1 && strstr(err_, "--trunk-stream"));
    /* 3. --expert-cache is inside --mem */
    const char *a5[] = {DF, "run", "--model", dir, "--prompt-ids", "1,2,3", "--mem", "48M", "--expert-cache", "300M",
                        "--ctx", "64", NULL};
    TCHECK(cli(a5) == 1 && strstr(err_, "--expert-cache"));
    const char *a6[] = {DF, "run", "--model", dir, "--prompt-ids", "1,2,3,4,5,6,7,8", "--mem", "48M",
                        "--expert-cache", "6M", "--ctx", "64", "--batch", "8", "--threads", "2", "--max-new", "24",
                        "--bench-json", NULL};
    TCHECKF(cli(a6) == 0, "%s", err_);
    check_peak("--expert-cache 6M", "48M", 48 * MiB);
    /* a long generation with the trunk streamed (embedding rows read, not mapped) */
    const char *a7[] = {DF, "run", "--model", dir, "--prompt-ids", "1,2,3,4,5,6,7,8", "--mem", "30M", "--ctx", "600",
                        "--batch", "8", "--threads", "2", "--max-new", "500", "--bench-json", NULL};
    TCHECKF(cli(a7) == 0, "%s", err_);
    check_peak("500 tokens, trunk streamed", "30M", 30 * MiB);
    /* a streamed trunk reads embedding rows instead of mapping them: a
     * prompt touching every page of a 16 MiB embedding must not grow the
     * resident set by it (mapped, this run peaks ~16 MiB higher) */
    char bigv[512];
    if (gen_model("plan_bigvocab", "--preset small --set vocab_size=32768 --set num_experts=128", bigv, sizeof bigv))
        return;
    static char ids[4096 * 8];
    size_t k = 0;
    for (int i = 0; i < 4096; i++) k += (size_t)snprintf(ids + k, sizeof ids - k, "%s%d", i ? "," : "", i * 8);
    const char *a8[] = {DF, "run", "--model", bigv, "--prompt-ids", ids, "--max-new", "1", "--ctx", "4200", "--mem",
                        "60M", "--trunk-stream", "on", "--threads", "2", "--bench-json", NULL};
    TCHECKF(cli(a8) == 0, "%s", err_);
    check_peak("every embedding row touched, trunk streamed", "60M", 60 * MiB);
}

/* info and plan read no weight: checked with strace (every read of a
 * shard is a pread of its header or nothing). */
/* One rule decides when the trunk stays resident, and plan and doctor
 * print it: the plan's resident_from is exactly the smallest --mem at which
 * it is resident (one byte less streams it), and doctor's advice names the
 * same number (it used to add margins of its own: 123.1 GiB where the plan
 * went resident at 108). */
static void test_resident_threshold_one_rule(void)
{
    char dir[512];
    if (gen_model("plan_rss", "--preset small --set num_experts=512 --seed 9", dir, sizeof dir)) return;
    const char *a[] = {DF, "plan", "--model", dir, "--mem", "30M", "--json", NULL};
    TCHECKF(cli(a) == 0 || strstr(out_, "resident_from"), "%s", err_);
    const char *r = strstr(out_, "\"resident_from\":");
    unsigned long long R = r ? strtoull(r + 16, NULL, 10) : 0;
    TCHECKF(R > 30ull * MiB, "resident_from %llu", R);
    char at[32], below[32];
    snprintf(at, sizeof at, "%llu", R);
    snprintf(below, sizeof below, "%llu", R - 1);
    const char *b[] = {DF, "plan", "--model", dir, "--mem", at, "--json", NULL};
    TCHECKF(cli(b) == 0 && strstr(out_, "\"trunk\":\"resident\""), "at %s: %s", at, out_);
    const char *c[] = {DF, "plan", "--model", dir, "--mem", below, "--json", NULL};
    /* one byte less: not resident (streamed, most of it kept as partial residency) */
    TCHECKF(cli(c) == 0 && (strstr(out_, "\"trunk\":\"streamed\"") || strstr(out_, "\"trunk\":\"partial\"")), "at %s: %s",
            below, out_);
    char gib[32];
    snprintf(gib, sizeof gib, "%.3f GiB", (double)R / (double)(1ull << 30));
    const char *d[] = {DF, "plan", "--model", dir, "--mem", "30M", NULL};
    cli(d);
    TCHECKF(strstr(out_, gib) || strstr(err_, gib), "plan does not print %s: %s", gib, out_);
    const char *e[] = {DF, "doctor", "--model", dir, "--mem", "30M", "--seconds", "1", NULL};
    cli(e);
    TCHECKF(strstr(out_, gib) && strstr(out_, "keeps it in memory"), "doctor does not say %s: %s", gib, out_);
}

static void test_cli_plan_reads_no_weights(void)
{
    /* everything resident: the auto chunk is chosen for speed (256), not 32 */
    {
        char t[512];
        snprintf(t, sizeof t, "%s/k3-tiny-a/checkpoint", testdata_dir());
        const char *a[] = {DF, "plan", "--model", t, "--mem", "1G", NULL};
        TCHECKF(cli(a) == 0 && (strstr(out_, "prompt chunk 256") || strstr(err_, "prompt chunk 256")),
                "resident plan's chunk: %s%s", out_, err_);
    }
    char tiny[512];
    snprintf(tiny, sizeof tiny, "%s/k3-tiny-a/checkpoint", testdata_dir());
    const char *a[] = {DF, "plan", "--model", tiny, "--mem", "1G", NULL};
    TCHECKF(cli(a) == 0, "%s", err_);
    TCHECK(strstr(out_, "memory plan for --mem 1.00 GiB") && strstr(out_, "expert cache"));
    const char *st = "/usr/bin/strace";
    if (access(st, X_OK) != 0) TSKIP("strace is not installed: cannot check which bytes info reads");
    char log[600];
    snprintf(log, sizeof log, "%s/strace.log", test_scratch());
    const char *b[] = {st, "-f", "-qq", "-o", log, "-e", "trace=pread64,read,mmap", "-e", "signal=none", DF, "info",
                       "--model", tiny, NULL};
    int rc = cli(b);
    if (rc != 0 && strstr(err_, "ptrace")) TSKIP("ptrace is not permitted here: %s", err_);
    TCHECKF(rc == 0, "%s", err_);
    /* the largest single read of info must be a header, not a tensor: the
     * tiny shards' headers are < 64 KiB; its trunk and experts are larger in sum */
    FILE *f = fopen(log, "r");
    TCHECK(f != NULL);
    if (!f) return;
    char line[1024];
    long total = 0, maps = 0;
    while (fgets(line, sizeof line, f)) {
        const char *m = strstr(line, "mmap(");
        if (strstr(line, "read64(") || strstr(line, "read(")) {
            const char *eq = strrchr(line, '=');
            long n = eq ? strtol(eq + 1, NULL, 10) : 0;
            if (n > 0) total += n;
        }
        /* a shared read-only file mapping would be a tensor */
        if (m && strstr(line, "MAP_SHARED") && !strstr(line, "PROT_WRITE")) maps++;
    }
    fclose(f);
    TCHECKF(maps == 0, "info mapped %ld tensors", maps);
    /* what it reads is the config, the index and the headers (~0.4 MB
     * here, libraries included); the shards are 1.7 MB */
    fprintf(stderr, "    info read %ld bytes in all\n", total);
    TCHECKF(total < 1000 * 1000, "info read %ld bytes", total);
}

static void test_cli_options_per_command(void)
{
    char tiny[512];
    snprintf(tiny, sizeof tiny, "%s/k3-tiny-a/checkpoint", testdata_dir());
    const char *a1[] = {DF, "info", "--model", tiny, "--slots", "3", NULL};
    TCHECK(cli(a1) == 2 && strstr(err_, "--slots") && strstr(err_, "info"));
    const char *a2[] = {DF, "info", "--model", tiny, "--to", "/tmp", NULL};
    TCHECK(cli(a2) == 2 && strstr(err_, "--to"));
    const char *a3[] = {DF, "run", "--model", tiny, "--prompt-ids", "1,2", "stray", NULL};
    TCHECK(cli(a3) == 2 && strstr(err_, "stray"));
    const char *a4[] = {DF, "tokenize", "--model", tiny, "--decode", "1,x", NULL};
    TCHECK(cli(a4) == 2 && strstr(err_, "--decode") && !strstr(err_, "--prompt-ids"));
    /* -- ends the options: the text may start with dashes */
    const char *a5[] = {DF, "tokenize", "--model", tiny, "--", "--special", NULL};
    TCHECKF(cli(a5) == 0 && strchr(out_, ','), "%s", err_);
    const char *a6[] = {DF, "run", "--model", tiny, "--prompt", "a", "--prompt-ids", "1", NULL};
    TCHECK(cli(a6) == 2);
    /* a heat file that cannot be written is refused at start, not at exit */
    /* sampling options without a temperature would be silently greedy */
    const char *a8[] = {DF, "run", "--model", tiny, "--prompt-ids", "1,2", "--top-p", "0.5", NULL};
    TCHECK(cli(a8) == 2 && strstr(err_, "--temp"));
    const char *a9[] = {DF, "run", "--model", tiny, "--prompt-ids", "1,2", "--greedy", "--temp", "0.7", NULL};
    TCHECK(cli(a9) == 2 && strstr(err_, "--greedy"));
    const char *a7[] = {DF, "run", "--model", tiny, "--prompt-ids", "1,2", "--heat", "/nonexistent/dir/heat", NULL};
    TCHECK(cli(a7) == 1 && strstr(err_, "/nonexistent/dir/heat"));
}

/* run --prompt honours --dump-logits, --print-ids and --bench-json: the
 * same rows and ids as --prompt-ids with the prompt's own ids. */
static void test_cli_prompt_outputs(void)
{
    char tiny[512], d1[600], d2[600];
    snprintf(tiny, sizeof tiny, "%s/k3-tiny-a/checkpoint", testdata_dir());
    snprintf(d1, sizeof d1, "%s/text.logits", test_scratch());
    snprintf(d2, sizeof d2, "%s/ids.logits", test_scratch());
    const char *t[] = {DF, "tokenize", "--model", tiny, "Hello world, this is", NULL};
    TCHECK(cli(t) == 0);
    char ids[4096];
    snprintf(ids, sizeof ids, "%.4000s", out_);
    ids[strcspn(ids, "\n")] = 0;
    const char *a[] = {DF, "run", "--model", tiny, "--prompt", "Hello world, this is", "--max-new", "5",
                       "--dump-logits", d1, "--print-ids", "--bench-json", NULL};
    TCHECKF(cli(a) == 0, "%s", err_);
    TCHECK(strstr(out_, "\"engine\":\"deltafin\"") != NULL);
    char text_out[8192];
    snprintf(text_out, sizeof text_out, "%.8000s", out_);
    const char *b[] = {DF, "run", "--model", tiny, "--prompt-ids", ids, "--max-new", "5", "--dump-logits", d2,
                       "--print-ids", NULL};
    TCHECKF(cli(b) == 0, "%s", err_);
    /* the ids line of --prompt-ids appears in the text run's output */
    char line[4096];
    snprintf(line, sizeof line, "%.4000s", out_);
    line[strcspn(line, "\n")] = 0;
    TCHECKF(strlen(line) > 0 && strstr(text_out, line), "ids %s not in %s", line, text_out);
    FILE *f1 = fopen(d1, "rb"), *f2 = fopen(d2, "rb");
    TCHECK(f1 && f2);
    if (!f1 || !f2) return;
    int same = 1;
    long n = 0;
    for (int c1, c2;; n++) {
        c1 = fgetc(f1), c2 = fgetc(f2);
        if (c1 != c2) same = 0;
        if (c1 == EOF || c2 == EOF) break;
    }
    fclose(f1);
    fclose(f2);
    TCHECKF(same && n > 0, "the dumps differ (%ld bytes compared)", n);
}

/* --io auto's probe must time the device, not the page cache: on a model
 * written a moment ago (dirty pages, which DONTNEED does not drop) every
 * expert it reads buffered must be out of the page cache first. */
static void test_io_auto_probe_is_cold(void)
{
    char dir[512];
    if (gen_model("plan_fresh", "--preset small --set num_experts=64 --seed 5", dir, sizeof dir)) return;
    df_engine_opts o;
    df_engine_opts_default(&o);
    o.quiet = 1;
    o.n_threads = 1;
    o.io_mode = "auto";
    o.expert_cache_bytes = 1;
    df_engine *eng;
    df_error err = {0};
    TCHECKF(df_engine_open(dir, &o, &eng, &err) == 0, "%s", err.msg);
    if (!eng) return;
    if (!eng->m.store.probe_direct_bps) {
        df_engine_close(eng);
        TSKIP("O_DIRECT is not available here: no probe ran");
    }
    TCHECKF(eng->m.store.probe_warm == 0, "%d probed experts were read from the page cache", eng->m.store.probe_warm);
    df_engine_close(eng);
}

/* doctor: one screen naming the CPU's kernels, memory, io_uring, the plan,
 * the drive and the speed it allows, the machine's memory and kernel rates
 * measured now and the ceilings they set; K3's config at 24 GiB gets the advice
 * its plan implies (the trunk read every token, a small expert cache); a
 * missing model is an error naming it. */
static void test_cli_doctor(void)
{
    char tiny[512], k3[512];
    snprintf(tiny, sizeof tiny, "%s/k3-tiny-a/checkpoint", testdata_dir());
    snprintf(k3, sizeof k3, "%s/k3/config.json", testdata_dir());
    const char *a1[] = {DF, "doctor", "--model", tiny, "--seconds", "1", NULL};
    TCHECKF(cli(a1) == 0, "%s", err_);
    const char *want[] = {"kernels: ", "memory ", "io_uring ", "plan ", "disk ", "GB/s", "compute  memory read ",
                          "GFLOP a position", "no disk read a token", "of weights from memory a token",
                          "nothing to change"};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) TCHECKF(strstr(out_, want[i]), "no \"%s\" in: %s", want[i], out_);
    const char *a2[] = {DF, "doctor", "--model", k3, "--mem", "24G", "--seconds", "1", NULL};
    TCHECKF(cli(a2) == 0, "%s", err_);
    TCHECKF(strstr(out_, "896 experts") && strstr(out_, "25.830 GB of experts") && strstr(out_, "keeps it in memory") &&
                strstr(out_, "each further GiB"),
            "%s", out_);
    const char *a3[] = {DF, "doctor", "--model", "/nonexistent/m", NULL};
    TCHECK(cli(a3) == 1 && strstr(err_, "/nonexistent/m"));
}

/* --batch auto plans a session's scratch as a line (engine_plan.c: through
 * 256 and 512 rows, its base covering one row); every batch's real scratch
 * (session_alloc's dry run) must lie on or under it, or the planned session
 * does not fit its own plan (a schedule buffer sized by the ceiling of the
 * blocks, a step, once broke `mpirun -np 2 --mem 64M`). */
static void test_scratch_under_the_line(void)
{
    char dir[512];
    if (gen_model("plan_line", "--preset small --set num_experts=512 --seed 9", dir, sizeof dir)) return;
    df_engine_opts o;
    df_engine_opts_default(&o);
    o.quiet = 1;
    o.n_threads = 1;
    df_engine *eng = NULL;
    df_error err = {0};
    if (df_engine_open(dir, &o, &eng, &err)) {
        t_fail(__FILE__, __LINE__, "open: %s", err.msg);
        return;
    }
    size_t state, s[3];
    static const int at[3] = {1, 256, 512};
    for (int i = 0; i < 3; i++) {
        df_session_opts so = {.n_ctx = 4096, .max_batch = at[i]};
        TCHECK(session_alloc(eng, &so, 1, NULL, &state, &s[i], &err) == 0);
    }
    size_t per_row = (s[2] - s[1] + 255) / 256, base_a = s[1] - 256 * per_row, base_1 = s[0] - per_row;
    size_t base = base_1 > base_a ? base_1 : base_a;
    int over = 0;
    for (int T = 1; T <= 2100; T += T < 300 ? 1 : 7) {
        df_session_opts so = {.n_ctx = 4096, .max_batch = T};
        size_t sc = 0;
        TCHECK(session_alloc(eng, &so, 1, NULL, &state, &sc, &err) == 0);
        if (sc > base + (size_t)T * per_row && over++ < 3)
            t_fail(__FILE__, __LINE__, "batch %d: scratch %zu over the plan's line %zu", T, sc, base + (size_t)T * per_row);
    }
    TCHECK(over == 0);
    df_engine_close(eng);
}

/* plan --trunk q8_0 (a config.json's what-if): every trunk matrix but the
 * router in Q8_0 (34 bytes per 32 values, llama.cpp's K3 conversion), counted
 * here from the roster; at 64 GiB the trunk then stays resident (the BF16
 * one streams 103 GiB a token there); a model's own files refuse it. */
static void test_plan_k3_q8_trunk(void)
{
    char cfg[512], mini[600];
    snprintf(cfg, sizeof cfg, "%s/k3/config.json", testdata_dir());
    snprintf(mini, sizeof mini, "%s/../models/k3-mini", testdata_dir());
    const uint64_t h = 7168, V = 163840, P = 96 * 128, Dk = 128, Hk = 96, Hm = 96, Rq = 1536, Rkv = 512, dn = 128,
                   dr = 64, dv = 128, Dff = 33792, E = 896, Ns = 2, I = 3072, Lt = 3584;
    uint64_t kda = 4 * P * h + Dk * h + P * Dk + Hk * h + h * P;
    uint64_t mla = Rq * h + Hm * (dn + dr) * Rq + (Rkv + dr) * h + Hm * (dn + dv) * Rkv + Hm * dv * h + h * Hm * dv;
    uint64_t moe_q = Lt * h + h * Lt + 3 * Ns * I * h, router = E * h;
    uint64_t q8 = (69 * kda + 24 * mla + 3 * Dff * h + 92 * moe_q + V * h) / 32 * 34 + 2 * 92 * router;
    df_plan_opts o = {.mem_budget = 64 * GiB, .n_threads = 16, .trunk_type = "q8_0"};
    df_plan p;
    df_error err = {0};
    TCHECKF(df_plan_model(cfg, &o, &p, NULL, &err) == 0, "%s", err.msg);
    TCHECKF(p.trunk_bytes == q8, "trunk %llu, expected %llu", (unsigned long long)p.trunk_bytes, (unsigned long long)q8);
    TCHECK(p.embed_bytes == V * h / 32 * 34);
    TCHECKF(p.trunk_mode == DF_TRUNK_RESIDENT && p.trunk_read_per_token == 0, "at 64 GiB: mode %d, %llu a token",
            p.trunk_mode, (unsigned long long)p.trunk_read_per_token);
    o.trunk_type = "bf16";
    TCHECK(df_plan_model(cfg, &o, &p, NULL, &err) == 0 && p.trunk_mode == DF_TRUNK_STREAMED);
    o.trunk_type = "q8_0";
    memset(&err, 0, sizeof err);
    TCHECK(df_plan_model(mini, &o, &p, NULL, &err) == -1 && strstr(err.msg, "config.json alone"));
    o.trunk_type = "q4";
    memset(&err, 0, sizeof err);
    TCHECK(df_plan_model(cfg, &o, &p, NULL, &err) == -1 && strstr(err.msg, "expected bf16, f16 or q8_0"));
}

/* plan --disk-gbps: the table's projected tok/s is the read speed over the bytes a decoded token
 * reads (trunk + experts), for every budget row; a bad list is refused by name */
static void test_cli_disk_projection(void)
{
    char cfg[512];
    snprintf(cfg, sizeof cfg, "%s/k3/config.json", testdata_dir());
    const char *a[] = {DF, "plan", "--model", cfg, "--disk-gbps", "7,28", NULL};
    TCHECKF(cli(a) == 0 && strstr(out_, "tok/s @7GB/s") && strstr(out_, "tok/s @28GB/s") && strstr(out_, "256 GiB"),
            "%s %s", out_, err_);
    /* the 64 GiB row: 7e9 / (trunk + experts read per token) */
    df_plan_opts o = {.mem_budget = 64 * GiB, .n_threads = 0};
    df_plan p;
    df_error err = {0};
    TCHECK(df_plan_model(cfg, &o, &p, NULL, &err) == 0);
    char want[32];
    snprintf(want, sizeof want, "%.3f", 7e9 / (double)(p.trunk_read_per_token + p.expert_read_est));
    const char *row = strstr(out_, "\n64 GiB");
    const char *eol = row ? strchr(row + 1, '\n') : NULL;
    TCHECKF(row && eol && memmem(row, (size_t)(eol - row), want, strlen(want)), "64 GiB row lacks %s: %s", want, out_);
    const char *bad[] = {DF, "plan", "--model", cfg, "--disk-gbps", "7,fast", NULL};
    TCHECKF(cli(bad) != 0 && strstr(err_, "--disk-gbps 7,fast"), "%s", err_);
}

static const test_case tests[] = {
    {"cli_disk_projection", test_cli_disk_projection},
    {"scratch_under_the_line", test_scratch_under_the_line},
    {"k3_q8_0_trunk_what_if", test_plan_k3_q8_trunk},
    {"resident_threshold_one_rule", test_resident_threshold_one_rule},
    {"cli_doctor", test_cli_doctor},
    {"io_auto_probe_is_cold", test_io_auto_probe_is_cold},
    {"plan_never_over_budget", test_plan_never_over_budget},
    {"plan_modes", test_plan_modes},
    {"plan_config_equals_headers", test_plan_config_equals_headers},
    {"plan_k3_config", test_plan_k3_config},
    {"plan_serve_ctx_rule", test_plan_serve_ctx_rule},
    {"plan_serve_ctx_models", test_plan_serve_ctx_models},
    {"cli_mem_is_a_promise", test_cli_mem_is_a_promise},
    {"cli_plan_reads_no_weights", test_cli_plan_reads_no_weights},
    {"cli_options_per_command", test_cli_options_per_command},
    {"cli_prompt_outputs", test_cli_prompt_outputs},
};

int main(int argc, char **argv)
{
    int rc = test_main(tests, NTESTS(tests), argc, argv);
    test_scratch_remove();
    return rc;
}
