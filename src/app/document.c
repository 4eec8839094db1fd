/* document.c - documents (text, Markdown, PDF) rendered into a prompt's text.
 *
 * See document.h for the rendered form.  Text documents are checked (UTF-8,
 * no NUL) and copied.  PDFs go to poppler's pdftotext, run as a child:
 * posix_spawn of /bin/sh, which sets the child's limits (2 GiB of address
 * space, 30 s of CPU) and execs pdftotext reading the PDF from a pipe and
 * writing UTF-8 text to another; the parent feeds and drains both with
 * poll under a wall-time deadline and an output cap, and kills the child
 * past either.  Poppler is well kept but parses hostile input; in a child a
 * crash, a hang or a memory blow-up is a 400 naming the document, and the
 * server goes on.  A PDF whose pages hold no text (scanned images) is an
 * error, not an empty document: a model answering about nothing would be
 * worse.  pdftotext ends each page with a form feed: they count the pages
 * and are dropped from the text.  At most two children run at once (each
 * may take 2 GiB); a burst of PDF requests waits its turn within its own
 * deadline.
 */
#define _GNU_SOURCE
#include "document.h"
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include "clock.h"
#include "util.h"

extern char **environ;

static size_t cap_bytes(const doc_limits *lim) { return lim && lim->max_bytes ? lim->max_bytes : DOC_MAX_BYTES_DEFAULT; }
static size_t cap_text(const doc_limits *lim) { return lim && lim->max_text ? lim->max_text : (size_t)64 << 20; }

/* ---- base64 and data: URLs ----------------------------------------------- */

int doc_decode(const char *s, size_t n, const doc_limits *lim, char *type, size_t type_cap, unsigned char **bytes,
               size_t *nb, df_error *err)
{
    *bytes = NULL;
    *nb = 0;
    if (type_cap) type[0] = 0;
    if (n >= 5 && !strncmp(s, "data:", 5)) {
        const char *comma = memchr(s, ',', n);
        if (!comma) return df_err_set(err, DF_ERR_ARG, 0, "a data: URL without a comma");
        const char *head = s + 5;
        size_t hl = (size_t)(comma - head);
        if (hl < 7 || memcmp(head + hl - 7, ";base64", 7))
            return df_err_set(err, DF_ERR_ARG, 0, "a data: URL that is not base64 (expected data:TYPE;base64,DATA)");
        size_t tl = strcspn(head, ";,");
        if (tl >= type_cap) return df_err_set(err, DF_ERR_ARG, 0, "a data: URL's media type is too long");
        memcpy(type, head, tl);
        type[tl] = 0;
        n -= (size_t)(comma + 1 - s);
        s = comma + 1;
    }
    if (!n) return df_err_set(err, DF_ERR_ARG, 0, "empty document data");
    if (n / 4 * 3 > cap_bytes(lim) + 2)
        return df_err_set(err, DF_ERR_ARG, 0, "the document is about %zu bytes; documents are capped at %zu bytes "
                          "(--max-document-bytes)", n / 4 * 3, cap_bytes(lim));
    unsigned char *b = xmalloc(n / 4 * 3 + 3);
    long got = b64_decode((const unsigned char *)s, n, b);
    if (got < 0) {
        free(b);
        return df_err_set(err, DF_ERR_ARG, 0, "the document's data is not valid base64 (standard alphabet, padded, "
                          "no line breaks)");
    }
    *bytes = b;
    *nb = (size_t)got;
    return 0;
}

/* ---- pdftotext in a child ------------------------------------------------- */

static int find_pdftotext(const doc_limits *lim, char *path, size_t cap)
{
    const char *p = lim && lim->pdftotext ? lim->pdftotext : getenv("DELTAFIN_PDFTOTEXT");
    if (p && *p) {
        snprintf(path, cap, "%s", p);
        return access(path, X_OK);
    }
    const char *dirs = getenv("PATH");
    if (!dirs || !*dirs) dirs = "/usr/local/bin:/usr/bin:/bin";
    while (*dirs) {
        size_t l = strcspn(dirs, ":");
        snprintf(path, cap, "%.*s/pdftotext", (int)l, dirs);
        if (l && !access(path, X_OK)) return 0;
        dirs += l + (dirs[l] == ':');
    }
    return -1;
}

