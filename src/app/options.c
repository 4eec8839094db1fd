/* options.c - the run options shared by every front end (L5): the
 * per-command option tables and their parser (an option a command does not
 * take is an error naming it; `--` ends the options; a stray argument is an
 * error), the usage text, the default model, the context a run needs, and
 * opening the engine and the session those options describe (the plan's
 * one-line summary always printed).  cli.c and server.c both include
 * options.h; neither depends on the other.  May exit (die); nothing below
 * it does.
 */
#define _GNU_SOURCE
#include "options.h"
#include "document.h"
#include "plan.h"
#include "draft_xtok.h"
#include "families.h"
#include "spec_state.h"
#include "tokenizer.h"
#include "util.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static void usage_options(FILE *f);

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
          "          [--max-request-bytes 128M] [--max-tokens N] [--name NAME]\n"
          "          [--max-document-bytes 32M] (a document's bytes: text, Markdown or PDF sent as an\n"
          "          Anthropic document block, an OpenAI file part or a Responses input_file; PDFs\n"
          "          need poppler's pdftotext)\n"
          "          [--timeout SEC] (a job's limit, prompt and reply: finish reason \"timeout\"; default none)\n"
          "          [--conn-timeout 600] (an idle connection's limit; streams send keep-alives)\n"
          "          [--ping-ms 2000] (SSE keep-alive after this long without output: a comment,\n"
          "          Anthropic's ping event on /v1/messages)\n"
          "          [--keep-billing-header] (keep Claude Code's per-session billing line in the\n"
          "          prompt; left out by default so sessions share their prefix)\n"
          "          [--checkpoints N] (conversation points kept, each a copy of the KDA state: a\n"
          "          request that shares a conversation's prefix evaluates only what follows; kept\n"
          "          where the system prompt and tools end and where each message ends, the latest;\n"
          "          default: as many as 1/64 of --mem holds, from 2 to 8, printed in the plan)\n"
          "          [--parallel N] (conversations kept, each its own session; a request goes to the\n"
          "          one sharing the longest prefix; default: as many as --mem holds, up to 4; the\n"
          "          memory plan counts N, else one: the others take only what the plan leaves)\n"
          "          [--prompt-cache DIR [--prompt-cache-max 8G]] (conversations leaving a slot, and\n"
          "          those kept at exit, saved as session files; a prompt extending one resumes it)\n"
          "          HTTP server: OpenAI /v1/chat/completions, /v1/completions, /v1/models,\n"
          "          Anthropic /v1/messages (SSE streaming), /health, /metrics, a chat page at /;\n"
          "          takes the run options too (--ctx, --mem, --threads, ...); without --ctx the\n"
          "          context is 64K where the expert cache keeps its streaming minimum at --mem (one\n"
          "          token's experts in every layer), else halved down to 4096 (`plan --serve`)\n"
          "  setup   --full|--stream --repo ORG/NAME --out DIR [--revision REV] [--base-url URL]\n"
          "          [--workers 8] [--chunk 64M] [--reserve SIZE] [--dry-run] | --check DIR\n"
          "          install a model from Hugging Face (or $HF_ENDPOINT, --base-url; $HF_TOKEN):\n"
          "          parallel range requests, resumable after any interruption, every file's\n"
          "          SHA-256 verified, published atomically; --check re-verifies an install.\n"
          "          --stream installs the trunk only: routed experts are fetched on first use into\n"
          "          a disk cache (--disk-cache-max SIZE), each checked against its SHA-256 when\n"
          "          known: --verify streams every shard once at setup to hash each expert (or the\n"
          "          repository publishes experts.manifest)\n"
          "  setup   --drafter ORG/NAME --out MODEL_DIR [...]: a draft model (Qwen3, or the target's family)\n"
          "          installed the same way at MODEL_DIR/drafters/NAME (config, tokenizer, safetensors),\n"
          "          for --draft model:MODEL_DIR/drafters/NAME\n"
          "  doctor  [--model DIR] [--mem SIZE] [--seconds 2] [--expert-path DIR]...: what this machine\n"
          "          can do with the model (CPU and kernels, memory, io_uring, the plan, each drive's\n"
          "          measured bandwidth, a streamed install's remote and disk cache, the decode speed it\n"
          "          allows, what to change)\n"
          "  info    --model DIR: the model's dimensions and its memory plan (reads no weights)\n"
          "  plan    --model DIR|FILE.gguf|config.json [--mem SIZE] [--ctx N] [--json] [--ranks N]\n"
          "          [--serve [--parallel N]] [--trunk bf16|f16|q8_0] [--disk-gbps 7,28]\n"
          "          [--draft model:PATH [--draft-mem SIZE]] (the draft model's share taken off --mem and\n"
          "          the drafter sized in it, as run and serve do)\n"
          "          where the model goes at --mem (or at 24/64/128/512 GiB) and the bytes read per\n"
          "          token, from the config and headers alone; --ranks: each MPI rank's share;\n"
          "          --serve: the context serve picks without --ctx, and why; --trunk: a config.json's\n"
          "          trunk as that type (q8_0: llama.cpp's K3 conversion), a what-if; --disk-gbps:\n"
          "          the tok/s each budget projects at those read speeds (disk-bound)\n"
          "  mpirun -np N deltafin run|chat|serve ...: the routed experts spread over N processes\n"
          "          (built with Open MPI; --heat balances them; DELTAFIN_RANK_TIMEOUT, default 60 s)\n"
          "  quantize --trunk q8_0 [--experts keep|q8_0] IN.gguf OUT.gguf\n"
          "          the GGUF with its trunk in Q8_0 (what llama.cpp's quantizer writes for K3's Q8_0\n"
          "          release: experts kept, the router and norms as they are), written beside OUT;\n"
          "          --experts q8_0 requantizes the routed experts too, from their MXFP4 values\n"
          "  perplexity --model DIR --file TEXT [--window N] [--json]\n"
          "             [--save-logits FILE | --kl-divergence BASE]\n"
          "          perplexity and bits per byte of a text file; --save-logits keeps the model's\n"
          "          distributions (compressed) for a later --kl-divergence; --kl-divergence BASE (a\n"
          "          model, run first, or such a file): KL divergence from the base (mean, median,\n"
          "          99%, 99.9%, max), top-1 agreement, the perplexity ratio (what quantizing lost)\n"
          "  iobench DIR [--chunk SIZE] [--io-depth N] [--seconds S] [--io buffered]\n"
          "          measure the drive's read bandwidth with the engine's read size and depth\n"
          "          (DIR: a model directory or any directory of large files)\n"
          "  place   --model DIR --to DIR [--to DIR ...] [--stripe]\n"
          "          copy the experts to other drives: every expert to every DIR (replicas,\n"
          "          reads go to the least busy copy) or spread across them (--stripe);\n"
          "          then run with --expert-path DIR for each\n"
          "  cachesim --trace FILE [--slots 64,256,1024]\n"
          "          replay a route trace through the LRU and LFU caches and Belady's optimal\n"
          "  trace   dump|stats|reuse FILE [--json] [--svg DIR] [--max-distance N]\n"
          "          a route trace (--trace, either format): dump: JSON lines (the header, each\n"
          "          evaluation's ids, each position's experts, scores and weights); stats: per\n"
          "          layer popularity, entropy, pairs, neighbours; reuse: at distances 1..N\n"
          "  trace   cache FILE [--slots 16,64,256] [--prior HEAT|TRACE] [--json] [--svg DIR]\n"
          "          hit rates by policy and Belady's optimum, pooled and per MoE layer; --prior:\n"
          "          another run's heat file or trace for the policies that start from one\n"
          "  trace   diff A B [--json]\n"
          "          where two traces route differently: per layer, experts, order, weights\n"
          "  trace   attention FILE --layer L [--head H] --svg DIR\n"
          "          an attention dump's map of one MLA layer and head\n"
          "  bench   --model MODEL [--vs-llama] [--threads N] [--prompt-len 32] [--gen 16]\n"
          "          [--reps 3] [--mem SIZE] [--kernels ISA] [--squeeze-to SIZE] [--drop-caches]\n"
          "          prefill and decode tok/s (medians), peak RSS, disk bytes per token, and how\n"
          "          close they are to this machine's limits measured in the same run (memory\n"
          "          read bandwidth, the kernels' in-cache rate); --vs-llama: llama.cpp (npm\n"
          "          build, tools/llama_peer.c) on the same GGUF, interleaved, with the ratios\n"
          "          (see deltafin bench --help)\n",
          f);
    usage_options(f);
}

