/* llama_peer.c - runs llama.cpp (the prebuilt v0.4.0 from the npm package
 * @node-llama-cpp/linux-x64) on a GGUF file, for two jobs:
 *
 *   logits: the oracle.  Feeds a prompt (token ids) and writes the logits of
 *           every position as raw little-endian f32 [n_pos][n_vocab], with
 *           an F32 KV cache and flash attention off, so that on an all-F32
 *           GGUF the only rounding left is llama.cpp's own f32 arithmetic.
 *           --greedy N then decodes N tokens by argmax and prints the ids.
 *   bench:  the speed peer of `deltafin bench --vs-llama`.  Prefills the
 *           prompt in one batch, decodes N tokens greedily one at a time and
 *           prints one JSON line: prefill and decode tok/s, the ids, bytes
 *           read from storage (/proc/self/io) during the run.
 *
 *   tokenize: --tokenize CASES loads only the vocabulary and prints the ids
 *           of each case (a line of base64 text) with llama_tokenize,
 *           specials parsed and nothing added: the tokenizer oracle.
 *
 * llama.h is not installed by the package, so the handful of declarations
 * this program uses are written below from the v0.4.0 header's documented
 * layout.  The structs are passed by value, so their layout must match that
 * release exactly; check_layout() compares the defaults the library returns
 * with the documented ones and refuses to run on a mismatch instead of
 * passing garbage.  Built only when the package is installed (Makefile
 * target build/llama_peer).
 */
#define _GNU_SOURCE
#include "clock.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- declarations of the llama.cpp v0.4.0 C API used here ---- */
struct llama_model;
struct llama_context;
struct llama_vocab;
typedef int32_t llama_token;
typedef int32_t llama_pos;
typedef int32_t llama_seq_id;

struct lp_model_params {
    void *devices;
    const void *tensor_buft_overrides;
    int32_t n_gpu_layers;
    int32_t split_mode;
    int32_t load_mode;   /* -1 auto, 0 none (read), 1 mmap, 4 direct io */
    int32_t lazy_mode;   /* 0 off, 1 auto, 2 on */
    int32_t main_gpu;
    const float *tensor_split;
    bool (*progress_callback)(float, void *);
    void *progress_callback_user_data;
    const void *kv_overrides;
    bool vocab_only, check_tensors, use_extra_bufts, no_host, no_alloc, load_mtp;
};

struct lp_context_params {
    uint32_t n_ctx, n_batch, n_ubatch, n_seq_max, n_rs_seq, n_outputs_max, n_outputs_max_per_seq;
    int32_t n_threads, n_threads_batch;
    int32_t ctx_type, rope_scaling_type, pooling_type, attention_type, flash_attn_type;
    float rope_freq_base, rope_freq_scale, yarn_ext_factor, yarn_attn_factor, yarn_beta_fast,
        yarn_beta_slow;
    uint32_t yarn_orig_ctx;
    float defrag_thold;
    void *cb_eval;
    void *cb_eval_user_data;
    int32_t type_k, type_v; /* ggml types: 0 = F32, 1 = F16 */
    void *abort_callback;
    void *abort_callback_data;
    bool embeddings, offload_kqv, no_perf, op_offload, swa_full, kv_unified;
    void *samplers;
    size_t n_samplers;
    struct llama_context *ctx_other;
};

struct lp_batch {
    int32_t n_tokens;
    llama_token *token;
    float *embd;
    llama_pos *pos;
    int32_t *n_seq_id;
    llama_seq_id **seq_id;
    int8_t *logits;
};

void ggml_backend_load_all_from_path(const char *dir_path);

/* llama.h's llama_model_quantize_params and llama_model_tensor_override */
struct lp_tensor_override {
    const char *pattern;
    int32_t type;              /* enum ggml_type */
};
struct lp_quantize_params {
    int32_t nthread;
    int32_t ftype;             /* enum llama_ftype: 1 F16, 7 Q8_0 */
    int32_t output_tensor_type, token_embedding_type;
    bool allow_requantize, quantize_output_tensor, only_copy, pure, keep_split, dry_run;
    const void *imatrix;
    const void *kv_overrides;
    const struct lp_tensor_override *tt_overrides; /* ends with a NULL pattern */
    const int32_t *prune_layers;
    size_t max_buf_size;
};
struct lp_quantize_params llama_model_quantize_default_params(void);
uint32_t llama_model_quantize(const char *fname_inp, const char *fname_out, const struct lp_quantize_params *params);

