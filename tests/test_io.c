/* test_io.c - expert I/O: the read queue (both backends, O_DIRECT and
 * buffered, short reads at EOF, errors), exactness of the output across
 * memory budgets, I/O modes and backends, hit accounting, a clear error when
 * an expert file is truncated under a running engine, and peak RSS within
 * --mem + 5 %.
 */
#define _GNU_SOURCE
#include "harness.h"
#include "expert_remote.h"
#include "engine.h"
#include "file.h"
#include "heat.h"
#include "util.h"

#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* One backend, one open mode.  O_DIRECT that the file system refuses is a
 * skip (counted), never a silent pass. */
static void test_queue(int backend, enum io_mode mode)
{
    char path[300];
    snprintf(path, sizeof path, "/var/tmp/df_ioq_%d", (int)getpid());
    size_t size = (size_t)3 << 20 | 123; /* not a multiple of the block size */
    uint8_t *data = malloc(size);
    for (size_t i = 0; i < size; i++) data[i] = (uint8_t)(i * 131 + (i >> 11));
    FILE *f = fopen(path, "wb");
    CHECK(f && fwrite(data, 1, size, f) == size && fclose(f) == 0);
    df_file df;
    df_error err = {0};
    io_queue *q = NULL;
    uint8_t *bufs = NULL;
    if (df_file_open(&df, path, mode, &err)) {
        if (mode == IO_DIRECT) t_skip("O_DIRECT unavailable here: %s", err.msg);
        else t_fail(__FILE__, __LINE__, "open: %s", err.msg);
        goto out;
    }
    TCHECKF(df.direct == (mode == IO_DIRECT), "asked for %s, got %s", mode == IO_DIRECT ? "O_DIRECT" : "buffered",
            df.direct ? "O_DIRECT" : "buffered");
    q = io_queue_new(8, (enum io_backend)backend, &err);
    if (!q) {
        t_skip("backend unavailable: %s", err.msg);
        df_file_close(&df);
        goto out;
    }
    enum { N = 40 };
    bufs = aligned_alloc_raw((size_t)N * 65536);
    io_req reqs[N];
    for (int i = 0; i < N; i++) {
        uint64_t off = (uint64_t)((i * 7919) % 760) * 4096;
        reqs[i] = (io_req){.fd = df.fd, .off = off, .len = 65536, .buf = bufs + (size_t)i * 65536, .tag = i};
    }
    reqs[N - 1].off = align_down(size - 1000, 4096); /* short read at EOF */
    io_queue_submit(q, reqs, N);
    int seen = 0;
    while (io_queue_in_flight(q)) {
        io_done d[16];
        int n = io_queue_wait(q, d, 16);
        for (int j = 0; j < n; j++) {
            const io_req *r = &reqs[d[j].tag];
            size_t want = r->off + r->len <= size ? r->len : size - r->off;
            TCHECKF(d[j].result == (int64_t)want, "read %lld: %lld bytes, expected %zu", (long long)d[j].tag,
                    (long long)d[j].result, want);
            TCHECKF(!memcmp(r->buf, data + r->off, want), "read %lld: wrong bytes", (long long)d[j].tag);
            seen++;
        }
    }
    TCHECK(seen == N);
    /* polling alone (never blocking) takes every read home, the ones
     * queued behind the depth of 8 included (io_uring: poll submits them) */
    memset(bufs, 0, (size_t)N * 65536);
    io_queue_submit(q, reqs, N);
    seen = 0;
    for (int spins = 0; io_queue_in_flight(q) && spins < 20000; spins++) {
        io_done d[16];
        int n = io_queue_poll(q, d, 16);
        if (!n) usleep(500);
        for (int j = 0; j < n; j++) {
            const io_req *r = &reqs[d[j].tag];
            size_t want = r->off + r->len <= size ? r->len : size - r->off;
            TCHECKF(d[j].result == (int64_t)want && !memcmp(r->buf, data + r->off, want), "polled read %lld",
                    (long long)d[j].tag);
            seen++;
        }
    }
    TCHECKF(seen == N, "polling took %d of %d reads home", seen, N);
    /* an error comes back as -errno */
    io_req bad = {.fd = 987654, .off = 0, .len = 4096, .buf = bufs, .tag = 7};
    io_queue_submit(q, &bad, 1);
    io_done d;
    TCHECK(io_queue_wait(q, &d, 1) == 1 && d.tag == 7 && d.result < 0);
    fprintf(stderr, "    %s, %s: ok\n", io_queue_backend(q), df.direct ? "O_DIRECT" : "buffered");
    aligned_free(bufs);
    io_queue_free(q);
    df_file_close(&df);
out:
    unlink(path);
    free(data);
}

static void test_queue_threads_direct(void) { test_queue(IO_BACKEND_THREADS, IO_DIRECT); }
static void test_queue_threads_buffered(void) { test_queue(IO_BACKEND_THREADS, IO_BUFFERED); }
static void test_queue_uring_direct(void) { test_queue(IO_BACKEND_URING, IO_DIRECT); }
static void test_queue_uring_buffered(void) { test_queue(IO_BACKEND_URING, IO_BUFFERED); }

typedef struct {
    size_t mem, cache;
    const char *io, *backend;
    int threads, chunk, no_prefetch;
    const char *const *xpaths;
    int n_xpaths;
    int trunk_stream;
    int batch; /* the session's max_batch (0: 8) */
} cfg;

static uint64_t g_expert_bytes; /* the last run's model: one routed expert */

/* "uring" where io_uring works here; else the pread pool, said once (qemu-user
 * has no io_uring; neither has a build without liburing) */
