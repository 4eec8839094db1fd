/* cli.c - the deltafin command line (front end; includes engine.h only).
 *
 *   deltafin run  --model DIR --prompt-ids 12,7,99 [--max-new N] [--print-ids]
 *                 [--dump-logits FILE] [--threads N] [--greedy] [--ctx N]
 *                 [--batch N] [--kernels ref|avx2|avx512] [--stop-eos] [--stats]
 *   deltafin info --model DIR
 *
 * Owns: argument parsing, the greedy generation loop, output formatting and
 * the logits dump (written to FILE.tmp and renamed, so an existing file is
 * never left half-written).  May exit; nothing below it does.
 */
#define _GNU_SOURCE
#include "cli.h"
#include "engine.h"
#include "server.h"

#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

void usage(FILE *f)
{
    fputs("usage: deltafin <command> [options]\n"
          "\n"
          "commands:\n"
          "  run     generate from a prompt (text, or token ids)\n"
          "  chat    interactive multi-turn chat (line editing, Ctrl-C stops a reply;\n"
          "          /reset, /stats, /quit)\n"
          "  tokenize --model DIR [--special] \"text\" | --decode 12,7,99\n"
          "          print the token ids of a text, or the text of ids\n"
          "  serve   --model DIR [--host 127.0.0.1] [--port 8080] [--queue 16] [--api-key KEY]\n"
          "          [--max-request-bytes 128M] [--max-tokens 32768] [--timeout 600] [--name NAME]\n"
          "          [--ping-ms 2000] (SSE keep-alive comment after this long without output)\n"
          "          HTTP server: OpenAI /v1/chat/completions, /v1/completions, /v1/models,\n"
          "          Anthropic /v1/messages (SSE streaming), /health, /metrics, a chat page at /;\n"
          "          takes the run options too (--ctx, --mem, --threads, ...)\n"
          "  info    print the model's dimensions and memory needs\n"
          "  iobench DIR [--chunk SIZE] [--io-depth N] [--seconds S] [--io buffered]\n"
          "          measure the drive's read bandwidth with the engine's read size and depth\n"
          "          (DIR: a model directory or any directory of large files)\n"
          "  place   --model DIR --to DIR [--to DIR ...] [--stripe]\n"
          "          copy the experts to other drives: every expert to every DIR (replicas,\n"
          "          reads go to the least busy copy) or spread across them (--stripe);\n"
          "          then run with --expert-path DIR for each\n"
          "  cachesim --trace FILE [--slots 64,256,1024]\n"
          "          replay a route trace through the LRU and LFU caches and Belady's optimal\n"
          "  bench   --vs-llama --model FILE.gguf [--threads N] [--prompt-len 32] [--gen 16]\n"
          "          [--reps 3] [--mem SIZE] [--squeeze-to SIZE] [--drop-caches]\n"
          "          llama.cpp (npm build, tools/llama_peer.c) and deltafin on the same GGUF,\n"
          "          interleaved; medians and ratios of prefill and decode tok/s, peak RSS, disk\n"
          "          bytes read per token (see deltafin bench --help)\n"
          "\n"
          "run options:\n"
          "  --model DIR          K3 checkpoint directory (config.json, index, shards), or a\n"
          "                       llama.cpp kimi-k3 .gguf file\n"
          "  --prompt TEXT        the prompt; raw continuation (no BOS), stops at the eos token\n"
          "  --chat               apply the chat template to --prompt and show the reply\n"
          "                       (reasoning on stderr, the answer on stdout)\n"
          "  --system TEXT        a system message (with --chat and in chat)\n"
          "  --reasoning-effort E low, high or max (default max)\n"
          "  --no-think           answer without the thinking channel\n"
          "  --prompt-ids LIST    comma-separated token ids, e.g. 12,7,99\n"
          "  --max-new N          tokens to generate (default 16 with --prompt-ids, else 512)\n"
          "  --print-ids          print the generated ids comma-separated on one line\n"
          "  --dump-logits FILE   write float32 LE logits [T][vocab], one row per prompt and\n"
          "                       generated token (row t = distribution after token t)\n"
          "  --greedy             greedy decoding (the default and, for now, the only mode)\n"
          "  --stop-eos           stop after generating the model's eos token\n"
          "  --threads N          worker threads (default: all CPUs); output is identical for every N\n"
          "  --ctx N              context capacity in tokens (default 4096)\n"
          "  --batch N            positions per forward call during prefill (default 32)\n"
          "  --kernels ISA        force ref, avx2 or avx512 kernels (also $DF_KERNELS)\n"
          "  --mem SIZE           memory budget for everything, e.g. 4G (default: 70% of RAM);\n"
          "                       the expert cache gets what the trunk and state leave\n"
          "  --expert-cache SIZE  set the expert cache size directly instead\n"
          "  --io MODE            expert reads: auto (O_DIRECT where possible), direct, buffered\n"
          "  --io-backend B       auto (io_uring where possible), uring, threads\n"
          "  --io-depth N         expert reads in flight (default 32)\n"
          "  --expert-path DIR    read experts from a directory written by 'deltafin place' (repeatable)\n"
          "  --cache-policy P     expert cache policy: lfu (default), tlfu (LFU + admission) or lru\n"
          "  --trace FILE         write the route trace (one JSON line per position and MoE layer)\n"
          "  --heat FILE          expert heat histogram: warms the cache at start, updated at exit\n"
          "  --events FILE        JSON line per forward call: hit rate, bytes read, GB/s, I/O wait, layer ms\n"
          "  --no-prefetch        no router look-ahead prefetch (on by default; it turns itself off\n"
          "                       for layers where its predictions do not pay)\n"
          "  --prefetch-k N       experts predicted per position and layer (default top_k / 2)\n"
          "  --trunk-stream M     auto (stream the trunk layer by layer when it does not fit --mem),\n"
          "                       on, or off (leave it mapped; the kernel pages it)\n"
          "  --prefault           fault the expert cache's memory in at start, in the background (pays\n"
          "                       off in long runs where first-touching memory is slow, as in some VMs)\n"
          "  --preload M          auto (read every routed expert at start when the expert cache holds\n"
          "                       them all: the model fits), on, or off\n"
          "  --stats              a live status line (tok/s, tokens, time to first token) and\n"
          "                       timing and expert I/O counters on stderr\n",
          f);
}