void llama_backend_init(void);
void llama_backend_free(void);
void llama_log_set(void (*cb)(int level, const char *text, void *ud), void *ud);
struct lp_model_params llama_model_default_params(void);
struct lp_context_params llama_context_default_params(void);
struct llama_model *llama_model_load_from_file(const char *path, struct lp_model_params p);
void llama_model_free(struct llama_model *m);
struct llama_context *llama_init_from_model(struct llama_model *m, struct lp_context_params p);
void llama_free(struct llama_context *c);
const struct llama_vocab *llama_model_get_vocab(const struct llama_model *m);
int32_t llama_vocab_n_tokens(const struct llama_vocab *v);
struct lp_batch llama_batch_init(int32_t n_tokens, int32_t embd, int32_t n_seq_max);
void llama_batch_free(struct lp_batch b);
int32_t llama_decode(struct llama_context *c, struct lp_batch b);
float *llama_get_logits_ith(struct llama_context *c, int32_t i);
int32_t llama_tokenize(const struct llama_vocab *v, const char *text, int32_t text_len, llama_token *tokens,
                       int32_t n_tokens_max, bool add_special, bool parse_special);

/* ---- the program ---- */
static int g_verbose;

static void log_cb(int level, const char *text, void *ud)
{
    (void)ud;
    /* ggml log levels: 2 info, 3 warn, 4 error; 5 continues the previous */
    if (g_verbose || level == 4)
        fputs(text, stderr);
}

static void die(const char *fmt, const char *arg)
{
    fprintf(stderr, "llama_peer: ");
    fprintf(stderr, fmt, arg);
    fputc('\n', stderr);
    exit(1);
}

static void check_layout(const struct lp_model_params *mp, const struct lp_context_params *cp)
{
    int ok = mp->n_gpu_layers == -1 && mp->load_mode == -1 && mp->lazy_mode == 1 &&
             mp->use_extra_bufts && !mp->vocab_only && !mp->load_mtp && cp->n_ctx == 512 &&
             cp->n_batch == 2048 && cp->n_ubatch == 512 && cp->n_seq_max == 1 &&
             cp->n_outputs_max_per_seq == 1 && cp->flash_attn_type == -1 &&
             cp->yarn_ext_factor == -1.0f && cp->defrag_thold == -1.0f && cp->type_k == 1 &&
             cp->type_v == 1 && cp->offload_kqv && cp->no_perf && cp->swa_full && !cp->kv_unified &&
             cp->samplers == NULL && cp->n_samplers == 0 && cp->ctx_other == NULL;
    if (!ok)
        die("%s", "the library's default parameters do not match the llama.cpp v0.4.0 layout "
                  "this program declares (a different llama.cpp build?)");
}

static unsigned long long proc_read_bytes(void)
{
    FILE *f = fopen("/proc/self/io", "r");
    unsigned long long v = 0;
    char line[128];
    if (!f)
        return 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "read_bytes: %llu", &v) == 1)
            break;
    fclose(f);
    return v;
}

/* peak resident set since exec (VmHWM, KiB): a parent's ru_maxrss would
 * also count what the forking parent had resident */
static long proc_peak_rss_kb(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    long v = -1;
    char line[128];
    if (!f)
        return -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "VmHWM: %ld", &v) == 1)
            break;
    fclose(f);
    return v;
}

/* "1,2,3" (commas and/or white space), or "@FILE" holding such a list
 * (deltafin bench passes its prompt that way: longer than one argument) */
static int parse_ids(const char *s, llama_token **out)
{
    char *file_text = NULL;
    if (s[0] == '@') {
        FILE *f = fopen(s + 1, "rb");
        if (!f)
            die("cannot open %s", s + 1);
        size_t n = 0, cap = 1 << 16;
        file_text = malloc(cap + 1);
        for (size_t got; file_text && (got = fread(file_text + n, 1, cap - n, f)) > 0;) {
            n += got;
            if (n == cap) {
                cap *= 2;
                file_text = realloc(file_text, cap + 1);
            }
        }
        fclose(f);
        if (!file_text)
            die("%s", "out of memory");
        file_text[n] = 0;
        s = file_text;
    }
    int n = 0, cap = 16;
    llama_token *v = malloc((size_t)cap * sizeof *v);
    while (v && *s) {
        char *end;
        long x = strtol(s, &end, 10);
        if (end == s || x < 0 || x > INT32_MAX)
            die("bad token id list at '%s'", s);
        if (n == cap) {
            cap *= 2;
            llama_token *nv = realloc(v, (size_t)cap * sizeof *v);
            if (!nv)
                break;
            v = nv;
        }
        v[n++] = (llama_token)x;
        s = end;
        while (*s == ',' || *s == ' ' || *s == '\n' || *s == '\t' || *s == '\r')
            s++;
    }
    free(file_text);
    if (!v)
        die("%s", "out of memory");
    *out = v;
    return n;
}

