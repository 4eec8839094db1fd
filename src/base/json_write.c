/* json_write.c - see json_write.h for the spelling rules.
 *
 * Doubles: the shortest "%.*e" precision that reads back to the same double
 * gives the digits (glibc printf is correctly rounded), then Python's repr
 * layout is applied: positional when the decimal exponent is in [-4, 16),
 * scientific ("1.5e+16", two-digit minimum exponent) otherwise.  This agrees
 * with Python's shortest-repr algorithm except, in theory, at some exact
 * powers of two where an asymmetric rounding interval admits a shorter
 * string that is not the nearest one; JSON inputs never rely on that.
 */
#include "json_write.h"
#include "util.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void json_buf_init(json_buf *b) { memset(b, 0, sizeof *b); }

void json_buf_free(json_buf *b)
{
    free(b->p);
    memset(b, 0, sizeof *b);
}

void json_buf_reserve(json_buf *b, size_t extra)
{
    CHECK(extra < SIZE_MAX / 2 - b->len);
    if (b->len + extra + 1 <= b->cap) return;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < b->len + extra + 1) cap *= 2;
    b->p = xrealloc(b->p, cap);
    b->cap = cap;
    b->p[b->len] = 0;
}

void json_buf_put(json_buf *b, const char *s, size_t n)
{
    json_buf_reserve(b, n);
    if (n) memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
}

void json_buf_puts(json_buf *b, const char *s) { json_buf_put(b, s, strlen(s)); }
void json_buf_putc(json_buf *b, char c) { json_buf_put(b, &c, 1); }

void json_write_string(json_buf *b, const char *s, size_t n)
{
    static const char hex[] = "0123456789abcdef";
    json_buf_reserve(b, n + 2);
    json_buf_putc(b, '"');
    size_t run = 0; /* start of the pending unescaped run */
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c != '"' && c != '\\') continue;
        json_buf_put(b, s + run, i - run);
        run = i + 1;
        char esc[7] = {'\\', 0, 0, 0, 0, 0, 0};
        size_t k = 2;
        switch (c) {
        case '"': esc[1] = '"'; break;
        case '\\': esc[1] = '\\'; break;
        case '\b': esc[1] = 'b'; break;
        case '\f': esc[1] = 'f'; break;
        case '\n': esc[1] = 'n'; break;
        case '\r': esc[1] = 'r'; break;
        case '\t': esc[1] = 't'; break;
        default:
            esc[1] = 'u', esc[2] = '0', esc[3] = '0', esc[4] = hex[c >> 4], esc[5] = hex[c & 15];
            k = 6;
        }
        json_buf_put(b, esc, k);
    }
    json_buf_put(b, s + run, n - run);
    json_buf_putc(b, '"');
}

void json_write_double(json_buf *b, double x)
{
    /* JSON has no spelling for these: null (the reader refuses literals
     * that overflow, and the server's numbers are checked before they are
     * written, so this is a last line, never valid-looking garbage) */
    if (isnan(x) || isinf(x)) { json_buf_puts(b, "null"); return; }
    if (x == 0) { json_buf_puts(b, signbit(x) ? "-0.0" : "0.0"); return; }
    char sci[40];
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(sci, sizeof sci, "%.*e", prec - 1, x);
        if (strtod(sci, NULL) == x) break;
    }
    /* sci = [-]d[.ddd]e(+|-)XX: collect the digits and the exponent. */
    const char *q = sci;
    int neg = *q == '-';
    if (neg) q++;
    char dig[24];
    int nd = 0;
    for (; *q && *q != 'e'; q++)
        if (*q != '.') dig[nd++] = *q;
    int e = atoi(q + 1);
    while (nd > 1 && dig[nd - 1] == '0') nd--;
    char out[48];
    int o = 0;
    if (neg) out[o++] = '-';
    if (e < -4 || e >= 16) {
        out[o++] = dig[0];
        if (nd > 1) {
            out[o++] = '.';
            for (int i = 1; i < nd; i++) out[o++] = dig[i];
        }
        o += snprintf(out + o, sizeof out - (size_t)o, "e%c%02d", e < 0 ? '-' : '+', e < 0 ? -e : e);
    } else if (e >= 0) {
        for (int i = 0; i <= e; i++) out[o++] = i < nd ? dig[i] : '0';
        out[o++] = '.';
        if (nd > e + 1)
            for (int i = e + 1; i < nd; i++) out[o++] = dig[i];
        else
            out[o++] = '0';
    } else {
        out[o++] = '0';
        out[o++] = '.';
        for (int i = 0; i < -e - 1; i++) out[o++] = '0';
        for (int i = 0; i < nd; i++) out[o++] = dig[i];
    }
    json_buf_put(b, out, (size_t)o);
}

void json_write_number(json_buf *b, const json_value *v)
{
    if (v->is_int) {
        char s[24];
        int n = snprintf(s, sizeof s, "%" PRId64, v->i);
        json_buf_put(b, s, (size_t)n);
    } else {
        json_write_double(b, v->num);
    }
}

/* Stable merge sort of key indices (reentrant, unlike qsort with a static
 * context: the server renders on several threads). */
static void sort_keys(const json_value *v, size_t *a, size_t *tmp, size_t n)
{
    if (n < 2) return;
    size_t h = n / 2;
    sort_keys(v, a, tmp, h);
    sort_keys(v, a + h, tmp, n - h);
    size_t i = 0, j = h, k = 0;
    while (i < h && j < n) tmp[k++] = strcmp(v->keys[a[j]], v->keys[a[i]]) < 0 ? a[j++] : a[i++];
    while (i < h) tmp[k++] = a[i++];
    while (j < n) tmp[k++] = a[j++];
    memcpy(a, tmp, n * sizeof *a);
}

void json_write_value(json_buf *b, const json_value *v, int flags)
{
    const char *comma = flags & JSON_WRITE_SPACED ? ", " : ",";
    const char *colon = flags & JSON_WRITE_SPACED ? ": " : ":";
    switch (v->type) {
    case JSON_NULL: json_buf_puts(b, "null"); return;
    case JSON_BOOL: json_buf_puts(b, v->b ? "true" : "false"); return;
    case JSON_NUMBER: json_write_number(b, v); return;
    case JSON_STRING: json_write_string(b, v->str, v->len); return;
    case JSON_ARRAY:
        json_buf_putc(b, '[');
        for (size_t i = 0; i < v->len; i++) {
            if (i) json_buf_puts(b, comma);
            json_write_value(b, v->items[i], flags);
        }
        json_buf_putc(b, ']');
        return;
    case JSON_OBJECT: {
        size_t *order = xmalloc((v->len ? 2 * v->len : 1) * sizeof *order);
        for (size_t i = 0; i < v->len; i++) order[i] = i;
        if (flags & JSON_WRITE_SORTED) sort_keys(v, order, order + v->len, v->len);
        json_buf_putc(b, '{');
        for (size_t k = 0; k < v->len; k++) {
            size_t i = order[k];
            if (k) json_buf_puts(b, comma);
            json_write_string(b, v->keys[i], strlen(v->keys[i]));
            json_buf_puts(b, colon);
            json_write_value(b, v->items[i], flags);
        }
        json_buf_putc(b, '}');
        free(order);
        return;
    }
    }
}
