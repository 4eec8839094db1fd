/* plan.c - see plan.h: where --mem goes, decided from sizes alone.
 *
 * Order of the decision:
 *   fixed   = session state + scratch + reserve + small vectors
 *   minimum = fixed + k expert slots (one token's experts must fit at once)
 *   trunk   = resident (all matrices + the mapped embedding) when it fits
 *             beside the minimum and streaming is not forced; otherwise two
 *             layer buffers (the embedding is then read by row, never
 *             mapped); otherwise the budget is refused with the numbers.
 *   cache   = what is left (capped at every expert), or --expert-cache,
 *             which must fit beside the rest (refused otherwise).
 *   batch   = (--batch auto) the prompt chunk: PLAN_BATCH_FAST (256, or the
 *             context) when every expert and the trunk still stay in memory
 *             with its scratch (speed: nothing is read), else 32 when they
 *             stay in memory; otherwise as many positions as half of
 *             the cache's share pays for (up to PLAN_BATCH_MAX and the
 *             context), because a chunk reads each needed expert and the
 *             streamed trunk once for all its positions: a prompt read in
 *             32-position chunks reads its experts again for every chunk.
 * serve's default context (no --ctx; plan_serve_ctx) is one rule on top:
 *   want    = 64K, or the model's maximum context when smaller;
 *   take the first of want, want/2, ... (above 4K) whose plan fits, keeps
 *             the trunk resident if it is resident at 4K, and leaves the
 *             expert cache at least its streaming minimum: k x n_moe_layers
 *             slots (one token's experts in every MoE layer; fewer and
 *             decode re-reads nearly every expert each token), or, where
 *             the cache is below that already at 4K (a resident trunk
 *             leaves little: K3 at 128 GiB), at least 7/8 of its 4K size.  With
 *             --expert-cache the cache is fixed: the context must only fit;
 *   else    4K (the session default), planned or refused as any context.
 *   The sessions counted are the planned ones (--parallel N, else one):
 *   serve keeps further conversations only in what the plan leaves unused.
 * The expected reads per token assume uniform routing for the hit rate:
 * an estimate for sizing a machine, labelled as such where printed.
 */
#include "plan.h"
#include "util.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

static double gib(uint64_t b) { return (double)b / (double)(1ull << 30); }

uint64_t plan_reserve_bytes(int n_threads, int vocab)
{
    /* the binary, libc, thread stacks as touched, I/O rings and the front
     * end's buffers: measured ~10 MiB (VmHWM of a run on the bundled model
     * with a 1 MiB cache: 11 MiB), and ~1.2 MiB more where Open MPI is
     * linked in (its libraries' pages at load: `deltafin --help` peaks at
     * 9.8 MiB against 8.6 without); the tokenizer's tables grow with the
     * vocabulary (~64 bytes per token) */
    return (18ull << 20) + (uint64_t)(n_threads > 0 ? n_threads : 1) * (1ull << 20) +
           (uint64_t)(vocab > 0 ? vocab : 0) * 64u;
}

uint64_t plan_mpi_bytes(int n_ranks)
{
    /* Open MPI's memory in a rank beyond its libraries' pages (counted in
     * plan_reserve_bytes): the runtime's heap and free lists after MPI_Init
     * and the shared-memory transport's segments as the exchanges touch
     * them, which grow with the peers.  Measured here as rank 0's peak over
     * one process's on the same plan (a 512-expert model at --mem 64M, 20
     * prompt ids): +7.8 MiB under mpirun -np 1, +7.0 to +8.8 MiB at 2
     * ranks, up to +11.4 MiB at 3; planned as 8 MiB + 2 MiB per rank.
     * n_ranks 0: not under mpirun. */
    return n_ranks > 0 ? (8ull << 20) + (uint64_t)n_ranks * (2ull << 20) : 0;
}

uint64_t plan_remote_bytes(int from_mirror)
{
    /* libcurl's memory while a streamed install fetches experts (the
     * transfers run on the evaluating thread with the allocation guard
     * off, expert_remote.c): its multi handle and 8 easy handles, their
     * receive buffers, the connection cache, the resolver and TLS state
     * where the mirror is https.  Measured here as the peak over a local
     * install's on the same plan (tests/setup's 16-expert model over plain
     * HTTP, --mem 32M and 48M): +2.2 to +3.0 MiB; planned as 4 MiB.  TLS
     * to a real mirror was not measured here. */
    return from_mirror ? (4ull << 20) : 0;
}

