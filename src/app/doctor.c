/* doctor.c - `deltafin doctor [--model DIR] [--mem SIZE] [--seconds N]
 * [--expert-path DIR]...`:
 * what this machine can do with this model, on one screen (front end, L5).
 *
 * Reads, in order: the CPU (model name, cores, the ISA flags the kernels
 * care about, the kernel set an engine would choose), memory (total and
 * available), io_uring, the model's memory plan at --mem (or the default
 * budget) from its headers alone, then for the model's directory the free
 * space and the drive's measured read bandwidth with the engine's own read
 * size (one expert) and depth (df_iobench, O_DIRECT where the file system
 * allows it).  From the plan's bytes to read per decoded token and the
 * measured bandwidth it gives the decode speed the drive allows (an upper
 * bound: compute is not counted); the processor and memory measured now
 * (df_measure_limits: memory read bandwidth, the kernels' in-cache rates)
 * and the prefill and in-memory decode ceilings they set; then what to
 * change to go faster.
 * With --expert-path (the directories `deltafin place` wrote), each drive
 * is measured on its own and the reads spread over them add up.  A
 * streamed install (setup --stream) is described (remote, disk cache,
 * whether its experts are verified) and its disk cache is what is
 * measured: its shards hold no experts.
 * Nothing is written; no weight is read except by the bandwidth probe.
 */
#define _GNU_SOURCE
#include "cli.h"
#include "options.h"
#include "plan.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

static double gib(uint64_t b) { return (double)b / (double)(1ull << 30); }

static void cpu_line(void)
{
    FILE *f = fopen("/proc/cpuinfo", "r");
    char line[4096], model[256] = "unknown", flags[4096] = "";
    while (f && fgets(line, sizeof line, f)) {
        if (!strncmp(line, "model name", 10) && !strcmp(model, "unknown")) {
            char *c = strchr(line, ':');
            if (c) snprintf(model, sizeof model, "%s", c + 2 + strspn(c + 2, " "));
        } else if (!strncmp(line, "flags", 5) && !flags[0]) {
            char *c = strchr(line, ':');
            if (c) snprintf(flags, sizeof flags, " %s ", c + 1);
        }
    }
    if (f) fclose(f);
    model[strcspn(model, "\n")] = 0;
    for (char *p = flags; *p; p++)
        if (*p == '\n') *p = ' ';
    printf("cpu      %s, %ld cores online\n", model, sysconf(_SC_NPROCESSORS_ONLN));
    static const char *want[] = {"avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "amx_tile"};
    printf("         ISA:");
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        char key[32];
        snprintf(key, sizeof key, " %s ", want[i]);
        printf(" %s%s", strstr(flags, key) ? "" : "no-", want[i]);
    }
    printf("\n         kernels: %s%s\n", df_kernels_chosen(),
           getenv("DF_BACKEND") || getenv("DF_KERNELS") ? " (forced by $DF_BACKEND / $DF_KERNELS)" : "");
}

static uint64_t meminfo(const char *key)
{
    FILE *f = fopen("/proc/meminfo", "r");
    char line[256];
    unsigned long long v = 0;
    size_t n = strlen(key);
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, key, n) && line[n] == ':') {
            sscanf(line + n + 1, "%llu", &v);
            break;
        }
    if (f) fclose(f);
    return (uint64_t)v * 1024;
}

/* A streamed install described (remote, disk cache, verification); returns
 * df_install_describe's answer: 1 streamed, 0 not, -1 error (printed) */
static int install_lines(const char *model, df_install_info *ii)
{
    df_error err = {0};
    int streamed = df_install_describe(model, ii, &err);
    if (streamed < 0) printf("install  %s\n", err.msg);
    if (streamed > 0) {
        printf("install  streamed from %s/%s at %.12s: routed experts are fetched on first use into a disk cache\n"
               "         of %.2f GiB (%d experts, %.2f GiB, in it now)\n",
               ii->base, ii->repo, ii->commit, gib(ii->cache_max), ii->cache_filled, gib(ii->cache_used));
        if (ii->experts_hashed == ii->experts)
            printf("         every fetched expert is checked against its SHA-256 before use\n");
        else
            printf("         UNVERIFIED: %zu of %zu experts have a SHA-256; the others are checked for size and bounds\n"
                   "         and fetched twice to compare the copies (twice the network bytes; a mirror serving the same\n"
                   "         wrong bytes every time is not caught: set up with --verify for a SHA-256 per expert)\n",
                   ii->experts_hashed, ii->experts);
    }
    return streamed;
}

/* The processor and memory measured now (all cores) and the prefill
 * ceiling they set; 0 when measured (lim filled) */