_Noreturn void die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "deltafin: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n(run 'deltafin --help' for usage)\n");
    va_end(ap);
    exit(2);
}

long parse_long(const char *s, const char *flag, long lo, long hi)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) {
        die("%s needs an integer in [%ld, %ld], got \"%s\"", flag, lo, hi, s);
    }
    return v;
}

size_t parse_size(const char *s, const char *flag)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    double mul = 1;
    if (*end == 'K' || *end == 'k') mul = 1024.0, end++;
    else if (*end == 'M' || *end == 'm') mul = 1024.0 * 1024, end++;
    else if (*end == 'G' || *end == 'g') mul = 1024.0 * 1024 * 1024, end++;
    else if (*end == 'T' || *end == 't') mul = 1024.0 * 1024 * 1024 * 1024, end++;
    if (*end == 'i' || *end == 'B') end++;
    if (*end == 'B') end++;
    if (errno || end == s || *end || !(v > 0) || v * mul > 1e18) {
        die("%s needs a size such as 512M or 4G, got \"%s\"", flag, s);
    }
    return (size_t)(v * mul);
}

int parse_ids(const char *s, int32_t **out)
{
    int n = 0, cap = 16;
    int32_t *ids = malloc((size_t)cap * sizeof *ids);
    const char *p = s;
    if (!*p) die("--prompt-ids is empty");
    while (*p) {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (errno || end == p || v < 0 || v > INT32_MAX) die("--prompt-ids: bad token id near \"%s\"", p);
        if (n == cap) ids = realloc(ids, (size_t)(cap *= 2) * sizeof *ids);
        ids[n++] = (int32_t)v;
        p = end;
        while (*p == ' ') p++;
        if (*p == ',') {
            p++;
            if (!*p) die("--prompt-ids: trailing comma in \"%s\"", s);
        } else if (*p) {
            die("--prompt-ids: expected ',' near \"%s\"", p);
        }
    }
    *out = ids;
    return n;
}