static int argmax(const float *x, int n)
{
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b])
            b = i;
    return b;
}

/* Feeds n tokens starting at position pos0; outputs logits for all of them
 * (all_logits) or the last only. */
static int feed(struct llama_context *ctx, struct lp_batch *b, const llama_token *ids, int n, int pos0,
                int all_logits)
{
    b->n_tokens = n;
    for (int i = 0; i < n; i++) {
        b->token[i] = ids[i];
        b->pos[i] = pos0 + i;
        b->n_seq_id[i] = 1;
        b->seq_id[i][0] = 0;
        b->logits[i] = (int8_t)(all_logits || i == n - 1);
    }
    return llama_decode(ctx, *b);
}

/* ggml type ids of the expert types --quantize-experts names */
static int ggml_type_named(const char *name)
{
    static const struct {
        const char *name;
        int type;
    } t[] = {{"f32", 0},    {"f16", 1},   {"q4_0", 2},  {"q4_1", 3},  {"q5_0", 6},   {"q5_1", 7},  {"q8_0", 8},
             {"q2_k", 10},  {"q3_k", 11}, {"q4_k", 12}, {"q5_k", 13}, {"q6_k", 14},  {"iq4_nl", 20},
             {"bf16", 30}};
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
        if (!strcmp(name, t[i].name)) return t[i].type;
    return -1;
}

/* llama.cpp's own quantizer (what llama-quantize runs): IN to OUT with the
 * trunk in `type`.  experts: "keep" leaves the routed experts as they are
 * (MXFP4, as K3's release ships them: the tensor override names them with
 * their own type, so they are copied, not requantized); "mix" lets the
 * ftype's own rules requantize them (a K-quant mix gives some layers' down
 * projections more bits, as the small-file recipes do); a type name
 * (q4_k, f32, ...) requantizes all three to it. */
static int quantize_file(const char *in, const char *out, const char *type, const char *experts, int threads)
{
    struct lp_quantize_params q = llama_model_quantize_default_params();
    if (q.allow_requantize || !q.quantize_output_tensor || q.only_copy || q.pure || q.dry_run || q.tt_overrides)
        die("%s", "the library's default quantize parameters do not match the llama.cpp v0.4.0 layout "
                  "this program declares");
    static const struct {
        const char *name;
        int ftype; /* enum llama_ftype */
    } ftypes[] = {{"f16", 1},     {"q4_0", 2},    {"q4_1", 3},     {"q8_0", 7},     {"q5_0", 8},
                  {"q5_1", 9},    {"q2_k", 10},   {"q3_k_m", 12},  {"q4_k_m", 15},  {"q5_k_m", 17},
                  {"q6_k", 18},   {"iq4_nl", 25}};
    q.ftype = -1;
    for (size_t i = 0; i < sizeof ftypes / sizeof ftypes[0]; i++)
        if (!strcmp(type, ftypes[i].name)) q.ftype = ftypes[i].ftype;
    if (q.ftype < 0)
        die("--quantize-type: f16, q4_0, q4_1, q8_0, q5_0, q5_1, q2_k, q3_k_m, q4_k_m, q5_k_m, q6_k or iq4_nl, "
            "not '%s'", type);
    static struct lp_tensor_override ov[] = {{"ffn_(gate|up|down)_exps", 39 /* MXFP4 */}, {NULL, 0}};
    if (strcmp(experts, "keep")) {
        q.allow_requantize = 1; /* the experts are MXFP4: their values are dequantized, then quantized */
        if (!strcmp(experts, "mix")) ov[0].pattern = NULL;
        else if ((ov[0].type = ggml_type_named(experts)) < 0)
            die("--quantize-experts: keep, mix, f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl, q2_k, q3_k, "
                "q4_k, q5_k or q6_k, not '%s'", experts);
    }
    q.tt_overrides = ov[0].pattern ? ov : NULL;
    q.nthread = threads;
    return llama_model_quantize(in, out, &q) ? 1 : 0;
}

