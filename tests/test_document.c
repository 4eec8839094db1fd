/* test_document.c - documents rendered into a prompt (src/app/document.c).
 *
 * Text and Markdown checked and copied; PDFs through poppler's pdftotext
 * (the PDFs are written here, with a correct xref table); the child's
 * limits checked with stand-in programs that hang, crash, flood or are
 * missing; data: URLs and base64; --attach's files.  pdftotext must be
 * installed (.ci/setup installs poppler-utils): without it the PDF tests
 * fail, naming it, rather than pass.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include "clock.h"
#include "document.h"
#include "harness.h"
#include "util.h"

/* A PDF of n pages of Helvetica text (NULL: an empty page), xref exact. */
static size_t make_pdf(const char *const *pages, int n, char *out, size_t cap)
{
    size_t len = 0, offs[32];
    int no = 0;
#define PUT(...) (len += (size_t)snprintf(out + len, cap - len, __VA_ARGS__))
    PUT("%%PDF-1.4\n");
    offs[no++] = len;
    PUT("1 0 obj\n<< /Type /Catalog /Pages 2 0 R >>\nendobj\n");
    offs[no++] = len;
    PUT("2 0 obj\n<< /Type /Pages /Kids [");
    for (int i = 0; i < n; i++) PUT("%d 0 R ", 3 + 2 * i);
    PUT("] /Count %d >>\nendobj\n", n);
    int font = 3 + 2 * n;
    for (int i = 0; i < n; i++) {
        char s[512] = "";
        if (pages[i]) snprintf(s, sizeof s, "BT /F1 12 Tf 72 720 Td (%s) Tj ET", pages[i]);
        offs[no++] = len;
        PUT("%d 0 obj\n<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Resources << /Font << /F1 %d 0 R >> >> "
            "/Contents %d 0 R >>\nendobj\n", 3 + 2 * i, font, 4 + 2 * i);
        offs[no++] = len;
        PUT("%d 0 obj\n<< /Length %zu >>\nstream\n%s\nendstream\nendobj\n", 4 + 2 * i, strlen(s), s);
    }
    offs[no++] = len;
    PUT("%d 0 obj\n<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>\nendobj\n", font);
    size_t x = len;
    PUT("xref\n0 %d\n0000000000 65535 f \n", no + 1);
    for (int i = 0; i < no; i++) PUT("%010zu 00000 n \n", offs[i]);
    PUT("trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%zu\n%%%%EOF\n", no + 1, x);
#undef PUT
    return len;
}

static int have_pdftotext(void)
{
    char tool[64];
    for (const char *d = "/usr/bin", *d2 = "/usr/local/bin"; d; d = d2, d2 = NULL) {
        snprintf(tool, sizeof tool, "%s/pdftotext", d);
        if (!access(tool, X_OK)) return 1;
    }
    t_fail(__FILE__, __LINE__, "pdftotext not found: apt-get install poppler-utils (the PDF checks did not run)");
    return 0;
}

static void text_documents(void)
{
    json_buf b;
    json_buf_init(&b);
    df_error err = {0};
    const char *md = "# Title\n\nbody\n\n\n";
    int pages = -1;
    TCHECK(doc_render(NULL, "text/markdown", "notes.md", NULL, (const unsigned char *)md, strlen(md), &b, &pages, &err) == 0);
    json_buf_putc(&b, 0);
    TCHECK(b.p && !strcmp(b.p, "<document name=\"notes.md\">\n# Title\n\nbody\n</document>\n\n"));
    TCHECK(pages == 0);
    /* names are one line without double quotes; context goes first */
    b.len = 0;
    TCHECK(doc_render(NULL, "TEXT/Plain; charset=utf-8", "a \"b\"\nc", "why", (const unsigned char *)"x", 1, &b, NULL,
                      &err) == 0);
    json_buf_putc(&b, 0);
    TCHECK(b.p && !strcmp(b.p, "<document name=\"a 'b' c\">\n<context>why</context>\nx\n</document>\n\n"));
    /* sniffed: valid UTF-8 is text */
    b.len = 0;
    TCHECK(doc_render(NULL, NULL, NULL, NULL, (const unsigned char *)"h\xc3\xa9", 3, &b, NULL, &err) == 0);
    json_buf_putc(&b, 0);
    TCHECK(b.p && !strcmp(b.p, "<document>\nh\xc3\xa9\n</document>\n\n"));
    /* refused: bad UTF-8 (with its byte), NUL, other types, over the cap */
    b.len = 0;
    TCHECK(doc_render(NULL, "text/plain", NULL, NULL, (const unsigned char *)"ab\xff", 3, &b, NULL, &err) == -1);
    TCHECK(err.code == DF_ERR_ARG && strstr(err.msg, "not UTF-8 text (byte 2)"));
    df_err_clear(&err);
    TCHECK(doc_render(NULL, "text/plain", NULL, NULL, (const unsigned char *)"a\0b", 3, &b, NULL, &err) == -1);
    TCHECK(strstr(err.msg, "NUL byte at 1") != NULL);
    df_err_clear(&err);
    TCHECK(doc_render(NULL, "image/png", NULL, NULL, (const unsigned char *)"x", 1, &b, NULL, &err) == -1);
    TCHECK(strstr(err.msg, "\"image/png\" are not read here") != NULL);
    df_err_clear(&err);
    doc_limits small = {.max_bytes = 4};
    TCHECK(doc_render(&small, "text/plain", NULL, NULL, (const unsigned char *)"hello", 5, &b, NULL, &err) == -1);
    TCHECK(strstr(err.msg, "capped at 4 bytes (--max-document-bytes)") != NULL);
    df_err_clear(&err);
    TCHECK(b.len == 0); /* nothing appended by a refused document */
    json_buf_free(&b);
}

