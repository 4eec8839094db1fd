/* tokenizer.c - K3's tokenizer (spec section 9): tiktoken byte-level BPE over
 * K3's pre-tokenizer regex, the 256 reserved specials, and the incremental
 * decoder.
 *
 * Owns: the vocabulary (token bytes in one arena, a byte-string -> rank hash
 * map, the specials sorted by spelling), the compiled pre-tokenizer (PCRE2,
 * compiled and JIT-compiled once at load), encoding and decoding.
 * Does not own: chat templates (which call encode per segment), the sampler.
 *
 * Encoding, in order:
 *  1. Invalid UTF-8 in the input is repaired exactly as Python's
 *     bytes.decode("utf-8", errors="replace") and WHATWG's TextDecoder do:
 *     every maximal subpart of an ill-formed sequence (a lone byte, or a valid
 *     but truncated prefix such as E4 BD) becomes one U+FFFD.  The result is
 *     the encoding of the repaired text, so it equals tiktoken on the string a
 *     Python or JavaScript caller would have.
 *  2. Safety splitting, identical to Kimi's tokenization_kimi.py: slices of
 *     at most 400,000 scalars, and within each, runs of more than 25,000
 *     characters of one class (Python str.isspace, which includes
 *     U+001C..U+001F) cut every 25,000.  Slices are encoded independently, so
 *     (as in Kimi's code) a special spelling cut by a slice boundary is text.
 *  3. allow_special: within a slice, the earliest position where a special
 *     spelling matches ends the ordinary text before it (which is encoded on
 *     its own, so `(?!\S)` sees its end) and emits the special id.  K3's
 *     spellings are prefix-free; should a file's not be, the longest wins.
 *  4. The regex splits ordinary text into pieces; each piece is BPE-encoded.
 *
 * The regex is the spec's with three PCRE2 adaptations, each exact:
 *  - `[X&&[^\p{Han}]]` (class intersection, which PCRE2 lacks) is written as
 *    the complement of the other general categories plus Han: the general
 *    categories partition Unicode, so ~(Ll|N|P|S|Z|C|Han) = (Lu|Lt|Lm|Lo|M)
 *    minus Han.  Pure classes, so the JIT needs no stack per character.
 *  - `\p{Han}` is Script=Han (`\p{sc:Han}`): bare `\p{Han}` means
 *    Script_Extensions in PCRE2 >= 10.40 (which would make "、" and "。" Han)
 *    but Script in Rust's regex crate, which tiktoken uses.
 *  - `\s` is written out as Unicode White_Space: PCRE2's UCP `\s` also
 *    matches U+180E, which Rust (and White_Space since Unicode 6.3) does not.
 * Character properties come from the PCRE2 library (Unicode 14 in 10.42);
 * tiktoken's Rust tables are newer.  The CJK extensions H and I (Unicode
 * 15.0/15.1) are added to Han and to letters by hand; other characters first
 * assigned after PCRE2's Unicode version may pre-tokenize differently.
 *
 * BPE: tiktoken's algorithm (whole piece first, then merge the adjacent pair
 * whose concatenation has the lowest rank, leftmost on ties) as written in
 * bpe_reference; pieces longer than BPE_SMALL bytes use bpe_heap, which makes
 * the same merges in O(n log n).  Tests check the two agree.
 *
 * Invariants: ranks equal line numbers, every byte is a token, byte strings
 * and special spellings are unique (all checked at load).  A loaded tokenizer
 * is read-only; encode allocates only its own scratch and the caller's ids.
 */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer.h"
#include "tokenizer_impl.h"
#include "sha.h"

#include <limits.h>
#include <pcre2.h>
#include <utf8proc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf.h"
#include "json.h"
#include "util.h"

#include <sys/stat.h>

#define SLICE_MAX_SCALARS 400000
#define RUN_MAX_CHARS 25000
#define BPE_SMALL 128
/* K3's file is ~2.5 MB; anything beyond this is not a tokenizer file. */
#define TIKTOKEN_MAX_BYTES ((size_t)1 << 30)
#define CONFIG_MAX_BYTES ((size_t)64 << 20)

/* ------------------------------------------------------------------ UTF-8 */

/* Python's str.isspace (bidi class WS/B/S or category Zs): White_Space plus
 * U+001C..U+001F.  Stable since Unicode 6.3. */
static int py_isspace(uint32_t c)
{
    if (c <= 0x20) return (c >= 0x09 && c <= 0x0d) || (c >= 0x1c);
    if (c < 0x85) return 0;
    return c == 0x85 || c == 0xa0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200a) || c == 0x2028 ||
           c == 0x2029 || c == 0x202f || c == 0x205f || c == 0x3000;
}

/* Offset of the first ill-formed byte, or n when s is valid UTF-8. */
static size_t utf8_valid_prefix(const unsigned char *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        if (s[i] < 0x80) {
            i++;
            continue;
        }
        int sub, len = utf8_char(s + i, n - i, &sub);
        if (!len) return i;
        i += (size_t)len;
    }
    return n;
}

/* Python's decode(errors="replace"): a new buffer, *out_len bytes. */
static char *utf8_repair(const unsigned char *s, size_t n, size_t *out_len)
{
    char *o = xmalloc(3 * n + 1);
    size_t j = 0;
    for (size_t i = 0; i < n;) {
        int sub, len = utf8_char(s + i, n - i, &sub);
        if (len) {
            memcpy(o + j, s + i, (size_t)len);
            j += (size_t)len;
            i += (size_t)len;
        } else {
            memcpy(o + j, "\xef\xbf\xbd", 3);
            j += 3;
            i += (size_t)sub;
        }
    }
    *out_len = j;
    return o;
}

/* ------------------------------------------------------------- hash map */

uint64_t tok_hash_bytes(const unsigned char *p, size_t n)
{
    uint64_t h = 0x9e3779b97f4a7c15ull ^ (n * 0xff51afd7ed558ccdull);
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        h = (h ^ w) * 0xbf58476d1ce4e5b9ull;
        h ^= h >> 31;
        p += 8;
        n -= 8;
    }
    uint64_t w = 0;
    memcpy(&w, p, n);
    h = (h ^ w) * 0x94d049bb133111ebull;
    h ^= h >> 29;
    h *= 0xbf58476d1ce4e5b9ull;
    h ^= h >> 32;
    return h;
}


