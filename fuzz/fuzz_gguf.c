/* fuzz_gguf.c - libFuzzer target: arbitrary bytes as a whole GGUF file.
 * The parser must return 0 or -1 with a message, never crash, leak or read
 * out of bounds (ASan + UBSan).  On success the tables' invariants are
 * re-checked, every accessor is exercised on every key, and the readers of
 * a parsed file run on it: K3's hyper-parameters (model_gguf.c), the
 * vocabulary (tokenizer.c), the block decoders of qblock.c on the first
 * blocks of every tensor stored in one of them (arbitrary bytes are valid
 * blocks: the decoders must not trap), and, when the header holds a K3
 * config, the whole model binding (model_load_gguf with headers only: trunk
 * and expert tensor types, shapes, per-layer expert slices, file bounds)
 * through a memfd, each succeeding or failing with a message. */
#define _GNU_SOURCE
#include "gguf.h"
#include "model.h"
#include "qblock.h"
#include "tokenizer.h"
#include "util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* The input is a file's first bytes; the file is PAD bytes longer (zeros),
 * so that a seed can be a real model's header alone and its tensors still
 * lie inside the file. */
#define PAD (4u << 20)

/* the model binding over the bytes as a file (headers only: nothing mapped) */
static void bind_model(const uint8_t *data, size_t size)
{
    int fd = memfd_create("fuzz.gguf", 0);
    if (fd < 0) return;
    if (write(fd, data, size) != (ssize_t)size || ftruncate(fd, (off_t)(size + PAD))) {
        close(fd);
        return;
    }
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    k3_model *m = xcalloc(1, sizeof *m);
    m->headers_only = 1;
    m->io_mode = IO_BUFFERED;
    m->io_backend = IO_BACKEND_THREADS;
    m->io_depth = 1;
    df_error e = {0};
    if (model_load_gguf(m, path, &e) != 0 && (!e.msg[0] || e.code == DF_OK)) abort();
    model_unload(m);
    free(m);
    close(fd);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    gguf_file f;
    df_error err = {0};
    if (gguf_parse(data, size, (uint64_t)size + PAD, "fuzz.gguf", &f, &err) != 0) {
        if (!err.msg[0] || err.code == DF_OK) abort();
        return 0;
    }
    if (f.data_start % f.alignment) abort();
    for (size_t i = 0; i < f.n_tensors; i++) {
        const gguf_tensor *t = &f.tensors[i];
        if (t->offset < f.data_start || t->offset > size + PAD || t->nbytes > size + PAD - t->offset) abort();
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
    for (size_t i = 0; i < f.n_tensors; i++) {
        const gguf_tensor *t = &f.tensors[i];
        const qblock_fmt *q = qblock_fmt_of_ggml(t->type);
        float out[QBLOCK_MAX];
        for (uint64_t b = 0; q && b < 4 && (b + 1) * (uint64_t)q->bytes <= t->nbytes; b++)
            if (t->offset + (b + 1) * (uint64_t)q->bytes <= size) q->decode(data + t->offset + b * (uint64_t)q->bytes, out);
    }
    k3_config c;
    df_error ce = {0};
    int have_cfg = k3_config_from_gguf(&f, &c, &ce) == 0;
    if (!have_cfg && (!ce.msg[0] || ce.code == DF_OK)) abort();
    k3_config_free(&c);
    if (have_cfg) bind_model(data, size);
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