static void decoding(void)
{
    df_error err = {0};
    unsigned char *bytes = NULL;
    size_t n = 0;
    char type[32];
    const char *url = "data:application/pdf;name=x.pdf;base64,aGVsbG8=";
    TCHECK(doc_decode(url, strlen(url), NULL, type, sizeof type, &bytes, &n, &err) == 0);
    TCHECK(!strcmp(type, "application/pdf") && n == 5 && bytes && !memcmp(bytes, "hello", 5));
    free(bytes);
    TCHECK(doc_decode("aGk=", 4, NULL, type, sizeof type, &bytes, &n, &err) == 0);
    TCHECK(type[0] == 0 && n == 2 && !memcmp(bytes, "hi", 2));
    free(bytes);
    const char *bad[] = {"data:text/plain,hello", "data:text/plain;base64", "aGk", "a b=", "", "data:;base64,"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        df_err_clear(&err);
        TCHECK(doc_decode(bad[i], strlen(bad[i]), NULL, type, sizeof type, &bytes, &n, &err) == -1);
        TCHECK(err.code == DF_ERR_ARG && bytes == NULL);
    }
    df_err_clear(&err);
    doc_limits small = {.max_bytes = 3};
    TCHECK(doc_decode("aGVsbG8gd29ybGQ=", 16, &small, type, sizeof type, &bytes, &n, &err) == -1);
    TCHECK(strstr(err.msg, "capped at 3 bytes") != NULL);
}

static void pdfs(void)
{
    if (!have_pdftotext()) return;
    static char pdf[8192];
    const char *two[] = {"The launch code is 4417.", "Page two says hello."};
    size_t n = make_pdf(two, 2, pdf, sizeof pdf);
    json_buf b;
    json_buf_init(&b);
    df_error err = {0};
    int pages = 0;
    TCHECK(doc_render(NULL, "application/pdf", "r.pdf", NULL, (unsigned char *)pdf, n, &b, &pages, &err) == 0);
    json_buf_putc(&b, 0);
    TCHECK(pages == 2);
    const char *head = "<document name=\"r.pdf\" pages=\"2\">\nThe launch code is 4417.\n";
    TCHECK(b.p && !strncmp(b.p, head, strlen(head)));
    TCHECK(b.p && strstr(b.p, "Page two says hello.\n</document>\n\n") && !strchr(b.p, '\f'));
    /* sniffed as a PDF by its header */
    b.len = 0;
    TCHECK(doc_render(NULL, NULL, NULL, NULL, (unsigned char *)pdf, n, &b, &pages, &err) == 0 && pages == 2);
    /* truncated, not a PDF, no text layer */
    b.len = 0;
    TCHECK(doc_render(NULL, "application/pdf", NULL, NULL, (unsigned char *)pdf, 200, &b, NULL, &err) == -1);
    TCHECK(err.code == DF_ERR_ARG && strstr(err.msg, "not a readable PDF (pdftotext: "));
    df_err_clear(&err);
    TCHECK(doc_render(NULL, "application/pdf", NULL, NULL, (const unsigned char *)"hello", 5, &b, NULL, &err) == -1);
    TCHECK(strstr(err.msg, "does not start with %PDF-") != NULL);
    df_err_clear(&err);
    const char *blank[] = {NULL, NULL, NULL};
    n = make_pdf(blank, 3, pdf, sizeof pdf);
    TCHECK(doc_render(NULL, "application/pdf", NULL, NULL, (unsigned char *)pdf, n, &b, NULL, &err) == -1);
    TCHECK(strstr(err.msg, "has 3 pages but no text layer") != NULL);
    df_err_clear(&err);
    /* the text cap: extraction stops past it */
    n = make_pdf(two, 2, pdf, sizeof pdf);
    doc_limits tiny = {.max_text = 10};
    TCHECK(doc_render(&tiny, "application/pdf", NULL, NULL, (unsigned char *)pdf, n, &b, NULL, &err) == -1);
    TCHECK(strstr(err.msg, "text passes 10 bytes") != NULL);
    df_err_clear(&err);
    TCHECK(b.len == 0);
    json_buf_free(&b);
}

