/* harness.h - the project's 40-line test helper.
 *
 * A test file defines `static const test_case tests[] = {{"name", fn}, ...}`
 * and calls test_main.  TCHECK records a failure (file:line and the
 * expression or a formatted message) and lets the test continue; TSKIP
 * marks the test skipped.  The last line printed is
 * `unit: N passed, N failed, N skipped`.
 */
#ifndef DF_TEST_HARNESS_H
#define DF_TEST_HARNESS_H

#include <stdio.h>

typedef struct test_case {
    const char *name;
    void (*fn)(void);
} test_case;

extern int t_failed_now, t_skipped_now;

void t_fail(const char *file, int line, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
void t_skip(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
int test_main(const test_case *tests, int n, int argc, char **argv);
/* Directory holding the test data (env DF_TESTDATA, default "testdata"). */
const char *testdata_dir(void);
/* A binary of the build under test: $BUILD/name (BUILD defaults to "build").
 * Two results may be held at once. */
const char *build_bin(const char *name);
/* Copy data (at most 256 KiB) so that its last byte sits right before an
 * unreadable page: a parser that over-reads faults instead of passing. */
const unsigned char *guard_place(const void *data, size_t n);
/* Scratch directory for generated models, made on first use under /var/tmp
 * (a disk file system, where O_DIRECT works), removed by test_scratch_remove. */
const char *test_scratch(void);
void test_scratch_remove(void);
/* Generate a model with k3gen into <scratch>/name (reused if present);
 * writes its path to out.  Returns 0, or records a failure and returns -1. */
int gen_model(const char *name, const char *args, char *out, size_t n);
/* A whole file, NUL-terminated (malloc'd; *n its length), or NULL. */
char *t_slurp(const char *path, size_t *n);
/* Run argv (argv[0] a path) to completion; its stdout and stderr go to
 * out and err (NUL-terminated, truncated to the sizes; either may be NULL).
 * Returns the exit status, or -1 when it did not exit normally. */
int t_run(const char *const *argv, char *out, size_t n_out, char *err, size_t n_err);

#define TCHECK(cond) do { if (!(cond)) t_fail(__FILE__, __LINE__, "%s", #cond); } while (0)
#define TCHECKF(cond, ...) do { if (!(cond)) t_fail(__FILE__, __LINE__, __VA_ARGS__); } while (0)
#define TSKIP(...) do { t_skip(__VA_ARGS__); return; } while (0)
#define NTESTS(a) ((int)(sizeof(a) / sizeof((a)[0])))

#endif
