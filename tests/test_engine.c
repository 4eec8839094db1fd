/* test_engine.c - exactness across execution choices, on the fixture model:
 * batch width (one call, chunks of 1/3/7/32 vs token by token), thread count
 * (1, 2, 3), kernel set (ref vs avx2 vs avx512 where the CPU has them),
 * expert cache size (one slot vs all) must all give bit-identical logits.
 * Also: the allocation guard trips on every allocator entry of the process
 * (ours, libc-internal, pool workers) and spares other threads, and bad ids / a full context are
 * clear errors that leave the session usable, and a NaN weight is an error
 * naming the layer and part where non-finite values first appear.
 */
#define _GNU_SOURCE
#include "harness.h"
#include "json.h"
#include "kernels.h"
#include "research.h"
#include "engine_impl.h"
#include "threadpool.h"
#include "safetensors.h"
#include "heat.h"
#include "trace_format.h"
#include "util.h"

#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

/* p3 of the fixture followed by its greedy continuation: 57 tokens */
static const int32_t ids[] = {387, 267, 263, 257, 294, 1,   389, 34,  78,  84,  77,  83,  304, 376, 75,
                              274, 68,  83,  13,  388, 267, 389, 386, 387, 267, 263, 257, 294, 1,   389,
                              54,  89,  76,  76,  79,  388, 267, 389, 386, 387, 267, 263, 257, 83,  1,
                              389, 2,   75,  388, 267, 389, 386, 387, 267, 263, 257, 83};
#define N_IDS ((int)(sizeof ids / sizeof ids[0]))

typedef struct {
    int threads;
    const char *kernels;
    size_t cache_bytes;
    int chunk;       /* tokens per eval call (0 = all at once) */
    int max_batch;
} run_cfg;

static float *run(const run_cfg *rc, int *V)
{
    char dir[512];
    snprintf(dir, sizeof dir, "%s/k3-tiny-a/checkpoint", testdata_dir());
    df_engine_opts o;
    df_engine_opts_default(&o);
    o.n_threads = rc->threads;
    o.kernels = rc->kernels;
    o.expert_cache_bytes = rc->cache_bytes;
    o.quiet = 1;
    df_engine *eng;
    df_error err = {0};
    if (df_engine_open(dir, &o, &eng, &err)) {
        t_fail(__FILE__, __LINE__, "open: %s", err.msg);
        return NULL;
    }
    df_model_info info;
    df_engine_info(eng, &info);
    *V = info.vocab;
    df_session_opts so;
    df_session_opts_default(&so);
    if (rc->max_batch) so.max_batch = rc->max_batch;
    df_session *s;
    TCHECK(df_session_new(eng, &so, &s, &err) == 0);
    float *out = malloc((size_t)N_IDS * info.vocab * sizeof(float));
    int chunk = rc->chunk ? rc->chunk : N_IDS;
    for (int off = 0; off < N_IDS; off += chunk) {
        int n = N_IDS - off < chunk ? N_IDS - off : chunk;
        if (df_session_eval(s, ids + off, n, out + (size_t)off * info.vocab, 1, &err))
            t_fail(__FILE__, __LINE__, "eval: %s", err.msg);
    }
    df_session_free(s);
    df_engine_close(eng);
    return out;
}

static void same_bits(const char *what, const float *a, const float *b, int V)
{
    if (!a || !b) return;
    size_t n = (size_t)N_IDS * V;
    for (size_t i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], 4)) {
            t_fail(__FILE__, __LINE__, "%s: logits differ at row %zu col %zu (%.9g vs %.9g)", what, i / V, i % V,
                   a[i], b[i]);
            return;
        }
}

static void test_batch_vs_sequential(void)
{
    int V;
    run_cfg base = {.threads = 1, .chunk = 1};
    float *seq = run(&base, &V);
    int chunks[] = {0, 3, 7, 32};
    int batches[] = {64, 5, 32, 32};
    for (int i = 0; i < 4; i++) {
        run_cfg c = {.threads = 1, .chunk = chunks[i], .max_batch = batches[i]};
        float *b = run(&c, &V);
        char what[64];
        snprintf(what, sizeof what, "chunk %d / max_batch %d", chunks[i], batches[i]);
        same_bits(what, seq, b, V);
        free(b);
    }
    free(seq);
}

static void test_thread_counts(void)
{
    int V;
    run_cfg c1 = {.threads = 1, .chunk = 0, .max_batch = 16};
    float *a = run(&c1, &V);
    for (int t = 2; t <= 3; t++) {
        run_cfg c = {.threads = t, .chunk = 0, .max_batch = 16};
        float *b = run(&c, &V);
        char what[64];
        snprintf(what, sizeof what, "%d threads", t);
        same_bits(what, a, b, V);
        free(b);
        run_cfg d = {.threads = t, .chunk = 1};
        b = run(&d, &V);
        snprintf(what, sizeof what, "%d threads, token by token", t);
        same_bits(what, a, b, V);
        free(b);
    }
    free(a);
}

