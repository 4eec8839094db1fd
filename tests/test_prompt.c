/* test_prompt.c - prompts longer than one command-line argument:
 * `--prompt-file FILE` (text; "-" is standard input) and
 * `--prompt-ids @FILE` (ids separated by commas and/or white space; "@-"
 * is standard input) on `run` (text, ids, --chat) and `bench`.
 *
 * The unit cases: files past the kernel's 128 KiB argument limit (a 200 KB
 * text, 65,000 ids) are read whole and refused before any evaluation when
 * --ctx cannot hold them, naming --ctx and the prompt's length; smaller
 * files and standard input give the same ids as the same prompt given as an
 * argument; bad files and entries are named.  With DF_SLOW=1 (make
 * check-slow) the 200 KB text and the 65,000 ids are evaluated whole under
 * --mem with a --ctx that holds them (minutes on 2 cores), peak RSS within
 * --mem.
 */
#define _GNU_SOURCE
#include "harness.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DF build_bin("deltafin")
#define MiB (1024ull * 1024)

static char out_[1 << 16], err_[1 << 16];

static int cli(const char *const *argv) { return t_run(argv, out_, sizeof out_, err_, sizeof err_); }

static const char *tiny(void)
{
    static char dir[512];
    snprintf(dir, sizeof dir, "%s/k3-tiny-a/checkpoint", testdata_dir());
    return dir;
}

/* n ids in 1..500, one file with mixed separators (newlines, spaces, commas) */
static void write_ids(const char *path, int n)
{
    FILE *f = fopen(path, "w");
    if (!f) {
        t_fail(__FILE__, __LINE__, "cannot write %s", path);
        return;
    }
    for (int i = 0; i < n; i++) fprintf(f, "%d%s", (i * 7919 + 13) % 500 + 1, i % 7 == 6 ? "\n" : i % 3 ? ", " : " ");
    fclose(f);
}

/* about `bytes` of plain English words */
static void write_text(const char *path, size_t bytes)
{
    static const char *w[] = {"the", "cat", "sat", "on", "a", "mat", "and", "then", "went", "home", "because", "it",
                              "was", "raining"};
    FILE *f = fopen(path, "w");
    if (!f) {
        t_fail(__FILE__, __LINE__, "cannot write %s", path);
        return;
    }
    size_t n = 0;
    for (unsigned i = 0; n < bytes; i++) n += (size_t)fprintf(f, "%s ", w[(i * 2654435761u >> 7) % 14]);
    fclose(f);
}

static long peak_kb(void)
{
    const char *p = strstr(out_, "\"peak_rss_kb\":");
    return p ? strtol(p + 14, NULL, 10) : -1;
}

static long prompt_len(void)
{
    const char *p = strstr(out_, "\"prompt\":");
    return p ? strtol(p + 9, NULL, 10) : -1;
}

