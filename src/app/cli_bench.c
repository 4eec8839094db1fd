/* cli_bench.c - `deltafin bench`: the engine's prefill and decode speed on
 * a model, beside the machine's own limits measured in the same run
 * (df_measure_limits: memory read bandwidth, the kernels' in-cache rate),
 * as roofline fractions; with --vs-llama, llama.cpp and deltafin on the
 * same GGUF, side by side in one run.
 *
 * Each measurement is a child process, so peak RSS (wait4's ru_maxrss) and
 * bytes read from storage (/proc/self/io read_bytes, printed by the child)
 * belong to one engine alone: llama.cpp through build/llama_peer (the npm
 * prebuilt libllama v0.4.0, tools/llama_peer.c) and deltafin through
 * `deltafin run --bench-json`.  Both get the same prompt ids, thread count
 * and number of decoded tokens; the repetitions alternate the order (A B,
 * B A, ...) so drift on a shared machine hits both alike, and the table
 * shows medians and the deltafin / llama.cpp ratios.
 *
 * Larger than RAM: --squeeze-to SIZE starts a helper process that mlock()s
 * memory until only SIZE is available, for both engines alike (llama.cpp
 * then pages its mmap, deltafin streams within --mem); --drop-caches empties
 * the page cache before every timed run so neither starts from the other's
 * pages.  A warm-up run of each engine precedes the timed ones unless
 * --drop-caches is given.
 * Front end only (L5): no engine internals, errors exit with a message.
 */
#define _GNU_SOURCE
#include "cli.h"
#include "json.h"
#include "weights.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define MAX_REPS 32

typedef struct {
    double prefill_tps, decode_tps, read_per_token;
    long rss_kb;
    char ids[4096];
    /* deltafin's result line only: the model's work (df_model_info) */
    double trunk_flops, expert_flops, weight_bytes;
    char trunk[40], experts[40], kernels[32];
} bench_result;

typedef struct {
    const char *model, *peer, *lib, *mem, *prompt_ids, *batch, *kernels;
    int threads, prompt_len, gen, reps, drop, no_repack, json, ubatch, vs;
    size_t squeeze_to;
} bench_args;

static void bench_usage(FILE *f)
{
    fputs("usage: deltafin bench --model MODEL [--vs-llama] [options]\n"
          "  deltafin's prefill and decode tok/s (medians of --reps runs, each a child\n"
          "  process), beside this machine's memory read bandwidth and the kernels' rate\n"
          "  with the weights in cache, both measured in the same run: how close each\n"
          "  is to its limit.  MODEL: a model folder or a GGUF file.\n"
          "  --vs-llama           llama.cpp (npm prebuilt, build/llama_peer) on the same GGUF,\n"
          "                       interleaved with deltafin (A B, B A, ...)\n"
          "  --threads N          threads for both engines (default: all CPUs)\n"
          "  --kernels ISA        deltafin's kernels (ref, avx2, avx512, neon; default: the best)\n"
          "  --prompt-len N       prompt tokens (default 32)\n"
          "  --prompt-ids LIST    the prompt instead of generated ids (@FILE: ids read from FILE)\n"
          "  --gen N              tokens decoded greedily after the prompt (default 16)\n"
          "  --reps N             timed repetitions of each engine, alternating order (default 3)\n"
          "  --mem SIZE           deltafin's memory budget (default: its planner's)\n"
          "  --batch N|auto       deltafin's prompt chunk (default auto: its planner's)\n"
          "  --llama-ubatch N     positions per llama.cpp graph (default 512, llama.cpp's own\n"
          "                       default; the prompt is one llama_decode call either way)\n"
          "  --squeeze-to SIZE    lock memory in a helper process until only SIZE is available\n"
          "                       (both engines run under the same pressure)\n"
          "  --drop-caches        drop the page cache before every timed run (needs root)\n"
          "  --llama-no-repack    llama.cpp without its repacked weight copies (needed when the\n"
          "                       model does not fit in RAM)\n"
          "  --llama-peer PATH    the llama_peer binary (default: next to deltafin)\n"
          "  --llama-lib DIR      llama.cpp's libraries (default: tests/llama/node_modules/...)\n"
          "  --json               also print every run as a JSON line, and the roofline figures last\n",
          f);
}

