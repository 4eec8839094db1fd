/* cli.h - shared by the command-line front end's files (cli.c: commands;
 * cli_common.c: what they share; cli_chat.c: text generation, the chat
 * REPL, tokenize, perplexity; cli_bench.c).  The run options are options.h's (the server
 * shares them); the server does not include this file. */
#ifndef DF_CLI_H
#define DF_CLI_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include "options.h"

/* cli_common.c */
/* --dump-logits: rows appended to FILE.tmp, renamed into place on success. */
typedef struct {
    FILE *f;
    const char *path;
    char tmp[4096];
    size_t V, rows;
} logits_sink;

int sink_open(logits_sink *k, const char *path, size_t V);
int sink_write(logits_sink *k, const float *rows, size_t n);
int sink_commit(logits_sink *k);
void sink_abort(logits_sink *k);
/* The prompt; with a sink, in batches with every row written; *last gets
 * the last row.  rows: [batch][V] scratch (sink only). */
int eval_prompt(df_session *s, const int32_t *ids, int n, int batch, float *last, float *rows, size_t V,
                logits_sink *k, df_error *err);
void print_bench_json(df_engine *eng, int n_prompt, double prefill_s, unsigned long long prefill_bytes, int n_gen,
                      double decode_s, unsigned long long decode_bytes, const int32_t *gen, const gen_stats *gs);
void print_run_stats(df_engine *eng, int n_prompt, double prefill_s, int n_gen, double decode_s);
/* --session FILE: when it exists, load it (an unreadable, foreign or
 * corrupted file is an error: -1, printed) and keep the part of the prompt
 * it holds (the loop's history becomes its ids); returns how many prompt
 * ids are held, 0 when the file is absent or the prompt does not extend
 * it (the session then starts empty).  prompt NULL: resume whatever it
 * holds (chat). */
int session_resume(gen_loop *g, df_session *s, const char *path, const int32_t *prompt, int n_prompt);
/* Save the loop's history and the session to FILE (the last token evaluated). */
int session_store(gen_loop *g, df_session *s, const char *path);


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
/* setup.c: `deltafin setup --full | --check` */
int cmd_setup(int argc, char **argv);
/* doctor.c: `deltafin doctor`, what this machine can do with a model */
int cmd_doctor(int argc, char **argv);
/* cli_common.c: --slots LIST (cache sizes in experts; NULL: 16,64,256,1024), at most 64 */
int parse_slots(const char *list, int slots[64]);
/* cli_trace.c */
int cmd_trace(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_perplexity(int argc, char **argv);
/* quantize.c: `deltafin quantize --trunk q8_0 IN.gguf OUT.gguf` */
int cmd_quantize(int argc, char **argv);

/* cli_kld.c: perplexity's KL-divergence mode (a base model's log-softmax
 * per scored row in a file, compressed; read back against another model) */
typedef struct kld_writer {
    FILE *f;
    int V;
    double *lp;
    uint16_t *q;
} kld_writer;
typedef struct kld_reader {
    FILE *f;
    int V;
    double *lp, *mlp;
    uint16_t *q;
} kld_reader;
uint64_t kld_ids_hash(const int32_t *ids, size_t n);
int kld_writer_open(kld_writer *w, const char *path, int V, int W, const int32_t *ids, size_t n);
int kld_writer_row(kld_writer *w, const float *logits);
int kld_writer_close(kld_writer *w);
/* -1 with why: unreadable, not such a file, another vocabulary, text or window */
int kld_reader_open(kld_reader *r, const char *path, int V, int W, const int32_t *ids, size_t n, char *why,
                    size_t nwhy);
int kld_reader_row(kld_reader *r, const float *logits, int32_t next, double *kl, double *base_nll, int *same_top);
void kld_reader_close(kld_reader *r);
/* kls: [n] per-token KL (sorted in place) */
void kld_report(const char *file, double *kls, size_t n, uint64_t same_top, double nll, double base_nll, int json);

#endif