/* Rank of the byte string p[0..n), or -1. */
int32_t tok_rank_of(const tokenizer *t, const unsigned char *p, size_t n)
{
    if (n == 1) return t->byte_rank[p[0]];
    if (n == 0 || n > t->max_tok_len) return -1;
    uint64_t h64 = tok_hash_bytes(p, n);
    uint32_t h = (uint32_t)h64;
    for (size_t i = (size_t)(h64 >> 32) & t->mask;; i = (i + 1) & t->mask) {
        const rank_slot *s = &t->slots[i];
        if (s->rank < 0) return -1;
        if (s->hash == h && tok_len(t, s->rank) == n && !memcmp(tok_ptr(t, s->rank), p, n)) return s->rank;
    }
}

/* ------------------------------------------------------------------ BPE */

static void ids_push(int32_t **ids, size_t *n, size_t *cap, int32_t id)
{
    if (*n == *cap) {
        *cap = *cap ? *cap * 2 : 64;
        *ids = xrealloc(*ids, *cap * sizeof **ids);
    }
    (*ids)[(*n)++] = id;
}

/* The rank of joining p[a..m) and p[m..b), or -1: any split making a token
 * (tiktoken), or only the pair a merge lists (Hugging Face BPE). */
static int32_t pair_rank(const tokenizer *t, const unsigned char *p, size_t a, size_t m, size_t b)
{
    int32_t r = tok_rank_of(t, p + a, b - a);
    if (r < 0 || !t->merge_left) return r;
    if (t->merge_left[r] != tok_rank_of(t, p + a, m - a) || t->merge_right[r] != tok_rank_of(t, p + m, b - m)) return -1;
    return r;
}

typedef struct bpe_part {
    size_t start;
    int32_t rank; /* rank of this part joined with the next, or INT32_MAX */
} bpe_part;

/* The specification: tiktoken's _byte_pair_merge, step for step.  parts must
 * hold n + 1 entries. */
static void bpe_reference(const tokenizer *t, const unsigned char *p, size_t n, bpe_part *parts, int32_t **ids,
                          size_t *nid, size_t *cap)
{
    size_t np = 0;
    for (size_t i = 0; i + 1 < n; i++) {
        int32_t r = pair_rank(t, p, i, i + 1, i + 2);
        parts[np++] = (bpe_part){i, r < 0 ? INT32_MAX : r};
    }
    parts[np++] = (bpe_part){n - 1, INT32_MAX};
    parts[np++] = (bpe_part){n, INT32_MAX};
    for (;;) {
        int32_t min_rank = INT32_MAX;
        size_t mi = 0;
        for (size_t i = 0; i + 1 < np; i++)
            if (parts[i].rank < min_rank) {
                min_rank = parts[i].rank;
                mi = i;
            }
        if (min_rank == INT32_MAX) break;
        /* the merged part mi now ends at parts[mi + 2]; its pair with the
         * following part ends at parts[mi + 3] (indices before removal) */
        if (mi > 0) {
            int32_t r = mi + 2 < np ? pair_rank(t, p, parts[mi - 1].start, parts[mi].start, parts[mi + 2].start) : -1;
            parts[mi - 1].rank = r < 0 ? INT32_MAX : r;
        }
        int32_t r = mi + 3 < np ? pair_rank(t, p, parts[mi].start, parts[mi + 2].start, parts[mi + 3].start) : -1;
        parts[mi].rank = r < 0 ? INT32_MAX : r;
        memmove(&parts[mi + 1], &parts[mi + 2], (np - mi - 2) * sizeof *parts);
        np--;
    }
    for (size_t i = 0; i + 1 < np; i++) {
        int32_t r = tok_rank_of(t, p + parts[i].start, parts[i + 1].start - parts[i].start);
        CHECK(r >= 0);
        ids_push(ids, nid, cap, r);
    }
}

typedef struct heap_ent {
    int32_t rank;
    uint32_t pos; /* start of the left part */
    uint32_t end; /* end of the pair when pushed; stale if the pair changed */
} heap_ent;

static int heap_less(heap_ent a, heap_ent b) { return a.rank < b.rank || (a.rank == b.rank && a.pos < b.pos); }

