/* expert_remote.c - see expert_remote.h. */
#define _GNU_SOURCE
#include "expert_remote.h"
#include "expert_manifest.h"
#include "expert_store.h"
#include "file.h"
#include "filehash.h"
#include "http.h"
#include "json.h"
#include "sha.h"
#include "util.h"

#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#define REMOTE_HANDLES 8
#define REMOTE_TRIES 6
/* complete copies of an expert without a SHA-256 fetched before giving up
 * when no two of them agree */
#define REMOTE_COPIES REMOTE_TRIES
/* v2: a 128-bit digest per slot (v1, "DFXCACH1", had none) */
#define INDEX_MAGIC "DFXCACH2"
#define INDEX_MAGIC_V1 "DFXCACH1"
#define INDEX_HEAD 28 /* magic, layers, experts, slot bytes (u32 x3), slots (u64) */
#define INDEX_SLOT 28 /* key (i32), last use (u64), digest (16 bytes) */

enum { X_IDLE, X_WAIT, X_ACTIVE };      /* a transfer: not wanted, due, on a handle */
enum { P_FETCHING, P_OK, P_FAILED };    /* an expert */

struct pending;

/* One range request for an expert's bytes: into the RAM slot (the copy
 * that is used), or, for an expert without a SHA-256, a second copy that
 * is only hashed, to compare with.  Either way the bytes are hashed as
 * they arrive (df_hash128), in order. */
typedef struct transfer {
    struct pending *p;
    int to_slot;
    int state, attempt, handle;
    double not_before;
    uint64_t got;
    df_hash128 hash;
} transfer;

/* An expert to fetch.  With a SHA-256 in the manifest: one copy, checked
 * against it.  Without one: copies until two agree, the first two in
 * parallel (x[0] into the slot, x[1] hashed only), any later one into the
 * slot alone; the slot's copy is accepted when its digest equals another
 * complete copy's. */
typedef struct pending {
    int il, e;
    uint8_t *slot;            /* the RAM slot: data at slot + lead */
    int64_t tag;
    int state, mismatches;    /* mismatches: against the SHA-256 */
    uint64_t want;
    transfer x[2];
    int n_seen, slot_seen;    /* complete copies; the one in the slot (-1: none whole) */
    uint8_t seen[REMOTE_COPIES][16];
    uint8_t digest[16];       /* the accepted copy's */
    expert_remote *r;
} pending;

struct expert_remote {
    expert_store *s;
    expert_manifest man;
    char base[1024], repo[512], commit[128], auth[1100];
    char dir[4096];
    /* the disk cache */
    char index_path[4200];
    df_file rd;               /* reads (O_DIRECT where possible) */
    int wfd;                  /* writes */
    int lockfd;               /* flock: this process owns the disk cache */
    uint64_t cap;
    int n_slots;
    int32_t *slot_key;        /* [n_slots] key or -1 */
    uint64_t *slot_use;       /* [n_slots] clock of last use */
    uint16_t *pins;           /* [n_slots] reads in flight */
    uint8_t *taken;           /* [n_slots] filled by the current flush */
    uint8_t (*slot_dig)[16];  /* [n_slots] digest of the bytes accepted at fetch time */
    int32_t *key_slot;        /* [layers * experts] slot or -1 */
    uint64_t clock;
    int warned_write;
    /* fetching */
    CURLM *multi;
    CURL *h[REMOTE_HANDLES];
    void *hl[REMOTE_HANDLES];
    int h_busy[REMOTE_HANDLES];
    http_hdrs hh[REMOTE_HANDLES]; /* the headers of the transfer on each handle */
    pending pend[EXPERT_BATCH_MAX];
    int n_pend;
    int assign[EXPERT_BATCH_MAX];
    char url[8192];
    char err[1024];
    expert_remote_stats st;
};

static size_t key_of(const expert_remote *r, int il, int e) { return (size_t)il * (size_t)r->s->n_experts + (size_t)e; }

/* ------------------------------------------------------------ install.json */

typedef struct install_info {
    int stream;
    char base[1024], repo[512], commit[128];
    uint64_t cache_max;
} install_info;

static int read_install(const char *dir, install_info *ii, int need, df_error *err)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/install.json", dir);
    memset(ii, 0, sizeof *ii);
    struct stat sb;
    if (stat(path, &sb)) {
        if (!need) return 0;
        return df_err_set(err, DF_ERR_IO, -1, "%s: cannot read: %s", path, strerror(errno));
    }
    char *text = NULL;
    size_t len = 0;
    if (read_small_file(path, &text, &len, 256u << 20, err)) return -1;
    json_doc *d = json_parse(text, len, err);
    free(text);
    if (!d) return df_err_prefix(err, "%s", path), -1;
    const json_value *root = json_root(d);
    const char *mode = json_get_str(root, "mode");
    int rc = 0;
    if (!mode || (strcmp(mode, "stream") && strcmp(mode, "full"))) {
        rc = df_err_set(err, DF_ERR_FORMAT, -1, "%s: \"mode\" must be \"full\" or \"stream\"", path);
    } else if (!strcmp(mode, "stream")) {
        const char *b = json_get_str(root, "base_url"), *rp = json_get_str(root, "repo"),
                   *c = json_get_str(root, "commit");
        int64_t cm = -1;
        json_get_int(root, "disk_cache_max", &cm);
        if (!b || !rp || !c || cm < 0 || strlen(b) >= sizeof ii->base || strlen(rp) >= sizeof ii->repo ||
            strlen(c) >= sizeof ii->commit || strspn(c, "0123456789abcdef") != strlen(c) || strchr(rp, ' '))
            rc = df_err_set(err, DF_ERR_FORMAT, -1,
                            "%s: a streamed install needs \"base_url\", \"repo\", \"commit\" and \"disk_cache_max\"",
                            path);
        else {
            ii->stream = 1;
            snprintf(ii->base, sizeof ii->base, "%s", b);
            snprintf(ii->repo, sizeof ii->repo, "%s", rp);
            snprintf(ii->commit, sizeof ii->commit, "%s", c);
            ii->cache_max = (uint64_t)cm;
        }
    }
    json_free(d);
    return rc;
}

