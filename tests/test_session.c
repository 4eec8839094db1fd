/* test_session.c - conversation state: checkpoints a session can return to
 * exactly, and session files (round trip bit for bit; another model's,
 * truncated or corrupted files refused with the session left empty; a
 * writer killed mid-save leaves the previous file valid).
 */
#define _GNU_SOURCE
#include "harness.h"
#include "engine.h"
#include "filehash.h"
#include "safetensors.h"
#include <fcntl.h>

#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define E0 (err = (df_error){0}, &err)

static df_engine *open_model(const char *dir)
{
    df_engine_opts o;
    df_engine_opts_default(&o);
    o.quiet = 1;
    o.n_threads = 2;
    o.no_prefetch = 1;
    o.plan_ctx = 256;
    o.plan_batch = 32;
    o.plan_checkpoints = 2;
    df_engine *eng = NULL;
    df_error err = {0};
    if (df_engine_open(dir, &o, &eng, &err)) t_fail(__FILE__, __LINE__, "open %s: %s", dir, err.msg);
    return eng;
}

static df_session *new_session(df_engine *eng, int ctx, int checkpoints)
{
    df_session_opts so = {.n_ctx = ctx, .max_batch = 32, .checkpoints = checkpoints};
    df_session *s = NULL;
    df_error err = {0};
    if (df_session_new(eng, &so, &s, &err)) t_fail(__FILE__, __LINE__, "session: %s", err.msg);
    return s;
}

static const char *model(const char *name, int seed)
{
    static char dirs[2][512];
    char *dir = dirs[seed & 1];
    char args[160];
    snprintf(args, sizeof args, "--preset small --set num_experts=16 --set num_experts_per_token=4 --seed %d", seed);
    return gen_model(name, args, dir, 512) ? NULL : dir;
}

static int32_t tok(int i) { return (int32_t)((i * 7919 + 31) % 1500 + 3); }

enum { N = 40 };

/* logits of every position, one at a time */
static float *reference(df_engine *eng, int V)
{
    df_session *s = new_session(eng, 256, 0);
    float *want = malloc((size_t)N * V * sizeof *want);
    df_error err = {0};
    for (int i = 0; i < N; i++) {
        int32_t t = tok(i);
        if (df_session_eval(s, &t, 1, want + (size_t)i * V, 0, &err)) t_fail(__FILE__, __LINE__, "%s", err.msg);
    }
    df_session_free(s);
    return want;
}

/* The checkpoint tests' model, its one-at-a-time reference logits, room
 * for a run's and the ids. */
typedef struct ck_fixture {
    df_engine *eng;
    int V;
    float *want, *got;
    int32_t ids[N];
} ck_fixture;

static int ck_open(ck_fixture *f)
{
    const char *dir = model("sess_a", 21);
    if (!dir || !(f->eng = open_model(dir))) return -1;
    df_model_info info;
    df_engine_info(f->eng, &info);
    f->V = info.vocab;
    f->want = reference(f->eng, f->V);
    f->got = malloc((size_t)N * f->V * sizeof *f->got);
    for (int i = 0; i < N; i++) f->ids[i] = tok(i);
    return 0;
}

static void ck_close(ck_fixture *f)
{
    free(f->want);
    free(f->got);
    df_engine_close(f->eng);
}

