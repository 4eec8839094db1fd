/* test_qwen3.c - the Qwen3 dense forward pass (src/model/qwen3/qwen3.c) against an
 * independent float64 reference (tools/qwen3/qwen3_toy.py, numpy) on random
 * models it generates: tied and untied embeddings, H*D != E and == E,
 * GQA and plain multi-head, F32 and BF16 tensors, several sizes.  Logits of
 * every position within 1e-4; the same model computed with a deliberate
 * architecture mistake (GPT-J interleaved RoPE, RoPE before the QK-norm,
 * kv head h % KV) lies far outside that, so the comparison would catch
 * each.  Evaluating the ids in one chunk, one at a time, in chunks of 5 and
 * after a truncation gives the same bits, and so does the model in 3 shards
 * with an index (tools/st_reshard.py).  With the matrix products on a
 * kernel table (qwen3_set_kernels): within 1e-4 too, the same bits on every
 * ISA this CPU runs, at every chunking and after a truncation.  Bad folders are refused with the
 * file and field named.  The family seam (family.h): the model's type picks
 * its family; the table's sizes are the opened model's, its forward pass, marks
 * and truncation give qwen3.c's bits; the engine refuses a Qwen3 folder
 * naming --draft; an unknown type is named with the types known.  Skipped
 * (said so) without python3-numpy.
 */
#define _GNU_SOURCE
#include "harness.h"
#include "engine.h"
#include "families.h"
#include "kernels.h"
#include "model.h"
#include "qwen3.h"
#include "util.h"

#include <dirent.h>
#include <sys/stat.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { N_IDS = 12 };
static const int32_t IDS[N_IDS] = {5, 17, 300, 42, 7, 99, 5, 17, 250, 3, 488, 61};
static const char IDS_S[] = "5,17,300,42,7,99,5,17,250,3,488,61";

static int have_numpy(void)
{
    return system("/usr/bin/python3 -c 'import numpy' >/dev/null 2>&1") == 0;
}

static int py(const char *args)
{
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 tools/qwen3/qwen3_toy.py %s", args);
    return system(cmd);
}

static double *read_f64(const char *path, size_t n)
{
    size_t len = 0;
    char *b = t_slurp(path, &len);
    if (!b || len != n * sizeof(double)) {
        free(b);
        return NULL;
    }
    return (double *)b;
}

static double max_diff(const float *a, const double *b, size_t n)
{
    double m = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (!(d <= m)) m = d; /* NaN counts as infinitely far */
    }
    return m;
}

static float *eval_chunks(const qwen3_model *m, int chunk, int truncate_at)
{
    const qwen3_config *c = qwen3_cfg(m);
    qwen3_state *s = NULL;
    df_error err = {0};
    float *lg = xmalloc((size_t)N_IDS * (size_t)c->vocab * sizeof *lg);
    CHECK(qwen3_state_new(m, 64, &s, &err) == 0);
    if (truncate_at) { /* evaluate past it, then take it back */
        CHECK(qwen3_eval(m, s, IDS, N_IDS, lg, &err) == 0);
        qwen3_truncate(s, truncate_at);
        CHECK(qwen3_state_pos(s) == truncate_at);
        CHECK(qwen3_eval(m, s, IDS + truncate_at, N_IDS - truncate_at, lg + (size_t)truncate_at * c->vocab, &err) == 0);
    } else {
        for (int i = 0; i < N_IDS; i += chunk) {
            int n = i + chunk <= N_IDS ? chunk : N_IDS - i;
            CHECK(qwen3_eval(m, s, IDS + i, n, lg + (size_t)i * c->vocab, &err) == 0);
        }
    }
    qwen3_state_free(s);
    return lg;
}

/* The matrix products on each kernel table this CPU runs (qwen3_set_kernels):
 * within the tolerance of the float64 reference, the same bits on every
 * ISA, and at every chunking and after a truncation. */
