/* file.c - see file.h.
 *
 * The pread pool: submit appends to a fixed ring of pending requests; each
 * worker pops one, preads until done (resuming short reads, stopping at
 * EOF), and appends the completion to a fixed ring of results.  Rings are
 * sized at creation (IO_RING_CAP), so submitting and waiting never allocate.
 * The io_uring backend (built when liburing is available) keeps `depth`
 * reads in the kernel's submission queue and resubmits the rest of a short
 * read itself.
 */
#define _GNU_SOURCE
#include "file.h"
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#ifdef DF_HAVE_URING
#include <liburing.h>
#endif

#define IO_RING_CAP 8192

int df_file_open(df_file *f, const char *path, enum io_mode mode, df_error *err)
{
    memset(f, 0, sizeof *f);
    f->fd = -1;
    struct stat st;
    if (stat(path, &st) != 0) return df_err_set(err, DF_ERR_IO, -1, "%s: cannot stat: %s", path, strerror(errno));
    f->size = (uint64_t)st.st_size;
    if (mode != IO_BUFFERED) {
#if defined(O_DIRECT)
        int fd = open(path, O_RDONLY | O_CLOEXEC | O_DIRECT);
#elif defined(F_NOCACHE)
        /* macOS: reads that bypass the unified buffer cache */
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd >= 0 && fcntl(fd, F_NOCACHE, 1) != 0) {
            close(fd);
            fd = -1;
        }
#else
        int fd = -1;
#endif
        if (fd >= 0) {
            /* some file systems accept the flag and fail the read: probe one block */
            void *probe = aligned_alloc_raw(DF_DIRECT_ALIGN);
            ssize_t r = probe ? pread(fd, probe, DF_DIRECT_ALIGN, 0) : -1;
            aligned_free(probe);
            if (r >= 0) {
                f->fd = fd;
                f->direct = 1;
            } else {
                close(fd);
            }
        }
        if (f->fd < 0 && mode == IO_DIRECT)
            return df_err_set(err, DF_ERR_IO, -1, "%s: O_DIRECT reads are not supported here", path);
    }
    if (f->fd < 0) {
        f->fd = open(path, O_RDONLY | O_CLOEXEC);
        if (f->fd < 0) return df_err_set(err, DF_ERR_IO, -1, "%s: cannot open: %s", path, strerror(errno));
        df_fd_random(f->fd);
    }
    f->path = xstrdup(path);
    return 0;
}

void df_file_close(df_file *f)
{
    if (!f) return;
    if (f->fd >= 0) close(f->fd);
    free(f->path);
    f->fd = -1;
    f->path = NULL;
}

void df_file_dontneed(const df_file *f, uint64_t off, uint64_t len)
{
    if (!f->direct) df_fd_dontneed(f->fd, off, len);
}

void df_fd_dontneed(int fd, uint64_t off, uint64_t len)
{
#if defined(POSIX_FADV_DONTNEED)
    (void)posix_fadvise(fd, (off_t)off, (off_t)len, POSIX_FADV_DONTNEED);
#else
    (void)fd, (void)off, (void)len;
#endif
}

void df_fd_random(int fd)
{
#if defined(POSIX_FADV_RANDOM)
    (void)posix_fadvise(fd, 0, 0, POSIX_FADV_RANDOM);
#elif defined(F_RDAHEAD)
    (void)fcntl(fd, F_RDAHEAD, 0); /* macOS: no read-ahead */
#else
    (void)fd;
#endif
}

void df_fd_writeback(int fd, uint64_t off, uint64_t len)
{
#if defined(SYNC_FILE_RANGE_WRITE)
    (void)sync_file_range(fd, (off_t)off, (off_t)len,
                          SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE | SYNC_FILE_RANGE_WAIT_AFTER);
#else
    (void)off, (void)len;
    (void)fsync(fd);
#endif
}

void df_mem_hugepages(void *p, size_t len)
{
#if defined(MADV_HUGEPAGE)
    (void)madvise(p, len, MADV_HUGEPAGE);
#else
    (void)p, (void)len;
#endif
}

struct io_queue {
    enum io_backend backend;
    int depth;
    int in_flight;                     /* submitted, not yet returned by wait */
    /* pread pool */
    pthread_t *threads;
    int n_threads;
    pthread_mutex_t mu;
    pthread_cond_t have_work, have_done;
    io_req *pend;
    size_t pend_head, pend_count;
    io_done *done;
    size_t done_head, done_count;
    int stop;
#ifdef DF_HAVE_URING
    struct io_uring ring;
    io_req *uq;                         /* requests waiting for a kernel slot */
    size_t uq_head, uq_count;
    io_req *slots;                      /* [depth] request per kernel slot */
    uint64_t *slot_done;                /* bytes already read for the slot */
    int *free_slots;
    int n_free;
#endif
};

