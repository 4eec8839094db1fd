/* tokenizer_hf.c - a Hugging Face tokenizer.json (byte-level BPE) read into
 * the tokenizer (tokenizer_impl.h): Qwen2/Qwen3's, and any other file whose
 * parts are ones deltafin implements exactly.
 *
 * Accepted, and refused with the part named otherwise:
 *   normalizer    null or {"type": "NFC"}
 *   pre_tokenizer Sequence[Split{Regex of a known family, Isolated, not
 *                 inverted}, ByteLevel{no prefix space, no regex}]
 *   model         BPE without byte fallback, dropout, unknown token or word
 *                 affixes, ignore_merges false; vocab ids 0..n-1, its token
 *                 strings in GPT-2's byte-level alphabet; merges as "a b" or
 *                 ["a", "b"]
 *   added_tokens  ids n.. contiguous, none stripping or whole-word
 * The merges must be the vocabulary's order: merge i makes a token of a
 * higher id than merge i-1 did, and every token longer than a byte is made
 * by exactly one merge.  Then Hugging Face's "apply the listed merge of
 * lowest index" is "join the adjacent pair of lowest rank" with rank = id,
 * restricted to the listed pairs (tokenizer.c's pair_rank): the encoder is
 * the tiktoken core with one extra check, exact by construction.
 */
#include "tokenizer_impl.h"
#include "gguf.h"
#include "json.h"
#include "util.h"

#include <stdlib.h>
#include <string.h>

/* Qwen3's tokenizer.json is 11 MB; nothing beyond this is a tokenizer. */
#define HF_MAX_BYTES ((size_t)256 << 20)

/* A token string in the byte-level alphabet to its bytes (out holds at
 * least strlen(s)); -1 if a character is outside the alphabet. */
static long level_bytes(const char *s, size_t n, unsigned char *out)
{
    const unsigned char *u = (const unsigned char *)s;
    long o = 0;
    for (size_t k = 0; k < n;) {
        int sub, cl = utf8_char(u + k, n - k, &sub);
        int b = cl ? tok_byte_of_level_cp(utf8_cp(u + k, cl)) : -1;
        if (b < 0) return -1;
        out[o++] = (unsigned char)b;
        k += (size_t)cl;
    }
    return o;
}

static int is_false_or_null(const json_value *v) { return !v || v->type == JSON_NULL || (v->type == JSON_BOOL && !v->b); }
static int is_empty_or_null(const json_value *v)
{
    return !v || v->type == JSON_NULL || (v->type == JSON_STRING && v->len == 0);
}

/* The normaliser and pre-tokenizer: which family, or an error. */
static int hf_family(const json_value *root, tokenizer *t, const char *path, df_error *err)
{
    const json_value *norm = json_get(root, "normalizer"), *pre = json_get(root, "pre_tokenizer");
    int nfc = 0;
    if (norm && norm->type != JSON_NULL) {
        const char *ty = json_get_str(norm, "type");
        if (!ty || strcmp(ty, "NFC"))
            return df_err_set(err, DF_ERR_UNSUPPORTED, norm->pos, "%s: normalizer \"%s\" (deltafin implements NFC)",
                              path, ty ? ty : "?");
        nfc = 1;
    }
    const char *pty = pre ? json_get_str(pre, "type") : NULL;
    const json_value *seq = pty && !strcmp(pty, "Sequence") ? json_get(pre, "pretokenizers") : NULL;
    const json_value *split = seq && seq->type == JSON_ARRAY && seq->len == 2 ? seq->items[0] : NULL;
    const json_value *bl = split ? seq->items[1] : NULL;
    const char *sty = split ? json_get_str(split, "type") : NULL, *bty = bl ? json_get_str(bl, "type") : NULL;
    const json_value *pat = split ? json_get(split, "pattern") : NULL;
    const char *re = pat ? json_get_str(pat, "Regex") : NULL, *beh = split ? json_get_str(split, "behavior") : NULL;
    if (!sty || strcmp(sty, "Split") || !re || !beh || strcmp(beh, "Isolated") || !is_false_or_null(json_get(split, "invert")) ||
        !bty || strcmp(bty, "ByteLevel") || !is_false_or_null(json_get(bl, "add_prefix_space")) ||
        !is_false_or_null(json_get(bl, "use_regex")))
        return df_err_set(err, DF_ERR_UNSUPPORTED, pre ? pre->pos : -1,
                          "%s: pre_tokenizer is not Sequence[Split(Regex, Isolated), ByteLevel(no prefix space, no "
                          "regex)], the byte-level BPE deltafin implements",
                          path);
    static const tok_family *const known[] = {&tok_family_qwen2};
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
        if (known[i]->hf_regex && !strcmp(re, known[i]->hf_regex) && known[i]->nfc == nfc) {
            t->fam = known[i];
            return 0;
        }
    return df_err_set(err, DF_ERR_UNSUPPORTED, pat->pos,
                      "%s: pre-tokenizer regex \"%.80s\"%s is not one deltafin implements (Qwen2's with NFC)", path, re,
                      strlen(re) > 80 ? "..." : "");
}