int expert_remote_detect(const char *dir, df_error *err)
{
    install_info ii;
    if (read_install(dir, &ii, 0, err)) return -1;
    return ii.stream;
}

/* ------------------------------------------------------------ the index */

/* INDEX_MAGIC, layers, experts, slot bytes, slots (u32 x3 + u64), then per
 * slot key (i32), last use (u64) and the df_hash128 digest of the bytes
 * accepted when the expert was fetched (16 bytes), then the CRC-32 of all
 * before it. */
static void index_seal(uint8_t *b, size_t n) /* the CRC of a whole index buffer of n bytes */
{
    uint32_t crc = df_crc32(0, b, n - 4);
    memcpy(b + n - 4, &crc, 4);
}

static int index_write(const char *path, const uint8_t *b, size_t n, df_error *err)
{
    atomic_file af;
    int rc = atomic_file_open(&af, path, err);
    if (!rc && (rc = atomic_file_write(&af, b, n, err))) atomic_file_abort(&af);
    if (!rc) rc = atomic_file_commit(&af, err);
    return rc;
}

static int save_index(expert_remote *r, df_error *err)
{
    size_t n = INDEX_HEAD + (size_t)r->n_slots * INDEX_SLOT + 4;
    uint8_t *b = xmalloc(n), *p = b;
    memcpy(p, INDEX_MAGIC, 8), p += 8;
    uint32_t v[3] = {(uint32_t)r->s->n_layers, (uint32_t)r->s->n_experts, (uint32_t)r->s->slot_bytes};
    memcpy(p, v, 12), p += 12;
    uint64_t ns = (uint64_t)r->n_slots;
    memcpy(p, &ns, 8), p += 8;
    for (int i = 0; i < r->n_slots; i++) {
        memcpy(p, &r->slot_key[i], 4), p += 4;
        memcpy(p, &r->slot_use[i], 8), p += 8;
        memcpy(p, r->slot_dig[i], 16), p += 16;
    }
    index_seal(b, n);
    int rc = index_write(r->index_path, b, n, err);
    free(b);
    return rc;
}

/* A saved index, read back whole: 1, with the header's fields; 0 when
 * there is none; -1 when it is damaged (size, magic or CRC); -2 when it is
 * whole but in the older format without digests (read no further). */
typedef struct cache_index {
    char *buf;
    size_t len;
    uint32_t layers, experts, slot_bytes;
    uint64_t n;               /* slots */
} cache_index;

static int index_read(const char *path, cache_index *ix)
{
    size_t n = 0;
    df_error e = {0};
    memset(ix, 0, sizeof *ix);
    if (read_small_file(path, &ix->buf, &n, 1u << 30, &e)) return 0;
    const char *b = ix->buf;
    uint32_t v[3], crc = 0;
    if (n >= INDEX_HEAD + 4) {
        memcpy(v, b + 8, 12);
        memcpy(&ix->n, b + 20, 8);
        memcpy(&crc, b + n - 4, 4);
    }
    int old = n >= INDEX_HEAD + 4 && !memcmp(b, INDEX_MAGIC_V1, 8) && crc == df_crc32(0, b, n - 4);
    if (n < INDEX_HEAD + 4 || memcmp(b, INDEX_MAGIC, 8) || ix->n > (1u << 24) ||
        n != INDEX_HEAD + ix->n * INDEX_SLOT + 4 || crc != df_crc32(0, b, n - 4)) {
        free(ix->buf);
        ix->buf = NULL;
        ix->n = 0;
        return old ? -2 : -1;
    }
    ix->len = n;
    ix->layers = v[0], ix->experts = v[1], ix->slot_bytes = v[2];
    return 1;
}

/* slot i's key (-1 free), last use and digest */
static int32_t index_key(const cache_index *ix, uint64_t i)
{
    int32_t k;
    memcpy(&k, ix->buf + INDEX_HEAD + i * INDEX_SLOT, 4);
    return k;
}

static uint64_t index_use(const cache_index *ix, uint64_t i)
{
    uint64_t u;
    memcpy(&u, ix->buf + INDEX_HEAD + i * INDEX_SLOT + 4, 8);
    return u;
}

static const uint8_t *index_digest(const cache_index *ix, uint64_t i)
{
    return (const uint8_t *)ix->buf + INDEX_HEAD + i * INDEX_SLOT + 12;
}

