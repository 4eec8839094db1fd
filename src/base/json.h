/* json.h - a small strict JSON reader (RFC 8259) building a read-only tree.
 *
 * Owns: parsing text into a tree of json_value nodes held in one arena that
 * json_free releases.  Used at load time only (config.json, the shard index,
 * safetensors headers, test fixtures), never in the token loop.
 * Invariants: strings are decoded UTF-8 with their length kept (embedded NUL
 * allowed); integers without fraction or exponent that fit int64 keep their
 * exact value in .i (is_int = 1); depth is limited to JSON_MAX_DEPTH; the
 * first error is reported with its byte offset.  Duplicate object keys are an
 * error (a header with two entries for one tensor is corrupt, not ambiguous).
 */
#ifndef DF_JSON_H
#define DF_JSON_H

#include <stddef.h>
#include <stdint.h>
#include "df_error.h"

#define JSON_MAX_DEPTH 64

enum json_type { JSON_NULL, JSON_BOOL, JSON_NUMBER, JSON_STRING, JSON_ARRAY, JSON_OBJECT };

typedef struct json_value json_value;
struct json_value {
    enum json_type type;
    int is_int;            /* NUMBER: exact int64 in i */
    int b;                 /* BOOL */
    int64_t i;
    double num;            /* NUMBER (always set) */
    const char *str;       /* STRING: NUL-terminated decoded bytes */
    size_t len;            /* STRING: bytes; ARRAY/OBJECT: entry count */
    json_value **items;    /* ARRAY/OBJECT entries */
    const char **keys;     /* OBJECT keys, parallel to items */
    int64_t pos;           /* byte offset of the value in the input */
};

typedef struct json_doc json_doc;

/* Parse text[0..len).  Returns NULL and fills err on failure. */
json_doc *json_parse(const char *text, size_t len, df_error *err);
void json_free(json_doc *doc);
const json_value *json_root(const json_doc *doc);
/* When text[0..len) is exactly one JSON number, true, false or null (JSON
 * whitespace around it allowed), set *type and return 0; else -1 (strings
 * and containers included).  The same grammar as json_parse, allocating
 * nothing (the chat output parser checks typed tool arguments with it). */
int json_scalar_type(const char *text, size_t len, enum json_type *type);

/* Lookups return NULL when absent or of another shape. */
const json_value *json_get(const json_value *obj, const char *key);
const json_value *json_at(const json_value *arr, size_t i);
/* Typed getters: return 0 on success, -1 if absent or wrong type. */
int json_get_int(const json_value *obj, const char *key, int64_t *out);
int json_get_num(const json_value *obj, const char *key, double *out);
int json_get_bool(const json_value *obj, const char *key, int *out);
const char *json_get_str(const json_value *obj, const char *key);
const char *json_type_name(enum json_type t);

#endif
