/* moe.c - the K3 FFN blocks: latent MoE with shared experts (spec section 7)
 * and the dense first-layer MLP (7.4).
 *
 * Data path: moe -> expert_cache -> expert_store.  For a batch, the routed
 * experts of all positions are collected once (each distinct expert is
 * acquired and, on a miss, read once), the inputs routed to one expert are
 * gathered into consecutive rows, and each expert's three MXFP4 products run
 * as jobs of one job list.  Each (position, route slot) output lands in its
 * own row; the weighted sum then runs per position in route order (the
 * descending biased score), so the result does not depend on which other
 * positions share the batch.  When more distinct experts are needed than the
 * cache has slots, they are processed in groups.
 */
#include "model.h"
#include "mathfn.h"
#include "quant.h"
#include "util.h"

#include <math.h>
#include <string.h>

static void situ_rows(const float *g, const float *u, size_t n, float b1, float b2, float *out)
{
    df_situ_n(g, u, n, b1, b2, out);
}

void dense_mlp_forward(df_session *s, const k3_layer *L, const float *y, int T, float *out)
{
    df_engine *eng = s->eng;
    const k3_config *c = &eng->cfg;
    mm_job jobs[2] = {
        {.w = L->gate, .x = y, .xs = (size_t)c->h, .y = s->big0, .ys = (size_t)c->Dff, .T = T},
        {.w = L->up, .x = y, .xs = (size_t)c->h, .y = s->big1, .ys = (size_t)c->Dff, .T = T},
    };
    mm_run(eng->pool, eng->kt, jobs, 2);
    situ_rows(s->big0, s->big1, (size_t)T * c->Dff, c->b1, c->b2, s->big0);
    mm_one(eng->pool, eng->kt, L->down, s->big0, T, out);
}

/* Top-k by biased score, descending; ties go to the lower expert id. */
static void route(const k3_config *c, const float *logits, const float *bias, int *ids, float *w, float *sig,
                  float *choice)
{
    for (int e = 0; e < c->E; e++) {
        sig[e] = df_sigmoidf(logits[e]);
        choice[e] = sig[e] + bias[e];
    }
    double sum = 0.0;
    for (int j = 0; j < c->k; j++) {
        int best = -1;
        for (int e = 0; e < c->E; e++) {
            if (choice[e] == -INFINITY) continue;
            if (best < 0 || choice[e] > choice[best]) best = e;
        }
        ids[j] = best;
        choice[best] = -INFINITY;
        sum += sig[best];
    }
    for (int j = 0; j < c->k; j++) w[j] = (float)((double)sig[ids[j]] / (sum + 1e-20) * (double)c->rsf);
}

static wmat expert_mat(const expert_store *st, const expert_loc *loc, const uint8_t *slot, int p, int rows, int cols)
{
    wmat m = {.type = st->ggml ? W_MXFP4_GG : W_MXFP4, .rows = rows, .cols = cols};
    m.data = expert_store_proj(st, loc, slot, p, &m.scales);
    return m;
}

/* The three MXFP4 products of the listed distinct experts (indices into
 * s->uniq), each over the rows gathered for it. */