/* llama_peer --lib DIR --model IN --quantize OUT [--quantize-type T] [--quantize-experts E] [--threads N] [-v]:
 * 0 when done (dies on an error), -1 when the command line is not this mode */
static int quantize_main(int argc, char **argv)
{
    const char *lib = NULL, *in = NULL, *out = NULL, *type = "q8_0", *experts = "keep";
    int threads = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int has = i + 1 < argc;
        if (!strcmp(a, "--lib") && has) lib = argv[++i];
        else if (!strcmp(a, "--model") && has) in = argv[++i];
        else if (!strcmp(a, "--quantize") && has) out = argv[++i];
        else if (!strcmp(a, "--quantize-type") && has) type = argv[++i];
        else if (!strcmp(a, "--quantize-experts") && has) experts = argv[++i];
        else if (!strcmp(a, "--threads") && has) threads = atoi(argv[++i]);
        else if (!strcmp(a, "-v")) g_verbose = 1;
    }
    if (!out) return -1;
    if (!lib || !in) die("%s", "--quantize needs --lib DIR and --model IN.gguf");
    llama_log_set(log_cb, NULL);
    ggml_backend_load_all_from_path(lib);
    llama_backend_init();
    if (quantize_file(in, out, type, experts, threads > 0 ? threads : 1))
        die("llama.cpp could not quantize '%s' (run with -v for its log)", in);
    llama_backend_free();
    return 0;
}

static int b64val(int c)
{
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    return c == '+' ? 62 : c == '/' ? 63 : -1;
}

/* --tokenize CASES: a line "[0|1 ]BASE64" in (tests/tok_dump's format: 1 =
 * specials parsed, the default), a line of ids out */
static int tokenize_main(int argc, char **argv)
{
    const char *lib = NULL, *model_path = NULL, *cases = NULL;
    for (int i = 1; i + 1 < argc; i++) {
        if (!strcmp(argv[i], "--lib")) lib = argv[++i];
        else if (!strcmp(argv[i], "--model")) model_path = argv[++i];
        else if (!strcmp(argv[i], "--tokenize")) cases = argv[++i];
    }
    if (!cases) return -1;
    if (!lib || !model_path) die("%s", "--tokenize needs --lib and --model");
    llama_log_set(log_cb, NULL);
    ggml_backend_load_all_from_path(lib);
    llama_backend_init();
    struct lp_model_params mp = llama_model_default_params();
    struct lp_context_params cp = llama_context_default_params();
    check_layout(&mp, &cp);
    mp.vocab_only = true;
    struct llama_model *model = llama_model_load_from_file(model_path, mp);
    if (!model) die("llama.cpp could not load '%s' (run with -v for its log)", model_path);
    const struct llama_vocab *v = llama_model_get_vocab(model);
    FILE *f = fopen(cases, "r");
    if (!f) die("cannot read '%s'", cases);
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    while ((len = getline(&line, &cap, f)) >= 0) {
        char *text = malloc((size_t)len + 1);
        size_t n = 0;
        unsigned acc = 0;
        int bits = 0, special = 1;
        ssize_t i0 = 0;
        if (len >= 2 && (line[0] == '0' || line[0] == '1') && line[1] == ' ') special = line[0] == '1', i0 = 2;
        for (ssize_t i = i0; i < len; i++) {
            int d = b64val((unsigned char)line[i]);
            if (d < 0) continue;
            acc = (acc << 6) | (unsigned)d;
            bits += 6;
            if (bits >= 8) text[n++] = (char)((acc >> (bits - 8)) & 0xff), bits -= 8;
        }
        int32_t max = (int32_t)n + 8;
        llama_token *ids = malloc((size_t)max * sizeof *ids);
        int32_t got = llama_tokenize(v, text, (int32_t)n, ids, max, false, special != 0);
        if (got < 0) die("%s", "llama_tokenize: more ids than bytes");
        for (int32_t i = 0; i < got; i++) printf(i ? " %d" : "%d", ids[i]);
        printf("\n");
        free(ids);
        free(text);
    }
    free(line);
    fclose(f);
    llama_model_free(model);
    llama_backend_free();
    return 0;
}

