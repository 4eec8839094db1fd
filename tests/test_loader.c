/* test_loader.c - corrupted, truncated and mismatched checkpoints give a
 * clear error that names the file, the tensor or key and the problem, and
 * never crash.  Each case copies the fixture checkpoint into a temporary
 * directory and breaks one thing (config, index, a shard header, shard
 * bytes).  Also: vision tensors are skipped, the loader never writes, and
 * one model.safetensors without an index or 5 shards give the fixture's
 * logits bit for bit (model/weights.c opens every layout).
 */
#define _GNU_SOURCE
#include "harness.h"
#include "engine.h"
#include "safetensors.h"
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

static const char *files[] = {"config.json", "model.safetensors.index.json", "model-00001-of-000003.safetensors",
                              "model-00002-of-000003.safetensors", "model-00003-of-000003.safetensors"};
#define SHARD1 "model-00001-of-000003.safetensors"

static char tmpdir[256];

static char *slurp(const char *path, size_t *len)
{
    char *buf;
    df_error err = {0};
    if (read_small_file(path, &buf, len, 1u << 28, &err)) return NULL;
    return buf;
}

static void spit(const char *path, const void *data, size_t len)
{
    FILE *f = fopen(path, "wb");
    CHECK(f && fwrite(data, 1, len, f) == len && fclose(f) == 0);
}

static void fresh_copy(void)
{
    snprintf(tmpdir, sizeof tmpdir, "/tmp/df_loader_XXXXXX");
    CHECK(mkdtemp(tmpdir));
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        char src[512], dst[512];
        size_t len;
        snprintf(src, sizeof src, "%s/k3-tiny-a/checkpoint/%s", testdata_dir(), files[i]);
        snprintf(dst, sizeof dst, "%s/%s", tmpdir, files[i]);
        char *b = slurp(src, &len);
        CHECK(b);
        spit(dst, b, len);
        free(b);
    }
}

static void cleanup(void)
{
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        char p[512];
        snprintf(p, sizeof p, "%s/%s", tmpdir, files[i]);
        unlink(p);
    }
    rmdir(tmpdir);
}

/* Open the temp checkpoint; expect failure with every needle in the message. */
static void expect_error(const char *what, const char *n1, const char *n2, const char *n3)
{
    df_engine_opts o;
    df_engine_opts_default(&o);
    o.quiet = 1;
    o.n_threads = 1;
    df_engine *eng = NULL;
    df_error err = {0};
    int rc = df_engine_open(tmpdir, &o, &eng, &err);
    TCHECKF(rc == -1 && !eng, "%s: the corrupted checkpoint loaded", what);
    if (eng) df_engine_close(eng);
    const char *needles[3] = {n1, n2, n3};
    for (int i = 0; i < 3; i++)
        TCHECKF(!needles[i] || strstr(err.msg, needles[i]), "%s: message lacks \"%s\": %s", what, needles[i], err.msg);
    fprintf(stderr, "    %s -> %s\n", what, err.msg);
}

static void replace_in_file(const char *name, const char *from, const char *to)
{
    char p[512];
    size_t len;
    snprintf(p, sizeof p, "%s/%s", tmpdir, name);
    char *b = slurp(p, &len);
    char *at = strstr(b, from);
    CHECK(at);
    size_t fl = strlen(from), tl = strlen(to);
    char *out = malloc(len - fl + tl + 1);
    size_t pre = (size_t)(at - b);
    memcpy(out, b, pre);
    memcpy(out + pre, to, tl);
    memcpy(out + pre + tl, at + fl, len - pre - fl);
    spit(p, out, len - fl + tl);
    free(b);
    free(out);
}

/* Rewrite a shard's header through a mutation of its tensor table; the data
 * section is kept byte for byte. */
typedef void (*mutate_fn)(st_tensor *t, size_t n, uint64_t data_start);

