/* util.c - CHECK, x-allocators, error helpers, allocation guard, log (the clock is clock.c).
 *
 * Also the one definition of a UTF-8 character (Unicode table 3-7, maximal
 * subparts for repair) that the JSON reader, the tokenizer and the server share.
 *
 * The allocation guard.  The token loop runs on the evaluating thread and on
 * the pool's and the I/O queue's workers, so the guard has a process-wide
 * count of held guards plus, per thread, whether the thread holds one or
 * joined (alloc_guard_join_thread).  Threads that are neither (the server's
 * HTTP threads, which allocate while the worker evaluates) are not checked.
 *
 * To see every allocation of the process, this file defines malloc, free,
 * calloc, realloc, reallocarray, aligned_alloc, memalign, posix_memalign,
 * valloc and pvalloc: glibc's documented way to replace malloc (ELF symbol
 * interposition, "Replacing malloc" in the glibc manual).  They check the
 * guard and forward to glibc's own allocator (__libc_malloc and friends), so
 * memory and malloc_usable_size behave exactly as before, and libc's internal
 * calls (qsort's merge buffer, stdio buffers, strdup, pthread) land here too.
 * Sanitizer builds (ASan, TSan, MSan, LSan) intercept malloc themselves, so
 * there the same check runs as a sanitizer allocation hook instead
 * (__sanitizer_install_malloc_and_free_hooks), which also sees every
 * allocation; UBSan alone keeps the interposition.
 */
#define _GNU_SOURCE
#include "util.h"

#include <errno.h>
#include <malloc.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <fcntl.h>
#include <unistd.h>

#ifndef __has_feature
#define __has_feature(x) 0
#endif
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__) || __has_feature(address_sanitizer) || \
    __has_feature(thread_sanitizer) || __has_feature(memory_sanitizer) || __has_feature(leak_sanitizer)
#define DF_GUARD_SANITIZER_HOOK 1
/* from <sanitizer/allocator_interface.h>, which gcc does not always install */
int __sanitizer_install_malloc_and_free_hooks(void (*malloc_hook)(const volatile void *, size_t),
                                              void (*free_hook)(const volatile void *));
#endif

int df_log_quiet = 0;
static atomic_int guard_depth;       /* guards held, all threads */
static _Thread_local int guard_held; /* guards held by this thread */
static _Thread_local int guard_joined, guard_exempt;

void df_check_fail(const char *file, int line, const char *expr)
{
    fprintf(stderr, "deltafin: CHECK failed at %s:%d: %s\n", file, line, expr);
    fflush(stderr);
    abort();
}

void alloc_guard_enter(void)
{
    guard_held++;
    atomic_fetch_add(&guard_depth, 1);
}
void alloc_guard_leave(void)
{
    CHECK(guard_held > 0);
    guard_held--;
    atomic_fetch_sub(&guard_depth, 1);
}
void alloc_guard_join_thread(void) { guard_joined = 1; }
void alloc_guard_exempt_thread(void) { guard_exempt = 1; }
int alloc_guard_exempt_begin(void)
{
    int was = guard_exempt;
    guard_exempt = 1;
    return was;
}
void alloc_guard_exempt_end(int was) { guard_exempt = was; }

/* Runs inside the allocator: no stdio (it may allocate), no CHECK. */
static void guard_check(const char *what, size_t n)
{
    if (guard_exempt || !(guard_held || (guard_joined && atomic_load_explicit(&guard_depth, memory_order_relaxed) > 0)))
        return;
    char msg[160];
    int len = snprintf(msg, sizeof msg, "deltafin: %s(%zu) inside the token loop (allocation guard)\n", what, n);
    if (len > 0) {
        ssize_t w = write(2, msg, (size_t)len < sizeof msg ? (size_t)len : sizeof msg - 1);
        (void)w;
    }
    abort();
}

#ifdef DF_GUARD_SANITIZER_HOOK
static void san_malloc_hook(const volatile void *p, size_t n)
{
    (void)p;
    guard_check("allocation", n);
}
static void san_free_hook(const volatile void *p) { (void)p; }
__attribute__((constructor)) static void san_install_hook(void)
{
    __sanitizer_install_malloc_and_free_hooks(san_malloc_hook, san_free_hook);
}
#else
/* glibc's allocator under its exported names (GLIBC_2.2.5). */
extern void *__libc_malloc(size_t n);
extern void *__libc_calloc(size_t n, size_t s);
extern void *__libc_realloc(void *p, size_t n);
extern void *__libc_memalign(size_t align, size_t n);
extern void *__libc_valloc(size_t n);
extern void *__libc_pvalloc(size_t n);
extern void __libc_free(void *p);

