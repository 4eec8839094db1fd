/* expert_store.c - see expert_store.h.
 *
 * Tags: the caller's tag is packed with (layer, expert) into the io_req tag
 * so that a failed read can name its expert; only the caller's part is
 * handed back.  The aligned span may run past the end of the file (the last
 * expert of a shard); O_DIRECT then returns a short count, which is fine as
 * long as the expert's own bytes arrived.
 */
#define _GNU_SOURCE
#include "expert_store.h"
#include "expert_remote.h"
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static const char *tensor_names[EX_N] = {"w1.weight_packed", "w1.weight_scale", "w2.weight_packed",
                                         "w2.weight_scale", "w3.weight_packed", "w3.weight_scale"};

void expert_store_init(expert_store *s, int n_layers, int n_experts, int I, int Lt)
{
    /* w1 and w3 are [I, Lt], w2 [Lt, I]: packed bytes, then E8M0 scales */
    const uint32_t sizes[EX_N] = {(uint32_t)(I * Lt / 2), (uint32_t)(I * Lt / 32), (uint32_t)(Lt * I / 2),
                                  (uint32_t)(Lt * I / 32), (uint32_t)(I * Lt / 2), (uint32_t)(I * Lt / 32)};
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
    s->slot_bytes = (size_t)align_up(off, DF_DIRECT_ALIGN) + DF_DIRECT_ALIGN;
}

static const char *piece_names[3] = {"ffn_gate_exps", "ffn_down_exps", "ffn_up_exps"};

/* GGUF pieces: the slot holds each piece's largest slice (over the MoE
 * layers, or all when moe_layer is NULL); an expert's bytes are the mean
 * over the MoE layers of its three slices (what a cold token reads per
 * expert on average: exact for the planner's per-layer sum). */
static void gg_size_slots(expert_store *s, const uint8_t *moe_layer)
{
    uint32_t mx = 0;
    uint64_t sum = 0, n = 0;
    for (int p = 0; p < 3; p++) s->piece_bytes[p] = 0;
    for (int il = 0; il < s->n_layers; il++) {
        if (moe_layer && !moe_layer[il]) continue;
        n++;
        for (int p = 0; p < 3; p++) {
            uint32_t b = s->gg_bytes[il * 3 + p];
            if (b > s->piece_bytes[p]) s->piece_bytes[p] = b;
            if (b > mx) mx = b;
            sum += b;
        }
    }
    s->piece_slot = (size_t)align_up(mx, DF_DIRECT_ALIGN) + DF_DIRECT_ALIGN;
    s->slot_bytes = 3 * s->piece_slot;
    if (n) s->expert_bytes = (sum + n - 1) / n;
}

void expert_store_set_piece_type(expert_store *s, int il, int piece, uint32_t type, uint32_t bytes)
{
    CHECK(s->ggml && il >= 0 && il < s->n_layers && piece >= 0 && piece < 3);
    s->gg_type[il * 3 + piece] = type;
    s->gg_bytes[il * 3 + piece] = bytes;
}

void expert_store_init_ggml(expert_store *s, int n_layers, int n_experts, int I, int Lt)
{
    expert_store_init(s, n_layers, n_experts, I, Lt);
    CHECK(n_layers <= 2048 && n_experts <= 65536);
    s->ggml = 1;
    int rows[3] = {I, Lt, I}, cols[3] = {Lt, I, Lt};
    s->gg_type = xcalloc((size_t)n_layers * 3, sizeof *s->gg_type);
    s->gg_bytes = xcalloc((size_t)n_layers * 3, sizeof *s->gg_bytes);
    for (int il = 0; il < n_layers; il++)
        for (int p = 0; p < 3; p++)
            expert_store_set_piece_type(s, il, p, 39 /* GGML_TYPE_MXFP4 */,
                                        (uint32_t)((uint64_t)rows[p] * (uint64_t)(cols[p] / 32) * 17));
    gg_size_slots(s, NULL);
    size_t nk = (size_t)n_layers * (size_t)n_experts;
    s->gg_left = xcalloc(nk, 1);
    s->gg_bad = xcalloc(nk, 1);
    for (size_t i = 0; i < nk; i++)
        for (int p = 0; p < 3; p++) s->loc[i].psrc[p] = UINT64_MAX;
}

