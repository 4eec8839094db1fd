/* gguf.c - see gguf.h.
 *
 * A cursor walks the header and keeps the first error with its byte
 * offset, so the parse reads as straight-line code; every read is bounded
 * by head_len first (a read past it but inside the file is DF_ERR_LIMIT:
 * "read more and retry"), so corrupt input can never make it read out of
 * bounds.  Counts are checked against the bytes left before anything is
 * allocated for them: a KV takes at least 13 bytes and a tensor info at
 * least 32, so a file cannot make us allocate more than a few times its
 * own size.  The overlap check sorts by offset (O(n log n)); gaps between
 * tensors are allowed, as the format does not forbid them.
 */
#define _GNU_SOURCE
#include "gguf.h"
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const struct { uint32_t id; const char *name; uint32_t blck, bytes; } types[] = {
    {0, "F32", 1, 4},        {1, "F16", 1, 2},         {2, "Q4_0", 32, 18},     {3, "Q4_1", 32, 20},
    {6, "Q5_0", 32, 22},     {7, "Q5_1", 32, 24},      {8, "Q8_0", 32, 34},     {9, "Q8_1", 32, 36},
    {10, "Q2_K", 256, 84},   {11, "Q3_K", 256, 110},   {12, "Q4_K", 256, 144},  {13, "Q5_K", 256, 176},
    {14, "Q6_K", 256, 210},  {15, "Q8_K", 256, 292},   {16, "IQ2_XXS", 256, 66}, {17, "IQ2_XS", 256, 74},
    {18, "IQ3_XXS", 256, 98}, {19, "IQ1_S", 256, 50},  {20, "IQ4_NL", 32, 18},  {21, "IQ3_S", 256, 110},
    {22, "IQ2_S", 256, 82},  {23, "IQ4_XS", 256, 136}, {24, "I8", 1, 1},        {25, "I16", 1, 2},
    {26, "I32", 1, 4},       {27, "I64", 1, 8},        {28, "F64", 1, 8},       {29, "IQ1_M", 256, 56},
    {30, "BF16", 1, 2},      {34, "TQ1_0", 256, 54},   {35, "TQ2_0", 256, 66},  {39, "MXFP4", 32, 17},
};

int gguf_type_info(uint32_t type, const char **name, uint32_t *blck, uint32_t *bytes)
{
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        if (types[i].id != type) continue;
        if (name) *name = types[i].name;
        if (blck) *blck = types[i].blck;
        if (bytes) *bytes = types[i].bytes;
        return 1;
    }
    return 0;
}

static const char *kv_names[] = {"UINT8", "INT8", "UINT16", "INT16", "UINT32", "INT32", "FLOAT32",
                                 "BOOL", "STRING", "ARRAY", "UINT64", "INT64", "FLOAT64"};
static const uint8_t kv_sizes[] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
#define N_KV_TYPES 13u

/* ------------------------------------------------------------------ cursor */

typedef struct cursor {
    const uint8_t *p;
    size_t len;          /* readable bytes (head_len) */
    uint64_t file_size;
    uint64_t pos;
    const char *label;
    df_error *err;
    int bad;
} cursor;

