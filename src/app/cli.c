/* cli.c - the deltafin command line (front end; `deltafin --help` lists
 * the commands; the run options and their tables are options.c's).
 *
 * Owns: main, `run --prompt-ids` (generation), `info` and `plan` (from
 * headers alone), iobench/place/cachesim.  What the commands share (the
 * logits dump, the prompt's evaluation, --session, the stats lines) is
 * cli_common.c's.  May exit; nothing below it does.
 */
#define _GNU_SOURCE
#include "cli.h"
#include "spec_state.h"
#include "engine.h"
#include "research.h"
#include "plan.h"
#include "families.h"
#include "draft_xtok.h"
#include "server.h"
#include "util.h"

#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static int cmd_run(int argc, char **argv)
{
    run_args a;
    parse_common(argc, argv, &a);
    if (a.prompt || a.chat) return run_text(&a);
    int32_t *prompt;
    int n_prompt = parse_ids(a.prompt_ids, "--prompt-ids", &prompt);
    int ctx = context_for(&a, n_prompt);
    df_engine *eng = open_engine(&a);
    df_model_info info;
    df_engine_info(eng, &info);
    df_session *s = open_session(eng, &a);
    size_t V = (size_t)info.vocab;
    int batch = df_session_max_batch(s);
    float *last = malloc(V * sizeof(float));
    float *rows = a.dump ? malloc((size_t)batch * V * sizeof(float)) : NULL;
    int32_t *gen = malloc(((size_t)a.max_new + 1) * sizeof *gen);
    if (!last || (a.dump && !rows) || !gen) die("cannot allocate the logits buffers (vocabulary %zu)", V);
    logits_sink sink;
    if (sink_open(&sink, a.dump, V)) return 1;
    df_error err = {0};
    sampler smp;
    sampler_from_args(&smp, &a, info.vocab);
    df_drafter *dr = open_drafter(&a, info.vocab, ctx);
    gen_loop gl;
    gen_from_args(&gl, &a, eng, s, &smp, dr);
    unsigned long long rb0 = proc_read_bytes();
    double t0 = now_sec();
    int held = a.session ? session_resume(&gl, s, a.session, prompt, n_prompt) : 0;
    if (held < 0) return 1;
    if (held ? gen_feed(&gl, prompt + held, (size_t)(n_prompt - held), &err)
             : eval_prompt(s, prompt, n_prompt, batch, last, rows, V, &sink, &err)) {
        fprintf(stderr, "deltafin: %s\n", err.msg);
        sink_abort(&sink);
        return 1;
    }
    if (!held) gen_prime(&gl, prompt, (size_t)n_prompt, last);
    double t1 = now_sec();
    unsigned long long rb1 = proc_read_bytes();
    int n_gen = 0, full = 0;
    /* the logits after each generated token are written when the next one
     * is chosen from them, and after the last one once it is evaluated */
    for (; n_gen < a.max_new; n_gen++) {
        if (n_prompt + n_gen >= ctx) {
            full = 1;
            break;
        }
        int32_t next;
        if (gen_next(&gl, &next, &err)) {
            fprintf(stderr, "deltafin: %s\n", err.msg);
            sink_abort(&sink);
            return 1;
        }
        if (n_gen && sink_write(&sink, gen_logits(&gl), 1)) {
            sink_abort(&sink);
            return 1;
        }
        gen[n_gen] = next;
        if (a.stop_eos && next == info.eos_id) {
            n_gen++;
            break;
        }
    }
    if (n_gen && (gen_settle(&gl, 1, &err) || sink_write(&sink, gen_logits(&gl), 1))) {
        fprintf(stderr, "deltafin: %s\n", err.msg[0] ? err.msg : "writing the --dump-logits file failed");
        sink_abort(&sink);
        return 1;
    }
    double t2 = now_sec();
    unsigned long long rb2 = proc_read_bytes();
    spec_state_save(&a, &gl);
    if (full)
        fprintf(stderr, "deltafin: the context is full (--ctx %d): stopped after %d of %d new tokens\n", ctx, n_gen,
                a.max_new);
    if (a.bench_json)
        print_bench_json(eng, n_prompt, t1 - t0, rb1 - rb0, n_gen, t2 - t1, rb2 - rb1, gen, &gl.st);
    if (a.print_ids) {
        for (int i = 0; i < n_gen; i++) printf("%s%d", i ? "," : "", gen[i]);
        printf("\n");
        fflush(stdout);
    }
    if (sink_commit(&sink)) return 1;
    if (a.session && session_store(&gl, s, a.session)) return 1;
    if (a.stats) print_run_stats(eng, n_prompt, t1 - t0, n_gen, t2 - t1);
    if (a.stats && dr) print_draft_stats(&gl.st), print_xtok_stats(dr);
    gen_free(&gl);
    df_drafter_free(dr);
    sampler_free(&smp);
    free(gen);
    free(rows);
    free(last);
    free(prompt);
    df_session_free(s);
    df_engine_close(eng);
    return 0;
}

