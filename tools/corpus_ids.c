/*
 * corpus_ids: JSONL training data -> little-endian uint16 token ids, with the
 * engine's own tokenizer and XTML chat template, so that training sees exactly
 * the ids `deltafin run --chat` feeds and generates.
 *
 *   corpus_ids --model DIR --in FILE.jsonl --out FILE.u16 [--mask FILE.u8] [--recut-values]
 *
 * Each input line is one object:
 *   {"text": "..."}     prose: encoded with allow_special = 0, then the
 *                       document separator <|end_of_msg|> (V-254, the config's
 *                       eos_token_id, so raw generation stops at a document end)
 *   {"messages": [...], "think": true|false}
 *                       a whole conversation rendered by chat_render with
 *                       add_generation_prompt = 0, thinking = "think" and (when
 *                       thinking) effort "max": what `run --chat` renders for
 *                       the prompt (without --no-think / with it) followed by
 *                       the assistant reply and its closing tags + <|end_of_msg|>
 *     optional "tools": [...]  the request's OpenAI tools, rendered as the
 *                       server renders them (K3's tool-declare system message
 *                       first); assistant messages may carry "tool_calls" and
 *                       "tool" messages the results, as in an OpenAI request
 * Nothing separates one conversation from the next: each ends in <|end_of_msg|>.
 * --mask writes one byte per id: 1 where the id belongs to an assistant reply
 * (the ids after the generation prompt, through <|end_of_msg|>), else 0; prose
 * ids are 1.  Owns nothing else; exits on the first bad line (named by number).
 *
 * --recut-values: a tool call's string argument that the conversation wrote
 * earlier after a space is written in the call with the pieces it had there.
 * The template encodes the value on its own, so BPE may cut the whole word
 * differently from the message (" coffee" = [ co][ff][ee], "coffee" =
 * [c][off][ee]) and the model would have to re-spell every piece.  With the
 * flag the call gets the message's first piece without its space (its
 * one-piece twin, else that text encoded alone) and then the message's other
 * pieces verbatim: one spelling step and a copy.  The text is the same (the
 * detokenizer does not care how it is cut) and every other id is unchanged;
 * only values whose " value" ids occur earlier in the rendered conversation
 * are recut.  For training rows only: the server renders history canonically.
 */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat_template.h"
#include "df_error.h"
#include "util.h"
#include "json.h"
#include "tokenizer.h"

static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "corpus_ids: ");
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(1);
}

typedef struct ids_buf {
    int32_t *ids;
    size_t n, cap;
} ids_buf;

static int recut_values;
static long n_values, n_recut, n_recut_changed;

static int seg_is(const chat_segment *g, const char *text)
{
    return !g->control && g->len == strlen(text) && !memcmp(g->text, text, g->len);
}

/* seg[i] is a string argument's value: <|open|>argument key="K" type="string"<|sep|>VALUE<|close|>argument */
static int is_string_value(const chat_segments *s, size_t i)
{
    if (i < 5 || i + 2 >= s->n || s->seg[i].control || !s->seg[i].len) return 0;
    const chat_segment *g = s->seg;
    return g[i - 1].control && !strcmp(g[i - 1].text, "<|sep|>") && seg_is(&g[i - 2], "\"") &&
           seg_is(&g[i - 3], "string") && seg_is(&g[i - 4], "=\"") && seg_is(&g[i - 5], " type") &&
           g[i + 1].control && !strcmp(g[i + 1].text, "<|close|>") && seg_is(&g[i + 2], "argument");
}

/* Append the recut ids of value v to b and return 1, or return 0 (append
 * nothing) when the ids of " v" do not occur in b->ids[0..b->n). */
static int recut_value(const tokenizer *t, const char *v, size_t len, ids_buf *b, df_error *err)
{
    static ids_buf src, first;
    static char *sp;
    static size_t sp_cap;
    if (len + 2 > sp_cap) sp = xrealloc(sp, sp_cap = 2 * len + 2);
    sp[0] = ' ';
    memcpy(sp + 1, v, len);
    src.n = 0;
    if (tokenizer_encode(t, sp, len + 1, 0, &src.ids, &src.n, &src.cap, err)) return -1;
    if (!src.n || src.n > b->n) return 0;
    size_t k0 = 0;
    for (; k0 + src.n <= b->n; k0++)
        if (!memcmp(b->ids + k0, src.ids, src.n * sizeof *src.ids)) break;
    if (k0 + src.n > b->n) return 0;
    size_t flen;
    const char *f = tokenizer_token_bytes(t, src.ids[0], &flen);
    if (!f || !flen || f[0] != ' ') return 0;
    first.n = 0;
    if (flen > 1 && tokenizer_encode(t, f + 1, flen - 1, 0, &first.ids, &first.n, &first.cap, err)) return -1;
    size_t need = b->n + first.n + src.n;
    if (need > b->cap) b->ids = xrealloc(b->ids, (b->cap = 2 * need) * sizeof *b->ids);
    size_t at = b->n;
    memcpy(b->ids + b->n, first.ids, first.n * sizeof *first.ids);
    b->n += first.n;
    memcpy(b->ids + b->n, src.ids + 1, (src.n - 1) * sizeof *src.ids);
    b->n += src.n - 1;
    /* the same text, whatever the cut */
    char *dec;
    size_t dlen;
    if (tokenizer_decode(t, b->ids + at, b->n - at, &dec, &dlen, err)) return -1;
    int same = dlen == len && !memcmp(dec, v, len);
    free(dec);
    if (!same) return df_err_set(err, DF_ERR_ARG, -1, "recut value does not decode to itself");
    /* count the values whose ids differ from the canonical cut */
    src.n = 0;
    if (tokenizer_encode(t, v, len, 0, &src.ids, &src.n, &src.cap, err)) return -1;
    n_recut++;
    n_recut_changed += src.n != b->n - at || memcmp(src.ids, b->ids + at, src.n * sizeof *src.ids);
    return 1;
}

