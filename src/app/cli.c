/* cli.c - the deltafin command line (front end; `deltafin --help` lists
 * the commands; the run options and their tables are options.c's).
 *
 * Owns: main, `run --prompt-ids` (generation), `info` and `plan` (from
 * headers alone), iobench/place/cachesim, and the outputs shared with cli_chat.c:
 * the logits dump (rows appended to FILE.tmp, renamed into place on
 * success, so an existing file is never left half-written), the bench JSON
 * line, the --stats lines and the prompt's progress.  May exit; nothing
 * below it does.
 */
#define _GNU_SOURCE
#include "cli.h"
#include "engine.h"
#include "plan.h"
#include "server.h"
#include "util.h"

#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

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
    double dt = now_sec() - ps->t0;
    double eta = done > 0 ? dt * (total - done) / done : 0.0;
    fprintf(stderr, "\rdeltafin: prompt %d/%d positions, %.1f MiB read, %.0f s left   ", done, total,
            (proc_read_bytes() - ps->rb0) / 1048576.0, eta);
    fflush(stderr);
}

typedef struct dump_rows {
    logits_sink *k;
    float *last;
    size_t V;
    int failed;
} dump_rows;

/* a chunk of the prompt's rows: into the dump, the last one kept */
static int dump_each(void *ctx, const float *rows, int n)
{
    dump_rows *d = ctx;
    if (sink_write(d->k, rows, (size_t)n)) return d->failed = 1;
    memcpy(d->last, rows + (size_t)(n - 1) * d->V, d->V * sizeof *d->last);
    return 0;
}

int eval_prompt(df_session *s, const int32_t *ids, int n, int batch, float *last, float *rows, size_t V,
                logits_sink *k, df_error *err)
{
    if (!k->f) {
        progress_state ps = {now_sec(), proc_read_bytes()};
        int show = isatty(2) && n > df_session_max_batch(s);
        if (show) df_session_set_progress(s, show_progress, &ps);
        int rc = df_session_eval(s, ids, n, last, 0, err);
        if (show) {
            df_session_set_progress(s, NULL, NULL);
            fprintf(stderr, "\r\033[K");
        }
        return rc;
    }
    (void)batch;
    dump_rows dr = {.k = k, .last = last, .V = V};
    if (df_session_eval_each(s, ids, n, rows, dump_each, &dr, err)) {
        if (dr.failed) {
            err->code = DF_ERR_IO;
            snprintf(err->msg, sizeof err->msg, "writing the --dump-logits file failed");
        }
        return -1;
    }
    return 0;
}

int session_resume(gen_loop *g, df_session *s, const char *path, const int32_t *prompt, int n_prompt)
{
    if (access(path, F_OK) != 0) return 0;
    int cap = df_session_n_ctx(s), n = 0;
    int32_t *ids = malloc((size_t)cap * sizeof *ids);
    df_error err = {0};
    if (!ids || df_session_load(s, path, ids, cap, &n, &err)) {
        fprintf(stderr, "deltafin: --session %s: %s\n", path, ids ? err.msg : "out of memory");
        free(ids);
        return -1;
    }
    int held = n;
    if (prompt) {
        int l = 0;
        while (l < n && l < n_prompt && ids[l] == prompt[l]) l++;
        /* an extension is resumed; anything else starts over */
        held = l == n && n < n_prompt ? n : 0;
        if (!held) {
            fprintf(stderr, "deltafin: --session %s: the prompt does not extend its %d tokens (they part at %d); "
                            "evaluating it whole\n", path, n, l);
            gen_reset(g);
            free(ids);
            return 0;
        }
    }
    gen_resume(g, ids, (size_t)n);
    if (prompt)
        fprintf(stderr, "deltafin: --session %s: %d tokens resumed; %d of the prompt's %d to evaluate\n", path, n,
                n_prompt - n, n_prompt);
    else
        fprintf(stderr, "deltafin: --session %s: %d tokens resumed\n", path, n);
    free(ids);
    return held;
}

int session_store(gen_loop *g, df_session *s, const char *path)
{
    df_error err = {0};
    size_t n;
    const int32_t *h = gen_history(g, &n);
    if (gen_settle(g, 1, &err) || df_session_save(s, h, (int)n, path, &err)) {
        fprintf(stderr, "deltafin: --session %s: %s\n", path, err.msg);
        return -1;
    }
    return 0;
}