static void plan_opts_from(const run_args *a, df_plan_opts *o, size_t mem)
{
    memset(o, 0, sizeof *o);
    o->mem_budget = mem;
    o->expert_cache_bytes = a->cache_bytes;
    o->n_ctx = a->ctx;
    o->max_batch = a->batch;
    o->n_threads = a->threads;
    o->trunk_stream = a->trunk_stream;
    o->cache_policy = a->policy;
    o->serve = a->serve;
    o->n_sessions = a->plan_sessions;
    o->checkpoints = a->serve ? -1 : 0; /* serve's default rule */
    o->trunk_type = a->trunk_type;
    if (drafting(a)) o->rollback_rows = draft_rows(a); /* the rows a verify pass can take back */
}

static double gib_(uint64_t b) { return (double)b / (double)(1ull << 30); }

/* info: the model's dimensions and its plan, from the config and headers
 * (no weight is read). */
static int cmd_info(int argc, char **argv)
{
    run_args a;
    parse_common(argc, argv, &a);
    df_plan_opts o;
    plan_opts_from(&a, &o, a.mem);
    df_plan p;
    df_model_info i;
    df_error err = {0};
    memset(&i, 0, sizeof i);
    int rc = df_plan_model(a.model, &o, &p, &i, &err);
    if (rc && err.code != DF_ERR_NOMEM) {
        fprintf(stderr, "deltafin: %s\n", err.msg);
        return 1;
    }
    printf("layers %d (KDA %d, MLA %d)\nhidden %d\nvocab %d\nexperts %d, %d per token, %.2f MiB each\n"
           "bos %d eos %d pad %d\ncontext memory per token %llu bytes (MLA latent cache, fp32)\n"
           "fixed recurrent state %.1f MiB (KDA)\ntrunk %.3f GiB (matrices) + embedding %.3f GiB\n",
           i.n_layers, i.n_kda_layers, i.n_mla_layers, i.hidden, i.vocab, i.n_experts, i.n_experts_used,
           (double)i.expert_bytes / (1 << 20), i.bos_id, i.eos_id, i.pad_id,
           (unsigned long long)i.ctx_bytes_per_token, (double)i.fixed_state_bytes / (1 << 20), gib_(p.trunk_bytes),
           gib_(p.embed_bytes));
    printf("trunk weights %s%s\n", i.trunk,
           i.trunk_quantized ? " (quantized: the logits are this file's, not those of the BF16 model it came from)" : "");
    printf("expert weights %s%s\n", i.experts,
           i.experts_requantized ? " (requantized: the logits are this file's, not those of the released MXFP4 experts)"
                                 : "");
    if (rc) {
        printf("no plan: %s\n", err.msg);
        return 1;
    }
    df_plan_print(&p, "", stdout);
    return 0;
}

static double gib_(uint64_t b);