static void rewrite_shard(const char *name, mutate_fn fn, const char *override_dtype_for, const char *dtype)
{
    char p[512];
    snprintf(p, sizeof p, "%s/%s", tmpdir, name);
    st_file f;
    df_error err = {0};
    CHECK(st_open(p, &f, &err) == 0);
    size_t len;
    char *b = slurp(p, &len);
    if (fn) fn(f.tensors, f.n_tensors, f.data_start);
    size_t cap = 1 << 20, k = 0;
    char *h = malloc(cap);
    k += (size_t)snprintf(h + k, cap - k, "{\"__metadata__\":{\"format\":\"pt\"}");
    for (size_t i = 0; i < f.n_tensors; i++) {
        const st_tensor *t = &f.tensors[i];
        const char *dt = override_dtype_for && !strcmp(t->name, override_dtype_for) ? dtype : st_dtype_name(t->dtype);
        k += (size_t)snprintf(h + k, cap - k, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[", t->name, dt);
        for (int d = 0; d < t->n_dims; d++) k += (size_t)snprintf(h + k, cap - k, "%s%lld", d ? "," : "", (long long)t->shape[d]);
        k += (size_t)snprintf(h + k, cap - k, "],\"data_offsets\":[%llu,%llu]}",
                              (unsigned long long)(t->offset - f.data_start),
                              (unsigned long long)(t->offset - f.data_start + t->nbytes));
    }
    k += (size_t)snprintf(h + k, cap - k, "}");
    size_t dlen = len - f.data_start;
    char *out = malloc(8 + k + dlen);
    uint64_t hl = k;
    for (int i = 0; i < 8; i++) out[i] = (char)(hl >> (8 * i));
    memcpy(out + 8, h, k);
    memcpy(out + 8 + k, b + f.data_start, dlen);
    spit(p, out, 8 + k + dlen);
    free(out);
    free(h);
    free(b);
    st_deinit(&f);
}

static const char *target;

static void mut_shape(st_tensor *t, size_t n, uint64_t ds)
{
    (void)ds;
    for (size_t i = 0; i < n; i++)
        if (!strcmp(t[i].name, target)) {
            t[i].n_dims = 2;
            t[i].shape[1] = 2;
            t[i].shape[0] /= 2;
        }
}

static void mut_overlap(st_tensor *t, size_t n, uint64_t ds)
{
    (void)ds;
    /* move the target onto the start of another tensor of at least its size */
    size_t ti = n;
    for (size_t i = 0; i < n; i++)
        if (!strcmp(t[i].name, target)) ti = i;
    CHECK(ti < n);
    for (size_t i = 0; i < n; i++)
        if (i != ti && t[i].nbytes >= t[ti].nbytes) {
            t[ti].offset = t[i].offset;
            return;
        }
}

static void mut_drop(st_tensor *t, size_t n, uint64_t ds)
{
    (void)ds;
    for (size_t i = 0; i < n; i++)
        if (!strcmp(t[i].name, target)) t[i].nbytes = 0, t[i].n_dims = 1, t[i].shape[0] = 0;
}

#define CASE(body)      \
    do {                \
        fresh_copy();   \
        body;           \
        cleanup();      \
    } while (0)

static void test_config_errors(void)
{
    CASE({
        char p[512];
        snprintf(p, sizeof p, "%s/config.json", tmpdir);
        unlink(p);
        expect_error("no config", "config.json", "cannot open", NULL);
    });
    CASE({
        replace_in_file("config.json", "\"hidden_size\": 64,", "\"hidden_size\": 64");
        expect_error("config syntax", "config.json", "JSON", NULL);
    });
    CASE({
        replace_in_file("config.json", "\"hidden_size\": 64,", "");
        expect_error("config missing key", "config.json", "\"hidden_size\"", "missing");
    });
    CASE({
        replace_in_file("config.json", "\"hidden_size\": 64,", "\"hidden_size\": \"64\",");
        expect_error("config wrong type", "hidden_size", "integer", NULL);
    });
    CASE({
        replace_in_file("config.json", "\"model_type\": \"kimi_k3\"", "\"model_type\": \"llama\"");
        expect_error("config model_type", "model_type", "kimi_k3", NULL);
    });
    CASE({
        replace_in_file("config.json", "\"full_attn_layers\": [\n        4,", "\"full_attn_layers\": [\n        3,");
        expect_error("config layer twice", "listed twice", NULL, NULL);
    });
    CASE({
        replace_in_file("config.json", "\"num_experts\": 16,", "\"num_experts\": 17,");
        expect_error("config/checkpoint mismatch", "gate.weight", "expected [17, 64]", NULL);
    });
    CASE({
        replace_in_file("config.json", "\"hidden_size\": 64,", "\"hidden_size\": 96,");
        expect_error("config hidden size mismatch", ".safetensors", "has shape", "expected");
    });
}

static void test_index_errors(void)
{
    CASE({
        replace_in_file("model.safetensors.index.json", "\"language_model.model.layers.2.self_attn.q_proj.weight\"",
                        "\"language_model.model.layers.2.self_attn.q_projX.weight\"");
        expect_error("index lacks tensor", "layers.2.self_attn.q_proj.weight", "weight_map", NULL);
    });
    CASE({
        replace_in_file("model.safetensors.index.json", "\"weight_map\"", "\"weight_mop\"");
        expect_error("index without weight_map", "index.json", "weight_map", NULL);
    });
    CASE({
        char p[512];
        snprintf(p, sizeof p, "%s/model-00002-of-000003.safetensors", tmpdir);
        unlink(p);
        expect_error("shard missing", "model-00002-of-000003.safetensors", "cannot open", NULL);
    });
    CASE({
        replace_in_file("model.safetensors.index.json", "\"weight_map\": {",
                        "\"weight_map\": {\n    \"language_model.vision_tower.x.weight\": \"model-00009-of-000009.safetensors\","
                        "\n    \"mm_projector.proj.weight\": \"model-00009-of-000009.safetensors\",");
        df_engine_opts o;
        df_engine_opts_default(&o);
        o.quiet = 1;
        df_engine *eng = NULL;
        df_error err = {0};
        TCHECKF(df_engine_open(tmpdir, &o, &eng, &err) == 0, "vision tensors not skipped: %s", err.msg);
        df_engine_close(eng);
    });
}

static void test_shard_errors(void)
{
    CASE({
        char p[512];
        snprintf(p, sizeof p, "%s/" SHARD1, tmpdir);
        struct stat st;
        stat(p, &st);
        CHECK(truncate(p, st.st_size / 2) == 0);
        expect_error("shard truncated", SHARD1, "truncated", NULL);
    });
    CASE({
        char p[512];
        snprintf(p, sizeof p, "%s/" SHARD1, tmpdir);
        CHECK(truncate(p, 5) == 0);
        expect_error("shard tiny", SHARD1, "too short", NULL);
    });
    CASE({
        char p[512];
        size_t len;
        snprintf(p, sizeof p, "%s/" SHARD1, tmpdir);
        char *b = slurp(p, &len);
        b[7] = 0x40; /* header length ~ 2^62 */
        spit(p, b, len);
        free(b);
        expect_error("header length garbage", SHARD1, "header length", NULL);
    });
    CASE({
        char p[512];
        size_t len;
        snprintf(p, sizeof p, "%s/" SHARD1, tmpdir);
        char *b = slurp(p, &len);
        b[8] = '[';
        spit(p, b, len);
        free(b);
        expect_error("header not JSON", SHARD1, "JSON", NULL);
    });
    CASE({
        rewrite_shard(SHARD1, NULL, "language_model.model.layers.0.input_layernorm.weight", "F16");
        expect_error("wrong dtype", SHARD1, "layers.0.input_layernorm.weight", "dtype F16");
    });
    CASE({
        rewrite_shard(SHARD1, NULL, "language_model.model.layers.0.input_layernorm.weight", "Q9");
        expect_error("unknown dtype", SHARD1, "layers.0.input_layernorm.weight", "unknown dtype");
    });
    CASE({
        target = "language_model.model.layers.1.post_attention_layernorm.weight";
        rewrite_shard(SHARD1, mut_shape, NULL, NULL);
        expect_error("wrong shape", SHARD1, "layers.1.post_attention_layernorm.weight", "[32, 2]");
    });
    CASE({
        target = "language_model.model.layers.1.post_attention_layernorm.weight";
        rewrite_shard(SHARD1, mut_overlap, NULL, NULL);
        expect_error("overlap", SHARD1, "overlap", NULL);
    });
    CASE({
        target = "language_model.model.layers.2.block_sparse_moe.experts.7.w2.weight_scale";
        rewrite_shard(SHARD1, mut_drop, NULL, NULL);
        expect_error("expert tensor shape", SHARD1, "experts.7.w2.weight_scale", "shape");
    });
    CASE({
        rewrite_shard(SHARD1, NULL, "language_model.model.layers.2.block_sparse_moe.experts.3.w1.weight_packed", "I8");
        expect_error("expert dtype", SHARD1, "experts.3.w1.weight_packed", "expected U8");
    });
}

/* In a forked child, make every way to open a file for writing (and to
 * create, rename, link, remove or truncate one) fail with EROFS through a
 * seccomp filter: unlike chmod 0444, root cannot override it.  Returns 0,
 * or -1 where seccomp filters are unavailable. */
static int forbid_writes(void)
{
#if defined(__x86_64__)
    static const int deny[] = {__NR_creat,  __NR_openat2,   __NR_rename,   __NR_renameat, __NR_renameat2,
                               __NR_unlink, __NR_unlinkat,  __NR_rmdir,    __NR_mkdir,    __NR_mkdirat,
                               __NR_link,   __NR_linkat,    __NR_symlink,  __NR_symlinkat, __NR_truncate,
                               __NR_ftruncate, __NR_fallocate, __NR_mknod, __NR_mknodat};
    enum { K = sizeof deny / sizeof deny[0] };
    const unsigned wr = O_WRONLY | O_RDWR | O_CREAT | O_TRUNC | O_APPEND;
    struct sock_filter f[K + 16];
    int n = 0;
    const int l_open = 6 + K + 1, l_openat = l_open + 2, l_deny = l_open + 4;
    f[n++] = (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch));
    f[n++] = (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0);
    f[n++] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW);
    f[n++] = (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr));
    f[n] = (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_open, (unsigned char)(l_open - n - 1), 0);
    n++;
    f[n] = (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_openat, (unsigned char)(l_openat - n - 1), 0);
    n++;
    for (int k = 0; k < K; k++, n++)
        f[n] = (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (unsigned)deny[k], (unsigned char)(l_deny - n - 1), 0);
    f[n++] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW);
    /* l_open: open(path, flags); l_openat: openat(dirfd, path, flags) */
    f[n++] = (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[1]));
    f[n++] = (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JA, 1, 0, 0);
    f[n++] = (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[2]));
    f[n++] = (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JSET | BPF_K, wr, 0, 1);
    f[n++] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (EROFS & SECCOMP_RET_DATA));
    f[n++] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW);
    CHECK(n <= (int)(sizeof f / sizeof f[0]) && l_deny == n - 2);
    struct sock_fprog prog = {.len = (unsigned short)n, .filter = f};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) return -1;
    if (prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) != 0) return -1;
    /* the filter works: */
    char probe[300];
    snprintf(probe, sizeof probe, "%s/probe", tmpdir);
    if (open(probe, O_WRONLY | O_CREAT | O_CLOEXEC, 0644) >= 0 || errno != EROFS) return -1;
    return 0;
