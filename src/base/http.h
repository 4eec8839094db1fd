/* http.h - the HTTP plumbing `setup` and streamed experts share (L0):
 * response header lines (Content-Range, Retry-After, Link rel="next"), a
 * libcurl handle set up the one way both use it (redirects followed,
 * timeouts, stall detection, an optional bearer token), and the retry
 * backoff.  The header parser is network-free and fuzzed (fuzz_setup).
 */
#ifndef DF_HTTP_H
#define DF_HTTP_H

#include <stddef.h>

/* What a response's headers say (a redirect's are forgotten at the next
 * status line). */
typedef struct http_hdrs {
    char next[2048];          /* Link rel="next" */
    char range[128];          /* Content-Range */
    long retry_after;         /* seconds, -1 none */
} http_hdrs;

/* One header line as libcurl hands it (CRLF included, not NUL-terminated). */
void http_header_line(http_hdrs *h, const char *line, size_t n);

/* A libcurl easy handle (a CURL *, as void * so that this header does not
 * need curl.h): redirects followed, 30 s to connect, a body under 1 KiB/s
 * for $DF_SETUP_STALL_S (30) seconds is a stall; auth is a whole header
 * line ("Authorization: Bearer ...") or empty.  *hl gets the header list
 * to free with curl_slist_free_all after the handle.  NULL if libcurl
 * cannot start. */
void *http_handle_new(const char *auth, const char *agent, void **hl);

/* Point handle c (a CURL *) at url, asking for bytes range ("A-B", or
 * NULL for all), the body to write(data, size, n, ud), the headers parsed
 * into *h (reset here). */
void http_prepare(void *c, const char *url, const char *range, size_t (*write)(char *, size_t, size_t, void *),
                  void *ud, http_hdrs *h);

/* Seconds to wait before retry number attempt (0-based): Retry-After when
 * the server sent one, else 0.25 s doubling, at most 30 s. */
double http_backoff_s(int attempt, long retry_after);
void http_backoff(int attempt, long retry_after);

#endif