static void usage(void)
{
    fprintf(stderr,
            "usage: llama_peer --lib DIR --model FILE.gguf --prompt-ids 1,2,3 [options]\n"
            "  --lib DIR           folder with libllama/libggml and the CPU variants\n"
            "  --threads N         threads (default 1)\n"
            "  --dump-logits FILE  write the logits of every prompt position (f32 [n_pos][n_vocab])\n"
            "  --greedy N          then decode N tokens by argmax; prints the ids\n"
            "  --bench N           prefill the prompt, decode N tokens, print one JSON line\n"
            "  --kv f32|f16        KV cache type (default f32)\n"
            "  --mmap | --no-mmap  load mode (default: mmap)\n"
            "  --no-repack         no extra (repacked) weight buffers\n"
            "  --ctx N             context size (default: prompt + decode + 16)\n"
            "  --ubatch N          positions per llama.cpp graph (n_ubatch; default: the whole prompt\n"
            "                      in one; llama.cpp's own tools default to 512)\n"
            "  -v                  llama.cpp's own log on stderr\n"
            "   or: llama_peer --lib DIR --model FILE.gguf --tokenize CASES   (a line \"[0|1 ]BASE64\" each:\n"
            "                      prints each one's ids, specials parsed unless 0, nothing added)\n"
            "   or: llama_peer --lib DIR --model IN.gguf --quantize OUT.gguf --quantize-type TYPE\n"
            "                      (f16 q4_0 q4_1 q8_0 q5_0 q5_1 q2_k q3_k_m q4_k_m q5_k_m q6_k iq4_nl)\n"
            "                      [--quantize-experts keep|mix|TYPE]\n"
            "                      llama.cpp's quantizer: the trunk in that type; routed experts kept\n"
            "                      (default), requantized by the type's own mix, or all in TYPE\n");
    exit(2);
}

