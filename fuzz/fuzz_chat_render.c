/* fuzz_chat_render.c - libFuzzer target for the chat template: arbitrary
 * bytes as JSON.  An object is a request (messages, thinking,
 * thinking_effort, add_generation_prompt, tools, tool_choice,
 * response_format); an array is the messages with default options.
 * Rendering must succeed or fail with a message; a rendering must consist of
 * non-empty segments whose control segments are the four markers, encode
 * without error, and the encoded conversation fed to the output parser must
 * keep the parser's invariants. */
#define FUZZ_CHAT_NO_ENTRY
#include "fuzz_chat_parser.c" /* the fixture tokenizer and the stream invariants */
#include "json.h"

#include <stdint.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const tokenizer *t = fuzz_tokenizer();
    df_error err = {0};
    json_doc *d = json_parse((const char *)data, size, &err);
    if (!d) return 0;
    const json_value *root = json_root(d), *messages = root;
    chat_options o;
    chat_options_init(&o);
    if (root->type == JSON_OBJECT) {
        messages = json_get(root, "messages");
        int b;
        if (!json_get_bool(root, "thinking", &b)) o.thinking = b;
        const json_value *e = json_get(root, "thinking_effort");
        if (e) o.thinking_effort = e->type == JSON_STRING ? e->str : NULL;
        if (!json_get_bool(root, "add_generation_prompt", &b)) o.add_generation_prompt = b;
        o.tools = json_get(root, "tools");
        o.tool_choice = json_get(root, "tool_choice");
        o.response_format = json_get(root, "response_format");
    }
    chat_segments *s;
    if (chat_render(messages, &o, &s, &err)) {
        if (!err.msg[0] || s) abort();
        json_free(d);
        return 0;
    }
    for (size_t i = 0; i < s->n; i++) {
        const chat_segment *g = &s->seg[i];
        if (!g->len || g->text[g->len]) abort();
        if (g->control && strcmp(g->text, "<|open|>") && strcmp(g->text, "<|close|>") &&
            strcmp(g->text, "<|sep|>") && strcmp(g->text, "<|end_of_msg|>"))
            abort();
    }
    int32_t *ids = NULL;
    size_t n = 0, cap = 0;
    if (chat_encode(t, s, &ids, &n, &cap, &err)) abort();
    chat_parser *p;
    if (chat_parser_new(t, o.thinking, &p, &err)) abort();
    fuzz_stream st = {0};
    const chat_event *ev;
    for (size_t i = 0; i < n; i++) {
        size_t k = chat_parser_feed(p, ids[i], &ev);
        fuzz_check_events(&st, ev, k);
    }
    size_t k = chat_parser_finish(p, &ev);
    fuzz_check_events(&st, ev, k);
    chat_parser_free(p);
    free(ids);
    chat_segments_free(s);
    json_free(d);
    return 0;
}