static const char *backend_here(const char *b)
{
    static int works = -1;
    if (!b || strcmp(b, "uring")) return b;
    if (works < 0) {
        char why[256];
        works = df_io_uring_works(why, sizeof why);
        if (!works) fprintf(stderr, "    io_uring unavailable here (%s): its variants run on the pread pool\n", why);
    }
    return works ? b : "threads";
}

static float *run(const char *dir, const cfg *c, const int32_t *ids, int n, int *V, df_stats *st)
{
    df_engine_opts o;
    df_engine_opts_default(&o);
    o.n_threads = c->threads ? c->threads : 2;
    o.quiet = 1;
    o.mem_budget = c->mem;
    o.expert_cache_bytes = c->cache;
    o.io_mode = c->io;
    o.io_backend = backend_here(c->backend);
    o.plan_ctx = 256;
    o.plan_batch = c->batch ? c->batch : 8;
    o.no_prefetch = c->no_prefetch;
    o.trunk_stream = c->trunk_stream;
    o.expert_paths = c->xpaths;
    o.n_expert_paths = c->n_xpaths;
    df_engine *eng;
    df_error err = {0};
    if (df_engine_open(dir, &o, &eng, &err)) {
        t_fail(__FILE__, __LINE__, "open %s: %s", dir, err.msg);
        return NULL;
    }
    df_model_info info;
    df_engine_info(eng, &info);
    *V = info.vocab;
    g_expert_bytes = info.expert_bytes;
    df_session *s;
    df_session_opts so = {.n_ctx = 256, .max_batch = c->batch ? c->batch : 8};
    TCHECK(df_session_new(eng, &so, &s, &err) == 0);
    float *out = malloc((size_t)n * info.vocab * sizeof(float));
    int chunk = c->chunk ? c->chunk : n;
    for (int off = 0; off < n; off += chunk) {
        int k = n - off < chunk ? n - off : chunk;
        if (df_session_eval(s, ids + off, k, out + (size_t)off * info.vocab, 1, &err))
            t_fail(__FILE__, __LINE__, "eval: %s", err.msg);
    }
    if (st) df_engine_stats(eng, st);
    df_session_free(s);
    df_engine_close(eng);
    return out;
}

static void test_exact_across_io(void)
{
    char dir[512];
    if (gen_model("small", "--preset small --seed 11", dir, sizeof dir)) return;
    int32_t ids[24];
    for (int i = 0; i < 24; i++) ids[i] = (i * 131 + 7) % 3800;
    int V;
    df_stats st;
    cfg base = {.cache = (size_t)1 << 30, .io = "buffered", .backend = "threads", .threads = 1, .chunk = 1,
                .no_prefetch = 1};
    float *a = run(dir, &base, ids, 24, &V, &st);
    const cfg variants[] = {
        {.mem = 0, .cache = 0, .io = "auto", .backend = "auto"},
        {.cache = 5 * 20480, .io = "direct", .backend = "uring"},
        {.cache = 1, .io = "direct", .backend = "threads"},
        {.cache = 64 * 20480, .io = "buffered", .backend = "uring", .chunk = 5},
        {.mem = (size_t)200 << 20, .io = "auto", .backend = "auto", .threads = 3, .chunk = 3},
        {.cache = 40 * 20480, .io = "direct", .backend = "uring", .chunk = 1, .no_prefetch = 1},
        {.cache = 40 * 20480, .io = "direct", .backend = "uring", .chunk = 1},
        {.cache = 200 * 20480, .io = "buffered", .backend = "threads", .chunk = 1},
    };
    for (size_t i = 0; i < sizeof variants / sizeof variants[0]; i++) {
        float *b = run(dir, &variants[i], ids, 24, &V, NULL);
        if (a && b)
            TCHECKF(!memcmp(a, b, (size_t)24 * V * sizeof(float)),
                    "variant %zu (cache %zu, io %s, backend %s): logits differ", i, variants[i].cache, variants[i].io,
                    variants[i].backend);
        free(b);
    }
    free(a);
}

static void test_hit_accounting(void)
{
    char dir[512];
    if (gen_model("small", "--preset small --seed 11", dir, sizeof dir)) return;
    int32_t ids[6] = {5, 900, 17, 2048, 33, 1000};
    int V;
    df_stats st;
    /* everything fits: each expert is read once, every later use is a hit */
    cfg big = {.cache = (size_t)1 << 30, .io = "auto", .backend = "auto", .chunk = 1, .no_prefetch = 1};
    float *a = run(dir, &big, ids, 6, &V, &st);
    TCHECKF(st.expert_misses == st.expert_reads, "misses %llu != reads %llu", (unsigned long long)st.expert_misses,
            (unsigned long long)st.expert_reads);
    /* 7 MoE layers x 8 experts per token */
    TCHECK(st.expert_hits + st.expert_misses == 6 * 7 * 8);
    TCHECK(st.expert_misses <= 7 * 128);
    /* one slot: nothing is ever resident before its use except a repeat within a layer */
    cfg one = {.cache = 1, .io = "auto", .backend = "auto", .chunk = 1, .no_prefetch = 1};
    df_stats st1;
    float *b = run(dir, &one, ids, 6, &V, &st1);
    TCHECKF(st1.expert_hits == 0, "1-slot cache counted %llu hits", (unsigned long long)st1.expert_hits);
    TCHECK(st1.expert_misses == 6 * 7 * 8);
    /* every miss is one read of one whole expert */
    TCHECKF(st1.expert_reads == st1.expert_misses && g_expert_bytes > 0 &&
                st1.expert_bytes_read == st1.expert_reads * g_expert_bytes,
            "%llu expert bytes read for %llu reads of %llu bytes (%llu misses)",
            (unsigned long long)st1.expert_bytes_read, (unsigned long long)st1.expert_reads,
            (unsigned long long)g_expert_bytes, (unsigned long long)st1.expert_misses);
    free(a), free(b);
}