static uint64_t rd_le(const uint8_t *p, int n)
{
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

/* Can n bytes be read at the cursor?  Sets the error naming `what`. */
static int need(cursor *c, uint64_t n, const char *what, const char *ctx)
{
    if (c->bad) return 0;
    if (n <= c->len - c->pos) return 1;
    c->bad = 1;
    if (n > c->file_size - c->pos)
        df_err_set(c->err, DF_ERR_FORMAT, (int64_t)c->pos,
                   "%s: %s%s%s at byte %llu needs %llu bytes but the file ends at byte %llu (truncated?)",
                   c->label, ctx ? ctx : "", ctx ? ": " : "", what, (unsigned long long)c->pos,
                   (unsigned long long)n, (unsigned long long)c->file_size);
    else
        df_err_set(c->err, DF_ERR_LIMIT, (int64_t)c->pos, "%s: header continues past the %zu bytes read",
                   c->label, c->len);
    return 0;
}

static uint64_t rd(cursor *c, int n, const char *what, const char *ctx)
{
    if (!need(c, (uint64_t)n, what, ctx)) return 0;
    uint64_t v = rd_le(c->p + c->pos, n);
    c->pos += (uint64_t)n;
    return v;
}

/* A string: u64 length then bytes.  Returns a pointer into the input. */
static const uint8_t *rd_str(cursor *c, uint64_t *len, const char *what, const char *ctx)
{
    uint64_t at = c->pos;
    uint64_t n = rd(c, 8, what, ctx);
    if (c->bad) return NULL;
    if (n > c->file_size - c->pos) {
        c->bad = 1;
        df_err_set(c->err, DF_ERR_FORMAT, (int64_t)at,
                   "%s: %s%s%s length %llu at byte %llu runs past the end of the file (%llu bytes)", c->label,
                   ctx ? ctx : "", ctx ? ": " : "", what, (unsigned long long)n, (unsigned long long)at,
                   (unsigned long long)c->file_size);
        return NULL;
    }
    if (!need(c, n, what, ctx)) return NULL;
    const uint8_t *s = c->p + c->pos;
    c->pos += n;
    *len = n;
    return s;
}

static int fail(cursor *c, int64_t pos, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(cursor *c, int64_t pos, const char *fmt, ...)
{
    if (c->bad) return -1;
    c->bad = 1;
    char msg[600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return df_err_set(c->err, DF_ERR_FORMAT, pos, "%s: %s (at byte %lld)", c->label, msg, (long long)pos);
}

/* -------------------------------------------------------------- lifetime */

void gguf_deinit(gguf_file *f)
{
    if (!f) return;
    for (size_t i = 0; i < f->n_kv; i++) {
        free(f->kv[i].key);
        free(f->kv[i].str_off);
        free(f->kv[i].str_len);
    }
    for (size_t i = 0; i < f->n_tensors; i++) free(f->tensors[i].name);
    free(f->kv);
    free(f->tensors);
    free(f->by_name);
    free(f->head);
    free(f->path);
    memset(f, 0, sizeof *f);
}

static int cmp_by_name(const void *a, const void *b)
{
    return strcmp((*(const gguf_tensor *const *)a)->name, (*(const gguf_tensor *const *)b)->name);
}
static int cmp_by_offset(const void *a, const void *b)
{
    const gguf_tensor *x = *(const gguf_tensor *const *)a, *y = *(const gguf_tensor *const *)b;
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}
static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Printable copy of a name for messages (names come from the file). */
static void printable(char *dst, size_t cap, const uint8_t *s, uint64_t n)
{
    size_t j = 0;
    for (uint64_t i = 0; i < n; i++) {
        if (j + 8 >= cap) {
            memcpy(dst + j, "...", 4);
            return;
        }
        unsigned char ch = s[i];
        if (ch >= 0x20 && ch < 0x7f) dst[j++] = (char)ch;
        else j += (size_t)snprintf(dst + j, cap - j, "\\x%02x", ch);
    }
    dst[j] = 0;
}

/* ------------------------------------------------------------------ parse */

static int parse_kv(cursor *c, gguf_kv *kv, const char *key)
{
    uint64_t tpos = c->pos;
    uint32_t t = (uint32_t)rd(c, 4, "value type", key);
    if (c->bad) return -1;
    if (t >= N_KV_TYPES)
        return fail(c, (int64_t)tpos, "key %s: unknown value type %u", key, t);
    kv->type = (enum gguf_kv_type)t;
    kv->n = 1;
    if (t == GGUF_KV_STRING) {
        kv->data = rd_str(c, &kv->len, "string value", key);
        return c->bad ? -1 : 0;
    }
    if (t != GGUF_KV_ARRAY) {
        if (!need(c, kv_sizes[t], "value", key)) return -1;
        kv->data = c->p + c->pos;
        if (t == GGUF_KV_BOOL && kv->data[0] > 1)
            return fail(c, (int64_t)c->pos, "key %s: bool value %u is neither 0 nor 1", key, kv->data[0]);
        c->pos += kv_sizes[t];
        return 0;
    }
    uint64_t epos = c->pos;
    uint32_t et = (uint32_t)rd(c, 4, "array element type", key);
    uint64_t npos = c->pos;
    uint64_t n = rd(c, 8, "array length", key);
    if (c->bad) return -1;
    if (et == GGUF_KV_ARRAY)
        return fail(c, (int64_t)epos, "key %s: array of arrays (nesting is not supported by GGUF readers)", key);
    if (et >= N_KV_TYPES)
        return fail(c, (int64_t)epos, "key %s: array of unknown element type %u", key, et);
    kv->arr_type = (enum gguf_kv_type)et;
    kv->n = n;
    uint64_t left = c->file_size - c->pos;
    uint64_t min_el = et == GGUF_KV_STRING ? 8 : kv_sizes[et];
    if (n > left / min_el)
        return fail(c, (int64_t)npos, "key %s: array of %llu %s elements cannot fit in the %llu bytes left in the file",
                    key, (unsigned long long)n, kv_names[et], (unsigned long long)left);
    kv->data = c->p + c->pos;
    if (et != GGUF_KV_STRING) {
        if (!need(c, n * min_el, "array data", key)) return -1;
        if (et == GGUF_KV_BOOL)
            for (uint64_t i = 0; i < n; i++)
                if (kv->data[i] > 1)
                    return fail(c, (int64_t)(c->pos + i), "key %s: bool element %llu is %u, neither 0 nor 1", key,
                                (unsigned long long)i, kv->data[i]);
        c->pos += n * min_el;
        return 0;
    }
    kv->str_off = xmalloc((size_t)(n ? n : 1) * sizeof *kv->str_off);
    kv->str_len = xmalloc((size_t)(n ? n : 1) * sizeof *kv->str_len);
    uint64_t base = c->pos;
    for (uint64_t i = 0; i < n; i++) {
        uint64_t l = 0;
        const uint8_t *s = rd_str(c, &l, "array string", key);
        if (c->bad) return -1;
        kv->str_off[i] = (uint64_t)(s - c->p) - base;
        kv->str_len[i] = l;
    }
    return 0;
}

static int parse_tensor(cursor *c, gguf_tensor *t)
{
    t->info_pos = c->pos;
    uint64_t nlen = 0;
    const uint8_t *name = rd_str(c, &nlen, "tensor name", NULL);
    if (c->bad) return -1;
    char pname[160];
    printable(pname, sizeof pname, name, nlen);
    if (nlen == 0) return fail(c, (int64_t)t->info_pos, "tensor with an empty name");
    if (nlen >= GGUF_MAX_NAME)
        return fail(c, (int64_t)t->info_pos, "tensor %s: name is %llu bytes, the limit is %d", pname,
                    (unsigned long long)nlen, GGUF_MAX_NAME - 1);
    if (memchr(name, 0, (size_t)nlen)) return fail(c, (int64_t)t->info_pos, "tensor %s: name contains a NUL byte", pname);
    t->name = xmalloc((size_t)nlen + 1);
    memcpy(t->name, name, (size_t)nlen);
    t->name[nlen] = 0;
    uint64_t dpos = c->pos;
    uint32_t nd = (uint32_t)rd(c, 4, "n_dims", t->name);
    if (c->bad) return -1;
    if (nd < 1 || nd > GGUF_MAX_DIMS)
        return fail(c, (int64_t)dpos, "tensor %s: n_dims %u is not in 1..%d", t->name, nd, GGUF_MAX_DIMS);
    t->n_dims = (int)nd;
    for (int d = 0; d < GGUF_MAX_DIMS; d++) t->ne[d] = 1;
    uint64_t count = 1;
    int overflow = 0;
    for (uint32_t d = 0; d < nd; d++) {
        uint64_t at = c->pos;
        uint64_t v = rd(c, 8, "dimension", t->name);
        if (c->bad) return -1;
        if (v > (uint64_t)INT64_MAX)
            return fail(c, (int64_t)at, "tensor %s: ne[%u] = %llu is negative as int64", t->name, d,
                        (unsigned long long)v);
        t->ne[d] = (int64_t)v;
        if (v && count > (uint64_t)INT64_MAX / v) overflow = 1;
        else count *= v;
    }
    uint64_t tpos = c->pos;
    t->type = (uint32_t)rd(c, 4, "ggml type", t->name);
    uint64_t off = rd(c, 8, "data offset", t->name);
    if (c->bad) return -1;
    const char *tname;
    uint32_t blck, bytes;
    if (!gguf_type_info(t->type, &tname, &blck, &bytes))
        return fail(c, (int64_t)tpos, "tensor %s: unknown ggml type %u", t->name, t->type);
    if (overflow)
        return fail(c, (int64_t)dpos, "tensor %s: element count overflows int64 (dims %lld x %lld x %lld x %lld)",
                    t->name, (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2], (long long)t->ne[3]);
    if (t->ne[0] % blck)
        return fail(c, (int64_t)dpos, "tensor %s: ne[0] = %lld is not a multiple of the %s block size %u", t->name,
                    (long long)t->ne[0], tname, blck);
    uint64_t nblk = count / blck;
    if (nblk > UINT64_MAX / bytes || nblk * bytes > (uint64_t)INT64_MAX)
        return fail(c, (int64_t)dpos, "tensor %s: byte size overflows", t->name);
    t->nbytes = nblk * bytes;
    t->offset = off; /* relative until the data section start is known */
    return 0;
}

static int parse_impl(const uint8_t *head, size_t head_len, uint64_t file_size, const char *label,
                      gguf_file *out, df_error *err)
{
    cursor cc = {head, head_len < file_size ? head_len : (size_t)file_size, file_size, 0, label, err, 0};
    cursor *c = &cc;
    const gguf_tensor **order = NULL;
    char **keys = NULL;
    if (c->len < 4)
        return df_err_set(err, file_size < 4 ? DF_ERR_FORMAT : DF_ERR_LIMIT, 0,
                          "%s: file is %llu bytes, too short for a GGUF header (24 bytes)", label,
                          (unsigned long long)file_size);
    if (memcmp(head, "GGUF", 4) != 0) {
        char m[40];
        printable(m, sizeof m, head, 4);
        return df_err_set(err, DF_ERR_FORMAT, 0, "%s: bad magic \"%s\" (expected \"GGUF\"; not a GGUF file)", label, m);
    }
    if (file_size < 24)
        return df_err_set(err, DF_ERR_FORMAT, 0, "%s: file is %llu bytes, too short for a GGUF header (24 bytes)",
                          label, (unsigned long long)file_size);
    c->pos = 4;
    out->version = (uint32_t)rd(c, 4, "version", NULL);
    if (c->bad) goto done;
    if (out->version != 2 && out->version != 3) {
        fail(c, 4, "GGUF version %u is not supported (this reader accepts versions 2 and 3%s)", out->version,
             out->version == 1 ? "; version 1 used 32-bit counts" :
             (out->version & 0xffff) == 0 ? "; the file may be big-endian" : "");
        goto done;
    }
    uint64_t n_tensors = rd(c, 8, "tensor count", NULL);
    uint64_t n_kv = rd(c, 8, "KV count", NULL);
    if (c->bad) goto done;
    uint64_t left = file_size - c->pos;
    if (n_kv > left / 13) {
        fail(c, 16, "KV count %llu is impossible for a file of %llu bytes", (unsigned long long)n_kv,
             (unsigned long long)file_size);
        goto done;
    }
    if (n_tensors > left / 32 || n_tensors > UINT32_MAX) {
        fail(c, 8, "tensor count %llu is impossible for a file of %llu bytes", (unsigned long long)n_tensors,
             (unsigned long long)file_size);
        goto done;
    }
    out->file_size = file_size;
    out->alignment = GGUF_DEFAULT_ALIGNMENT;
    out->kv = xcalloc(n_kv ? (size_t)n_kv : 1, sizeof *out->kv);
    for (uint64_t i = 0; i < n_kv; i++) {
        gguf_kv *kv = &out->kv[i];
        kv->pos = c->pos;
        uint64_t klen = 0;
        const uint8_t *k = rd_str(c, &klen, "key", NULL);
        if (c->bad) goto done;
        char pk[160];
        printable(pk, sizeof pk, k, klen);
        if (klen == 0) { fail(c, (int64_t)kv->pos, "KV %llu has an empty key", (unsigned long long)i); goto done; }
        if (memchr(k, 0, (size_t)klen)) { fail(c, (int64_t)kv->pos, "key %s contains a NUL byte", pk); goto done; }
        kv->key = xmalloc((size_t)klen + 1);
        memcpy(kv->key, k, (size_t)klen);
        kv->key[klen] = 0;
        out->n_kv++;
        if (parse_kv(c, kv, kv->key)) goto done;
        if (!strcmp(kv->key, "general.alignment")) {
            if (kv->type != GGUF_KV_U32) {
                fail(c, (int64_t)kv->pos, "key general.alignment has type %s, expected UINT32", kv_names[kv->type]);
                goto done;
            }
            uint32_t a = (uint32_t)rd_le(kv->data, 4);
            if (a == 0 || (a & (a - 1))) {
                fail(c, (int64_t)kv->pos, "key general.alignment = %u is not a power of two", a);
                goto done;
            }
            out->alignment = a;
        }
    }
    keys = xmalloc((n_kv ? (size_t)n_kv : 1) * sizeof *keys);
    for (size_t i = 0; i < out->n_kv; i++) keys[i] = out->kv[i].key;
    qsort(keys, out->n_kv, sizeof *keys, cmp_str);
    for (size_t i = 1; i < out->n_kv; i++)
        if (!strcmp(keys[i - 1], keys[i])) {
            const gguf_kv *dup = NULL;
            for (size_t j = out->n_kv; j-- > 0;)
                if (!strcmp(out->kv[j].key, keys[i])) { dup = &out->kv[j]; break; }
            fail(c, dup ? (int64_t)dup->pos : -1, "duplicate key %s", keys[i]);
            goto done;
        }
    out->tensors = xcalloc(n_tensors ? (size_t)n_tensors : 1, sizeof *out->tensors);
    for (uint64_t i = 0; i < n_tensors; i++) {
        gguf_tensor *t = &out->tensors[i];
        out->n_tensors++;
        if (parse_tensor(c, t)) goto done;
    }
    uint64_t hdr_end = c->pos;
    uint64_t a = out->alignment;
    out->data_start = hdr_end + (a - hdr_end % a) % a;
    uint64_t data_size = out->data_start <= file_size ? file_size - out->data_start : 0;
    for (size_t i = 0; i < out->n_tensors; i++) {
        gguf_tensor *t = &out->tensors[i];
        uint64_t rel = t->offset;
        if (rel % a) {
            fail(c, (int64_t)t->info_pos, "tensor %s: data offset %llu is not a multiple of the alignment %u", t->name,
                 (unsigned long long)rel, out->alignment);
            goto done;
        }
        if (out->data_start > file_size || rel > data_size || t->nbytes > data_size - rel) {
            fail(c, (int64_t)t->info_pos,
                 "tensor %s: data [%llu, +%llu) lies outside the data section of %llu bytes starting at byte %llu "
                 "(truncated?)", t->name, (unsigned long long)rel, (unsigned long long)t->nbytes,
                 (unsigned long long)data_size, (unsigned long long)out->data_start);
            goto done;
        }
        t->offset = out->data_start + rel;
    }
    size_t nt = out->n_tensors ? out->n_tensors : 1;
    order = xmalloc(nt * sizeof *order);
    for (size_t i = 0; i < out->n_tensors; i++) order[i] = &out->tensors[i];
    qsort(order, out->n_tensors, sizeof *order, cmp_by_name);
    for (size_t i = 1; i < out->n_tensors; i++)
        if (!strcmp(order[i - 1]->name, order[i]->name)) {
            const gguf_tensor *t = order[i - 1] > order[i] ? order[i - 1] : order[i];
            fail(c, (int64_t)t->info_pos, "duplicate tensor name %s", t->name);
            goto done;
        }
    out->by_name = xmalloc(nt * sizeof *out->by_name);
    for (size_t i = 0; i < out->n_tensors; i++) out->by_name[i] = (uint32_t)(order[i] - out->tensors);
    qsort(order, out->n_tensors, sizeof *order, cmp_by_offset);
    for (size_t i = 1; i < out->n_tensors; i++) {
        const gguf_tensor *p = order[i - 1], *q = order[i];
        if (p->nbytes && q->nbytes && p->offset + p->nbytes > q->offset) {
            fail(c, (int64_t)q->info_pos, "tensors %s and %s overlap in the data section (bytes %llu..%llu and %llu..)",
                 p->name, q->name, (unsigned long long)p->offset, (unsigned long long)(p->offset + p->nbytes),
                 (unsigned long long)q->offset);
            goto done;
        }
    }
    /* Own a copy of the header so KV values stay valid after the caller's
     * buffer goes; repoint the values into it. */
    out->head_len = (size_t)hdr_end;
    out->head = xmalloc(out->head_len ? out->head_len : 1);
    memcpy(out->head, head, out->head_len);
    for (size_t i = 0; i < out->n_kv; i++)
        if (out->kv[i].data) out->kv[i].data = out->head + (out->kv[i].data - head);
done:
    free(order);
    free(keys);
    if (c->bad) {
        gguf_deinit(out);
        return -1;
    }
    return 0;
}

int gguf_parse(const uint8_t *head, size_t head_len, uint64_t file_size, const char *label, gguf_file *out,
               df_error *err)
{
    memset(out, 0, sizeof *out);
    return parse_impl(head, head_len, file_size, label, out, err);
}

int gguf_open(const char *path, gguf_file *out, df_error *err)
{
    memset(out, 0, sizeof *out);
    uint64_t size;
    int fd = open_sized(path, &size, err);
    if (fd < 0) return -1;
    size_t want = 1u << 20, got = 0;
    uint8_t *buf = NULL;
    int rc;
    for (;;) {
        if (want > size) want = (size_t)size;
        buf = xrealloc(buf, want ? want : 1);
        while (got < want) {
            ssize_t r = pread(fd, buf + got, want - got, (off_t)got);
            if (r < 0 && errno == EINTR) continue;
            if (r < 0) {
                rc = df_err_set(err, DF_ERR_IO, (int64_t)got, "%s: read failed: %s", path, strerror(errno));
                goto out;
            }
            if (r == 0) break;
            got += (size_t)r;
        }
        df_error e = {0};
        rc = gguf_parse(buf, got, got < want ? got : size, path, out, &e);
        if (rc == 0 || e.code != DF_ERR_LIMIT || got < want || want >= size || want >= GGUF_MAX_HEADER) {
            if (rc && e.code == DF_ERR_LIMIT)
                df_err_set(err, DF_ERR_FORMAT, e.pos, "%s: header is larger than %llu bytes (corrupt?)", path,
                           (unsigned long long)GGUF_MAX_HEADER);
            else if (rc)
                *err = err->code ? *err : e;
            break;
        }
        want = want > SIZE_MAX / 4 ? SIZE_MAX : want * 4;
    }
out:
    free(buf);
    close(fd);
    if (rc == 0) out->path = xstrdup(path);
    return rc;
}

/* ----------------------------------------------------------------- lookups */

const gguf_kv *gguf_find_kv(const gguf_file *f, const char *key)
{
    for (size_t i = 0; i < f->n_kv; i++)
        if (!strcmp(f->kv[i].key, key)) return &f->kv[i];
    return NULL;
}

const gguf_tensor *gguf_find_tensor(const gguf_file *f, const char *name)
{
    size_t lo = 0, hi = f->n_tensors;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        const gguf_tensor *t = &f->tensors[f->by_name[mid]];
        int c = strcmp(t->name, name);
        if (c == 0) return t;
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    return NULL;
}

static const char *lbl(const gguf_file *f) { return f->path ? f->path : "gguf"; }

static const gguf_kv *need_kv(const gguf_file *f, const char *key, df_error *err)
{
    const gguf_kv *kv = gguf_find_kv(f, key);
    if (!kv) df_err_set(err, DF_ERR_FORMAT, -1, "%s: missing key %s", lbl(f), key);
    return kv;
}

static int type_err(const gguf_file *f, const gguf_kv *kv, const char *want, df_error *err)
{
    if (kv->type == GGUF_KV_ARRAY)
        return df_err_set(err, DF_ERR_FORMAT, (int64_t)kv->pos, "%s: key %s is an array of %s, expected %s", lbl(f),
                          kv->key, kv_names[kv->arr_type], want);
    return df_err_set(err, DF_ERR_FORMAT, (int64_t)kv->pos, "%s: key %s has type %s, expected %s", lbl(f), kv->key,
                      kv_names[kv->type], want);
}

/* Integer element as signed/unsigned pair; returns 0 if t is not an integer type. */
static int int_value(enum gguf_kv_type t, const uint8_t *p, int64_t *sv, uint64_t *uv, int *is_neg)
{
    uint64_t raw;
    switch (t) {
    case GGUF_KV_U8: case GGUF_KV_U16: case GGUF_KV_U32: case GGUF_KV_U64:
        *uv = rd_le(p, kv_sizes[t]);
        *is_neg = 0;
        *sv = *uv > (uint64_t)INT64_MAX ? INT64_MAX : (int64_t)*uv;
        return 1;
    case GGUF_KV_I8: case GGUF_KV_I16: case GGUF_KV_I32: case GGUF_KV_I64: {
        int bits = 8 * kv_sizes[t];
        raw = rd_le(p, kv_sizes[t]);
        if (bits < 64 && (raw >> (bits - 1)) & 1) raw |= ~0ull << bits; /* sign-extend */
        memcpy(sv, &raw, 8);
        *is_neg = *sv < 0;
        *uv = *is_neg ? 0 : (uint64_t)*sv;
        return 1;
    }
    default:
        return 0;
    }
}

static int get_int(const gguf_file *f, const char *key, int64_t lo, uint64_t hi, const char *want, int64_t *sv,
                   uint64_t *uv, df_error *err)
{
    const gguf_kv *kv = need_kv(f, key, err);
    if (!kv) return -1;
    int neg;
    if (kv->type == GGUF_KV_ARRAY || !int_value(kv->type, kv->data, sv, uv, &neg)) return type_err(f, kv, want, err);
    if ((neg && *sv < lo) || (!neg && *uv > hi))
        return neg ? df_err_set(err, DF_ERR_FORMAT, (int64_t)kv->pos, "%s: key %s = %lld does not fit in %s", lbl(f),
                                key, (long long)*sv, want)
                   : df_err_set(err, DF_ERR_FORMAT, (int64_t)kv->pos, "%s: key %s = %llu does not fit in %s", lbl(f),
                                key, (unsigned long long)*uv, want);
    return 0;
}

int gguf_get_u32(const gguf_file *f, const char *key, uint32_t *out, df_error *err)
{
    int64_t s;
    uint64_t u;
    if (get_int(f, key, 0, UINT32_MAX, "u32", &s, &u, err)) return -1;
    *out = (uint32_t)u;
    return 0;
}

int gguf_get_i32(const gguf_file *f, const char *key, int32_t *out, df_error *err)
{
    int64_t s;
    uint64_t u;
    if (get_int(f, key, INT32_MIN, INT32_MAX, "i32", &s, &u, err)) return -1;
    *out = (int32_t)s;
    return 0;
}

int gguf_get_u64(const gguf_file *f, const char *key, uint64_t *out, df_error *err)
{
    int64_t s;
    uint64_t u;
    if (get_int(f, key, 0, UINT64_MAX, "u64", &s, &u, err)) return -1;
    *out = u;
    return 0;
}

static int float_value(enum gguf_kv_type t, const uint8_t *p, float *out)
{
    if (t == GGUF_KV_F32) {
        uint32_t b = (uint32_t)rd_le(p, 4);
        memcpy(out, &b, 4);
        return 1;
    }
    if (t == GGUF_KV_F64) {
        uint64_t b = rd_le(p, 8);
        double d;
        memcpy(&d, &b, 8);
        *out = (float)d;
        return (double)*out == d || d != d;
    }
    return 0;
}

int gguf_get_f32(const gguf_file *f, const char *key, float *out, df_error *err)
{
    const gguf_kv *kv = need_kv(f, key, err);
    if (!kv) return -1;
    if (kv->type == GGUF_KV_ARRAY || !float_value(kv->type, kv->data, out))
        return type_err(f, kv, "FLOAT32", err);
    return 0;
}

int gguf_get_bool(const gguf_file *f, const char *key, int *out, df_error *err)
{
    const gguf_kv *kv = need_kv(f, key, err);
    if (!kv) return -1;
    if (kv->type != GGUF_KV_BOOL) return type_err(f, kv, "BOOL", err);
    *out = kv->data[0];
    return 0;
}

int gguf_get_str(const gguf_file *f, const char *key, const char **s, size_t *len, df_error *err)
{
    const gguf_kv *kv = need_kv(f, key, err);
    if (!kv) return -1;
    if (kv->type != GGUF_KV_STRING) return type_err(f, kv, "STRING", err);
    *s = (const char *)kv->data;
    *len = (size_t)kv->len;
    return 0;
}

static const gguf_kv *need_arr(const gguf_file *f, const char *key, const char *want, df_error *err)
{
    const gguf_kv *kv = need_kv(f, key, err);
    if (kv && kv->type != GGUF_KV_ARRAY) {
        df_err_set(err, DF_ERR_FORMAT, (int64_t)kv->pos, "%s: key %s has type %s, expected an array of %s", lbl(f),
                   key, kv_names[kv->type], want);
        return NULL;
    }
    return kv;
}

int gguf_get_arr_int(const gguf_file *f, const char *key, int64_t *out, size_t max, size_t *n, df_error *err)
{
    const gguf_kv *kv = need_arr(f, key, "integers", err);
    if (!kv) return -1;
    *n = (size_t)kv->n;
    int64_t s;
    uint64_t u;
    int neg;
    if (kv->n && !int_value(kv->arr_type, kv->data, &s, &u, &neg))
        return df_err_set(err, DF_ERR_FORMAT, (int64_t)kv->pos, "%s: key %s is an array of %s, expected integers",
                          lbl(f), key, kv_names[kv->arr_type]);
    for (uint64_t i = 0; i < kv->n && i < max; i++) {
        int_value(kv->arr_type, kv->data + i * kv_sizes[kv->arr_type], &s, &u, &neg);
        if (!neg && u > (uint64_t)INT64_MAX)
            return df_err_set(err, DF_ERR_FORMAT, (int64_t)kv->pos, "%s: key %s: element %llu = %llu does not fit in int64",
                              lbl(f), key, (unsigned long long)i, (unsigned long long)u);
        out[i] = s;
    }
    return 0;
}

int gguf_get_arr_f32(const gguf_file *f, const char *key, float *out, size_t max, size_t *n, df_error *err)
{
    const gguf_kv *kv = need_arr(f, key, "FLOAT32", err);
    if (!kv) return -1;
    *n = (size_t)kv->n;
    if (kv->arr_type != GGUF_KV_F32 && kv->arr_type != GGUF_KV_F64)
        return df_err_set(err, DF_ERR_FORMAT, (int64_t)kv->pos, "%s: key %s is an array of %s, expected FLOAT32",
                          lbl(f), key, kv_names[kv->arr_type]);
    for (uint64_t i = 0; i < kv->n && i < max; i++)
        if (!float_value(kv->arr_type, kv->data + i * kv_sizes[kv->arr_type], &out[i]))
            return df_err_set(err, DF_ERR_FORMAT, (int64_t)kv->pos,
                              "%s: key %s: element %llu is not exactly representable as FLOAT32", lbl(f), key,
                              (unsigned long long)i);
    return 0;
}

int gguf_get_arr_str(const gguf_file *f, const char *key, size_t i, const char **s, size_t *len, df_error *err)
{
    const gguf_kv *kv = need_arr(f, key, "STRING", err);
    if (!kv) return -1;
    if (kv->arr_type != GGUF_KV_STRING)
        return df_err_set(err, DF_ERR_FORMAT, (int64_t)kv->pos, "%s: key %s is an array of %s, expected STRING",
                          lbl(f), key, kv_names[kv->arr_type]);
    if (i >= kv->n)
        return df_err_set(err, DF_ERR_ARG, (int64_t)kv->pos, "%s: key %s: index %zu past the %llu strings", lbl(f),
                          key, i, (unsigned long long)kv->n);
    *s = (const char *)kv->data + kv->str_off[i];
    *len = (size_t)kv->str_len[i];
    return 0;
}