int main(int argc, char **argv)
{
    if (quantize_main(argc, argv) >= 0) return 0;
    if (tokenize_main(argc, argv) >= 0) return 0;
    const char *lib = NULL, *model_path = NULL, *ids_arg = NULL, *dump = NULL;
    int threads = 1, greedy = 0, bench = -1, kv_f32 = 1, mmap = 1, repack = 1, n_ctx = 0, ubatch = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--lib") && v)
            lib = argv[++i];
        else if (!strcmp(a, "--model") && v)
            model_path = argv[++i];
        else if (!strcmp(a, "--prompt-ids") && v)
            ids_arg = argv[++i];
        else if (!strcmp(a, "--threads") && v)
            threads = atoi(argv[++i]);
        else if (!strcmp(a, "--dump-logits") && v)
            dump = argv[++i];
        else if (!strcmp(a, "--greedy") && v)
            greedy = atoi(argv[++i]);
        else if (!strcmp(a, "--bench") && v)
            bench = atoi(argv[++i]);
        else if (!strcmp(a, "--ctx") && v)
            n_ctx = atoi(argv[++i]);
        else if (!strcmp(a, "--ubatch") && v)
            ubatch = atoi(argv[++i]);
        else if (!strcmp(a, "--kv") && v) {
            const char *k = argv[++i];
            if (!strcmp(k, "f32"))
                kv_f32 = 1;
            else if (!strcmp(k, "f16"))
                kv_f32 = 0;
            else
                die("--kv wants f32 or f16, not '%s'", k);
        } else if (!strcmp(a, "--mmap"))
            mmap = 1;
        else if (!strcmp(a, "--no-mmap"))
            mmap = 0;
        else if (!strcmp(a, "--no-repack"))
            repack = 0;
        else if (!strcmp(a, "-v"))
            g_verbose = 1;
        else {
            fprintf(stderr, "llama_peer: unknown or incomplete option '%s'\n", a);
            usage();
        }
    }
    if (!lib || !model_path || !ids_arg)
        usage();
    if (threads < 1 || greedy < 0 || ubatch < 0)
        die("%s", "--threads must be >= 1, --greedy and --ubatch >= 0");
    llama_token *ids;
    int n_prompt = parse_ids(ids_arg, &ids);
    if (n_prompt < 1)
        die("%s", "--prompt-ids is empty");
    int n_gen = bench >= 0 ? bench : greedy;

    llama_log_set(log_cb, NULL);
    ggml_backend_load_all_from_path(lib);
    llama_backend_init();

    struct lp_model_params mp = llama_model_default_params();
    struct lp_context_params cp = llama_context_default_params();
    check_layout(&mp, &cp);
    mp.n_gpu_layers = 0;
    mp.load_mode = mmap ? 1 : 0;
    mp.use_extra_bufts = repack;
    unsigned long long rb0 = proc_read_bytes();
    double t0 = now_sec();
    struct llama_model *model = llama_model_load_from_file(model_path, mp);
    if (!model)
        die("llama.cpp could not load '%s' (run with -v for its log)", model_path);
    double t_load = now_sec() - t0;
    int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));

    cp.n_ctx = (uint32_t)(n_ctx > 0 ? n_ctx : n_prompt + n_gen + 16);
    cp.n_batch = (uint32_t)n_prompt;
    cp.n_ubatch = (uint32_t)(ubatch > 0 && ubatch < n_prompt ? ubatch : n_prompt);
    cp.n_outputs_max = (uint32_t)n_prompt;
    cp.n_outputs_max_per_seq = (uint32_t)n_prompt;
    cp.n_threads = cp.n_threads_batch = threads;
    cp.flash_attn_type = 0;
    cp.type_k = cp.type_v = kv_f32 ? 0 : 1;
    cp.no_perf = true;
    struct llama_context *ctx = llama_init_from_model(model, cp);
    if (!ctx)
        die("llama.cpp could not create a context for '%s'", model_path);
    struct lp_batch b = llama_batch_init(n_prompt, 0, 1);

    unsigned long long rb1 = proc_read_bytes();
    double t1 = now_sec();
    if (feed(ctx, &b, ids, n_prompt, 0, dump != NULL) != 0)
        die("%s", "llama_decode failed on the prompt");
    double t_prefill = now_sec() - t1;
    if (dump) {
        FILE *f = fopen(dump, "wb");
        if (!f)
            die("cannot write '%s'", dump);
        for (int i = 0; i < n_prompt; i++) {
            const float *lg = llama_get_logits_ith(ctx, i);
            if (!lg || fwrite(lg, sizeof(float), (size_t)n_vocab, f) != (size_t)n_vocab)
                die("writing logits to '%s' failed", dump);
        }
        if (fclose(f))
            die("writing logits to '%s' failed", dump);
    }
    llama_token *out = calloc((size_t)n_gen + 1, sizeof *out);
    if (!out)
        die("%s", "out of memory");
    unsigned long long rb2 = proc_read_bytes();
    double t2 = now_sec();
    llama_token cur = (llama_token)argmax(llama_get_logits_ith(ctx, n_prompt - 1), n_vocab);
    for (int i = 0; i < n_gen; i++) {
        out[i] = cur;
        if (i + 1 == n_gen)
            break;
        if (feed(ctx, &b, &cur, 1, n_prompt + i, 0) != 0)
            die("%s", "llama_decode failed while decoding");
        cur = (llama_token)argmax(llama_get_logits_ith(ctx, 0), n_vocab);
    }
    double t_decode = now_sec() - t2;
    unsigned long long rb3 = proc_read_bytes();

    if (bench >= 0) {
        /* n_gen tokens decoded means n_gen - 1 forward calls after the prompt */
        int steps = n_gen > 1 ? n_gen - 1 : 0;
        printf("{\"engine\":\"llama.cpp\",\"load_s\":%.3f,\"load_read_bytes\":%llu,"
               "\"prompt\":%d,\"prefill_s\":%.6f,\"prefill_tps\":%.4f,\"prefill_read_bytes\":%llu,"
               "\"decode_steps\":%d,\"decode_s\":%.6f,\"decode_tps\":%.4f,\"decode_read_bytes\":%llu,"
               "\"peak_rss_kb\":%ld,\"ids\":[",
               t_load, rb1 - rb0, n_prompt, t_prefill, n_prompt / t_prefill, rb2 - rb1, steps,
               t_decode, steps ? steps / t_decode : 0.0, rb3 - rb2, proc_peak_rss_kb());
        for (int i = 0; i < n_gen; i++)
            printf("%s%d", i ? "," : "", out[i]);
        printf("]}\n");
    } else if (greedy) {
        for (int i = 0; i < n_gen; i++)
            printf("%s%d", i ? " " : "", out[i]);
        printf("\n");
    }
    free(out);
    free(ids);
    llama_batch_free(b);
    llama_free(ctx);
    llama_model_free(model);
    llama_backend_free();
    return 0;
}
