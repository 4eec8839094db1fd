/* setup_stream.c - the planning half of `deltafin setup --stream` (L5).
 *
 * A streamed install holds everything but the routed experts: the small
 * files whole, and each safetensors shard at its full size with only its
 * header and trunk tensors written (the experts' ranges are holes, which
 * take no disk on any Linux file system).  The engine then reads the trunk
 * as from a full install and fetches each expert on first use
 * (store/expert_remote.c).  Here: every shard's header is fetched by a
 * range request and parsed; routed experts are the tensors named
 * "...layers.L.block_sparse_moe.experts.E.w{1,2,3}.weight_{packed,scale}",
 * each expert's six must be one contiguous range (as K3 ships them); the
 * trunk is the rest of the file.  The manifest (store/expert_manifest.h)
 * lists each expert's shard, offset and length.
 * Hashes: the Hub publishes whole-file SHA-256s only.  With --verify every
 * shard is fetched whole once, hashed against its lfs.oid, each expert and
 * the trunk hashed into the manifest, and the shard cut down to its trunk
 * (holes punched in place) as soon as it is complete, so the disk holds the
 * trunk plus the shards in flight.  A manifest the repository publishes
 * (experts.manifest, fetched and checked like any small file) gives its
 * hashes too, once its offsets agree with the headers; a trunk hash in it
 * is checked against what was fetched.  Otherwise the install says that
 * its experts are unverified (checked for size and bounds, and fetched twice
 * at run time to compare the copies: expert_remote.h), and each
 * shard's trunk, once staged, is fetched a second time through a hash (not
 * stored) and compared range by range with the staged bytes: bytes that
 * change between fetches, or a staged piece damaged across a restart, are
 * fetched again, and refused when they differ twice.  The agreeing trunk's
 * SHA-256 goes into the manifest for --check; a mirror that serves the
 * same wrong bytes every time is not caught (only --verify catches it).
 */
#define _GNU_SOURCE
#include "setup_impl.h"
#include "expert_remote.h"
#include "file.h"
#include "http.h"
#include "safetensors.h"
#include "sha.h"
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define PARTIAL_MANIFEST ".deltafin-manifest"
#define HEADER_TRIES 4

static const char *parts[6] = {"w1.weight_packed", "w1.weight_scale", "w2.weight_packed",
                               "w2.weight_scale", "w3.weight_packed", "w3.weight_scale"};

/* layer and expert of a routed expert's tensor, else 0 */
static int expert_name(const char *name, int *layer, int *expert)
{
    const char *l = strstr(name, ".layers."), *x = strstr(name, ".block_sparse_moe.experts.");
    if (!l || !x || x < l) return 0;
    char *end;
    long lv = strtol(l + 8, &end, 10);
    if (end == l + 8 || *end != '.' || lv < 0 || lv > 4095) return 0;
    long ev = strtol(x + 26, &end, 10);
    if (end == x + 26 || *end != '.' || ev < 0 || ev > 65535) return 0;
    for (int p = 0; p < 6; p++)
        if (!strcmp(end + 1, parts[p])) {
            *layer = (int)lv;
            *expert = (int)ev;
            return 1;
        }
    return 0;
}

static int ends_with(const char *s, const char *t)
{
    size_t a = strlen(s), b = strlen(t);
    return a >= b && !strcmp(s + a - b, t);
}

static const char *base_name(const char *p)
{
    const char *s = strrchr(p, '/');
    return s ? s + 1 : p;
}

