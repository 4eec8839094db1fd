/* session_file.c - a session saved to and loaded from a file
 * (engine.h df_session_save / df_session_load).
 *
 * Layout, little-endian:
 *   header (64 bytes): "DFSESS01", u32 version (2), u32 header CRC (of the
 *     header with this field 0), 16 bytes model identity, u32 n_ids,
 *     u32 n_kda, u32 n_mla, u32 row_w (MLA floats per position), u32 kda_S
 *     floats per layer, u32 kda_hist floats per layer, u32 section count,
 *     zero padding;
 *   sections, each: u32 tag, u32 CRC of its bytes, u64 byte count, bytes:
 *     1 ids (int32 [n]), 2 KDA state (f32 [n_kda][Hk][Dk][Dk]), 3 conv
 *     history (f32 [n_kda][3][Wc-1][P]), 4 MLA latent cache (f32, per MLA
 *     layer its first n rows);
 *   trailer "DFSESEND".
 * The model identity is an FNV-1a 128-bit hash of the config's numbers,
 * the expert size, and the content
 * hash of every weight file (trunk and experts: one byte changed anywhere
 * changes it) and of config.json; a streamed install's manifest stands for
 * its remote experts.  A file's content hash is computed once and cached
 * by its device, inode, size, mtime and ctime (filehash.h), so only the
 * first session file of a model reads it whole (K3: 1.56 TB, about 13
 * minutes at 2 GB/s; later opens read a few hundred bytes per file).
 * Version 1 files (sampled bytes only) are refused by version.  Floats are stored as the engine holds them (the session is
 * bit for bit the one saved).  Written through atomic_file (file.h).
 * Loading reads each section straight into the session's buffers and
 * checks its CRC there; any error resets the session.
 */
#define _GNU_SOURCE
#include "engine_impl.h"
#include "file.h"
#include "filehash.h"
#include "util.h"

#include <errno.h>
#include <limits.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define SESS_MAGIC "DFSESS01"
#define SESS_END "DFSESEND"
#define SESS_VERSION 2
#define SESS_HDR 64

enum { SEC_IDS = 1, SEC_KDA_S = 2, SEC_KDA_HIST = 3, SEC_MLA = 4 };

static void put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static void put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t get32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t get64(const uint8_t *p) { return (uint64_t)get32(p) | (uint64_t)get32(p + 4) << 32; }

/* two 64-bit FNV-1a lanes with different offsets: 128 bits of identity */
typedef struct fnv {
    uint64_t a, b;
} fnv;

static void fnv_add(fnv *h, const void *p, size_t n)
{
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++) {
        h->a = (h->a ^ b[i]) * 0x100000001b3ull;
        h->b = (h->b ^ (uint8_t)(b[i] + 0x5b)) * 0x100000001b3ull;
    }
}

static void fnv_u64(fnv *h, uint64_t v)
{
    uint8_t b[8];
    put64(b, v);
    fnv_add(h, b, 8);
}

