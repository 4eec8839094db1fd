/* test_trace.c - route traces (--trace, research/trace.h): the reader's
 * routes equal the engine's debug records bit for bit; traces are the same
 * at any thread count and batch width; `deltafin trace dump`, the Python
 * reader (tools/router/dftrace.py) and cachesim agree on both formats; bad
 * files are refused by byte, never read past.
 */
#include "harness.h"
#include "json.h"
#include "engine_impl.h"
#include "heat.h"
#include "research.h"
#include "trace.h"
#include "util.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { N_IDS = 24 };

static const char *model_dir(void)
{
    static char dir[512];
    if (!dir[0] &&
        gen_model("trace_m", "--preset small --set num_experts=32 --set num_experts_per_token=4 --seed 17", dir,
                  sizeof dir))
        dir[0] = 0;
    return dir[0] ? dir : NULL;
}

static int32_t id_at(int i) { return (int32_t)((i * 7919 + 31) % 1500 + 5); }

/* One (position, layer) route as the engine reported it. */
typedef struct {
    int n;
    int32_t ids[DBG_MAX_K];
    uint32_t w[DBG_MAX_K], s[DBG_MAX_K];
    int have;
} route;

static df_engine *open_traced(const char *dir, const char *trace, int threads)
{
    df_engine_opts o;
    df_engine_opts_default(&o);
    o.quiet = 1;
    o.mem_budget = (size_t)1 << 30;
    o.n_threads = threads;
    o.trace_path = trace;
    df_engine *eng = NULL;
    df_error err = {0};
    TCHECKF(df_engine_open(dir, &o, &eng, &err) == 0, "%s", err.msg);
    return eng;
}

/* Every (position, layer) route of a trace into r[pos * NL + layer];
 * checks the evaluation records against want_evals (pos0 of each, in order)
 * and the token ids against ids.  Returns the number of route rows. */
static int read_routes(const char *path, int NL, route *r, const int *want_evals, int n_evals)
{
    df_trace *t;
    df_error err = {0};
    if (df_trace_open(path, &t, &err)) {
        t_fail(__FILE__, __LINE__, "%s", err.msg);
        return -1;
    }
    const df_trace_info *in = df_trace_header(t);
    TCHECK(in->binary && in->layers == NL && in->top_k == 4 && in->experts == 32 && strstr(in->model, "trace_m"));
    df_trace_rec rec;
    int rc, rows = 0, ev = 0;
    while ((rc = df_trace_next(t, &rec, &err)) == 1) {
        if (rec.tag == TRACE_EVAL) {
            TCHECKF(ev < n_evals && rec.pos0 == want_evals[ev], "evaluation %d starts at %d", ev, rec.pos0);
            for (int i = 0; i < rec.n; i++)
                TCHECKF(rec.pos0 + i < N_IDS && rec.ids[i] == id_at(rec.pos0 + i), "evaluated id at %d", rec.pos0 + i);
            ev++;
            continue;
        }
        TCHECK(rec.tag == TRACE_ROUTE && rec.k == 4 && in->moe[rec.layer]);
        for (int p = 0; p < rec.n; p++) {
            int pos = rec.pos0 + p;
            if (pos < 0 || pos >= N_IDS) {
                t_fail(__FILE__, __LINE__, "route of position %d", pos);
                continue;
            }
            route *x = &r[pos * NL + rec.layer];
            TCHECKF(!x->have, "position %d layer %d traced twice", pos, rec.layer);
            x->have = 1;
            x->n = rec.k;
            memcpy(x->ids, rec.ids + (size_t)p * rec.k, (size_t)rec.k * 4);
            memcpy(x->w, rec.weight + (size_t)p * rec.k, (size_t)rec.k * 4);
            memcpy(x->s, rec.score + (size_t)p * rec.k, (size_t)rec.k * 4);
            for (int j = 0; j < rec.k; j++) {
                float s = rec.score[(size_t)p * rec.k + j];
                TCHECKF(s > 0.0f && s < 1.0f, "a router score of %g", (double)s);
            }
            rows++;
        }
    }
    TCHECKF(rc == 0, "%s", err.msg);
    TCHECKF(ev == n_evals, "%d evaluation records, %d expected", ev, n_evals);
    df_trace_close(t);
    return rows;
}

/* Tokens one at a time at two threads, the debug record of each position
 * kept; then the trace read back: the same experts and weight bits.  Then
 * one thread, the same ids as one evaluation in chunks of 5 rows: the same
 * routes, scores and weights, bit for bit. */
