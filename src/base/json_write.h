/* json_write.h - a small JSON writer: a growable byte buffer, string and
 * number spellings, and whole json_value trees in the two styles K3's chat
 * template needs.
 *
 * Owns: json_buf (append-only, NUL-terminated, grows with xrealloc) and the
 * spelling rules.  Does not own: parsing (json.h), pretty-printing with
 * newlines, or any policy about which style a caller uses.
 * Spellings (they must match the Python/serde reference renderer byte for
 * byte, spec section 10):
 *   - strings: `"` and `\` escaped, \b \f \n \r \t short forms, other bytes
 *     below 0x20 as \u00xx (lower-case hex); everything else, non-ASCII
 *     included, written as is (ensure_ascii=False / serde_json behaviour);
 *   - numbers: exact integers as decimal; other numbers as Python's repr of
 *     the double (shortest round trip, "1.0", "1e+16", "1e-05");
 *   - JSON_WRITE_SORTED sorts object keys by bytes (= code points) at every
 *     depth; JSON_WRITE_SPACED uses ", " and ": " separators (Python's
 *     json.dumps default), otherwise "," and ":".
 * Allocates: only when the buffer grows; never use under alloc_guard.
 */
#ifndef DF_JSON_WRITE_H
#define DF_JSON_WRITE_H

#include <stddef.h>
#include "json.h"

typedef struct json_buf {
    char *p;      /* NUL-terminated when len > 0 or after json_buf_reserve */
    size_t len;
    size_t cap;
} json_buf;

enum json_write_flags {
    JSON_WRITE_SORTED = 1,  /* keys sorted recursively */
    JSON_WRITE_SPACED = 2,  /* ", " and ": " instead of "," and ":" */
};

void json_buf_init(json_buf *b);
void json_buf_free(json_buf *b);
void json_buf_reserve(json_buf *b, size_t extra);
void json_buf_put(json_buf *b, const char *s, size_t n);
void json_buf_puts(json_buf *b, const char *s);
void json_buf_putc(json_buf *b, char c);

/* A JSON string literal (with quotes) for s[0..n). */
void json_write_string(json_buf *b, const char *s, size_t n);
/* Python repr of a double; a NaN or infinity is written as null (JSON has no
 * spelling for them; json.c refuses literals that overflow). */
void json_write_double(json_buf *b, double x);
/* A NUMBER value: exact int64 when is_int, else json_write_double. */
void json_write_number(json_buf *b, const json_value *v);
/* A whole tree; flags from enum json_write_flags. */
void json_write_value(json_buf *b, const json_value *v, int flags);

#endif