static void run_experts(df_session *s, int il, const int *us, int n)
{
    df_engine *eng = s->eng;
    const k3_config *c = &eng->cfg;
    int E = c->E, Lt = c->Lt, I = c->I;
    mm_job jobs[MM_MAX_JOBS];
    int nj = 0;
    CHECK(n > 0 && 2 * n <= MM_MAX_JOBS);
    for (int i = 0; i < n; i++) {
        int u = us[i];
        const expert_loc *loc = &eng->store.loc[(size_t)il * E + (size_t)s->uniq[u]];
        const uint8_t *slot = s->uniq_slot[u];
        size_t r0 = (size_t)s->uniq_first[u];
        int nt = s->uniq_count[u];
        jobs[nj++] = (mm_job){.w = expert_mat(&eng->store, loc, slot, 0, I, Lt), .x = s->g_x + r0 * Lt,
                              .xs = (size_t)Lt, .y = s->g_h1 + r0 * I, .ys = (size_t)I, .T = nt};
        jobs[nj++] = (mm_job){.w = expert_mat(&eng->store, loc, slot, 2, I, Lt), .x = s->g_x + r0 * Lt,
                              .xs = (size_t)Lt, .y = s->g_h3 + r0 * I, .ys = (size_t)I, .T = nt};
    }
    mm_run(eng->pool, eng->kt, jobs, nj);
    for (int i = 0; i < n; i++) {
        int u = us[i];
        for (int r = s->uniq_first[u]; r < s->uniq_first[u] + s->uniq_count[u]; r++) {
            float *h1 = s->g_h1 + (size_t)r * I, *h3 = s->g_h3 + (size_t)r * I;
            situ_rows(h1, h3, (size_t)I, c->b1, c->b2, h1);
            mxfp4_prep_x(h1, I, s->g_a + (size_t)r * I);
        }
    }
    nj = 0;
    for (int i = 0; i < n; i++) {
        int u = us[i];
        const expert_loc *loc = &eng->store.loc[(size_t)il * E + (size_t)s->uniq[u]];
        size_t r0 = (size_t)s->uniq_first[u];
        jobs[nj++] = (mm_job){.w = expert_mat(&eng->store, loc, s->uniq_slot[u], 1, Lt, I), .x = s->g_a + r0 * I,
                              .xs = (size_t)I, .y = s->g_out + r0 * Lt, .ys = (size_t)Lt, .T = s->uniq_count[u]};
    }
    mm_run(eng->pool, eng->kt, jobs, nj);
}

/* Read tags: a demand read carries its index into s->uniq; a prefetch
 * carries PF_TAG | layer << 16 | expert. */
#define PF_TAG ((int64_t)1 << 31)

/* A prefetch read landed (or failed).  Returns the index u of the current
 * group's expert it satisfies, or -1. */
static int prefetch_landed(df_session *s, int64_t tag, int ok, int cur_il, int u0, int u1)
{
    df_engine *eng = s->eng;
    int il = (int)((tag >> 16) & 0x7FFF), e = (int)(tag & 0xFFFF);
    int waiting = -1;
    if (il == cur_il)
        for (int u = u0; u < u1; u++)
            if (s->uniq[u] == e && !s->uniq_state[u]) waiting = u;
    if (ok) {
        expert_cache_filled(&eng->cache, il, e);
        expert_cache_release(&eng->cache, il, e); /* the prefetch's own pin */
        eng->pf_landed++;
    } else if (waiting < 0) {
        expert_cache_abort(&eng->cache, il, e);
    }
    return waiting;
}

/* Acquire experts uniq[u0..u1) and queue the misses' reads (submitted
 * together, sorted by offset).  An expert a prefetch is already reading is
 * waited for, not read twice.  Returns how many experts must still arrive;
 * *failed = -1 when a read could not even be queued (the group is still
 * finished normally, so every started read is waited for and every slot
 * given back). */
static int experts_begin(df_session *s, int il, int u0, int u1, int *n_ready, int *failed, df_error *err)
{
    df_engine *eng = s->eng;
    int n_wait = 0, rc = 0;
    *n_ready = 0;
    for (int u = u0; u < u1; u++) {
        int e = s->uniq[u], r;
        while ((r = expert_cache_acquire(&eng->cache, il, e, &s->uniq_slot[u])) == EC_FULL) {
            /* every free slot is held by prefetches still reading (from an
             * earlier call): take their completions, which unpin them */
            int64_t tags[64];
            int ok[64], n = expert_store_wait(&eng->store, tags, ok, 64, err);
            CHECK(n > 0); /* a group never exceeds the slot count */
            for (int i = 0; i < n; i++) {
                CHECK(tags[i] & PF_TAG); /* this group's own reads are not submitted yet */
                int w = prefetch_landed(s, tags[i], ok[i], il, u0, u);
                if (w >= 0 && ok[i]) {
                    s->uniq_state[w] = 1;
                    s->ready_list[(*n_ready)++] = w;
                    n_wait--;
                } else if (w >= 0) {
                    rc = -1;
                    n_wait--;
                }
            }
        }
        s->uniq_state[u] = r == EC_HIT;
        if (r == EC_HIT) {
            s->ready_list[(*n_ready)++] = u;
        } else {
            n_wait++;
            if (r == EC_MISS && !rc && expert_store_queue(&eng->store, il, e, s->uniq_slot[u], u, err)) rc = -1;
        }
    }
    expert_store_flush(&eng->store);
    *failed = rc;
    return n_wait;
}