static void test_round_trip_and_invariance(void)
{
    const char *dir = model_dir();
    if (!dir) return;
    char t1[600], t2[600];
    snprintf(t1, sizeof t1, "%s/one_by_one.trace", test_scratch());
    snprintf(t2, sizeof t2, "%s/chunked.trace", test_scratch());
    df_engine *eng = open_traced(dir, t1, 2);
    if (!eng) return;
    df_model_info info;
    df_engine_info(eng, &info);
    int NL = info.n_layers;
    route *dbg = calloc((size_t)N_IDS * NL, sizeof *dbg), *r1 = calloc((size_t)N_IDS * NL, sizeof *r1),
          *r2 = calloc((size_t)N_IDS * NL, sizeof *r2);
    df_session_opts so;
    df_session_opts_default(&so);
    so.max_batch = 8;
    df_session *s;
    df_error err = {0};
    TCHECK(df_session_new(eng, &so, &s, &err) == 0);
    TCHECK(df_session_count_routes(s, &err) == 0);
    int E = info.n_experts;
    uint32_t *cnt1 = calloc((size_t)NL * E, sizeof *cnt1), *cnt2 = calloc((size_t)NL * E, sizeof *cnt2);
    uint64_t crows1 = 0, crows2 = 0;
    dbg_record d = {.enabled = 1, .t = -1};
    d.layers = calloc((size_t)NL, sizeof *d.layers);
    s->dbg = &d;
    float *logits = malloc((size_t)info.vocab * sizeof *logits);
    int evals1[N_IDS], evals2[N_IDS];
    for (int i = 0; i < N_IDS; i++) {
        int32_t id = id_at(i);
        for (int il = 0; il < NL; il++) d.layers[il].n_experts = 0;
        TCHECK(df_session_eval(s, &id, 1, logits, 0, &err) == 0);
        evals1[i] = i;
        for (int il = 0; il < NL; il++) {
            const dbg_layer *L = &d.layers[il];
            route *x = &dbg[i * NL + il];
            x->have = L->n_experts > 0;
            x->n = L->n_experts;
            for (int j = 0; j < L->n_experts; j++) {
                float w = (float)L->expert_weights[j];
                x->ids[j] = L->expert_ids[j];
                memcpy(&x->w[j], &w, 4);
            }
        }
    }
    memcpy(cnt1, df_session_route_counts(s, &crows1), (size_t)NL * E * sizeof *cnt1);
    df_session_route_counts_reset(s);
    uint64_t zr = 1;
    const uint32_t *z = df_session_route_counts(s, &zr);
    int nonzero = 0;
    for (int i = 0; i < NL * E; i++) nonzero += z[i] != 0;
    TCHECKF(zr == 0 && !nonzero, "after a reset: %d counts and %llu rows left", nonzero, (unsigned long long)zr);
    df_session_free(s);
    df_engine_close(eng);
    int rows1 = read_routes(t1, NL, r1, evals1, N_IDS);
    int moe_rows = 0;
    for (int i = 0; i < N_IDS * NL; i++) {
        moe_rows += dbg[i].have;
        TCHECKF(dbg[i].have == r1[i].have, "position %d layer %d: traced %d, debug %d", i / NL, i % NL, r1[i].have,
                dbg[i].have);
        if (!dbg[i].have || !r1[i].have) continue;
        TCHECKF(!memcmp(dbg[i].ids, r1[i].ids, 16) && !memcmp(dbg[i].w, r1[i].w, 16),
                "position %d layer %d: the trace's route is not the debug record's", i / NL, i % NL);
    }
    TCHECKF(rows1 == moe_rows && moe_rows >= N_IDS, "%d route rows read, %d MoE rows evaluated", rows1, moe_rows);

    eng = open_traced(dir, t2, 1);
    if (eng) {
        so.max_batch = 5;
        TCHECK(df_session_new(eng, &so, &s, &err) == 0);
        int32_t ids[N_IDS];
        for (int i = 0; i < N_IDS; i++) ids[i] = id_at(i);
        TCHECK(df_session_count_routes(s, &err) == 0);
        TCHECK(df_session_eval(s, ids, N_IDS, logits, 0, &err) == 0);
        memcpy(cnt2, df_session_route_counts(s, &crows2), (size_t)NL * E * sizeof *cnt2);
        df_session_free(s);
        df_engine_close(eng);
        evals2[0] = 0;
        int rows2 = read_routes(t2, NL, r2, evals2, 1);
        TCHECK(rows2 == rows1);
        for (int i = 0; i < N_IDS * NL; i++)
            TCHECKF(r1[i].have == r2[i].have && !memcmp(r1[i].ids, r2[i].ids, 16) && !memcmp(r1[i].w, r2[i].w, 16) &&
                        !memcmp(r1[i].s, r2[i].s, 16),
                    "position %d layer %d: routes differ between 2 threads one by one and 1 thread in chunks of 5",
                    i / NL, i % NL);
    }
    /* the route counts (observe_routes.c, the server's GET /v1/routes): the trace's routes counted
     * per layer and expert, the same one by one and in chunks of 5 */
    uint32_t *want = calloc((size_t)NL * E, sizeof *want);
    for (int i = 0; i < N_IDS * NL; i++)
        for (int j = 0; r1[i].have && j < r1[i].n; j++) want[(i % NL) * E + r1[i].ids[j]]++;
    int bad = 0;
    for (int i = 0; i < NL * E; i++) bad += cnt1[i] != want[i] || cnt2[i] != want[i];
    TCHECKF(!bad && crows1 == N_IDS && crows2 == N_IDS, "%d counts differ from the trace's; rows %llu, %llu of %d", bad,
            (unsigned long long)crows1, (unsigned long long)crows2, N_IDS);
    free(want);
    free(cnt1);
    free(cnt2);
    free(logits);
    free(d.layers);
    free(dbg);
    free(r1);
    free(r2);
}

/* The CLI: run --trace in both formats; trace dump against the Python
 * reader (binary) and against the JSON lines (the same experts); cachesim
 * gives the same table from either file. */
