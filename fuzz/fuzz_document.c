/* fuzz_document.c - libFuzzer target for documents (src/app/document.c).
 *
 * The first byte picks the path: 0 a data: URL or bare base64, decoded and
 * rendered with the type it names (or sniffed); 1 a Markdown text; 2 a PDF
 * through poppler's pdftotext in its child (when installed).  Checked: an
 * error always has a message; a rendered document is valid UTF-8, opens with
 * "<document" and ends with "</document>\n\n"; a refused one appends nothing.
 */
#include <stdlib.h>
#include <string.h>
#include "document.h"
#include "util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(int rc, const json_buf *b, size_t before, const df_error *err)
{
    if (rc) {
        if (!err->msg[0] || b->len != before) abort();
        return;
    }
    const char *p = b->p + before;
    size_t n = b->len - before;
    static const char tail[] = "</document>\n\n";
    if (n < 9 || memcmp(p, "<document", 9) || n < sizeof tail - 1 || memcmp(p + n - (sizeof tail - 1), tail, sizeof tail - 1))
        abort();
    if (!utf8_valid(p, n)) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!size) return 0;
    doc_limits lim = {.max_bytes = 1 << 20, .max_text = 1 << 20, .timeout_ms = 5000};
    json_buf b;
    json_buf_init(&b);
    json_buf_puts(&b, "x");
    df_error err = {0};
    const uint8_t mode = data[0] % 3;
    data++, size--;
    int rc;
    if (mode == 0) {
        unsigned char *bytes = NULL;
        size_t nb = 0;
        char type[64];
        rc = doc_decode((const char *)data, size, &lim, type, sizeof type, &bytes, &nb, &err);
        if (!rc) {
            rc = doc_render(&lim, type, "f.bin", NULL, bytes, nb, &b, NULL, &err);
            check(rc, &b, 1, &err);
        } else if (!err.msg[0] || bytes) {
            abort();
        }
        free(bytes);
    } else {
        rc = doc_render(&lim, mode == 1 ? "text/markdown" : "application/pdf", "a \"name\"\n", "ctx", data, size, &b,
                        NULL, &err);
        check(rc, &b, 1, &err);
    }
    json_buf_free(&b);
    return 0;
}