static void test_kernel_sets(void)
{
    int V;
    run_cfg r = {.threads = 2, .kernels = "ref"};
    float *a = run(&r, &V);
    int compared = 0;
    const char *isas[] = {"avx2", "avx512", "neon"};
    enum kernel_isa ids_[] = {KERNEL_AVX2, KERNEL_AVX512, KERNEL_NEON};
    for (int i = 0; i < 3; i++) {
        if (!kernels_cpu_has(ids_[i])) {
            fprintf(stderr, "    %s not available on this CPU\n", isas[i]);
            continue;
        }
        run_cfg c = {.threads = 2, .kernels = isas[i]};
        float *b = run(&c, &V);
        same_bits(isas[i], a, b, V);
        free(b);
        compared++;
    }
    free(a);
    if (!compared) TSKIP("no SIMD kernel set on this CPU");
}

static void test_cache_sizes(void)
{
    int V;
    run_cfg all = {.threads = 2};
    float *a = run(&all, &V);
    run_cfg one = {.threads = 2, .cache_bytes = 1}; /* one slot: every expert re-read */
    float *b = run(&one, &V);
    same_bits("1-slot cache", a, b, V);
    run_cfg seq = {.threads = 1, .cache_bytes = 3 * 4096, .chunk = 1};
    float *c = run(&seq, &V);
    same_bits("3-slot cache, token by token", a, c, V);
    free(a);
    free(b);
    free(c);
}

/* The allocation guard.  Each case runs in a forked child (stderr to
 * /dev/null) and must end with SIGABRT, or exit 0 where nothing may trip.
 * util.c replaces the process's malloc family, so allocations made inside
 * libc (qsort's merge buffer, strdup, fopen's FILE) are caught as well as
 * our own; the pool's workers are checked while the evaluating thread holds
 * the guard; a thread that is neither (the server's HTTP threads) is not. */
static int guard_child(void (*body)(void))
{
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        int fd = open("/dev/null", O_WRONLY);
        if (fd >= 0) dup2(fd, 2);
        body();
        _exit(0);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    return st;
}
#define TRIPPED(st) (WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT)

static void direct_malloc(void)
{
    alloc_guard_enter();
    void *volatile p = malloc(100);
    (void)p;
}

static int cmp_int(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}
/* glibc's qsort is a merge sort that mallocs its buffer once the array
 * passes 1 KiB: the call expert_store's flush used to make */
static void libc_qsort(void)
{
    enum { N = 100000 };
    static int a[N];
    for (int i = 0; i < N; i++) a[i] = (int)((i * 2654435761u) >> 7);
    alloc_guard_enter();
    qsort(a, N, sizeof a[0], cmp_int);
}
static void libc_strdup(void)
{
    static char text[] = "allocated inside libc";
    char *volatile src = text;
    alloc_guard_enter();
    char *volatile p = strdup(src);
    (void)p;
}
static void libc_fopen(void)
{
    alloc_guard_enter();
    FILE *volatile f = fopen("/dev/null", "r");
    (void)f;
}
static void guarded_then_released(void)
{
    alloc_guard_enter();
    alloc_guard_enter();
    alloc_guard_leave();
    alloc_guard_leave();
    free(strdup("after the token loop"));
}

static void worker_mallocs(void *ctx, size_t begin, size_t end, int worker)
{
    (void)ctx, (void)begin, (void)end;
    if (worker != 0) {
        void *volatile p = malloc(64);
        free(p);
    } else {
        usleep(20000); /* leave items to the workers */
    }
}
static void pool_worker_malloc(void)
{
    threadpool *pool = threadpool_new(3);
    alloc_guard_enter();
    parallel_for(pool, 64, 1, worker_mallocs, NULL);
    alloc_guard_leave();
}

static atomic_int other_go, other_done;
static void *other_thread(void *arg)
{
    (void)arg;
    while (!atomic_load(&other_go)) usleep(1000);
    free(strdup("an HTTP thread's allocation"));
    atomic_store(&other_done, 1);
    return NULL;
}
static void unrelated_thread_malloc(void)
{
    pthread_t th;
    if (pthread_create(&th, NULL, other_thread, NULL)) _exit(3);
    alloc_guard_enter();
    atomic_store(&other_go, 1);
    while (!atomic_load(&other_done)) usleep(1000);
    alloc_guard_leave();
    pthread_join(th, NULL);
}

static void test_alloc_guard_trips(void)
{
    int st = guard_child(direct_malloc);
    TCHECKF(TRIPPED(st), "malloc under the guard did not abort (status %d)", st);
    st = guard_child(libc_qsort);
    TCHECKF(TRIPPED(st), "glibc qsort of 400 KB under the guard did not abort (status %d)", st);
    st = guard_child(libc_strdup);
    TCHECKF(TRIPPED(st), "strdup under the guard did not abort (status %d)", st);
    st = guard_child(libc_fopen);
    TCHECKF(TRIPPED(st), "fopen under the guard did not abort (status %d)", st);
    st = guard_child(pool_worker_malloc);
    TCHECKF(TRIPPED(st), "a pool worker's malloc under the guard did not abort (status %d)", st);
    st = guard_child(guarded_then_released);
    TCHECKF(WIFEXITED(st) && WEXITSTATUS(st) == 0, "allocation after the guard was released aborted (status %d)", st);
    st = guard_child(unrelated_thread_malloc);
    TCHECKF(WIFEXITED(st) && WEXITSTATUS(st) == 0,
            "a thread outside the token loop could not allocate while the guard was held (status %d)", st);
}

