/* trace.c - the route trace reader (trace.h): both formats the engine's
 * trace observer writes (engine/observe_trace.c, trace_format.h).
 *
 * The file is read whole.  Binary records are checked before use: the tag
 * and length fit in what is left, the length is the payload's exact size
 * for its counts (with overflow checked), the layer is an MoE layer of the
 * header, k is the header's top_k and every expert id is in range; token ids
 * are checked against the header's vocabulary.  Arrays are copied out of
 * the file into buffers of the reader (the file's bytes need not be
 * aligned).  Records of unknown tags are skipped.  JSON lines are parsed
 * one at a time with json.c, as the older cachesim did.
 */
#include "trace.h"
#include "json.h"
#include "util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

struct df_trace {
    char *name;
    uint8_t *data;
    size_t len, pos, line;
    df_trace_info info;
    char *model;
    uint8_t *moe;
    int32_t *ids;
    float *score, *weight;
    size_t cap;               /* elements of ids, score and weight */
};

static uint32_t rd32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v; /* little-endian files, little-endian hosts (trace_format.h) */
}

static void reserve(df_trace *t, size_t n)
{
    if (n <= t->cap) return;
    t->cap = n > 2 * t->cap ? n : 2 * t->cap;
    t->ids = xrealloc(t->ids, t->cap * sizeof *t->ids);
    t->score = xrealloc(t->score, t->cap * sizeof *t->score);
    t->weight = xrealloc(t->weight, t->cap * sizeof *t->weight);
}

static int header_int(const json_value *r, const char *key, int64_t lo, int64_t hi, int *out)
{
    int64_t v;
    if (json_get_int(r, key, &v) || v < lo || v > hi) return -1;
    *out = (int)v;
    return 0;
}

static int open_binary(df_trace *t, df_error *err)
{
    if (t->len < TRACE_MAGIC_LEN + 8)
        return df_err_set(err, DF_ERR_FORMAT, -1, "%s: a binary trace cut short in its header", t->name);
    uint32_t ver = rd32(t->data + TRACE_MAGIC_LEN), hlen = rd32(t->data + TRACE_MAGIC_LEN + 4);
    if (ver != TRACE_VERSION)
        return df_err_set(err, DF_ERR_FORMAT, -1, "%s: trace version %u (this reader knows %d)", t->name, ver,
                          TRACE_VERSION);
    size_t h0 = TRACE_MAGIC_LEN + 8;
    if (hlen > t->len - h0 || hlen % 4)
        return df_err_set(err, DF_ERR_FORMAT, -1, "%s: header length %u does not fit the file", t->name, hlen);
    df_error jerr = {0};
    json_doc *d = json_parse((const char *)t->data + h0, hlen, &jerr);
    if (!d) return df_err_set(err, DF_ERR_FORMAT, -1, "%s: trace header: %s", t->name, jerr.msg);
    const json_value *r = json_root(d), *m = json_get(r, "model"), *ml = json_get(r, "moe_layers");
    df_trace_info *in = &t->info;
    int rc = -1;
    if (header_int(r, "layers", 1, 65535, &in->layers) || header_int(r, "experts", 1, 65535, &in->experts) ||
        header_int(r, "top_k", 1, 4096, &in->top_k) || header_int(r, "hidden", 1, 1 << 24, &in->hidden) ||
        header_int(r, "vocab", 1, 1 << 24, &in->vocab) || header_int(r, "shared_experts", 0, 4096, &in->shared_experts) ||
        !m || m->type != JSON_STRING || !ml || ml->type != JSON_ARRAY || in->top_k > in->experts) {
        df_err_set(err, DF_ERR_FORMAT, -1, "%s: trace header lacks a field or has one out of range", t->name);
        goto done;
    }
    t->model = xmalloc(m->len + 1);
    memcpy(t->model, m->str, m->len);
    t->model[m->len] = 0;
    t->moe = xcalloc((size_t)in->layers, 1);
    for (size_t i = 0; i < ml->len; i++) {
        const json_value *e = ml->items[i];
        if (e->type != JSON_NUMBER || !e->is_int || e->i < 0 || e->i >= in->layers) {
            df_err_set(err, DF_ERR_FORMAT, -1, "%s: trace header: moe_layers holds a bad layer", t->name);
            goto done;
        }
        t->moe[e->i] = 1;
    }
    in->binary = 1;
    t->pos = h0 + hlen;
    rc = 0;
done:
    json_free(d);
    return rc;
}