double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void parse_common(int argc, char **argv, run_args *a)
{
    memset(a, 0, sizeof *a);
    a->max_new = 16;
    for (int i = 2; i < argc; i++) {
        const char *f = argv[i];
#define NEED_ARG() do { if (i + 1 >= argc) die("%s needs a value", f); } while (0)
        if (!strcmp(f, "--help") || !strcmp(f, "-h")) { usage(stdout); exit(0); }
        else if (!strcmp(f, "--model")) { NEED_ARG(); a->model = argv[++i]; }
        else if (!strcmp(f, "--prompt-ids")) { NEED_ARG(); a->prompt_ids = argv[++i]; }
        else if (!strcmp(f, "--max-new")) {
            NEED_ARG();
            a->max_new = (int)parse_long(argv[++i], f, 0, 1 << 24);
            a->max_new_set = 1;
        }
        else if (!strcmp(f, "--print-ids")) a->print_ids = 1;
        else if (!strcmp(f, "--dump-logits")) { NEED_ARG(); a->dump = argv[++i]; }
        else if (!strcmp(f, "--greedy")) {}
        else if (!strcmp(f, "--stop-eos")) a->stop_eos = 1;
        else if (!strcmp(f, "--threads")) { NEED_ARG(); a->threads = (int)parse_long(argv[++i], f, 1, 256); }
        else if (!strcmp(f, "--ctx")) { NEED_ARG(); a->ctx = (int)parse_long(argv[++i], f, 1, 1 << 24); }
        else if (!strcmp(f, "--batch")) { NEED_ARG(); a->batch = (int)parse_long(argv[++i], f, 1, 4096); }
        else if (!strcmp(f, "--kernels")) { NEED_ARG(); a->kernels = argv[++i]; }
        else if (!strcmp(f, "--expert-cache")) { NEED_ARG(); a->cache_bytes = parse_size(argv[++i], f); }
        else if (!strcmp(f, "--stats")) a->stats = 1;
        else if (!strcmp(f, "--bench-json")) a->bench_json = 1;
        else if (!strcmp(f, "--preload")) {
            NEED_ARG();
            const char *v = argv[++i];
            if (!strcmp(v, "on")) a->preload = 1;
            else if (!strcmp(v, "off")) a->preload = -1;
            else if (!strcmp(v, "auto")) a->preload = 0;
            else die("--preload wants on, off or auto, not \"%s\"", v);
        }
        else if (!strcmp(f, "--mem")) { NEED_ARG(); a->mem = parse_size(argv[++i], f); }
        else if (!strcmp(f, "--io")) { NEED_ARG(); a->io = argv[++i]; }
        else if (!strcmp(f, "--io-backend")) { NEED_ARG(); a->io_backend = argv[++i]; }
        else if (!strcmp(f, "--io-depth")) { NEED_ARG(); a->io_depth = (int)parse_long(argv[++i], f, 1, 256); }
        else if (!strcmp(f, "--cache-policy")) { NEED_ARG(); a->policy = argv[++i]; }
        else if (!strcmp(f, "--trace")) { NEED_ARG(); a->trace = argv[++i]; }
        else if (!strcmp(f, "--heat")) { NEED_ARG(); a->heat = argv[++i]; }
        else if (!strcmp(f, "--events")) { NEED_ARG(); a->events = argv[++i]; }
        else if (!strcmp(f, "--prefault")) a->prefault = 1;
        else if (!strcmp(f, "--trunk-stream")) {
            NEED_ARG();
            const char *v = argv[++i];
            a->trunk_stream = !strcmp(v, "on") ? 1 : !strcmp(v, "off") ? -1 : !strcmp(v, "auto") ? 0 : 2;
            if (a->trunk_stream == 2) die("--trunk-stream must be on, off or auto, got \"%s\"", v);
        }
        else if (!strcmp(f, "--stripe")) a->stripe = 1;
        else if (!strcmp(f, "--expert-path") || !strcmp(f, "--to")) {
            NEED_ARG();
            if (a->n_xpaths == 7) die("at most 7 %s directories", f);
            a->xpaths[a->n_xpaths++] = argv[++i];
        }
        else if (!strcmp(f, "--no-prefetch")) a->no_prefetch = 1;
        else if (!strcmp(f, "--prefetch-k")) { NEED_ARG(); a->prefetch_k = (int)parse_long(argv[++i], f, 1, 4096); }
        else if (!strcmp(f, "--slots")) { NEED_ARG(); a->slots = argv[++i]; }
        else if (!strcmp(f, "--prompt")) { NEED_ARG(); a->prompt = argv[++i]; }
        else if (!strcmp(f, "--system")) { NEED_ARG(); a->system = argv[++i]; }
        else if (!strcmp(f, "--chat")) a->chat = 1;
        else if (!strcmp(f, "--no-think")) a->no_think = 1;
        else if (!strcmp(f, "--reasoning-effort")) {
            NEED_ARG();
            a->effort = argv[++i];
            if (strcmp(a->effort, "low") && strcmp(a->effort, "high") && strcmp(a->effort, "max"))
                die("--reasoning-effort must be low, high or max, got \"%s\"", a->effort);
        }
        else if (!strcmp(f, "--special")) a->special = 1;
        else if (!strcmp(f, "--decode")) { NEED_ARG(); a->decode = argv[++i]; }
        else if (f[0] != '-' && !a->text) a->text = f;
        else die("unknown option \"%s\"", f);
#undef NEED_ARG
    }
    if (!a->model && strcmp(argv[1], "cachesim")) die("--model DIR is required");
    if (a->max_new_set == 0 && (a->chat || a->prompt)) a->max_new = 512;
}

