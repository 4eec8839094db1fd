/* engine_info.c - what the engine reports about itself (engine.h): the
 * model's shape and sizes (df_engine_info, also for df_plan_model's dry
 * run), a streamed install's description, the run's counters (expert
 * cache, store, remote, prefetch, prompt, trunk stream), the kernels and
 * io_uring a run would get.  Reads only; changes nothing it reports on.
 */
#define _GNU_SOURCE
#include "engine_impl.h"
#include "expert_remote.h"
#include "gguf.h"
#include "util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The trunk matrices' types, by their bytes, most first ("q8_0+bf16"). */
static const char *wmat_type_name(const wmat *w)
{
    switch (w->type) {
    case W_F32: return "f32";
    case W_BF16: return "bf16";
    case W_F16: return "f16";
    case W_Q8_0: return "q8_0";
    case W_QB: return w->qb->name;
    default: return "mxfp4";
    }
}

/* Type names, lower case, joined by '+' in the order of their bytes, most
 * first ("q8_0+bf16"); name[] and bytes[] (nt entries) are consumed. */
static void join_by_bytes(const char **name, uint64_t *bytes, int nt, char *out, size_t n)
{
    out[0] = 0;
    for (int done = 0; done < nt; done++) {
        int best = -1;
        for (int k = 0; k < nt; k++)
            if (name[k] && (best < 0 || bytes[k] > bytes[best])) best = k;
        size_t l = strlen(out);
        snprintf(out + l, n - l, "%s", l ? "+" : "");
        for (const char *c = name[best]; *c && strlen(out) + 1 < n; c++) {
            l = strlen(out);
            out[l] = (char)(*c >= 'A' && *c <= 'Z' ? *c - 'A' + 'a' : *c);
            out[l + 1] = 0;
        }
        name[best] = NULL;
    }
}

/* name[] / bytes[] of up to 16 types: t's entry, added when new */
static int type_slot(const char **name, uint64_t *bytes, int *nt, const char *t)
{
    int k = 0;
    while (k < *nt && strcmp(name[k], t)) k++;
    if (k == *nt && *nt < 16) name[*nt] = t, bytes[(*nt)++] = 0;
    return k < *nt ? k : -1;
}

void engine_trunk_types(const k3_model *m, char *out, size_t n, int *quantized)
{
    const char *name[16];
    uint64_t bytes[16];
    int nt = 0;
    *quantized = 0;
    for (int i = 0; i < m->n_trunk; i++) {
        const wmat *w = m->trunk[i].w;
        if (w->type == W_Q8_0 || w->type == W_QB) *quantized = 1;
        int k = type_slot(name, bytes, &nt, wmat_type_name(w));
        if (k >= 0) bytes[k] += m->trunk[i].nbytes;
    }
    join_by_bytes(name, bytes, nt, out, n);
}

/* The routed experts' types, by their bytes, most first ("mxfp4" as K3
 * ships them; "q4_k+q6_k" for a K-quant mix).  requantized: some piece is
 * not MXFP4, so the experts are not the released weights. */