static void heap_push(heap_ent *h, size_t *n, heap_ent e)
{
    size_t i = (*n)++;
    while (i > 0 && heap_less(e, h[(i - 1) / 2])) {
        h[i] = h[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h[i] = e;
}

static heap_ent heap_pop(heap_ent *h, size_t *n)
{
    heap_ent top = h[0], last = h[--*n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && heap_less(h[c + 1], h[c])) c++;
        if (!heap_less(h[c], last)) break;
        h[i] = h[c];
        i = c;
    }
    if (*n) h[i] = last;
    return top;
}

/* The same merges as bpe_reference: the live pair with the lowest (rank,
 * start) is always merged next, so the order and the result are identical.
 * Parts form a linked list over byte positions; heap entries are checked for
 * staleness when popped. */
static void bpe_heap(const tokenizer *t, const unsigned char *p, size_t n, int32_t **ids, size_t *nid, size_t *cap)
{
    CHECK(n < UINT32_MAX);
    uint32_t *next = xmalloc((n + 1) * sizeof *next), *prev = xmalloc((n + 1) * sizeof *prev);
    unsigned char *alive = xmalloc(n + 1);
    size_t hcap = 3 * n + 4, hn = 0;
    heap_ent *heap = xmalloc(hcap * sizeof *heap);
    for (size_t i = 0; i < n; i++) {
        next[i] = (uint32_t)(i + 1);
        prev[i] = (uint32_t)(i ? i - 1 : UINT32_MAX);
        alive[i] = 1;
    }
    for (size_t i = 0; i + 1 < n; i++) {
        int32_t r = pair_rank(t, p, i, i + 1, i + 2);
        if (r >= 0) heap_push(heap, &hn, (heap_ent){r, (uint32_t)i, (uint32_t)(i + 2)});
    }
    while (hn) {
        heap_ent e = heap_pop(heap, &hn);
        uint32_t i = e.pos, j = next[i];
        if (!alive[i] || j >= n || next[j] != e.end) continue; /* stale */
        /* merge part j into part i */
        alive[j] = 0;
        next[i] = next[j];
        if (next[i] < n) prev[next[i]] = i;
        if (hn + 2 > hcap) {
            hcap *= 2;
            heap = xrealloc(heap, hcap * sizeof *heap);
        }
        if (next[i] < n) {
            uint32_t end = next[next[i]];
            int32_t r = pair_rank(t, p, i, next[i], end);
            if (r >= 0) heap_push(heap, &hn, (heap_ent){r, i, end});
        }
        if (prev[i] != UINT32_MAX) {
            uint32_t k = prev[i], end = next[i];
            int32_t r = pair_rank(t, p, k, i, end);
            if (r >= 0) heap_push(heap, &hn, (heap_ent){r, k, end});
        }
    }
    for (uint32_t i = 0; i < n; i = next[i]) {
        int32_t r = tok_rank_of(t, p + i, next[i] - i);
        CHECK(r >= 0);
        ids_push(ids, nid, cap, r);
    }
    free(next);
    free(prev);
    free(alive);
    free(heap);
}

static void bpe_piece(const tokenizer *t, const unsigned char *p, size_t n, int32_t **ids, size_t *nid, size_t *cap)
{
    /* tiktoken takes a piece that is a token whole; merges-only BPE does not */
    int32_t r = t->merge_left && n > 1 ? -1 : tok_rank_of(t, p, n);
    if (r >= 0) {
        ids_push(ids, nid, cap, r);
    } else if (n <= BPE_SMALL) {
        bpe_part parts[BPE_SMALL + 1];
        bpe_reference(t, p, n, parts, ids, nid, cap);
    } else {
        bpe_heap(t, p, n, ids, nid, cap);
    }
}

int tokenizer_bpe(const tokenizer *t, const unsigned char *piece, size_t len, int reference, int32_t **ids,
                  size_t *n, size_t *cap)
{
    if (len == 0) return 0;
    int32_t r = t->merge_left && len > 1 ? -1 : tok_rank_of(t, piece, len);
    if (r >= 0) {
        ids_push(ids, n, cap, r);
    } else if (reference) {
        bpe_part *parts = xmalloc((len + 1) * sizeof *parts);
        bpe_reference(t, piece, len, parts, ids, n, cap);
        free(parts);
    } else {
        bpe_heap(t, piece, len, ids, n, cap);
    }
    return 0;
}

/* ------------------------------------------------------------- pre-tokenizer */


typedef struct piece_sink {
    const tokenizer *t;
    int32_t **ids;
    size_t *n, *cap;
    size_t **ends; /* tokenizer_split: piece end offsets instead of ids */
    size_t base;   /* offset of the subject within the caller's text */
} piece_sink;

/* Regex-split s[0..n) (valid UTF-8) and BPE-encode each piece. */
static int encode_ordinary(const unsigned char *s, size_t n, pcre2_match_data *md, piece_sink *k, df_error *err)
{
    size_t pos = 0;
    while (pos < n) {
        int rc = pcre2_match(k->t->re, s, n, pos, PCRE2_NO_UTF_CHECK, md, NULL);
        if (rc == PCRE2_ERROR_JIT_STACKLIMIT)
            rc = pcre2_match(k->t->re, s, n, pos, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, md, NULL);
        if (rc == PCRE2_ERROR_NOMATCH) break; /* unreachable: every character matches some alternative */
        if (rc < 0) {
            PCRE2_UCHAR msg[128];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return df_err_set(err, DF_ERR_LIMIT, (int64_t)(k->base + pos), "tokenizer: pre-tokenizer failed: %s",
                              (const char *)msg);
        }
        const PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        size_t a = ov[0], b = ov[1];
        /* Text before a match (a > pos) would be skipped, as tiktoken's
         * find_iter does, but every character is in some alternative's first
         * class, and no alternative matches the empty string. */
        CHECK(b > a);
        if (k->ends) {
            if (*k->n == *k->cap) {
                *k->cap = *k->cap ? *k->cap * 2 : 64;
                *k->ends = xrealloc(*k->ends, *k->cap * sizeof **k->ends);
            }
            (*k->ends)[(*k->n)++] = k->base + b;
        } else {
            bpe_piece(k->t, s + a, b - a, k->ids, k->n, k->cap);
        }
        pos = b;
    }
    return 0;
}

/* ------------------------------------------------------------- specials */

static int spell_cmp(const tokenizer *t, int32_t a, int32_t b)
{
    size_t la = tok_len(t, a), lb = tok_len(t, b);
    int c = memcmp(tok_ptr(t, a), tok_ptr(t, b), la < lb ? la : lb);
    return c ? c : (la > lb) - (la < lb);
}

/* The special whose spelling is the longest prefix of s[0..n), or -1. */
static int32_t special_at(const tokenizer *t, const unsigned char *s, size_t n, size_t *mlen)
{
    size_t lo = 0, hi = (size_t)t->n_special;
    int32_t best = -1;
    /* invariant: the spellings in sorted[lo..hi) all start with s[0..k);
     * one of exactly length k would sort first */
    for (size_t k = 0; lo < hi; k++) {
        if (tok_len(t, t->special_sorted[lo]) == k) {
            best = t->special_sorted[lo];
            *mlen = k;
            lo++;
        }
        if (k >= n || lo >= hi) break;
        unsigned char c = s[k];
        size_t a = lo, b = hi;
        while (a < b) { /* first with byte k >= c */
            size_t m = a + (b - a) / 2;
            if (tok_ptr(t, t->special_sorted[m])[k] < c) a = m + 1;
            else b = m;
        }
        size_t e = a;
        b = hi;
        while (e < b) { /* first with byte k > c */
            size_t m = e + (b - e) / 2;
            if (tok_ptr(t, t->special_sorted[m])[k] <= c) e = m + 1;
            else b = m;
        }
        lo = a;
        hi = e;
    }
    return best;
}

/* Ordinary text between specials: NFC first where the family normalises
 * (Hugging Face normalises what its added tokens leave), then split. */
static int encode_segment(const tokenizer *t, const unsigned char *s, size_t n, pcre2_match_data *md, piece_sink *k,
                          df_error *err)
{
    int ascii = 1;
    for (size_t i = 0; i < n && ascii; i++) ascii = s[i] < 0x80;
    if (!t->fam->nfc || ascii || !n) return encode_ordinary(s, n, md, k, err);
    utf8proc_uint8_t *nfc = NULL;
    utf8proc_ssize_t m = utf8proc_map(s, (utf8proc_ssize_t)n, &nfc, UTF8PROC_STABLE | UTF8PROC_COMPOSE);
    if (m < 0) {
        free(nfc);
        return df_err_set(err, DF_ERR_LIMIT, (int64_t)k->base, "tokenizer: NFC normalisation failed: %s",
                          utf8proc_errmsg(m));
    }
    int rc;
    if (k->ends && ((size_t)m != n || memcmp(nfc, s, n)))
        rc = df_err_set(err, DF_ERR_UNSUPPORTED, (int64_t)k->base,
                        "tokenizer_split: the text changes under NFC, so piece ends would not be its offsets");
    else rc = encode_ordinary(nfc, (size_t)m, md, k, err);
    free(nfc);
    return rc;
}

static int encode_slice(const tokenizer *t, const unsigned char *s, size_t n, int allow_special,
                        pcre2_match_data *md, piece_sink *k, df_error *err)
{
    size_t start = 0;
    if (allow_special) {
        for (size_t i = 0; i < n; i++) {
            if (!t->special_first[s[i]]) continue;
            size_t mlen = 0;
            int32_t id = special_at(t, s + i, n - i, &mlen);
            if (id < 0) continue;
            k->base += start;
            int rc = encode_segment(t, s + start, i - start, md, k, err);
            k->base -= start;
            if (rc) return rc;
            if (!k->ends) ids_push(k->ids, k->n, k->cap, id);
            start = i + mlen;
            i = start - 1;
        }
    }
    k->base += start;
    int rc = encode_segment(t, s + start, n - start, md, k, err);
    k->base -= start;
    return rc;
}

/* Steps 2-4 of the file comment on valid UTF-8 s[0..n). */
static int encode_text(const tokenizer *t, const unsigned char *s, size_t n, int allow_special, piece_sink *k,
                       df_error *err)
{
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(t->re, NULL);
    CHECK(md);
    size_t base0 = k->base;
    int rc = 0;
    size_t pos = 0;
    if (!t->fam->kimi_slices) {
        rc = encode_slice(t, s, n, allow_special, md, k, err);
        pos = n;
    }
    while (pos < n && !rc) {
        /* one slice of at most SLICE_MAX_SCALARS scalars, cut into pieces
         * with no class run longer than RUN_MAX_CHARS */
        size_t slice_start = pos, run = 0, scalars = 0;
        int run_space = -1;
        while (pos < n && scalars < SLICE_MAX_SCALARS) {
            int sub, len = utf8_char(s + pos, n - pos, &sub);
            CHECK(len > 0);
            int sp = py_isspace(utf8_cp(s + pos, len));
            if (sp != run_space) {
                run = 1;
                run_space = sp;
            } else if (++run > RUN_MAX_CHARS) {
                k->base = base0 + slice_start;
                rc = encode_slice(t, s + slice_start, pos - slice_start, allow_special, md, k, err);
                if (rc) break;
                slice_start = pos;
                run = 1;
            }
            pos += (size_t)len;
            scalars++;
        }
        if (!rc) {
            k->base = base0 + slice_start;
            rc = encode_slice(t, s + slice_start, pos - slice_start, allow_special, md, k, err);
        }
    }
    k->base = base0;
    pcre2_match_data_free(md);
    return rc;
}

int tokenizer_encode(const tokenizer *t, const char *text, size_t len, int allow_special, int32_t **ids, size_t *n,
                     size_t *cap, df_error *err)
{
    if (!t || (!text && len)) return df_err_set(err, DF_ERR_ARG, -1, "tokenizer_encode: NULL argument");
    const unsigned char *s = (const unsigned char *)text;
    char *fixed = NULL;
    if (utf8_valid_prefix(s, len) != len) {
        fixed = utf8_repair(s, len, &len);
        s = (const unsigned char *)fixed;
    }
    size_t n0 = *n;
    piece_sink k = {t, ids, n, cap, NULL, 0};
    int rc = encode_text(t, s, len, allow_special ? 1 : 0, &k, err);
    if (rc) *n = n0; /* nothing appended on failure */
    free(fixed);
    return rc;
}

int tokenizer_split(const tokenizer *t, const char *text, size_t len, size_t **ends, size_t *n, size_t *cap,
                    df_error *err)
{
    const unsigned char *s = (const unsigned char *)text;
    size_t bad = utf8_valid_prefix(s, len);
    if (bad != len) return df_err_set(err, DF_ERR_ARG, (int64_t)bad, "tokenizer_split: invalid UTF-8");
    piece_sink k = {t, NULL, n, cap, ends, 0};
    return encode_text(t, s, len, 0, &k, err);
}

/* ------------------------------------------------------------------ loading */

/* Fill the hash map with ranks 0..n_ranks-1 in order of their home slot, so
 * the table is written front to back instead of at random (K3's 163,584
 * inserts would otherwise each miss the cache).  Returns 0, or fills *a < *b
 * with two ranks holding the same bytes. */
static int build_map(tokenizer *t, const uint64_t *h64, int32_t *a, int32_t *b)
{
    size_t n = (size_t)t->n_ranks, nb = (t->mask + 1) >> 8; /* 256 slots per bucket */
    uint32_t *cnt = xcalloc(nb + 1, sizeof *cnt);
    int32_t *order = xmalloc(n * sizeof *order);
    for (size_t r = 0; r < n; r++) cnt[(((size_t)(h64[r] >> 32) & t->mask) >> 8) + 1]++;
    for (size_t i = 0; i < nb; i++) cnt[i + 1] += cnt[i];
    for (size_t r = 0; r < n; r++) order[cnt[((size_t)(h64[r] >> 32) & t->mask) >> 8]++] = (int32_t)r;
    int rc = 0;
    for (size_t k = 0; k < n && !rc; k++) {
        int32_t r = order[k];
        const unsigned char *p = tok_ptr(t, r);
        size_t len = tok_len(t, r);
        uint32_t h = (uint32_t)h64[r];
        for (size_t i = (size_t)(h64[r] >> 32) & t->mask;; i = (i + 1) & t->mask) {
            rank_slot *sl = &t->slots[i];
            if (sl->rank < 0) {
                sl->hash = h;
                sl->rank = r;
                break;
            }
            if (sl->hash == h && tok_len(t, sl->rank) == len && !memcmp(tok_ptr(t, sl->rank), p, len)) {
                *a = sl->rank < r ? sl->rank : r;
                *b = sl->rank < r ? r : sl->rank;
                rc = -1;
                break;
            }
        }
    }
    free(cnt);
    free(order);
    return rc;
}


/* Parse tiktoken.model into the arena, offsets and hash map. */
static int load_ranks(tokenizer *t, const char *path, df_error *err)
{
    char *buf = NULL;
    size_t len = 0;
    if (read_small_file(path, &buf, &len, TIKTOKEN_MAX_BYTES, err)) return -1;
    const unsigned char *s = (const unsigned char *)buf;
    size_t n_lines = 0;
    for (const unsigned char *q = s; (q = memchr(q, '\n', len - (size_t)(q - s))) != NULL; q++) n_lines++;
    n_lines += len && s[len - 1] != '\n';
    if (n_lines > (size_t)INT32_MAX - TOK_K3_SPECIALS - 1) {
        free(buf);
        return df_err_set(err, DF_ERR_FORMAT, -1, "%s: too many lines", path);
    }
    /* base64 never expands, so len bytes (+ a NUL per line) hold every token */
    t->data = xmalloc(len + n_lines + 1);
    t->off = xmalloc((n_lines + TOK_K3_SPECIALS + 1) * sizeof *t->off);
    uint64_t *h64 = xmalloc((n_lines + 1) * sizeof *h64);
    for (int b = 0; b < 256; b++) t->byte_rank[b] = -1;
    t->off[0] = 0;

    size_t pos = 0, used = 0;
    int32_t rank = 0;
    int rc = 0;
    while (pos < len) {
        size_t line = (size_t)rank + 1;
        const unsigned char *nl = memchr(s + pos, '\n', len - pos);
        size_t eol = nl ? (size_t)(nl - s) : len, end = eol;
        if (end > pos && s[end - 1] == '\r') end--;
        if (end == pos) {
            rc = df_err_set(err, DF_ERR_FORMAT, (int64_t)pos, "%s:%zu: empty line", path, line);
            break;
        }
        const unsigned char *sp = memchr(s + pos, ' ', end - pos);
        if (!sp) {
            rc = df_err_set(err, DF_ERR_FORMAT, (int64_t)pos, "%s:%zu: expected \"base64 rank\"", path, line);
            break;
        }
        size_t b64_len = (size_t)(sp - (s + pos));
        long nb = b64_decode(s + pos, b64_len, t->data + used);
        if (nb <= 0) {
            rc = df_err_set(err, DF_ERR_FORMAT, (int64_t)pos, "%s:%zu: invalid base64 \"%.*s\"", path, line,
                            (int)(b64_len < 64 ? b64_len : 64), (const char *)(s + pos));
            break;
        }
        const unsigned char *q = sp + 1;
        int64_t r = 0;
        int digits = 0;
        while (q < s + end && *q >= '0' && *q <= '9' && digits < 12) {
            r = r * 10 + (*q++ - '0');
            digits++;
        }
        if (!digits || q != s + end) {
            rc = df_err_set(err, DF_ERR_FORMAT, (int64_t)(sp + 1 - s), "%s:%zu: bad rank \"%.*s\"", path, line,
                            (int)((s + end) - (sp + 1) < 32 ? (s + end) - (sp + 1) : 32), (const char *)(sp + 1));
            break;
        }
        if (r != rank) {
            rc = df_err_set(err, DF_ERR_FORMAT, (int64_t)(sp + 1 - s),
                            "%s:%zu: rank %lld, expected %d (ranks must be contiguous from 0 and equal the line "
                            "number)",
                            path, line, (long long)r, rank);
            break;
        }
        h64[rank] = tok_hash_bytes(t->data + used, (size_t)nb);
        if (nb == 1 && t->byte_rank[t->data[used]] < 0) t->byte_rank[t->data[used]] = rank;
        if ((size_t)nb > t->max_tok_len) t->max_tok_len = (size_t)nb;
        used += (size_t)nb;
        t->data[used++] = 0;
        t->off[++rank] = used;
        pos = eol + 1;
    }
    free(buf);
    if (!rc) rc = tok_finish_ranks(t, rank, h64, path, err);
    free(h64);
    return rc;
}

/* After the ordinary tokens are in the arena (h64: their hashes): the hash
 * map, duplicate and byte-coverage checks. */
int tok_finish_ranks(tokenizer *t, int32_t rank, const uint64_t *h64, const char *path, df_error *err)
{
    int rc = 0;
    {
        t->n_ranks = rank;
        size_t cap_slots = 1024;
        while (cap_slots < 2 * (size_t)rank) cap_slots *= 2;
        t->slots = xmalloc(cap_slots * sizeof *t->slots);
        for (size_t i = 0; i < cap_slots; i++) t->slots[i].rank = -1;
        t->mask = cap_slots - 1;
        int32_t a, b;
        if (build_map(t, h64, &a, &b))
            rc = df_err_set(err, DF_ERR_FORMAT, -1, "%s:%d: token duplicates the byte string of line %d", path,
                            b + 1, a + 1);
    }
    for (int b = 0; b < 256 && !rc; b++)
        if (t->byte_rank[b] < 0)
            rc = df_err_set(err, DF_ERR_FORMAT, -1,
                            "%s: byte 0x%02x has no token (every single byte must be present)", path, b);
    return rc;
}

/* Strict decimal id string. */
int tok_parse_id(const char *s, int64_t *out)
{
    if (!*s || (s[0] == '0' && s[1]) || strlen(s) > 12) return -1;
    int64_t v = 0;
    for (; *s; s++) {
        if (*s < '0' || *s > '9') return -1;
        v = v * 10 + (*s - '0');
    }
    *out = v;
    return 0;
}


/* Spellings from tokenizer_config.json's added_tokens_decoder, appended to
 * the arena as ids n_ranks .. n_ranks+255. */
static int load_specials(tokenizer *t, const char *path, df_error *err)
{
    char *buf = NULL;
    size_t len = 0;
    if (read_small_file(path, &buf, &len, CONFIG_MAX_BYTES, err)) return -1;
    json_doc *doc = json_parse(buf, len, err);
    free(buf);
    if (!doc) {
        df_err_prefix(err, "%s", path);
        return -1;
    }
    const char *spell[TOK_K3_SPECIALS] = {0};
    size_t spell_len[TOK_K3_SPECIALS] = {0};
    int rc = 0;
    const json_value *atd = json_get(json_root(doc), "added_tokens_decoder");
    if (!atd || atd->type != JSON_OBJECT) {
        rc = df_err_set(err, DF_ERR_FORMAT, -1, "%s: no \"added_tokens_decoder\" object", path);
        goto done;
    }
    for (size_t i = 0; i < atd->len; i++) {
        int64_t id;
        const json_value *v = atd->items[i];
        if (tok_parse_id(atd->keys[i], &id)) {
            rc = df_err_set(err, DF_ERR_FORMAT, v->pos, "%s: added_tokens_decoder key \"%.40s\" is not an id", path,
                            atd->keys[i]);
            goto done;
        }
        if (id < t->n_ranks || id >= (int64_t)t->n_ranks + TOK_K3_SPECIALS) {
            rc = df_err_set(err, DF_ERR_FORMAT, v->pos,
                            "%s: added_tokens_decoder id %lld is outside the reserved range [%d, %d)", path,
                            (long long)id, t->n_ranks, t->n_ranks + TOK_K3_SPECIALS);
            goto done;
        }
        const json_value *c = v->type == JSON_OBJECT ? json_get(v, "content") : NULL;
        if (!c || c->type != JSON_STRING || c->len == 0 || memchr(c->str, 0, c->len)) {
            rc = df_err_set(err, DF_ERR_FORMAT, v->pos,
                            "%s: added_tokens_decoder[\"%lld\"] needs a non-empty \"content\" string without NUL",
                            path, (long long)id);
            goto done;
        }
        spell[id - t->n_ranks] = c->str;
        spell_len[id - t->n_ranks] = c->len;
    }
    rc = tok_install_specials(t, spell, spell_len, path, err);
done:
    json_free(doc);
    return rc;
}

/* Append the t->n_special spellings (NULL: <|reserved_token_ID|>) to the
 * arena as ids n_ranks .. n_vocab-1 and index them. */
int tok_install_specials(tokenizer *t, const char **spell, size_t *spell_len, const char *path, df_error *err)
{
    int ns = t->n_special;
    size_t extra = 0;
    char (*dflt)[40] = xmalloc((size_t)(ns ? ns : 1) * sizeof *dflt);
    for (int i = 0; i < ns; i++) {
        if (!spell[i]) {
            snprintf(dflt[i], sizeof dflt[i], "<|reserved_token_%d|>", t->n_ranks + i);
            spell[i] = dflt[i];
            spell_len[i] = strlen(dflt[i]);
        }
        extra += spell_len[i] + 1;
    }
    size_t used = t->off[t->n_ranks];
    t->data = xrealloc(t->data, used + extra + 1);
    for (int i = 0; i < ns; i++) {
        memcpy(t->data + used, spell[i], spell_len[i]);
        used += spell_len[i];
        t->data[used++] = 0;
        t->off[t->n_ranks + i + 1] = used;
    }
    free(dflt); /* spell[] may point into it: copied above, not used again */
    t->special_sorted = xmalloc((size_t)(ns ? ns : 1) * sizeof *t->special_sorted);
    for (int i = 0; i < ns; i++) {
        /* insertion sort: a few hundred entries, load time only */
        int32_t id = t->n_ranks + i;
        int j = i;
        while (j > 0 && spell_cmp(t, t->special_sorted[j - 1], id) > 0) {
            t->special_sorted[j] = t->special_sorted[j - 1];
            j--;
        }
        t->special_sorted[j] = id;
        t->special_first[tok_ptr(t, id)[0]] = 1;
    }
    for (int i = 1; i < ns; i++)
        if (!spell_cmp(t, t->special_sorted[i - 1], t->special_sorted[i]))
            return df_err_set(err, DF_ERR_FORMAT, -1, "%s: ids %d and %d have the same spelling \"%s\"", path,
                              t->special_sorted[i - 1], t->special_sorted[i],
                              (const char *)tok_ptr(t, t->special_sorted[i]));
    return 0;
}

/* GPT-2's byte-level alphabet, which llama.cpp's "gpt2" vocabularies use to
 * store token bytes as text: the printable bytes 33..126, 161..172 and
 * 174..255 stand for themselves, the other 68 bytes for U+0100 + their
 * index in byte order.  Returns the byte of code point cp, or -1. */
int tok_byte_of_level_cp(uint32_t cp)
{
    if ((cp >= 33 && cp <= 126) || (cp >= 161 && cp <= 172) || (cp >= 174 && cp <= 255)) return (int)cp;
    if (cp < 256 || cp >= 256 + 68) return -1;
    int k = (int)(cp - 256);
    for (int b = 0; b < 256; b++) {
        int printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
        if (!printable && k-- == 0) return b;
    }
    return -1;
}

/* The vocabulary of a llama.cpp GGUF (tokenizer.ggml.model "gpt2"): the
 * leading NORMAL tokens (type 1) are the BPE ranks in id order, their
 * strings in the byte-level alphabet; the tokens after them are the
 * specials, stored verbatim. */
int tok_load_gguf_k3(tokenizer *t, const gguf_file *gp, df_error *err)
{
    const gguf_file g = *gp; /* a shallow copy: the getters only read */
    const char *path = g.path;
    int rc = -1;
    uint64_t *h64 = NULL;
    const char *model;
    size_t mlen;
    const gguf_kv *tok = gguf_find_kv(&g, "tokenizer.ggml.tokens"), *typ = gguf_find_kv(&g, "tokenizer.ggml.token_type");
    if (gguf_get_str(&g, "tokenizer.ggml.model", &model, &mlen, err)) goto out;
    if (mlen != 4 || memcmp(model, "gpt2", 4)) {
        df_err_set(err, DF_ERR_UNSUPPORTED, -1, "%s: tokenizer.ggml.model is \"%.*s\"; K3's vocabulary is \"gpt2\"",
                   path, (int)(mlen > 32 ? 32 : mlen), model);
        goto out;
    }
    if (!tok || tok->type != GGUF_KV_ARRAY || tok->arr_type != GGUF_KV_STRING || !typ || typ->type != GGUF_KV_ARRAY ||
        typ->n != tok->n) {
        df_err_set(err, DF_ERR_FORMAT, -1, "%s: needs tokenizer.ggml.tokens (strings) and a token_type per token", path);
        goto out;
    }
    size_t n = (size_t)tok->n, n_ranks = 0, bytes = 0;
    if (n > (size_t)INT32_MAX - TOK_K3_SPECIALS - 1) {
        df_err_set(err, DF_ERR_FORMAT, -1, "%s: %zu tokens", path, n);
        goto out;
    }
    int64_t *types = xmalloc((n ? n : 1) * sizeof *types);
    size_t got = 0;
    if (gguf_get_arr_int(&g, "tokenizer.ggml.token_type", types, n, &got, err)) {
        free(types);
        goto out;
    }
    while (n_ranks < n && types[n_ranks] == 1) n_ranks++;
    for (size_t i = n_ranks; i < n; i++)
        if (types[i] == 1) {
            df_err_set(err, DF_ERR_UNSUPPORTED, -1,
                       "%s: token %zu is NORMAL after special token %zu; deltafin needs the BPE ranks first", path, i,
                       n_ranks);
            free(types);
            goto out;
        }
    free(types);
    if (n - n_ranks > TOK_K3_SPECIALS) {
        df_err_set(err, DF_ERR_UNSUPPORTED, -1, "%s: %zu special tokens; K3 reserves %d", path, n - n_ranks,
                   TOK_K3_SPECIALS);
        goto out;
    }
    for (size_t i = 0; i < n_ranks; i++) bytes += (size_t)tok->str_len[i] + 1;
    t->data = xmalloc(bytes + 1);
    t->off = xmalloc((n_ranks + TOK_K3_SPECIALS + 1) * sizeof *t->off);
    h64 = xmalloc((n_ranks + 1) * sizeof *h64);
    for (int b = 0; b < 256; b++) t->byte_rank[b] = -1;
    t->off[0] = 0;
    size_t used = 0;
    for (size_t i = 0; i < n_ranks; i++) {
        const unsigned char *s = tok->data + tok->str_off[i];
        size_t len = (size_t)tok->str_len[i], start = used;
        for (size_t k = 0; k < len;) {
            int sub, cl = utf8_char(s + k, len - k, &sub);
            int b = cl ? tok_byte_of_level_cp(utf8_cp(s + k, cl)) : -1;
            if (b < 0) {
                df_err_set(err, DF_ERR_FORMAT, -1, "%s: token %zu (\"%.*s\") is not in the byte-level alphabet", path, i,
                           (int)(len > 40 ? 40 : len), (const char *)s);
                goto out;
            }
            t->data[used++] = (unsigned char)b;
            k += (size_t)cl;
        }
        size_t nb = used - start;
        if (!nb) {
            df_err_set(err, DF_ERR_FORMAT, -1, "%s: token %zu is empty", path, i);
            goto out;
        }
        h64[i] = tok_hash_bytes(t->data + start, nb);
        if (nb == 1 && t->byte_rank[t->data[start]] < 0) t->byte_rank[t->data[start]] = (int32_t)i;
        if (nb > t->max_tok_len) t->max_tok_len = nb;
        t->data[used++] = 0;
        t->off[i + 1] = used;
    }
    if (tok_finish_ranks(t, (int32_t)n_ranks, h64, path, err)) goto out;
    const char *spell[TOK_K3_SPECIALS] = {0};
    size_t spell_len[TOK_K3_SPECIALS] = {0};
    for (size_t i = n_ranks; i < n; i++) {
        spell[i - n_ranks] = (const char *)tok->data + tok->str_off[i];
        spell_len[i - n_ranks] = (size_t)tok->str_len[i];
        if (!spell_len[i - n_ranks] || memchr(spell[i - n_ranks], 0, spell_len[i - n_ranks])) {
            df_err_set(err, DF_ERR_FORMAT, -1, "%s: special token %zu is empty or holds a NUL", path, i);
            goto out;
        }
    }
    rc = tok_install_specials(t, spell, spell_len, path, err);
out:
    free(h64);
    return rc;
}

/* Output of decoding p[0..n) from an empty decoder state, not counting a
 * held-back incomplete tail. */
static size_t fresh_decode_len(const unsigned char *p, size_t n)
{
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        int sub, len = utf8_char(p + i, n - i, &sub);
        if (len) {
            o += (size_t)len;
            i += (size_t)len;
        } else if (i + (size_t)sub == n && sub < utf8_need(p[i])) {
            break; /* truncated at the end: held back */
        } else {
            o += 3;
            i += (size_t)sub;
        }
    }
    return o;
}