/* Take every completion, including prefetches for later layers. */
int moe_drain_prefetches(df_session *s, df_error *err)
{
    df_engine *eng = s->eng;
    int64_t tags[64];
    int ok[64], n, rc = 0;
    while ((n = expert_store_wait(&eng->store, tags, ok, 64, err)) > 0)
        for (int i = 0; i < n; i++) {
            CHECK(tags[i] & PF_TAG);
            prefetch_landed(s, tags[i], ok[i], -1, 0, 0);
            if (!ok[i]) rc = -1;
        }
    return rc;
}

/* Compute the resident experts while the reads are in flight, then each
 * missed one as its read (or the prefetch it waits for) lands; give every
 * slot back (failed reads are dropped from the cache). */
static int experts_finish(df_session *s, int il, int u0, int u1, int n_ready, int n_wait, int rc, df_error *err)
{
    df_engine *eng = s->eng;
    expert_cache *cache = &eng->cache;
    int *ready = s->ready_list;
    if (!rc && n_ready) run_experts(s, il, ready, n_ready);
    int64_t tags[64];
    int ok[64];
    while (n_wait > 0) {
        int n = expert_store_wait(&eng->store, tags, ok, 64, err);
        if (!n) break; /* nothing in flight: only after a queue error */
        n_ready = 0;
        for (int i = 0; i < n; i++) {
            int u = (int)tags[i];
            if (tags[i] & PF_TAG) {
                u = prefetch_landed(s, tags[i], ok[i], il, u0, u1);
                if (u < 0) continue;
            } else if (ok[i]) {
                expert_cache_filled(cache, il, s->uniq[u]);
            }
            n_wait--;
            if (!ok[i]) {
                rc = -1;
                continue;
            }
            s->uniq_state[u] = 1;
            ready[n_ready++] = u;
        }
        if (!rc && n_ready) run_experts(s, il, ready, n_ready);
    }
    for (int u = u0; u < u1; u++) {
        if (s->uniq_state[u]) expert_cache_release(cache, il, s->uniq[u]);
        else expert_cache_abort(cache, il, s->uniq[u]);
    }
    return rc;
}

/* Router look-ahead: after layer il, apply the next MoE layer's router to
 * the hidden state normalized with that layer's post-attention norm, and
 * start reading its top-scoring experts that are not resident.  Issued only
 * when the demand reads are done (the disk is idle while attention runs),
 * never more than the queue depth, and not for layers where past
 * predictions did not pay (after 16 tries: precision below 1/4, or more
 * prefetched experts evicted unused than used). */
