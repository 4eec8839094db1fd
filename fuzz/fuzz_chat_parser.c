/* fuzz_chat_parser.c - libFuzzer target for the chat output parser: the
 * first byte picks the start (think / response), then every 2 bytes are one
 * token id (little endian, modulo the vocabulary plus a few out-of-range
 * ids).  The parser must never crash and must keep the stream invariants of
 * fuzz_check_events, including after chat_parser_finish.  The fixture
 * tokenizer comes from DF_TESTDATA (default "testdata")/k3-tiny-a/checkpoint. */
#include "chat_template.h"
#include "tokenizer.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

static tokenizer *fuzz_tok;

static const tokenizer *fuzz_tokenizer(void)
{
    if (!fuzz_tok) {
        const char *d = getenv("DF_TESTDATA");
        char dir[4096];
        snprintf(dir, sizeof dir, "%s/k3-tiny-a/checkpoint", d && *d ? d : "testdata");
        df_error err = {0};
        if (tokenizer_load(dir, &fuzz_tok, &err)) {
            fprintf(stderr, "fuzz: cannot load the fixture tokenizer: %s\n", err.msg);
            abort();
        }
    }
    return fuzz_tok;
}

static int fuzz_utf8_valid(const char *s, size_t n)
{
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        unsigned c = u[i];
        size_t k = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        if (!k || i + k > n) return 0;
        unsigned cp = k == 1 ? c : k == 2 ? c & 0x1f : k == 3 ? c & 0x0f : c & 0x07;
        for (size_t j = 1; j < k; j++) {
            if ((u[i + j] & 0xc0) != 0x80) return 0;
            cp = cp << 6 | (u[i + j] & 0x3f);
        }
        if ((k == 2 && cp < 0x80) || (k == 3 && cp < 0x800) || (k == 4 && (cp < 0x10000 || cp > 0x10ffff)) ||
            (cp >= 0xd800 && cp <= 0xdfff))
            return 0;
        i += k;
    }
    return 1;
}

/* The invariants every event stream must keep (fuzz_chat_render.c includes
 * this file for them, with FUZZ_CHAT_NO_ENTRY defined). */
typedef struct fuzz_stream {
    int begun, ended, done;
} fuzz_stream;

static void fuzz_check_events(fuzz_stream *s, const chat_event *ev, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        const chat_event *e = &ev[i];
        if (s->done) abort();
        if (!e->text || !e->name || e->text[e->len] || e->name[e->name_len]) abort();
        switch (e->type) {
        case CHAT_EV_REASONING:
        case CHAT_EV_CONTENT:
            if (!e->len || !fuzz_utf8_valid(e->text, e->len)) abort();
            break;
        case CHAT_EV_CALL_BEGIN:
            if (s->begun != s->ended || e->index != s->ended) abort();
            s->begun++;
            break;
        case CHAT_EV_CALL_ARG:
        case CHAT_EV_CALL_JSON:
            if (s->begun != s->ended + 1 || e->index != s->ended) abort();
            if (!fuzz_utf8_valid(e->text, e->len) || !fuzz_utf8_valid(e->name, e->name_len)) abort();
            break;
        case CHAT_EV_CALL_END:
            if (s->begun != s->ended + 1 || e->index != s->ended) abort();
            s->ended++;
            break;
        case CHAT_EV_END:
            if (s->begun != s->ended) abort();
            s->done = 1;
            break;
        default: abort();
        }
    }
}

#ifndef FUZZ_CHAT_NO_ENTRY
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!size) return 0;
    const tokenizer *t = fuzz_tokenizer();
    int nv = tokenizer_n_vocab(t);
    chat_parser *p;
    df_error err = {0};
    if (chat_parser_new(t, data[0] & 1, &p, &err)) abort();
    fuzz_stream s = {0};
    const chat_event *ev;
    for (size_t i = 1; i + 1 < size; i += 2) {
        unsigned v = (unsigned)data[i] | (unsigned)data[i + 1] << 8;
        int32_t id = (int32_t)(v % (unsigned)(nv + 4)) - 2; /* -2..nv+1: a few ids out of range */
        size_t n = chat_parser_feed(p, id, &ev);
        fuzz_check_events(&s, ev, n);
    }
    size_t n = chat_parser_finish(p, &ev);
    fuzz_check_events(&s, ev, n);
    if (s.begun != s.ended) abort();
    if (s.done != chat_parser_done(p)) abort();
    chat_parser_free(p);
    return 0;
}
#endif
