/* cli.c - the deltafin command line (front end; includes engine.h and
 * server.h; `deltafin --help` lists the commands).
 *
 * Owns: the per-command option tables (an option a command does not take
 * is an error naming it; `--` ends the options), the default model, the
 * context a run needs (planned before the engine opens), `run
 * --prompt-ids` (greedy generation), `info` and `plan` (from headers
 * alone), iobench/place/cachesim, and the outputs shared with cli_chat.c:
 * the logits dump (rows appended to FILE.tmp, renamed into place on
 * success, so an existing file is never left half-written), the bench JSON
 * line, the --stats lines and the prompt's progress.  May exit; nothing
 * below it does.
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
#include <unistd.h>

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
          "  info    --model DIR: the model's dimensions and its memory plan (reads no weights)\n"
          "  plan    --model DIR|FILE.gguf|config.json [--mem SIZE] [--ctx N] [--json]\n"
          "          where the model goes at --mem (or at 24/64/128/512 GiB) and the bytes read per\n"
          "          token, from the config and headers alone\n"
          "  perplexity --model DIR --file TEXT [--window N] [--json]\n"
          "          perplexity and bits per byte of a text file\n"
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
          "  --greedy             greedy decoding (the default)\n"
          "  --temp T             sample at temperature T (0 = greedy) with --top-p P, --top-k K and\n"
          "                       --seed N (the same seed gives the same text; the server's sampler)\n"
          "  --stop-eos           stop after generating the model's eos token\n"
          "  --threads N          worker threads (default: all CPUs); output is identical for every N\n"
          "  --ctx N              context capacity in tokens (default 4096)\n"
          "  --batch N|auto       positions per forward pass of a prompt (default auto: chosen by the\n"
          "                       planner from --mem; each pass reads its experts and the streamed trunk once)\n"
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

int parse_ids(const char *s, const char *flag, int32_t **out)
{
    int n = 0, cap = 16;
    int32_t *ids = malloc((size_t)cap * sizeof *ids);
    const char *p = s;
    if (!*p) die("%s is empty", flag);
    while (*p) {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (errno || end == p || v < 0 || v > INT32_MAX) die("%s: bad token id near \"%s\"", flag, p);
        if (n == cap) ids = realloc(ids, (size_t)(cap *= 2) * sizeof *ids);
        ids[n++] = (int32_t)v;
        p = end;
        while (*p == ' ') p++;
        if (*p == ',') {
            p++;
            if (!*p) die("%s: trailing comma in \"%s\"", flag, s);
        } else if (*p) {
            die("%s: expected ',' near \"%s\"", flag, p);
        }
    }
    *out = ids;
    return n;
}

double parse_double(const char *s, const char *flag, double lo, double hi)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !(v >= lo && v <= hi)) die("%s needs a number in [%g, %g], got \"%s\"", flag, lo, hi, s);
    return v;
}

void sampler_from_args(sampler *smp, const run_args *a, int vocab)
{
    uint64_t seed = a->seed;
    if (a->temp > 0 && !a->seed_set) {
        seed = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
        fprintf(stderr, "deltafin: sampling at temperature %g with --seed %llu\n", a->temp, (unsigned long long)seed);
    }
    sampler_init(smp, vocab, a->temp, a->top_p > 0 ? a->top_p : 1, a->top_k, seed);
}

double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Which command takes which option: an option a command does not use is
 * an error naming it, never silently ignored. */