static void test_files_and_stdin(void)
{
    char ids[600], text[600], small[600], cmd[2048];
    snprintf(ids, sizeof ids, "%s/ids65k.txt", test_scratch());
    snprintf(text, sizeof text, "%s/text200k.txt", test_scratch());
    snprintf(small, sizeof small, "%s/ids-small.txt", test_scratch());
    write_ids(ids, 65000);
    write_text(text, 200 * 1000);

    /* 1. past the argument limit, refused before evaluation naming --ctx */
    char at[620];
    snprintf(at, sizeof at, "@%s", ids);
    const char *a1[] = {DF, "run", "--model", tiny(), "--prompt-ids", at, "--ctx", "4096", "--max-new", "1", NULL};
    TCHECKF(cli(a1) == 2 && strstr(err_, "65000 tokens") && strstr(err_, "--ctx 4096"), "65,000 ids: %s", err_);
    const char *a2[] = {DF, "run", "--model", tiny(), "--prompt-file", text, "--ctx", "4096", "--max-new", "1", NULL};
    TCHECKF(cli(a2) == 2 && strstr(err_, "does not fit --ctx 4096"), "200 KB text: %s", err_);
    const char *a2c[] = {DF, "run", "--model", tiny(), "--chat", "--prompt-file", text, "--ctx", "4096", NULL};
    TCHECKF(cli(a2c) == 2 && strstr(err_, "--ctx"), "200 KB chat turn: %s", err_);

    /* 2. the same ids from a file, from standard input and as an argument */
    write_ids(small, 300);
    FILE *f = fopen(small, "r");
    char list[4096] = "";
    size_t k = 0;
    for (int c, sep = 0; f && (c = fgetc(f)) != EOF;) {
        if (c >= '0' && c <= '9') {
            if (sep && k) list[k++] = ',';
            sep = 0;
            list[k++] = (char)c;
        } else {
            sep = 1;
        }
    }
    list[k] = 0;
    if (f) fclose(f);
    char at_small[620];
    snprintf(at_small, sizeof at_small, "@%s", small);
    const char *b1[] = {DF, "run", "--model", tiny(), "--prompt-ids", list, "--max-new", "8", "--print-ids", NULL};
    TCHECKF(cli(b1) == 0, "%s", err_);
    char ref[sizeof out_];
    snprintf(ref, sizeof ref, "%s", out_);
    const char *b2[] = {DF, "run", "--model", tiny(), "--prompt-ids", at_small, "--max-new", "8", "--print-ids", NULL};
    TCHECKF(cli(b2) == 0 && !strcmp(out_, ref), "@FILE: %s / %s", out_, err_);
    snprintf(cmd, sizeof cmd, "'%s' run --model '%s' --prompt-ids @- --max-new 8 --print-ids < '%s'", DF, tiny(), small);
    const char *b3[] = {"/bin/sh", "-c", cmd, NULL};
    TCHECKF(cli(b3) == 0 && !strcmp(out_, ref), "@-: %s / %s", out_, err_);

    /* text: a file and standard input give what --prompt gives */
    char stext[600];
    snprintf(stext, sizeof stext, "%s/text-small.txt", test_scratch());
    f = fopen(stext, "w");
    if (f) {
        fputs("the cat sat on the mat and then", f);
        fclose(f);
    }
    const char *c1[] = {DF, "run", "--model", tiny(), "--prompt", "the cat sat on the mat and then", "--max-new", "8",
                        "--print-ids", NULL};
    TCHECKF(cli(c1) == 0, "%s", err_);
    snprintf(ref, sizeof ref, "%s", out_);
    const char *c2[] = {DF, "run", "--model", tiny(), "--prompt-file", stext, "--max-new", "8", "--print-ids", NULL};
    TCHECKF(cli(c2) == 0 && !strcmp(out_, ref), "--prompt-file: %s / %s", out_, err_);
    snprintf(cmd, sizeof cmd, "'%s' run --model '%s' --prompt-file - --max-new 8 --print-ids < '%s'", DF, tiny(), stext);
    const char *c3[] = {"/bin/sh", "-c", cmd, NULL};
    TCHECKF(cli(c3) == 0 && !strcmp(out_, ref), "--prompt-file -: %s / %s", out_, err_);

    /* 3. errors name the file and the entry */
    char bad[600];
    snprintf(bad, sizeof bad, "%s/ids-bad.txt", test_scratch());
    f = fopen(bad, "w");
    if (f) {
        fputs("1, 2\n3 x4 5\n", f);
        fclose(f);
    }
    char at_bad[620];
    snprintf(at_bad, sizeof at_bad, "@%s", bad);
    const char *d1[] = {DF, "run", "--model", tiny(), "--prompt-ids", at_bad, NULL};
    TCHECKF(cli(d1) == 2 && strstr(err_, bad) && strstr(err_, "entry 4"), "bad entry: %s", err_);
    const char *d2[] = {DF, "run", "--model", tiny(), "--prompt-ids", "@/nonexistent/ids", NULL};
    TCHECKF(cli(d2) == 2 && strstr(err_, "/nonexistent/ids") && strstr(err_, "cannot open"), "missing: %s", err_);
    const char *d3[] = {DF, "run", "--model", tiny(), "--prompt-file", test_scratch(), NULL};
    TCHECKF(cli(d3) == 2 && strstr(err_, "not a regular file"), "a directory: %s", err_);
    const char *d4[] = {DF, "run", "--model", tiny(), "--prompt-file", stext, "--prompt", "x", NULL};
    TCHECKF(cli(d4) == 2 && strstr(err_, "cannot be combined"), "two prompts: %s", err_);
    /* a --session path that cannot be written is refused before anything runs */
    const char *e1[] = {DF, "run", "--model", tiny(), "--prompt-ids", "1,2,3", "--max-new", "100000", "--session",
                        "/nonexistent/dir/x.session", NULL};
    TCHECKF(cli(e1) == 2 && strstr(err_, "--session") && strstr(err_, "does not exist") && !out_[0], "session: %s",
            err_);
    const char *e2[] = {DF, "run", "--model", tiny(), "--prompt-ids", "1,2,3", "--session", test_scratch(), NULL};
    TCHECKF(cli(e2) == 2 && strstr(err_, "not a regular file"), "session dir: %s", err_);
    snprintf(cmd, sizeof cmd, "'%s' run --model '%s' --prompt-file - < /dev/null", DF, tiny());
    const char *d5[] = {"/bin/sh", "-c", cmd, NULL};
    TCHECKF(cli(d5) == 2 && strstr(err_, "empty"), "empty standard input: %s", err_);
}