static int open_jsonl(df_trace *t, df_error *err)
{
    const char *p = (const char *)t->data;
    const char *nl = memchr(p, '\n', t->len);
    size_t ll = nl ? (size_t)(nl - p) : t->len;
    df_error jerr = {0};
    json_doc *d = json_parse(p, ll, &jerr);
    if (!d) return df_err_set(err, DF_ERR_FORMAT, -1, "%s:1: %s", t->name, jerr.msg);
    const json_value *r = json_root(d);
    df_trace_info *in = &t->info;
    int k = 16, rc = -1;
    if (!json_get(r, "trace") || header_int(r, "layers", 1, 65535, &in->layers) ||
        header_int(r, "experts", 1, 65535, &in->experts)) {
        df_err_set(err, DF_ERR_FORMAT, -1, "%s:1: bad trace header", t->name);
        goto done;
    }
    if (header_int(r, "top_k", 1, 4096, &k)) k = 16;
    in->top_k = k;
    t->model = xstrdup("");
    t->moe = xmalloc((size_t)in->layers);
    memset(t->moe, 1, (size_t)in->layers);
    t->pos = nl ? ll + 1 : t->len;
    t->line = 1;
    rc = 0;
done:
    json_free(d);
    return rc;
}

int df_trace_from_memory(const void *data, size_t len, const char *name, df_trace **out, df_error *err)
{
    *out = NULL;
    df_trace *t = xcalloc(1, sizeof *t);
    t->name = xstrdup(name);
    t->data = xmalloc(len + 1);
    if (len) memcpy(t->data, data, len);
    t->data[len] = 0;
    t->len = len;
    int rc;
    if (len >= TRACE_MAGIC_LEN && !memcmp(t->data, TRACE_MAGIC, TRACE_MAGIC_LEN)) rc = open_binary(t, err);
    else if (len && t->data[0] == '{') rc = open_jsonl(t, err);
    else rc = df_err_set(err, DF_ERR_FORMAT, -1, "%s: not a deltafin route trace (neither binary nor JSON lines)", name);
    if (rc) {
        df_trace_close(t);
        return -1;
    }
    t->info.model = t->model;
    t->info.moe = t->moe;
    *out = t;
    return 0;
}

int df_trace_open(const char *path, df_trace **out, df_error *err)
{
    char *text;
    size_t len;
    *out = NULL;
    if (read_small_file(path, &text, &len, (size_t)1 << 36, err)) return -1;
    int rc = df_trace_from_memory(text, len, path, out, err);
    free(text);
    return rc;
}

const df_trace_info *df_trace_header(const df_trace *t) { return &t->info; }

/* TRACE_ATTN: counts and sizes checked, every position causal (or -1 past
 * the context), every weight in [0, 1] */