static void check_kernels(const char *name, qwen3_model *m, const double *want, size_t n)
{
    static const enum kernel_isa isas[] = {KERNEL_REF, KERNEL_AVX2, KERNEL_AVX512, KERNEL_NEON};
    const kernel_table *tabs[] = {kernels_ref(), kernels_avx2(), kernels_avx512(), kernels_neon()};
    float *first = NULL;
    const char *first_name = NULL;
    int ran = 0;
    for (int k = 0; k < 4; k++) {
        if (!tabs[k] || !kernels_cpu_has(isas[k])) continue;
        qwen3_set_kernels(m, tabs[k]);
        float *lg = eval_chunks(m, N_IDS, 0);
        double d = want ? max_diff(lg, want, n) : INFINITY;
        TCHECKF(d <= 1e-4, "%s on %s kernels: logits differ from the float64 reference by %.3g", name, tabs[k]->name, d);
        if (!first) {
            first = lg, first_name = tabs[k]->name;
            printf("    %s on kernels: max |logit - float64 reference| %.2e\n", name, d);
            static const int chunks[2] = {1, 5};
            for (int i = 0; i < 2; i++) {
                float *c = eval_chunks(m, chunks[i], 0);
                TCHECKF(!memcmp(c, lg, n * sizeof *c), "%s on %s kernels: chunks of %d give other bits", name,
                        tabs[k]->name, chunks[i]);
                free(c);
            }
            float *tr = eval_chunks(m, N_IDS, 7);
            TCHECKF(!memcmp(tr, lg, n * sizeof *tr), "%s on %s kernels: truncated and re-evaluated gives other bits",
                    name, tabs[k]->name);
            free(tr);
        } else {
            TCHECKF(!memcmp(lg, first, n * sizeof *lg), "%s: %s and %s kernels give other bits", name, first_name,
                    tabs[k]->name);
            free(lg);
        }
        ran++;
    }
    qwen3_set_kernels(m, NULL);
    TCHECKF(ran >= 1, "%s: no kernel table ran", name);
    free(first);
}

/* Matrices kept in the file's type (BF16 here) give the bits of the same
 * model widened to F32 at load, on a kernel table, in the memory the type
 * says. */
static void check_stored(const char *name, const char *dir, qwen3_model *m, size_t n)
{
    df_error err = {0};
    qwen3_model *w = NULL;
    const kernel_table *kt = kernels_select(NULL, &err);
    TCHECKF(kt && qwen3_open_f32(dir, &w, &err) == 0, "%s: %s", name, err.msg);
    if (!w || !kt) return;
    qwen3_set_kernels(m, kt);
    qwen3_set_kernels(w, kt);
    float *a = eval_chunks(m, N_IDS, 0), *b = eval_chunks(w, N_IDS, 0);
    TCHECKF(!memcmp(a, b, n * sizeof *a), "%s: the stored matrices give other bits than widened ones", name);
    size_t kept = qwen3_model_bytes(m), wide = qwen3_model_bytes(w);
    uint64_t from_headers = 0;
    TCHECKF(qwen3_weight_bytes(dir, &from_headers, &err) == 0 && from_headers == kept, "%s: headers say %llu, loaded %zu",
            name, (unsigned long long)from_headers, kept);
    printf("    %s: weights %zu bytes as stored, %zu widened to f32: the same bits on %s\n", name, kept, wide, kt->name);
    if (strstr(name, "bf16")) TCHECKF(kept < wide * 6 / 10, "%s: BF16 matrices take %zu of %zu bytes", name, kept, wide);
    else TCHECK(kept == wide);
    qwen3_set_kernels(m, NULL);
    free(a), free(b);
    qwen3_free(w);
}

