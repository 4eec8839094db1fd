/* place.c - experts on several drives: `deltafin place`, which writes the
 * directories and the manifests that `--expert-path DIR` reads
 * (expert_paths.c).
 *
 * A placed directory holds, for each model shard that contains experts, a
 * file of the same name and size in which only the assigned experts' byte
 * ranges are written (the rest is a hole), so every expert keeps its offset
 * and the store reads a copy exactly as it reads the original.  The file
 * `deltafin-place.json` lists what the directory holds: the shard names and
 * sizes (to refuse a copy of another model) and, per MoE layer, the expert
 * ids.  It is written last, by rename, so an interrupted `place` leaves no
 * manifest and the directory is not used.
 * Modes: replicate (every directory gets every expert; reads go to the
 * least busy copy) and stripe (expert i of the model goes to directory
 * i mod n).
 */
#define _GNU_SOURCE
#include "engine_impl.h"
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int copy_range(int in, int out, uint64_t off, uint64_t len, uint8_t *buf, size_t cap)
{
    while (len) {
        size_t n = len < cap ? (size_t)len : cap;
        ssize_t r = pread(in, buf, n, (off_t)off);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return r < 0 ? -errno : -EIO;
        ssize_t w = pwrite(out, buf, (size_t)r, (off_t)off);
        if (w != r) return w < 0 ? -errno : -EIO;
        off += (uint64_t)r;
        len -= (uint64_t)r;
    }
    return 0;
}