static int attn_record(df_trace *t, df_trace_rec *r, const uint8_t *p, uint32_t len, size_t at, df_error *err)
{
    if (len < 24) return df_err_set(err, DF_ERR_FORMAT, -1, "%s: byte %zu: an attention record cut short", t->name, at);
    uint32_t pos0 = rd32(p), layer = rd32(p + 4), T = rd32(p + 8), h0 = rd32(p + 12), nh = rd32(p + 16), K = rd32(p + 20);
    if (layer >= (uint32_t)t->info.layers || T < 1 || nh < 1 || K < 1 || K > 4096 || nh > 65535 || h0 > 65535 ||
        T > INT32_MAX / 8 / nh / K || (size_t)len != 24 + 8 * (size_t)T * nh * K || pos0 > INT32_MAX - T)
        return df_err_set(err, DF_ERR_FORMAT, -1, "%s: byte %zu: a bad attention record (layer %u, %u positions, %u "
                          "heads, top %u)", t->name, at, layer, T, nh, K);
    size_t n = (size_t)T * nh * K;
    reserve(t, n);
    memcpy(t->ids, p + 24, 4 * n);
    memcpy(t->weight, p + 24 + 4 * n, 4 * n);
    for (size_t i = 0; i < n; i++) {
        int64_t q = (int64_t)pos0 + (int64_t)(i / ((size_t)nh * K)); /* the query's position */
        float w = t->weight[i];
        if (t->ids[i] < -1 || t->ids[i] > q || !(w >= 0.0f && w <= 1.0f) || (t->ids[i] < 0 && w != 0.0f))
            return df_err_set(err, DF_ERR_FORMAT, -1,
                              "%s: byte %zu: attention entry %zu (position %d, weight %g) is not a causal weight",
                              t->name, at, i, t->ids[i], (double)w);
    }
    *r = (df_trace_rec){.tag = TRACE_ATTN, .pos0 = (int)pos0, .n = (int)T, .layer = (int)layer, .k = (int)K,
                        .head0 = (int)h0, .n_heads = (int)nh, .ids = t->ids, .weight = t->weight, .where = at};
    return 1;
}

/* TRACE_KDA: sizes checked, every statistic in [0, 1] (sigmoids, and
 * decays that are exps of non-positive numbers) */
static int kda_record(df_trace *t, df_trace_rec *r, const uint8_t *p, uint32_t len, size_t at, df_error *err)
{
    if (len < 16) return df_err_set(err, DF_ERR_FORMAT, -1, "%s: byte %zu: a KDA record cut short", t->name, at);
    uint32_t pos0 = rd32(p), layer = rd32(p + 4), T = rd32(p + 8), nh = rd32(p + 12);
    if (layer >= (uint32_t)t->info.layers || T < 1 || nh < 1 || nh > 65535 || T > INT32_MAX / 16 / nh ||
        (size_t)len != 16 + 16 * (size_t)T * nh || pos0 > INT32_MAX - T)
        return df_err_set(err, DF_ERR_FORMAT, -1, "%s: byte %zu: a bad KDA record (layer %u, %u positions, %u heads)",
                          t->name, at, layer, T, nh);
    size_t n = (size_t)T * nh * 4;
    reserve(t, n);
    memcpy(t->weight, p + 16, 4 * n);
    for (size_t i = 0; i < n; i++)
        if (!(t->weight[i] >= 0.0f && t->weight[i] <= 1.0f))
            return df_err_set(err, DF_ERR_FORMAT, -1, "%s: byte %zu: KDA statistic %zu is %g, outside [0, 1]", t->name,
                              at, i, (double)t->weight[i]);
    *r = (df_trace_rec){.tag = TRACE_KDA, .pos0 = (int)pos0, .n = (int)T, .layer = (int)layer, .k = 4,
                        .n_heads = (int)nh, .weight = t->weight, .where = at};
    return 1;
}

/* TRACE_PREDICT: the target an MoE layer after `from`, k the model's, the
 * ids in range */
static int predict_record(df_trace *t, df_trace_rec *r, const uint8_t *p, uint32_t len, size_t at, df_error *err)
{
    if (len < 24) return df_err_set(err, DF_ERR_FORMAT, -1, "%s: byte %zu: a look-ahead record cut short", t->name, at);
    uint32_t pos0 = rd32(p), from = rd32(p + 4), to = rd32(p + 8), d = rd32(p + 12), T = rd32(p + 16), k = rd32(p + 20);
    if (to >= (uint32_t)t->info.layers || !t->moe[to] || from >= to || d < 1 || d > to - from ||
        k != (uint32_t)t->info.top_k || T < 1 || T > INT32_MAX / 4 / k || (size_t)len != 24 + 4 * (size_t)T * k ||
        pos0 > INT32_MAX - T)
        return df_err_set(err, DF_ERR_FORMAT, -1, "%s: byte %zu: a bad look-ahead record (layer %u -> %u, d %u)",
                          t->name, at, from, to, d);
    size_t n = (size_t)T * k;
    reserve(t, n);
    memcpy(t->ids, p + 24, 4 * n);
    for (size_t i = 0; i < n; i++)
        if (t->ids[i] < 0 || t->ids[i] >= t->info.experts)
            return df_err_set(err, DF_ERR_FORMAT, -1, "%s: byte %zu: predicted expert %d out of range", t->name, at,
                              t->ids[i]);
    *r = (df_trace_rec){.tag = TRACE_PREDICT, .pos0 = (int)pos0, .n = (int)T, .layer = (int)to, .k = (int)k,
                        .from = (int)from, .dist = (int)d, .ids = t->ids, .where = at};
    return 1;
}

