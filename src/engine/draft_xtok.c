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
 *     regex, tokenizer.h).  Its KV cache is kept over the longest common
 *     prefix with the ids it last evaluated; only the rest is evaluated.
 *  3. Up to k + 2 greedy drafter tokens, stopping before the first whose
 *     own probability is under XT_CONFIDENCE.
 *  4. The draft's bytes, less a trailing partial character, appended to
 *     the bytes of the last XT_TAIL target ids (fewer if a special is
 *     nearer) and encoded by the target's tokenizer: when that reproduces
 *     those tail ids first, the ids after them are the proposal, less the
 *     last one (it may be an unfinished word that more text would merge
 *     into another token), at most k.  Otherwise nothing is proposed and
 *     the translation counter grows.
 * Proposals never change a token: the target verifies each (generate.c).
 * The drafter is any dense family's model (family.h: Qwen3 today), opened
 * through the family table with its matrix products on the best kernel
 * table (the same bits on every ISA).
 */
#include "draft_xtok.h"
#include "family.h"
#include "kernels.h"
#include "util.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define XT_TAIL 4
#define XT_CONFIDENCE 0.30

typedef struct xtok {
    tokenizer *tt, *dt;         /* the target's and the drafter's */
    const df_family *fam;
    df_family_model *m;
    df_family_state *s;
    int n_ctx, V;
    int32_t *qids;              /* the drafter ids its state holds, [n_ctx] */
    int n_q;
    float *logits;              /* [V] */
    double *ex, *ey;            /* [V]: the confidence's exponentials (the kernel table's exp_n) */
    const kernel_table *kt;
    unsigned char *text;        /* the history's bytes */
    size_t text_cap;
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

static void text_put(xtok *x, size_t *len, const char *b, size_t n)
{
    if (*len + n + 1 > x->text_cap) {
        x->text_cap = (*len + n + 1) * 2;
        x->text = xrealloc(x->text, x->text_cap);
    }
    memcpy(x->text + *len, b, n);
    *len += n;
}

/* Greedy drafter tokens after the state's ids: at most m, stopping before a
 * token under the confidence; the logits of the state's last id are in x->logits. */
static int generate(xtok *x, int m, int32_t *gen, df_error *err)
{
    int g = 0;
    while (g < m && x->n_q < x->n_ctx) {
        int best = 0;
        for (int i = 1; i < x->V; i++)
            if (x->logits[i] > x->logits[best]) best = i;
        /* z = sum of exp(l - max), the exponentials in the kernel table's vector exp (df_exp's bits) */
        double z = 0, mx = (double)x->logits[best];
        for (int i = 0; i < x->V; i++) x->ex[i] = (double)x->logits[i] - mx;
        x->kt->exp_n(x->ex, x->ey, (size_t)x->V);
        for (int i = 0; i < x->V; i++) z += x->ey[i];
        if (1.0 / z < XT_CONFIDENCE || tokenizer_is_special(x->dt, best) || best >= tokenizer_n_vocab(x->dt)) break;
        gen[g++] = best;
        if (x->fam->forward(x->m, x->s, &gen[g - 1], 1, x->logits, 1, err)) return -1;
        x->qids[x->n_q++] = gen[g - 1];
    }
    return g;
}

/* Step 4: the drafter ids gen[0..g), after the target ids tail[0..nt), as
 * at most k target ids in out; 0 when nothing translates. */
static int translate(xtok *x, const int32_t *tail, size_t nt, const int32_t *gen, int g, int k, int32_t *out,
                     df_error *err)
{
    size_t dl = 0;
    for (size_t i = 0; i < nt; i++) {
        size_t bl;
        const char *b = tokenizer_token_bytes(x->tt, tail[i], &bl);
        if (b) text_put(x, &dl, b, bl);
    }
    size_t tail_bytes = dl;
    for (int i = 0; i < g; i++) {
        size_t bl;
        const char *b = tokenizer_token_bytes(x->dt, gen[i], &bl);
        if (b) text_put(x, &dl, b, bl);
    }
    size_t whole = tail_bytes + cut_partial(x->text + tail_bytes, dl - tail_bytes);
    x->st.cut_char += whole != dl;
    size_t ne = 0;
    if (tokenizer_encode(x->tt, (const char *)x->text, whole, 0, &x->enc, &ne, &x->enc_cap, err)) return -1;
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
    x.dt = (tokenizer *)(uintptr_t)drafter;
    int np = translate(&x, tail, nt, gen, g, k, out, err);
    free(x.text);
    free(x.enc);
    if (st) *st = x.st;
    return np;
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
        if (b) text_put(x, &len, b, bl);
    }
    if (!len || !utf8_complete(x->text, len)) {
        x->st.boundary += len != 0;
        return 0;
    }
    /* 2. the drafter's ids, its cache kept over the common prefix */
    size_t ne = 0;
    if (tokenizer_encode(x->dt, (const char *)x->text, len, 0, &x->enc, &ne, &x->enc_cap, err)) return -1;
    if (ne + (size_t)k + 3 > (size_t)x->n_ctx) return 0; /* past the drafter's context */
    int same = 0;
    while (same < x->n_q && (size_t)same < ne && x->qids[same] == x->enc[same]) same++;
    if ((size_t)same == ne) same--; /* the last id is evaluated again for its logits */
    x->fam->truncate(x->s, same);
    if (x->fam->forward(x->m, x->s, x->enc + same, (int)ne - same, x->logits, 1, err)) return -1;
    memcpy(x->qids + same, x->enc + same, (ne - (size_t)same) * sizeof *x->qids);
    x->n_q = (int)ne;
    /* 3. greedy drafter tokens */
    int32_t gen[GEN_MAX_DRAFT + 2];
    int g = generate(x, k + 2 < GEN_MAX_DRAFT + 2 ? k + 2 : GEN_MAX_DRAFT + 2, gen, err);
    if (g < 0) return -1;
    x->st.drafter_tokens += (uint64_t)g;
    if (!g) return 0;
    /* 4. the draft's bytes after the tail's, in the target's ids */
    size_t tail0 = n - (n - from < XT_TAIL ? n - from : XT_TAIL);
    int np = translate(x, hist + tail0, n - tail0, gen, g, k, out, err);
    x->st.proposals += np > 0;
    return np;
}

