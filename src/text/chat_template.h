/* chat_template.h - K3's XTML chat template (spec section 10): rendering an
 * OpenAI-style conversation to token segments and ids, and parsing the
 * model's output back into reasoning, content and tool calls.
 *
 * Owns: the template (building blocks open/close/sysmsg, message order, tool
 * declarations, typed tool-call arguments, tool results reordered to the call
 * order, thinking on/off and effort, tool_choice / response_format system
 * messages, the generation prompt); segment-wise encoding; the incremental
 * output parser; converting parsed arguments back to an OpenAI arguments
 * string.  Does not own: tokenization (tokenizer.h), HTTP or request JSON
 * beyond the message/tool trees, images (K3 here is text-only: image parts
 * are an error).
 * Invariants: a control segment is exactly one special-token spelling and
 * is the only place a special id can come from; user text containing
 * "<|open|>" stays ordinary BPE.  Each segment is encoded on its own, empty
 * segments are dropped.  Parser text deltas are whole UTF-8 characters and
 * never contain a recognised tag; malformed output degrades to text, never
 * to an error.
 * Thread-safety: rendering and encoding are reentrant; a chat_parser belongs
 * to one thread.  Allocation: rendering and encoding allocate; the parser
 * reserves its buffers in chat_parser_new and grows one only for a reply
 * beyond them, or parses an object/array-typed tool argument (see there);
 * otherwise feeding tokens allocates nothing.
 */
#ifndef DF_CHAT_TEMPLATE_H
#define DF_CHAT_TEMPLATE_H

#include <stddef.h>
#include <stdint.h>
#include "df_error.h"
#include "json.h"
#include "tokenizer.h"

/* ---- rendering ---------------------------------------------------------- */

typedef struct chat_segment {
    const char *text;  /* NUL-terminated; len is authoritative (JSON text may hold NUL) */
    size_t len;
    int control;       /* 1: a special spelling, encoded with allow_special = 1 */
} chat_segment;

struct chat_text_block;

typedef struct chat_segments {
    chat_segment *seg;
    size_t n;
    size_t cap_;                    /* private */
    struct chat_text_block *text_;  /* private: owns the copied texts */
} chat_segments;

typedef struct chat_options {
    int thinking;                      /* 1: open("think") prompt, assistant reasoning rendered */
    const char *thinking_effort;       /* "low", "high", "max", or NULL (no effort message);
                                          checked only when thinking is on, like chat.rs */
    int add_generation_prompt;
    const json_value *tools;           /* request "tools" (any JSON; falsy = none) or NULL */
    const json_value *tool_choice;     /* NULL, null, "auto", "none", "required" */
    const json_value *response_format; /* NULL, null, {"type": "text"|"json_object"|"json_schema", ...} */
} chat_options;

/* thinking = 1, effort "max" (Kimi's apply_chat_template default),
 * add_generation_prompt = 1, no tools/tool_choice/response_format. */
void chat_options_init(chat_options *o);

/* Render a JSON array of messages.  The json trees are only read during the
 * call; *out owns copies of every text.  Bad input fails with DF_ERR_ARG
 * (DF_ERR_UNSUPPORTED for images and named tool_choice) and a message naming
 * the message index and field; err->pos is the value's byte offset in the
 * JSON text the tree came from. */
int chat_render(const json_value *messages, const chat_options *opt, chat_segments **out, df_error *err);
void chat_segments_free(chat_segments *s);
/* The segments concatenated (what the template "looks like"); xmalloc'd,
 * NUL-terminated, *len may be NULL. */
char *chat_segments_join(const chat_segments *s, size_t *len);

/* Append the ids of all segments to the growable array (*ids, *n, *cap), as
 * tokenizer_encode does: ordinary segments with allow_special = 0, each on
 * its own; a control segment must be a known special spelling. */
int chat_encode(const tokenizer *t, const chat_segments *s, int32_t **ids, size_t *n, size_t *cap,
                df_error *err);

/* ---- tool-call arguments ------------------------------------------------ */

enum chat_arg_type {
    CHAT_ARG_STRING,
    CHAT_ARG_NUMBER,
    CHAT_ARG_BOOLEAN,
    CHAT_ARG_NULL,
    CHAT_ARG_OBJECT,
    CHAT_ARG_ARRAY,
};

/* "string", "number", ... (the type="" attribute spelling). */
const char *chat_arg_type_name(enum chat_arg_type t);

typedef struct chat_arg {
    const char *key;
    size_t key_len;
    enum chat_arg_type type;
    const char *value;   /* as rendered: strings raw, other types JSON text */
    size_t value_len;
} chat_arg;

/* The OpenAI "arguments" string for a call: a compact JSON object in argument
 * order; strings quoted, other types copied as JSON when the text parses as
 * JSON of that type, quoted as a string when it does not (malformed model
 * output).  xmalloc'd, NUL-terminated; *len may be NULL. */
char *chat_args_to_json(const chat_arg *args, size_t n, size_t *len);

/* ---- output parser ------------------------------------------------------ */

enum chat_event_type {
    CHAT_EV_REASONING,   /* text: reasoning delta */
    CHAT_EV_CONTENT,     /* text: content delta */
    CHAT_EV_CALL_BEGIN,  /* name: tool name; index: 0-based call number in this message */
    CHAT_EV_CALL_ARG,    /* name: key; arg_type; text: the whole value (strings raw, else JSON) */
    CHAT_EV_CALL_JSON,   /* text: a raw JSON block (arguments that were not valid JSON) */
    CHAT_EV_CALL_END,    /* name, index; text: the call's OpenAI arguments string: the raw
                            JSON block if the call had one and no arguments, else
                            chat_args_to_json of its arguments ("{}" for none) */
    CHAT_EV_END,         /* <|end_of_msg|>: the message is complete */
};

typedef struct chat_event {
    enum chat_event_type type;
    const char *text;    /* NUL-terminated; "" when unused */
    size_t len;
    const char *name;    /* NUL-terminated; "" when unused */
    size_t name_len;
    enum chat_arg_type arg_type;
    int index;
} chat_event;

typedef struct chat_parser chat_parser;

/* start_in_think: 1 when the prompt ended with <|open|>think<|sep|>, 0 for
 * <|open|>response<|sep|>.  The tokenizer must outlive the parser. */
int chat_parser_new(const tokenizer *t, int start_in_think, chat_parser **out, df_error *err);
void chat_parser_free(chat_parser *p);
void chat_parser_reset(chat_parser *p, int start_in_think);

/* Feed one generated id.  Returns the number of events and points *ev at
 * them; events and their texts stay valid until the next feed/finish/reset.
 * Text deltas of one kind within one call are merged.  Ids outside the
 * vocabulary are ignored; everything after <|end_of_msg|> is ignored. */
size_t chat_parser_feed(chat_parser *p, int32_t id, const chat_event **ev);
/* The stream stopped without <|end_of_msg|> (length limit, stop string):
 * flush held-back bytes (as U+FFFD), drop an unfinished tag (markup cut
 * short is not text), emit an open argument / JSON block and CALL_END for
 * an open call.  No END event. */
size_t chat_parser_finish(chat_parser *p, const chat_event **ev);
/* 1 after <|end_of_msg|>. */
int chat_parser_done(const chat_parser *p);
/* The XTML (control spellings and tag words, to encode with allow_special
 * = 1) that closes the assistant message from the parser's current state,
 * e.g. "<|close|>response<|sep|><|close|>message<|sep|><|end_of_msg|>";
 * "" when the message is complete.  Used when a generation is interrupted
 * so that the conversation state stays well-formed. */
const char *chat_parser_closing(const chat_parser *p);

#endif