static int next_binary(df_trace *t, df_trace_rec *r, df_error *err)
{
    for (;;) {
        if (t->pos == t->len) return 0;
        size_t at = t->pos, left = t->len - at;
        if (left < 8) return df_err_set(err, DF_ERR_FORMAT, -1, "%s: byte %zu: a record cut short", t->name, at);
        uint32_t tag = rd32(t->data + at), len = rd32(t->data + at + 4);
        const uint8_t *p = t->data + at + 8;
        if (len % 4 || len > left - 8)
            return df_err_set(err, DF_ERR_FORMAT, -1, "%s: byte %zu: record length %u does not fit", t->name, at, len);
        t->pos = at + 8 + len;
        memset(r, 0, sizeof *r);
        r->where = at;
        if (tag == TRACE_EVAL) {
            uint32_t pos0 = len >= 8 ? rd32(p) : 0, n = len >= 8 ? rd32(p + 4) : 0;
            if (len < 8 || n < 1 || n > INT32_MAX / 4 || (size_t)len != 8 + 4 * (size_t)n || pos0 > INT32_MAX - n)
                return df_err_set(err, DF_ERR_FORMAT, -1, "%s: byte %zu: a bad evaluation record", t->name, at);
            reserve(t, n);
            memcpy(t->ids, p + 8, 4 * (size_t)n);
            for (uint32_t i = 0; i < n; i++)
                if (t->ids[i] < 0 || t->ids[i] >= t->info.vocab)
                    return df_err_set(err, DF_ERR_FORMAT, -1, "%s: byte %zu: token id %d outside the vocabulary",
                                      t->name, at, t->ids[i]);
            *r = (df_trace_rec){.tag = TRACE_EVAL, .pos0 = (int)pos0, .n = (int)n, .ids = t->ids, .where = at};
            return 1;
        }
        if (tag == TRACE_ATTN) return attn_record(t, r, p, len, at, err);
        if (tag == TRACE_KDA) return kda_record(t, r, p, len, at, err);
        if (tag == TRACE_PREDICT) return predict_record(t, r, p, len, at, err);
        if (tag != TRACE_ROUTE) continue; /* a later version's record */
        if (len < 16) return df_err_set(err, DF_ERR_FORMAT, -1, "%s: byte %zu: a route record cut short", t->name, at);
        uint32_t pos0 = rd32(p), layer = rd32(p + 4), T = rd32(p + 8), k = rd32(p + 12);
        if (layer >= (uint32_t)t->info.layers || !t->moe[layer] || k != (uint32_t)t->info.top_k || T < 1 ||
            T > INT32_MAX / 12 / k || (size_t)len != 16 + 12 * (size_t)T * k || pos0 > INT32_MAX - T)
            return df_err_set(err, DF_ERR_FORMAT, -1,
                              "%s: byte %zu: a bad route record (layer %u, %u positions, k %u)", t->name, at, layer, T,
                              k);
        size_t n = (size_t)T * k;
        reserve(t, n);
        memcpy(t->ids, p + 16, 4 * n);
        memcpy(t->score, p + 16 + 4 * n, 4 * n);
        memcpy(t->weight, p + 16 + 8 * n, 4 * n);
        for (size_t i = 0; i < n; i++) {
            if (t->ids[i] < 0 || t->ids[i] >= t->info.experts)
                return df_err_set(err, DF_ERR_FORMAT, -1, "%s: byte %zu: expert id %d out of range", t->name, at,
                                  t->ids[i]);
            if (!(t->score[i] >= 0.0f && t->score[i] <= 1.0f && t->weight[i] >= 0.0f && t->weight[i] < INFINITY))
                return df_err_set(err, DF_ERR_FORMAT, -1, "%s: byte %zu: route %zu has score %g, weight %g", t->name,
                                  at, i, (double)t->score[i], (double)t->weight[i]);
        }
        *r = (df_trace_rec){.tag = TRACE_ROUTE, .pos0 = (int)pos0, .n = (int)T, .layer = (int)layer, .k = (int)k,
                            .ids = t->ids, .score = t->score, .weight = t->weight, .where = at};
        return 1;
    }
}