void expert_store_set_piece(expert_store *s, int il, int e, int piece, int file, uint64_t off)
{
    expert_loc *l = &s->loc[(size_t)il * (size_t)s->n_experts + (size_t)e];
    l->file = file;
    l->pfile[piece] = file;
    l->psrc[piece] = off;
}

int expert_store_add_file(expert_store *s, const char *path, df_error *err)
{
    (void)err;
    for (int i = 0; i < s->n_files; i++)
        if (!strcmp(s->paths[i], path)) return i;
    s->paths = xrealloc(s->paths, (size_t)(s->n_files + 1) * sizeof *s->paths);
    s->paths[s->n_files] = xstrdup(path);
    return s->n_files++;
}

void expert_store_set(expert_store *s, int il, int e, int which, int file, uint64_t off)
{
    expert_loc *l = &s->loc[(size_t)il * (size_t)s->n_experts + (size_t)e];
    l->file = file;
    l->src[which] = off;
}

/* Are any of the pages of [off, off + len) in the page cache?  mincore on
 * a mapping that is never touched: it reads nothing and, unlike a
 * non-blocking read, starts no readahead (which would warm the very pages
 * the probe is about to time). */
static int span_cached(int fd, uint64_t off, uint64_t len)
{
    uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE), a = off & ~(page - 1);
    size_t n = (size_t)(off + len - a);
    void *m = mmap(NULL, n, PROT_READ, MAP_SHARED, fd, (off_t)a);
    if (m == MAP_FAILED) return 0;
    unsigned char vec[512];
    size_t pages = (n + page - 1) / page;
    int hit = 0;
    for (size_t p0 = 0; p0 < pages && !hit; p0 += sizeof vec) {
        size_t k = pages - p0 < sizeof vec ? pages - p0 : sizeof vec;
        size_t bytes = p0 + k == pages ? n - p0 * page : k * page;
        if (mincore((uint8_t *)m + p0 * page, bytes, vec) != 0) break;
        for (size_t i = 0; i < k; i++) hit |= vec[i] & 1;
    }
    munmap(m, n);
    return hit;
}

/* Time n reads of the experts keys[0..n) through fds (direct: aligned spans),
 * all in flight at once, after dropping them from the page cache.  Returns
 * bytes per second, or 0 on any failure. */
static double time_reads(expert_store *s, const size_t *keys, int n, int direct, uint8_t *buf)
{
    io_req reqs[8];
    for (int i = 0; i < n; i++) {
        const expert_loc *l = &s->loc[keys[i]];
        int fd = s->plain_fds[l->file];
        /* a freshly written model's pages are dirty, and DONTNEED drops
         * only clean pages: write them back first, or the buffered probe
         * reads from memory and buffered reads look faster than the drive */
        df_fd_writeback(fd, l->span_off, l->span_len);
        df_fd_dontneed(fd, l->span_off, l->span_len);
        if (!direct && span_cached(fd, l->offset, s->expert_bytes)) s->probe_warm++;
        reqs[i] = direct ? (io_req){.fd = s->files[l->file].fd, .off = l->span_off, .len = l->span_len,
                                    .buf = buf + (size_t)i * s->slot_bytes, .tag = i}
                         : (io_req){.fd = s->plain_fds[l->file], .off = l->offset, .len = (size_t)s->expert_bytes,
                                    .buf = buf + (size_t)i * s->slot_bytes, .tag = i};
    }
    double t0 = now_sec();
    io_queue_submit(s->q, reqs, n);
    uint64_t bytes = 0;
    int bad = 0;
    while (io_queue_in_flight(s->q)) {
        io_done d[8];
        int got = io_queue_wait(s->q, d, 8);
        for (int i = 0; i < got; i++) {
            if (d[i].result <= 0) bad = 1;
            else bytes += (uint64_t)d[i].result;
        }
    }
    double t = now_sec() - t0;
    for (int i = 0; i < n; i++) {
        const expert_loc *l = &s->loc[keys[i]];
        df_fd_dontneed(s->plain_fds[l->file], l->span_off, l->span_len);
    }
    return bad || t <= 0 ? 0.0 : (double)bytes / t;
}

/* IO_AUTO: O_DIRECT works here, but some devices are faster through the
 * page cache.  Read a few experts each way (different ones, so neither
 * finds the other's pages) and switch to buffered reads when they are
 * clearly (> 15 %) faster. */