/* A prefill with many misses per layer runs under the allocation guard,
 * which sees every allocation of the process (libc's too): 32 tokens in one
 * batch route to ~110 of the 128 experts per layer, so each flush sorts
 * ~110 reads, which glibc's qsort would have done with a malloc'd buffer
 * (the guard aborts the process).  The logits equal token-by-token decoding
 * from a cache that holds everything. */
static void test_prefill_misses_under_guard(void)
{
    char dir[512];
    if (gen_model("small", "--preset small --seed 11", dir, sizeof dir)) return;
    enum { N = 32 };
    int32_t ids[N];
    for (int i = 0; i < N; i++) ids[i] = (i * 389 + 11) % 3800;
    int V;
    df_stats st;
    cfg small = {.cache = 300 * 20480, .io = "auto", .backend = "auto", .chunk = N, .batch = N, .no_prefetch = 1};
    float *a = run(dir, &small, ids, N, &V, &st);
    TCHECKF(st.expert_misses >= 7 * 62 && st.expert_reads >= st.expert_misses,
            "%llu misses, %llu reads: the flushes were not large", (unsigned long long)st.expert_misses,
            (unsigned long long)st.expert_reads);
    cfg all = {.cache = (size_t)1 << 30, .io = "buffered", .backend = "threads", .chunk = 1, .no_prefetch = 1};
    float *b = run(dir, &all, ids, N, &V, NULL);
    if (a && b) TCHECK(!memcmp(a, b, (size_t)N * V * sizeof(float)));
    free(a), free(b);
}

static void test_prefetch_accounting(void)
{
    char dir[512];
    if (gen_model("small", "--preset small --seed 11", dir, sizeof dir)) return;
    int32_t ids[30];
    for (int i = 0; i < 30; i++) ids[i] = (i * 97 + 1) % 3800;
    int V;
    df_stats st;
    cfg c = {.cache = 60 * 20480, .io = "auto", .backend = "auto", .chunk = 1};
    float *a = run(dir, &c, ids, 30, &V, &st);
    fprintf(stderr, "    prefetch: %llu issued, %llu used, %llu late, %llu wasted; precision %.2f recall %.2f\n",
            (unsigned long long)st.prefetch_issued, (unsigned long long)st.prefetch_used,
            (unsigned long long)st.prefetch_late, (unsigned long long)st.prefetch_wasted,
            st.prefetch_predicted ? (double)st.prefetch_correct / st.prefetch_predicted : 0.0,
            st.prefetch_actual ? (double)st.prefetch_correct / st.prefetch_actual : 0.0);
    TCHECK(st.prefetch_issued > 0 && st.prefetch_predicted > 0);
    TCHECK(st.prefetch_used + st.prefetch_wasted <= st.prefetch_issued);
    TCHECK(st.prefetch_late <= st.prefetch_used && st.prefetch_correct <= st.prefetch_predicted);
    /* every read is a demand miss not served by a prefetch, or a prefetch */
    TCHECKF(st.expert_reads == st.expert_misses - st.prefetch_late + st.prefetch_issued,
            "reads %llu != misses %llu - late %llu + prefetches %llu", (unsigned long long)st.expert_reads,
            (unsigned long long)st.expert_misses, (unsigned long long)st.prefetch_late,
            (unsigned long long)st.prefetch_issued);
    free(a);
}

static void test_multiple_drives(void)
{
    char dir[512];
    if (gen_model("small", "--preset small --seed 11", dir, sizeof dir)) return;
    char r1[600], r2[600], s1[600], s2[600], s3[600];
    snprintf(r1, sizeof r1, "%s/rep1", test_scratch());
    snprintf(r2, sizeof r2, "%s/rep2", test_scratch());
    snprintf(s1, sizeof s1, "%s/str1", test_scratch());
    snprintf(s2, sizeof s2, "%s/str2", test_scratch());
    snprintf(s3, sizeof s3, "%s/str3", test_scratch());
    const char *reps[2] = {r1, r2}, *stripes[3] = {s1, s2, s3};
    df_error err = {0};
    TCHECKF(df_place(dir, reps, 2, 0, NULL, NULL, &err) == 0, "place replicas: %s", err.msg);
    TCHECKF(df_place(dir, stripes, 3, 1, NULL, NULL, &err) == 0, "place stripes: %s", err.msg);
    int32_t ids[20];
    for (int i = 0; i < 20; i++) ids[i] = (i * 37 + 2) % 3800;
    int V;
    df_stats st;
    cfg base = {.cache = 30 * 20480, .io = "auto", .backend = "auto", .chunk = 1};
    float *a = run(dir, &base, ids, 20, &V, &st);
    cfg rep = base, str = base;
    rep.xpaths = reps;
    rep.n_xpaths = 2;
    str.xpaths = stripes;
    str.n_xpaths = 3;
    float *b = run(dir, &rep, ids, 20, &V, &st);
    fprintf(stderr, "    replicas: reads %llu (model dir) %llu %llu\n", (unsigned long long)st.source_reads[0],
            (unsigned long long)st.source_reads[1], (unsigned long long)st.source_reads[2]);
    TCHECK(st.source_reads[0] == 0 && st.source_reads[1] > 0 && st.source_reads[2] > 0);
    float *c = run(dir, &str, ids, 20, &V, &st);
    fprintf(stderr, "    stripes: reads %llu %llu %llu\n", (unsigned long long)st.source_reads[1],
            (unsigned long long)st.source_reads[2], (unsigned long long)st.source_reads[3]);
    TCHECK(st.source_reads[1] > 0 && st.source_reads[2] > 0 && st.source_reads[3] > 0);
    if (a && b) TCHECKF(!memcmp(a, b, (size_t)20 * V * sizeof(float)), "replicas: logits differ");
    if (a && c) TCHECKF(!memcmp(a, c, (size_t)20 * V * sizeof(float)), "stripes: logits differ");
    free(a), free(b), free(c);
    /* two of three stripes: experts are missing, said clearly */
    df_engine_opts o;
    df_engine_opts_default(&o);
    o.quiet = 1;
    o.expert_paths = stripes;
    o.n_expert_paths = 2;
    df_engine *eng = NULL;
    memset(&err, 0, sizeof err);
    TCHECK(df_engine_open(dir, &o, &eng, &err) == -1);
    TCHECKF(strstr(err.msg, "in none of the expert paths"), "message: %s", err.msg);
    /* a directory that was never placed */
    const char *bad[1] = {test_scratch()};
    o.expert_paths = bad;
    o.n_expert_paths = 1;
    memset(&err, 0, sizeof err);
    TCHECK(df_engine_open(dir, &o, &eng, &err) == -1);
    TCHECKF(strstr(err.msg, "not a placed expert directory"), "message: %s", err.msg);
}