static void test_cli_formats(void)
{
    const char *dir = model_dir();
    if (!dir) return;
    char bin[600], jl[600], ids[400] = "";
    snprintf(bin, sizeof bin, "%s/cli.trace", test_scratch());
    snprintf(jl, sizeof jl, "%s/cli.jsonl", test_scratch());
    for (int i = 0; i < 12; i++) snprintf(ids + strlen(ids), sizeof ids - strlen(ids), "%s%d", i ? "," : "", id_at(i));
    static char out[1 << 20], out2[1 << 20], err[1 << 14];
    /* one position per evaluation (--batch 1): a binary trace's record is then one cachesim step,
     * as each JSON line is */
    const char *a1[] = {build_bin("deltafin"), "run", "--model", dir, "--prompt-ids", ids, "--max-new", "6",
                        "--trace", bin, "--batch", "1", NULL};
    TCHECKF(t_run(a1, NULL, 0, err, sizeof err) == 0, "%s", err);
    const char *a2[] = {build_bin("deltafin"), "run", "--model", dir, "--prompt-ids", ids, "--max-new", "6",
                        "--trace", jl, "--trace-format", "jsonl", "--threads", "1", "--batch", "1", NULL};
    TCHECKF(t_run(a2, NULL, 0, err, sizeof err) == 0, "%s", err);
    const char *d1[] = {build_bin("deltafin"), "trace", "dump", bin, NULL};
    TCHECKF(t_run(d1, out, sizeof out, err, sizeof err) == 0, "%s", err);
    TCHECK(strstr(out, "\"format\":\"binary\"") && strstr(out, "{\"eval\":{\"pos0\":0,\"ids\":[") &&
           strstr(out, "\"scores\":["));
    if (access("/usr/bin/python3", X_OK) == 0) {
        const char *py[] = {"/usr/bin/python3", "tools/router/dftrace.py", bin, NULL};
        int rc = t_run(py, out2, sizeof out2, err, sizeof err);
        if (rc != 0 && strstr(err, "No module named 'numpy'"))
            t_skip("the Python reader needs numpy (Debian's python3-numpy)");
        else
            TCHECKF(rc == 0 && !strcmp(out, out2), "the Python reader's dump differs from deltafin's: %s", err);
    } else {
        t_skip("no /usr/bin/python3: the Python reader is not checked");
    }
    /* the JSON lines hold the same experts in the same order */
    const char *d2[] = {build_bin("deltafin"), "trace", "dump", jl, NULL};
    TCHECKF(t_run(d2, out2, sizeof out2, err, sizeof err) == 0, "%s", err);
    int lines = 0;
    for (const char *p = out, *q = out2;;) {
        p = strstr(p, "{\"pos\":");
        q = strstr(q, "{\"pos\":");
        if (!p || !q) {
            TCHECKF(!p && !q, "the two formats hold different numbers of routes");
            break;
        }
        const char *pe = strstr(p, "],"), *qe = strstr(q, "],");
        TCHECKF(pe && qe && pe - p == qe - q && !memcmp(p, q, (size_t)(pe - p)), "route %d differs between formats",
                lines);
        lines++;
        p++, q++;
    }
    TCHECK(lines > 12);
    const char *c1[] = {build_bin("deltafin"), "cachesim", "--trace", bin, "--slots", "8,64", NULL};
    const char *c2[] = {build_bin("deltafin"), "cachesim", "--trace", jl, "--slots", "8,64", NULL};
    TCHECKF(t_run(c1, out, sizeof out, err, sizeof err) == 0, "%s", err);
    TCHECKF(t_run(c2, out2, sizeof out2, err, sizeof err) == 0, "%s", err);
    const char *b1 = strchr(out, '\n'), *b2 = strchr(out2, '\n');
    TCHECKF(b1 && b2 && !strcmp(b1, b2), "cachesim differs between the formats");
    /* trace cache: the pooled rows are cachesim's, then one entry per MoE layer */
    const char *c3[] = {build_bin("deltafin"), "trace", "cache", bin, "--slots", "8,64", "--json", NULL};
    TCHECKF(t_run(c3, out2, sizeof out2, err, sizeof err) == 0, "%s", err);
    df_error je = {0};
    json_doc *jd = json_parse(out2, strlen(out2), &je);
    TCHECKF(jd, "trace cache --json: %s", je.msg);
    if (jd) {
        const json_value *po = json_get(json_root(jd), "pooled"), *ly = json_get(json_root(jd), "layers");
        TCHECK(po && po->len == 2 && ly && ly->len == 7);
        int64_t lru = -1;
        if (po && po->len == 2) json_get_int(po->items[1], "hits_lru", &lru);
        TCHECK(lru >= 0);
        json_free(jd);
    }
    const char *bad[] = {build_bin("deltafin"), "trace", "plot", bin, NULL};
    TCHECK(t_run(bad, NULL, 0, err, sizeof err) != 0 && strstr(err, "usage"));
}

/* Every prefix of a real trace, and single corrupted fields: refused with
 * the byte named, or read to its end; the bytes sit against an unreadable
 * page, so reading past them faults. */
