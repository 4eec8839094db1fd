/* test_sha.c - SHA-256 and SHA-1 against the FIPS 180-4 examples and
 * against the system's sha256sum / sha1sum and git's blob ids on random
 * data fed in uneven pieces. */
#define _GNU_SOURCE
#include "harness.h"
#include "sha.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void hex256(const void *p, size_t n, char out[65])
{
    sha256_ctx c;
    uint8_t d[32];
    sha256_init(&c);
    sha256_update(&c, p, n);
    sha256_final(&c, d);
    sha_hex(d, 32, out);
}

static void hex1(const void *p, size_t n, char out[41])
{
    sha1_ctx c;
    uint8_t d[20];
    sha1_init(&c);
    sha1_update(&c, p, n);
    sha1_final(&c, d);
    sha_hex(d, 20, out);
}

static void test_fips_examples(void)
{
    char h[65];
    hex256("abc", 3, h);
    TCHECK(!strcmp(h, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"));
    hex256("", 0, h);
    TCHECK(!strcmp(h, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"));
    const char *two = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
    hex256(two, strlen(two), h);
    TCHECK(!strcmp(h, "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"));
    hex1("abc", 3, h);
    TCHECK(!strcmp(h, "a9993e364706816aba3e25717850c26c9cd0d89d"));
    hex1(two, strlen(two), h);
    TCHECK(!strcmp(h, "84983e441c3bd26ebaae4aa1f95129e5e54670f1"));
}

/* Random files of awkward lengths, hashed in uneven pieces, against the
 * coreutils tools and git (when installed). */
static void test_against_tools(void)
{
    const size_t lens[] = {1, 55, 56, 63, 64, 65, 119, 1000, 65536 + 17};
    uint64_t r = 12345;
    for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
        size_t n = lens[li];
        unsigned char *b = malloc(n);
        for (size_t i = 0; i < n; i++) {
            r = r * 6364136223846793005ull + 1442695040888963407ull;
            b[i] = (unsigned char)(r >> 56);
        }
        char path[600];
        snprintf(path, sizeof path, "%s/sha.bin", test_scratch());
        FILE *f = fopen(path, "wb");
        fwrite(b, 1, n, f);
        fclose(f);
        sha256_ctx c;
        sha1_ctx c1;
        sha256_init(&c);
        sha1_init(&c1);
        char hdr[64];
        int hl = snprintf(hdr, sizeof hdr, "blob %zu", n) + 1; /* with the NUL */
        sha1_update(&c1, hdr, (size_t)hl);
        for (size_t o = 0, k = 1; o < n; o += k, k = k * 3 % 97 + 1) {
            size_t m = n - o < k ? n - o : k;
            sha256_update(&c, b + o, m);
            sha1_update(&c1, b + o, m);
        }
        uint8_t d[32], d1[20];
        char h[65], h1[41];
        sha256_final(&c, d);
        sha1_final(&c1, d1);
        sha_hex(d, 32, h);
        sha_hex(d1, 20, h1);
        char out[256];
        const char *a[] = {"/usr/bin/sha256sum", path, NULL};
        TCHECK(t_run(a, out, sizeof out, NULL, 0) == 0 && !strncmp(out, h, 64));
        const char *g[] = {"/usr/bin/git", "hash-object", path, NULL};
        if (t_run(g, out, sizeof out, NULL, 0) == 0) TCHECKF(!strncmp(out, h1, 40), "git %s, ours %s", out, h1);
        else t_skip("git is not installed: the blob id check did not run");
        free(b);
    }
}

static const test_case tests[] = {
    {"fips_examples", test_fips_examples},
    {"against_tools", test_against_tools},
};

int main(int argc, char **argv) { return test_main(tests, NTESTS(tests), argc, argv); }
