/* sha.c - see sha.h.  Written from FIPS 180-4: message schedule,
 * compression, padding with the bit length big-endian. */
#include "sha.h"

#include <string.h>

static uint32_t rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }
static uint32_t rotl(uint32_t x, int n) { return (x << n) | (x >> (32 - n)); }

static uint32_t be32(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

static void put_be32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)(v >> 24), p[1] = (uint8_t)(v >> 16), p[2] = (uint8_t)(v >> 8), p[3] = (uint8_t)v;
}

/* ---------------------------------------------------------------- SHA-256 */

static const uint32_t K256[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
};

static void sha256_block(uint32_t h[8], const uint8_t *b)
{
    uint32_t w[64];
    for (int t = 0; t < 16; t++) w[t] = be32(b + 4 * t);
    for (int t = 16; t < 64; t++) {
        uint32_t s0 = rotr(w[t - 15], 7) ^ rotr(w[t - 15], 18) ^ (w[t - 15] >> 3);
        uint32_t s1 = rotr(w[t - 2], 17) ^ rotr(w[t - 2], 19) ^ (w[t - 2] >> 10);
        w[t] = w[t - 16] + s0 + w[t - 7] + s1;
    }
    uint32_t a = h[0], bb = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], hh = h[7];
    for (int t = 0; t < 64; t++) {
        uint32_t S1 = rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25);
        uint32_t ch = (e & f) ^ (~e & g);
        uint32_t t1 = hh + S1 + ch + K256[t] + w[t];
        uint32_t S0 = rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22);
        uint32_t maj = (a & bb) ^ (a & c) ^ (bb & c);
        uint32_t t2 = S0 + maj;
        hh = g, g = f, f = e, e = d + t1, d = c, c = bb, bb = a, a = t1 + t2;
    }
    h[0] += a, h[1] += bb, h[2] += c, h[3] += d, h[4] += e, h[5] += f, h[6] += g, h[7] += hh;
}

void sha256_init(sha256_ctx *c)
{
    static const uint32_t iv[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                   0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    memcpy(c->h, iv, sizeof iv);
    c->len = 0;
    c->n = 0;
}

/* Buffer bytes into 64-byte blocks for `block` (both hashes alike). */
static void absorb(uint32_t *h, uint8_t *buf, size_t *have, uint64_t *len, const void *p, size_t n,
                   void (*block)(uint32_t *, const uint8_t *))
{
    const uint8_t *b = p;
    *len += n;
    if (*have) {
        size_t k = 64 - *have < n ? 64 - *have : n;
        memcpy(buf + *have, b, k);
        *have += k, b += k, n -= k;
        if (*have < 64) return;
        block(h, buf);
        *have = 0;
    }
    for (; n >= 64; n -= 64, b += 64) block(h, b);
    memcpy(buf, b, n);
    *have = n;
}

void sha256_update(sha256_ctx *c, const void *p, size_t n) { absorb(c->h, c->buf, &c->n, &c->len, p, n, sha256_block); }

/* 0x80, zeros to 56 mod 64, the bit length big-endian */
static void pad(uint8_t *buf, size_t *n, uint64_t len, void (*block)(uint32_t *, const uint8_t *), uint32_t *h)
{
    buf[(*n)++] = 0x80;
    if (*n > 56) {
        memset(buf + *n, 0, 64 - *n);
        block(h, buf);
        *n = 0;
    }
    memset(buf + *n, 0, 56 - *n);
    uint64_t bits = len * 8;
    for (int i = 0; i < 8; i++) buf[56 + i] = (uint8_t)(bits >> (56 - 8 * i));
    block(h, buf);
}

void sha256_final(sha256_ctx *c, uint8_t out[32])
{
    pad(c->buf, &c->n, c->len, sha256_block, c->h);
    for (int i = 0; i < 8; i++) put_be32(out + 4 * i, c->h[i]);
}

/* ------------------------------------------------------------------ SHA-1 */

static void sha1_block(uint32_t h[5], const uint8_t *b)
{
    uint32_t w[80];
    for (int t = 0; t < 16; t++) w[t] = be32(b + 4 * t);
    for (int t = 16; t < 80; t++) w[t] = rotl(w[t - 3] ^ w[t - 8] ^ w[t - 14] ^ w[t - 16], 1);
    uint32_t a = h[0], bb = h[1], c = h[2], d = h[3], e = h[4];
    for (int t = 0; t < 80; t++) {
        uint32_t f, k;
        if (t < 20) f = (bb & c) | (~bb & d), k = 0x5a827999;
        else if (t < 40) f = bb ^ c ^ d, k = 0x6ed9eba1;
        else if (t < 60) f = (bb & c) | (bb & d) | (c & d), k = 0x8f1bbcdc;
        else f = bb ^ c ^ d, k = 0xca62c1d6;
        uint32_t tmp = rotl(a, 5) + f + e + k + w[t];
        e = d, d = c, c = rotl(bb, 30), bb = a, a = tmp;
    }
    h[0] += a, h[1] += bb, h[2] += c, h[3] += d, h[4] += e;
}

void sha1_init(sha1_ctx *c)
{
    static const uint32_t iv[5] = {0x67452301, 0xefcdab89, 0x98badcfe, 0x10325476, 0xc3d2e1f0};
    memcpy(c->h, iv, sizeof iv);
    c->len = 0;
    c->n = 0;
}

void sha1_update(sha1_ctx *c, const void *p, size_t n) { absorb(c->h, c->buf, &c->n, &c->len, p, n, sha1_block); }

void sha1_final(sha1_ctx *c, uint8_t out[20])
{
    pad(c->buf, &c->n, c->len, sha1_block, c->h);
    for (int i = 0; i < 5; i++) put_be32(out + 4 * i, c->h[i]);
}

void sha_hex(const uint8_t *d, size_t n, char *out)
{
    static const char hx[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) out[2 * i] = hx[d[i] >> 4], out[2 * i + 1] = hx[d[i] & 15];
    out[2 * n] = 0;
}
