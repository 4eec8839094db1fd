/* file.h - L0 file I/O: O_DIRECT opens, aligned spans, and an asynchronous
 * read queue.
 *
 * Owns: opening a file for direct reads (falling back to buffered reads
 * with posix_fadvise(DONTNEED) where the file system refuses O_DIRECT; on
 * macOS, which has no O_DIRECT, F_NOCACHE), the page-cache hints, the
 * alignment arithmetic O_DIRECT needs, and io_queue: many reads in flight,
 * completed out of order.  The queue has two backends behind one interface:
 * io_uring (Linux, when the kernel allows it) and a pool of pread threads.
 * Callers submit a batch (sorted by offset, ideally) and collect
 * completions; a completion carries the caller's tag and the byte count or
 * -errno.  Also the project's CRC-32 and atomically replaced files (heat,
 * session files).  Does not own: what is read or where it goes (expert_store).
 * Thread: one submitting/collecting thread per queue.
 */
#ifndef DF_FILE_H
#define DF_FILE_H

#include <stddef.h>
#include <stdint.h>
#include "df_error.h"

#define DF_DIRECT_ALIGN 4096u

typedef struct df_file {
    int fd;
    int direct;           /* opened with O_DIRECT */
    uint64_t size;
    char *path;
} df_file;

enum io_mode { IO_AUTO, IO_DIRECT, IO_BUFFERED };

/* Open read-only.  IO_AUTO: O_DIRECT if the file system accepts an aligned
 * direct read, else buffered.  IO_DIRECT fails where O_DIRECT does not work. */
int df_file_open(df_file *f, const char *path, enum io_mode mode, df_error *err);
void df_file_close(df_file *f);
/* Drop this range from the page cache (buffered mode: reads do not pile up). */
void df_file_dontneed(const df_file *f, uint64_t off, uint64_t len);

/* Page-cache and memory hints: the only calls into Linux-only interfaces
 * outside the io_uring backend, each a no-op (or its POSIX stand-in) where
 * the system lacks it (macOS: no posix_fadvise, sync_file_range or
 * MADV_HUGEPAGE; F_NOCACHE takes O_DIRECT's place in df_file_open). */
void df_fd_dontneed(int fd, uint64_t off, uint64_t len); /* POSIX_FADV_DONTNEED */
void df_fd_random(int fd);                               /* POSIX_FADV_RANDOM */
void df_fd_writeback(int fd, uint64_t off, uint64_t len); /* dirty pages written (sync_file_range; else fdatasync) */
void df_mem_hugepages(void *p, size_t len);              /* MADV_HUGEPAGE */

static inline uint64_t align_down(uint64_t v, uint64_t a) { return v & ~(a - 1); }
static inline uint64_t align_up(uint64_t v, uint64_t a) { return (v + a - 1) & ~(a - 1); }

typedef struct io_req {
    int fd;
    uint64_t off;
    size_t len;
    void *buf;
    int64_t tag;          /* returned with the completion */
} io_req;

typedef struct io_done {
    int64_t tag;
    int64_t result;       /* bytes read (may be short at EOF), or -errno */
} io_done;

typedef struct io_queue io_queue;

enum io_backend { IO_BACKEND_AUTO, IO_BACKEND_URING, IO_BACKEND_THREADS };

/* depth: reads in flight (threads for the pool backend). */
io_queue *io_queue_new(int depth, enum io_backend backend, df_error *err);
void io_queue_free(io_queue *q);
const char *io_queue_backend(const io_queue *q);
/* Queue n reads; returns at once.  Reads partly done by the kernel are
 * resumed internally, so a completion is a whole read or an error. */
void io_queue_submit(io_queue *q, const io_req *reqs, int n);
/* Block until at least one read completes; fill up to max; returns count.
 * Returns 0 when nothing is in flight. */
int io_queue_wait(io_queue *q, io_done *done, int max);
/* The same without blocking: the completions already there (maybe none);
 * with io_uring, reads queued behind a full ring are submitted into the
 * slots the landed ones freed. */
int io_queue_poll(io_queue *q, io_done *done, int max);
int io_queue_in_flight(const io_queue *q);

/* CRC-32 (IEEE 802.3, the zlib one): crc = df_crc32(0, p, n), or continued
 * over several pieces by passing the previous value.  Table-driven. */
uint32_t df_crc32(uint32_t crc, const void *p, size_t n);

/* A file replaced atomically: written to PATH.tmp (a stale one from a
 * crashed writer is replaced), fsynced, renamed over PATH and the
 * directory fsynced; until the commit PATH is untouched (a crash leaves the
 * previous file, or none), and an abort removes the temporary file. */
typedef struct atomic_file {
    int fd;
    char *path, *tmp;
} atomic_file;
int atomic_file_open(atomic_file *af, const char *path, df_error *err);
int atomic_file_write(atomic_file *af, const void *p, size_t n, df_error *err);
int atomic_file_commit(atomic_file *af, df_error *err);
void atomic_file_abort(atomic_file *af);

#endif