/* What an earlier run cached, when the index is whole and for this model's
 * shapes; slots past a smaller cap are dropped.  Anything else: empty. */
static void load_index(expert_remote *r)
{
    cache_index ix;
    int got = index_read(r->index_path, &ix);
    size_t nk = (size_t)r->s->n_layers * (size_t)r->s->n_experts;
    if (!got) return;
    if (got == -2) {
        df_log("%s: written by an older deltafin (no digest per slot): starting an empty cache", r->index_path);
        goto out;
    }
    if (got < 0 || ix.layers != (uint32_t)r->s->n_layers || ix.experts != (uint32_t)r->s->n_experts ||
        ix.slot_bytes != (uint32_t)r->s->slot_bytes) {
        df_log("%s: not this model's disk cache index, or damaged: starting an empty cache", r->index_path);
        goto out;
    }
    for (uint64_t i = 0; i < ix.n && (int)i < r->n_slots; i++) {
        int32_t k = index_key(&ix, i);
        uint64_t use = index_use(&ix, i);
        if (k < 0 || (size_t)k >= nk || r->key_slot[k] >= 0 || r->man.shard[k] < 0) continue;
        r->slot_key[i] = k;
        r->slot_use[i] = use;
        memcpy(r->slot_dig[i], index_digest(&ix, i), 16);
        r->key_slot[k] = (int32_t)i;
        if (use > r->clock) r->clock = use;
    }
out:
    free(ix.buf);
}

/* ------------------------------------------------------------ opening */

static const char *base_name(const char *p)
{
    const char *s = strrchr(p, '/');
    return s ? s + 1 : p;
}

int expert_remote_open(expert_store *s, const char *dir, uint64_t cache_max, df_error *err)
{
    install_info ii;
    if (read_install(dir, &ii, 1, err)) return -1;
    if (!ii.stream) return df_err_set(err, DF_ERR_ARG, -1, "%s is not a streamed install", dir);
    if (s->ggml) return df_err_set(err, DF_ERR_UNSUPPORTED, -1, "streamed installs hold safetensors models");
    expert_remote *r = xcalloc(1, sizeof *r);
    r->s = s;
    r->wfd = r->lockfd = -1;
    r->rd.fd = -1;
    snprintf(r->dir, sizeof r->dir, "%s", dir);
    snprintf(r->base, sizeof r->base, "%s", ii.base);
    snprintf(r->repo, sizeof r->repo, "%s", ii.repo);
    snprintf(r->commit, sizeof r->commit, "%s", ii.commit);
    const char *tok = getenv("HF_TOKEN");
    if (tok && *tok) snprintf(r->auth, sizeof r->auth, "Authorization: Bearer %s", tok);
    char path[4300];
    snprintf(path, sizeof path, "%s/experts.manifest", dir);
    if (expert_manifest_load(path, &r->man, err)) goto bad;
    if (r->man.n_layers > s->n_layers || r->man.n_experts != s->n_experts) {
        df_err_set(err, DF_ERR_FORMAT, -1, "%s: %d layers x %d experts, the model has %d x %d", path, r->man.n_layers,
                   r->man.n_experts, s->n_layers, s->n_experts);
        goto bad;
    }
    if (r->man.n_layers < s->n_layers) { /* trailing layers without routed experts: unlisted */
        expert_manifest full;
        if (expert_manifest_init(&full, s->n_layers, s->n_experts, err)) goto bad;
        size_t nm = (size_t)r->man.n_layers * (size_t)s->n_experts;
        memcpy(full.shard, r->man.shard, nm * sizeof *full.shard);
        memcpy(full.off, r->man.off, nm * sizeof *full.off);
        memcpy(full.len, r->man.len, nm * sizeof *full.len);
        memcpy(full.sha, r->man.sha, nm * sizeof *full.sha);
        memcpy(full.has_sha, r->man.has_sha, nm);
        full.shards = r->man.shards;
        full.n_shards = r->man.n_shards;
        r->man.shards = NULL;
        r->man.n_shards = 0;
        expert_manifest_free(&r->man);
        r->man = full;
    }
    /* every routed expert the store knows must be in the manifest at the same place */
    size_t nk = (size_t)s->n_layers * (size_t)s->n_experts;
    for (size_t k = 0; k < nk; k++) {
        const expert_loc *l = &s->loc[k];
        if (l->file < 0) continue;
        int il = (int)(k / (size_t)s->n_experts), e = (int)(k % (size_t)s->n_experts);
        int sh = r->man.shard[k];
        if (sh < 0 || !l->contiguous || strcmp(r->man.shards[sh].name, base_name(s->paths[l->file])) ||
            r->man.off[k] != l->offset || r->man.len[k] != s->expert_bytes) {
            df_err_set(err, DF_ERR_FORMAT, -1,
                       "%s: layer %d expert %d is not where the model's headers put it (%s at %" PRIu64 ", %" PRIu64
                       " bytes)",
                       path, il, e, base_name(s->paths[l->file]), l->offset, s->expert_bytes);
            goto bad;
        }
    }
    /* the disk cache */
    r->cap = cache_max ? cache_max : ii.cache_max;
    r->n_slots = (int)(r->cap / s->slot_bytes > (1u << 24) ? (1u << 24) : r->cap / s->slot_bytes);
    snprintf(path, sizeof path, "%s/expert-cache", dir);
    if (mkdir(path, 0755) && errno != EEXIST) {
        df_err_set(err, DF_ERR_IO, -1, "%s: cannot create: %s", path, strerror(errno));
        goto bad;
    }
    /* one process owns the disk cache; another one fetches without it
     * (two writers would overwrite each other's slots) */
    snprintf(path, sizeof path, "%s/expert-cache/lock", dir);
    r->lockfd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (r->lockfd < 0 || flock(r->lockfd, LOCK_EX | LOCK_NB)) {
        df_log("%s/expert-cache is in use by another deltafin process: this one fetches the experts it misses "
               "without a disk cache",
               dir);
        r->n_slots = 0;
    }
    snprintf(r->index_path, sizeof r->index_path, "%s/expert-cache/index", dir);
    snprintf(path, sizeof path, "%s/expert-cache/data", dir);
    r->wfd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (r->wfd < 0) {
        df_err_set(err, DF_ERR_IO, -1, "%s: cannot open: %s", path, strerror(errno));
        goto bad;
    }
    r->slot_key = xmalloc(((size_t)r->n_slots + 1) * sizeof *r->slot_key);
    r->slot_use = xcalloc((size_t)r->n_slots + 1, sizeof *r->slot_use);
    r->pins = xcalloc((size_t)r->n_slots + 1, sizeof *r->pins);
    r->taken = xcalloc((size_t)r->n_slots + 1, 1);
    r->slot_dig = xcalloc((size_t)r->n_slots + 1, sizeof *r->slot_dig);
    r->key_slot = xmalloc(nk * sizeof *r->key_slot);
    for (int i = 0; i < r->n_slots; i++) r->slot_key[i] = -1;
    for (size_t k = 0; k < nk; k++) r->key_slot[k] = -1;
    if (r->n_slots) load_index(r);
    /* a smaller cap than last time: the data file shrinks with it */
    struct stat sb;
    uint64_t want = (uint64_t)r->n_slots * s->slot_bytes;
    if (r->n_slots && !fstat(r->wfd, &sb) && (uint64_t)sb.st_size > want && ftruncate(r->wfd, (off_t)want) == 0) {
        df_error e2 = {0};
        if (save_index(r, &e2)) df_log("%s", e2.msg);
    }
    if (df_file_open(&r->rd, path, s->mode == IO_BUFFERED ? IO_BUFFERED : IO_AUTO, err)) goto bad;
    /* the transfers */
    r->multi = curl_multi_init();
    if (!r->multi) {
        df_err_set(err, DF_ERR_IO, -1, "cannot start libcurl");
        goto bad;
    }
    curl_multi_setopt(r->multi, CURLMOPT_MAX_HOST_CONNECTIONS, (long)REMOTE_HANDLES);
    for (int i = 0; i < REMOTE_HANDLES; i++) {
        r->h[i] = http_handle_new(r->auth, "deltafin-stream/1", &r->hl[i]);
        if (!r->h[i]) {
            df_err_set(err, DF_ERR_IO, -1, "cannot start libcurl");
            goto bad;
        }
    }
    s->remote = r;
    return 0;
bad:
    expert_remote_close(r);
    return -1;
}

