/* util.h - L0 plumbing: CHECK, allocators, the error helpers, logging, clock.
 *
 * Owns: the always-on CHECK macro (bugs abort with file:line), the x-allocators
 * (abort on out-of-memory; only for small/startup allocations), the error
 * helpers, and the allocation guard that enforces "nothing allocates in the
 * token loop": util.c defines the process's malloc family itself (glibc's
 * documented malloc replacement, forwarding to glibc's allocator), so every
 * allocation of the process - ours, libc's own (qsort, stdio, strdup),
 * other libraries' - passes the guard.  While a guard is held, an allocation
 * on a token-loop thread aborts: the thread holding it (the one evaluating)
 * and the threads that joined (the pool's and the I/O queue's workers).
 * Other threads (the server's HTTP threads) are not checked.  In sanitizer
 * builds the sanitizer owns malloc; the guard is then a sanitizer allocation
 * hook, which sees the same allocations.
 * Also base64 (the tokenizer's vocabulary, the server's thinking signatures) and
 * the one definition of a UTF-8 character (utf8_char_len, utf8_valid,
 * utf8_cut) that the JSON reader and the server share.
 * Does not own: files, threads, anything model-specific.
 */
#ifndef DF_UTIL_H
#define DF_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include "clock.h"
#include "df_error.h"

#define CHECK(cond) \
    do { if (!(cond)) df_check_fail(__FILE__, __LINE__, #cond); } while (0)

_Noreturn void df_check_fail(const char *file, int line, const char *expr);

void *xmalloc(size_t n);
void *xcalloc(size_t n, size_t size);
void *xrealloc(void *p, size_t n);
char *xstrdup(const char *s);
/* 64-byte aligned, zeroed; returns NULL on failure (big budgeted buffers). */
void *aligned_alloc_zero(size_t n);
/* 4096-aligned, NOT zeroed (pages stay untouched until first written). */
void *aligned_alloc_raw(size_t n);
void aligned_free(void *p);

/* Allocation guard: see the file comment.  enter/leave nest; the calling
 * thread is checked while it holds a guard. */
void alloc_guard_enter(void);
void alloc_guard_leave(void);
/* The calling thread does token-loop work for whichever thread holds a guard
 * (pool and I/O workers): it is checked whenever any guard is held. */
void alloc_guard_join_thread(void);
/* The calling thread never runs the token loop: its allocations are never
 * checked, even if it joined. */
void alloc_guard_exempt_thread(void);
/* Network code inside the token loop (a streamed install's expert fetches:
 * libcurl allocates per transfer) runs between these two: the calling
 * thread is not checked meanwhile.  begin returns what end restores. */
int alloc_guard_exempt_begin(void);
void alloc_guard_exempt_end(int was);

/* Fill err if it holds no error yet (the first error wins). Returns -1. */
int df_err_set(df_error *err, int code, int64_t pos, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Prefix an existing message with context ("file.safetensors: ..."). */
void df_err_prefix(df_error *err, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
void df_err_clear(df_error *err);

/* UTF-8 (the one definition: json.c, tokenizer.c, the server): the length (1..4) of
 * the well-formed character at s, of which n >= 1 bytes are readable, or 0
 * when s does not start one (bad lead or continuation, overlong, surrogate,
 * above U+10FFFF, cut short). */
size_t utf8_char_len(const unsigned char *s, size_t n);
/* The same test with the repair information the tokenizer needs (Python's
 * decode(errors="replace")): the length of the well-formed character at
 * s[0..n), or 0; *sub gets the length of the maximal subpart one U+FFFD
 * replaces (>= 1). */
int utf8_char(const unsigned char *s, size_t n, int *sub);
/* The sequence length a lead byte starts (1..4), 0 for a byte that cannot
 * start one; the code point of a well-formed character of len bytes. */
int utf8_need(unsigned char lead);
/* May b follow the lead byte of a multi-byte sequence (Unicode table 3-7)? */
int utf8_second_ok(unsigned char lead, unsigned char b);
uint32_t utf8_cp(const unsigned char *s, int len);
/* 1 when s[0..n) is well-formed UTF-8. */
int utf8_valid(const char *s, size_t n);
/* Where to cut s[0..n) to at most max bytes without splitting a character:
 * n if it fits, else max less a character that would straddle it.  Reads
 * only s[0..max), so it also repairs a string snprintf already cut at max.
 * Well-formed input gives a well-formed prefix. */
size_t utf8_cut(const char *s, size_t n, size_t max);

void df_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* The median of v[0..n) (sorts v; 0 for n = 0); for benchmarks, not the token loop. */
double median_d(double *v, int n);
/* This process's peak resident set (VmHWM) in KiB, -1 when unknown. */
long peak_rss_kb(void);
extern int df_log_quiet;

/* Read a whole small file (configs, indexes). NUL-terminates. */
/* Open path read-only and give its size: the fd, or -1 with a message
 * naming the file. */
int open_sized(const char *path, uint64_t *size, df_error *err);
int read_small_file(const char *path, char **out, size_t *len, size_t max_len, df_error *err);

/* Base64 (RFC 4648, standard alphabet, padded).  Decoding is strict
 * (padding and zero unused bits, so one byte string has one spelling):
 * writes at most 3 * n / 4 bytes, returns the count or -1 (also for n 0).
 * Encoding writes 4 * ceil(n / 3) characters and a NUL. */
long b64_decode(const unsigned char *s, size_t n, unsigned char *out);
void b64_encode(const unsigned char *s, size_t n, char *out);

#endif
