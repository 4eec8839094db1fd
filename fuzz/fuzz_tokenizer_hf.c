/* fuzz_tokenizer_hf.c - libFuzzer target for Hugging Face tokenizer.json
 * files (tokenizer_hf.c) and the Qwen family's encoder.
 *
 * An input whose first byte is even is a tokenizer.json: it must load or be
 * refused with an error naming the file ("x"), never crash or read past the
 * input.  Otherwise the rest is text for a small Qwen-family tokenizer built
 * here (the 256 bytes, merges a b / b c / a bc / th / the, one added token),
 * with these properties for both modes:
 *  - every id is in [0, n_vocab); allow_special = 0 never yields a special;
 *  - decoding the ids and encoding that text again gives the same ids (NFC
 *    is idempotent and the byte-level round trip is lossless);
 *  - the heap BPE equals the reference on the text as one piece.
 */
#include "tokenizer.h"
#include "util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static tokenizer *tok;

static int level_cp(int b)
{
    if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255)) return b;
    int n = 0;
    for (int x = 0; x < b; x++) n += !((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174 && x <= 255));
    return 256 + n;
}

static void load_once(void)
{
    if (tok) return;
    static char js[16384];
    size_t o = 0;
    o += (size_t)snprintf(js + o, sizeof js - o,
                          "{\"added_tokens\":[{\"id\":261,\"content\":\"<|x|>\"}],\"normalizer\":{\"type\":\"NFC\"},"
                          "\"pre_tokenizer\":{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":"
                          "{\"Regex\":\"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?\\\\p{L}+|\\\\p{N}| "
                          "?[^\\\\s\\\\p{L}\\\\p{N}]+[\\\\r\\\\n]*|\\\\s*[\\\\r\\\\n]+|\\\\s+(?!\\\\S)|\\\\s+\"},"
                          "\"behavior\":\"Isolated\",\"invert\":false},{\"type\":\"ByteLevel\",\"add_prefix_space\":false,"
                          "\"use_regex\":false}]},\"model\":{\"type\":\"BPE\",\"vocab\":{");
    for (int b = 0; b < 256; b++) {
        int cp = level_cp(b);
        o += (size_t)snprintf(js + o, sizeof js - o, "%s\"", b ? "," : "");
        if (cp == '"' || cp == '\\') o += (size_t)snprintf(js + o, sizeof js - o, "\\%c", cp);
        else if (cp < 0x80) js[o++] = (char)cp;
        else js[o++] = (char)(0xc0 | (cp >> 6)), js[o++] = (char)(0x80 | (cp & 0x3f));
        o += (size_t)snprintf(js + o, sizeof js - o, "\":%d", b);
    }
    o += (size_t)snprintf(js + o, sizeof js - o,
                          ",\"ab\":256,\"bc\":257,\"abc\":258,\"th\":259,\"the\":260},"
                          "\"merges\":[\"a b\",\"b c\",\"a bc\",\"t h\",\"th e\"]}}");
    df_error err = {0};
    if (tokenizer_load_hf_json(js, o, "small", &tok, &err)) {
        fprintf(stderr, "fuzz_tokenizer_hf: %s\n", err.msg);
        abort();
    }
}

static size_t decode_all(const int32_t *ids, size_t n, char **out)
{
    size_t cap = tok_decoder_max_out(tok), len = 0;
    char *o = xmalloc(cap * (n + 1) + 1);
    tok_decoder d;
    tok_decoder_init(&d, tok);
    for (size_t i = 0; i < n; i++) len += tok_decoder_feed(&d, ids[i], o + len, cap);
    len += tok_decoder_flush(&d, o + len, cap);
    *out = o;
    return len;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!size) return 0;
    if (!(data[0] & 1)) {
        tokenizer *t = NULL;
        df_error err = {0};
        int rc = tokenizer_load_hf_json((const char *)data + 1, size - 1, "x", &t, &err);
        if (rc && !strstr(err.msg, "x")) {
            fprintf(stderr, "error does not name the file: %s\n", err.msg);
            abort();
        }
        tokenizer_free(t);
        return 0;
    }
    load_once();
    const char *s = (const char *)data + 1;
    size_t n = size - 1;
    int nv = tokenizer_n_vocab(tok), nr = tokenizer_n_ranks(tok);
    for (int special = 0; special < 2; special++) {
        int32_t *ids = NULL, *again = NULL;
        size_t ni = 0, ci = 0, na = 0, ca = 0;
        df_error err = {0};
        if (tokenizer_encode(tok, s, n, special, &ids, &ni, &ci, &err)) abort();
        for (size_t i = 0; i < ni; i++)
            if (ids[i] < 0 || ids[i] >= nv || (!special && ids[i] >= nr)) abort();
        char *text;
        size_t tl = decode_all(ids, ni, &text);
        if (tokenizer_encode(tok, text, tl, special, &again, &na, &ca, &err)) abort();
        if (na != ni || (ni && memcmp(ids, again, ni * sizeof *ids))) abort();
        free(text);
        free(ids);
        free(again);
    }
    int32_t *r1 = NULL, *r2 = NULL;
    size_t n1 = 0, n2 = 0, c1 = 0, c2 = 0;
    tokenizer_bpe(tok, data + 1, n, 1, &r1, &n1, &c1);
    tokenizer_bpe(tok, data + 1, n, 0, &r2, &n2, &c2);
    if (n1 != n2 || (n1 && memcmp(r1, r2, n1 * sizeof *r1))) abort();
    free(r1);
    free(r2);
    return 0;
}
