/* draft_xtok.c - a drafter with another tokenizer (issue 42: Qwen3 drafting
 * for K3), behind the df_drafter interface: the history is kept as bytes,
 * re-encoded for the drafter, and only the draft is translated back into
 * the target's ids, never the history through a lossy string.
 *
 * A proposal, for the target ids hist[0..n):
 *  1. The text: the bytes of the target ids after the last special token
 *     (the current message; markup is the target's, not text the drafter
 *     knows).  A text ending inside a UTF-8 character proposes nothing.
 *  2. The drafter's ids: the text encoded by its tokenizer (NFC and its
 *     regex, tokenizer.h).  Its state is kept over the longest common
 *     prefix with the ids it last evaluated (as far as the family's
 *     truncate reaches: a mark is set XT_MARK_BACK ids before the text's
 *     end, for K3's recurrent state); only the rest is evaluated.
 *  3. Up to k + 2 greedy drafter tokens, stopping before the first whose
 *     own probability is under XT_CONFIDENCE.
 *  4. The draft's bytes, less a trailing partial character, appended to
 *     the bytes of the last XT_TAIL target ids (fewer if a special is
 *     nearer) and encoded by the target's tokenizer: when that reproduces
 *     those tail ids first, the ids after them are the proposal, less the
 *     last one (it may be an unfinished word that more text would merge
 *     into another token), at most k.  Otherwise nothing is proposed and
 *     the translation counter grows.
 * With a wide drafter (--draft-wide: a larger model, as the original pairs
 * Qwen3-0.6B with 1.7B), a proposal shorter than k ids whose drafter was
 * sure of at least its first token asks the wide one too (its own state,
 * kept over the common prefix in the same way: it catches up in one
 * batched pass when asked), and the longer of the two proposals is taken,
 * the wide one's on a tie.  The first drafter's proposals of k ids, and
 * the positions where it is unsure of its first token, cost the wide one
 * nothing.
 * Proposals never change a token: the target verifies each (generate.c).
 * The drafter is a model of any family (families.h: Qwen3, or K3 with
 * another tokenizer), opened through the family table with its matrix
 * products on the family's choice of kernels (the same bits on every ISA).
 */
#include "draft_xtok.h"
#include "families.h"
#include "kernels.h"
#include "util.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define XT_TAIL 4
#define XT_CONFIDENCE 0.30
#define XT_MARK_BACK 8

/* One drafter model: its tokenizer, its state and the ids that state holds. */
typedef struct xt_lane {
    tokenizer *dt;
    const df_family *fam;
    df_family_model *m;
    df_family_state *s;
    int n_ctx, V;
    int32_t *qids;              /* the drafter ids its state holds, [n_ctx] */
    int n_q;
    float *logits;              /* [V] */
    double *ex, *ey;            /* [V]: the confidence's exponentials (the kernel table's exp_n) */
} xt_lane;

typedef struct xtok {
    tokenizer *tt;              /* the target's */
    xt_lane lane[2];            /* the drafter, and the wide one asked when it is unsure (n_lanes 2) */
    int n_lanes;
    const kernel_table *kt;
    unsigned char *text;        /* the history's bytes (the current message) */
    size_t text_cap;
    unsigned char *tr;          /* a translation's bytes: the tail's, then the draft's */
    size_t tr_cap;
    int32_t *enc;               /* encodings (grown by tokenizer_encode) */
    size_t enc_cap;
    xtok_stats st;
} xtok;

static int utf8_complete(const unsigned char *p, size_t n)
{
    /* the last lead byte's sequence must be whole */
    size_t i = n;
    while (i > 0 && (p[i - 1] & 0xC0) == 0x80 && n - i < 3) i--;
    if (i == 0) return n == 0;
    unsigned char c = p[i - 1];
    size_t need = c < 0x80 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    return n - (i - 1) >= need;
}

static size_t cut_partial(const unsigned char *p, size_t n)
{
    while (n && !utf8_complete(p, n)) n--;
    return n;
}

static void buf_put(unsigned char **buf, size_t *cap, size_t *len, const char *b, size_t n)
{
    if (*len + n + 1 > *cap) {
        *cap = (*len + n + 1) * 2;
        *buf = xrealloc(*buf, *cap);
    }
    memcpy(*buf + *len, b, n);
    *len += n;
}

/* Greedy drafter tokens after the lane's ids: at most m, stopping before a
 * token under the confidence; the logits of the state's last id are in
 * l->logits. */