static int fetch_header_once(setup *S, int fi, st_file *out, df_error *err)
{
    const setup_file *f = &S->files[fi];
    char url[4096], range[64];
    snprintf(url, sizeof url, "%s/%s/resolve/%s/%s", S->base, S->repo, S->commit, f->path);
    char *b = NULL;
    size_t n = 0;
    if (f->size < 8) return df_err_set(err, DF_ERR_FORMAT, -1, "%s: %" PRIu64 " bytes is no safetensors file", f->path, f->size);
    if (setup_get(S, url, "0-7", &b, &n, 64, NULL, 0, err)) return -1;
    uint64_t hl = 0;
    if (n == 8) memcpy(&hl, b, 8);
    free(b);
    if (n != 8 || hl < 2 || hl > ST_MAX_HEADER || 8 + hl > f->size)
        return df_err_set(err, DF_ERR_FORMAT, -1, "%s: not a safetensors header (length %" PRIu64 ")", f->path, hl);
    snprintf(range, sizeof range, "0-%" PRIu64, 8 + hl - 1);
    if (setup_get(S, url, range, &b, &n, (size_t)hl + 16, NULL, 0, err)) return -1;
    int rc = n == 8 + hl ? st_parse((const uint8_t *)b, n, f->size, f->path, out, err)
                         : df_err_set(err, DF_ERR_IO, -1, "%s: the header arrived short", f->path);
    free(b);
    return rc;
}

/* A shard's header; a reply that is not one (short, garbled) is asked for
 * again with the backoff of every request before it counts as an error. */
static int fetch_header(setup *S, int fi, st_file *out, df_error *err)
{
    for (int attempt = 0;; attempt++) {
        int rc = fetch_header_once(S, fi, out, err);
        if (!rc || attempt + 1 == HEADER_TRIES) return rc;
        fprintf(stderr, "deltafin: setup: %s: %s: asking again\n", S->files[fi].path, err->msg);
        *err = (df_error){0};
        atomic_fetch_add(&S->retries, 1);
        http_backoff(attempt, -1);
    }
}

/* hashes of an earlier run's staging manifest, for what has not changed */
static void take_hashes(setup *S)
{
    char p[4400];
    snprintf(p, sizeof p, "%s/" PARTIAL_MANIFEST, S->staging);
    expert_manifest old;
    df_error e = {0};
    if (access(p, R_OK) || expert_manifest_load(p, &old, &e)) return;
    expert_manifest *m = &S->man;
    if (old.n_layers == m->n_layers && old.n_experts == m->n_experts && old.n_shards == m->n_shards) {
        for (int i = 0; i < m->n_shards; i++)
            if (old.shards[i].has_trunk_sha && !strcmp(old.shards[i].name, m->shards[i].name)) {
                memcpy(m->shards[i].trunk_sha, old.shards[i].trunk_sha, 32);
                m->shards[i].has_trunk_sha = 1;
            }
        size_t nk = (size_t)m->n_layers * (size_t)m->n_experts;
        for (size_t k = 0; k < nk; k++)
            if (old.has_sha[k] && old.shard[k] == m->shard[k] && old.off[k] == m->off[k] && old.len[k] == m->len[k]) {
                memcpy(m->sha[k], old.sha[k], 32);
                m->has_sha[k] = 1;
            }
    }
    expert_manifest_free(&old);
}

/* Shard si's trunk: the complement of its experts in [0, size), in file
 * order, into a new array; returns the count. */
static int trunk_ranges(const expert_manifest *m, int si, uint64_t size, byte_range **out)
{
    size_t nk = (size_t)m->n_layers * (size_t)m->n_experts;
    int ne = 0;
    for (size_t k = 0; k < nk; k++) ne += m->shard[k] == si;
    byte_range *ex = xmalloc(((size_t)ne + 1) * sizeof *ex);
    ne = 0;
    for (size_t k = 0; k < nk; k++)
        if (m->shard[k] == si) ex[ne++] = (byte_range){m->off[k], m->len[k]};
    for (int a = 1; a < ne; a++) { /* insertion sort by offset (already nearly sorted) */
        byte_range v = ex[a];
        int b = a;
        for (; b > 0 && ex[b - 1].off > v.off; b--) ex[b] = ex[b - 1];
        ex[b] = v;
    }
    byte_range *tr = xmalloc(((size_t)ne + 1) * sizeof *tr);
    int nt = 0;
    uint64_t at = 0;
    for (int a = 0; a <= ne; a++) {
        uint64_t end = a < ne ? ex[a].off : size;
        if (end > at) tr[nt++] = (byte_range){at, end - at};
        if (a < ne) at = ex[a].off + ex[a].len;
    }
    free(ex);
    *out = tr;
    return nt;
}