/* plan --draft model:PATH: a draft model's share of --mem (--draft-mem,
 * else an eighth) is taken off the target's budget, as run and serve take
 * it, and the drafter is sized in it by its family's plan (families.h: a
 * Qwen3 model by its weights and a KV cache, a K3 model by the engine's
 * plan at that share), for a state of the target's context, or of at most
 * XT_MAX_CTX positions when its tokenizer is another (its drafts are then
 * translated); --draft-wide's drafter is added to the first's (both in the
 * one share).  Prints one line; returns -1 (said why) when it does not
 * fit. */
static int plan_draft(const run_args *a, size_t total, int n_ctx, FILE *out)
{
    const char *path = a->draft + 6;
    size_t share = draft_share(a, total);
    uint64_t need = 0, wneed = 0;
    df_error err = {0};
    char what[300], wwhat[300], line[720];
    const df_family *fam = family_of(path, &err);
    if (!fam) {
        fprintf(stderr, "deltafin: --draft model:%s: %s\n", path, err.msg);
        return -1;
    }
    int same = draft_same_tokenizer(a->model, path, NULL, 0);
    if (a->draft_wide && same) {
        fprintf(stderr, "deltafin: --draft-wide %s: a wide drafter backs a drafter of another tokenizer (--draft "
                        "model:PATH of a Qwen3 model), not --draft %s, which shares the target's tokenizer\n",
                a->draft_wide, a->draft);
        return -1;
    }
    /* as the drafter opens (a drafter of another tokenizer reads the
     * current message only: a state of at most XT_MAX_CTX positions) */
    df_family_opts o;
    int threads = a->draft_threads ? a->draft_threads : 1;
    if (same) df_drafter_model_opts(share, n_ctx, threads, &o);
    else df_drafter_xtok_opts(share, n_ctx, threads, &o);
    int rc = fam->plan(path, &o, &need, what, sizeof what, &err);
    if (rc && err.code != DF_ERR_NOMEM) {
        fprintf(stderr, "deltafin: --draft model:%s at its share of --mem (%.2f GiB, --draft-mem): %s\n", path,
                gib_(share), err.msg);
        return -1;
    }
    snprintf(line, sizeof line, "%s%s", what, same ? "" : "; its drafts translated into the target's ids");
    if (a->draft_wide) {
        /* the wide drafter comes out of the same share */
        const df_family *wf = family_of(a->draft_wide, &err);
        int wrc = wf ? wf->plan(a->draft_wide, &o, &wneed, wwhat, sizeof wwhat, &err) : -1;
        if (!wf || (wrc && err.code != DF_ERR_NOMEM)) {
            fprintf(stderr, "deltafin: --draft-wide %s: %s\n", a->draft_wide, err.msg);
            return -1;
        }
        need += wneed;
        size_t wl = strlen(line);
        snprintf(line + wl, sizeof line - wl, "; with --draft-wide %s: %s", a->draft_wide, wwhat);
    }
    fprintf(out, "draft model %s: %.2f GiB of its %.2f GiB share of --mem (--draft-mem) (%s)\n", path, gib_(need),
            gib_(share), line);
    if (need > share || rc) {
        fprintf(stderr, "deltafin: the draft model%s %.2f GiB; %s share of --mem is %.2f GiB: raise --draft-mem\n",
                a->draft_wide ? "s need" : " needs", gib_(need), a->draft_wide ? "their" : "its", gib_(share));
        return -1;
    }
    return 0;
}

/* plan: where the model goes at --mem, or at several machine sizes when
 * --mem is not given; from a model directory, a .gguf or a config.json
 * alone, never reading a weight. */
