/* cli.h - shared by the command-line front end's files (cli.c: commands
 * and options; cli_chat.c: text generation, the chat REPL, tokenize).
 * Front-end only: nothing below L5 includes it. */
#ifndef DF_CLI_H
#define DF_CLI_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include "engine.h"

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
} run_args;

_Noreturn void die(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void usage(FILE *f);
long parse_long(const char *s, const char *flag, long lo, long hi);
size_t parse_size(const char *s, const char *flag);
int parse_ids(const char *s, int32_t **out);
double now(void);
void parse_common(int argc, char **argv, run_args *a);
df_engine *open_engine(const run_args *a);

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

#endif