int stream_plan(setup *S, df_error *err)
{
    int nf = S->n_files, rc = -1;
    S->shard = xcalloc((size_t)nf, sizeof *S->shard);
    S->want = xcalloc((size_t)nf, sizeof *S->want);
    S->n_want = xcalloc((size_t)nf, sizeof *S->n_want);
    S->trunk_bytes = xcalloc((size_t)nf, sizeof *S->trunk_bytes);
    S->tries = xcalloc((size_t)nf, sizeof *S->tries);
    S->left = xcalloc((size_t)nf, sizeof *S->left);
    S->published = -1;
    st_file *hd = xcalloc((size_t)nf, sizeof *hd);
    int max_l = -1, max_e = -1, n_sh = 0;
    for (int i = 0; i < nf; i++) {
        S->trunk_bytes[i] = S->files[i].size;
        if (!strcmp(S->files[i].path, STREAM_MANIFEST)) S->published = i;
        if (!ends_with(S->files[i].path, ".safetensors")) continue;
        S->shard[i] = 1;
        n_sh++;
        if (fetch_header(S, i, &hd[i], err)) goto out;
        for (size_t t = 0; t < hd[i].n_tensors; t++) {
            int l, e;
            if (!expert_name(hd[i].tensors[t].name, &l, &e)) continue;
            if (l > max_l) max_l = l;
            if (e > max_e) max_e = e;
        }
    }
    if (!n_sh) {
        rc = df_err_set(err, DF_ERR_FORMAT, -1, "%s lists no .safetensors shard: nothing to stream", S->repo);
        goto out;
    }
    if (max_l < 0) {
        rc = df_err_set(err, DF_ERR_FORMAT, -1, "%s has no routed experts (no \"block_sparse_moe.experts\" tensors)",
                        S->repo);
        goto out;
    }
    if (expert_manifest_init(&S->man, max_l + 1, max_e + 1, err)) goto out;
    size_t nk = (size_t)(max_l + 1) * (size_t)(max_e + 1);
    uint64_t *lo = xmalloc(nk * sizeof *lo), *hi = xcalloc(nk, sizeof *hi), *sum = xcalloc(nk, sizeof *sum);
    uint8_t *cnt = xcalloc(nk, 1);
    int32_t *owner = xmalloc(nk * sizeof *owner);
    for (size_t k = 0; k < nk; k++) lo[k] = UINT64_MAX, owner[k] = -1;
    int bad = 0;
    for (int i = 0; i < nf && !bad; i++) {
        if (!S->shard[i]) continue;
        int si = expert_manifest_add_shard(&S->man, base_name(S->files[i].path), S->files[i].size, err);
        if (si < 0 || strchr(S->files[i].path, '/')) {
            df_err_set(err, DF_ERR_FORMAT, -1, "%s: a shard must sit at the top of the repository", S->files[i].path);
            bad = 1;
            break;
        }
        for (size_t t = 0; t < hd[i].n_tensors; t++) {
            const st_tensor *x = &hd[i].tensors[t];
            int l, e;
            if (!expert_name(x->name, &l, &e)) continue;
            size_t k = (size_t)l * (size_t)(max_e + 1) + (size_t)e;
            if (owner[k] >= 0 && owner[k] != si) {
                df_err_set(err, DF_ERR_UNSUPPORTED, -1, "layer %d expert %d: its tensors are split across shards", l, e);
                bad = 1;
                break;
            }
            owner[k] = si;
            cnt[k]++;
            sum[k] += x->nbytes;
            if (x->offset < lo[k]) lo[k] = x->offset;
            if (x->offset + x->nbytes > hi[k]) hi[k] = x->offset + x->nbytes;
        }
    }
    for (size_t k = 0; k < nk && !bad; k++) {
        if (owner[k] < 0) continue;
        int l = (int)(k / (size_t)(max_e + 1)), e = (int)(k % (size_t)(max_e + 1));
        if (cnt[k] != 6 || hi[k] - lo[k] != sum[k]) {
            df_err_set(err, DF_ERR_UNSUPPORTED, -1,
                       "layer %d expert %d: its six tensors are not one contiguous range in %s; a streamed install "
                       "fetches each expert with one range request (install this model with --full)",
                       l, e, S->man.shards[owner[k]].name);
            bad = 1;
            break;
        }
        S->man.shard[k] = owner[k];
        S->man.off[k] = lo[k];
        S->man.len[k] = sum[k];
        S->expert_total += sum[k];
    }
    /* each shard's trunk: the complement of its experts, in file order */
    for (int i = 0, si = 0; i < nf && !bad; i++) {
        if (!S->shard[i]) continue;
        S->n_want[i] = trunk_ranges(&S->man, si, S->files[i].size, &S->want[i]);
        uint64_t kept = 0;
        for (int a = 0; a < S->n_want[i]; a++) kept += S->want[i][a].len;
        S->trunk_bytes[i] = kept;
        si++;
    }
    free(lo);
    free(hi);
    free(sum);
    free(cnt);
    free(owner);
    if (bad) goto out;
    take_hashes(S);
    rc = 0;
out:
    for (int i = 0; i < nf; i++) st_deinit(&hd[i]);
    free(hd);
    return rc;
}

