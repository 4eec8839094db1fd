/* engine.c - engine.h: opening a model, sessions, and the layer loop.
 *
 * Owns: the engine lifecycle (kernels chosen once, model loaded, pool and
 * expert cache created), session allocation (every buffer the token loop
 * needs is sized here, from the config, n_ctx and max_batch), and the
 * forward pass over a chunk of positions (spec section 4.2): AttnRes mixes,
 * the block boundary bookkeeping, attention and FFN per layer, the final mix,
 * norm and lm_head.  The token loop runs under the allocation guard.
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

void df_session_opts_default(df_session_opts *o)
{
    memset(o, 0, sizeof *o);
    o->n_ctx = 4096;
    o->max_batch = 0; /* the plan's */
}

static int session_alloc(df_engine *eng, const df_session_opts *opts, int dry, df_session **out, size_t *state_bytes,
                         size_t *scratch_bytes, df_error *err);

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

static uint64_t default_budget(void);
size_t df_mem_budget_default(void) { return (size_t)default_budget(); }

static uint64_t default_budget(void)
{
    uint64_t phys = (uint64_t)sysconf(_SC_PHYS_PAGES) * (uint64_t)sysconf(_SC_PAGESIZE);
    return phys / 10 * 7;
}

/* The sizes the planner needs, from the loaded headers, for a session of
 * so's context and batch (counted by session_alloc's dry run). */
static int engine_sizes(df_engine *eng, const df_session_opts *so, plan_sizes *sz, df_error *err)
{
    const k3_config *c = &eng->m.cfg;
    memset(sz, 0, sizeof *sz);
    size_t state = 0, scratch = 0;
    if (so->max_batch > 0) {
        if (session_alloc(eng, so, 1, NULL, &state, &scratch, err)) return -1;
    } else {
        /* --batch auto: scratch is linear in the batch from the row block
         * (256) on, and less below it: the line through 256 and 512 rows,
         * with a base that also covers a batch of one (the big buffers
         * hold at least one dense-MLP row), bounds it; the default chunk's
         * is measured */
        df_session_opts one = *so, a = *so, b = *so, d = *so;
        size_t s1 = 0, sa = 0, sb = 0, sd = 0;
        one.max_batch = 1;
        a.max_batch = 256;
        b.max_batch = 512;
        d.max_batch = PLAN_BATCH_DEFAULT < so->n_ctx ? PLAN_BATCH_DEFAULT : so->n_ctx > 0 ? so->n_ctx : 1;
        if (session_alloc(eng, &one, 1, NULL, &state, &s1, err) || session_alloc(eng, &a, 1, NULL, &state, &sa, err) ||
            session_alloc(eng, &d, 1, NULL, &state, &sd, err) || session_alloc(eng, &b, 1, NULL, &state, &sb, err))
            return -1;
        sz->scratch_per_row = (sb - sa) / 256;
        size_t base_a = sa - 256 * sz->scratch_per_row, base_1 = s1 - sz->scratch_per_row;
        sz->scratch_base = base_1 > base_a ? base_1 : base_a;
        sz->scratch_default = sd;
    }
    /* an experts-only rank never touches the trunk (mapped, never read) */
    sz->trunk_bytes = eng->experts_only ? 0 : eng->m.trunk_mapped_bytes - eng->m.embed_bytes;
    sz->embed_bytes = eng->experts_only ? 0 : eng->m.embed_bytes;
    sz->vec_bytes = eng->m.owned_bytes;
    sz->stream_buf_bytes = eng->experts_only ? 0 : trunk_stream_buffer_bytes(eng);
    sz->expert_bytes = eng->m.store.expert_bytes;
    sz->slot_bytes = eng->m.store.slot_bytes;
    for (int il = 0; il < c->NL; il++) sz->n_moe_layers += c->layer_moe[il];
    sz->n_experts = (uint64_t)sz->n_moe_layers * (uint64_t)c->E;
    sz->k = c->k;
    sz->state_bytes = state;
    sz->scratch_bytes = scratch;
    sz->mpi_ranks = df_ranks_size();
    sz->mpi_bytes = plan_mpi_bytes(df_ranks_mpi() ? sz->mpi_ranks : 0);
    sz->remote_bytes = plan_remote_bytes(eng->m.from_mirror);
    sz->reserve_bytes = plan_reserve_bytes(eng->n_threads, c->V) + sz->mpi_bytes + sz->remote_bytes;
    sz->n_ctx = so->n_ctx;
    sz->max_batch = so->max_batch;
    return 0;
}

/* One conversation checkpoint: the KDA state and conv history, in bytes. */
static uint64_t checkpoint_bytes(const df_engine *eng);

/* serve's default number of checkpoints per conversation (plan_checkpoints
 * -1): as many as take at most 1/64 of the budget over all the planned
 * sessions, at least 2 (where the system prompt and tools end, and where
 * the last message ends) and at most 8.  K3's cost 470 MB each: 2 below
 * 64 GiB, 8 from 256 GiB. */
static int serve_checkpoints(const df_engine *eng, size_t budget, int n_sessions)
{
    uint64_t each = checkpoint_bytes(eng) * (uint64_t)(n_sessions > 1 ? n_sessions : 1);
    uint64_t n = each ? (uint64_t)budget / 64 / each : 8;
    return n < 2 ? 2 : n > 8 ? 8 : (int)n;
}

static void plan_session_opts(const df_engine *eng, const df_engine_opts *o, df_session_opts *so)
{
    df_session_opts_default(so);
    if (o->plan_ctx > 0) so->n_ctx = o->plan_ctx;
    if (o->plan_batch > 0) so->max_batch = o->plan_batch;
    if (o->plan_rollback > 0) so->rollback_rows = o->plan_rollback;
    if (o->plan_checkpoints > 0) so->checkpoints = o->plan_checkpoints;
    if (o->plan_checkpoints < 0)
        so->checkpoints = serve_checkpoints(eng, o->mem_budget ? o->mem_budget : default_budget(), o->plan_sessions);
}

/* The planned sessions: so's, n_sessions times (plan_sizes_at). */
typedef struct planned_sessions {
    df_engine *eng;
    const df_session_opts *so;
    int n_sessions;
} planned_sessions;

static int sessions_sizes(void *arg, int n_ctx, plan_sizes *sz, df_error *err)
{
    const planned_sessions *ps = arg;
    df_session_opts so = *ps->so;
    so.n_ctx = n_ctx;
    if (engine_sizes(ps->eng, &so, sz, err)) return -1;
    if (ps->n_sessions > 1) {
        /* serve --parallel N: N sessions come before the expert cache, which
         * takes what is left (a slightly smaller cache, not a refusal) */
        uint64_t n = (uint64_t)ps->n_sessions;
        sz->state_bytes *= n;
        sz->scratch_bytes *= n;
        sz->scratch_base *= n;
        sz->scratch_per_row *= n;
        sz->scratch_default *= n;
    }
    return 0;
}

/* The plan for so's session under these options (plan.c decides; the
 * sizes come from the loaded headers).  serve_ctx: so's context is
 * serve's default, chosen by plan_serve_ctx. */
static int decide_plan(df_engine *eng, const df_session_opts *so, int n_sessions, int serve_ctx, size_t mem_budget,
                       int stream_trunk, size_t expert_cache_bytes, const char *cache_policy, enum cache_policy *pol,
                       df_plan *p, df_error *err)
{
    if (expert_cache_policy_parse(cache_policy, pol))
        return df_err_set(err, DF_ERR_ARG, -1, "unknown cache policy \"%s\" (expected lfu, tlfu or lru)", cache_policy);
    plan_request rq = {.budget = mem_budget ? mem_budget : default_budget(),
                       .budget_given = mem_budget > 0,
                       .trunk_stream = stream_trunk,
                       .expert_cache_bytes = expert_cache_bytes,
                       .tlfu = *pol == CACHE_TLFU,
                       .auto_batch = so->max_batch <= 0};
    planned_sessions ps = {eng, so, n_sessions};
    int rc;
    if (serve_ctx) {
        rc = plan_serve_ctx(sessions_sizes, &ps, eng->m.cfg.n_ctx_max, &rq, p, err);
    } else {
        plan_sizes sz;
        if (sessions_sizes(&ps, so->n_ctx, &sz, err)) return -1;
        rc = plan_compute(&sz, &rq, p, err);
    }
    p->checkpoints = so->checkpoints;
    p->checkpoint_bytes = checkpoint_bytes(eng);
    return rc;
}

/* Decide the plan (plan.c), then act on it: the expert cache, the trunk
 * streamed or copied resident.  Nothing is allocated before the plan holds. */
