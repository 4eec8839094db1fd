/* gr_string.h - strings for the grammar builder (L1): characters as code
 * point sets, encoded as JSON string text or raw UTF-8; a regular subset of
 * ECMAScript patterns (JSON Schema's `pattern`); the regular `format`s.
 *
 * Two encodings of one character:
 *  - GR_STR_JSON: inside a JSON string literal (the quotes are the
 *    caller's): printable ASCII other than '"' and '\\' as itself; '"',
 *    '\\', '\n', '\r', '\t', '\b', '\f' as their two-byte escapes; other
 *    control characters (< 0x20) as \u00XX (lower-case hex); code points
 *    >= 0x80 as their UTF-8 bytes (never \u escapes, never surrogates,
 *    never overlong forms).  Every output decodes to exactly the code
 *    points of the set.
 *  - GR_STR_RAW: the character's UTF-8 bytes (a tool argument's value in
 *    K3's markup is raw text ended by <|close|>), every code point
 *    0..0x10FFFF except surrogates.
 * The first byte of each character's encoding carries `first_flags`
 * (GR_INC when the machine counts characters: maxLength / minLength count
 * code points, as JSON Schema and ajv do); other bytes carry no flag.
 *
 * Patterns: literals and escapes (\\ \/ \. \- \t \n \r \f \v \0 \xHH \uHHHH
 * (a surrogate pair of them is one character), \u{H...}, \cX, escaped ASCII
 * punctuation), `.` (any character but \n \r U+2028 U+2029), classes [...]
 * and [^...] with ranges and \d \w \s \D \W \S inside and outside (\b inside
 * is backspace), groups ( ), (?: ) and (?<name> ), alternation |,
 * quantifiers * + ? {n} {n,} {n,m} (a lazy `?` after them changes nothing
 * here), `^` starting and `$` ending the pattern or one of its top-level
 * alternatives (an unanchored side matches any text there, as ECMAScript's
 * search does).  Anything else (backreferences, lookaround, \b \B, \p,
 * modifiers, `^`/`$` elsewhere, a bound above GR_PATTERN_MAX_REPEAT, more
 * than 20,000 character positions once unrolled) fails with
 * DF_ERR_UNSUPPORTED naming it and its offset; what ECMAScript's `u` mode
 * calls a syntax error fails with DF_ERR_ARG.  A pattern that is one class
 * (or character) repeated ({n,m}, *, +, ?, or once) between both anchors
 * does not unroll when first_flags has GR_INC: it narrows the caller's
 * character counter instead (*cmin, *cmax), so `^[\s\S]{0,300}$` is one
 * loop state and `^.{0,524288}$` costs no more.
 */
#ifndef DF_GR_STRING_H
#define DF_GR_STRING_H

#include <stddef.h>
#include <stdint.h>

#include "df_error.h"
#include "grammar.h"

enum gr_str_mode { GR_STR_JSON, GR_STR_RAW };

#define GR_PATTERN_MAX_REPEAT 1000

/* A set of code points as sorted, disjoint, non-adjacent ranges. */
typedef struct gr_cpset {
    uint32_t (*r)[2]; /* [n][2]: lo, hi inclusive */
    size_t n, cap;
} gr_cpset;

void gr_cpset_init(gr_cpset *s);
void gr_cpset_free(gr_cpset *s);
void gr_cpset_add(gr_cpset *s, uint32_t lo, uint32_t hi);
void gr_cpset_invert(gr_cpset *s); /* within 0..0x10FFFF, surrogates excluded */
void gr_cpset_all(gr_cpset *s);    /* every code point but surrogates */

/* One character of set s, encoded per mode, on edges of machine m from ->
 * to (new intermediate states as needed); the first byte's edges carry
 * first_flags.  An empty set adds nothing. */
void gr_chars(gr_builder *b, int m, int from, int to, const gr_cpset *s, enum gr_str_mode mode,
              unsigned first_flags);

/* The string body (between the quotes, or the raw argument text) for a
 * JSON Schema string with this pattern (NULL: any), from -> to in machine
 * m, characters flagged with first_flags.  *cmin / *cmax are the
 * character counter's bounds (from minLength / maxLength, GR_COUNT_INF for
 * none); a pattern of one repeated class narrows them (see above), and then
 * the body is that class looping (DF_ERR_ARG when no length is left);
 * otherwise they are left as they are for the caller to apply (the body's
 * characters still carry first_flags), and when the bounds are at most
 * GR_PATTERN_MAX_REPEAT and the product stays small the body also counts
 * them itself, so that no prefix it allows misses the window (a pattern's
 * lengths may have gaps the counter's bounds do not see: ^(?:aaa)+$ with
 * 4..5).  Errors name the construct and its offset in the pattern
 * (err->pos). */
int gr_pattern(gr_builder *b, int m, int from, int to, const char *pat, size_t len, enum gr_str_mode mode,
               unsigned first_flags, uint32_t *cmin, uint32_t *cmax, df_error *err);

/* The intersection of n patterns (JSON Schema's allOf of string schemas
 * with patterns, or a pattern with a format's pattern): the bodies every
 * pattern matches, from -> to as gr_pattern (n == 1 is gr_pattern, n == 0
 * any text).  Each pattern of one repeated class narrows *cmin / *cmax as
 * there.  A pattern's error is prefixed "pattern I of N: "; DF_ERR_LIMIT
 * when the product passes GR_PATTERN_MAX_PRODUCT states. */
#define GR_PATTERN_MAX_PRODUCT 100000
int gr_patterns(gr_builder *b, int m, int from, int to, const char *const *pats, const size_t *lens, int n,
                enum gr_str_mode mode, unsigned first_flags, uint32_t *cmin, uint32_t *cmax, df_error *err);

/* A `format` that is regular: date, time, date-time, uuid, uri, email,
 * ipv4, hostname (what the generated text must satisfy is the subset
 * described in gr_string.c, each a subset of what ajv-formats accepts).
 * Unknown formats fail with DF_ERR_UNSUPPORTED naming them. */
int gr_format(gr_builder *b, int m, int from, int to, const char *format, enum gr_str_mode mode,
              unsigned first_flags, df_error *err);
/* The anchored pattern gr_format compiles for a format (for gr_patterns),
 * or NULL for a format it does not know. */
const char *gr_format_pattern(const char *format);

#endif
