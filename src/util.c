/* util.c - CHECK, x-allocators, error helpers, allocation guard, clock, log.
 *
 * The allocation guard counter is a process-wide atomic: the token loop runs
 * on the engine's pool threads, so a per-thread flag would miss allocations
 * made by workers.  The wrapped allocators below are reached through the
 * linker's --wrap option; a binary linked without it simply skips the check.
 * Threads that never run the token loop but allocate while it runs (the
 * server's HTTP threads) exempt themselves with alloc_guard_exempt_thread.
 */
#define _GNU_SOURCE
#include "util.h"

#include <errno.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <fcntl.h>
#include <unistd.h>

int df_log_quiet = 0;
static atomic_int guard_depth;
static _Thread_local int guard_exempt;

void df_check_fail(const char *file, int line, const char *expr)
{
    fprintf(stderr, "deltafin: CHECK failed at %s:%d: %s\n", file, line, expr);
    fflush(stderr);
    abort();
}

void alloc_guard_enter(void) { atomic_fetch_add(&guard_depth, 1); }
void alloc_guard_leave(void) { atomic_fetch_sub(&guard_depth, 1); }
int alloc_guard_active(void) { return atomic_load(&guard_depth) > 0; }
void alloc_guard_exempt_thread(void) { guard_exempt = 1; }

static void guard_trip(const char *what, size_t n)
{
    fprintf(stderr, "deltafin: %s(%zu) inside the token loop (allocation guard)\n", what, n);
    abort();
}

/* --wrap targets.  Declared here only; the linker supplies __real_*. */
void *__real_malloc(size_t n);
void *__real_calloc(size_t n, size_t s);
void *__real_realloc(void *p, size_t n);
int __real_posix_memalign(void **p, size_t a, size_t n);
void *__wrap_malloc(size_t n);
void *__wrap_calloc(size_t n, size_t s);
void *__wrap_realloc(void *p, size_t n);
int __wrap_posix_memalign(void **p, size_t a, size_t n);

void *__wrap_malloc(size_t n)
{
    if (atomic_load_explicit(&guard_depth, memory_order_relaxed) > 0 && !guard_exempt) guard_trip("malloc", n);
    return __real_malloc(n);
}
void *__wrap_calloc(size_t n, size_t s)
{
    if (atomic_load_explicit(&guard_depth, memory_order_relaxed) > 0 && !guard_exempt) guard_trip("calloc", n * s);
    return __real_calloc(n, s);
}
void *__wrap_realloc(void *p, size_t n)
{
    if (atomic_load_explicit(&guard_depth, memory_order_relaxed) > 0 && !guard_exempt) guard_trip("realloc", n);
    return __real_realloc(p, n);
}
int __wrap_posix_memalign(void **p, size_t a, size_t n)
{
    if (atomic_load_explicit(&guard_depth, memory_order_relaxed) > 0 && !guard_exempt) guard_trip("posix_memalign", n);
    return __real_posix_memalign(p, a, n);
}

static _Noreturn void oom(size_t n)
{
    fprintf(stderr, "deltafin: out of memory allocating %zu bytes\n", n);
    abort();
}

void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p) oom(n);
    return p;
}

void *xcalloc(size_t n, size_t size)
{
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p) oom(n * size);
    return p;
}

void *xrealloc(void *p, size_t n)
{
    void *q = realloc(p, n ? n : 1);
    if (!q) oom(n);
    return q;
}

char *xstrdup(const char *s)
{
    size_t n = strlen(s) + 1;
    char *p = xmalloc(n);
    memcpy(p, s, n);
    return p;
}

void *aligned_alloc_zero(size_t n)
{
    void *p = NULL;
    if (posix_memalign(&p, 64, n ? n : 64) != 0) return NULL;
    memset(p, 0, n);
    return p;
}

void *aligned_alloc_raw(size_t n)
{
    void *p = NULL;
    if (posix_memalign(&p, 4096, n ? n : 4096) != 0) return NULL;
    return p;
}

void aligned_free(void *p) { free(p); }

int df_err_set(df_error *err, int code, int64_t pos, const char *fmt, ...)
{
    if (!err || err->code) return -1;
    err->code = code;
    err->pos = pos;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
    return -1;
}

void df_err_prefix(df_error *err, const char *fmt, ...)
{
    if (!err) return;
    char pre[256], old[sizeof err->msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(pre, sizeof pre, fmt, ap);
    va_end(ap);
    memcpy(old, err->msg, sizeof old);
    snprintf(err->msg, sizeof err->msg, "%.255s: %.500s", pre, old);
}

void df_err_clear(df_error *err)
{
    if (!err) return;
    err->code = 0;
    err->pos = -1;
    err->msg[0] = 0;
}

double now_sec(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void df_log(const char *fmt, ...)
{
    if (df_log_quiet) return;
    va_list ap;
    va_start(ap, fmt);
    fputs("deltafin: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

int open_sized(const char *path, uint64_t *size, df_error *err)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return df_err_set(err, DF_ERR_IO, -1, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        close(fd);
        return df_err_set(err, DF_ERR_IO, -1, "%s: cannot stat: %s", path, strerror(errno));
    }
    *size = (uint64_t)st.st_size;
    return fd;
}

int read_small_file(const char *path, char **out, size_t *len, size_t max_len, df_error *err)
{
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return df_err_set(err, DF_ERR_IO, -1, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return df_err_set(err, DF_ERR_IO, -1, "%s: not a regular file", path);
    }
    if ((uint64_t)st.st_size > max_len) {
        close(fd);
        return df_err_set(err, DF_ERR_FORMAT, -1, "%s: file is %lld bytes, more than the %zu allowed",
                          path, (long long)st.st_size, max_len);
    }
    size_t n = (size_t)st.st_size;
    char *buf = xmalloc(n + 1);
    size_t got = 0;
    while (got < n) {
        ssize_t r = read(fd, buf + got, n - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            free(buf);
            close(fd);
            return df_err_set(err, DF_ERR_IO, (int64_t)got, "%s: read failed: %s", path,
                              r < 0 ? strerror(errno) : "unexpected end of file");
        }
        got += (size_t)r;
    }
    close(fd);
    buf[n] = 0;
    *out = buf;
    if (len) *len = n;
    return 0;
}
