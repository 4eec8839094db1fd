/* test_json.c - the JSON reader: values, escapes, exact integers, and the
 * first error with its byte offset for malformed input; the UTF-8 rules it
 * shares with the server (util.h): well-formedness and cutting on a
 * character boundary. */
#include "harness.h"
#include "json.h"
#include "json_write.h"
#include "util.h"

#include <math.h>
#include <string.h>

static json_doc *parse(const char *s, df_error *err)
{
    err->code = 0;
    err->msg[0] = 0;
    return json_parse(s, strlen(s), err);
}

static void test_values(void)
{
    df_error err;
    json_doc *d = parse(" {\"a\": [1, -2, 3.5, 1e3, true, false, null, \"x\\u00e9\\ud83d\\ude00\\n\"], \"big\": 9007199254740993,"
                        " \"o\": {}} ", &err);
    TCHECK(d);
    if (!d) return;
    const json_value *r = json_root(d), *a = json_get(r, "a");
    TCHECK(a && a->type == JSON_ARRAY && a->len == 8);
    TCHECK(a->items[0]->is_int && a->items[0]->i == 1);
    TCHECK(a->items[1]->is_int && a->items[1]->i == -2);
    TCHECK(!a->items[2]->is_int && a->items[2]->num == 3.5);
    TCHECK(!a->items[3]->is_int && a->items[3]->num == 1000.0);
    TCHECK(a->items[4]->type == JSON_BOOL && a->items[4]->b == 1);
    TCHECK(a->items[6]->type == JSON_NULL);
    TCHECK(!strcmp(a->items[7]->str, "x\xc3\xa9\xf0\x9f\x98\x80\n"));
    int64_t big;
    TCHECK(json_get_int(r, "big", &big) == 0 && big == 9007199254740993ll);
    TCHECK(json_get(r, "o")->type == JSON_OBJECT && json_get(r, "o")->len == 0);
    TCHECK(json_get(r, "missing") == NULL);
    json_free(d);
}

static void test_errors(void)
{
    static const struct { const char *text; const char *msg; long pos; } bad[] = {
        {"", "unexpected end", 0},
        {"{\"a\":1,}", "expected object key", 7},
        {"[1 2]", "expected ','", 3},
        {"{\"a\":1} x", "trailing", 8},
        {"\"abc", "unterminated string", -1},
        {"\"a\\q\"", "bad escape", 3},
        {"\"\\ud800\"", "surrogate", -1},
        {"01", "trailing", 1},
        {"-", "truncated number", 1},
        {"1.", "bad fraction", 2},
        {"{\"a\":1,\"a\":2}", "duplicate key", 0},
        {"\"\x01\"", "control character", 1},
        {"\"\xc3\x28\"", "invalid UTF-8", 1},
        {"nul", "unexpected character", 0},
        /* past a double's range: infinity has no JSON spelling to write back */
        {"{\"x\":1e999}", "out of range", -1},
        {"[-1e400]", "out of range", -1},
        {"[1234567890123456789012345678901234567890123456789012345678901234567890e300]", "out of range", -1},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        df_error err;
        json_doc *d = parse(bad[i].text, &err);
        TCHECKF(!d, "accepted \"%s\"", bad[i].text);
        TCHECKF(err.code == DF_ERR_FORMAT && strstr(err.msg, bad[i].msg), "\"%s\": message \"%s\"", bad[i].text,
                err.msg);
        if (bad[i].pos >= 0) TCHECKF(err.pos == bad[i].pos, "\"%s\": position %lld", bad[i].text, (long long)err.pos);
        json_free(d);
    }
    char deep[200];
    memset(deep, '[', sizeof deep - 1);
    deep[sizeof deep - 1] = 0;
    df_error err;
    TCHECK(!parse(deep, &err) && strstr(err.msg, "too deep"));
}

/* The writer never spells a NaN or an infinity (not JSON): null. */
static void test_write_nonfinite(void)
{
    const double xs[] = {NAN, INFINITY, -INFINITY, 1.5};
    const char *want[] = {"null", "null", "null", "1.5"};
    for (int i = 0; i < 4; i++) {
        json_buf b;
        json_buf_init(&b);
        json_write_double(&b, xs[i]);
        json_buf_putc(&b, 0);
        TCHECKF(!strcmp(b.p, want[i]), "%g written as %s", xs[i], b.p);
        json_buf_free(&b);
    }
}

/* json_scalar_type agrees with json_parse on every input (it shares the
 * grammar) and answers -1 for strings and containers. */
static void test_scalar_type(void)
{
    static const char *in[] = {"3", " -0.5e+3 ", "1e", "01", "-", "true", "false ", "null", "nul", "truex", "\"s\"",
                               "[1]", "{}", "", " ", "1 2", "9007199254740993", "1.", ".5", "\t\n0\r"};
    for (size_t i = 0; i < sizeof in / sizeof in[0]; i++) {
        df_error err = {0};
        json_doc *d = json_parse(in[i], strlen(in[i]), &err);
        enum json_type want = d ? json_root(d)->type : JSON_STRING, got = JSON_STRING;
        int scalar = d && (want == JSON_NUMBER || want == JSON_BOOL || want == JSON_NULL);
        int rc = json_scalar_type(in[i], strlen(in[i]), &got);
        TCHECKF(scalar ? rc == 0 && got == want : rc == -1, "\"%s\": json_parse %s, json_scalar_type %d", in[i],
                d ? json_type_name(want) : "fails", rc);
        json_free(d);
    }
}

static void test_utf8(void)
{
    /* well-formed: ASCII, 2, 3, 4 bytes; ill-formed: overlong, surrogate,
     * above U+10FFFF, bad continuation, cut short */
    TCHECK(utf8_valid("a\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80", 10));
    static const char *bad[] = {"\xC0\xAF", "\xE0\x80\xAF", "\xED\xA0\x80", "\xF4\x90\x80\x80", "\xC3(", "\xE2\x82",
                                "\x80", "\xFF"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) TCHECKF(!utf8_valid(bad[i], strlen(bad[i])), "bad %zu", i);
    /* a string of 3-byte characters after 0..2 ASCII bytes, cut at every
     * length: the cut never splits a character and loses at most 2 bytes */
    for (int lead = 0; lead < 3; lead++) {
        char s[64];
        size_t n = 0;
        for (int i = 0; i < lead; i++) s[n++] = 'a';
        while (n + 3 <= sizeof s) memcpy(s + n, "\xEE\xA2\x88", 3), n += 3;
        for (size_t max = 0; max <= n + 1; max++) {
            size_t k = utf8_cut(s, n, max);
            TCHECKF(k <= max && k <= n && max - k <= 2 + (max > n ? max - n : 0) && utf8_valid(s, k),
                    "lead %d: cut at %zu gave %zu", lead, max, k);
        }
    }
    /* 4-byte characters; a cut at a boundary keeps everything */
    const char *emoji = "\xF0\x9F\x98\x80\xF0\x9F\x98\x80";
    TCHECK(utf8_cut(emoji, 8, 7) == 4 && utf8_cut(emoji, 8, 5) == 4 && utf8_cut(emoji, 8, 4) == 4 &&
           utf8_cut(emoji, 8, 3) == 0 && utf8_cut(emoji, 8, 8) == 8);
}

static const test_case tests[] = {
    {"write_nonfinite", test_write_nonfinite},
    {"json_values", test_values},
    {"json_errors_with_position", test_errors},
    {"json_scalar_type_matches_parse", test_scalar_type},
    {"utf8_valid_and_cut", test_utf8},
};

int main(int argc, char **argv) { return test_main(tests, NTESTS(tests), argc, argv); }
