/* server_grammar.c - constrained decoding for the server: which requests
 * get a grammar, compiling it while the request is validated (so a schema
 * the engine cannot guarantee is a 400 naming the keyword), and the
 * matcher driving the worker's generation loop (gen_constraint).
 *
 * Every API arrives here in chat form (chat_options: tools, tool_choice,
 * response_format; server_anthropic.c and server_responses.c convert):
 *   - tool_choice "required" (Anthropic any) or naming a function
 *     ({"type":"function","function":{"name":N}}, Anthropic {"type":"tool"})
 *     -> the reply is calls only, each argument list valid against its
 *     tool's parameters; one call when the tool is named or
 *     parallel_tool_calls is false (Anthropic disable_parallel_tool_use);
 *   - response_format json_schema (strict or not: it asks for the shape)
 *     or json_object -> the content is one JSON value of that schema / any
 *     JSON object;
 *   - tools with strict: true and tool_choice auto -> free text, and any
 *     call of a strict tool has valid arguments (other tools' arguments
 *     are free).
 * tool_choice "none" keeps response_format only.  Nothing else is
 * constrained: tools offered without a guarantee are rendered as before
 * and their schemas are never compiled (no agent request is refused for a
 * keyword it did not ask to be enforced).
 */
#include "server_impl.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static int gram_str_is(const json_value *v, const char *s)
{
    return v && v->type == JSON_STRING && !strcmp(v->str, s);
}

static const char *fn_name(const json_value *tool, const json_value **params, int *strict)
{
    const json_value *fn = json_get(tool, "function");
    if (!fn) return NULL;
    *params = json_get(fn, "parameters");
    if (*params && (*params)->type == JSON_NULL) *params = NULL;
    const json_value *st = json_get(fn, "strict");
    *strict = st && st->type == JSON_BOOL && st->b;
    return json_get_str(fn, "name");
}

int job_constraint(srv *S, job *j, const chat_options *co, rq_err *e)
{
    (void)S;
    const json_value *tc = co->tool_choice, *rf = co->response_format, *tools = co->tools;
    size_t n_tools = tools && tools->type == JSON_ARRAY ? tools->len : 0;
    const char *named = NULL;
    int forced = 0, any_strict = 0;
    if (tc && tc->type == JSON_STRING && !strcmp(tc->str, "required")) forced = 1;
    if (tc && tc->type == JSON_OBJECT) {
        const json_value *fn = json_get(tc, "function");
        named = fn ? json_get_str(fn, "name") : NULL;
        if (!named) return rq_fail(e, 400, "tool_choice", "tool_choice: expected {\"type\": \"function\", \"function\": "
                                   "{\"name\": ...}}");
        forced = 1;
    }
    int none = tc && tc->type == JSON_STRING && !strcmp(tc->str, "none");
    gr_tool *gt = xcalloc(n_tools ? n_tools : 1, sizeof *gt);
    int n = 0, rc = -1;
    for (size_t i = 0; i < n_tools; i++) {
        const json_value *params = NULL;
        int strict = 0;
        const char *name = fn_name(tools->items[i], &params, &strict);
        if (!name) continue;
        any_strict |= strict;
        if (named && strcmp(named, name)) continue;
        gt[n++] = (gr_tool){name, params, params, strict};
    }
    gr_reply_spec sp = {0};
    sp.thinking = j->think;
    const char *param = "tool_choice";
    if (forced && !none) {
        if (named && !n) {
            rc = rq_fail(e, 400, "tool_choice", "tool_choice names \"%.*s\", which is not among the tools",
                         (int)utf8_cut(named, strlen(named), 80), named);
            goto out;
        }
        if (!n) {
            rc = rq_fail(e, 400, "tool_choice", "tool_choice \"required\" needs tools");
            goto out;
        }
        sp.kind = GR_REPLY_TOOLS;
        sp.single = named != NULL || j->single_call;
        param = "tools";
    } else if (rf && rf->type == JSON_OBJECT && (gram_str_is(json_get(rf, "type"), "json_schema") ||
                                                 gram_str_is(json_get(rf, "type"), "json_object"))) {
        sp.kind = GR_REPLY_JSON;
        param = "response_format";
        if (gram_str_is(json_get(rf, "type"), "json_schema")) {
            const json_value *js = json_get(rf, "json_schema");
            const json_value *schema = js ? json_get(js, "schema") : NULL;
            if (!schema) {
                rc = rq_fail(e, 400, "response_format", "response_format.json_schema.schema: missing");
                goto out;
            }
            sp.schema = sp.schema_root = schema;
            sp.path = j->api == API_RESPONSES ? "text.format.schema"
                      : j->api == API_MESSAGES ? "output_config.format.schema" : "response_format.json_schema.schema";
        }
    } else if (any_strict && !none && n_tools) {
        sp.kind = GR_REPLY_AUTO;
        sp.single = j->single_call;
        param = "tools";
    } else {
        rc = 0;
        goto out;
    }
    sp.tools = gt;
    sp.n_tools = n;
    df_error err = {0};
    if (gr_reply_grammar(&sp, &j->grammar, &err)) {
        /* named as the API the request came in spells it */
        const char *fmt = j->api == API_RESPONSES ? "text.format" : j->api == API_MESSAGES ? "output_config.format"
                                                                                            : "response_format";
        if (sp.kind == GR_REPLY_JSON) param = j->api == API_RESPONSES ? "text.format"
                                              : j->api == API_MESSAGES ? "output_config" : "response_format";
        rc = rq_fail(e, 400, param, "%s: %s", sp.kind == GR_REPLY_JSON ? fmt : "tools", err.msg);
        goto out;
    }
    rc = 0;
out:
    free(gt);
    return rc;
}
