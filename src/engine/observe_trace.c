/* observe_trace.c - the route trace observer (--trace FILE): every
 * evaluation's ids and, at each MoE layer's PROBE_ROUTE, its positions'
 * experts, router scores and weights; binary (trace_format.h, the default)
 * or one JSON line per position and layer (--trace-format jsonl, the
 * older format that scripts may read).  The header is written at open
 * (trace_open); records go through the engine's own stdio buffer, so the
 * token loop allocates nothing.
 */
#include "engine_impl.h"
#include "json_write.h"
#include "backend_cpu.h"
#include "mathfn.h"
#include "trace_format.h"
#include "util.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the binary route trace is written in the host's byte order: little-endian only"
#endif

void put_u32(FILE *f, uint32_t v) { fwrite(&v, sizeof v, 1, f); }

int trace_open(df_engine *eng, const char *path, int jsonl, const char *model, df_error *err)
{
    const k3_config *c = &eng->m.cfg;
    eng->trace = fopen(path, "wb");
    if (!eng->trace) return df_err_set(err, DF_ERR_IO, -1, "%s: cannot create the route trace: %s", path, strerror(errno));
    /* own buffer: stdio must not allocate inside the token loop */
    eng->trace_buf = xmalloc(1 << 16);
    setvbuf(eng->trace, eng->trace_buf, _IOFBF, 1 << 16);
    eng->trace_jsonl = jsonl;
    if (jsonl) {
        fprintf(eng->trace, "{\"trace\":\"deltafin routes\",\"version\":1,\"layers\":%d,\"experts\":%d,\"top_k\":%d}\n",
                c->NL, c->E, c->k);
        return 0;
    }
    char extra[64] = "";
    if (eng->trace_lookahead) {
        if (eng->trace_lookahead < 0 || eng->trace_lookahead > 8)
            return df_err_set(err, DF_ERR_ARG, -1, "trace look-ahead %d: 1 to 8 layers", eng->trace_lookahead);
        snprintf(extra, sizeof extra, ",\"lookahead\":%d", eng->trace_lookahead);
        eng->la_xn = xmalloc((size_t)c->h * sizeof *eng->la_xn);
        eng->la_logits = xmalloc((size_t)c->E * sizeof *eng->la_logits);
        eng->la_choice = xmalloc((size_t)c->E * sizeof *eng->la_choice);
        eng->la_top = xmalloc((size_t)c->k * sizeof *eng->la_top);
    }
    return trace_header(eng, eng->trace, model, extra) ? df_err_set(err, DF_ERR_IO, -1, "%s: cannot write the route trace", path) : 0;
}

int trace_header(df_engine *eng, FILE *f, const char *model, const char *extra)
{
    const k3_config *c = &eng->m.cfg;
    json_buf h;
    json_buf_init(&h);
    char num[160];
    json_buf_puts(&h, "{\"trace\":\"deltafin routes\",\"version\":1,\"model\":");
    json_write_string(&h, model, strlen(model));
    snprintf(num, sizeof num, ",\"layers\":%d,\"experts\":%d,\"top_k\":%d,\"hidden\":%d,\"vocab\":%d,\"shared_experts\":%d",
             c->NL, c->E, c->k, c->h, c->V, c->Ns);
    json_buf_puts(&h, num);
    json_buf_puts(&h, ",\"moe_layers\":[");
    for (int il = 0, n = 0; il < c->NL; il++)
        if (c->layer_moe[il]) {
            snprintf(num, sizeof num, "%s%d", n++ ? "," : "", il);
            json_buf_puts(&h, num);
        }
    json_buf_puts(&h, "]");
    if (extra) json_buf_puts(&h, extra);
    json_buf_puts(&h, "}");
    while (h.len % 4) json_buf_putc(&h, ' ');
    fwrite(TRACE_MAGIC, 1, TRACE_MAGIC_LEN, f);
    put_u32(f, TRACE_VERSION);
    put_u32(f, (uint32_t)h.len);
    fwrite(h.p, 1, h.len, f);
    json_buf_free(&h);
    return ferror(f) ? -1 : 0;
}

