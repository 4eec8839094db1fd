/* safetensors.c - see safetensors.h.
 *
 * The header is parsed with json.c and then checked entry by entry; the
 * overlap check sorts the entries by begin offset, so it is O(n log n) for
 * the thousands of tensors a K3 shard holds.  Gaps between tensors are
 * allowed (the format does not forbid them) but each entry must be in bounds.
 */
#define _GNU_SOURCE
#include "safetensors.h"
#include "json.h"
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const struct { const char *name; enum st_dtype t; size_t size; } dtypes[] = {
    {"F32", ST_F32, 4}, {"BF16", ST_BF16, 2}, {"F16", ST_F16, 2}, {"U8", ST_U8, 1},
    {"I8", ST_I8, 1}, {"I32", ST_I32, 4}, {"I64", ST_I64, 8}, {"F64", ST_F64, 8},
    {"BOOL", ST_BOOL, 1}, {"U16", ST_U16, 2}, {"I16", ST_I16, 2}, {"U32", ST_U32, 4},
    {"U64", ST_U64, 8},
};

const char *st_dtype_name(enum st_dtype t)
{
    for (size_t i = 0; i < sizeof dtypes / sizeof dtypes[0]; i++)
        if (dtypes[i].t == t) return dtypes[i].name;
    return "?";
}

size_t st_dtype_size(enum st_dtype t)
{
    for (size_t i = 0; i < sizeof dtypes / sizeof dtypes[0]; i++)
        if (dtypes[i].t == t) return dtypes[i].size;
    return 0;
}

void st_deinit(st_file *f)
{
    if (!f) return;
    for (size_t i = 0; i < f->n_tensors; i++) free(f->tensors[i].name);
    free(f->tensors);
    free(f->path);
    memset(f, 0, sizeof *f);
}