void *malloc(size_t n)
{
    guard_check("malloc", n);
    return __libc_malloc(n);
}
void free(void *p) { __libc_free(p); }
void *calloc(size_t n, size_t s)
{
    guard_check("calloc", n * s);
    return __libc_calloc(n, s);
}
void *realloc(void *p, size_t n)
{
    if (n) guard_check("realloc", n); /* realloc(p, 0) frees */
    return __libc_realloc(p, n);
}
void *reallocarray(void *p, size_t n, size_t s)
{
    size_t bytes;
    if (__builtin_mul_overflow(n, s, &bytes)) {
        errno = ENOMEM;
        return NULL;
    }
    return realloc(p, bytes);
}
void *memalign(size_t align, size_t n)
{
    guard_check("memalign", n);
    return __libc_memalign(align, n);
}
void *aligned_alloc(size_t align, size_t n)
{
    guard_check("aligned_alloc", n);
    return __libc_memalign(align, n);
}
int posix_memalign(void **out, size_t align, size_t n)
{
    guard_check("posix_memalign", n);
    if (align % sizeof(void *) || (align & (align - 1)) || !align) return EINVAL;
    int saved = errno;
    void *p = __libc_memalign(align, n);
    if (!p) {
        errno = saved;
        return ENOMEM;
    }
    *out = p;
    return 0;
}
void *valloc(size_t n)
{
    guard_check("valloc", n);
    return __libc_valloc(n);
}
void *pvalloc(size_t n)
{
    guard_check("pvalloc", n);
    return __libc_pvalloc(n);
}
#endif

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

/* Bytes allowed after the lead byte of a multi-byte sequence (Unicode table
 * 3-7: no overlongs, no surrogates, nothing above U+10FFFF). */
int utf8_second_ok(unsigned char lead, unsigned char b)
{
    switch (lead) {
    case 0xe0: return b >= 0xa0 && b <= 0xbf;
    case 0xed: return b >= 0x80 && b <= 0x9f;
    case 0xf0: return b >= 0x90 && b <= 0xbf;
    case 0xf4: return b >= 0x80 && b <= 0x8f;
    default: return b >= 0x80 && b <= 0xbf;
    }
}

/* Length of the sequence a lead byte starts; 0 for a byte that cannot start one. */
int utf8_need(unsigned char lead)
{
    if (lead < 0x80) return 1;
    if (lead >= 0xc2 && lead <= 0xdf) return 2;
    if (lead >= 0xe0 && lead <= 0xef) return 3;
    if (lead >= 0xf0 && lead <= 0xf4) return 4;
    return 0;
}

/* Length of the well-formed character at s[0..n), or 0 when s starts with an
 * ill-formed or truncated sequence; *sub gets the length of its maximal
 * subpart (the bytes one U+FFFD replaces, >= 1). */
int utf8_char(const unsigned char *s, size_t n, int *sub)
{
    int need = utf8_need(s[0]);
    *sub = 1;
    if (need == 1) return 1;
    if (need == 0) return 0;
    int k = 1;
    while (k < need && (size_t)k < n && (k == 1 ? utf8_second_ok(s[0], s[1]) : (s[k] & 0xc0) == 0x80)) k++;
    *sub = k;
    return k == need ? need : 0;
}

uint32_t utf8_cp(const unsigned char *s, int len)
{
    switch (len) {
    case 1: return s[0];
    case 2: return (uint32_t)(s[0] & 0x1f) << 6 | (s[1] & 0x3f);
    case 3: return (uint32_t)(s[0] & 0x0f) << 12 | (uint32_t)(s[1] & 0x3f) << 6 | (s[2] & 0x3f);
    default:
        return (uint32_t)(s[0] & 0x07) << 18 | (uint32_t)(s[1] & 0x3f) << 12 | (uint32_t)(s[2] & 0x3f) << 6 |
               (s[3] & 0x3f);
    }
}

size_t utf8_char_len(const unsigned char *s, size_t n)
{
    int sub;
    return (size_t)utf8_char(s, n, &sub);
}

int utf8_valid(const char *s, size_t n)
{
    for (size_t i = 0; i < n;) {
        size_t k = utf8_char_len((const unsigned char *)s + i, n - i);
        if (!k) return 0;
        i += k;
    }
    return 1;
}