/* make check-slow: the long prompts evaluated whole under --mem */
static void test_long_prompts_whole(void)
{
    if (!getenv("DF_SLOW")) TSKIP("minutes on 2 cores: DF_SLOW=1 (make check-slow) runs it");
    if (getenv("DF_SANITIZED")) TSKIP("sanitizer runtimes inflate RSS");
    char ids[600], text[600], at[620];
    snprintf(ids, sizeof ids, "%s/ids65k.txt", test_scratch());
    snprintf(text, sizeof text, "%s/text200k.txt", test_scratch());
    write_ids(ids, 65000);
    write_text(text, 200 * 1000);
    snprintf(at, sizeof at, "@%s", ids);
    const char *a1[] = {DF, "run", "--model", tiny(), "--prompt-ids", at, "--ctx", "65008", "--max-new", "2", "--mem",
                        "160M", "--bench-json", NULL};
    TCHECKF(cli(a1) == 0 && prompt_len() == 65000, "65,000 ids: %s", err_);
    long kb = peak_kb();
    fprintf(stderr, "    65,000 ids: peak RSS %.1f MiB with --mem 160M\n", kb / 1024.0);
    TCHECKF(kb > 0 && (uint64_t)kb * 1024 <= 160 * MiB, "peak %ld kB", kb);
    /* the default model (4,096 ids: ~49K tokens for 200 KB; the fixture's 640 make it 111K) */
    char mini[600];
    snprintf(mini, sizeof mini, "%s/../models/k3-mini", testdata_dir());
    const char *a2[] = {DF, "run", "--model", mini, "--prompt-file", text, "--ctx", "65536", "--max-new", "2",
                        "--mem", "200M", "--bench-json", NULL};
    TCHECKF(cli(a2) == 0 && prompt_len() > 40000, "200 KB text: %s", err_);
    kb = peak_kb();
    fprintf(stderr, "    200 KB text (%ld tokens): peak RSS %.1f MiB with --mem 200M\n", prompt_len(), kb / 1024.0);
    TCHECKF(kb > 0 && (uint64_t)kb * 1024 <= 200 * MiB, "peak %ld kB", kb);
    test_scratch_remove();
}

static void cleanup(void) { test_scratch_remove(); }

static const test_case tests[] = {
    {"files_and_stdin", test_files_and_stdin},
    {"long_prompts_whole", test_long_prompts_whole},
    {"cleanup", cleanup},
};

int main(int argc, char **argv) { return test_main(tests, NTESTS(tests), argc, argv); }
