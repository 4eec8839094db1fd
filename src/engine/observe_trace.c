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
#include "trace_format.h"
#include "util.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the binary route trace is written in the host's byte order: little-endian only"
#endif

static void put_u32(FILE *f, uint32_t v) { fwrite(&v, sizeof v, 1, f); }

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
    return trace_header(eng, eng->trace, model, NULL) ? df_err_set(err, DF_ERR_IO, -1, "%s: cannot write the route trace", path) : 0;
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