static void fill_common(const plan_sizes *sz, const plan_request *rq, df_plan *p)
{
    memset(p, 0, sizeof *p);
    p->budget = rq->budget;
    p->budget_given = rq->budget_given;
    p->trunk_bytes = sz->trunk_bytes;
    p->embed_bytes = sz->embed_bytes;
    p->vec_bytes = sz->vec_bytes;
    p->state_bytes = sz->state_bytes;
    p->scratch_bytes = sz->scratch_bytes;
    p->reserve_bytes = sz->reserve_bytes;
    p->mpi_bytes = sz->mpi_bytes;
    p->mpi_ranks = sz->mpi_ranks;
    p->remote_bytes = sz->remote_bytes;
    p->n_ctx = sz->n_ctx;
    p->max_batch = sz->max_batch;
    p->n_experts = sz->n_experts;
    p->expert_bytes = sz->expert_bytes;
    p->slot_bytes = sz->slot_bytes;
    p->k = sz->k;
    p->n_moe_layers = sz->n_moe_layers;
    p->cache_forced = rq->expert_cache_bytes > 0;
    p->expert_read_cold = (uint64_t)sz->n_moe_layers * (uint64_t)sz->k * sz->expert_bytes;
}

static void finish(df_plan *p, const plan_sizes *sz, int tlfu)
{
    uint64_t n = p->n_slots;
    if (tlfu && n > (uint64_t)sz->k) {
        p->n_transient = (uint64_t)sz->k;
        p->n_slots = n - p->n_transient;
    }
    p->cache_bytes = n * sz->slot_bytes;
    p->used = p->trunk_used + p->state_bytes + p->scratch_bytes + p->reserve_bytes + p->vec_bytes + p->cache_bytes;
    p->trunk_read_per_token = p->trunk_mode == DF_TRUNK_STREAMED ? sz->trunk_bytes - p->trunk_resident_bytes : 0;
    p->est_hit_rate = sz->n_experts ? (double)p->n_slots / (double)sz->n_experts : 1.0;
    if (p->est_hit_rate > 1) p->est_hit_rate = 1;
    p->expert_read_est = (uint64_t)((double)p->expert_read_cold * (1.0 - p->est_hit_rate) + 0.5);
}

static int plan_fixed(const plan_sizes *sz, const plan_request *rq, df_plan *p, df_error *err);

/* Expert bytes a decoded token reads with `slots` cache slots (the
 * uniform-routing estimate of finish()). */
static uint64_t expert_read_at(const plan_sizes *sz, uint64_t slots)
{
    uint64_t cold = (uint64_t)sz->n_moe_layers * (uint64_t)sz->k * sz->expert_bytes;
    double hit = sz->n_experts ? (double)slots / (double)sz->n_experts : 1.0;
    if (hit > 1) hit = 1;
    return (uint64_t)((double)cold * (1.0 - hit) + 0.5);
}

/* Partial residency of a streamed trunk: keep layers in memory, largest
 * first (a resident layer also no longer sizes the buffers), as long as
 * that lowers the bytes a decoded token reads: a resident byte is a byte
 * not read on every pass, while the cache it takes saves only its hit
 * rate's share of the experts' reads (K3 at 64 GiB: a GiB of trunk saves
 * a GiB per token, a GiB of cache ~18 MB).  The cache keeps at least what
 * streaming needs (one token's experts in every MoE layer) when the
 * whole-stream plan gave it that much; below it, only the estimate decides.  Sets p's trunk fields
 * (trunk_used, trunk_buf_bytes, the resident layers) and the alternative. */
