/* setup.c - `deltafin setup --full`: install a model from a Hugging
 * Face-compatible mirror, resumable and verified (front end, L5).
 *
 *   deltafin setup --full --repo ORG/NAME --out DIR [--revision REV]
 *                  [--base-url URL] [--workers N] [--chunk SIZE] [--reserve SIZE]
 *                  [--dry-run]
 *   deltafin setup --stream [--verify] [--disk-cache-max SIZE] ... (the same)
 *   deltafin setup --check DIR
 *   deltafin setup --drafter ORG/NAME --out MODEL_DIR ... (setup_drafter.c:
 *                  a draft model at MODEL_DIR/drafters/NAME, as --full)
 *
 * --stream: the trunk only, experts fetched on first use (setup_stream.c
 * plans it: which byte ranges of each shard to fetch, the manifest;
 * store/expert_remote.c fetches at run time).  Its pieces are the shards'
 * trunk ranges, or whole shards with --verify (each hashed and cut down to
 * its trunk as soon as it is complete, by the worker that completed it).
 *
 * The remote: the base URL (--base-url, else $HF_ENDPOINT, else
 * https://huggingface.co), $HF_TOKEN as a bearer token.  The revision is
 * resolved to a commit (GET {base}/api/models/{repo}/revision/{rev}, its
 * "sha") and every later request names the commit, so the install is
 * pinned.  The file list: GET {base}/api/models/{repo}/tree/{commit}
 * ?recursive=true, following `Link: <...>; rel="next"` pages; an entry with
 * "lfs" is checked by lfs.oid (SHA-256) and lfs.size, one without by its
 * git blob id (SHA-1 of "blob <size>\0" + content).  Bytes come from GET
 * {base}/{repo}/resolve/{commit}/{path} with Range, redirects followed.
 *
 * Downloading: files are cut into --chunk pieces (64 MiB) that --workers
 * threads (8), each with its own keep-alive connection, fetch into files of
 * the staging directory DIR.partial (pre-sized, written with pwrite); a
 * piece is accepted only when the answer is 206 with the asked
 * Content-Range (or 200 for a whole file) and exactly its length arrived.
 * 429, 5xx, dropped connections, stalls and short bodies are retried with
 * backoff (Retry-After honoured), 8 times; other statuses stop the install
 * with the file named.  Done pieces are recorded in DIR.partial/
 * .deltafin-progress (replaced atomically after each), so a restart after
 * any interruption (kill -9 included) fetches only what is missing.  A
 * complete file is hashed; a mismatch re-fetches the whole file once, then
 * stops the install naming the file (a mirror serving other bytes).  When
 * every file is verified, install.json (remote, commit, files, sizes,
 * hashes) is written and DIR.partial renamed to DIR: DIR never holds a
 * partial or unverified model.  Before downloading, the disk is planned:
 * the bytes still to fetch must fit the free space less --reserve (the
 * larger of 1 GiB and 1% of the disk), else the install is refused with
 * the numbers.  Progress: a status line on a terminal, plain lines (every
 * 10% or 30 s) otherwise.  --check re-verifies an install offline.
 */
#define _GNU_SOURCE
#include "cli.h"
#include "options.h"
#include "file.h"
#include "http.h"
#include "json.h"
#include "setup_impl.h"
#include "expert_remote.h"
#include "sha.h"
#include "util.h"

#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#define PROGRESS_FILE ".deltafin-progress"


/* ------------------------------------------------------------ HTTP */

/* ------------------------------------------------------ the file list */

static int resolve_commit(setup *S, df_error *err)
{
    char url[2400];
    snprintf(url, sizeof url, "%s/api/models/%s/revision/%s", S->base, S->repo, S->rev);
    char *body = NULL;
    size_t n = 0;
    if (setup_get(S, url, NULL, &body, &n, 64u << 20, NULL, 0, err)) return -1;
    json_doc *d = json_parse(body, n, err);
    free(body);
    if (!d) return df_err_prefix(err, "%s", url), -1;
    const char *sha = json_get_str(json_root(d), "sha");
    int rc = 0;
    if (!sha || strlen(sha) < 7 || strlen(sha) >= sizeof S->commit || strspn(sha, "0123456789abcdef") != strlen(sha))
        rc = df_err_set(err, DF_ERR_FORMAT, -1, "%s: no commit \"sha\" in the answer", url);
    else snprintf(S->commit, sizeof S->commit, "%s", sha);
    json_free(d);
    return rc;
}

static int list_files(setup *S, df_error *err)
{
    char url[4096];
    snprintf(url, sizeof url, "%s/api/models/%s/tree/%s?recursive=true", S->base, S->repo, S->commit);
    int cap = 0;
    for (int page = 0; page < 10000 && url[0]; page++) {
        char *body = NULL;
        size_t n = 0;
        char next[2048] = "";
        if (setup_get(S, url, NULL, &body, &n, 256u << 20, next, sizeof next, err)) return -1;
        json_doc *d = json_parse(body, n, err);
        free(body);
        if (!d) return df_err_prefix(err, "%s", url), -1;
        int rc = setup_listing_entries(json_root(d), &S->files, &S->n_files, &cap, url, err);
        json_free(d);
        if (rc) return -1;
        snprintf(url, sizeof url, "%s", next);
    }
    if (!S->n_files) return df_err_set(err, DF_ERR_FORMAT, -1, "%s at %s lists no files", S->repo, S->commit);
    return 0;
}

