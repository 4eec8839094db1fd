/* ranks.c - routed experts spread over several processes with MPI (L4).
 *
 * Started as `mpirun -np N deltafin run|chat|serve ...`: every rank opens
 * the same model with the same options; rank 0 runs the front end, the
 * trunk and the routing; ranks 1..N-1 only compute experts.  The routed
 * experts are partitioned by (layer, expert): with a heat file (--heat) each
 * layer's experts go, hottest first, to the rank with the least heat so
 * far; otherwise round robin (expert e of layer l to rank (e + l) mod N).
 * Every rank, rank 0 included, computes its share through its own expert
 * cache and store (RAM where its --mem allows, its own disk otherwise).
 *
 * Per MoE layer (moe.c, through model_ctx.ranks): rank 0 sends each rank
 * one request (ids, rows per expert, then the gathered latent rows as f32)
 * with non-blocking sends, computes its own experts and the shared experts
 * meanwhile, then waits for each rank's answer: one output row per input
 * row, received straight into the rows moe.c sums in router order.  The
 * same kernels compute the same rows whatever process runs them and
 * whatever other rows share the batch (HACKING.md, batch invariance), so
 * the logits are bit-identical to one process at any rank count.
 *
 * Failure: calls return errors (MPI_ERRORS_RETURN); an answer that does
 * not come within $DELTAFIN_RANK_TIMEOUT seconds (60) stops the pass with
 * an error naming the rank and layer, never a wrong token; a rank's own
 * error (a failed read) comes back as a message.
 * Messages (tags): REQ ints [op, layer, n, rows, ids[n], counts[n]]
 * (op WORK, STATS, STOP); X f32 rows; OUT bytes (the output rows, or
 * "ERR:" and a message); STATS doubles.  MPI may allocate per message: its
 * calls run under alloc_guard_exempt.  Built only where mpicc is found
 * (DF_HAVE_MPI); otherwise there is one rank and nothing here runs.
 */
#define _GNU_SOURCE
#include "engine_impl.h"
#include "heat.h"
#include "util.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef DF_HAVE_MPI
#include <mpi.h>

enum { TAG_REQ = 11, TAG_X, TAG_OUT, TAG_STATS };
enum { OP_WORK = 1, OP_STATS, OP_STOP };
#define HELLO_MAGIC 0x4446524b /* "DFRK" */

static int g_rank, g_size = 1, g_inited, g_failed;
static int g_hello[4], g_have_hello; /* ranks > 0: what rank 0 announced */

struct df_ranks {
    df_engine *eng;
    moe_ranks mr;
    uint8_t *owner;
    int max_rows, Lt;
    int *hdr;                 /* [size][4 + 2 * max_rows] */
    MPI_Request *req;         /* [size][3] */
    int *posted;              /* [size] */
    int *rows;                /* [size] rows posted */
    int *layer;
    char **outp;              /* [size] where each answer lands */
    uint64_t *calls;          /* [size] experts computed */
    df_rank_stats *st;        /* [size] */
    double timeout;
};