/* The folder of this executable, for finding llama_peer and the package. */
static void exe_dir(char *out, size_t n)
{
    ssize_t k = readlink("/proc/self/exe", out, n - 1);
    if (k <= 0) {
        snprintf(out, n, ".");
        return;
    }
    out[k] = 0;
    char *sl = strrchr(out, '/');
    if (sl) *sl = 0;
}

/* The model's bytes: its weight files (weights.h: a folder's shards, a
 * GGUF and the files of its gguf-split), or the file itself when it is
 * not a model deltafin reads. */
static double model_bytes(const char *path)
{
    wset w;
    if (wset_open(path, NULL, &w, NULL) == 0) {
        double n = (double)wset_file_bytes(&w);
        wset_close(&w);
        return n;
    }
    struct stat sb;
    return stat(path, &sb) ? 0 : (double)sb.st_size;
}

static double median(double *v, int n)
{
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && v[j] < v[j - 1]; j--) {
            double t = v[j];
            v[j] = v[j - 1];
            v[j - 1] = t;
        }
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static void drop_caches(void)
{
    sync();
    FILE *f = fopen("/proc/sys/vm/drop_caches", "w");
    if (!f || fputs("3\n", f) < 0 || fclose(f) != 0)
        die("--drop-caches: cannot write /proc/sys/vm/drop_caches (needs root)");
}

/* This process's OOM score adjustment (see squeeze): best effort; lowering
 * it needs privileges a container may lack, raising it never does. */
static void set_oom_adj(const char *v)
{
    int fd = open("/proc/self/oom_score_adj", O_WRONLY);
    if (fd < 0) return;
    ssize_t w = write(fd, v, strlen(v));
    (void)w;
    close(fd);
}

/* Run argv as a child; its stdout's last JSON line goes to r.  The child is
 * the kernel's first choice when memory runs out (an engine past the
 * squeezed memory is killed, not the helper holding it). */
static void run_child(char *const *argv, const char *what, int quiet_stderr, bench_result *r, int json)
{
    int fd[2];
    if (pipe(fd)) die("pipe: %s", strerror(errno));
    /* a quiet child's standard error goes to a temporary file, shown when it fails */
    FILE *errf = quiet_stderr ? tmpfile() : NULL;
    pid_t pid = fork();
    if (pid < 0) die("fork: %s", strerror(errno));
    if (pid == 0) {
        dup2(fd[1], 1);
        close(fd[0]);
        close(fd[1]);
        if (quiet_stderr) {
            if (errf) {
                dup2(fileno(errf), 2);
            } else {
                FILE *n = freopen("/dev/null", "w", stderr);
                (void)n;
            }
        }
        set_oom_adj("1000");
        execv(argv[0], argv);
        fprintf(stderr, "deltafin bench: cannot run %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    close(fd[1]);
    char buf[1 << 16];
    size_t len = 0;
    ssize_t k;
    while ((k = read(fd[0], buf + len, sizeof buf - 1 - len)) > 0) len += (size_t)k;
    close(fd[0]);
    buf[len] = 0;
    int status;
    struct rusage ru;
    if (wait4(pid, &status, 0, &ru) < 0) die("wait: %s", strerror(errno));
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        char tail[1024] = "";
        if (errf) { /* the last lines it printed */
            long end = fseek(errf, 0, SEEK_END) == 0 ? ftell(errf) : 0;
            long from = end > (long)sizeof tail - 1 ? end - (long)sizeof tail + 1 : 0;
            if (end > 0 && fseek(errf, from, SEEK_SET) == 0) tail[fread(tail, 1, sizeof tail - 1, errf)] = 0;
        }
        die("%s failed (%s %d): %s ...%s%s", what, WIFEXITED(status) ? "exit status" : "signal",
            WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status), argv[0], tail[0] ? "; it said:\n" : "",
            tail);
    }
    if (errf) fclose(errf);
    char *line = strrchr(buf, '{');
    df_error err = {0};
    json_doc *doc = line ? json_parse(line, strlen(line), &err) : NULL;
    if (!doc) die("%s printed no result line (%s)", what, line ? err.msg : "no JSON");
    const json_value *o = json_root(doc);
    double steps = 0, rb = 0;
    if (json_get_num(o, "prefill_tps", &r->prefill_tps) || json_get_num(o, "decode_tps", &r->decode_tps) ||
        json_get_num(o, "decode_steps", &steps) || json_get_num(o, "decode_read_bytes", &rb))
        die("%s: result line lacks a field: %s", what, line);
    r->read_per_token = steps > 0 ? rb / steps : 0;
    r->trunk_flops = r->expert_flops = r->weight_bytes = 0;
    r->trunk[0] = r->experts[0] = r->kernels[0] = 0;
    (void)json_get_num(o, "trunk_flops_per_position", &r->trunk_flops);
    (void)json_get_num(o, "expert_flops_per_position", &r->expert_flops);
    (void)json_get_num(o, "weight_bytes_per_token", &r->weight_bytes);
    const char *sv;
    if ((sv = json_get_str(o, "trunk"))) snprintf(r->trunk, sizeof r->trunk, "%s", sv);
    if ((sv = json_get_str(o, "experts"))) snprintf(r->experts, sizeof r->experts, "%s", sv);
    if ((sv = json_get_str(o, "kernels"))) snprintf(r->kernels, sizeof r->kernels, "%s", sv);
    /* the child's own peak since exec; ru_maxrss also counts what this
     * process had resident when it forked */
    double peak = -1;
    r->rss_kb = json_get_num(o, "peak_rss_kb", &peak) == 0 && peak > 0 ? (long)peak : ru.ru_maxrss;
    const json_value *ids = json_get(o, "ids");
    size_t w = 0;
    r->ids[0] = 0;
    for (size_t i = 0; ids && ids->type == JSON_ARRAY && i < ids->len && w + 16 < sizeof r->ids; i++)
        w += (size_t)snprintf(r->ids + w, sizeof r->ids - w, "%s%lld", i ? "," : "", (long long)ids->items[i]->i);
    json_free(doc);
    if (json) {
        char *nl = strchr(line, '\n');
        if (nl) *nl = 0;
        printf("%s\n", line);
    }
}

