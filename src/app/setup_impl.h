/* setup_impl.h - what setup.c (downloads, verification, publishing),
 * setup_stream.c (the streamed install's planning: shard headers, expert
 * and trunk ranges, the manifest, trimming) and setup_fetch.c (the requests
 * and hashes both make) share.  Private to the three. */
#ifndef DF_SETUP_IMPL_H
#define DF_SETUP_IMPL_H

#include "df_error.h"
#include "expert_manifest.h"
#include "setup_parse.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

typedef struct chunk {
    int file;
    uint64_t off, len;
} chunk;

typedef struct byte_range {
    uint64_t off, len;
} byte_range;

typedef struct setup {
    char base[1024], repo[512], rev[256], commit[128];
    char auth[1100];          /* "Authorization: Bearer ..." or empty */
    const char *out;
    char staging[4200], progress[4300];
    setup_file *files;
    int n_files;
    chunk *chunks;
    int n_chunks;
    uint8_t *done;            /* [n_chunks] */
    uint64_t chunk_size;
    int workers;
    /* --stream */
    int stream, verify;
    const char *drafter_of;   /* --drafter: the model directory it installs beside (else NULL) */
    uint64_t cache_max;       /* --disk-cache-max (0: chosen from the free space) */
    int *shard;               /* [n_files] 1 = a safetensors shard */
    byte_range **want;        /* [n_files] a shard's trunk ranges (NULL: the whole file) */
    int *n_want;
    uint64_t *trunk_bytes;    /* [n_files] bytes kept of each file */
    uint64_t expert_total;    /* bytes of every routed expert */
    expert_manifest man;
    int published;            /* the repository's own experts.manifest: its file index, else -1 */
    atomic_int *left;         /* [n_files] chunks not done (--verify finishes a shard when 0) */
    int *tries;               /* [n_files] --verify: times fetched whole */
    /* shared by the workers */
    pthread_mutex_t mu;
    int next;                 /* next chunk to consider */
    atomic_int failed;
    char errmsg[1024];
    atomic_ullong fetched;    /* bytes received this run */
    atomic_ullong have;       /* bytes of done chunks */
    uint64_t total;
    atomic_int busy;
    atomic_int retries;
    int *fds;                 /* [n_files] staging files, opened for writing */
} setup;

#define STREAM_MANIFEST "experts.manifest"
/* every request's attempts (429, 5xx, dropped connections, short bodies) */
#define SETUP_MAX_TRIES 8

/* setup_fetch.c */
struct curl_slist;
/* A libcurl easy handle (a CURL *) with the setup's user agent and
 * $HF_TOKEN header (*hl: the header list to free with it), or NULL. */
void *setup_handle_new(const setup *S, struct curl_slist **hl);
/* GET url into memory (at most max bytes); range "A-B" or NULL; *next gets
 * a Link rel="next" when asked for.  Retried like every request. */
int setup_get(setup *S, const char *url, const char *range, char **out, size_t *n, size_t max, char *next,
              size_t n_next, df_error *err);
/* SHA-256 of bytes [off, off+len) of a size-byte file at url, fetched
 * through the hash (nothing stored); retried like every request, and only
 * a 206 with the exact Content-Range and length counts. */
int setup_hash_get(setup *S, const char *url, uint64_t off, uint64_t len, uint64_t size, uint8_t out[32],
                   df_error *err);
/* The file's SHA-256 (lfs) or git blob id into got (hex), or "(N bytes)"
 * when its size is not f->size. */
int setup_hash_file(const char *path, const setup_file *f, char *got, size_t n_got, df_error *err);

/* setup.c: the first failure of the workers (later ones are dropped) */
void setup_fail(setup *S, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* setup_drafter.c (setup --drafter) */
/* After the listing: the target (model_dir/config.json) and the drafter's
 * config.json checked (a Qwen3 or the target's model_type), the listing cut
 * to what a drafter needs; nonzero with the reason. */
int drafter_prepare(setup *S, const char *model_dir, df_error *err);
/* After publishing at dir: how to use it and what it costs. */
void drafter_installed(const char *model_dir, const char *dir);

/* setup_stream.c */
/* After the listing: every shard's header fetched and parsed, its experts
 * and trunk ranges found, the manifest started (S->want, S->man). */
int stream_plan(setup *S, df_error *err);
/* --verify: shard fi is complete in staging: hashed whole against its
 * lfs.oid, every expert and the trunk hashed into the manifest, then cut
 * down to its trunk.  1 = the hash did not match (fetch it again). */
int stream_finish_shard(setup *S, int fi, df_error *err);
/* Without --verify: shard fi's trunk, complete in staging, fetched a
 * second time through a hash and compared range by range with the bytes on
 * disk; when all agree, their SHA-256 goes into the manifest (so that
 * --check and later reads find damage on disk).  1 = range *bad differs
 * (its pieces must be fetched again). */
int stream_recheck_shard(setup *S, int fi, byte_range *bad, df_error *err);
/* Before publishing: a published manifest merged in (its hashes; a trunk
 * hash checked), the manifest written into staging. */
int stream_finish(setup *S, df_error *err);
/* setup --check of a streamed install's shards and disk cache; 0 = good. */
int stream_check(const char *dir, const char *path, uint64_t size, int *n_checked);
/* 1 when the streamed install's manifest lacks a SHA-256 for some expert
 * (set up without --verify or a published manifest: its trunk hashes are
 * then the two agreeing fetches', not the publisher's). */
int stream_unverified(const char *dir);

#endif