static void check_model(const char *name, const char *make_args, int mistakes)
{
    char dir[600], args[1600], ref[700];
    snprintf(dir, sizeof dir, "%s/%s", test_scratch(), name);
    snprintf(args, sizeof args, "make %s %s", dir, make_args);
    TCHECKF(py(args) == 0, "%s: qwen3_toy.py make failed", name);
    snprintf(ref, sizeof ref, "%s/ref.f64", dir);
    snprintf(args, sizeof args, "ref %s %s %s", dir, IDS_S, ref);
    TCHECKF(py(args) == 0, "%s: qwen3_toy.py ref failed", name);
    qwen3_model *m = NULL;
    df_error err = {0};
    TCHECKF(qwen3_open(dir, &m, &err) == 0, "%s: %s", name, err.msg);
    if (!m) return;
    const qwen3_config *c = qwen3_cfg(m);
    size_t n = (size_t)N_IDS * (size_t)c->vocab;
    double *want = read_f64(ref, n);
    TCHECK(want != NULL);
    float *all = eval_chunks(m, N_IDS, 0);
    double d = want ? max_diff(all, want, n) : INFINITY;
    TCHECKF(d <= 1e-4, "%s: logits differ from the float64 reference by %.3g", name, d);
    printf("    %s: max |logit - float64 reference| %.2e\n", name, d);
    /* the chunking never changes a bit */
    static const int chunks[3] = {1, 5, 7};
    for (int i = 0; i < 3; i++) {
        float *lg = eval_chunks(m, chunks[i], 0);
        TCHECKF(!memcmp(lg, all, n * sizeof *lg), "%s: chunks of %d give other bits", name, chunks[i]);
        free(lg);
    }
    float *tr = eval_chunks(m, N_IDS, 7);
    TCHECKF(!memcmp(tr, all, n * sizeof *tr), "%s: truncated and re-evaluated gives other bits", name);
    free(tr);
    check_kernels(name, m, want, n);
    check_stored(name, dir, m, n);
    /* the same tensors in 3 shards with an index (tools/st_reshard.py): the same bits */
    char sharded[700];
    snprintf(sharded, sizeof sharded, "%s-sharded", dir);
    snprintf(args, sizeof args, "/usr/bin/python3 tools/st_reshard.py %s %s 3", dir, sharded);
    TCHECKF(system(args) == 0, "%s", args);
    qwen3_model *m3 = NULL;
    df_err_clear(&err);
    TCHECKF(qwen3_open(sharded, &m3, &err) == 0, "%s in 3 shards: %s", name, err.msg);
    if (m3) {
        float *lg = eval_chunks(m3, N_IDS, 0);
        TCHECKF(!memcmp(lg, all, n * sizeof *lg), "%s: 3 shards with an index give other bits", name);
        free(lg);
        qwen3_free(m3);
    }
    /* each deliberate mistake is far outside the tolerance */
    static const char *mistake[3] = {"interleaved-rope", "rope-before-norm", "kv-mod"};
    for (int i = 0; i < mistakes; i++) {
        char wrong[700];
        snprintf(wrong, sizeof wrong, "%s/wrong.f64", dir);
        snprintf(args, sizeof args, "ref %s %s %s --mistake %s", dir, IDS_S, wrong, mistake[i]);
        TCHECK(py(args) == 0);
        double *w = read_f64(wrong, n);
        double dw = w ? max_diff(all, w, n) : 0;
        TCHECKF(dw > 1e-2, "%s: the %s model is within %.3g: the test would not catch it", name, mistake[i], dw);
        printf("    %s, %s: %.3g away\n", name, mistake[i], dw);
        free(w);
    }
    free(all);
    free(want);
    qwen3_free(m);
}

static void test_against_reference(void)
{
    if (!have_numpy()) TSKIP("the float64 reference needs python3-numpy (/usr/bin/python3)");
    /* GQA, H*D = 128 != E = 64, tied, F32 */
    check_model("gqa_tied_f32", "--layers 2 --hidden 64 --heads 4 --kv-heads 2 --head-dim 32 --ffn 96", 3);
    /* untied, BF16, E 48, 6 heads of 16 over 2 kv heads, 3 layers */
    check_model("untied_bf16", "--layers 3 --hidden 48 --heads 6 --kv-heads 2 --head-dim 16 --ffn 80 --untied "
                               "--dtype bf16 --seed 2",
                0);
    /* plain multi-head, H*D == E */
    check_model("mha_f32", "--layers 1 --hidden 64 --heads 4 --kv-heads 4 --head-dim 16 --ffn 64 --seed 3", 0);
}

