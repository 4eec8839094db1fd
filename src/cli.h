/* cli.h - shared by the command-line front end's files (cli.c: commands,
 * option tables, shared outputs; cli_chat.c: text generation, the chat
 * REPL, tokenize, perplexity; cli_bench.c; server.c takes the run options
 * from parse_common).  Front-end only: nothing below L5 includes it. */
#ifndef DF_CLI_H
#define DF_CLI_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include "engine.h"
#include "sampler.h"

typedef struct {
    const char *model, *prompt_ids, *dump, *kernels, *io, *io_backend, *policy, *trace, *slots, *heat, *events;
    int max_new, max_new_set, print_ids, threads, ctx, batch, stop_eos, stats, io_depth, prefault, no_prefetch,
        prefetch_k;
    size_t cache_bytes, mem;
    const char *xpaths[8];
    int n_xpaths, stripe;
    /* text and chat */
    const char *prompt, *system, *effort, *decode, *text;
    int chat, no_think, special;
    int trunk_stream;
    int ctx_cap;   /* the session's context capacity (set when it is created) */
    int preload;    /* --preload: 1 on, -1 off, 0 auto */
    int bench_json; /* run: one JSON line of timings and disk reads (bench --vs-llama) */
    int ctx_plan;   /* the context the engine is planned for (context_for), 0 = --ctx or the default */
    const char *file; /* perplexity: the text file */
    int window;     /* perplexity: positions per window */
    int json;       /* plan, perplexity: machine-readable output */
    int greedy, top_k, seed_set;  /* sampling (sampler.h): --greedy, --temp, --top-p, --top-k, --seed */
    double temp, top_p;
    uint64_t seed;
} run_args;

/* --dump-logits: rows appended to FILE.tmp, renamed into place on success. */
typedef struct {
    FILE *f;
    const char *path;
    char tmp[4096];
    size_t V, rows;
} logits_sink;

_Noreturn void die(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void usage(FILE *f);
long parse_long(const char *s, const char *flag, long lo, long hi);
double parse_double(const char *s, const char *flag, double lo, double hi);
/* The sampler the run options ask for (greedy unless --temp > 0; without
 * --seed a time-based seed, printed so the run can be repeated). */
void sampler_from_args(sampler *smp, const run_args *a, int vocab);
size_t parse_size(const char *s, const char *flag);
int parse_ids(const char *s, const char *flag, int32_t **out);
double now(void);
void parse_common(int argc, char **argv, run_args *a);
/* The default --model (the bundled model beside the executable), or NULL. */
const char *default_model(void);
/* The session's context for a prompt of n_prompt ids: --ctx (refused when
 * the prompt does not fit; generation stops when it is full) or prompt +
 * --max-new (at least the default); stored in a->ctx_plan for open_engine. */
int context_for(run_args *a, int n_prompt);
/* Open the engine planned for a->ctx_plan (exits with the error); prints
 * the plan's one-line summary (the full plan with --stats). */
df_engine *open_engine(const run_args *a);
df_session *open_session(df_engine *eng, const run_args *a);
int sink_open(logits_sink *k, const char *path, size_t V);
int sink_write(logits_sink *k, const float *rows, size_t n);
int sink_commit(logits_sink *k);
void sink_abort(logits_sink *k);
/* The prompt; with a sink, in batches with every row written; *last gets
 * the last row.  rows: [batch][V] scratch (sink only). */
int eval_prompt(df_session *s, const int32_t *ids, int n, int batch, float *last, float *rows, size_t V,
                logits_sink *k, df_error *err);
void print_bench_json(df_engine *eng, int n_prompt, double prefill_s, unsigned long long prefill_bytes, int n_gen, double decode_s,
                      unsigned long long decode_bytes, const int32_t *gen);
void print_run_stats(df_engine *eng, int n_prompt, double prefill_s, int n_gen, double decode_s);

/* Bytes this process has read from storage so far (/proc/self/io read_bytes:
 * page-cache misses, mmap faults and O_DIRECT reads alike); 0 if unknown. */
unsigned long long proc_read_bytes(void);
/* This process's peak resident set since its exec (/proc/self/status
 * VmHWM, KiB), or -1.  Unlike a parent's wait4 ru_maxrss, it does not
 * include what the forking parent had resident before the exec. */
long proc_peak_rss_kb(void);

/* cli_bench.c */
int cmd_bench(int argc, char **argv);

/* cli_chat.c */
int run_text(run_args *a);
int cmd_chat(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_perplexity(int argc, char **argv);

#endif