static void partial_residency(const plan_sizes *sz, const plan_request *rq, uint64_t fixed, uint64_t need_cache,
                              df_plan *p)
{
    const uint64_t budget = rq->budget, slot = sz->slot_bytes ? sz->slot_bytes : 1;
    const int n = sz->n_trunk_layers;
    const uint64_t forced = rq->expert_cache_bytes ? need_cache : 0;
    uint64_t whole_slots = forced ? forced / slot : (budget - fixed - 2 * sz->stream_buf_bytes) / slot;
    if (sz->n_experts && whole_slots > sz->n_experts) whole_slots = sz->n_experts;
    p->alt_stream_all_read = sz->trunk_bytes + expert_read_at(sz, whole_slots);
    p->alt_stream_all_cache = whole_slots * slot;
    if (rq->trunk_stream != 0 || n <= 1 || n > DF_PLAN_MAX_LAYERS || !sz->layer_span) return;
    uint64_t min_slots = plan_stream_min_slots(sz);
    if (min_slots > whole_slots) min_slots = need_cache / slot; /* below it already: the estimate decides */
    uint8_t res[DF_PLAN_MAX_LAYERS] = {0};
    int order[DF_PLAN_MAX_LAYERS];
    for (int i = 0; i < n; i++) order[i] = i;
    for (int i = 1; i < n; i++) /* by span, largest first; ties by index */
        for (int j = i; j > 0 && (sz->layer_span[order[j]] > sz->layer_span[order[j - 1]] ||
                                  (sz->layer_span[order[j]] == sz->layer_span[order[j - 1]] && order[j] < order[j - 1]));
             j--) {
            int t = order[j];
            order[j] = order[j - 1];
            order[j - 1] = t;
        }
    uint64_t best = p->alt_stream_all_read, res_span = 0, res_bytes = 0;
    int best_n = 0, n_res = 0;
    uint8_t best_res[DF_PLAN_MAX_LAYERS] = {0};
    uint64_t best_used = 2 * sz->stream_buf_bytes, best_buf = sz->stream_buf_bytes, best_bytes = 0;
    for (int i = 0; i < n - 1; i++) { /* at least one layer stays streamed: all resident is the resident plan */
        int L = order[i];
        res[L] = 1;
        uint64_t buf = 0;
        for (int j = 0; j < n; j++)
            if (!res[j] && sz->layer_span[j] > buf) buf = sz->layer_span[j];
        uint64_t used = res_span + sz->layer_span[L] + 2 * buf;
        uint64_t slots = 0;
        int fits = fixed + used + need_cache <= budget;
        if (fits) {
            slots = forced ? forced / slot : (budget - fixed - used) / slot;
            if (sz->n_experts && slots > sz->n_experts) slots = sz->n_experts;
            fits = slots >= min_slots;
        }
        if (!fits) {
            res[L] = 0; /* a smaller layer further down may still fit */
            continue;
        }
        res_span += sz->layer_span[L];
        res_bytes += sz->layer_bytes[L];
        n_res++;
        uint64_t read = sz->trunk_bytes - res_bytes + expert_read_at(sz, slots);
        if (read < best) {
            best = read;
            best_n = n_res;
            best_used = used;
            best_buf = buf;
            best_bytes = res_bytes;
            memcpy(best_res, res, (size_t)n);
        }
    }
    p->trunk_layers = n;
    if (!best_n) return;
    p->trunk_resident_n = best_n;
    p->trunk_resident_bytes = best_bytes;
    memcpy(p->trunk_resident_layer, best_res, (size_t)n);
    p->trunk_used = best_used;
    p->trunk_buf_bytes = best_buf;
}

