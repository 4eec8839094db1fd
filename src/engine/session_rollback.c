/* session_rollback.c - going back in a session (engine.h): the rollback
 * mark (speculative decoding: the KDA state at the mark, later rows'
 * recurrence inputs replayed by kda.c), conversation checkpoints (the KDA
 * state and conv history at chosen positions, taken now or asked for ahead
 * and copied inside the pass that evaluates them, kda.c), the reachable
 * positions, truncation, and a prefix copied between sessions.
 */
#define _GNU_SOURCE
#include "heat.h"
#include "expert_fetch.h"
#include "plan.h"
#include "prefetch.h"
#include "engine_impl.h"
#include "expert_remote.h"
#include "mathfn.h"
#include "quant.h"
#include "util.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int df_session_mark(df_session *s, df_error *err)
{
    if (s->b.rb_rows <= 0)
        return df_err_set(err, DF_ERR_ARG, -1, "this session keeps no rollback rows (opened with rollback_rows 0)");
    memcpy(s->b.kda_S0, s->b.kda_S, kda_state_floats(s->eng) * sizeof(float));
    memcpy(s->b.kda_hist0, s->b.kda_hist, kda_hist_floats(s->eng) * sizeof(float));
    s->b.rb_mark = s->b.pos;
    return 0;
}

int df_session_mark_pos(const df_session *s) { return s->b.rb_mark; }

/* The entry a checkpoint at pos goes to: one already at pos (held or
 * asked for), an empty one, else the least recently used, except that with
 * two or more the lowest position is kept: it is the prefix most requests
 * share (a system prompt and tools), while later ones move on each turn. */
static int ck_entry(const df_session *s, int pos)
{
    int entry = -1, lowest = -1;
    for (int i = 0; i < s->b.n_ck; i++) {
        int at = s->b.ck_pos[i] >= 0 ? s->b.ck_pos[i] : s->b.ck_want[i];
        if (at == pos) return i;
        if (at >= 0 && (lowest < 0 || at < (s->b.ck_pos[lowest] >= 0 ? s->b.ck_pos[lowest] : s->b.ck_want[lowest])))
            lowest = i;
    }
    for (int i = 0; entry < 0 && i < s->b.n_ck; i++)
        if (s->b.ck_pos[i] < 0 && s->b.ck_want[i] < 0) entry = i;
    for (int k = 0; entry < 0 && k < s->b.n_ck; k++) {
        if (k == lowest && s->b.n_ck > 1) continue;
        int older = 0;
        for (int i = 0; i < s->b.n_ck; i++)
            older |= (i != lowest || s->b.n_ck == 1) && s->b.ck_age[i] < s->b.ck_age[k];
        if (!older) entry = k;
    }
    return entry;
}

int df_session_checkpoint(df_session *s, df_error *err)
{
    if (s->b.n_ck <= 0) return df_err_set(err, DF_ERR_ARG, -1, "this session keeps no checkpoints (opened with 0)");
    int entry = ck_entry(s, s->b.pos);
    if (s->b.ck_pos[entry] != s->b.pos) {
        size_t nS = kda_state_floats(s->eng), nH = kda_hist_floats(s->eng);
        float *dst = s->b.ck_state + (size_t)entry * (nS + nH);
        memcpy(dst, s->b.kda_S, nS * sizeof(float));
        memcpy(dst + nS, s->b.kda_hist, nH * sizeof(float));
    }
    s->b.ck_pos[entry] = s->b.pos;
    s->b.ck_want[entry] = -1;
    s->b.ck_age[entry] = ++s->b.ck_clock;
    return 0;
}

int df_session_checkpoint_at(df_session *s, int pos, df_error *err)
{
    if (s->b.n_ck <= 0) return df_err_set(err, DF_ERR_ARG, -1, "this session keeps no checkpoints (opened with 0)");
    if (pos == s->b.pos) return df_session_checkpoint(s, err);
    if (pos < s->b.pos || pos > s->b.n_ctx)
        return df_err_set(err, DF_ERR_ARG, -1, "cannot keep a checkpoint at position %d: the session holds %d, "
                          "context %d (positions ahead only)", pos, s->b.pos, s->b.n_ctx);
    int entry = ck_entry(s, pos);
    s->b.ck_pos[entry] = -1;
    s->b.ck_want[entry] = pos;
    s->b.ck_age[entry] = ++s->b.ck_clock;
    return 0;
}

/* After a pass over positions (p0, p1]: the checkpoints asked for there are
 * complete (every KDA layer copied its heads), or, when the pass failed,
 * partial and dropped. */
void session_ck_settle(df_session *s, int p0, int p1, int ok)
{
    for (int i = 0; i < s->b.n_ck; i++) {
        int w = s->b.ck_want[i];
        if (w <= p0 || w > p1) continue;
        if (ok) s->b.ck_pos[i] = w;
        s->b.ck_want[i] = -1;
    }
}

int df_session_reachable(const df_session *s, int pos)
{
    if (pos >= s->b.pos) return s->b.pos;
    if (pos < 0) return 0;
    if (s->b.rb_mark >= 0 && pos >= s->b.rb_mark) return pos;
    int best = 0;
    for (int i = 0; i < s->b.n_ck; i++)
        if (s->b.ck_pos[i] <= pos && s->b.ck_pos[i] > best) best = s->b.ck_pos[i];
    return best;
}

