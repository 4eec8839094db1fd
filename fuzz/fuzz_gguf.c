/* fuzz_gguf.c - libFuzzer target: arbitrary bytes as a whole GGUF file.
 * The parser must return 0 or -1 with a message, never crash, leak or read
 * out of bounds (ASan + UBSan).  On success the tables' invariants are
 * re-checked, every accessor is exercised on every key, and the two readers
 * of a parsed file run on it: K3's hyper-parameters (model_gguf.c) and the
 * vocabulary (tokenizer.c), each succeeding or failing with a message. */
#include "gguf.h"
#include "model.h"
#include "tokenizer.h"
#include "util.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    gguf_file f;
    df_error err = {0};
    if (gguf_parse(data, size, size, "fuzz.gguf", &f, &err) != 0) {
        if (!err.msg[0] || err.code == DF_OK) abort();
        return 0;
    }
    if (f.data_start % f.alignment) abort();
    for (size_t i = 0; i < f.n_tensors; i++) {
        const gguf_tensor *t = &f.tensors[i];
        if (t->offset < f.data_start || t->offset > size || t->nbytes > size - t->offset) abort();
        if ((t->offset - f.data_start) % f.alignment) abort();
        if (gguf_find_tensor(&f, t->name) != t) abort();
    }
    for (size_t i = 0; i < f.n_kv; i++) {
        const gguf_kv *kv = &f.kv[i];
        if (gguf_find_kv(&f, kv->key) != kv) abort();
        df_error e = {0};
        uint32_t u32;
        int32_t i32;
        uint64_t u64;
        float f32;
        int b;
        const char *s;
        size_t n, len;
        int64_t ints[8];
        float floats[8];
        (void)gguf_get_u32(&f, kv->key, &u32, &e);
        (void)gguf_get_i32(&f, kv->key, &i32, &e);
        (void)gguf_get_u64(&f, kv->key, &u64, &e);
        (void)gguf_get_f32(&f, kv->key, &f32, &e);
        (void)gguf_get_bool(&f, kv->key, &b, &e);
        if (gguf_get_str(&f, kv->key, &s, &len, &e) == 0 && len && s[len - 1] == (char)0x7f) e.pos = 0;
        (void)gguf_get_arr_int(&f, kv->key, ints, 8, &n, &e);
        (void)gguf_get_arr_f32(&f, kv->key, floats, 8, &n, &e);
        if (kv->type == GGUF_KV_ARRAY && kv->arr_type == GGUF_KV_STRING && kv->n)
            if (gguf_get_arr_str(&f, kv->key, (size_t)kv->n - 1, &s, &len, &e) == 0 && len && s[len - 1] == 1)
                e.pos = 0;
    }
    k3_config c;
    df_error ce = {0};
    if (k3_config_from_gguf(&f, &c, &ce) != 0 && (!ce.msg[0] || ce.code == DF_OK)) abort();
    k3_config_free(&c);
    tokenizer *tok = NULL;
    df_error te = {0};
    if (tokenizer_from_gguf(&f, &tok, &te) != 0) {
        if (!te.msg[0] || te.code == DF_OK || tok) abort();
    } else {
        int32_t *ids = NULL;
        size_t n_ids = 0, cap = 0;
        static const char text[] = "Hello, world! 12345 <|open|>";
        if (tokenizer_encode(tok, text, sizeof text - 1, 1, &ids, &n_ids, &cap, &te) == 0)
            for (size_t i = 0; i < n_ids; i++)
                if (ids[i] < 0 || ids[i] >= tokenizer_n_vocab(tok)) abort();
        free(ids);
        tokenizer_free(tok);
    }
    gguf_deinit(&f);
    return 0;
}
