/* quantize.c - `deltafin quantize --trunk q8_0 [--experts keep|q8_0] IN.gguf
 * OUT.gguf`: a GGUF with its trunk in Q8_0 and everything else as it was,
 * the file llama.cpp's own quantizer writes for K3's Q8_0 release
 * (llama-quantize ... Q8_0 with the MXFP4 experts kept); `--experts q8_0`
 * requantizes the routed experts too, from their MXFP4 values (what
 * llama.cpp writes with the experts' tensor type overridden to Q8_0).
 *
 * Which tensors: those llama.cpp quantizes (a weight of two or more
 * dimensions, not a norm, not the router `ffn_gate_inp`, not the KDA short
 * convolutions `ssm_conv1d`) that are F32, F16 or BF16; the routed experts
 * (already MXFP4) and every other tensor are copied byte for byte.  A
 * quantized row is whole Q8_0 blocks (q8_0_quantize_block: ggml's rounding),
 * or, when its length is not a multiple of 32, F16 (llama.cpp's fallback).
 * The metadata is copied with general.file_type set to 7 (MOSTLY_Q8_0) and
 * general.quantization_version 2 added when missing.  The output is written
 * beside OUT and renamed into place: a failed run leaves nothing.
 * make llama-oracle checks every tensor against llama.cpp's own output,
 * type and bytes.
 */
#define _GNU_SOURCE
#include "cli.h"
#include "gguf.h"
#include "qblock.h"
#include "quant.h"
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int ends_with_s(const char *s, const char *t)
{
    size_t n = strlen(s), m = strlen(t);
    return n >= m && !strcmp(s + n - m, t);
}

/* llama.cpp's rule for which tensors a quantization may change */
static int quantizable(const gguf_tensor *t)
{
    if (t->n_dims < 2 || !ends_with_s(t->name, "weight")) return 0;
    if (strstr(t->name, "_norm.weight") || strstr(t->name, "ffn_gate_inp.weight") || strstr(t->name, "ssm_conv1d"))
        return 0;
    return t->type == GGML_TYPE_F32 || t->type == GGML_TYPE_F16 || t->type == GGML_TYPE_BF16;
}

/* value i of a row: F32/F16/BF16, or ggml MXFP4 (per 32 values a scale
 * byte e, then 16 bytes: value j in the low nibble of byte j, value j + 16
 * in its high nibble; e2m1(code) * 2^(e - 127), exact in f32 as ggml's
 * dequantize_row_mxfp4 gives it) */
static float src_value(uint32_t type, const uint8_t *p, size_t i)
{
    if (type == GGML_TYPE_MXFP4) {
        static const float e2m1[16] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6, -0.0f, -0.5f, -1, -1.5f, -2, -3, -4, -6};
        const uint8_t *b = p + i / 32 * GGML_MXFP4_BYTES;
        size_t j = i % 32;
        int code = j < 16 ? b[1 + j] & 15 : b[1 + j - 16] >> 4;
        return ldexpf(e2m1[code], (int)b[0] - 127);
    }
    return type == GGML_TYPE_F32 ? load_f32(p, i) : type == GGML_TYPE_F16 ? load_f16(p, i) : load_bf16(p, i);
}

static int routed_expert(const gguf_tensor *t)
{
    return t->n_dims == 3 && t->type == GGML_TYPE_MXFP4 && strstr(t->name, "_exps.weight");
}

static void put_u32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }
static void put_u64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }

typedef struct qout {
    FILE *f;
    const char *path;
    uint64_t pos;
} qout;

static void qwrite(qout *o, const void *p, size_t n)
{
    if (n && fwrite(p, 1, n, o->f) != n) die("quantize: writing %s: %s", o->path, strerror(errno));
    o->pos += n;
}

static void qpad(qout *o, uint32_t align)
{
    static const uint8_t zero[256];
    while (o->pos % align) {
        size_t n = (size_t)(align - o->pos % align);
        qwrite(o, zero, n < sizeof zero ? n : sizeof zero);
    }
}

static int read_at(int fd, uint8_t *dst, size_t n, uint64_t off)
{
    while (n) {
        ssize_t k = pread(fd, dst, n, (off_t)off);
        if (k <= 0) return -1;
        dst += k, n -= (size_t)k, off += (uint64_t)k;
    }
    return 0;
}

