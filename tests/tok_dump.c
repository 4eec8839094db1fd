/* tok_dump.c - prints deltafin's token ids for the tiktoken oracle
 * (tests/oracle/run_tokenizer_oracle.sh).
 *
 *   tok_dump MODEL_DIR [CASES]      (CASES defaults to stdin)
 *
 * Each input line is "<allow_special 0|1> <base64 of the text's bytes>"; each
 * output line is the ids, space-separated (empty for empty text), then " | "
 * and the base64 of tokenizer_decode of those ids (the oracle checks that it
 * equals the input after U+FFFD repair).
 * A test tool, so it may exit().
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer.h"
#include "util.h"

static int b64v(int c)
{
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
}

static size_t b64dec(const char *s, size_t n, unsigned char *out)
{
    size_t o = 0;
    uint32_t acc = 0;
    int bits = 0;
    for (size_t i = 0; i < n; i++) {
        int v = b64v((unsigned char)s[i]);
        if (v < 0) continue; /* padding */
        acc = acc << 6 | (uint32_t)v;
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            out[o++] = (unsigned char)(acc >> bits);
        }
    }
    return o;
}

static void b64out(const unsigned char *p, size_t n)
{
    static const char tab[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    for (size_t i = 0; i < n; i += 3) {
        uint32_t x = (uint32_t)p[i] << 16 | (i + 1 < n ? (uint32_t)p[i + 1] << 8 : 0) | (i + 2 < n ? p[i + 2] : 0);
        putchar(tab[x >> 18 & 63]);
        putchar(tab[x >> 12 & 63]);
        putchar(i + 1 < n ? tab[x >> 6 & 63] : '=');
        putchar(i + 2 < n ? tab[x & 63] : '=');
    }
}

int main(int argc, char **argv)
{
    if (argc < 2 || argc > 3) {
        fprintf(stderr, "usage: tok_dump MODEL_DIR [CASES]\n");
        return 2;
    }
    df_error err = {0};
    tokenizer *t;
    if (tokenizer_load(argv[1], &t, &err)) {
        fprintf(stderr, "tok_dump: %s\n", err.msg);
        return 1;
    }
    FILE *f = argc == 3 ? fopen(argv[2], "r") : stdin;
    if (!f) {
        perror(argv[2]);
        return 1;
    }
    char *line = NULL;
    size_t lcap = 0;
    ssize_t ll;
    int32_t *ids = NULL;
    size_t cap = 0;
    while ((ll = getline(&line, &lcap, f)) >= 0) {
        while (ll > 0 && (line[ll - 1] == '\n' || line[ll - 1] == '\r')) line[--ll] = 0;
        if (ll < 1) continue;
        int allow = line[0] == '1';
        const char *b = ll > 2 ? line + 2 : "";
        unsigned char *text = xmalloc(strlen(b) + 1);
        size_t len = b64dec(b, strlen(b), text), n = 0;
        if (tokenizer_encode(t, (const char *)text, len, allow, &ids, &n, &cap, &err)) {
            fprintf(stderr, "tok_dump: %s\n", err.msg);
            return 1;
        }
        for (size_t i = 0; i < n; i++) printf(i ? " %d" : "%d", ids[i]);
        char *dec;
        size_t dlen;
        if (tokenizer_decode(t, ids, n, &dec, &dlen, &err)) {
            fprintf(stderr, "tok_dump: %s\n", err.msg);
            return 1;
        }
        printf(" | ");
        b64out((const unsigned char *)dec, dlen);
        printf("\n");
        free(dec);
        free(text);
    }
    free(line);
    free(ids);
    tokenizer_free(t);
    return 0;
}