df_engine *open_engine(const run_args *a)
{
    df_engine_opts eo;
    df_engine_opts_default(&eo);
    eo.n_threads = a->threads;
    eo.kernels = a->kernels;
    eo.expert_cache_bytes = a->cache_bytes;
    eo.mem_budget = a->mem;
    eo.io_mode = a->io;
    eo.io_backend = a->io_backend;
    eo.io_depth = a->io_depth;
    eo.plan_ctx = a->ctx;
    eo.plan_batch = a->batch;
    eo.cache_policy = a->policy;
    eo.trace_path = a->trace;
    eo.heat_path = a->heat;
    eo.events_path = a->events;
    eo.prefault = a->prefault;
    eo.preload = a->preload;
    eo.trunk_stream = a->trunk_stream;
    eo.expert_paths = a->xpaths;
    eo.n_expert_paths = a->n_xpaths;
    eo.no_prefetch = a->no_prefetch;
    eo.prefetch_k = a->prefetch_k;
    eo.quiet = !a->stats;
    df_engine *eng;
    df_error err = {0};
    if (df_engine_open(a->model, &eo, &eng, &err)) {
        fprintf(stderr, "deltafin: cannot load model: %s\n", err.msg);
        exit(1);
    }
    return eng;
}

static int cmd_run(int argc, char **argv)
{
    run_args a;
    parse_common(argc, argv, &a);
    if (a.prompt || a.chat) return run_text(&a);
    if (!a.prompt_ids) die("run needs --prompt \"text\" or --prompt-ids LIST");
    int32_t *prompt;
    int n_prompt = parse_ids(a.prompt_ids, &prompt);
    df_engine *eng = open_engine(&a);
    df_model_info info;
    df_engine_info(eng, &info);
    df_session_opts so;
    df_session_opts_default(&so);
    if (a.ctx) so.n_ctx = a.ctx;
    if (a.batch) so.max_batch = a.batch;
    if (so.n_ctx < n_prompt + a.max_new) so.n_ctx = n_prompt + a.max_new;
    df_session *s;
    df_error err = {0};
    if (df_session_new(eng, &so, &s, &err)) {
        fprintf(stderr, "deltafin: %s\n", err.msg);
        return 1;
    }
    size_t V = (size_t)info.vocab;
    size_t rows = (size_t)n_prompt + (size_t)a.max_new;
    float *logits = malloc((a.dump ? rows : (size_t)n_prompt) * V * sizeof(float));
    if (!logits) {
        fprintf(stderr, "deltafin: cannot allocate logits for %zu rows\n", rows);
        return 1;
    }
    int32_t *gen = malloc(((size_t)a.max_new + 1) * sizeof *gen);
    unsigned long long rb0 = proc_read_bytes();
    double t0 = now();
    if (df_session_eval(s, prompt, n_prompt, logits, a.dump != NULL, &err)) {
        fprintf(stderr, "deltafin: %s\n", err.msg);
        return 1;
    }
    double t1 = now();
    unsigned long long rb1 = proc_read_bytes();
    size_t n_rows = a.dump ? (size_t)n_prompt : 0;
    const float *last = a.dump ? logits + (size_t)(n_prompt - 1) * V : logits;
    int n_gen = 0;
    for (; n_gen < a.max_new; n_gen++) {
        int32_t next = (int32_t)df_argmax(last, info.vocab);
        gen[n_gen] = next;
        float *dst = a.dump ? logits + n_rows * V : logits;
        if (df_session_eval(s, &next, 1, dst, 0, &err)) {
            fprintf(stderr, "deltafin: %s\n", err.msg);
            return 1;
        }
        if (a.dump) n_rows++;
        last = dst;
        if (a.stop_eos && next == info.eos_id) {
            n_gen++;
            break;
        }
    }
    double t2 = now();
    unsigned long long rb2 = proc_read_bytes();
    if (a.bench_json) {
        printf("{\"engine\":\"deltafin\",\"prompt\":%d,\"prefill_s\":%.6f,\"prefill_tps\":%.4f,"
               "\"prefill_read_bytes\":%llu,\"decode_steps\":%d,\"decode_s\":%.6f,\"decode_tps\":%.4f,"
               "\"decode_read_bytes\":%llu,\"peak_rss_kb\":%ld,\"ids\":[",
               n_prompt, t1 - t0, n_prompt / (t1 - t0), rb1 - rb0, n_gen, t2 - t1, n_gen ? n_gen / (t2 - t1) : 0.0,
               rb2 - rb1, proc_peak_rss_kb());
        for (int i = 0; i < n_gen; i++) printf("%s%d", i ? "," : "", gen[i]);
        printf("]}\n");
        fflush(stdout);
    }
    if (a.print_ids) {
        for (int i = 0; i < n_gen; i++) printf("%s%d", i ? "," : "", gen[i]);
        printf("\n");
        fflush(stdout);
    }
    if (a.dump) {
        char tmp[PATH_MAX];
        snprintf(tmp, sizeof tmp, "%s.tmp", a.dump);
        FILE *f = fopen(tmp, "wb");
        if (!f || fwrite(logits, sizeof(float) * V, n_rows, f) != n_rows || fclose(f) != 0) {
            fprintf(stderr, "deltafin: cannot write %s: %s\n", tmp, strerror(errno));
            remove(tmp);
            return 1;
        }
        if (rename(tmp, a.dump) != 0) {
            fprintf(stderr, "deltafin: cannot rename %s to %s: %s\n", tmp, a.dump, strerror(errno));
            remove(tmp);
            return 1;
        }
    }
    if (a.stats) {
        df_stats st;
        df_engine_stats(eng, &st);
        fprintf(stderr,
                "deltafin: prefill %d tokens in %.3f s (%.1f tok/s); decode %d tokens in %.3f s (%.2f tok/s)\n"
                "deltafin: experts: %llu hits, %llu misses (hit rate %.1f%%), %.1f MiB read in %llu reads, "
                "%.2f s waiting for I/O (%.1f%% of the run), %.2f GB/s while waiting\n",
                n_prompt, t1 - t0, n_prompt / (t1 - t0), n_gen, t2 - t1, n_gen ? n_gen / (t2 - t1) : 0.0,
                (unsigned long long)st.expert_hits, (unsigned long long)st.expert_misses,
                st.expert_hits + st.expert_misses ? 100.0 * st.expert_hits / (st.expert_hits + st.expert_misses) : 0.0,
                (double)st.expert_bytes_read / (1 << 20), (unsigned long long)st.expert_reads, st.io_wait_sec,
                100.0 * st.io_wait_sec / (t2 - t0), st.io_wait_sec > 0 ? st.expert_bytes_io / st.io_wait_sec / 1e9 : 0.0);
        if (st.prefetch_predicted)
            fprintf(stderr,
                    "deltafin: prefetch: precision %.2f, recall %.2f; %llu reads issued, %llu used (%llu late), "
                    "%llu evicted unused\n",
                    (double)st.prefetch_correct / st.prefetch_predicted,
                    st.prefetch_actual ? (double)st.prefetch_correct / st.prefetch_actual : 0.0,
                    (unsigned long long)st.prefetch_issued, (unsigned long long)st.prefetch_used,
                    (unsigned long long)st.prefetch_late, (unsigned long long)st.prefetch_wasted);
        if (st.prefetch_ab_rounds)
            fprintf(stderr, "deltafin: prefetch timing: %d comparison%s, last: %s (decode step %.1f ms on, %.1f ms off)\n",
                    st.prefetch_ab_rounds, st.prefetch_ab_rounds == 1 ? "" : "s", st.prefetch_ab_on ? "kept on" : "turned off",
                    st.prefetch_ab_on_ms, st.prefetch_ab_off_ms);
    }
    free(gen);
    free(logits);
    free(prompt);
    df_session_free(s);
    df_engine_close(eng);
    return 0;
}