static int64_t pread_full(const io_req *r)
{
    size_t got = 0;
    while (got < r->len) {
        ssize_t n = pread(r->fd, (uint8_t *)r->buf + got, r->len - got, (off_t)(r->off + got));
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return -errno;
        if (n == 0) break;
        got += (size_t)n;
    }
    return (int64_t)got;
}

static void *io_worker(void *arg)
{
    io_queue *q = arg;
    alloc_guard_join_thread(); /* serves the token loop's reads */
    pthread_mutex_lock(&q->mu);
    for (;;) {
        while (!q->pend_count && !q->stop) pthread_cond_wait(&q->have_work, &q->mu);
        if (q->stop) break;
        io_req r = q->pend[q->pend_head];
        q->pend_head = (q->pend_head + 1) % IO_RING_CAP;
        q->pend_count--;
        pthread_mutex_unlock(&q->mu);
        int64_t res = pread_full(&r);
        pthread_mutex_lock(&q->mu);
        CHECK(q->done_count < IO_RING_CAP);
        q->done[(q->done_head + q->done_count) % IO_RING_CAP] = (io_done){.tag = r.tag, .result = res};
        q->done_count++;
        pthread_cond_signal(&q->have_done);
    }
    pthread_mutex_unlock(&q->mu);
    return NULL;
}

io_queue *io_queue_new(int depth, enum io_backend backend, df_error *err)
{
    if (depth < 1) depth = 1;
    if (depth > 256) depth = 256;
    io_queue *q = xcalloc(1, sizeof *q);
    q->depth = depth;
#ifdef DF_HAVE_URING
    if (backend != IO_BACKEND_THREADS) {
        int rc = io_uring_queue_init((unsigned)depth, &q->ring, 0);
        if (rc == 0) {
            q->backend = IO_BACKEND_URING;
            q->uq = xmalloc(IO_RING_CAP * sizeof *q->uq);
            q->slots = xcalloc((size_t)depth, sizeof *q->slots);
            q->slot_done = xcalloc((size_t)depth, sizeof *q->slot_done);
            q->free_slots = xmalloc((size_t)depth * sizeof *q->free_slots);
            for (int i = 0; i < depth; i++) q->free_slots[i] = depth - 1 - i;
            q->n_free = depth;
            q->done = xmalloc(IO_RING_CAP * sizeof *q->done);
            return q;
        }
        if (backend == IO_BACKEND_URING) {
            df_err_set(err, DF_ERR_UNSUPPORTED, -1, "io_uring is not available: %s", strerror(-rc));
            free(q);
            return NULL;
        }
    }
#else
    if (backend == IO_BACKEND_URING) {
        df_err_set(err, DF_ERR_UNSUPPORTED, -1, "this build has no io_uring support (liburing missing at build time)");
        free(q);
        return NULL;
    }
#endif
    q->backend = IO_BACKEND_THREADS;
    pthread_mutex_init(&q->mu, NULL);
    pthread_cond_init(&q->have_work, NULL);
    pthread_cond_init(&q->have_done, NULL);
    q->pend = xmalloc(IO_RING_CAP * sizeof *q->pend);
    q->done = xmalloc(IO_RING_CAP * sizeof *q->done);
    q->n_threads = depth;
    q->threads = xcalloc((size_t)depth, sizeof *q->threads);
    for (int i = 0; i < depth; i++) CHECK(pthread_create(&q->threads[i], NULL, io_worker, q) == 0);
    return q;
}

void io_queue_free(io_queue *q)
{
    if (!q) return;
    while (io_queue_in_flight(q)) {
        io_done d[64];
        io_queue_wait(q, d, 64);
    }
#ifdef DF_HAVE_URING
    if (q->backend == IO_BACKEND_URING) {
        io_uring_queue_exit(&q->ring);
        free(q->uq);
        free(q->slots);
        free(q->slot_done);
        free(q->free_slots);
        free(q->done);
        free(q);
        return;
    }
#endif
    pthread_mutex_lock(&q->mu);
    q->stop = 1;
    pthread_cond_broadcast(&q->have_work);
    pthread_mutex_unlock(&q->mu);
    for (int i = 0; i < q->n_threads; i++) pthread_join(q->threads[i], NULL);
    pthread_mutex_destroy(&q->mu);
    pthread_cond_destroy(&q->have_work);
    pthread_cond_destroy(&q->have_done);
    free(q->threads);
    free(q->pend);
    free(q->done);
    free(q);
}