#else
    return -1;
#endif
}

static void test_loader_does_not_write(void)
{
    fresh_copy();
    struct stat before[5], after[5];
    for (int i = 0; i < 5; i++) {
        char p[512];
        snprintf(p, sizeof p, "%s/%s", tmpdir, files[i]);
        stat(p, &before[i]);
    }
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        if (forbid_writes()) _exit(4);
        df_engine_opts o;
        df_engine_opts_default(&o);
        o.quiet = 1;
        df_engine *eng = NULL;
        df_error err = {0};
        if (df_engine_open(tmpdir, &o, &eng, &err)) {
            fprintf(stderr, "    open with every write refused: %s\n", err.msg);
            _exit(1);
        }
        df_engine_close(eng);
        _exit(0);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    if (WIFEXITED(st) && WEXITSTATUS(st) == 4) {
        t_skip("no seccomp filters here: cannot refuse writes to root");
    } else {
        TCHECKF(WIFEXITED(st) && WEXITSTATUS(st) == 0,
                "the loader failed (or crashed) when no file may be opened for writing (status %d)", st);
    }
    for (int i = 0; i < 5; i++) {
        char p[512];
        snprintf(p, sizeof p, "%s/%s", tmpdir, files[i]);
        stat(p, &after[i]);
        TCHECK(before[i].st_size == after[i].st_size && before[i].st_mtime == after[i].st_mtime);
    }
    cleanup();
}