static int shard_index(const setup *S, int fi)
{
    int si = 0;
    for (int i = 0; i < fi; i++) si += S->shard[i];
    return si;
}

static int pread_all(int fd, uint8_t *b, size_t n, uint64_t off)
{
    for (size_t got = 0; got < n;) {
        ssize_t r = pread(fd, b + got, n - got, (off_t)(off + got));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return -1;
        got += (size_t)r;
    }
    return 0;
}

/* SHA-256 of the file's bytes in ranges, in order */
static int hash_ranges(int fd, const byte_range *r, int n, uint8_t out[32])
{
    sha256_ctx c;
    sha256_init(&c);
    size_t bs = 4u << 20;
    uint8_t *b = xmalloc(bs);
    int rc = 0;
    for (int i = 0; i < n && !rc; i++)
        for (uint64_t at = 0; at < r[i].len && !rc; at += bs) {
            size_t k = (size_t)(r[i].len - at < bs ? r[i].len - at : bs);
            if (pread_all(fd, b, k, r[i].off + at)) rc = -1;
            else sha256_update(&c, b, k);
        }
    free(b);
    sha256_final(&c, out);
    return rc;
}

static int save_partial(setup *S, df_error *err)
{
    char p[4400];
    snprintf(p, sizeof p, "%s/" PARTIAL_MANIFEST, S->staging);
    pthread_mutex_lock(&S->mu);
    int rc = expert_manifest_save(p, &S->man, err);
    pthread_mutex_unlock(&S->mu);
    return rc;
}

static int trim_copy(const char *path, uint64_t size, const byte_range *r, int n, df_error *err);

/* The file cut down to the ranges: the bytes between them punched out in
 * place (no second copy on disk at any time); where the file system cannot
 * punch holes, a sparse copy renamed over it.  Interrupted, the file no
 * longer hashes to its lfs.oid and a restart fetches it again. */
static int trim(const char *path, uint64_t size, const byte_range *r, int n, df_error *err)
{
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0) return df_err_set(err, DF_ERR_IO, -1, "%s: cannot open: %s", path, strerror(errno));
    uint64_t at = 0;
    int rc = 0;
    for (int i = 0; i <= n && !rc; i++) {
        uint64_t end = i < n ? r[i].off : size;
#if defined(FALLOC_FL_PUNCH_HOLE)
        if (end > at && fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)at, (off_t)(end - at)))
            rc = errno == EOPNOTSUPP ? 1 : -1;
#else
        rc = 1; /* no hole punching here (macOS: F_PUNCHHOLE is a later step): the copy */
#endif
        if (i < n) at = r[i].off + r[i].len;
    }
    if (!rc && fsync(fd)) rc = -1;
    close(fd);
    if (rc > 0) return trim_copy(path, size, r, n, err);
    if (rc) return df_err_set(err, DF_ERR_IO, -1, "%s: cutting it down to its trunk failed: %s", path, strerror(errno));
    return 0;
}