typedef struct child {
    pid_t pid;
    int in, out, errfd;
} child;

static int spawn_pdftotext(char *tool, child *c, df_error *err)
{
    int pin[2], pout[2], perr[2];
    if (pipe2(pin, O_CLOEXEC)) return df_err_set(err, DF_ERR_IO, 0, "pdftotext: pipe: %s", strerror(errno));
    if (pipe2(pout, O_CLOEXEC)) {
        close(pin[0]), close(pin[1]);
        return df_err_set(err, DF_ERR_IO, 0, "pdftotext: pipe: %s", strerror(errno));
    }
    if (pipe2(perr, O_CLOEXEC)) {
        close(pin[0]), close(pin[1]), close(pout[0]), close(pout[1]);
        return df_err_set(err, DF_ERR_IO, 0, "pdftotext: pipe: %s", strerror(errno));
    }
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, pin[0], 0);
    posix_spawn_file_actions_adddup2(&fa, pout[1], 1);
    posix_spawn_file_actions_adddup2(&fa, perr[1], 2);
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 34))
    posix_spawn_file_actions_addclosefrom_np(&fa, 3); /* the server's sockets and model files stay in the server */
#endif
    posix_spawnattr_t at;
    posix_spawnattr_init(&at);
    sigset_t none, dfl;
    sigemptyset(&none);
    sigemptyset(&dfl);
    sigaddset(&dfl, SIGPIPE);
    posix_spawnattr_setsigmask(&at, &none);
    posix_spawnattr_setsigdefault(&at, &dfl);
    posix_spawnattr_setflags(&at, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
    /* the limits are the shell's to set; the tool's path is an argument, never spliced into the script */
    char *argv[] = {"sh", "-c", "ulimit -v 2097152 2>/dev/null; ulimit -t 30 2>/dev/null; "
                    "exec \"$0\" -enc UTF-8 -eol unix - -", tool, NULL};
    int rc = posix_spawn(&c->pid, "/bin/sh", &fa, &at, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&at);
    close(pin[0]), close(pout[1]), close(perr[1]);
    if (rc) {
        close(pin[1]), close(pout[0]), close(perr[0]);
        return df_err_set(err, DF_ERR_IO, 0, "pdftotext: cannot start /bin/sh: %s", strerror(rc));
    }
    c->in = pin[1], c->out = pout[0], c->errfd = perr[0];
    fcntl(c->in, F_SETFL, O_NONBLOCK);
    return 0;
}

/* Feed data to the child, collect stdout (at most max) and the start of
 * stderr.  Returns 0, or 1 when the output passed max, 2 past the deadline. */
static int pump(child *c, const unsigned char *data, size_t n, size_t max, int timeout_ms, json_buf *out,
                char *emsg, size_t ecap)
{
    size_t sent = 0, elen = 0;
    double end = now_sec() + timeout_ms / 1000.0;
    char buf[65536];
    int open_out = 1, open_err = 1;
    while (open_out || open_err) {
        struct pollfd p[3];
        int np = 0, io = -1, ie = -1, ii = -1;
        if (open_out) p[io = np++] = (struct pollfd){.fd = c->out, .events = POLLIN};
        if (open_err) p[ie = np++] = (struct pollfd){.fd = c->errfd, .events = POLLIN};
        if (c->in >= 0) p[ii = np++] = (struct pollfd){.fd = c->in, .events = POLLOUT};
        int left = (int)((end - now_sec()) * 1000);
        if (left <= 0) return 2;
        int k = poll(p, (nfds_t)np, left);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return 2;
        if (ii >= 0 && p[ii].revents) {
            ssize_t w = (p[ii].revents & POLLOUT) ? write(c->in, data + sent, n - sent) : -1;
            if (w > 0) sent += (size_t)w;
            if (w < 0 && errno == EAGAIN) w = 0;
            if (w < 0 || sent == n) close(c->in), c->in = -1; /* a child that stopped reading says why on stderr */
        }
        if (io >= 0 && p[io].revents) {
            ssize_t r = read(c->out, buf, sizeof buf);
            if (r > 0) {
                if (out->len + (size_t)r > max) return 1;
                json_buf_put(out, buf, (size_t)r);
            } else if (r == 0 || errno != EINTR) {
                open_out = 0;
            }
        }
        if (ie >= 0 && p[ie].revents) {
            ssize_t r = read(c->errfd, buf, sizeof buf);
            if (r > 0) {
                size_t take = elen + 1 < ecap ? ecap - 1 - elen : 0;
                if ((size_t)r < take) take = (size_t)r;
                memcpy(emsg + elen, buf, take);
                elen += take;
                emsg[elen] = 0;
            } else if (r == 0 || errno != EINTR) {
                open_err = 0;
            }
        }
    }
    return 0;
}

