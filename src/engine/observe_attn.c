/* observe_attn.c - the attention dump (--dump-attention FILE): the binary
 * trace format (trace_format.h) with every evaluation's ids and, at each
 * chosen MLA layer, each chosen head's largest attention weights for every
 * query position (TRACE_ATTN records), and at each chosen KDA layer every
 * head's beta, decay (mean and min over its channels) and output gate
 * (mean) per position (TRACE_KDA records, from kda.c).  mla.c fills the session's buffer
 * from the weights the kernel leaves (kernels.h), so a dump is the engine's
 * own weights, the same bits at any thread count and batch width; the
 * layer offers it as PROBE_ATTN_PROBS.
 */
#include "engine_impl.h"
#include "trace_format.h"
#include "util.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int attn_open(df_engine *eng, const df_engine_opts *o, const char *model, df_error *err)
{
    const k3_config *c = &eng->m.cfg;
    int l0 = o->attn_l0, l1 = (o->attn_l1 ? o->attn_l1 : c->NL) - 1, h0 = o->attn_h0,
        h1 = o->attn_h1 ? o->attn_h1 : c->Hm;
    int top = o->attn_top ? o->attn_top : 16;
    if (l0 < 0 || l1 >= c->NL || l0 > l1)
        return df_err_set(err, DF_ERR_ARG, -1, "attention dump: layers %d..%d outside the model's 0..%d", l0, l1, c->NL - 1);
    if (h0 < 0 || h1 > c->Hm || h0 >= h1)
        return df_err_set(err, DF_ERR_ARG, -1, "attention dump: heads %d..%d outside the model's 0..%d", h0, h1 - 1,
                          c->Hm - 1);
    if (top < 1 || top > 4096) return df_err_set(err, DF_ERR_ARG, -1, "attention dump: top %d outside 1..4096", top);
    /* mla.c and kda.c fill the dump's buffers: the reference backend (ops_ref.c) has its own loops */
    if (strcmp(eng->bk.ops->name, "cpu"))
        return df_err_set(err, DF_ERR_UNSUPPORTED, -1, "attention dump: needs the cpu backend, not %s",
                          eng->bk.ops->name);
    eng->attn_on = xcalloc((size_t)c->NL, 1);
    char extra[8192];
    int n = snprintf(extra, sizeof extra, ",\"attention\":{\"top\":%d,\"head0\":%d,\"heads\":%d,\"layers\":[", top, h0,
                     h1 - h0), any = 0;
    for (int il = l0; il <= l1; il++)
        if (c->layer_kind[il] == LAYER_MLA) {
            if (n < (int)sizeof extra - 16) n += snprintf(extra + n, sizeof extra - (size_t)n, "%s%d", any ? "," : "", il);
            any = 1;
        }
    n += snprintf(extra + n, sizeof extra - (size_t)n, "],\"kda_layers\":[");
    for (int il = l0, m = 0; il <= l1; il++) {
        eng->attn_on[il] = 1;
        if (c->layer_kind[il] == LAYER_KDA && n < (int)sizeof extra - 16)
            n += snprintf(extra + n, sizeof extra - (size_t)n, "%s%d", m++ ? "," : "", il);
    }
    snprintf(extra + n, sizeof extra - (size_t)n, "]}");
    eng->attn_h0 = h0, eng->attn_nh = h1 - h0, eng->attn_top = top;
    eng->attn = fopen(o->attn_path, "wb");
    if (!eng->attn)
        return df_err_set(err, DF_ERR_IO, -1, "%s: cannot create the attention dump: %s", o->attn_path, strerror(errno));
    eng->attn_buf = xmalloc(1 << 16); /* stdio must not allocate inside the token loop */
    setvbuf(eng->attn, eng->attn_buf, _IOFBF, 1 << 16);
    if (trace_header(eng, eng->attn, model, extra))
        return df_err_set(err, DF_ERR_IO, -1, "%s: cannot write the attention dump", o->attn_path);
    return 0;
}

void observe_attn(df_engine *eng, const probe_ev *ev)
{
    FILE *f = eng->attn;
    if (!f) return;
    if (ev->point == PROBE_PROMPT_BEGIN) {
        if (ev->ids) trace_eval(f, ev);
        return;
    }
    if (!ev->ids) { /* a KDA layer: per row and head, beta, the decay's mean and min, the gate's mean */
        size_t n = (size_t)ev->T * (size_t)ev->n_probs * 4;
        put_u32(f, TRACE_KDA);
        put_u32(f, (uint32_t)(16 + 4 * n));
        put_u32(f, (uint32_t)ev->pos0);
        put_u32(f, (uint32_t)ev->il);
        put_u32(f, (uint32_t)ev->T);
        put_u32(f, (uint32_t)ev->n_probs);
        fwrite(ev->w, sizeof(float), n, f);
        return;
    }
    size_t n = (size_t)ev->T * (size_t)ev->n_probs * (size_t)ev->k;
    put_u32(f, TRACE_ATTN);
    put_u32(f, (uint32_t)(24 + 8 * n));
    put_u32(f, (uint32_t)ev->pos0);
    put_u32(f, (uint32_t)ev->il);
    put_u32(f, (uint32_t)ev->T);
    put_u32(f, (uint32_t)ev->width); /* the first head */
    put_u32(f, (uint32_t)ev->n_probs);
    put_u32(f, (uint32_t)ev->k);
    fwrite(ev->ids, sizeof(int32_t), n, f);
    fwrite(ev->w, sizeof(float), n, f);
}