enum {
    C_RUN = 1 << 0, C_CHAT = 1 << 1, C_SERVE = 1 << 2, C_INFO = 1 << 3, C_PLAN = 1 << 4, C_TOKENIZE = 1 << 5,
    C_PLACE = 1 << 6, C_CACHESIM = 1 << 7, C_PERPLEXITY = 1 << 8,
    C_ENGINE = C_RUN | C_CHAT | C_SERVE | C_PERPLEXITY,          /* opens an engine and a session */
    C_SIZING = C_ENGINE | C_INFO | C_PLAN,                        /* memory plan inputs */
    C_MODEL = C_SIZING | C_TOKENIZE | C_PLACE,
};
typedef struct {
    const char *name;
    int has_arg;
    unsigned cmds;
} opt_def;
static const opt_def opts[] = {
    {"--model", 1, C_MODEL},          {"--mem", 1, C_SIZING},          {"--ctx", 1, C_SIZING},
    {"--batch", 1, C_SIZING},         {"--threads", 1, C_SIZING},      {"--expert-cache", 1, C_SIZING},
    {"--trunk-stream", 1, C_SIZING},  {"--cache-policy", 1, C_SIZING}, {"--kernels", 1, C_ENGINE},
    {"--io", 1, C_ENGINE},            {"--io-backend", 1, C_ENGINE},   {"--io-depth", 1, C_ENGINE},
    {"--trace", 1, C_ENGINE | C_CACHESIM}, {"--heat", 1, C_ENGINE},    {"--events", 1, C_ENGINE},
    {"--no-prefetch", 0, C_ENGINE},   {"--prefetch-k", 1, C_ENGINE},   {"--expert-path", 1, C_ENGINE},
    {"--prefault", 0, C_ENGINE},      {"--preload", 1, C_ENGINE},      {"--stats", 0, C_ENGINE},
    {"--prompt-ids", 1, C_RUN},       {"--prompt", 1, C_RUN},          {"--max-new", 1, C_RUN | C_CHAT},
    {"--print-ids", 0, C_RUN},        {"--dump-logits", 1, C_RUN},     {"--greedy", 0, C_RUN},
    {"--stop-eos", 0, C_RUN},         {"--bench-json", 0, C_RUN},      {"--chat", 0, C_RUN},
    {"--system", 1, C_RUN | C_CHAT},  {"--reasoning-effort", 1, C_RUN | C_CHAT},
    {"--no-think", 0, C_RUN | C_CHAT}, {"--special", 0, C_TOKENIZE},   {"--decode", 1, C_TOKENIZE},
    {"--to", 1, C_PLACE},             {"--stripe", 0, C_PLACE},        {"--slots", 1, C_CACHESIM},
    {"--temp", 1, C_RUN | C_CHAT},    {"--top-p", 1, C_RUN | C_CHAT},  {"--top-k", 1, C_RUN | C_CHAT},
    {"--seed", 1, C_RUN | C_CHAT},    {"--file", 1, C_PERPLEXITY},      {"--window", 1, C_PERPLEXITY},   {"--json", 0, C_PLAN | C_PERPLEXITY},
};

static unsigned command_bit(const char *cmd)
{
    static const struct { const char *name; unsigned bit; } t[] = {
        {"run", C_RUN}, {"chat", C_CHAT}, {"serve", C_SERVE}, {"info", C_INFO}, {"plan", C_PLAN},
        {"tokenize", C_TOKENIZE}, {"place", C_PLACE}, {"cachesim", C_CACHESIM}, {"perplexity", C_PERPLEXITY}};
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
        if (!strcmp(cmd, t[i].name)) return t[i].bit;
    return 0;
}

static const char *commands_of(unsigned m, char *buf, size_t n)
{
    static const char *names[] = {"run", "chat", "serve", "info", "plan", "tokenize", "place", "cachesim", "perplexity"};
    size_t k = 0;
    buf[0] = 0;
    for (int i = 0; i < 9; i++)
        if (m & (1u << i)) k += (size_t)snprintf(buf + k, k < n ? n - k : 0, "%s%s", k ? ", " : "", names[i]);
    return buf;
}