static void choose_mode(expert_store *s, const uint8_t *moe_layer)
{
    if (!s->n_files || !s->files[0].direct) return;
    size_t keys[8];
    int n = 0;
    size_t nk = (size_t)s->n_layers * (size_t)s->n_experts;
    for (size_t k = 0; k < nk && n < 8; k += nk / 8 + 1)
        if (moe_layer[k / (size_t)s->n_experts] && s->loc[k].contiguous) keys[n++] = k;
    if (n < 4) return;
    uint8_t *buf = aligned_alloc_raw((size_t)(n / 2) * s->slot_bytes);
    if (!buf) return;
    double direct = time_reads(s, keys, n / 2, 1, buf);
    double buffered = time_reads(s, keys + n / 2, n / 2, 0, buf);
    aligned_free(buf);
    s->probe_direct_bps = direct;
    s->probe_buffered_bps = buffered;
    /* a probe that read from memory says nothing about the device */
    if (s->probe_warm || !(buffered > direct * 1.15) || direct <= 0) return;
    for (int i = 0; i < s->n_files; i++) {
        df_file f;
        df_error e2 = {0};
        if (df_file_open(&f, s->paths[i], IO_BUFFERED, &e2)) return;
        df_file_close(&s->files[i]);
        s->files[i] = f;
    }
}

int expert_store_finish(expert_store *s, const uint8_t *moe_layer, enum io_mode mode, int depth,
                        enum io_backend backend, df_error *err)
{
    s->mode = mode;
    s->files = xcalloc((size_t)(s->n_files ? s->n_files : 1), sizeof *s->files);
    s->plain_fds = xmalloc((size_t)(s->n_files ? s->n_files : 1) * sizeof *s->plain_fds);
    for (int i = 0; i < s->n_files; i++) s->files[i].fd = s->plain_fds[i] = -1;
    for (int i = 0; i < s->n_files; i++) {
        if (df_file_open(&s->files[i], s->paths[i], mode, err)) return -1;
        s->plain_fds[i] = open(s->paths[i], O_RDONLY | O_CLOEXEC);
        if (s->plain_fds[i] < 0)
            return df_err_set(err, DF_ERR_IO, -1, "%s: cannot open: %s", s->paths[i], strerror(errno));
    }
    if (s->ggml) gg_size_slots(s, moe_layer);
    for (int il = 0; s->ggml && il < s->n_layers; il++) {
        if (!moe_layer[il]) continue;
        for (int e = 0; e < s->n_experts; e++) {
            expert_loc *l = &s->loc[(size_t)il * (size_t)s->n_experts + (size_t)e];
            for (int p = 0; p < 3; p++) {
                if (l->file < 0 || l->psrc[p] == UINT64_MAX)
                    return df_err_set(err, DF_ERR_FORMAT, -1, "layer %d expert %d: %s is missing", il, e,
                                      piece_names[p]);
                uint64_t end = l->psrc[p] + s->gg_bytes[il * 3 + p];
                if (end > s->files[l->pfile[p]].size)
                    return df_err_set(err, DF_ERR_FORMAT, (int64_t)end,
                                      "%s: layer %d expert %d (%s) ends past the end of the file", s->paths[l->pfile[p]],
                                      il, e, piece_names[p]);
                l->pspan_off[p] = align_down(l->psrc[p], DF_DIRECT_ALIGN);
                l->pspan_len[p] = (uint32_t)(align_up(end, DF_DIRECT_ALIGN) - l->pspan_off[p]);
                l->plead[p] = (uint32_t)(l->psrc[p] - l->pspan_off[p]);
            }
            l->contiguous = 0;
            l->offset = l->psrc[0];
            l->lead = 0;
            uint32_t off = 0;
            for (int k = 0; k < EX_N; k++) {
                l->rel[k] = off;
                off += s->sizes[k];
            }
        }
    }
    for (int il = 0; !s->ggml && il < s->n_layers; il++) {
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
            if (hi > s->files[l->file].size)
                return df_err_set(err, DF_ERR_FORMAT, (int64_t)hi, "%s: layer %d expert %d ends past the end of the file",
                                  s->paths[l->file], il, e);
            l->contiguous = hi - lo == s->expert_bytes;
            if (l->contiguous) {
                l->offset = lo;
                l->span_off = align_down(lo, DF_DIRECT_ALIGN);
                l->span_len = (uint32_t)(align_up(hi, DF_DIRECT_ALIGN) - l->span_off);
                l->lead = (uint32_t)(lo - l->span_off);
                for (int k = 0; k < EX_N; k++) l->rel[k] = (uint32_t)(l->src[k] - lo);
            } else {
                uint32_t off = 0;
                l->lead = 0;
                for (int k = 0; k < EX_N; k++) {
                    l->rel[k] = off;
                    off += s->sizes[k];
                }
            }
        }
    }
    s->n_src = 1;
    s->q = io_queue_new(depth, backend, err);
    if (!s->q) return -1;
    if (mode == IO_AUTO && !s->stream) choose_mode(s, moe_layer); /* a stream's shards have no experts to time */
    return 0;
}