static void test_checkpoints(void)
{
    ck_fixture f;
    if (ck_open(&f)) return;
    df_engine *eng = f.eng;
    int V = f.V;
    float *want = f.want, *got = f.got;
    const int32_t *ids = f.ids;
    df_session *s = new_session(eng, 256, 2);
    df_error err = {0};
    TCHECK(df_session_eval(s, ids, 10, got, 0, &err) == 0 && df_session_checkpoint(s, &err) == 0);
    TCHECK(df_session_eval(s, ids + 10, 8, got, 0, &err) == 0 && df_session_checkpoint(s, &err) == 0);
    TCHECK(df_session_eval(s, ids + 18, 7, got, 0, &err) == 0);
    TCHECK(df_session_reachable(s, 24) == 18 && df_session_reachable(s, 17) == 10 && df_session_reachable(s, 9) == 0);
    /* back to 18, then to 10: the logits of the shorter session */
    TCHECK(df_session_truncate(s, 18, &err) == 0);
    TCHECK(df_session_eval(s, ids + 18, 3, got, 1, &err) == 0);
    TCHECKF(!memcmp(got, want + (size_t)18 * V, (size_t)3 * V * sizeof *got), "after returning to checkpoint 18");
    TCHECK(df_session_truncate(s, 10, &err) == 0);
    TCHECK(df_session_reachable(s, 20) == 10); /* 18 is gone with the truncation */
    TCHECK(df_session_eval(s, ids + 10, 5, got, 1, &err) == 0);
    TCHECKF(!memcmp(got, want + (size_t)10 * V, (size_t)5 * V * sizeof *got), "after returning to checkpoint 10");
    /* not a checkpoint: refused, the session unchanged */
    TCHECK(df_session_truncate(s, 12, E0) == -1 && strstr(err.msg, "no mark or checkpoint"));
    TCHECK(df_session_pos(s) == 15);
    /* a third checkpoint replaces the least recently used one but never the
     * lowest (the prefix most requests share): 15's slot, 10 stays */
    TCHECK(df_session_checkpoint(s, &err) == 0);
    TCHECK(df_session_eval(s, ids + 15, 5, got, 0, &err) == 0 && df_session_checkpoint(s, &err) == 0);
    TCHECK(df_session_reachable(s, 19) == 10 && df_session_reachable(s, 14) == 10 && df_session_reachable(s, 20) == 20);
    TCHECK(df_session_eval(s, ids + 20, 2, got, 0, &err) == 0 && df_session_checkpoint(s, &err) == 0);
    TCHECK(df_session_reachable(s, 21) == 10 && df_session_reachable(s, 22) == 22);
    TCHECK(df_session_truncate(s, 10, &err) == 0);
    TCHECK(df_session_eval(s, ids + 10, 5, got, 1, &err) == 0);
    TCHECKF(!memcmp(got, want + (size_t)10 * V, (size_t)5 * V * sizeof *got), "after returning to the kept checkpoint 10");
    /* another session takes this one's prefix (a checkpoint, or its end) without evaluating it */
    df_session *s2 = new_session(eng, 256, 2);
    TCHECK(df_session_eval(s2, ids + 3, 4, got, 0, &err) == 0); /* something of its own, dropped */
    TCHECK(df_session_copy_prefix(s2, s, 10, &err) == 0 && df_session_pos(s2) == 10 && df_session_reachable(s2, 12) == 10);
    TCHECK(df_session_eval(s2, ids + 10, 6, got, 1, &err) == 0);
    TCHECKF(!memcmp(got, want + (size_t)10 * V, (size_t)6 * V * sizeof *got), "after copying checkpoint 10");
    TCHECK(df_session_copy_prefix(s2, s, 15, &err) == 0 && df_session_eval(s2, ids + 15, 3, got, 1, &err) == 0);
    TCHECKF(!memcmp(got, want + (size_t)15 * V, (size_t)3 * V * sizeof *got), "after copying the end, 15");
    TCHECK(df_session_copy_prefix(s2, s, 12, E0) == -1 && strstr(err.msg, "checkpoint"));
    TCHECK(df_session_copy_prefix(s, s, 10, E0) == -1);
    df_session_free(s2);
    df_session_free(s);
    s = new_session(eng, 256, 0);
    TCHECK(df_session_checkpoint(s, E0) == -1);
    df_session_free(s);
    ck_close(&f);
}

/* Checkpoints asked for ahead (df_session_checkpoint_at) are taken inside
 * one pass, across its chunks and row slices: each is the state of having
 * evaluated exactly that far, the pass itself is not split. */
