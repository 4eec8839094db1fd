/* setup_fetch.c - the requests and hashes that setup.c (the downloads,
 * --check) and setup_stream.c (shard headers, --verify) both make: a GET
 * into memory with the Link rel="next" of a paged listing, a byte range
 * hashed as it arrives (nothing stored), a local file's SHA-256 or git blob
 * id.  Every request is retried SETUP_MAX_TRIES times with http.c's
 * backoff; see setup.c's opening comment for the remote and its rules.
 */
#define _GNU_SOURCE
#include "setup_impl.h"
#include "http.h"
#include "sha.h"
#include "util.h"

#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct membuf {
    char *p;
    size_t n, cap, max;
} membuf;

static size_t mem_write(char *d, size_t sz, size_t nm, void *ud)
{
    membuf *m = ud;
    size_t k = sz * nm;
    if (m->n + k + 1 > m->max) return 0;
    if (m->n + k + 1 > m->cap) {
        m->cap = (m->n + k + 1) * 2;
        m->p = xrealloc(m->p, m->cap);
    }
    memcpy(m->p + m->n, d, k);
    m->n += k;
    m->p[m->n] = 0;
    return k;
}

void *setup_handle_new(const setup *S, struct curl_slist **hl)
{
    void *l;
    CURL *c = http_handle_new(S->auth, "deltafin-setup/1", &l);
    *hl = l;
    return c;
}

int setup_get(setup *S, const char *url, const char *range, char **out, size_t *n, size_t max, char *next,
              size_t n_next, df_error *err)
{
    struct curl_slist *hl;
    CURL *c = setup_handle_new(S, &hl);
    if (!c) return df_err_set(err, DF_ERR_IO, -1, "cannot start libcurl");
    membuf m = {.max = max + 1};
    int rc = -1;
    for (int attempt = 0; attempt < SETUP_MAX_TRIES; attempt++) {
        http_hdrs h;
        m.n = 0;
        http_prepare(c, url, range, mem_write, &m, &h);
        CURLcode cc = curl_easy_perform(c);
        long status = 0;
        curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
        if (cc == CURLE_OK && status == (range ? 206 : 200)) {
            if (next) snprintf(next, n_next, "%s", h.next);
            rc = 0;
            break;
        }
        if (cc == CURLE_OK && (status == 200 || (status != 429 && status < 500))) {
            df_err_set(err, DF_ERR_IO, -1, "%s: HTTP %ld%s", url, status,
                       status == 401 || status == 403 ? " (set HF_TOKEN for a gated or private repository)"
                       : status == 200               ? " (the mirror ignores Range requests)"
                                                     : "");
            break;
        }
        if (attempt + 1 == SETUP_MAX_TRIES) {
            df_err_set(err, DF_ERR_IO, -1, "%s: %s after %d tries", url,
                       cc != CURLE_OK ? curl_easy_strerror(cc) : "server error", SETUP_MAX_TRIES);
            break;
        }
        http_backoff(attempt, h.retry_after);
    }
    curl_slist_free_all(hl);
    curl_easy_cleanup(c);
    if (rc) free(m.p);
    else {
        *out = m.p ? m.p : xcalloc(1, 1);
        *n = m.n;
    }
    return rc;
}

typedef struct hash_sink {
    sha256_ctx c;
    uint64_t got, want;
} hash_sink;

static size_t hash_write(char *d, size_t sz, size_t nm, void *ud)
{
    hash_sink *k = ud;
    size_t n = sz * nm;
    if (k->got + n > k->want) return 0; /* more than asked: a wrong answer */
    sha256_update(&k->c, (const uint8_t *)d, n);
    k->got += n;
    return n;
}

int setup_hash_get(setup *S, const char *url, uint64_t off, uint64_t len, uint64_t size, uint8_t out[32], df_error *err)
{
    struct curl_slist *hl;
    CURL *c = setup_handle_new(S, &hl);
    if (!c) return df_err_set(err, DF_ERR_IO, -1, "cannot start libcurl");
    char range[64], want_range[128];
    snprintf(range, sizeof range, "%llu-%llu", (unsigned long long)off, (unsigned long long)(off + len - 1));
    snprintf(want_range, sizeof want_range, "bytes %s/%llu", range, (unsigned long long)size);
    int rc = -1;
    for (int attempt = 0; attempt < SETUP_MAX_TRIES; attempt++) {
        http_hdrs h;
        hash_sink k = {.want = len};
        sha256_init(&k.c);
        http_prepare(c, url, range, hash_write, &k, &h);
        CURLcode cc = curl_easy_perform(c);
        long status = 0;
        curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
        atomic_fetch_add(&S->fetched, k.got);
        if (cc == CURLE_OK && status == 206 && k.got == len && !strcmp(h.range, want_range)) {
            sha256_final(&k.c, out);
            rc = 0;
            break;
        }
        if (cc == CURLE_OK && status >= 400 && status < 500 && status != 429 && status != 408) {
            df_err_set(err, DF_ERR_IO, -1, "%s: HTTP %ld for bytes %s", url, status, range);
            break;
        }
        if (attempt + 1 == SETUP_MAX_TRIES) {
            df_err_set(err, DF_ERR_IO, -1, "%s: bytes %s failed %d times (last: %s, HTTP %ld, %llu of %llu bytes)", url,
                       range, SETUP_MAX_TRIES, cc != CURLE_OK ? curl_easy_strerror(cc) : "bad answer", status,
                       (unsigned long long)k.got, (unsigned long long)len);
            break;
        }
        atomic_fetch_add(&S->retries, 1);
        http_backoff(attempt, h.retry_after);
    }
    curl_slist_free_all(hl);
    curl_easy_cleanup(c);
    return rc;
}

int setup_hash_file(const char *path, const setup_file *f, char *got, size_t n_got, df_error *err)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return df_err_set(err, DF_ERR_IO, -1, "%s: cannot open: %s", path, strerror(errno));
    sha256_ctx s2;
    sha1_ctx s1;
    sha256_init(&s2);
    sha1_init(&s1);
    if (!f->lfs) {
        char hdr[64];
        int hl = snprintf(hdr, sizeof hdr, "blob %llu", (unsigned long long)f->size) + 1;
        sha1_update(&s1, hdr, (size_t)hl);
    }
    size_t bs = 4u << 20;
    uint8_t *buf = xmalloc(bs);
    uint64_t total = 0;
    int rc = 0;
    for (;;) {
        ssize_t r = read(fd, buf, bs);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            rc = df_err_set(err, DF_ERR_IO, -1, "%s: read failed: %s", path, strerror(errno));
            break;
        }
        if (!r) break;
        total += (uint64_t)r;
        if (f->lfs) sha256_update(&s2, buf, (size_t)r);
        else sha1_update(&s1, buf, (size_t)r);
    }
    free(buf);
    close(fd);
    if (rc) return -1;
    uint8_t d[32];
    if (f->lfs) {
        sha256_final(&s2, d);
        sha_hex(d, 32, got);
    } else {
        sha1_final(&s1, d);
        sha_hex(d, 20, got);
    }
    if (total != f->size) snprintf(got, n_got, "(%llu bytes)", (unsigned long long)total);
    return 0;
}
