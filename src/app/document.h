/* document.h - documents (text, Markdown, PDF) rendered into a prompt's text.
 *
 * Owns: the one rendering of a document that the server's three APIs
 * (Anthropic `document` blocks, OpenAI chat `file` parts, Responses
 * `input_file` items) and the CLI's --attach share, so that the same file
 * gives the same prompt ids whichever way it arrives; PDF text extraction
 * by poppler's pdftotext in a child process with CPU, memory, time and
 * output limits (a malformed or hostile PDF costs an error, never the
 * server); data: URLs and strict base64.
 * Invariants: a rendered document is
 *     <document name="NAME" pages="N">\nTEXT\n</document>\n\n
 * (name and pages only when known), TEXT valid UTF-8 without NUL; the only
 * state kept between calls is the count of running pdftotext children
 * (at most two; thread-safe).
 */
#ifndef DF_DOCUMENT_H
#define DF_DOCUMENT_H
#include <stddef.h>
#include "df_error.h"
#include "json_write.h"

#define DOC_MAX_BYTES_DEFAULT ((size_t)32 << 20)

typedef struct doc_limits {
    size_t max_bytes;      /* a document's own bytes (decoded); 0 = DOC_MAX_BYTES_DEFAULT */
    size_t max_text;       /* extracted PDF text; 0 = 64 MiB */
    int timeout_ms;        /* pdftotext wall time; 0 = 60 s */
    const char *pdftotext; /* NULL: $DELTAFIN_PDFTOTEXT, else pdftotext on PATH */
} doc_limits;

/* df_error codes: DF_ERR_ARG for a document at fault (the caller's 400),
 * DF_ERR_UNSUPPORTED when this machine cannot read it (no pdftotext). */

/* Render DATA[0..n) as a document into OUT (appended).  media_type NULL:
 * sniffed (%PDF- is a PDF, valid UTF-8 is text).  Types read: application/pdf,
 * text/ anything (text/plain, text/markdown, text/csv, ...), application/json.
 * name and context may be NULL; pages (may be NULL) gets the PDF's page
 * count, 0 for text. */
int doc_render(const doc_limits *lim, const char *media_type, const char *name, const char *context,
               const unsigned char *data, size_t n, json_buf *out, int *pages, df_error *err);

/* "data:TYPE[;params];base64,DATA" or bare base64: the bytes (malloc'd) and
 * the media type (copied into type, "" when not given).  Strict base64. */
int doc_decode(const char *s, size_t n, const doc_limits *lim, char *type, size_t type_cap, unsigned char **bytes,
               size_t *nb, df_error *err);

/* A file for --attach: read (at most the byte cap), typed by its extension
 * (.pdf, .md / .markdown, .txt, else sniffed) and rendered under its base
 * name.  PATH "-" is refused (standard input is the prompt's). */
int doc_render_file(const doc_limits *lim, const char *path, json_buf *out, df_error *err);

#endif