static void test_checkpoints_inside(void)
{
    ck_fixture f;
    if (ck_open(&f)) return;
    df_engine *eng = f.eng;
    int V = f.V;
    float *want = f.want, *got = f.got;
    const int32_t *ids = f.ids;
    df_error err = {0};
    for (int rb = 0; rb < 2; rb++) {
        /* chunks of 32 positions; row slices of the default size, then of 8 */
        df_session_opts so = {.n_ctx = 256, .max_batch = 32, .checkpoints = 5, .row_slice = rb ? 8 : 0};
        df_session *s = NULL;
        TCHECK(df_session_new(eng, &so, &s, &err) == 0);
        if (!s) break;
        TCHECK(df_session_eval(s, ids, 3, got, 0, &err) == 0);
        static const int at[] = {5, 13, 32, 36};
        for (int i = 0; i < 4; i++) TCHECK(df_session_checkpoint_at(s, at[i], &err) == 0);
        TCHECK(df_session_checkpoint_at(s, 2, E0) == -1 && strstr(err.msg, "ahead"));
        TCHECK(df_session_checkpoint_at(s, 39, &err) == 0); /* beyond this pass: not reached, not reachable */
        TCHECK(df_session_reachable(s, 3) == 3 && df_session_reachable(s, 2) == 0);
        TCHECK(df_session_eval(s, ids + 3, 35, got, 0, &err) == 0); /* positions 3..37: a chunk of 32, then 3 */
        TCHECK(df_session_reachable(s, 12) == 5 && df_session_reachable(s, 13) == 13 && df_session_reachable(s, 31) == 13);
        TCHECK(df_session_reachable(s, 35) == 32 && df_session_reachable(s, 37) == 36);
        for (int i = 3; i >= 0; i--) {
            int p = at[i], n = p + 3 <= N ? 3 : N - p;
            TCHECK(df_session_truncate(s, p, &err) == 0);
            TCHECK(df_session_eval(s, ids + p, n, got, 1, &err) == 0);
            TCHECKF(!memcmp(got, want + (size_t)p * V, (size_t)n * V * sizeof *got),
                    "row slice %d: after returning to checkpoint %d taken inside a pass", rb ? 8 : 256, p);
            TCHECK(df_session_truncate(s, p, &err) == 0);
        }
        /* the pending one at 39 was dropped by the truncations */
        TCHECK(df_session_eval(s, ids + 5, 35, got, 0, &err) == 0 && df_session_reachable(s, 39) == 5);
        df_session_free(s);
    }
    df_session *s = new_session(eng, 256, 0);
    TCHECK(df_session_checkpoint_at(s, 4, E0) == -1 && strstr(err.msg, "no checkpoints"));
    df_session_free(s);
    ck_close(&f);
}

static long file_size(const char *p)
{
    struct stat st;
    return stat(p, &st) ? -1 : (long)st.st_size;
}

static void copy_prefix(const char *from, const char *to, long n, long flip)
{
    FILE *a = fopen(from, "rb"), *b = fopen(to, "wb");
    for (long i = 0; a && b && i < n; i++) {
        int c = fgetc(a);
        if (c == EOF) break;
        if (i == flip) c ^= 0x10;
        fputc(c, b);
    }
    if (a) fclose(a);
    if (b) fclose(b);
}

static void test_session_files(void)
{
    const char *dir = model("sess_a", 21);
    if (!dir) return;
    df_engine *eng = open_model(dir);
    if (!eng) return;
    df_model_info info;
    df_engine_info(eng, &info);
    int V = info.vocab;
    float *want = reference(eng, V);
    float *got = malloc((size_t)N * V * sizeof *got);
    int32_t ids[N], back[N];
    for (int i = 0; i < N; i++) ids[i] = tok(i);
    char path[600], bad[600];
    snprintf(path, sizeof path, "%s/s.session", test_scratch());
    snprintf(bad, sizeof bad, "%s/bad.session", test_scratch());
    df_error err = {0};
    df_session *s = new_session(eng, 256, 0);
    TCHECK(df_session_eval(s, ids, 25, got, 0, &err) == 0);
    TCHECKF(df_session_save(s, ids, 25, path, &err) == 0, "%s", err.msg);
    TCHECK(df_session_save(s, ids, 24, path, E0) == -1); /* ids must be what the session holds */
    df_session_free(s);
    /* a fresh session from the file goes on exactly */
    s = new_session(eng, 256, 0);
    int n = 0;
    TCHECKF(df_session_load(s, path, back, N, &n, &err) == 0, "%s", err.msg);
    TCHECK(n == 25 && df_session_pos(s) == 25 && !memcmp(back, ids, 25 * sizeof *ids));
    TCHECK(df_session_eval(s, ids + 25, 10, got, 1, &err) == 0);
    TCHECKF(!memcmp(got, want + (size_t)25 * V, (size_t)10 * V * sizeof *got), "logits after the round trip differ");
    /* a context too small for it */
    df_session *small = new_session(eng, 16, 0);
    TCHECK(df_session_load(small, path, back, N, &n, E0) == -1 && strstr(err.msg, "context"));
    df_session_free(small);
    /* truncated anywhere, or a byte flipped in any part: refused, the session left empty */
    long size = file_size(path);
    TCHECK(size > 200);
    long cuts[] = {0, 10, 63, 64, 90, size / 2, size - 9, size - 1};
    for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
        copy_prefix(path, bad, cuts[i], -1);
        TCHECKF(df_session_load(s, bad, back, N, &n, E0) == -1 && n == 0 && df_session_pos(s) == 0,
                "a file cut at %ld bytes was loaded", cuts[i]);
    }
    long flips[] = {3, 20, 40, 70, 64 + 16 + 50, size / 2, size - 20, size - 3};
    for (size_t i = 0; i < sizeof flips / sizeof flips[0]; i++) {
        copy_prefix(path, bad, size, flips[i]);
        TCHECKF(df_session_load(s, bad, back, N, &n, E0) == -1 && n == 0 && df_session_pos(s) == 0,
                "a byte flipped at %ld was loaded", flips[i]);
        TCHECK(err.msg[0]);
    }
    copy_prefix(path, bad, size, -1);
    FILE *f = fopen(bad, "ab");
    if (f) fputc('x', f), fclose(f);
    TCHECK(df_session_load(s, bad, back, N, &n, E0) == -1 && strstr(err.msg, "trailing"));
    TCHECK(df_session_load(s, "/nonexistent/x.session", back, N, &n, E0) == -1 && strstr(err.msg, "/nonexistent"));
    df_session_free(s);
    df_engine_close(eng);
    /* another model of the same shape: refused by its identity */
    const char *other = model("sess_b", 22);
    if (other) {
        df_engine *e2 = open_model(other);
        df_session *s2 = e2 ? new_session(e2, 256, 0) : NULL;
        if (s2) {
            TCHECKF(df_session_load(s2, path, back, N, &n, E0) == -1 && strstr(err.msg, "different model"), "%s",
                    err.msg);
            TCHECK(df_session_pos(s2) == 0);
            df_session_free(s2);
        }
        if (e2) df_engine_close(e2);
    }
    free(want);
    free(got);
}