void parse_common(int argc, char **argv, run_args *a)
{
    memset(a, 0, sizeof *a);
    a->max_new = 16;
    const unsigned cmd = command_bit(argv[1]);
    if (!cmd) die("internal: no option table for '%s'", argv[1]);
    int only_positional = 0;
    for (int i = 2; i < argc; i++) {
        const char *f = argv[i];
        if (only_positional || f[0] != '-' || !f[1]) {
            if (cmd == C_TOKENIZE && !a->text) a->text = f;
            else die("%s: unexpected argument \"%s\"", argv[1], f);
            continue;
        }
        if (!strcmp(f, "--")) {
            only_positional = 1;
            continue;
        }
        if (!strcmp(f, "--help") || !strcmp(f, "-h")) { usage(stdout); exit(0); }
        const opt_def *d = NULL;
        for (size_t j = 0; j < sizeof opts / sizeof opts[0] && !d; j++)
            if (!strcmp(opts[j].name, f)) d = &opts[j];
        if (!d) die("%s: unknown option \"%s\"", argv[1], f);
        if (!(d->cmds & cmd)) {
            char buf[128];
            die("%s does not apply to '%s' (it is an option of: %s)", f, argv[1], commands_of(d->cmds, buf, sizeof buf));
        }
        const char *v = NULL;
        if (d->has_arg) {
            if (i + 1 >= argc) die("%s needs a value", f);
            v = argv[++i];
        }
        if (!strcmp(f, "--model")) a->model = v;
        else if (!strcmp(f, "--prompt-ids")) a->prompt_ids = v;
        else if (!strcmp(f, "--max-new")) {
            a->max_new = (int)parse_long(v, f, 0, 1 << 24);
            a->max_new_set = 1;
        }
        else if (!strcmp(f, "--print-ids")) a->print_ids = 1;
        else if (!strcmp(f, "--dump-logits")) a->dump = v;
        else if (!strcmp(f, "--greedy")) a->greedy = 1;
        else if (!strcmp(f, "--temp")) a->temp = parse_double(v, f, 0, 10);
        else if (!strcmp(f, "--top-p")) a->top_p = parse_double(v, f, 1e-9, 1);
        else if (!strcmp(f, "--top-k")) a->top_k = (int)parse_long(v, f, 1, 1 << 24);
        else if (!strcmp(f, "--seed")) {
            a->seed = (uint64_t)parse_long(v, f, 0, LONG_MAX);
            a->seed_set = 1;
        }
        else if (!strcmp(f, "--stop-eos")) a->stop_eos = 1;
        else if (!strcmp(f, "--threads")) a->threads = (int)parse_long(v, f, 1, 256);
        else if (!strcmp(f, "--ctx")) a->ctx = (int)parse_long(v, f, 1, 1 << 24);
        else if (!strcmp(f, "--batch")) a->batch = !strcmp(v, "auto") ? 0 : (int)parse_long(v, f, 1, 4096);
        else if (!strcmp(f, "--kernels")) a->kernels = v;
        else if (!strcmp(f, "--expert-cache")) a->cache_bytes = parse_size(v, f);
        else if (!strcmp(f, "--stats")) a->stats = 1;
        else if (!strcmp(f, "--bench-json")) a->bench_json = 1;
        else if (!strcmp(f, "--preload")) {
            if (!strcmp(v, "on")) a->preload = 1;
            else if (!strcmp(v, "off")) a->preload = -1;
            else if (!strcmp(v, "auto")) a->preload = 0;
            else die("--preload wants on, off or auto, not \"%s\"", v);
        }
        else if (!strcmp(f, "--mem")) a->mem = parse_size(v, f);
        else if (!strcmp(f, "--io")) a->io = v;
        else if (!strcmp(f, "--io-backend")) a->io_backend = v;
        else if (!strcmp(f, "--io-depth")) a->io_depth = (int)parse_long(v, f, 1, 256);
        else if (!strcmp(f, "--cache-policy")) a->policy = v;
        else if (!strcmp(f, "--trace")) a->trace = v;
        else if (!strcmp(f, "--heat")) a->heat = v;
        else if (!strcmp(f, "--events")) a->events = v;
        else if (!strcmp(f, "--prefault")) a->prefault = 1;
        else if (!strcmp(f, "--trunk-stream")) {
            a->trunk_stream = !strcmp(v, "on") ? 1 : !strcmp(v, "off") ? -1 : !strcmp(v, "auto") ? 0 : 2;
            if (a->trunk_stream == 2) die("--trunk-stream must be on, off or auto, got \"%s\"", v);
        }
        else if (!strcmp(f, "--stripe")) a->stripe = 1;
        else if (!strcmp(f, "--expert-path") || !strcmp(f, "--to")) {
            if (a->n_xpaths == 7) die("at most 7 %s directories", f);
            a->xpaths[a->n_xpaths++] = v;
        }
        else if (!strcmp(f, "--no-prefetch")) a->no_prefetch = 1;
        else if (!strcmp(f, "--prefetch-k")) a->prefetch_k = (int)parse_long(v, f, 1, 4096);
        else if (!strcmp(f, "--slots")) a->slots = v;
        else if (!strcmp(f, "--prompt")) a->prompt = v;
        else if (!strcmp(f, "--system")) a->system = v;
        else if (!strcmp(f, "--chat")) a->chat = 1;
        else if (!strcmp(f, "--no-think")) a->no_think = 1;
        else if (!strcmp(f, "--reasoning-effort")) {
            a->effort = v;
            if (strcmp(v, "low") && strcmp(v, "high") && strcmp(v, "max"))
                die("--reasoning-effort must be low, high or max, got \"%s\"", v);
        }
        else if (!strcmp(f, "--special")) a->special = 1;
        else if (!strcmp(f, "--decode")) a->decode = v;
        else if (!strcmp(f, "--file")) a->file = v;
        else if (!strcmp(f, "--window")) a->window = (int)parse_long(v, f, 2, 1 << 20);
        else if (!strcmp(f, "--json")) a->json = 1;
        else die("internal: option %s has no handler", f);
    }
    if (a->greedy && a->temp > 0) die("--greedy and --temp %g contradict each other", a->temp);
    if (!a->temp && (a->top_p || a->top_k || a->seed_set))
        die("--top-p, --top-k and --seed choose among samples: they need --temp > 0 (the default is greedy)");
    if (!a->model && (cmd & C_MODEL)) a->model = default_model();
    if (!a->model && (cmd & C_MODEL)) die("--model DIR is required (no default model found)");
    if (cmd == C_RUN) {
        if (a->prompt && a->prompt_ids) die("--prompt and --prompt-ids cannot be combined");
        if (a->chat && a->prompt_ids) die("--chat takes --prompt \"text\", not --prompt-ids");
        if (!a->prompt && !a->prompt_ids) die("run needs --prompt \"text\" or --prompt-ids LIST");
        if (!a->chat && (a->system || a->effort || a->no_think))
            die("--system, --reasoning-effort and --no-think need --chat");
    }
    if (a->max_new_set == 0 && (a->chat || a->prompt)) a->max_new = 512;
}