int plan_compute(const plan_sizes *sz0, const plan_request *rq, df_plan *p, df_error *err)
{
    if (!rq->auto_batch) return plan_fixed(sz0, rq, p, err);
    plan_sizes sz = *sz0;
    int T = PLAN_BATCH_DEFAULT < sz.n_ctx ? PLAN_BATCH_DEFAULT : sz.n_ctx;
    sz.max_batch = T;
    sz.scratch_bytes = sz.scratch_default ? sz.scratch_default : sz.scratch_base + (uint64_t)T * sz.scratch_per_row;
    if (plan_fixed(&sz, rq, p, err)) return -1;
    /* the trunk's residency is decided at this first chunk: the threshold
     * kept whatever chunk is chosen below */
    const uint64_t resident_from = p->resident_from;
    int streams = p->trunk_mode == DF_TRUNK_STREAMED || p->n_slots + p->n_transient < sz.n_experts;
    if (!streams && sz.scratch_per_row) {
        /* nothing streams: the chunk is chosen for speed (a 256-position
         * chunk prefills ~1.4x faster than 32), when its scratch still
         * leaves every expert and the trunk in memory */
        int fast = PLAN_BATCH_FAST < sz.n_ctx ? PLAN_BATCH_FAST : sz.n_ctx;
        if (fast > T) {
            plan_sizes f = sz;
            f.max_batch = fast;
            f.scratch_bytes = sz.scratch_base + (uint64_t)fast * sz.scratch_per_row;
            df_plan q;
            if (plan_fixed(&f, rq, &q, NULL) == 0 && q.trunk_mode != DF_TRUNK_STREAMED &&
                q.n_slots + q.n_transient >= sz.n_experts)
                *p = q;
        }
    }
    if (!streams || !sz.scratch_per_row) {
        p->batch_auto = 1;
        p->resident_from = resident_from;
        return 0;
    }
    /* grow the chunk into half of what the cache got (and what is unused):
     * a prompt chunk reads each needed expert once, so for a prompt a
     * larger chunk saves far more reads than the same bytes of cache would */
    uint64_t room = (p->budget - p->used + p->cache_bytes) / 2;
    uint64_t grow = room / sz.scratch_per_row;
    uint64_t want = (uint64_t)T + grow;
    if (want > PLAN_BATCH_MAX) want = PLAN_BATCH_MAX;
    if (want > (uint64_t)sz.n_ctx) want = (uint64_t)sz.n_ctx;
    if (want > 32) want -= want % 32;
    if (want > (uint64_t)T) {
        sz.max_batch = (int)want;
        sz.scratch_bytes = sz.scratch_base + want * sz.scratch_per_row;
        df_plan q;
        if (plan_fixed(&sz, rq, &q, NULL) == 0) *p = q;
    }
    p->batch_auto = 1;
    p->resident_from = resident_from;
    return 0;
}

static int plan_fixed(const plan_sizes *sz, const plan_request *rq, df_plan *p, df_error *err)
{
    fill_common(sz, rq, p);
    const uint64_t budget = rq->budget, slot = sz->slot_bytes, k = (uint64_t)sz->k;
    const uint64_t fixed = sz->state_bytes + sz->scratch_bytes + sz->reserve_bytes + sz->vec_bytes;
    const uint64_t resident = sz->trunk_bytes + sz->embed_bytes, streamed = 2 * sz->stream_buf_bytes;
    const uint64_t min_cache = k * slot;
    uint64_t cache = rq->expert_cache_bytes ? rq->expert_cache_bytes / slot * slot : 0;
    if (rq->expert_cache_bytes && cache < min_cache) cache = min_cache;
    if (cache > sz->n_experts * slot && sz->n_experts) cache = sz->n_experts * slot;
    const uint64_t need_cache = rq->expert_cache_bytes ? cache : min_cache;
    const char *what = rq->budget_given ? "--mem" : "the default budget (70% of RAM; set --mem)";

    p->resident_from = fixed + resident + need_cache;
    int fit_res = rq->trunk_stream <= 0 && fixed + resident + need_cache <= budget;
    int fit_str = rq->trunk_stream >= 0 && fixed + streamed + need_cache <= budget;
    if (fit_res) {
        p->trunk_mode = DF_TRUNK_RESIDENT;
        p->trunk_used = resident;
    } else if (fit_str) {
        p->trunk_mode = DF_TRUNK_STREAMED;
        p->trunk_used = streamed;
        p->trunk_buf_bytes = sz->stream_buf_bytes;
        partial_residency(sz, rq, fixed, need_cache, p);
    } else {
        /* the cheapest configuration allowed, for the message and the caller */
        int str = rq->trunk_stream >= 0;
        p->trunk_mode = str ? DF_TRUNK_STREAMED : DF_TRUNK_RESIDENT;
        p->trunk_used = str ? streamed : resident;
        p->trunk_buf_bytes = str ? sz->stream_buf_bytes : 0;
        p->n_slots = need_cache / (slot ? slot : 1);
        finish(p, sz, 0);
        return df_err_set(err, DF_ERR_NOMEM, -1,
                          "%s %.3f GiB cannot hold this model with a context of %d tokens: it needs %.3f GiB "
                          "(trunk %s %.3f GiB + context state %.3f GiB + scratch %.3f GiB (batch %d) + small "
                          "vectors %.3f GiB + reserve %.3f GiB + expert cache %.3f GiB (%s)); raise --mem%s%s",
                          what, gib(budget), sz->n_ctx, gib(p->used),
                          str ? "streamed through two buffers" : "resident", gib(p->trunk_used), gib(sz->state_bytes),
                          gib(sz->scratch_bytes), sz->max_batch, gib(sz->vec_bytes), gib(sz->reserve_bytes),
                          gib(need_cache),
                          rq->expert_cache_bytes ? "--expert-cache" : "one token's experts",
                          sz->state_bytes > budget / 4 ? " or lower --ctx" : "",
                          rq->expert_cache_bytes ? " or lower --expert-cache" :
                          rq->trunk_stream < 0 ? " or allow --trunk-stream auto" : "");
    }
    uint64_t left = budget - fixed - p->trunk_used;
    if (rq->expert_cache_bytes) {
        p->n_slots = cache / slot;
    } else {
        p->n_slots = left / slot;
        if (sz->n_experts && p->n_slots > sz->n_experts) p->n_slots = sz->n_experts;
    }
    if (p->n_slots < k) p->n_slots = k;
    if (p->n_slots > (uint64_t)INT32_MAX / 2) p->n_slots = (uint64_t)INT32_MAX / 2;
    finish(p, sz, rq->tlfu);
    CHECK(p->used <= budget);
    return 0;
}