/* The first line of pdftotext's complaint, trimmed, for an error message. */
static void first_line(char *s)
{
    size_t l = strcspn(s, "\n");
    while (l && (s[l - 1] == '\r' || s[l - 1] == ' ')) l--;
    s[utf8_cut(s, l, 200)] = 0;
}

/* At most DOC_MAX_CHILDREN pdftotext children at once (each may take 2 GiB):
 * a burst of PDF requests waits its turn, up to its own deadline. */
#define DOC_MAX_CHILDREN 2
static pthread_mutex_t children_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t children_cv = PTHREAD_COND_INITIALIZER;
static int children;

static int child_slot(int timeout_ms)
{
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += timeout_ms / 1000;
    until.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (until.tv_nsec >= 1000000000L) until.tv_sec++, until.tv_nsec -= 1000000000L;
    pthread_mutex_lock(&children_mu);
    int rc = 0;
    while (children >= DOC_MAX_CHILDREN && rc == 0) rc = pthread_cond_timedwait(&children_cv, &children_mu, &until);
    int got = children < DOC_MAX_CHILDREN;
    children += got;
    pthread_mutex_unlock(&children_mu);
    return got ? 0 : -1;
}

static void child_slot_free(void)
{
    pthread_mutex_lock(&children_mu);
    children--;
    pthread_cond_signal(&children_cv);
    pthread_mutex_unlock(&children_mu);
}