/* The default model when --model is omitted: the bundled trained model,
 * else the tiny test checkpoint, found beside the executable (build/..)
 * or in the current directory. */
const char *default_model(void)
{
    static char buf[PATH_MAX];
    static const char *rel[] = {"models/k3-mini", "testdata/k3-tiny-a/checkpoint"};
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    const char *bases[2] = {NULL, "."};
    if (n > 0) {
        exe[n] = 0;
        char *slash = strrchr(exe, '/');
        if (slash) {
            *slash = 0;
            strncat(exe, "/..", sizeof exe - strlen(exe) - 1);
            bases[0] = exe;
        }
    }
    for (size_t r = 0; r < sizeof rel / sizeof rel[0]; r++)
        for (int b = 0; b < 2; b++) {
            if (!bases[b]) continue;
            char cfg[PATH_MAX + 16];
            snprintf(buf, sizeof buf, "%s/%s", bases[b], rel[r]);
            snprintf(cfg, sizeof cfg, "%s/config.json", buf);
            if (access(cfg, R_OK) == 0) return buf;
        }
    return NULL;
}

int context_for(run_args *a, int n_prompt)
{
    df_session_opts d;
    df_session_opts_default(&d);
    if (a->ctx) {
        if (n_prompt >= a->ctx)
            die("the prompt (%d tokens) does not fit --ctx %d (it needs room for at least one more token)", n_prompt,
                a->ctx);
        a->ctx_plan = a->ctx;
    } else {
        long need = (long)n_prompt + a->max_new + 1;
        a->ctx_plan = need > d.n_ctx ? (int)(need < (1 << 24) ? need : (1 << 24)) : d.n_ctx;
    }
    return a->ctx_plan;
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
    eo.plan_ctx = a->ctx_plan ? a->ctx_plan : a->ctx;
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
    if (!a->stats) {
        /* the plan is always shown; --stats shows it in full */
        df_plan p;
        char line[512];
        df_engine_plan(eng, &p);
        df_plan_summary(&p, line, sizeof line);
        fprintf(stderr, "deltafin: %s\n", line);
    }
    return eng;
}

df_session *open_session(df_engine *eng, const run_args *a)
{
    df_session_opts so;
    df_session_opts_default(&so);
    if (a->ctx_plan) so.n_ctx = a->ctx_plan;
    else if (a->ctx) so.n_ctx = a->ctx;
    if (a->batch) so.max_batch = a->batch;
    df_session *s;
    df_error err = {0};
    if (df_session_new(eng, &so, &s, &err)) {
        fprintf(stderr, "deltafin: %s\n", err.msg);
        exit(1);
    }
    return s;
}