static int next_jsonl(df_trace *t, df_trace_rec *r, df_error *err)
{
    for (;;) {
        if (t->pos >= t->len) return 0;
        const char *p = (const char *)t->data + t->pos;
        const char *nl = memchr(p, '\n', t->len - t->pos);
        size_t ll = nl ? (size_t)(nl - p) : t->len - t->pos;
        t->pos += ll + 1;
        t->line++;
        if (!ll) continue;
        df_error jerr = {0};
        json_doc *d = json_parse(p, ll, &jerr);
        if (!d) return df_err_set(err, DF_ERR_FORMAT, -1, "%s:%zu: %s", t->name, t->line, jerr.msg);
        const json_value *o = json_root(d), *ex = json_get(o, "experts"), *wt = json_get(o, "weights");
        int64_t layer, pos = 0;
        int rc = -1;
        if (json_get_int(o, "layer", &layer) || layer < 0 || layer >= t->info.layers || !ex || ex->type != JSON_ARRAY ||
            !ex->len || ex->len > 4096 || (wt && (wt->type != JSON_ARRAY || wt->len != ex->len)) ||
            (json_get(o, "pos") && (json_get_int(o, "pos", &pos) || pos < 0 || pos > INT32_MAX))) {
            df_err_set(err, DF_ERR_FORMAT, -1, "%s:%zu: not a route line of a deltafin trace", t->name, t->line);
            goto done;
        }
        reserve(t, ex->len);
        for (size_t j = 0; j < ex->len; j++) {
            const json_value *e = ex->items[j], *w = wt ? wt->items[j] : NULL;
            if (e->type != JSON_NUMBER || !e->is_int || e->i < 0 || e->i >= t->info.experts) {
                df_err_set(err, DF_ERR_FORMAT, -1, "%s:%zu: expert id out of range", t->name, t->line);
                goto done;
            }
            if (w && w->type != JSON_NUMBER) {
                df_err_set(err, DF_ERR_FORMAT, -1, "%s:%zu: a weight is not a number", t->name, t->line);
                goto done;
            }
            t->ids[j] = (int32_t)e->i;
            if (w) t->weight[j] = (float)(w->is_int ? (double)w->i : w->num);
        }
        *r = (df_trace_rec){.tag = TRACE_ROUTE, .pos0 = (int)pos, .n = 1, .layer = (int)layer, .k = (int)ex->len,
                            .ids = t->ids, .weight = wt ? t->weight : NULL, .where = t->line};
        rc = 1;
    done:
        json_free(d);
        return rc;
    }
}

int df_trace_next(df_trace *t, df_trace_rec *r, df_error *err)
{
    return t->info.binary ? next_binary(t, r, err) : next_jsonl(t, r, err);
}

void df_trace_rewind(df_trace *t)
{
    if (t->info.binary) {
        t->pos = TRACE_MAGIC_LEN + 8 + rd32(t->data + TRACE_MAGIC_LEN + 4);
    } else {
        const char *nl = memchr(t->data, '\n', t->len);
        t->pos = nl ? (size_t)(nl - (const char *)t->data) + 1 : t->len;
        t->line = 1;
    }
}

void df_trace_close(df_trace *t)
{
    if (!t) return;
    free(t->name);
    free(t->data);
    free(t->model);
    free(t->moe);
    free(t->ids);
    free(t->score);
    free(t->weight);
    free(t);
}
