/* trunk_stream.c - the trunk from disk, layer by layer, when it does not fit
 * the memory budget (K3's trunk is ~120 GB).
 *
 * Two buffers, each large enough for the biggest layer's trunk matrices (the
 * output head counts as layer NL): while layer L computes from one, layer
 * L + 1 is read into the other, with one aligned read per tensor through its
 * own io_queue (so expert reads and trunk reads never wait for each other's
 * completions).  Starting a layer waits for its reads and re-points the
 * layer's wmat views into the buffer; the values are the file's bytes, so
 * results are bit-identical to the mapped trunk.  The embedding stays mapped
 * (a token touches one row).  Small vectors are owned copies already.
 */
#define _GNU_SOURCE
#include "engine_impl.h"
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static int cmp_layer(const void *a, const void *b)
{
    const trunk_tensor *x = a, *y = b;
    return x->layer - y->layer;
}

/* Lay out every layer's tensors in a buffer; returns the largest layer. */
static uint64_t layout(df_engine *eng)
{
    int NL = eng->m.cfg.NL;
    qsort(eng->m.trunk, (size_t)eng->m.n_trunk, sizeof *eng->m.trunk, cmp_layer);
    uint64_t best = 0;
    for (int i = 0; i < eng->m.n_trunk;) {
        int L = eng->m.trunk[i].layer, j = i;
        uint64_t at = 0;
        for (; j < eng->m.n_trunk && eng->m.trunk[j].layer == L; j++) {
            trunk_tensor *t = &eng->m.trunk[j];
            uint64_t a0 = align_down(t->off, DF_DIRECT_ALIGN), a1 = align_up(t->off + t->nbytes, DF_DIRECT_ALIGN);
            t->buf_off = at;
            t->lead = (uint32_t)(t->off - a0);
            at += a1 - a0;
        }
        if (L >= 0 && L <= NL && at > best) best = at;
        i = j;
    }
    return best;
}

uint64_t trunk_stream_buffer_bytes(const df_engine *eng)
{
    /* layout sorts, so work on a copy's worth of arithmetic instead */
    int NL = eng->m.cfg.NL;
    uint64_t *per = xcalloc((size_t)NL + 1, sizeof *per), best = 0;
    for (int i = 0; i < eng->m.n_trunk; i++) {
        const trunk_tensor *t = &eng->m.trunk[i];
        if (t->layer < 0) continue;
        per[t->layer] += align_up(t->off + t->nbytes, DF_DIRECT_ALIGN) - align_down(t->off, DF_DIRECT_ALIGN);
    }
    for (int L = 0; L <= NL; L++)
        if (per[L] > best) best = per[L];
    free(per);
    return best;
}

int trunk_stream_init(df_engine *eng, df_error *err)
{
    trunk_stream *ts = &eng->ts;
    int NL = eng->m.cfg.NL;
    ts->buf_bytes = layout(eng);
    ts->first = xmalloc(((size_t)NL + 2) * sizeof *ts->first);
    for (int L = 0, i = 0; L <= NL + 1; L++) {
        while (i < eng->m.n_trunk && eng->m.trunk[i].layer < L) i++;
        ts->first[L] = i;
    }
    for (int b = 0; b < 2; b++) {
        ts->buf[b] = aligned_alloc_raw(ts->buf_bytes ? ts->buf_bytes : 4096);
        ts->buf_layer[b] = -1;
        if (!ts->buf[b])
            return df_err_set(err, DF_ERR_NOMEM, -1, "cannot allocate two trunk buffers of %.2f GiB",
                              ts->buf_bytes / (double)(1u << 30));
    }
    ts->files = xcalloc((size_t)eng->m.n_shards, sizeof *ts->files);
    for (int s = 0; s < eng->m.n_shards; s++) ts->files[s].fd = -1;
    for (int s = 0; s < eng->m.n_shards; s++)
        if (df_file_open(&ts->files[s], eng->m.shards[s].path, eng->m.io_mode, err)) return -1;
    ts->q = io_queue_new(16, eng->m.io_backend, err);
    if (!ts->q) return -1;
    ts->on = 1;
    return 0;
}

/* A file mapping is made of 4 KiB page-cache pages: streaming through it
 * costs a TLB miss every 4 KiB and stops the hardware prefetchers at each
 * page boundary.  The same bytes in anonymous memory with transparent huge
 * pages read at full memory speed (decode is a scan of the trunk), so a
 * resident trunk is copied once at open.  The file's own pages stay in the
 * page cache only as clean, reclaimable pages. */
