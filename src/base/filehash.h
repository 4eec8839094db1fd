/* filehash.h - L0: a 128-bit hash of a whole file's bytes, computed once
 * and kept in a cache keyed by the file's identity on disk.
 *
 * Owns: the hash (df_hash128: four 64-bit multiply-rotate lanes over
 * 32-byte stripes, a length-aware finish into two 64-bit halves; not a
 * cryptographic hash: it tells an accidental or careless difference apart,
 * one flipped byte anywhere, not a forged file), reading a file through a
 * 1 MiB buffer with the pages dropped behind it, and the cache: one small
 * text record per file under the cache directory, naming the file's real
 * path, device, inode, size, mtime and ctime (nanoseconds) and the hash.
 * A record whose key differs from the file's stat is stale: the file is
 * hashed again and the record replaced (atomically).  The cache directory
 * is $DELTAFIN_CACHE_DIR, else $XDG_CACHE_HOME/deltafin, else
 * $HOME/.cache/deltafin; when it cannot be made, nothing is cached.
 * Does not own: which files make a model (session_file.c).
 * Allocates: the read buffer, per call; never under the allocation guard.
 */
#ifndef DF_FILEHASH_H
#define DF_FILEHASH_H

#include <stddef.h>
#include <stdint.h>
#include "df_error.h"

typedef struct df_hash128 {
    uint64_t v[4];       /* lanes */
    uint8_t tail[32];    /* bytes of an unfinished stripe */
    size_t n_tail;
    uint64_t len;
} df_hash128;

void df_hash128_init(df_hash128 *h);
void df_hash128_add(df_hash128 *h, const void *p, size_t n);
void df_hash128_final(const df_hash128 *h, uint8_t out[16]);

typedef struct filehash_stats {
    int cached;          /* the hash came from the cache */
    double seconds;      /* spent hashing (0 when cached) */
    uint64_t bytes;      /* hashed (0 when cached) */
} filehash_stats;

/* The hash of the file at path, from the cache when its record matches the
 * file's stat, else computed and recorded.  quiet = 0 prints a line on
 * stderr before hashing a file of 1 GiB or more.  st may be NULL. */
int file_content_hash(const char *path, uint8_t out[16], int quiet, filehash_stats *st, df_error *err);

/* The cache directory in use ("" when none). */
const char *filehash_cache_dir(void);

#endif
