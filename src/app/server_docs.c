/* server_docs.c - documents in requests (L6): the three APIs' spellings of
 * a document mapped onto document.c's one rendering.
 *
 *   Anthropic  {"type": "document", "source": {"type": "base64",
 *              "media_type": "application/pdf" | "text/plain", "data": ...}
 *              | {"type": "text", "media_type": "text/plain", "data": TEXT}
 *              | {"type": "content", "content": TEXT | [text blocks]},
 *              "title"?, "context"?, "citations"?: {"enabled": false}}
 *   OpenAI     {"type": "file", "file": {"file_data": "data:TYPE;base64,..",
 *              "filename"?}} in a user message's content
 *   Responses  {"type": "input_file", "file_data": "data:TYPE;base64,..",
 *              "filename"?}
 *
 * A document by URL or by file id (Files API) is refused by name: this
 * server fetches nothing and stores no files.  Citations would need cited
 * spans in the reply, which K3 does not produce: enabled true is refused.
 * The text cap of the whole prompt still applies after rendering.
 */
#define _GNU_SOURCE
#include "server_impl.h"

static int str_is_type(const json_value *p, const char *t)
{
    const char *s = p->type == JSON_OBJECT ? json_get_str(p, "type") : NULL;
    return s && !strcmp(s, t);
}

static int doc_fail(rq_err *e, const char *param, const char *where, df_error *err)
{
    if (err->code == DF_ERR_UNSUPPORTED) e->code = "unsupported_document";
    return rq_fail(e, 400, param, "%s: %s", where, err->msg);
}

/* ---- Anthropic ------------------------------------------------------------ */

static int anth_source_content(const json_value *c, const char *w, json_buf *t, rq_err *e)
{
    if (c && c->type == JSON_STRING) {
        json_buf_put(t, c->str, c->len);
        return 0;
    }
    if (!c || c->type != JSON_ARRAY)
        return rq_fail(e, 400, "messages", "%s.source.content: expected a string or an array of text blocks", w);
    for (size_t i = 0; i < c->len; i++) {
        const char *bt = json_get_str(c->items[i], "type");
        const json_value *x = json_get(c->items[i], "text");
        if (!bt || strcmp(bt, "text") || !x || x->type != JSON_STRING)
            return rq_fail(e, 400, "messages", "%s.source.content[%zu]: expected {\"type\": \"text\", \"text\": ...} "
                           "(K3 here reads text only)", w, i);
        if (i) json_buf_puts(t, "\n\n");
        json_buf_put(t, x->str, x->len);
    }
    return 0;
}