static void test_trunk_streamed(void)
{
    char dir[512];
    if (gen_model("small", "--preset small --seed 11", dir, sizeof dir)) return;
    int32_t ids[16];
    for (int i = 0; i < 16; i++) ids[i] = (i * 59 + 9) % 3800;
    int V;
    df_stats st;
    cfg base = {.cache = 50 * 20480, .io = "auto", .backend = "auto", .chunk = 1};
    float *a = run(dir, &base, ids, 16, &V, &st);
    cfg str = base;
    str.trunk_stream = 1;
    float *b = run(dir, &str, ids, 16, &V, &st);
    TCHECKF(st.trunk_bytes_read > 0, "streamed trunk read nothing");
    cfg str_batch = str;
    str_batch.chunk = 5;
    str_batch.threads = 1;
    float *c = run(dir, &str_batch, ids, 16, &V, &st);
    if (a && b) TCHECKF(!memcmp(a, b, (size_t)16 * V * sizeof(float)), "streamed trunk: logits differ");
    if (a && c) TCHECKF(!memcmp(a, c, (size_t)16 * V * sizeof(float)), "streamed trunk, batches of 5: logits differ");
    fprintf(stderr, "    streamed trunk: %.1f MiB read for 16 tokens\n", st.trunk_bytes_read / 1048576.0);
    free(a), free(b), free(c);
}

/* Partial residency: a budget between a streamed and a resident trunk
 * keeps some layers in memory and streams the rest; the logits are those
 * of the resident and the whole-stream runs, bit for bit (at 2 threads and
 * in batches of 5 at 1 thread), and it reads less trunk. */
static void test_trunk_partly_resident(void)
{
    char dir[512];
    if (gen_model("partial", "--preset small --seed 11 --set num_experts=32", dir, sizeof dir)) return;
    /* the smallest budget whose plan keeps some layers resident, not all */
    size_t mem = 0;
    df_plan p;
    for (size_t m = 16u << 20; m < (256u << 20) && !mem; m += 1u << 20) {
        df_plan_opts po = {.mem_budget = m, .n_ctx = 256, .max_batch = 8, .n_threads = 2};
        df_error e = {0};
        if (df_plan_model(dir, &po, &p, NULL, &e) == 0 && p.trunk_mode == DF_TRUNK_STREAMED && p.trunk_resident_n > 0)
            mem = m;
    }
    TCHECKF(mem > 0, "no budget up to 256 MiB keeps part of the trunk resident");
    if (!mem) return;
    TCHECKF(p.trunk_resident_n < p.trunk_layers && p.used <= p.budget &&
                p.trunk_read_per_token == p.trunk_bytes - p.trunk_resident_bytes &&
                p.trunk_read_per_token + p.expert_read_est < p.alt_stream_all_read,
            "partial plan: %d of %d layers, read %llu + %llu vs whole-stream %llu", p.trunk_resident_n, p.trunk_layers,
            (unsigned long long)p.trunk_read_per_token, (unsigned long long)p.expert_read_est,
            (unsigned long long)p.alt_stream_all_read);
    int32_t ids[16];
    for (int i = 0; i < 16; i++) ids[i] = (i * 59 + 9) % 3800;
    int V;
    df_stats st, sp;
    cfg res = {.io = "auto", .backend = "auto", .chunk = 1}, part = res, whole = res, part5 = res;
    part.mem = mem;
    part5.mem = mem;
    part5.chunk = 5;
    part5.threads = 1;
    whole.mem = mem;
    whole.trunk_stream = 1;
    float *a = run(dir, &res, ids, 16, &V, &st);
    float *b = run(dir, &part, ids, 16, &V, &sp);
    uint64_t part_read = sp.trunk_bytes_read;
    float *c = run(dir, &part5, ids, 16, &V, &sp);
    float *d = run(dir, &whole, ids, 16, &V, &st);
    if (a && b) TCHECKF(!memcmp(a, b, (size_t)16 * V * sizeof(float)), "partly resident trunk: logits differ");
    if (a && c) TCHECKF(!memcmp(a, c, (size_t)16 * V * sizeof(float)), "partly resident, batches of 5: logits differ");
    if (a && d) TCHECKF(!memcmp(a, d, (size_t)16 * V * sizeof(float)), "whole-stream trunk: logits differ");
    TCHECKF(part_read > 0 && part_read < st.trunk_bytes_read, "trunk read: partly resident %llu, whole stream %llu",
            (unsigned long long)part_read, (unsigned long long)st.trunk_bytes_read);
    fprintf(stderr, "    --mem %.0f MiB: %d of %d layers resident; trunk read for 16 tokens %.1f MiB (whole stream %.1f)\n",
            mem / 1048576.0, p.trunk_resident_n, p.trunk_layers, part_read / 1048576.0,
            st.trunk_bytes_read / 1048576.0);
    free(a), free(b), free(c), free(d);
}