int sink_open(logits_sink *k, const char *path, size_t V)
{
    memset(k, 0, sizeof *k);
    if (!path) return 0;
    k->path = path;
    k->V = V;
    snprintf(k->tmp, sizeof k->tmp, "%s.tmp", path);
    k->f = fopen(k->tmp, "wb");
    if (!k->f) {
        fprintf(stderr, "deltafin: cannot create %s: %s\n", k->tmp, strerror(errno));
        return -1;
    }
    return 0;
}

int sink_write(logits_sink *k, const float *rows, size_t n)
{
    if (!k->f) return 0;
    if (fwrite(rows, sizeof(float) * k->V, n, k->f) != n) {
        fprintf(stderr, "deltafin: cannot write %s: %s\n", k->tmp, strerror(errno));
        return -1;
    }
    k->rows += n;
    return 0;
}

int sink_commit(logits_sink *k)
{
    if (!k->f) return 0;
    int bad = fclose(k->f) != 0;
    k->f = NULL;
    if (bad || rename(k->tmp, k->path) != 0) {
        fprintf(stderr, "deltafin: cannot write %s: %s\n", k->path, strerror(errno));
        remove(k->tmp);
        return -1;
    }
    return 0;
}

void sink_abort(logits_sink *k)
{
    if (!k->f) return;
    fclose(k->f);
    k->f = NULL;
    remove(k->tmp);
}

typedef struct {
    double t0;
    unsigned long long rb0;
} progress_state;

/* A long prompt on a terminal: positions done, bytes read, ETA. */
static void show_progress(void *ctx, int done, int total)
{
    progress_state *ps = ctx;
    double dt = now() - ps->t0;
    double eta = done > 0 ? dt * (total - done) / done : 0.0;
    fprintf(stderr, "\rdeltafin: prompt %d/%d positions, %.1f MiB read, %.0f s left   ", done, total,
            (proc_read_bytes() - ps->rb0) / 1048576.0, eta);
    fflush(stderr);
}

int eval_prompt(df_session *s, const int32_t *ids, int n, int batch, float *last, float *rows, size_t V,
                logits_sink *k, df_error *err)
{
    if (!k->f) {
        progress_state ps = {now(), proc_read_bytes()};
        int show = isatty(2) && n > df_session_max_batch(s);
        if (show) df_session_set_progress(s, show_progress, &ps);
        int rc = df_session_eval(s, ids, n, last, 0, err);
        if (show) {
            df_session_set_progress(s, NULL, NULL);
            fprintf(stderr, "\r\033[K");
        }
        return rc;
    }
    for (int off = 0; off < n; off += batch) {
        int T = n - off < batch ? n - off : batch;
        if (df_session_eval(s, ids + off, T, rows, 1, err)) return -1;
        if (sink_write(k, rows, (size_t)T)) {
            err->code = DF_ERR_IO;
            snprintf(err->msg, sizeof err->msg, "writing the --dump-logits file failed");
            return -1;
        }
        memcpy(last, rows + (size_t)(T - 1) * V, V * sizeof *last);
    }
    return 0;
}

void print_bench_json(df_engine *eng, int n_prompt, double prefill_s, unsigned long long prefill_bytes, int n_gen,
                      double decode_s, unsigned long long decode_bytes, const int32_t *gen)
{
    df_stats st;
    df_engine_stats(eng, &st);
    printf("{\"engine\":\"deltafin\",\"prompt\":%d,\"prefill_s\":%.6f,\"prefill_tps\":%.4f,"
           "\"prefill_read_bytes\":%llu,\"prefill_chunk\":%d,\"prefill_unique_experts\":%llu,"
           "\"prefill_expert_reads\":%llu,\"prefill_expert_bytes\":%llu,\"decode_steps\":%d,\"decode_s\":%.6f,"
           "\"decode_tps\":%.4f,\"decode_read_bytes\":%llu,\"peak_rss_kb\":%ld,\"ids\":[",
           n_prompt, prefill_s, prefill_s > 0 ? n_prompt / prefill_s : 0.0, prefill_bytes, st.prompt_chunk,
           (unsigned long long)st.prompt_unique_experts, (unsigned long long)st.prompt_expert_reads,
           (unsigned long long)st.prompt_expert_bytes, n_gen, decode_s,
           n_gen && decode_s > 0 ? n_gen / decode_s : 0.0, decode_bytes, proc_peak_rss_kb());
    for (int i = 0; i < n_gen; i++) printf("%s%d", i ? "," : "", gen[i]);
    printf("]}\n");
    fflush(stdout);
}

