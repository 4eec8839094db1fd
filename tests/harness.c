/* harness.c - see harness.h.  Tests run in table order in one process; an
 * optional argument runs only the tests whose name contains it. */
#define _GNU_SOURCE
#include "harness.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <fcntl.h>
#include <unistd.h>

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

const char *build_bin(const char *name)
{
    static char path[2][512];
    static int k;
    const char *b = getenv("BUILD");
    k ^= 1;
    snprintf(path[k], sizeof path[k], "%s/%s", b && *b ? b : "build", name);
    return path[k];
}

const unsigned char *guard_place(const void *data, size_t n)
{
    static unsigned char *guarded;
    size_t pg = (size_t)sysconf(_SC_PAGESIZE), span = 64 * pg;
    if (!guarded) {
        guarded = mmap(NULL, span + pg, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (guarded == MAP_FAILED || mprotect(guarded + span, pg, PROT_NONE) != 0) abort();
    }
    if (n > span) abort();
    unsigned char *at = guarded + span - n;
    if (n) memcpy(at, data, n);
    return at;
}

static char scratch[256];
static pid_t scratch_owner;

/* at exit, by the process that made it (not a forked child) */
static void scratch_at_exit(void)
{
    if (scratch[0] && getpid() == scratch_owner) test_scratch_remove();
}

const char *test_scratch(void)
{
    if (!scratch[0]) {
        static int registered;
        if (!registered++) atexit(scratch_at_exit);
        scratch_owner = getpid();
        snprintf(scratch, sizeof scratch, "/var/tmp/df_test_XXXXXX");
        if (!mkdtemp(scratch)) {
            snprintf(scratch, sizeof scratch, "/tmp/df_test_XXXXXX");
            if (!mkdtemp(scratch)) {
                perror("mkdtemp");
                abort();
            }
        }
    }
    return scratch;
}

void test_scratch_remove(void)
{
    if (!scratch[0]) return;
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", scratch);
    if (system(cmd) != 0) fprintf(stderr, "cannot remove %s\n", scratch);
    scratch[0] = 0;
}

int gen_model(const char *name, const char *args, char *out, size_t n)
{
    snprintf(out, n, "%s/%s", test_scratch(), name);
    struct stat st;
    if (stat(out, &st) == 0) return 0;
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s --out %s %s >/dev/null", build_bin("k3gen"), out, args);
    int rc = system(cmd);
    if (rc) t_fail(__FILE__, __LINE__, "k3gen failed: %s", cmd);
    return rc ? -1 : 0;
}

static void drain(int fd, char *buf, size_t n)
{
    size_t len = 0;
    char sink[4096];
    for (;;) {
        ssize_t k = buf && len + 1 < n ? read(fd, buf + len, n - 1 - len) : read(fd, sink, sizeof sink);
        if (k <= 0) break;
        if (buf && len + 1 < n) len += (size_t)k;
    }
    if (buf && n) buf[len] = 0;
    close(fd);
}

char *t_slurp(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)(len > 0 ? len : 0) + 1);
    *n = len > 0 ? fread(b, 1, (size_t)len, f) : 0;
    b[*n] = 0;
    fclose(f);
    return b;
}

int t_run(const char *const *argv, char *out, size_t n_out, char *err, size_t n_err)
{
    char tmpl[] = "/tmp/df_t_run_XXXXXX";
    int efd = mkstemp(tmpl);
    int po[2];
    if (efd < 0 || pipe(po) != 0) return -1;
    unlink(tmpl);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(po[1], 1);
        dup2(efd, 2);
        close(po[0]);
        execv(argv[0], (char *const *)(uintptr_t)argv);
        _exit(127);
    }
    close(po[1]);
    drain(po[0], out, n_out);
    int status;
    if (waitpid(pid, &status, 0) != pid) return -1;
    lseek(efd, 0, SEEK_SET);
    drain(efd, err, n_err);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/* Is `name` one of $DF_TEST_SKIP's comma-separated "program:test" entries?
 * (tests/qemu/run_qemu_tests.sh: what is too slow under qemu, each with its
 * reason in tests/qemu/skip.list) */
static int skip_listed(const char *prog, const char *name)
{
    const char *l = getenv("DF_TEST_SKIP");
    if (!l || !*l) return 0;
    const char *base = strrchr(prog, '/');
    base = base ? base + 1 : prog;
    size_t bl = strlen(base), nl = strlen(name);
    for (const char *p = l; *p;) {
        const char *e = strchr(p, ',');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        if (len == bl + 1 + nl && !strncmp(p, base, bl) && p[bl] == ':' && !strncmp(p + bl + 1, name, nl)) return 1;
        p += len + (e ? 1 : 0);
    }
    return 0;
}

int test_main(const test_case *tests, int n, int argc, char **argv)
{
    int passed = 0, failed = 0, skipped = 0;
    for (int i = 0; i < n; i++) {
        if (argc > 1 && !strstr(tests[i].name, argv[1])) continue;
        if (argc > 0 && skip_listed(argv[0], tests[i].name)) {
            fprintf(stderr, "  skip %s (listed in $DF_TEST_SKIP)\n", tests[i].name);
            skipped++;
            continue;
        }
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