int anth_document(srv *S, const json_value *b, const char *where, size_t k, json_buf *out, rq_err *e)
{
    static const char *const allowed[] = {"type", "source", "title", "context", "citations", "cache_control", NULL};
    char w[96];
    snprintf(w, sizeof w, "%s.content[%zu]", where, k);
    if (check_fields(b, allowed, e)) return -1;
    const json_value *src = field(b, "source"), *title = field(b, "title"), *ctx = field(b, "context"),
                     *cit = field(b, "citations");
    if ((title && title->type != JSON_STRING) || (ctx && ctx->type != JSON_STRING))
        return rq_fail(e, 400, "messages", "%s: title and context must be strings", w);
    if (cit) {
        const json_value *en = cit->type == JSON_OBJECT ? json_get(cit, "enabled") : NULL;
        if (!en || en->type != JSON_BOOL)
            return rq_fail(e, 400, "messages", "%s.citations: expected {\"enabled\": false}", w);
        if (en->b)
            return rq_fail(e, 400, "messages", "%s.citations.enabled: true is not supported (K3 here writes no cited "
                           "spans; send the document without citations)", w);
    }
    const char *st = src && src->type == JSON_OBJECT ? json_get_str(src, "type") : NULL;
    if (!st) return rq_fail(e, 400, "messages", "%s.source: expected an object with a type (base64, text or content)", w);
    const char *mt = json_get_str(src, "media_type");
    const json_value *data = json_get(src, "data");
    df_error err = {0};
    int rc;
    if (!strcmp(st, "base64")) {
        if (!mt || !data || data->type != JSON_STRING)
            return rq_fail(e, 400, "messages", "%s.source: base64 needs media_type and data", w);
        unsigned char *bytes = NULL;
        size_t nb = 0;
        char dtype[96];
        rc = doc_decode(data->str, data->len, &S->doc, dtype, sizeof dtype, &bytes, &nb, &err);
        if (!rc) rc = doc_render(&S->doc, mt, title ? title->str : NULL, ctx ? ctx->str : NULL, bytes, nb, out, NULL, &err);
        free(bytes);
    } else if (!strcmp(st, "text")) {
        if (!data || data->type != JSON_STRING)
            return rq_fail(e, 400, "messages", "%s.source: text needs data (a string)", w);
        if (mt && strncmp(mt, "text/", 5))
            return rq_fail(e, 400, "messages", "%s.source.media_type: a text source is text/plain or another text/ type", w);
        rc = doc_render(&S->doc, mt ? mt : "text/plain", title ? title->str : NULL, ctx ? ctx->str : NULL,
                        (const unsigned char *)data->str, data->len, out, NULL, &err);
    } else if (!strcmp(st, "content")) {
        json_buf t;
        json_buf_init(&t);
        rc = anth_source_content(json_get(src, "content"), w, &t, e);
        if (rc) {
            json_buf_free(&t);
            return -1;
        }
        rc = doc_render(&S->doc, "text/plain", title ? title->str : NULL, ctx ? ctx->str : NULL,
                        (const unsigned char *)(t.p ? t.p : ""), t.len, out, NULL, &err);
        json_buf_free(&t);
    } else if (!strcmp(st, "url") || !strcmp(st, "file")) {
        return rq_fail(e, 400, "messages", "%s.source.type: \"%s\" documents are not supported (this server fetches "
                       "nothing and keeps no uploaded files): send the bytes as base64 or the text", w, st);
    } else {
        return rq_fail(e, 400, "messages", "%s.source.type: expected base64, text or content", w);
    }
    return rc ? doc_fail(e, "messages", w, &err) : 0;
}

/* ---- OpenAI chat ------------------------------------------------------------ */

/* OpenAI's file_data and filename (chat file parts and Responses input_file
 * alike): checked, decoded and rendered into out.  param and w name the
 * part in errors, wd its fields' object ("x.file" or "x"). */
static int file_data(srv *S, const json_value *o, const char *param, const char *w, const char *wd, json_buf *out,
                     rq_err *e)
{
    const json_value *data = field(o, "file_data"), *name = field(o, "filename");
    if (!data || data->type != JSON_STRING)
        return rq_fail(e, 400, param, "%s.file_data: expected a string (data:TYPE;base64,DATA)", wd);
    if (name && name->type != JSON_STRING) return rq_fail(e, 400, param, "%s.filename: expected a string", wd);
    df_error err = {0};
    unsigned char *bytes = NULL;
    size_t nb = 0;
    char type[96];
    int rc = doc_decode(data->str, data->len, &S->doc, type, sizeof type, &bytes, &nb, &err);
    if (!rc) rc = doc_render(&S->doc, type, name ? name->str : NULL, NULL, bytes, nb, out, NULL, &err);
    free(bytes);
    return rc ? doc_fail(e, param, w, &err) : 0;
}

static int file_part(srv *S, const json_value *f, const char *w, json_buf *text, rq_err *e)
{
    static const char *const allowed[] = {"file_data", "filename", "file_id", NULL};
    if (!f || f->type != JSON_OBJECT)
        return rq_fail(e, 400, "messages", "%s.file: expected {\"file_data\": \"data:...;base64,...\", \"filename\": ...}", w);
    if (check_fields(f, allowed, e)) return -1;
    if (field(f, "file_id"))
        return rq_fail(e, 400, "messages", "%s.file.file_id: files by id are not supported (this server keeps no "
                       "uploaded files): send file_data", w);
    char wd[112];
    snprintf(wd, sizeof wd, "%s.file", w);
    return file_data(S, f, "messages", w, wd, text, e);
}