/* ------------------------------------------------------ progress file */

/* "DFPROG01", the commit, n_chunks, chunk size, then one byte per chunk
 * (1 done) and one per file (1 verified). */
static int save_progress(setup *S, df_error *err)
{
    atomic_file af;
    if (atomic_file_open(&af, S->progress, err)) return -1;
    char head[256];
    int n = snprintf(head, sizeof head, "DFPROG01 %s %d %llu %d\n", S->commit, S->n_chunks,
                     (unsigned long long)S->chunk_size, S->n_files);
    uint8_t *ver = xmalloc((size_t)S->n_files);
    for (int i = 0; i < S->n_files; i++) ver[i] = (uint8_t)S->files[i].verified;
    int rc = atomic_file_write(&af, head, (size_t)n, err) || atomic_file_write(&af, S->done, (size_t)S->n_chunks, err) ||
             atomic_file_write(&af, ver, (size_t)S->n_files, err);
    free(ver);
    if (rc) {
        atomic_file_abort(&af);
        return -1;
    }
    return atomic_file_commit(&af, err);
}

/* What an earlier run left: used only when it was for the same commit,
 * chunking and file list; the files themselves are checked again by hash. */
static void load_progress(setup *S)
{
    char *text = NULL;
    size_t len = 0;
    df_error err = {0};
    if (read_small_file(S->progress, &text, &len, 1u << 30, &err)) return;
    char head[256];
    snprintf(head, sizeof head, "DFPROG01 %s %d %llu %d\n", S->commit, S->n_chunks,
             (unsigned long long)S->chunk_size, S->n_files);
    size_t hl = strlen(head);
    if (len == hl + (size_t)S->n_chunks + (size_t)S->n_files && !memcmp(text, head, hl)) {
        for (int i = 0; i < S->n_chunks; i++) S->done[i] = text[hl + (size_t)i] == 1;
        for (int i = 0; i < S->n_files; i++) S->files[i].verified = text[hl + (size_t)S->n_chunks + (size_t)i] == 1;
    }
    free(text);
}

/* ------------------------------------------------------------ workers */

typedef struct sink {
    int fd;
    uint64_t off, want, got;
    setup *S;
} sink;

static size_t file_write(char *d, size_t sz, size_t nm, void *ud)
{
    sink *k = ud;
    size_t n = sz * nm;
    if (k->got + n > k->want) return 0; /* more than asked: refuse (a mirror ignoring Range) */
    for (size_t w = 0; w < n;) {
        ssize_t r = pwrite(k->fd, d + w, n - w, (off_t)(k->off + k->got + w));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return 0;
        w += (size_t)r;
    }
    k->got += n;
    atomic_fetch_add(&k->S->fetched, n);
    return n;
}

void setup_fail(setup *S, const char *fmt, ...)
{
    pthread_mutex_lock(&S->mu);
    if (!atomic_load(&S->failed)) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(S->errmsg, sizeof S->errmsg, fmt, ap);
        va_end(ap);
        atomic_store(&S->failed, 1);
    }
    pthread_mutex_unlock(&S->mu);
}

/* One piece, retried; 0 when it arrived whole. */
static int fetch_chunk(setup *S, CURL *c, int ci)
{
    const chunk *ch = &S->chunks[ci];
    const setup_file *f = &S->files[ch->file];
    char url[4096], range[64];
    snprintf(url, sizeof url, "%s/%s/resolve/%s/%s", S->base, S->repo, S->commit, f->path);
    snprintf(range, sizeof range, "%llu-%llu", (unsigned long long)ch->off, (unsigned long long)(ch->off + ch->len - 1));
    for (int attempt = 0; attempt < SETUP_MAX_TRIES && !atomic_load(&S->failed); attempt++) {
        http_hdrs h;
        sink k = {.fd = S->fds[ch->file], .off = ch->off, .want = ch->len, .S = S};
        http_prepare(c, url, f->size ? range : NULL, file_write, &k, &h);
        CURLcode cc = curl_easy_perform(c);
        long status = 0;
        curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
        char want_range[128];
        snprintf(want_range, sizeof want_range, "bytes %s/%llu", range, (unsigned long long)f->size);
        int whole = ch->off == 0 && ch->len == f->size;
        if (cc == CURLE_OK && k.got == ch->len &&
            ((status == 206 && !strcmp(h.range, want_range)) || (status == 200 && whole) || (!f->size && status == 200)))
            return 0;
        if (cc == CURLE_OK && status == 206 && h.range[0] && strcmp(h.range, want_range) &&
            !strstr(h.range, range)) {
            /* the mirror's file is not the size the list says */
            setup_fail(S, "%s: the mirror answers Content-Range \"%s\" for bytes %s of a %llu-byte file: its size "
                    "differs from the file list",
                 f->path, h.range, range, (unsigned long long)f->size);
            return -1;
        }
        if (cc == CURLE_OK && status >= 400 && status < 500 && status != 429 && status != 408) {
            setup_fail(S, "%s: HTTP %ld%s", f->path, status,
                 status == 401 || status == 403 ? " (set HF_TOKEN for a gated or private repository)" : "");
            return -1;
        }
        if (cc == CURLE_OK && status == 200 && !whole) {
            setup_fail(S, "%s: the mirror ignores Range requests (HTTP 200 for bytes %s)", f->path, range);
            return -1;
        }
        atomic_fetch_add(&S->retries, 1);
        if (attempt + 1 < SETUP_MAX_TRIES) http_backoff(attempt, h.retry_after);
        else
            setup_fail(S, "%s: bytes %s failed %d times (last: %s, HTTP %ld, %llu of %llu bytes)", f->path, range, SETUP_MAX_TRIES,
                 cc != CURLE_OK ? curl_easy_strerror(cc) : "bad answer", status, (unsigned long long)k.got,
                 (unsigned long long)ch->len);
    }
    return -1;
}