static int compute_lines(const df_model_info *info, df_limits *lim)
{
    int n_cpu = (int)sysconf(_SC_NPROCESSORS_ONLN);
    df_error err = {0};
    if (df_measure_limits(NULL, n_cpu > 0 ? n_cpu : 1, lim, &err)) {
        printf("compute  not measured: %s\n", err.msg);
        return -1;
    }
    printf("compute  memory read %.1f GB/s (%d threads); the %s kernels with their weights in cache, GFLOP/s at a "
           "prompt chunk / one position: bf16 %.0f / %.0f, q8_0 %.0f / %.0f, mxfp4 %.0f / %.0f\n",
           lim->mem_read_gbs, lim->threads, lim->kernels, lim->bf16_gflops, lim->bf16_gflops_1, lim->q8_0_gflops,
           lim->q8_0_gflops_1, lim->mxfp4_gflops, lim->mxfp4_gflops_1);
    double gf = (double)(info->trunk_flops_per_position + info->expert_flops_per_position) / 1e9;
    if (gf > 0 && lim->bf16_gflops > 0)
        printf("         prefill: %.4g GFLOP a position in the weights' products: at most ~%.1f tok/s at the BF16 "
               "rate, before attention and reads (`deltafin bench` measures the engine against these limits)\n",
               gf, lim->bf16_gflops / gf);
    return 0;
}