/* the output's temporary name: removed if the run stops before the rename */
static char g_tmp[4096];
static void remove_tmp(void)
{
    if (g_tmp[0]) unlink(g_tmp);
}

/* one tensor's data: copied, or rows converted a slab at a time */
static void convert_tensor(int fd, const gguf_tensor *t, uint32_t to, qout *o)
{
    size_t row_n = (size_t)t->ne[0];
    size_t in_row = (size_t)(t->nbytes / (uint64_t)(t->ne[1] * t->ne[2] * t->ne[3]));
    uint64_t n_rows = (uint64_t)(t->ne[1] * t->ne[2] * t->ne[3]);
    size_t out_row = to == GGML_TYPE_Q8_0 ? row_n / 32 * 34 : to == GGML_TYPE_F16 ? row_n * 2 : in_row;
    size_t slab = (size_t)(64u << 20) / (in_row + 1) + 1;
    uint8_t *in = xmalloc(slab * in_row), *out = xmalloc(slab * out_row);
    float *x = xmalloc(row_n * sizeof *x);
    for (uint64_t r0 = 0; r0 < n_rows; r0 += slab) {
        size_t k = n_rows - r0 < slab ? (size_t)(n_rows - r0) : slab;
        if (read_at(fd, in, k * in_row, t->offset + r0 * in_row))
            die("quantize: reading tensor %s: %s", t->name, strerror(errno));
        if (to == t->type) {
            qwrite(o, in, k * in_row);
            continue;
        }
        for (size_t r = 0; r < k; r++) {
            for (size_t i = 0; i < row_n; i++) x[i] = src_value(t->type, in + r * in_row, i);
            uint8_t *dst = out + r * out_row;
            if (to == GGML_TYPE_Q8_0)
                for (size_t b = 0; b < row_n / 32; b++) q8_0_quantize_block(x + 32 * b, dst + 34 * b);
            else
                for (size_t i = 0; i < row_n; i++) {
                    uint16_t h = f32_to_f16(x[i]);
                    memcpy(dst + 2 * i, &h, 2);
                }
        }
        qwrite(o, out, k * out_row);
    }
    free(in), free(out), free(x);
}