static int cmd_plan(int argc, char **argv)
{
    run_args a;
    parse_common(argc, argv, &a);
    size_t sizes[6] = {0};
    int n = 0;
    if (a.mem) sizes[n++] = a.mem;
    else {
        static const size_t gb[] = {24, 64, 128, 256, 512};
        for (int i = 0; i < 5; i++) sizes[n++] = gb[i] << 30;
    }
    int bad = 0;
    uint64_t cold = 0;
    if (!a.json && !a.mem) {
        printf("%-10s %-9s %11s %11s %13s %13s %7s %16s %16s%s", "--mem", "trunk", "trunk GiB", "cache GiB",
               "experts held", "context GiB", "chunk", "trunk read/tok", "experts read/tok",
               a.serve && !a.ctx ? "  context" : "");
        for (int g = 0; g < a.n_disk_gbps; g++) {
            char h[32];
            snprintf(h, sizeof h, "tok/s @%gGB/s", a.disk_gbps[g]);
            printf(" %14s", h);
        }
        printf("\n");
    }
    int draft_model = drafting(&a) && !strncmp(a.draft, "model:", 6);
    for (int i = 0; i < n; i++) {
        df_plan_opts o;
        plan_opts_from(&a, &o, sizes[i]);
        if (draft_model) {
            if (draft_share(&a, sizes[i]) >= sizes[i]) {
                fprintf(stderr, "deltafin: --draft-mem leaves nothing of --mem %.2f GiB for the model\n", gib_(sizes[i]));
                return 1;
            }
            o.mem_budget = sizes[i] - draft_share(&a, sizes[i]);
        }
        df_plan p;
        df_error err = {0};
        int rc = df_plan_model(a.model, &o, &p, NULL, &err);
        if (rc && err.code != DF_ERR_NOMEM) {
            fprintf(stderr, "deltafin: %s\n", err.msg);
            return 1;
        }
        if (a.json) plan_json(stdout, &p, !rc, err.msg);
        else if (a.mem) {
            if (rc) {
                fprintf(stderr, "deltafin: %s\n", err.msg);
                bad = 1;
            } else {
                df_plan_print(&p, "", stdout);
            }
        } else if (rc) {
            printf("%-10s does not fit: needs %.2f GiB\n", "", gib_(p.used));
        } else {
            char mem[32], held[40];
            snprintf(mem, sizeof mem, "%.0f GiB", gib_(p.budget));
            snprintf(held, sizeof held, "%llu/%llu", (unsigned long long)p.n_slots, (unsigned long long)p.n_experts);
            printf("%-10s %-9s %11.2f %11.2f %13s %13.3f %7d %12.2f GiB %12.2f GiB", mem,
                   p.trunk_mode == DF_TRUNK_RESIDENT ? "resident" : p.trunk_resident_n ? "partial" : "streamed",
                   gib_(p.trunk_used),
                   gib_(p.cache_bytes), held, gib_(p.state_bytes), p.max_batch, gib_(p.trunk_read_per_token),
                   gib_(p.expert_read_est));
            if (a.serve && !a.ctx) printf("  %7d", p.n_ctx);
            /* disk-bound: the bytes a decoded token reads at that speed (compute not counted) */
            uint64_t per = p.trunk_read_per_token + p.expert_read_est;
            for (int g = 0; g < a.n_disk_gbps; g++) {
                if (per) printf(" %14.3f", a.disk_gbps[g] * 1e9 / (double)per);
                else printf(" %14s", "(in RAM)");
            }
            printf("\n");
        }
        bad |= rc != 0;
        cold = p.expert_read_cold;
        if (draft_model && !a.json && !rc) bad |= plan_draft(&a, sizes[i], p.n_ctx, stdout) != 0;
    }
    if (a.ranks > 1 && !a.json) {
        /* mpirun -np N: the default round-robin partition, each rank at this --mem */
        df_plan_opts o;
        plan_opts_from(&a, &o, a.mem ? a.mem : df_mem_budget_default());
        df_plan p;
        df_model_info info;
        df_error err = {0};
        if (df_plan_model(a.model, &o, &p, &info, &err) && err.code != DF_ERR_NOMEM) {
            fprintf(stderr, "deltafin: %s\n", err.msg);
            return 1;
        }
        uint64_t pairs = p.n_experts;
        printf("over %d ranks (mpirun -np %d; experts round robin by (layer, expert), or by heat with --heat), each "
               "with --mem %.0f GiB:\n",
               a.ranks, a.ranks, gib_(p.budget));
        for (int r = 0; r < a.ranks; r++) {
            uint64_t mine = pairs / (uint64_t)a.ranks + ((uint64_t)r < pairs % (uint64_t)a.ranks);
            uint64_t held = p.n_slots < mine ? p.n_slots : mine;
            printf("  rank %d%s: %llu (layer, expert) pairs, %.2f GiB; its expert cache holds %llu of them (%s)\n", r,
                   r ? "" : " (front end, trunk)", (unsigned long long)mine,
                   gib_(mine * (uint64_t)info.expert_bytes), (unsigned long long)held,
                   held == mine ? "its whole share in RAM" : "the rest streams from its own disk");
        }
    }
    if (!a.json && !a.mem && a.serve && !a.ctx)
        printf("context: serve's default at each --mem (64K where the expert cache keeps one token's experts "
               "in every MoE layer, else halved down to 4096; --serve --mem SIZE says why)\n");
    else if (!a.json && !a.mem)
        printf("context %d tokens; chunk: positions per prompt pass (each pass reads the streamed trunk and "
               "each needed expert once); experts read per token: uniform-routing estimate (cache share of all "
               "experts), %.2f GiB with nothing cached\n",
               a.ctx ? a.ctx : 4096, gib_(cold));
    return bad && a.mem ? 1 : 0;
}