void print_bench_json(df_engine *eng, int n_prompt, double prefill_s, unsigned long long prefill_bytes, int n_gen,
                      double decode_s, unsigned long long decode_bytes, const int32_t *gen, const gen_stats *gs)
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
    printf("],\"draft_proposed\":%llu,\"draft_accepted\":%llu,\"verify_passes\":%llu,\"decode_passes\":%llu,"
           "\"decode_expert_bytes\":%llu,\"ranks\":%d,\"rank_expert_calls\":[",
           (unsigned long long)gs->proposed, (unsigned long long)gs->accepted, (unsigned long long)gs->draft_passes,
           (unsigned long long)gs->passes, (unsigned long long)gs->expert_bytes, df_ranks_size());
    /* experts computed by each rank (one process: the expert computations of its misses and hits) */
    df_rank_stats rs[256];
    int nr = df_ranks_stats(eng, rs, 256);
    if (!nr) printf("%llu", (unsigned long long)(st.expert_hits + st.expert_misses));
    for (int r = 0; r < nr; r++) printf("%s%llu", r ? "," : "", (unsigned long long)rs[r].expert_calls);
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
    if (st.streamed)
        fprintf(stderr,
                "deltafin: streamed experts: %llu fetched (%.1f MiB in %.2f s, %llu retries); of those bytes %.1f MiB "
                "in %llu second copies fetched to compare (no SHA-256), %llu experts whose copies differed; disk "
                "cache: %llu reads served, %llu evicted\n",
                (unsigned long long)st.remote_fetches, (double)st.remote_bytes / (1 << 20), st.remote_sec,
                (unsigned long long)st.remote_retries, (double)st.remote_compare_bytes / (1 << 20),
                (unsigned long long)st.remote_compare_fetches, (unsigned long long)st.remote_copy_mismatches,
                (unsigned long long)st.disk_cache_hits, (unsigned long long)st.disk_cache_evictions);
    df_rank_stats rs[256];
    int nr = df_ranks_stats(eng, rs, 256);
    double per = n_prompt + n_gen > 0 ? 1024.0 * (n_prompt + n_gen) : 1.0;
    for (int r = 0; r < nr; r++) {
        if (!r)
            fprintf(stderr, "deltafin: rank 0 (front end): %llu experts computed, %.1f MiB of experts read, %.2f s "
                            "waiting for the other ranks, peak %.1f MiB resident\n",
                    (unsigned long long)rs[0].expert_calls, (double)rs[0].expert_bytes_read / (1 << 20), rs[0].wait_sec,
                    rs[0].peak_rss_kb / 1024.0);
        else
            fprintf(stderr,
                    "deltafin: rank %d: %llu experts computed (%.2f s), %.1f MiB of experts read, peak %.1f MiB "
                    "resident; %.1f KiB sent to it and %.1f KiB back per token\n",
                    r, (unsigned long long)rs[r].expert_calls, rs[r].expert_sec,
                    (double)rs[r].expert_bytes_read / (1 << 20), rs[r].peak_rss_kb / 1024.0,
                    (double)rs[r].bytes_sent / per, (double)rs[r].bytes_received / per);
    }
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
    sampler smp;
    sampler_from_args(&smp, &a, info.vocab);
    df_drafter *dr = open_drafter(&a, info.vocab, ctx);
    gen_loop gl;
    gen_from_args(&gl, &a, eng, s, &smp, dr);
    unsigned long long rb0 = proc_read_bytes();
    double t0 = now_sec();
    int held = a.session ? session_resume(&gl, s, a.session, prompt, n_prompt) : 0;
    if (held < 0) return 1;
    if (held ? gen_feed(&gl, prompt + held, (size_t)(n_prompt - held), &err)
             : eval_prompt(s, prompt, n_prompt, batch, last, rows, V, &sink, &err)) {
        fprintf(stderr, "deltafin: %s\n", err.msg);
        sink_abort(&sink);
        return 1;
    }
    if (!held) gen_prime(&gl, prompt, (size_t)n_prompt, last);
    double t1 = now_sec();
    unsigned long long rb1 = proc_read_bytes();
    int n_gen = 0, full = 0;
    /* the logits after each generated token are written when the next one
     * is chosen from them, and after the last one once it is evaluated */
    for (; n_gen < a.max_new; n_gen++) {
        if (n_prompt + n_gen >= ctx) {
            full = 1;
            break;
        }
        int32_t next;
        if (gen_next(&gl, &next, &err)) {
            fprintf(stderr, "deltafin: %s\n", err.msg);
            sink_abort(&sink);
            return 1;
        }
        if (n_gen && sink_write(&sink, gen_logits(&gl), 1)) {
            sink_abort(&sink);
            return 1;
        }
        gen[n_gen] = next;
        if (a.stop_eos && next == info.eos_id) {
            n_gen++;
            break;
        }
    }
    if (n_gen && (gen_settle(&gl, 1, &err) || sink_write(&sink, gen_logits(&gl), 1))) {
        fprintf(stderr, "deltafin: %s\n", err.msg[0] ? err.msg : "writing the --dump-logits file failed");
        sink_abort(&sink);
        return 1;
    }
    double t2 = now_sec();
    unsigned long long rb2 = proc_read_bytes();
    if (full)
        fprintf(stderr, "deltafin: the context is full (--ctx %d): stopped after %d of %d new tokens\n", ctx, n_gen,
                a.max_new);
    if (a.bench_json)
        print_bench_json(eng, n_prompt, t1 - t0, rb1 - rb0, n_gen, t2 - t1, rb2 - rb1, gen, &gl.st);
    if (a.print_ids) {
        for (int i = 0; i < n_gen; i++) printf("%s%d", i ? "," : "", gen[i]);
        printf("\n");
        fflush(stdout);
    }
    if (sink_commit(&sink)) return 1;
    if (a.session && session_store(&gl, s, a.session)) return 1;
    if (a.stats) print_run_stats(eng, n_prompt, t1 - t0, n_gen, t2 - t1);
    if (a.stats && dr) print_draft_stats(&gl.st);
    gen_free(&gl);
    df_drafter_free(dr);
    sampler_free(&smp);
    free(gen);
    free(rows);
    free(last);
    free(prompt);
    df_session_free(s);
    df_engine_close(eng);
    return 0;
}

