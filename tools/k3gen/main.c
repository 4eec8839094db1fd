/*
 * k3gen: writes a Kimi-K3-layout test checkpoint directory (config.json, index json,
 * model-NNNNN-of-NNNNNN.safetensors shards, tiktoken.model, tokenizer_config.json)
 * with deterministic random weights at any size (presets + --set), optionally the
 * same model as a llama.cpp kimi-k3 GGUF (--gguf), a GGUF converted from an existing
 * checkpoint (--from), or only the tokenizer (--tokenizer-only). Layout follows
 * shared/docs/k3-architecture.md sections 2, 3, 3.1, 8, 9.1 and reproduces
 * shared/fixtures/k3-tiny-a/checkpoint byte for byte in everything but the values
 * and tiktoken.model (preset tiny-a-shape). This file owns the command line only.
 * Deliberately independent of src/: k3gen does not link libdeltafin and includes
 * no src/ header but the one clock (src/base/clock.h, compiled alone: timing lines
 * only, nothing it writes depends on it). It re-implements the safetensors/index/config/tiktoken/GGUF writers,
 * the safetensors reader behind --from and the MXFP4/BF16 encodings on its own, so
 * that it is an independent oracle for the engine's loaders (a bug shared by the
 * engine and its test generator would pass unseen). Self-contained: libc + libm.
 * Files: k3gen.h (shared types), util.c (errors, buffers, rng seed, output files),
 * model.c (config, presets, roster, config.json), weights.c (tensor bytes),
 * safetensors.c (shards + index), source.c (--from reader), tokenizer.c (BPE
 * trainer, tiktoken files), gguf.c (GGUF writer).
 */
#include "k3gen.h"
#include "clock.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: k3gen --out DIR [--preset NAME] [--seed N] [--set key=value ...]\n"
            "             [--shard-max-mb N | --shards N] [--force] [--dry-run]\n"
            "             [--gguf FILE [--gguf-f32]]\n"
            "       k3gen --from DIR --gguf FILE [--gguf-f32] [--preset NAME] [--set key=value ...]\n"
            "       k3gen --out DIR --tokenizer-only [--tokenizer-corpus FILE] [--set vocab_size=V]\n"
            "Writes a Kimi-K3-layout checkpoint with deterministic random weights.\n"
            "  --out DIR          output directory (created; must be empty unless --force)\n"
            "  --preset NAME      size preset (default tiny):\n");
    for (size_t i = 0; i < n_presets; i++)
        fprintf(f, "                       %-13s %s\n", presets[i].name, presets[i].about);
    fprintf(f,
            "  --seed N           weight seed (default 0); the tokenizer depends only on vocab_size\n"
            "  --set key=value    override a text_config size; keys:\n"
            "                      ");
    for (size_t i = 0; i < n_cfg_keys; i++)
        fprintf(f, "%s%s", cfg_keys[i].key,
                i + 1 < n_cfg_keys ? (i % 4 == 3 ? ",\n                      " : ", ") : "\n");
    fprintf(f,
            "                     mla_every=N: MLA at 1-based layers N, 2N, ... and the last layer\n"
            "  --shard-max-mb N   start a new shard before a layer that would push it past N MiB\n"
            "                     (a layer never spans shards; default: per preset, else 4096)\n"
            "  --shards N         split the layers into N shards by count (as k3-tiny-a: 5,4,4)\n"
            "  --force            write into a non-empty DIR (removes its old shards/index)\n"
            "  --dry-run          print the summary without writing anything\n"
            "  --gguf FILE        also write the same model as one GGUF v3 file in llama.cpp's\n"
            "                     kimi-k3 layout (experts as 3-D MXFP4 tensors, same values)\n"
            "  --gguf-f32         write every GGUF tensor as F32 (MXFP4 dequantized exactly)\n"
            "  --gguf-trunk T     the GGUF's 2-D trunk matrices as q8_0 or f16 (ggml's rounding), or\n"
            "                     q8_0-values (F32 holding exactly the values the q8_0 file stores)\n"
            "  --gguf-experts T   the GGUF's routed experts requantized from their MXFP4 values to\n"
            "                     q8_0 (ggml's rounding), or q8_0-values (F32 of what that file stores)\n"
            "  --gguf-split N     write the GGUF as N files the way llama.cpp's gguf-split does\n"
            "                     (FILE-00001-of-0000N.gguf, ...; metadata in the first)\n"
            "  --from DIR         write only the GGUF, its tensor bytes read from the existing\n"
            "                     safetensors checkpoint DIR (index weight_map, else every shard);\n"
            "                     --preset/--set must give DIR's shape: each tensor is checked\n"
            "                     for name, dtype and shape; tokenizer/metadata are k3gen's\n"
            "  --tokenizer-corpus FILE  train the BPE merges on FILE's text instead of the\n"
            "                     built-in corpus (digit runs excluded: digits stay single tokens)\n"
            "  --tokenizer-only   write only tiktoken.model and tokenizer_config.json into DIR\n");
}

