/* constraint.c - the grammar of a whole constrained reply in K3's markup
 * (see json_schema.h, gr_reply_grammar).
 *
 * The markup mirrors chat_template.c's rendering of an assistant message
 * (open/close tags as <|open|>TAG<|sep|> and <|close|>TAG<|sep|>, attribute
 * values escaped & -> &amp;, " -> &quot;), so chat_template's output parser
 * reads a constrained reply as it reads any other: content for JSON,
 * tool-call events with typed arguments for tools.  The reasoning before a
 * constrained reply is free (any ordinary token; <|close|> ends it): the
 * constraint starts when it ends.  A forced tool reply has an empty
 * response block (the OpenAI and Anthropic APIs return no text with a
 * forced call), then the calls, numbered from 1 (index="1"...; past 9 calls
 * any two-digit index is allowed).
 */
#include "json_schema.h"
#include "json_write.h"
#include "tokenizer.h"
#include "util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int tag(gr_builder *b, int m, int from, int sym, const char *name)
{
    int s = gr_state(b, m), t = gr_state(b, m), u = gr_state(b, m);
    gr_sym(b, m, from, s, sym, 0);
    gr_lit(b, m, s, t, name, strlen(name));
    gr_sym(b, m, t, u, GR_SYM_SEP, 0);
    return u;
}

/* one call of any of the tools: <|open|>call tool="NAME" index="I"<|sep|>ARGS<|close|>call<|sep|> */
static int call_machine(gr_builder *b, const gr_reply_spec *sp, df_error *err)
{
    int m = gr_machine(b, "tool call");
    int s = gr_state(b, m);
    gr_sym(b, m, 0, s, GR_SYM_OPEN, 0);
    int body = gr_state(b, m);
    json_buf jb;
    json_buf_init(&jb);
    for (int i = 0; i < sp->n_tools; i++) {
        const gr_tool *t = &sp->tools[i];
        int constrained = sp->kind != GR_REPLY_AUTO || t->strict;
        js_compiler *c = js_compiler_new(b, constrained ? (t->root ? t->root : t->params) : NULL);
        char path[300];
        snprintf(path, sizeof path, "tools[%s].parameters", t->name);
        int args = js_arguments(c, constrained ? t->params : NULL, path, err);
        js_compiler_free(c);
        if (args < 0) {
            json_buf_free(&jb);
            return -1;
        }
        jb.len = 0;
        json_buf_puts(&jb, "call tool=\"");
        js_attr_escape(&jb, t->name);
        json_buf_puts(&jb, "\" index=\"");
        int h = gr_state(b, m);
        gr_lit(b, m, s, h, jb.p, jb.len);
        int d = gr_state(b, m);
        if (sp->single) {
            gr_sym(b, m, h, d, '1', 0);
        } else {
            gr_range(b, m, h, d, '1', '9', 0);
            int d2 = gr_state(b, m);
            gr_range(b, m, h, d2, '1', '9', 0);
            gr_range(b, m, d2, d, '0', '9', 0);
        }
        int q = gr_state(b, m), a = gr_state(b, m);
        gr_sym(b, m, d, q, '"', 0);
        gr_sym(b, m, q, a, GR_SYM_SEP, 0);
        gr_call(b, m, a, body, args, 0);
    }
    json_buf_free(&jb);
    int e = tag(b, m, body, GR_SYM_CLOSE, "call");
    gr_accept(b, m, e);
    return m;
}