static int pread_plain(int fd, uint8_t *dst, uint64_t n, uint64_t off)
{
    uint64_t got = 0;
    while (got < n) {
        ssize_t r = pread(fd, dst + got, (size_t)(n - got), (off_t)(off + got));
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return -errno;
        if (r == 0) return -EIO;
        got += (uint64_t)r;
    }
    return 0;
}

/* tag layout: caller tag (32 bits) | source (4) | layer (12) | expert (16);
 * source REMOTE_SRC = a streamed install's disk cache or network */
#define REMOTE_SRC 15
static int64_t pack_tag(int64_t tag, int src, int il, int e)
{
    return (int64_t)(((uint64_t)(uint32_t)tag << 32) | ((uint64_t)src << 28) | ((uint64_t)(il & 0xFFF) << 16) |
                     (uint16_t)e);
}

int expert_store_set_sources(expert_store *s, const char *const *dirs, int n, const uint8_t *const *held,
                             const uint8_t *moe_layer, df_error *err)
{
    if (n < 1 || n > EXPERT_MAX_SOURCES - 1)
        return df_err_set(err, DF_ERR_ARG, -1, "between 1 and %d expert paths are supported", EXPERT_MAX_SOURCES - 1);
    if (s->ggml)
        return df_err_set(err, DF_ERR_UNSUPPORTED, -1,
                          "--expert-path works with safetensors models; a GGUF model reads its experts from the "
                          "GGUF file");
    if (s->stream)
        return df_err_set(err, DF_ERR_UNSUPPORTED, -1,
                          "--expert-path needs every expert on disk: a streamed install fetches them into its disk "
                          "cache instead (install it with setup --full)");
    size_t nk = (size_t)s->n_layers * (size_t)s->n_experts;
    s->holders = xcalloc(nk, 1);
    for (int d = 0; d < n; d++) {
        expert_source *src = &s->src[d + 1];
        src->dir = xstrdup(dirs[d]);
        src->files = xcalloc((size_t)s->n_files, sizeof *src->files);
        for (int f = 0; f < s->n_files; f++) src->files[f].fd = -1;
        for (size_t k = 0; k < nk; k++) {
            if (!held[d][k]) continue;
            const expert_loc *l = &s->loc[k];
            if (l->file < 0) continue;
            df_file *df = &src->files[l->file];
            if (df->fd < 0) {
                const char *base = strrchr(s->paths[l->file], '/');
                char path[4096];
                snprintf(path, sizeof path, "%s/%s", dirs[d], base ? base + 1 : s->paths[l->file]);
                if (df_file_open(df, path, s->mode, err)) return -1;
                if (df->size != s->files[l->file].size)
                    return df_err_set(err, DF_ERR_FORMAT, -1, "%s: %llu bytes, but the model's shard has %llu", path,
                                      (unsigned long long)df->size, (unsigned long long)s->files[l->file].size);
            }
            s->holders[k] |= (uint8_t)(1u << (d + 1));
        }
    }
    for (int il = 0; il < s->n_layers; il++)
        for (int e = 0; moe_layer[il] && e < s->n_experts; e++)
            if (!s->holders[(size_t)il * s->n_experts + (size_t)e])
                return df_err_set(err, DF_ERR_ARG, -1, "layer %d expert %d is in none of the expert paths", il, e);
    s->n_src = n + 1;
    return 0;
}

