/* test_prefill.c - prompts read each needed expert once per chunk, the
 * planner's chunk (--batch auto) gives the same logits as every other
 * batch width, and long contexts (32K positions) agree between one long
 * prefill and position-by-position evaluation. */
#define _GNU_SOURCE
#include "harness.h"
#include "engine.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static df_engine *open_model(const char *dir, size_t cache, int ctx, int batch, int threads)
{
    df_engine_opts o;
    df_engine_opts_default(&o);
    o.quiet = 1;
    o.n_threads = threads;
    o.expert_cache_bytes = cache;
    o.no_prefetch = 1;
    o.plan_ctx = ctx;
    o.plan_batch = batch;
    df_engine *eng = NULL;
    df_error err = {0};
    if (df_engine_open(dir, &o, &eng, &err)) t_fail(__FILE__, __LINE__, "open %s: %s", dir, err.msg);
    return eng;
}

/* all rows' logits of ids at max_batch `batch` (0: the plan's), the
 * layers' work in blocks of `rb` rows (0: the default) */
static float *eval_rb(df_engine *eng, const int32_t *ids, int n, int batch, int rb, int ctx, df_stats *st)
{
    df_model_info info;
    df_engine_info(eng, &info);
    df_session_opts so = {.n_ctx = ctx, .max_batch = batch, .row_slice = rb};
    df_session *s;
    df_error err = {0};
    if (df_session_new(eng, &so, &s, &err)) {
        t_fail(__FILE__, __LINE__, "session: %s", err.msg);
        return NULL;
    }
    float *out = malloc((size_t)n * info.vocab * sizeof *out);
    if (df_session_eval(s, ids, n, out, 1, &err)) t_fail(__FILE__, __LINE__, "eval: %s", err.msg);
    if (st) df_engine_stats(eng, st);
    df_session_free(s);
    return out;
}

static float *eval_all(df_engine *eng, const int32_t *ids, int n, int batch, int ctx, df_stats *st)
{
    return eval_rb(eng, ids, n, batch, 0, ctx, st);
}

/* One prompt at batch 1, 7, 32, the planner's choice and the whole prompt,
 * with a one-slot cache and with every expert resident: the same bits.
 * The chunks of 32 and of the whole prompt also run their layers in blocks
 * of 13 and 64 rows (a chunk longer than its row slice: attention, dense
 * and shared-expert work by block around one pass over the routed
 * experts), and in blocks of 3 rows with a 7-row expert batch. */
static void test_auto_batch_bit_identical(void)
{
    char dir[512];
    if (gen_model("prefill_m", "--preset small --set num_experts=64 --set num_experts_per_token=8 --seed 4", dir,
                  sizeof dir))
        return;
    enum { N = 200 };
    int32_t ids[N];
    for (int i = 0; i < N; i++) ids[i] = (int32_t)((i * 7919 + 13) % 3000 + 5);
    size_t caches[2] = {1, (size_t)1 << 30};
    float *ref = NULL;
    int V = 0;
    for (int c = 0; c < 2; c++) {
        df_engine *eng = open_model(dir, caches[c], 512, 0, 2);
        if (!eng) return;
        df_model_info info;
        df_engine_info(eng, &info);
        V = info.vocab;
        df_plan p;
        df_engine_plan(eng, &p);
        TCHECK(p.batch_auto);
        if (c == 0) TCHECKF(p.max_batch >= N, "a one-slot cache streams experts: chunk %d", p.max_batch);
        int batches[] = {1, 7, 32, 0, N, 32, N, N};
        int blocks[] = {0, 0, 0, 0, 0, 13, 64, 3};
        for (int b = 0; b < 8; b++) {
            float *got = eval_rb(eng, ids, N, batches[b], blocks[b], 512, NULL);
            if (!got) continue;
            if (!ref) ref = got;
            else {
                TCHECKF(!memcmp(ref, got, (size_t)N * V * sizeof *got), "cache %zu batch %d row slice %d differs",
                        caches[c], batches[b], blocks[b]);
                free(got);
            }
        }
        df_engine_close(eng);
    }
    free(ref);
}

/* An expert with more gathered rows than a batch holds runs in pieces:
 * 8 experts, 4 per position, 600 positions in blocks of 3 rows give each
 * expert ~300 rows against a batch of 2*3 + 256 = 262 (moe.c run_experts).
 * The same bits as one block of 600 (batches of up to 1,456 rows: no
 * pieces) and as chunks of 7. */