void moe_prefetch_next(df_session *s, int il, int T, const float *H)
{
    df_engine *eng = s->eng;
    const k3_config *c = &eng->cfg;
    int nl = il + 1;
    while (nl < c->NL && !c->layer_moe[nl]) nl++;
    if (!eng->pf_active || eng->all_resident || nl >= c->NL || !eng->pf_layer_on[nl]) return;
    if (expert_store_in_flight(&eng->store) >= eng->io_depth) return;
    /* streamed trunk: the next layer's router is in the buffer being loaded;
     * a layer further away is not loaded yet, so no prediction for it */
    if (eng->ts.on && (nl != il + 1 || trunk_stream_ready(eng, nl, NULL))) return;
    const k3_layer *N = &eng->layers[nl];
    int E = c->E, h = c->h, npf = eng->pf_k;
    for (int t = 0; t < T; t++) rmsnorm(H + (size_t)t * h, N->post_ln, h, c->eps, s->big0 + (size_t)t * h);
    mm_one(eng->pool, eng->kt, N->router, s->big0, T, s->big1);
    /* never pin so many slots that the next layer's demand group cannot fit */
    int group = T * c->k < MM_MAX_JOBS / 2 ? T * c->k : MM_MAX_JOBS / 2;
    int room = eng->cache.n_slots - group - eng->cache.n_pending;
    if (room <= 0) return;
    uint8_t *pred = eng->pf_pred + (size_t)nl * E;
    memset(pred, 0, (size_t)E);
    int n_pred = 0;
    for (int t = 0; t < T; t++) {
        float *choice = s->big2;
        for (int e = 0; e < E; e++) choice[e] = df_sigmoidf(s->big1[(size_t)t * E + e]) + N->router_bias[e];
        for (int j = 0; j < npf; j++) {
            int best = -1;
            for (int e = 0; e < E; e++)
                if (choice[e] > -INFINITY && (best < 0 || choice[e] > choice[best])) best = e;
            choice[best] = -INFINITY;
            if (!pred[best]) {
                pred[best] = 1;
                n_pred++;
            }
        }
    }
    eng->pf_npred[nl] = n_pred;
    df_error qerr = {0};
    for (int e = 0; e < E && room > 0; e++) {
        if (!pred[e]) continue;
        uint8_t *slot;
        if (expert_cache_acquire_prefetch(&eng->cache, nl, e, &slot) != EC_MISS) continue;
        if (expert_store_queue(&eng->store, nl, e, slot, PF_TAG | (int64_t)nl << 16 | e, &qerr)) {
            expert_cache_abort(&eng->cache, nl, e);
            break; /* a prefetch failure is not an error: the demand read will report it */
        }
        eng->pf_issued++;
        room--;
    }
    expert_store_flush(&eng->store);
}

/* Score the prediction made for layer il against its real route. */
static void prefetch_score(df_session *s, int il, int n_u)
{
    df_engine *eng = s->eng;
    if (!eng->pf_on || !eng->pf_npred[il]) return;
    const uint8_t *pred = eng->pf_pred + (size_t)il * eng->cfg.E;
    int correct = 0;
    for (int u = 0; u < n_u; u++) correct += pred[s->uniq[u]];
    eng->pf_tries[il]++;
    eng->pf_predicted[il] += (uint64_t)eng->pf_npred[il];
    eng->pf_correct[il] += (uint64_t)correct;
    eng->pf_actual[il] += (uint64_t)n_u;
    eng->pf_npred[il] = 0;
    /* it does not pay when predictions are mostly wrong, or when more of the
     * experts it read were evicted unused than were ever used */
    uint32_t used = eng->cache.pf_used_l[il], wasted = eng->cache.pf_wasted_l[il];
    if (eng->pf_tries[il] >= 16 && eng->pf_layer_on[il] &&
        (eng->pf_correct[il] * 4 < eng->pf_predicted[il] || wasted > used)) {
        eng->pf_layer_on[il] = 0;
        if (!eng->quiet)
            df_log("prefetch off for layer %d after %llu tokens: precision %.2f, %u prefetched experts used, %u "
                   "evicted unused",
                   il, (unsigned long long)eng->pf_tries[il],
                   (double)eng->pf_correct[il] / (double)eng->pf_predicted[il], used, wasted);
    }
}

/* shared experts: SiTU of the gate/up products already in big0/big1, then
 * the down-projection into out (zeros when the model has none) */
static void shared_down(df_session *s, const k3_layer *L, int T, float *out)
{
    df_engine *eng = s->eng;
    const k3_config *c = &eng->cfg;
    int NsI = c->Ns * c->I;
    if (NsI) {
        situ_rows(s->big0, s->big1, (size_t)T * NsI, c->b1, c->b2, s->big0);
        mm_one(eng->pool, eng->kt, L->sh_down, s->big0, T, out);
    } else {
        memset(out, 0, (size_t)T * c->h * sizeof(float));
    }
}