static int cmd_iobench(int argc, char **argv)
{
    if (argc < 3 || argv[2][0] == '-') die("iobench needs a directory: deltafin iobench DIR");
    df_iobench_opts o = {0};
    for (int i = 3; i < argc; i++) {
        const char *f = argv[i];
        if (i + 1 >= argc) die("%s needs a value", f);
        if (!strcmp(f, "--chunk")) o.chunk_bytes = parse_size(argv[++i], f);
        else if (!strcmp(f, "--io-depth")) o.depth = (int)parse_long(argv[++i], f, 1, 256);
        else if (!strcmp(f, "--seconds")) o.seconds = (double)parse_long(argv[++i], f, 1, 3600);
        else if (!strcmp(f, "--io")) {
            const char *m = argv[++i];
            if (!strcmp(m, "buffered")) o.buffered = 1;
            else if (strcmp(m, "direct")) die("--io must be direct or buffered, got \"%s\"", m);
        } else die("unknown option \"%s\"", f);
    }
    df_iobench_result r;
    df_error err = {0};
    if (df_iobench(argv[2], &o, &r, &err)) {
        fprintf(stderr, "deltafin: iobench: %s\n", err.msg);
        return 1;
    }
    printf("iobench %s: %.2f GB/s (%s, %s, %.2f MiB reads, %d in flight, %llu reads in %.1f s)\n", argv[2], r.gbps,
           r.direct ? "O_DIRECT" : "buffered", r.backend, r.chunk_bytes / 1048576.0, r.depth,
           (unsigned long long)r.reads, r.seconds);
    return 0;
}

static void place_progress(void *ctx, uint64_t done, uint64_t total)
{
    double *last = ctx, t = now_sec();
    if (t - *last < 0.5 && done < total) return;
    *last = t;
    fprintf(stderr, "\rdeltafin: placing experts: %5.1f%% (%.2f of %.2f GB)", total ? 100.0 * done / total : 100.0,
            done / 1e9, total / 1e9);
    if (done >= total) fputc('\n', stderr);
}

static int cmd_place(int argc, char **argv)
{
    run_args a;
    parse_common(argc, argv, &a);
    if (!a.n_xpaths) die("place needs at least one --to DIR");
    double last = 0;
    df_error err = {0};
    if (df_place(a.model, a.xpaths, a.n_xpaths, a.stripe, place_progress, &last, &err)) {
        fprintf(stderr, "\ndeltafin: place: %s\n", err.msg);
        return 1;
    }
    fprintf(stderr, "deltafin: experts of %s placed (%s) in %d director%s; run with", a.model,
            a.stripe ? "striped" : "replicated", a.n_xpaths, a.n_xpaths == 1 ? "y" : "ies");
    for (int i = 0; i < a.n_xpaths; i++) fprintf(stderr, " --expert-path %s", a.xpaths[i]);
    fprintf(stderr, "\n");
    return 0;
}