static int generate(const xtok *x, xt_lane *l, int m, int32_t *gen, df_error *err)
{
    int g = 0;
    while (g < m && l->n_q < l->n_ctx) {
        int best = 0;
        for (int i = 1; i < l->V; i++)
            if (l->logits[i] > l->logits[best]) best = i;
        /* z = sum of exp(l - max), the exponentials in the kernel table's vector exp (df_exp's bits) */
        double z = 0, mx = (double)l->logits[best];
        for (int i = 0; i < l->V; i++) l->ex[i] = (double)l->logits[i] - mx;
        x->kt->exp_n(l->ex, l->ey, (size_t)l->V);
        for (int i = 0; i < l->V; i++) z += l->ey[i];
        if (1.0 / z < XT_CONFIDENCE || tokenizer_is_special(l->dt, best) || best >= tokenizer_n_vocab(l->dt)) break;
        gen[g++] = best;
        if (l->fam->forward(l->m, l->s, &gen[g - 1], 1, l->logits, 1, err)) return -1;
        l->qids[l->n_q++] = gen[g - 1];
    }
    return g;
}

/* Step 4: the drafter ids gen[0..g), after the target ids tail[0..nt), as
 * at most k target ids in out; 0 when nothing translates. */
static int translate(xtok *x, const tokenizer *dt, const int32_t *tail, size_t nt, const int32_t *gen, int g, int k,
                     int32_t *out, df_error *err)
{
    size_t dl = 0;
    for (size_t i = 0; i < nt; i++) {
        size_t bl;
        const char *b = tokenizer_token_bytes(x->tt, tail[i], &bl);
        if (b) buf_put(&x->tr, &x->tr_cap, &dl, b, bl);
    }
    size_t tail_bytes = dl;
    for (int i = 0; i < g; i++) {
        size_t bl;
        const char *b = tokenizer_token_bytes(dt, gen[i], &bl);
        if (b) buf_put(&x->tr, &x->tr_cap, &dl, b, bl);
    }
    size_t whole = tail_bytes + cut_partial(x->tr + tail_bytes, dl - tail_bytes);
    x->st.cut_char += whole != dl;
    size_t ne = 0;
    if (tokenizer_encode(x->tt, (const char *)x->tr, whole, 0, &x->enc, &ne, &x->enc_cap, err)) return -1;
    if (ne < nt || memcmp(x->enc, tail, nt * sizeof *tail)) {
        x->st.untranslated++;
        return 0;
    }
    int np = (int)(ne - nt) - 1; /* the last may be an unfinished word */
    if (np > k) np = k;
    for (int i = 0; i < np; i++) out[i] = x->enc[nt + (size_t)i];
    return np > 0 ? np : 0;
}

int xtok_translate(const tokenizer *target, const tokenizer *drafter, const int32_t *tail, size_t nt,
                   const int32_t *gen, int g, int k, int32_t *out, xtok_stats *st, df_error *err)
{
    xtok x;
    memset(&x, 0, sizeof x);
    x.tt = (tokenizer *)(uintptr_t)target;
    int np = translate(&x, drafter, tail, nt, gen, g, k, out, err);
    free(x.tr);
    free(x.enc);
    if (st) *st = x.st;
    return np;
}

/* Steps 2-4 for one lane: its proposal (at most k target ids) for the
 * text x->text[0..len) whose target ids end with tail[0..nt); *gen_n gets
 * the drafter tokens it generated. */
static int lane_propose(xtok *x, xt_lane *l, size_t len, const int32_t *tail, size_t nt, int k, int32_t *out,
                        int *gen_n, df_error *err)
{
    *gen_n = 0;
    /* 2. the drafter's ids, its cache kept over the common prefix */
    size_t ne = 0;
    if (tokenizer_encode(l->dt, (const char *)x->text, len, 0, &x->enc, &ne, &x->enc_cap, err)) return -1;
    if (ne + (size_t)k + 3 > (size_t)l->n_ctx) return 0; /* past the drafter's context */
    int same = 0;
    while (same < l->n_q && (size_t)same < ne && l->qids[same] == x->enc[same]) same++;
    if ((size_t)same == ne) same--; /* the last id is evaluated again for its logits */
    same = l->fam->truncate(l->s, same); /* less where the state cannot go back (K3 before its mark) */
    /* a mark XT_MARK_BACK ids before the text's end: the next proposal's
     * text, the same with the accepted ids after it, may re-encode its
     * last word differently, and a state that goes back only to its mark
     * (K3's) then goes back there instead of starting over */
    int mk = (int)ne - XT_MARK_BACK > same ? (int)ne - XT_MARK_BACK : same;
    if (mk > same && l->fam->forward(l->m, l->s, x->enc + same, mk - same, NULL, 0, err)) return -1;
    if (l->fam->mark(l->s, err) ||
        l->fam->forward(l->m, l->s, x->enc + mk, (int)ne - mk, l->logits, 1, err))
        return -1;
    memcpy(l->qids + same, x->enc + same, (ne - (size_t)same) * sizeof *l->qids);
    l->n_q = (int)ne;
    /* 3. greedy drafter tokens */
    int32_t gen[GEN_MAX_DRAFT + 2];
    int g = generate(x, l, k + 2 < GEN_MAX_DRAFT + 2 ? k + 2 : GEN_MAX_DRAFT + 2, gen, err);
    if (g < 0) return -1;
    *gen_n = g;
    if (!g) return 0;
    /* 4. the draft's bytes after the tail's, in the target's ids */
    return translate(x, l->dt, tail, nt, gen, g, k, out, err);
}