int gr_reply_grammar(const gr_reply_spec *sp, gr_grammar **out, df_error *err)
{
    *out = NULL;
    gr_builder *b = gr_builder_new();
    int top = gr_machine(b, "reply");
    int at = 0;
    if (sp->thinking) {
        gr_range(b, top, 0, 0, 0, 255, 0); /* reasoning: any text */
        at = tag(b, top, 0, GR_SYM_CLOSE, "think");
        at = tag(b, top, at, GR_SYM_OPEN, "response");
    }
    int rc = -1;
    if (sp->kind == GR_REPLY_JSON) {
        js_compiler *c = js_compiler_new(b, sp->schema_root ? sp->schema_root : sp->schema);
        int v;
        if (sp->schema) {
            v = js_value(c, sp->schema, sp->path ? sp->path : "schema", err);
        } else {
            /* json_object: any object */
            static const char obj[] = "{\"type\":\"object\"}";
            json_doc *d = json_parse(obj, sizeof obj - 1, err);
            v = d ? js_value(c, json_root(d), "response_format", err) : -1;
            /* machines copy what they need: the document can go */
            json_free(d);
        }
        js_compiler_free(c);
        if (v < 0) goto done;
        int s1 = gr_state(b, top), s2 = gr_state(b, top);
        gr_call(b, top, at, s1, v, 0);
        /* at most one newline after the value */
        gr_eps(b, top, s1, s2);
        gr_sym(b, top, s1, s2, '\n', 0);
        at = tag(b, top, s2, GR_SYM_CLOSE, "response");
    } else if (sp->kind == GR_REPLY_AUTO) {
        /* free text (no special), then the message ends or calls follow */
        int txt = gr_state(b, top);
        gr_eps(b, top, at, txt);
        gr_range(b, top, txt, txt, 0, 255, 0);
        at = tag(b, top, txt, GR_SYM_CLOSE, "response");
        int fin = gr_state(b, top);
        gr_eps(b, top, at, fin);
        if (sp->n_tools > 0) {
            int call = call_machine(b, sp, err);
            if (call < 0) goto done;
            int t0 = tag(b, top, at, GR_SYM_OPEN, "tools");
            int c1 = gr_state(b, top);
            gr_call(b, top, t0, c1, call, 0);
            if (!sp->single) gr_call(b, top, c1, c1, call, 0);
            int t1 = tag(b, top, c1, GR_SYM_CLOSE, "tools");
            gr_eps(b, top, t1, fin);
        }
        at = fin;
    } else {
        if (sp->n_tools <= 0) {
            df_err_set(err, DF_ERR_ARG, -1, "a forced tool call needs at least one tool");
            goto done;
        }
        int call = call_machine(b, sp, err);
        if (call < 0) goto done;
        at = tag(b, top, at, GR_SYM_CLOSE, "response");
        at = tag(b, top, at, GR_SYM_OPEN, "tools");
        int c1 = gr_state(b, top);
        gr_call(b, top, at, c1, call, 0);
        if (!sp->single) gr_call(b, top, c1, c1, call, 0);
        at = tag(b, top, c1, GR_SYM_CLOSE, "tools");
    }
    at = tag(b, top, at, GR_SYM_CLOSE, "message");
    int end = gr_state(b, top);
    gr_sym(b, top, at, end, GR_SYM_EOM, 0);
    gr_accept(b, top, end);
    rc = gr_build(b, top, out, err);
done:
    gr_builder_free(b);
    return rc;
}

gr_vocab *gr_vocab_from_tokenizer(const tokenizer *t)
{
    int n = tokenizer_n_vocab(t);
    const char **bytes = xcalloc((size_t)n, sizeof *bytes);
    size_t *len = xcalloc((size_t)n, sizeof *len);
    int *special = xcalloc((size_t)n, sizeof *special);
    static const char *const names[4] = {"<|open|>", "<|close|>", "<|sep|>", "<|end_of_msg|>"};
    int32_t ids[4];
    for (int k = 0; k < 4; k++) ids[k] = tokenizer_special_id(t, names[k]);
    for (int i = 0; i < n; i++) {
        special[i] = -1;
        if (tokenizer_is_special(t, i)) {
            special[i] = -2;
            for (int k = 0; k < 4; k++)
                if (ids[k] == i) special[i] = GR_SYM_OPEN + k;
            continue;
        }
        bytes[i] = tokenizer_token_bytes(t, i, &len[i]);
        if (!bytes[i]) special[i] = -2;
    }
    gr_vocab *v = gr_vocab_new(n, bytes, len, special);
    free(bytes);
    free(len);
    free(special);
    return v;
}
