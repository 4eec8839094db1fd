/* engine.c - engine.h: opening and closing a model.
 *
 * Owns the engine lifecycle: the kernels chosen once, the model loaded
 * (model.c / model_gguf.c), the memory plan acted on (engine_plan.c decides),
 * the pool and expert cache created, the trunk resident or streamed, the
 * --heat and --preload warm-ups; events.  What the engine reports about
 * itself (info, stats) is engine_info.c.  Sessions are session.c (allocation) and
 * session_rollback.c (marks, checkpoints); the forward pass is forward.c.
 */
#define _GNU_SOURCE
#include "heat.h"
#include "expert_fetch.h"
#include "plan.h"
#include "prefetch.h"
#include "engine_impl.h"
#include "expert_remote.h"
#include "mathfn.h"
#include "quant.h"
#include "util.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void df_engine_opts_default(df_engine_opts *o)
{
    memset(o, 0, sizeof *o);
}


static int io_options(df_engine *eng, const df_engine_opts *o, df_error *err)
{
    const char *m = o->io_mode && *o->io_mode ? o->io_mode : "auto";
    if (!strcmp(m, "auto")) eng->m.io_mode = IO_AUTO;
    else if (!strcmp(m, "direct")) eng->m.io_mode = IO_DIRECT;
    else if (!strcmp(m, "buffered")) eng->m.io_mode = IO_BUFFERED;
    else return df_err_set(err, DF_ERR_ARG, -1, "unknown I/O mode \"%s\" (expected auto, direct or buffered)", m);
    const char *b = o->io_backend && *o->io_backend ? o->io_backend : "auto";
    if (!strcmp(b, "auto")) eng->m.io_backend = IO_BACKEND_AUTO;
    else if (!strcmp(b, "uring")) eng->m.io_backend = IO_BACKEND_URING;
    else if (!strcmp(b, "threads")) eng->m.io_backend = IO_BACKEND_THREADS;
    else return df_err_set(err, DF_ERR_ARG, -1, "unknown I/O backend \"%s\" (expected auto, uring or threads)", b);
    eng->m.io_depth = o->io_depth > 0 ? o->io_depth : 32;
    eng->m.disk_cache_max = o->disk_cache_max;
    return 0;
}

static double gib(uint64_t b) { return (double)b / (double)(1ull << 30); }

static int trunk_ready(void *eng, int il) { return trunk_stream_ready(eng, il, NULL); }

static int heat_check_writable(const char *path, df_error *err)
{
    if (access(path, F_OK) == 0) {
        if (access(path, W_OK) != 0)
            return df_err_set(err, DF_ERR_IO, -1, "--heat %s: cannot write it: %s", path, strerror(errno));
        return 0;
    }
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (!slash) snprintf(dir, sizeof dir, ".");
    else if (slash == dir) dir[1] = 0;
    else *slash = 0;
    if (access(dir, W_OK) != 0)
        return df_err_set(err, DF_ERR_IO, -1, "--heat %s: cannot create it in %s: %s", path, dir, strerror(errno));
    return 0;
}

/* hottest first, ties by key (qsort_r: the counts are an argument, not a global) */
static int cmp_heat(const void *a, const void *b, void *counts)
{
    const float *freq = counts;
    float x = freq[*(const int32_t *)a], y = freq[*(const int32_t *)b];
    if (x != y) return x > y ? -1 : 1;
    return *(const int32_t *)a - *(const int32_t *)b;
}

/* Warming is not use: hit, miss and read counters restart afterwards, and
 * the use counts (the policy's, the heat file's) stay what routing made them. */
static long read_into_cache(df_engine *eng, const int32_t *keys, size_t n, df_error *err)
{
    size_t nk = (size_t)eng->m.cfg.NL * (size_t)eng->m.cfg.E;
    float *freq = xmalloc(nk * sizeof *freq);
    memcpy(freq, eng->cache.freq, nk * sizeof *freq);
    uint64_t since = eng->cache.since_aging;
    long done = fetch_warm(&eng->mc, keys, n, err);
    memcpy(eng->cache.freq, freq, nk * sizeof *freq);
    eng->cache.since_aging = since;
    free(freq);
    eng->cache.hits = eng->cache.misses = 0;
    memset(&eng->m.store.st, 0, sizeof eng->m.store.st);
    return done;
}

/* --preload: when the cache holds every routed expert, read them all at
 * open, in file order (the model fits: nothing will ever be evicted, so
 * every token runs from memory like a fully resident engine). */