static int xt_propose(df_drafter *d, const int32_t *hist, size_t n, int32_t *out, int k, df_error *err)
{
    xtok *x = d->state;
    /* 1. the current message's bytes */
    size_t from = n;
    while (from > 0 && !tokenizer_is_special(x->tt, hist[from - 1])) from--;
    size_t len = 0;
    for (size_t i = from; i < n; i++) {
        size_t bl;
        const char *b = tokenizer_token_bytes(x->tt, hist[i], &bl);
        if (b) buf_put(&x->text, &x->text_cap, &len, b, bl);
    }
    if (!len || !utf8_complete(x->text, len)) {
        x->st.boundary += len != 0;
        return 0;
    }
    size_t tail0 = n - (n - from < XT_TAIL ? n - from : XT_TAIL);
    int g;
    int np = lane_propose(x, &x->lane[0], len, hist + tail0, n - tail0, k, out, &g, err);
    if (np < 0) return -1;
    x->st.drafter_tokens += (uint64_t)g;
    if (x->n_lanes > 1 && np < k && g > 0) {
        /* the drafter was sure of a token but not of k ids: the wide one
         * is asked, and its proposal is taken when it is at least as long
         * (sure for as many ids, and the larger model).  Where the first
         * is unsure of its first token the wide one is not asked: there
         * (after markup, between thoughts) it was nearly never sure either
         * (README: ~200 asks for 6-40 taken, against 14-45 for the same
         * tokens per pass) */
        int32_t wide[GEN_MAX_DRAFT];
        int wg;
        int nw = lane_propose(x, &x->lane[1], len, hist + tail0, n - tail0, k, wide, &wg, err);
        if (nw < 0) return -1;
        x->st.wide_asked++;
        x->st.wide_tokens += (uint64_t)wg;
        if (nw > 0 && nw >= np) {
            memcpy(out, wide, (size_t)nw * sizeof *out);
            np = nw;
            x->st.wide_used++;
        }
    }
    x->st.proposals += np > 0;
    return np;
}

static void xt_reset(df_drafter *d)
{
    xtok *x = d->state;
    for (int i = 0; i < x->n_lanes; i++) {
        x->lane[i].fam->truncate(x->lane[i].s, 0);
        x->lane[i].n_q = 0;
    }
}

static void lane_free(xt_lane *l)
{
    tokenizer_free(l->dt);
    if (l->s) l->fam->state_free(l->s);
    if (l->m) l->fam->close(l->m);
    free(l->qids), free(l->logits), free(l->ex), free(l->ey);
    memset(l, 0, sizeof *l);
}

static void xt_destroy(df_drafter *d)
{
    xtok *x = d->state;
    if (!x) return;
    tokenizer_free(x->tt);
    for (int i = 0; i < 2; i++) lane_free(&x->lane[i]);
    free(x->text), free(x->tr), free(x->enc);
    free(x);
    d->state = NULL;
}

/* The family of the model at path (*fam) and what it takes opened with o
 * (*need, *what). */
static int lane_size(const char *path, const df_family_opts *o, const df_family **fam, uint64_t *need, char *what,
                     size_t n_what, df_error *err)
{
    *fam = family_of(path, err);
    if (!*fam) return -1;
    df_error pe = {0};
    if ((*fam)->plan(path, o, need, what, n_what, &pe) && pe.code != DF_ERR_NOMEM) { /* too large: said below */
        *err = pe;
        return -1;
    }
    return 0;
}