int df_ranks_init(int *argc, char ***argv)
{
    if (!getenv("OMPI_COMM_WORLD_SIZE") && !getenv("PMIX_RANK")) return 0; /* not started by mpirun */
    int prov = 0;
    /* serve evaluates on its worker thread: MPI calls come from one thread
     * at a time, not always the main one */
    if (MPI_Init_thread(argc, argv, MPI_THREAD_SERIALIZED, &prov) != MPI_SUCCESS) return 0;
    g_inited = 1;
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g_size);
    if (prov < MPI_THREAD_SERIALIZED && g_rank == 0)
        fprintf(stderr, "deltafin: this MPI library gives thread level %d: serve needs MPI_THREAD_SERIALIZED\n", prov);
    if (g_size > 255) {
        fprintf(stderr, "deltafin: at most 255 ranks\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    return g_rank;
}

int df_ranks_size(void) { return g_size; }
int df_ranks_mpi(void) { return g_inited; }
int df_ranks_rank(void) { return g_rank; }

void df_ranks_finalize(void)
{
    /* after a rank failed, finalizing would wait for it: end the job (the
     * error has been printed) */
    if (g_inited && g_failed) MPI_Abort(MPI_COMM_WORLD, 1);
    if (g_inited) MPI_Finalize();
    g_inited = 0;
}

static int post(void *ctx, int r, int il, const int *ids, const int *counts, int n, const float *x, int rows,
                float *out, df_error *err)
{
    struct df_ranks *R = ctx;
    if (rows > R->max_rows)
        return df_err_set(err, DF_ERR_ARG, -1, "rank %d: %d rows for layer %d, its buffers hold %d", r, rows, il,
                          R->max_rows);
    CHECK(!R->posted[r]);
    int *h = R->hdr + (size_t)r * (size_t)(4 + 2 * R->max_rows);
    h[0] = OP_WORK, h[1] = il, h[2] = n, h[3] = rows;
    memcpy(h + 4, ids, (size_t)n * sizeof *ids);
    memcpy(h + 4 + n, counts, (size_t)n * sizeof *counts);
    int was = alloc_guard_exempt_begin();
    size_t xb = (size_t)rows * (size_t)R->Lt * sizeof(float);
    MPI_Request *q = R->req + 3 * (size_t)r;
    int rc = MPI_Isend(h, 4 + 2 * n, MPI_INT, r, TAG_REQ, MPI_COMM_WORLD, &q[0]);
    if (rc == MPI_SUCCESS) rc = MPI_Isend(x, (int)(xb / sizeof(float)), MPI_FLOAT, r, TAG_X, MPI_COMM_WORLD, &q[1]);
    if (rc == MPI_SUCCESS) rc = MPI_Irecv(out, (int)xb, MPI_BYTE, r, TAG_OUT, MPI_COMM_WORLD, &q[2]);
    alloc_guard_exempt_end(was);
    if (rc != MPI_SUCCESS) return df_err_set(err, DF_ERR_IO, -1, "rank %d: sending layer %d failed (MPI error %d)", r, il, rc);
    R->posted[r] = 1;
    R->outp[r] = (char *)out;
    R->rows[r] = rows;
    R->layer[r] = il;
    R->calls[r] += (uint64_t)n;
    R->st[r].rows += (uint64_t)rows;
    R->st[r].bytes_sent += xb + (size_t)(4 + 2 * n) * sizeof(int);
    return 0;
}

static int collect(void *ctx, int il, df_error *err)
{
    struct df_ranks *R = ctx;
    (void)il;
    int was = alloc_guard_exempt_begin();
    double t0 = now_sec(), deadline = t0 + R->timeout;
    int rc = 0;
    for (int r = 1; r < g_size && !rc; r++) {
        if (!R->posted[r]) continue;
        MPI_Request *q = R->req + 3 * (size_t)r;
        MPI_Status st[3];
        for (;;) {
            int done = 0;
            if (MPI_Testall(3, q, &done, st) != MPI_SUCCESS) {
                rc = df_err_set(err, DF_ERR_IO, -1, "rank %d: layer %d failed (the rank is gone?)", r, R->layer[r]);
                break;
            }
            if (done) break;
            if (now_sec() > deadline) {
                rc = df_err_set(err, DF_ERR_IO, -1,
                                "rank %d did not answer layer %d within %.0f s (DELTAFIN_RANK_TIMEOUT): it died or "
                                "hangs; stopping",
                                r, R->layer[r], R->timeout);
                break;
            }
            struct timespec ts = {0, 20000};
            nanosleep(&ts, NULL);
        }
        if (rc) break;
        R->posted[r] = 0;
        int got = 0;
        MPI_Get_count(&st[2], MPI_BYTE, &got);
        size_t want = (size_t)R->rows[r] * (size_t)R->Lt * sizeof(float);
        if ((size_t)got != want) {
            /* the rank's own error: "ERR:" and its message, in the output rows */
            const char *m = R->outp[r];
            if (got > 4 && (size_t)got < want && !memcmp(m, "ERR:", 4))
                rc = df_err_set(err, DF_ERR_IO, -1, "%.*s (layer %d)", got - 4 > 500 ? 500 : got - 4, m + 4,
                                R->layer[r]);
            else
                rc = df_err_set(err, DF_ERR_IO, -1, "rank %d: layer %d: %d bytes answered, %zu expected", r,
                                R->layer[r], got, want);
            break;
        }
        R->st[r].bytes_received += want;
    }
    R->st[0].wait_sec += now_sec() - t0;
    alloc_guard_exempt_end(was);
    if (rc) g_failed = 1;
    return rc;
}

static void partition(struct df_ranks *R, const char *heat_path)
{
    const k3_config *c = &R->eng->m.cfg;
    size_t nk = (size_t)c->NL * (size_t)c->E;
    float *heat = xcalloc(nk, sizeof *heat);
    df_error e = {0};
    int have = heat_path && !heat_load(heat_path, c->NL, c->E, heat, &e);
    double *load = xcalloc((size_t)g_size, sizeof *load);
    int *order = xmalloc((size_t)c->E * sizeof *order);
    for (int il = 0; il < c->NL; il++) {
        if (!have) {
            for (int x = 0; x < c->E; x++) R->owner[(size_t)il * c->E + (size_t)x] = (uint8_t)((x + il) % g_size);
            continue;
        }
        const float *h = heat + (size_t)il * c->E;
        for (int x = 0; x < c->E; x++) order[x] = x;
        for (int a = 1; a < c->E; a++) { /* hottest first, ties by id */
            int v = order[a], b = a;
            for (; b > 0 && (h[order[b - 1]] < h[v] || (h[order[b - 1]] == h[v] && order[b - 1] > v)); b--)
                order[b] = order[b - 1];
            order[b] = v;
        }
        memset(load, 0, (size_t)g_size * sizeof *load);
        for (int a = 0; a < c->E; a++) {
            int best = 0;
            for (int r = 1; r < g_size; r++)
                if (load[r] < load[best]) best = r;
            R->owner[(size_t)il * c->E + (size_t)order[a]] = (uint8_t)best;
            load[best] += (double)h[order[a]] + 1e-9; /* cold experts still spread */
        }
    }
    if (have && !R->eng->mc.quiet) df_log("experts partitioned over %d ranks by the heat of %s", g_size, heat_path);
    free(order);
    free(load);
    free(heat);
}

/* Every rank's model, compared at start by all ranks together (a
 * collective), so that a rank holding another model stops every rank at
 * once with its number named, instead of answering with other weights (the
 * same shape) or leaving rank 0 to wait out DELTAFIN_RANK_TIMEOUT (another
 * shape).  The identity is session files' (engine_model_identity: the
 * config, the trunk table, every weight file's content hash). */
typedef struct rank_model {
    int32_t nl, e, ok;
    uint8_t id[16];
} rank_model;

static int compare_models(df_engine *eng, df_error *err)
{
    const k3_config *c = &eng->m.cfg;
    rank_model me = {c->NL, c->E, 1, {0}};
    df_error ie = {0};
    if (engine_model_identity(eng, me.id, &ie)) me.ok = 0;
    rank_model *all = xcalloc((size_t)g_size, sizeof *all);
    int rc = 0;
    if (MPI_Allgather(&me, (int)sizeof me, MPI_BYTE, all, (int)sizeof me, MPI_BYTE, MPI_COMM_WORLD) != MPI_SUCCESS) {
        rc = df_err_set(err, DF_ERR_IO, -1, "MPI: the ranks could not compare their models");
    } else if (!me.ok) {
        rc = df_err_set(err, DF_ERR_IO, -1, "rank %d: %s", g_rank, ie.msg);
    } else {
        for (int r = 1; r < g_size && !rc; r++) {
            if (!all[r].ok) {
                rc = df_err_set(err, DF_ERR_IO, -1, "rank %d could not compute its model's identity (its own error "
                                "says why)", r);
            } else if (all[r].nl != all[0].nl || all[r].e != all[0].e) {
                rc = df_err_set(err, DF_ERR_ARG, -1,
                                "rank %d holds a different model: %d layers x %d experts, rank 0's has %d x %d", r,
                                all[r].nl, all[r].e, all[0].nl, all[0].e);
            } else if (memcmp(all[r].id, all[0].id, sizeof me.id)) {
                rc = df_err_set(err, DF_ERR_ARG, -1,
                                "rank %d holds a different model than rank 0 (the same shape, other weights: the "
                                "model identities differ); every rank must run the same --model",
                                r);
            }
        }
    }
    free(all);
    return rc;
}

int df_ranks_attach(df_engine *eng, const char *heat_path, int max_batch, df_error *err)
{
    if (g_size < 2) return 0;
    const k3_config *c = &eng->m.cfg;
    struct df_ranks *R = xcalloc(1, sizeof *R);
    R->eng = eng;
    R->Lt = c->Lt;
    R->max_rows = max_batch * c->k;
    R->owner = xmalloc((size_t)c->NL * (size_t)c->E);
    R->hdr = xmalloc((size_t)g_size * (size_t)(4 + 2 * R->max_rows) * sizeof *R->hdr);
    R->req = xcalloc((size_t)g_size * 3, sizeof *R->req);
    R->posted = xcalloc((size_t)g_size, sizeof *R->posted);
    R->rows = xcalloc((size_t)g_size, sizeof *R->rows);
    R->layer = xcalloc((size_t)g_size, sizeof *R->layer);
    R->outp = xcalloc((size_t)g_size, sizeof *R->outp);
    R->calls = xcalloc((size_t)g_size, sizeof *R->calls);
    R->st = xcalloc((size_t)g_size, sizeof *R->st);
    const char *t = getenv("DELTAFIN_RANK_TIMEOUT");
    R->timeout = t && atof(t) > 0 ? atof(t) : 60.0;
    partition(R, heat_path);
    int hello[4] = {HELLO_MAGIC, c->NL, c->E, max_batch};
    if (MPI_Bcast(hello, 4, MPI_INT, 0, MPI_COMM_WORLD) != MPI_SUCCESS ||
        MPI_Bcast(R->owner, c->NL * c->E, MPI_BYTE, 0, MPI_COMM_WORLD) != MPI_SUCCESS) {
        ranks_close(R);
        return df_err_set(err, DF_ERR_IO, -1, "MPI: the ranks did not take the partition");
    }
    if (compare_models(eng, err)) {
        ranks_close(R);
        return -1;
    }
    R->mr = (moe_ranks){.n = g_size, .owner = R->owner, .post = post, .collect = collect, .ctx = R,
                        .local_calls = &R->calls[0]};
    eng->ranks = R;
    eng->mc.ranks = &R->mr;
    /* a look-ahead read here would be for experts other ranks compute */
    eng->pf.on = eng->pf.active = 0;
    if (!eng->mc.quiet) {
        size_t mine = 0;
        for (size_t k = 0; k < (size_t)c->NL * (size_t)c->E; k++) mine += R->owner[k] == 0;
        df_log("experts over %d ranks (MPI): rank 0 computes %zu of %zu (layer, expert) pairs", g_size, mine,
               (size_t)c->NL * (size_t)c->E);
    }
    return 0;
}

static int send_all(const void *p, int n, MPI_Datatype t, int tag)
{
    return MPI_Send(p, n, t, 0, tag, MPI_COMM_WORLD);
}

int df_ranks_hello(int *max_batch, df_error *err)
{
    if (!g_have_hello) {
        if (MPI_Bcast(g_hello, 4, MPI_INT, 0, MPI_COMM_WORLD) != MPI_SUCCESS || g_hello[0] != HELLO_MAGIC)
            return df_err_set(err, DF_ERR_IO, -1, "rank %d: rank 0 did not announce itself", g_rank);
        g_have_hello = 1;
    }
    *max_batch = g_hello[3];
    return 0;
}

int df_ranks_serve(df_engine *eng, df_error *err)
{
    const k3_config *c = &eng->m.cfg;
    int *hello = g_hello, mb;
    if (df_ranks_hello(&mb, err)) return -1;
    /* rank 0's partition, in rank 0's shape (this model's may differ:
     * compare_models says so on every rank) */
    uint8_t *owner = xmalloc((size_t)hello[1] * (size_t)hello[2]);
    MPI_Bcast(owner, hello[1] * hello[2], MPI_BYTE, 0, MPI_COMM_WORLD);
    free(owner);
    if (compare_models(eng, err)) return -1;
    int max_rows = hello[3] * c->k;
    df_session_opts so;
    df_session_opts_default(&so);
    so.n_ctx = 16;
    so.max_batch = hello[3];
    df_session *s;
    if (df_session_new(eng, &so, &s, err)) return -1;
    int *hdr = xmalloc((size_t)(4 + 2 * max_rows) * sizeof *hdr);
    float *x = xmalloc((size_t)max_rows * (size_t)c->Lt * sizeof *x);
    float *out = xmalloc((size_t)max_rows * (size_t)c->Lt * sizeof *out);
    double calls = 0, rows = 0, sec = 0;
    int rc = 0;
    for (;;) {
        MPI_Status st;
        if (MPI_Recv(hdr, 4 + 2 * max_rows, MPI_INT, 0, TAG_REQ, MPI_COMM_WORLD, &st) != MPI_SUCCESS) {
            rc = df_err_set(err, DF_ERR_IO, -1, "rank %d: rank 0 is gone", g_rank);
            break;
        }
        if (hdr[0] == OP_STOP) break;
        if (hdr[0] == OP_STATS) {
            double v[5] = {calls, rows, (double)eng->m.store.st.bytes_read, sec, (double)peak_rss_kb()};
            send_all(v, 5, MPI_DOUBLE, TAG_STATS);
            continue;
        }
        int il = hdr[1], n = hdr[2], nr = hdr[3];
        MPI_Recv(x, nr * c->Lt, MPI_FLOAT, 0, TAG_X, MPI_COMM_WORLD, &st);
        df_error e = {0};
        double t0 = now_sec();
        if (il < 0 || il >= c->NL || n < 1 || nr > max_rows ||
            moe_experts_for(&eng->mc, &s->b, il, hdr + 4, hdr + 4 + n, n, x, out, &e)) {
            char m[600];
            int len = snprintf(m, sizeof m, "ERR:rank %d: %s", g_rank, e.msg[0] ? e.msg : "bad request");
            send_all(m, len, MPI_BYTE, TAG_OUT);
            continue;
        }
        sec += now_sec() - t0;
        calls += n;
        rows += nr;
        send_all(out, (int)((size_t)nr * (size_t)c->Lt * sizeof(float)), MPI_BYTE, TAG_OUT);
    }
    free(hdr);
    free(x);
    free(out);
    df_session_free(s);
    return rc;
}

int df_ranks_stats(df_engine *eng, df_rank_stats *out, int max)
{
    struct df_ranks *R = eng->ranks;
    if (!R) return 0;
    int n = g_size < max ? g_size : max;
    for (int r = 0; r < n; r++) {
        out[r] = R->st[r];
        out[r].rank = r;
        out[r].expert_calls = R->calls[r];
        if (r == 0) {
            out[r].expert_bytes_read = eng->m.store.st.bytes_read;
            out[r].peak_rss_kb = peak_rss_kb();
            continue;
        }
        int h[4] = {OP_STATS, 0, 0, 0};
        double v[5] = {0};
        if (MPI_Send(h, 4, MPI_INT, r, TAG_REQ, MPI_COMM_WORLD) == MPI_SUCCESS &&
            MPI_Recv(v, 5, MPI_DOUBLE, r, TAG_STATS, MPI_COMM_WORLD, MPI_STATUS_IGNORE) == MPI_SUCCESS) {
            out[r].expert_bytes_read = (uint64_t)v[2];
            out[r].expert_sec = v[3];
            out[r].peak_rss_kb = (long)v[4];
        }
    }
    return n;
}

void ranks_close(struct df_ranks *R)
{
    if (!R) return;
    if (R->eng && R->eng->ranks == R) {
        for (int r = 1; r < g_size && !g_failed; r++) {
            int h[4] = {OP_STOP, 0, 0, 0};
            MPI_Send(h, 4, MPI_INT, r, TAG_REQ, MPI_COMM_WORLD);
        }
        R->eng->ranks = NULL;
        R->eng->mc.ranks = NULL;
    }
    free(R->owner);
    free(R->hdr);
    free(R->req);
    free(R->posted);
    free(R->rows);
    free(R->layer);
    free(R->outp);
    free(R->calls);
    free(R->st);
    free(R);
}

#else /* built without MPI: one process */

int df_ranks_init(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    if (getenv("OMPI_COMM_WORLD_SIZE") && atoi(getenv("OMPI_COMM_WORLD_SIZE")) > 1) {
        fprintf(stderr, "deltafin: started by mpirun, but built without MPI (install libopenmpi-dev and rebuild)\n");
        exit(2);
    }
    return 0;
}
int df_ranks_size(void) { return 1; }
int df_ranks_mpi(void) { return 0; }
int df_ranks_rank(void) { return 0; }
void df_ranks_finalize(void) {}
int df_ranks_attach(df_engine *eng, const char *heat_path, int max_batch, df_error *err)
{
    (void)eng, (void)heat_path, (void)max_batch, (void)err;
    return 0;
}
int df_ranks_serve(df_engine *eng, df_error *err)
{
    (void)eng;
    return df_err_set(err, DF_ERR_UNSUPPORTED, -1, "built without MPI");
}
int df_ranks_hello(int *max_batch, df_error *err)
{
    *max_batch = 0;
    return df_err_set(err, DF_ERR_UNSUPPORTED, -1, "built without MPI");
}
int df_ranks_stats(df_engine *eng, df_rank_stats *out, int max)
{
    (void)eng, (void)out, (void)max;
    return 0;
}
void ranks_close(struct df_ranks *R) { (void)R; }

#endif