static int cmp_offset(const void *a, const void *b)
{
    const st_tensor *x = *(const st_tensor *const *)a, *y = *(const st_tensor *const *)b;
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

static int cmp_name(const void *a, const void *b)
{
    return strcmp(((const st_tensor *)a)->name, ((const st_tensor *)b)->name);
}

int st_parse(const uint8_t *head, size_t head_len, uint64_t file_size, const char *label,
             st_file *out, df_error *err)
{
    memset(out, 0, sizeof *out);
    if (file_size < 8 || head_len < 8)
        return df_err_set(err, DF_ERR_FORMAT, 0, "%s: file is %llu bytes, too short for a safetensors header",
                          label, (unsigned long long)file_size);
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = (n << 8) | head[i];
    if (n < 2 || n > ST_MAX_HEADER || n > file_size - 8)
        return df_err_set(err, DF_ERR_FORMAT, 0,
                          "%s: header length %llu is impossible for a file of %llu bytes (truncated or not safetensors)",
                          label, (unsigned long long)n, (unsigned long long)file_size);
    if (head_len < 8 + n)
        return df_err_set(err, DF_ERR_FORMAT, 8, "%s: header truncated (%zu of %llu bytes)", label,
                          head_len - 8, (unsigned long long)n);
    df_error jerr = {0};
    json_doc *doc = json_parse((const char *)head + 8, (size_t)n, &jerr);
    if (!doc)
        return df_err_set(err, DF_ERR_FORMAT, 8 + jerr.pos, "%s: header is not valid JSON: %s", label, jerr.msg);
    const json_value *root = json_root(doc);
    int rc = -1;
    st_tensor **order = NULL;
    if (root->type != JSON_OBJECT) {
        df_err_set(err, DF_ERR_FORMAT, 8, "%s: header is a JSON %s, expected an object", label,
                   json_type_name(root->type));
        goto done;
    }
    uint64_t data_size = file_size - 8 - n;
    out->data_start = 8 + n;
    out->file_size = file_size;
    out->tensors = xcalloc(root->len ? root->len : 1, sizeof *out->tensors);
    for (size_t i = 0; i < root->len; i++) {
        const char *name = root->keys[i];
        const json_value *e = root->items[i];
        int64_t epos = 8 + e->pos;
        if (!strcmp(name, "__metadata__")) {
            if (e->type != JSON_OBJECT) {
                df_err_set(err, DF_ERR_FORMAT, epos, "%s: __metadata__ is not an object", label);
                goto done;
            }
            continue;
        }
        if (!name[0]) { df_err_set(err, DF_ERR_FORMAT, epos, "%s: tensor with an empty name", label); goto done; }
        if (e->type != JSON_OBJECT) {
            df_err_set(err, DF_ERR_FORMAT, epos, "%s: tensor %s: entry is not an object", label, name);
            goto done;
        }
        st_tensor *t = &out->tensors[out->n_tensors];
        const char *dt = json_get_str(e, "dtype");
        const json_value *shape = json_get(e, "shape");
        const json_value *offs = json_get(e, "data_offsets");
        if (!dt) { df_err_set(err, DF_ERR_FORMAT, epos, "%s: tensor %s: missing or non-string dtype", label, name); goto done; }
        size_t k;
        for (k = 0; k < sizeof dtypes / sizeof dtypes[0]; k++)
            if (!strcmp(dtypes[k].name, dt)) break;
        if (k == sizeof dtypes / sizeof dtypes[0]) {
            df_err_set(err, DF_ERR_FORMAT, epos, "%s: tensor %s: unknown dtype \"%s\"", label, name, dt);
            goto done;
        }
        t->dtype = dtypes[k].t;
        if (!shape || shape->type != JSON_ARRAY || shape->len > ST_MAX_DIMS) {
            df_err_set(err, DF_ERR_FORMAT, epos, "%s: tensor %s: shape must be an array of at most %d integers",
                       label, name, ST_MAX_DIMS);
            goto done;
        }
        t->n_dims = (int)shape->len;
        uint64_t count = 1;
        for (size_t d = 0; d < shape->len; d++) {
            const json_value *v = shape->items[d];
            if (v->type != JSON_NUMBER || !v->is_int || v->i < 0 || v->i > ((int64_t)1 << 40)) {
                df_err_set(err, DF_ERR_FORMAT, epos, "%s: tensor %s: shape[%zu] is not a valid dimension",
                           label, name, d);
                goto done;
            }
            t->shape[d] = v->i;
            if (v->i && count > UINT64_MAX / (uint64_t)v->i / 8) {
                df_err_set(err, DF_ERR_FORMAT, epos, "%s: tensor %s: shape overflows", label, name);
                goto done;
            }
            count *= (uint64_t)v->i;
        }
        t->nbytes = count * dtypes[k].size;
        if (!offs || offs->type != JSON_ARRAY || offs->len != 2 ||
            offs->items[0]->type != JSON_NUMBER || !offs->items[0]->is_int ||
            offs->items[1]->type != JSON_NUMBER || !offs->items[1]->is_int) {
            df_err_set(err, DF_ERR_FORMAT, epos, "%s: tensor %s: data_offsets must be [begin, end] integers", label, name);
            goto done;
        }
        int64_t b = offs->items[0]->i, en = offs->items[1]->i;
        if (b < 0 || en < b) {
            df_err_set(err, DF_ERR_FORMAT, epos, "%s: tensor %s: data_offsets [%lld, %lld] are reversed or negative",
                       label, name, (long long)b, (long long)en);
            goto done;
        }
        if ((uint64_t)(en - b) != t->nbytes) {
            df_err_set(err, DF_ERR_FORMAT, epos,
                       "%s: tensor %s: data_offsets span %lld bytes but dtype %s and its shape need %llu",
                       label, name, (long long)(en - b), dt, (unsigned long long)t->nbytes);
            goto done;
        }
        if ((uint64_t)en > data_size) {
            df_err_set(err, DF_ERR_FORMAT, epos,
                       "%s: tensor %s: data ends at byte %lld of the data section, but the file holds only %llu (truncated?)",
                       label, name, (long long)en, (unsigned long long)data_size);
            goto done;
        }
        t->offset = out->data_start + (uint64_t)b;
        t->name = xstrdup(name);
        out->n_tensors++;
    }
    order = xmalloc((out->n_tensors ? out->n_tensors : 1) * sizeof *order);
    for (size_t i = 0; i < out->n_tensors; i++) order[i] = &out->tensors[i];
    qsort(order, out->n_tensors, sizeof *order, cmp_offset);
    for (size_t i = 1; i < out->n_tensors; i++) {
        const st_tensor *a = order[i - 1], *b = order[i];
        if (a->nbytes && b->nbytes && a->offset + a->nbytes > b->offset) {
            df_err_set(err, DF_ERR_FORMAT, -1, "%s: tensors %s and %s overlap in the data section", label,
                       a->name, b->name);
            goto done;
        }
    }
    qsort(out->tensors, out->n_tensors, sizeof *out->tensors, cmp_name);
    rc = 0;
done:
    free(order);
    json_free(doc);
    if (rc) st_deinit(out);
    return rc;
}

int st_open(const char *path, st_file *out, df_error *err)
{
    memset(out, 0, sizeof *out);
    uint64_t size;
    int fd = open_sized(path, &size, err);
    if (fd < 0) return -1;
    uint8_t lenb[8];
    ssize_t r = size >= 8 ? pread(fd, lenb, 8, 0) : 0;
    if (r != 8) {
        close(fd);
        return df_err_set(err, DF_ERR_FORMAT, 0, "%s: file is %llu bytes, too short for a safetensors header",
                          path, (unsigned long long)size);
    }
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = (n << 8) | lenb[i];
    if (n > ST_MAX_HEADER || n > size - 8) {
        close(fd);
        return df_err_set(err, DF_ERR_FORMAT, 0,
                          "%s: header length %llu is impossible for a file of %llu bytes (truncated or not safetensors)",
                          path, (unsigned long long)n, (unsigned long long)size);
    }
    uint8_t *head = xmalloc(8 + n);
    size_t got = 0;
    while (got < 8 + n) {
        r = pread(fd, head + got, 8 + n - got, (off_t)got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        got += (size_t)r;
    }
    close(fd);
    int rc = st_parse(head, got, size, path, out, err);
    free(head);
    if (rc == 0) out->path = xstrdup(path);
    return rc;
}

const st_tensor *st_find(const st_file *f, const char *name)
{
    size_t lo = 0, hi = f->n_tensors;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        int c = strcmp(f->tensors[mid].name, name);
        if (c == 0) return &f->tensors[mid];
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    return NULL;
}