uint64_t plan_stream_min_slots(const plan_sizes *sz)
{
    uint64_t m = (uint64_t)sz->k * (uint64_t)sz->n_moe_layers;
    return sz->n_experts && m > sz->n_experts ? sz->n_experts : m;
}

/* what stops ctx_want, or 0 when q (planned at it) passes the rule */
static int serve_ctx_fails(int rc, const df_plan *q, const df_plan *floor, uint64_t min_slots)
{
    if (rc) return DF_CTX_WHY_BUDGET;
    if (q->trunk_mode != floor->trunk_mode) return DF_CTX_WHY_TRUNK;
    /* the cache keeps the streaming minimum; where it is below that already
     * at 4,096 (a resident trunk leaves little), a larger context may take
     * at most an eighth of it (K3 at 128 GiB: 32K, enough for an agent) */
    uint64_t have0 = floor->n_slots + floor->n_transient;
    uint64_t need = have0 >= min_slots ? min_slots : have0 - have0 / 8;
    if (!q->cache_forced && q->n_slots + q->n_transient < need) return DF_CTX_WHY_CACHE;
    return 0;
}

int plan_serve_ctx(plan_sizes_at sizes, void *arg, int n_ctx_max, const plan_request *rq, df_plan *p,
                   df_error *err)
{
    int want = PLAN_SERVE_CTX, lo = PLAN_SERVE_CTX_MIN;
    if (n_ctx_max > 0 && want > n_ctx_max) want = n_ctx_max;
    if (lo > want) lo = want;
    plan_sizes sz;
    df_plan floor;
    df_error ferr = {0};
    if (sizes(arg, lo, &sz, err)) return -1;
    const uint64_t min_slots = plan_stream_min_slots(&sz);
    int frc = plan_compute(&sz, rq, &floor, &ferr);
    int why = 0, found = 0;
    for (int n = want; n > lo && !frc && !found; n /= 2) {
        df_plan q;
        if (sizes(arg, n, &sz, err)) return -1;
        int fail = serve_ctx_fails(plan_compute(&sz, rq, &q, NULL), &q, &floor, min_slots);
        if (n == want) why = fail;
        if (!fail) {
            *p = q;
            p->ctx_rule = n == want ? DF_CTX_SERVE_FITS : DF_CTX_SERVE_SMALLER;
            found = 1;
        }
    }
    if (!found) {
        *p = floor;
        p->ctx_rule = want == lo ? DF_CTX_SERVE_FITS : DF_CTX_SERVE_FLOOR;
        if (frc && err) *err = ferr;
    }
    p->ctx_want = want;
    p->ctx_why = why;
    p->ctx_floor_resident = frc ? 0 : floor.trunk_resident_bytes;
    p->stream_min_slots = min_slots;
    return frc ? -1 : 0;
}

static void ctx_tokens(int n, char *buf, size_t len)
{
    if (n >= 1024 && n % 1024 == 0) snprintf(buf, len, "%dK", n / 1024);
    else snprintf(buf, len, "%d", n);
}

