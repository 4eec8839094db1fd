/* setup_drafter.c - `deltafin setup --drafter ORG/NAME --out MODEL_DIR`:
 * a draft model installed beside the model it drafts for, at
 * MODEL_DIR/drafters/NAME, by the same resumable, verified download as
 * `setup --full` (setup.c), so `--draft model:MODEL_DIR/drafters/NAME`
 * and `plan --draft` find it.
 *
 * Before anything is downloaded: the target must be installed (its
 * config.json), and the drafter's own config.json (fetched alone) must
 * name a family deltafin reads (families.h: "qwen3", K3's types); any
 * of them drafts, with the target's tokenizer directly and with another
 * translated (draft_xtok.c), which --draft decides when it opens it.  The listing is cut to what a
 * drafter needs (config, tokenizer and generation files, the safetensors
 * and their index); other weight formats and files (PyTorch .bin, ONNX,
 * GGUF, images) are left on the mirror and named.  After publishing, the
 * command to use it and what it costs (plan --draft's figures).
 */
#define _GNU_SOURCE
#include "setup_impl.h"
#include "families.h"
#include "util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* What a drafter needs of a repository: its config, tokenizer and
 * generation files and its safetensors (with their index). */
static int drafter_needs(const char *path)
{
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    static const char *const names[] = {"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                                        "vocab.json", "merges.txt", "special_tokens_map.json", "tiktoken.model",
                                        "model.safetensors.index.json"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (!strcmp(path, names[i])) return 1;
    size_t n = strlen(base);
    return base == path && n > 12 && !strcmp(base + n - 12, ".safetensors");
}

int drafter_prepare(setup *S, const char *model_dir, df_error *err)
{
    /* the target's family, from its installed config */
    char path[4200], target_type[64], draft_type[64];
    snprintf(path, sizeof path, "%s/config.json", model_dir);
    char *text = NULL;
    size_t n = 0;
    if (read_small_file(path, &text, &n, 1 << 24, err))
        return df_err_prefix(err, "--drafter installs beside a model: %s", model_dir), -1;
    int rc = family_config_type(text, n, path, target_type, sizeof target_type, err);
    free(text);
    if (rc) return -1;
    /* the drafter's family, from its config.json alone */
    int has_config = 0;
    for (int i = 0; i < S->n_files; i++) has_config |= !strcmp(S->files[i].path, "config.json");
    if (!has_config)
        return df_err_set(err, DF_ERR_FORMAT, -1, "%s at %s has no config.json: not a model deltafin can draft with",
                          S->repo, S->commit);
    char url[4096];
    snprintf(url, sizeof url, "%s/%s/resolve/%s/config.json", S->base, S->repo, S->commit);
    text = NULL;
    if (setup_get(S, url, NULL, &text, &n, 1 << 24, NULL, 0, err)) return -1;
    rc = family_config_type(text, n, url, draft_type, sizeof draft_type, err);
    free(text);
    if (rc) return -1;
    /* a model of any family deltafin knows (families.h) drafts: with the
     * target's tokenizer directly, with another translated */
    if (!family_named(draft_type))
        return df_err_set(err, DF_ERR_FORMAT, -1,
                          "%s is a \"%s\" model, of no family deltafin reads: it drafts with Qwen3 models (\"qwen3\") "
                          "and K3 models (\"%s\", as %s)",
                          S->repo, draft_type[0] ? draft_type : "(no model_type)", target_type, model_dir);
    /* the listing cut to what a drafter needs */
    int kept = 0, skipped = 0, weights = 0;
    uint64_t skipped_bytes = 0;
    for (int i = 0; i < S->n_files; i++) {
        setup_file f = S->files[i];
        if (drafter_needs(f.path)) {
            weights += strstr(f.path, ".safetensors") && !strstr(f.path, ".index.json");
            S->files[kept++] = f;
            continue;
        }
        if (skipped < 8) fprintf(stderr, "deltafin: setup: --drafter leaves %s on the mirror (not needed)\n", f.path);
        skipped++;
        skipped_bytes += f.size;
        free(f.path);
    }
    if (skipped > 8) fprintf(stderr, "deltafin: setup: ... and %d more files\n", skipped - 8);
    if (skipped)
        fprintf(stderr, "deltafin: setup: %d files (%.3f GB) not fetched: a drafter needs its config, tokenizer and "
                        "safetensors\n", skipped, (double)skipped_bytes / 1e9);
    S->n_files = kept;
    if (!weights)
        return df_err_set(err, DF_ERR_FORMAT, -1,
                          "%s at %s has no .safetensors weights (a GGUF drafter: download the file and pass "
                          "--draft model:FILE.gguf)", S->repo, S->commit);
    fprintf(stderr, "deltafin: setup: drafter %s (%s) for %s (%s): its tokenizer is compared with the target's when "
                    "--draft opens it (the same: it drafts the target's ids; another: its drafts are translated)\n",
            S->repo, draft_type, model_dir, target_type);
    return 0;
}

void drafter_installed(const char *model_dir, const char *dir)
{
    fprintf(stderr, "deltafin: setup: drafter ready: --draft model:%s (with --model %s)\n", dir, model_dir);
    df_error err = {0};
    const df_family *fam = family_of(dir, &err);
    uint64_t bytes = 0;
    char what[300];
    df_family_opts o = {.n_threads = 1, .n_ctx = 4096, .max_rows = 64};
    if (fam && !fam->target && !fam->plan(dir, &o, &bytes, what, sizeof what, &err)) {
        fprintf(stderr,
                "deltafin: setup: it takes %.2f GiB at a 4,096-position state (%s), charged to --draft-mem (default "
                "an eighth of --mem): "
                "`deltafin plan --model %s --draft model:%s` shows the budget\n",
                (double)bytes / (1u << 30), what, model_dir, dir);
    } else
        fprintf(stderr, "deltafin: setup: `deltafin plan --model %s --draft model:%s` shows what it takes of --mem\n",
                model_dir, dir);
}
