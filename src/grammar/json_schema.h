/* json_schema.h - JSON Schema compiled to grammar machines (L1), and the
 * whole constrained reply in K3's markup (constraint.c).
 *
 * Two forms of a value:
 *  - JSON text (response_format, output_config.format, text.format): the
 *    value with JSON whitespace (between tokens: none, a space, or a
 *    newline and at most JS_MAX_WS spaces or tabs);
 *  - K3's tool-call arguments: an object schema as a sequence of
 *    <|open|>argument key="K" type="T"<|sep|>VALUE<|close|>argument<|sep|>,
 *    a string VALUE raw (its characters as UTF-8, no quotes or escapes),
 *    any other as JSON text; `type` names the value's JSON type ("number"
 *    for integers too), as chat_template.c renders and parses them.
 *
 * The supported subset, what the generated text satisfies, and the
 * keywords refused are in json_schema.c's design comment.  Every error
 * names the keyword and where it is (a JSON pointer into the schema).
 */
#ifndef DF_JSON_SCHEMA_H
#define DF_JSON_SCHEMA_H

#include "df_error.h"
#include "grammar.h"
#include "json.h"

#define JS_MAX_WS 16
#define JS_MAX_KEY 64

typedef struct js_compiler js_compiler;

/* A compiler adding machines to b for schemas within root (the document
 * $ref resolves against; borrowed until js_compiler_free). */
js_compiler *js_compiler_new(gr_builder *b, const json_value *root);
void js_compiler_free(js_compiler *c);
/* A machine producing one JSON value valid against schema (a node inside
 * root, or root itself; NULL = any JSON value); path names it in errors
 * (e.g. "response_format.json_schema.schema").  Returns the machine, or -1
 * with err set. */
int js_value(js_compiler *c, const json_value *schema, const char *path, df_error *err);
/* A machine producing an object schema's arguments in K3's markup. */
int js_arguments(js_compiler *c, const json_value *schema, const char *path, df_error *err);

/* An attribute value as K3's template escapes it (& -> &amp;, " -> &quot;). */
struct json_buf;
void js_attr_escape(struct json_buf *jb, const char *s);

/* ---- the reply (constraint.c) -------------------------------------------- */

enum gr_reply_kind {
    GR_REPLY_JSON,  /* response content is one JSON value (schema or any object) */
    GR_REPLY_TOOLS, /* the reply is tool calls only */
    GR_REPLY_AUTO,  /* free text, then calls or none: the strict tools' arguments constrained */
};

typedef struct gr_tool {
    const char *name;          /* the tool's name as the template renders it */
    const json_value *params;  /* its parameters / input_schema (NULL: none) */
    const json_value *root;    /* the document params' $refs resolve in (NULL: params) */
    int strict;                /* GR_REPLY_AUTO: its arguments follow params (else any arguments) */
} gr_tool;

typedef struct gr_reply_spec {
    enum gr_reply_kind kind;
    int thinking;              /* the prompt ends inside <|open|>think<|sep|>: reasoning first, free */
    /* JSON */
    const json_value *schema;  /* NULL: any JSON object (json_object) */
    const json_value *schema_root;
    const char *path;          /* for errors, e.g. "response_format.json_schema.schema" */
    /* TOOLS: calls of these tools (one when single) */
    const gr_tool *tools;
    int n_tools;
    int single;                /* exactly one call; else one or more */
} gr_reply_spec;

/* The grammar of the whole reply after the generation prompt: with
 * thinking, free reasoning then <|close|>think<|sep|><|open|>response<|sep|>;
 * then the JSON value and <|close|>response<|sep|>, or an empty response
 * and <|open|>tools<|sep|> calls <|close|>tools<|sep|>; then
 * <|close|>message<|sep|><|end_of_msg|>. */
int gr_reply_grammar(const gr_reply_spec *spec, gr_grammar **out, df_error *err);

struct tokenizer;
/* The tokenizer's vocabulary for matchers: ordinary tokens by their bytes,
 * K3's four template specials as GR_SYM_*, every other special never. */
gr_vocab *gr_vocab_from_tokenizer(const struct tokenizer *t);

#endif