void expert_remote_close(expert_remote *r)
{
    if (!r) return;
    for (int i = 0; i < REMOTE_HANDLES; i++) {
        if (r->h[i]) {
            if (r->h_busy[i] && r->multi) curl_multi_remove_handle(r->multi, r->h[i]);
            curl_easy_cleanup(r->h[i]);
        }
        curl_slist_free_all(r->hl[i]);
    }
    if (r->multi) curl_multi_cleanup(r->multi);
    df_file_close(&r->rd);
    if (r->wfd >= 0) close(r->wfd);
    if (r->lockfd >= 0) close(r->lockfd);
    expert_manifest_free(&r->man);
    free(r->slot_key);
    free(r->slot_use);
    free(r->pins);
    free(r->taken);
    free(r->slot_dig);
    free(r->key_slot);
    free(r);
}

/* ------------------------------------------------------------ reads */

int expert_remote_lookup(expert_remote *r, int il, int e, int *fd, uint64_t *off, int *direct)
{
    int32_t cs = r->key_slot[key_of(r, il, e)];
    if (cs < 0) return 0;
    r->pins[cs]++;
    r->slot_use[cs] = ++r->clock;
    r->st.disk_hits++;
    *fd = r->rd.fd;
    *direct = r->rd.direct;
    *off = (uint64_t)cs * r->s->slot_bytes;
    return 1;
}

void expert_remote_read_done(expert_remote *r, int il, int e)
{
    int32_t cs = r->key_slot[key_of(r, il, e)];
    if (cs >= 0 && r->pins[cs]) r->pins[cs]--;
}

void expert_remote_queue_fetch(expert_remote *r, int il, int e, uint8_t *slot, int64_t tag)
{
    CHECK(r->n_pend < EXPERT_BATCH_MAX);
    pending *p = &r->pend[r->n_pend++];
    size_t k = key_of(r, il, e);
    *p = (pending){.il = il, .e = e, .slot = slot, .tag = tag, .want = r->man.len[k], .slot_seen = -1, .r = r};
    for (int j = 0; j < 2; j++) p->x[j] = (transfer){.p = p, .to_slot = !j, .state = X_WAIT, .handle = -1};
    if (r->man.has_sha[k]) p->x[1].state = X_IDLE; /* its SHA-256 checks the one copy */
}