static void test_malformed(void)
{
    const char *dir = model_dir();
    if (!dir) return;
    char path[600], err_s[1 << 12];
    snprintf(path, sizeof path, "%s/small.trace", test_scratch());
    const char *a[] = {build_bin("deltafin"), "run", "--model", dir, "--prompt-ids", "5,6,7", "--max-new", "2",
                       "--trace", path, NULL};
    TCHECKF(t_run(a, NULL, 0, err_s, sizeof err_s) == 0, "%s", err_s);
    size_t n = 0;
    unsigned char *data = (unsigned char *)t_slurp(path, &n);
    TCHECK(data && n > 64 && n < (200u << 10));
    if (!data) return;
    int full = -1;
    for (size_t len = 0; len <= n; len++) {
        const unsigned char *p = guard_place(data, len);
        df_trace *t;
        df_error err = {0};
        int rc = df_trace_from_memory(p, len, "x", &t, &err);
        if (rc == 0) {
            df_trace_rec r;
            int routes = 0;
            while ((rc = df_trace_next(t, &r, &err)) == 1) routes += r.tag == TRACE_ROUTE;
            df_trace_close(t);
            if (len == n) full = routes;
        }
        if (rc < 0) TCHECKF(strstr(err.msg, "x:") || strstr(err.msg, "x "), "prefix %zu: %s", len, err.msg);
    }
    TCHECK(full > 0);
    /* a record's length past the end; a layer that is not MoE; an expert out of range */
    uint32_t hlen;
    memcpy(&hlen, data + 12, 4);
    size_t rec0 = 16 + hlen;
    unsigned char *c = malloc(n);
    struct { size_t off; uint32_t v; const char *want; } cases[] = {
        {rec0 + 4, 0x7ffffff0u, "does not fit"},
        {rec0 + 4, 12, "bad evaluation"},
        {12, 3, "does not fit"},
        {8, 2, "version 2"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        memcpy(c, data, n);
        memcpy(c + cases[k].off, &cases[k].v, 4);
        df_trace *t;
        df_error err = {0};
        int rc = df_trace_from_memory(c, n, "x", &t, &err);
        if (rc == 0) {
            df_trace_rec r;
            while ((rc = df_trace_next(t, &r, &err)) == 1) {}
            df_trace_close(t);
        }
        TCHECKF(rc < 0 && strstr(err.msg, cases[k].want), "case %zu: %s", k, err.msg);
    }
    /* the first route record: its layer set to 0 (a dense layer here) */
    size_t at = rec0;
    for (;;) {
        uint32_t tag, len;
        memcpy(&tag, data + at, 4), memcpy(&len, data + at + 4, 4);
        if (tag == TRACE_ROUTE) break;
        at += 8 + len;
    }
    memcpy(c, data, n);
    uint32_t zero = 0, big = 999;
    memcpy(c + at + 12, &zero, 4);
    df_trace *t;
    df_error err = {0};
    df_trace_rec r;
    TCHECK(df_trace_from_memory(c, n, "x", &t, &err) == 0);
    int rc;
    while ((rc = df_trace_next(t, &r, &err)) == 1) {}
    df_trace_close(t);
    TCHECKF(rc < 0 && strstr(err.msg, "bad route record"), "%s", err.msg);
    memcpy(c, data, n);
    memcpy(c + at + 24, &big, 4);
    df_err_clear(&err);
    TCHECK(df_trace_from_memory(c, n, "x", &t, &err) == 0);
    while ((rc = df_trace_next(t, &r, &err)) == 1) {}
    df_trace_close(t);
    TCHECKF(rc < 0 && strstr(err.msg, "expert id 999"), "%s", err.msg);
    df_err_clear(&err);
    TCHECK(df_trace_from_memory("PK\3\4", 4, "x", &t, &err) < 0 && strstr(err.msg, "not a deltafin route trace"));
    free(c);
    free(data);
}

/* Two JSON documents equal: the same keys in the same order, the same
 * integers, doubles within 1e-12 relative (two summation orders) */
static int json_same(const json_value *a, const json_value *b, char *where, size_t n)
{
    if (a->type != b->type) return snprintf(where, n, "types differ"), 0;
    switch (a->type) {
    case JSON_NUMBER:
        if (a->is_int && b->is_int) return a->i == b->i || (snprintf(where, n, "%lld != %lld", (long long)a->i, (long long)b->i), 0);
        if (fabs(a->num - b->num) <= 1e-12 * fabs(a->num) + 1e-300) return 1;
        return snprintf(where, n, "%.17g != %.17g", a->num, b->num), 0;
    case JSON_ARRAY:
    case JSON_OBJECT:
        if (a->len != b->len) return snprintf(where, n, "%zu entries != %zu", a->len, b->len), 0;
        for (size_t i = 0; i < a->len; i++) {
            if (a->type == JSON_OBJECT && strcmp(a->keys[i], b->keys[i]))
                return snprintf(where, n, "key %s != %s", a->keys[i], b->keys[i]), 0;
            if (!json_same(a->items[i], b->items[i], where, n)) {
                size_t l = strlen(where);
                snprintf(where + l, n - l, " <- %s[%zu]", a->type == JSON_OBJECT ? a->keys[i] : "", i);
                return 0;
            }
        }
        return 1;
    default: return 1;
    }
}

/* Every key of the Python document in deltafin's, with the same values
 * (json_same's rules); deltafin may have more (the cache replay's LFU and
 * TLFU, which are the engine's own cache code) */
static int json_within(const json_value *py, const json_value *c, char *where, size_t n)
{
    if (py->type != JSON_OBJECT && py->type != JSON_ARRAY) return json_same(py, c, where, n);
    if (py->type != c->type) return snprintf(where, n, "types differ"), 0;
    if (py->type == JSON_ARRAY && py->len != c->len) return snprintf(where, n, "%zu entries != %zu", py->len, c->len), 0;
    for (size_t i = 0; i < py->len; i++) {
        const json_value *cv = py->type == JSON_ARRAY ? c->items[i] : json_get(c, py->keys[i]);
        if (!cv) return snprintf(where, n, "no %s", py->keys[i]), 0;
        if (!json_within(py->items[i], cv, where, n)) return 0;
    }
    return 1;
}

/* The committed traces (testdata/traces: the default model's answers to
 * "What is 23 + 45?" and "... + 46?", with --trace-lookahead 2): every verb's
 * --json against tools/router/dftrace.py, which computes each figure again
 * from its own reader */
static void test_committed_against_python(void)
{
    if (access("/usr/bin/python3", X_OK) != 0) TSKIP("no /usr/bin/python3");
    char a[600], b[600];
    snprintf(a, sizeof a, "%s/traces/a.trace", testdata_dir());
    snprintf(b, sizeof b, "%s/traces/b.trace", testdata_dir());
    /* deltafin's arguments after "trace", then dftrace.py's; "A" and "B" are the two traces */
    static const char *cases[][2][7] = {
        {{"stats", "A", "--json", NULL}, {"--stats", "4", "A", NULL}},
        {{"reuse", "A", "--json", "--max-distance", "12", NULL}, {"--reuse", "12", "A", NULL}},
        {{"prefetch", "B", "--json", NULL}, {"--prefetch", "B", NULL}},
        {{"cache", "A", "--json", "--slots", "4,8,28,112", NULL}, {"--cache", "4,8,28,112", "A", NULL}},
        {{"diff", "A", "B", "--json", NULL}, {"--diff", "A", "B", NULL}},
    };
    static char out[1 << 20], py_out[1 << 20], err[1 << 14];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *argv[12] = {build_bin("deltafin"), "trace"}, *pv[8] = {"/usr/bin/python3", "tools/router/dftrace.py"};
        int n = 2, m = 2;
        for (int j = 0; cases[i][0][j]; j++)
            argv[n++] = !strcmp(cases[i][0][j], "A") ? a : !strcmp(cases[i][0][j], "B") ? b : cases[i][0][j];
        for (int j = 0; cases[i][1][j]; j++)
            pv[m++] = !strcmp(cases[i][1][j], "A") ? a : !strcmp(cases[i][1][j], "B") ? b : cases[i][1][j];
        const char *const *cs = cases[i][0];
        argv[n] = NULL, pv[m] = NULL;
        TCHECKF(t_run(argv, out, sizeof out, err, sizeof err) == 0, "trace %s: %s", cs[0], err);
        int rc = t_run(pv, py_out, sizeof py_out, err, sizeof err);
        if (rc != 0 && strstr(err, "No module named 'numpy'")) TSKIP("the Python reader needs numpy (python3-numpy)");
        TCHECKF(rc == 0, "dftrace.py %s: %s", pv[2], err);
        df_error e1 = {0}, e2 = {0};
        json_doc *d1 = json_parse(out, strlen(out), &e1), *d2 = json_parse(py_out, strlen(py_out), &e2);
        char where[400] = "";
        TCHECKF(d1 && d2 && json_within(json_root(d2), json_root(d1), where, sizeof where), "trace %s: %s %s %s",
                cs[0], where, e1.msg, e2.msg);
        json_free(d1);
        json_free(d2);
    }
}

/* `trace stats --json` and `trace reuse --json` against tools/router/dftrace.py,
 * which computes every figure again from its own reader (numpy) */
