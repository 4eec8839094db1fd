/* weights.c - a model's weight files opened and indexed by tensor name
 * (weights.h): a safetensors folder (with or without an index) or a GGUF
 * and its gguf-split siblings.  Headers only; the families read the bytes.
 */
#define _GNU_SOURCE
#include "weights.h"
#include "json.h"
#include "util.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define MAX_SPLITS 4096

const char *wset_path(const wset *w, int i)
{
    return w->format == WSET_GGUF ? w->gg[i].path : w->st[i].path;
}

static int join(char *out, size_t n, const char *dir, const char *file, df_error *err)
{
    if ((size_t)snprintf(out, n, "%s/%s", dir, file) >= n)
        return df_err_set(err, DF_ERR_ARG, -1, "path too long: %s/%s", dir, file);
    return 0;
}

static int cmp_name(const void *a, const void *b)
{
    return strcmp(((const wset_name *)a)->name, ((const wset_name *)b)->name);
}

static int add_st(wset *w, const char *path, df_error *err)
{
    w->st = xrealloc(w->st, (size_t)(w->n_files + 1) * sizeof *w->st);
    memset(&w->st[w->n_files], 0, sizeof *w->st);
    if (st_open(path, &w->st[w->n_files], err)) return -1;
    w->n_files++;
    return 0;
}

/* The shards model.safetensors.index.json names, in first-seen order. */
static int open_index(wset *w, const char *dir, const char *index, int (*skip)(const char *), df_error *err)
{
    size_t len = 0;
    w->index_path = xstrdup(index);
    if (read_small_file(index, &w->index_text, &len, 1u << 30, err)) return -1;
    df_error jerr = {0};
    json_doc *doc = json_parse(w->index_text, len, &jerr);
    if (!doc) return df_err_set(err, DF_ERR_FORMAT, jerr.pos, "%s: %s", index, jerr.msg);
    w->index_doc = doc;
    const json_value *wm = json_get(json_root(doc), "weight_map");
    if (!wm || wm->type != JSON_OBJECT) return df_err_set(err, DF_ERR_FORMAT, -1, "%s: missing \"weight_map\" object", index);
    const char **shard = xcalloc(wm->len + 1, sizeof *shard);
    w->names = xcalloc(wm->len + 1, sizeof *w->names);
    int n_sh = 0, rc = 0;
    for (size_t i = 0; i < wm->len && !rc; i++) {
        const json_value *v = wm->items[i];
        if (v->type != JSON_STRING || !v->str[0] || strchr(v->str, '/') || !strcmp(v->str, "..")) {
            rc = df_err_set(err, DF_ERR_FORMAT, v->pos, "%s: weight_map[\"%s\"] is not a plain shard file name", index,
                            wm->keys[i]);
            break;
        }
        if (skip && skip(wm->keys[i])) continue;
        int s;
        for (s = n_sh - 1; s >= 0; s--)
            if (!strcmp(shard[s], v->str)) break;
        if (s < 0) shard[s = n_sh++] = v->str;
        w->names[w->n_names++] = (wset_name){wm->keys[i], s};
    }
    for (int s = 0; s < n_sh && !rc; s++) {
        char p[PATH_MAX];
        rc = join(p, sizeof p, dir, shard[s], err) || add_st(w, p, err) ? -1 : 0;
    }
    free((void *)shard);
    if (rc) return -1;
    qsort(w->names, w->n_names, sizeof *w->names, cmp_name);
    for (size_t i = 1; i < w->n_names; i++)
        if (!strcmp(w->names[i - 1].name, w->names[i].name))
            return df_err_set(err, DF_ERR_FORMAT, -1, "%s: weight_map names %s twice", index, w->names[i].name);
    return 0;
}

static int open_folder(wset *w, const char *dir, int (*skip)(const char *), df_error *err)
{
    char p[PATH_MAX];
    struct stat sb;
    w->format = WSET_SAFETENSORS;
    if (join(p, sizeof p, dir, "model.safetensors.index.json", err)) return -1;
    if (stat(p, &sb) == 0) return open_index(w, dir, p, skip, err);
    if (join(p, sizeof p, dir, "model.safetensors", err)) return -1;
    if (stat(p, &sb) != 0)
        return df_err_set(err, DF_ERR_IO, -1, "%s: cannot open model.safetensors.index.json or model.safetensors "
                          "(a model folder holds one of them)", dir);
    if (add_st(w, p, err)) return -1;
    /* one file: its header is the index */
    const st_file *f = &w->st[0];
    w->names = xcalloc(f->n_tensors + 1, sizeof *w->names);
    for (size_t i = 0; i < f->n_tensors; i++)
        if (!skip || !skip(f->tensors[i].name)) w->names[w->n_names++] = (wset_name){f->tensors[i].name, 0};
    qsort(w->names, w->n_names, sizeof *w->names, cmp_name);
    return 0;
}

/* llama.cpp's gguf-split layout: PREFIX-00001-of-0000N.gguf holds the
 * metadata and split.no / split.count; files 2..N the other tensors. */
