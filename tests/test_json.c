/* test_json.c - the JSON reader: values, escapes, exact integers, and the
 * first error with its byte offset for malformed input. */
#include "harness.h"
#include "json.h"

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

static const test_case tests[] = {
    {"json_values", test_values},
    {"json_errors_with_position", test_errors},
};

int main(int argc, char **argv) { return test_main(tests, NTESTS(tests), argc, argv); }
