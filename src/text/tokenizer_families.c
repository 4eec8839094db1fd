/* tokenizer_families.c - the per-family tables of the byte-level BPE
 * tokenizer (tokenizer_impl.h): each family's pre-tokenizer regex written
 * for PCRE2, the regex its tokenizer.json states, and its normalisation.
 *
 * Both patterns write `\s` out as Unicode White_Space (tokenizer.c's file
 * comment says why: PCRE2's UCP `\s` also matches U+180E), which is what
 * Oniguruma (Hugging Face tokenizers) and Rust's regex (tiktoken) mean by it.
 *
 * Qwen2's regex (Qwen2/Qwen3, tokenizer.json's Split pattern) differs from
 * K3's: single digits, no Han class, and the contractions alone as the first
 * alternative.  `(?i:...)` stays case-insensitive as Oniguruma has it: under
 * PCRE2's Unicode caseless matching `'s` also matches U+017F (long s), as it
 * does in Hugging Face tokenizers; llama.cpp and transformers.js spell the
 * group `'[sS]|...` and split "'\u017f" + letters differently (the tests name
 * the case).
 */
#include "tokenizer_impl.h"

/* Unicode White_Space, written out (see the file comment). */
#define WS \
    "\\t\\n\\x{0B}\\f\\r\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}"
/* Han: Script=Han plus CJK extensions H and I, unassigned before Unicode 15. */
#define HAN_NEW "\\x{31350}-\\x{323AF}\\x{2EBF0}-\\x{2EE5D}"
#define HAN "\\p{sc:Han}" HAN_NEW
/* [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]] and [\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]] */
#define UPPERISH "[^\\p{Ll}\\p{N}\\p{P}\\p{S}\\p{Z}\\p{C}" HAN "]"
#define LOWERISH "[^\\p{Lu}\\p{Lt}\\p{N}\\p{P}\\p{S}\\p{Z}\\p{C}" HAN "]"
#define CONTRACTION "(?i:'s|'t|'re|'ve|'m|'ll|'d)?"

static const char k3_pattern[] =
    /* 1 */ "[" HAN "]+"
    /* 2 */ "|[^\\r\\n\\p{L}\\p{N}" HAN_NEW "]?" UPPERISH "*" LOWERISH "+" CONTRACTION
    /* 3 */ "|[^\\r\\n\\p{L}\\p{N}" HAN_NEW "]?" UPPERISH "+" LOWERISH "*" CONTRACTION
    /* 4 */ "|\\p{N}{1,3}"
    /* 5 */ "| ?[^" WS "\\p{L}\\p{N}" HAN_NEW "]+[\\r\\n]*"
    /* 6 */ "|[" WS "]*[\\r\\n]+"
    /* 7 */ "|[" WS "]+(?![^" WS "])"
    /* 8 */ "|[" WS "]+";

static const char qwen2_pattern[] =
    /* 1 */ "(?i:'s|'t|'re|'ve|'m|'ll|'d)"
    /* 2 */ "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+"
    /* 3 */ "|\\p{N}"
    /* 4 */ "| ?[^" WS "\\p{L}\\p{N}]+[\\r\\n]*"
    /* 5 */ "|[" WS "]*[\\r\\n]+"
    /* 6 */ "|[" WS "]+(?![^" WS "])"
    /* 7 */ "|[" WS "]+";

const tok_family tok_family_k3 = {"k3", k3_pattern, NULL, 0, 1};

const tok_family tok_family_qwen2 = {
    "qwen2", qwen2_pattern,
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    1, 0};