/* the fixture with default options, quiet; NULL (a failure recorded) when
 * it does not open */
static df_engine *open_tiny(void)
{
    char dir[512];
    snprintf(dir, sizeof dir, "%s/k3-tiny-a/checkpoint", testdata_dir());
    df_engine_opts o;
    df_engine_opts_default(&o);
    o.quiet = 1;
    df_engine *eng;
    df_error err = {0};
    if (df_engine_open(dir, &o, &eng, &err)) {
        t_fail(__FILE__, __LINE__, "open %s: %s", dir, err.msg);
        return NULL;
    }
    return eng;
}

static void test_errors_keep_session(void)
{
    df_engine *eng = open_tiny();
    if (!eng) return;
    df_error err = {0};
    df_session_opts so = {.n_ctx = 8, .max_batch = 4};
    df_session *s;
    TCHECK(df_session_new(eng, &so, &s, &err) == 0);
    int32_t bad[2] = {1, 640};
    TCHECK(df_session_eval(s, bad, 2, NULL, 0, &err) == -1);
    TCHECKF(err.code == DF_ERR_ARG && strstr(err.msg, "640"), "bad id message: %s", err.msg);
    TCHECK(df_session_pos(s) == 0);
    df_err_clear(&err);
    TCHECK(df_session_eval(s, ids, 6, NULL, 0, &err) == 0);
    TCHECK(df_session_eval(s, ids, 3, NULL, 0, &err) == -1);
    TCHECKF(err.code == DF_ERR_LIMIT && strstr(err.msg, "context full"), "context message: %s", err.msg);
    TCHECK(df_session_pos(s) == 6);
    df_err_clear(&err);
    TCHECK(df_session_eval(s, ids, 2, NULL, 0, &err) == 0);
    df_session_reset(s);
    TCHECK(df_session_pos(s) == 0);
    df_session_free(s);
    df_engine_close(eng);
}

/* A copy of the fixture checkpoint with one tensor poisoned: bytes [0, n)
 * of tensor `name` (found in whichever shard holds it) set to `byte`
 * (0xff: BF16 NaN pairs, MXFP4 scales of NaN).  Writes the copy's path. */
static int poisoned_copy(const char *tag, const char *name, size_t n, int byte, char *out, size_t n_out)
{
    char src[512];
    snprintf(src, sizeof src, "%s/k3-tiny-a/checkpoint", testdata_dir());
    snprintf(out, n_out, "%s/nan-%s", test_scratch(), tag);
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && cp -r '%s' '%s'", out, src, out);
    if (system(cmd) != 0) {
        t_fail(__FILE__, __LINE__, "cannot copy %s", src);
        return -1;
    }
    for (int i = 1; i <= 3; i++) {
        char shard[1200];
        snprintf(shard, sizeof shard, "%s/model-%05d-of-000003.safetensors", out, i);
        st_file f;
        df_error err = {0};
        if (st_open(shard, &f, &err)) continue;
        const st_tensor *t = st_find(&f, name);
        if (t) {
            if (n > t->nbytes) n = (size_t)t->nbytes;
            unsigned char buf[64];
            memset(buf, byte, sizeof buf);
            int fd = open(shard, O_WRONLY);
            int ok = fd >= 0 && pwrite(fd, buf, n < sizeof buf ? n : sizeof buf, (off_t)t->offset) > 0;
            if (fd >= 0) close(fd);
            st_deinit(&f);
            if (!ok) t_fail(__FILE__, __LINE__, "cannot poison %s", shard);
            return ok ? 0 : -1;
        }
        st_deinit(&f);
    }
    t_fail(__FILE__, __LINE__, "no tensor %s in the fixture", name);
    return -1;
}

/* A NaN weight stops evaluation with an error naming the first layer and
 * part where non-finite values appear (not token 0 forever), through the
 * API (a prompt without logits too, and a decode step) and `deltafin run`. */
