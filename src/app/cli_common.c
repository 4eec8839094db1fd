/* cli_common.c - what the command line's commands (cli.c, cli_chat.c,
 * cli_bench.c) share: the logits dump (rows appended to FILE.tmp, renamed
 * into place on success, so an existing file is never left half-written),
 * the prompt's evaluation with it and its progress on a terminal,
 * --session's resume and store, the bench JSON line, the --stats lines,
 * and this process's reads and peak memory from /proc.  Calls no command.
 */
#define _GNU_SOURCE
#include "cli.h"
#include "engine.h"
#include "util.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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
    df_model_info mi;
    df_engine_info(eng, &mi);
    printf("{\"engine\":\"deltafin\",\"trunk\":\"%s\",\"experts\":\"%s\",\"prompt\":%d,\"prefill_s\":%.6f,\"prefill_tps\":%.4f,"
           "\"prefill_read_bytes\":%llu,\"prefill_chunk\":%d,\"prefill_unique_experts\":%llu,"
           "\"prefill_expert_reads\":%llu,\"prefill_expert_bytes\":%llu,\"decode_steps\":%d,\"decode_s\":%.6f,"
           "\"decode_tps\":%.4f,\"decode_read_bytes\":%llu,\"peak_rss_kb\":%ld,\"ids\":[",
           mi.trunk, mi.experts, n_prompt, prefill_s, prefill_s > 0 ? n_prompt / prefill_s : 0.0, prefill_bytes, st.prompt_chunk,
           (unsigned long long)st.prompt_unique_experts, (unsigned long long)st.prompt_expert_reads,
           (unsigned long long)st.prompt_expert_bytes, n_gen, decode_s,
           n_gen && decode_s > 0 ? n_gen / decode_s : 0.0, decode_bytes, proc_peak_rss_kb());
    for (int i = 0; i < n_gen; i++) printf("%s%d", i ? "," : "", gen[i]);
    printf("],\"kernels\":\"%s\",\"trunk_flops_per_position\":%llu,\"expert_flops_per_position\":%llu,"
           "\"weight_bytes_per_token\":%llu",
           mi.kernels, (unsigned long long)mi.trunk_flops_per_position, (unsigned long long)mi.expert_flops_per_position,
           (unsigned long long)mi.weight_bytes_per_token);
    printf(",\"draft_proposed\":%llu,\"draft_accepted\":%llu,\"verify_passes\":%llu,\"decode_passes\":%llu,"
           "\"first_draft_pass\":%lld,\"decode_expert_bytes\":%llu,\"ranks\":%d,\"rank_expert_calls\":[",
           (unsigned long long)gs->proposed, (unsigned long long)gs->accepted, (unsigned long long)gs->draft_passes,
           (unsigned long long)gs->passes, (long long)gs->first_draft_pass, (unsigned long long)gs->expert_bytes,
           df_ranks_size());
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

/* --slots LIST for cachesim and trace cache (cli.h) */
int parse_slots(const char *list, int slots[64])
{
    int n = 0;
    const char *p = list ? list : "16,64,256,1024";
    while (*p && n < 64) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < 1 || v > (1 << 24)) die("--slots: bad cache size near \"%s\"", p);
        slots[n++] = (int)v;
        p = *end == ',' ? end + 1 : end;
        if (*end && *end != ',') die("--slots: expected ',' near \"%s\"", end);
    }
    return n;
}