static void test_stats_against_python(void)
{
    const char *dir = model_dir();
    if (!dir) return;
    if (access("/usr/bin/python3", X_OK) != 0) TSKIP("no /usr/bin/python3");
    char path[600], ids[1200] = "";
    snprintf(path, sizeof path, "%s/stats.trace", test_scratch());
    for (int i = 0; i < 60; i++) snprintf(ids + strlen(ids), sizeof ids - strlen(ids), "%s%d", i ? "," : "", id_at(i % 17));
    static char out[1 << 20], out2[1 << 20], err[1 << 14];
    const char *a[] = {build_bin("deltafin"), "run", "--model", dir, "--prompt-ids", ids, "--max-new", "40",
                       "--trace", path, NULL};
    TCHECKF(t_run(a, NULL, 0, err, sizeof err) == 0, "%s", err);
    const char *verbs[][4] = {{"stats", "--stats", "4", NULL}, {"reuse", "--reuse", "9", "--max-distance"}};
    for (int v = 0; v < 2; v++) {
        const char *c[] = {build_bin("deltafin"), "trace", verbs[v][0], path, "--json", verbs[v][3], verbs[v][2], NULL};
        if (!verbs[v][3]) c[5] = NULL;
        TCHECKF(t_run(c, out, sizeof out, err, sizeof err) == 0, "%s", err);
        const char *py[] = {"/usr/bin/python3", "tools/router/dftrace.py", verbs[v][1], verbs[v][2], path, NULL};
        int rc = t_run(py, out2, sizeof out2, err, sizeof err);
        if (rc != 0 && strstr(err, "No module named 'numpy'")) TSKIP("the Python reader needs numpy (python3-numpy)");
        TCHECKF(rc == 0, "%s", err);
        df_error e1 = {0}, e2 = {0};
        json_doc *d1 = json_parse(out, strlen(out), &e1), *d2 = json_parse(out2, strlen(out2), &e2);
        TCHECKF(d1 && d2, "%s / %s", e1.msg, e2.msg);
        char where[400] = "";
        if (d1 && d2) TCHECKF(json_same(json_root(d1), json_root(d2), where, sizeof where), "trace %s: %s", verbs[v][0], where);
        const json_value *L = d1 ? json_get(json_root(d1), "layers") : NULL;
        TCHECK(L && L->len > 0);
        json_free(d1);
        json_free(d2);
    }
}

/* trace diff: a trace against itself, against its JSON lines (the same
 * experts, weights rounded to seven digits) and against a prompt that
 * differs from position 7 on: routes are causal, so positions 0..6 agree
 * bit for bit and the first difference is at 7 or later. */
static void test_diff(void)
{
    const char *dir = model_dir();
    if (!dir) return;
    char p1[600], p2[600], p3[600], ids1[400] = "", ids2[400] = "";
    snprintf(p1, sizeof p1, "%s/d1.trace", test_scratch());
    snprintf(p2, sizeof p2, "%s/d2.trace", test_scratch());
    snprintf(p3, sizeof p3, "%s/d3.jsonl", test_scratch());
    for (int i = 0; i < 20; i++) {
        snprintf(ids1 + strlen(ids1), sizeof ids1 - strlen(ids1), "%s%d", i ? "," : "", id_at(i));
        snprintf(ids2 + strlen(ids2), sizeof ids2 - strlen(ids2), "%s%d", i ? "," : "", i < 7 ? id_at(i) : id_at(i + 50));
    }
    static char err[1 << 14];
    const char *a1[] = {build_bin("deltafin"), "run", "--model", dir, "--prompt-ids", ids1, "--max-new", "4",
                        "--trace", p1, NULL};
    const char *a2[] = {build_bin("deltafin"), "run", "--model", dir, "--prompt-ids", ids2, "--max-new", "4",
                        "--trace", p2, "--threads", "1", NULL};
    const char *a3[] = {build_bin("deltafin"), "run", "--model", dir, "--prompt-ids", ids1, "--max-new", "4",
                        "--trace", p3, "--trace-format", "jsonl", NULL};
    TCHECKF(t_run(a1, NULL, 0, err, sizeof err) == 0, "%s", err);
    TCHECKF(t_run(a2, NULL, 0, err, sizeof err) == 0, "%s", err);
    TCHECKF(t_run(a3, NULL, 0, err, sizeof err) == 0, "%s", err);
    df_trace_diff D;
    df_error e = {0};
    TCHECKF(df_trace_diff_compute(p1, p1, &D, &e) == 0, "%s", e.msg);
    TCHECK(D.pooled.compared >= 24 && !D.pooled.set_differs && !D.pooled.order_differs && !D.pooled.weight_differs &&
           D.pooled.mean_overlap == 1.0 && D.pooled.first_pos == -1 && !D.only_a && !D.only_b);
    df_trace_diff_free(&D);
    TCHECKF(df_trace_diff_compute(p1, p3, &D, &e) == 0, "%s", e.msg);
    TCHECKF(!D.pooled.set_differs && !D.pooled.order_differs && D.pooled.max_weight_diff < 1e-6 &&
                D.pooled.first_pos == -1,
            "binary against its JSON lines: %llu sets, %llu orders differ, max |dw| %g",
            (unsigned long long)D.pooled.set_differs, (unsigned long long)D.pooled.order_differs,
            D.pooled.max_weight_diff);
    df_trace_diff_free(&D);
    TCHECKF(df_trace_diff_compute(p1, p2, &D, &e) == 0, "%s", e.msg);
    TCHECKF(D.pooled.first_pos >= 7 && D.pooled.set_differs > 0, "another prompt from position 7: first difference %d",
            D.pooled.first_pos);
    /* positions 0..6 held the same: nothing before 7 differs in any layer */
    for (int i = 0; i < D.n_layers; i++) TCHECK(D.layers[i].first_pos == -1 || D.layers[i].first_pos >= 7);
    df_trace_diff_free(&D);
    static char out[1 << 16];
    const char *c[] = {build_bin("deltafin"), "trace", "diff", p1, p2, "--json", NULL};
    TCHECKF(t_run(c, out, sizeof out, err, sizeof err) == 0, "%s", err);
    TCHECK(strstr(out, "\"pooled\":{\"compared\":") != NULL);
}

/* --svg: the three plots, well formed as far as a count can tell (Chromium
 * renders them in make server-test), a heat-map cell per layer and expert,
 * the same bytes when written twice */