static int trim_copy(const char *path, uint64_t size, const byte_range *r, int n, df_error *err)
{
    char tmp[4500];
    snprintf(tmp, sizeof tmp, "%s.trim", path);
    int in = open(path, O_RDONLY | O_CLOEXEC), out = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    int rc = 0;
    size_t bs = 4u << 20;
    uint8_t *b = xmalloc(bs);
    if (in < 0 || out < 0 || ftruncate(out, (off_t)size)) rc = -1;
    for (int i = 0; i < n && !rc; i++)
        for (uint64_t at = 0; at < r[i].len && !rc; at += bs) {
            size_t k = (size_t)(r[i].len - at < bs ? r[i].len - at : bs);
            if (pread_all(in, b, k, r[i].off + at) || pwrite(out, b, k, (off_t)(r[i].off + at)) != (ssize_t)k) rc = -1;
        }
    free(b);
    if (!rc && fsync(out)) rc = -1;
    if (in >= 0) close(in);
    if (out >= 0 && close(out)) rc = -1;
    if (!rc && rename(tmp, path)) rc = -1;
    if (rc) {
        unlink(tmp);
        return df_err_set(err, DF_ERR_IO, -1, "%s: cutting it down to its trunk failed: %s", path, strerror(errno));
    }
    return 0;
}

