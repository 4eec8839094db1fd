/* harness.c - see harness.h.  Tests run in table order in one process; an
 * optional argument runs only the tests whose name contains it. */
#include "harness.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

int t_failed_now, t_skipped_now;

void t_fail(const char *file, int line, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "    FAIL %s:%d: ", file, line);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    t_failed_now++;
}

void t_skip(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "    skip: ");
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    t_skipped_now = 1;
}

const char *testdata_dir(void)
{
    const char *d = getenv("DF_TESTDATA");
    return d && *d ? d : "testdata";
}

int test_main(const test_case *tests, int n, int argc, char **argv)
{
    int passed = 0, failed = 0, skipped = 0;
    for (int i = 0; i < n; i++) {
        if (argc > 1 && !strstr(tests[i].name, argv[1])) continue;
        t_failed_now = 0;
        t_skipped_now = 0;
        tests[i].fn();
        const char *st = t_failed_now ? "FAIL" : t_skipped_now ? "skip" : "ok";
        fprintf(stderr, "  %-4s %s\n", st, tests[i].name);
        if (t_failed_now) failed++;
        else if (t_skipped_now) skipped++;
        else passed++;
    }
    printf("unit: %d passed, %d failed, %d skipped\n", passed, failed, skipped);
    return failed ? 1 : 0;
}