static void test_svg(void)
{
    const char *dir = model_dir();
    if (!dir) return;
    char path[600], d1[600], d2[600], f[700];
    snprintf(path, sizeof path, "%s/svg.trace", test_scratch());
    snprintf(d1, sizeof d1, "%s/svg1", test_scratch());
    snprintf(d2, sizeof d2, "%s/svg2", test_scratch());
    static char err[1 << 14];
    const char *a[] = {build_bin("deltafin"), "run", "--model", dir, "--prompt-ids", "5,6,7,8,9", "--max-new", "20",
                       "--trace", path, NULL};
    TCHECKF(t_run(a, NULL, 0, err, sizeof err) == 0, "%s", err);
    for (int r = 0; r < 2; r++) {
        const char *o = r ? d2 : d1;
        const char *s[] = {build_bin("deltafin"), "trace", "stats", path, "--svg", o, NULL};
        const char *c[] = {build_bin("deltafin"), "trace", "cache", path, "--slots", "4,16,64", "--svg", o, NULL};
        TCHECKF(t_run(s, NULL, 0, err, sizeof err) == 0, "%s", err);
        TCHECKF(t_run(c, NULL, 0, err, sizeof err) == 0, "%s", err);
    }
    static const char *names[] = {"popularity.svg", "reuse.svg", "cache.svg"};
    for (int i = 0; i < 3; i++) {
        size_t n1 = 0, n2 = 0;
        snprintf(f, sizeof f, "%s/%s", d1, names[i]);
        char *x = t_slurp(f, &n1);
        snprintf(f, sizeof f, "%s/%s", d2, names[i]);
        char *y = t_slurp(f, &n2);
        TCHECKF(x && y && n1 == n2 && !memcmp(x, y, n1), "%s: not the same bytes twice", names[i]);
        TCHECKF(x && !strncmp(x, "<svg ", 5) && strstr(x, "</svg>\n"), "%s: not an SVG document", names[i]);
        if (x && i == 0) {
            int cells = 0;
            for (const char *p = x; (p = strstr(p, "class=\"cell\"")); p++) cells++;
            TCHECKF(cells == 7 * 32, "%d heat-map cells, expected 7 layers x 32 experts", cells);
        }
        if (x && i == 2) TCHECK(strstr(x, "class=\"Belady\"") && strstr(x, "class=\"LFU\""));
        free(x);
        free(y);
    }
    const char *bad[] = {build_bin("deltafin"), "trace", "stats", path, "--svg", "/proc/nope/x", NULL};
    TCHECK(t_run(bad, NULL, 0, err, sizeof err) != 0 && strstr(err, "--svg /proc/nope/x"));
    /* an attention map: a cell per weight the dump kept for that layer and head */
    char ap[600], amap[700];
    snprintf(ap, sizeof ap, "%s/svg.attn", test_scratch());
    const char *da[] = {build_bin("deltafin"), "run", "--model", dir, "--prompt-ids", "5,6,7,8,9,10,11", "--max-new",
                        "6", "--dump-attention", ap, "--attn-top", "3", NULL};
    TCHECKF(t_run(da, NULL, 0, err, sizeof err) == 0, "%s", err);
    df_trace *t;
    df_error e = {0};
    int want = 0, layer = -1;
    if (df_trace_open(ap, &t, &e) == 0) {
        df_trace_rec r;
        while (df_trace_next(t, &r, &e) == 1) {
            if (r.tag != TRACE_ATTN) continue;
            if (layer < 0) layer = r.layer;
            if (r.layer != layer) continue;
            for (int q = 0; q < r.n; q++)
                for (int j = 0; j < r.k; j++) want += r.ids[((size_t)q * r.n_heads + 1) * r.k + (size_t)j] >= 0;
        }
        df_trace_close(t);
    }
    TCHECK(layer >= 0 && want > 6);
    char ls[16];
    snprintf(ls, sizeof ls, "%d", layer);
    const char *am[] = {build_bin("deltafin"), "trace", "attention", ap, "--layer", ls, "--head", "1", "--svg", d1, NULL};
    TCHECKF(t_run(am, NULL, 0, err, sizeof err) == 0, "%s", err);
    snprintf(amap, sizeof amap, "%s/attention-%d-1.svg", d1, layer);
    size_t an = 0;
    char *x = t_slurp(amap, &an);
    int cells = 0;
    for (const char *p = x; p && (p = strstr(p, "class=\"cell\"")); p++) cells++;
    TCHECKF(x && cells == want, "attention map: %d cells, the dump keeps %d weights", cells, want);
    free(x);
    const char *am2[] = {build_bin("deltafin"), "trace", "attention", ap, "--layer", "0", "--svg", d1, NULL};
    TCHECK(t_run(am2, NULL, 0, err, sizeof err) != 0 && strstr(err, "no attention of layer 0"));
}

/* Every (position, layer, head) entry of an attention dump, as bytes
 * (positions then weights), into out[pos][layer][head]; returns entries */
static int read_attn(const char *path, int NL, int H, int K, char *out, size_t rec, float *kda, int *n_kda)
{
    df_trace *t;
    df_error err = {0};
    if (df_trace_open(path, &t, &err)) {
        t_fail(__FILE__, __LINE__, "%s", err.msg);
        return -1;
    }
    df_trace_rec r;
    int rc, n = 0;
    while ((rc = df_trace_next(t, &r, &err)) == 1) {
        if (r.tag == TRACE_KDA) { /* [pos][layer][head][4] */
            TCHECK(r.n_heads <= 64 && r.layer < NL && r.k == 4);
            for (int q = 0; q < r.n && r.n_heads <= 64; q++)
                if (r.pos0 + q < 40)
                    memcpy(kda + (((size_t)(r.pos0 + q) * NL + (size_t)r.layer) * 64) * 4,
                           r.weight + (size_t)q * r.n_heads * 4, (size_t)r.n_heads * 16);
            (*n_kda)++;
            continue;
        }
        if (r.tag != TRACE_ATTN) continue;
        TCHECK(r.k == K && r.head0 == 0 && r.n_heads == H && r.layer < NL);
        for (int q = 0; q < r.n; q++)
            for (int h = 0; h < r.n_heads; h++) {
                int pos = r.pos0 + q;
                if (pos >= 40) continue;
                size_t at = ((size_t)q * r.n_heads + (size_t)h) * (size_t)K;
                char *o = out + (((size_t)pos * NL + (size_t)r.layer) * H + (size_t)h) * rec;
                memcpy(o, r.ids + at, (size_t)K * 4);
                memcpy(o + (size_t)K * 4, r.weight + at, (size_t)K * 4);
                /* a whole distribution (K >= the context): sorted, sums to 1 */
                double sum = 0;
                for (int j = 0; j < K; j++) {
                    sum += r.weight[at + j];
                    if (j) TCHECK(r.weight[at + j] <= r.weight[at + j - 1]);
                    TCHECK(r.ids[at + j] <= pos);
                }
                TCHECKF(fabs(sum - 1.0) < 1e-5, "position %d layer %d head %d: weights sum to %.9g", pos, r.layer, h,
                        sum);
                n++;
            }
    }
    TCHECKF(rc == 0, "%s", err.msg);
    df_trace_close(t);
    return n;
}