/* The BPE tokens by id (strings in the byte-level alphabet, by_id[i] of
 * by_len[i] bytes) into the arena, then the rank map; room for n_added
 * specials after them. */
static int set_vocab(tokenizer *t, const char *const *by_id, const size_t *by_len, size_t n, size_t n_added,
                     const char *path, df_error *err)
{
    size_t bytes = 0;
    for (size_t i = 0; i < n; i++) bytes += by_len[i] + 1;
    t->data = xmalloc(bytes + 1);
    t->off = xmalloc((n + n_added + 1) * sizeof *t->off);
    uint64_t *h64 = xmalloc((n ? n : 1) * sizeof *h64);
    for (int b = 0; b < 256; b++) t->byte_rank[b] = -1;
    t->off[0] = 0;
    size_t used = 0;
    int rc = 0;
    for (size_t id = 0; id < n && !rc; id++) {
        long nb = level_bytes(by_id[id], by_len[id], t->data + used);
        if (nb <= 0) {
            rc = df_err_set(err, DF_ERR_FORMAT, -1, "%s: token %zu (\"%.*s\") is empty or not in the byte-level alphabet",
                            path, id, (int)(by_len[id] > 40 ? 40 : by_len[id]), by_id[id]);
            break;
        }
        h64[id] = tok_hash_bytes(t->data + used, (size_t)nb);
        if (nb == 1 && t->byte_rank[t->data[used]] < 0) t->byte_rank[t->data[used]] = (int32_t)id;
        if ((size_t)nb > t->max_tok_len) t->max_tok_len = (size_t)nb;
        used += (size_t)nb;
        t->data[used++] = 0;
        t->off[id + 1] = used;
    }
    if (!rc) rc = tok_finish_ranks(t, (int32_t)n, h64, path, err);
    free(h64);
    return rc;
}

/* model.vocab: ids 0..n-1, each once */
static int hf_vocab(const json_value *vocab, tokenizer *t, size_t n_added, const char *path, df_error *err)
{
    size_t n = vocab->len;
    if (n < 256 || n > (size_t)INT32_MAX / 2)
        return df_err_set(err, DF_ERR_FORMAT, vocab->pos, "%s: model.vocab holds %zu tokens", path, n);
    const char **by_id = xcalloc(n, sizeof *by_id);
    size_t *by_len = xcalloc(n, sizeof *by_len);
    int rc = 0;
    for (size_t i = 0; i < n && !rc; i++) {
        const json_value *v = vocab->items[i];
        if (v->type != JSON_NUMBER || !v->is_int || v->i < 0 || (size_t)v->i >= n || by_id[v->i])
            rc = df_err_set(err, DF_ERR_FORMAT, v->pos, "%s: model.vocab[\"%.40s\"]: ids must be 0..%zu, each once", path,
                            vocab->keys[i], n - 1);
        else by_id[v->i] = vocab->keys[i], by_len[v->i] = strlen(vocab->keys[i]);
    }
    if (!rc) rc = set_vocab(t, by_id, by_len, n, n_added, path, err);
    free(by_id);
    free(by_len);
    return rc;
}

/* One merge's two sides as ids, and the id of their join; -1 when a side
 * or the join is not a token (buf holds both sides' bytes). */
