/* test_repl.c - the chat REPL driven through a pseudo-terminal, as a user
 * would: a two-turn conversation whose state is kept between turns, line
 * editing (cursor movement, insertion, Ctrl-A, history), an interrupted
 * generation (Ctrl-C) after which the conversation goes on, and /reset.
 */
#define _GNU_SOURCE
#include "harness.h"

#include <poll.h>
#include <pty.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

typedef struct {
    pid_t pid;
    int fd;
    char buf[1 << 20];
    size_t len;
} repl;

static double mono(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

static int start_with(repl *r, const char *max_new, const char *draft)
{
    memset(r, 0, sizeof *r);
    char model[512], bin[512];
    snprintf(model, sizeof model, "%s/k3-tiny-a/checkpoint", testdata_dir());
    const char *b = getenv("BUILD");
    snprintf(bin, sizeof bin, "%s/deltafin", b && *b ? b : "build");
    struct winsize ws = {.ws_row = 40, .ws_col = 200};
    r->pid = forkpty(&r->fd, NULL, NULL, &ws);
    if (r->pid < 0) return -1;
    if (r->pid == 0) {
        if (draft)
            execl(bin, "deltafin", "chat", "--model", model, "--max-new", max_new, "--threads", "1", "--ctx", "100000",
                  "--draft", draft, "--draft-k", "3", (char *)NULL);
        else
            execl(bin, "deltafin", "chat", "--model", model, "--max-new", max_new, "--threads", "1", "--ctx", "100000",
                  (char *)NULL);
        _exit(127);
    }
    return 0;
}

static int start(repl *r, const char *max_new) { return start_with(r, max_new, NULL); }

/* Read until `needle` appears after offset `from` or the timeout; returns
 * the offset just past it, or -1. */
static long wait_for(repl *r, size_t from, const char *needle, double timeout)
{
    double end = mono() + timeout;
    for (;;) {
        r->buf[r->len] = 0;
        char *at = memmem(r->buf + from, r->len - from, needle, strlen(needle));
        if (at) return (long)(at - r->buf) + (long)strlen(needle);
        double left = end - mono();
        if (left <= 0) return -1;
        struct pollfd p = {.fd = r->fd, .events = POLLIN};
        if (poll(&p, 1, (int)(left * 1000) + 1) <= 0) continue;
        ssize_t n = read(r->fd, r->buf + r->len, sizeof r->buf - 1 - r->len);
        if (n <= 0) return -1;
        r->len += (size_t)n;
    }
}

static void send_keys(repl *r, const char *s)
{
    size_t n = strlen(s);
    if (write(r->fd, s, n) != (ssize_t)n) t_fail(__FILE__, __LINE__, "write to the pty failed");
    usleep(20000);
}

/* Run /stats and return the context token count it reports. */
static long context_tokens(repl *r)
{
    size_t from = r->len;
    send_keys(r, "/stats\r");
    long at = wait_for(r, from, "context: ", 10);
    if (at < 0) return -1;
    if (wait_for(r, (size_t)at, " tokens", 10) < 0) return -1;
    return strtol(r->buf + at, NULL, 10);
}

/* Send /quit and reap the child: it must exit by itself, with status 0.
 * The status checked is the one waitpid returned for this child, never a
 * stale one. */
static void stop(repl *r)
{
    send_keys(r, "/quit\r");
    int st = 0;
    pid_t w = 0;
    for (int i = 0; i < 100 && (w = waitpid(r->pid, &st, WNOHANG)) == 0; i++) usleep(50000);
    if (w == 0) {
        kill(r->pid, SIGKILL);
        waitpid(r->pid, &st, 0);
        t_fail(__FILE__, __LINE__, "chat did not exit on /quit");
    } else {
        TCHECKF(w == r->pid && WIFEXITED(st) && WEXITSTATUS(st) == 0, "chat ended with status %d on /quit", st);
    }
    close(r->fd);
}

/* a fresh prompt: the line editor starts on a new line with "\r\033[K> ";
 * keystroke echoes redraw without the newline */
#define PROMPT "\n\r\033[K> "

static repl R;

static void test_two_turns_and_reset(void)
{
    repl *r = &R;
    if (start(r, "12")) TSKIP("forkpty failed");
    TCHECKF(wait_for(r, 0, PROMPT, 20) >= 0, "no prompt; output: %.300s", r->buf);
    size_t from = r->len;
    send_keys(r, "Hello there\r");
    TCHECKF(wait_for(r, from, PROMPT, 30) >= 0, "no prompt after turn 1");
    long c1 = context_tokens(r);
    TCHECKF(c1 > 12, "context after one turn: %ld", c1);
    from = r->len;
    send_keys(r, "And again\r");
    TCHECK(wait_for(r, from, PROMPT, 30) >= 0);
    long c2 = context_tokens(r);
    /* the second turn adds only its own message and reply: the first turn
     * is not prefilled again */
    TCHECKF(c2 > c1 && c2 - c1 < c1 + 12, "context %ld after turn 2, %ld after turn 1", c2, c1);
    /* line editing: "/sats", three left arrows, insert "t" -> "/stats" */
    from = r->len;
    send_keys(r, "/sats\033[D\033[D\033[Dt\r");
    TCHECKF(wait_for(r, from, "context: ", 10) >= 0, "cursor editing did not produce /stats");
    /* Ctrl-A then insert at the start: "stats" -> "/stats" */
    from = r->len;
    send_keys(r, "stats\x01/\r");
    TCHECKF(wait_for(r, from, "context: ", 10) >= 0, "Ctrl-A editing did not produce /stats");
    /* history: up arrow recalls the last line */
    from = r->len;
    send_keys(r, "\033[A\r");
    TCHECKF(wait_for(r, from, "context: ", 10) >= 0, "history recall did not run /stats again");
    send_keys(r, "/reset\r");
    TCHECK(wait_for(r, r->len, "(conversation reset)", 10) >= 0);
    TCHECKF(context_tokens(r) == 0, "context not empty after /reset");
    from = r->len;
    send_keys(r, "Fresh start\r");
    TCHECK(wait_for(r, from, PROMPT, 30) >= 0);
    TCHECKF(context_tokens(r) > 0, "no turn after /reset");
    stop(r);
}

/* Send `msg`, let the reply run `run_us`, then press Ctrl-C; returns 1 when
 * the reply was interrupted ("[interrupted]" then a fresh prompt), 0 when it
 * ended by itself before the Ctrl-C arrived (the model said <|end_of_msg|>:
 * the caller tries again), -1 on a failure.  A Ctrl-C that stops nothing
 * leaves the reply running with no prompt, which is -1. */
static int interrupt_reply(repl *r, const char *msg, useconds_t run_us)
{
    size_t from = r->len;
    char line[128];
    snprintf(line, sizeof line, "%s\r", msg);
    send_keys(r, line);
    /* the line is taken (the editor left raw mode and ended the line): from
     * here a Ctrl-C is a signal, not a keystroke */
    long at0 = wait_for(r, from, line, 20);
    if (at0 < 0 || wait_for(r, (size_t)at0, "\n", 20) < 0) return -1;
    usleep(run_us);
    (void)wait_for(r, from, "\xff\xfe", 0.3); /* drain output */
    send_keys(r, "\x03");
    long at = wait_for(r, (size_t)at0, "[interrupted]", 20);
    if (at >= 0) return wait_for(r, (size_t)at, PROMPT, 20) >= 0 ? 1 : -1;
    /* no "[interrupted]": only acceptable when the reply had ended by itself */
    return wait_for(r, (size_t)at0, PROMPT, 0.1) >= 0 ? 0 : -1;
}

static void test_interrupt(void)
{
    repl *r = &R;
    if (start(r, "90000")) TSKIP("forkpty failed");
    TCHECK(wait_for(r, 0, PROMPT, 20) >= 0);
    /* the tiny model is random and rarely ends a reply; when it does before
     * the Ctrl-C, the turn is retried with another message */
    static const char *msgs[] = {"Tell me everything", "More please", "Keep talking", "Say more", "Continue"};
    int got = 0, tries = 0;
    for (; tries < 5 && got == 0; tries++) got = interrupt_reply(r, msgs[tries], 500000);
    TCHECKF(got == 1, "Ctrl-C did not stop the reply (%d tries); output ends: %s", tries,
            r->buf + (r->len > 400 ? r->len - 400 : 0));
    long c1 = context_tokens(r);
    TCHECKF(c1 > 20, "context after the interrupted reply: %ld", c1);
    /* the conversation continues after the interruption, and a second reply
     * is stopped the same way */
    got = 0;
    for (tries = 0; tries < 5 && got == 0; tries++) got = interrupt_reply(r, msgs[(tries + 1) % 5], 300000);
    TCHECKF(got == 1, "second Ctrl-C did not stop the reply (%d tries); output ends: %s", tries,
            r->buf + (r->len > 400 ? r->len - 400 : 0));
    long c2 = context_tokens(r);
    TCHECKF(c2 > c1, "context %ld after the second reply, %ld before", c2, c1);
    stop(r);
}

/* The replies of a two-turn conversation, as printed: the same with the
 * model drafting for itself (every draft accepted) as without drafts. */
static void transcript(const char *draft, char *out, size_t n)
{
    repl *r = &R;
    out[0] = 0;
    if (start_with(r, "20", draft)) TSKIP("forkpty failed");
    TCHECK(wait_for(r, 0, PROMPT, 20) >= 0);
    size_t from = r->len;
    send_keys(r, "Hello there\r");
    TCHECK(wait_for(r, from, PROMPT, 30) >= 0);
    send_keys(r, "And again\r");
    TCHECK(wait_for(r, r->len, PROMPT, 30) >= 0);
    size_t end = r->len;
    long c = context_tokens(r);
    snprintf(out, n, "%.*s|context %ld", (int)(end - from), r->buf + from, c);
    stop(r);
}

static void test_drafts_same_replies(void)
{
    static char plain[1 << 16], drafted[1 << 16], spec[600];
    snprintf(spec, sizeof spec, "model:%s/k3-tiny-a/checkpoint", testdata_dir());
    transcript(NULL, plain, sizeof plain);
    transcript(spec, drafted, sizeof drafted);
    TCHECKF(plain[0] && !strcmp(plain, drafted), "with drafts:\n%s\nwithout:\n%s", drafted, plain);
}

static const test_case tests[] = {
    {"repl_drafts_same_replies", test_drafts_same_replies},
    {"repl_two_turns_editing_reset", test_two_turns_and_reset},
    {"repl_ctrl_c_interrupts_reply", test_interrupt},
};

int main(int argc, char **argv) { return test_main(tests, NTESTS(tests), argc, argv); }