/* --verify: the complete shard fi hashed and trimmed; a mismatch sends it
 * back to be fetched again, once.  0 = go on. */
static int verify_shard(setup *S, int fi)
{
    df_error err = {0};
    int rc = stream_finish_shard(S, fi, &err);
    if (rc < 0) {
        setup_fail(S, "%s", err.msg);
        return -1;
    }
    setup_file *f = &S->files[fi];
    pthread_mutex_lock(&S->mu);
    if (rc == 1 && ++S->tries[fi] >= 2) {
        pthread_mutex_unlock(&S->mu);
        setup_fail(S, "%s: SHA-256 mismatch twice: the mirror serves other bytes; nothing was installed", f->path);
        return -1;
    }
    if (rc == 1) {
        for (int k = 0; k < f->n_chunks; k++) S->done[f->first_chunk + k] = 0;
        atomic_store(&S->left[fi], f->n_chunks);
        atomic_fetch_sub(&S->have, f->size);
        if (S->next > f->first_chunk) S->next = f->first_chunk;
    }
    int bad = save_progress(S, &err);
    pthread_mutex_unlock(&S->mu);
    if (bad) setup_fail(S, "%s", err.msg);
    return bad ? -1 : 0;
}

static void *worker(void *arg)
{
    setup *S = arg;
    struct curl_slist *hl;
    CURL *c = setup_handle_new(S, &hl);
    if (!c) {
        setup_fail(S, "cannot start libcurl");
        return NULL;
    }
    for (;;) {
        pthread_mutex_lock(&S->mu);
        while (S->next < S->n_chunks && S->done[S->next]) S->next++;
        int ci = atomic_load(&S->failed) || S->next >= S->n_chunks ? -1 : S->next++;
        pthread_mutex_unlock(&S->mu);
        if (ci < 0) break;
        atomic_fetch_add(&S->busy, 1);
        int rc = fetch_chunk(S, c, ci);
        atomic_fetch_sub(&S->busy, 1);
        if (rc) break;
        df_error err = {0};
        int fi = S->chunks[ci].file;
        pthread_mutex_lock(&S->mu);
        S->done[ci] = 1;
        atomic_fetch_add(&S->have, S->chunks[ci].len);
        int bad = save_progress(S, &err);
        int complete = S->stream && S->verify && S->shard[fi] && atomic_fetch_sub(&S->left[fi], 1) == 1;
        pthread_mutex_unlock(&S->mu);
        if (bad) {
            setup_fail(S, "%s", err.msg);
            break;
        }
        /* --verify: a shard is cut down to its trunk as soon as it is whole */
        if (complete && verify_shard(S, fi)) break;
    }
    curl_slist_free_all(hl);
    curl_easy_cleanup(c);
    return NULL;
}

/* --------------------------------------------------------------- plan */

static uint64_t dir_free(const char *dir, uint64_t *disk)
{
    struct statvfs v;
    if (statvfs(dir, &v)) return 0;
    *disk = (uint64_t)v.f_blocks * v.f_frsize;
    return (uint64_t)v.f_bavail * v.f_frsize;
}

static void parent_of(const char *path, char *out, size_t n)
{
    snprintf(out, n, "%s", path);
    char *s = strrchr(out, '/');
    if (!s) snprintf(out, n, ".");
    else if (s == out) out[1] = 0;
    else *s = 0;
}

static double gb(uint64_t b) { return (double)b / 1e9; }

static void progress_line(setup *S, double t0, int tty, int final)
{
    double t = now_sec() - t0;
    uint64_t have = atomic_load(&S->have), fetched = atomic_load(&S->fetched);
    double rate = t > 0 ? (double)fetched / t : 0;
    double eta = rate > 0 ? (double)(S->total - have) / rate : 0;
    if (tty)
        fprintf(stderr, "\r\033[Kdeltafin: setup: %.2f of %.2f GB, %.1f MB/s, ETA %.0f s, %d of %d workers busy, %d retries%s",
                gb(have), gb(S->total), rate / 1e6, eta, atomic_load(&S->busy), S->workers, atomic_load(&S->retries),
                final ? "\n" : "");
    else
        fprintf(stderr, "deltafin: setup: %.2f of %.2f GB, %.1f MB/s, ETA %.0f s, %d retries\n", gb(have), gb(S->total),
                rate / 1e6, eta, atomic_load(&S->retries));
    fflush(stderr);
}