/* Stand-ins for pdftotext: a script in the scratch directory. */
static const char *stand_in(const char *name, const char *body)
{
    static char path[2][512];
    static int k;
    char *p = path[k++ & 1];
    snprintf(p, 512, "%s/%s", test_scratch(), name);
    FILE *f = fopen(p, "w");
    if (!f) return NULL;
    fprintf(f, "#!/bin/sh\n%s\n", body);
    fclose(f);
    chmod(p, 0755);
    return p;
}

static void child_limits(void)
{
    static char pdf[4096];
    const char *one[] = {"x"};
    size_t n = make_pdf(one, 1, pdf, sizeof pdf);
    json_buf b;
    json_buf_init(&b);
    df_error err = {0};
    doc_limits lim = {.pdftotext = "/nonexistent/pdftotext"};
    TCHECK(doc_render(&lim, "application/pdf", NULL, NULL, (unsigned char *)pdf, n, &b, NULL, &err) == -1);
    TCHECK(err.code == DF_ERR_UNSUPPORTED && strstr(err.msg, "apt-get install poppler-utils"));
    df_err_clear(&err);
    /* a hang: killed at the deadline, reported */
    lim = (doc_limits){.pdftotext = stand_in("hang", "exec sleep 30"), .timeout_ms = 300};
    double t0 = now_sec();
    TCHECK(doc_render(&lim, "application/pdf", NULL, NULL, (unsigned char *)pdf, n, &b, NULL, &err) == -1);
    TCHECK(strstr(err.msg, "did not finish this PDF in time (300 ms)") != NULL);
    TCHECK(now_sec() - t0 < 5);
    df_err_clear(&err);
    /* a crash */
    lim = (doc_limits){.pdftotext = stand_in("crash", "kill -SEGV $$")};
    TCHECK(doc_render(&lim, "application/pdf", NULL, NULL, (unsigned char *)pdf, n, &b, NULL, &err) == -1);
    TCHECK(strstr(err.msg, "stopped by signal 11") != NULL);
    df_err_clear(&err);
    /* a flood of output that never reads its input: the cap ends it */
    lim = (doc_limits){.pdftotext = stand_in("flood", "exec yes"), .max_text = 1 << 20};
    TCHECK(doc_render(&lim, "application/pdf", NULL, NULL, (unsigned char *)pdf, n, &b, NULL, &err) == -1);
    TCHECK(strstr(err.msg, "passes 1048576 bytes") != NULL);
    df_err_clear(&err);
    /* a child that exits early without reading a large input: no SIGPIPE here, its complaint reported */
    static char big[1 << 20];
    memcpy(big, "%PDF-1.4\n", 9);
    memset(big + 9, 'a', sizeof big - 9);
    lim = (doc_limits){.pdftotext = stand_in("quit", "echo 'I/O Error: gave up' >&2; exit 1")};
    TCHECK(doc_render(&lim, "application/pdf", NULL, NULL, (unsigned char *)big, sizeof big, &b, NULL, &err) == -1);
    TCHECK(strstr(err.msg, "not a readable PDF (pdftotext: I/O Error: gave up)") != NULL);
    df_err_clear(&err);
    /* the limits the child runs under: 2 GiB of address space (ulimit -v in KiB), 30 s of CPU */
    lim = (doc_limits){.pdftotext = stand_in("limits", "echo \"limits $(ulimit -v) $(ulimit -t)\" >&2; exit 1")};
    TCHECK(doc_render(&lim, "application/pdf", NULL, NULL, (unsigned char *)pdf, n, &b, NULL, &err) == -1);
    TCHECKF(strstr(err.msg, "limits 2097152 30)") != NULL, "%s", err.msg);
    df_err_clear(&err);
    /* the caller's descriptors stay with the caller (a server's sockets and model files) */
    int fd = open("/dev/null", O_RDONLY); /* no O_CLOEXEC */
    char script[200];
    snprintf(script, sizeof script, "if [ -e /proc/$$/fd/%d ]; then echo 'fd %d inherited' >&2; else echo 'fd %d closed' >&2; fi; exit 1",
             fd, fd, fd);
    lim = (doc_limits){.pdftotext = stand_in("fds", script)};
    TCHECK(doc_render(&lim, "application/pdf", NULL, NULL, (unsigned char *)pdf, n, &b, NULL, &err) == -1);
    TCHECKF(strstr(err.msg, "closed)") != NULL, "%s", err.msg);
    df_err_clear(&err);
    close(fd);
    TCHECK(b.len == 0);
    json_buf_free(&b);
}

