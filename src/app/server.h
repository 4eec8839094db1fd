/* server.h - `deltafin serve`: the HTTP front end (L5, like cli.c).
 *
 * OpenAI (chat completions, completions, responses) and Anthropic (messages) APIs over
 * libmicrohttpd, streaming as SSE, one inference worker that owns the
 * session.  server.c documents the threading and the request rules.
 */
#ifndef DF_SERVER_H
#define DF_SERVER_H

#include <stddef.h>

typedef struct tokenizer tokenizer;

/* argv as main got it (argv[1] = "serve"); returns the process exit code. */
int cmd_serve(int argc, char **argv);

/* What request validation needs of a server: the tokenizer (borrowed, must
 * outlive the call), the context length, the max_tokens ceiling and the
 * model name echoed back (NULL: "deltafin"). */
typedef struct server_limits {
    tokenizer *tok;
    int n_ctx, max_tokens_cap;
    const char *name;
} server_limits;

enum { SERVER_EP_CHAT, SERVER_EP_COMPLETIONS, SERVER_EP_MESSAGES, SERVER_EP_RESPONSES };

/* Validates BODY (LEN bytes, need not end in NUL) as a POST to ENDPOINT
 * (SERVER_EP_*) would be, without HTTP, queue or model: parse, field checks,
 * chat template, tokenization.  Returns the HTTP status: 200 when the request
 * would be queued (*n_ids, if not NULL, is the prompt's token count and
 * *err_body is NULL), else the error status and *err_body the API-shaped JSON
 * error body (NUL-terminated; the caller frees it). */
int server_parse_request(const server_limits *lim, int endpoint, const char *body, size_t len, char **err_body,
                         size_t *n_ids);

#endif