int df_place(const char *model_dir, const char *const *dirs, int n, int stripe, df_place_progress progress,
             void *ctx, df_error *err)
{
    if (n < 1 || n > EXPERT_MAX_SOURCES - 1)
        return df_err_set(err, DF_ERR_ARG, -1, "place needs 1 to %d target directories", EXPERT_MAX_SOURCES - 1);
    df_engine_opts o;
    df_engine_opts_default(&o);
    o.quiet = 1;
    o.n_threads = 1;
    o.expert_cache_bytes = 1;
    o.io_mode = "buffered";
    o.no_prefetch = 1;
    df_engine *eng;
    if (df_engine_open(model_dir, &o, &eng, err)) return -1;
    if (eng->m.store.stream) {
        df_engine_close(eng);
        return df_err_set(err, DF_ERR_UNSUPPORTED, -1,
                          "%s is a streamed install: its shards hold no experts to place (install the model with "
                          "setup --full)",
                          model_dir);
    }
    const expert_store *st = &eng->m.store;
    const k3_config *c = &eng->m.cfg;
    int rc = -1;
    int *out_fds = xmalloc((size_t)n * (size_t)st->n_files * sizeof *out_fds);
    int *in_fds = xmalloc((size_t)st->n_files * sizeof *in_fds);
    for (int i = 0; i < n * st->n_files; i++) out_fds[i] = -1;
    for (int f = 0; f < st->n_files; f++) in_fds[f] = -1;
    size_t cap = 8u << 20;
    uint8_t *buf = xmalloc(cap);
    uint64_t total = 0, done_bytes = 0;
    for (int il = 0; il < c->NL; il++)
        if (c->layer_moe[il]) total += (uint64_t)c->E * st->expert_bytes * (uint64_t)(stripe ? 1 : n);
    for (int d = 0; d < n; d++) {
        if (mkdir(dirs[d], 0755) != 0 && errno != EEXIST) {
            df_err_set(err, DF_ERR_IO, -1, "%s: cannot create: %s", dirs[d], strerror(errno));
            goto done;
        }
        char m[4096];
        snprintf(m, sizeof m, "%s/" PLACE_MANIFEST, dirs[d]);
        unlink(m); /* the directory is not usable until this place completes */
    }
    for (int il = 0; il < c->NL; il++) {
        if (!c->layer_moe[il]) continue;
        for (int e = 0; e < c->E; e++) {
            const expert_loc *l = &st->loc[(size_t)il * c->E + (size_t)e];
            if (in_fds[l->file] < 0 && (in_fds[l->file] = open(st->paths[l->file], O_RDONLY | O_CLOEXEC)) < 0) {
                df_err_set(err, DF_ERR_IO, -1, "%s: cannot open: %s", st->paths[l->file], strerror(errno));
                goto done;
            }
            for (int d = 0; d < n; d++) {
                if (stripe && ((il * c->E + e) % n) != d) continue;
                int *fd = &out_fds[d * st->n_files + l->file];
                if (*fd < 0) {
                    char p[4096];
                    snprintf(p, sizeof p, "%s/%s", dirs[d], place_base_name(st->paths[l->file]));
                    *fd = open(p, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
                    if (*fd < 0 || ftruncate(*fd, (off_t)st->files[l->file].size) != 0) {
                        df_err_set(err, DF_ERR_IO, -1, "%s: cannot create: %s", p, strerror(errno));
                        goto done;
                    }
                }
                /* contiguous experts in one range, others tensor by tensor */
                int r = 0;
                if (l->contiguous) r = copy_range(in_fds[l->file], *fd, l->offset, st->expert_bytes, buf, cap);
                for (int k = 0; !l->contiguous && !r && k < EX_N; k++)
                    r = copy_range(in_fds[l->file], *fd, l->src[k], st->sizes[k], buf, cap);
                if (r) {
                    df_err_set(err, DF_ERR_IO, -1, "copying layer %d expert %d to %s failed: %s", il, e, dirs[d],
                               strerror(-r));
                    goto done;
                }
                done_bytes += st->expert_bytes;
            }
            if (progress) progress(ctx, done_bytes, total);
        }
    }
    for (int d = 0; d < n; d++) {
        for (int f = 0; f < st->n_files; f++) {
            int fd = out_fds[d * st->n_files + f];
            if (fd >= 0 && fsync(fd) != 0) {
                df_err_set(err, DF_ERR_IO, -1, "%s: fsync failed: %s", dirs[d], strerror(errno));
                goto done;
            }
        }
        char m[4096], tmp[4200];
        snprintf(m, sizeof m, "%s/" PLACE_MANIFEST, dirs[d]);
        snprintf(tmp, sizeof tmp, "%s.tmp", m);
        FILE *fp = fopen(tmp, "w");
        if (!fp) {
            df_err_set(err, DF_ERR_IO, -1, "%s: cannot create: %s", tmp, strerror(errno));
            goto done;
        }
        fprintf(fp, "{\"deltafin_place\":1,\"mode\":\"%s\",\"experts_per_layer\":%d,\"shards\":{", stripe ? "stripe" : "replicate", c->E);
        int first = 1;
        for (int f = 0; f < st->n_files; f++)
            if (out_fds[d * st->n_files + f] >= 0) {
                fprintf(fp, "%s\"%s\":%llu", first ? "" : ",", place_base_name(st->paths[f]),
                        (unsigned long long)st->files[f].size);
                first = 0;
            }
        fprintf(fp, "},\"layers\":{");
        first = 1;
        for (int il = 0; il < c->NL; il++) {
            if (!c->layer_moe[il]) continue;
            fprintf(fp, "%s\"%d\":[", first ? "" : ",", il);
            first = 0;
            int fe = 1;
            for (int e = 0; e < c->E; e++)
                if (!stripe || ((il * c->E + e) % n) == d) {
                    fprintf(fp, "%s%d", fe ? "" : ",", e);
                    fe = 0;
                }
            fprintf(fp, "]");
        }
        fprintf(fp, "}}\n");
        if (fflush(fp) != 0 || fsync(fileno(fp)) != 0 || fclose(fp) != 0 || rename(tmp, m) != 0) {
            df_err_set(err, DF_ERR_IO, -1, "%s: cannot write the manifest: %s", m, strerror(errno));
            goto done;
        }
    }
    rc = 0;
done:
    for (int i = 0; i < n * st->n_files; i++)
        if (out_fds[i] >= 0) close(out_fds[i]);
    for (int f = 0; f < st->n_files; f++)
        if (in_fds[f] >= 0) close(in_fds[f]);
    free(out_fds);
    free(in_fds);
    free(buf);
    df_engine_close(eng);
    return rc;
}