static int encode_segments(const tokenizer *t, const chat_segments *s, ids_buf *b, df_error *err)
{
    if (!recut_values) return chat_encode(t, s, &b->ids, &b->n, &b->cap, err);
    for (size_t i = 0; i < s->n; i++) {
        if (is_string_value(s, i)) {
            n_values++;
            int rc = recut_value(t, s->seg[i].text, s->seg[i].len, b, err);
            if (rc < 0) return -1;
            if (rc) continue;
        }
        chat_segments one = *s;
        one.seg = &s->seg[i];
        one.n = 1;
        if (chat_encode(t, &one, &b->ids, &b->n, &b->cap, err)) return -1;
    }
    return 0;
}

/* Render messages[0..n_msg) and append the ids; n_msg < len renders a
 * sub-conversation through a temporary array. */
static int render_ids(const tokenizer *t, const json_value *msgs, size_t n_msg, int think, int gen_prompt,
                      const json_value *tools, ids_buf *b, df_error *err)
{
    json_value sub = *msgs;
    sub.len = n_msg;
    chat_options o;
    chat_options_init(&o);
    o.thinking = think;
    o.thinking_effort = think ? "max" : NULL;
    o.add_generation_prompt = gen_prompt;
    o.tools = tools;
    chat_segments *seg;
    if (chat_render(&sub, &o, &seg, err)) return -1;
    int rc = encode_segments(t, seg, b, err);
    chat_segments_free(seg);
    return rc;
}