size_t utf8_cut(const char *s, size_t n, size_t max)
{
    if (n <= max) return n;
    /* the last character starting before max: does it run past max? */
    size_t j = max;
    while (j > 0 && max - j < 4 && ((unsigned char)s[j - 1] & 0xC0) == 0x80) j--;
    if (j == 0) return max;
    unsigned c = (unsigned char)s[j - 1];
    size_t len = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    return j - 1 + len > max ? j - 1 : max;
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

long peak_rss_kb(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    long v = -1;
    char line[128];
    if (!f) {
        /* no /proc (macOS): the kernel's high-water mark, in bytes there */
        struct rusage ru;
        if (getrusage(RUSAGE_SELF, &ru) != 0) return -1;
#if defined(__APPLE__)
        return (long)(ru.ru_maxrss / 1024);
#else
        return (long)ru.ru_maxrss;
#endif
    }
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "VmHWM: %ld", &v) == 1) break;
    fclose(f);
    return v;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

double median_d(double *v, int n)
{
    if (n <= 0) return 0;
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* ---- base64 ----------------------------------------------------------- */

/* base64 alphabet value of each byte, -1 for others */
static const signed char b64_tab[256] = {
    ['A'] = 0,  ['B'] = 1,  ['C'] = 2,  ['D'] = 3,  ['E'] = 4,  ['F'] = 5,  ['G'] = 6,  ['H'] = 7,
    ['I'] = 8,  ['J'] = 9,  ['K'] = 10, ['L'] = 11, ['M'] = 12, ['N'] = 13, ['O'] = 14, ['P'] = 15,
    ['Q'] = 16, ['R'] = 17, ['S'] = 18, ['T'] = 19, ['U'] = 20, ['V'] = 21, ['W'] = 22, ['X'] = 23,
    ['Y'] = 24, ['Z'] = 25, ['a'] = 26, ['b'] = 27, ['c'] = 28, ['d'] = 29, ['e'] = 30, ['f'] = 31,
    ['g'] = 32, ['h'] = 33, ['i'] = 34, ['j'] = 35, ['k'] = 36, ['l'] = 37, ['m'] = 38, ['n'] = 39,
    ['o'] = 40, ['p'] = 41, ['q'] = 42, ['r'] = 43, ['s'] = 44, ['t'] = 45, ['u'] = 46, ['v'] = 47,
    ['w'] = 48, ['x'] = 49, ['y'] = 50, ['z'] = 51, ['0'] = 52, ['1'] = 53, ['2'] = 54, ['3'] = 55,
    ['4'] = 56, ['5'] = 57, ['6'] = 58, ['7'] = 59, ['8'] = 60, ['9'] = 61, ['+'] = 62, ['/'] = 63,
};
/* b64_tab holds 0 for non-alphabet bytes too; this tells them apart */
static int b64_val(unsigned char c) { return (b64_tab[c] || c == 'A') ? b64_tab[c] : -1; }

long b64_decode(const unsigned char *s, size_t n, unsigned char *out)
{
    if (n == 0 || n % 4) return -1;
    size_t pad = s[n - 1] == '=' ? (s[n - 2] == '=' ? 2 : 1) : 0;
    long o = 0;
    for (size_t i = 0; i < n; i += 4) {
        int v[4];
        for (int j = 0; j < 4; j++) {
            v[j] = b64_val(s[i + (size_t)j]);
            if (v[j] < 0 && !(i + 4 == n && (size_t)j >= 4 - pad)) return -1;
        }
        uint32_t x = (uint32_t)v[0] << 18 | (uint32_t)v[1] << 12;
        if (i + 4 == n && pad == 2) {
            if (x & 0xffff) return -1;
            out[o++] = (unsigned char)(x >> 16);
        } else if (i + 4 == n && pad == 1) {
            x |= (uint32_t)v[2] << 6;
            if (x & 0xff) return -1;
            out[o++] = (unsigned char)(x >> 16);
            out[o++] = (unsigned char)(x >> 8);
        } else {
            x |= (uint32_t)v[2] << 6 | (uint32_t)v[3];
            out[o++] = (unsigned char)(x >> 16);
            out[o++] = (unsigned char)(x >> 8);
            out[o++] = (unsigned char)x;
        }
    }
    return o;
}

void b64_encode(const unsigned char *s, size_t n, char *out)
{
    static const char abc[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    size_t o = 0;
    for (size_t i = 0; i < n; i += 3) {
        uint32_t x = (uint32_t)s[i] << 16 | (i + 1 < n ? (uint32_t)s[i + 1] << 8 : 0) | (i + 2 < n ? s[i + 2] : 0);
        out[o++] = abc[x >> 18];
        out[o++] = abc[(x >> 12) & 63];
        out[o++] = i + 1 < n ? abc[(x >> 6) & 63] : '=';
        out[o++] = i + 2 < n ? abc[x & 63] : '=';
    }
    out[o] = 0;
}