int moe_forward(df_session *s, int il, const k3_layer *L, const float *y, int T, float *out, df_error *err)
{
    df_engine *eng = s->eng;
    const k3_config *c = &eng->cfg;
    int E = c->E, k = c->k, Lt = c->Lt, h = c->h, NsI = c->Ns * c->I;

    /* router, latent down-projection and shared experts in one job list */
    float *rlog = s->big2, *z = s->big3;
    mm_job jobs[MM_MAX_JOBS];
    int nj = 0;
    jobs[nj++] = (mm_job){.w = L->router, .x = y, .xs = (size_t)h, .y = rlog, .ys = (size_t)E, .T = T};
    jobs[nj++] = (mm_job){.w = L->lat_down, .x = y, .xs = (size_t)h, .y = z, .ys = (size_t)Lt, .T = T};
    if (NsI) {
        jobs[nj++] = (mm_job){.w = L->sh_gate, .x = y, .xs = (size_t)h, .y = s->big0, .ys = (size_t)NsI, .T = T};
        jobs[nj++] = (mm_job){.w = L->sh_up, .x = y, .xs = (size_t)h, .y = s->big1, .ys = (size_t)NsI, .T = T};
    }
    mm_run(eng->pool, eng->kt, jobs, nj);

    /* routing; sig/choice scratch in big4/big5 */
    for (int t = 0; t < T; t++)
        route(c, rlog + (size_t)t * E, L->router_bias, s->route_ids + (size_t)t * k, s->route_w + (size_t)t * k,
              s->big4, s->big5);
    for (int t = 0; t < T; t++) mxfp4_prep_x(z + (size_t)t * Lt, Lt, s->zp + (size_t)t * Lt);

    /* distinct experts in first-use order, and each one's gathered rows */
    int n_u = 0;
    for (int i = 0; i < T * k; i++) {
        int e = s->route_ids[i], u;
        for (u = 0; u < n_u; u++)
            if (s->uniq[u] == e) break;
        if (u == n_u) {
            s->uniq[n_u] = e;
            s->uniq_count[n_u] = 0;
            n_u++;
        }
        s->uniq_count[u]++;
    }
    for (int u = 0, acc = 0; u < n_u; u++) {
        s->uniq_first[u] = acc;
        acc += s->uniq_count[u];
        s->uniq_count[u] = 0;
    }
    for (int i = 0; i < T * k; i++) {
        int u;
        for (u = 0; s->uniq[u] != s->route_ids[i]; u++) {}
        int row = s->uniq_first[u] + s->uniq_count[u]++;
        s->slot_of[i] = row;
        memcpy(s->g_x + (size_t)row * Lt, s->zp + (size_t)(i / k) * Lt, (size_t)Lt * sizeof(float));
    }

    prefetch_score(s, il, n_u);

    /* experts in groups that fit the cache; the first group's reads overlap
     * the shared experts' down-projection */
    int group = eng->cache.n_slots < MM_MAX_JOBS / 2 ? eng->cache.n_slots : MM_MAX_JOBS / 2;
    for (int u0 = 0; u0 < n_u; u0 += group) {
        int u1 = u0 + group < n_u ? u0 + group : n_u, n_ready, failed;
        int n_wait = experts_begin(s, il, u0, u1, &n_ready, &failed, err);
        if (u0 == 0) shared_down(s, L, T, out);
        /* after a failure, still wait for every read that was started */
        if (experts_finish(s, il, u0, u1, n_ready, n_wait, failed, err)) return -1;
    }

    /* weighted sum in route order, latent norm, up-projection, + shared */
    float *acc = s->big4;
    for (int t = 0; t < T; t++) {
        float *a = acc + (size_t)t * Lt;
        for (int i = 0; i < Lt; i++) a[i] = 0.0f;
        for (int j = 0; j < k; j++) {
            const float *o = s->g_out + (size_t)s->slot_of[t * k + j] * Lt;
            float w = s->route_w[t * k + j];
            for (int i = 0; i < Lt; i++) a[i] = a[i] + o[i] * w;
        }
        rmsnorm(a, L->lat_norm, Lt, c->eps, a);
    }
    mm_one(eng->pool, eng->kt, L->lat_up, acc, T, s->big5);
    for (size_t i = 0; i < (size_t)T * h; i++) out[i] = s->big5[i] + out[i];
    return 0;
}