const char *expert_remote_error(const expert_remote *r) { return r->err; }
const df_file *expert_remote_file(const expert_remote *r) { return &r->rd; }
const expert_remote_stats *expert_remote_get_stats(const expert_remote *r) { return &r->st; }

void expert_remote_get_info(const expert_remote *r, expert_remote_info *o)
{
    memset(o, 0, sizeof *o);
    snprintf(o->base, sizeof o->base, "%s", r->base);
    snprintf(o->repo, sizeof o->repo, "%s", r->repo);
    snprintf(o->commit, sizeof o->commit, "%s", r->commit);
    o->cache_max = r->cap;
    o->cache_slots = r->n_slots;
    for (int i = 0; i < r->n_slots; i++) o->cache_filled += r->slot_key[i] >= 0;
    o->cache_used = (uint64_t)o->cache_filled * r->s->expert_bytes;
    o->hashed = expert_manifest_hashed(&r->man, &o->listed);
}

/* ------------------------------------------------------------ fetching */

static void set_err(expert_remote *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void set_err(expert_remote *r, const char *fmt, ...)
{
    if (r->err[0]) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->err, sizeof r->err, fmt, ap);
    va_end(ap);
}

static size_t body_cb(char *d, size_t sz, size_t nm, void *ud)
{
    transfer *t = ud;
    pending *p = t->p;
    size_t n = sz * nm;
    if (t->got + n > p->want) return 0; /* more than asked: a mirror ignoring Range */
    if (t->to_slot) {
        const expert_loc *l = &p->r->s->loc[key_of(p->r, p->il, p->e)];
        memcpy(p->slot + l->lead + t->got, d, n);
    }
    df_hash128_add(&t->hash, d, n);
    t->got += n;
    return n;
}

static void start(expert_remote *r, transfer *t, int hi)
{
    const expert_manifest *m = &r->man;
    pending *p = t->p;
    size_t k = key_of(r, p->il, p->e);
    CURL *c = r->h[hi];
    char range[64];
    snprintf(r->url, sizeof r->url, "%s/%s/resolve/%s/%s", r->base, r->repo, r->commit, m->shards[m->shard[k]].name);
    snprintf(range, sizeof range, "%" PRIu64 "-%" PRIu64, m->off[k], m->off[k] + m->len[k] - 1);
    t->got = 0;
    df_hash128_init(&t->hash);
    http_prepare(c, r->url, range, body_cb, t, &r->hh[hi]);
    curl_easy_setopt(c, CURLOPT_PRIVATE, t);
    curl_multi_add_handle(r->multi, c);
    r->h_busy[hi] = 1;
    t->handle = hi;
    t->state = X_ACTIVE;
}

static void release(expert_remote *r, transfer *t)
{
    if (t->handle < 0) return;
    curl_multi_remove_handle(r->multi, r->h[t->handle]);
    r->h_busy[t->handle] = 0;
    t->handle = -1;
}

/* An expert done with (P_OK or P_FAILED): a transfer of it still on a
 * handle (its other copy, when it failed) is dropped. */
static void settle(expert_remote *r, pending *p, int state)
{
    for (int j = 0; j < 2; j++) {
        release(r, &p->x[j]);
        p->x[j].state = X_IDLE;
    }
    p->state = state;
}

/* A complete copy of an expert without a SHA-256 (length and Content-Range
 * checked), its digest d: accepted when the slot's copy equals another
 * one; else, once both transfers are done, another copy into the slot. */
static void copy_done(expert_remote *r, transfer *t, const uint8_t d[16], double now)
{
    pending *p = t->p;
    if (p->n_seen) { /* the first complete copy is the one needed; the others are the price of comparing */
        r->st.compare_fetches++;
        r->st.compare_bytes += t->got;
    }
    int agree = 0;
    if (t->to_slot) {
        for (int i = 0; i < p->n_seen; i++) agree |= !memcmp(p->seen[i], d, 16);
        p->slot_seen = p->n_seen < REMOTE_COPIES ? p->n_seen : -1;
    } else
        agree = p->slot_seen >= 0 && !memcmp(p->seen[p->slot_seen], d, 16);
    if (p->n_seen < REMOTE_COPIES) memcpy(p->seen[p->n_seen++], d, 16);
    t->state = X_IDLE;
    if (agree) {
        memcpy(p->digest, d, 16);
        settle(r, p, P_OK);
        return;
    }
    const transfer *o = t == &p->x[0] ? &p->x[1] : &p->x[0];
    if (o->state != X_IDLE) return; /* the other copy is still coming */
    const expert_manifest *m = &r->man;
    size_t k = key_of(r, p->il, p->e);
    const char *shard = m->shards[m->shard[k]].name;
    if (p->n_seen >= REMOTE_COPIES) {
        set_err(r, "layer %d expert %d from %s/%s/resolve/%.12s/%s: %d copies differ between fetches, no two agree "
                   "(the mirror or the network changes the bytes; without a SHA-256 the right copy cannot be told)",
                p->il, p->e, r->base, r->repo, r->commit, shard, p->n_seen);
        settle(r, p, P_FAILED);
        return;
    }
    if (p->n_seen == 2) {
        r->st.copy_mismatches++;
        df_log("layer %d expert %d from %s/%s/resolve/%.12s/%s: two fetches differ (no SHA-256 to tell the right "
               "one): fetching it again until two copies agree",
               p->il, p->e, r->base, r->repo, r->commit, shard);
    }
    r->st.retries++;
    p->slot_seen = -1; /* the slot is written over */
    p->x[0].state = X_WAIT;
    p->x[0].not_before = now;
}