static long parse_long(const char *s, const char *what)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 0);
    if (errno || end == s || *end)
        die("%s: '%s' is not an integer", what, s);
    return v;
}

/* The command line, as given. */
typedef struct args {
    const char *out, *preset_name, *gguf_path, *from;
    int gguf_f32, gguf_split;
    uint64_t seed;
    int force, dry_run, shards, tok_only;
    long shard_max_mb;
    const char **sets;
    int nsets;
} args;

/* Fills a; returns 1 for --help (usage printed), 0 otherwise; dies on a bad
 * argument. */
static int parse_args(int argc, char **argv, args *o)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
#define NEED_ARG()                                                                          \
    do {                                                                                    \
        if (i + 1 >= argc)                                                                  \
            die("option %s needs an argument (see --help)", a);                            \
    } while (0)
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 1;
        } else if (!strcmp(a, "--out")) {
            NEED_ARG();
            o->out = argv[++i];
        } else if (!strcmp(a, "--preset")) {
            NEED_ARG();
            o->preset_name = argv[++i];
        } else if (!strcmp(a, "--seed")) {
            NEED_ARG();
            char *end;
            errno = 0;
            o->seed = strtoull(argv[++i], &end, 0);
            if (errno || end == argv[i] || *end || argv[i][0] == '-')
                die("--seed: '%s' is not a non-negative integer", argv[i]);
        } else if (!strcmp(a, "--set")) {
            NEED_ARG();
            o->sets[o->nsets++] = argv[++i];
        } else if (!strcmp(a, "--shard-max-mb")) {
            NEED_ARG();
            o->shard_max_mb = parse_long(argv[++i], "--shard-max-mb");
            if (o->shard_max_mb < 1)
                die("--shard-max-mb must be >= 1");
        } else if (!strcmp(a, "--shards")) {
            NEED_ARG();
            long s = parse_long(argv[++i], "--shards");
            if (s < 1 || s > 99999)
                die("--shards must be in 1..99999");
            o->shards = (int)s;
        } else if (!strcmp(a, "--force")) {
            o->force = 1;
        } else if (!strcmp(a, "--dry-run")) {
            o->dry_run = 1;
        } else if (!strcmp(a, "--gguf")) {
            NEED_ARG();
            o->gguf_path = argv[++i];
        } else if (!strcmp(a, "--gguf-f32")) {
            o->gguf_f32 = 1;
        } else if (!strcmp(a, "--gguf-trunk")) {
            NEED_ARG();
            gg_set_trunk(argv[++i]);
        } else if (!strcmp(a, "--gguf-experts")) {
            NEED_ARG();
            gg_set_experts(argv[++i]);
        } else if (!strcmp(a, "--gguf-split")) {
            NEED_ARG();
            long v = parse_long(argv[++i], "--gguf-split");
            if (v < 1 || v > 99999)
                die("--gguf-split wants 1 to 99999 files, not %ld", v);
            o->gguf_split = (int)v;
        } else if (!strcmp(a, "--from")) {
            NEED_ARG();
            o->from = argv[++i];
        } else if (!strcmp(a, "--tokenizer-corpus")) {
            NEED_ARG();
            g_tok_corpus = argv[++i];
        } else if (!strcmp(a, "--tokenizer-only")) {
            o->tok_only = 1;
        } else {
            die("unknown argument '%s' (see --help)", a);
        }
#undef NEED_ARG
    }
    return 0;
}