/* The source to read expert k from: the holder with the fewest reads in flight. */
static int pick_source(const expert_store *s, size_t k)
{
    if (!s->holders) return 0;
    int best = -1;
    for (int i = 1; i < s->n_src; i++)
        if ((s->holders[k] >> i) & 1)
            if (best < 0 || s->src[i].in_flight < s->src[best].in_flight ||
                (s->src[i].in_flight == s->src[best].in_flight && s->src[i].reads < s->src[best].reads))
                best = i;
    return best;
}

static const df_file *src_file(const expert_store *s, int src, int file)
{
    return src == 0 ? &s->files[file] : &s->src[src].files[file];
}

/* GGUF tag layout: caller tag (32) | source (3) | piece (2) | layer (11) | expert (16) */
static int64_t pack_tag_gg(int64_t tag, int src, int piece, int il, int e)
{
    return (int64_t)(((uint64_t)(uint32_t)tag << 32) | ((uint64_t)src << 29) | ((uint64_t)piece << 27) |
                     ((uint64_t)(il & 0x7FF) << 16) | (uint16_t)e);
}

static void queue_ggml(expert_store *s, int il, int e, uint8_t *slot, int64_t tag)
{
    size_t k = (size_t)il * (size_t)s->n_experts + (size_t)e;
    const expert_loc *l = &s->loc[k];
    CHECK(s->gg_left[k] == 0);
    s->gg_left[k] = 3;
    s->gg_bad[k] = 0;
    for (int p = 0; p < 3; p++) {
        const df_file *f = &s->files[l->pfile[p]];
        uint8_t *part = slot + (size_t)p * s->piece_slot;
        io_req r = {.fd = f->fd, .off = l->pspan_off[p], .len = l->pspan_len[p], .buf = part,
                    .tag = pack_tag_gg(tag, 0, p, il, e)};
        if (!f->direct) {
            r.off = l->psrc[p];
            r.len = s->gg_bytes[il * 3 + p];
            r.buf = part + l->plead[p];
        }
        s->src[0].in_flight++;
        CHECK(s->n_batch < EXPERT_BATCH_MAX);
        s->batch[s->n_batch++] = r;
    }
}

int expert_store_queue(expert_store *s, int il, int e, uint8_t *slot, int64_t tag, df_error *err)
{
    const expert_loc *l = &s->loc[(size_t)il * (size_t)s->n_experts + (size_t)e];
    CHECK(l->file >= 0 && tag >= 0 && tag <= UINT32_MAX);
    if (s->ggml) {
        queue_ggml(s, il, e, slot, tag);
        return 0;
    }
    if (s->remote) {
        int fd, direct;
        uint64_t off;
        int64_t t = pack_tag(tag, REMOTE_SRC, il, e);
        if (!expert_remote_lookup(s->remote, il, e, &fd, &off, &direct)) {
            expert_remote_queue_fetch(s->remote, il, e, slot, t);
            return 0;
        }
        io_req r = {.fd = fd, .off = off, .len = (size_t)align_up(l->lead + s->expert_bytes, DF_DIRECT_ALIGN),
                    .buf = slot, .tag = t};
        if (!direct) {
            r.off = off + l->lead;
            r.len = (size_t)s->expert_bytes;
            r.buf = slot + l->lead;
        }
        CHECK(s->n_batch < EXPERT_BATCH_MAX);
        s->batch[s->n_batch++] = r;
        return 0;
    }
    if (!l->contiguous) {
        for (int k = 0; k < EX_N; k++) {
            int rc = pread_plain(s->plain_fds[l->file], slot + l->rel[k], s->sizes[k], l->src[k]);
            if (rc)
                return df_err_set(err, DF_ERR_IO, (int64_t)l->src[k], "%s: reading layer %d expert %d %s failed: %s",
                                  s->paths[l->file], il, e, tensor_names[k], strerror(-rc));
            s->st.n_reads++;
            s->st.bytes_io += s->sizes[k];
        }
        s->st.bytes_read += s->expert_bytes;
        /* completes at once: hand the tag back through the next wait */
        io_req r = {.fd = -1, .tag = pack_tag(tag, 0, il, e)};
        CHECK(s->n_batch < EXPERT_BATCH_MAX);
        s->batch[s->n_batch++] = r;
        return 0;
    }
    int src = pick_source(s, (size_t)il * (size_t)s->n_experts + (size_t)e);
    const df_file *f = src_file(s, src, l->file);
    s->src[src].in_flight++;
    io_req r = {.fd = f->fd, .off = l->span_off, .len = l->span_len, .buf = slot, .tag = pack_tag(tag, src, il, e)};
    if (!f->direct) {
        /* buffered: read exactly the expert, into the same place in the slot */
        r.off = l->offset;
        r.len = (size_t)s->expert_bytes;
        r.buf = slot + l->lead;
    }
    CHECK(s->n_batch < EXPERT_BATCH_MAX);
    s->batch[s->n_batch++] = r;
    return 0;
}

