/* options.h - the run options every front end shares (L5; see options.c):
 * run_args, parse_common with its per-command tables, the default model,
 * the context a run needs, opening the engine and session, the sampler the
 * options ask for.  Included by cli.c, cli_chat.c, cli_bench.c and the
 * server; it includes no front end. */
#ifndef DF_OPTIONS_H
#define DF_OPTIONS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include "engine.h"
#include "draft.h"
#include "sampler.h"

typedef struct {
    const char *model, *prompt_ids, *dump, *kernels, *backend, *io, *io_backend, *policy, *trace, *slots, *heat, *events;
    int max_new, max_new_set, print_ids, threads, ctx, batch, stop_eos, stats, io_depth, prefault, no_prefetch,
        prefetch_k;
    size_t cache_bytes, mem;
    uint64_t disk_cache_max;
    int ranks;      /* plan --ranks N: the experts' partition over N MPI ranks */ /* --disk-cache-max: a streamed install's disk cache (0: setup's) */
    const char *xpaths[8];
    int n_xpaths, stripe;
    /* text and chat */
    const char *prompt, *system, *effort, *decode, *text;
    const char *json_schema;  /* run --json-schema FILE: the reply is JSON valid against it (implies --chat) */
    const char *prompt_file; /* --prompt-file FILE (- = standard input): read into prompt */
    const char *attach[16];  /* --attach FILE (repeatable): documents before the first user text */
    int n_attach;
    char *attach_text;       /* the documents rendered (document.c), NULL without --attach */
    int chat, no_think, special;
    int trunk_stream;
    int trace_jsonl; /* --trace-format jsonl */
    int trace_lookahead; /* --trace-lookahead D */
    const char *attn_path; /* --dump-attention FILE */
    int attn_l0, attn_l1, attn_h0, attn_h1, attn_top;
    int preload;    /* --preload: 1 on, -1 off, 0 auto */
    int bench_json; /* run: one JSON line of timings and disk reads (bench --vs-llama) */
    int ctx_plan;   /* the context the engine is planned for (context_for), 0 = --ctx or the default */
    const char *file; /* perplexity: the text file */
    int window;     /* perplexity: positions per window */
    const char *kld_base;   /* perplexity --kl-divergence BASE: a base model, or a --save-logits file */
    const char *save_logits; /* perplexity --save-logits FILE: the base's rows for a later --kl-divergence */
    const char *trunk_type;  /* plan --trunk bf16|f16|q8_0: a config.json's what-if */
    double disk_gbps[4];     /* plan --disk-gbps 7,28: projected tok/s at these read speeds */
    int n_disk_gbps;
    int json;       /* plan, perplexity: machine-readable output */
    int greedy, top_k, seed_set;  /* sampling (sampler.h): --greedy, --temp, --top-p, --top-k, --seed */
    double temp, top_p;
    uint64_t seed;
    /* speculative decoding (generate.h, draft.h) */
    const char *draft;   /* --draft none|ngram|suffix|model:PATH|auto (NULL = none) */
    int draft_max, draft_k;
    size_t draft_mem;    /* a draft model's share of --mem (0 = an eighth) */
    int draft_threads;   /* --draft-threads (0: one) */
    const char *draft_wide; /* --draft-wide PATH: a second cross-tokenizer drafter, asked when the first is unsure */
    const char *spec_state; /* --spec-state FILE: what the drafts' cost model and guard learned, kept
                               across runs (gen_memory, spec_state.c) */
    int checkpoints;     /* conversation checkpoints per session (serve --checkpoints) */
    int plan_sessions;   /* sessions planned before the expert cache (serve, plan --parallel N; 0 = 1) */
    int serve;           /* without --ctx, serve's default context (plan.c plan_serve_ctx): serve,
                            plan --serve */
    const char *session; /* run, chat: --session FILE */
} run_args;

_Noreturn void die(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void usage(FILE *f);
long parse_long(const char *s, const char *flag, long lo, long hi);
double parse_double(const char *s, const char *flag, double lo, double hi);
/* The sampler the run options ask for (greedy unless --temp > 0; without
 * --seed a time-based seed, printed so the run can be repeated). */
void sampler_from_args(sampler *smp, const run_args *a, int vocab);
size_t parse_size(const char *s, const char *flag);
/* Token ids separated by commas and/or white space; "@FILE" reads them from
 * FILE ("@-": standard input).  Dies naming the flag (and file) on error. */
int parse_ids(const char *s, const char *flag, int32_t **out);
/* A whole prompt file (path "-": standard input), NUL-terminated; dies
 * naming the flag and file when it cannot be read or is not text. */
char *read_prompt_file(const char *path, const char *flag, size_t *len);
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
/* Whether --draft asks for drafts; the drafter it names (NULL for none;
 * exits with the error), for a target of this vocabulary and context. */
int drafting(const run_args *a);
/* The rollback rows a session needs for --draft: one step's drafts + 1. */
int draft_rows(const run_args *a);
/* A draft model's share of the total memory: --draft-mem, else an eighth. */
size_t draft_share(const run_args *a, size_t total);
/* 1 when the draft model's tokenizer is the target's (the fingerprints of
 * their tables: it drafts the target's ids), 0 when not (its drafts are
 * translated), with why (may be NULL) naming the first id that differs;
 * exits naming the file when either cannot be read. */
int draft_same_tokenizer(const char *target, const char *draft, char *why, size_t n_why);
df_drafter *open_drafter(const run_args *a, int vocab, int n_ctx);
/* gen_init with the --draft-k / --draft-max options (exits on error). */
void gen_from_args(gen_loop *g, const run_args *a, df_engine *eng, df_session *s, sampler *smp, df_drafter *dr);
/* The drafting counters of a run, one line on stderr (--stats). */
void print_draft_stats(const gen_stats *st);
/* A cross-tokenizer drafter's counters (draft_xtok.h); nothing for others. */
void print_xtok_stats(const df_drafter *dr);

/* The plan as one JSON object and a newline (plan --json, serve's GET /v1/plan); msg: why not ok. */
void plan_json(FILE *out, const df_plan *p, int ok, const char *msg);

#endif