/* The combinations the options refuse. */
static void check_args(const args *o)
{
    if (o->from && o->out)
        die("--from writes only the GGUF (--gguf FILE); --out is not used with --from");
    if (o->from && !o->gguf_path)
        die("--from DIR needs --gguf FILE (it converts DIR's safetensors to one GGUF)");
    if (!o->out && !o->dry_run && !o->from)
        die("--out DIR is required (see --help)");
    if (o->shards > 0 && o->shard_max_mb > 0)
        die("--shards and --shard-max-mb are mutually exclusive");
    if (o->gguf_split > 1 && (!o->gguf_path || strlen(o->gguf_path) < 6 ||
                              strcmp(o->gguf_path + strlen(o->gguf_path) - 5, ".gguf")))
        die("--gguf-split needs --gguf FILE ending in .gguf (the files are FILE-00001-of-0000N.gguf, ...)");
    if (o->gguf_f32 && !o->gguf_path)
        die("--gguf-f32 needs --gguf FILE");
    if (g_tok_corpus && (o->gguf_path || o->from))
        die("--tokenizer-corpus: the GGUF writer has only the built-in tokenizer");
    if (o->tok_only && (!o->out || o->dry_run || o->gguf_path || o->from))
        die("--tokenizer-only needs --out DIR and no --dry-run/--gguf/--from");
}

/* The preset with the --set overrides applied and validated, and the
 * preset's shard layout when none was asked for; NULL (printed) when the
 * preset is unknown. */
static const preset *make_cfg(args *o, model_cfg *cfg)
{
    const preset *pr = NULL;
    for (size_t i = 0; i < n_presets; i++)
        if (!strcmp(presets[i].name, o->preset_name))
            pr = &presets[i];
    if (!pr) {
        fprintf(stderr, "k3gen: error: unknown preset '%s'; known:", o->preset_name);
        for (size_t i = 0; i < n_presets; i++)
            fprintf(stderr, " %s", presets[i].name);
        fputc('\n', stderr);
        return NULL;
    }
    *cfg = pr->cfg;
    for (int i = 0; i < o->nsets; i++) {
        const char *eq = strchr(o->sets[i], '=');
        if (!eq)
            die("--set '%s': expected key=value", o->sets[i]);
        char key[128];
        size_t kl = (size_t)(eq - o->sets[i]);
        if (kl == 0 || kl >= sizeof key)
            die("--set '%s': bad key", o->sets[i]);
        memcpy(key, o->sets[i], kl);
        key[kl] = 0;
        long *f = cfg_field(cfg, key);
        if (!f)
            die("--set: unknown key '%s' (see --help for the list)", key);
        *f = parse_long(eq + 1, key);
    }
    validate_cfg(cfg);
    if (o->shards < 0 && o->shard_max_mb < 0) {
        o->shards = pr->shards;
        o->shard_max_mb = pr->shard_max_mb > 0 ? pr->shard_max_mb : 4096;
    }
    if (o->gguf_path && cfg->moe_layer_freq != 1)
        die("--gguf: moe_layer_freq = %ld cannot be expressed in llama.cpp's kimi-k3 layout "
            "(dense layers are exactly those below leading_dense_block_count)", cfg->moe_layer_freq);
    if (o->shards > 0 && o->shards > cfg->num_hidden_layers)
        die("%d shards requested but only %ld layers (a layer never spans shards); "
            "use --shards or --shard-max-mb", o->shards, cfg->num_hidden_layers);
    return pr;
}

/* --from: DIR's safetensors converted to one GGUF (or checked, --dry-run). */
static void convert_from(const args *o, const preset *pr, const model_cfg *cfg, tensor_list *tl, long nmla, double t0)
{
    static src_ckpt src;
    src_open(&src, o->from, tl); /* dies unless every roster tensor matches */
    g_src = &src;
    gg_set_from(o->from);
    uint64_t total = 0;
    for (size_t i = 0; i < tl->n; i++)
        total += tensor_bytes(&tl->t[i]);
    uint64_t gguf_bytes = o->dry_run ? 0 : write_gguf(o->gguf_path, cfg, tl, o->seed, o->gguf_f32, o->gguf_split);
    printf("k3gen: %s %s from %s: preset %s, V=%ld h=%ld layers=%ld (%ld KDA, %ld MLA) "
           "E=%ld; %zu tensors, %llu bytes (%.1f MiB) read from %zu shard%s, %.2f s\n",
           o->dry_run ? "checked (dry run, not written)" : "wrote", o->gguf_path, o->from, pr->name,
           cfg->vocab_size, cfg->hidden_size, cfg->num_hidden_layers,
           cfg->num_hidden_layers - nmla, nmla, cfg->num_experts, tl->n,
           (unsigned long long)total, (double)total / (1 << 20), src.n,
           src.n == 1 ? "" : "s", now_sec() - t0);
    if (gguf_bytes)
        gg_report(o->gguf_path, o->gguf_split, o->gguf_f32, gguf_bytes);
    g_src = NULL;
    src_close(&src);
}