/* Three PDFs at once: two children run, the third waits for a slot. */
typedef struct {
    doc_limits lim;
    const char *pdf;
    size_t n;
    df_error err;
    int rc;
} burst_arg;

static void *burst_one(void *p)
{
    burst_arg *a = p;
    json_buf b;
    json_buf_init(&b);
    a->rc = doc_render(&a->lim, "application/pdf", NULL, NULL, (const unsigned char *)a->pdf, a->n, &b, NULL, &a->err);
    json_buf_free(&b);
    return NULL;
}

static void child_burst(void)
{
    static char pdf[4096];
    const char *one[] = {"x"};
    size_t n = make_pdf(one, 1, pdf, sizeof pdf);
    const char *slow = stand_in("slow", "cat >/dev/null; sleep 1; echo 'slow: gave up' >&2; exit 1");
    burst_arg args[3];
    pthread_t th[3];
    double t0 = now_sec();
    for (int i = 0; i < 3; i++) {
        args[i] = (burst_arg){.lim = {.pdftotext = slow, .timeout_ms = 1800}, .pdf = pdf, .n = n};
        TCHECK(pthread_create(&th[i], NULL, burst_one, &args[i]) == 0);
    }
    for (int i = 0; i < 3; i++) pthread_join(th[i], NULL);
    double dt = now_sec() - t0;
    for (int i = 0; i < 3; i++)
        TCHECKF(args[i].rc == -1 && strstr(args[i].err.msg, "pdftotext: slow: gave up"), "%d: %s", i, args[i].err.msg);
    TCHECKF(dt > 1.9 && dt < 5, "three 1 s children took %.2f s: not two at a time", dt);
}

static void attach_files(void)
{
    char path[600];
    snprintf(path, sizeof path, "%s/notes.MD", test_scratch());
    FILE *f = fopen(path, "w");
    TCHECK(f != NULL);
    if (!f) return;
    fputs("- a\n- b\n", f);
    fclose(f);
    json_buf b;
    json_buf_init(&b);
    df_error err = {0};
    TCHECK(doc_render_file(NULL, path, &b, &err) == 0);
    json_buf_putc(&b, 0);
    TCHECK(b.p && !strcmp(b.p, "<document name=\"notes.MD\">\n- a\n- b\n</document>\n\n"));
    b.len = 0;
    TCHECK(doc_render_file(NULL, "-", &b, &err) == -1 && strstr(err.msg, "standard input is the prompt's"));
    df_err_clear(&err);
    TCHECK(doc_render_file(NULL, "/nonexistent/x.txt", &b, &err) == -1 && strstr(err.msg, "/nonexistent/x.txt"));
    df_err_clear(&err);
    TCHECK(doc_render_file(NULL, test_scratch(), &b, &err) == -1 && strstr(err.msg, "not a regular file"));
    df_err_clear(&err);
    doc_limits small = {.max_bytes = 3};
    TCHECK(doc_render_file(&small, path, &b, &err) == -1 && strstr(err.msg, "capped at 3 bytes"));
    json_buf_free(&b);
}

static const test_case tests[] = {
    {"text_documents", text_documents}, {"decoding", decoding}, {"pdfs", pdfs},
    {"child_limits", child_limits},     {"child_burst", child_burst},       {"attach_files", attach_files},
};

int main(int argc, char **argv)
{
    int rc = test_main(tests, (int)(sizeof tests / sizeof tests[0]), argc, argv);
    test_scratch_remove();
    return rc;
}