static long meminfo_kb(const char *key)
{
    FILE *f = fopen("/proc/meminfo", "r");
    char line[256];
    long v = -1;
    size_t kl = strlen(key);
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, key, kl) && line[kl] == ':') {
            v = strtol(line + kl + 1, NULL, 10);
            break;
        }
    if (f) fclose(f);
    return v;
}

/* A child that locks memory until only `target` bytes are available; returns
 * its pid once the memory is locked. */
static pid_t squeeze(size_t target, size_t *locked)
{
    long avail_kb = meminfo_kb("MemAvailable");
    if (avail_kb < 0) die("--squeeze-to: cannot read MemAvailable from /proc/meminfo");
    size_t avail = (size_t)avail_kb * 1024;
    if (avail <= target) {
        *locked = 0;
        return 0;
    }
    size_t n = avail - target;
    int fd[2];
    if (pipe(fd)) die("pipe: %s", strerror(errno));
    pid_t pid = fork();
    if (pid < 0) die("fork: %s", strerror(errno));
    if (pid == 0) {
        close(fd[0]);
        /* an engine that allocates past the memory left is the one the
         * kernel should kill, not the helper (which would leave the runs
         * after it unsqueezed): the engines raise their score (run_child),
         * and the helper lowers its own where it may; the check after each
         * run holds either way */
        set_oom_adj("-1000");
        void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        char ok = p != MAP_FAILED && mlock(p, n) == 0 ? 'y' : 'n';
        if (write(fd[1], &ok, 1) != 1) _exit(1);
        for (;;) pause();
    }
    close(fd[1]);
    char ok = 0;
    if (read(fd[0], &ok, 1) != 1 || ok != 'y') {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        die("--squeeze-to: could not lock %.1f GiB (mlock needs root or a large RLIMIT_MEMLOCK)", n / 1073741824.0);
    }
    close(fd[0]);
    *locked = n;
    return pid;
}