static int32_t merge_ids(const tokenizer *t, const char *sa, size_t la, const char *sb, size_t lb, unsigned char *buf,
                         int32_t *a, int32_t *b)
{
    if (la + lb > 4 * t->max_tok_len) return -1; /* sides longer than any token are no tokens */
    long na = level_bytes(sa, la, buf), nb = na > 0 ? level_bytes(sb, lb, buf + na) : -1;
    if (na <= 0 || nb <= 0) return -1;
    *a = tok_rank_of(t, buf, (size_t)na);
    *b = tok_rank_of(t, buf + na, (size_t)nb);
    if (*a < 0 || *b < 0) return -1;
    return tok_rank_of(t, buf, (size_t)(na + nb));
}

/* One merge as its two sides: a string "a b" or a pair ["a", "b"] */
static int merge_of_json(const json_value *m, const char **sa, size_t *la, const char **sb, size_t *lb)
{
    if (m->type == JSON_STRING) {
        const char *sp = memchr(m->str, ' ', m->len);
        if (!sp || memchr(sp + 1, ' ', m->len - (size_t)(sp + 1 - m->str))) return -1;
        *sa = m->str, *la = (size_t)(sp - m->str), *sb = sp + 1, *lb = m->len - *la - 1;
        return 0;
    }
    if (m->type == JSON_ARRAY && m->len == 2 && m->items[0]->type == JSON_STRING && m->items[1]->type == JSON_STRING) {
        *sa = m->items[0]->str, *la = m->items[0]->len, *sb = m->items[1]->str, *lb = m->items[1]->len;
        return 0;
    }
    return -1;
}

/* The merges in order (side(i) gives merge i's two sides, or -1): each
 * makes a later token than the one before, and every token longer than a
 * byte comes from exactly one. */
typedef int (*merge_side_fn)(const void *src, size_t i, const char **sa, size_t *la, const char **sb, size_t *lb);

static int set_merges(tokenizer *t, const void *src, size_t n_merges, merge_side_fn side, int64_t pos,
                      const char *path, df_error *err)
{
    size_t n = (size_t)t->n_ranks;
    t->merge_left = xmalloc(n * sizeof *t->merge_left);
    t->merge_right = xmalloc(n * sizeof *t->merge_right);
    for (size_t i = 0; i < n; i++) t->merge_left[i] = t->merge_right[i] = -1;
    unsigned char *buf = xmalloc(4 * t->max_tok_len + 16);
    int32_t last = -1;
    int rc = 0;
    for (size_t i = 0; i < n_merges && !rc; i++) {
        const char *sa, *sb;
        size_t la, lb;
        int32_t a, b, r = side(src, i, &sa, &la, &sb, &lb) ? -1 : merge_ids(t, sa, la, sb, lb, buf, &a, &b);
        if (r < 0)
            rc = df_err_set(err, DF_ERR_FORMAT, pos, "%s: merge %zu does not join two tokens into a token", path, i);
        else if (r <= last)
            rc = df_err_set(err, DF_ERR_UNSUPPORTED, pos,
                            "%s: merge %zu makes token %d after merge %zu made %d: deltafin needs the merges in the "
                            "vocabulary's order",
                            path, i, r, i - 1, last);
        else t->merge_left[r] = a, t->merge_right[r] = b, last = r;
    }
    for (size_t r = 0; r < n && !rc; r++)
        if (tok_len(t, (int32_t)r) > 1 && t->merge_left[r] < 0)
            rc = df_err_set(err, DF_ERR_UNSUPPORTED, -1, "%s: token %zu (%zu bytes) is made by no merge", path, r,
                            tok_len(t, (int32_t)r));
    free(buf);
    return rc;
}

static int json_merge_side(const void *src, size_t i, const char **sa, size_t *la, const char **sb, size_t *lb)
{
    return merge_of_json(((const json_value *)src)->items[i], sa, la, sb, lb);
}

static int hf_merges(const json_value *merges, tokenizer *t, const char *path, df_error *err)
{
    return set_merges(t, merges, merges->len, json_merge_side, merges->pos, path, err);
}

