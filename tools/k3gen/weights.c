/*
 * k3gen tensor bytes: generates a roster tensor's data chunk by chunk
 * (CHUNK_BYTES) and hands each chunk to a sink (a file or a memory buffer);
 * with --from the bytes come from the source checkpoint instead (source.c).
 * Invariants:
 *  - a tensor's bytes depend only on (--seed, its name) and its roster entry,
 *    never on the shard, the order of writing or where the bytes go.
 *  - BF16 is F32 rounded to nearest even (values are finite); normals are
 *    Box-Muller in float; A_log is log(1 + 2u) for the first `extra` entries.
 *  - MXFP4 packed bytes are uniform random bytes (two E2M1 codes each); scale
 *    bytes are extra + {-1, 0, +1}.
 * Knows no file format.
 */
#include "k3gen.h"

/* ----------------------------------------------------------- data writing */

static inline uint16_t f32_to_bf16(float f)
{
    uint32_t b;
    memcpy(&b, &f, 4);
    b += 0x7fffu + ((b >> 16) & 1u); /* round to nearest even; values are finite */
    return (uint16_t)(b >> 16);
}

/* Generates t's bytes chunk by chunk into buf (CHUNK_BYTES) and hands each
 * chunk to emit; the bytes do not depend on where they go.  With --from the
 * bytes are read from the source checkpoint instead (src_read_tensor). */

void gen_tensor_data(const tensor *t, uint64_t seed, unsigned char *buf, sink_fn emit,
                            void *ctx)
{
    if (have_source()) {
        src_read_tensor(t, buf, emit, ctx);
        return;
    }
    rng r;
    rng_seed(&r, seed, t->name);
    const int es = dtype_sizes[t->dtype];
    const int64_t total = tensor_numel(t);
    const int64_t per_chunk = CHUNK_BYTES / es;
    for (int64_t done = 0; done < total;) {
        int64_t cnt = total - done < per_chunk ? total - done : per_chunk;
        switch (t->init) {
        case INIT_NORMAL:
            if (t->dtype == DT_F32) {
                float *o = (float *)buf;
                for (int64_t i = 0; i < cnt; i++)
                    o[i] = t->mean + t->sd * rng_normal(&r);
            } else if (t->dtype == DT_BF16) {
                uint16_t *o = (uint16_t *)buf;
                for (int64_t i = 0; i < cnt; i++)
                    o[i] = f32_to_bf16(t->mean + t->sd * rng_normal(&r));
            } else {
                die("internal: normal init for U8 tensor %s", t->name);
            }
            break;
        case INIT_A_LOG: {
            float *o = (float *)buf;
            for (int64_t i = 0; i < cnt; i++) {
                int64_t idx = done + i;
                o[i] = idx < t->extra ? (float)log(1.0 + 2.0 * rng_uniform(&r)) : 0.0f;
            }
            break;
        }
        case INIT_MX_PACKED:
            for (int64_t i = 0; i < cnt; i += 8) {
                uint64_t x = rng_next(&r);
                int64_t m = cnt - i < 8 ? cnt - i : 8;
                memcpy(buf + i, &x, (size_t)m); /* byte order irrelevant: uniform bytes */
            }
            break;
        case INIT_MX_SCALE:
            for (int64_t i = 0; i < cnt; i++)
                buf[i] = (unsigned char)(t->extra - 1 + (long)((rng_next(&r) >> 32) % 3u));
            break;
        default:
            die("internal: bad init kind");
        }
        emit(ctx, buf, (size_t)(cnt * es));
        done += cnt;
    }
}

typedef struct {
    FILE *f;
    const char *path;
} file_sink;

static void emit_file(void *ctx, const unsigned char *p, size_t n)
{
    file_sink *fs = ctx;
    write_all(fs->f, p, n, fs->path);
}

void write_tensor_data(FILE *f, const char *path, const tensor *t, uint64_t seed,
                              unsigned char *buf)
{
    file_sink fs = {f, path};
    gen_tensor_data(t, seed, buf, emit_file, &fs);
}

typedef struct {
    unsigned char *p;
    size_t len, cap;
} mem_sink;

static void emit_mem(void *ctx, const unsigned char *p, size_t n)
{
    mem_sink *ms = ctx;
    if (ms->len + n > ms->cap)
        die("internal: tensor larger than its computed size");
    memcpy(ms->p + ms->len, p, n);
    ms->len += n;
}

/* All of t's bytes in a new buffer (the same bytes the shard holds). */
unsigned char *gen_tensor_mem(const tensor *t, uint64_t seed, unsigned char *chunk)
{
    size_t nb = (size_t)tensor_bytes(t);
    mem_sink ms = {xmalloc(nb), 0, nb};
    gen_tensor_data(t, seed, chunk, emit_mem, &ms);
    if (ms.len != nb)
        die("internal: tensor %s produced %zu of %zu bytes", t->name, ms.len, nb);
    return ms.p;
}

