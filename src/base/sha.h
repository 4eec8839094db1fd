/* sha.h - SHA-256 and SHA-1 (FIPS 180-4), streaming (L0).
 *
 * SHA-256 verifies downloaded model files against the Hugging Face Hub's
 * LFS object ids; SHA-1 computes the git blob id (`blob <size>\0` then the
 * content) of small files stored without LFS.  Portable C, no allocation;
 * the scalar compression function is the specification.
 */
#ifndef DF_SHA_H
#define DF_SHA_H

#include <stddef.h>
#include <stdint.h>

typedef struct sha256_ctx {
    uint32_t h[8];
    uint64_t len;             /* bytes hashed */
    uint8_t buf[64];
    size_t n;                 /* bytes in buf */
} sha256_ctx;

void sha256_init(sha256_ctx *c);
void sha256_update(sha256_ctx *c, const void *p, size_t n);
void sha256_final(sha256_ctx *c, uint8_t out[32]);

typedef struct sha1_ctx {
    uint32_t h[5];
    uint64_t len;
    uint8_t buf[64];
    size_t n;
} sha1_ctx;

void sha1_init(sha1_ctx *c);
void sha1_update(sha1_ctx *c, const void *p, size_t n);
void sha1_final(sha1_ctx *c, uint8_t out[20]);

/* Lower-case hex of n bytes into out (2n + 1 chars). */
void sha_hex(const uint8_t *d, size_t n, char *out);

#endif