/* A content array with its file parts as text parts. */
static int expand_content(srv *S, const json_value *c, const char *w, json_buf *out, rq_err *e)
{
    json_buf_putc(out, '[');
    for (size_t k = 0; k < c->len; k++) {
        const json_value *p = c->items[k];
        if (k) json_buf_putc(out, ',');
        if (!str_is_type(p, "file")) {
            json_write_value(out, p, 0);
            continue;
        }
        char pw[96];
        snprintf(pw, sizeof pw, "%s.content[%zu]", w, k);
        json_buf text;
        json_buf_init(&text);
        int rc = file_part(S, json_get(p, "file"), pw, &text, e);
        if (!rc) {
            json_buf_puts(out, "{\"type\":\"text\",\"text\":");
            json_write_string(out, text.p ? text.p : "", text.len);
            json_buf_putc(out, '}');
        }
        json_buf_free(&text);
        if (rc) return -1;
    }
    json_buf_putc(out, ']');
    return 0;
}

int chat_expand_files(srv *S, const json_value *msgs, json_doc **doc, rq_err *e)
{
    *doc = NULL;
    int any = 0;
    for (size_t i = 0; i < msgs->len; i++) {
        const json_value *c = json_get(msgs->items[i], "content");
        for (size_t k = 0; c && c->type == JSON_ARRAY && k < c->len; k++)
            if (str_is_type(c->items[k], "file")) {
                const char *role = json_get_str(msgs->items[i], "role");
                if (!role || strcmp(role, "user"))
                    return rq_fail(e, 400, "messages", "messages[%zu].content[%zu]: file parts belong in user messages",
                                   i, k);
                any = 1;
            }
    }
    if (!any) return 0;
    json_buf b;
    json_buf_init(&b);
    json_buf_putc(&b, '[');
    int rc = 0;
    for (size_t i = 0; i < msgs->len && !rc; i++) {
        const json_value *m = msgs->items[i];
        if (i) json_buf_putc(&b, ',');
        if (m->type != JSON_OBJECT) {
            json_write_value(&b, m, 0);
            continue;
        }
        char w[48];
        snprintf(w, sizeof w, "messages[%zu]", i);
        json_buf_putc(&b, '{');
        for (size_t f = 0; f < m->len && !rc; f++) {
            if (f) json_buf_putc(&b, ',');
            put_str(&b, m->keys[f]);
            json_buf_putc(&b, ':');
            if (!strcmp(m->keys[f], "content") && m->items[f]->type == JSON_ARRAY)
                rc = expand_content(S, m->items[f], w, &b, e);
            else
                json_write_value(&b, m->items[f], 0);
        }
        json_buf_putc(&b, '}');
    }
    json_buf_putc(&b, ']');
    if (!rc) {
        df_error err = {0};
        *doc = json_parse(b.p, b.len, &err);
        if (!*doc) rc = rq_fail(e, 500, "messages", "internal: the messages with their documents did not parse: %s",
                                err.msg);
    }
    json_buf_free(&b);
    return rc;
}

/* ---- Responses ------------------------------------------------------------- */

int resp_input_file(srv *S, const json_value *p, const char *where, size_t k, json_buf *out, rq_err *e)
{
    static const char *const allowed[] = {"type", "file_data", "filename", "file_id", "file_url", "detail", NULL};
    char w[96];
    snprintf(w, sizeof w, "%s[%zu]", where, k);
    if (check_fields(p, allowed, e)) return -1;
    if (field(p, "file_id") || field(p, "file_url"))
        return rq_fail(e, 400, "input", "%s: files by id or URL are not supported (this server fetches nothing and "
                       "keeps no uploaded files): send file_data", w);
    return file_data(S, p, "input", w, w, out, e);
}
