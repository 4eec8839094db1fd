/* expert_store.c - see expert_store.h. */
#define _GNU_SOURCE
#include "expert_store.h"
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *tensor_names[EX_N] = {"w1.weight_packed", "w1.weight_scale", "w2.weight_packed",
                                         "w2.weight_scale", "w3.weight_packed", "w3.weight_scale"};

void expert_store_init(expert_store *s, int n_layers, int n_experts, const uint32_t sizes[EX_N])
{
    memset(s, 0, sizeof *s);
    s->n_layers = n_layers;
    s->n_experts = n_experts;
    s->loc = xcalloc((size_t)n_layers * (size_t)n_experts, sizeof *s->loc);
    for (size_t i = 0; i < (size_t)n_layers * (size_t)n_experts; i++) {
        s->loc[i].file = -1;
        for (int k = 0; k < EX_N; k++) s->loc[i].src[k] = UINT64_MAX;
    }
    uint64_t off = 0;
    for (int k = 0; k < EX_N; k++) {
        s->sizes[k] = sizes[k];
        off += sizes[k];
    }
    s->expert_bytes = off;
}

int expert_store_add_file(expert_store *s, const char *path, df_error *err)
{
    for (int i = 0; i < s->n_files; i++)
        if (!strcmp(s->paths[i], path)) return i;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return df_err_set(err, DF_ERR_IO, -1, "%s: cannot open for expert reads: %s", path, strerror(errno));
    s->fds = xrealloc(s->fds, (size_t)(s->n_files + 1) * sizeof *s->fds);
    s->paths = xrealloc(s->paths, (size_t)(s->n_files + 1) * sizeof *s->paths);
    s->fds[s->n_files] = fd;
    s->paths[s->n_files] = xstrdup(path);
    return s->n_files++;
}

void expert_store_set(expert_store *s, int il, int e, int which, int file, uint64_t off)
{
    expert_loc *l = &s->loc[(size_t)il * (size_t)s->n_experts + (size_t)e];
    l->file = file;
    l->src[which] = off;
}

int expert_store_finish(expert_store *s, const uint8_t *moe_layer, df_error *err)
{
    for (int il = 0; il < s->n_layers; il++) {
        if (!moe_layer[il]) continue;
        for (int e = 0; e < s->n_experts; e++) {
            expert_loc *l = &s->loc[(size_t)il * (size_t)s->n_experts + (size_t)e];
            for (int k = 0; k < EX_N; k++)
                if (l->src[k] == UINT64_MAX)
                    return df_err_set(err, DF_ERR_FORMAT, -1, "layer %d expert %d: tensor %s is missing", il, e,
                                      tensor_names[k]);
            /* contiguous = the six ranges tile [min, min + expert_bytes) */
            uint64_t lo = UINT64_MAX, hi = 0;
            for (int k = 0; k < EX_N; k++) {
                if (l->src[k] < lo) lo = l->src[k];
                if (l->src[k] + s->sizes[k] > hi) hi = l->src[k] + s->sizes[k];
            }
            l->contiguous = hi - lo == s->expert_bytes;
            if (l->contiguous) {
                l->offset = lo;
                for (int k = 0; k < EX_N; k++) l->rel[k] = (uint32_t)(l->src[k] - lo);
            } else {
                uint32_t off = 0;
                for (int k = 0; k < EX_N; k++) {
                    l->rel[k] = off;
                    off += s->sizes[k];
                }
            }
        }
    }
    return 0;
}

static int pread_full(int fd, uint8_t *dst, uint64_t n, uint64_t off)
{
    uint64_t got = 0;
    while (got < n) {
        ssize_t r = pread(fd, dst + got, (size_t)(n - got), (off_t)(off + got));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return r < 0 ? -errno : -EIO;
        got += (uint64_t)r;
    }
    return 0;
}

int expert_store_read(expert_store *s, int il, int e, uint8_t *dst, df_error *err)
{
    const expert_loc *l = &s->loc[(size_t)il * (size_t)s->n_experts + (size_t)e];
    CHECK(l->file >= 0);
    int fd = s->fds[l->file];
    if (l->contiguous) {
        int rc = pread_full(fd, dst, s->expert_bytes, l->offset);
        if (rc)
            return df_err_set(err, DF_ERR_IO, (int64_t)l->offset, "%s: reading layer %d expert %d failed: %s",
                              s->paths[l->file], il, e, strerror(-rc));
        s->n_reads++;
    } else {
        for (int k = 0; k < EX_N; k++) {
            int rc = pread_full(fd, dst + l->rel[k], s->sizes[k], l->src[k]);
            if (rc)
                return df_err_set(err, DF_ERR_IO, (int64_t)l->src[k], "%s: reading layer %d expert %d %s failed: %s",
                                  s->paths[l->file], il, e, tensor_names[k], strerror(-rc));
            s->n_reads++;
        }
    }
    s->bytes_read += s->expert_bytes;
    return 0;
}

void expert_store_deinit(expert_store *s)
{
    if (!s) return;
    for (int i = 0; i < s->n_files; i++) {
        close(s->fds[i]);
        free(s->paths[i]);
    }
    free(s->fds);
    free(s->paths);
    free(s->loc);
    memset(s, 0, sizeof *s);
}