static int req_before(const io_req *x, const io_req *y)
{
    return x->fd != y->fd ? x->fd < y->fd : x->off < y->off;
}

/* By (fd, offset), ties in submission order.  An insertion sort, not qsort:
 * this runs in the token loop, and glibc's qsort mallocs its merge buffer
 * (see the allocation guard in util.h).  A flush holds one group of a
 * layer's misses or predictions (hundreds of requests), so the quadratic
 * worst case stays small next to the reads it orders. */
static void sort_reqs(io_req *r, int n)
{
    for (int i = 1; i < n; i++) {
        io_req v = r[i];
        int j = i;
        for (; j > 0 && req_before(&v, &r[j - 1]); j--) r[j] = r[j - 1];
        r[j] = v;
    }
}

static void fetched(void *ud, int64_t tag, int il, int e, int ok)
{
    (void)il, (void)e;
    expert_store *s = ud;
    CHECK(s->n_sync_done < EXPERT_BATCH_MAX);
    s->sync_ok[s->n_sync_done] = (uint8_t)ok;
    s->sync_done[s->n_sync_done++] = tag;
    if (ok) {
        s->st.n_reads++;
        s->st.bytes_read += s->expert_bytes;
        s->st.bytes_io += s->expert_bytes;
    }
}

void expert_store_flush(expert_store *s)
{
    int n = 0;
    for (int i = 0; i < s->n_batch; i++) {
        if (s->batch[i].fd < 0) {
            CHECK(s->n_sync_done < EXPERT_BATCH_MAX);
            s->sync_ok[s->n_sync_done] = 1;
            s->sync_done[s->n_sync_done++] = s->batch[i].tag;
        } else s->batch[n++] = s->batch[i];
    }
    sort_reqs(s->batch, n);
    io_queue_submit(s->q, s->batch, n);
    s->n_batch = 0;
    /* a streamed install's misses: fetched now, while the cached ones read */
    if (s->remote) expert_remote_flush(s->remote, fetched, s);
}

int expert_store_in_flight(const expert_store *s) { return s->n_sync_done + io_queue_in_flight(s->q); }

static int store_reap(expert_store *s, int64_t *tags, int *ok, int max, df_error *err, int block);

int expert_store_wait(expert_store *s, int64_t *tags, int *ok, int max, df_error *err)
{
    return store_reap(s, tags, ok, max, err, 1);
}

int expert_store_poll(expert_store *s, int64_t *tags, int *ok, int max, df_error *err)
{
    return store_reap(s, tags, ok, max, err, 0);
}