/* An evaluation's record: its ids from pos0 */
void trace_eval(FILE *f, const probe_ev *ev)
{
    put_u32(f, TRACE_EVAL);
    put_u32(f, 8 + 4 * (uint32_t)ev->T);
    put_u32(f, (uint32_t)ev->pos0);
    put_u32(f, (uint32_t)ev->T);
    fwrite(ev->ids, sizeof(int32_t), (size_t)ev->T, f);
}

static void trace_jsonl(df_engine *eng, const probe_ev *ev)
{
    for (int t = 0; t < ev->T; t++) {
        fprintf(eng->trace, "{\"pos\":%d,\"layer\":%d,\"experts\":[", ev->pos0 + t, ev->il);
        for (int j = 0; j < ev->k; j++) fprintf(eng->trace, "%s%d", j ? "," : "", ev->ids[t * ev->k + j]);
        fprintf(eng->trace, "],\"weights\":[");
        for (int j = 0; j < ev->k; j++) fprintf(eng->trace, "%s%.7g", j ? "," : "", (double)ev->w[t * ev->k + j]);
        fprintf(eng->trace, "]}\n");
    }
}

/* --trace-lookahead D, at a layer's end (PROBE_MLP_OUT: rows2 is the hidden
 * state after it): for each of the next D MoE layers, that layer's router
 * on each row as the prefetcher applies it (prefetch.c: RMSNorm with the
 * layer's post_ln, the router, the biased scores), its top k in order */
void observe_lookahead(df_engine *eng, const probe_ev *ev)
{
    const k3_config *c = &eng->m.cfg;
    FILE *f = eng->trace;
    int nl = ev->il;
    for (int d = 1; d <= eng->trace_lookahead; d++) {
        do nl++;
        while (nl < c->NL && !c->layer_moe[nl]);
        if (nl >= c->NL) return;
        const k3_layer *N = &eng->m.layers[nl];
        put_u32(f, TRACE_PREDICT);
        put_u32(f, 24 + 4 * (uint32_t)ev->nt * (uint32_t)c->k);
        put_u32(f, (uint32_t)(ev->pos0 + ev->t0));
        put_u32(f, (uint32_t)ev->il);
        put_u32(f, (uint32_t)nl);
        put_u32(f, (uint32_t)d);
        put_u32(f, (uint32_t)ev->nt);
        put_u32(f, (uint32_t)c->k);
        for (int t = 0; t < ev->nt; t++) {
            rmsnorm(ev->rows2 + (size_t)t * c->h, N->post_ln, c->h, c->eps, eng->la_xn);
            mm_rows(eng->bk.kt, N->router, eng->la_xn, eng->la_logits, 0, c->E);
            df_router_score(eng->la_logits, N->router_bias, c->E, NULL, eng->la_choice);
            df_topk(eng->la_choice, c->E, c->k, eng->la_top);
            fwrite(eng->la_top, sizeof(int32_t), (size_t)c->k, f);
        }
    }
}

void observe_trace(df_engine *eng, const probe_ev *ev)
{
    FILE *f = eng->trace;
    if (ev->point == PROBE_PROMPT_BEGIN) {
        if (!eng->trace_jsonl && ev->ids) trace_eval(f, ev);
        return;
    }
    if (ev->point != PROBE_ROUTE) return;
    if (eng->trace_jsonl) {
        trace_jsonl(eng, ev);
        return;
    }
    size_t n = (size_t)ev->T * (size_t)ev->k;
    put_u32(f, TRACE_ROUTE);
    put_u32(f, (uint32_t)(16 + 12 * n));
    put_u32(f, (uint32_t)ev->pos0);
    put_u32(f, (uint32_t)ev->il);
    put_u32(f, (uint32_t)ev->T);
    put_u32(f, (uint32_t)ev->k);
    fwrite(ev->ids, sizeof(int32_t), n, f);
    fwrite(ev->score, sizeof(float), n, f);
    fwrite(ev->w, sizeof(float), n, f);
}