static void parse_bench(int argc, char **argv, bench_args *b)
{
    memset(b, 0, sizeof *b);
    b->prompt_len = 32;
    b->gen = 16;
    b->reps = 3;
    b->ubatch = 512;
    b->batch = "auto";
    for (int i = 2; i < argc; i++) {
        const char *f = argv[i];
#define ARG() (i + 1 < argc ? argv[++i] : (die("%s needs a value", f), ""))
        if (!strcmp(f, "--vs-llama")) b->vs = 1;
        else if (!strcmp(f, "--kernels")) b->kernels = ARG();
        else if (!strcmp(f, "--model")) b->model = ARG();
        else if (!strcmp(f, "--threads")) b->threads = (int)parse_long(ARG(), f, 1, 1024);
        else if (!strcmp(f, "--prompt-len")) b->prompt_len = (int)parse_long(ARG(), f, 1, 65536);
        else if (!strcmp(f, "--prompt-ids")) b->prompt_ids = ARG();
        else if (!strcmp(f, "--gen")) b->gen = (int)parse_long(ARG(), f, 2, 65536);
        else if (!strcmp(f, "--reps")) b->reps = (int)parse_long(ARG(), f, 1, MAX_REPS);
        else if (!strcmp(f, "--mem")) b->mem = ARG();
        else if (!strcmp(f, "--batch")) {
            b->batch = ARG();
            if (strcmp(b->batch, "auto")) (void)parse_long(b->batch, f, 1, 4096);
        } else if (!strcmp(f, "--llama-ubatch")) b->ubatch = (int)parse_long(ARG(), f, 1, 65536);
        else if (!strcmp(f, "--squeeze-to")) b->squeeze_to = parse_size(ARG(), f);
        else if (!strcmp(f, "--drop-caches")) b->drop = 1;
        else if (!strcmp(f, "--llama-no-repack")) b->no_repack = 1;
        else if (!strcmp(f, "--llama-peer")) b->peer = ARG();
        else if (!strcmp(f, "--llama-lib")) b->lib = ARG();
        else if (!strcmp(f, "--json")) b->json = 1;
        else if (!strcmp(f, "--help") || !strcmp(f, "-h")) {
            bench_usage(stdout);
            exit(0);
        } else {
            bench_usage(stderr);
            die("bench: unknown option \"%s\"", f);
        }
#undef ARG
    }
    if (!b->model) {
        bench_usage(stderr);
        die(b->vs ? "bench --vs-llama needs --model FILE.gguf (llama.cpp reads GGUF only)" : "bench needs --model");
    }
    struct stat sb;
    if (stat(b->model, &sb)) die("--model %s: %s", b->model, strerror(errno));
    if (b->vs && !S_ISREG(sb.st_mode)) die("--model %s: not a GGUF file (llama.cpp reads GGUF only)", b->model);
    if (!b->threads) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        b->threads = n > 0 ? (int)n : 1;
    }
}

static char *bench_ids_file;
static void remove_ids_file(void)
{
    if (bench_ids_file) unlink(bench_ids_file);
}

/* The machine's limits, measured in this run: before each repetition and
 * after the last (print_roofline takes the medians). */
static void measure_limits(const bench_args *b, df_limits *l)
{
    df_error err = {0};
    if (df_measure_limits(b->kernels, b->threads, l, &err)) die("measuring the machine: %s", err.msg);
}

/* The kernels' in-cache GFLOP/s for a weight type named as df_model_info
 * names it (the first of "q8_0+bf16"); 0 when not measured */
static double type_rate(const df_limits *l, const char *types, int gguf, int one)
{
    char t[16];
    size_t n = strcspn(types, "+");
    snprintf(t, sizeof t, "%.*s", (int)(n < sizeof t ? n : sizeof t - 1), types);
    if (!strcmp(t, "bf16")) return one ? l->bf16_gflops_1 : l->bf16_gflops;
    if (!strcmp(t, "f16")) return one ? l->f16_gflops_1 : l->f16_gflops;
    if (!strcmp(t, "q8_0")) return one ? l->q8_0_gflops_1 : l->q8_0_gflops;
    if (!strcmp(t, "mxfp4"))
        return gguf ? (one ? l->mxfp4_gg_gflops_1 : l->mxfp4_gg_gflops) : (one ? l->mxfp4_gflops_1 : l->mxfp4_gflops);
    return 0;
}