static int mkdirs_for(const char *root, const char *rel, df_error *err)
{
    char p[4400];
    snprintf(p, sizeof p, "%s/%s", root, rel);
    for (char *s = p + strlen(root) + 1; (s = strchr(s, '/')); s++) {
        *s = 0;
        if (mkdir(p, 0755) && errno != EEXIST) return df_err_set(err, DF_ERR_IO, -1, "%s: cannot create: %s", p, strerror(errno));
        *s = '/';
    }
    return 0;
}

static void write_json_str(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"' || *s == '\\') fputc('\\', f);
        if ((unsigned char)*s < 0x20) fprintf(f, "\\u%04x", (unsigned char)*s);
        else fputc(*s, f);
    }
    fputc('"', f);
}

static int write_install(setup *S, df_error *err)
{
    char path[4400];
    snprintf(path, sizeof path, "%s/install.json", S->staging);
    FILE *f = fopen(path, "w");
    if (!f) return df_err_set(err, DF_ERR_IO, -1, "%s: cannot create: %s", path, strerror(errno));
    fprintf(f, "{\"mode\":\"%s\",\"base_url\":", S->stream ? "stream" : "full");
    write_json_str(f, S->base);
    fprintf(f, ",\"repo\":");
    write_json_str(f, S->repo);
    fprintf(f, ",\"revision\":");
    write_json_str(f, S->rev);
    fprintf(f, ",\"commit\":\"%s\",", S->commit);
    if (S->stream) {
        size_t listed = 0, hashed = expert_manifest_hashed(&S->man, &listed);
        int trunk = 1;
        for (int i = 0; i < S->man.n_shards; i++) trunk &= S->man.shards[i].has_trunk_sha;
        fprintf(f, "\"disk_cache_max\":%llu,\"experts\":%zu,\"experts_hashed\":%zu,\"trunk_hashed\":%s,",
                (unsigned long long)S->cache_max, listed, hashed, trunk ? "true" : "false");
    }
    fprintf(f, "\"files\":[");
    for (int i = 0, n = 0; i < S->n_files; i++) {
        if (S->stream && i == S->published) continue; /* replaced by the install's own manifest */
        fprintf(f, "%s{\"path\":", n++ ? "," : "");
        write_json_str(f, S->files[i].path);
        fprintf(f, ",\"size\":%llu,\"%s\":\"%s\"%s}", (unsigned long long)S->files[i].size,
                S->files[i].lfs ? "sha256" : "git_oid", S->files[i].hash,
                S->stream && S->shard[i] ? ",\"part\":\"trunk\"" : "");
    }
    fprintf(f, "]}\n");
    int bad = ferror(f) | fflush(f) | fsync(fileno(f));
    bad |= fclose(f);
    return bad ? df_err_set(err, DF_ERR_IO, -1, "%s: write failed", path) : 0;
}

/* ------------------------------------------------------------ command */

/* The pieces: whole files, or a streamed shard's trunk ranges (--verify:
 * the whole shard, cut down once hashed).  Returns the bytes the install
 * keeps; *peak_extra: the most a --verify shard holds beyond its trunk. */
static uint64_t cut_pieces(setup *S, uint64_t *peak_extra)
{
    int cap = 0;
    uint64_t keep = 0;
    *peak_extra = 0;
    for (int i = 0; i < S->n_files; i++) {
        setup_file *f = &S->files[i];
        byte_range whole = {0, f->size};
        int trunk_only = S->stream && S->shard[i] && !S->verify;
        const byte_range *r = trunk_only ? S->want[i] : &whole;
        int nr = trunk_only ? S->n_want[i] : 1;
        f->first_chunk = S->n_chunks;
        for (int j = 0; j < nr; j++)
            for (uint64_t off = 0; off < r[j].len || (!r[j].len && !off && !f->size); off += S->chunk_size) {
                if (S->n_chunks == cap) {
                    cap = cap ? 2 * cap : 1024;
                    S->chunks = xrealloc(S->chunks, (size_t)cap * sizeof *S->chunks);
                }
                uint64_t len = r[j].len - off < S->chunk_size ? r[j].len - off : S->chunk_size;
                S->chunks[S->n_chunks++] = (chunk){i, r[j].off + off, len};
                S->total += len;
                if (!f->size) break;
            }
        f->n_chunks = S->n_chunks - f->first_chunk;
        keep += S->stream && S->shard[i] ? S->trunk_bytes[i] : f->size;
        if (S->stream && S->verify && S->shard[i] && f->size - S->trunk_bytes[i] > *peak_extra)
            *peak_extra = f->size - S->trunk_bytes[i];
    }
    return keep;
}

/* The progress file read back, then the disk planned and the plan printed
 * (--dry-run: also the file list).  Returns 0 to go on, 1 when the install
 * stops here (printed), 2 after a dry run. */