static void test_truncated_expert_file(void)
{
    char dir[512];
    if (gen_model("trunc", "--preset small --seed 5", dir, sizeof dir)) return;
    df_engine_opts o;
    df_engine_opts_default(&o);
    o.quiet = 1;
    o.expert_cache_bytes = 1;
    df_engine *eng;
    df_error err = {0};
    if (df_engine_open(dir, &o, &eng, &err)) {
        t_fail(__FILE__, __LINE__, "open: %s", err.msg);
        return;
    }
    df_session *s;
    TCHECK(df_session_new(eng, NULL, &s, &err) == 0);
    /* cut every shard after its header: experts are gone, the trunk mapping too
     * (trunk pages already touched stay readable; we only evaluate after the
     * expert reads fail, so no mapped page past EOF is touched first) */
    char shard[700];
    snprintf(shard, sizeof shard, "%s/model-00002-of-000003.safetensors", dir);
    struct stat st;
    CHECK(stat(shard, &st) == 0);
    char *keep;
    size_t len;
    CHECK(read_small_file(shard, &keep, &len, 1u << 30, &err) == 0);
    /* truncate to just past the last trunk tensor: find the first U8 (expert) data by
     * truncating to 60% -- the experts (U8) come last in each shard */
    CHECK(truncate(shard, (off_t)(st.st_size * 6 / 10)) == 0);
    int32_t ids[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    int rc = df_session_eval(s, ids, 8, NULL, 0, &err);
    TCHECKF(rc == -1, "eval succeeded on a truncated expert file");
    TCHECKF(strstr(err.msg, "model-00002-of-000003.safetensors") && strstr(err.msg, "expert") &&
                strstr(err.msg, "layer"),
            "message: %s", err.msg);
    fprintf(stderr, "    -> %s\n", err.msg);
    /* restore: the engine recovers after a reset */
    FILE *f = fopen(shard, "wb");
    CHECK(f && fwrite(keep, 1, len, f) == len && fclose(f) == 0);
    free(keep);
    df_session_reset(s);
    df_err_clear(&err);
    TCHECKF(df_session_eval(s, ids, 8, NULL, 0, &err) == 0, "after restore: %s", err.msg);
    df_session_free(s);
    df_engine_close(eng);
}

/* Run deltafin with args; returns its own peak RSS in bytes (VmHWM since
 * its exec, from `run --bench-json`), 0 on failure.  wait4's ru_maxrss
 * would also count this test process's pages at the fork. */
static size_t child_peak_rss(const char *const *args)
{
    int fd[2];
    CHECK(pipe(fd) == 0);
    pid_t pid = fork();
    if (pid == 0) {
        int nul = open("/dev/null", O_WRONLY);
        dup2(fd[1], 1);
        dup2(nul, 2);
        close(fd[0]);
        execv(build_bin("deltafin"), (char *const *)(uintptr_t)args);
        _exit(127);
    }
    close(fd[1]);
    char buf[8192];
    size_t len = 0;
    ssize_t k;
    while (len + 1 < sizeof buf && (k = read(fd[0], buf + len, sizeof buf - 1 - len)) > 0) len += (size_t)k;
    buf[len] = 0;
    close(fd[0]);
    int status;
    CHECK(waitpid(pid, &status, 0) == pid);
    TCHECKF(WIFEXITED(status) && WEXITSTATUS(status) == 0, "deltafin %s %s failed (status %d)", args[1], args[2],
            status);
    const char *p = strstr(buf, "\"peak_rss_kb\":");
    TCHECKF(p != NULL, "no peak_rss_kb in: %s", buf);
    return p ? (size_t)strtol(p + 14, NULL, 10) * 1024 : 0;
}

static void test_rss_within_budget(void)
{
    if (getenv("DF_SANITIZED")) TSKIP("sanitizer runtimes inflate RSS");
    if (getenv("DF_UNDER_QEMU")) TSKIP("under qemu the emulator's own memory is in the RSS");
    char dir[512];
    /* experts (~90 MB) far larger than the budget */
    if (gen_model("rss", "--preset small --set num_experts=512 --seed 9", dir, sizeof dir)) return;
    const char *mem = "48M";
    const size_t budget = (size_t)48 << 20;
    const char *args[] = {"deltafin", "run", "--model", dir, "--prompt-ids", "1,2,3,4,5,6,7,8,9,10,11,12",
                          "--max-new", "24", "--mem", mem, "--ctx", "64", "--batch", "8", "--threads", "2",
                          "--bench-json", NULL};
    size_t peak = child_peak_rss(args);
    fprintf(stderr, "    peak RSS %.1f MiB with --mem %s (limit %.1f MiB)\n", peak / 1048576.0, mem,
            budget * 1.05 / 1048576.0);
    TCHECKF(peak > 0 && peak <= budget + budget / 20, "peak RSS %zu exceeds --mem %s + 5%%", peak, mem);
    /* a budget below the trunk: the trunk is streamed and the budget still holds */
    const char *mem2 = "30M";
    const size_t budget2 = (size_t)30 << 20;
    const char *args2[] = {"deltafin", "run", "--model", dir, "--prompt-ids", "1,2,3,4,5,6,7,8", "--max-new", "16",
                           "--mem", mem2, "--ctx", "64", "--batch", "8", "--threads", "2", "--trunk-stream", "auto",
                           "--bench-json", NULL};
    peak = child_peak_rss(args2);
    fprintf(stderr, "    peak RSS %.1f MiB with --mem %s, trunk streamed (limit %.1f MiB)\n", peak / 1048576.0, mem2,
            budget2 * 1.05 / 1048576.0);
    TCHECKF(peak > 0 && peak <= budget2 + budget2 / 20, "peak RSS %zu exceeds --mem %s + 5%%", peak, mem2);
}

static float *run_heat(const char *dir, const char *heat, const int32_t *ids, int n, int *V, df_stats *st)
{
    df_engine_opts o;
    df_engine_opts_default(&o);
    o.quiet = 1;
    o.expert_cache_bytes = 200 * 20480;
    o.heat_path = heat;
    df_engine *eng;
    df_error err = {0};
    if (df_engine_open(dir, &o, &eng, &err)) {
        t_fail(__FILE__, __LINE__, "open: %s", err.msg);
        return NULL;
    }
    df_model_info info;
    df_engine_info(eng, &info);
    *V = info.vocab;
    df_session *s;
    TCHECK(df_session_new(eng, NULL, &s, &err) == 0);
    float *out = malloc((size_t)n * info.vocab * sizeof(float));
    for (int i = 0; i < n; i++) TCHECK(df_session_eval(s, ids + i, 1, out + (size_t)i * info.vocab, 1, &err) == 0);
    df_engine_stats(eng, st);
    df_session_free(s);
    df_engine_close(eng);
    return out;
}

static void test_heat_warms_cache(void)
{
    char dir[512], heat[600];
    if (gen_model("small", "--preset small --seed 11", dir, sizeof dir)) return;
    snprintf(heat, sizeof heat, "%s/heat.bin", test_scratch());
    unlink(heat);
    int32_t ids[16];
    for (int i = 0; i < 16; i++) ids[i] = (i * 71 + 3) % 3800;
    int V;
    df_stats cold, warm;
    float *a = run_heat(dir, heat, ids, 16, &V, &cold);
    struct stat st;
    TCHECKF(stat(heat, &st) == 0 && st.st_size == 20 + 8 * 128 * 4, "heat file not written with the bounded size");
    float *b = run_heat(dir, heat, ids, 16, &V, &warm);
    fprintf(stderr, "    cold: %llu hits / %llu misses; warmed: %llu hits / %llu misses\n",
            (unsigned long long)cold.expert_hits, (unsigned long long)cold.expert_misses,
            (unsigned long long)warm.expert_hits, (unsigned long long)warm.expert_misses);
    TCHECK(warm.expert_hits > cold.expert_hits && warm.expert_misses < cold.expert_misses);
    if (a && b) TCHECK(!memcmp(a, b, (size_t)16 * V * sizeof(float)));
    free(a), free(b);
    /* a corrupt heat file is ignored: cold start, same output */
    FILE *f = fopen(heat, "r+b");
    CHECK(f && fseek(f, 100, SEEK_SET) == 0 && fputc(0x5A, f) != EOF && fclose(f) == 0);
    float *c = run_heat(dir, heat, ids, 16, &V, &warm);
    TCHECK(warm.expert_misses == cold.expert_misses);
    free(c);
}

static void test_heat_crash_mid_write(void)
{
    char heat[600];
    snprintf(heat, sizeof heat, "%s/crash.heat", test_scratch());
    enum { L = 4, E = 64 };
    float old[L * E], neu[L * E], got[L * E];
    for (int i = 0; i < L * E; i++) old[i] = (float)i, neu[i] = (float)(1000 - i);
    df_error err = {0};
    TCHECK(heat_save(heat, L, E, old, &err) == 0);
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        /* the kernel kills the writer (SIGXFSZ) once it has written half of
         * the new file: no hook in heat.c, no timing */
        struct rlimit half = {.rlim_cur = (20 + L * E * 4) / 2, .rlim_max = RLIM_INFINITY};
        struct rlimit no_core = {0, 0};
        if (setrlimit(RLIMIT_CORE, &no_core) || setrlimit(RLIMIT_FSIZE, &half)) _exit(3);
        df_error e2 = {0};
        heat_save(heat, L, E, neu, &e2);
        _exit(0);
    }
    int status;
    waitpid(pid, &status, 0);
    TCHECKF(WIFSIGNALED(status) && WTERMSIG(status) == SIGXFSZ, "the writer was not killed mid-write (status %d)",
            status);
    char tmp[700];
    snprintf(tmp, sizeof tmp, "%s.tmp", heat);
    struct stat st;
    TCHECKF(stat(tmp, &st) == 0 && st.st_size < 20 + L * E * 4, "the killed writer left no partial temp file");
    TCHECKF(heat_load(heat, L, E, got, &err) == 0, "old heat file unreadable after the crash: %s", err.msg);
    TCHECK(!memcmp(got, old, sizeof old));
    /* the next save replaces the stale temp file */
    TCHECK(heat_save(heat, L, E, neu, &err) == 0 && heat_load(heat, L, E, got, &err) == 0 && !memcmp(got, neu, sizeof neu));
    TCHECK(stat(tmp, &st) != 0);
    /* wrong shape is refused */
    TCHECK(heat_load(heat, L, E + 1, got, &err) == -1);
}

