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

/* model.vocab into the arena in id order, then the rank map. */
static int hf_vocab(const json_value *vocab, tokenizer *t, size_t n_added, const char *path, df_error *err)
{
    size_t n = vocab->len, bytes = 0;
    if (n < 256 || n > (size_t)INT32_MAX / 2)
        return df_err_set(err, DF_ERR_FORMAT, vocab->pos, "%s: model.vocab holds %zu tokens", path, n);
    const char **by_id = xcalloc(n, sizeof *by_id);
    int rc = 0;
    for (size_t i = 0; i < n && !rc; i++) {
        const json_value *v = vocab->items[i];
        if (v->type != JSON_NUMBER || !v->is_int || v->i < 0 || (size_t)v->i >= n || by_id[v->i])
            rc = df_err_set(err, DF_ERR_FORMAT, v->pos, "%s: model.vocab[\"%.40s\"]: ids must be 0..%zu, each once", path,
                            vocab->keys[i], n - 1);
        else by_id[v->i] = vocab->keys[i], bytes += strlen(vocab->keys[i]) + 1;
    }
    uint64_t *h64 = NULL;
    if (!rc) {
        t->data = xmalloc(bytes + 1);
        t->off = xmalloc((n + n_added + 1) * sizeof *t->off);
        h64 = xmalloc(n * sizeof *h64);
        for (int b = 0; b < 256; b++) t->byte_rank[b] = -1;
        t->off[0] = 0;
    }
    size_t used = 0;
    for (size_t id = 0; id < n && !rc; id++) {
        long nb = level_bytes(by_id[id], strlen(by_id[id]), t->data + used);
        if (nb <= 0) {
            rc = df_err_set(err, DF_ERR_FORMAT, -1, "%s: token %zu (\"%.40s\") is empty or not in the byte-level alphabet",
                            path, id, by_id[id]);
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
    free(by_id);
    return rc;
}

/* One merge's two sides as ids (a string "a b" or a pair ["a", "b"]). */
static int merge_sides(const json_value *m, const tokenizer *t, unsigned char *buf, int32_t *a, int32_t *b)
{
    const char *sa, *sb;
    size_t la, lb;
    if (m->type == JSON_STRING) {
        const char *sp = memchr(m->str, ' ', m->len);
        if (!sp || memchr(sp + 1, ' ', m->len - (size_t)(sp + 1 - m->str))) return -1;
        sa = m->str, la = (size_t)(sp - m->str), sb = sp + 1, lb = m->len - la - 1;
    } else if (m->type == JSON_ARRAY && m->len == 2 && m->items[0]->type == JSON_STRING &&
               m->items[1]->type == JSON_STRING) {
        sa = m->items[0]->str, la = m->items[0]->len, sb = m->items[1]->str, lb = m->items[1]->len;
    } else {
        return -1;
    }
    long na = level_bytes(sa, la, buf), nb = na > 0 ? level_bytes(sb, lb, buf + na) : -1;
    if (na <= 0 || nb <= 0) return -1;
    *a = tok_rank_of(t, buf, (size_t)na);
    *b = tok_rank_of(t, buf + na, (size_t)nb);
    if (*a < 0 || *b < 0) return -1;
    return tok_rank_of(t, buf, (size_t)(na + nb));
}

/* model.merges: each makes a later token than the one before, every token
 * longer than a byte comes from exactly one. */
static int hf_merges(const json_value *merges, tokenizer *t, const char *path, df_error *err)
{
    size_t n = (size_t)t->n_ranks;
    t->merge_left = xmalloc(n * sizeof *t->merge_left);
    t->merge_right = xmalloc(n * sizeof *t->merge_right);
    for (size_t i = 0; i < n; i++) t->merge_left[i] = t->merge_right[i] = -1;
    unsigned char *buf = xmalloc(4 * t->max_tok_len + 16);
    int32_t last = -1;
    int rc = 0;
    for (size_t i = 0; i < merges->len && !rc; i++) {
        const json_value *m = merges->items[i];
        int32_t a, b, r = -1;
        /* sides longer than any token cannot be tokens */
        size_t span = m->type == JSON_STRING ? m->len : m->type == JSON_ARRAY && m->len == 2 && m->items[0]->type == JSON_STRING &&
                                                                  m->items[1]->type == JSON_STRING
                                                              ? m->items[0]->len + m->items[1]->len
                                                              : 0;
        if (span && span <= 4 * t->max_tok_len) r = merge_sides(m, t, buf, &a, &b);
        if (r < 0)
            rc = df_err_set(err, DF_ERR_FORMAT, m->pos, "%s: merge %zu does not join two tokens into a token", path, i);
        else if (r <= last)
            rc = df_err_set(err, DF_ERR_UNSUPPORTED, m->pos,
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