/* The fixture's logits from the checkpoint at dir (all rows of 9 ids),
 * or NULL with the error printed. */
static float *logits_of(const char *dir, int *V)
{
    static const int32_t ids[9] = {1, 5, 9, 42, 7, 3, 100, 5, 9};
    df_engine_opts o;
    df_engine_opts_default(&o);
    o.quiet = 1;
    o.n_threads = 1;
    df_engine *eng = NULL;
    df_session *s = NULL;
    df_error err = {0};
    float *out = NULL;
    if (df_engine_open(dir, &o, &eng, &err) == 0) {
        df_model_info mi;
        df_engine_info(eng, &mi);
        *V = mi.vocab;
        df_session_opts so;
        df_session_opts_default(&so);
        out = xmalloc((size_t)9 * (size_t)mi.vocab * sizeof *out);
        if (df_session_new(eng, &so, &s, &err) || df_session_eval(s, ids, 9, out, 1, &err)) {
            free(out);
            out = NULL;
        }
    }
    if (!out) fprintf(stderr, "    %s: %s\n", dir, err.msg);
    if (s) df_session_free(s);
    if (eng) df_engine_close(eng);
    return out;
}

/* The same checkpoint in one model.safetensors without an index, and in 5
 * shards with one (tools/st_reshard.py, the tensors' bytes unchanged): the
 * same logits, bit for bit, as the fixture's 3 shards; a folder with
 * neither file is refused naming both. */