/* Flip (xor 0xff) the byte at offset `at` of tensor `name` in whichever
 * safetensors shard of dir holds it; returns 0, or -1 when not found. */
static int flip_tensor_byte(const char *dir, const char *name, uint64_t at)
{
    for (int i = 1; i < 100; i++) {
        char shard[700];
        int found = 0;
        for (int n = i; n < 100 && !found; n++) {
            snprintf(shard, sizeof shard, "%s/model-%05d-of-%05d.safetensors", dir, i, n);
            found = !access(shard, F_OK);
            if (!found) {
                snprintf(shard, sizeof shard, "%s/model-%05d-of-%06d.safetensors", dir, i, n);
                found = !access(shard, F_OK);
            }
        }
        if (!found) return -1;
        st_file f;
        df_error err = {0};
        if (st_open(shard, &f, &err)) return -1;
        const st_tensor *t = st_find(&f, name);
        int rc = 1;
        if (t && at < t->nbytes) {
            int fd = open(shard, O_RDWR);
            uint8_t b;
            rc = fd >= 0 && pread(fd, &b, 1, (off_t)(t->offset + at)) == 1 && (b ^= 0xff, 1) &&
                         pwrite(fd, &b, 1, (off_t)(t->offset + at)) == 1
                     ? 0
                     : -1;
            if (fd >= 0) close(fd);
        }
        st_deinit(&f);
        if (rc <= 0) return rc;
    }
    return -1;
}

/* The identity covers every byte that can change a logit: a session file
 * is refused by a model differing from its own in one routed-expert byte,
 * or in one trunk byte away from the start, middle and end of its tensor
 * (the bytes the identity used to sample); the same bytes put back (a new
 * mtime and ctime, the same content) are accepted again after a re-hash;
 * and a second open takes each file's hash from the cache. */