/* --dump-attention: the same weights at two threads in one chunk, one
 * thread a token at a time, and the reference kernels; every query's
 * weights (K >= its context) sorted and summing to 1; bad flags refused */
static void test_attention(void)
{
    const char *dir = model_dir();
    if (!dir) return;
    enum { K = 48, H_MAX = 64 };
    char p[3][600], ids[400] = "";
    for (int i = 0; i < 30; i++) snprintf(ids + strlen(ids), sizeof ids - strlen(ids), "%s%d", i ? "," : "", id_at(i));
    static const char *variants[3][6] = {{"--threads", "2", NULL},
                                         {"--threads", "1", "--batch", "1", NULL},
                                         {"--threads", "2", "--kernels", "ref", NULL}};
    static char err[1 << 14];
    for (int v = 0; v < 3; v++) {
        snprintf(p[v], sizeof p[v], "%s/attn%d.trace", test_scratch(), v);
        const char *a[20] = {build_bin("deltafin"), "run", "--model", dir, "--prompt-ids", ids, "--max-new", "8",
                             "--dump-attention", p[v], "--attn-top", "48"};
        int n = 12;
        for (int k = 0; variants[v][k]; k++) a[n++] = variants[v][k];
        a[n] = NULL;
        TCHECKF(t_run(a, NULL, 0, err, sizeof err) == 0, "%s", err);
    }
    df_trace *t;
    df_error e = {0};
    if (df_trace_open(p[0], &t, &e)) {
        t_fail(__FILE__, __LINE__, "%s", e.msg);
        return;
    }
    int NL = df_trace_header(t)->layers;
    df_trace_close(t);
    size_t rec = (size_t)K * 8, total = (size_t)40 * NL * H_MAX * rec;
    char *got[3];
    float *kda[3];
    int n[3], nk[3] = {0, 0, 0};
    int H = 0;
    /* the test model's heads: from the first record */
    {
        df_trace_rec r;
        TCHECK(df_trace_open(p[0], &t, &e) == 0);
        while (df_trace_next(t, &r, &e) == 1)
            if (r.tag == TRACE_ATTN) {
                H = r.n_heads;
                break;
            }
        df_trace_close(t);
    }
    TCHECK(H > 0 && H <= H_MAX);
    if (H <= 0 || H > H_MAX) return;
    size_t ktotal = (size_t)40 * NL * 64 * 4 * sizeof(float);
    for (int v = 0; v < 3; v++) {
        got[v] = calloc(1, total);
        kda[v] = calloc(1, ktotal);
        n[v] = read_attn(p[v], NL, H, K, got[v], rec, kda[v], &nk[v]);
    }
    TCHECKF(n[0] > 0 && n[0] == n[1] && n[0] == n[2], "entries %d / %d / %d", n[0], n[1], n[2]);
    TCHECKF(!memcmp(got[0], got[1], total), "attention differs between 2 threads in a chunk and 1 thread one by one");
    TCHECKF(!memcmp(got[0], got[2], total), "attention differs between the selected kernels and the reference");
    TCHECKF(nk[0] > 0 && nk[1] > 0 && nk[2] > 0, "KDA records %d / %d / %d", nk[0], nk[1], nk[2]);
    TCHECKF(!memcmp(kda[0], kda[1], ktotal) && !memcmp(kda[0], kda[2], ktotal),
            "KDA statistics differ between threads, chunks or kernels");
    for (int v = 0; v < 3; v++) free(got[v]), free(kda[v]);
    /* a KDA layer alone: its statistics, no attention record */
    const char *kd[] = {build_bin("deltafin"), "run", "--model", dir, "--prompt-ids", "1,2,3", "--dump-attention",
                        p[0], "--attn-layers", "0", NULL};
    TCHECKF(t_run(kd, NULL, 0, err, sizeof err) == 0, "%s", err);
    int kinds[5] = {0};
    if (df_trace_open(p[0], &t, &e) == 0) {
        df_trace_rec r;
        while (df_trace_next(t, &r, &e) == 1)
            if (r.tag >= 1 && r.tag <= 4) kinds[r.tag]++;
        df_trace_close(t);
    }
    TCHECKF(kinds[TRACE_KDA] > 0 && !kinds[TRACE_ATTN] && kinds[TRACE_EVAL] > 0, "layer 0 alone: %d KDA, %d attention",
            kinds[TRACE_KDA], kinds[TRACE_ATTN]);
    const char *bad[] = {build_bin("deltafin"), "run", "--model", dir, "--prompt-ids", "1,2", "--dump-attention",
                         p[0], "--attn-layers", "0..99", NULL};
    TCHECK(t_run(bad, NULL, 0, err, sizeof err) != 0 && strstr(err, "outside the model"));
    const char *bad2[] = {build_bin("deltafin"), "run", "--model", dir, "--prompt-ids", "1,2", "--attn-top", "4", NULL};
    TCHECK(t_run(bad2, NULL, 0, err, sizeof err) != 0 && strstr(err, "need --dump-attention"));
    const char *bad3[] = {build_bin("deltafin"), "run", "--model", dir, "--prompt-ids", "1,2", "--dump-attention", p[0],
                          "--backend", "ref", NULL};
    TCHECK(t_run(bad3, NULL, 0, err, sizeof err) != 0 && strstr(err, "needs the cpu backend"));
}

/* --trace-lookahead and trace prefetch: the predictions are the same bits at
 * 2 threads in one chunk and 1 thread one token at a time; the figures
 * equal tools/router/dftrace.py's, computed from its own reader */