static int plan_memory(df_engine *eng, const df_engine_opts *o, df_error *err)
{
    df_session_opts so;
    plan_session_opts(eng, o, &so);
    enum cache_policy pol;
    df_plan *p = &eng->plan;
    if (decide_plan(eng, &so, o->plan_sessions, o->plan_ctx <= 0 && o->plan_ctx_serve, o->mem_budget, o->trunk_stream,
                    o->expert_cache_bytes, o->cache_policy, &pol, p, err))
        return -1;
    if (expert_cache_init(&eng->cache, eng->m.cfg.NL, eng->m.cfg.E, (int)p->n_slots, (int)p->n_transient,
                          eng->m.store.slot_bytes, pol))
        return df_err_set(err, DF_ERR_NOMEM, -1, "cannot allocate the expert cache (%llu slots of %zu bytes)",
                          (unsigned long long)p->n_slots, eng->m.store.slot_bytes);
    if (eng->experts_only) {
        /* nothing of the trunk is loaded */
    } else if (p->trunk_mode == DF_TRUNK_STREAMED) {
        if (trunk_stream_init(eng, err)) return -1;
        CHECK(2 * eng->ts.buf_bytes <= p->trunk_used);
    } else if (trunk_load_resident(eng, err)) {
        return -1;
    }
    if (o->prefault) expert_cache_prefault(&eng->cache);
    eng->session_room = p->state_bytes + p->scratch_bytes + (p->budget - p->used);
    if (!o->quiet) df_plan_print(p, "deltafin: ", stderr);
    return 0;
}

void df_engine_plan(const df_engine *eng, df_plan *p) { *p = eng->plan; }

static int trunk_ready(void *eng, int il) { return trunk_stream_ready(eng, il, NULL); }

static int ends_with(const char *s, const char *suf)
{
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && !strcmp(s + a - b, suf);
}