static void test_refused(void)
{
    if (!have_numpy()) TSKIP("the models are written by tools/qwen3/qwen3_toy.py (python3-numpy)");
    char dir[600], args[1200], sh[2400];
    snprintf(dir, sizeof dir, "%s/bad", test_scratch());
    snprintf(args, sizeof args, "make %s --layers 1 --hidden 32 --heads 2 --kv-heads 1 --head-dim 16 --ffn 32", dir);
    TCHECK(py(args) == 0);
    static const char *const cases[][3] = {
        {"\"model_type\": \"qwen3\"", "\"model_type\": \"llama\"", "is not qwen3"},
        {"\"rope_theta\": 1000000.0,", "", "rope_theta"},
        {"\"rms_norm_eps\": 1e-06,", "", "rms_norm_eps"},
        {"\"num_key_value_heads\": 1", "\"num_key_value_heads\": 3", "kv heads"},
        {"\"vocab_size\": 512", "\"vocab_size\": 513", "model.embed_tokens.weight has the wrong shape"},
        {"\"num_hidden_layers\": 1", "\"num_hidden_layers\": 2", "tensor model.layers.1.input_layernorm.weight is missing"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(sh, sizeof sh, "cp %s/config.json %s/config.orig && /usr/bin/python3 -c \"import sys; p='%s/config.json'; "
                               "s=open(p).read(); assert sys.argv[1] in s; open(p,'w').write(s.replace(sys.argv[1], "
                               "sys.argv[2], 1))\" '%s' '%s'",
                 dir, dir, dir, cases[i][0], cases[i][1]);
        TCHECKF(system(sh) == 0, "editing config.json for case %zu", i);
        qwen3_model *m = NULL;
        df_error err = {0};
        TCHECKF(qwen3_open(dir, &m, &err) == -1 && !m && strstr(err.msg, cases[i][2]) && strstr(err.msg, dir),
                "case %zu: \"%s\" (expected \"%s\")", i, err.msg, cases[i][2]);
        qwen3_free(m);
        snprintf(sh, sizeof sh, "mv %s/config.orig %s/config.json", dir, dir);
        TCHECK(system(sh) == 0);
    }
    /* an id outside the vocabulary, and more ids than the context holds */
    qwen3_model *m = NULL;
    qwen3_state *s = NULL;
    df_error err = {0};
    TCHECKF(qwen3_open(dir, &m, &err) == 0, "%s", err.msg);
    if (!m) return;
    TCHECK(qwen3_state_new(m, 4, &s, &err) == 0);
    int32_t bad = 512, five[5] = {1, 2, 3, 4, 5};
    TCHECK(qwen3_eval(m, s, &bad, 1, NULL, &err) == -1 && strstr(err.msg, "outside the vocabulary"));
    df_err_clear(&err);
    TCHECK(qwen3_eval(m, s, five, 5, NULL, &err) == -1 && strstr(err.msg, "context"));
    qwen3_state_free(s);
    qwen3_free(m);
    test_scratch_remove();
}

/* The family table (family.h) over the same code: what the type picks, the
 * sizes it states, the bits it computes. */
static void test_family(void)
{
    if (!have_numpy()) TSKIP("the models are written by tools/qwen3/qwen3_toy.py (python3-numpy)");
    char dir[600], args[1200], sh[2400];
    snprintf(dir, sizeof dir, "%s/fam", test_scratch());
    snprintf(args, sizeof args, "make %s --layers 2 --hidden 48 --heads 4 --kv-heads 2 --head-dim 16 --ffn 64 --seed 5",
             dir);
    TCHECK(py(args) == 0);
    df_error err = {0};
    const df_family *f = family_of(dir, &err);
    TCHECKF(f == &df_family_qwen3 && !f->target && f->forward && f->mark && f->plan, "family_of: %s",
            f ? f->name : err.msg);
    if (f != &df_family_qwen3) return;
    qwen3_model *m = NULL;
    TCHECKF(qwen3_open(dir, &m, &err) == 0, "%s", err.msg);
    if (!m) return;
    const qwen3_config *c = qwen3_cfg(m);
    df_family_info fi;
    TCHECKF(f->info(dir, &fi, &err) == 0, "%s", err.msg);
    TCHECK(fi.layers == c->layers && fi.hidden == c->hidden && fi.vocab == c->vocab);
    TCHECKF(family_bytes(&fi, 0) == qwen3_model_bytes(m) &&
                family_bytes(&fi, 4096) == qwen3_model_bytes(m) + qwen3_state_bytes(c, 4096),
            "sizes %llu against the opened model's %zu", (unsigned long long)family_bytes(&fi, 0), qwen3_model_bytes(m));
    TCHECKF(strstr(fi.summary, "Qwen3, 2 layers, 48 wide") != NULL, "%s", fi.summary);
    /* its plan: the same bytes, and a budget under them refused with both */
    uint64_t pb = 0;
    char what[300];
    df_family_opts po0 = {.n_ctx = 4096};
    TCHECKF(f->plan(dir, &po0, &pb, what, sizeof what, &err) == 0 && pb == family_bytes(&fi, 4096) &&
                strstr(what, "a state of 4096 positions"),
            "plan: %llu, %s", (unsigned long long)pb, err.code ? err.msg : what);
    po0.mem_budget = pb - 1;
    TCHECK(f->plan(dir, &po0, &pb, what, sizeof what, &err) == -1 && err.code == DF_ERR_NOMEM);
    df_err_clear(&err);
    /* the table's pass gives qwen3.c's bits: all rows, the last row, after a truncation */
    const kernel_table *kt = kernels_select(NULL, &err);
    TCHECK(kt != NULL);
    qwen3_set_kernels(m, kt);
    float *want = eval_chunks(m, N_IDS, 0);
    df_family_model *fm = NULL;
    df_family_state *fs = NULL;
    size_t V = (size_t)c->vocab;
    float *lg = xmalloc((size_t)N_IDS * V * sizeof *lg), *last = xmalloc(V * sizeof *last);
    df_family_opts fo = {.kt = kt, .n_threads = 2};
    TCHECKF(f->open(dir, &fo, &fm, &err) == 0 && f->vocab(fm) == c->vocab && f->state_new(fm, 64, &fs, &err) == 0,
            "%s", err.msg);
    if (fm && fs) {
        TCHECK(f->forward(fm, fs, IDS, N_IDS, lg, 0, &err) == 0 && f->pos(fs) == N_IDS);
        TCHECKF(!memcmp(lg, want, (size_t)N_IDS * V * sizeof *lg), "the family's rows differ from qwen3_eval's");
        TCHECK(f->truncate(fs, 7) == 7 && f->pos(fs) == 7 && f->mark(fs, &err) == 0);
        TCHECK(f->forward(fm, fs, IDS + 7, N_IDS - 7, last, 1, &err) == 0 && f->pos(fs) == N_IDS);
        TCHECKF(!memcmp(last, want + (size_t)(N_IDS - 1) * V, V * sizeof *last),
                "the last row after a truncation differs");
        TCHECK(f->forward(fm, fs, IDS, 0, last, 1, &err) == -1);
        /* past one chunk of rows (Q3_ROWS, 32): 75 ids at once give the bits of one at a time */
        enum { LONG = 75 };
        int32_t lids[LONG];
        for (int i = 0; i < LONG; i++) lids[i] = (int32_t)((i * 37 + 11) % c->vocab);
        float *all = xmalloc((size_t)LONG * V * sizeof *all), *one = xmalloc(V * sizeof *one);
        df_family_state *fa = NULL, *f1 = NULL;
        TCHECKF(f->state_new(fm, 128, &fa, &err) == 0 && f->forward(fm, fa, lids, LONG, all, 0, &err) == 0 &&
                    f->state_new(fm, 128, &f1, &err) == 0,
                "%s", err.msg);
        int same = 1;
        for (int i = 0; f1 && i < LONG; i++)
            same &= f->forward(fm, f1, lids + i, 1, one, 1, &err) == 0 && !memcmp(one, all + (size_t)i * V, V * sizeof *one);
        TCHECKF(same, "75 ids in one call differ from one at a time");
        if (f1) f->state_free(f1);
        if (fa) f->state_free(fa);
        free(all), free(one);
    }
    if (fs) f->state_free(fs);
    if (fm) f->close(fm);
    free(lg), free(last), free(want);
    qwen3_free(m);
    /* the engine (open and plan) refuses it, naming what it is for */
    df_engine_opts eo;
    df_engine_opts_default(&eo);
    eo.quiet = 1;
    df_engine *eng = NULL;
    df_err_clear(&err);
    TCHECKF(df_engine_open(dir, &eo, &eng, &err) == -1 && !eng && strstr(err.msg, "Qwen3") &&
                strstr(err.msg, "--draft model:"),
            "%s", err.msg);
    df_plan_opts po = {0};
    df_plan pl;
    df_err_clear(&err);
    TCHECKF(df_plan_model(dir, &po, &pl, NULL, &err) == -1 && strstr(err.msg, "Qwen3") &&
                strstr(err.msg, "--draft model:"),
            "%s", err.msg);
    /* an unknown type: named, with the types known */
    snprintf(sh, sizeof sh, "sed -i 's/\"model_type\": \"qwen3\"/\"model_type\": \"llama\"/' %s/config.json", dir);
    TCHECK(system(sh) == 0);
    df_err_clear(&err);
    TCHECKF(!family_of(dir, &err) && strstr(err.msg, "\"llama\"") && strstr(err.msg, "\"qwen3\"") &&
                strstr(err.msg, "\"kimi_k3\""),
            "%s", err.msg);
    /* K3: the default model's folder */
    const char *k3 = "models/k3-mini";
    struct stat sb;
    if (stat(k3, &sb) == 0) {
        df_err_clear(&err);
        f = family_of(k3, &err);
        TCHECKF(f == &df_family_k3 && f->target && f->forward && f->info(k3, &fi, &err) == 0, "%s", err.msg);
        uint64_t files = 0;
        DIR *d = opendir(k3);
        struct dirent *e;
        char p[1200];
        while (d && (e = readdir(d)))
            if (strstr(e->d_name, ".safetensors") && !strstr(e->d_name, ".json")) {
                snprintf(p, sizeof p, "%s/%s", k3, e->d_name);
                if (stat(p, &sb) == 0) files += (uint64_t)sb.st_size;
            }
        if (d) closedir(d);
        TCHECKF(fi.weight_bytes == files && files > 0 && fi.layers > 0 && fi.vocab > 0,
                "K3 info: %llu bytes against %llu", (unsigned long long)fi.weight_bytes, (unsigned long long)files);
    }
    test_scratch_remove();
}

/* K3 through the family table (families.h: the engine behind it): the
 * rows of a state equal df_session_eval's on an engine opened directly,
 * at another thread count; truncate after the mark reaches the position
 * and gives the bits of a state that only saw that prefix; before the mark
 * it returns 0 with the state emptied; its plan is the engine's. */
static void test_family_k3(void)
{
    const char *k3 = "models/k3-mini";
    struct stat sb;
    if (stat(k3, &sb) != 0) TSKIP("no models/k3-mini here");
    enum { N = 24 };
    int32_t ids[N];
    for (int i = 0; i < N; i++) ids[i] = (int32_t)((i * 131 + 7) % 3000);
    df_error err = {0};
    df_engine_opts eo;
    df_engine_opts_default(&eo);
    eo.quiet = 1;
    eo.n_threads = 1;
    eo.no_prefetch = 1;
    df_engine *eng = NULL;
    df_session *s = NULL;
    df_session_opts so = {.n_ctx = 256, .max_batch = 8};
    TCHECKF(df_engine_open(k3, &eo, &eng, &err) == 0 && df_session_new(eng, &so, &s, &err) == 0, "%s", err.msg);
    if (!s) {
        df_engine_close(eng);
        return;
    }
    df_model_info info;
    df_engine_info(eng, &info);
    size_t V = (size_t)info.vocab;
    float *want = xmalloc((size_t)N * V * sizeof *want), *got = xmalloc((size_t)N * V * sizeof *got);
    float *last = xmalloc(V * sizeof *last);
    TCHECKF(df_session_eval(s, ids, N, want, 1, &err) == 0, "%s", err.msg);
    df_session_free(s);
    df_engine_close(eng);

    const df_family *f = family_of(k3, &err);
    TCHECKF(f == &df_family_k3, "%s", f ? f->name : err.msg);
    df_family_model *fm = NULL;
    df_family_state *fs = NULL;
    df_family_opts fo = {.n_threads = 2, .mem_budget = (uint64_t)1 << 30, .n_ctx = 256, .max_rows = 16, .rollback = 18};
    TCHECKF(f->open(k3, &fo, &fm, &err) == 0 && f->vocab(fm) == (int)V && f->state_new(fm, 256, &fs, &err) == 0, "%s",
            err.msg);
    if (fm && fs) {
        TCHECKF(f->forward(fm, fs, ids, N, got, 0, &err) == 0 && f->pos(fs) == N, "%s", err.msg);
        TCHECKF(!memcmp(got, want, (size_t)N * V * sizeof *got), "the table's rows differ from df_session_eval's");
        /* mark at 10, then back to 14 and to 10: the bits of the prefix */
        TCHECK(f->truncate(fs, 10) == 0 && f->pos(fs) == 0); /* no mark: emptied */
        TCHECK(f->forward(fm, fs, ids, 10, NULL, 0, &err) == 0 && f->mark(fs, &err) == 0);
        TCHECK(f->forward(fm, fs, ids + 10, N - 10, NULL, 0, &err) == 0 && f->pos(fs) == N);
        TCHECK(f->truncate(fs, 14) == 14 && f->pos(fs) == 14);
        TCHECK(f->forward(fm, fs, ids + 14, N - 14, last, 1, &err) == 0);
        TCHECKF(!memcmp(last, want + (size_t)(N - 1) * V, V * sizeof *last), "the last row after truncate(14) differs");
        TCHECK(f->truncate(fs, 10) == 10 && f->forward(fm, fs, ids + 10, 1, last, 1, &err) == 0);
        TCHECKF(!memcmp(last, want + 10 * V, V * sizeof *last), "row 10 after truncate(10) differs");
        /* before the mark: emptied, and evaluated again from 0 the same */
        TCHECK(f->truncate(fs, 4) == 0 && f->pos(fs) == 0);
        TCHECK(f->forward(fm, fs, ids, 5, last, 1, &err) == 0);
        TCHECKF(!memcmp(last, want + 4 * V, V * sizeof *last), "row 4 after an emptied state differs");
        TCHECK(f->truncate(fs, f->pos(fs)) == 5); /* the current position: nothing to do */
    }
    if (fs) f->state_free(fs);
    if (fm) f->close(fm);
    /* its plan is df_plan_model's for one session as the table opens it */
    uint64_t bytes = 0;
    char what[300];
    df_plan_opts po = {.mem_budget = (size_t)1 << 30, .n_ctx = 256, .max_batch = 16, .rollback_rows = 18, .n_threads = 2};
    df_plan p;
    TCHECKF(f->plan(k3, &fo, &bytes, what, sizeof what, &err) == 0 && df_plan_model(k3, &po, &p, NULL, &err) == 0 &&
                bytes == p.used && bytes > 0 && strstr(what, "trunk resident"),
            "%llu against %llu: %s", (unsigned long long)bytes, (unsigned long long)p.used, err.code ? err.msg : what);
    free(want), free(got), free(last);
}

static const test_case tests[] = {
    {"against_reference", test_against_reference},
    {"refused", test_refused},
    {"family", test_family},
    {"family_k3", test_family_k3},
};

int main(int argc, char **argv) { return test_main(tests, NTESTS(tests), argc, argv); }