static int lane_open(xt_lane *l, const char *path, const df_family *fam, const df_family_opts *o, df_error *err)
{
    l->n_ctx = o->n_ctx;
    l->fam = fam;
    if (tokenizer_load(path, &l->dt, err) || fam->open(path, o, &l->m, err) ||
        fam->state_new(l->m, o->n_ctx, &l->s, err))
        return -1;
    l->V = fam->vocab(l->m);
    if (l->V < tokenizer_n_vocab(l->dt))
        return df_err_set(err, DF_ERR_FORMAT, -1, "the model's vocabulary (%d) is smaller than its tokenizer's (%d)", l->V,
                          tokenizer_n_vocab(l->dt));
    l->qids = xmalloc((size_t)o->n_ctx * sizeof *l->qids);
    l->logits = xmalloc((size_t)l->V * sizeof *l->logits);
    l->ex = xmalloc((size_t)l->V * sizeof *l->ex);
    l->ey = xmalloc((size_t)l->V * sizeof *l->ey);
    return 0;
}

void df_drafter_xtok_opts(size_t mem_budget, int n_ctx, int n_threads, df_family_opts *o)
{
    /* its products on its family's choice of kernels */
    *o = (df_family_opts){.n_threads = n_threads, .mem_budget = mem_budget,
                          .n_ctx = n_ctx < XT_MAX_CTX ? n_ctx : XT_MAX_CTX, .max_rows = 64,
                          .rollback = XT_MARK_BACK + GEN_MAX_DRAFT + 2};
}

int df_drafter_open_xtok(const char *path, const char *wide, const char *target_model, int n_ctx, size_t mem_budget,
                         int n_threads, df_drafter **out, df_error *err)
{
    *out = NULL;
    const char *paths[2] = {path, wide};
    int n_lanes = wide ? 2 : 1;
    const df_family *fam[2];
    char what[2][256];
    uint64_t need[2] = {0, 0};
    const kernel_table *kt = kernels_select(NULL, err); /* the confidence's exponentials: any ISA, the same bits */
    if (!kt) return -1;
    /* each drafter planned alone at the whole share; together checked below */
    df_family_opts o;
    df_drafter_xtok_opts(mem_budget, n_ctx, n_threads, &o);
    for (int i = 0; i < n_lanes; i++)
        if (lane_size(paths[i], &o, &fam[i], &need[i], what[i], sizeof what[i], err)) {
            df_err_prefix(err, "%s%s", i ? "--draft-wide " : "--draft model:", paths[i]);
            return -1;
        }
    if (need[0] + need[1] > mem_budget) {
        if (wide)
            return df_err_set(err, DF_ERR_LIMIT, -1,
                              "--draft model:%s with --draft-wide %s: the drafters need %.2f + %.2f GiB (%s; %s); their "
                              "share of --mem is %.2f GiB (--draft-mem)",
                              path, wide, need[0] / 1073741824.0, need[1] / 1073741824.0, what[0], what[1],
                              mem_budget / 1073741824.0);
        return df_err_set(err, DF_ERR_LIMIT, -1,
                          "--draft model:%s: the drafter needs %.2f GiB (%s); its share of --mem is %.2f GiB "
                          "(--draft-mem)",
                          path, need[0] / 1073741824.0, what[0], mem_budget / 1073741824.0);
    }
    xtok *x = xcalloc(1, sizeof *x);
    df_drafter *d = xcalloc(1, sizeof *d);
    d->name = "xtok";
    d->state = x;
    d->propose = xt_propose;
    d->reset = xt_reset;
    d->destroy = xt_destroy;
    x->n_lanes = n_lanes;
    x->st.wide = n_lanes > 1;
    if (tokenizer_load(target_model, &x->tt, err)) {
        df_err_prefix(err, "--draft model:%s", path);
        xt_destroy(d);
        free(d);
        return -1;
    }
    x->kt = kt;
    for (int i = 0; i < n_lanes; i++) {
        /* alone, the drafter has the whole share; of two, the first what
         * its plan takes and the second the rest */
        df_family_opts oi = o;
        if (wide) oi.mem_budget = i ? mem_budget - need[0] : need[0];
        if (lane_open(&x->lane[i], paths[i], fam[i], &oi, err)) {
            df_err_prefix(err, "%s%s", i ? "--draft-wide " : "--draft model:", paths[i]);
            xt_destroy(d);
            free(d);
            return -1;
        }
    }
    *out = d;
    return 0;
}

int df_drafter_xtok_stats(const df_drafter *d, xtok_stats *st)
{
    if (!d || d->propose != xt_propose) return -1;
    *st = ((const xtok *)d->state)->st;
    return 0;
}