static int pdf_text(const doc_limits *lim, const unsigned char *data, size_t n, json_buf *text, int *pages,
                    df_error *err)
{
    char tool[4096];
    if (find_pdftotext(lim, tool, sizeof tool))
        return df_err_set(err, DF_ERR_UNSUPPORTED, 0, "PDF documents need poppler's pdftotext, which is not installed "
                          "here (%s): apt-get install poppler-utils (text and Markdown documents work without it)",
                          lim && lim->pdftotext ? lim->pdftotext : getenv("DELTAFIN_PDFTOTEXT") ? getenv("DELTAFIN_PDFTOTEXT")
                          : "not on PATH");
    if (n < 5 || memcmp(data, "%PDF-", 5))
        return df_err_set(err, DF_ERR_ARG, 0, "not a PDF (it does not start with %%PDF-)");
    int timeout_ms = lim && lim->timeout_ms ? lim->timeout_ms : 60000;
    if (child_slot(timeout_ms))
        return df_err_set(err, DF_ERR_LIMIT, 0, "%d PDFs are being read already and none finished within %d ms: try "
                          "again", DOC_MAX_CHILDREN, timeout_ms);
    child c;
    if (spawn_pdftotext(tool, &c, err)) {
        child_slot_free();
        return -1;
    }
    char emsg[512] = "";
    /* a child that stops reading must not raise SIGPIPE in this thread */
    sigset_t pipe_set, old;
    sigemptyset(&pipe_set);
    sigaddset(&pipe_set, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_set, &old);
    int pr = pump(&c, data, n, cap_text(lim), timeout_ms, text, emsg, sizeof emsg);
    if (c.in >= 0) close(c.in);
    close(c.out), close(c.errfd);
    if (pr) kill(c.pid, SIGKILL);
    int status = 0;
    while (waitpid(c.pid, &status, 0) < 0 && errno == EINTR) {}
    child_slot_free();
    struct timespec zero = {0, 0};
    while (sigtimedwait(&pipe_set, NULL, &zero) > 0) {}
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    first_line(emsg);
    if (pr == 1)
        return df_err_set(err, DF_ERR_ARG, 0, "the PDF's text passes %zu bytes, more than a prompt can hold",
                          cap_text(lim));
    if (pr == 2) return df_err_set(err, DF_ERR_ARG, 0, "pdftotext did not finish this PDF in time (%d ms)", timeout_ms);
    if (WIFSIGNALED(status))
        return df_err_set(err, DF_ERR_ARG, 0, "pdftotext was stopped by signal %d on this PDF (%s)",
                          WTERMSIG(status), WTERMSIG(status) == SIGXCPU ? "its CPU limit" :
                          WTERMSIG(status) == SIGKILL ? "killed" : "a crash or its memory limit");
    int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    if (code == 127) return df_err_set(err, DF_ERR_UNSUPPORTED, 0, "pdftotext (%s) could not be run: %s", tool, emsg);
    if (code == 3) return df_err_set(err, DF_ERR_ARG, 0, "the PDF's permissions forbid extracting its text (%s)", emsg);
    if (code) return df_err_set(err, DF_ERR_ARG, 0, "not a readable PDF (pdftotext: %s)",
                                *emsg ? emsg : "failed without a message");
    int np = 0;
    size_t w = 0, content = 0;
    for (size_t i = 0; i < text->len; i++) {
        char ch = text->p[i];
        if (ch == '\f') {
            np++;
            continue;
        }
        if (ch == 0) continue;
        if (ch != ' ' && ch != '\n' && ch != '\t' && ch != '\r') content++;
        text->p[w++] = ch;
    }
    text->len = w;
    *pages = np;
    if (!content)
        return df_err_set(err, DF_ERR_ARG, 0, "the PDF has %d page%s but no text layer (a scan? run OCR on it first, "
                          "e.g. ocrmypdf)", np, np == 1 ? "" : "s");
    return 0;
}

/* ---- rendering ------------------------------------------------------------ */

static int is_text_type(const char *t)
{
    return !strncmp(t, "text/", 5) || !strcmp(t, "application/json") || !strcmp(t, "application/x-ndjson") ||
           !strcmp(t, "application/xml") || !strcmp(t, "application/yaml") || !strcmp(t, "application/x-yaml");
}

/* An attribute value: one line, no quotes, at most 200 bytes. */
static void put_attr(json_buf *out, const char *k, const char *v)
{
    size_t n = utf8_cut(v, strlen(v), 200);
    json_buf_puts(out, k);
    json_buf_puts(out, "=\"");
    for (size_t i = 0; i < n; i++)
        json_buf_putc(out, v[i] == '"' ? '\'' : v[i] == '\n' || v[i] == '\r' || v[i] == '\t' ? ' ' : v[i]);
    json_buf_putc(out, '"');
}

static int check_text(const unsigned char *d, size_t n, df_error *err)
{
    for (size_t i = 0; i < n;) {
        size_t l = utf8_char_len(d + i, n - i);
        if (!l) return df_err_set(err, DF_ERR_ARG, (int64_t)i, "the document is not UTF-8 text (byte %zu); text "
                                  "documents must be UTF-8, and PDFs sent as application/pdf", i);
        if (d[i] == 0) return df_err_set(err, DF_ERR_ARG, (int64_t)i, "the document holds a NUL byte at %zu: not text", i);
        i += l;
    }
    return 0;
}