static void test_nonfinite_named(void)
{
    static const struct {
        const char *tag, *tensor;
        size_t n;
        const char *want;
    } cases[] = {
        {"attn", "language_model.model.layers.2.self_attn.o_proj.weight", 2, "layer 2's KDA attention"},
        {"moe", "language_model.model.layers.3.block_sparse_moe.routed_expert_down_proj.weight", 2, "layer 3's MoE"},
        {"dense", "language_model.model.layers.0.mlp.down_proj.weight", 2, "layer 0's dense MLP"},
        {"expert", "language_model.model.layers.5.block_sparse_moe.experts.0.w2.weight_scale", 64, "layer 5's MoE"},
        {"head", "language_model.lm_head.weight", 2, "output norm and lm_head"},
    };
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        char dir[1024];
        if (poisoned_copy(cases[ci].tag, cases[ci].tensor, cases[ci].n, 0xff, dir, sizeof dir)) continue;
        df_engine_opts o;
        df_engine_opts_default(&o);
        o.quiet = 1;
        df_engine *eng;
        df_error err = {0};
        if (df_engine_open(dir, &o, &eng, &err)) {
            t_fail(__FILE__, __LINE__, "%s: open: %s", cases[ci].tag, err.msg);
            continue;
        }
        df_model_info info;
        df_engine_info(eng, &info);
        df_session_opts so;
        df_session_opts_default(&so);
        df_session *s;
        TCHECK(df_session_new(eng, &so, &s, &err) == 0);
        float *lg = malloc((size_t)info.vocab * sizeof(float));
        /* the whole prompt with its logits; then, for a part every token
         * meets, the prompt with no logits wanted and one decode step */
        int rc = df_session_eval(s, ids, N_IDS, lg, 0, &err);
        int is_expert = !strcmp(cases[ci].tag, "expert");
        TCHECKF(rc == -1 && err.code == DF_ERR_NUMERIC && strstr(err.msg, cases[ci].want),
                "%s: rc %d code %d: %s", cases[ci].tag, rc, err.code, err.msg);
        /* the failing chunk is not taken: the first for a layer's part, the
         * last (the one whose logits are wanted) for the head */
        int want_pos = strcmp(cases[ci].tag, "head") ? 0 : (N_IDS - 1) / df_session_max_batch(s) * df_session_max_batch(s);
        TCHECKF(df_session_pos(s) == want_pos, "%s: pos %d, not %d", cases[ci].tag, df_session_pos(s), want_pos);
        if (!is_expert && strcmp(cases[ci].tag, "head")) {
            df_session_reset(s);
            df_err_clear(&err);
            rc = df_session_eval(s, ids, 1, NULL, 0, &err);
            TCHECKF(rc == -1 && strstr(err.msg, cases[ci].want), "%s, no logits: %s", cases[ci].tag, err.msg);
        }
        free(lg);
        df_session_free(s);
        df_engine_close(eng);
        if (ci != 0) continue;
        /* the CLI: a clear error and a failing exit, no tokens */
        char out[4096], errs[4096];
        const char *argv[] = {build_bin("deltafin"), "run", "--model", dir, "--prompt-ids", "387,267,263", "--max-new",
                              "4", NULL};
        int st = t_run(argv, out, sizeof out, errs, sizeof errs);
        TCHECKF(st != 0 && strstr(errs, "non-finite") && strstr(errs, "layer 2"), "run: status %d, stderr: %s", st,
                errs);
    }
    test_scratch_remove();
}

static void put_u32s(FILE *f, const uint32_t *v, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        unsigned char b[4] = {(unsigned char)v[i], (unsigned char)(v[i] >> 8), (unsigned char)(v[i] >> 16),
                              (unsigned char)(v[i] >> 24)};
        CHECK(fwrite(b, 1, 4, f) == 4);
    }
}

/* One route record of T positions at layer 1, top_k 1 (scores and weights 1) */
static void put_route(FILE *f, uint32_t pos0, const uint32_t *route, uint32_t T)
{
    uint32_t h[6] = {TRACE_ROUTE, 16 + 12 * T, pos0, 1, T, 1}, one = 0x3f800000u;
    put_u32s(f, h, 6);
    put_u32s(f, route, T);
    for (uint32_t i = 0; i < 2 * T; i++) put_u32s(f, &one, 1);
}

/* The policies the study added (trace cache), worked out by hand on a
 * binary trace: layer 1 of 4 experts, top_k 1, 2 slots; step A a chunk of
 * four positions routed 0 0 0 1, then one position each: B 2, C 0, D 1,
 * E 0; before B the look-ahead predicts expert 1.
 *   LFU (rows): A adds 3 rows / 2 mean = 1.5 to 0, 0.5 to 1; B evicts 1;
 *     C hits 0; D evicts 2 (count 1 < 2.5); E hits: 2 hits.
 *   LFU counting steps: 0 and 1 tie at 1, B evicts 0 (older); C evicts 1;
 *     D evicts 2; E hits: 1.  LRU the same: 1.
 *   LFU + look-ahead: B spares the predicted 1 and evicts 0; C evicts 1
 *     (0.5); D evicts 2; E hits: 1.
 *   static {0, 1}: 2 + 1 = 3.  Belady streams 2 through: C, D, E hit: 3.
 *   Belady reading every expert into the cache: B evicts 1 (used after 0),
 *     C hits, D evicts 2 (never used again), E hits: 2.
 *   prior (expert 1 counted 10 times, as a JSON-lines trace or a heat
 *     file): LFU starts 0 at 1.5, 1 at 10.5; B evicts 0, C evicts 2, D and
 *     E hit: 2; the prior's hot set {1}: D hits: 1; per layer: layer 1 gets
 *     the one slot, every use misses: 0. */
