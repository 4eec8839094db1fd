/* tokenizer.h - byte-level BPE tokenizers: K3's (tiktoken-style over K3's
 * pre-tokenizer regex, plus the 256 reserved special tokens, spec section 9)
 * and Hugging Face tokenizer.json files of a known family (Qwen3's: its
 * regex, NFC, merges-only BPE, its added tokens; tokenizer_impl.h).
 *
 * Owns: loading `tiktoken.model` (base64 bytes + rank per line) and the
 * special spellings of `tokenizer_config.json`; encoding text to ids (special
 * spellings recognised only when the caller allows it); decoding ids back to
 * bytes, incrementally, never emitting half a UTF-8 character and never
 * splitting a special token.  Invalid UTF-8 in encoder input is handled as
 * documented in tokenizer.c.  Thread-safety: a loaded tokenizer is read-only;
 * encode/decode may run concurrently from several threads; a tok_decoder
 * belongs to one thread.
 */
#ifndef DF_TOKENIZER_H
#define DF_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>
#include "df_error.h"

typedef struct tokenizer tokenizer;

/* Load model_dir/tiktoken.model and model_dir/tokenizer_config.json (K3),
 * or, without tiktoken.model, model_dir/tokenizer.json (Hugging Face), or,
 * when model_dir is a file, the "gpt2" vocabulary of a llama.cpp GGUF
 * (tokenizer.ggml.tokens in GPT-2's byte-level alphabet + token_type).
 * The vocabulary is n_ranks BPE tokens followed by the specials (K3: 256;
 * a tokenizer.json: its added tokens). */
int tokenizer_load(const char *model_dir, tokenizer **out, df_error *err);
/* The vocabulary of an already parsed GGUF (what tokenizer_load does for a
 * GGUF path). */
struct gguf_file;
int tokenizer_from_gguf(const struct gguf_file *g, tokenizer **out, df_error *err);
/* A Hugging Face tokenizer.json held in memory (name: for messages), as
 * tokenizer_load reads model_dir/tokenizer.json when the folder has no
 * tiktoken.model: byte-level BPE of a family deltafin implements (Qwen2 and
 * Qwen3's; tokenizer_hf.c lists what it accepts). */
int tokenizer_load_hf_json(const char *json, size_t len, const char *name, tokenizer **out, df_error *err);
void tokenizer_free(tokenizer *t);
int tokenizer_n_vocab(const tokenizer *t);

/* Append the ids of text[0..len) to the growable array *ids (*n used, *cap
 * allocated; *ids may start NULL).  allow_special = 1: special spellings in
 * the text become their ids; 0: they are ordinary text. */
int tokenizer_encode(const tokenizer *t, const char *text, size_t len, int allow_special, int32_t **ids,
                     size_t *n, size_t *cap, df_error *err);

/* id of a special spelling such as "<|open|>", or -1. */
int32_t tokenizer_special_id(const tokenizer *t, const char *spelling);
int tokenizer_is_special(const tokenizer *t, int32_t id);
/* The bytes of a token (a special's spelling); NULL for an id out of range.
 * Valid while the tokenizer is. */
const char *tokenizer_token_bytes(const tokenizer *t, int32_t id, size_t *len);

/* Incremental decoder: bytes of ordinary tokens are held back until they
 * complete a UTF-8 character; a special token is emitted whole.  Bytes that
 * can never form a valid character come out as U+FFFD. */
typedef struct tok_decoder {
    const tokenizer *t;
    unsigned char pend[8];
    int n_pend;
} tok_decoder;

void tok_decoder_init(tok_decoder *d, const tokenizer *t);
/* Decode one id; writes at most cap bytes to out and returns the count.
 * cap >= tok_decoder_max_out(t) is always enough (a token of bytes that are
 * never valid UTF-8 can expand to U+FFFD per byte); with less, only the
 * whole characters that fit are written. */
size_t tok_decoder_feed(tok_decoder *d, int32_t id, char *out, size_t cap);
/* End of stream: pending incomplete bytes become U+FFFD. */
size_t tok_decoder_flush(tok_decoder *d, char *out, size_t cap);

/* ---- additions (tokenizer.c documents the encoding rules) ---- */

/* Ordinary (BPE) tokens: ids 0 .. n_ranks-1; the specials follow. */
int tokenizer_n_ranks(const tokenizer *t);

/* SHA-256 over the id -> bytes table (ordinary tokens and special
 * spellings, in id order, each length-prefixed) and the two counts: equal
 * for two tokenizers exactly when every id means the same bytes, whatever
 * the files they were read from (a model folder's or a GGUF's). */
void tokenizer_fingerprint(const tokenizer *t, uint8_t out[32]);

/* The most bytes one tok_decoder_feed or tok_decoder_flush can write for any
 * id of this tokenizer (computed at load).  A buffer this large is always
 * enough.  Note: "token length + 8" above holds for tokens that are pieces of
 * valid UTF-8 except in one case: a pending lone lead byte (E0, F0, ...) that
 * the next token's three leading continuation bytes cannot complete needs
 * length + 9; tokens containing bytes that are never valid UTF-8 need up to
 * 3 * length + 3.  When cap is too small, feed/flush write the whole
 * characters that fit and drop the rest of that call's output. */
size_t tok_decoder_max_out(const tokenizer *t);

/* Decode ids into a new NUL-terminated string (*out, free() it), invalid
 * UTF-8 replaced as tok_decoder does (Python's errors="replace").  An id
 * outside [0, n_vocab) is DF_ERR_ARG. */
int tokenizer_decode(const tokenizer *t, const int32_t *ids, size_t n, char **out, size_t *out_len,
                     df_error *err);

/* For tests and tools.  tokenizer_split: the pre-tokenizer alone (safety
 * splitting + regex, no specials) on valid UTF-8 (else DF_ERR_ARG); appends
 * the end offset of each piece to the growable array *ends.  tokenizer_bpe:
 * BPE of one piece, appended to *ids; reference = 1 runs tiktoken's
 * quadratic algorithm (the specification), 0 the heap-based one that encode
 * uses for long pieces. */
int tokenizer_split(const tokenizer *t, const char *text, size_t len, size_t **ends, size_t *n, size_t *cap,
                    df_error *err);
int tokenizer_bpe(const tokenizer *t, const unsigned char *piece, size_t len, int reference, int32_t **ids,
                  size_t *n, size_t *cap);

#endif
