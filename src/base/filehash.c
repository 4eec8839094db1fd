/* filehash.c - whole-file hashes, computed once and cached (filehash.h).
 *
 * The hash runs four independent lanes, each taking every fourth 8-byte
 * word: v = rotl(v + w * K2, 31) * K1 (a multiply spreads each input bit
 * over the lane; the rotate keeps the high bits moving), so a byte changed
 * anywhere changes its lane for good.  The finish folds the lanes, the
 * unfinished tail and the length into two 64-bit halves, each through its
 * own avalanche (xor-shift-multiply) so that the halves are independent.
 * Measured here at several GB/s on one core: the drive, not the hash,
 * bounds a first hash of a large model.
 */
#define _GNU_SOURCE
#include "filehash.h"
#include "file.h"
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define K1 0x9e3779b97f4a7c15ull
#define K2 0xc2b2ae3d27d4eb4full
#define K3 0x165667b19e3779f9ull
#define K4 0xd6e8feb86659fd93ull

static uint64_t rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

static uint64_t rd64(const uint8_t *p)
{
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    uint64_t v;
    memcpy(&v, p, sizeof v);
    return v;
#else
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
    return v;
#endif
}

static uint64_t lane(uint64_t v, uint64_t w) { return rotl(v + w * K2, 31) * K1; }

static uint64_t avalanche(uint64_t x, uint64_t m)
{
    x ^= x >> 33;
    x *= m;
    x ^= x >> 29;
    x *= K3;
    x ^= x >> 32;
    return x;
}

void df_hash128_init(df_hash128 *h)
{
    memset(h, 0, sizeof *h);
    h->v[0] = K1 + K2;
    h->v[1] = K2;
    h->v[2] = K4;
    h->v[3] = 0 - K1;
}

static void stripe(df_hash128 *h, const uint8_t *p)
{
    h->v[0] = lane(h->v[0], rd64(p));
    h->v[1] = lane(h->v[1], rd64(p + 8));
    h->v[2] = lane(h->v[2], rd64(p + 16));
    h->v[3] = lane(h->v[3], rd64(p + 24));
}

void df_hash128_add(df_hash128 *h, const void *data, size_t n)
{
    const uint8_t *p = data;
    h->len += n;
    if (h->n_tail) {
        size_t take = 32 - h->n_tail < n ? 32 - h->n_tail : n;
        memcpy(h->tail + h->n_tail, p, take);
        h->n_tail += take;
        p += take;
        n -= take;
        if (h->n_tail < 32) return;
        stripe(h, h->tail);
        h->n_tail = 0;
    }
    for (; n >= 32; p += 32, n -= 32) stripe(h, p);
    memcpy(h->tail, p, n);
    h->n_tail = n;
}

void df_hash128_final(const df_hash128 *h, uint8_t out[16])
{
    uint64_t v[4] = {h->v[0], h->v[1], h->v[2], h->v[3]};
    /* the tail: whole words into the lanes in turn, then the bytes */
    size_t i = 0;
    for (; i + 8 <= h->n_tail; i += 8) v[i / 8] = lane(v[i / 8], rd64(h->tail + i));
    uint64_t last = 0;
    for (size_t j = h->n_tail; j > i; j--) last = last << 8 | h->tail[j - 1];
    uint64_t a = rotl(v[0], 1) + rotl(v[1], 7) + rotl(v[2], 12) + rotl(v[3], 18);
    uint64_t b = v[0] ^ rotl(v[1], 23) ^ rotl(v[2], 41) ^ rotl(v[3], 53);
    a = (a ^ lane(0, last)) * K1 + h->len;
    b = (b + lane(K4, last)) * K2 ^ (h->len * K3);
    a = avalanche(a ^ (h->n_tail - i), K2);
    b = avalanche(b + a, K4);
    for (int k = 0; k < 8; k++) {
        out[k] = (uint8_t)(a >> (8 * k));
        out[8 + k] = (uint8_t)(b >> (8 * k));
    }
}

/* ---------------------------------------------------------------- cache */

static char g_dir[PATH_MAX];
static int g_dir_state; /* 0 unknown, 1 usable, -1 none */

static int mkdir_p(const char *path)
{
    char tmp[PATH_MAX];
    snprintf(tmp, sizeof tmp, "%s", path);
    for (char *p = tmp + 1; *p; p++)
        if (*p == '/') {
            *p = 0;
            if (mkdir(tmp, 0755) && errno != EEXIST) return -1;
            *p = '/';
        }
    return mkdir(tmp, 0755) && errno != EEXIST ? -1 : 0;
}

const char *filehash_cache_dir(void)
{
    if (!g_dir_state) {
        const char *d = getenv("DELTAFIN_CACHE_DIR"), *x = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
        if (d && *d) snprintf(g_dir, sizeof g_dir, "%s/filehash", d);
        else if (x && *x) snprintf(g_dir, sizeof g_dir, "%s/deltafin/filehash", x);
        else if (home && *home) snprintf(g_dir, sizeof g_dir, "%s/.cache/deltafin/filehash", home);
        else g_dir[0] = 0;
        g_dir_state = g_dir[0] && !mkdir_p(g_dir) ? 1 : -1;
        if (g_dir_state < 0) g_dir[0] = 0;
    }
    return g_dir;
}

typedef struct fkey {
    unsigned long long dev, ino, size;
    long long mt_s, mt_ns, ct_s, ct_ns;
} fkey;