static void test_expert_pieces(void)
{
    char dir[512];
    if (gen_model("prefill_e8", "--preset small --set num_experts=8 --set num_experts_per_token=4 --seed 6", dir,
                  sizeof dir))
        return;
    enum { N = 600 };
    int32_t ids[N];
    for (int i = 0; i < N; i++) ids[i] = (int32_t)((i * 6151 + 29) % 3000 + 5);
    df_engine *eng = open_model(dir, 1, 1024, 0, 2);
    if (!eng) return;
    df_model_info info;
    df_engine_info(eng, &info);
    float *ref = eval_rb(eng, ids, N, N, N, 1024, NULL);
    float *pieces = eval_rb(eng, ids, N, N, 3, 1024, NULL);
    float *seven = eval_rb(eng, ids, N, 7, 0, 1024, NULL);
    size_t bytes = (size_t)N * info.vocab * sizeof *ref;
    TCHECK(ref && pieces && seven);
    if (ref && pieces && seven) {
        TCHECKF(!memcmp(ref, pieces, bytes), "blocks of 3 rows (experts in pieces) differ from one block");
        TCHECKF(!memcmp(ref, seven, bytes), "chunks of 7 differ from one block");
    }
    free(ref);
    free(pieces);
    free(seven);
    df_engine_close(eng);
}

/* A chunk longer than its row slice starts each layer's reads between the
 * blocks (moe_start), for the experts the rows so far were routed to: still
 * one read per needed (layer, expert), with a one-slot cache (the early
 * reads stop at the full cache) and a 40-slot one, and the same bits as
 * one block. */
static void test_early_reads_once(void)
{
    char dir[512];
    if (gen_model("prefill_m", "--preset small --set num_experts=64 --set num_experts_per_token=8 --seed 4", dir,
                  sizeof dir))
        return;
    enum { N = 150 };
    int32_t ids[N];
    for (int i = 0; i < N; i++) ids[i] = (int32_t)((i * 104729 + 7) % 3000 + 5);
    size_t caches[2] = {1, 40 * 20480};
    for (int c = 0; c < 2; c++) {
        float *lg[2] = {NULL, NULL};
        df_stats st[2];
        for (int v = 0; v < 2; v++) {
            df_engine *eng = open_model(dir, caches[c], 512, 0, 2);
            if (!eng) return;
            lg[v] = eval_rb(eng, ids, N, N, v ? 16 : 0, 512, &st[v]);
            df_engine_close(eng);
        }
        df_model_info info;
        df_engine *eng = open_model(dir, caches[c], 512, 0, 2);
        df_engine_info(eng, &info);
        df_engine_close(eng);
        fprintf(stderr, "    cache %zu B, blocks of 16: %llu pairs needed, %llu reads (one block: %llu)\n", caches[c],
                (unsigned long long)st[1].prompt_unique_experts, (unsigned long long)st[1].prompt_expert_reads,
                (unsigned long long)st[0].prompt_expert_reads);
        TCHECK(st[1].prompt_unique_experts > 0 && st[1].prompt_expert_reads == st[1].prompt_unique_experts);
        TCHECK(st[0].prompt_unique_experts == st[1].prompt_unique_experts);
        TCHECKF(lg[0] && lg[1] && !memcmp(lg[0], lg[1], (size_t)N * info.vocab * sizeof(float)),
                "cache %zu: blocks of 16 differ from one block", caches[c]);
        free(lg[0]);
        free(lg[1]);
    }
}

/* A prompt that fits one chunk reads each (layer, expert) it needs once:
 * the store's reads equal the distinct pairs, which equal the pairs in the
 * route trace. */
/* prefill_m (64 experts, 8 per token) with a one-slot cache and no
 * prefetch: every needed expert is read */
static df_engine *open_one_slot(int ctx, const char *trace)
{
    char dir[512];
    if (gen_model("prefill_m", "--preset small --set num_experts=64 --set num_experts_per_token=8 --seed 4", dir,
                  sizeof dir))
        return NULL;
    df_engine_opts o;
    df_engine_opts_default(&o);
    o.quiet = 1;
    o.n_threads = 2;
    o.expert_cache_bytes = 1;
    o.no_prefetch = 1;
    o.plan_ctx = ctx;
    o.trace_path = trace;
    o.trace_jsonl = 1; /* read below line by line */
    df_engine *eng;
    df_error err = {0};
    TCHECKF(df_engine_open(dir, &o, &eng, &err) == 0, "%s", err.msg);
    return err.msg[0] ? NULL : eng;
}