static int plan_disk(setup *S, uint64_t keep, uint64_t peak_extra, int dry_run)
{
    S->done = xcalloc((size_t)S->n_chunks + 1, 1);
    load_progress(S);
    for (int i = 0; S->stream && i < S->n_chunks; i++)
        if (!S->done[i]) atomic_fetch_add(&S->left[S->chunks[i].file], 1);
    uint64_t have = 0;
    for (int i = 0; i < S->n_chunks; i++)
        if (S->done[i]) have += S->chunks[i].len;
    atomic_store(&S->have, have);
    char parent[4200];
    parent_of(S->out, parent, sizeof parent);
    uint64_t disk = 0, avail = dir_free(parent, &disk);
    uint64_t floor = disk / 100 > (1ull << 30) ? disk / 100 : 1ull << 30;
    const char *rs = getenv("DF_SETUP_RESERVE");
    if (rs) floor = strtoull(rs, NULL, 10);
    uint64_t need = S->total - have;
    if (S->stream) {
        /* on disk at most: the trunk, --verify's shards in flight (each worker's
         * shard whole until it is cut down), the disk cache's cap */
        uint64_t in_flight = peak_extra * (uint64_t)(S->workers < 2 ? S->workers : 2);
        uint64_t room = avail > floor + keep + in_flight ? avail - floor - keep - in_flight : 0;
        if (!S->cache_max) S->cache_max = S->expert_total < room / 2 ? S->expert_total : room / 2;
        need = keep + in_flight + S->cache_max;
        fprintf(stderr,
                "deltafin: setup: %s at %s (%.12s), streamed: %d files; trunk and small files %.3f GB kept, routed "
                "experts %.3f GB fetched on first use into a disk cache of at most %.3f GB%s; %.3f GB on disk "
                "already, %.3f GB to fetch now; %s has %.3f GB free (keeping %.3f GB)\n",
                S->repo, S->rev, S->commit, S->n_files, gb(keep), gb(S->expert_total), gb(S->cache_max),
                S->verify ? "; --verify: every shard streamed once and hashed" : "", gb(have), gb(S->total - have),
                parent, gb(avail), gb(floor));
    } else
        fprintf(stderr,
                "deltafin: setup: %s at %s (%.12s): %d files, %.3f GB; %.3f GB on disk already, %.3f GB to fetch; "
                "%s has %.3f GB free (keeping %.3f GB)\n",
                S->repo, S->rev, S->commit, S->n_files, gb(S->total), gb(have), gb(need), parent, gb(avail), gb(floor));
    if (dry_run) {
        for (int i = 0; i < S->n_files; i++)
            printf("%s %llu %s\n", S->files[i].path, (unsigned long long)S->files[i].size, S->files[i].hash);
        return 2;
    }
    if (avail < floor || avail - floor < need) {
        fprintf(stderr,
                "deltafin: setup: not enough disk: %.3f GB %s, %.3f GB free in %s less %.3f GB kept free "
                "(--reserve)\n",
                gb(need), S->stream ? "for the trunk, the shards in flight and the disk cache (--disk-cache-max)" : "to fetch",
                gb(avail), parent, gb(floor));
        return 1; /* printed */
    }
    return 0;
}

/* DIR.partial and its files, pre-sized and open for writing (S->fds);
 * -1 (printed) when DIR exists or cannot be made. */