/* The checkpoint directory (and --gguf's file) from the random weights. */
static void generate(const args *o, const preset *pr, const model_cfg *cfg, tensor_list *tl, long nmla, double t0)
{
    int nshards = assign_shards(cfg, tl, o->shards > 0 ? o->shards : 0, o->shard_max_mb);

    if (!o->dry_run) {
        prepare_out_dir(o->out, o->force);
        write_config(o->out, cfg);
        write_tokenizer(o->out, cfg->vocab_size);
    }
    uint64_t total = write_shards(o->out, tl, nshards, o->seed, o->dry_run);
    uint64_t gguf_bytes = 0;
    if (o->gguf_path && !o->dry_run)
        gguf_bytes = write_gguf(o->gguf_path, cfg, tl, o->seed, o->gguf_f32, o->gguf_split);
    if (!o->dry_run)
        write_index(o->out, tl, nshards, total); /* last: marks the directory complete */

    printf("k3gen: %s %s: preset %s seed %llu, V=%ld h=%ld layers=%ld (%ld KDA, %ld MLA) "
           "E=%ld k=%ld I=%ld Lt=%ld; %llu bytes (%.1f MiB) in %d shard%s, %zu tensors, %.2f s\n",
           o->dry_run ? "would write" : "wrote", o->out ? o->out : "(dry run)", pr->name,
           (unsigned long long)o->seed, cfg->vocab_size, cfg->hidden_size, cfg->num_hidden_layers,
           cfg->num_hidden_layers - nmla, nmla, cfg->num_experts, cfg->num_experts_per_token,
           cfg->moe_intermediate_size, cfg->routed_expert_hidden_size, (unsigned long long)total,
           (double)total / (1 << 20), nshards, nshards == 1 ? "" : "s", tl->n, now_sec() - t0);
    if (gguf_bytes)
        gg_report(o->gguf_path, o->gguf_split, o->gguf_f32, gguf_bytes);
}

int main(int argc, char **argv)
{
    args o = {.preset_name = "tiny", .gguf_split = 1, .shards = -1, .shard_max_mb = -1};
    o.sets = xmalloc((size_t)argc * sizeof *o.sets);
    if (parse_args(argc, argv, &o))
        return 0;
    check_args(&o);
    model_cfg cfg;
    const preset *pr = make_cfg(&o, &cfg);
    if (!pr)
        return 1;

    double t0 = now_sec();
    if (o.tok_only) {
        /* only tiktoken.model + tokenizer_config.json; other files in DIR stay */
        if (mkdir(o.out, 0755) && errno != EEXIST)
            die("mkdir %s: %s", o.out, strerror(errno));
        int n = write_tokenizer(o.out, cfg.vocab_size);
        printf("k3gen: wrote the tokenizer to %s: V=%ld (%d BPE ranks + 256 specials), %.2f s\n", o.out,
               cfg.vocab_size, n, now_sec() - t0);
        free(o.sets);
        return 0;
    }
    tensor_list tl = {0};
    build_roster(&cfg, &tl);
    long nmla = 0;
    for (long l = 0; l < cfg.num_hidden_layers; l++)
        nmla += is_mla_layer(&cfg, l);
    if (o.from)
        convert_from(&o, pr, &cfg, &tl, nmla, t0);
    else
        generate(&o, pr, &cfg, &tl, nmla, t0);
    for (size_t i = 0; i < tl.n; i++)
        free(tl.t[i].name);
    free(tl.t);
    free(o.sets);
    return 0;
}