int tok_load_tiktoken(tokenizer *t, const char *model_dir, df_error *err)
{
    t->fam = &tok_family_k3;
    t->n_special = TOK_K3_SPECIALS;
    size_t dl = strlen(model_dir);
    char *path = xmalloc(dl + 32);
    snprintf(path, dl + 32, "%s/tiktoken.model", model_dir);
    int rc = load_ranks(t, path, err);
    if (!rc) {
        snprintf(path, dl + 32, "%s/tokenizer_config.json", model_dir);
        rc = load_specials(t, path, err);
    }
    free(path);
    return rc;
}


/* After the vocabulary: the decoder bound and the pre-tokenizer. */
int tok_finish_load(tokenizer *t, df_error *err)
{
    t->n_vocab = t->n_ranks + t->n_special;

    /* The bound tok_decoder_max_out reports: a pending prefix resolves to at
     * most 3 bytes, then the token decodes as from an empty state. */
    t->max_dec_out = 3;
    for (int32_t id = 0; id < t->n_vocab; id++) {
        size_t o = 3 + (id < t->n_ranks ? fresh_decode_len(tok_ptr(t, id), tok_len(t, id)) : tok_len(t, id));
        if (o > t->max_dec_out) t->max_dec_out = o;
    }

    int ec;
    PCRE2_SIZE eo;
    t->re = pcre2_compile((PCRE2_SPTR)t->fam->pattern, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP, &ec, &eo, NULL);
    if (!t->re) {
        PCRE2_UCHAR msg[128];
        pcre2_get_error_message(ec, msg, sizeof msg);
        return df_err_set(err, DF_ERR_UNSUPPORTED, (int64_t)eo, "PCRE2 cannot compile the pre-tokenizer: %s",
                          (const char *)msg);
    }
    /* JIT is an optimisation only: without it pcre2_match interprets. */
    (void)pcre2_jit_compile(t->re, PCRE2_JIT_COMPLETE);
    return 0;
}