long proc_peak_rss_kb(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    long v = -1;
    char line[128];
    if (!f) return -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "VmHWM: %ld", &v) == 1) break;
    fclose(f);
    return v;
}

unsigned long long proc_read_bytes(void)
{
    FILE *f = fopen("/proc/self/io", "r");
    unsigned long long v = 0;
    char line[128];
    if (!f) return 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "read_bytes: %llu", &v) == 1) break;
    fclose(f);
    return v;
}

static int cmd_info(int argc, char **argv)
{
    run_args a;
    parse_common(argc, argv, &a);
    df_engine *eng = open_engine(&a);
    df_model_info i;
    df_engine_info(eng, &i);
    printf("layers %d (KDA %d, MLA %d)\nhidden %d\nvocab %d\nexperts %d, %d per token, %.2f MiB each\n"
           "bos %d eos %d pad %d\ncontext memory per token %llu bytes (MLA latent cache, fp32)\n"
           "fixed recurrent state %.1f MiB (KDA)\nkernels %s, threads %d, expert cache slots %d\n",
           i.n_layers, i.n_kda_layers, i.n_mla_layers, i.hidden, i.vocab, i.n_experts, i.n_experts_used,
           (double)i.expert_bytes / (1 << 20), i.bos_id, i.eos_id, i.pad_id,
           (unsigned long long)i.ctx_bytes_per_token, (double)i.fixed_state_bytes / (1 << 20), i.kernels,
           i.n_threads, i.n_cache_slots);
    df_engine_close(eng);
    return 0;
}

