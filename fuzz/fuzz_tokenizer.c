/* fuzz_tokenizer.c - libFuzzer target: arbitrary bytes through the encoder
 * (both modes) and decoders of the fixture tokenizer, loaded once from
 * $DF_TESTDATA/k3-tiny-a/checkpoint (default testdata/).
 *
 * Properties, for every input x (r = x after U+FFFD repair, computed here
 * independently of tokenizer.c):
 *  - every id is in [0, n_vocab); allow_special = 0 never yields a special;
 *  - decode(encode(x, s)) == r for both s: a special id decodes to its own
 *    spelling, so recognising spellings never changes the text;
 *  - when r contains no special spelling, both modes give the same ids;
 *  - feeding the ids one at a time (cap = tok_decoder_max_out) emits only
 *    whole characters and, with the flush, exactly decode(ids);
 *  - the heap BPE equals tiktoken's reference algorithm on x as one piece.
 */
#include "tokenizer.h"
#include "util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static tokenizer *tok;

static void load_once(void)
{
    if (tok) return;
    const char *d = getenv("DF_TESTDATA");
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/k3-tiny-a/checkpoint", d && *d ? d : "testdata");
    df_error err = {0};
    if (tokenizer_load(dir, &tok, &err)) {
        fprintf(stderr, "fuzz_tokenizer: %s\n", err.msg);
        abort();
    }
}

/* Python's bytes.decode("utf-8", errors="replace"), written from the Unicode
 * table of well-formed sequences rather than shared with tokenizer.c. */
static size_t repair(const uint8_t *s, size_t n, uint8_t *o)
{
    size_t j = 0;
    for (size_t i = 0; i < n;) {
        uint8_t c = s[i];
        size_t need;
        uint8_t lo = 0x80, hi = 0xbf;
        if (c < 0x80) need = 1;
        else if (c >= 0xc2 && c <= 0xdf) need = 2;
        else if (c >= 0xe0 && c <= 0xef) need = 3, lo = c == 0xe0 ? 0xa0 : 0x80, hi = c == 0xed ? 0x9f : 0xbf;
        else if (c >= 0xf0 && c <= 0xf4) need = 4, lo = c == 0xf0 ? 0x90 : 0x80, hi = c == 0xf4 ? 0x8f : 0xbf;
        else need = 0;
        size_t k = 1;
        while (need > 1 && k < need && i + k < n && s[i + k] >= (k == 1 ? lo : 0x80) && s[i + k] <= (k == 1 ? hi : 0xbf))
            k++;
        if (need && k == need) {
            memcpy(o + j, s + i, need);
            j += need;
            i += need;
        } else {
            memcpy(o + j, "\xef\xbf\xbd", 3);
            j += 3;
            i += k;
        }
    }
    return j;
}

static int whole_chars(const char *s, size_t n)
{
    uint8_t *tmp = malloc(3 * n + 1);
    size_t m = repair((const uint8_t *)s, n, tmp);
    int ok = m == n && !memcmp(tmp, s, n);
    free(tmp);
    return ok;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    load_once();
    const int V = tokenizer_n_vocab(tok);
    uint8_t *r = malloc(3 * size + 1);
    size_t rn = repair(data, size, r);
    int has_spelling = 0;
    for (int32_t id = tokenizer_n_ranks(tok); id < V && !has_spelling; id++) {
        size_t l;
        const char *sp = tokenizer_token_bytes(tok, id, &l);
        for (size_t i = 0; i + l <= rn && !has_spelling; i++) has_spelling = !memcmp(r + i, sp, l);
    }

    int32_t *ids[2] = {NULL, NULL};
    size_t n[2] = {0, 0}, cap[2] = {0, 0};
    size_t maxo = tok_decoder_max_out(tok);
    char *chunk = malloc(maxo);
    for (int s = 0; s < 2; s++) {
        df_error err = {0};
        if (tokenizer_encode(tok, (const char *)data, size, s, &ids[s], &n[s], &cap[s], &err)) {
            /* only the regex engine's resource limits may fail */
            if (err.code != DF_ERR_LIMIT) abort();
            goto out;
        }
        for (size_t i = 0; i < n[s]; i++)
            if (ids[s][i] < 0 || ids[s][i] >= V || (!s && tokenizer_is_special(tok, ids[s][i]))) abort();
        char *d = NULL;
        size_t dn = 0;
        if (tokenizer_decode(tok, ids[s], n[s], &d, &dn, &err)) abort();
        if (dn != rn || memcmp(d, r, rn)) abort();
        /* incremental decode */
        tok_decoder dec;
        tok_decoder_init(&dec, tok);
        char *acc = malloc(dn + 8);
        size_t at = 0;
        for (size_t i = 0; i < n[s]; i++) {
            size_t m = tok_decoder_feed(&dec, ids[s][i], chunk, maxo);
            if (m > maxo || at + m > dn || !whole_chars(chunk, m)) abort();
            memcpy(acc + at, chunk, m);
            at += m;
        }
        at += tok_decoder_flush(&dec, acc + at, 8);
        if (at != dn || memcmp(acc, d, dn)) abort();
        free(acc);
        free(d);
    }
    if (!has_spelling && (n[0] != n[1] || (n[0] && memcmp(ids[0], ids[1], n[0] * sizeof *ids[0])))) abort();
    if (size <= 512) { /* the reference is quadratic */
        int32_t *a = NULL, *b = NULL;
        size_t na = 0, nb = 0, ca = 0, cb = 0;
        tokenizer_bpe(tok, data, size, 1, &a, &na, &ca);
        tokenizer_bpe(tok, data, size, 0, &b, &nb, &cb);
        if (na != nb || (na && memcmp(a, b, na * sizeof *a))) abort();
        free(a);
        free(b);
    }
out:
    free(chunk);
    free(ids[0]);
    free(ids[1]);
    free(r);
    return 0;
}
