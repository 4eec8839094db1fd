/* web_page.h - the chat page (GET /) as the binary carries it.
 *
 * The page is built from web/ (npm, esbuild: web/build.mjs) into one HTML
 * file with its script and styles inline, gzip-compressed and committed as
 * web/dist/index.html.gz; the Makefile turns that file into a C array
 * ($(BUILD)/web_page.c, od + awk), so `make` needs no npm and the server
 * needs no file on disk.  The bytes are served as they are, with
 * Content-Encoding: gzip, to clients that accept gzip (server.c).
 * `make web` rebuilds the bundle; `make web-check` (in `make check`) fails
 * when the committed one is not what web/src and web/package-lock.json build.
 */
#ifndef DF_WEB_PAGE_H
#define DF_WEB_PAGE_H
#include <stddef.h>

extern const unsigned char web_page_gz[]; /* a gzip member: the page's UTF-8 HTML */
extern const size_t web_page_gz_len;      /* its length in bytes */

#endif