static void test_cachesim_policies(void)
{
    char path[600], prior[600], heat[600];
    snprintf(path, sizeof path, "%s/policies.trace", test_scratch());
    snprintf(prior, sizeof prior, "%s/prior.trace", test_scratch());
    snprintf(heat, sizeof heat, "%s/prior.heat", test_scratch());
    FILE *f = fopen(path, "wb");
    CHECK(f);
    char hdr[256];
    int hl = snprintf(hdr, sizeof hdr,
                      "{\"trace\":\"deltafin routes\",\"version\":1,\"model\":\"by hand\",\"layers\":2,\"experts\":4,"
                      "\"top_k\":1,\"hidden\":8,\"vocab\":16,\"shared_experts\":0,\"moe_layers\":[1]}");
    while (hl % 4) hdr[hl++] = ' ';
    CHECK(fwrite(TRACE_MAGIC, 1, TRACE_MAGIC_LEN, f) == TRACE_MAGIC_LEN);
    uint32_t vh[2] = {TRACE_VERSION, (uint32_t)hl};
    put_u32s(f, vh, 2);
    CHECK(fwrite(hdr, 1, (size_t)hl, f) == (size_t)hl);
    static const uint32_t a[4] = {0, 0, 0, 1}, b = 2, c = 0, d = 1, e = 0;
    put_route(f, 0, a, 4);
    uint32_t pred[9] = {TRACE_PREDICT, 28, 4, 0, 1, 1, 1, 1, 1}; /* pos 4, layer 0 -> 1, d 1, T 1, k 1: expert 1 */
    put_u32s(f, pred, 9);
    put_route(f, 4, &b, 1);
    put_route(f, 5, &c, 1);
    put_route(f, 6, &d, 1);
    put_route(f, 7, &e, 1);
    CHECK(fclose(f) == 0);
    f = fopen(prior, "w");
    CHECK(f);
    fprintf(f, "{\"trace\":\"deltafin routes\",\"version\":1,\"layers\":2,\"experts\":4,\"top_k\":1}\n");
    for (int i = 0; i < 10; i++) fprintf(f, "{\"pos\":%d,\"layer\":1,\"experts\":[1],\"weights\":[1]}\n", i);
    CHECK(fclose(f) == 0);
    float counts[8] = {0, 0, 0, 0, 0, 10, 0, 0};
    df_error err = {0};
    TCHECKF(heat_save(heat, 2, 4, counts, &err) == 0, "%s", err.msg);
    const char *priors[3] = {NULL, prior, heat};
    for (int pi = 0; pi < 3; pi++) {
        int two = 2;
        df_cachesim_row r;
        TCHECKF(df_cachesim_layers(path, priors[pi], &two, 1, &r, NULL, NULL, NULL, &err) == 0, "%s", err.msg);
        TCHECKF(r.steps == 5 && r.accesses == 6 && r.hits_lfu == 2 && r.hits_lfu_steps == 1 && r.hits_lru == 1 &&
                    r.has_lookahead && r.hits_lookahead == 1 && r.hits_static == 3 && r.hits_belady == 3 &&
                    r.hits_belady_demand == 2,
                "steps %llu accesses %llu: LFU %llu, LFU steps %llu, LRU %llu, look-ahead %llu, static %llu, Belady "
                "%llu, demand %llu",
                (unsigned long long)r.steps, (unsigned long long)r.accesses, (unsigned long long)r.hits_lfu,
                (unsigned long long)r.hits_lfu_steps, (unsigned long long)r.hits_lru,
                (unsigned long long)r.hits_lookahead, (unsigned long long)r.hits_static,
                (unsigned long long)r.hits_belady, (unsigned long long)r.hits_belady_demand);
        TCHECK(r.has_prior == (pi > 0));
        if (pi)
            TCHECKF(r.hits_prior == 2 && r.hits_prior_static == 1 && r.hits_prior_layers == 0,
                    "prior %s: LFU %llu, static %llu, per layer %llu", priors[pi], (unsigned long long)r.hits_prior,
                    (unsigned long long)r.hits_prior_static, (unsigned long long)r.hits_prior_layers);
    }
    /* a prior of another shape, and one that is neither a trace nor a heat file */
    int two = 2;
    df_cachesim_row r;
    f = fopen(prior, "w");
    CHECK(f);
    fprintf(f, "{\"trace\":\"deltafin routes\",\"version\":1,\"layers\":3,\"experts\":4,\"top_k\":1}\n"
               "{\"pos\":0,\"layer\":1,\"experts\":[1],\"weights\":[1]}\n");
    CHECK(fclose(f) == 0);
    df_err_clear(&err);
    TCHECK(df_cachesim_layers(path, prior, &two, 1, &r, NULL, NULL, NULL, &err) == -1 && strstr(err.msg, "another shape"));
    f = fopen(prior, "w");
    CHECK(f && fputs("not a trace\n", f) >= 0 && fclose(f) == 0);
    df_err_clear(&err);
    TCHECK(df_cachesim_layers(path, prior, &two, 1, &r, NULL, NULL, NULL, &err) == -1 &&
           strstr(err.msg, "neither a heat file"));
    test_scratch_remove();
}