long proc_peak_rss_kb(void) { return peak_rss_kb(); }

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
    o->serve = a->serve;
    o->n_sessions = a->plan_sessions;
    o->checkpoints = a->serve ? -1 : 0; /* serve's default rule */
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

static void json_str_field(const char *name, const char *msg)
{
    printf(",\"%s\":\"", name);
    for (const char *c = msg; *c; c++) {
        if (*c == '"' || *c == '\\') putchar('\\');
        if ((unsigned char)*c >= 0x20) putchar(*c);
    }
    putchar('"');
}

static void plan_json(const df_plan *p, int ok, const char *msg)
{
    printf("{\"ok\":%s,\"budget\":%llu,\"trunk\":\"%s\",\"trunk_bytes\":%llu,\"embed_bytes\":%llu,"
           "\"trunk_used\":%llu,\"state_bytes\":%llu,\"scratch_bytes\":%llu,\"reserve_bytes\":%llu,"
           "\"vec_bytes\":%llu,\"cache_bytes\":%llu,\"cache_slots\":%llu,\"experts\":%llu,\"used\":%llu,"
           "\"ctx\":%d,\"trunk_read_per_token\":%llu,\"expert_read_cold\":%llu,\"expert_read_est\":%llu,"
           "\"resident_from\":%llu,\"mpi_bytes\":%llu,\"remote_bytes\":%llu",
           ok ? "true" : "false", (unsigned long long)p->budget,
           p->trunk_mode == DF_TRUNK_STREAMED ? "streamed" : "resident", (unsigned long long)p->trunk_bytes,
           (unsigned long long)p->embed_bytes, (unsigned long long)p->trunk_used, (unsigned long long)p->state_bytes,
           (unsigned long long)p->scratch_bytes, (unsigned long long)p->reserve_bytes,
           (unsigned long long)p->vec_bytes, (unsigned long long)p->cache_bytes,
           (unsigned long long)(p->n_slots + p->n_transient), (unsigned long long)p->n_experts,
           (unsigned long long)p->used, p->n_ctx, (unsigned long long)p->trunk_read_per_token,
           (unsigned long long)p->expert_read_cold, (unsigned long long)p->expert_read_est,
           (unsigned long long)p->resident_from, (unsigned long long)p->mpi_bytes,
           (unsigned long long)p->remote_bytes);
    printf(",\"checkpoints\":%d,\"checkpoint_bytes\":%llu", p->checkpoints, (unsigned long long)p->checkpoint_bytes);
    char why[320];
    df_plan_ctx_reason(p, why, sizeof why);
    if (*why) json_str_field("ctx_reason", why);
    if (!ok) json_str_field("error", msg);
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
        printf("%-10s %-9s %11s %11s %13s %13s %7s %16s %16s%s\n", "--mem", "trunk", "trunk GiB", "cache GiB",
               "experts held", "context GiB", "chunk", "trunk read/tok", "experts read/tok",
               a.serve && !a.ctx ? "  context" : "");
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
            printf("%-10s %-9s %11.2f %11.2f %13s %13.3f %7d %12.2f GiB %12.2f GiB", mem,
                   p.trunk_mode == DF_TRUNK_STREAMED ? "streamed" : "resident", gib_(p.trunk_used),
                   gib_(p.cache_bytes), held, gib_(p.state_bytes), p.max_batch, gib_(p.trunk_read_per_token),
                   gib_(p.expert_read_est));
            if (a.serve && !a.ctx) printf("  %7d", p.n_ctx);
            printf("\n");
        }
        bad |= rc != 0;
        cold = p.expert_read_cold;
    }
    if (a.ranks > 1 && !a.json) {
        /* mpirun -np N: the default round-robin partition, each rank at this --mem */
        df_plan_opts o;
        plan_opts_from(&a, &o, a.mem ? a.mem : df_mem_budget_default());
        df_plan p;
        df_model_info info;
        df_error err = {0};
        if (df_plan_model(a.model, &o, &p, &info, &err) && err.code != DF_ERR_NOMEM) {
            fprintf(stderr, "deltafin: %s\n", err.msg);
            return 1;
        }
        uint64_t pairs = p.n_experts;
        printf("over %d ranks (mpirun -np %d; experts round robin by (layer, expert), or by heat with --heat), each "
               "with --mem %.0f GiB:\n",
               a.ranks, a.ranks, gib_(p.budget));
        for (int r = 0; r < a.ranks; r++) {
            uint64_t mine = pairs / (uint64_t)a.ranks + ((uint64_t)r < pairs % (uint64_t)a.ranks);
            uint64_t held = p.n_slots < mine ? p.n_slots : mine;
            printf("  rank %d%s: %llu (layer, expert) pairs, %.2f GiB; its expert cache holds %llu of them (%s)\n", r,
                   r ? "" : " (front end, trunk)", (unsigned long long)mine,
                   gib_(mine * (uint64_t)info.expert_bytes), (unsigned long long)held,
                   held == mine ? "its whole share in RAM" : "the rest streams from its own disk");
        }
    }
    if (!a.json && !a.mem && a.serve && !a.ctx)
        printf("context: serve's default at each --mem (64K where the expert cache keeps one token's experts "
               "in every MoE layer, else halved down to 4096; --serve --mem SIZE says why)\n");
    else if (!a.json && !a.mem)
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
    double *last = ctx, t = now_sec();
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

static int dispatch(int argc, char **argv);

int main(int argc, char **argv)
{
    df_ranks_init(&argc, &argv); /* under mpirun: ranks > 0 become expert workers in open_engine */
    int rc = dispatch(argc, argv);
    df_ranks_finalize();
    return rc;
}

static int dispatch(int argc, char **argv)
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
    if (!strcmp(argv[1], "setup")) return cmd_setup(argc, argv);
    if (!strcmp(argv[1], "doctor")) return cmd_doctor(argc, argv);
    if (!strcmp(argv[1], "bench")) return cmd_bench(argc, argv);
    die("unknown command \"%s\"", argv[1]);
}