const char *io_queue_backend(const io_queue *q)
{
    return q->backend == IO_BACKEND_URING ? "io_uring" : "pread threads";
}

int io_queue_in_flight(const io_queue *q) { return q->in_flight; }

#ifdef DF_HAVE_URING
static void uring_fill(io_queue *q)
{
    int added = 0;
    while (q->uq_count && q->n_free) {
        int s = q->free_slots[--q->n_free];
        q->slots[s] = q->uq[q->uq_head];
        q->slot_done[s] = 0;
        q->uq_head = (q->uq_head + 1) % IO_RING_CAP;
        q->uq_count--;
        struct io_uring_sqe *sqe = io_uring_get_sqe(&q->ring);
        CHECK(sqe);
        io_uring_prep_read(sqe, q->slots[s].fd, q->slots[s].buf, (unsigned)q->slots[s].len, q->slots[s].off);
        io_uring_sqe_set_data64(sqe, (uint64_t)s);
        added++;
    }
    if (added) io_uring_submit(&q->ring);
}
#endif

void io_queue_submit(io_queue *q, const io_req *reqs, int n)
{
    if (n <= 0) return;
#ifdef DF_HAVE_URING
    if (q->backend == IO_BACKEND_URING) {
        CHECK(q->uq_count + (size_t)n <= IO_RING_CAP);
        for (int i = 0; i < n; i++) q->uq[(q->uq_head + q->uq_count++) % IO_RING_CAP] = reqs[i];
        q->in_flight += n;
        uring_fill(q);
        return;
    }
#endif
    pthread_mutex_lock(&q->mu);
    CHECK(q->pend_count + (size_t)n <= IO_RING_CAP);
    for (int i = 0; i < n; i++) q->pend[(q->pend_head + q->pend_count++) % IO_RING_CAP] = reqs[i];
    q->in_flight += n;
    pthread_cond_broadcast(&q->have_work);
    pthread_mutex_unlock(&q->mu);
}

/* io_queue_wait (block) and io_queue_poll (return at once, maybe with none) */
static int queue_reap(io_queue *q, io_done *done, int max, int block)
{
    if (!q->in_flight || max <= 0) return 0;
#ifdef DF_HAVE_URING
    if (q->backend == IO_BACKEND_URING) {
        int got = 0;
        while (!got) {
            struct io_uring_cqe *cqe;
            if (!block) {
                if (io_uring_peek_cqe(&q->ring, &cqe) != 0) break;
            } else {
                int rc = io_uring_wait_cqe(&q->ring, &cqe);
                if (rc == -EINTR) continue;
                CHECK(rc == 0);
            }
            while (got < max && io_uring_peek_cqe(&q->ring, &cqe) == 0) {
                int s = (int)io_uring_cqe_get_data64(cqe);
                int res = cqe->res;
                io_uring_cqe_seen(&q->ring, cqe);
                io_req *r = &q->slots[s];
                int retry = res == -EINTR || res == -EAGAIN;
                if (retry || (res > 0 && q->slot_done[s] + (uint64_t)res < r->len)) {
                    /* interrupted or short read: ask for the rest in the same slot */
                    if (!retry) q->slot_done[s] += (uint64_t)res;
                    struct io_uring_sqe *sqe = io_uring_get_sqe(&q->ring);
                    CHECK(sqe);
                    io_uring_prep_read(sqe, r->fd, (uint8_t *)r->buf + q->slot_done[s],
                                       (unsigned)(r->len - q->slot_done[s]), r->off + q->slot_done[s]);
                    io_uring_sqe_set_data64(sqe, (uint64_t)s);
                    io_uring_submit(&q->ring);
                    continue;
                }
                int64_t total = res < 0 ? res : (int64_t)(q->slot_done[s] + (uint64_t)res);
                done[got++] = (io_done){.tag = r->tag, .result = total};
                q->free_slots[q->n_free++] = s;
                q->in_flight--;
            }
            uring_fill(q);
        }
        return got;
    }
#endif
    pthread_mutex_lock(&q->mu);
    while (block && !q->done_count) pthread_cond_wait(&q->have_done, &q->mu);
    int got = 0;
    while (got < max && q->done_count) {
        done[got++] = q->done[q->done_head];
        q->done_head = (q->done_head + 1) % IO_RING_CAP;
        q->done_count--;
    }
    q->in_flight -= got;
    pthread_mutex_unlock(&q->mu);
    return got;
}