static int cmd_cachesim(int argc, char **argv)
{
    run_args a;
    parse_common(argc, argv, &a);
    if (!a.trace) die("cachesim needs --trace FILE (written by 'deltafin run --trace FILE')");
    int slots[64], n = parse_slots(a.slots, slots);
    df_cachesim_row rows[64];
    df_error err = {0};
    if (df_cachesim(a.trace, slots, n, rows, &err)) {
        fprintf(stderr, "deltafin: %s\n", err.msg);
        return 1;
    }
    printf("trace %s: %llu steps, %llu expert uses\n", a.trace, (unsigned long long)rows[0].steps,
           (unsigned long long)rows[0].accesses);
    printf("%10s %9s %9s %9s %9s %9s %11s %11s %11s %13s %11s\n", "slots", "LRU hit%", "LFU hit%", "TLFU hit%",
           "static%", "Belady%", "LRU/Belady", "LFU/Belady", "TLFU/Belady", "static/Belady", "LFU/static");
    for (int i = 0; i < n; i++) {
        const df_cachesim_row *r = &rows[i];
        double acc = (double)r->accesses, b = (double)r->hits_belady, st = (double)r->hits_static;
        printf("%10d %9.2f %9.2f %9.2f %9.2f %9.2f %11.3f %11.3f %11.3f %13.3f %11.3f\n", r->slots,
               100 * r->hits_lru / acc, 100 * r->hits_lfu / acc, 100 * r->hits_tlfu / acc, 100 * st / acc,
               100 * b / acc, b ? r->hits_lru / b : 1.0, b ? r->hits_lfu / b : 1.0, b ? r->hits_tlfu / b : 1.0,
               b ? st / b : 1.0, st ? r->hits_lfu / st : 1.0);
    }
    printf("static = the trace's most used experts kept from their first use (frequencies known in advance):\n"
           "the ceiling of a frequency-only policy; Belady also knows the order of future uses\n");
    return 0;
}

static int dispatch(int argc, char **argv);

int main(int argc, char **argv)
{
    df_ranks_init(&argc, &argv); /* under mpirun: ranks > 0 become expert workers in open_engine */
    int rc = dispatch(argc, argv);
    df_ranks_finalize();
    return rc;
}

static int dispatch(int argc, char **argv)
{
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (!strcmp(argv[1], "run")) return cmd_run(argc, argv);
    if (!strcmp(argv[1], "info")) return cmd_info(argc, argv);
    if (!strcmp(argv[1], "plan")) return cmd_plan(argc, argv);
    if (!strcmp(argv[1], "cachesim")) return cmd_cachesim(argc, argv);
    if (!strcmp(argv[1], "trace")) return cmd_trace(argc, argv);
    if (!strcmp(argv[1], "iobench")) return cmd_iobench(argc, argv);
    if (!strcmp(argv[1], "place")) return cmd_place(argc, argv);
    if (!strcmp(argv[1], "chat")) return cmd_chat(argc, argv);
    if (!strcmp(argv[1], "tokenize")) return cmd_tokenize(argc, argv);
    if (!strcmp(argv[1], "perplexity")) return cmd_perplexity(argc, argv);
    if (!strcmp(argv[1], "quantize")) return cmd_quantize(argc, argv);
    if (!strcmp(argv[1], "serve")) return cmd_serve(argc, argv);
    if (!strcmp(argv[1], "setup")) return cmd_setup(argc, argv);
    if (!strcmp(argv[1], "doctor")) return cmd_doctor(argc, argv);
    if (!strcmp(argv[1], "bench")) return cmd_bench(argc, argv);
    die("unknown command \"%s\"", argv[1]);
}
