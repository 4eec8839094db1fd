/* family_k3.c - Kimi K3's entry in the family table (family.h), the
 * engine behind the family interface: `open` is df_engine_open with a
 * memory plan for one session of the given context, rows and rollback
 * (the expert cache takes what the budget leaves, the trunk resident or
 * streamed as the plan decides), a state is a df_session, `forward` its
 * eval, `mark` and `truncate` its rollback (a truncation before the mark
 * empties the session: its KDA state cannot go back there).  `info` and
 * `plan` read the configuration and headers alone: layers, width,
 * vocabulary and the bytes of the weight files (weights.h), and the plan
 * the engine would open with (df_plan_model).  The engine's own callers
 * (run, serve) keep its full interface (engine.h); this table is for a
 * K3 model beside the target: a drafter.
 */
#include "families.h"
#include "engine.h"
#include "gguf.h"
#include "kernels.h"
#include "model.h"
#include "util.h"
#include "weights.h"

#include <stdlib.h>
#include <stdio.h>
#include <string.h>

static int k3_info(const char *path, df_family_info *fi, df_error *err)
{
    memset(fi, 0, sizeof *fi);
    k3_config c;
    wset ws;
    if (wset_open(path, NULL, &ws, err)) return -1;
    int rc;
    if (ws.format == WSET_GGUF) {
        rc = k3_config_from_gguf(&ws.gg[0], &c, err);
    } else {
        char p[4096], *text = NULL;
        size_t len;
        rc = (size_t)snprintf(p, sizeof p, "%s/config.json", path) >= sizeof p
                 ? df_err_set(err, DF_ERR_ARG, -1, "%s: path too long", path)
                 : read_small_file(p, &text, &len, 64u << 20, err);
        if (!rc) rc = k3_config_parse(text, len, &c, err);
        free(text);
    }
    fi->weight_bytes = wset_file_bytes(&ws);
    wset_close(&ws);
    if (rc) {
        df_err_prefix(err, "%s", path);
        return -1;
    }
    fi->layers = c.NL, fi->hidden = c.h, fi->vocab = c.V;
    snprintf(fi->summary, sizeof fi->summary, "Kimi K3, %d layers, %d wide, %d experts of %d per token: %.2f GiB of "
             "weight files (the engine plans what stays in memory)", c.NL, c.h, c.E, c.k,
             (double)fi->weight_bytes / (1u << 30));
    k3_config_free(&c);
    return 0;
}

/* The plan and open options the engine gets for one session as o asks. */
static void k3_opts(const df_family_opts *o, df_engine_opts *eo, df_session_opts *so)
{
    df_engine_opts_default(eo);
    eo->quiet = 1;
    eo->mem_budget = (size_t)o->mem_budget;
    eo->n_threads = o->n_threads > 0 ? o->n_threads : 1;
    eo->kernels = o->kt ? o->kt->name : NULL;
    eo->plan_ctx = o->n_ctx > 0 ? o->n_ctx : 4096;
    eo->plan_batch = o->max_rows > 0 ? o->max_rows : 64;
    eo->plan_rollback = o->rollback;
    eo->no_prefetch = 1; /* a model beside the target: its look-ahead reads would compete with the target's */
    memset(so, 0, sizeof *so);
    so->n_ctx = eo->plan_ctx;
    so->max_batch = eo->plan_batch;
    so->rollback_rows = o->rollback;
}

static int k3_plan(const char *path, const df_family_opts *o, uint64_t *bytes, char *what, size_t n_what,
                   df_error *err)
{
    df_engine_opts eo;
    df_session_opts so;
    k3_opts(o, &eo, &so);
    df_plan_opts po;
    memset(&po, 0, sizeof po);
    po.mem_budget = eo.mem_budget;
    po.n_ctx = so.n_ctx;
    po.max_batch = so.max_batch;
    po.rollback_rows = so.rollback_rows;
    po.n_threads = eo.n_threads;
    df_plan p;
    int rc = df_plan_model(path, &po, &p, NULL, err);
    *bytes = p.used;
    snprintf(what, n_what, "its own plan: trunk %s, %.2f GiB of experts cached",
             p.trunk_mode == DF_TRUNK_RESIDENT ? "resident" : "streamed", (double)p.cache_bytes / (1u << 30));
    return rc;
}

typedef struct k3_fmodel {
    df_engine *eng;
    df_session_opts so;
    int V;
} k3_fmodel;

static int k3_open(const char *path, const df_family_opts *o, df_family_model **out, df_error *err)
{
    *out = NULL;
    k3_fmodel *m = xcalloc(1, sizeof *m);
    df_engine_opts eo;
    k3_opts(o, &eo, &m->so);
    if (df_engine_open(path, &eo, &m->eng, err)) {
        free(m);
        return -1;
    }
    df_model_info info;
    df_engine_info(m->eng, &info);
    m->V = info.vocab;
    *out = (df_family_model *)m;
    return 0;
}

static void k3_close(df_family_model *fm)
{
    k3_fmodel *m = (k3_fmodel *)fm;
    if (!m) return;
    df_engine_close(m->eng);
    free(m);
}

static int k3_vocab(const df_family_model *fm) { return ((const k3_fmodel *)fm)->V; }

static int k3_state_new(df_family_model *fm, int n_ctx, df_family_state **out, df_error *err)
{
    k3_fmodel *m = (k3_fmodel *)fm;
    df_session_opts so = m->so;
    so.n_ctx = n_ctx;
    return df_session_new(m->eng, &so, (df_session **)out, err);
}

static void k3_state_free(df_family_state *s) { df_session_free((df_session *)s); }
static int k3_pos(const df_family_state *s) { return df_session_pos((const df_session *)s); }
static int k3_mark(df_family_state *s, df_error *err) { return df_session_mark((df_session *)s, err); }

static int k3_truncate(df_family_state *fs, int pos)
{
    df_session *s = (df_session *)fs;
    if (pos >= df_session_pos(s)) return df_session_pos(s);
    int r = pos > 0 ? df_session_reachable(s, pos) : 0;
    df_error e = {0};
    if (r > 0 && !df_session_truncate(s, r, &e)) return r;
    df_session_reset(s);
    return 0;
}

static int k3_forward(const df_family_model *fm, df_family_state *s, const int32_t *ids, int n, float *logits,
                      int last_only, df_error *err)
{
    (void)fm;
    if (last_only && n < 1) return df_err_set(err, DF_ERR_ARG, -1, "kimi_k3: no ids to evaluate");
    return df_session_eval((df_session *)s, ids, n, logits, !last_only, err);
}

static const char *const k3_types[] = {"kimi_k3", "kimi_linear", "kimi-k3", NULL};

const df_family df_family_k3 = {
    .name = "kimi_k3",
    .title = "Kimi K3 (MoE)",
    .types = k3_types,
    .target = 1,
    .info = k3_info,
    .plan = k3_plan,
    .open = k3_open,
    .close = k3_close,
    .vocab = k3_vocab,
    .state_new = k3_state_new,
    .state_free = k3_state_free,
    .pos = k3_pos,
    .mark = k3_mark,
    .truncate = k3_truncate,
    .forward = k3_forward,
};