static int open_gguf(wset *w, const char *path, df_error *err)
{
    w->format = WSET_GGUF;
    w->gg = xcalloc(1, sizeof *w->gg);
    if (gguf_open(path, &w->gg[0], err)) return -1;
    w->n_files = 1;
    gguf_file *g0 = &w->gg[0];
    uint64_t count = 1, no = 0;
    if (gguf_find_kv(g0, "split.count") && gguf_get_u64(g0, "split.count", &count, err)) return -1;
    if (count <= 1) return 0;
    if (count > MAX_SPLITS)
        return df_err_set(err, DF_ERR_FORMAT, -1, "%s: split.count %llu is more than %d", path,
                          (unsigned long long)count, MAX_SPLITS);
    if (gguf_get_u64(g0, "split.no", &no, err)) return -1;
    if (no != 0)
        return df_err_set(err, DF_ERR_ARG, -1,
                          "%s is split %llu of %llu of a model: give the first file (...-00001-of-%05llu.gguf)", path,
                          (unsigned long long)no + 1, (unsigned long long)count, (unsigned long long)count);
    char suffix[48];
    snprintf(suffix, sizeof suffix, "-00001-of-%05llu.gguf", (unsigned long long)count);
    size_t pl = strlen(path), sl = strlen(suffix);
    if (pl <= sl || strcmp(path + pl - sl, suffix))
        return df_err_set(err, DF_ERR_ARG, -1, "%s: the first of %llu split files must be named PREFIX%s", path,
                          (unsigned long long)count, suffix);
    w->gg = xrealloc(w->gg, (size_t)count * sizeof *w->gg);
    memset(w->gg + 1, 0, (size_t)(count - 1) * sizeof *w->gg);
    for (uint64_t i = 1; i < count; i++) {
        size_t n = pl + 8;
        char *p = xmalloc(n);
        snprintf(p, n, "%.*s-%05llu-of-%05llu.gguf", (int)(pl - sl), path, (unsigned long long)i + 1,
                 (unsigned long long)count);
        int rc = gguf_open(p, &w->gg[i], err);
        free(p);
        if (rc) return -1;
        w->n_files = (int)i + 1;
        gguf_file *gi = &w->gg[i];
        uint64_t sn = 0, sc = 0;
        if (gguf_get_u64(gi, "split.no", &sn, err) || gguf_get_u64(gi, "split.count", &sc, err)) return -1;
        if (sn != i || sc != count)
            return df_err_set(err, DF_ERR_FORMAT, -1, "%s: split.no %llu of %llu, expected %llu of %llu", gi->path,
                              (unsigned long long)sn + 1, (unsigned long long)sc, (unsigned long long)i + 1,
                              (unsigned long long)count);
        for (size_t t = 0; t < gi->n_tensors; t++)
            for (uint64_t j = 0; j < i; j++)
                if (gguf_find_tensor(&w->gg[j], gi->tensors[t].name))
                    return df_err_set(err, DF_ERR_FORMAT, -1, "%s: tensor %s is also in %s", gi->path,
                                      gi->tensors[t].name, w->gg[j].path);
    }
    return 0;
}

int wset_open(const char *path, int (*skip)(const char *name), wset *w, df_error *err)
{
    memset(w, 0, sizeof *w);
    struct stat sb;
    if (stat(path, &sb) != 0) return df_err_set(err, DF_ERR_IO, -1, "%s: no such file or folder", path);
    w->where = xstrdup(path);
    int rc = S_ISDIR(sb.st_mode) ? open_folder(w, path, skip, err) : open_gguf(w, path, err);
    if (rc) wset_close(w);
    return rc;
}

void wset_close(wset *w)
{
    for (int i = 0; i < w->n_files; i++) {
        if (w->st) st_deinit(&w->st[i]);
        if (w->gg) gguf_deinit(&w->gg[i]);
    }
    free(w->st);
    free(w->gg);
    free(w->names);
    json_free(w->index_doc);
    free(w->index_text);
    free(w->index_path);
    free(w->where);
    memset(w, 0, sizeof *w);
}

const st_tensor *wset_st(const wset *w, const char *name, int *file, df_error *err)
{
    wset_name key = {.name = name};
    const wset_name *e = w->format == WSET_SAFETENSORS
                             ? bsearch(&key, w->names, w->n_names, sizeof key, cmp_name) : NULL;
    if (!e) {
        if (w->index_path)
            df_err_set(err, DF_ERR_FORMAT, -1, "%s: tensor %s is missing from weight_map", w->index_path, name);
        else
            df_err_set(err, DF_ERR_FORMAT, -1, "%s: tensor %s is missing", w->n_files ? w->st[0].path : w->where, name);
        return NULL;
    }
    const st_tensor *t = st_find(&w->st[e->file], name);
    if (!t) {
        df_err_set(err, DF_ERR_FORMAT, -1, "%s: tensor %s is listed in the index for this shard but not in its header",
                   w->st[e->file].path, name);
        return NULL;
    }
    *file = e->file;
    return t;
}

const gguf_tensor *wset_gguf(const wset *w, const char *name, int *file, df_error *err)
{
    for (int f = 0; w->format == WSET_GGUF && f < w->n_files; f++) {
        const gguf_tensor *t = gguf_find_tensor(&w->gg[f], name);
        if (t) {
            *file = f;
            return t;
        }
    }
    df_err_set(err, DF_ERR_FORMAT, -1, "%s: tensor %s is missing%s", w->where, name,
               w->n_files > 1 ? " (from every split)" : "");
    return NULL;
}

uint64_t wset_file_bytes(const wset *w)
{
    uint64_t n = 0;
    for (int i = 0; i < w->n_files; i++) n += w->format == WSET_GGUF ? w->gg[i].file_size : w->st[i].file_size;
    return n;
}