/* How close each engine is to the machine's limits: prefill's GFLOP/s in
 * the weights' matrix products against the kernels' in-cache rate for the
 * model's trunk and expert types (the time those products would take at
 * that rate is the roof), decode's GB/s of weights read a token against the
 * memory read bandwidth (and, when it binds first, the one-position rate). */
static void print_roofline(const bench_args *b, const bench_result *d, const df_limits *lim, int nlim,
                           const double pf[2], const double dc[2])
{
    /* each figure: the median of the measurements taken between the timed
     * runs; a machine whose speed moved by more than 15 % is said */
    df_limits l = lim[0];
    double *f[] = {&l.mem_read_gbs,  &l.bf16_gflops,   &l.f16_gflops,   &l.q8_0_gflops,
                   &l.mxfp4_gflops,  &l.mxfp4_gg_gflops, &l.bf16_gflops_1, &l.f16_gflops_1,
                   &l.q8_0_gflops_1, &l.mxfp4_gflops_1, &l.mxfp4_gg_gflops_1};
    double lo[11], hi[11];
    for (int i = 0; i < 11; i++) {
        size_t off = (size_t)((const char *)f[i] - (const char *)&l);
        double v[MAX_REPS + 1];
        for (int k = 0; k < nlim; k++) memcpy(&v[k], (const char *)&lim[k] + off, sizeof(double));
        *f[i] = median(v, nlim);
        lo[i] = hi[i] = v[0];
        for (int k = 1; k < nlim; k++) lo[i] = v[k] < lo[i] ? v[k] : lo[i], hi[i] = v[k] > hi[i] ? v[k] : hi[i];
    }
    struct stat sb;
    int gguf = stat(b->model, &sb) == 0 && S_ISREG(sb.st_mode);
    const char *mx = gguf ? "mxfp4 (ggml blocks)" : "mxfp4";
    printf("\nthis machine, measured in this run (%d threads, %s kernels): memory read %.1f GB/s; matrix products "
           "with the weights in cache, GFLOP/s at 32 positions / 1: bf16 %.1f / %.1f, f16 %.1f / %.1f, q8_0 %.1f / "
           "%.1f, %s %.1f / %.1f\n",
           l.threads, l.kernels, l.mem_read_gbs, l.bf16_gflops, l.bf16_gflops_1, l.f16_gflops, l.f16_gflops_1,
           l.q8_0_gflops, l.q8_0_gflops_1, mx, gguf ? l.mxfp4_gg_gflops : l.mxfp4_gflops,
           gguf ? l.mxfp4_gg_gflops_1 : l.mxfp4_gflops_1);
    if (hi[0] > 1.15 * lo[0] || hi[1] > 1.15 * lo[1])
        printf("  (the machine's speed moved during the run, %d measurements: memory read %.1f to %.1f GB/s, bf16 in "
               "cache %.1f to %.1f GFLOP/s; medians used, read the fractions as approximate)\n",
               nlim, lo[0], hi[0], lo[1], hi[1]);
    if (d->trunk_flops + d->expert_flops <= 0 || d->weight_bytes <= 0) {
        printf("roofline: the engine's result line has no work figures (an older binary?)\n");
        return;
    }
    double rt = type_rate(&l, d->trunk, gguf, 0), re = type_rate(&l, d->experts, gguf, 0);
    double rt1 = type_rate(&l, d->trunk, gguf, 1), re1 = type_rate(&l, d->experts, gguf, 1);
    double gf = (d->trunk_flops + d->expert_flops) / 1e9;
    printf("prefill: %.4g GFLOP a position in the weights' products (trunk %s %.4g, experts %s %.4g; attention "
           "over the context not counted)\n",
           gf, d->trunk, d->trunk_flops / 1e9, d->experts, d->expert_flops / 1e9);
    double roof = rt > 0 && re > 0 ? 1.0 / (d->trunk_flops / 1e9 / rt + d->expert_flops / 1e9 / re) : 0;
    for (int e = b->vs ? 0 : 1; e < 2; e++) {
        const char *who = e ? "deltafin" : "llama.cpp";
        if (roof > 0)
            printf("  %-9s %9.2f tok/s = %7.1f GFLOP/s, %.2f of the kernels' in-cache rate (%.2f tok/s)\n", who,
                   pf[e], pf[e] * gf, pf[e] / roof, roof);
        else
            printf("  %-9s %9.2f tok/s = %7.1f GFLOP/s (no in-cache rate measured for %s / %s)\n", who, pf[e],
                   pf[e] * gf, d->trunk, d->experts);
    }
    double gb = d->weight_bytes / 1e9;
    double mroof = l.mem_read_gbs > 0 ? l.mem_read_gbs / gb : 0;
    double croof = rt1 > 0 && re1 > 0 ? 1.0 / (d->trunk_flops / 1e9 / rt1 + d->expert_flops / 1e9 / re1) : 0;
    printf("decode: %.4g GB of weights a token (every trunk matrix with the output head, %s routed experts); "
           "memory roof %.2f tok/s, one-position kernel roof %.2f tok/s\n",
           gb, d->experts, mroof, croof);
    for (int e = b->vs ? 0 : 1; e < 2; e++)
        printf("  %-9s %9.3f tok/s = %7.2f GB/s, %.2f of the memory read bandwidth%s\n", e ? "deltafin" : "llama.cpp",
               dc[e], dc[e] * gb, mroof > 0 ? dc[e] / mroof : 0,
               croof > 0 && mroof > 0 ? (croof < mroof ? "; the kernels bind first" : "") : "");
    if (d->read_per_token > 1e6)
        printf("  (deltafin read %.1f MB a decoded token from storage: the disk, not memory, is the limit here)\n",
               d->read_per_token / 1e6);
    if (!b->json) return;
    /* the same figures as one JSON line (--json), after the runs' lines */
    printf("{\"roofline\":{\"threads\":%d,\"kernels\":\"%s\",\"measurements\":%d,\"mem_read_gbs\":%.3f,"
           "\"mem_read_gbs_range\":[%.3f,%.3f],\"bf16_gflops\":%.3f,\"bf16_gflops_range\":[%.3f,%.3f],"
           "\"trunk_rate_gflops\":%.3f,\"expert_rate_gflops\":%.3f,\"gflop_per_position\":%.6g,"
           "\"weight_gb_per_token\":%.6g,\"prefill_roof_tps\":%.4f,\"decode_memory_roof_tps\":%.4f,"
           "\"decode_kernel_roof_tps\":%.4f",
           l.threads, l.kernels, nlim, l.mem_read_gbs, lo[0], hi[0], l.bf16_gflops, lo[1], hi[1], rt, re, gf, gb, roof,
           mroof, croof);
    for (int e = b->vs ? 0 : 1; e < 2; e++)
        printf(",\"%s\":{\"prefill_tps\":%.4f,\"prefill_of_roof\":%.4f,\"decode_tps\":%.4f,\"decode_of_memory\":%.4f}",
               e ? "deltafin" : "llama_cpp", pf[e], roof > 0 ? pf[e] / roof : 0, dc[e], mroof > 0 ? dc[e] / mroof : 0);
    printf("}}\n");
}