/* deltafin cachesim on a trace whose answers are worked out by hand:
 * one layer, uses 0 1 0 2 0 1 0 3, two slots.
 *   Belady: misses 0, 1; hit 0; 2 is never used again, so it streams through
 *           without evicting; hits 0, 1, 0; miss 3: 4 hits.
 *   static: keeps {0, 1} (used 4 and 2 times): 3 + 1 = 4 hits.
 *   LRU:    0 1 | 0 hit | 2 evicts 1 | 0 hit | 1 evicts 2 | 0 hit | 3: 3 hits.
 * A malformed trace is refused with the line named. */
static void test_cachesim_known_answers(void)
{
    char path[600], bad[600];
    snprintf(path, sizeof path, "%s/known.trace", test_scratch());
    snprintf(bad, sizeof bad, "%s/bad.trace", test_scratch());
    FILE *f = fopen(path, "w");
    CHECK(f);
    fprintf(f, "{\"trace\":\"deltafin routes\",\"version\":1,\"layers\":1,\"experts\":4,\"top_k\":1}\n");
    static const int seq[] = {0, 1, 0, 2, 0, 1, 0, 3};
    for (int i = 0; i < 8; i++) fprintf(f, "{\"pos\":%d,\"layer\":0,\"experts\":[%d],\"weights\":[1]}\n", i, seq[i]);
    CHECK(fclose(f) == 0);
    int slots[2] = {2, 4};
    df_cachesim_row rows[2];
    df_error err = {0};
    TCHECKF(df_cachesim(path, slots, 2, rows, &err) == 0, "%s", err.msg);
    TCHECK(rows[0].accesses == 8 && rows[0].steps == 8);
    TCHECKF(rows[0].hits_belady == 4 && rows[0].hits_static == 4 && rows[0].hits_lru == 3,
            "2 slots: Belady %llu static %llu LRU %llu", (unsigned long long)rows[0].hits_belady,
            (unsigned long long)rows[0].hits_static, (unsigned long long)rows[0].hits_lru);
    /* every expert fits: only the four first uses miss, for every policy */
    TCHECK(rows[1].hits_belady == 4 && rows[1].hits_static == 4 && rows[1].hits_lru == 4 && rows[1].hits_lfu == 4);
    /* per layer (trace cache): two layers of that sequence, interleaved;
     * 4 slots give each layer 2, so each alone has the answers above */
    char two[600];
    snprintf(two, sizeof two, "%s/two.trace", test_scratch());
    f = fopen(two, "w");
    CHECK(f);
    fprintf(f, "{\"trace\":\"deltafin routes\",\"version\":1,\"layers\":3,\"experts\":4,\"top_k\":1}\n");
    for (int i = 0; i < 8; i++)
        for (int il = 1; il < 3; il++)
            fprintf(f, "{\"pos\":%d,\"layer\":%d,\"experts\":[%d],\"weights\":[1]}\n", i, il, seq[i]);
    CHECK(fclose(f) == 0);
    df_cachesim_row pooled[1], *pl = NULL;
    int four = 4, lids[3], nl = 0;
    TCHECKF(df_cachesim_layers(two, NULL, &four, 1, pooled, &pl, lids, &nl, &err) == 0, "%s", err.msg);
    TCHECK(nl == 2 && lids[0] == 1 && lids[1] == 2 && pooled[0].accesses == 16 && pooled[0].steps == 16);
    for (int j = 0; pl && j < nl; j++)
        TCHECKF(pl[j].slots == 2 && pl[j].accesses == 8 && pl[j].hits_belady == 4 && pl[j].hits_static == 4 &&
                    pl[j].hits_lru == 3,
                "layer %d alone: Belady %llu static %llu LRU %llu", lids[j], (unsigned long long)pl[j].hits_belady,
                (unsigned long long)pl[j].hits_static, (unsigned long long)pl[j].hits_lru);
    free(pl);
    f = fopen(bad, "w");
    CHECK(f);
    fprintf(f, "{\"trace\":\"deltafin routes\",\"version\":1,\"layers\":1,\"experts\":4,\"top_k\":1}\n"
               "{\"pos\":0,\"layer\":0,\"experts\":[9]}\n");
    CHECK(fclose(f) == 0);
    df_err_clear(&err);
    TCHECK(df_cachesim(bad, slots, 1, rows, &err) == -1 && strstr(err.msg, "bad.trace:2") &&
           strstr(err.msg, "out of range"));
    test_scratch_remove();
}