static void key_of(const struct stat *st, fkey *k)
{
    *k = (fkey){(unsigned long long)st->st_dev, (unsigned long long)st->st_ino, (unsigned long long)st->st_size,
                (long long)st->st_mtim.tv_sec, (long long)st->st_mtim.tv_nsec, (long long)st->st_ctim.tv_sec,
                (long long)st->st_ctim.tv_nsec};
}

static void record_path(const char *real, char *out, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (const char *p = real; *p; p++) h = (h ^ (uint8_t)*p) * 0x100000001b3ull;
    snprintf(out, n, "%s/%016llx.fh", g_dir, (unsigned long long)h);
}

static int hexval(int c) { return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1; }

/* 0 and the hash when the record names this file with this key */
static int cache_lookup(const char *rec, const char *real, const fkey *k, uint8_t out[16])
{
    FILE *f = fopen(rec, "r");
    if (!f) return -1;
    char line[PATH_MAX + 64], want[PATH_MAX + 8];
    int ok = 0;
    snprintf(want, sizeof want, "path %s\n", real);
    fkey r;
    char hex[40];
    if (fgets(line, sizeof line, f) && !strcmp(line, "deltafin-filehash 1\n") && fgets(line, sizeof line, f) &&
        !strcmp(line, want) && fgets(line, sizeof line, f) &&
        sscanf(line, "key %llu %llu %llu %lld %lld %lld %lld", &r.dev, &r.ino, &r.size, &r.mt_s, &r.mt_ns, &r.ct_s,
               &r.ct_ns) == 7 &&
        !memcmp(&r, k, sizeof r) && fgets(line, sizeof line, f) && sscanf(line, "hash %32s", hex) == 1 &&
        strlen(hex) == 32) {
        ok = 1;
        for (int i = 0; i < 16 && ok; i++) {
            int hi = hexval(hex[2 * i]), lo = hexval(hex[2 * i + 1]);
            if (hi < 0 || lo < 0) ok = 0;
            else out[i] = (uint8_t)(hi << 4 | lo);
        }
    }
    fclose(f);
    return ok ? 0 : -1;
}

static void cache_store(const char *rec, const char *real, const fkey *k, const uint8_t h[16])
{
    char buf[PATH_MAX + 256];
    int n = snprintf(buf, sizeof buf, "deltafin-filehash 1\npath %s\nkey %llu %llu %llu %lld %lld %lld %lld\nhash ", real,
                     k->dev, k->ino, k->size, k->mt_s, k->mt_ns, k->ct_s, k->ct_ns);
    for (int i = 0; i < 16; i++) n += snprintf(buf + n, sizeof buf - (size_t)n, "%02x", h[i]);
    n += snprintf(buf + n, sizeof buf - (size_t)n, "\n");
    atomic_file af;
    df_error e = {0};
    if (atomic_file_open(&af, rec, &e)) return; /* a cache that cannot be written is not an error */
    if (atomic_file_write(&af, buf, (size_t)n, &e)) {
        atomic_file_abort(&af);
        return;
    }
    (void)atomic_file_commit(&af, &e);
}

int file_content_hash(const char *path, uint8_t out[16], int quiet, filehash_stats *st, df_error *err)
{
    filehash_stats z = {0};
    if (!st) st = &z;
    *st = z;
    char real[PATH_MAX];
    if (!realpath(path, real)) return df_err_set(err, DF_ERR_IO, -1, "%s: %s", path, strerror(errno));
    int fd = open(real, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return df_err_set(err, DF_ERR_IO, -1, "%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) || !S_ISREG(sb.st_mode)) {
        close(fd);
        return df_err_set(err, DF_ERR_IO, -1, "%s: not a regular file", path);
    }
    fkey k;
    key_of(&sb, &k);
    char rec[PATH_MAX + 32] = "";
    if (filehash_cache_dir()[0]) {
        record_path(real, rec, sizeof rec);
        if (!cache_lookup(rec, real, &k, out)) {
            close(fd);
            st->cached = 1;
            return 0;
        }
    }
    if (!quiet && (uint64_t)sb.st_size >= (1ull << 30))
        df_log("hashing %s (%.1f GiB) once for the model's identity%s%s", path, (double)sb.st_size / (1 << 30),
               rec[0] ? "; kept in " : " (no cache directory: every time)", rec[0] ? g_dir : "");
    enum { BUF = 1 << 20 };
    uint8_t *buf = xmalloc(BUF);
    df_hash128 h;
    df_hash128_init(&h);
    double t0 = now_sec();
    uint64_t off = 0;
    int rc = 0;
    for (;;) {
        ssize_t got = pread(fd, buf, BUF, (off_t)off);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) {
            rc = df_err_set(err, DF_ERR_IO, -1, "%s: read at %llu: %s", path, (unsigned long long)off, strerror(errno));
            break;
        }
        if (got == 0) break;
        df_hash128_add(&h, buf, (size_t)got);
        /* a model is far larger than the page cache: leave it as it was */
        df_fd_dontneed(fd, off, (uint64_t)got);
        off += (uint64_t)got;
    }
    free(buf);
    close(fd);
    if (rc) return rc;
    if (off != (uint64_t)sb.st_size)
        return df_err_set(err, DF_ERR_IO, -1, "%s: changed while being hashed (%llu bytes read, %llu expected)", path,
                          (unsigned long long)off, (unsigned long long)sb.st_size);
    df_hash128_final(&h, out);
    st->seconds = now_sec() - t0;
    st->bytes = off;
    /* recorded under the key it had before reading: a change during the
     * read (mtime, ctime) makes the record stale at the next open */
    if (rec[0]) cache_store(rec, real, &k, out);
    return 0;
}
