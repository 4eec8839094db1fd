/* fuzz_server_request.c - libFuzzer target for `deltafin serve`'s request
 * validation (server_parse_request): the first byte picks the endpoint
 * (chat completions, completions, messages, responses; mod 4: the seeds
 * written for three endpoints start with 0, 1 or 2 and keep theirs), the
 * rest is the body.
 * Validation must either accept the request (a non-empty prompt that fits
 * the context) or return a 4xx whose body is valid UTF-8 (checked byte by
 * byte, before and apart from the JSON parse) and API-shaped JSON: OpenAI's
 * {"error":{"message","type","param","code"}} (responses too), Anthropic's
 * {"type":"error","error":{"type","message"}}.  The tokenizer of the tiny
 * test model (testdata/k3-tiny-a/checkpoint, or $DELTAFIN_FUZZ_MODEL) is
 * loaded once.
 * Only server_request.c and server_emit.c are linked: validation needs no
 * HTTP, worker, engine or command line, so nothing is stubbed. */
#include "json.h"
#include "server.h"
#include "tokenizer.h"
#include "util.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

enum { N_CTX = 2048, MAX_TOKENS_CAP = 1024 };

static tokenizer *fuzz_tok(void)
{
    static tokenizer *tok;
    if (!tok) {
        const char *dir = getenv("DELTAFIN_FUZZ_MODEL");
        df_error err = {0};
        if (tokenizer_load(dir ? dir : "testdata/k3-tiny-a/checkpoint", &tok, &err)) {
            fprintf(stderr, "fuzz_server_request: cannot load the tokenizer (run from the repository root): %s\n",
                    err.msg);
            abort();
        }
    }
    return tok;
}

static void check_error_shape(int endpoint, int status, const char *body)
{
    if (status < 400 || status > 499 || !body) abort();
    /* an error quoting request text must not cut it inside a character */
    if (!utf8_valid(body, strlen(body))) {
        fprintf(stderr, "fuzz_server_request: error body is not UTF-8: %s\n", body);
        abort();
    }
    df_error err = {0};
    json_doc *d = json_parse(body, strlen(body), &err);
    if (!d) {
        fprintf(stderr, "fuzz_server_request: error body is not JSON (%s): %s\n", err.msg, body);
        abort();
    }
    const json_value *root = json_root(d);
    if (root->type != JSON_OBJECT) abort();
    const json_value *e = json_get(root, "error");
    if (!e || e->type != JSON_OBJECT) abort();
    const json_value *msg = json_get(e, "message"), *type = json_get(e, "type");
    if (!msg || msg->type != JSON_STRING || !msg->str[0] || !type || type->type != JSON_STRING) abort();
    if (endpoint == SERVER_EP_MESSAGES) {
        const json_value *t = json_get(root, "type");
        if (!t || t->type != JSON_STRING || strcmp(t->str, "error")) abort();
    } else if (!json_get(e, "param") || !json_get(e, "code")) {
        abort();
    }
    json_free(d);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    server_limits lim = {.tok = fuzz_tok(), .n_ctx = N_CTX, .max_tokens_cap = MAX_TOKENS_CAP, .name = "fuzz"};
    int endpoint = data[0] % 4;
    char *err_body = NULL;
    size_t n_ids = 0;
    int status = server_parse_request(&lim, endpoint, (const char *)data + 1, size - 1, &err_body, &n_ids);
    if (status == 200) {
        if (err_body || n_ids == 0 || n_ids >= N_CTX) abort();
    } else {
        check_error_shape(endpoint, status, err_body);
    }
    free(err_body);
    return 0;
}