int engine_model_identity(df_engine *eng, uint8_t id[16], df_error *err)
{
    if (eng->model_id_ok) {
        memcpy(id, eng->model_id, 16);
        return 0;
    }
    const k3_model *m = &eng->m;
    const k3_config *c = &m->cfg;
    fnv h = {0xcbf29ce484222325ull, 0x84222325cbf29ce4ull};
    const int nums[] = {c->NL, c->h, c->V, c->E, c->k, c->I, c->Lt, c->Hk, c->Dk, c->P, c->Wc, c->Hm, c->dn, c->dr,
                        c->dv, c->Rq, c->Rkv, c->B, c->Ns, c->Dff, c->first_dense, c->moe_freq};
    for (size_t i = 0; i < sizeof nums / sizeof nums[0]; i++) fnv_u64(&h, (uint64_t)(int64_t)nums[i]);
    for (int l = 0; l < c->NL; l++) fnv_u64(&h, (uint64_t)c->layer_kind[l] * 2 + (uint64_t)c->layer_moe[l]);
    fnv_add(&h, &c->eps, sizeof c->eps);
    fnv_u64(&h, m->store.expert_bytes);
    /* not the trunk table: it comes from the files' headers (hashed below),
     * and the engine's views of it change with how the trunk is held */
    /* every byte of every weight file (trunk and experts), hashed once per
     * file and kept in the file-hash cache (filehash.h); a streamed
     * install's experts are remote: its manifest (offsets, lengths and,
     * when set up with --verify, each expert's SHA-256) stands for them;
     * and the config file as written */
    char extra[2][PATH_MAX + 32];
    int n_extra = 0;
    if (m->n_shards > 0) {
        char dir[PATH_MAX];
        snprintf(dir, sizeof dir, "%s", m->shards[0].path);
        char *slash = strrchr(dir, '/');
        if (slash) *slash = 0;
        else snprintf(dir, sizeof dir, ".");
        if (m->store.stream) snprintf(extra[n_extra++], sizeof extra[0], "%s/experts.manifest", dir);
        snprintf(extra[n_extra], sizeof extra[0], "%s/config.json", dir);
        if (!access(extra[n_extra], R_OK)) n_extra++;
    }
    double sec = 0;
    uint64_t bytes = 0;
    for (int i = 0; i < m->n_shards + n_extra; i++) {
        const char *path = i < m->n_shards ? m->shards[i].path : extra[i - m->n_shards];
        uint8_t fh[16];
        filehash_stats st;
        if (file_content_hash(path, fh, eng->mc.quiet, &st, err)) {
            df_err_prefix(err, "the model's identity");
            return -1;
        }
        const char *base = strrchr(path, '/');
        base = base ? base + 1 : path;
        fnv_add(&h, base, strlen(base) + 1);
        fnv_add(&h, fh, sizeof fh);
        sec += st.seconds;
        bytes += st.bytes;
    }
    if (bytes >= (1ull << 30) && !eng->mc.quiet)
        df_log("the model's identity: %.1f GiB hashed in %.1f s (%.2f GB/s); later opens read the cache in %s",
               (double)bytes / (1 << 30), sec, sec > 0 ? (double)bytes / sec / 1e9 : 0.0, filehash_cache_dir());
    put64(id, h.a);
    put64(id + 8, h.b);
    memcpy(eng->model_id, id, 16);
    eng->model_id_ok = 1;
    return 0;
}

typedef struct sizes {
    uint32_t n_kda, n_mla, row_w, s_per, h_per;
} sizes;

static sizes session_sizes(const df_session *s)
{
    const df_engine *eng = s->eng;
    const k3_config *c = &eng->m.cfg;
    sizes z = {(uint32_t)eng->m.n_kda, (uint32_t)eng->m.n_mla, (uint32_t)(c->Rkv + c->dr),
               (uint32_t)((size_t)c->Hk * c->Dk * c->Dk), (uint32_t)(3 * (size_t)(c->Wc > 1 ? c->Wc - 1 : 1) * c->P)};
    return z;
}

static int write_section(atomic_file *af, uint32_t tag, const void *p, uint64_t n, uint32_t crc, df_error *err)
{
    uint8_t h[16];
    put32(h, tag);
    put32(h + 4, crc);
    put64(h + 8, n);
    if (atomic_file_write(af, h, sizeof h, err)) return -1;
    return n ? atomic_file_write(af, p, (size_t)n, err) : 0;
}

int df_session_save(df_session *s, const int32_t *ids, int n, const char *path, df_error *err)
{
    if (n != s->b.pos)
        return df_err_set(err, DF_ERR_ARG, -1, "%s: %d ids given for a session at position %d", path, n, s->b.pos);
    uint8_t hdr[SESS_HDR] = {0};
    memcpy(hdr, SESS_MAGIC, 8);
    put32(hdr + 8, SESS_VERSION);
    if (engine_model_identity(s->eng, hdr + 16, err)) return -1;
    sizes z = session_sizes(s);
    put32(hdr + 32, (uint32_t)n);
    put32(hdr + 36, z.n_kda);
    put32(hdr + 40, z.n_mla);
    put32(hdr + 44, z.row_w);
    put32(hdr + 48, z.s_per);
    put32(hdr + 52, z.h_per);
    put32(hdr + 56, 4);
    put32(hdr + 12, df_crc32(0, hdr, SESS_HDR));
    atomic_file af;
    if (atomic_file_open(&af, path, err)) return -1;
    uint64_t nS = (uint64_t)z.n_kda * z.s_per * 4, nH = (uint64_t)z.n_kda * z.h_per * 4;
    uint64_t per_mla = (uint64_t)n * z.row_w * 4, ctx_row = (uint64_t)s->b.n_ctx * z.row_w;
    uint32_t mcrc = 0;
    for (uint32_t l = 0; l < z.n_mla; l++) mcrc = df_crc32(mcrc, s->b.mla_cache + l * ctx_row, (size_t)per_mla);
    int rc = atomic_file_write(&af, hdr, SESS_HDR, err) ||
             write_section(&af, SEC_IDS, ids, (uint64_t)n * 4, df_crc32(0, ids, (size_t)n * 4), err) ||
             write_section(&af, SEC_KDA_S, s->b.kda_S, nS, df_crc32(0, s->b.kda_S, (size_t)nS), err) ||
             write_section(&af, SEC_KDA_HIST, s->b.kda_hist, nH, df_crc32(0, s->b.kda_hist, (size_t)nH), err);
    if (!rc) {
        uint8_t h[16];
        put32(h, SEC_MLA);
        put32(h + 4, mcrc);
        put64(h + 8, per_mla * z.n_mla);
        rc = atomic_file_write(&af, h, sizeof h, err);
        for (uint32_t l = 0; !rc && l < z.n_mla; l++)
            rc = atomic_file_write(&af, s->b.mla_cache + l * ctx_row, (size_t)per_mla, err);
    }
    if (!rc) rc = atomic_file_write(&af, SESS_END, 8, err);
    if (rc) {
        atomic_file_abort(&af);
        return -1;
    }
    return atomic_file_commit(&af, err);
}