static void test_layouts(void)
{
    char src[512], dst[600], cmd[1400];
    snprintf(src, sizeof src, "%s/k3-tiny-a/checkpoint", testdata_dir());
    int V = 0, V2 = 0;
    float *want = logits_of(src, &V);
    TCHECK(want != NULL);
    if (!want) return;
    for (int n = 1; n <= 5; n += 4) {
        snprintf(dst, sizeof dst, "%s/layout%d", test_scratch(), n);
        snprintf(cmd, sizeof cmd, "/usr/bin/python3 tools/st_reshard.py %s %s %d", src, dst, n);
        TCHECKF(system(cmd) == 0, "%s", cmd);
        snprintf(cmd, sizeof cmd, "%s/model.safetensors.index.json", dst);
        struct stat sb;
        TCHECKF((stat(cmd, &sb) == 0) == (n > 1), "%d shards: the index is %s", n, n > 1 ? "missing" : "there");
        float *got = logits_of(dst, &V2);
        TCHECKF(got && V2 == V && !memcmp(got, want, (size_t)9 * (size_t)V * sizeof *got),
                "%d shard(s): the logits differ from the fixture's", n);
        free(got);
    }
    snprintf(dst, sizeof dst, "%s/layout1/model.safetensors", test_scratch());
    TCHECK(unlink(dst) == 0);
    snprintf(dst, sizeof dst, "%s/layout1", test_scratch());
    snprintf(tmpdir, sizeof tmpdir, "%.200s", dst);
    expect_error("no weight files", "model.safetensors.index.json", "model.safetensors (a model folder", NULL);
    free(want);
    test_scratch_remove();
}

static const test_case tests[] = {
    {"config_errors_named", test_config_errors},
    {"index_errors_named", test_index_errors},
    {"shard_errors_named", test_shard_errors},
    {"loader_reads_only", test_loader_does_not_write},
    {"layouts_same_bits", test_layouts},
};

int main(int argc, char **argv) { return test_main(tests, NTESTS(tests), argc, argv); }