/* The prefetch's timing controller: decode steps alternate windows with the
 * prefetch on and off, then it keeps the faster; the events file shows both
 * states, the stats the comparison, and the logits equal a run without
 * prefetch (the choice never changes results). */
static void test_prefetch_timing_controller(void)
{
    char dir[512], ev[700];
    if (gen_model("small", "--preset small --seed 11", dir, sizeof dir)) return;
    snprintf(ev, sizeof ev, "%s/ab.events", test_scratch());
    int32_t ids[48];
    for (int i = 0; i < 48; i++) ids[i] = (i * 131 + 17) % 3800;
    int V;
    cfg off = {.cache = 40 * 20480, .io = "auto", .backend = "auto", .chunk = 1, .no_prefetch = 1};
    float *a = run(dir, &off, ids, 48, &V, NULL);
    df_engine_opts o;
    df_engine_opts_default(&o);
    o.quiet = 1;
    o.expert_cache_bytes = 40 * 20480;
    o.events_path = ev;
    df_engine *eng;
    df_error err = {0};
    if (df_engine_open(dir, &o, &eng, &err)) {
        t_fail(__FILE__, __LINE__, "open: %s", err.msg);
        free(a);
        return;
    }
    df_session *s;
    TCHECK(df_session_new(eng, NULL, &s, &err) == 0);
    float *b = malloc((size_t)48 * V * sizeof(float));
    for (int i = 0; i < 48; i++) TCHECK(df_session_eval(s, ids + i, 1, b + (size_t)i * V, 1, &err) == 0);
    df_stats st;
    df_engine_stats(eng, &st);
    df_session_free(s);
    df_engine_close(eng);
    fprintf(stderr, "    %d comparison(s): %s, decode step %.2f ms with prefetch, %.2f ms without\n",
            st.prefetch_ab_rounds, st.prefetch_ab_on ? "kept on" : "turned off", st.prefetch_ab_on_ms,
            st.prefetch_ab_off_ms);
    TCHECK(st.prefetch_ab_rounds >= 1 && (st.prefetch_ab_on == 0 || st.prefetch_ab_on == 1));
    TCHECK(st.prefetch_ab_on_ms > 0 && st.prefetch_ab_off_ms > 0);
    if (a) TCHECKF(!memcmp(a, b, (size_t)48 * V * sizeof(float)), "logits differ from the run without prefetch");
    char *text;
    size_t len;
    CHECK(read_small_file(ev, &text, &len, 1u << 26, &err) == 0);
    TCHECKF(strstr(text, "\"prefetch\":0") && strstr(text, "\"prefetch\":1"), "events never show both states");
    free(text);
    free(a);
    free(b);
}