static int read_all(int fd, void *p, size_t n)
{
    uint8_t *b = p;
    for (size_t got = 0; got < n;) {
        ssize_t r = read(fd, b + got, n - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return -1;
        got += (size_t)r;
    }
    return 0;
}

/* One section: its header must name `tag` and `bytes`; the bytes go to
 * dst (in pieces of `piece` bytes `stride` bytes apart, for the MLA
 * layers) and must match the CRC. */
static int read_section(int fd, const char *path, uint32_t tag, uint64_t bytes, uint8_t *dst, uint64_t piece,
                        uint64_t stride, df_error *err)
{
    static const char *names[] = {"", "ids", "KDA state", "conv history", "MLA cache"};
    uint8_t h[16];
    if (read_all(fd, h, sizeof h))
        return df_err_set(err, DF_ERR_FORMAT, -1, "%s: truncated before the %s section", path, names[tag]);
    if (get32(h) != tag || get64(h + 8) != bytes)
        return df_err_set(err, DF_ERR_FORMAT, -1, "%s: the %s section is tag %u of %llu bytes, expected tag %u of %llu",
                          path, names[tag], get32(h), (unsigned long long)get64(h + 8), tag, (unsigned long long)bytes);
    uint32_t crc = 0;
    for (uint64_t off = 0, k = 0; off < bytes; off += piece, k++) {
        uint8_t *d = dst + k * stride;
        if (read_all(fd, d, (size_t)piece))
            return df_err_set(err, DF_ERR_FORMAT, -1, "%s: truncated in the %s section", path, names[tag]);
        crc = df_crc32(crc, d, (size_t)piece);
    }
    if (crc != get32(h + 4))
        return df_err_set(err, DF_ERR_FORMAT, -1, "%s: the %s section is corrupted (CRC %08x, expected %08x)", path,
                          names[tag], crc, get32(h + 4));
    return 0;
}

static int load(df_session *s, int fd, const char *path, int32_t *ids, int cap, int *n_out, df_error *err)
{
    uint8_t hdr[SESS_HDR];
    if (read_all(fd, hdr, SESS_HDR)) return df_err_set(err, DF_ERR_FORMAT, -1, "%s: shorter than a session header", path);
    if (memcmp(hdr, SESS_MAGIC, 8)) return df_err_set(err, DF_ERR_FORMAT, -1, "%s: not a deltafin session file", path);
    if (get32(hdr + 8) != SESS_VERSION)
        return df_err_set(err, DF_ERR_UNSUPPORTED, -1, "%s: session file version %u (this build reads %d)", path,
                          get32(hdr + 8), SESS_VERSION);
    uint32_t want = get32(hdr + 12);
    put32(hdr + 12, 0);
    if (df_crc32(0, hdr, SESS_HDR) != want) return df_err_set(err, DF_ERR_FORMAT, -1, "%s: the header is corrupted", path);
    uint8_t id[16];
    if (engine_model_identity(s->eng, id, err)) return -1;
    if (memcmp(id, hdr + 16, 16))
        return df_err_set(err, DF_ERR_ARG, -1, "%s: the session was saved with a different model", path);
    sizes z = session_sizes(s);
    if (get32(hdr + 36) != z.n_kda || get32(hdr + 40) != z.n_mla || get32(hdr + 44) != z.row_w ||
        get32(hdr + 48) != z.s_per || get32(hdr + 52) != z.h_per || get32(hdr + 56) != 4)
        return df_err_set(err, DF_ERR_FORMAT, -1, "%s: its state sizes do not match this model", path);
    uint32_t n = get32(hdr + 32);
    if (n > (uint32_t)s->b.n_ctx || (int)n > cap)
        return df_err_set(err, DF_ERR_LIMIT, -1, "%s: %u tokens do not fit this session's context of %d", path, n,
                          s->b.n_ctx < cap ? s->b.n_ctx : cap);
    uint64_t nS = (uint64_t)z.n_kda * z.s_per * 4, nH = (uint64_t)z.n_kda * z.h_per * 4;
    uint64_t per_mla = (uint64_t)n * z.row_w * 4, ctx_row = (uint64_t)s->b.n_ctx * z.row_w * 4;
    if (read_section(fd, path, SEC_IDS, (uint64_t)n * 4, (uint8_t *)ids, n ? (uint64_t)n * 4 : 1, 0, err) ||
        read_section(fd, path, SEC_KDA_S, nS, (uint8_t *)s->b.kda_S, nS ? nS : 1, 0, err) ||
        read_section(fd, path, SEC_KDA_HIST, nH, (uint8_t *)s->b.kda_hist, nH ? nH : 1, 0, err) ||
        read_section(fd, path, SEC_MLA, per_mla * z.n_mla, (uint8_t *)s->b.mla_cache, per_mla ? per_mla : 1, ctx_row,
                     err))
        return -1;
    uint8_t end[8];
    if (read_all(fd, end, 8) || memcmp(end, SESS_END, 8))
        return df_err_set(err, DF_ERR_FORMAT, -1, "%s: truncated (no end marker)", path);
    if (read(fd, end, 1) != 0) return df_err_set(err, DF_ERR_FORMAT, -1, "%s: trailing bytes after the end marker", path);
    for (uint32_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= s->eng->m.cfg.V)
            return df_err_set(err, DF_ERR_FORMAT, -1, "%s: id %d at %u is outside the vocabulary", path, ids[i], i);
    s->b.pos = (int)n;
    *n_out = (int)n;
    return 0;
}

/* Open a session file for reading: never blocks (a FIFO or device named
 * like a session file would hold the caller, e.g. the server's worker,
 * until a writer came) and refuses anything but a regular file. */
static int open_session_file(const char *path, df_error *err)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return df_err_set(err, DF_ERR_IO, -1, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) || !S_ISREG(st.st_mode)) {
        close(fd);
        df_err_set(err, DF_ERR_FORMAT, -1, "%s: not a regular file", path);
        return -1;
    }
    int fl = fcntl(fd, F_GETFL);
    if (fl >= 0) (void)fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
    return fd;
}