/* added_tokens: the specials, ids n_ranks.. in order. */
static int hf_added(const json_value *added, tokenizer *t, const char *path, df_error *err)
{
    size_t m = added ? added->len : 0;
    const char **spell = xcalloc(m + 1, sizeof *spell);
    size_t *spell_len = xcalloc(m + 1, sizeof *spell_len);
    int rc = 0;
    for (size_t i = 0; i < m && !rc; i++) {
        const json_value *a = added->items[i], *c = json_get(a, "content");
        int64_t id = -1;
        if (json_get_int(a, "id", &id) || id < t->n_ranks || (size_t)(id - t->n_ranks) >= m || spell[id - t->n_ranks] ||
            !c || c->type != JSON_STRING || !c->len || memchr(c->str, 0, c->len))
            rc = df_err_set(err, DF_ERR_FORMAT, a->pos,
                            "%s: added_tokens[%zu]: needs an id in %d..%zu (each once) and a non-empty content", path, i,
                            t->n_ranks, (size_t)t->n_ranks + m - 1);
        else if (!is_false_or_null(json_get(a, "lstrip")) || !is_false_or_null(json_get(a, "rstrip")) ||
                 !is_false_or_null(json_get(a, "single_word")))
            rc = df_err_set(err, DF_ERR_UNSUPPORTED, a->pos,
                            "%s: added token \"%.40s\" strips spaces or matches whole words only (not implemented)", path,
                            c->str);
        else spell[id - t->n_ranks] = c->str, spell_len[id - t->n_ranks] = c->len;
    }
    if (!rc) {
        t->n_special = (int)m;
        rc = tok_install_specials(t, spell, spell_len, path, err);
    }
    free(spell);
    free(spell_len);
    return rc;
}

static int load_hf_json(tokenizer *t, const char *buf, size_t len, const char *path, df_error *err)
{
    json_doc *doc = json_parse(buf, len, err);
    if (!doc) {
        df_err_prefix(err, "%s", path);
        return -1;
    }
    const json_value *root = json_root(doc), *model = json_get(root, "model");
    const json_value *vocab = model ? json_get(model, "vocab") : NULL, *merges = model ? json_get(model, "merges") : NULL;
    const json_value *added = json_get(root, "added_tokens");
    const char *mty = model ? json_get_str(model, "type") : NULL;
    int rc = -1;
    if (!mty || strcmp(mty, "BPE") || !vocab || vocab->type != JSON_OBJECT || !merges || merges->type != JSON_ARRAY)
        df_err_set(err, DF_ERR_UNSUPPORTED, model ? model->pos : -1,
                   "%s: model is not a BPE with a vocab object and a merges array", path);
    else if (!is_false_or_null(json_get(model, "byte_fallback")) || !is_false_or_null(json_get(model, "ignore_merges")) ||
             !is_empty_or_null(json_get(model, "unk_token")) || !is_empty_or_null(json_get(model, "continuing_subword_prefix")) ||
             !is_empty_or_null(json_get(model, "end_of_word_suffix")) ||
             (json_get(model, "dropout") && json_get(model, "dropout")->type != JSON_NULL))
        df_err_set(err, DF_ERR_UNSUPPORTED, model->pos,
                   "%s: a BPE with byte fallback, ignore_merges, an unknown token, word affixes or dropout (not "
                   "implemented)",
                   path);
    else if (added && added->type != JSON_ARRAY)
        df_err_set(err, DF_ERR_FORMAT, added->pos, "%s: added_tokens is not an array", path);
    else if (!hf_family(root, t, path, err) && !hf_vocab(vocab, t, added ? added->len : 0, path, err) &&
             !hf_merges(merges, t, path, err) && !hf_added(added, t, path, err))
        rc = 0;
    json_free(doc);
    return rc;
}

int tok_load_hf(tokenizer *t, const char *path, df_error *err)
{
    char *buf = NULL;
    size_t len = 0;
    if (read_small_file(path, &buf, &len, HF_MAX_BYTES, err)) return -1;
    int rc = load_hf_json(t, buf, len, path, err);
    free(buf);
    return rc;
}

int tokenizer_load_hf_json(const char *json, size_t len, const char *name, tokenizer **out, df_error *err)
{
    *out = NULL;
    tokenizer *t = xcalloc(1, sizeof *t);
    t->fam = &tok_family_k3;
    if (load_hf_json(t, json, len, name, err) || tok_finish_load(t, err)) {
        df_err_prefix(err, "tokenizer");
        tokenizer_free(t);
        return -1;
    }
    *out = t;
    return 0;
}

/* ---- a llama.cpp GGUF's Qwen2 vocabulary (tokenizer.ggml.pre "qwen2") ---- */

typedef struct {
    const gguf_kv *kv;
} gguf_merges;