/* A finished transfer: a copy accepted, compared, retried later, or the
 * expert failed. */
static void finish(expert_remote *r, transfer *t, CURLcode cc, double now)
{
    pending *p = t->p;
    CURL *c = r->h[t->handle];
    const http_hdrs *hh = &r->hh[t->handle];
    long status = 0;
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
    release(r, t);
    const expert_manifest *m = &r->man;
    size_t k = key_of(r, p->il, p->e);
    const char *shard = m->shards[m->shard[k]].name;
    char want_range[128];
    snprintf(want_range, sizeof want_range, "bytes %" PRIu64 "-%" PRIu64 "/", m->off[k], m->off[k] + m->len[k] - 1);
    if (cc == CURLE_OK && status == 206 && t->got == p->want && !strncmp(hh->range, want_range, strlen(want_range))) {
        r->st.bytes += t->got;
        uint8_t hd[16];
        df_hash128_final(&t->hash, hd);
        if (!m->has_sha[k]) {
            copy_done(r, t, hd, now);
            return;
        }
        uint8_t d[32];
        sha256_ctx sc;
        sha256_init(&sc);
        sha256_update(&sc, p->slot + r->s->loc[k].lead, p->want);
        sha256_final(&sc, d);
        if (!memcmp(d, m->sha[k], 32)) {
            memcpy(p->digest, hd, 16);
            settle(r, p, P_OK);
            return;
        }
        if (++p->mismatches >= 2) {
            set_err(r, "layer %d expert %d from %s/%s/resolve/%.12s/%s: SHA-256 mismatch twice (the mirror serves other "
                       "bytes than the manifest's)",
                    p->il, p->e, r->base, r->repo, r->commit, shard);
            settle(r, p, P_FAILED);
            return;
        }
    } else if (cc == CURLE_OK && (status == 200 || (status >= 400 && status < 500 && status != 408 && status != 429))) {
        set_err(r, "layer %d expert %d from %s/%s/resolve/%.12s/%s: %s", p->il, p->e, r->base, r->repo, r->commit, shard,
                status == 200 ? "the mirror ignores Range requests (HTTP 200)"
                : status == 401 || status == 403 ? "HTTP 401/403 (set HF_TOKEN for a gated or private repository)"
                                                  : "refused by the server");
        if (status != 200) snprintf(r->err + strlen(r->err), sizeof r->err - strlen(r->err), " (HTTP %ld)", status);
        settle(r, p, P_FAILED);
        return;
    }
    r->st.retries++;
    if (++t->attempt >= REMOTE_TRIES) {
        set_err(r, "layer %d expert %d from %s/%s/resolve/%.12s/%s: failed %d times (last: %s, HTTP %ld, %" PRIu64
                   " of %" PRIu64 " bytes)",
                p->il, p->e, r->base, r->repo, r->commit, shard, REMOTE_TRIES,
                cc != CURLE_OK ? curl_easy_strerror(cc) : "bad answer", status, t->got, p->want);
        settle(r, p, P_FAILED);
        return;
    }
    if (t->to_slot) p->slot_seen = -1; /* written over, whatever it held */
    t->not_before = now + http_backoff_s(t->attempt - 1, hh->retry_after);
    t->state = X_WAIT;
}

static int fetch_all(expert_remote *r)
{
    int left = r->n_pend;
    while (left) {
        double now = now_sec();
        int free_h = 0;
        for (int hi = 0; hi < REMOTE_HANDLES; hi++) free_h += !r->h_busy[hi];
        for (int i = 0; i < r->n_pend && free_h; i++) {
            pending *p = &r->pend[i];
            for (int j = 0; j < 2 && free_h && p->state == P_FETCHING; j++) {
                transfer *t = &p->x[j];
                if (t->state != X_WAIT || t->not_before > now) continue;
                int hi = 0;
                while (r->h_busy[hi]) hi++;
                start(r, t, hi);
                free_h--;
            }
        }
        int running = 0;
        curl_multi_perform(r->multi, &running);
        CURLMsg *msg;
        int q;
        while ((msg = curl_multi_info_read(r->multi, &q))) {
            if (msg->msg != CURLMSG_DONE) continue;
            transfer *t = NULL;
            curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, (char **)&t);
            if (!t || t->handle < 0 || t->p->state != P_FETCHING) continue; /* dropped with its expert */
            finish(r, t, msg->data.result, now_sec());
            if (t->p->state != P_FETCHING) left--;
        }
        if (left) curl_multi_poll(r->multi, NULL, 0, 20, NULL);
    }
    return 0;
}