static void test_reads_once_per_needed_expert(void)
{
    char trace[600];
    snprintf(trace, sizeof trace, "%s/prefill.trace", test_scratch());
    df_engine *eng = open_one_slot(512, trace);
    if (!eng) return;
    enum { N = 150 };
    int32_t ids[N];
    for (int i = 0; i < N; i++) ids[i] = (int32_t)((i * 104729 + 7) % 3000 + 5);
    df_stats st;
    free(eval_all(eng, ids, N, 0, 512, &st));
    df_model_info info;
    df_engine_info(eng, &info);
    df_engine_close(eng); /* flushes the trace */
    fprintf(stderr, "    %llu positions, chunk %d: %llu pairs needed, %llu reads\n",
            (unsigned long long)st.prompt_positions, st.prompt_chunk, (unsigned long long)st.prompt_unique_experts,
            (unsigned long long)st.prompt_expert_reads);
    TCHECK(st.prompt_positions == N && st.prompt_chunk >= N);
    TCHECK(st.prompt_unique_experts > 0 && st.prompt_expert_reads == st.prompt_unique_experts);
    /* the pairs the route trace names */
    FILE *f = fopen(trace, "r");
    TCHECK(f != NULL);
    if (!f) return;
    uint8_t *seen = calloc((size_t)info.n_layers * info.n_experts, 1);
    uint64_t pairs = 0;
    char line[4096];
    while (fgets(line, sizeof line, f)) {
        const char *p = strstr(line, "\"layer\":"), *e = strstr(line, "\"experts\":[");
        if (!p || !e) continue;
        int il = atoi(p + 8);
        for (const char *q = e + 11; *q && *q != ']';) {
            char *end;
            long x = strtol(q, &end, 10);
            if (end == q) break;
            uint8_t *b = &seen[(size_t)il * info.n_experts + (size_t)x];
            if (!*b) *b = 1, pairs++;
            q = *end == ',' ? end + 1 : end;
        }
    }
    fclose(f);
    free(seen);
    TCHECKF(pairs == st.prompt_unique_experts, "trace %llu pairs, engine %llu", (unsigned long long)pairs,
            (unsigned long long)st.prompt_unique_experts);
}


typedef struct rows_acc {
    float *out;
    size_t V;
    int n;
} rows_acc;

static int take_rows(void *ctx, const float *rows, int n)
{
    rows_acc *a = ctx;
    memcpy(a->out + (size_t)a->n * a->V, rows, (size_t)n * a->V * sizeof *rows);
    a->n += n;
    return 0;
}

/* Rows handed over a chunk at a time (--dump-logits): the same bits as all
 * rows at once, and the prompt's accounting covers every chunk, not the
 * last one. */
static void test_eval_each_rows_and_accounting(void)
{
    df_engine *eng = open_one_slot(256, NULL);
    if (!eng) return;
    df_error err = {0};
    enum { N = 40, B = 7 };
    int32_t ids[N];
    for (int i = 0; i < N; i++) ids[i] = (int32_t)((i * 7919 + 3) % 3000 + 5);
    df_stats all;
    float *ref = eval_all(eng, ids, N, B, 256, &all);
    df_model_info info;
    df_engine_info(eng, &info);
    df_session_opts so = {.n_ctx = 256, .max_batch = B};
    df_session *s;
    TCHECK(df_session_new(eng, &so, &s, &err) == 0);
    rows_acc a = {.out = malloc((size_t)N * info.vocab * sizeof(float)), .V = (size_t)info.vocab};
    float *chunk = malloc((size_t)B * info.vocab * sizeof(float));
    TCHECKF(df_session_eval_each(s, ids, N, chunk, take_rows, &a, &err) == 0, "%s", err.msg);
    df_stats st;
    df_engine_stats(eng, &st);
    TCHECK(a.n == N && !memcmp(a.out, ref, (size_t)N * info.vocab * sizeof(float)));
    TCHECKF(st.prompt_positions == N && st.prompt_unique_experts == all.prompt_unique_experts,
            "%llu positions, %llu pairs (all rows at once: %llu)", (unsigned long long)st.prompt_positions,
            (unsigned long long)st.prompt_unique_experts, (unsigned long long)all.prompt_unique_experts);
    df_session_free(s);
    free(chunk);
    free(a.out);
    free(ref);
    df_engine_close(eng);
}

/* 32K positions: one long prefill (the planner's chunks) and position by
 * position agree bit for bit at sampled positions. */
