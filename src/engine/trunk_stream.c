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
 * Partial residency (the plan's trunk_resident_layer): the layers the plan
 * keeps are copied into memory once, like a resident trunk, and only the
 * others go through the buffers, which are then sized for the largest of
 * those; after each layer the next *streamed* one starts loading, so it
 * reads while the resident layers in between compute.  The values are the
 * same bytes either way: any split gives the same logits.
 */
#define _GNU_SOURCE
#include "engine_impl.h"
#include "file.h"
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

/* Lay out every layer's tensors in a buffer; returns the largest layer
 * that is streamed (res: the resident layers, or NULL). */
static uint64_t layout(df_engine *eng, const uint8_t *res)
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
        if (L >= 0 && L <= NL && at > best && !(res && res[L])) best = at;
        i = j;
    }
    return best;
}

void trunk_layer_sizes(const df_engine *eng, uint64_t *bytes, uint64_t *span)
{
    int NL = eng->m.cfg.NL;
    memset(bytes, 0, ((size_t)NL + 1) * sizeof *bytes);
    memset(span, 0, ((size_t)NL + 1) * sizeof *span);
    for (int i = 0; i < eng->m.n_trunk; i++) {
        const trunk_tensor *t = &eng->m.trunk[i];
        if (t->layer < 0 || t->layer > NL) continue;
        bytes[t->layer] += t->nbytes;
        span[t->layer] += align_up(t->off + t->nbytes, DF_DIRECT_ALIGN) - align_down(t->off, DF_DIRECT_ALIGN);
    }
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

static int load_copy(df_engine *eng, const uint8_t *res, df_error *err);

int trunk_stream_init(df_engine *eng, const uint8_t *resident, df_error *err)
{
    trunk_stream *ts = &eng->ts;
    int NL = eng->m.cfg.NL;
    int any = 0;
    for (int L = 0; resident && L <= NL; L++) any |= resident[L];
    if (any) {
        ts->res = xcalloc((size_t)NL + 1, 1);
        memcpy(ts->res, resident, (size_t)NL + 1);
    }
    ts->buf_bytes = layout(eng, ts->res);
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
    return ts->res ? load_copy(eng, ts->res, err) : 0;
}

/* A file mapping is made of 4 KiB page-cache pages: streaming through it
 * costs a TLB miss every 4 KiB and stops the hardware prefetchers at each
 * page boundary.  The same bytes in anonymous memory with transparent huge
 * pages read at full memory speed (decode is a scan of the trunk), so a
 * resident trunk is copied once at open.  The file's own pages stay in the
 * page cache only as clean, reclaimable pages. */
int trunk_load_resident(df_engine *eng, df_error *err) { return load_copy(eng, NULL, err); }

/* The copy of the layers res[] marks (NULL: every layer): the whole trunk
 * starts on a 2 MiB boundary (what the plan's resident trunk allows); a
 * partly resident one takes exactly its pages (the plan counts each kept
 * layer at its aligned-read size, which bounds its copy). */
static int load_copy(df_engine *eng, const uint8_t *res, df_error *err)
{
    trunk_stream *ts = &eng->ts;
    const uint64_t HUGE = res ? 4096u : 2u << 20;
    uint64_t total = 0;
    for (int i = 0; i < eng->m.n_trunk; i++)
        if (eng->m.trunk[i].layer >= 0 && !(res && !res[eng->m.trunk[i].layer]))
            total += align_up(eng->m.trunk[i].nbytes, 64);
    if (!total) return 0;
    size_t len = (size_t)align_up(total, HUGE) + (res ? 0 : (size_t)HUGE);
    void *m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED)
        return df_err_set(err, DF_ERR_NOMEM, -1, "cannot allocate %.2f GiB for the resident trunk",
                          total / 1073741824.0);
    uint8_t *base = (uint8_t *)align_up((uint64_t)(uintptr_t)m, HUGE);
    df_mem_hugepages(base, (size_t)align_up(total, HUGE));
    int *fds = xmalloc((size_t)eng->m.n_shards * sizeof *fds);
    for (int s = 0; s < eng->m.n_shards; s++) fds[s] = -1;
    uint64_t at = 0;
    int rc = 0;
    for (int i = 0; i < eng->m.n_trunk && !rc; i++) {
        trunk_tensor *t = &eng->m.trunk[i];
        if (t->layer < 0 || (res && !res[t->layer])) continue;
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
    free(ts->res);
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
    if (ts->res && ts->res[il]) return 0; /* its views point into the resident copy */
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
    int NL = eng->m.cfg.NL;
    if (trunk_stream_ready(eng, il, err)) return -1;
    /* the next streamed layer (after the output head comes layer 0) */
    int next = il;
    do next = next == NL ? 0 : next + 1;
    while (ts->res && ts->res[next] && next != il);
    if (ts->buf_layer[0] == next || ts->buf_layer[1] == next) return 0;
    /* into the buffer not holding il (any, when il is resident: the
     * streamed layers before it are done) */
    int b = ts->buf_layer[0] == il ? 1 : 0;
    if (wait_buffer(eng, b, err)) return -1;
    submit(eng, next, b);
    return 0;
}