int df_session_file_ids(df_engine *eng, const char *path, int32_t *ids, int cap, int *n, df_error *err)
{
    *n = 0;
    int fd = open_session_file(path, err);
    if (fd < 0) return -1;
    uint8_t hdr[SESS_HDR], id[16];
    int rc = -1;
    if (read_all(fd, hdr, SESS_HDR) || memcmp(hdr, SESS_MAGIC, 8) || get32(hdr + 8) != SESS_VERSION) {
        df_err_set(err, DF_ERR_FORMAT, -1, "%s: not a readable session file", path);
        goto out;
    }
    uint32_t want = get32(hdr + 12);
    put32(hdr + 12, 0);
    if (df_crc32(0, hdr, SESS_HDR) != want) {
        df_err_set(err, DF_ERR_FORMAT, -1, "%s: the header is corrupted", path);
        goto out;
    }
    if (engine_model_identity(eng, id, err)) goto out;
    if (memcmp(id, hdr + 16, 16)) {
        df_err_set(err, DF_ERR_ARG, -1, "%s: the session was saved with a different model", path);
        goto out;
    }
    uint32_t m = get32(hdr + 32);
    if ((int)m > cap || m > (1u << 30)) {
        df_err_set(err, DF_ERR_LIMIT, -1, "%s: %u tokens, more than %d", path, m, cap);
        goto out;
    }
    if (read_section(fd, path, SEC_IDS, (uint64_t)m * 4, (uint8_t *)ids, m ? (uint64_t)m * 4 : 1, 0, err)) goto out;
    *n = (int)m;
    rc = 0;
out:
    close(fd);
    return rc;
}

int df_session_load(df_session *s, const char *path, int32_t *ids, int cap, int *n, df_error *err)
{
    *n = 0;
    df_session_reset(s);
    int fd = open_session_file(path, err);
    if (fd < 0) return -1;
    int rc = load(s, fd, path, ids, cap, n, err);
    close(fd);
    if (rc) {
        df_session_reset(s);
        *n = 0;
    }
    return rc;
}