void df_plan_ctx_reason(const df_plan *p, char *buf, size_t n)
{
    char want[32];
    ctx_tokens(p->ctx_want, want, sizeof want);
    const char *model_max = p->ctx_want < PLAN_SERVE_CTX ? " (the model's maximum)" : "";
    char mem[64];
    if (p->budget < (1ull << 30))
        snprintf(mem, sizeof mem, "%s %.0f MiB", p->budget_given ? "--mem" : "the default --mem",
                 (double)p->budget / (1 << 20));
    else
        snprintf(mem, sizeof mem, "%s %.2f GiB", p->budget_given ? "--mem" : "the default --mem", gib(p->budget));
    if (p->ctx_rule == DF_CTX_GIVEN) {
        snprintf(buf, n, "%s", "");
    } else if (p->ctx_rule == DF_CTX_SERVE_FITS) {
        char less[160] = "";
        if (p->ctx_floor_resident > p->trunk_resident_bytes)
            snprintf(less, sizeof less, " (it keeps %.2f GiB less of the trunk resident than %d tokens would)",
                     gib(p->ctx_floor_resident - p->trunk_resident_bytes), PLAN_SERVE_CTX_MIN);
        snprintf(buf, n, "default for serve: %s%s fits beside the expert cache%s", want, model_max, less);
    } else if (p->ctx_why == DF_CTX_WHY_CACHE && p->n_slots + p->n_transient < p->stream_min_slots) {
        snprintf(buf, n,
                 "default for serve: the expert cache is below its streaming minimum (%" PRIu64 " experts, %.2f GiB: "
                 "one token's in every MoE layer) at %s, and %s would take more than an eighth of it",
                 p->stream_min_slots, gib(p->stream_min_slots * p->slot_bytes), mem, want);
    } else if (p->ctx_why == DF_CTX_WHY_CACHE) {
        snprintf(buf, n,
                 "default for serve: %s would leave the expert cache below its streaming minimum (%" PRIu64
                 " experts, %.2f GiB: one token's in every MoE layer) at %s",
                 want, p->stream_min_slots, gib(p->stream_min_slots * p->slot_bytes), mem);
    } else if (p->ctx_why == DF_CTX_WHY_TRUNK) {
        snprintf(buf, n, "default for serve: %s would stream the trunk, resident at %d tokens, at %s", want,
                 PLAN_SERVE_CTX_MIN, mem);
    } else {
        snprintf(buf, n, "default for serve: %s does not fit %s", want, mem);
    }
}

void df_plan_summary(const df_plan *p, char *buf, size_t n)
{
    char why[320] = "", ctx[340] = "", part[96] = "";
    df_plan_ctx_reason(p, why, sizeof why);
    if (p->trunk_mode == DF_TRUNK_STREAMED && p->trunk_resident_n)
        snprintf(part, sizeof part, " (%d of %d layers resident, %.2f GiB)", p->trunk_resident_n, p->trunk_layers,
                 gib(p->trunk_resident_bytes));
    if (*why) snprintf(ctx, sizeof ctx, " (%s)", why);
    snprintf(buf, n,
             "plan: --mem %.2f GiB%s: trunk %.2f GiB %s%s%s%s%s, context %d tokens%s %.3f GiB, prompt chunk %d%s "
             "(scratch %.3f GiB), expert cache %.2f GiB (%" PRIu64 " of %" PRIu64 " experts%s%s%s), unused %.2f GiB",
             gib(p->budget), p->budget_given ? "" : " (default)", gib(p->trunk_used),
             p->trunk_mode == DF_TRUNK_STREAMED ? "streamed" : "resident", part, p->trunk_quantized ? " (" : "",
             p->trunk_quantized ? p->trunk_types : "", p->trunk_quantized ? ", quantized: not the BF16 model's logits)" : "",
             p->n_ctx, ctx, gib(p->state_bytes),
             p->max_batch, p->batch_auto ? " (auto)" : "", gib(p->scratch_bytes), gib(p->cache_bytes), p->n_slots + p->n_transient, p->n_experts,
             p->experts_requantized ? ", requantized to " : "", p->experts_requantized ? p->expert_types : "",
             p->experts_requantized ? ": not the released experts" : "", gib(p->budget - p->used));
}