int stream_finish_shard(setup *S, int fi, df_error *err)
{
    setup_file *f = &S->files[fi];
    char p[4400], got[80];
    snprintf(p, sizeof p, "%s/%s", S->staging, f->path);
    if (fsync(S->fds[fi]) || setup_hash_file(p, f, got, sizeof got, err)) {
        if (!err->msg[0]) df_err_set(err, DF_ERR_IO, -1, "%s: %s", p, strerror(errno));
        return -1;
    }
    if (strcmp(got, f->hash)) {
        fprintf(stderr, "deltafin: setup: %s: SHA-256 mismatch (%s, expected %s)%s\n", f->path, got, f->hash,
                S->tries[fi] ? "" : ": fetching it again");
        return 1;
    }
    int si = shard_index(S, fi);
    int fd = open(p, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return df_err_set(err, DF_ERR_IO, -1, "%s: cannot open: %s", p, strerror(errno));
    expert_manifest *m = &S->man;
    size_t nk = (size_t)m->n_layers * (size_t)m->n_experts;
    int rc = 0;
    for (size_t k = 0; k < nk && !rc; k++) {
        if (m->shard[k] != si) continue;
        byte_range r = {m->off[k], m->len[k]};
        uint8_t d[32];
        if (hash_ranges(fd, &r, 1, d)) rc = -1;
        pthread_mutex_lock(&S->mu);
        memcpy(m->sha[k], d, 32);
        m->has_sha[k] = 1;
        pthread_mutex_unlock(&S->mu);
    }
    uint8_t t[32];
    if (!rc && hash_ranges(fd, S->want[fi], S->n_want[fi], t)) rc = -1;
    close(fd);
    if (rc) return df_err_set(err, DF_ERR_IO, -1, "%s: read failed: %s", p, strerror(errno));
    pthread_mutex_lock(&S->mu);
    memcpy(m->shards[si].trunk_sha, t, 32);
    m->shards[si].has_trunk_sha = 1;
    pthread_mutex_unlock(&S->mu);
    /* the hashes are saved before the experts' bytes go */
    if (save_partial(S, err) || trim(p, f->size, S->want[fi], S->n_want[fi], err)) return -1;
    f->verified = 1;
    return 0;
}

int stream_recheck_shard(setup *S, int fi, byte_range *bad, df_error *err)
{
    setup_file *f = &S->files[fi];
    char p[4400], url[4096];
    snprintf(p, sizeof p, "%s/%s", S->staging, f->path);
    snprintf(url, sizeof url, "%s/%s/resolve/%s/%s", S->base, S->repo, S->commit, f->path);
    if (fsync(S->fds[fi])) return df_err_set(err, DF_ERR_IO, -1, "%s: %s", p, strerror(errno));
    int fd = open(p, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return df_err_set(err, DF_ERR_IO, -1, "%s: cannot open: %s", p, strerror(errno));
    sha256_ctx all;
    sha256_init(&all);
    size_t bs = 4u << 20;
    uint8_t *b = xmalloc(bs);
    int rc = 0;
    for (int i = 0; i < S->n_want[fi] && !rc; i++) {
        const byte_range *r = &S->want[fi][i];
        sha256_ctx one;
        sha256_init(&one);
        for (uint64_t at = 0; at < r->len && !rc; at += bs) {
            size_t k = (size_t)(r->len - at < bs ? r->len - at : bs);
            if (pread_all(fd, b, k, r->off + at))
                rc = df_err_set(err, DF_ERR_IO, -1, "%s: read failed: %s", p, errno ? strerror(errno) : "short file");
            else {
                sha256_update(&one, b, k);
                sha256_update(&all, b, k);
            }
        }
        if (rc || !r->len) continue;
        uint8_t disk[32], net[32];
        sha256_final(&one, disk);
        if (setup_hash_get(S, url, r->off, r->len, f->size, net, err)) {
            df_err_prefix(err, "checking the trunk");
            rc = -1;
        } else if (memcmp(disk, net, 32)) {
            *bad = *r;
            rc = 1;
        }
    }
    free(b);
    close(fd);
    if (rc) return rc;
    uint8_t t[32];
    sha256_final(&all, t);
    int si = shard_index(S, fi);
    pthread_mutex_lock(&S->mu);
    memcpy(S->man.shards[si].trunk_sha, t, 32);
    S->man.shards[si].has_trunk_sha = 1;
    pthread_mutex_unlock(&S->mu);
    f->verified = 1;
    return 0;
}

int stream_finish(setup *S, df_error *err)
{
    expert_manifest *m = &S->man;
    char p[4400];
    if (S->published >= 0) {
        snprintf(p, sizeof p, "%s/%s", S->staging, STREAM_MANIFEST);
        expert_manifest pub;
        if (expert_manifest_load(p, &pub, err)) return df_err_prefix(err, "the repository's manifest"), -1;
        size_t nk = (size_t)m->n_layers * (size_t)m->n_experts;
        int rc = 0;
        if (pub.n_layers != m->n_layers || pub.n_experts != m->n_experts)
            rc = df_err_set(err, DF_ERR_FORMAT, -1, "the repository's %s is for %d x %d experts, the shards hold %d x %d",
                            STREAM_MANIFEST, pub.n_layers, pub.n_experts, m->n_layers, m->n_experts);
        for (size_t k = 0; k < nk && !rc; k++) {
            if (pub.shard[k] < 0) continue;
            if (m->shard[k] < 0 || strcmp(pub.shards[pub.shard[k]].name, m->shards[m->shard[k]].name) ||
                pub.off[k] != m->off[k] || pub.len[k] != m->len[k])
                rc = df_err_set(err, DF_ERR_FORMAT, -1,
                                "the repository's %s puts layer %zu expert %zu elsewhere than the shard headers do",
                                STREAM_MANIFEST, k / (size_t)m->n_experts, k % (size_t)m->n_experts);
            else if (pub.has_sha[k] && m->has_sha[k] && memcmp(pub.sha[k], m->sha[k], 32))
                rc = df_err_set(err, DF_ERR_FORMAT, -1,
                                "the repository's %s gives layer %zu expert %zu another SHA-256 than its shard's bytes",
                                STREAM_MANIFEST, k / (size_t)m->n_experts, k % (size_t)m->n_experts);
            else if (pub.has_sha[k]) {
                memcpy(m->sha[k], pub.sha[k], 32);
                m->has_sha[k] = 1;
            }
        }
        /* its trunk hashes check what was fetched */
        for (int i = 0, si = 0; i < S->n_files && !rc; i++) {
            if (!S->shard[i]) continue;
            int pi = -1;
            for (int j = 0; j < pub.n_shards; j++)
                if (!strcmp(pub.shards[j].name, m->shards[si].name)) pi = j;
            if (pi >= 0 && pub.shards[pi].has_trunk_sha) {
                if (m->shards[si].has_trunk_sha) {
                    if (memcmp(m->shards[si].trunk_sha, pub.shards[pi].trunk_sha, 32))
                        rc = df_err_set(err, DF_ERR_FORMAT, -1, "%s: its trunk's SHA-256 differs from the repository's %s",
                                        S->files[i].path, STREAM_MANIFEST);
                } else {
                    char fp[4400];
                    uint8_t d[32];
                    snprintf(fp, sizeof fp, "%s/%s", S->staging, S->files[i].path);
                    int fd = open(fp, O_RDONLY | O_CLOEXEC);
                    if (fd < 0 || hash_ranges(fd, S->want[i], S->n_want[i], d))
                        rc = df_err_set(err, DF_ERR_IO, -1, "%s: cannot read", fp);
                    else if (memcmp(d, pub.shards[pi].trunk_sha, 32))
                        rc = df_err_set(err, DF_ERR_FORMAT, -1,
                                        "%s: the trunk fetched does not match the SHA-256 in the repository's %s (the "
                                        "mirror serves other bytes); nothing was installed",
                                        S->files[i].path, STREAM_MANIFEST);
                    else {
                        memcpy(m->shards[si].trunk_sha, d, 32);
                        m->shards[si].has_trunk_sha = 1;
                    }
                    if (fd >= 0) close(fd);
                }
            }
            si++;
        }
        expert_manifest_free(&pub);
        if (rc) return -1;
    }
    snprintf(p, sizeof p, "%s/%s", S->staging, STREAM_MANIFEST);
    if (expert_manifest_save(p, m, err)) return -1;
    snprintf(p, sizeof p, "%s/" PARTIAL_MANIFEST, S->staging);
    unlink(p);
    return 0;
}

int stream_unverified(const char *dir)
{
    char p[4400];
    snprintf(p, sizeof p, "%s/%s", dir, STREAM_MANIFEST);
    expert_manifest m;
    df_error err = {0};
    if (expert_manifest_load(p, &m, &err)) return 1;
    size_t listed = 0, hashed = expert_manifest_hashed(&m, &listed);
    expert_manifest_free(&m);
    return hashed != listed;
}

int stream_check(const char *dir, const char *path, uint64_t size, int *n_checked)
{
    static expert_manifest m;
    static char loaded[4200];
    df_error err = {0};
    char p[4400];
    if (strcmp(loaded, dir)) {
        expert_manifest_free(&m);
        snprintf(p, sizeof p, "%s/%s", dir, STREAM_MANIFEST);
        if (expert_manifest_load(p, &m, &err)) {
            fprintf(stderr, "deltafin: setup --check: %s\n", err.msg);
            return 1;
        }
        snprintf(loaded, sizeof loaded, "%s", dir);
    }
    snprintf(p, sizeof p, "%s/%s", dir, path);
    struct stat sb;
    if (stat(p, &sb) || (uint64_t)sb.st_size != size) {
        fprintf(stderr, "deltafin: setup --check: %s: missing or not %" PRIu64 " bytes\n", path, size);
        return 1;
    }
    int si = -1;
    for (int j = 0; j < m.n_shards; j++)
        if (!strcmp(m.shards[j].name, base_name(path))) si = j;
    if (si < 0) {
        fprintf(stderr, "deltafin: setup --check: %s is not in %s\n", path, STREAM_MANIFEST);
        return 1;
    }
    if (!m.shards[si].has_trunk_sha) {
        fprintf(stderr, "deltafin: setup --check: %s: size only (its trunk has no SHA-256: set up by an older deltafin without --verify; run setup again)\n",
                path);
        return 0;
    }
    byte_range *tr;
    int nt = trunk_ranges(&m, si, size, &tr);
    uint8_t d[32];
    int fd = open(p, O_RDONLY | O_CLOEXEC), bad = fd < 0 || hash_ranges(fd, tr, nt, d);
    if (fd >= 0) close(fd);
    free(tr);
    if (bad || memcmp(d, m.shards[si].trunk_sha, 32)) {
        fprintf(stderr, "deltafin: setup --check: %s: %s\n", path, bad ? "cannot read" : "its trunk's SHA-256 differs");
        return 1;
    }
    (*n_checked)++;
    return 0;
}