static int cmd_iobench(int argc, char **argv)
{
    if (argc < 3 || argv[2][0] == '-') die("iobench needs a directory: deltafin iobench DIR");
    df_iobench_opts o = {0};
    for (int i = 3; i < argc; i++) {
        const char *f = argv[i];
        if (i + 1 >= argc) die("%s needs a value", f);
        if (!strcmp(f, "--chunk")) o.chunk_bytes = parse_size(argv[++i], f);
        else if (!strcmp(f, "--io-depth")) o.depth = (int)parse_long(argv[++i], f, 1, 256);
        else if (!strcmp(f, "--seconds")) o.seconds = (double)parse_long(argv[++i], f, 1, 3600);
        else if (!strcmp(f, "--io")) {
            const char *m = argv[++i];
            if (!strcmp(m, "buffered")) o.buffered = 1;
            else if (strcmp(m, "direct")) die("--io must be direct or buffered, got \"%s\"", m);
        } else die("unknown option \"%s\"", f);
    }
    df_iobench_result r;
    df_error err = {0};
    if (df_iobench(argv[2], &o, &r, &err)) {
        fprintf(stderr, "deltafin: iobench: %s\n", err.msg);
        return 1;
    }
    printf("iobench %s: %.2f GB/s (%s, %s, %.2f MiB reads, %d in flight, %llu reads in %.1f s)\n", argv[2], r.gbps,
           r.direct ? "O_DIRECT" : "buffered", r.backend, r.chunk_bytes / 1048576.0, r.depth,
           (unsigned long long)r.reads, r.seconds);
    return 0;
}