/* The same random model as safetensors and as llama.cpp's kimi-k3 GGUF
 * (experts as three ggml-MXFP4 pieces, kv_b split per head, fused res
 * scores, -exp(A_log)): the GGUF path gives the safetensors logits bit for
 * bit at every budget, I/O mode and backend, with the trunk streamed, in
 * batches and token by token. */
static void test_gguf_exact(void)
{
    char dir[512], gg[700], args[900];
    snprintf(gg, sizeof gg, "%s/ggsmall.gguf", test_scratch());
    snprintf(args, sizeof args, "--preset small --seed 13 --gguf %s", gg);
    if (gen_model("ggsmall", args, dir, sizeof dir)) return;
    int32_t ids[20];
    for (int i = 0; i < 20; i++) ids[i] = (i * 97 + 5) % 3800;
    int V;
    df_stats st;
    cfg base = {.cache = (size_t)1 << 30, .io = "buffered", .backend = "threads", .threads = 1, .chunk = 1,
                .no_prefetch = 1};
    float *a = run(dir, &base, ids, 20, &V, NULL);
    const cfg variants[] = {
        {.cache = (size_t)1 << 30, .io = "buffered", .backend = "threads", .threads = 1, .chunk = 1, .no_prefetch = 1},
        {.mem = 0, .cache = 0, .io = "auto", .backend = "auto"},
        {.cache = 1, .io = "direct", .backend = "threads", .chunk = 1},
        {.cache = 6 * 40960, .io = "direct", .backend = "uring", .chunk = 4},
        {.cache = 30 * 40960, .io = "buffered", .backend = "uring", .chunk = 1},
        {.cache = 30 * 40960, .io = "direct", .backend = "uring", .threads = 3, .chunk = 7},
        {.cache = 20 * 40960, .io = "auto", .backend = "auto", .chunk = 1, .trunk_stream = 1},
    };
    for (size_t i = 0; i < sizeof variants / sizeof variants[0]; i++) {
        float *b = run(gg, &variants[i], ids, 20, &V, &st);
        if (a && b)
            TCHECKF(!memcmp(a, b, (size_t)20 * V * sizeof(float)),
                    "GGUF variant %zu (cache %zu, io %s, backend %s): logits differ from safetensors", i,
                    variants[i].cache, variants[i].io, variants[i].backend);
        if (i == 2) TCHECKF(st.expert_misses > 0 && st.expert_reads >= 3 * st.expert_misses, "1 slot: %llu reads",
                            (unsigned long long)st.expert_reads);
        if (i == 6) TCHECKF(st.trunk_bytes_read > 0, "GGUF trunk not streamed");
        free(b);
    }
    /* the same GGUF split into 4 files the way llama.cpp's gguf-split does
     * (an expert's three pieces may sit in different files) */
    char sp[700], first[760], second[760], cmd[2600];
    snprintf(sp, sizeof sp, "%s/ggsplit.gguf", test_scratch());
    snprintf(first, sizeof first, "%s/ggsplit-00001-of-00004.gguf", test_scratch());
    snprintf(second, sizeof second, "%s/ggsplit-00002-of-00004.gguf", test_scratch());
    snprintf(cmd, sizeof cmd, "%s --preset small --seed 13 --from %s --gguf %s --gguf-split 4 >/dev/null", build_bin("k3gen"),
             dir, sp);
    TCHECKF(system(cmd) == 0, "%s failed", cmd);
    const cfg split_variants[] = {
        {.cache = 1, .io = "direct", .backend = "uring", .chunk = 1},
        {.cache = 12 * 40960, .io = "buffered", .backend = "threads", .chunk = 5, .trunk_stream = 1},
    };
    for (size_t i = 0; i < 2; i++) {
        float *b = run(first, &split_variants[i], ids, 20, &V, NULL);
        if (a && b)
            TCHECKF(!memcmp(a, b, (size_t)20 * V * sizeof(float)), "split GGUF variant %zu: logits differ", i);
        free(b);
    }
    df_engine_opts o;
    df_engine_opts_default(&o);
    o.quiet = 1;
    df_engine *eng = NULL;
    df_error err = {0};
    TCHECK(df_engine_open(second, &o, &eng, &err) == -1 && strstr(err.msg, "give the first file"));
    fprintf(stderr, "    -> %s\n", err.msg);
    CHECK(unlink(second) == 0);
    df_err_clear(&err);
    TCHECK(df_engine_open(first, &o, &eng, &err) == -1 && strstr(err.msg, "ggsplit-00002-of-00004.gguf"));
    fprintf(stderr, "    -> %s\n", err.msg);
    free(a);
}