static int preload_all(df_engine *eng, int verbose, df_error *err)
{
    const k3_config *c = &eng->m.cfg;
    size_t nk = (size_t)c->NL * (size_t)c->E, n = 0;
    int32_t *keys = xmalloc(nk * sizeof *keys);
    for (size_t k = 0; k < nk; k++)
        if (c->layer_moe[k / (size_t)c->E] && !expert_cache_resident(&eng->cache, (int)(k / (size_t)c->E),
                                                                     (int)(k % (size_t)c->E)))
            keys[n++] = (int32_t)k;
    double t0 = now_sec();
    long done = read_into_cache(eng, keys, n, err);
    free(keys);
    if (done < 0) return -1;
    eng->mc.all_resident = (size_t)done == n && (uint64_t)eng->cache.n_slots >= eng->plan.n_experts;
    double dt = now_sec() - t0;
    if (verbose)
        df_log("preloaded all %ld experts (%.2f GiB in %.2f s, %.2f GB/s)", done,
               done * (double)eng->m.store.expert_bytes / (1 << 30), dt,
               dt > 0 ? done * (double)eng->m.store.expert_bytes / dt / 1e9 : 0.0);
    return 0;
}

/* Seed the cache's use counts from the heat file and read the hottest
 * experts into it before the first token (all reads in flight at once). */
static int heat_warm(df_engine *eng, int verbose, df_error *err)
{
    const k3_config *c = &eng->m.cfg;
    size_t nk = (size_t)c->NL * (size_t)c->E;
    df_error herr = {0};
    if (heat_load(eng->heat_path, c->NL, c->E, eng->cache.freq, &herr)) {
        memset(eng->cache.freq, 0, nk * sizeof *eng->cache.freq);
        if (herr.code != DF_ERR_IO && verbose) df_log("ignoring the heat file: %s", herr.msg);
        return 0;
    }
    int32_t *keys = xmalloc(nk * sizeof *keys);
    size_t n = 0;
    for (size_t k = 0; k < nk; k++)
        if (eng->cache.freq[k] > 0 && c->layer_moe[k / (size_t)c->E]) keys[n++] = (int32_t)k;
    qsort_r(keys, n, sizeof *keys, cmp_heat, eng->cache.freq);
    double t0 = now_sec();
    long done = read_into_cache(eng, keys, n, err);
    free(keys);
    if (done < 0) return -1;
    if (verbose)
        df_log("warmed the cache with %ld experts from %s (%.1f MiB in %.2f s)", done, eng->heat_path,
               done * (double)eng->m.store.expert_bytes / (1 << 20), now_sec() - t0);
    return 0;
}