static void place_progress(void *ctx, uint64_t done, uint64_t total)
{
    double *last = ctx, t = now();
    if (t - *last < 0.5 && done < total) return;
    *last = t;
    fprintf(stderr, "\rdeltafin: placing experts: %5.1f%% (%.2f of %.2f GB)", total ? 100.0 * done / total : 100.0,
            done / 1e9, total / 1e9);
    if (done >= total) fputc('\n', stderr);
}

static int cmd_place(int argc, char **argv)
{
    run_args a;
    parse_common(argc, argv, &a);
    if (!a.n_xpaths) die("place needs at least one --to DIR");
    double last = 0;
    df_error err = {0};
    if (df_place(a.model, a.xpaths, a.n_xpaths, a.stripe, place_progress, &last, &err)) {
        fprintf(stderr, "\ndeltafin: place: %s\n", err.msg);
        return 1;
    }
    fprintf(stderr, "deltafin: experts of %s placed (%s) in %d director%s; run with", a.model,
            a.stripe ? "striped" : "replicated", a.n_xpaths, a.n_xpaths == 1 ? "y" : "ies");
    for (int i = 0; i < a.n_xpaths; i++) fprintf(stderr, " --expert-path %s", a.xpaths[i]);
    fprintf(stderr, "\n");
    return 0;
}

static int cmd_cachesim(int argc, char **argv)
{
    run_args a;
    parse_common(argc, argv, &a);
    if (!a.trace) die("cachesim needs --trace FILE (written by 'deltafin run --trace FILE')");
    int slots[64], n = 0;
    const char *p = a.slots ? a.slots : "16,64,256,1024";
    while (*p && n < 64) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < 1 || v > (1 << 24)) die("--slots: bad cache size near \"%s\"", p);
        slots[n++] = (int)v;
        p = *end == ',' ? end + 1 : end;
        if (*end && *end != ',') die("--slots: expected ',' near \"%s\"", end);
    }
    df_cachesim_row rows[64];
    df_error err = {0};
    if (df_cachesim(a.trace, slots, n, rows, &err)) {
        fprintf(stderr, "deltafin: %s\n", err.msg);
        return 1;
    }
    printf("trace %s: %llu steps, %llu expert uses\n", a.trace, (unsigned long long)rows[0].steps,
           (unsigned long long)rows[0].accesses);
    printf("%10s %9s %9s %9s %9s %9s %11s %11s %11s %13s %11s\n", "slots", "LRU hit%", "LFU hit%", "TLFU hit%",
           "static%", "Belady%", "LRU/Belady", "LFU/Belady", "TLFU/Belady", "static/Belady", "LFU/static");
    for (int i = 0; i < n; i++) {
        const df_cachesim_row *r = &rows[i];
        double acc = (double)r->accesses, b = (double)r->hits_belady, st = (double)r->hits_static;
        printf("%10d %9.2f %9.2f %9.2f %9.2f %9.2f %11.3f %11.3f %11.3f %13.3f %11.3f\n", r->slots,
               100 * r->hits_lru / acc, 100 * r->hits_lfu / acc, 100 * r->hits_tlfu / acc, 100 * st / acc,
               100 * b / acc, b ? r->hits_lru / b : 1.0, b ? r->hits_lfu / b : 1.0, b ? r->hits_tlfu / b : 1.0,
               b ? st / b : 1.0, st ? r->hits_lfu / st : 1.0);
    }
    printf("static = the trace's most used experts kept from their first use (frequencies known in advance):\n"
           "the ceiling of a frequency-only policy; Belady also knows the order of future uses\n");
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (!strcmp(argv[1], "run")) return cmd_run(argc, argv);
    if (!strcmp(argv[1], "info")) return cmd_info(argc, argv);
    if (!strcmp(argv[1], "cachesim")) return cmd_cachesim(argc, argv);
    if (!strcmp(argv[1], "iobench")) return cmd_iobench(argc, argv);
    if (!strcmp(argv[1], "place")) return cmd_place(argc, argv);
    if (!strcmp(argv[1], "chat")) return cmd_chat(argc, argv);
    if (!strcmp(argv[1], "tokenize")) return cmd_tokenize(argc, argv);
    if (!strcmp(argv[1], "serve")) return cmd_serve(argc, argv);
    if (!strcmp(argv[1], "bench")) return cmd_bench(argc, argv);
    die("unknown command \"%s\"", argv[1]);
}