void tokenizer_free(tokenizer *t)
{
    if (!t) return;
    pcre2_code_free(t->re);
    free(t->data);
    free(t->off);
    free(t->slots);
    free(t->special_sorted);
    free(t->merge_left);
    free(t->merge_right);
    free(t);
}

int tokenizer_n_vocab(const tokenizer *t) { return t->n_vocab; }
int tokenizer_n_ranks(const tokenizer *t) { return t->n_ranks; }

void tokenizer_fingerprint(const tokenizer *t, uint8_t out[32])
{
    sha256_ctx c;
    sha256_init(&c);
    uint32_t head[2] = {(uint32_t)t->n_ranks, (uint32_t)t->n_vocab};
    sha256_update(&c, head, sizeof head);
    /* another family encodes the same tables differently (K3's value is
     * unchanged: its name is not hashed) */
    if (t->fam != &tok_family_k3) sha256_update(&c, t->fam->name, strlen(t->fam->name) + 1);
    for (int32_t id = 0; id < t->n_vocab; id++) {
        uint32_t len = (uint32_t)tok_len(t, id);
        sha256_update(&c, &len, sizeof len);
        sha256_update(&c, t->data + t->off[id], len);
    }
    sha256_final(&c, out);
}

int32_t tokenizer_special_id(const tokenizer *t, const char *spelling)
{
    size_t n = strlen(spelling), lo = 0, hi = (size_t)t->n_special;
    while (lo < hi) {
        size_t m = lo + (hi - lo) / 2;
        int32_t id = t->special_sorted[m];
        size_t l = tok_len(t, id);
        int c = memcmp(tok_ptr(t, id), spelling, l < n ? l : n);
        if (!c) c = (l > n) - (l < n);
        if (!c) return id;
        if (c < 0) lo = m + 1;
        else hi = m;
    }
    return -1;
}

