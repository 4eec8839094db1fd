/* spec_state.c - see spec_state.h.  The file:
 *   {"deltafin_spec_state": 1, "entries": [
 *     {"model": REALPATH, "drafter": SPEC, "kmax": K, "t_pass": [...], "t_count": [...],
 *      "acc": A, "acc_w": W, "draft_tok_sec": S, "sh_cost": C,
 *      "guard": {"hold": H, "hold_len": L, "choice": 0|1, "rounds": R, "last": -1|0|1,
 *                "mean": [OFF, ON]}}, ...]}
 * t_pass[T] is the mean seconds of a pass of T rows (index 0 unused).  The
 * model is keyed by its real path, the drafter by its --draft spelling
 * ("auto" is ngram; with --draft-wide W, "SPEC --draft-wide W").  Other entries are copied through unchanged.
 */
#define _GNU_SOURCE
#include "spec_state.h"
#include "file.h"
#include "json.h"
#include "json_write.h"
#include "util.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* a state file that could not be read is left as it is */
static int g_unreadable;

static int applies(const run_args *a, const gen_loop *g)
{
    return a->spec_state && g->dr && g->kmax && !g->k_fixed;
}

static void key_of(const run_args *a, char *model, size_t cap, char *drafter, size_t dcap)
{
    char *rp = a->model ? realpath(a->model, NULL) : NULL;
    snprintf(model, cap, "%s", rp ? rp : a->model ? a->model : "");
    free(rp);
    /* a wide drafter makes another drafter: "model:P --draft-wide W" */
    snprintf(drafter, dcap, "%s%s%s", !strcmp(a->draft, "auto") ? "ngram" : a->draft,
             a->draft_wide ? " --draft-wide " : "", a->draft_wide ? a->draft_wide : "");
}

static double num(const json_value *o, const char *k, double dflt)
{
    double v;
    return json_get_num(o, k, &v) ? dflt : v;
}

static void entry_to_memory(const json_value *e, gen_memory *m)
{
    memset(m, 0, sizeof *m);
    m->kmax = (int)num(e, "kmax", 0);
    if (m->kmax < 0 || m->kmax > GEN_MAX_DRAFT) m->kmax = 0;
    const json_value *tp = json_get(e, "t_pass"), *tc = json_get(e, "t_count");
    for (int T = 1; T <= m->kmax + 1; T++) {
        const json_value *x = tp ? json_at(tp, (size_t)T) : NULL, *c = tc ? json_at(tc, (size_t)T) : NULL;
        m->t_pass[T] = x && x->type == JSON_NUMBER ? x->num : -1;
        m->t_count[T] = c && c->type == JSON_NUMBER && c->num >= 0 && c->num < 4e9 ? (unsigned)c->num : 0;
    }
    m->acc = num(e, "acc", -1);
    m->acc_w = num(e, "acc_w", -1);
    m->draft_tok_sec = num(e, "draft_tok_sec", -1);
    m->sh_cost = num(e, "sh_cost", -1);
    const json_value *gd = json_get(e, "guard"), *mean = gd ? json_get(gd, "mean") : NULL;
    if (gd) {
        double h = num(gd, "hold", 0), hl = num(gd, "hold_len", 0);
        m->guard_hold = h >= 0 && h < 1e12 ? (uint64_t)h : 0;
        m->guard_hold_len = hl >= 0 && hl < 1e12 ? (uint64_t)hl : 0;
        m->guard_choice = (int)num(gd, "choice", -1);
        m->guard_rounds = (int)num(gd, "rounds", 0);
        m->guard_last = (int)num(gd, "last", -1);
        for (int i = 0; i < 2; i++) {
            const json_value *x = mean ? json_at(mean, (size_t)i) : NULL;
            m->guard_mean[i] = x && x->type == JSON_NUMBER ? x->num : 0;
        }
    }
}

static void memory_to_json(json_buf *b, const char *model, const char *drafter, const gen_memory *m)
{
    json_buf_puts(b, "{\"model\":");
    json_write_string(b, model, strlen(model));
    json_buf_puts(b, ",\"drafter\":");
    json_write_string(b, drafter, strlen(drafter));
    char t[96];
    snprintf(t, sizeof t, ",\"kmax\":%d,\"t_pass\":[0", m->kmax);
    json_buf_puts(b, t);
    for (int T = 1; T <= m->kmax + 1; T++) json_buf_putc(b, ','), json_write_double(b, m->t_pass[T]);
    json_buf_puts(b, "],\"t_count\":[0");
    for (int T = 1; T <= m->kmax + 1; T++) {
        snprintf(t, sizeof t, ",%u", m->t_count[T]);
        json_buf_puts(b, t);
    }
    json_buf_puts(b, "],\"acc\":");
    json_write_double(b, m->acc);
    json_buf_puts(b, ",\"acc_w\":");
    json_write_double(b, m->acc_w);
    json_buf_puts(b, ",\"draft_tok_sec\":");
    json_write_double(b, m->draft_tok_sec);
    json_buf_puts(b, ",\"sh_cost\":");
    json_write_double(b, m->sh_cost);
    snprintf(t, sizeof t, ",\"guard\":{\"hold\":%llu,\"hold_len\":%llu,\"choice\":%d,\"rounds\":%d,\"last\":%d,\"mean\":[",
             (unsigned long long)m->guard_hold, (unsigned long long)m->guard_hold_len, m->guard_choice,
             m->guard_rounds, m->guard_last);
    json_buf_puts(b, t);
    json_write_double(b, m->guard_mean[0]);
    json_buf_putc(b, ',');
    json_write_double(b, m->guard_mean[1]);
    json_buf_puts(b, "]}}");
}