int io_queue_wait(io_queue *q, io_done *done, int max) { return queue_reap(q, done, max, 1); }

int io_queue_poll(io_queue *q, io_done *done, int max)
{
#ifdef DF_HAVE_URING
    /* reads queued behind a full ring go out as the landed ones free slots */
    if (q->backend == IO_BACKEND_URING && q->in_flight) {
        int got = queue_reap(q, done, max, 0);
        uring_fill(q);
        return got;
    }
#endif
    return queue_reap(q, done, max, 0);
}

/* ------------------------------------------------------------- CRC-32 */

static uint32_t crc_table[8][256];
static pthread_once_t crc_once = PTHREAD_ONCE_INIT;

static void crc_init(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1)));
        crc_table[0][i] = c;
    }
    for (int t = 1; t < 8; t++)
        for (int i = 0; i < 256; i++) crc_table[t][i] = (crc_table[t - 1][i] >> 8) ^ crc_table[0][crc_table[t - 1][i] & 0xFF];
}

uint32_t df_crc32(uint32_t crc, const void *p, size_t n)
{
    pthread_once(&crc_once, crc_init);
    const uint8_t *b = p;
    uint32_t c = ~crc;
    /* slicing by 8: eight bytes per step, the same value as byte at a time */
    for (; n >= 8; n -= 8, b += 8) {
        uint32_t lo = c ^ ((uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24);
        uint32_t hi = (uint32_t)b[4] | (uint32_t)b[5] << 8 | (uint32_t)b[6] << 16 | (uint32_t)b[7] << 24;
        c = crc_table[7][lo & 0xFF] ^ crc_table[6][(lo >> 8) & 0xFF] ^ crc_table[5][(lo >> 16) & 0xFF] ^
            crc_table[4][lo >> 24] ^ crc_table[3][hi & 0xFF] ^ crc_table[2][(hi >> 8) & 0xFF] ^
            crc_table[1][(hi >> 16) & 0xFF] ^ crc_table[0][hi >> 24];
    }
    while (n--) c = (c >> 8) ^ crc_table[0][(c ^ *b++) & 0xFF];
    return ~c;
}

/* ------------------------------------------------------ atomic files */

int atomic_file_open(atomic_file *af, const char *path, df_error *err)
{
    memset(af, 0, sizeof *af);
    af->fd = -1;
    size_t n = strlen(path) + 32;
    af->tmp = xmalloc(n);
    snprintf(af->tmp, n, "%s.tmp", path);
    af->fd = open(af->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (af->fd < 0) {
        df_err_set(err, DF_ERR_IO, -1, "%s: cannot create: %s", af->tmp, strerror(errno));
        free(af->tmp);
        af->tmp = NULL;
        return -1;
    }
    af->path = xstrdup(path);
    return 0;
}

int atomic_file_write(atomic_file *af, const void *p, size_t n, df_error *err)
{
    const uint8_t *b = p;
    for (size_t done = 0; done < n;) {
        ssize_t w = write(af->fd, b + done, n - done);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return df_err_set(err, DF_ERR_IO, -1, "%s: write failed: %s", af->tmp, strerror(errno));
        done += (size_t)w;
    }
    return 0;
}

void atomic_file_abort(atomic_file *af)
{
    if (af->fd >= 0) close(af->fd);
    if (af->tmp) unlink(af->tmp);
    free(af->tmp);
    free(af->path);
    memset(af, 0, sizeof *af);
    af->fd = -1;
}

int atomic_file_commit(atomic_file *af, df_error *err)
{
    if (fsync(af->fd) != 0) {
        df_err_set(err, DF_ERR_IO, -1, "%s: fsync failed: %s", af->tmp, strerror(errno));
        atomic_file_abort(af);
        return -1;
    }
    close(af->fd);
    af->fd = -1;
    if (rename(af->tmp, af->path) != 0) {
        df_err_set(err, DF_ERR_IO, -1, "cannot rename %s to %s: %s", af->tmp, af->path, strerror(errno));
        atomic_file_abort(af);
        return -1;
    }
    /* make the rename durable: fsync the directory */
    char *dir = xstrdup(af->path);
    char *slash = strrchr(dir, '/');
    if (slash) *(slash == dir ? slash + 1 : slash) = 0;
    int dfd = open(slash ? dir : ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        fsync(dfd);
        close(dfd);
    }
    free(dir);
    free(af->tmp);
    free(af->path);
    memset(af, 0, sizeof *af);
    af->fd = -1;
    return 0;
}