static void xt_reset(df_drafter *d)
{
    xtok *x = d->state;
    x->fam->truncate(x->s, 0);
    x->n_q = 0;
}

static void xt_destroy(df_drafter *d)
{
    xtok *x = d->state;
    if (!x) return;
    tokenizer_free(x->tt);
    tokenizer_free(x->dt);
    if (x->s) x->fam->state_free(x->s);
    if (x->m) x->fam->close(x->m);
    free(x->qids), free(x->logits), free(x->ex), free(x->ey), free(x->text), free(x->enc);
    free(x);
    d->state = NULL;
}

int df_drafter_open_xtok(const char *path, const char *target_model, int n_ctx, size_t mem_budget, int n_threads,
                         df_drafter **out, df_error *err)
{
    *out = NULL;
    if (n_ctx > XT_MAX_CTX) n_ctx = XT_MAX_CTX;
    df_family_info fi;
    const df_family *fam = family_of(path, err);
    if (!fam || fam->info(path, &fi, err)) {
        df_err_prefix(err, "--draft model:%s", path);
        return -1;
    }
    if (fam->engine)
        return df_err_set(err, DF_ERR_ARG, -1,
                          "--draft model:%s: a %s model drafts with the target's own tokenizer, not translated", path,
                          fam->title);
    uint64_t need = family_bytes(&fi, n_ctx);
    if (need > mem_budget)
        return df_err_set(err, DF_ERR_LIMIT, -1,
                          "--draft model:%s: the drafter needs %.2f GiB (%s; a state of %d positions); its share of "
                          "--mem is %.2f GiB (--draft-mem)",
                          path, need / 1073741824.0, fi.summary, n_ctx, mem_budget / 1073741824.0);
    xtok *x = xcalloc(1, sizeof *x);
    df_drafter *d = xcalloc(1, sizeof *d);
    d->name = "xtok";
    d->state = x;
    d->propose = xt_propose;
    d->reset = xt_reset;
    d->destroy = xt_destroy;
    x->n_ctx = n_ctx;
    x->fam = fam;
    const kernel_table *kt = NULL;
    if (tokenizer_load(target_model, &x->tt, err) || tokenizer_load(path, &x->dt, err) ||
        !(kt = kernels_select(NULL, err)) /* any ISA: the same bits */ || fam->open(path, kt, n_threads, &x->m, err) ||
        fam->state_new(x->m, n_ctx, &x->s, err)) {
        df_err_prefix(err, "--draft model:%s", path);
        xt_destroy(d);
        free(d);
        return -1;
    }
    x->V = fam->vocab(x->m);
    if (x->V < tokenizer_n_vocab(x->dt)) {
        df_err_set(err, DF_ERR_FORMAT, -1, "--draft model:%s: the model's vocabulary (%d) is smaller than its tokenizer's (%d)",
                   path, x->V, tokenizer_n_vocab(x->dt));
        xt_destroy(d);
        free(d);
        return -1;
    }
    x->qids = xmalloc((size_t)n_ctx * sizeof *x->qids);
    x->logits = xmalloc((size_t)x->V * sizeof *x->logits);
    x->ex = xmalloc((size_t)x->V * sizeof *x->ex);
    x->ey = xmalloc((size_t)x->V * sizeof *x->ey);
    x->kt = kt;
    *out = d;
    return 0;
}

int df_drafter_xtok_stats(const df_drafter *d, xtok_stats *st)
{
    if (!d || d->propose != xt_propose) return -1;
    *st = ((const xtok *)d->state)->st;
    return 0;
}
