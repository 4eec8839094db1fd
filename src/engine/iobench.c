/* iobench.c - the device's own read bandwidth, measured the way the engine
 * reads experts: one aligned read of `chunk` bytes per request, `depth`
 * requests in flight, O_DIRECT (or buffered), through the same io_queue.
 * Offsets are random (4 KiB aligned) over the regular files of a directory
 * (its *.safetensors shards when it is a model), so the figure is the
 * ceiling that `deltafin run --stats` compares its expert GB/s against.
 */
#define _GNU_SOURCE
#include "engine.h"
#include "file.h"
#include "util.h"

#include <dirent.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static uint64_t rng_next(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

int df_iobench(const char *dir, const df_iobench_opts *o, df_iobench_result *r, df_error *err)
{
    memset(r, 0, sizeof *r);
    size_t chunk = o->chunk_bytes ? o->chunk_bytes : (size_t)17547264;
    chunk = (size_t)align_up(chunk, DF_DIRECT_ALIGN);
    int depth = o->depth > 0 ? o->depth : 32;
    double seconds = o->seconds > 0 ? o->seconds : 5.0;
    DIR *d = opendir(dir);
    if (!d) return df_err_set(err, DF_ERR_IO, -1, "%s: cannot open directory: %s", dir, strerror(errno));
    df_file files[256];
    int n_files = 0, any_st = 0;
    struct dirent *de;
    /* prefer shards: a model directory also holds small json files */
    while ((de = readdir(d)))
        if (strstr(de->d_name, ".safetensors") && !strstr(de->d_name, ".json")) any_st = 1;
    rewinddir(d);
    int rc = -1;
    while ((de = readdir(d)) && n_files < 256) {
        if (de->d_name[0] == '.') continue;
        if (any_st && (!strstr(de->d_name, ".safetensors") || strstr(de->d_name, ".json"))) continue;
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        struct stat st;
        if (stat(path, &st) || !S_ISREG(st.st_mode) || (uint64_t)st.st_size < chunk + DF_DIRECT_ALIGN) continue;
        if (df_file_open(&files[n_files], path, o->buffered ? IO_BUFFERED : IO_DIRECT, err)) goto done;
        n_files++;
    }
    if (!n_files) {
        df_err_set(err, DF_ERR_ARG, -1, "%s: no file larger than one %zu-byte read", dir, chunk);
        goto done;
    }
    io_queue *q = io_queue_new(depth, IO_BACKEND_AUTO, err);
    if (!q) goto done;
    uint8_t *bufs = aligned_alloc_raw((size_t)depth * chunk);
    if (!bufs) {
        io_queue_free(q);
        df_err_set(err, DF_ERR_NOMEM, -1, "cannot allocate %d read buffers of %zu bytes", depth, chunk);
        goto done;
    }
    uint64_t seed = 0x9E3779B97F4A7C15ull;
    double t0 = now_sec(), t_end = t0 + seconds;
    int issued = 0;
    io_req req;
    for (int i = 0; i < depth; i++) {
        df_file *f = &files[issued % n_files];
        uint64_t span = (f->size - chunk) / DF_DIRECT_ALIGN;
        req = (io_req){.fd = f->fd, .off = (rng_next(&seed) % (span + 1)) * DF_DIRECT_ALIGN, .len = chunk,
                       .buf = bufs + (size_t)i * chunk, .tag = i};
        io_queue_submit(q, &req, 1);
        issued++;
    }
    while (io_queue_in_flight(q)) {
        io_done dn[64];
        int got = io_queue_wait(q, dn, 64);
        for (int j = 0; j < got; j++) {
            if (dn[j].result < 0) {
                df_err_set(err, DF_ERR_IO, -1, "read failed: %s", strerror((int)-dn[j].result));
                continue;
            }
            r->bytes += (uint64_t)dn[j].result;
            r->reads++;
            if (now_sec() < t_end && !err->code) {
                df_file *f = &files[issued % n_files];
                uint64_t span = (f->size - chunk) / DF_DIRECT_ALIGN;
                req = (io_req){.fd = f->fd, .off = (rng_next(&seed) % (span + 1)) * DF_DIRECT_ALIGN, .len = chunk,
                               .buf = bufs + (size_t)dn[j].tag * chunk, .tag = dn[j].tag};
                if (!files[issued % n_files].direct) df_file_dontneed(f, 0, 0);
                io_queue_submit(q, &req, 1);
                issued++;
            }
        }
    }
    r->seconds = now_sec() - t0;
    r->gbps = r->bytes / r->seconds / 1e9;
    r->chunk_bytes = chunk;
    r->depth = depth;
    r->direct = files[0].direct;
    snprintf(r->backend, sizeof r->backend, "%s", io_queue_backend(q));
    aligned_free(bufs);
    io_queue_free(q);
    rc = err->code ? -1 : 0;
done:
    for (int i = 0; i < n_files; i++) df_file_close(&files[i]);
    closedir(d);
    return rc;
}