static void test_identity_every_byte(void)
{
    const char *src = model("sess_a", 21);
    if (!src) return;
    char dir[700], cmd[2200], path[700];
    snprintf(dir, sizeof dir, "%s/sess_id", test_scratch());
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && cp -r '%s' '%s'", dir, src, dir);
    if (system(cmd)) {
        t_fail(__FILE__, __LINE__, "cannot copy %s", src);
        return;
    }
    snprintf(path, sizeof path, "%s/id.session", test_scratch());
    int32_t ids[N], back[N];
    for (int i = 0; i < N; i++) ids[i] = tok(i);
    df_error err = {0};
    df_engine *eng = open_model(dir);
    if (!eng) return;
    df_session *s = new_session(eng, 256, 0);
    TCHECK(df_session_eval(s, ids, 20, NULL, 0, &err) == 0);
    TCHECKF(df_session_save(s, ids, 20, path, &err) == 0, "%s", err.msg);
    df_session_free(s);
    df_engine_close(eng);
    /* the hashes were recorded: a shard's now comes from the cache */
    char shard[800];
    snprintf(shard, sizeof shard, "%s/model-00001-of-00001.safetensors", dir);
    if (access(shard, F_OK)) snprintf(shard, sizeof shard, "%s/config.json", dir);
    uint8_t h1[16];
    filehash_stats fs;
    TCHECK(file_content_hash(shard, h1, 1, &fs, &err) == 0 && fs.cached == 1);

    static const struct {
        const char *what, *tensor;
        uint64_t at;
    } flips[] = {
        {"one routed-expert byte", "language_model.model.layers.2.block_sparse_moe.experts.5.w2.weight_packed", 37},
        {"one trunk byte (not sampled before)", "language_model.model.layers.1.self_attn.o_proj.weight", 100},
    };
    for (size_t i = 0; i < sizeof flips / sizeof flips[0]; i++) {
        int n = 0;
        TCHECKF(flip_tensor_byte(dir, flips[i].tensor, flips[i].at) == 0, "%s: cannot flip %s", flips[i].what,
                flips[i].tensor);
        eng = open_model(dir);
        if (!eng) return;
        s = new_session(eng, 256, 0);
        TCHECKF(df_session_load(s, path, back, N, &n, E0) == -1 && strstr(err.msg, "different model") &&
                    df_session_pos(s) == 0,
                "%s: loaded (%s)", flips[i].what, err.msg);
        df_session_free(s);
        df_engine_close(eng);
        /* the byte put back: the same content under a new mtime is hashed again and accepted */
        TCHECK(flip_tensor_byte(dir, flips[i].tensor, flips[i].at) == 0);
        eng = open_model(dir);
        if (!eng) return;
        s = new_session(eng, 256, 0);
        TCHECKF(df_session_load(s, path, back, N, &n, E0) == 0 && n == 20, "%s restored: %s", flips[i].what, err.msg);
        df_session_free(s);
        df_engine_close(eng);
    }
}

/* A writer killed in the middle of a save (its file size limit) leaves the
 * previous file as it was, and the next save replaces the stale temp file. */
static void test_kill_mid_save(void)
{
    const char *dir = model("sess_a", 21);
    if (!dir) return;
    df_engine *eng = open_model(dir);
    if (!eng) return;
    int32_t ids[N], back[N];
    for (int i = 0; i < N; i++) ids[i] = tok(i);
    char path[600], tmp[620];
    snprintf(path, sizeof path, "%s/k.session", test_scratch());
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    df_error err = {0};
    df_session *s = new_session(eng, 256, 0);
    TCHECK(df_session_eval(s, ids, 12, NULL, 0, &err) == 0 && df_session_save(s, ids, 12, path, &err) == 0);
    TCHECK(df_session_eval(s, ids + 12, 20, NULL, 0, &err) == 0);
    long size = file_size(path);
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        struct rlimit half = {(rlim_t)size / 2, (rlim_t)size / 2}, no_core = {0, 0};
        if (setrlimit(RLIMIT_CORE, &no_core) || setrlimit(RLIMIT_FSIZE, &half)) _exit(3);
        df_error e2 = {0};
        df_session_save(s, ids, 32, path, &e2);
        _exit(0);
    }
    int status;
    waitpid(pid, &status, 0);
    TCHECKF(WIFSIGNALED(status) && WTERMSIG(status) == SIGXFSZ, "the writer was not killed mid-save (status %d)", status);
    TCHECK(file_size(tmp) > 0 && file_size(tmp) < size + 20 * 100);
    df_session *r = new_session(eng, 256, 0);
    int n = 0;
    TCHECKF(df_session_load(r, path, back, N, &n, &err) == 0 && n == 12, "the previous file is unreadable: %s", err.msg);
    TCHECK(df_session_save(s, ids, 32, path, &err) == 0 && file_size(tmp) < 0);
    TCHECK(df_session_load(r, path, back, N, &n, &err) == 0 && n == 32);
    df_session_free(r);
    df_session_free(s);
    df_engine_close(eng);
}

/* `run --session` and `chat --session`: a resumed run evaluates only the
 * new part of its prompt and prints what a fresh run prints; a resumed chat
 * continues the conversation as one process would; a damaged file is
 * refused by name, and never half-loaded. */