int cmd_bench(int argc, char **argv)
{
    bench_args b;
    parse_bench(argc, argv, &b);
    char dir[PATH_MAX], peer[PATH_MAX + 32], lib[PATH_MAX + 96], self[PATH_MAX + 16];
    exe_dir(dir, sizeof dir);
    snprintf(self, sizeof self, "%s/deltafin", dir);
    snprintf(peer, sizeof peer, "%s/llama_peer", dir);
    if (b.peer) snprintf(peer, sizeof peer, "%s", b.peer);
    snprintf(lib, sizeof lib, "%s/../tests/llama/node_modules/@node-llama-cpp/linux-x64/bins/linux-x64", dir);
    if (b.lib) snprintf(lib, sizeof lib, "%s", b.lib);
    if (b.vs && access(peer, X_OK))
        die("llama.cpp's runner %s is missing: npm ci --prefix tests/llama && make build/llama_peer", peer);
    char probe[PATH_MAX + 128];
    snprintf(probe, sizeof probe, "%s/libllama.v0.4.0.so", lib);
    if (b.vs && access(probe, R_OK)) die("llama.cpp's library %s is missing (--llama-lib DIR)", probe);

    /* the prompt: ids 1..500 (any model's vocabulary has them) spread by a fixed stride unless given
     * (--prompt-ids LIST or @FILE); both engines read it from a file, so a
     * prompt longer than one argument (128 KiB) works */
    int32_t *pid = NULL;
    if (b.prompt_ids) {
        b.prompt_len = parse_ids(b.prompt_ids, "--prompt-ids", &pid);
    } else {
        pid = malloc((size_t)b.prompt_len * sizeof *pid);
        if (!pid) die("out of memory");
        for (int i = 0; i < b.prompt_len; i++) pid[i] = (i * 7919 + 13) % 500 + 1;
    }
    static char ids_path[] = "/tmp/deltafin-bench-ids.XXXXXX";
    int ifd = mkstemp(ids_path);
    if (ifd >= 0) {
        bench_ids_file = ids_path;
        atexit(remove_ids_file);
    }
    FILE *idf = ifd >= 0 ? fdopen(ifd, "w") : NULL;
    if (!idf) die("cannot write the prompt's ids to %s: %s", ids_path, strerror(errno));
    for (int i = 0; i < b.prompt_len; i++) fprintf(idf, "%s%d", i ? "," : "", pid[i]);
    if (fclose(idf)) die("cannot write the prompt's ids to %s: %s", ids_path, strerror(errno));
    free(pid);
    char ids[sizeof ids_path + 1];
    snprintf(ids, sizeof ids, "@%s", ids_path);
    char thr[16], gen[16], model[PATH_MAX], mem[64], ub[16], bt[16], kern[32];
    snprintf(kern, sizeof kern, "%s", b.kernels ? b.kernels : "");
    snprintf(model, sizeof model, "%s", b.model);
    snprintf(mem, sizeof mem, "%s", b.mem ? b.mem : "");
    snprintf(thr, sizeof thr, "%d", b.threads);
    snprintf(gen, sizeof gen, "%d", b.gen);
    snprintf(ub, sizeof ub, "%d", b.ubatch);
    snprintf(bt, sizeof bt, "%s", b.batch);
    char *ll_argv[24], *df_argv[24];
    int n = 0;
    ll_argv[n++] = peer;
    ll_argv[n++] = "--lib", ll_argv[n++] = lib;
    ll_argv[n++] = "--model", ll_argv[n++] = model;
    ll_argv[n++] = "--prompt-ids", ll_argv[n++] = ids;
    ll_argv[n++] = "--threads", ll_argv[n++] = thr;
    ll_argv[n++] = "--bench", ll_argv[n++] = gen;
    ll_argv[n++] = "--kv", ll_argv[n++] = "f32";
    ll_argv[n++] = "--ubatch", ll_argv[n++] = ub;
    if (b.no_repack) ll_argv[n++] = "--no-repack";
    ll_argv[n] = NULL;
    n = 0;
    df_argv[n++] = self;
    df_argv[n++] = "run";
    df_argv[n++] = "--model", df_argv[n++] = model;
    df_argv[n++] = "--prompt-ids", df_argv[n++] = ids;
    df_argv[n++] = "--max-new", df_argv[n++] = gen;
    df_argv[n++] = "--threads", df_argv[n++] = thr;
    df_argv[n++] = "--batch", df_argv[n++] = bt;
    if (b.mem) df_argv[n++] = "--mem", df_argv[n++] = mem;
    if (b.kernels) df_argv[n++] = "--kernels", df_argv[n++] = kern;
    df_argv[n++] = "--bench-json";
    df_argv[n] = NULL;

    double mbytes = model_bytes(b.model);
    size_t locked = 0;
    pid_t helper = b.squeeze_to ? squeeze(b.squeeze_to, &locked) : 0;
    long avail_kb = meminfo_kb("MemAvailable");
    if (b.vs)
        printf("deltafin bench --vs-llama: %s (%.2f GB), %d threads, prompt %d tokens, %d decoded, %d repetitions\n",
               b.model, mbytes / 1e9, b.threads, b.prompt_len, b.gen, b.reps);
    else
        printf("deltafin bench: %s, %d threads, prompt %d tokens, %d decoded, %d repetitions\n", b.model, b.threads,
               b.prompt_len, b.gen, b.reps);
    if (b.vs) printf("llama.cpp: %d positions per graph (--llama-ubatch); deltafin: --batch %s\n", b.ubatch, b.batch);
    printf("memory available to the engines: %.1f GiB\n", avail_kb / 1048576.0);
    if (locked) printf("  helper holds %.1f GiB locked; the model is %.1fx the available memory\n",
                       locked / 1073741824.0, mbytes / (avail_kb * 1024.0));
    fflush(stdout);

    bench_result res[2][MAX_REPS];
    memset(res, 0, sizeof res);
    if (!b.drop) { /* warm-up: page cache, CPU variant selection, file system metadata */
        bench_result w;
        if (b.vs) run_child(ll_argv, "llama.cpp (warm-up)", 1, &w, 0);
        run_child(df_argv, "deltafin (warm-up)", 1, &w, 0);
    }
    df_limits lim[MAX_REPS + 1];
    int nlim = 0;
    for (int r = 0; r < b.reps; r++) {
        measure_limits(&b, &lim[nlim++]);
        for (int k = 0; k < 2; k++) {
            int e = (r % 2) ^ k; /* 0 = llama.cpp first on even reps */
            if (!b.vs && !e) continue;
            if (b.drop) drop_caches();
            run_child(e ? df_argv : ll_argv, e ? "deltafin" : "llama.cpp", 1, &res[e][r], b.json);
            if (helper && waitpid(helper, NULL, WNOHANG) != 0)
                die("the --squeeze-to helper is gone (killed for memory?) during %s's run: it ran with more "
                    "than %.1f GiB available, so nothing is reported (llama.cpp on a model larger than the "
                    "memory needs --llama-no-repack)",
                    e ? "deltafin" : "llama.cpp", b.squeeze_to / 1073741824.0);
            printf("  rep %d %-9s prefill %8.2f tok/s  decode %7.3f tok/s  RSS %7.0f MiB  %8.1f MB read/token\n",
                    r + 1, e ? "deltafin" : "llama.cpp", res[e][r].prefill_tps, res[e][r].decode_tps,
                    res[e][r].rss_kb / 1024.0, res[e][r].read_per_token / 1e6);
            fflush(stdout);
        }
    }
    if (helper) {
        kill(helper, SIGKILL);
        waitpid(helper, NULL, 0);
    }
    measure_limits(&b, &lim[nlim++]);
    double pf[2], dc[2], rd[2], rss[2];
    for (int e = 0; e < 2; e++) {
        double v[MAX_REPS];
        for (int r = 0; r < b.reps; r++) v[r] = res[e][r].prefill_tps;
        pf[e] = median(v, b.reps);
        for (int r = 0; r < b.reps; r++) v[r] = res[e][r].decode_tps;
        dc[e] = median(v, b.reps);
        for (int r = 0; r < b.reps; r++) v[r] = res[e][r].read_per_token;
        rd[e] = median(v, b.reps);
        rss[e] = 0;
        for (int r = 0; r < b.reps; r++)
            if (res[e][r].rss_kb / 1024.0 > rss[e]) rss[e] = res[e][r].rss_kb / 1024.0;
    }
    printf("\n%-16s %14s %14s %14s %20s\n", "engine", "prefill tok/s", "decode tok/s", "peak RSS MiB",
           "disk MB/token (dec)");
    if (b.vs) printf("%-16s %14.2f %14.3f %14.0f %20.1f\n", "llama.cpp", pf[0], dc[0], rss[0], rd[0] / 1e6);
    printf("%-16s %14.2f %14.3f %14.0f %20.1f\n", "deltafin", pf[1], dc[1], rss[1], rd[1] / 1e6);
    if (b.vs)
        printf("%-16s %13.2fx %13.2fx %13.2fx %19s\n", "deltafin/llama", pf[0] > 0 ? pf[1] / pf[0] : 0,
               dc[0] > 0 ? dc[1] / dc[0] : 0, rss[0] > 0 ? rss[1] / rss[0] : 0, "");
    print_roofline(&b, &res[1][0], lim, nlim, pf, dc);
    if (!b.vs) return 0;
    int same = !strcmp(res[0][0].ids, res[1][0].ids);
    printf("greedy ids: %s\n", same ? "identical"
                                    : "differ (expected with MXFP4 experts: llama.cpp rounds activations to 8 bits "
                                      "for MXFP4 matmuls; make llama-oracle compares exactly on an F32 GGUF)");
    return 0;
}