int expert_disk_victim(int n, const int32_t *key, const uint64_t *use, const uint16_t *pins, const uint8_t *taken)
{
    int best = -1;
    for (int i = 0; i < n; i++) {
        if (pins[i] || taken[i]) continue;
        if (key[i] < 0) return i;
        if (best < 0 || use[i] < use[best]) best = i;
    }
    return best;
}

/* The fetched experts into the disk cache: victims freed in the saved
 * index first, bytes written and synced, then the new owners saved. */
static void store_fetched(expert_remote *r, uint8_t *taken)
{
    if (!r->n_slots) {
        for (int i = 0; i < r->n_pend; i++) r->st.not_cached += r->pend[i].state == P_OK;
        return;
    }
    memset(taken, 0, (size_t)r->n_slots);
    int freed = 0, n = 0;
    for (int i = 0; i < r->n_pend; i++) {
        r->assign[i] = -1;
        if (r->pend[i].state != P_OK) continue;
        int v = expert_disk_victim(r->n_slots, r->slot_key, r->slot_use, r->pins, taken);
        if (v < 0) {
            r->st.not_cached++;
            continue;
        }
        taken[v] = 1;
        if (r->slot_key[v] >= 0) {
            r->key_slot[r->slot_key[v]] = -1;
            r->slot_key[v] = -1;
            r->st.evictions++;
            freed = 1;
        }
        r->assign[i] = v;
        n++;
    }
    df_error e = {0};
    if (freed && save_index(r, &e)) goto fail;
    for (int i = 0; i < r->n_pend; i++) {
        if (r->assign[i] < 0) continue;
        const pending *p = &r->pend[i];
        const expert_loc *l = &r->s->loc[key_of(r, p->il, p->e)];
        size_t len = (size_t)align_up(l->lead + r->s->expert_bytes, DF_DIRECT_ALIGN);
        off_t at = (off_t)((uint64_t)r->assign[i] * r->s->slot_bytes);
        for (size_t w = 0; w < len;) {
            ssize_t k = pwrite(r->wfd, p->slot + w, len - w, at + (off_t)w);
            if (k < 0 && errno == EINTR) continue;
            if (k <= 0) {
                df_err_set(&e, DF_ERR_IO, -1, "%s/expert-cache/data: write failed: %s", r->dir,
                           k < 0 ? strerror(errno) : "no space");
                goto fail;
            }
            w += (size_t)k;
        }
    }
    if (n && fdatasync(r->wfd)) {
        df_err_set(&e, DF_ERR_IO, -1, "%s/expert-cache/data: sync failed: %s", r->dir, strerror(errno));
        goto fail;
    }
    for (int i = 0; i < r->n_pend; i++) {
        int v = r->assign[i];
        if (v < 0) continue;
        size_t k = key_of(r, r->pend[i].il, r->pend[i].e);
        r->slot_key[v] = (int32_t)k;
        r->key_slot[k] = v;
        r->slot_use[v] = ++r->clock;
        memcpy(r->slot_dig[v], r->pend[i].digest, 16);
    }
    if (n && save_index(r, &e)) goto fail;
    return;
fail:
    /* the experts are in RAM and verified: the run goes on, uncached */
    if (!r->warned_write) df_log("disk cache not updated: %s", e.msg);
    r->warned_write = 1;
    for (int i = 0; i < r->n_pend; i++) {
        int v = r->assign[i];
        if (v < 0 || r->slot_key[v] >= 0) continue;
        r->st.not_cached++;
    }
}

void expert_remote_flush(expert_remote *r, void (*done)(void *ud, int64_t tag, int il, int e, int ok), void *ud)
{
    if (!r->n_pend) return;
    int was = alloc_guard_exempt_begin();
    double t0 = now_sec();
    fetch_all(r);
    r->st.fetch_sec += now_sec() - t0;
    for (int i = 0; i < r->n_pend; i++) r->st.fetches += r->pend[i].state == P_OK;
    store_fetched(r, r->taken);
    alloc_guard_exempt_end(was);
    for (int i = 0; i < r->n_pend; i++) done(ud, r->pend[i].tag, r->pend[i].il, r->pend[i].e, r->pend[i].state == P_OK);
    r->n_pend = 0;
}

/* ------------------------------------------------------------ --check */

/* The slots marked wrong freed in the saved index, under the disk cache's
 * lock (not taken: another process owns the cache, and it is left alone). */
static int drop_slots(const char *dir, cache_index *ix, const uint8_t *wrong, df_error *err)
{
    char path[4300];
    snprintf(path, sizeof path, "%s/expert-cache/lock", dir);
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0) return df_err_set(err, DF_ERR_IO, -1, "%s: cannot open: %s", path, strerror(errno));
    if (flock(fd, LOCK_EX | LOCK_NB)) {
        close(fd);
        return df_err_set(err, DF_ERR_IO, -1, "%s/expert-cache is in use by another deltafin process", dir);
    }
    for (uint64_t i = 0; i < ix->n; i++) {
        if (!wrong[i]) continue;
        int32_t none = -1;
        memcpy(ix->buf + INDEX_HEAD + i * INDEX_SLOT, &none, 4);
        memset(ix->buf + INDEX_HEAD + i * INDEX_SLOT + 4, 0, INDEX_SLOT - 4);
    }
    index_seal((uint8_t *)ix->buf, ix->len);
    snprintf(path, sizeof path, "%s/expert-cache/index", dir);
    int rc = index_write(path, (const uint8_t *)ix->buf, ix->len, err);
    close(fd);
    return rc;
}