/* df_model_info's work figures (bench's roofline) against an independent
 * reading of the checkpoint's headers: the trunk's FLOP a position is 2 x
 * the entries of every 2-D BF16 matrix in the layers except the routed
 * experts and the folded [1, h] residual projections; the experts' is 2 x
 * k x the MoE layers x an expert's values (packed bytes x 2 per piece); a
 * decoded token reads those trunk matrices, the output head and k experts
 * per MoE layer (packed and scale bytes).  Then df_measure_limits gives
 * positive rates for every format. */
static void test_work_figures(void)
{
    char dir[512];
    snprintf(dir, sizeof dir, "%s/k3-tiny-a/checkpoint", testdata_dir());
    df_engine *eng = open_tiny();
    if (!eng) return;
    df_error err = {0};
    df_model_info info;
    df_engine_info(eng, &info);
    df_engine_close(eng);
    uint64_t tp = 0, tb = 0, ev = 0, eb = 0;
    int moe_layers = 0;
    for (int sh = 1; sh <= 3; sh++) {
        char path[600];
        snprintf(path, sizeof path, "%s/model-%05d-of-000003.safetensors", dir, sh);
        st_file f;
        if (st_open(path, &f, &err)) do { t_fail(__FILE__, __LINE__, "%s: %s", path, err.msg); return; } while (0);
        for (size_t i = 0; i < f.n_tensors; i++) {
            const st_tensor *t = &f.tensors[i];
            const char *n = t->name;
            if (strstr(n, ".experts.0.")) { /* expert 0 of each MoE layer stands for every expert */
                eb += t->nbytes;
                if (strstr(n, "weight_packed")) ev += 2 * t->nbytes;
                if (strstr(n, ".w1.weight_packed")) moe_layers++;
                continue;
            }
            if (strstr(n, ".experts.") || t->n_dims != 2 || t->dtype != ST_BF16 || strstr(n, "_res_proj")) continue;
            if (strstr(n, "lm_head")) tb += t->nbytes;
            if (!strstr(n, ".layers.")) continue;
            tp += (uint64_t)t->shape[0] * (uint64_t)t->shape[1];
            tb += t->nbytes;
        }
        st_deinit(&f);
    }
    uint64_t k = (uint64_t)info.n_experts_used;
    TCHECKF(info.trunk_flops_per_position == 2 * tp, "trunk FLOP a position %llu, the headers say %llu",
            (unsigned long long)info.trunk_flops_per_position, (unsigned long long)(2 * tp));
    TCHECKF(info.expert_flops_per_position == 2 * k * ev, "expert FLOP a position %llu, the headers say %llu",
            (unsigned long long)info.expert_flops_per_position, (unsigned long long)(2 * k * ev));
    TCHECKF(info.weight_bytes_per_token == tb + k * eb, "weight bytes a token %llu, the headers say %llu",
            (unsigned long long)info.weight_bytes_per_token, (unsigned long long)(tb + k * eb));
    TCHECK(moe_layers > 0 && tp > 0);
    df_limits l;
    if (df_measure_limits(NULL, 1, &l, &err)) do { t_fail(__FILE__, __LINE__, "df_measure_limits: %s", err.msg); return; } while (0);
    fprintf(stderr, "    %s: memory read %.1f GB/s; in cache (32 / 1 positions): bf16 %.1f / %.1f, mxfp4 %.1f / %.1f GFLOP/s\n",
            l.kernels, l.mem_read_gbs, l.bf16_gflops, l.bf16_gflops_1, l.mxfp4_gflops, l.mxfp4_gflops_1);
    TCHECK(l.mem_read_gbs > 0.1 && l.bf16_gflops > 0.01 && l.f16_gflops > 0.01 && l.q8_0_gflops > 0.01 &&
           l.mxfp4_gflops > 0.01 && l.mxfp4_gg_gflops > 0.01 && l.bf16_gflops_1 > 0.01 && l.mxfp4_gg_gflops_1 > 0.01);
    if (df_measure_limits("no-such-isa", 1, &l, &err) == 0) do { t_fail(__FILE__, __LINE__, "an unknown --kernels name was accepted"); return; } while (0);
}

/* `deltafin bench` without llama.cpp on the fixture: the table, the
 * machine line and the roofline lines, whose figures agree with each other
 * (GFLOP/s = tok/s x GFLOP a position; the fraction = tok/s / the roof);
 * a missing model and a missing --model are named. */
