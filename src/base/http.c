/* http.c - see http.h. */
#define _GNU_SOURCE
#include "http.h"

#include <curl/curl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

void http_header_line(http_hdrs *h, const char *d, size_t n)
{
    char line[2304];
    size_t k = n < sizeof line - 1 ? n : sizeof line - 1;
    memcpy(line, d, k);
    line[k] = 0;
    k = strlen(line); /* an embedded NUL ends the line */
    while (k && (line[k - 1] == '\r' || line[k - 1] == '\n')) line[--k] = 0;
    if (!strncasecmp(line, "HTTP/", 5)) { /* a new response (a redirect): forget the last one's headers */
        h->range[0] = 0;
        h->next[0] = 0;
        h->retry_after = -1;
    } else if (!strncasecmp(line, "content-range:", 14)) {
        snprintf(h->range, sizeof h->range, "%s", line + 14 + strspn(line + 14, " "));
    } else if (!strncasecmp(line, "retry-after:", 12)) {
        char *end;
        long v = strtol(line + 12, &end, 10);
        h->retry_after = end != line + 12 && v >= 0 && v < 86400 ? v : -1;
    } else if (!strncasecmp(line, "link:", 5)) {
        /* <url>; rel="next", possibly among several comma-separated links */
        for (char *p = strchr(line, '<'); p; p = strchr(p + 1, '<')) {
            char *e = strchr(p, '>');
            if (!e) break;
            char *comma = strchr(e, ','), *rel = strstr(e, "rel=\"next\"");
            if (rel && (!comma || rel < comma)) {
                snprintf(h->next, sizeof h->next, "%.*s", (int)(e - p - 1), p + 1);
                break;
            }
        }
    }
}

void *http_handle_new(const char *auth, const char *agent, void **hl)
{
    CURL *c = curl_easy_init();
    *hl = NULL;
    if (!c) return NULL;
    curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 1L);
    curl_easy_setopt(c, CURLOPT_MAXREDIRS, 10L);
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT, 30L);
    curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, 1024L);
    curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME, getenv("DF_SETUP_STALL_S") ? atol(getenv("DF_SETUP_STALL_S")) : 30L);
    curl_easy_setopt(c, CURLOPT_USERAGENT, agent);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    struct curl_slist *l = NULL;
    if (auth && auth[0]) l = curl_slist_append(NULL, auth);
    if (l) curl_easy_setopt(c, CURLOPT_HTTPHEADER, l);
    *hl = l;
    return c;
}

static size_t header_cb(char *d, size_t sz, size_t nm, void *ud)
{
    http_header_line(ud, d, sz * nm);
    return sz * nm;
}

void http_prepare(void *c, const char *url, const char *range, size_t (*write)(char *, size_t, size_t, void *),
                  void *ud, http_hdrs *h)
{
    *h = (http_hdrs){.retry_after = -1};
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_RANGE, range);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, write);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, ud);
    curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, header_cb);
    curl_easy_setopt(c, CURLOPT_HEADERDATA, h);
}

double http_backoff_s(int attempt, long retry_after)
{
    double s = retry_after >= 0 ? (double)retry_after : 0.25 * (double)(1 << (attempt < 7 ? attempt : 7));
    return s > 30 ? 30 : s;
}

void http_backoff(int attempt, long retry_after)
{
    double s = http_backoff_s(attempt, retry_after);
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}