void df_plan_print(const df_plan *p, const char *prefix, FILE *f)
{
    fprintf(f, "%smemory plan for --mem %.2f GiB%s (context %d tokens, prompt chunk %d%s):\n", prefix,
            gib(p->budget), p->budget_given ? "" : " (default: 70% of RAM)", p->n_ctx, p->max_batch,
            p->batch_auto ? ", chosen from the budget" : "");
    char why[320];
    df_plan_ctx_reason(p, why, sizeof why);
    if (*why) fprintf(f, "%s  context %d tokens: %s\n", prefix, p->n_ctx, why);
    if (p->trunk_mode == DF_TRUNK_STREAMED && p->trunk_resident_n)
        fprintf(f, "%s  trunk, partly resident        %10.3f GiB  (%d of %d layers resident, %.3f GiB; the rest, %.3f "
                   "GiB, re-read per forward pass through 2 buffers of %.3f GiB)\n", prefix, gib(p->trunk_used),
                p->trunk_resident_n, p->trunk_layers, gib(p->trunk_resident_bytes),
                gib(p->trunk_bytes - p->trunk_resident_bytes), gib(p->trunk_buf_bytes));
    else if (p->trunk_mode == DF_TRUNK_STREAMED)
        fprintf(f, "%s  trunk, streamed (2 buffers)   %10.3f GiB  (%.3f GiB re-read per forward pass)\n", prefix,
                gib(p->trunk_used), gib(p->trunk_bytes));
    else
        fprintf(f, "%s  trunk, resident               %10.3f GiB  (matrices %.3f + embedding %.3f)\n", prefix,
                gib(p->trunk_used), gib(p->trunk_bytes), gib(p->embed_bytes));
    fprintf(f, "%s  trunk resident from --mem     %10.3f GiB\n", prefix, gib(p->resident_from));
    fprintf(f, "%s  small vectors (f32)           %10.3f GiB\n", prefix, gib(p->vec_bytes));
    fprintf(f, "%s  KDA state + MLA cache         %10.3f GiB\n", prefix, gib(p->state_bytes));
    if (p->checkpoints > 0)
        fprintf(f, "%s    of it checkpoints          %10.3f GiB (%d a session, each a copy of the KDA state: %.1f MiB)\n", prefix,
                gib(p->checkpoint_bytes * (uint64_t)p->checkpoints), p->checkpoints, (double)p->checkpoint_bytes / (1 << 20));
    fprintf(f, "%s  scratch                       %10.3f GiB\n", prefix, gib(p->scratch_bytes));
    fprintf(f, "%s  process reserve               %10.3f GiB\n", prefix, gib(p->reserve_bytes));
    if (p->mpi_bytes)
        fprintf(f, "%s    of it Open MPI (%d ranks)     %10.3f GiB\n", prefix, p->mpi_ranks, gib(p->mpi_bytes));
    if (p->remote_bytes)
        fprintf(f, "%s    of it libcurl (mirror fetches) %9.3f GiB\n", prefix, gib(p->remote_bytes));
    fprintf(f, "%s  expert cache%s %10.3f GiB  (%" PRIu64 " of %" PRIu64 " experts%s, %.2f MiB each)\n",
            prefix, p->cache_forced ? " (--expert-cache)" : "                 ", gib(p->cache_bytes),
            p->n_slots, p->n_experts, p->n_transient ? " + transient" : "", (double)p->expert_bytes / (1 << 20));
    fprintf(f, "%s  unused                        %10.3f GiB\n", prefix, gib(p->budget - p->used));
    fprintf(f, "%s  per decoded token: trunk read %.3f GiB; experts %.3f GiB with nothing cached, ~%.3f GiB at "
               "this cache (uniform-routing estimate, hit rate %.2f)\n",
            prefix, gib(p->trunk_read_per_token), gib(p->expert_read_cold), gib(p->expert_read_est),
            p->est_hit_rate);
    if (p->trunk_mode == DF_TRUNK_STREAMED)
        fprintf(f, "%s  per decoded token, trunk + experts: %.3f GiB with this plan; %.3f GiB with the whole trunk "
                   "streamed and a %.3f GiB cache%s\n",
                prefix, gib(p->trunk_read_per_token + p->expert_read_est), gib(p->alt_stream_all_read),
                gib(p->alt_stream_all_cache), p->trunk_resident_n ? "" : " (this plan: nothing paid for residency)");
}