int cmd_quantize(int argc, char **argv)
{
    const char *trunk = NULL, *experts = "keep", *in_path = NULL, *out_path = NULL;
    for (int i = 2; i < argc; i++) {
        if (!strcmp(argv[i], "--trunk") && i + 1 < argc) trunk = argv[++i];
        else if (!strcmp(argv[i], "--experts") && i + 1 < argc) experts = argv[++i];
        else if (argv[i][0] == '-' && argv[i][1]) die("quantize: unknown option %s", argv[i]);
        else if (!in_path) in_path = argv[i];
        else if (!out_path) out_path = argv[i];
        else die("quantize: one input and one output, not %s too", argv[i]);
    }
    if (!trunk || !in_path || !out_path)
        die("usage: deltafin quantize --trunk q8_0 [--experts keep|q8_0] IN.gguf OUT.gguf");
    if (strcmp(trunk, "q8_0")) die("quantize --trunk %s: only q8_0 is written (every type is read)", trunk);
    if (strcmp(experts, "keep") && strcmp(experts, "q8_0"))
        die("quantize --experts %s: keep (as they are) or q8_0 (requantized from their MXFP4 values)", experts);
    int req = !strcmp(experts, "q8_0");
    gguf_file g;
    df_error err = {0};
    if (gguf_open(in_path, &g, &err)) die("quantize: %s", err.msg);
    /* the metadata: the input's key/value bytes, general.file_type patched */
    uint64_t kv0 = g.n_kv ? g.kv[0].pos : 24, kv1 = g.n_tensors ? g.tensors[0].info_pos : g.head_len;
    size_t kv_len = (size_t)(kv1 - kv0);
    uint8_t *kv = xmalloc(kv_len + 64);
    memcpy(kv, g.head + kv0, kv_len);
    const gguf_kv *ft = gguf_find_kv(&g, "general.file_type");
    if (ft && ft->type == GGUF_KV_U32) put_u32(kv + (ft->data - g.head - kv0), 7);
    uint64_t n_kv = g.n_kv;
    if (!gguf_find_kv(&g, "general.quantization_version")) {
        static const char key[] = "general.quantization_version";
        put_u64(kv + kv_len, sizeof key - 1);
        memcpy(kv + kv_len + 8, key, sizeof key - 1);
        put_u32(kv + kv_len + 8 + sizeof key - 1, GGUF_KV_U32);
        put_u32(kv + kv_len + 12 + sizeof key - 1, 2);
        kv_len += 16 + sizeof key - 1;
        n_kv++;
    }
    /* the tensors' new types and offsets */
    uint32_t *to = xmalloc((g.n_tensors + 1) * sizeof *to);
    uint64_t *off = xmalloc((g.n_tensors + 1) * sizeof *off), data = 0;
    int n_q8 = 0, n_f16 = 0;
    for (size_t i = 0; i < g.n_tensors; i++) {
        const gguf_tensor *t = &g.tensors[i];
        to[i] = t->type;
        if (quantizable(t) || (req && routed_expert(t))) to[i] = t->ne[0] % 32 ? GGML_TYPE_F16 : GGML_TYPE_Q8_0;
        n_q8 += to[i] == GGML_TYPE_Q8_0 && t->type != to[i];
        n_f16 += to[i] == GGML_TYPE_F16 && t->type != to[i];
        uint64_t rows = (uint64_t)(t->ne[1] * t->ne[2] * t->ne[3]);
        uint64_t bytes = to[i] == t->type ? t->nbytes
                         : to[i] == GGML_TYPE_Q8_0 ? rows * (uint64_t)(t->ne[0] / 32) * 34 : rows * (uint64_t)t->ne[0] * 2;
        data = (data + g.alignment - 1) / g.alignment * g.alignment;
        off[i] = data;
        data += bytes;
    }
    snprintf(g_tmp, sizeof g_tmp, "%s.tmp", out_path);
    atexit(remove_tmp);
    qout o = {.f = fopen(g_tmp, "wb"), .path = g_tmp};
    if (!o.f) die("quantize: %s: %s", g_tmp, strerror(errno));
    uint8_t head[24];
    memcpy(head, "GGUF", 4);
    put_u32(head + 4, 3);
    put_u64(head + 8, g.n_tensors);
    put_u64(head + 16, n_kv);
    qwrite(&o, head, 24);
    qwrite(&o, kv, kv_len);
    for (size_t i = 0; i < g.n_tensors; i++) {
        const gguf_tensor *t = &g.tensors[i];
        uint8_t b[8];
        put_u64(b, strlen(t->name));
        qwrite(&o, b, 8);
        qwrite(&o, t->name, strlen(t->name));
        put_u32(b, (uint32_t)t->n_dims);
        qwrite(&o, b, 4);
        for (int d = 0; d < t->n_dims; d++) {
            put_u64(b, (uint64_t)t->ne[d]);
            qwrite(&o, b, 8);
        }
        put_u32(b, to[i]);
        qwrite(&o, b, 4);
        put_u64(b, off[i]);
        qwrite(&o, b, 8);
    }
    qpad(&o, g.alignment);
    uint64_t data_start = o.pos;
    int fd = open(in_path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) die("quantize: %s: %s", in_path, strerror(errno));
    for (size_t i = 0; i < g.n_tensors; i++) {
        while (o.pos < data_start + off[i]) qpad(&o, g.alignment);
        convert_tensor(fd, &g.tensors[i], to[i], &o);
    }
    close(fd);
    if (fflush(o.f) || fsync(fileno(o.f)) || fclose(o.f)) die("quantize: writing %s: %s", g_tmp, strerror(errno));
    if (rename(g_tmp, out_path)) die("quantize: %s: %s", out_path, strerror(errno));
    g_tmp[0] = 0;
    fprintf(stderr, "deltafin: quantize: %s -> %s: %d tensors to Q8_0, %d to F16 (rows not whole blocks), %zu "
            "kept%s; %.1f MiB -> %.1f MiB\n", in_path, out_path, n_q8, n_f16, g.n_tensors - (size_t)n_q8 - (size_t)n_f16,
            req ? " (the routed experts requantized to Q8_0)" : "",
            (double)g.file_size / (1 << 20), (double)(data_start + data) / (1 << 20));
    free(kv), free(to), free(off);
    gguf_deinit(&g);
    return 0;
}
