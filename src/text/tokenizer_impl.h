/* tokenizer_impl.h - the tokenizer's inside, shared by its files: the BPE
 * core and encoder/decoder (tokenizer.c) and the loaders of other families'
 * files (tokenizer_hf.c: a Hugging Face tokenizer.json).
 *
 * tokenizer_load.c picks the loader for a path.
 *
 * A family is what differs between byte-level BPE tokenizers beyond their
 * tables: the pre-tokenizer regex, Unicode normalisation, and how merges are
 * chosen.  K3's (tiktoken): its regex, no normalisation, Kimi's safety
 * slices, and "merge the adjacent pair whose concatenation has the lowest
 * rank, whole piece first".  Qwen2's (Hugging Face BPE): its regex, NFC,
 * no slices, and only the listed merges (merge_left/right), never the whole
 * piece first.  Not part of engine.h or tokenizer.h.
 */
#ifndef DF_TOKENIZER_IMPL_H
#define DF_TOKENIZER_IMPL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stddef.h>
#include <stdint.h>

#include "df_error.h"
#include "tokenizer.h"

/* K3's tiktoken file reserves this many specials after its ranks. */
#define TOK_K3_SPECIALS 256

typedef struct rank_slot {
    uint32_t hash;
    int32_t rank; /* -1 = empty */
} rank_slot;

/* A family's fixed parts (tokenizer_family_*). */
typedef struct tok_family {
    const char *name;          /* "k3", "qwen2" */
    const char *pattern;       /* the pre-tokenizer for PCRE2 (UTF, UCP) */
    const char *hf_regex;      /* the Split regex a tokenizer.json of this family holds (NULL: none) */
    int nfc;                   /* normalise ordinary text to NFC before splitting */
    int kimi_slices;           /* Kimi's safety slices (tokenization_kimi.py) */
} tok_family;

struct tokenizer {
    const tok_family *fam;
    int n_ranks;            /* ordinary tokens: ids 0 .. n_ranks-1 */
    int n_special;          /* specials: ids n_ranks .. n_vocab-1 */
    int n_vocab;            /* n_ranks + n_special */
    unsigned char *data;    /* every token's bytes, each followed by a NUL */
    size_t *off;            /* [n_vocab + 1] offsets into data */
    rank_slot *slots;       /* open addressing, linear probing; [mask + 1] */
    size_t mask;
    size_t max_tok_len;     /* longest ordinary token, a lookup fast path */
    int32_t byte_rank[256];
    int32_t *special_sorted;   /* [n_special] special ids sorted by spelling bytes */
    unsigned char special_first[256]; /* 1 if some spelling starts with the byte */
    size_t max_dec_out;     /* most bytes one tok_decoder call can write */
    /* Hugging Face BPE: rank r (r >= 0, not a single byte) may only be made
     * from the pair its merge lists; NULL: any split (tiktoken) */
    int32_t *merge_left, *merge_right;
    pcre2_code *re;
};

extern const tok_family tok_family_k3, tok_family_qwen2;

static inline const unsigned char *tok_ptr(const tokenizer *t, int32_t id) { return t->data + t->off[id]; }
static inline size_t tok_len(const tokenizer *t, int32_t id) { return t->off[id + 1] - t->off[id] - 1; }

uint64_t tok_hash_bytes(const unsigned char *p, size_t n);
/* Rank of the byte string p[0..n), or -1 (before merge rules). */
int32_t tok_rank_of(const tokenizer *t, const unsigned char *p, size_t n);
/* After the ordinary tokens are in the arena (h64: their hashes): the hash
 * map, duplicate and byte-coverage checks. */
int tok_finish_ranks(tokenizer *t, int32_t rank, const uint64_t *h64, const char *path, df_error *err);
/* Append t->n_special spellings (NULL: <|reserved_token_ID|>) to the arena
 * as ids n_ranks .. and index them. */
int tok_install_specials(tokenizer *t, const char **spell, size_t *spell_len, const char *path, df_error *err);
/* After the vocabulary: the decoder bound and the family's pre-tokenizer. */
int tok_finish_load(tokenizer *t, df_error *err);
/* The byte a code point of GPT-2's byte-level alphabet stands for, or -1. */
int tok_byte_of_level_cp(uint32_t cp);
/* Strict decimal id string. */
int tok_parse_id(const char *s, int64_t *out);

/* K3's model_dir/tiktoken.model and tokenizer_config.json into t
 * (tokenizer.c). */
int tok_load_tiktoken(tokenizer *t, const char *model_dir, df_error *err);
/* A Hugging Face tokenizer.json (byte-level BPE of a known family) into t
 * (tokenizer_hf.c). */
int tok_load_hf(tokenizer *t, const char *path, df_error *err);
/* A llama.cpp GGUF's "gpt2" vocabulary: K3's (ranks, up to 256 specials;
 * tokenizer.c) or Qwen2's (tokenizer.ggml.pre "qwen2": its merges, its
 * added tokens, the UNUSED padding left out; tokenizer_hf.c). */
struct gguf_file;
int tok_load_gguf_k3(tokenizer *t, const struct gguf_file *g, df_error *err);
int tok_load_gguf_qwen2(tokenizer *t, const struct gguf_file *g, df_error *err);

#endif