int tokenizer_is_special(const tokenizer *t, int32_t id) { return id >= t->n_ranks && id < t->n_vocab; }

const char *tokenizer_token_bytes(const tokenizer *t, int32_t id, size_t *len)
{
    if (id < 0 || id >= t->n_vocab) {
        if (len) *len = 0;
        return NULL;
    }
    if (len) *len = tok_len(t, id);
    return (const char *)tok_ptr(t, id);
}

/* ------------------------------------------------------------------ decoding */

/* Output cursor: never writes past cap; once a unit does not fit, the rest
 * of the call's output is dropped (a caller error, see tok_decoder_max_out). */
typedef struct out_buf {
    char *p;
    size_t cap, n;
    int full;
} out_buf;

static void out_put(out_buf *o, const void *s, size_t n)
{
    if (o->full || o->cap - o->n < n) {
        o->full = 1;
        return;
    }
    memcpy(o->p + o->n, s, n);
    o->n += n;
}

/* Feed one byte through the maximal-subpart UTF-8 decoder in d->pend. */
static void dec_byte(tok_decoder *d, unsigned char b, out_buf *o)
{
    for (;;) {
        if (d->n_pend == 0) {
            int need = utf8_need(b);
            if (need == 1) out_put(o, &b, 1);
            else if (need == 0) out_put(o, "\xef\xbf\xbd", 3);
            else d->pend[d->n_pend++] = b;
            return;
        }
        int ok = d->n_pend == 1 ? utf8_second_ok(d->pend[0], b) : (b & 0xc0) == 0x80;
        if (ok) {
            d->pend[d->n_pend++] = b;
            if (d->n_pend == utf8_need(d->pend[0])) {
                out_put(o, d->pend, (size_t)d->n_pend);
                d->n_pend = 0;
            }
            return;
        }
        /* the pending prefix can never complete: one U+FFFD, then b afresh */
        out_put(o, "\xef\xbf\xbd", 3);
        d->n_pend = 0;
    }
}