int df_engine_open(const char *model_dir, const df_engine_opts *opts, df_engine **out, df_error *err)
{
    df_engine_opts def;
    if (!opts) {
        df_engine_opts_default(&def);
        opts = &def;
    }
    *out = NULL;
    quant_init();
    df_engine *eng = xcalloc(1, sizeof *eng);
    eng->n_ranks = df_ranks_size();
    if (io_options(eng, opts, err)) {
        free(eng);
        return -1;
    }
    eng->experts_only = opts->experts_only;
    char spec[64];
    if (engine_backend_spec(opts->backend, opts->kernels, spec, sizeof spec, err)) {
        free(eng);
        return -1;
    }
    if (k3_backend_spec_ok(spec, err)) {
        free(eng);
        return -1;
    }
    if (engine_model_load(&eng->m, model_dir, err)) {
        model_unload(&eng->m);
        free(eng);
        return -1;
    }
    eng->n_threads = opts->n_threads > 0 ? opts->n_threads : (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (eng->n_threads < 1) eng->n_threads = 1;
    if (eng->n_threads > 256) eng->n_threads = 256;
    if (k3_backend_open(&eng->bk, spec, eng->n_threads, err)) {
        model_unload(&eng->m);
        free(eng);
        return -1;
    }

    if (opts->n_expert_paths && engine_use_expert_paths(eng, opts->expert_paths, opts->n_expert_paths, err)) {
        df_engine_close(eng);
        return -1;
    }
    if (engine_plan_memory(eng, opts, err)) {
        df_engine_close(eng);
        return -1;
    }
    eng->mc = (model_ctx){.cfg = eng->m.cfg, .layers = eng->m.layers, .bk = &eng->bk,
                          .cache = &eng->cache, .store = &eng->m.store, .pf = &eng->pf, .io_depth = eng->m.io_depth,
                          .quiet = opts->quiet, .trunk_streamed = eng->ts.on, .trunk_ready = trunk_ready, .eng = eng};
    prefetch_init(&eng->pf, eng->m.cfg.NL, eng->m.cfg.E, eng->m.cfg.k, opts->prefetch_k, !opts->no_prefetch);
    if (opts->heat_path) {
        /* it is written at close: a path that cannot be written is refused
         * now, not reported after the run */
        if (heat_check_writable(opts->heat_path, err)) {
            df_engine_close(eng);
            return -1;
        }
        eng->heat_path = xstrdup(opts->heat_path);
        if (heat_warm(eng, !opts->quiet, err)) {
            df_engine_close(eng);
            return -1;
        }
    }
    if (opts->preload > 0 || (opts->preload == 0 && !eng->ts.on && !eng->m.store.remote &&
                              (uint64_t)eng->cache.n_slots >= eng->plan.n_experts)) {
        if (preload_all(eng, !opts->quiet, err)) {
            df_engine_close(eng);
            return -1;
        }
    }
    if (opts->events_path) {
        eng->events = fopen(opts->events_path, "w");
        if (!eng->events) {
            df_err_set(err, DF_ERR_IO, -1, "%s: cannot create the events file: %s", opts->events_path,
                       strerror(errno));
            df_engine_close(eng);
            return -1;
        }
        eng->events_buf = xmalloc(1 << 16);
        setvbuf(eng->events, eng->events_buf, _IOFBF, 1 << 16);
        eng->layer_sec = xcalloc((size_t)eng->m.cfg.NL, sizeof *eng->layer_sec);
    }
    eng->trace_lookahead = opts->trace_path && !opts->trace_jsonl ? opts->trace_lookahead : 0;
    if (opts->trace_path && trace_open(eng, opts->trace_path, opts->trace_jsonl, model_dir, err)) {
        df_engine_close(eng);
        return -1;
    }
    if (opts->attn_path && attn_open(eng, opts, model_dir, err)) {
        df_engine_close(eng);
        return -1;
    }
    if (!opts->quiet)
        df_log("loaded %s: %d layers (%d KDA, %d MLA), hidden %d, %d experts (top %d); backend %s, %d threads; "
               "expert reads %s via %s, %d in flight",
               model_dir, eng->m.cfg.NL, eng->m.n_kda, eng->m.n_mla, eng->m.cfg.h, eng->m.cfg.E, eng->m.cfg.k, eng->bk.name,
               eng->bk.n_workers, eng->m.store.n_files && eng->m.store.files[0].direct ? "O_DIRECT" : "buffered",
               io_queue_backend(eng->m.store.q), eng->m.io_depth);
    if (eng->m.store.remote) {
        /* unverified experts are said at every start, quiet or not */
        expert_remote_info ri;
        expert_remote_get_info(eng->m.store.remote, &ri);
        if (!opts->quiet || ri.hashed != ri.listed)
            df_log("experts streamed from %s/%s at %.12s into a disk cache of %.2f GiB (%d of %d slots filled); %s",
                   ri.base, ri.repo, ri.commit, gib(ri.cache_max), ri.cache_filled, ri.cache_slots,
                   ri.hashed == ri.listed ? "every expert is checked against its SHA-256 before use"
                   : ri.hashed ? "UNVERIFIED: some experts have no SHA-256 in the manifest: those are checked for size "
                                 "and bounds and fetched twice to compare (a mirror serving the same wrong bytes every "
                                 "time is not caught)"
                               : "UNVERIFIED: the manifest has no SHA-256 per expert (set up with --verify), fetched "
                                 "experts are checked for size and bounds and fetched twice to compare (a mirror "
                                 "serving the same wrong bytes every time is not caught)");
    }
    if (!opts->quiet && eng->m.store.probe_direct_bps > 0)
        df_log("expert read probe: O_DIRECT %.2f GB/s, buffered %.2f GB/s", eng->m.store.probe_direct_bps / 1e9,
               eng->m.store.probe_buffered_bps / 1e9);
    *out = eng;
    return 0;
}

void df_engine_close(df_engine *eng)
{
    if (!eng) return;
    ranks_close(eng->ranks);
    if (eng->heat_path && eng->cache.freq) {
        df_error herr = {0};
        if (heat_save(eng->heat_path, eng->m.cfg.NL, eng->m.cfg.E, eng->cache.freq, &herr))
            df_log("could not save the heat file: %s", herr.msg);
    }
    free(eng->heat_path);
    if (eng->trace) {
        fclose(eng->trace);
        free(eng->trace_buf);
    }
    if (eng->attn) {
        fclose(eng->attn);
        free(eng->attn_buf);
    }
    free(eng->attn_on);
    free(eng->la_xn), free(eng->la_logits), free(eng->la_choice), free(eng->la_top);
    if (eng->events) {
        fclose(eng->events);
        free(eng->events_buf);
    }
    free(eng->layer_sec);
    prefetch_deinit(&eng->pf);
    /* prefetch reads may still be writing into cache slots */
    if (eng->m.store.q && eng->mc.store) fetch_drain(&eng->mc, NULL);
    k3_backend_close(&eng->bk);
    trunk_stream_deinit(eng);
    free(eng->layer_bytes);
    free(eng->layer_span);
    expert_cache_deinit(&eng->cache);
    model_unload(&eng->m);
    free(eng);
}

void df_engine_event(df_engine *eng, const char *json)
{
    if (!eng->events) return;
    fputs(json, eng->events);
    fputc('\n', eng->events);
    fflush(eng->events);
}

int df_argmax(const float *logits, int n)
{
    int best = 0;
    for (int i = 1; i < n; i++)
        if (logits[i] > logits[best]) best = i;
    return best;
}