void engine_expert_types(const k3_model *m, char *out, size_t n, int *requantized)
{
    const expert_store *st = &m->store;
    *requantized = 0;
    snprintf(out, n, "mxfp4");
    if (!st->ggml) return;
    const char *name[16];
    uint64_t bytes[16];
    int nt = 0;
    for (int il = 0; il < st->n_layers; il++) {
        if (!m->cfg.layer_moe[il]) continue;
        for (int p = 0; p < 3; p++) {
            uint32_t t = st->gg_type[il * 3 + p];
            const qblock_fmt *f = qblock_fmt_of_ggml(t);
            const char *tn = t == GGML_TYPE_MXFP4 ? "mxfp4" : t == GGML_TYPE_F32 ? "f32" : t == GGML_TYPE_F16 ? "f16"
                             : t == GGML_TYPE_BF16 ? "bf16" : f ? f->name : "?";
            if (t != GGML_TYPE_MXFP4) *requantized = 1;
            int k = type_slot(name, bytes, &nt, tn);
            if (k >= 0) bytes[k] += st->gg_bytes[il * 3 + p];
        }
    }
    join_by_bytes(name, bytes, nt, out, n);
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
    info->layer_moe = c->layer_moe;
    info->bos_id = c->bos;
    info->eos_id = c->eos;
    info->pad_id = c->pad;
    info->expert_bytes = eng->m.store.expert_bytes;
    info->ctx_bytes_per_token = (uint64_t)eng->m.n_mla * (uint64_t)(c->Rkv + c->dr) * sizeof(float);
    info->fixed_state_bytes = (uint64_t)eng->m.n_kda *
                              ((uint64_t)c->Hk * c->Dk * c->Dk + 3ull * (uint64_t)(c->Wc - 1) * c->P) * sizeof(float);
    info->kernels = eng->bk.kt ? eng->bk.kt->name : "";
    engine_trunk_types(&eng->m, info->trunk, sizeof info->trunk, &info->trunk_quantized);
    engine_expert_types(&eng->m, info->experts, sizeof info->experts, &info->experts_requantized);
    info->backend = eng->bk.name;
    info->n_threads = eng->n_threads;
    info->n_cache_slots = eng->cache.n_slots;
    const k3_model *m = &eng->m;
    uint64_t tp = 0, tb = 0;
    for (int i = 0; i < m->n_trunk; i++) {
        const trunk_tensor *t = &m->trunk[i];
        if (t->layer < 0) continue;
        tb += t->nbytes;
        if (t->layer < c->NL) tp += (uint64_t)t->w->rows * (uint64_t)t->w->cols;
    }
    int n_moe = 0;
    for (int il = 0; il < c->NL; il++) n_moe += c->layer_moe[il] != 0;
    uint64_t eb = 0; /* one position's k experts over the MoE layers, at each layer's piece sizes */
    for (int il = 0; il < c->NL; il++) {
        if (!c->layer_moe[il]) continue;
        uint64_t one = m->store.expert_bytes;
        if (m->store.ggml) one = m->store.gg_bytes[il * 3] + m->store.gg_bytes[il * 3 + 1] + m->store.gg_bytes[il * 3 + 2];
        eb += (uint64_t)c->k * one;
    }
    info->trunk_flops_per_position = 2 * tp;
    info->expert_flops_per_position = 2ull * (uint64_t)n_moe * (uint64_t)c->k * 3ull * (uint64_t)c->I * (uint64_t)c->Lt;
    info->weight_bytes_per_token = tb + eb;
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

/* One knob: --backend (or its spelling --kernels ISA = cpu:ISA), else
 * $DF_BACKEND (or $DF_KERNELS = cpu:ISA), else "cpu".  A flag beats the
 * environment; two spellings at one level that name different backends are
 * an error, not a silent choice. */
static int one_level(const char *backend, const char *kernels, const char *what_b, const char *what_k, char *out,
                     size_t n, df_error *err)
{
    char k[64] = "";
    if (kernels && *kernels) snprintf(k, sizeof k, "cpu:%s", kernels);
    if (backend && *backend && *k) {
        int same = !strcmp(backend, k) || (!strcmp(backend, "cpu:scalar") && !strcmp(k, "cpu:ref")) ||
                   (!strcmp(backend, "cpu:ref") && !strcmp(k, "cpu:scalar"));
        if (!same)
            return df_err_set(err, DF_ERR_ARG, -1, "%s %s and %s %s name different backends (%s is %s): give one",
                              what_b, backend, what_k, kernels, what_k, k);
    }
    if (backend && *backend) snprintf(out, n, "%s", backend);
    else if (*k) snprintf(out, n, "%s", k);
    return 0;
}

int engine_backend_spec(const char *backend, const char *kernels, char *out, size_t n, df_error *err)
{
    out[0] = 0;
    if (one_level(backend, kernels, "--backend", "--kernels", out, n, err)) return -1;
    if (!out[0] && one_level(getenv("DF_BACKEND"), getenv("DF_KERNELS"), "$DF_BACKEND", "$DF_KERNELS", out, n, err))
        return -1;
    if (!out[0]) snprintf(out, n, "cpu");
    return 0;
}

const char *df_kernels_chosen(void)
{
    static char name[32];
    df_error err = {0};
    char spec[64];
    k3_backend bk;
    if (engine_backend_spec(NULL, NULL, spec, sizeof spec, &err) || k3_backend_open(&bk, spec, 1, &err))
        return "none";
    snprintf(name, sizeof name, "%s", bk.kt->name);
    k3_backend_close(&bk);
    return name;
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