static void test_cli_sessions(void)
{
    char tiny[512], sess[600], cmd[4096];
    snprintf(tiny, sizeof tiny, "%s/k3-tiny-a/checkpoint", testdata_dir());
    snprintf(sess, sizeof sess, "%s/cli.session", test_scratch());
    unlink(sess);
    static char out[1 << 16], out2[1 << 16], err[1 << 16];
    const char *df = build_bin("deltafin");
    const char *r1[] = {df, "run", "--model", tiny, "--prompt-ids", "5,6,7,8,9", "--max-new", "6", "--print-ids",
                        "--session", sess, NULL};
    TCHECKF(t_run(r1, out, sizeof out, err, sizeof err) == 0, "%s", err);
    TCHECK(file_size(sess) > 0);
    /* the next prompt extends what the file holds (its prompt and reply, whose last id is
     * evaluated too) */
    char ids[512];
    snprintf(ids, sizeof ids, "5,6,7,8,9,%.*s,11,12", (int)strcspn(out, "\n"), out);
    const char *r2[] = {df, "run", "--model", tiny, "--prompt-ids", ids, "--max-new", "6", "--print-ids", "--session",
                        sess, "--stats", NULL};
    TCHECKF(t_run(r2, out, sizeof out, err, sizeof err) == 0, "%s", err);
    TCHECKF(strstr(err, "11 tokens resumed"), "not resumed: %s", err);
    TCHECKF(strstr(err, "2 of the prompt's 13 to evaluate"), "%s", err);
    const char *r3[] = {df, "run", "--model", tiny, "--prompt-ids", ids, "--max-new", "6", "--print-ids", NULL};
    TCHECK(t_run(r3, out2, sizeof out2, err, sizeof err) == 0);
    TCHECKF(!strcmp(out, out2), "resumed: %s fresh: %s", out, out2);
    /* a corrupted file: refused, named */
    long size = file_size(sess);
    char bad[620];
    snprintf(bad, sizeof bad, "%s.bad", sess);
    copy_prefix(sess, bad, size, size / 2);
    const char *r4[] = {df, "run", "--model", tiny, "--prompt-ids", ids, "--session", bad, NULL};
    TCHECK(t_run(r4, out, sizeof out, err, sizeof err) == 1 && strstr(err, bad) && strstr(err, "corrupted"));
    const char *r5[] = {df, "run", "--model", tiny, "--prompt-ids", ids, "--session", bad, "--dump-logits", "/tmp/x",
                        NULL};
    TCHECK(t_run(r5, out, sizeof out, err, sizeof err) == 2 && strstr(err, "--dump-logits"));
    /* chat: two processes, one turn each, as one process with two turns */
    unlink(sess);
    snprintf(cmd, sizeof cmd, "printf 'Hello there\\n' | %s chat --model %s --max-new 10 --session %s >/dev/null && "
             "printf 'And again\\n' | %s chat --model %s --max-new 10 --session %s", df, tiny, sess, df, tiny, sess);
    const char *c1[] = {"/bin/sh", "-c", cmd, NULL};
    TCHECKF(t_run(c1, out, sizeof out, err, sizeof err) == 0, "%s", err);
    snprintf(cmd, sizeof cmd, "printf 'Hello there\\nAnd again\\n' | %s chat --model %s --max-new 10", df, tiny);
    const char *c2[] = {"/bin/sh", "-c", cmd, NULL};
    TCHECK(t_run(c2, out2, sizeof out2, err, sizeof err) == 0);
    /* the second process printed the second reply, as the one process did last */
    size_t a = strlen(out), b = strlen(out2);
    TCHECKF(a > 4 && b > a && !strcmp(out2 + b - a, out), "resumed chat: [%s] one process: [%s]", out, out2);
}

static const test_case tests[] = {
    {"cli_sessions", test_cli_sessions},
    {"checkpoints", test_checkpoints},
    {"checkpoints_inside", test_checkpoints_inside},
    {"session_files", test_session_files},
    {"kill_mid_save", test_kill_mid_save},
    {"identity_every_byte", test_identity_every_byte},
};

int main(int argc, char **argv)
{
    /* the file-hash cache of these runs, not the user's */
    char cache[600];
    snprintf(cache, sizeof cache, "%s/filehash-cache", test_scratch());
    setenv("DELTAFIN_CACHE_DIR", cache, 1);
    return test_main(tests, NTESTS(tests), argc, argv);
}