int expert_cache_verify(const char *dir, expert_cache_check *out, df_error *err)
{
    char path[4300];
    expert_manifest m;
    memset(out, 0, sizeof *out);
    snprintf(path, sizeof path, "%s/experts.manifest", dir);
    if (expert_manifest_load(path, &m, err)) return -1;
    snprintf(path, sizeof path, "%s/expert-cache/index", dir);
    cache_index ix;
    int have = index_read(path, &ix), rc = 0;
    uint8_t *wrong = NULL, *buf = NULL;
    if (!have) { /* nothing cached yet */
        expert_manifest_free(&m);
        return 0;
    }
    if (have == -2) { /* never read by a run again: nothing in it is used */
        out->old_index = 1;
        goto out;
    }
    if (have < 0 || ix.experts != (uint32_t)m.n_experts) {
        rc = df_err_set(err, DF_ERR_FORMAT, -1, "%s: damaged or not this model's (the next run starts an empty cache)",
                        path);
        goto out;
    }
    snprintf(path, sizeof path, "%s/expert-cache/data", dir);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        rc = df_err_set(err, DF_ERR_IO, -1, "%s: cannot open: %s", path, strerror(errno));
        goto out;
    }
    size_t cap = 0;
    wrong = xcalloc(ix.n + 1, 1);
    for (uint64_t i = 0; i < ix.n; i++) {
        int32_t k = index_key(&ix, i);
        if (k < 0) continue;
        if ((size_t)k >= (size_t)m.n_layers * (size_t)m.n_experts || m.shard[k] < 0) {
            df_log("%s: slot %" PRIu64 " names no expert of the manifest", path, i);
            wrong[i] = 1;
            out->wrong++;
            continue;
        }
        if (m.len[k] > cap) {
            cap = (size_t)m.len[k];
            buf = xrealloc(buf, cap);
        }
        uint64_t at = i * ix.slot_bytes + m.off[k] % DF_DIRECT_ALIGN;
        ssize_t got = pread(fd, buf, (size_t)m.len[k], (off_t)at);
        size_t n = got > 0 ? (size_t)got : 0;
        int ok = got == (ssize_t)m.len[k];
        if (m.has_sha[k]) {
            uint8_t d[32];
            sha256_ctx c;
            sha256_init(&c);
            sha256_update(&c, buf, n);
            sha256_final(&c, d);
            ok = ok && !memcmp(d, m.sha[k], 32);
        } else {
            uint8_t d[16];
            df_hash128 h;
            df_hash128_init(&h);
            df_hash128_add(&h, buf, n);
            df_hash128_final(&h, d);
            ok = ok && !memcmp(d, index_digest(&ix, i), 16);
        }
        if (ok) {
            out->sha_ok += m.has_sha[k];
            out->digest_ok += !m.has_sha[k];
            continue;
        }
        df_log("%s: slot %" PRIu64 " (layer %d expert %d) does not match %s", path, i,
               (int)((size_t)k / (size_t)m.n_experts), (int)((size_t)k % (size_t)m.n_experts),
               m.has_sha[k] ? "its SHA-256" : "the digest recorded when it was fetched");
        wrong[i] = 1;
        out->wrong++;
    }
    close(fd);
    if (out->wrong) {
        df_error e = {0};
        if (drop_slots(dir, &ix, wrong, &e))
            df_log("%s/expert-cache: the damaged slots are left in place (%s): remove %s/expert-cache before the next "
                   "run",
                   dir, e.msg, dir);
        else out->dropped = out->wrong;
    }
out:
    free(buf);
    free(wrong);
    free(ix.buf);
    expert_manifest_free(&m);
    return rc;
}

/* ------------------------------------------------------------ describe */

int expert_remote_describe(const char *dir, expert_remote_info *o, df_error *err)
{
    install_info ii;
    memset(o, 0, sizeof *o);
    if (read_install(dir, &ii, 0, err)) return -1;
    if (!ii.stream) return 0;
    snprintf(o->base, sizeof o->base, "%s", ii.base);
    snprintf(o->repo, sizeof o->repo, "%s", ii.repo);
    snprintf(o->commit, sizeof o->commit, "%s", ii.commit);
    o->cache_max = ii.cache_max;
    char path[4300];
    expert_manifest m;
    snprintf(path, sizeof path, "%s/experts.manifest", dir);
    if (expert_manifest_load(path, &m, err)) return -1;
    o->hashed = expert_manifest_hashed(&m, &o->listed);
    snprintf(path, sizeof path, "%s/expert-cache/index", dir);
    cache_index ix;
    if (index_read(path, &ix) > 0) {
        o->cache_slots = (int)ix.n;
        for (uint64_t i = 0; i < ix.n; i++) {
            int32_t k = index_key(&ix, i);
            if (k >= 0 && (size_t)k < (size_t)m.n_layers * (size_t)m.n_experts && m.shard[k] >= 0) {
                o->cache_filled++;
                o->cache_used += m.len[k];
            }
        }
    }
    free(ix.buf);
    expert_manifest_free(&m);
    return 1;
}