int df_plan_model(const char *path, const df_plan_opts *o, df_plan *p, df_model_info *info, df_error *err)
{
    df_plan_opts def;
    if (!o) {
        memset(&def, 0, sizeof def);
        o = &def;
    }
    memset(p, 0, sizeof *p);
    df_engine *eng = xcalloc(1, sizeof *eng);
    eng->m.headers_only = 1;
    eng->m.io_mode = IO_BUFFERED; /* no read probe: nothing is read */
    eng->m.io_backend = IO_BACKEND_THREADS;
    eng->m.io_depth = 1;
    eng->n_threads = o->n_threads > 0 ? o->n_threads : (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (eng->n_threads < 1) eng->n_threads = 1;
    int rc = ends_with(path, ".json") ? model_load_config_only(&eng->m, path, err) : model_load(&eng->m, path, err);
    if (!rc) {
        df_session_opts so;
        df_session_opts_default(&so);
        if (o->n_ctx > 0) so.n_ctx = o->n_ctx;
        if (o->max_batch > 0) so.max_batch = o->max_batch;
        if (o->rollback_rows > 0) so.rollback_rows = o->rollback_rows;
        if (o->checkpoints > 0) so.checkpoints = o->checkpoints;
        if (o->checkpoints < 0)
            so.checkpoints = serve_checkpoints(eng, o->mem_budget ? o->mem_budget : default_budget(), o->n_sessions);
        enum cache_policy pol;
        rc = decide_plan(eng, &so, o->n_sessions > 1 ? o->n_sessions : 1, o->serve && o->n_ctx <= 0, o->mem_budget,
                         o->trunk_stream, o->expert_cache_bytes, o->cache_policy, &pol, p, err);
        if (info && (!rc || err->code == DF_ERR_NOMEM)) {
            df_engine_info(eng, info);
            info->n_cache_slots = (int)p->n_slots;
        }
    }
    model_unload(&eng->m);
    free(eng);
    return rc;
}

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

/* Warming is not use: hit, miss and read counters restart afterwards. */
static long read_into_cache(df_engine *eng, const int32_t *keys, size_t n, df_error *err)
{
    long done = fetch_warm(&eng->mc, keys, n, err);
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
    if (io_options(eng, opts, err)) {
        free(eng);
        return -1;
    }
    eng->experts_only = opts->experts_only;
    const char *force = opts->kernels ? opts->kernels : getenv("DF_KERNELS");
    eng->kt = kernels_select(force, err);
    if (!eng->kt) {
        free(eng);
        return -1;
    }
    if (model_load(&eng->m, model_dir, err)) {
        model_unload(&eng->m);
        free(eng);
        return -1;
    }
    eng->n_threads = opts->n_threads > 0 ? opts->n_threads : (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (eng->n_threads < 1) eng->n_threads = 1;
    if (eng->n_threads > 256) eng->n_threads = 256;
    eng->pool = threadpool_new(eng->n_threads);

    if (opts->n_expert_paths && engine_use_expert_paths(eng, opts->expert_paths, opts->n_expert_paths, err)) {
        df_engine_close(eng);
        return -1;
    }
    if (plan_memory(eng, opts, err)) {
        df_engine_close(eng);
        return -1;
    }
    eng->mc = (model_ctx){.cfg = eng->m.cfg, .layers = eng->m.layers, .pool = eng->pool, .kt = eng->kt,
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
    if (opts->trace_path) {
        /* own buffer: stdio must not allocate inside the token loop */
        eng->trace = fopen(opts->trace_path, "w");
        if (!eng->trace) {
            df_err_set(err, DF_ERR_IO, -1, "%s: cannot create the route trace: %s", opts->trace_path, strerror(errno));
            df_engine_close(eng);
            return -1;
        }
        eng->trace_buf = xmalloc(1 << 16);
        setvbuf(eng->trace, eng->trace_buf, _IOFBF, 1 << 16);
        fprintf(eng->trace, "{\"trace\":\"deltafin routes\",\"version\":1,\"layers\":%d,\"experts\":%d,\"top_k\":%d}\n",
                eng->m.cfg.NL, eng->m.cfg.E, eng->m.cfg.k);
    }
    if (!opts->quiet)
        df_log("loaded %s: %d layers (%d KDA, %d MLA), hidden %d, %d experts (top %d); kernels %s, %d threads; "
               "expert reads %s via %s, %d in flight",
               model_dir, eng->m.cfg.NL, eng->m.n_kda, eng->m.n_mla, eng->m.cfg.h, eng->m.cfg.E, eng->m.cfg.k, eng->kt->name,
               eng->n_threads, eng->m.store.n_files && eng->m.store.files[0].direct ? "O_DIRECT" : "buffered",
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
    if (eng->events) {
        fclose(eng->events);
        free(eng->events_buf);
    }
    free(eng->layer_sec);
    prefetch_deinit(&eng->pf);
    /* prefetch reads may still be writing into cache slots */
    if (eng->m.store.q && eng->mc.store) fetch_drain(&eng->mc, NULL);
    threadpool_free(eng->pool);
    trunk_stream_deinit(eng);
    expert_cache_deinit(&eng->cache);
    model_unload(&eng->m);
    free(eng);
}

void df_engine_info(const df_engine *eng, df_model_info *info)
{
    const k3_config *c = &eng->m.cfg;
    memset(info, 0, sizeof *info);
    info->vocab = c->V;
    info->hidden = c->h;
    info->n_layers = c->NL;
    info->n_mla_layers = eng->m.n_mla;
    info->n_kda_layers = eng->m.n_kda;
    info->n_experts = c->E;
    info->n_experts_used = c->k;
    info->bos_id = c->bos;
    info->eos_id = c->eos;
    info->pad_id = c->pad;
    info->expert_bytes = eng->m.store.expert_bytes;
    info->ctx_bytes_per_token = (uint64_t)eng->m.n_mla * (uint64_t)(c->Rkv + c->dr) * sizeof(float);
    info->fixed_state_bytes = (uint64_t)eng->m.n_kda *
                              ((uint64_t)c->Hk * c->Dk * c->Dk + 3ull * (uint64_t)(c->Wc - 1) * c->P) * sizeof(float);
    info->kernels = eng->kt ? eng->kt->name : "";
    info->n_threads = eng->n_threads;
    info->n_cache_slots = eng->cache.n_slots;
}

int df_install_describe(const char *dir, df_install_info *out, df_error *err)
{
    expert_remote_info ri;
    memset(out, 0, sizeof *out);
    int rc = expert_remote_describe(dir, &ri, err);
    if (rc <= 0) return rc;
    memcpy(out->base, ri.base, sizeof out->base);
    memcpy(out->repo, ri.repo, sizeof out->repo);
    memcpy(out->commit, ri.commit, sizeof out->commit);
    out->cache_max = ri.cache_max;
    out->cache_used = ri.cache_used;
    out->cache_filled = ri.cache_filled;
    out->cache_slots = ri.cache_slots;
    out->experts = ri.listed;
    out->experts_hashed = ri.hashed;
    return 1;
}

void df_engine_stats(const df_engine *eng, df_stats *st)
{
    memset(st, 0, sizeof *st);
    st->tokens = eng->tokens;
    st->expert_hits = eng->cache.hits;
    st->expert_misses = eng->cache.misses;
    st->expert_bytes_read = eng->m.store.st.bytes_read;
    st->expert_bytes_io = eng->m.store.st.bytes_io;
    st->expert_reads = eng->m.store.st.n_reads;
    st->io_wait_sec = eng->m.store.st.wait_sec;
    if (eng->m.store.remote) {
        const expert_remote_stats *rs = expert_remote_get_stats(eng->m.store.remote);
        st->streamed = 1;
        st->remote_fetches = rs->fetches;
        st->remote_bytes = rs->bytes;
        st->remote_retries = rs->retries;
        st->remote_compare_fetches = rs->compare_fetches;
        st->remote_compare_bytes = rs->compare_bytes;
        st->remote_copy_mismatches = rs->copy_mismatches;
        st->disk_cache_hits = rs->disk_hits;
        st->disk_cache_evictions = rs->evictions;
        st->remote_sec = rs->fetch_sec;
        st->io_wait_sec += rs->fetch_sec;
    }
    for (int i = 0; i < eng->m.store.n_src && i < 8; i++) st->source_reads[i] = eng->m.store.src[i].reads;
    st->prefetch_issued = eng->pf.issued;
    st->prompt_positions = eng->prompt.positions;
    st->prompt_chunk = eng->prompt.chunk;
    st->prompt_unique_experts = eng->prompt.unique;
    st->prompt_expert_reads = eng->prompt.reads;
    st->prompt_expert_bytes = eng->prompt.bytes;
    st->prompt_sec = eng->prompt.seconds;
    st->trunk_bytes_read = eng->ts.bytes_read;
    st->trunk_wait_sec = eng->ts.wait_sec;
    st->prefetch_used = eng->cache.pf_used;
    st->prefetch_wasted = eng->cache.pf_wasted;
    st->prefetch_late = eng->cache.late;
    st->prefetch_ab_rounds = eng->pf.timing.rounds;
    st->prefetch_ab_on = eng->pf.timing.last;
    st->prefetch_ab_on_ms = 1e3 * eng->pf.timing.mean[1];
    st->prefetch_ab_off_ms = 1e3 * eng->pf.timing.mean[0];
    for (int il = 0; il < eng->m.cfg.NL && eng->pf.predicted; il++) {
        st->prefetch_predicted += eng->pf.predicted[il];
        st->prefetch_correct += eng->pf.correct[il];
        st->prefetch_actual += eng->pf.actual[il];
    }
}

/* rows a chunk's layer work takes at a time (df_session_opts.row_block) */
#define SESSION_ROW_BLOCK 256

static size_t max_sz(size_t a, size_t b) { return a > b ? a : b; }
static size_t min_sz(size_t a, size_t b) { return a < b ? a : b; }

/* Every session buffer goes through ALLOC, so the memory planner can size a
 * session with the same code (dry = 1 counts bytes and allocates nothing). */
#define ALLOC(field, count)                                                                  \
    do {                                                                                     \
        size_t n_ = (size_t)(count);                                                         \
        if (!dry && !((field) = aligned_alloc_zero((n_ ? n_ : 1) * sizeof *(field)))) goto nomem; \
        bytes += n_ * sizeof *(field);                                                       \
    } while (0)

/* A session's KDA state and conv history, in floats (all KDA layers). */
static size_t kda_state_floats(const df_engine *eng)
{
    const k3_config *c = &eng->m.cfg;
    return (size_t)eng->m.n_kda * c->Hk * c->Dk * c->Dk;
}

static size_t kda_hist_floats(const df_engine *eng)
{
    const k3_config *c = &eng->m.cfg;
    return (size_t)eng->m.n_kda * 3 * (size_t)(c->Wc > 1 ? c->Wc - 1 : 1) * c->P;
}

static uint64_t checkpoint_bytes(const df_engine *eng)
{
    return (uint64_t)(kda_state_floats(eng) + kda_hist_floats(eng)) * sizeof(float);
}

static int session_alloc(df_engine *eng, const df_session_opts *opts, int dry, df_session **out, size_t *state_bytes,
                         size_t *scratch_bytes, df_error *err)
{
    df_session_opts def;
    df_session_opts_default(&def);
    if (!opts) opts = &def;
    if (out) *out = NULL;
    const k3_config *c = &eng->m.cfg;
    int n_ctx = opts->n_ctx > 0 ? opts->n_ctx : def.n_ctx;
    int T = opts->max_batch > 0 ? opts->max_batch : eng->plan.max_batch > 0 ? eng->plan.max_batch : 32;
    if (T > 4096) return df_err_set(err, DF_ERR_ARG, -1, "max_batch %d is too large (at most 4096)", T);
    if (opts->row_block < 0 || opts->row_block > 4096)
        return df_err_set(err, DF_ERR_ARG, -1, "row_block %d is outside [0, 4096]", opts->row_block);
    /* a chunk's layer work runs in blocks of Tb rows; only the residual
     * stream, the anchors and the routed-expert rows are per position */
    int Tb = opts->row_block > 0 ? opts->row_block : SESSION_ROW_BLOCK;
    if (Tb > T) Tb = T;
    df_session *s = xcalloc(1, sizeof *s);
    s->eng = eng;
    s->b.n_ctx = n_ctx;
    s->b.max_batch = T;
    s->b.row_block = Tb;
    size_t bytes = 0, h = (size_t)c->h;
    s->b.n_anchor_max = (c->NL + c->B - 1) / c->B;
    if (s->b.n_anchor_max > DBG_MAX_ANCHORS) {
        int n = s->b.n_anchor_max;
        free(s);
        return df_err_set(err, DF_ERR_UNSUPPORTED, -1, "%d AttnRes blocks exceed the supported %d", n,
                          DBG_MAX_ANCHORS);
    }
    size_t row_w = (size_t)c->Rkv + (size_t)c->dr;
    ALLOC(s->b.kda_S, kda_state_floats(eng));
    ALLOC(s->b.kda_hist, kda_hist_floats(eng));
    ALLOC(s->b.mla_cache, (size_t)eng->m.n_mla * (size_t)n_ctx * row_w);
    s->b.rb_mark = -1;
    if (opts->rollback_rows < 0 || opts->rollback_rows > 4096) {
        int r = opts->rollback_rows;
        df_session_free(s);
        return df_err_set(err, DF_ERR_ARG, -1, "rollback_rows %d is outside [0, 4096]", r);
    }
    if (opts->rollback_rows > 0) {
        s->b.rb_rows = opts->rollback_rows;
        ALLOC(s->b.kda_S0, kda_state_floats(eng));
        ALLOC(s->b.kda_hist0, kda_hist_floats(eng));
        ALLOC(s->b.kda_rec, (size_t)eng->m.n_kda * (size_t)s->b.rb_rows * (4 * (size_t)c->P + (size_t)c->Hk));
    }
    if (opts->checkpoints < 0 || opts->checkpoints > 64) {
        int k = opts->checkpoints;
        df_session_free(s);
        return df_err_set(err, DF_ERR_ARG, -1, "checkpoints %d is outside [0, 64]", k);
    }
    if (opts->checkpoints > 0) {
        s->b.n_ck = opts->checkpoints;
        ALLOC(s->b.ck_state, (size_t)s->b.n_ck * (kda_state_floats(eng) + kda_hist_floats(eng)));
        if (!dry) {
            s->b.ck_pos = xmalloc((size_t)s->b.n_ck * sizeof *s->b.ck_pos);
            s->b.ck_age = xcalloc((size_t)s->b.n_ck, sizeof *s->b.ck_age);
            s->b.ck_want = xmalloc((size_t)s->b.n_ck * sizeof *s->b.ck_want);
            s->b.ck_nS = kda_state_floats(eng);
            s->b.ck_nH = kda_hist_floats(eng);
            for (int i = 0; i < s->b.n_ck; i++) s->b.ck_pos[i] = s->b.ck_want[i] = -1;
        }
    }
    size_t state = bytes;
    ALLOC(s->b.H, (size_t)T * h);
    ALLOC(s->b.anchors, (size_t)s->b.n_anchor_max * T * h);
    ALLOC(s->b.ain, (size_t)Tb * h);
    ALLOC(s->b.xn, (size_t)Tb * h);
    ALLOC(s->b.att, (size_t)Tb * h);
    ALLOC(s->b.min, (size_t)Tb * h);
    ALLOC(s->b.y, (size_t)Tb * h);
    ALLOC(s->b.ffn, (size_t)Tb * h);
    size_t bw = h;
    bw = max_sz(bw, (size_t)c->P);
    bw = max_sz(bw, (size_t)c->Hm * (c->dn + c->dr));
    bw = max_sz(bw, (size_t)c->Hm * c->dv);
    bw = max_sz(bw, (size_t)c->Ns * c->I);
    bw = max_sz(bw, (size_t)c->E);
    bw = max_sz(bw, (size_t)c->Lt);
    /* the dense MLP's Dff-wide rows (the widest at K3's size: 33,792 against
     * 18,432) go through big0/big1 in blocks of rows (dense_mlp_forward), so
     * the six buffers need not be Dff wide for every position of a chunk */
    s->b.big_w = bw;
    s->b.big_cap = max_sz((size_t)Tb * bw, (size_t)c->Dff);
    ALLOC(s->b.big0, s->b.big_cap);
    ALLOC(s->b.big1, s->b.big_cap);
    ALLOC(s->b.big2, s->b.big_cap);
    ALLOC(s->b.big3, s->b.big_cap);
    ALLOC(s->b.big4, s->b.big_cap);
    ALLOC(s->b.big5, s->b.big_cap);
    size_t sw = max_sz(max_sz((size_t)c->Dk, (size_t)c->Hk), max_sz((size_t)c->Rq, row_w));
    ALLOC(s->b.small0, (size_t)Tb * sw);
    ALLOC(s->b.small1, (size_t)Tb * sw);
    ALLOC(s->b.probs, (size_t)Tb * (s->b.n_anchor_max + 1));
    ALLOC(s->b.logits_tmp, (size_t)c->V);
    /* per worker: KDA's rows, or MLA attention for a block of heads at a
     * full context ([oh | q_abs / ctx per head | scores per head], mla.c
     * heads_per_call): up to MLA_NH_MAX heads per pass over the latent
     * cache, not one (K3 at 128K: 17 MB per thread, ~6x faster attention) */
    size_t nh = c->Hm < MLA_NH_MAX ? (size_t)c->Hm : MLA_NH_MAX;
    if (!nh) nh = 1;
    s->b.worker_w = max_sz(6 * (size_t)c->Dk,
                           max_sz(2 * (size_t)c->Rkv + (size_t)c->dv + (size_t)n_ctx,
                                  (size_t)c->dv + nh * ((size_t)c->Rkv + (size_t)n_ctx))) +
                    16;
    ALLOC(s->b.worker_buf, (size_t)eng->n_threads * s->b.worker_w);
    size_t Tk = (size_t)T * c->k;
    ALLOC(s->b.route_ids, Tk);
    ALLOC(s->b.route_w, Tk);
    ALLOC(s->b.zp, (size_t)T * c->Lt);
    /* a chunk's experts run in batches of rows (moe.c): all T*k rows at
     * once only for small T (decode, verify passes), else 2 Tb + 256 rows
     * (an expert with more runs in pieces), gathered from zp per batch;
     * across ranks the other ranks' rows are posted whole, so all T*k */
    s->b.g_rows = min_sz(Tk, 2 * (size_t)Tb + 256);
    s->b.g_x_full = df_ranks_size() > 1;
    ALLOC(s->b.g_x, (s->b.g_x_full ? Tk : s->b.g_rows) * c->Lt);
    ALLOC(s->b.row_pos, Tk);
    ALLOC(s->b.g_h1, s->b.g_rows * c->I);
    ALLOC(s->b.g_h3, s->b.g_rows * c->I);
    ALLOC(s->b.g_out, Tk * c->Lt);
    ALLOC(s->b.uniq, Tk);
    ALLOC(s->b.u_of_e, (size_t)c->E);
    ALLOC(s->b.slot_of, Tk);
    ALLOC(s->b.uniq_first, Tk);
    ALLOC(s->b.uniq_count, Tk);
    ALLOC(s->b.uniq_slot, Tk);
    ALLOC(s->b.uniq_state, Tk);
    ALLOC(s->b.ready_list, Tk);
    ALLOC(s->b.seen, (size_t)c->NL * (size_t)c->E);
    if (!dry)
        for (int e = 0; e < c->E; e++) s->b.u_of_e[e] = -1;
    if (state_bytes) *state_bytes = state;
    if (scratch_bytes) *scratch_bytes = bytes - state;
    if (dry) {
        free(s);
        return 0;
    }
    *out = s;
    return 0;
nomem:
    df_session_free(s);
    return df_err_set(err, DF_ERR_NOMEM, -1,
                      "cannot allocate session buffers (%zu bytes so far; n_ctx %d, max_batch %d): lower --ctx",
                      bytes, n_ctx, T);
}

/* A session takes its bytes from the plan: the one the planner reserved
 * for, plus whatever the plan left unused.  A larger context or batch than
 * planned, or a second session the budget cannot hold, is refused with the
 * numbers instead of growing past --mem. */
int df_session_new(df_engine *eng, const df_session_opts *opts, df_session **out, df_error *err)
{
    size_t state = 0, scratch = 0;
    *out = NULL;
    if (session_alloc(eng, opts, 1, NULL, &state, &scratch, err)) return -1;
    uint64_t need = (uint64_t)state + scratch;
    if (eng->sessions_bytes + need > eng->session_room) {
        df_session_opts d;
        df_session_opts_default(&d);
        d.max_batch = eng->plan.max_batch;
        return df_err_set(err, DF_ERR_NOMEM, -1,
                          "a session with a context of %d tokens and batch %d needs %.3f GiB, but the memory plan "
                          "(--mem %.2f GiB, planned for a context of %d) has %.3f GiB left for sessions: "
                          "lower --ctx or raise --mem",
                          opts && opts->n_ctx > 0 ? opts->n_ctx : d.n_ctx,
                          opts && opts->max_batch > 0 ? opts->max_batch : d.max_batch, gib(need),
                          gib(eng->plan.budget), eng->plan.n_ctx, gib(eng->session_room - eng->sessions_bytes));
    }
    if (session_alloc(eng, opts, 0, out, NULL, NULL, err)) return -1;
    (*out)->bytes = need;
    eng->sessions_bytes += need;
    return 0;
}

void df_session_free(df_session *s)
{
    if (!s) return;
    s->eng->sessions_bytes -= s->bytes;
    free(s->b.ck_pos);
    free(s->b.ck_age);
    free(s->b.ck_want);
    float **fl[] = {&s->b.kda_S, &s->b.kda_hist, &s->b.kda_S0, &s->b.kda_hist0, &s->b.kda_rec, &s->b.ck_state, &s->b.mla_cache, &s->b.H, &s->b.anchors, &s->b.ain, &s->b.xn, &s->b.att,
                    &s->b.min, &s->b.y, &s->b.ffn, &s->b.big0, &s->b.big1, &s->b.big2, &s->b.big3, &s->b.big4, &s->b.big5,
                    &s->b.small0, &s->b.small1, &s->b.probs, &s->b.logits_tmp, &s->b.worker_buf, &s->b.route_w, &s->b.zp,
                    &s->b.g_x, &s->b.g_h1, &s->b.g_h3, &s->b.g_out};
    for (size_t i = 0; i < sizeof fl / sizeof fl[0]; i++) aligned_free(*fl[i]);
    aligned_free(s->b.route_ids);
    aligned_free(s->b.uniq);
    aligned_free(s->b.u_of_e);
    aligned_free(s->b.row_pos);
    aligned_free(s->b.slot_of);
    aligned_free(s->b.uniq_first);
    aligned_free(s->b.uniq_count);
    aligned_free(s->b.uniq_slot);
    aligned_free(s->b.uniq_state);
    aligned_free(s->b.ready_list);
    aligned_free(s->b.seen);
    free(s);
}

void df_session_reset(df_session *s)
{
    memset(s->b.kda_S, 0, kda_state_floats(s->eng) * sizeof(float));
    memset(s->b.kda_hist, 0, kda_hist_floats(s->eng) * sizeof(float));
    s->b.pos = 0;
    s->b.rb_mark = -1;
    for (int i = 0; i < s->b.n_ck; i++) s->b.ck_pos[i] = s->b.ck_want[i] = -1;
}

int df_session_mark(df_session *s, df_error *err)
{
    if (s->b.rb_rows <= 0)
        return df_err_set(err, DF_ERR_ARG, -1, "this session keeps no rollback rows (opened with rollback_rows 0)");
    memcpy(s->b.kda_S0, s->b.kda_S, kda_state_floats(s->eng) * sizeof(float));
    memcpy(s->b.kda_hist0, s->b.kda_hist, kda_hist_floats(s->eng) * sizeof(float));
    s->b.rb_mark = s->b.pos;
    return 0;
}

int df_session_mark_pos(const df_session *s) { return s->b.rb_mark; }

/* The slot a checkpoint at pos goes to: one already at pos (held or
 * asked for), an empty one, else the least recently used, except that with
 * two or more the lowest position is kept: it is the prefix most requests
 * share (a system prompt and tools), while later ones move on each turn. */
static int ck_slot(const df_session *s, int pos)
{
    int slot = -1, lowest = -1;
    for (int i = 0; i < s->b.n_ck; i++) {
        int at = s->b.ck_pos[i] >= 0 ? s->b.ck_pos[i] : s->b.ck_want[i];
        if (at == pos) return i;
        if (at >= 0 && (lowest < 0 || at < (s->b.ck_pos[lowest] >= 0 ? s->b.ck_pos[lowest] : s->b.ck_want[lowest])))
            lowest = i;
    }
    for (int i = 0; slot < 0 && i < s->b.n_ck; i++)
        if (s->b.ck_pos[i] < 0 && s->b.ck_want[i] < 0) slot = i;
    for (int k = 0; slot < 0 && k < s->b.n_ck; k++) {
        if (k == lowest && s->b.n_ck > 1) continue;
        int older = 0;
        for (int i = 0; i < s->b.n_ck; i++)
            older |= (i != lowest || s->b.n_ck == 1) && s->b.ck_age[i] < s->b.ck_age[k];
        if (!older) slot = k;
    }
    return slot;
}

int df_session_checkpoint(df_session *s, df_error *err)
{
    if (s->b.n_ck <= 0) return df_err_set(err, DF_ERR_ARG, -1, "this session keeps no checkpoints (opened with 0)");
    int slot = ck_slot(s, s->b.pos);
    if (s->b.ck_pos[slot] != s->b.pos) {
        size_t nS = kda_state_floats(s->eng), nH = kda_hist_floats(s->eng);
        float *dst = s->b.ck_state + (size_t)slot * (nS + nH);
        memcpy(dst, s->b.kda_S, nS * sizeof(float));
        memcpy(dst + nS, s->b.kda_hist, nH * sizeof(float));
    }
    s->b.ck_pos[slot] = s->b.pos;
    s->b.ck_want[slot] = -1;
    s->b.ck_age[slot] = ++s->b.ck_clock;
    return 0;
}

int df_session_checkpoint_at(df_session *s, int pos, df_error *err)
{
    if (s->b.n_ck <= 0) return df_err_set(err, DF_ERR_ARG, -1, "this session keeps no checkpoints (opened with 0)");
    if (pos == s->b.pos) return df_session_checkpoint(s, err);
    if (pos < s->b.pos || pos > s->b.n_ctx)
        return df_err_set(err, DF_ERR_ARG, -1, "cannot keep a checkpoint at position %d: the session holds %d, "
                          "context %d (positions ahead only)", pos, s->b.pos, s->b.n_ctx);
    int slot = ck_slot(s, pos);
    s->b.ck_pos[slot] = -1;
    s->b.ck_want[slot] = pos;
    s->b.ck_age[slot] = ++s->b.ck_clock;
    return 0;
}

/* After a pass over positions (p0, p1]: the checkpoints asked for there are
 * complete (every KDA layer copied its heads), or, when the pass failed,
 * partial and dropped. */
static void ck_settle(df_session *s, int p0, int p1, int ok)
{
    for (int i = 0; i < s->b.n_ck; i++) {
        int w = s->b.ck_want[i];
        if (w <= p0 || w > p1) continue;
        if (ok) s->b.ck_pos[i] = w;
        s->b.ck_want[i] = -1;
    }
}

int df_session_reachable(const df_session *s, int pos)
{
    if (pos >= s->b.pos) return s->b.pos;
    if (pos < 0) return 0;
    if (s->b.rb_mark >= 0 && pos >= s->b.rb_mark) return pos;
    int best = 0;
    for (int i = 0; i < s->b.n_ck; i++)
        if (s->b.ck_pos[i] <= pos && s->b.ck_pos[i] > best) best = s->b.ck_pos[i];
    return best;
}

int df_session_copy_prefix(df_session *dst, const df_session *src, int pos, df_error *err)
{
    if (dst == src || dst->eng != src->eng || dst->b.n_ctx != src->b.n_ctx)
        return df_err_set(err, DF_ERR_ARG, -1, "copying a session prefix needs two sessions of one engine and context");
    if (pos <= 0 || pos > src->b.pos)
        return df_err_set(err, DF_ERR_ARG, -1, "cannot copy position %d: the session holds %d", pos, src->b.pos);
    size_t nS = kda_state_floats(src->eng), nH = kda_hist_floats(src->eng);
    const float *kS = NULL, *kH = NULL;
    if (pos == src->b.pos) {
        kS = src->b.kda_S;
        kH = src->b.kda_hist;
    }
    for (int i = 0; !kS && i < src->b.n_ck; i++)
        if (src->b.ck_pos[i] == pos) {
            kS = src->b.ck_state + (size_t)i * (nS + nH);
            kH = kS + nS;
        }
    if (!kS)
        return df_err_set(err, DF_ERR_ARG, -1, "cannot copy position %d: neither the session's end (%d) nor a "
                          "checkpoint", pos, src->b.pos);
    memcpy(dst->b.kda_S, kS, nS * sizeof(float));
    memcpy(dst->b.kda_hist, kH, nH * sizeof(float));
    const k3_config *c = &src->eng->m.cfg;
    size_t row_w = (size_t)(c->Rkv + c->dr), ctx_row = (size_t)src->b.n_ctx * row_w;
    for (int l = 0; l < src->eng->m.n_mla; l++)
        memcpy(dst->b.mla_cache + (size_t)l * ctx_row, src->b.mla_cache + (size_t)l * ctx_row,
               (size_t)pos * row_w * sizeof(float));
    dst->b.pos = pos;
    dst->b.rb_mark = -1;
    for (int i = 0; i < dst->b.n_ck; i++) dst->b.ck_pos[i] = dst->b.ck_want[i] = -1;
    /* the copied prefix stays reachable in dst too */
    return dst->b.n_ck > 0 ? df_session_checkpoint(dst, err) : 0;
}

/* Back to checkpoint position pos (the caller found it). */
static void restore_checkpoint(df_session *s, int pos)
{
    size_t nS = kda_state_floats(s->eng), nH = kda_hist_floats(s->eng);
    for (int i = 0; i < s->b.n_ck; i++)
        if (s->b.ck_pos[i] == pos) {
            const float *src = s->b.ck_state + (size_t)i * (nS + nH);
            memcpy(s->b.kda_S, src, nS * sizeof(float));
            memcpy(s->b.kda_hist, src + nS, nH * sizeof(float));
            s->b.ck_age[i] = ++s->b.ck_clock;
            return;
        }
}

int df_session_truncate(df_session *s, int pos, df_error *err)
{
    if (pos < 0 || pos > s->b.pos)
        return df_err_set(err, DF_ERR_ARG, -1, "cannot truncate to position %d: the session holds %d", pos, s->b.pos);
    if (pos == s->b.pos) return 0;
    if (pos == 0) {
        df_session_reset(s);
        return 0;
    }
    if (df_session_reachable(s, pos) == pos && (s->b.rb_mark < 0 || pos < s->b.rb_mark)) {
        /* a checkpoint: the state as it was there; later ones and the mark are gone */
        restore_checkpoint(s, pos);
        for (int i = 0; i < s->b.n_ck; i++) {
            if (s->b.ck_pos[i] > pos) s->b.ck_pos[i] = -1;
            s->b.ck_want[i] = -1;
        }
        s->b.rb_mark = -1;
        s->b.pos = pos;
        return 0;
    }
    if (s->b.rb_mark < 0)
        return df_err_set(err, DF_ERR_ARG, -1,
                          "cannot roll back to position %d: no mark or checkpoint is held there "
                          "(df_session_mark, or more rows than rollback_rows %d evaluated since)",
                          pos, s->b.rb_rows);
    if (pos < s->b.rb_mark)
        return df_err_set(err, DF_ERR_ARG, -1, "cannot roll back to position %d: the mark is at %d", pos,
                          s->b.rb_mark);
    df_engine *eng = s->eng;
    int rows = pos - s->b.rb_mark;
    const k3_config *c = &eng->m.cfg;
    memcpy(s->b.kda_S, s->b.kda_S0, kda_state_floats(s->eng) * sizeof(float));
    memcpy(s->b.kda_hist, s->b.kda_hist0, kda_hist_floats(s->eng) * sizeof(float));
    if (rows > 0) {
        alloc_guard_enter();
        for (int il = 0; il < c->NL; il++)
            if (eng->m.layers[il].kind == LAYER_KDA) kda_replay(&eng->mc, &s->b, &eng->m.layers[il], rows);
        alloc_guard_leave();
    }
    for (int i = 0; i < s->b.n_ck; i++) {
        if (s->b.ck_pos[i] > pos) s->b.ck_pos[i] = -1;
        s->b.ck_want[i] = -1;
    }
    s->b.pos = pos;
    return 0;
}

const char *df_kernels_chosen(void)
{
    df_error err = {0};
    const char *force = getenv("DF_KERNELS");
    const kernel_table *kt = kernels_select(force, &err);
    return kt ? kt->name : "none";
}

int df_io_uring_works(char *why, size_t n)
{
    df_error err = {0};
    io_queue *q = io_queue_new(4, IO_BACKEND_URING, &err);
    if (!q) {
        snprintf(why, n, "%s", err.msg);
        return 0;
    }
    io_queue_free(q);
    return 1;
}

void df_engine_event(df_engine *eng, const char *json)
{
    if (!eng->events) return;
    fputs(json, eng->events);
    fputc('\n', eng->events);
    fflush(eng->events);
}

int df_session_pos(const df_session *s) { return s->b.pos; }
int df_session_n_ctx(const df_session *s) { return s->b.n_ctx; }
void df_session_set_progress(df_session *s, df_progress_fn fn, void *ctx)
{
    s->progress = fn;
    s->progress_ctx = ctx;
}
int df_session_max_batch(const df_session *s) { return s->b.max_batch; }

int df_argmax(const float *logits, int n)
{
    int best = 0;
    for (int i = 1; i < n; i++)
        if (logits[i] > logits[best]) best = i;
    return best;
}

/* Embedding rows.  A resident trunk keeps the embedding mapped (counted in
 * the plan); a streamed one reads each row from the file into H (BF16 rows
 * land in the row's first half and are widened from the end, so no value is
 * overwritten before it is read): touching rows of a mapping would grow the
 * resident set with every new token, outside the budget. */
static int embed_rows(const df_engine *eng, const int32_t *ids, int T, float *H, df_error *err)
{
    const k3_config *c = &eng->m.cfg;
    size_t es = eng->m.embed.type == W_BF16 ? 2 : 4;
    for (int t = 0; t < T; t++) {
        size_t base = (size_t)ids[t] * c->h;
        float *row = H + (size_t)t * c->h;
        if (eng->ts.on) {
            size_t n = (size_t)c->h * es;
            uint64_t off = eng->m.embed_off + (uint64_t)base * es;
            if (model_pread_fd(eng->m.shards[eng->m.embed_shard].fd, (uint8_t *)row, n, off))
                return df_err_set(err, DF_ERR_IO, (int64_t)off, "%s: reading the embedding row of token %d failed",
                                  eng->m.shards[eng->m.embed_shard].path, ids[t]);
            if (es == 2)
                for (int i = c->h - 1; i >= 0; i--) row[i] = load_bf16(row, (size_t)i);
            continue;
        }
        for (int i = 0; i < c->h; i++)
            row[i] = eng->m.embed.type == W_BF16 ? load_bf16(eng->m.embed.data, base + i) : load_f32(eng->m.embed.data, base + i);
    }
    return 0;
}

static void add_rows(float *dst, const float *src, size_t n)
{
    for (size_t i = 0; i < n; i++) dst[i] = dst[i] + src[i];
}

/* Non-finite values.  A NaN or infinity in a weight (or an overflow)
 * spreads through every later layer into the logits, and greedy decoding
 * of NaN logits is token 0 forever.  So the rows a part of a layer adds to
 * the residual stream are tested where they are added (an exponent test
 * per float, integer OR: O(h) per row against the part's O(h^2) work, and
 * no effect on any value), the earliest layer and part is kept, and the
 * chunk fails at its end with an error naming it.  The logits are tested
 * too (the output norm and lm_head). */
static int any_nonfinite(const float *x, size_t n)
{
    uint32_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, x + i, sizeof u);
        bad |= (uint32_t)((u & 0x7f800000u) == 0x7f800000u);
    }
    return bad != 0;
}

static void check_finite(df_session *s, const float *x, size_t n, int layer, const char *part)
{
    if (s->nf_layer <= layer) return; /* already seen no later than this */
    if (any_nonfinite(x, n)) {
        s->nf_layer = layer;
        s->nf_part = part;
    }
}

/* Row-local work of a chunk (norms, the residual mixes) on every worker
 * when there are enough rows: a row's result is its own, whatever the split. */
typedef struct rows_ctx {
    const float *x, *w, *anc;
    int n, n_anc;
    size_t astride;
    float eps;
    float *y, *probs;
} rows_ctx;

static void norm_range(void *v, size_t a, size_t b, int worker)
{
    (void)worker;
    const rows_ctx *r = v;
    for (size_t t = a; t < b; t++) rmsnorm(r->x + t * r->n, r->w, r->n, r->eps, r->y + t * r->n);
}

static void mix_range(void *v, size_t a, size_t b, int worker)
{
    (void)worker;
    const rows_ctx *r = v;
    size_t n = (size_t)r->n;
    attnres_mix(r->anc + a * n, r->n_anc, r->astride, r->x + a * n, (int)(b - a), r->n, r->w, r->eps, r->y + a * n,
                r->probs ? r->probs + a * (size_t)(r->n_anc + 1) : NULL);
}

enum { ROWS_PAR_MIN = 16 };

static void norm_rows(threadpool *pool, const float *x, const float *w, int T, int n, float eps, float *y)
{
    rows_ctx r = {.x = x, .w = w, .n = n, .eps = eps, .y = y};
    if (T < ROWS_PAR_MIN) norm_range(&r, 0, (size_t)T, 0);
    else parallel_for(pool, (size_t)T, 4, norm_range, &r);
}

/* attnres_mix over T rows (probs: [T][n_anc+1] or NULL) */
static void mix_rows(threadpool *pool, const float *anc, int n_anc, size_t astride, const float *p, int T, int n,
                     const float *nwpw, float eps, float *out, float *probs)
{
    rows_ctx r = {.x = p, .w = nwpw, .anc = anc, .n = n, .n_anc = n_anc, .astride = astride, .eps = eps, .y = out,
                  .probs = probs};
    if (T < ROWS_PAR_MIN) mix_range(&r, 0, (size_t)T, 0);
    else parallel_for(pool, (size_t)T, 4, mix_range, &r);
}

/* Route trace: one JSON line per (position, MoE layer), experts in route
 * order with their weights (--trace; the input of `deltafin cachesim`). */
static void trace_routes(const df_session *s, int il, int T)
{
    const df_engine *eng = s->eng;
    int k = eng->m.cfg.k;
    for (int t = 0; t < T; t++) {
        fprintf(eng->trace, "{\"pos\":%d,\"layer\":%d,\"experts\":[", s->b.pos + t, il);
        for (int j = 0; j < k; j++) fprintf(eng->trace, "%s%d", j ? "," : "", s->b.route_ids[t * k + j]);
        fprintf(eng->trace, "],\"weights\":[");
        for (int j = 0; j < k; j++) fprintf(eng->trace, "%s%.7g", j ? "," : "", (double)s->b.route_w[t * k + j]);
        fprintf(eng->trace, "]}\n");
    }
}

/* Rows [t0, t0 + nt) of layer il up to the MoE block's routed experts:
 * the residual mix, attention (at positions pos0 + t0...), and then either
 * the dense MLP (added to H) or the MoE router (moe_route; with the shared
 * experts' gate and up when the chunk is one block).  dl: the debug record
 * when this block holds the chunk's last position (row ld). */
static int layer_rows(df_session *s, int il, int t0, int nt, int n_anc, int pos0, int one_block, dbg_layer *dl,
                      int ld, df_error *err)
{
    df_engine *eng = s->eng;
    const model_ctx *mc = &eng->mc;
    const k3_config *c = &eng->m.cfg;
    const k3_layer *L = &eng->m.layers[il];
    size_t h = (size_t)c->h, nh = (size_t)nt * h;
    size_t astride = (size_t)s->b.max_batch * h;
    float *H = s->b.H + (size_t)t0 * h;
    const float *anc = s->b.anchors + (size_t)t0 * h;
    int boundary = il % c->B == 0;
    const float *ain = H;
    if (n_anc) {
        mix_rows(eng->pool, anc, n_anc, astride, H, nt, (int)h, L->attn_res_nwpw, c->eps, s->b.ain, s->b.probs);
        ain = s->b.ain;
    }
    if (dl) {
        dl->n_attn_probs = n_anc + 1;
        for (int j = 0; j <= n_anc; j++) dl->attn_probs[j] = n_anc ? s->b.probs[(size_t)ld * (n_anc + 1) + j] : 1.0;
        dl->attn_input_norm = l2norm(ain + (size_t)ld * h, (int)h);
    }
    if (boundary) memcpy(s->b.anchors + (size_t)n_anc++ * astride + (size_t)t0 * h, H, nh * sizeof(float));
    norm_rows(eng->pool, ain, L->input_ln, nt, (int)h, c->eps, s->b.xn);
    s->b.pos = pos0 + t0;
    int rc = 0;
    if (L->kind == LAYER_KDA) kda_forward(mc, &s->b, L, s->b.xn, nt, s->b.att);
    else rc = mla_forward(mc, &s->b, L, s->b.xn, nt, s->b.att, err);
    s->b.pos = pos0;
    if (rc) return -1;
    if (boundary) memcpy(H, s->b.att, nh * sizeof(float));
    else add_rows(H, s->b.att, nh);
    check_finite(s, H, nh, il, L->kind == LAYER_KDA ? "KDA attention" : "MLA attention");
    mix_rows(eng->pool, anc, n_anc, astride, H, nt, (int)h, L->mlp_res_nwpw, c->eps, s->b.min, s->b.probs);
    if (dl) {
        dl->attn_output_norm = l2norm(s->b.att + (size_t)ld * h, (int)h);
        dl->n_mlp_probs = n_anc + 1;
        for (int j = 0; j <= n_anc; j++) dl->mlp_probs[j] = s->b.probs[(size_t)ld * (n_anc + 1) + j];
        dl->mlp_input_norm = l2norm(s->b.min + (size_t)ld * h, (int)h);
    }
    norm_rows(eng->pool, s->b.min, L->post_ln, nt, (int)h, c->eps, s->b.y);
    if (L->moe) {
        moe_route(mc, &s->b, L, s->b.y, t0, nt, one_block);
    } else {
        dense_mlp_forward(mc, &s->b, L, s->b.y, nt, s->b.ffn);
        add_rows(H, s->b.ffn, nh);
        check_finite(s, H, nh, il, "dense MLP");
        if (dl) dl->mlp_output_norm = l2norm(s->b.ffn + (size_t)ld * h, (int)h);
    }
    return 0;
}

/* Rows [t0, t0 + nt) of MoE layer il after its routed experts ran: the
 * shared experts (unless one_block: done during the reads) and the routed
 * sum, added to H.  n_anc: the anchors layer il mixes.  dl: its debug
 * record, filled when the block holds the chunk's last position dt. */
static void finish_block(df_session *s, int il, int n_anc, int t0, int nt, int one_block, dbg_layer *dl, int dt,
                         int tl)
{
    df_engine *eng = s->eng;
    const k3_config *c = &eng->m.cfg;
    const k3_layer *L = &eng->m.layers[il];
    size_t h = (size_t)c->h, astride = (size_t)s->b.max_batch * h;
    float *H = s->b.H + (size_t)t0 * h;
    if (!one_block) {
        /* the block's MoE input again, from the unchanged H and anchors */
        mix_rows(eng->pool, s->b.anchors + (size_t)t0 * h, n_anc, astride, H, nt, (int)h, L->mlp_res_nwpw, c->eps,
                 s->b.min, s->b.probs);
        norm_rows(eng->pool, s->b.min, L->post_ln, nt, (int)h, c->eps, s->b.y);
    }
    moe_finish(&eng->mc, &s->b, L, s->b.y, t0, nt, s->b.ffn, one_block);
    add_rows(H, s->b.ffn, (size_t)nt * h);
    check_finite(s, H, (size_t)nt * h, il, "MoE (router, shared or routed experts)");
    if (dl && t0 == tl) {
        dl->mlp_output_norm = l2norm(s->b.ffn + (size_t)(dt - tl) * h, (int)h);
        dl->partial_sum_norm = l2norm(s->b.H + (size_t)dt * h, (int)h);
    }
}

/* One chunk of T <= max_batch positions, layer by layer: each layer's
 * attention, dense work and routing in blocks of row_block rows, then its
 * routed experts over all T rows (each distinct expert read once per
 * chunk), then the blocks' shared experts and routed sums (interleaved
 * with the next layer's blocks: the wavefront below).  Only H, the
 * anchors and the routed rows are held for every position; every row's
 * result is the same whatever the chunk and block widths (HACKING.md).
 * logits: NULL, or [T][V] when all_rows, or [V] for the last position. */
static int forward_chunk(df_session *s, const int32_t *ids, int T, float *logits, int all_rows, df_error *err)
{
    df_engine *eng = s->eng;
    const model_ctx *mc = &eng->mc;
    const k3_config *c = &eng->m.cfg;
    size_t h = (size_t)c->h;
    size_t astride = (size_t)s->b.max_batch * h;
    dbg_record *dbg = s->dbg && s->dbg->enabled ? s->dbg : NULL;
    int dt = T - 1;  /* debug position: the chunk's last */
    int RB = s->b.row_block, one_block = T <= RB, pos0 = s->b.pos;
    int tl = dt / RB * RB; /* the first row of the last block */
    double t_start = now_sec(), t_layer = t_start;
    uint64_t hits0 = eng->cache.hits, miss0 = eng->cache.misses, bytes0 = eng->m.store.st.bytes_io;
    uint64_t pfi0 = eng->pf.issued, pfu0 = eng->cache.pf_used, late0 = eng->cache.late;
    double wait0 = eng->m.store.st.wait_sec;
    CHECK(T >= 1 && T <= s->b.max_batch);
    if (embed_rows(eng, ids, T, s->b.H, err)) goto fail;
    s->nf_layer = INT_MAX;
    s->nf_part = NULL;
    check_finite(s, s->b.H, (size_t)T * h, -1, "token embedding");
    if (dbg) dbg->embedding_norm = l2norm(s->b.H + dt * h, (int)h);
    int n_anc = 0;
    /* Several blocks, trunk in memory: a MoE layer's blocks are finished
     * one by one inside the next layer's block loop (a wavefront), since
     * block b of layer L+1 needs only block b of layer L.  So the next
     * layer's first block routes, and its reads start, right after this
     * layer's first block is finished, not after all of them.  (A streamed
     * trunk holds only two layers' weights, so it finishes each layer
     * before the next starts.) */
    int wave = !one_block && !eng->ts.on;
    int pend = -1, pend_anc = 0; /* the MoE layer whose blocks are still to finish, its anchor count */
    for (int il = 0; il < c->NL; il++) {
        const k3_layer *L = &eng->m.layers[il];
        dbg_layer *dl = dbg ? &dbg->layers[il] : NULL;
        if (eng->ts.on && trunk_stream_layer(eng, il, err)) goto fail;
        for (int t0 = 0; t0 < T; t0 += RB) {
            int nt = T - t0 < RB ? T - t0 : RB;
            if (pend >= 0) finish_block(s, pend, pend_anc, t0, nt, one_block, dbg ? &dbg->layers[pend] : NULL, dt, tl);
            if (layer_rows(s, il, t0, nt, n_anc, pos0, one_block, t0 == tl ? dl : NULL, dt - tl, err)) goto fail;
            /* the experts these rows need start reading while the next
             * blocks' attention runs */
            if (L->moe && t0 + nt < T) moe_start(mc, &s->b, il, err);
        }
        pend = -1;
        if (il % c->B == 0) n_anc++;
        if (L->moe) {
            /* one block: the shared experts' down-projection overlaps the
             * first reads; several: each block's shared experts run at its finish */
            if (moe_experts(mc, &s->b, il, L, T, one_block ? s->b.ffn : NULL, err)) goto fail;
            if (eng->trace) trace_routes(s, il, T);
            if (dl) {
                /* before the next layer's routing takes these rows */
                dl->n_experts = c->k;
                for (int j = 0; j < c->k && j < DBG_MAX_K; j++) {
                    dl->expert_ids[j] = s->b.route_ids[dt * c->k + j];
                    dl->expert_weights[j] = s->b.route_w[dt * c->k + j];
                }
            }
            if (wave && il + 1 < c->NL) {
                pend = il;
                pend_anc = n_anc;
            } else {
                for (int t0 = 0; t0 < T; t0 += RB)
                    finish_block(s, il, n_anc, t0, T - t0 < RB ? T - t0 : RB, one_block, dl, dt, tl);
            }
        } else if (dl) {
            dl->n_experts = 0;
            dl->partial_sum_norm = l2norm(s->b.H + dt * h, (int)h);
        }
        prefetch_after_layer(mc, &s->b, il, T, s->b.H);
        if (eng->events) {
            double t = now_sec();
            eng->layer_sec[il] = t - t_layer;
            t_layer = t;
        }
    }
    if (eng->ts.on && trunk_stream_layer(eng, c->NL, err)) goto fail;
    /* the output mix and norm, by block; the last position alone when only
     * its logits are wanted */
    for (int t0 = all_rows ? 0 : dt; t0 < T; t0 += RB) {
        int nt = T - t0 < RB ? T - t0 : RB;
        mix_rows(eng->pool, s->b.anchors + (size_t)t0 * h, n_anc, astride, s->b.H + (size_t)t0 * h, nt, (int)h,
                 eng->m.out_res_nwpw, c->eps, s->b.ain, NULL);
        norm_rows(eng->pool, s->b.ain, eng->m.final_norm, nt, (int)h, c->eps, s->b.xn);
        if (dbg && t0 + nt == T) {
            dbg->final_mix_norm = l2norm(s->b.ain + (size_t)(dt - t0) * h, (int)h);
            dbg->final_normed_norm = l2norm(s->b.xn + (size_t)(dt - t0) * h, (int)h);
        }
        if (logits) {
            float *lr = all_rows ? logits + (size_t)t0 * c->V : logits;
            mm_one(eng->pool, eng->kt, eng->m.lm_head, s->b.xn, nt, lr);
            check_finite(s, lr, (size_t)(all_rows ? nt : 1) * c->V, c->NL, "output norm and lm_head");
        }
    }
    if (s->nf_layer != INT_MAX) {
        /* the session's state past this chunk's start is not usable: its
         * position stays where it was and the caller resets or truncates */
        if (s->nf_layer < 0 || s->nf_layer >= c->NL)
            df_err_set(err, DF_ERR_NUMERIC, -1,
                       "non-finite values (NaN or infinity) at positions %d-%d, first in the %s: the model's "
                       "weights hold a NaN or infinity there, or the values overflowed",
                       pos0, pos0 + T - 1, s->nf_part);
        else
            df_err_set(err, DF_ERR_NUMERIC, -1,
                       "non-finite values (NaN or infinity) at positions %d-%d, first in layer %d's %s "
                       "(model.layers.%d): the model's weights hold a NaN or infinity there, or the values overflowed",
                       pos0, pos0 + T - 1, s->nf_layer, s->nf_part, s->nf_layer);
        goto fail;
    }
    if (logits && dbg) dbg->logits_norm = l2norm(all_rows ? logits + (size_t)dt * c->V : logits, c->V);
    if (eng->events) {
        /* one JSON line per forward call (per token while decoding) */
        double dt_s = now_sec() - t_start, wait = eng->m.store.st.wait_sec - wait0;
        uint64_t hits = eng->cache.hits - hits0, miss = eng->cache.misses - miss0;
        uint64_t bytes = eng->m.store.st.bytes_io - bytes0;
        fprintf(eng->events,
                "{\"pos\":%d,\"tokens\":%d,\"ms\":%.3f,\"expert_hits\":%llu,\"expert_misses\":%llu,"
                "\"hit_rate\":%.4f,\"bytes_read\":%llu,\"io_wait_ms\":%.3f,\"io_wait_share\":%.4f,"
                "\"read_gbps\":%.3f,\"prefetch\":%d,\"prefetch_issued\":%llu,\"prefetch_used\":%llu,"
                "\"prefetch_late\":%llu,\"layer_ms\":[",
                s->b.pos, T, 1e3 * dt_s, (unsigned long long)hits, (unsigned long long)miss,
                hits + miss ? (double)hits / (double)(hits + miss) : 1.0, (unsigned long long)bytes, 1e3 * wait,
                dt_s > 0 ? wait / dt_s : 0.0, dt_s > 0 ? (double)bytes / dt_s / 1e9 : 0.0, eng->pf.active,
                (unsigned long long)(eng->pf.issued - pfi0), (unsigned long long)(eng->cache.pf_used - pfu0),
                (unsigned long long)(eng->cache.late - late0));
        for (int il = 0; il < c->NL; il++) fprintf(eng->events, "%s%.3f", il ? "," : "", 1e3 * eng->layer_sec[il]);
        fprintf(eng->events, "]}\n");
        fflush(eng->events);
    }
    prefetch_step_timed(&eng->pf, T, now_sec() - t_start, eng->mc.quiet);
    s->b.pos += T;
    eng->tokens += (uint64_t)T;
    /* predictions may still be reading: they are taken in by later waits
     * (or when a group needs their slots), never waited for here */
    return 0;
fail:
    moe_abandon(&eng->mc, &s->b);
    fetch_drain(&eng->mc, NULL);
    return -1;
}

static int eval_impl(df_session *s, const int32_t *ids, int n, float *logits, int all_rows, df_rows_fn each,
                     void *each_ctx, df_error *err);

int df_session_eval(df_session *s, const int32_t *ids, int n, float *logits, int all_rows, df_error *err)
{
    return eval_impl(s, ids, n, logits, all_rows, NULL, NULL, err);
}

int df_session_eval_each(df_session *s, const int32_t *ids, int n, float *rows, df_rows_fn each, void *ctx,
                         df_error *err)
{
    return eval_impl(s, ids, n, rows, 1, each, ctx, err);
}

static int eval_impl(df_session *s, const int32_t *ids, int n, float *logits, int all_rows, df_rows_fn each,
                     void *each_ctx, df_error *err)
{
    const k3_config *c = &s->eng->m.cfg;
    if (n <= 0) return df_err_set(err, DF_ERR_ARG, -1, "no tokens to evaluate");
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= c->V)
            return df_err_set(err, DF_ERR_ARG, i, "token id %d at index %d is outside the vocabulary [0, %d)", ids[i],
                              i, c->V);
    if (n > s->b.n_ctx - s->b.pos)
        return df_err_set(err, DF_ERR_LIMIT, -1, "context full: %d tokens held, %d more requested, capacity %d",
                          s->b.pos, n, s->b.n_ctx);
    /* rows past what the mark can take back: the mark is dropped */
    if (s->b.rb_mark >= 0 && s->b.pos + n - s->b.rb_mark > s->b.rb_rows) s->b.rb_mark = -1;
    int rc = 0;
    df_engine *eng = s->eng;
    uint64_t reads0 = eng->m.store.st.n_reads, bytes0 = eng->m.store.st.bytes_read;
    double t0 = now_sec();
    if (n > 1) {
        /* a prompt: count the distinct (layer, expert) pairs it needs */
        memset(s->b.seen, 0, (size_t)c->NL * (size_t)c->E);
        s->b.n_seen = 0;
    }
    alloc_guard_enter();
    for (int off = 0; off < n && !rc; off += s->b.max_batch) {
        int T = n - off < s->b.max_batch ? n - off : s->b.max_batch;
        int last = off + T == n;
        float *dst = NULL;
        if (logits && each) dst = logits; /* one chunk's rows at a time, handed to each */
        else if (logits && all_rows) dst = logits + (size_t)off * c->V;
        else if (logits && last) dst = logits;
        int p0 = s->b.pos;
        rc = forward_chunk(s, ids + off, T, dst, all_rows, err);
        ck_settle(s, p0, p0 + T, !rc);
        if (!rc && each) {
            alloc_guard_leave();
            if (each(each_ctx, dst, T)) rc = df_err_set(err, DF_ERR_IO, off, "the rows' consumer failed");
            alloc_guard_enter();
        }
        if (!rc && s->progress && off + T < n) {
            alloc_guard_leave();
            s->progress(s->progress_ctx, off + T, n);
            alloc_guard_enter();
        }
    }
    alloc_guard_leave();
    if (n > 1) {
        prompt_stats *ps = &eng->prompt;
        ps->positions = (uint64_t)n;
        ps->chunk = s->b.max_batch;
        ps->unique = s->b.n_seen;
        ps->reads = eng->m.store.st.n_reads - reads0;
        ps->bytes = eng->m.store.st.bytes_read - bytes0;
        ps->seconds = now_sec() - t0;
    }
    return rc;
}