int df_session_copy_prefix(df_session *dst, const df_session *src, int pos, df_error *err)
{
    if (dst == src || dst->eng != src->eng || dst->b.n_ctx != src->b.n_ctx)
        return df_err_set(err, DF_ERR_ARG, -1, "copying a session prefix needs two sessions of one engine and context");
    if (pos <= 0 || pos > src->b.pos)
        return df_err_set(err, DF_ERR_ARG, -1, "cannot copy position %d: the session holds %d", pos, src->b.pos);
    size_t nS = kda_state_floats(src->eng), nH = kda_hist_floats(src->eng);
    const float *kS = NULL, *kH = NULL;
    if (pos == src->b.pos) {
        kS = src->b.kda_S;
        kH = src->b.kda_hist;
    }
    for (int i = 0; !kS && i < src->b.n_ck; i++)
        if (src->b.ck_pos[i] == pos) {
            kS = src->b.ck_state + (size_t)i * (nS + nH);
            kH = kS + nS;
        }
    if (!kS)
        return df_err_set(err, DF_ERR_ARG, -1, "cannot copy position %d: neither the session's end (%d) nor a "
                          "checkpoint", pos, src->b.pos);
    memcpy(dst->b.kda_S, kS, nS * sizeof(float));
    memcpy(dst->b.kda_hist, kH, nH * sizeof(float));
    const k3_config *c = &src->eng->m.cfg;
    size_t row_w = (size_t)(c->Rkv + c->dr), ctx_row = (size_t)src->b.n_ctx * row_w;
    for (int l = 0; l < src->eng->m.n_mla; l++)
        memcpy(dst->b.mla_cache + (size_t)l * ctx_row, src->b.mla_cache + (size_t)l * ctx_row,
               (size_t)pos * row_w * sizeof(float));
    dst->b.pos = pos;
    dst->b.rb_mark = -1;
    for (int i = 0; i < dst->b.n_ck; i++) dst->b.ck_pos[i] = dst->b.ck_want[i] = -1;
    /* the copied prefix stays reachable in dst too */
    return dst->b.n_ck > 0 ? df_session_checkpoint(dst, err) : 0;
}

/* Back to checkpoint position pos (the caller found it). */
static void restore_checkpoint(df_session *s, int pos)
{
    size_t nS = kda_state_floats(s->eng), nH = kda_hist_floats(s->eng);
    for (int i = 0; i < s->b.n_ck; i++)
        if (s->b.ck_pos[i] == pos) {
            const float *src = s->b.ck_state + (size_t)i * (nS + nH);
            memcpy(s->b.kda_S, src, nS * sizeof(float));
            memcpy(s->b.kda_hist, src + nS, nH * sizeof(float));
            s->b.ck_age[i] = ++s->b.ck_clock;
            return;
        }
}

int df_session_truncate(df_session *s, int pos, df_error *err)
{
    if (pos < 0 || pos > s->b.pos)
        return df_err_set(err, DF_ERR_ARG, -1, "cannot truncate to position %d: the session holds %d", pos, s->b.pos);
    if (pos == s->b.pos) return 0;
    if (pos == 0) {
        df_session_reset(s);
        return 0;
    }
    if (df_session_reachable(s, pos) == pos && (s->b.rb_mark < 0 || pos < s->b.rb_mark)) {
        /* a checkpoint: the state as it was there; later ones and the mark are gone */
        restore_checkpoint(s, pos);
        for (int i = 0; i < s->b.n_ck; i++) {
            if (s->b.ck_pos[i] > pos) s->b.ck_pos[i] = -1;
            s->b.ck_want[i] = -1;
        }
        s->b.rb_mark = -1;
        s->b.pos = pos;
        return 0;
    }
    if (s->b.rb_mark < 0)
        return df_err_set(err, DF_ERR_ARG, -1,
                          "cannot roll back to position %d: no mark or checkpoint is held there "
                          "(df_session_mark, or more rows than rollback_rows %d evaluated since)",
                          pos, s->b.rb_rows);
    if (pos < s->b.rb_mark)
        return df_err_set(err, DF_ERR_ARG, -1, "cannot roll back to position %d: the mark is at %d", pos,
                          s->b.rb_mark);
    df_engine *eng = s->eng;
    int rows = pos - s->b.rb_mark;
    const k3_config *c = &eng->m.cfg;
    memcpy(s->b.kda_S, s->b.kda_S0, kda_state_floats(s->eng) * sizeof(float));
    memcpy(s->b.kda_hist, s->b.kda_hist0, kda_hist_floats(s->eng) * sizeof(float));
    if (rows > 0) {
        alloc_guard_enter();
        for (int il = 0; il < c->NL; il++)
            if (eng->m.layers[il].kind == LAYER_KDA) eng->bk.ops->kda_replay(&eng->mc, &s->b, &eng->m.layers[il], rows);
        alloc_guard_leave();
    }
    for (int i = 0; i < s->b.n_ck; i++) {
        if (s->b.ck_pos[i] > pos) s->b.ck_pos[i] = -1;
        s->b.ck_want[i] = -1;
    }
    s->b.pos = pos;
    return 0;
}