static int gguf_merge_side(const void *src, size_t i, const char **sa, size_t *la, const char **sb, size_t *lb)
{
    const gguf_kv *kv = ((const gguf_merges *)src)->kv;
    const char *m = (const char *)kv->data + kv->str_off[i];
    size_t len = (size_t)kv->str_len[i];
    const char *sp = memchr(m, ' ', len);
    if (!sp || memchr(sp + 1, ' ', len - (size_t)(sp + 1 - m))) return -1;
    *sa = m, *la = (size_t)(sp - m), *sb = sp + 1, *lb = len - *la - 1;
    return 0;
}

/* As llama.cpp's converter writes it: the BPE tokens (NORMAL) first, then
 * the added tokens (CONTROL or USER_DEFINED), then UNUSED padding, which
 * is left out (the model's vocabulary may be larger than its tokenizer's,
 * as with tokenizer.json).  NFC as the family's tokenizer.json has it
 * (llama.cpp itself applies none). */
int tok_load_gguf_qwen2(tokenizer *t, const gguf_file *g, df_error *err)
{
    const char *path = g->path;
    const gguf_kv *tok = gguf_find_kv(g, "tokenizer.ggml.tokens"), *typ = gguf_find_kv(g, "tokenizer.ggml.token_type");
    const gguf_kv *mer = gguf_find_kv(g, "tokenizer.ggml.merges");
    t->fam = &tok_family_qwen2;
    if (!tok || tok->type != GGUF_KV_ARRAY || tok->arr_type != GGUF_KV_STRING || !typ || typ->type != GGUF_KV_ARRAY ||
        typ->n != tok->n || !mer || mer->type != GGUF_KV_ARRAY || mer->arr_type != GGUF_KV_STRING)
        return df_err_set(err, DF_ERR_FORMAT, -1,
                          "%s: a qwen2 vocabulary needs tokenizer.ggml.tokens, a token_type per token and "
                          "tokenizer.ggml.merges (strings)",
                          path);
    size_t n = (size_t)tok->n, got = 0, n_bpe = 0, n_added = 0;
    if (n > (size_t)INT32_MAX / 2) return df_err_set(err, DF_ERR_FORMAT, -1, "%s: %zu tokens", path, n);
    int64_t *types = xmalloc((n ? n : 1) * sizeof *types);
    if (gguf_get_arr_int(g, "tokenizer.ggml.token_type", types, n, &got, err)) {
        free(types);
        return -1;
    }
    while (n_bpe < n && types[n_bpe] == 1) n_bpe++;
    while (n_bpe + n_added < n && (types[n_bpe + n_added] == 3 || types[n_bpe + n_added] == 4)) n_added++;
    size_t rest = n_bpe + n_added;
    while (rest < n && types[rest] == 5) rest++;
    free(types);
    if (rest != n || n_bpe < 256)
        return df_err_set(err, DF_ERR_UNSUPPORTED, -1,
                          "%s: token %zu breaks the layout deltafin reads (BPE tokens, then added tokens, then unused "
                          "padding)",
                          path, rest);
    const char **by_id = xmalloc((n ? n : 1) * sizeof *by_id);
    size_t *by_len = xmalloc((n ? n : 1) * sizeof *by_len);
    for (size_t i = 0; i < n; i++)
        by_id[i] = (const char *)tok->data + tok->str_off[i], by_len[i] = (size_t)tok->str_len[i];
    int rc = set_vocab(t, by_id, by_len, n_bpe, n_added, path, err);
    gguf_merges gm = {mer};
    if (!rc) rc = set_merges(t, &gm, (size_t)mer->n, gguf_merge_side, -1, path, err);
    if (!rc) {
        const char **spell = xcalloc(n_added + 1, sizeof *spell);
        size_t *spell_len = xcalloc(n_added + 1, sizeof *spell_len);
        for (size_t i = 0; i < n_added && !rc; i++) {
            spell[i] = by_id[n_bpe + i], spell_len[i] = by_len[n_bpe + i];
            if (!spell_len[i] || memchr(spell[i], 0, spell_len[i]))
                rc = df_err_set(err, DF_ERR_FORMAT, -1, "%s: added token %zu is empty or holds a NUL", path, n_bpe + i);
        }
        t->n_special = (int)n_added;
        if (!rc) rc = tok_install_specials(t, spell, spell_len, path, err);
        free(spell);
        free(spell_len);
    }
    free(by_id);
    free(by_len);
    return rc;
}