static void test_long_context_32k(void)
{
    if (getenv("DF_SANITIZED")) TSKIP("2 x 32K positions take minutes under the sanitizers: run in the plain suite");
    char dir[512];
    /* attention is quadratic in the context: one MLA layer with one head
     * keeps 2 x 32K positions to seconds (two layers: KDA dense, then MLA) */
    if (gen_model("prefill_long",
                  "--preset tiny --set num_hidden_layers=2 --set num_attention_heads=1 --set mla_every=100", dir,
                  sizeof dir))
        return;
    enum { N = 32768 + 64 };
    static const int marks[] = {99, 4095, 16383, 32767, N - 1};
    int32_t *ids = malloc(N * sizeof *ids);
    for (int i = 0; i < N; i++) ids[i] = (int32_t)((i * 2654435761u) % 200);
    df_engine *eng = open_model(dir, (size_t)1 << 30, N, 0, 1);
    if (!eng) return;
    df_model_info info;
    df_engine_info(eng, &info);
    int V = info.vocab;
    float *a = malloc(5 * (size_t)V * sizeof *a), *b = malloc(5 * (size_t)V * sizeof *b), *tmp = malloc((size_t)V * 4);
    df_session_opts so = {.n_ctx = N};
    df_session *s1, *s2;
    df_error err = {0};
    TCHECKF(df_session_new(eng, &so, &s1, &err) == 0, "%s", err.msg);
    /* long prefill, cut only where a sampled position's logits are needed */
    int at = 0;
    for (int m = 0; m < 5; m++) {
        TCHECK(df_session_eval(s1, ids + at, marks[m] + 1 - at, a + (size_t)m * V, 0, &err) == 0);
        at = marks[m] + 1;
    }
    df_session_free(s1);
    so.max_batch = 1;
    TCHECKF(df_session_new(eng, &so, &s2, &err) == 0, "%s", err.msg);
    for (int i = 0, m = 0; i < N; i++) {
        TCHECK(df_session_eval(s2, ids + i, 1, tmp, 0, &err) == 0);
        if (i == marks[m]) memcpy(b + (size_t)m++ * V, tmp, (size_t)V * sizeof *tmp);
    }
    df_session_free(s2);
    TCHECK(!memcmp(a, b, 5 * (size_t)V * sizeof *a));
    df_engine_close(eng);
    free(a);
    free(b);
    free(tmp);
    free(ids);
}

/* The look-ahead prefetch runs on decode steps only: a prompt chunk reads
 * each next layer's union when it gets there, so predicting it adds reads. */
static void test_no_prefetch_in_prompts(void)
{
    char dir[512];
    if (gen_model("prefill_m", "--preset small --set num_experts=64 --set num_experts_per_token=8 --seed 4", dir,
                  sizeof dir))
        return;
    df_engine_opts o;
    df_engine_opts_default(&o);
    o.quiet = 1;
    o.n_threads = 2;
    /* room for predictions beside a full group (prefetch.c pins at most
     * n_slots - group), but not every expert (a preloaded cache predicts nothing) */
    o.expert_cache_bytes = 330 * 20480;
    o.plan_ctx = 512;
    df_engine *eng;
    df_error err = {0};
    TCHECKF(df_engine_open(dir, &o, &eng, &err) == 0, "%s", err.msg);
    if (!eng) return;
    df_model_info info;
    df_engine_info(eng, &info);
    df_session *s;
    TCHECK(df_session_new(eng, NULL, &s, &err) == 0);
    enum { N = 12 };
    int32_t ids[N];
    for (int i = 0; i < N; i++) ids[i] = (int32_t)((i * 7919 + 3) % 3000 + 5);
    float *lg = malloc((size_t)info.vocab * sizeof *lg);
    TCHECK(df_session_eval(s, ids, N, lg, 0, &err) == 0);
    df_stats st;
    df_engine_stats(eng, &st);
    TCHECKF(st.prefetch_issued == 0 && st.prefetch_predicted == 0, "a prompt issued %llu prefetch reads",
            (unsigned long long)st.prefetch_issued);
    for (int i = 0; i < 8; i++) {
        int32_t next = (int32_t)df_argmax(lg, info.vocab);
        TCHECK(df_session_eval(s, &next, 1, lg, 0, &err) == 0);
    }
    df_engine_stats(eng, &st);
    TCHECKF(st.prefetch_predicted > 0, "decode steps made no prediction");
    free(lg);
    df_session_free(s);
    df_engine_close(eng);
}

static const test_case tests[] = {
    {"no_prefetch_in_prompts", test_no_prefetch_in_prompts},
    {"auto_batch_bit_identical", test_auto_batch_bit_identical},
    {"expert_pieces", test_expert_pieces},
    {"early_reads_once", test_early_reads_once},
    {"reads_once_per_needed_expert", test_reads_once_per_needed_expert},
    {"eval_each_rows_and_accounting", test_eval_each_rows_and_accounting},
    {"long_context_32k", test_long_context_32k},
};

int main(int argc, char **argv)
{
    int rc = test_main(tests, NTESTS(tests), argc, argv);
    test_scratch_remove();
    return rc;
}