static int open_staging(setup *S, df_error *err)
{
    struct stat st;
    if (!stat(S->out, &st)) {
        fprintf(stderr, "deltafin: setup: %s already exists (check it with 'deltafin setup --check %s')\n", S->out,
                S->out);
        return -1;
    }
    if (mkdir(S->staging, 0755) && errno != EEXIST) {
        fprintf(stderr, "deltafin: setup: %s: cannot create: %s\n", S->staging, strerror(errno));
        return -1;
    }
    S->fds = xcalloc((size_t)S->n_files, sizeof *S->fds);
    for (int i = 0; i < S->n_files; i++) {
        char p[4400];
        snprintf(p, sizeof p, "%s/%s", S->staging, S->files[i].path);
        if (mkdirs_for(S->staging, S->files[i].path, err)) {
            fprintf(stderr, "deltafin: setup: %s\n", err->msg);
            return -1;
        }
        S->fds[i] = open(p, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
        if (S->fds[i] < 0 || ftruncate(S->fds[i], (off_t)S->files[i].size)) {
            fprintf(stderr, "deltafin: setup: %s: %s\n", p, strerror(errno));
            return -1;
        }
    }
    return 0;
}

/* One round of downloads: the workers until every piece is tried, the
 * progress printed meanwhile. */
static void fetch_round(setup *S, double t0, int tty)
{
    pthread_t *th = xcalloc((size_t)S->workers, sizeof *th);
    char *joined = xcalloc((size_t)S->workers, 1);
    S->next = 0;
    for (int w = 0; w < S->workers; w++) pthread_create(&th[w], NULL, worker, S);
    double last = now_sec(), next_pct = 0.1;
    for (;;) {
        struct timespec ts = {0, 200000000L};
        nanosleep(&ts, NULL);
        int running = 0;
        for (int w = 0; w < S->workers; w++) {
            if (!joined[w] && pthread_tryjoin_np(th[w], NULL) == 0) joined[w] = 1;
            running |= !joined[w];
        }
        if (!running) break;
        double frac = S->total ? (double)atomic_load(&S->have) / (double)S->total : 1;
        if (tty || frac >= next_pct || now_sec() - last > 30) {
            progress_line(S, t0, tty, 0);
            last = now_sec();
            while (next_pct <= frac) next_pct += 0.1;
        }
    }
    free(th);
    free(joined);
}

/* Every piece is in: hash the files not yet verified.  Returns -1 when the
 * install stops (printed), else whether a file must be fetched again
 * (its pieces marked not done). */
static int verify_round(setup *S, int round, df_error *err)
{
    int bad = 0;
    for (int i = 0; i < S->n_files; i++) {
        setup_file *f = &S->files[i];
        if (f->verified) continue;
        if (S->stream && S->shard[i]) {
            /* --verify: hashed when complete (here: complete already at a restart) */
            if (S->verify) {
                int rc = stream_finish_shard(S, i, err);
                if (rc < 0 || (rc == 1 && round == 1)) {
                    fprintf(stderr, "deltafin: setup: %s\n",
                            rc < 0 ? err->msg : "a shard's SHA-256 did not match twice: nothing was installed");
                    return -1;
                }
                if (rc == 1) {
                    for (int k = 0; k < f->n_chunks; k++) S->done[f->first_chunk + k] = 0;
                    atomic_store(&S->left[i], f->n_chunks);
                    atomic_fetch_sub(&S->have, f->size);
                    bad = 1;
                }
            } else {
                /* the trunk fetched twice: both fetches must agree */
                byte_range r;
                int rc = stream_recheck_shard(S, i, &r, err);
                if (rc < 0) {
                    fprintf(stderr, "deltafin: setup: %s\n", err->msg);
                    return -1;
                }
                if (rc == 1) {
                    fprintf(stderr,
                            "deltafin: setup: %s: trunk bytes %llu-%llu differ between two fetches (or were "
                            "damaged on disk)%s\n",
                            f->path, (unsigned long long)r.off, (unsigned long long)(r.off + r.len - 1),
                            round ? ": the mirror serves unstable bytes; nothing was installed" : ": fetching them again");
                    if (round == 1) return -1;
                    /* the shard's whole trunk again: the check stopped at the first range */
                    for (int k = 0; k < f->n_chunks; k++)
                        if (S->done[f->first_chunk + k]) {
                            S->done[f->first_chunk + k] = 0;
                            atomic_fetch_sub(&S->have, S->chunks[f->first_chunk + k].len);
                        }
                    bad = 1;
                }
            }
            continue;
        }
        char p[4400], got[80];
        snprintf(p, sizeof p, "%s/%s", S->staging, f->path);
        if (fsync(S->fds[i]) || setup_hash_file(p, f, got, sizeof got, err)) {
            fprintf(stderr, "deltafin: setup: %s\n", err->msg[0] ? err->msg : strerror(errno));
            return -1;
        }
        if (!strcmp(got, f->hash)) {
            f->verified = 1;
            continue;
        }
        if (round == 1) {
            fprintf(stderr,
                    "deltafin: setup: %s: %s %s, the file list says %s, twice: the mirror serves other bytes; "
                    "nothing was installed\n",
                    f->path, f->lfs ? "SHA-256" : "git blob id", got, f->hash);
            return -1;
        }
        fprintf(stderr, "deltafin: setup: %s: %s mismatch (%s, expected %s): fetching it again\n", f->path,
                f->lfs ? "SHA-256" : "git blob id", got, f->hash);
        for (int k = 0; k < f->n_chunks; k++) S->done[f->first_chunk + k] = 0;
        atomic_fetch_sub(&S->have, f->size);
        bad = 1;
    }
    return bad;
}

/* The complete staging directory published as DIR (install.json, then the
 * rename) and the outcome printed; nonzero (printed) on failure. */
static int publish(setup *S, df_error *err)
{
    for (int i = 0; i < S->n_files; i++) close(S->fds[i]);
    if (S->stream && stream_finish(S, err)) {
        fprintf(stderr, "deltafin: setup: %s\n", err->msg);
        return 1;
    }
    if (write_install(S, err)) {
        fprintf(stderr, "deltafin: setup: %s\n", err->msg);
        return 1;
    }
    unlink(S->progress);
    if (rename(S->staging, S->out)) {
        fprintf(stderr, "deltafin: setup: cannot rename %s to %s: %s\n", S->staging, S->out, strerror(errno));
        return 1;
    }
    if (S->stream) {
        size_t listed = 0, hashed = expert_manifest_hashed(&S->man, &listed);
        fprintf(stderr,
                "deltafin: setup: installed %s, streamed (%.3f GB fetched this run); %zu routed experts fetched on "
                "first use, %s\n",
                S->out, gb(atomic_load(&S->fetched)), listed,
                hashed == listed ? "each checked against its SHA-256 before use"
                                 : "UNVERIFIED: no per-expert SHA-256 (use --verify, or publish experts.manifest "
                                   "beside the model); fetched experts are checked for size and bounds and fetched "
                                   "twice to compare the copies (twice the network bytes; a mirror serving the same "
                                   "wrong bytes every time is not caught)");
    } else
        fprintf(stderr, "deltafin: setup: installed %s (%d files, %.3f GB, every file verified; %.3f GB fetched this run)\n",
                S->out, S->n_files, gb(S->total), gb(atomic_load(&S->fetched)));
    return 0;
}

static int install(setup *S, int dry_run)
{
    df_error err = {0};
    if (resolve_commit(S, &err) || list_files(S, &err) || (S->drafter_of && drafter_prepare(S, S->drafter_of, &err))) {
        fprintf(stderr, "deltafin: setup: %s\n", err.msg);
        return 1;
    }
    snprintf(S->staging, sizeof S->staging, "%s.partial", S->out);
    snprintf(S->progress, sizeof S->progress, "%s/" PROGRESS_FILE, S->staging);
    if (S->stream && stream_plan(S, &err)) {
        fprintf(stderr, "deltafin: setup: %s\n", err.msg);
        return 1;
    }
    uint64_t peak_extra;
    uint64_t keep = cut_pieces(S, &peak_extra);
    int rc = plan_disk(S, keep, peak_extra, dry_run);
    if (rc) return rc == 2 ? 0 : 1;
    if (open_staging(S, &err)) return 1;
    int tty = isatty(2);
    double t0 = now_sec();
    for (int round = 0; round < 2; round++) {
        fetch_round(S, t0, tty);
        if (atomic_load(&S->failed)) {
            if (tty) fputc('\n', stderr);
            fprintf(stderr, "deltafin: setup: %s\ndeltafin: setup: stopped; run the same command again to resume\n",
                    S->errmsg);
            return 1;
        }
        int bad = verify_round(S, round, &err);
        if (bad < 0) return 1;
        if (save_progress(S, &err)) {
            fprintf(stderr, "deltafin: setup: %s\n", err.msg);
            return 1;
        }
        if (!bad) break;
    }
    progress_line(S, t0, tty, 1);
    int prc = publish(S, &err);
    if (!prc && S->drafter_of) drafter_installed(S->drafter_of, S->out);
    return prc;
}

/* --check DIR: every file of install.json against its hash, offline */
static int check_install(const char *dir)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/install.json", dir);
    char *text = NULL;
    size_t len = 0;
    df_error err = {0};
    if (read_small_file(path, &text, &len, 256u << 20, &err)) {
        fprintf(stderr, "deltafin: setup --check: %s\n", err.msg);
        return 1;
    }
    json_doc *d = json_parse(text, len, &err);
    free(text);
    const json_value *files = d ? json_get(json_root(d), "files") : NULL;
    if (!files || files->type != JSON_ARRAY) {
        fprintf(stderr, "deltafin: setup --check: %s: %s\n", path, d ? "no \"files\" array" : err.msg);
        json_free(d);
        return 1;
    }
    int bad = 0, n_trunk = 0;
    for (size_t i = 0; i < files->len; i++) {
        const json_value *e = json_at(files, i);
        const char *p = json_get_str(e, "path"), *h256 = json_get_str(e, "sha256"), *oid = json_get_str(e, "git_oid");
        int64_t size = -1;
        json_get_int(e, "size", &size);
        if (!p || size < 0 || (!h256 && !oid) || !setup_safe_path(p)) {
            fprintf(stderr, "deltafin: setup --check: %s: entry %zu is malformed\n", path, i);
            bad = 1;
            continue;
        }
        const char *part = json_get_str(e, "part");
        if (part && !strcmp(part, "trunk")) {
            bad |= stream_check(dir, p, (uint64_t)size, &n_trunk);
            continue;
        }
        setup_file f = {.size = (uint64_t)size, .lfs = h256 != NULL};
        snprintf(f.hash, sizeof f.hash, "%s", h256 ? h256 : oid);
        char fp[4400], got[80];
        snprintf(fp, sizeof fp, "%s/%s", dir, p);
        err = (df_error){0};
        if (setup_hash_file(fp, &f, got, sizeof got, &err)) {
            fprintf(stderr, "deltafin: setup --check: %s\n", err.msg);
            bad = 1;
        } else if (strcmp(got, f.hash)) {
            fprintf(stderr, "deltafin: setup --check: %s: %s, expected %s\n", p, got, f.hash);
            bad = 1;
        }
    }
    const char *mode = json_get_str(json_root(d), "mode");
    int unverified = 0;
    if (mode && !strcmp(mode, "stream")) {
        unverified = stream_unverified(dir);
        /* the experts fetched so far: against the manifest's SHA-256, or
         * the digest recorded when two fetches agreed */
        expert_cache_check cc;
        if (expert_cache_verify(dir, &cc, &err)) {
            fprintf(stderr, "deltafin: setup --check: %s\n", err.msg);
            bad = 1;
        } else if (cc.old_index) {
            fprintf(stderr, "deltafin: setup --check: %s: disk cache: an index from an older deltafin, without digests: "
                            "not checked (the next run starts an empty cache)\n", dir);
        } else {
            fprintf(stderr,
                    "deltafin: setup --check: %s: disk cache: %d experts checked against their SHA-256, %d without one "
                    "checked against the copy fetched twice (the digest recorded when two fetches agreed), %d wrong",
                    dir, cc.sha_ok, cc.digest_ok, cc.wrong);
            if (cc.wrong)
                fprintf(stderr, cc.dropped == cc.wrong ? " (dropped from the cache: the next run fetches them again)\n"
                                                       : " (left in the cache)\n");
            else fputc('\n', stderr);
            bad |= cc.wrong > 0;
        }
    }
    if (!bad && !unverified) fprintf(stderr, "deltafin: setup --check: %s: %zu files verified\n", dir, files->len);
    else if (!bad)
        fprintf(stderr,
                "deltafin: setup --check: %s: %zu files match the hashes kept at setup; UNVERIFIED: the trunks' "
                "hashes come from two fetches that agreed, not from the publisher, and the experts have no "
                "SHA-256: each was fetched twice and the copies compared, which a mirror serving the same wrong "
                "bytes every time passes (set up with --verify to check both against the shards' SHA-256)\n",
                dir, files->len);
    json_free(d);
    return bad;
}