/* A truncated GGUF: the failed expert read names the file, layer, expert and
 * the piece (ffn_*_exps), and nothing is computed from missing bytes. */
static void test_gguf_truncated(void)
{
    char dir[512], gg[700], cut[700], args[900];
    snprintf(gg, sizeof gg, "%s/ggtrunc.gguf", test_scratch());
    snprintf(args, sizeof args, "--preset small --seed 2 --gguf %s", gg);
    if (gen_model("ggtrunc", args, dir, sizeof dir)) return;
    snprintf(cut, sizeof cut, "%s/ggtrunc-cut.gguf", test_scratch());
    df_error err = {0};
    char *bytes;
    size_t len;
    CHECK(read_small_file(gg, &bytes, &len, 1u << 30, &err) == 0);
    /* a copy, cut below after the engine has opened it: the last layers'
     * expert tensors lie in the file's last 7% */
    FILE *f = fopen(cut, "wb");
    CHECK(f && fwrite(bytes, 1, len, f) == len && fclose(f) == 0);
    free(bytes);
    df_engine_opts o;
    df_engine_opts_default(&o);
    o.quiet = 1;
    o.expert_cache_bytes = 1;
    df_engine *eng;
    if (df_engine_open(cut, &o, &eng, &err)) {
        t_fail(__FILE__, __LINE__, "open: %s", err.msg);
        return;
    }
    df_session *s;
    TCHECK(df_session_new(eng, NULL, &s, &err) == 0);
    struct stat sb;
    CHECK(stat(cut, &sb) == 0);
    CHECK(truncate(cut, (off_t)(sb.st_size * 93 / 100)) == 0);
    int32_t ids[12];
    for (int i = 0; i < 12; i++) ids[i] = i * 300 + 1;
    float *lg = malloc((size_t)12 * 3840 * sizeof(float));
    int rc = df_session_eval(s, ids, 12, lg, 1, &err);
    TCHECKF(rc == -1, "eval succeeded on a truncated GGUF");
    TCHECKF(strstr(err.msg, "ggtrunc-cut.gguf") && strstr(err.msg, "expert") && strstr(err.msg, "_exps") &&
                strstr(err.msg, "layer"),
            "message: %s", err.msg);
    fprintf(stderr, "    -> %s\n", err.msg);
    free(lg);
    df_session_free(s);
    df_engine_close(eng);
}

static void test_cleanup(void) { test_scratch_remove(); }


/* A streamed install's disk cache never evicts a slot a read is using:
 * free slots first, then the least recently used unpinned, unfilled one. */
static void test_disk_cache_victim(void)
{
    int32_t key[4] = {7, 8, 9, 10};
    uint64_t use[4] = {5, 1, 3, 2};
    uint16_t pins[4] = {0, 1, 0, 0};
    uint8_t taken[4] = {0, 0, 0, 0};
    TCHECK(expert_disk_victim(4, key, use, pins, taken) == 3); /* slot 1 is older but pinned */
    taken[3] = 1;
    TCHECK(expert_disk_victim(4, key, use, pins, taken) == 2);
    pins[0] = pins[2] = 1;
    TCHECK(expert_disk_victim(4, key, use, pins, taken) == -1); /* everything in use or just filled */
    key[3] = -1, taken[3] = 0, pins[3] = 0;
    TCHECK(expert_disk_victim(4, key, use, pins, taken) == 3); /* a free slot */
}

static const test_case tests[] = {
    {"disk_cache_victim", test_disk_cache_victim},
    {"io_queue_threads_direct", test_queue_threads_direct},
    {"io_queue_threads_buffered", test_queue_threads_buffered},
    {"io_queue_uring_direct", test_queue_uring_direct},
    {"io_queue_uring_buffered", test_queue_uring_buffered},
    {"exact_across_budgets_modes_backends", test_exact_across_io},
    {"hit_accounting", test_hit_accounting},
    {"prefill_misses_under_alloc_guard", test_prefill_misses_under_guard},
    {"prefetch_accounting", test_prefetch_accounting},
    {"multiple_drives_replicas_and_stripes", test_multiple_drives},
    {"prefetch_timing_controller", test_prefetch_timing_controller},
    {"trunk_streamed_bit_identical", test_trunk_streamed},
    {"trunk_partly_resident_bit_identical", test_trunk_partly_resident},
    {"truncated_expert_file_named", test_truncated_expert_file},
    {"rss_within_mem_budget", test_rss_within_budget},
    {"heat_file_warms_cache", test_heat_warms_cache},
    {"heat_file_survives_kill_mid_write", test_heat_crash_mid_write},
    {"gguf_bit_identical_to_safetensors", test_gguf_exact},
    {"gguf_truncated_named", test_gguf_truncated},
    {"cleanup", test_cleanup},
};

int main(int argc, char **argv) { return test_main(tests, NTESTS(tests), argc, argv); }