/* The file's entries (NULL when there is no file yet); -1 when it exists
 * but is not a state file (named in err). */
static int read_state(const char *path, json_doc **doc, const json_value **entries, df_error *err)
{
    *doc = NULL;
    *entries = NULL;
    char *buf = NULL;
    size_t len = 0;
    df_error rerr = {0};
    if (read_small_file(path, &buf, &len, (size_t)16 << 20, &rerr)) {
        if (access(path, F_OK) != 0) return 0; /* no file yet */
        return df_err_set(err, rerr.code, -1, "%s", rerr.msg);
    }
    *doc = json_parse(buf, len, err);
    free(buf);
    if (!*doc) {
        df_err_prefix(err, "%s", path);
        return -1;
    }
    const json_value *r = json_root(*doc), *e = json_get(r, "entries");
    double ver;
    if (json_get_num(r, "deltafin_spec_state", &ver) || ver != 1 || !e || e->type != JSON_ARRAY) {
        json_free(*doc);
        *doc = NULL;
        return df_err_set(err, DF_ERR_FORMAT, -1, "%s: not a deltafin --spec-state file (version 1)", path);
    }
    *entries = e;
    return 0;
}

static int is_entry(const json_value *e, const char *model, const char *drafter)
{
    const char *m = json_get_str(e, "model"), *d = json_get_str(e, "drafter");
    return m && d && !strcmp(m, model) && !strcmp(d, drafter);
}

/* This run's key and the file's entries */
typedef struct state_view {
    char model[PATH_MAX + 1];
    char drafter[2 * PATH_MAX + 32];
    json_doc *doc;
    const json_value *entries;
} state_view;

static int view_open(const run_args *a, state_view *v, df_error *err)
{
    key_of(a, v->model, sizeof v->model, v->drafter, sizeof v->drafter);
    return read_state(a->spec_state, &v->doc, &v->entries, err);
}

void spec_state_load(const run_args *a, gen_loop *g)
{
    if (!applies(a, g)) return;
    state_view v;
    df_error err = {0};
    if (view_open(a, &v, &err)) {
        fprintf(stderr, "deltafin: ignoring --spec-state (it is left unchanged): %s\n", err.msg);
        g_unreadable = 1;
        return;
    }
    for (size_t i = 0; v.entries && i < v.entries->len; i++)
        if (is_entry(v.entries->items[i], v.model, v.drafter)) {
            gen_memory m;
            entry_to_memory(v.entries->items[i], &m);
            gen_memory_put(g, &m);
            break;
        }
    json_free(v.doc);
}

int spec_state_save(const run_args *a, const gen_loop *g)
{
    if (!applies(a, g) || g_unreadable) return 0;
    state_view v;
    df_error err = {0};
    if (view_open(a, &v, &err)) {
        fprintf(stderr, "deltafin: --spec-state not written (the file is left unchanged): %s\n", err.msg);
        return -1;
    }
    json_buf b;
    json_buf_init(&b);
    json_buf_puts(&b, "{\"deltafin_spec_state\":1,\"entries\":[\n");
    gen_memory m;
    gen_memory_get(g, &m);
    memory_to_json(&b, v.model, v.drafter, &m);
    for (size_t i = 0; v.entries && i < v.entries->len; i++) {
        if (is_entry(v.entries->items[i], v.model, v.drafter)) continue;
        json_buf_puts(&b, ",\n");
        json_write_value(&b, v.entries->items[i], 0);
    }
    json_buf_puts(&b, "\n]}\n");
    json_free(v.doc);
    atomic_file af;
    int rc = atomic_file_open(&af, a->spec_state, &err);
    if (!rc && atomic_file_write(&af, b.p, b.len, &err)) {
        atomic_file_abort(&af);
        rc = -1;
    }
    if (!rc) rc = atomic_file_commit(&af, &err); /* aborts itself on failure */
    if (rc) fprintf(stderr, "deltafin: --spec-state not written: %s\n", err.msg);
    json_buf_free(&b);
    return rc;
}