void print_run_stats(df_engine *eng, int n_prompt, double prefill_s, int n_gen, double decode_s)
{
    df_stats st;
    df_engine_stats(eng, &st);
    double total = prefill_s + decode_s;
    fprintf(stderr,
            "deltafin: prefill %d tokens in %.3f s (%.1f tok/s); decode %d tokens in %.3f s (%.2f tok/s)\n"
            "deltafin: experts: %llu hits, %llu misses (hit rate %.1f%%), %.1f MiB read in %llu reads, "
            "%.2f s waiting for I/O (%.1f%% of the run), %.2f GB/s while waiting\n",
            n_prompt, prefill_s, prefill_s > 0 ? n_prompt / prefill_s : 0.0, n_gen, decode_s,
            n_gen && decode_s > 0 ? n_gen / decode_s : 0.0, (unsigned long long)st.expert_hits,
            (unsigned long long)st.expert_misses,
            st.expert_hits + st.expert_misses ? 100.0 * st.expert_hits / (st.expert_hits + st.expert_misses) : 0.0,
            (double)st.expert_bytes_read / (1 << 20), (unsigned long long)st.expert_reads, st.io_wait_sec,
            total > 0 ? 100.0 * st.io_wait_sec / total : 0.0,
            st.io_wait_sec > 0 ? st.expert_bytes_io / st.io_wait_sec / 1e9 : 0.0);
    if (st.prompt_positions)
        fprintf(stderr,
                "deltafin: prompt: %llu positions in chunks of %d; %llu distinct (layer, expert) pairs needed, %llu "
                "expert reads (%.2f reads per needed expert), %.1f MiB\n",
                (unsigned long long)st.prompt_positions, st.prompt_chunk,
                (unsigned long long)st.prompt_unique_experts, (unsigned long long)st.prompt_expert_reads,
                st.prompt_unique_experts ? (double)st.prompt_expert_reads / (double)st.prompt_unique_experts : 0.0,
                (double)st.prompt_expert_bytes / (1 << 20));
    if (st.trunk_bytes_read)
        fprintf(stderr, "deltafin: trunk streamed: %.1f MiB read, %.2f s waiting\n",
                (double)st.trunk_bytes_read / (1 << 20), st.trunk_wait_sec);
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

static int cmd_run(int argc, char **argv)
{
    run_args a;
    parse_common(argc, argv, &a);
    if (a.prompt || a.chat) return run_text(&a);
    int32_t *prompt;
    int n_prompt = parse_ids(a.prompt_ids, "--prompt-ids", &prompt);
    int ctx = context_for(&a, n_prompt);
    df_engine *eng = open_engine(&a);
    df_model_info info;
    df_engine_info(eng, &info);
    df_session *s = open_session(eng, &a);
    size_t V = (size_t)info.vocab;
    int batch = df_session_max_batch(s);
    float *last = malloc(V * sizeof(float));
    float *rows = a.dump ? malloc((size_t)batch * V * sizeof(float)) : NULL;
    int32_t *gen = malloc(((size_t)a.max_new + 1) * sizeof *gen);
    if (!last || (a.dump && !rows) || !gen) die("cannot allocate the logits buffers (vocabulary %zu)", V);
    logits_sink sink;
    if (sink_open(&sink, a.dump, V)) return 1;
    df_error err = {0};
    unsigned long long rb0 = proc_read_bytes();
    double t0 = now();
    if (eval_prompt(s, prompt, n_prompt, batch, last, rows, V, &sink, &err)) {
        fprintf(stderr, "deltafin: %s\n", err.msg);
        sink_abort(&sink);
        return 1;
    }
    double t1 = now();
    unsigned long long rb1 = proc_read_bytes();
    int n_gen = 0, full = 0;
    sampler smp;
    sampler_from_args(&smp, &a, info.vocab);
    for (; n_gen < a.max_new; n_gen++) {
        if (df_session_pos(s) >= ctx) {
            full = 1;
            break;
        }
        int32_t next = sampler_next(&smp, last);
        gen[n_gen] = next;
        if (df_session_eval(s, &next, 1, last, 0, &err)) {
            fprintf(stderr, "deltafin: %s\n", err.msg);
            sink_abort(&sink);
            return 1;
        }
        if (sink_write(&sink, last, 1)) {
            sink_abort(&sink);
            return 1;
        }
        if (a.stop_eos && next == info.eos_id) {
            n_gen++;
            break;
        }
    }
    double t2 = now();
    unsigned long long rb2 = proc_read_bytes();
    if (full)
        fprintf(stderr, "deltafin: the context is full (--ctx %d): stopped after %d of %d new tokens\n", ctx, n_gen,
                a.max_new);
    if (a.bench_json) print_bench_json(eng, n_prompt, t1 - t0, rb1 - rb0, n_gen, t2 - t1, rb2 - rb1, gen);
    if (a.print_ids) {
        for (int i = 0; i < n_gen; i++) printf("%s%d", i ? "," : "", gen[i]);
        printf("\n");
        fflush(stdout);
    }
    if (sink_commit(&sink)) return 1;
    if (a.stats) print_run_stats(eng, n_prompt, t1 - t0, n_gen, t2 - t1);
    sampler_free(&smp);
    free(gen);
    free(rows);
    free(last);
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

static void plan_opts_from(const run_args *a, df_plan_opts *o, size_t mem)
{
    memset(o, 0, sizeof *o);
    o->mem_budget = mem;
    o->expert_cache_bytes = a->cache_bytes;
    o->n_ctx = a->ctx;
    o->max_batch = a->batch;
    o->n_threads = a->threads;
    o->trunk_stream = a->trunk_stream;
    o->cache_policy = a->policy;
}

static double gib_(uint64_t b) { return (double)b / (double)(1ull << 30); }

/* info: the model's dimensions and its plan, from the config and headers
 * (no weight is read). */
static int cmd_info(int argc, char **argv)
{
    run_args a;
    parse_common(argc, argv, &a);
    df_plan_opts o;
    plan_opts_from(&a, &o, a.mem);
    df_plan p;
    df_model_info i;
    df_error err = {0};
    memset(&i, 0, sizeof i);
    int rc = df_plan_model(a.model, &o, &p, &i, &err);
    if (rc && err.code != DF_ERR_NOMEM) {
        fprintf(stderr, "deltafin: %s\n", err.msg);
        return 1;
    }
    printf("layers %d (KDA %d, MLA %d)\nhidden %d\nvocab %d\nexperts %d, %d per token, %.2f MiB each\n"
           "bos %d eos %d pad %d\ncontext memory per token %llu bytes (MLA latent cache, fp32)\n"
           "fixed recurrent state %.1f MiB (KDA)\ntrunk %.3f GiB (matrices) + embedding %.3f GiB\n",
           i.n_layers, i.n_kda_layers, i.n_mla_layers, i.hidden, i.vocab, i.n_experts, i.n_experts_used,
           (double)i.expert_bytes / (1 << 20), i.bos_id, i.eos_id, i.pad_id,
           (unsigned long long)i.ctx_bytes_per_token, (double)i.fixed_state_bytes / (1 << 20), gib_(p.trunk_bytes),
           gib_(p.embed_bytes));
    if (rc) {
        printf("no plan: %s\n", err.msg);
        return 1;
    }
    df_plan_print(&p, "", stdout);
    return 0;
}

static void plan_json(const df_plan *p, int ok, const char *msg)
{
    printf("{\"ok\":%s,\"budget\":%llu,\"trunk\":\"%s\",\"trunk_bytes\":%llu,\"embed_bytes\":%llu,"
           "\"trunk_used\":%llu,\"state_bytes\":%llu,\"scratch_bytes\":%llu,\"reserve_bytes\":%llu,"
           "\"vec_bytes\":%llu,\"cache_bytes\":%llu,\"cache_slots\":%llu,\"experts\":%llu,\"used\":%llu,"
           "\"ctx\":%d,\"trunk_read_per_token\":%llu,\"expert_read_cold\":%llu,\"expert_read_est\":%llu",
           ok ? "true" : "false", (unsigned long long)p->budget,
           p->trunk_mode == DF_TRUNK_STREAMED ? "streamed" : "resident", (unsigned long long)p->trunk_bytes,
           (unsigned long long)p->embed_bytes, (unsigned long long)p->trunk_used, (unsigned long long)p->state_bytes,
           (unsigned long long)p->scratch_bytes, (unsigned long long)p->reserve_bytes,
           (unsigned long long)p->vec_bytes, (unsigned long long)p->cache_bytes,
           (unsigned long long)(p->n_slots + p->n_transient), (unsigned long long)p->n_experts,
           (unsigned long long)p->used, p->n_ctx, (unsigned long long)p->trunk_read_per_token,
           (unsigned long long)p->expert_read_cold, (unsigned long long)p->expert_read_est);
    if (!ok) {
        printf(",\"error\":\"");
        for (const char *c = msg; *c; c++) {
            if (*c == '"' || *c == '\\') putchar('\\');
            if ((unsigned char)*c >= 0x20) putchar(*c);
        }
        putchar('"');
    }
    printf("}\n");
}

/* plan: where the model goes at --mem, or at several machine sizes when
 * --mem is not given; from a model directory, a .gguf or a config.json
 * alone, never reading a weight. */
static int cmd_plan(int argc, char **argv)
{
    run_args a;
    parse_common(argc, argv, &a);
    size_t sizes[5] = {0};
    int n = 0;
    if (a.mem) sizes[n++] = a.mem;
    else {
        static const size_t gb[] = {24, 64, 128, 512};
        for (int i = 0; i < 4; i++) sizes[n++] = gb[i] << 30;
    }
    int bad = 0;
    uint64_t cold = 0;
    if (!a.json && !a.mem)
        printf("%-10s %-9s %11s %11s %13s %13s %7s %16s %16s\n", "--mem", "trunk", "trunk GiB", "cache GiB",
               "experts held", "context GiB", "chunk", "trunk read/tok", "experts read/tok");
    for (int i = 0; i < n; i++) {
        df_plan_opts o;
        plan_opts_from(&a, &o, sizes[i]);
        df_plan p;
        df_error err = {0};
        int rc = df_plan_model(a.model, &o, &p, NULL, &err);
        if (rc && err.code != DF_ERR_NOMEM) {
            fprintf(stderr, "deltafin: %s\n", err.msg);
            return 1;
        }
        if (a.json) plan_json(&p, !rc, err.msg);
        else if (a.mem) {
            if (rc) {
                fprintf(stderr, "deltafin: %s\n", err.msg);
                bad = 1;
            } else {
                df_plan_print(&p, "", stdout);
            }
        } else if (rc) {
            printf("%-10s does not fit: needs %.2f GiB\n", "", gib_(p.used));
        } else {
            char mem[32], held[40];
            snprintf(mem, sizeof mem, "%.0f GiB", gib_(p.budget));
            snprintf(held, sizeof held, "%llu/%llu", (unsigned long long)p.n_slots, (unsigned long long)p.n_experts);
            printf("%-10s %-9s %11.2f %11.2f %13s %13.3f %7d %12.2f GiB %12.2f GiB\n", mem,
                   p.trunk_mode == DF_TRUNK_STREAMED ? "streamed" : "resident", gib_(p.trunk_used),
                   gib_(p.cache_bytes), held, gib_(p.state_bytes), p.max_batch, gib_(p.trunk_read_per_token),
                   gib_(p.expert_read_est));
        }
        bad |= rc != 0;
        cold = p.expert_read_cold;
    }
    if (!a.json && !a.mem)
        printf("context %d tokens; chunk: positions per prompt pass (each pass reads the streamed trunk and "
               "each needed expert once); experts read per token: uniform-routing estimate (cache share of all "
               "experts), %.2f GiB with nothing cached\n",
               a.ctx ? a.ctx : 4096, gib_(cold));
    return bad && a.mem ? 1 : 0;
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
    if (!strcmp(argv[1], "plan")) return cmd_plan(argc, argv);
    if (!strcmp(argv[1], "cachesim")) return cmd_cachesim(argc, argv);
    if (!strcmp(argv[1], "iobench")) return cmd_iobench(argc, argv);
    if (!strcmp(argv[1], "place")) return cmd_place(argc, argv);
    if (!strcmp(argv[1], "chat")) return cmd_chat(argc, argv);
    if (!strcmp(argv[1], "tokenize")) return cmd_tokenize(argc, argv);
    if (!strcmp(argv[1], "perplexity")) return cmd_perplexity(argc, argv);
    if (!strcmp(argv[1], "serve")) return cmd_serve(argc, argv);
    if (!strcmp(argv[1], "bench")) return cmd_bench(argc, argv);
    die("unknown command \"%s\"", argv[1]);
}