static void test_prefetch(void)
{
    const char *dir = model_dir();
    if (!dir) return;
    char p[2][600], ids[400] = "";
    for (int i = 0; i < 24; i++) snprintf(ids + strlen(ids), sizeof ids - strlen(ids), "%s%d", i ? "," : "", id_at(i));
    static char out[2][1 << 16], err[1 << 14];
    for (int v = 0; v < 2; v++) {
        snprintf(p[v], sizeof p[v], "%s/la%d.trace", test_scratch(), v);
        const char *a[] = {build_bin("deltafin"), "run", "--model", dir, "--prompt-ids", ids, "--max-new", "8",
                           "--trace", p[v], "--trace-lookahead", "2", "--threads", v ? "1" : "2",
                           v ? "--batch" : NULL, "1", NULL};
        TCHECKF(t_run(a, NULL, 0, err, sizeof err) == 0, "%s", err);
        const char *c[] = {build_bin("deltafin"), "trace", "prefetch", p[v], "--json", NULL};
        TCHECKF(t_run(c, out[v], sizeof out[v], err, sizeof err) == 0, "%s", err);
    }
    TCHECKF(!strcmp(out[0], out[1]), "the look-ahead differs between 2 threads in a chunk and 1 thread one by one");
    TCHECK(strstr(out[0], "\"d\":2,\"layer\":-1") != NULL);
    if (access("/usr/bin/python3", X_OK) == 0) {
        static char py_out[1 << 16];
        const char *py[] = {"/usr/bin/python3", "tools/router/dftrace.py", "--prefetch", p[0], NULL};
        int rc = t_run(py, py_out, sizeof py_out, err, sizeof err);
        if (rc != 0 && strstr(err, "No module named 'numpy'")) TSKIP("the Python reader needs numpy");
        TCHECKF(rc == 0, "%s", err);
        df_error e1 = {0}, e2 = {0};
        json_doc *d1 = json_parse(out[0], strlen(out[0]), &e1), *d2 = json_parse(py_out, strlen(py_out), &e2);
        char where[400] = "";
        TCHECKF(d1 && d2 && json_same(json_root(d1), json_root(d2), where, sizeof where), "trace prefetch: %s %s %s",
                where, e1.msg, e2.msg);
        json_free(d1);
        json_free(d2);
    }
    char plain[600];
    snprintf(plain, sizeof plain, "%s/plain.trace", test_scratch());
    const char *a[] = {build_bin("deltafin"), "run", "--model", dir, "--prompt-ids", "5,6", "--max-new", "2", "--trace",
                       plain, NULL};
    TCHECKF(t_run(a, NULL, 0, err, sizeof err) == 0, "%s", err);
    const char *c[] = {build_bin("deltafin"), "trace", "prefetch", plain, NULL};
    TCHECK(t_run(c, NULL, 0, err, sizeof err) != 0 && strstr(err, "--trace-lookahead"));
}

/* The engine's cache counts rows (moe.c): after a prompt of 40 ids in one
 * chunk and 3 decoded, the heat file written at exit holds, per expert, the
 * sum over the trace's route records of its rows x the record's distinct
 * experts / (positions x k) (a decode record: 1); `--cache-policy
 * lfu-steps` holds the number of records the expert is in. */
static void test_rows_counted(void)
{
    const char *dir = model_dir();
    if (!dir) return;
    char ids[400] = "", err[1 << 12];
    for (int i = 0; i < 40; i++) snprintf(ids + strlen(ids), sizeof ids - strlen(ids), "%s%d", i ? "," : "", id_at(i));
    static const char *pols[2] = {"lfu", "lfu-steps"};
    for (int pi = 0; pi < 2; pi++) {
        char tr[600], heat[600];
        snprintf(tr, sizeof tr, "%s/rows-%d.trace", test_scratch(), pi);
        snprintf(heat, sizeof heat, "%s/rows-%d.heat", test_scratch(), pi);
        const char *a[] = {build_bin("deltafin"), "run", "--model", dir, "--prompt-ids", ids, "--max-new", "3",
                           "--batch", "64", "--threads", "1", "--cache-policy", pols[pi], "--trace", tr, "--heat",
                           heat, NULL};
        TCHECKF(t_run(a, NULL, 0, err, sizeof err) == 0, "%s", err);
        df_trace *t;
        df_error e = {0};
        TCHECKF(df_trace_open(tr, &t, &e) == 0, "%s", e.msg);
        if (!t) return;
        const df_trace_info *in = df_trace_header(t);
        size_t nk = (size_t)in->layers * (size_t)in->experts;
        double *want = calloc(nk, sizeof *want);
        float *got = calloc(nk, sizeof *got);
        int *cnt = calloc((size_t)in->experts, sizeof *cnt), chunks = 0;
        CHECK(want && got && cnt);
        df_trace_rec r;
        while (df_trace_next(t, &r, &e) == 1) {
            if (r.tag != TRACE_ROUTE) continue;
            memset(cnt, 0, (size_t)in->experts * sizeof *cnt);
            int distinct = 0;
            for (int q = 0; q < r.n * r.k; q++) distinct += cnt[r.ids[q]]++ == 0;
            for (int x = 0; x < in->experts; x++)
                if (cnt[x]) want[(size_t)r.layer * in->experts + x] += pi ? 1.0 : (double)cnt[x] * distinct / (r.n * r.k);
            chunks += r.n > 1;
        }
        int layers = in->layers, experts = in->experts; /* the header goes with the trace */
        df_trace_close(t);
        TCHECKF(heat_load(heat, layers, experts, got, &e) == 0, "%s", e.msg);
        int bad = 0, uneven = 0;
        for (size_t key = 0; key < nk; key++) {
            bad += fabs(got[key] - want[key]) > 1e-4 * (1 + want[key]);
            uneven += want[key] != floor(want[key]);
        }
        TCHECKF(!bad, "%s: %d experts' counts differ from the trace's rows", pols[pi], bad);
        /* the prompt was one chunk, and row counts made some counts fractional */
        TCHECK(chunks > 0 && (pi ? !uneven : uneven > 0));
        free(want), free(got), free(cnt);
    }
}

static const test_case tests[] = {
    {"committed_against_python", test_committed_against_python},
    {"prefetch", test_prefetch},
    {"rows_counted", test_rows_counted},
    {"attention", test_attention},
    {"svg", test_svg},
    {"diff", test_diff},
    {"stats_against_python", test_stats_against_python},
    {"round_trip_and_invariance", test_round_trip_and_invariance},
    {"cli_formats", test_cli_formats},
    {"malformed", test_malformed},
};

int main(int argc, char **argv)
{
    int rc = test_main(tests, NTESTS(tests), argc, argv);
    test_scratch_remove();
    return rc;
}
