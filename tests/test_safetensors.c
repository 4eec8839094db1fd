/* test_safetensors.c - the safetensors header parser on hand-made inputs.
 * Every input is placed so that it ends exactly at an unreadable page, so an
 * over-read faults instead of passing silently. */
#define _GNU_SOURCE
#include "harness.h"
#include "safetensors.h"

#include <string.h>
#include <unistd.h>

static size_t make(uint8_t *buf, const char *header, size_t data_len)
{
    uint64_t n = strlen(header);
    for (int i = 0; i < 8; i++) buf[i] = (uint8_t)(n >> (8 * i));
    memcpy(buf + 8, header, n);
    memset(buf + 8 + n, 0xAB, data_len);
    return 8 + n + data_len;
}

static int parse(const char *header, size_t data_len, st_file *f, df_error *err)
{
    static uint8_t buf[1 << 16];
    size_t n = make(buf, header, data_len);
    memset(err, 0, sizeof *err);
    return st_parse(guard_place(buf, n), n, n, "x.safetensors", f, err);
}

static void test_valid(void)
{
    st_file f;
    df_error err;
    const char *h = "{\"b\":{\"dtype\":\"BF16\",\"shape\":[2,3],\"data_offsets\":[4,16]},"
                    "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                    "\"__metadata__\":{\"format\":\"pt\"},\"s\":{\"dtype\":\"U8\",\"shape\":[],\"data_offsets\":[16,17]}}   ";
    TCHECKF(parse(h, 17, &f, &err) == 0, "%s", err.msg);
    TCHECK(f.n_tensors == 3);
    const st_tensor *a = st_find(&f, "a"), *b = st_find(&f, "b"), *s = st_find(&f, "s");
    TCHECK(a && b && s);
    if (a && b && s) {
        TCHECK(a->dtype == ST_F32 && a->offset == f.data_start && a->nbytes == 4);
        TCHECK(b->dtype == ST_BF16 && b->n_dims == 2 && b->shape[1] == 3 && b->offset == f.data_start + 4);
        TCHECK(s->n_dims == 0 && s->nbytes == 1);
    }
    TCHECK(!st_find(&f, "c"));
    st_deinit(&f);
}

static void test_invalid(void)
{
    static const struct { const char *h; size_t data; const char *msg; } bad[] = {
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,4]}}", 8, "need 8"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 4, "truncated"},
        {"{\"a\":{\"dtype\":\"F99\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, "unknown dtype"},
        {"{\"a\":{\"shape\":[2],\"data_offsets\":[0,8]}}", 8, "dtype"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 8, "shape[0]"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":2,\"data_offsets\":[0,8]}}", 8, "shape must be"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", 8, "reversed"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0]}}", 8, "data_offsets"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
         "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, "overlap"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,4294967296],\"data_offsets\":[0,8]}}", 8, "overflow"},
        {"[1,2]", 0, "expected an object"},
        {"{\"a\":1}", 0, "not an object"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},\"a\":{}}", 4, "duplicate"},
        {"{\"__metadata__\":3}", 0, "__metadata__"},
        {"{\"\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "empty name"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        st_file f;
        df_error err;
        int rc = parse(bad[i].h, bad[i].data, &f, &err);
        TCHECKF(rc == -1, "case %zu accepted", i);
        TCHECKF(strstr(err.msg, bad[i].msg) && strstr(err.msg, "x.safetensors"), "case %zu: message \"%s\"", i,
                err.msg);
        if (rc == 0) st_deinit(&f);
    }
    /* length prefix problems */
    uint8_t buf[64] = {0};
    df_error err = {0};
    st_file f;
    TCHECK(st_parse(guard_place(buf, 4), 4, 4, "x", &f, &err) == -1 && strstr(err.msg, "too short"));
    buf[0] = 200;
    memset(&err, 0, sizeof err);
    TCHECK(st_parse(guard_place(buf, 20), 20, 20, "x", &f, &err) == -1 && strstr(err.msg, "header length"));
    memset(&err, 0, sizeof err);
    buf[0] = 10;
    TCHECK(st_parse(guard_place(buf, 12), 12, 100, "x", &f, &err) == -1 && strstr(err.msg, "header truncated"));
}

static const test_case tests[] = {
    {"safetensors_valid", test_valid},
    {"safetensors_invalid_named", test_invalid},
};

int main(int argc, char **argv) { return test_main(tests, NTESTS(tests), argc, argv); }