int main(int argc, char **argv)
{
    const char *model = NULL, *in = NULL, *out = NULL, *mask_path = NULL;
    for (int i = 1; i < argc; i++) {
        if (i + 1 < argc && !strcmp(argv[i], "--model")) model = argv[++i];
        else if (i + 1 < argc && !strcmp(argv[i], "--in")) in = argv[++i];
        else if (i + 1 < argc && !strcmp(argv[i], "--out")) out = argv[++i];
        else if (i + 1 < argc && !strcmp(argv[i], "--mask")) mask_path = argv[++i];
        else if (!strcmp(argv[i], "--recut-values")) recut_values = 1;
        else {
            fprintf(stderr, "usage: corpus_ids --model DIR --in FILE.jsonl --out FILE.u16 [--mask FILE.u8] "
                            "[--recut-values]\n");
            return 2;
        }
    }
    if (!model || !in || !out) die("--model, --in and --out are required");

    df_error err = {0};
    tokenizer *tok;
    if (tokenizer_load(model, &tok, &err)) die("%s: %s", model, err.msg);
    int V = tokenizer_n_vocab(tok);
    if (V > 65536) die("%s: %d ids do not fit uint16", model, V);
    int32_t sep = tokenizer_special_id(tok, "<|end_of_msg|>");
    if (sep < 0) die("%s: no <|end_of_msg|>", model);

    FILE *fi = fopen(in, "rb");
    if (!fi) die("%s: %s", in, strerror(errno));
    FILE *fo = fopen(out, "wb");
    if (!fo) die("%s: %s", out, strerror(errno));
    FILE *fm = NULL;
    if (mask_path && !(fm = fopen(mask_path, "wb"))) die("%s: %s", mask_path, strerror(errno));

    char *line = NULL;
    size_t line_cap = 0;
    ssize_t len;
    long lineno = 0, n_text = 0, n_chat = 0;
    uint64_t n_ids = 0, n_bytes = 0, n_text_ids = 0, n_reply = 0;
    ids_buf b = {0}, tmp = {0};
    uint16_t *u16 = NULL;
    unsigned char *mask = NULL;
    size_t u_cap = 0;
    while ((len = getline(&line, &line_cap, fi)) > 0) {
        lineno++;
        json_doc *d = json_parse(line, (size_t)len, &err);
        if (!d) die("%s:%ld: %s", in, lineno, err.msg);
        const json_value *r = json_root(d), *text = json_get(r, "text"), *msgs = json_get(r, "messages"),
                         *tools = json_get(r, "tools");
        b.n = 0;
        if (text && text->type == JSON_STRING) {
            if (tokenizer_encode(tok, text->str, text->len, 0, &b.ids, &b.n, &b.cap, &err))
                die("%s:%ld: %s", in, lineno, err.msg);
            if (b.n == b.cap) {
                b.cap = b.cap ? 2 * b.cap : 256;
                b.ids = realloc(b.ids, b.cap * sizeof *b.ids);
                if (!b.ids) die("out of memory");
            }
            b.ids[b.n++] = sep;
            n_text++;
            n_text_ids += b.n - 1; /* the separator not counted */
            n_bytes += text->len;
        } else if (msgs && msgs->type == JSON_ARRAY) {
            int think = 0;
            const json_value *th = json_get(r, "think");
            if (th && th->type == JSON_BOOL) think = th->b;
            if (render_ids(tok, msgs, msgs->len, think, 0, tools, &b, &err)) die("%s:%ld: %s", in, lineno, err.msg);
            n_chat++;
        } else {
            die("%s:%ld: %s", in, lineno, "expected {\"text\": ...} or {\"messages\": [...]}");
        }
        if (b.n > u_cap) {
            u_cap = b.n * 2;
            u16 = realloc(u16, u_cap * sizeof *u16);
            mask = realloc(mask, u_cap);
            if (!u16 || !mask) die("out of memory");
        }
        for (size_t k = 0; k < b.n; k++) {
            uint32_t v = (uint32_t)b.ids[k];
            unsigned char le[2] = {(unsigned char)(v & 0xff), (unsigned char)(v >> 8)};
            memcpy(&u16[k], le, 2); /* little-endian whatever the host */
        }
        if (fwrite(u16, sizeof *u16, b.n, fo) != b.n) die("%s: %s", out, strerror(errno));
        if (fm) {
            memset(mask, msgs && !text ? 0 : 1, b.n);
            if (msgs && !text) {
                /* reply k: from the end of the prompt up to messages[0..k] */
                for (size_t k = 0; k < msgs->len; k++) {
                    const char *role = json_get_str(msgs->items[k], "role");
                    if (!role || strcmp(role, "assistant")) continue;
                    const json_value *th = json_get(r, "think");
                    int think = th && th->type == JSON_BOOL && th->b;
                    tmp.n = 0;
                    if (render_ids(tok, msgs, k, think, 1, tools, &tmp, &err)) die("%s:%ld: %s", in, lineno, err.msg);
                    size_t from = tmp.n;
                    tmp.n = 0;
                    if (render_ids(tok, msgs, k + 1, think, 0, tools, &tmp, &err)) die("%s:%ld: %s", in, lineno, err.msg);
                    /* the prefix property that generation relies on */
                    if (tmp.n > b.n || memcmp(tmp.ids, b.ids, tmp.n * sizeof *tmp.ids))
                        die("%s:%ld: %s", in, lineno, "rendering is not prefix-stable");
                    memset(mask + from, 1, tmp.n - from);
                    n_reply += tmp.n - from;
                }
            }
            if (fwrite(mask, 1, b.n, fm) != b.n) die("%s: %s", mask_path, strerror(errno));
        }
        n_ids += b.n;
        json_free(d);
    }
    if (ferror(fi)) die("%s: %s", in, "read error");
    if (fclose(fo) || (fm && fclose(fm))) die("%s: %s", out, strerror(errno));
    fclose(fi);
    printf("corpus_ids: %s -> %s: %ld documents (%llu bytes, %llu ids, %.3f bytes/token), %ld conversations "
           "(%llu ids%s), %llu ids in all\n",
           in, out, n_text, (unsigned long long)n_bytes, (unsigned long long)n_text_ids,
           n_text_ids ? (double)n_bytes / (double)n_text_ids : 0.0, n_chat,
           (unsigned long long)(n_ids - n_text_ids - (uint64_t)n_text), fm ? ", reply ids counted in the mask" : "",
           (unsigned long long)n_ids);
    if (recut_values)
        printf("corpus_ids: --recut-values: of %ld string argument values, %ld written with the message's pieces "
               "(%ld of them differ from the canonical cut); counted once per render, the mask renders included\n",
               n_values, n_recut, n_recut_changed);
    if (fm)
        printf("corpus_ids: mask: %llu assistant-reply ids in the conversations\n", (unsigned long long)n_reply);
    free(line);
    free(b.ids);
    free(tmp.ids);
    free(u16);
    free(mask);
    tokenizer_free(tok);
    return 0;
}
