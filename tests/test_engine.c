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
#include "kernels.h"
#include "engine_impl.h"
#include "threadpool.h"
#include "safetensors.h"
#include "util.h"

#include <fcntl.h>
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

static void test_errors_keep_session(void)
{
    char dir[512];
    snprintf(dir, sizeof dir, "%s/k3-tiny-a/checkpoint", testdata_dir());
    df_engine_opts o;
    df_engine_opts_default(&o);
    o.quiet = 1;
    df_engine *eng;
    df_error err = {0};
    if (df_engine_open(dir, &o, &eng, &err)) {
        t_fail(__FILE__, __LINE__, "open: %s", err.msg);
        return;
    }
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

static const test_case tests[] = {
    {"cachesim_known_answers", test_cachesim_known_answers},
    {"batch_vs_sequential_bit_identical", test_batch_vs_sequential},
    {"thread_counts_bit_identical", test_thread_counts},
    {"kernel_sets_bit_identical", test_kernel_sets},
    {"cache_sizes_bit_identical", test_cache_sizes},
    {"alloc_guard_trips", test_alloc_guard_trips},
    {"errors_keep_session_usable", test_errors_keep_session},
    {"nonfinite_weights_named", test_nonfinite_named},
};

int main(int argc, char **argv) { return test_main(tests, NTESTS(tests), argc, argv); }