/* the options, after the commands (usage) */
static void usage_options(FILE *f)
{
    fputs(
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
          "  --json-schema FILE   the answer is JSON valid against the JSON Schema in FILE (implies\n"
          "                       --chat; the supported keywords: docs in src/grammar/json_schema.c)\n"
          "  --prompt-file FILE   the prompt's text from FILE (- for standard input): for prompts\n"
          "                       longer than one argument (the kernel's limit is 128 KiB)\n"
          "  --attach FILE        a document before the prompt (run) or the first message (chat):\n"
          "                       text, Markdown or PDF (poppler's pdftotext), rendered as the server\n"
          "                       renders a document block; repeatable, 32 MiB each\n"
          "  --prompt-ids LIST    comma-separated token ids, e.g. 12,7,99; @FILE reads them from FILE\n"
          "                       (separated by commas and/or white space; @- standard input)\n"
          "  --max-new N          tokens to generate (default 16 with --prompt-ids, else 512)\n"
          "  --print-ids          print the generated ids comma-separated on one line\n"
          "  --dump-logits FILE   write float32 LE logits [T][vocab], one row per prompt and\n"
          "                       generated token (row t = distribution after token t)\n"
          "  --greedy             greedy decoding (the default)\n"
          "  --temp T             sample at temperature T (0 = greedy) with --top-p P, --top-k K and\n"
          "                       --seed N (the same seed gives the same text; the server's sampler)\n"
          "  --stop-eos           stop after generating the model's eos token\n"
          "  --draft D            speculative decoding (run, chat, serve): none (default), ngram (prompt\n"
          "                       lookup), suffix (continuations seen in this process), model:PATH (a small\n"
          "                       model, K3 or Qwen3: with the target's tokenizer it drafts its ids,\n"
          "                       with another its drafts are translated), lookup:FILE (ngram over the history,\n"
          "                       then over FILE: a text, or ids in a file named .ids) or auto\n"
          "                       (ngram).  Drafts only propose:\n"
          "                       greedy output and every logit are identical with and without them\n"
          "  --draft-max N        at most N drafts per step (default 8); the number is chosen each step\n"
          "                       from measured pass times and acceptance, 0 when drafts do not pay\n"
          "  --draft-k N          exactly N drafts per step instead\n"
          "  --draft-mem SIZE     a draft model's share of --mem (default an eighth)\n"
          "  --draft-threads N    the threads a draft model computes on (default 1: drafting is\n"
          "                       latency-bound, and a second pool competes with the target's);\n"
          "                       any count gives the same drafts\n"
          "  --draft-wide PATH    a second, larger Qwen3 drafter beside --draft model:PATH, asked where\n"
          "                       the first is sure of a token but stops short of N drafts; the\n"
          "                       longer proposal is taken (both in --draft-mem's share)\n"
          "  --spec-state FILE    keep what the drafts' cost model and guard learned (pass times,\n"
          "                       acceptance, the guard's verdict) per model and drafter in FILE: read\n"
          "                       at start, written after each answer, so drafts that paid start at once\n"
          "  --session FILE       resume from FILE (a prompt extending its tokens evaluates only the\n"
          "                       rest; chat: the conversation goes on) and save to it at the end\n"
          "                       (chat: after every reply); a file of another model, truncated or\n"
          "                       corrupted, is refused\n"
          "  --threads N          worker threads (default: all CPUs); output is identical for every N\n"
          "  --ctx N              context capacity in tokens (default 4096, or what the prompt needs;\n"
          "                       serve: 64K where it fits, see serve)\n"
          "  --batch N|auto       positions per forward pass of a prompt (default auto: chosen by the\n"
          "                       planner from --mem; each pass reads its experts and the streamed trunk once)\n"
          "  --backend B          where and how the blocks run: cpu (default: the best kernels here),\n"
          "                       cpu:avx512, cpu:avx2, cpu:neon (AArch64), cpu:scalar, or ref (the\n"
          "                       reference backend: one thread, plain C, the oracle; slow); also\n"
          "                       $DF_BACKEND.  Logits are\n"
          "                       identical on every backend\n"
          "  --kernels ISA        the same as --backend cpu:ISA (ref = scalar); also $DF_KERNELS\n"
          "  --mem SIZE           memory budget for everything, e.g. 4G (default: 70% of RAM);\n"
          "                       the expert cache gets what the trunk and state leave\n"
          "  --expert-cache SIZE  set the expert cache size directly instead\n"
          "  --io MODE            expert reads: auto (O_DIRECT where possible), direct, buffered\n"
          "  --io-backend B       auto (io_uring where possible), uring, threads\n"
          "  --io-depth N         expert reads in flight (default 32)\n"
          "  --disk-cache-max SIZE  a streamed install (setup --stream): the cap of its disk cache of\n"
          "                       fetched experts (default: what setup recorded)\n"
          "  --expert-path DIR    read experts from a directory written by 'deltafin place' (repeatable)\n"
          "  --cache-policy P     expert cache policy: lfu (default; counts the rows a chunk routes to\n"
          "                       each expert), tlfu (LFU + admission), lru, or lfu-steps (one count\n"
          "                       per chunk: the default before, for comparisons)\n"
          "  --trace FILE         write the route trace: every evaluation's ids, then each position's\n"
          "                       experts, router scores and weights at every MoE layer, bit for bit\n"
          "                       (binary; 'deltafin trace dump FILE' prints it)\n"
          "  --trace-format F     binary (default) or jsonl (the older format: a JSON line per position\n"
          "                       and MoE layer, experts and weights only)\n"
          "  --trace-lookahead D  with --trace: after each layer, the next D MoE layers' routers on the\n"
          "                       hidden state, as the prefetcher applies them ('trace prefetch')\n"
          "  --dump-attention FILE  every query's largest MLA attention weights (the trace format:\n"
          "                       'deltafin trace dump FILE' prints them), bit for bit\n"
          "  --attn-layers L..M   the layers dumped (default all; a KDA layer gives each head's beta,\n"
          "                       decay mean and min and gate mean per position)\n"
          "  --attn-heads A..B    the heads dumped (default all)\n"
          "  --attn-top K         weights kept per query and head (default 16)\n"
          "  --heat FILE          expert heat histogram: warms the cache at start, updated at exit\n"
          "  --events FILE        JSON line per forward call: hit rate, bytes read, GB/s, I/O wait, layer ms\n"
          "  --no-prefetch        no router look-ahead prefetch (on by default; it turns itself off\n"
          "                       for layers where its predictions do not pay)\n"
          "  --prefetch-k N       experts predicted per position and layer (default top_k / 2)\n"
          "  --trunk-stream M     auto (when the trunk does not fit --mem, keep the layers that pay\n"
          "                       resident and stream the rest layer by layer), on (stream every\n"
          "                       layer), or off (leave it mapped; the kernel pages it)\n"
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

/* "A..B" (inclusive) or "A" into lo, hi */
static void parse_range(const char *v, const char *flag, int *lo, int *hi)
{
    char *e;
    long a = strtol(v, &e, 10), b = a;
    int ok = e != v;
    if (ok && e[0] == '.' && e[1] == '.') {
        char *e2;
        b = strtol(e + 2, &e2, 10);
        ok = e2 != e + 2;
        e = e2;
    }
    if (!ok || *e || a < 0 || b < a || b > 1 << 20) die("%s \"%s\": expected N or N..M (0 <= N <= M)", flag, v);
    *lo = (int)a, *hi = (int)b;
}

/* --dump-attention FILE, --attn-layers L..M, --attn-heads A..B, --attn-top K;
 * --trace-lookahead D */
static void parse_attn(run_args *a, const char *f, const char *v)
{
    if (!strcmp(f, "--dump-attention")) a->attn_path = v;
    else if (!strcmp(f, "--trace-lookahead")) a->trace_lookahead = (int)parse_long(v, f, 1, 8);
    else if (!strcmp(f, "--attn-layers")) {
        parse_range(v, f, &a->attn_l0, &a->attn_l1);
        a->attn_l1++; /* exclusive in the engine */
    } else if (!strcmp(f, "--attn-heads")) {
        parse_range(v, f, &a->attn_h0, &a->attn_h1);
        a->attn_h1++;
    } else a->attn_top = (int)parse_long(v, f, 1, 4096);
}

/* --trace-format: 1 for jsonl, 0 for binary */
static int trace_format_jsonl(const char *v)
{
    if (strcmp(v, "binary") && strcmp(v, "jsonl")) die("--trace-format \"%s\": expected binary or jsonl", v);
    return !strcmp(v, "jsonl");
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

/* A prompt too large for one argument comes from a file (or standard
 * input as "-"): read whole, up to PROMPT_FILE_MAX bytes (a million-token
 * context is a few MB of text; more is a wrong file, not a prompt). */
#define PROMPT_FILE_MAX ((size_t)256 << 20)

char *read_prompt_file(const char *path, const char *flag, size_t *len)
{
    int is_stdin = !strcmp(path, "-");
    FILE *f = is_stdin ? stdin : fopen(path, "rb");
    if (!f) die("%s %s: cannot open: %s", flag, path, strerror(errno));
    struct stat st;
    if (!is_stdin && fstat(fileno(f), &st) == 0 && !S_ISREG(st.st_mode) && !S_ISFIFO(st.st_mode) && !S_ISCHR(st.st_mode))
        die("%s %s: not a regular file", flag, path);
    size_t n = 0, cap = 1 << 16;
    static char *volatile reading; /* reachable if a die() below exits mid-read */
    char *buf = reading = malloc(cap + 1);
    if (!buf) die("%s %s: out of memory", flag, path);
    for (;;) {
        if (n == cap) {
            if (cap >= PROMPT_FILE_MAX) die("%s %s: larger than %zu MiB", flag, path, PROMPT_FILE_MAX >> 20);
            cap *= 2;
            char *nb = realloc(buf, cap + 1);
            if (!nb) die("%s %s: out of memory", flag, path);
            buf = reading = nb;
        }
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (got == 0) {
            if (ferror(f)) die("%s %s: read error: %s", flag, is_stdin ? "(standard input)" : path, strerror(errno));
            break;
        }
    }
    if (!is_stdin) fclose(f);
    buf[n] = 0;
    if (memchr(buf, 0, n)) die("%s %s: holds a NUL byte (not a text file)", flag, path);
    reading = NULL;
    *len = n;
    return buf;
}

/* Buffers held in statics while a prompt is read or parsed, so that a
 * die() midway exits with them reachable (sanitized builds report a
 * buffer only a dead frame pointed to as a leak). */
static int32_t *volatile parsing;
static char *volatile parsing_text;

/* A --session path is checked before anything runs (a bad one used to be
 * reported after the whole generation): an existing file must be a regular
 * one that can be read, and its directory must take the file written
 * beside it and renamed into place. */
static void check_session_path(const char *path)
{
    struct stat st;
    if (!stat(path, &st)) {
        if (!S_ISREG(st.st_mode)) die("--session %s: not a regular file", path);
        if (access(path, R_OK)) die("--session %s: cannot read: %s", path, strerror(errno));
    } else if (errno != ENOENT) {
        die("--session %s: %s", path, strerror(errno));
    }
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash == dir) dir[1] = 0;
    else if (slash) *slash = 0;
    else snprintf(dir, sizeof dir, ".");
    if (stat(dir, &st) || !S_ISDIR(st.st_mode)) die("--session %s: the directory %s does not exist", path, dir);
    if (access(dir, W_OK)) die("--session %s: cannot write in %s: %s", path, dir, strerror(errno));
}

/* Token ids separated by commas and/or white space ("12,7,99", one per
 * line, ...).  s = "@FILE" reads them from FILE ("@-": standard input). */
int parse_ids(const char *s, const char *flag, int32_t **out)
{
    const char *src = NULL;
    char *owned = NULL;
    if (s[0] == '@') {
        size_t n;
        src = s + 1;
        if (!*src) die("%s @FILE: no file named", flag);
        owned = read_prompt_file(src, flag, &n);
        s = owned;
    }
    int n = 0, cap = 16;
    int32_t *ids = malloc((size_t)cap * sizeof *ids);
    if (!ids) die("%s: out of memory", flag);
    parsing = ids;
    parsing_text = owned;
    const char *p = s;
#define IDS_WS(c) ((c) == ' ' || (c) == '\t' || (c) == '\n' || (c) == '\r')
    while (IDS_WS(*p)) p++;
    if (!*p) die("%s%s%s is empty", flag, src ? " @" : "", src ? src : "");
    while (*p) {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (errno || end == p || v < 0 || v > INT32_MAX || (*p < '0' || *p > '9')) {
            char near[24];
            snprintf(near, sizeof near, "%.20s", p);
            for (char *c = near; *c; c++)
                if (IDS_WS(*c)) *c = ' ';
            if (src) die("%s @%s: entry %d is not a token id (near \"%s\")", flag, src, n + 1, near);
            die("%s: bad token id near \"%s\"", flag, near);
        }
        if (n == cap) {
            int32_t *ni = realloc(ids, (size_t)(cap *= 2) * sizeof *ids);
            if (!ni) die("%s: out of memory", flag);
            ids = parsing = ni;
        }
        ids[n++] = (int32_t)v;
        p = end;
        while (IDS_WS(*p)) p++;
        if (*p == ',') {
            p++;
            while (IDS_WS(*p)) p++;
            if (!*p && !src) die("%s: trailing comma", flag); /* a file may end with one */
        } else if (*p && (p == end)) {
            if (src) die("%s @%s: expected ',' or white space after entry %d", flag, src, n);
            die("%s: expected ',' near \"%.20s\"", flag, p);
        }
    }
#undef IDS_WS
    free(owned);
    parsing = NULL;
    parsing_text = NULL;
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
    {"--backend", 1, C_ENGINE},
    {"--io", 1, C_ENGINE},            {"--io-backend", 1, C_ENGINE},   {"--io-depth", 1, C_ENGINE}, {"--disk-cache-max", 1, C_ENGINE},
    {"--trace", 1, C_ENGINE | C_CACHESIM}, {"--trace-format", 1, C_ENGINE}, {"--dump-attention", 1, C_ENGINE},
    {"--attn-layers", 1, C_ENGINE}, {"--attn-heads", 1, C_ENGINE}, {"--attn-top", 1, C_ENGINE},
    {"--trace-lookahead", 1, C_ENGINE}, {"--heat", 1, C_ENGINE},    {"--events", 1, C_ENGINE},
    {"--no-prefetch", 0, C_ENGINE},   {"--prefetch-k", 1, C_ENGINE},   {"--expert-path", 1, C_ENGINE},
    {"--prefault", 0, C_ENGINE},      {"--preload", 1, C_ENGINE},      {"--stats", 0, C_ENGINE},
    {"--prompt-ids", 1, C_RUN},       {"--prompt", 1, C_RUN},          {"--prompt-file", 1, C_RUN},          {"--attach", 1, C_RUN | C_CHAT},          {"--max-new", 1, C_RUN | C_CHAT},
    {"--print-ids", 0, C_RUN},        {"--dump-logits", 1, C_RUN},     {"--greedy", 0, C_RUN},
    {"--stop-eos", 0, C_RUN},         {"--bench-json", 0, C_RUN},      {"--chat", 0, C_RUN},
    {"--system", 1, C_RUN | C_CHAT},  {"--json-schema", 1, C_RUN},  {"--reasoning-effort", 1, C_RUN | C_CHAT},
    {"--no-think", 0, C_RUN | C_CHAT}, {"--special", 0, C_TOKENIZE},   {"--decode", 1, C_TOKENIZE},
    {"--to", 1, C_PLACE},             {"--stripe", 0, C_PLACE},        {"--slots", 1, C_CACHESIM},
    {"--temp", 1, C_RUN | C_CHAT},    {"--top-p", 1, C_RUN | C_CHAT},  {"--top-k", 1, C_RUN | C_CHAT},
    {"--seed", 1, C_RUN | C_CHAT},    {"--draft", 1, C_RUN | C_CHAT | C_SERVE | C_PLAN},
    {"--draft-max", 1, C_RUN | C_CHAT | C_SERVE | C_PLAN}, {"--draft-k", 1, C_RUN | C_CHAT | C_SERVE | C_PLAN},
    {"--draft-mem", 1, C_RUN | C_CHAT | C_SERVE | C_PLAN}, {"--spec-state", 1, C_RUN | C_CHAT | C_SERVE},
    {"--draft-threads", 1, C_RUN | C_CHAT | C_SERVE}, {"--draft-wide", 1, C_RUN | C_CHAT | C_SERVE | C_PLAN},
    {"--session", 1, C_RUN | C_CHAT},    {"--file", 1, C_PERPLEXITY},      {"--window", 1, C_PERPLEXITY},
    {"--kl-divergence", 1, C_PERPLEXITY}, {"--save-logits", 1, C_PERPLEXITY},   {"--json", 0, C_PLAN | C_PERPLEXITY}, {"--ranks", 1, C_PLAN}, {"--trunk", 1, C_PLAN}, {"--disk-gbps", 1, C_PLAN},
    {"--serve", 0, C_PLAN},           {"--parallel", 1, C_PLAN},
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

/* plan --disk-gbps 7,28: up to four read speeds in GB/s */
static void parse_gbps(const char *v, run_args *a)
{
    a->n_disk_gbps = 0;
    for (const char *p = v; *p;) {
        char *end;
        double g = strtod(p, &end);
        if (end == p || !(g > 0 && g < 1e4) || a->n_disk_gbps == 4 || (*end && *end != ','))
            die("--disk-gbps %s: up to four read speeds in GB/s, comma-separated (7,28)", v);
        a->disk_gbps[a->n_disk_gbps++] = g;
        p = *end ? end + 1 : end;
    }
}

/* The speculative-decoding flags: 1 when f is one (parse_common). */
static int draft_flag(run_args *a, const char *f, const char *v)
{
    if (!strcmp(f, "--draft")) {
        if (strcmp(v, "none") && strcmp(v, "ngram") && strcmp(v, "suffix") && strcmp(v, "auto") &&
            (strncmp(v, "model:", 6) || !v[6]) && (strncmp(v, "lookup:", 7) || !v[7]))
            die("--draft wants none, ngram, suffix, auto, model:PATH or lookup:FILE, not \"%s\"", v);
        a->draft = v;
    } else if (!strcmp(f, "--draft-max")) {
        a->draft_max = (int)parse_long(v, f, 1, GEN_MAX_DRAFT);
    } else if (!strcmp(f, "--spec-state")) {
        a->spec_state = v;
    } else if (!strcmp(f, "--draft-k")) {
        a->draft_k = (int)parse_long(v, f, 1, GEN_MAX_DRAFT);
    } else if (!strcmp(f, "--draft-mem")) {
        a->draft_mem = parse_size(v, f);
    } else if (!strcmp(f, "--draft-threads")) {
        a->draft_threads = (int)parse_long(v, f, 1, 256);
    } else if (!strcmp(f, "--draft-wide")) {
        if (!*v) die("--draft-wide wants the folder or GGUF of a second cross-tokenizer drafter");
        a->draft_wide = v;
    } else {
        return 0;
    }
    return 1;
}

/* run's prompt options, checked (and --prompt-file read) once all are parsed */
static void check_run(run_args *a)
{
    if ((a->prompt != NULL) + (a->prompt_ids != NULL) + (a->prompt_file != NULL) > 1)
        die("--prompt, --prompt-file and --prompt-ids cannot be combined (give the prompt once)");
    if (a->prompt_file) {
        size_t n;
        /* held for the whole run (a static keeps it reachable at exit) */
        static char *volatile prompt_text;
        prompt_text = read_prompt_file(a->prompt_file, "--prompt-file", &n);
        a->prompt = prompt_text;
        if (!n) die("--prompt-file %s is empty", a->prompt_file);
    }
    if (a->chat && a->prompt_ids) die("--chat takes --prompt \"text\", not --prompt-ids");
    if (a->n_attach && a->prompt_ids) die("--attach goes with --prompt or --prompt-file, not --prompt-ids");
    if (!a->prompt && !a->prompt_ids)
        die("run needs --prompt \"text\", --prompt-file FILE or --prompt-ids LIST|@FILE");
    if (!a->chat && (a->system || a->effort || a->no_think))
        die("--system, --reasoning-effort and --no-think need --chat");
    if (a->session) check_session_path(a->session);
    if (a->session && a->dump)
        die("--session cannot be combined with --dump-logits (a resumed prompt's rows are not evaluated again)");
}

static void add_attach(run_args *a, const char *path)
{
    if (a->n_attach == (int)(sizeof a->attach / sizeof a->attach[0]))
        die("--attach: at most %d documents", (int)(sizeof a->attach / sizeof a->attach[0]));
    a->attach[a->n_attach++] = path;
}

/* --attach: the documents rendered once, as the server renders document blocks */
static void render_attachments(run_args *a)
{
    json_buf b;
    json_buf_init(&b);
    doc_limits lim = {0};
    for (int i = 0; i < a->n_attach; i++) {
        df_error err = {0};
        if (doc_render_file(&lim, a->attach[i], &b, &err)) die("%s", err.msg);
    }
    json_buf_putc(&b, 0);
    /* held for the whole run (a static keeps it reachable at exit) */
    static char *volatile held;
    held = b.p;
    a->attach_text = held;
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
        else if (draft_flag(a, f, v)) {}
        else if (!strcmp(f, "--session")) a->session = v;
        else if (!strcmp(f, "--threads")) a->threads = (int)parse_long(v, f, 1, 256);
        else if (!strcmp(f, "--ctx")) a->ctx = (int)parse_long(v, f, 1, 1 << 24);
        else if (!strcmp(f, "--batch")) a->batch = !strcmp(v, "auto") ? 0 : (int)parse_long(v, f, 1, 4096);
        else if (!strcmp(f, "--kernels")) a->kernels = v;
        else if (!strcmp(f, "--backend")) a->backend = v;
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
        else if (!strcmp(f, "--disk-cache-max")) a->disk_cache_max = parse_size(v, f);
        else if (!strcmp(f, "--cache-policy")) a->policy = v;
        else if (!strcmp(f, "--trace")) a->trace = v;
        else if (!strcmp(f, "--trace-format")) a->trace_jsonl = trace_format_jsonl(v);
        else if (!strcmp(f, "--dump-attention") || !strncmp(f, "--attn-", 7) || !strcmp(f, "--trace-lookahead"))
            parse_attn(a, f, v);
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
        else if (!strcmp(f, "--prompt-file")) a->prompt_file = v;
        else if (!strcmp(f, "--attach")) add_attach(a, v);
        else if (!strcmp(f, "--system")) a->system = v;
        else if (!strcmp(f, "--chat")) a->chat = 1;
        else if (!strcmp(f, "--json-schema")) a->json_schema = v, a->chat = 1;
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
        else if (!strcmp(f, "--kl-divergence")) a->kld_base = v;
        else if (!strcmp(f, "--save-logits")) a->save_logits = v;
        else if (!strcmp(f, "--json")) a->json = 1;
        else if (!strcmp(f, "--ranks")) a->ranks = (int)parse_long(v, f, 1, 255);
        else if (!strcmp(f, "--trunk")) a->trunk_type = v;
        else if (!strcmp(f, "--disk-gbps")) parse_gbps(v, a);
        else if (!strcmp(f, "--serve")) a->serve = 1;
        else if (!strcmp(f, "--parallel")) a->plan_sessions = (int)parse_long(v, f, 1, 64);
        else die("internal: option %s has no handler", f);
    }
    if (a->greedy && a->temp > 0) die("--greedy and --temp %g contradict each other", a->temp);
    if (a->draft_wide && (!a->draft || strncmp(a->draft, "model:", 6)))
        die("--draft-wide %s: a wide drafter backs a drafter of another tokenizer: it needs --draft model:PATH",
            a->draft_wide);
    if (!a->temp && (a->top_p || a->top_k || a->seed_set))
        die("--top-p, --top-k and --seed choose among samples: they need --temp > 0 (the default is greedy)");
    if (!a->model && (cmd & C_MODEL)) a->model = default_model();
    if (!a->model && (cmd & C_MODEL)) die("--model DIR is required (no default model found)");
    if (cmd & C_SIZING) { /* a dense family's model (family.h) drafts; it is no target (tokenize reads it) */
        df_error fe = {0};
        const df_family *fam = family_of(a->model, &fe);
        if (fam && !fam->target)
            die("--model %s is a %s model: deltafin runs it as a drafter beside a K3 target (--draft model:%s); "
                "`deltafin tokenize --model %s` reads its tokenizer",
                a->model, fam->title, a->model, a->model);
    }
    if (cmd == C_RUN) check_run(a);
    if (cmd == C_CHAT && a->session) check_session_path(a->session);
    if (a->max_new_set == 0 && (a->chat || a->prompt)) a->max_new = 512;
    if (a->n_attach) render_attachments(a);
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

int drafting(const run_args *a) { return a->draft && strcmp(a->draft, "none"); }

int draft_rows(const run_args *a)
{
    int k = a->draft_max ? a->draft_max : 8;
    if (a->draft_k > k) k = a->draft_k;
    return k + 1;
}

size_t draft_share(const run_args *a, size_t total) { return a->draft_mem ? a->draft_mem : total / 8; }

int draft_same_tokenizer(const char *target, const char *draft, char *why, size_t n_why)
{
    tokenizer *tt = NULL, *td = NULL;
    df_error err = {0};
    if (tokenizer_load(target, &tt, &err))
        die("--draft model:%s: cannot read the target's tokenizer to compare with: %s", draft, err.msg);
    if (tokenizer_load(draft, &td, &err)) {
        tokenizer_free(tt);
        die("--draft model:%s: cannot read its tokenizer: %s", draft, err.msg);
    }
    uint8_t ft[32], fd[32];
    tokenizer_fingerprint(tt, ft);
    tokenizer_fingerprint(td, fd);
    int same = !memcmp(ft, fd, sizeof ft);
    if (!same && why) {
        int nt = tokenizer_n_vocab(tt), nd = tokenizer_n_vocab(td), id = 0;
        for (; id < nt && id < nd; id++) {
            size_t lt, ld;
            const char *bt = tokenizer_token_bytes(tt, id, &lt), *bd = tokenizer_token_bytes(td, id, &ld);
            if (lt != ld || memcmp(bt, bd, lt)) break;
        }
        snprintf(why, n_why, "its tokenizer is not the target's (%d ids against %d; id %d is the first that differs)",
                 nd, nt, id);
    }
    tokenizer_free(tt);
    tokenizer_free(td);
    return same;
}

/* --draft lookup:FILE: FILE's text in the target's ids, or, for a name
 * ending in .ids, the ids it lists (decimal, separated by commas or white
 * space: `--bench-json`'s "ids" of an earlier run, or tokenize's output). */
static df_drafter *open_lookup(const run_args *a, const char *spec, int vocab)
{
    const char *path = spec + 7;
    if (!*path) die("--draft lookup:FILE: no file named");
    char *text = NULL;
    size_t len = 0;
    df_error err = {0};
    if (read_small_file(path, &text, &len, (size_t)64 << 20, &err)) die("--draft %s: %s", spec, err.msg);
    int32_t *ids = NULL;
    size_t n = 0, cap = 0;
    size_t pl = strlen(path);
    if (pl > 4 && !strcmp(path + pl - 4, ".ids")) {
        cap = len / 2 + 1;
        ids = xmalloc(cap * sizeof *ids);
        for (size_t i = 0; i < len;) {
            if (text[i] == ',' || isspace((unsigned char)text[i])) {
                i++;
                continue;
            }
            if (!isdigit((unsigned char)text[i]))
                die("--draft %s: byte %zu is '%c': a .ids file lists decimal ids separated by commas or spaces", spec, i,
                    text[i]);
            long v = 0;
            size_t at = i;
            while (i < len && isdigit((unsigned char)text[i]) && v <= vocab) v = v * 10 + (text[i++] - '0');
            if (v >= vocab) die("--draft %s: id %ld (byte %zu) is outside the model's vocabulary (%d)", spec, v, at, vocab);
            ids[n++] = (int32_t)v;
        }
    } else {
        tokenizer *tk = NULL;
        if (tokenizer_load(a->model, &tk, &err) || tokenizer_encode(tk, text, len, 0, &ids, &n, &cap, &err))
            die("--draft %s: %s", spec, err.msg);
        tokenizer_free(tk);
    }
    free(text);
    df_drafter *d;
    if (df_drafter_open_lookup(ids, n, spec, &d, &err)) die("%s", err.msg);
    free(ids);
    return d;
}

df_drafter *open_drafter(const run_args *a, int vocab, int n_ctx)
{
    if (!drafting(a)) return NULL;
    /* auto: prompt lookup, which costs no model and no memory */
    const char *spec = !strcmp(a->draft, "auto") ? "ngram" : a->draft;
    df_drafter *d;
    df_error err = {0};
    int model = !strncmp(spec, "model:", 6) && spec[6], same = 1;
    if (model && !family_of(spec + 6, &err)) {
        fprintf(stderr, "deltafin: --draft %s: %s\n", spec, err.msg);
        exit(1);
    }
    /* a draft model of any family: with the target's tokenizer it drafts
     * the target's ids (draft.c), with another its drafts are translated
     * (draft_xtok.c) */
    if (model) same = draft_same_tokenizer(a->model, spec + 6, NULL, 0);
    if (a->draft_wide && (!model || same))
        die("--draft-wide %s: a wide drafter backs a drafter of another tokenizer (--draft model:PATH of a Qwen3 "
            "model), not --draft %s%s",
            a->draft_wide, spec, model ? ", which shares the target's tokenizer" : "");
    size_t total = a->mem ? a->mem : df_mem_budget_default();
    if (!same) {
        if (df_drafter_open_xtok(spec + 6, a->draft_wide, a->model, n_ctx, draft_share(a, total), a->draft_threads ? a->draft_threads : 1,
                                 &d, &err)) {
            fprintf(stderr, "deltafin: %s\n", err.msg);
            exit(1);
        }
        return d;
    }
    if (!strncmp(spec, "lookup:", 7)) return open_lookup(a, spec, vocab);
    /* a draft model runs on one thread unless --draft-threads: drafting is
     * latency-bound on small models, and a second worker pool's spinning
     * would compete with the target's on every pass */
    if (df_drafter_open(spec, draft_share(a, total), n_ctx, a->draft_threads ? a->draft_threads : 1, vocab, &d, &err)) {
        fprintf(stderr, "deltafin: %s\n", err.msg);
        exit(1);
    }
    return d;
}

void gen_from_args(gen_loop *g, const run_args *a, df_engine *eng, df_session *s, sampler *smp, df_drafter *dr)
{
    gen_opts go = {.draft_k = a->draft_k, .draft_max = a->draft_max};
    df_error err = {0};
    if (gen_init(g, eng, s, smp, dr, &go, &err)) {
        fprintf(stderr, "deltafin: %s\n", err.msg);
        exit(1);
    }
    spec_state_load(a, g);
}

void print_xtok_stats(const df_drafter *dr)
{
    xtok_stats x;
    if (df_drafter_xtok_stats(dr, &x)) return;
    fprintf(stderr,
            "deltafin: cross-tokenizer drafter: %llu proposals from %llu drafter tokens; %llu drafts did not translate "
            "at the history's tail, %llu histories ended inside a character, %llu drafts were cut at a partial "
            "character\n",
            (unsigned long long)x.proposals, (unsigned long long)x.drafter_tokens, (unsigned long long)x.untranslated,
            (unsigned long long)x.boundary, (unsigned long long)x.cut_char);
    if (x.wide)
        fprintf(stderr,
                "deltafin: wide drafter: asked for %llu proposals the first was unsure of, %llu of its proposals "
                "taken, %llu wide drafter tokens\n",
                (unsigned long long)x.wide_asked, (unsigned long long)x.wide_used, (unsigned long long)x.wide_tokens);
}

void print_draft_stats(const gen_stats *st)
{
    if (st->shadow_scored)
        fprintf(stderr,
                "deltafin: drafts scored without a pass (shadow): %llu proposals, %llu of %llu ids right (%.1f%%)\n",
                (unsigned long long)st->shadow_scored, (unsigned long long)st->shadow_right,
                (unsigned long long)st->shadow_proposed,
                st->shadow_proposed ? 100.0 * (double)st->shadow_right / (double)st->shadow_proposed : 0.0);
    if (!st->draft_passes && !st->proposed) {
        fprintf(stderr, "deltafin: drafts: none proposed (%llu decode passes)\n", (unsigned long long)st->passes);
        return;
    }
    fprintf(stderr,
            "deltafin: drafts: %llu proposed, %llu accepted (%.1f%%); %llu passes for %llu tokens (%.2f per pass), "
            "%llu with drafts; last k %d; %.1f KiB of experts read per token; %.3f s drafting\n",
            (unsigned long long)st->proposed, (unsigned long long)st->accepted,
            st->proposed ? 100.0 * (double)st->accepted / (double)st->proposed : 0.0, (unsigned long long)st->passes,
            (unsigned long long)st->emitted, st->passes ? (double)st->emitted / (double)st->passes : 0.0,
            (unsigned long long)st->draft_passes, st->last_k,
            st->emitted ? (double)st->expert_bytes / 1024.0 / (double)st->emitted : 0.0, st->draft_sec);
    if (st->guard_rounds)
        fprintf(stderr,
                "deltafin: drafts timed: %d round%s, last: %s (%.2f ms per token with drafts, %.2f without)\n",
                st->guard_rounds, st->guard_rounds == 1 ? "" : "s", st->guard_on ? "allowed" : "held off (slower)",
                st->guard_ms[1], st->guard_ms[0]);
}

df_engine *open_engine(const run_args *a)
{
    /* under mpirun, ranks 1..N-1 open the same model and compute experts
     * for rank 0 (engine.h, df_ranks_*); they write no file */
    run_args worker;
    int rank = df_ranks_rank();
    if (rank > 0) {
        worker = *a;
        worker.heat = worker.trace = worker.events = NULL;
        worker.stats = 0;
        a = &worker;
    }
    df_engine_opts eo;
    df_engine_opts_default(&eo);
    eo.n_threads = a->threads;
    eo.kernels = a->kernels;
    eo.backend = a->backend;
    eo.expert_cache_bytes = a->cache_bytes;
    eo.mem_budget = a->mem;
    eo.io_mode = a->io;
    eo.io_backend = a->io_backend;
    eo.io_depth = a->io_depth;
    eo.disk_cache_max = a->disk_cache_max;
    eo.plan_ctx = a->ctx_plan ? a->ctx_plan : a->ctx;
    eo.plan_ctx_serve = a->serve && !eo.plan_ctx;
    eo.plan_batch = a->batch;
    eo.cache_policy = a->policy;
    eo.trace_path = a->trace;
    eo.trace_jsonl = a->trace_jsonl;
    if (a->trace_lookahead && (!a->trace || a->trace_jsonl))
        die("--trace-lookahead needs --trace FILE in the binary format");
    eo.trace_lookahead = a->trace_lookahead;
    if ((a->attn_l1 || a->attn_h1 || a->attn_top) && !a->attn_path)
        die("--attn-layers, --attn-heads and --attn-top need --dump-attention FILE");
    eo.attn_path = a->attn_path;
    eo.attn_l0 = a->attn_l0, eo.attn_l1 = a->attn_l1, eo.attn_h0 = a->attn_h0, eo.attn_h1 = a->attn_h1;
    eo.attn_top = a->attn_top;
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
    eo.plan_checkpoints = a->checkpoints;
    eo.plan_sessions = a->plan_sessions;
    if (drafting(a)) {
        eo.plan_rollback = draft_rows(a);
        /* a draft model's memory comes out of the same budget */
        if (!strncmp(a->draft, "model:", 6)) {
            size_t total = a->mem ? a->mem : df_mem_budget_default();
            size_t share = draft_share(a, total);
            if (share >= total) die("--draft-mem %zu bytes leaves nothing of --mem %zu for the model", share, total);
            eo.mem_budget = total - share;
        }
    }
    df_engine *eng;
    df_error err = {0};
    if (rank > 0) {
        /* an experts-only engine for rank 0's batch: no trunk, a small
         * session, the budget to the expert cache, nothing preloaded that
         * another rank computes */
        int mb = 0;
        if (df_ranks_hello(&mb, &err)) {
            fprintf(stderr, "deltafin: %s\n", err.msg);
            exit(1);
        }
        eo.quiet = 1;
        eo.experts_only = 1;
        eo.plan_ctx = 16;
        eo.plan_ctx_serve = 0;
        eo.plan_batch = mb;
        eo.plan_rollback = eo.plan_checkpoints = 0;
        eo.preload = -1;
    } else if (df_ranks_size() > 1 && !eo.preload) {
        eo.preload = -1; /* rank 0 computes a share only */
    }
    if (df_engine_open(a->model, &eo, &eng, &err)) {
        fprintf(stderr, "deltafin: %scannot load model: %s\n", rank ? "rank: " : "", err.msg);
        exit(1);
    }
    if (rank > 0) {
        int rc = df_ranks_serve(eng, &err);
        if (rc) fprintf(stderr, "deltafin: %s\n", err.msg);
        df_engine_close(eng);
        df_ranks_finalize();
        exit(rc ? 1 : 0);
    }
    if (df_ranks_size() > 1) {
        df_plan p;
        df_engine_plan(eng, &p);
        if (df_ranks_attach(eng, a->heat, a->batch > p.max_batch ? a->batch : p.max_batch, &err)) {
            fprintf(stderr, "deltafin: %s\n", err.msg);
            exit(1);
        }
    }
    if (!a->stats) {
        /* the plan is always shown; --stats shows it in full */
        df_plan p;
        char line[1024];
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
    if (drafting(a)) so.rollback_rows = draft_rows(a);
    so.checkpoints = a->checkpoints;
    df_session *s;
    df_error err = {0};
    if (df_session_new(eng, &so, &s, &err)) {
        fprintf(stderr, "deltafin: %s\n", err.msg);
        exit(1);
    }
    return s;
}


/* The plan as one JSON object and a newline (plan --json; the server's GET /v1/plan):
 * ok, the budget, where the trunk goes, the expert cache, the reads per token; msg when not ok. */
static void json_str_field(FILE *out, const char *name, const char *msg)
{
    fprintf(out, ",\"%s\":\"", name);
    for (const char *c = msg; *c; c++) {
        if (*c == '"' || *c == '\\') fputc('\\', out);
        if ((unsigned char)*c >= 0x20) fputc(*c, out);
    }
    fputc('"', out);
}

void plan_json(FILE *out, const df_plan *p, int ok, const char *msg)
{
    fprintf(out, "{\"ok\":%s,\"budget\":%llu,\"trunk\":\"%s\",\"trunk_bytes\":%llu,\"embed_bytes\":%llu,"
           "\"trunk_used\":%llu,\"state_bytes\":%llu,\"scratch_bytes\":%llu,\"reserve_bytes\":%llu,"
           "\"vec_bytes\":%llu,\"cache_bytes\":%llu,\"cache_slots\":%llu,\"experts\":%llu,\"used\":%llu,"
           "\"ctx\":%d,\"trunk_read_per_token\":%llu,\"expert_read_cold\":%llu,\"expert_read_est\":%llu,"
           "\"resident_from\":%llu,\"mpi_bytes\":%llu,\"remote_bytes\":%llu,\"trunk_layers\":%d,"
           "\"trunk_resident_layers\":%d,\"trunk_resident_bytes\":%llu,\"whole_stream_read_per_token\":%llu",
           ok ? "true" : "false", (unsigned long long)p->budget,
           p->trunk_mode == DF_TRUNK_RESIDENT ? "resident" : p->trunk_resident_n ? "partial" : "streamed",
           (unsigned long long)p->trunk_bytes,
           (unsigned long long)p->embed_bytes, (unsigned long long)p->trunk_used, (unsigned long long)p->state_bytes,
           (unsigned long long)p->scratch_bytes, (unsigned long long)p->reserve_bytes,
           (unsigned long long)p->vec_bytes, (unsigned long long)p->cache_bytes,
           (unsigned long long)(p->n_slots + p->n_transient), (unsigned long long)p->n_experts,
           (unsigned long long)p->used, p->n_ctx, (unsigned long long)p->trunk_read_per_token,
           (unsigned long long)p->expert_read_cold, (unsigned long long)p->expert_read_est,
           (unsigned long long)p->resident_from, (unsigned long long)p->mpi_bytes,
           (unsigned long long)p->remote_bytes, p->trunk_layers, p->trunk_resident_n,
           (unsigned long long)p->trunk_resident_bytes,
           (unsigned long long)(p->trunk_mode == DF_TRUNK_STREAMED ? p->alt_stream_all_read : 0));
    fprintf(out, ",\"checkpoints\":%d,\"checkpoint_bytes\":%llu", p->checkpoints, (unsigned long long)p->checkpoint_bytes);
    char why[320];
    df_plan_ctx_reason(p, why, sizeof why);
    if (*why) json_str_field(out, "ctx_reason", why);
    if (!ok) json_str_field(out, "error", msg);
    fprintf(out, "}\n");
}