static void test_bench_cli(void)
{
    static char out[1 << 16], errb[1 << 16];
    char dir[512];
    snprintf(dir, sizeof dir, "%s/k3-tiny-a/checkpoint", testdata_dir());
    const char *argv[] = {build_bin("deltafin"), "bench", "--model", dir, "--threads", "1", "--prompt-len", "12",
                          "--gen", "3", "--reps", "1", NULL};
    int rc = t_run(argv, out, sizeof out, errb, sizeof errb);
    if (rc) do { t_fail(__FILE__, __LINE__, "bench failed (%d): %s", rc, errb); return; } while (0);
    double gf = 0, tps = 0, gfs = 0, frac = 0, roof = 0, gb = 0, dtps = 0, gbs = 0, mfrac = 0, mroof = 0;
    const char *p = strstr(out, "\nprefill: ");
    TCHECKF(p && sscanf(p, "\nprefill: %lf GFLOP", &gf) == 1, "no prefill line: %s", out);
    p = p ? strstr(p, "\n  deltafin ") : NULL;
    TCHECKF(p && sscanf(p, "\n  deltafin %lf tok/s = %lf GFLOP/s, %lf of the kernels' in-cache rate (%lf tok/s)",
                        &tps, &gfs, &frac, &roof) == 4,
            "no deltafin prefill roofline: %s", out);
    p = strstr(out, "\ndecode: ");
    TCHECKF(p && sscanf(p, "\ndecode: %lf GB of weights a token", &gb) == 1, "no decode line: %s", out);
    const char *q = p ? strstr(p, "memory roof ") : NULL;
    TCHECK(q && sscanf(q, "memory roof %lf", &mroof) == 1);
    p = p ? strstr(p, "\n  deltafin ") : NULL;
    TCHECKF(p && sscanf(p, "\n  deltafin %lf tok/s = %lf GB/s, %lf of the memory read bandwidth", &dtps, &gbs,
                        &mfrac) == 3,
            "no deltafin decode roofline: %s", out);
    TCHECK(strstr(out, "this machine, measured in this run (1 threads"));
    TCHECK(tps > 0 && gf > 0 && roof > 0 && dtps > 0 && gb > 0 && mroof > 0);
    TCHECKF(fabs(gfs - tps * gf) <= 0.06 + 0.002 * gfs + 6e-4 * tps * gf, "GFLOP/s %g != %g tok/s x %g GFLOP", gfs, tps, gf);
    TCHECKF(fabs(frac - tps / roof) <= 0.006 + 0.002 * frac, "fraction %g != %g / %g", frac, tps, roof);
    TCHECKF(fabs(gbs - dtps * gb) <= 0.006 + 0.002 * gbs + 6e-4 * dtps * gb, "GB/s %g != %g x %g", gbs, dtps, gb);
    TCHECKF(fabs(mfrac - dtps / mroof) <= 0.006 + 0.002 * mfrac, "memory fraction %g != %g / %g", mfrac, dtps, mroof);
    /* --json: the same figures as a last JSON line */
    const char *aj[] = {build_bin("deltafin"), "bench", "--model", dir, "--threads", "1", "--prompt-len", "12",
                        "--gen", "3", "--reps", "1", "--json", NULL};
    rc = t_run(aj, out, sizeof out, errb, sizeof errb);
    const char *rl = strstr(out, "{\"roofline\":");
    df_error je = {0};
    json_doc *doc = rl ? json_parse(rl, strcspn(rl, "\n"), &je) : NULL;
    TCHECKF(rc == 0 && doc, "no roofline JSON line (%s): %s", je.msg, out);
    if (doc) {
        const json_value *r = json_get(json_root(doc), "roofline"), *dfn = r ? json_get(r, "deltafin") : NULL;
        double ptps = 0, pof = 0, proof = 0, mem = 0;
        TCHECK(dfn && !json_get_num(dfn, "prefill_tps", &ptps) && !json_get_num(dfn, "prefill_of_roof", &pof) &&
               !json_get_num(r, "prefill_roof_tps", &proof) && !json_get_num(r, "mem_read_gbs", &mem));
        TCHECKF(ptps > 0 && proof > 0 && mem > 0 && fabs(pof - ptps / proof) < 1e-3 * (1 + pof),
                "roofline JSON: %g of %g tok/s is not %g", ptps, proof, pof);
        json_free(doc);
    }
    const char *bad[] = {build_bin("deltafin"), "bench", "--model", "/nonexistent/model", NULL};
    TCHECK(t_run(bad, out, sizeof out, errb, sizeof errb) != 0 && strstr(errb, "/nonexistent/model"));
    const char *none[] = {build_bin("deltafin"), "bench", "--threads", "1", NULL};
    TCHECK(t_run(none, out, sizeof out, errb, sizeof errb) != 0 && strstr(errb, "--model"));
}

static const test_case tests[] = {
    {"cachesim_known_answers", test_cachesim_known_answers},
    {"cachesim_policies", test_cachesim_policies},
    {"batch_vs_sequential_bit_identical", test_batch_vs_sequential},
    {"thread_counts_bit_identical", test_thread_counts},
    {"kernel_sets_bit_identical", test_kernel_sets},
    {"cache_sizes_bit_identical", test_cache_sizes},
    {"alloc_guard_trips", test_alloc_guard_trips},
    {"errors_keep_session_usable", test_errors_keep_session},
    {"nonfinite_weights_named", test_nonfinite_named},
    {"work_figures_and_limits", test_work_figures},
    {"bench_cli_roofline", test_bench_cli},
};

int main(int argc, char **argv) { return test_main(tests, NTESTS(tests), argc, argv); }