void tok_decoder_init(tok_decoder *d, const tokenizer *t)
{
    memset(d, 0, sizeof *d);
    d->t = t;
}

size_t tok_decoder_flush(tok_decoder *d, char *out, size_t cap)
{
    out_buf o = {out, cap, 0, 0};
    if (d->n_pend) out_put(&o, "\xef\xbf\xbd", 3);
    d->n_pend = 0;
    return o.n;
}

size_t tok_decoder_feed(tok_decoder *d, int32_t id, char *out, size_t cap)
{
    const tokenizer *t = d->t;
    if (id < 0 || id >= t->n_vocab) return 0; /* not a token: ignored */
    if (id >= t->n_ranks) {
        size_t n = tok_decoder_flush(d, out, cap);
        out_buf o = {out, cap, n, 0};
        out_put(&o, tok_ptr(t, id), tok_len(t, id));
        return o.n;
    }
    out_buf o = {out, cap, 0, 0};
    const unsigned char *p = tok_ptr(t, id);
    size_t n = tok_len(t, id);
    for (size_t i = 0; i < n; i++) dec_byte(d, p[i], &o);
    return o.n;
}

size_t tok_decoder_max_out(const tokenizer *t) { return t->max_dec_out; }

int tokenizer_decode(const tokenizer *t, const int32_t *ids, size_t n, char **out, size_t *out_len, df_error *err)
{
    *out = NULL;
    if (out_len) *out_len = 0;
    size_t total = 3;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= t->n_vocab)
            return df_err_set(err, DF_ERR_ARG, (int64_t)i, "tokenizer_decode: id %d at %zu is not in [0, %d)",
                              (int)ids[i], i, t->n_vocab);
        total += 3 * tok_len(t, ids[i]) + 3;
    }
    char *buf = xmalloc(total + 1);
    tok_decoder d;
    tok_decoder_init(&d, t);
    size_t o = 0;
    for (size_t i = 0; i < n; i++) o += tok_decoder_feed(&d, ids[i], buf + o, total - o);
    o += tok_decoder_flush(&d, buf + o, total - o);
    buf[o] = 0;
    *out = buf;
    if (out_len) *out_len = o;
    return 0;
}