int cmd_doctor(int argc, char **argv)
{
    const char *model = NULL;
    size_t mem = 0;
    int seconds = 2, n_xp = 0;
    const char *xp[8];
    for (int i = 2; i < argc; i++) {
        const char *f = argv[i];
        if (i + 1 < argc && !strcmp(f, "--model")) model = argv[++i];
        else if (i + 1 < argc && !strcmp(f, "--expert-path")) {
            if (n_xp == 7) die("doctor: at most 7 --expert-path directories");
            xp[n_xp++] = argv[++i];
        }
        else if (i + 1 < argc && !strcmp(f, "--mem")) mem = parse_size(argv[++i], f);
        else if (i + 1 < argc && !strcmp(f, "--seconds")) seconds = (int)parse_long(argv[++i], f, 1, 600);
        else if (!strcmp(f, "--help") || !strcmp(f, "-h")) {
            usage(stdout);
            return 0;
        } else die("doctor: unknown option or missing value \"%s\"", f);
    }
    if (!model) model = default_model();
    if (!model) die("doctor needs --model DIR (no default model found)");
    printf("deltafin doctor: %s\n", model);
    cpu_line();
    uint64_t total = meminfo("MemTotal"), avail = meminfo("MemAvailable");
    printf("memory   %.1f GiB, %.1f GiB available; --mem defaults to %.1f GiB (70%%)\n", gib(total), gib(avail),
           gib(df_mem_budget_default()));
    char why[256] = "";
    int uring = df_io_uring_works(why, sizeof why);
    printf("io_uring %s\n", uring ? "works" : why);

    df_plan_opts po = {.mem_budget = mem};
    df_plan p;
    df_model_info info;
    memset(&info, 0, sizeof info);
    df_error err = {0};
    int prc = df_plan_model(model, &po, &p, &info, &err);
    if (prc && err.code != DF_ERR_NOMEM) {
        fprintf(stderr, "deltafin: doctor: %s\n", err.msg);
        return 1;
    }
    char line[512];
    df_plan_summary(&p, line, sizeof line);
    printf("model    %d layers, %d experts of %.2f MiB, %d per token; trunk %.2f GiB\n", info.n_layers, info.n_experts,
           (double)info.expert_bytes / (1 << 20), info.n_experts_used, gib(p.trunk_bytes + p.embed_bytes));
    printf("plan     %s\n", prc ? err.msg : !strncmp(line, "plan: ", 6) ? line + 6 : line);

    /* a streamed install */
    df_install_info ii;
    int streamed = install_lines(model, &ii);
    /* the drives the experts are read from */
    struct stat st;
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", model);
    if (!stat(model, &st) && S_ISREG(st.st_mode)) {
        char *s = strrchr(dir, '/');
        if (s) *s = 0;
        else snprintf(dir, sizeof dir, ".");
    }
    if (streamed > 0) snprintf(dir + strlen(dir), sizeof dir - strlen(dir), "/expert-cache");
    const char *drives[8];
    int n_dr = 0;
    if (n_xp)
        for (int i = 0; i < n_xp; i++) drives[n_dr++] = xp[i];
    else drives[n_dr++] = dir;
    double gbps = 0;
    for (int d = 0; d < n_dr; d++) {
        struct statvfs v;
        if (!statvfs(drives[d], &v))
            printf("disk     %s: %.1f GiB free of %.1f GiB\n", drives[d], gib((uint64_t)v.f_bavail * v.f_frsize),
                   gib((uint64_t)v.f_blocks * v.f_frsize));
        else printf("disk     %s: cannot stat\n", drives[d]);
        df_iobench_opts io = {.chunk_bytes = info.expert_bytes ? (size_t)((info.expert_bytes + 4095) / 4096 * 4096) : 0,
                              .seconds = seconds};
        df_iobench_result r;
        err = (df_error){0};
        if (df_iobench(drives[d], &io, &r, &err))
            printf("         read bandwidth not measured: %s\n", err.msg);
        else {
            gbps += r.gbps;
            printf("         reads of one expert (%.2f MiB), %d in flight, %s, %s: %.2f GB/s over %.1f s\n",
                   (double)r.chunk_bytes / (1 << 20), r.depth, r.direct ? "O_DIRECT" : "buffered", r.backend, r.gbps,
                   r.seconds);
            if (r.seconds < 0.5 || r.bytes < (uint64_t)64 << 20)
                printf("         (the files here are small: this figure is mostly the page cache)\n");
        }
    }
    if (n_dr > 1 && gbps > 0)
        printf("         together: %.2f GB/s when reads spread over the %d drives (--expert-path)\n", gbps, n_dr);

    /* what the processor and memory allow, measured now (all cores) */
    df_limits lim;
    int lrc = compute_lines(&info, &lim);

    /* what the drive allows */
    uint64_t per_token = p.expert_read_est + p.trunk_read_per_token;
    printf("decode   per token: %.3f GB of experts with nothing cached, ~%.3f GB at this cache, %.3f GB of trunk\n",
           (double)p.expert_read_cold / 1e9, (double)p.expert_read_est / 1e9, (double)p.trunk_read_per_token / 1e9);
    if (prc) {
        printf("         no plan at this budget: give more --mem\n");
    } else if (!per_token) {
        printf("         everything stays in memory: no disk read a token");
        if (!lrc && info.weight_bytes_per_token && lim.mem_read_gbs > 0)
            printf("; it reads %.4g GB of weights from memory a token: at %.1f GB/s at most %.1f tok/s",
                   (double)info.weight_bytes_per_token / 1e9, lim.mem_read_gbs,
                   lim.mem_read_gbs * 1e9 / (double)info.weight_bytes_per_token);
        printf(" (measure it with `deltafin bench` or `deltafin run --stats`)\n");
    } else if (gbps > 0) {
        printf("         at %.2f GB/s the drive allows at most %.2f tok/s (compute not counted)\n", gbps,
               gbps * 1e9 / (double)per_token);
    }
    /* what to change */
    printf("advice\n");
    int n = 0;
    if (!prc && p.trunk_mode == DF_TRUNK_STREAMED)
        printf("  - the trunk (%.1f GiB) is read every token: --mem from %.3f GiB keeps it in memory (the plan's "
               "own threshold)\n",
               gib(p.trunk_bytes), gib(p.resident_from)), n++;
    if (!prc && p.expert_read_est > 0 && p.n_experts)
        printf("  - the expert cache holds %llu of %llu experts: each further GiB of --mem holds %.0f more\n",
               (unsigned long long)(p.n_slots + p.n_transient), (unsigned long long)p.n_experts,
               info.expert_bytes ? (double)(1ull << 30) / (double)info.expert_bytes : 0.0),
            n++;
    if (!uring) printf("  - io_uring is unavailable: reads go through a thread pool (install liburing, allow io_uring)\n"), n++;
    if (gbps > 0 && per_token && gbps < 3)
        printf("  - the drive reads %.2f GB/s: a faster NVMe drive, or `deltafin place --to DIR2 --stripe` over "
               "several drives, multiplies decode speed\n",
               gbps),
            n++;
    if (streamed > 0 && ii.cache_max < (uint64_t)ii.experts * info.expert_bytes)
        printf("  - experts outside the disk cache come over the network each time: a larger --disk-cache-max (up to "
               "%.1f GiB holds them all) or setup --full keeps them local\n",
               gib((uint64_t)ii.experts * info.expert_bytes)),
            n++;
    if (streamed > 0 && ii.experts_hashed < ii.experts)
        printf("  - fetched experts are not checked by hash: set up again with --stream --verify (or publish "
               "experts.manifest beside the model)\n"),
            n++;
    if (!strcmp(df_kernels_chosen(), "ref"))
        printf("  - only the scalar reference kernels run here (no AVX2): expect slow compute\n"), n++;
    if (!n) printf("  - nothing to change: this machine holds this model\n");
    return prc ? 1 : 0;
}