static int store_reap(expert_store *s, int64_t *tags, int *ok, int max, df_error *err, int block)
{
    int n = 0;
    while (s->n_sync_done && n < max) {
        --s->n_sync_done;
        tags[n] = (int64_t)((uint64_t)s->sync_done[s->n_sync_done] >> 32);
        ok[n] = s->sync_ok[s->n_sync_done];
        if (!ok[n]) df_err_set(err, DF_ERR_IO, -1, "%s", s->remote ? expert_remote_error(s->remote) : "read failed");
        n++;
    }
    if (n || !io_queue_in_flight(s->q)) return n;
    io_done done[64];
    if (s->ggml && max > 64 / 3) max = 64 / 3; /* each piece may finish an expert */
again:;
    double t0 = now_sec();
    int got = block ? io_queue_wait(s->q, done, max < 64 ? max : 64) : io_queue_poll(s->q, done, max < 64 ? max : 64);
    if (block) s->st.wait_sec += now_sec() - t0;
    for (int i = 0; i < got && s->ggml; i++) {
        int p = (int)((done[i].tag >> 27) & 0x3);
        int il = (int)((done[i].tag >> 16) & 0x7FF), e = (int)(done[i].tag & 0xFFFF);
        size_t k = (size_t)il * (size_t)s->n_experts + (size_t)e;
        const expert_loc *l = &s->loc[k];
        const df_file *f = &s->files[l->pfile[p]];
        s->src[0].in_flight--;
        uint32_t pb = s->gg_bytes[il * 3 + p];
        uint64_t need = f->direct ? (uint64_t)l->plead[p] + pb : pb;
        if (done[i].result < 0 || (uint64_t)done[i].result < need) {
            if (!s->gg_bad[k])
                df_err_set(err, DF_ERR_IO, (int64_t)l->psrc[p], "%s: reading layer %d expert %d (%s) failed: %s",
                           f->path, il, e, piece_names[p],
                           done[i].result < 0 ? strerror((int)-done[i].result) : "short read (file truncated?)");
            s->gg_bad[k] = 1;
        } else {
            s->st.n_reads++;
            s->st.bytes_io += (uint64_t)done[i].result;
            s->src[0].reads++;
            s->src[0].bytes += (uint64_t)done[i].result;
            s->st.bytes_read += pb;
            if (!f->direct) df_file_dontneed(f, l->psrc[p], pb);
        }
        if (--s->gg_left[k]) continue;
        tags[n] = (int64_t)((uint64_t)done[i].tag >> 32);
        ok[n] = !s->gg_bad[k];
        n++;
    }
    for (int i = 0; i < got && !s->ggml; i++) {
        int src = (int)((done[i].tag >> 28) & 0xF);
        int il = (int)((done[i].tag >> 16) & 0xFFF), e = (int)(done[i].tag & 0xFFFF);
        const expert_loc *l = &s->loc[(size_t)il * (size_t)s->n_experts + (size_t)e];
        const df_file *f;
        if (src == REMOTE_SRC) {
            f = expert_remote_file(s->remote);
            expert_remote_read_done(s->remote, il, e);
        } else {
            f = src_file(s, src, l->file);
            s->src[src].in_flight--;
        }
        uint64_t need = f->direct ? (uint64_t)l->lead + s->expert_bytes : s->expert_bytes;
        tags[n] = (int64_t)((uint64_t)done[i].tag >> 32);
        if (done[i].result < 0 || (uint64_t)done[i].result < need) {
            df_err_set(err, DF_ERR_IO, (int64_t)l->offset, "%s: reading layer %d expert %d failed: %s", f->path, il,
                       e, done[i].result < 0 ? strerror((int)-done[i].result) : "short read (file truncated?)");
            ok[n++] = 0;
            continue;
        }
        s->st.n_reads++;
        s->st.bytes_read += s->expert_bytes;
        s->st.bytes_io += (uint64_t)done[i].result;
        if (src != REMOTE_SRC) {
            s->src[src].reads++;
            s->src[src].bytes += (uint64_t)done[i].result;
            if (!f->direct) df_file_dontneed(f, l->offset, s->expert_bytes);
        }
        ok[n++] = 1;
    }
    if (!n && got && io_queue_in_flight(s->q)) goto again; /* only pieces landed */
    if (!n && block && io_queue_in_flight(s->q)) goto again;
    return n;
}

void expert_store_deinit(expert_store *s)
{
    if (!s) return;
    expert_remote_close(s->remote);
    s->remote = NULL;
    io_queue_free(s->q);
    for (int i = 0; s->files && i < s->n_files; i++) {
        df_file_close(&s->files[i]);
        if (s->plain_fds[i] >= 0) close(s->plain_fds[i]);
    }
    for (int i = 0; i < s->n_files; i++) free(s->paths[i]);
    for (int d = 1; d < EXPERT_MAX_SOURCES; d++) { /* also sources of a failed set_sources */
        for (int f = 0; s->src[d].files && f < s->n_files; f++) df_file_close(&s->src[d].files[f]);
        free(s->src[d].files);
        free(s->src[d].dir);
    }
    free(s->holders);
    free(s->gg_left);
    free(s->gg_bad);
    free(s->gg_type);
    free(s->gg_bytes);
    free(s->files);
    free(s->plain_fds);
    free(s->paths);
    free(s->loc);
    memset(s, 0, sizeof *s);
}