int doc_render(const doc_limits *lim, const char *media_type, const char *name, const char *context,
               const unsigned char *data, size_t n, json_buf *out, int *pages, df_error *err)
{
    int np = 0;
    if (pages) *pages = 0;
    if (n > cap_bytes(lim))
        return df_err_set(err, DF_ERR_ARG, 0, "the document is %zu bytes; documents are capped at %zu bytes "
                          "(--max-document-bytes)", n, cap_bytes(lim));
    char sniffed[32];
    if (!media_type || !*media_type) {
        snprintf(sniffed, sizeof sniffed, "%s", n >= 5 && !memcmp(data, "%PDF-", 5) ? "application/pdf" : "text/plain");
        media_type = sniffed;
    }
    char type[64];
    size_t tl = strcspn(media_type, ";");
    snprintf(type, sizeof type, "%.*s", (int)(tl < sizeof type - 1 ? tl : sizeof type - 1), media_type);
    for (char *p = type; *p; p++)
        if (*p >= 'A' && *p <= 'Z') *p = (char)(*p - 'A' + 'a');
    while (tl && type[strlen(type) - 1] == ' ') type[strlen(type) - 1] = 0;
    json_buf text;
    json_buf_init(&text);
    int rc;
    if (!strcmp(type, "application/pdf")) {
        rc = pdf_text(lim, data, n, &text, &np, err);
    } else if (is_text_type(type)) {
        rc = check_text(data, n, err);
        if (!rc) json_buf_put(&text, (const char *)data, n);
    } else {
        rc = df_err_set(err, DF_ERR_ARG, 0, "documents of type \"%.*s\" are not read here (text, Markdown and PDF "
                        "are: text/plain, text/markdown, application/pdf)", (int)utf8_cut(type, strlen(type), 60), type);
    }
    if (rc) {
        json_buf_free(&text);
        return -1;
    }
    while (text.len && (text.p[text.len - 1] == '\n' || text.p[text.len - 1] == ' ' || text.p[text.len - 1] == '\r'))
        text.len--;
    json_buf_puts(out, "<document");
    if (name && *name) put_attr(out, " name", name);
    if (np) {
        char pg[16];
        snprintf(pg, sizeof pg, "%d", np);
        put_attr(out, " pages", pg);
    }
    json_buf_puts(out, ">\n");
    if (context && *context) {
        json_buf_puts(out, "<context>");
        json_buf_puts(out, context);
        json_buf_puts(out, "</context>\n");
    }
    json_buf_put(out, text.p ? text.p : "", text.len);
    json_buf_puts(out, "\n</document>\n\n");
    json_buf_free(&text);
    if (pages) *pages = np;
    return 0;
}

int doc_render_file(const doc_limits *lim, const char *path, json_buf *out, df_error *err)
{
    if (!strcmp(path, "-")) return df_err_set(err, DF_ERR_ARG, 0, "--attach -: standard input is the prompt's "
                                              "(--prompt-file -); attach a file by its path");
    char *data = NULL;
    size_t n = 0;
    struct stat st;
    if (stat(path, &st)) return df_err_set(err, DF_ERR_IO, 0, "--attach %s: %s", path, strerror(errno));
    if (!S_ISREG(st.st_mode)) return df_err_set(err, DF_ERR_ARG, 0, "--attach %s: not a regular file", path);
    if ((size_t)st.st_size > cap_bytes(lim))
        return df_err_set(err, DF_ERR_ARG, 0, "--attach %s: %lld bytes; documents are capped at %zu bytes "
                          "(--max-document-bytes)", path, (long long)st.st_size, cap_bytes(lim));
    if (read_small_file(path, &data, &n, cap_bytes(lim), err)) return -1;
    const char *dot = strrchr(path, '.'), *slash = strrchr(path, '/');
    const char *base = slash ? slash + 1 : path;
    const char *type = NULL;
    if (dot && dot > base) {
        if (!strcasecmp(dot, ".pdf")) type = "application/pdf";
        else if (!strcasecmp(dot, ".md") || !strcasecmp(dot, ".markdown")) type = "text/markdown";
        else if (!strcasecmp(dot, ".txt")) type = "text/plain";
    }
    int rc = doc_render(lim, type, base, NULL, (const unsigned char *)data, n, out, NULL, err);
    if (rc) df_err_prefix(err, "--attach %s", path);
    free(data);
    return rc;
}
