/* engine_plan.c - the memory plan of an engine (plan.c decides): the sizes
 * the planner needs, read from the loaded headers (a session counted by
 * session_alloc's dry run, times the planned sessions), serve's default
 * context and number of checkpoints, and df_plan_model (the plan of a model
 * from its config and headers alone, no weight read).
 */
#define _GNU_SOURCE
#include "heat.h"
#include "expert_fetch.h"
#include "plan.h"
#include "prefetch.h"
#include "engine_impl.h"
#include "families.h"
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
        /* --batch auto: scratch is linear in the batch from the row slice
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
        sz->scratch_per_row = (sb - sa + 255) / 256; /* rounded up: the line bounds every batch */
        size_t base_a = sa - 256 * sz->scratch_per_row, base_1 = s1 - sz->scratch_per_row;
        sz->scratch_base = base_1 > base_a ? base_1 : base_a;
        sz->scratch_default = sd;
    }
    /* an experts-only rank never touches the trunk (mapped, never read) */
    sz->trunk_bytes = eng->experts_only ? 0 : eng->m.trunk_mapped_bytes - eng->m.embed_bytes;
    sz->embed_bytes = eng->experts_only ? 0 : eng->m.embed_bytes;
    sz->vec_bytes = eng->m.owned_bytes;
    sz->stream_buf_bytes = eng->experts_only ? 0 : trunk_stream_buffer_bytes(eng);
    if (!eng->experts_only) {
        if (!eng->layer_bytes) {
            eng->layer_bytes = xcalloc((size_t)c->NL + 1, sizeof *eng->layer_bytes);
            eng->layer_span = xcalloc((size_t)c->NL + 1, sizeof *eng->layer_span);
            trunk_layer_sizes(eng, eng->layer_bytes, eng->layer_span);
        }
        sz->n_trunk_layers = c->NL + 1;
        sz->layer_bytes = eng->layer_bytes;
        sz->layer_span = eng->layer_span;
    }
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

/* serve's default number of checkpoints per conversation (plan_checkpoints
 * -1): as many as take at most 1/64 of the budget over all the planned
 * sessions, at least 2 (where the system prompt and tools end, and where
 * the last message ends) and at most 8.  K3's cost 443 MiB each: 2 up
 * to 64 GiB, 4 at 128 GiB, 8 from 256 GiB. */
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
        return df_err_set(err, DF_ERR_ARG, -1, "unknown cache policy \"%s\" (expected lfu, tlfu, lru or lfu-steps)", cache_policy);
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
    engine_trunk_types(&eng->m, p->trunk_types, sizeof p->trunk_types, &p->trunk_quantized);
    engine_expert_types(&eng->m, p->expert_types, sizeof p->expert_types, &p->experts_requantized);
    return rc;
}

/* Decide the plan (plan.c), then act on it: the expert cache, the trunk
 * streamed or copied resident.  Nothing is allocated before the plan holds. */
int engine_plan_memory(df_engine *eng, const df_engine_opts *o, df_error *err)
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
        if (trunk_stream_init(eng, p->trunk_resident_n ? p->trunk_resident_layer : NULL, err)) return -1;
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

static int ends_with(const char *s, const char *suf)
{
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && !strcmp(s + a - b, suf);
}

int engine_model_load(k3_model *m, const char *path, df_error *err)
{
    /* the family the model states (families.h): the engine runs the
     * target families (K3); another family's model drafts beside one.  A type no
     * family reads, or none, is left to K3's loader, which names what is
     * wrong with it as a K3 */
    char type[128];
    df_error fe = {0};
    const df_family *f = family_type_of(path, type, sizeof type, &fe) ? NULL : family_named(type);
    if (f && !f->target)
        return df_err_set(err, DF_ERR_UNSUPPORTED, -1,
                          "%s is a %s model (\"%s\"): deltafin runs it as a drafter beside a K3 target "
                          "(--draft model:%s), not as the model itself",
                          path, f->title, type, path);
    return model_load(m, path, err);
}

int df_plan_model(const char *path, const df_plan_opts *o, df_plan *p, df_model_info *info, df_error *err)
{
    df_plan_opts def;
    if (!o) {
        memset(&def, 0, sizeof def);
        o = &def;
    }
    memset(p, 0, sizeof *p);
    enum wtype syn = W_BF16;
    if (o->trunk_type && *o->trunk_type) {
        if (!ends_with(path, ".json"))
            return df_err_set(err, DF_ERR_ARG, -1, "--trunk %s: a what-if for a config.json alone; a model's own "
                              "files are planned with the types they hold", o->trunk_type);
        if (!strcmp(o->trunk_type, "q8_0")) syn = W_Q8_0;
        else if (!strcmp(o->trunk_type, "f16")) syn = W_F16;
        else if (strcmp(o->trunk_type, "bf16"))
            return df_err_set(err, DF_ERR_ARG, -1, "--trunk %s: expected bf16, f16 or q8_0", o->trunk_type);
    }
    df_engine *eng = xcalloc(1, sizeof *eng);
    eng->n_ranks = df_ranks_size();
    eng->m.headers_only = 1;
    eng->m.io_mode = IO_BUFFERED; /* no read probe: nothing is read */
    eng->m.io_backend = IO_BACKEND_THREADS;
    eng->m.io_depth = 1;
    eng->n_threads = o->n_threads > 0 ? o->n_threads : (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (eng->n_threads < 1) eng->n_threads = 1;
    eng->m.syn_trunk = syn;
    int rc = ends_with(path, ".json") ? model_load_config_only(&eng->m, path, err) : engine_model_load(&eng->m, path, err);
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
    free(eng->layer_bytes);
    free(eng->layer_span);
    free(eng);
    return rc;
}