int trunk_load_resident(df_engine *eng, df_error *err)
{
    trunk_stream *ts = &eng->ts;
    const uint64_t HUGE = 2u << 20;
    uint64_t total = 0;
    for (int i = 0; i < eng->m.n_trunk; i++)
        if (eng->m.trunk[i].layer >= 0) total += align_up(eng->m.trunk[i].nbytes, 64);
    if (!total) return 0;
    size_t len = (size_t)align_up(total, HUGE) + (size_t)HUGE;
    void *m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED)
        return df_err_set(err, DF_ERR_NOMEM, -1, "cannot allocate %.2f GiB for the resident trunk",
                          total / 1073741824.0);
    uint8_t *base = (uint8_t *)align_up((uint64_t)(uintptr_t)m, HUGE);
    madvise(base, (size_t)align_up(total, HUGE), MADV_HUGEPAGE);
    int *fds = xmalloc((size_t)eng->m.n_shards * sizeof *fds);
    for (int s = 0; s < eng->m.n_shards; s++) fds[s] = -1;
    uint64_t at = 0;
    int rc = 0;
    for (int i = 0; i < eng->m.n_trunk && !rc; i++) {
        trunk_tensor *t = &eng->m.trunk[i];
        if (t->layer < 0) continue;
        if (fds[t->shard] < 0 && (fds[t->shard] = open(eng->m.shards[t->shard].path, O_RDONLY | O_CLOEXEC)) < 0) {
            rc = df_err_set(err, DF_ERR_IO, -1, "%s: cannot open: %s", eng->m.shards[t->shard].path, strerror(errno));
            break;
        }
        for (uint64_t got = 0; got < t->nbytes;) {
            ssize_t r = pread(fds[t->shard], base + at + got, (size_t)(t->nbytes - got), (off_t)(t->off + got));
            if (r < 0 && errno == EINTR) continue;
            if (r <= 0) {
                rc = df_err_set(err, DF_ERR_IO, (int64_t)(t->off + got), "%s: reading the trunk failed: %s",
                                eng->m.shards[t->shard].path, r < 0 ? strerror(errno) : "unexpected end of file");
                break;
            }
            got += (uint64_t)r;
        }
        t->w->data = base + at;
        at += align_up(t->nbytes, 64);
    }
    for (int s = 0; s < eng->m.n_shards; s++)
        if (fds[s] >= 0) close(fds[s]);
    free(fds);
    ts->resident = base;
    ts->resident_map = m;
    ts->resident_bytes = len;
    return rc;
}

void trunk_stream_deinit(df_engine *eng)
{
    trunk_stream *ts = &eng->ts;
    if (ts->resident_map) munmap(ts->resident_map, ts->resident_bytes);
    io_queue_free(ts->q);
    for (int s = 0; ts->files && s < eng->m.n_shards; s++) df_file_close(&ts->files[s]);
    free(ts->files);
    aligned_free(ts->buf[0]);
    aligned_free(ts->buf[1]);
    free(ts->first);
    memset(ts, 0, sizeof *ts);
}

static void submit(df_engine *eng, int L, int b)
{
    trunk_stream *ts = &eng->ts;
    io_req reqs[64];
    int n = 0;
    ts->buf_layer[b] = L;
    for (int i = ts->first[L]; i < ts->first[L + 1]; i++) {
        const trunk_tensor *t = &eng->m.trunk[i];
        uint64_t a0 = align_down(t->off, DF_DIRECT_ALIGN), a1 = align_up(t->off + t->nbytes, DF_DIRECT_ALIGN);
        reqs[n++] = (io_req){.fd = ts->files[t->shard].fd, .off = a0, .len = (size_t)(a1 - a0),
                             .buf = ts->buf[b] + t->buf_off, .tag = b};
        if (n == 64) {
            io_queue_submit(ts->q, reqs, n);
            ts->buf_pending[b] += n;
            n = 0;
        }
    }
    io_queue_submit(ts->q, reqs, n);
    ts->buf_pending[b] += n;
}

static int wait_buffer(df_engine *eng, int b, df_error *err)
{
    trunk_stream *ts = &eng->ts;
    double t0 = now_sec();
    int rc = 0;
    while (ts->buf_pending[b] > 0) {
        io_done d[16];
        int got = io_queue_wait(ts->q, d, 16);
        for (int i = 0; i < got; i++) {
            ts->buf_pending[d[i].tag]--;
            if (d[i].result < 0) rc = -1;
            else ts->bytes_read += (uint64_t)d[i].result;
        }
        if (!got) break;
    }
    ts->wait_sec += now_sec() - t0;
    if (rc) {
        df_err_set(err, DF_ERR_IO, -1, "reading the trunk of layer %d failed", ts->buf_layer[b]);
        ts->buf_layer[b] = -1;
        return -1;
    }
    return 0;
}

int trunk_stream_ready(df_engine *eng, int il, df_error *err)
{
    trunk_stream *ts = &eng->ts;
    int b = ts->buf_layer[0] == il ? 0 : ts->buf_layer[1] == il ? 1 : -1;
    if (b < 0) {
        /* not requested yet: take the buffer not holding the previous layer */
        int prev = il == 0 ? eng->m.cfg.NL : il - 1;
        b = ts->buf_layer[0] == prev ? 1 : 0;
        if (wait_buffer(eng, b, err)) return -1; /* its old reads must land first */
        submit(eng, il, b);
    }
    if (wait_buffer(eng, b, err)) return -1;
    for (int i = ts->first[il]; i < ts->first[il + 1]; i++) {
        trunk_tensor *t = &eng->m.trunk[i];
        t->w->data = ts->buf[b] + t->buf_off + t->lead;
    }
    return 0;
}

int trunk_stream_layer(df_engine *eng, int il, df_error *err)
{
    trunk_stream *ts = &eng->ts;
    if (trunk_stream_ready(eng, il, err)) return -1;
    int next = il == eng->m.cfg.NL ? 0 : il + 1;
    int b = ts->buf_layer[0] == il ? 1 : 0;
    if (ts->buf_layer[b] != next) {
        if (wait_buffer(eng, b, err)) return -1;
        submit(eng, next, b);
    }
    return 0;
}