int cmd_setup(int argc, char **argv)
{
    static setup S_;
    setup *S = &S_;
    const char *base = getenv("HF_ENDPOINT"), *repo = NULL, *rev = "main", *check = NULL, *drafter = NULL;
    int full = 0, dry = 0;
    S->workers = 8;
    S->chunk_size = 64u << 20;
    for (int i = 2; i < argc; i++) {
        const char *f = argv[i];
        int has = i + 1 < argc;
#define V() (has ? argv[++i] : (die("%s needs a value", f), ""))
        if (!strcmp(f, "--full")) full = 1;
        else if (!strcmp(f, "--stream")) S->stream = 1;
        else if (!strcmp(f, "--verify")) S->verify = 1;
        else if (!strcmp(f, "--disk-cache-max")) S->cache_max = parse_size(V(), f);
        else if (!strcmp(f, "--dry-run")) dry = 1;
        else if (!strcmp(f, "--repo")) repo = V();
        else if (!strcmp(f, "--drafter")) drafter = V();
        else if (!strcmp(f, "--revision")) rev = V();
        else if (!strcmp(f, "--base-url")) base = V();
        else if (!strcmp(f, "--out")) S->out = V();
        else if (!strcmp(f, "--check")) check = V();
        else if (!strcmp(f, "--workers")) S->workers = (int)parse_long(V(), f, 1, 64);
        else if (!strcmp(f, "--chunk")) S->chunk_size = parse_size(V(), f);
        else if (!strcmp(f, "--reserve")) setenv("DF_SETUP_RESERVE", V(), 1);
        else if (!strcmp(f, "--help") || !strcmp(f, "-h")) {
            usage(stdout);
            return 0;
        } else die("setup: unknown option \"%s\"", f);
#undef V
    }
    if (check) return check_install(check);
    static char drafter_out[4200];
    if (drafter) {
        /* beside the model: MODEL_DIR/drafters/NAME, installed as --full */
        if (full || S->stream || repo) die("--drafter ORG/NAME is the repository, installed whole: no --full, --stream or --repo");
        if (!S->out || !*S->out) die("setup --drafter needs --out MODEL_DIR (the installed model it drafts for)");
        if (!strchr(drafter, '/') || !setup_safe_path(drafter) || strchr(strchr(drafter, '/') + 1, '/'))
            die("setup --drafter needs ORG/NAME, got \"%s\"", drafter);
        struct stat st;
        if (stat(S->out, &st) || !S_ISDIR(st.st_mode)) die("setup --drafter: %s is not a model directory", S->out);
        char dir[4096];
        snprintf(dir, sizeof dir, "%s/drafters", S->out);
        if (mkdir(dir, 0755) && errno != EEXIST) die("setup --drafter: cannot create %s: %s", dir, strerror(errno));
        S->drafter_of = S->out;
        snprintf(drafter_out, sizeof drafter_out, "%s/%s", dir, strchr(drafter, '/') + 1);
        S->out = drafter_out;
        repo = drafter;
        full = 1;
    }
    if (full + S->stream != 1) die("setup needs one of --full and --stream (or --check DIR)");
    if (S->verify && !S->stream) die("--verify is for --stream (a --full install verifies every file anyway)");
    if (!repo || !strchr(repo, '/') || !setup_safe_path(repo)) die("setup needs --repo ORG/NAME");
    if (!S->out || !*S->out) die("setup needs --out DIR");
    if (S->chunk_size < 4096) die("--chunk must be at least 4K");
    if (!base || !*base) base = "https://huggingface.co";
    snprintf(S->base, sizeof S->base, "%s", base);
    for (size_t n = strlen(S->base); n && S->base[n - 1] == '/'; n--) S->base[n - 1] = 0;
    snprintf(S->repo, sizeof S->repo, "%s", repo);
    snprintf(S->rev, sizeof S->rev, "%s", rev);
    const char *tok = getenv("HF_TOKEN");
    if (tok && *tok) snprintf(S->auth, sizeof S->auth, "Authorization: Bearer %s", tok);
    pthread_mutex_init(&S->mu, NULL);
    if (curl_global_init(CURL_GLOBAL_DEFAULT)) die("cannot initialise libcurl");
    int rc = install(S, dry);
    curl_global_cleanup();
    return rc;
}
