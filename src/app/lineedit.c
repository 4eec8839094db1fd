/* lineedit.c - see lineedit.h.  Redraws the whole line after each key
 * (prompt + buffer, then moves the cursor back), which is simple and
 * correct for single-line input. */
#define _GNU_SOURCE
#include "lineedit.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <termios.h>
#include <unistd.h>

void lineedit_init(lineedit *le)
{
    memset(le, 0, sizeof *le);
    le->tty = isatty(0) && isatty(1);
}

void lineedit_free(lineedit *le)
{
    for (int i = 0; i < le->n_hist; i++) free(le->hist[i]);
    free(le->hist);
}

void lineedit_history_add(lineedit *le, const char *line)
{
    if (!*line || (le->n_hist && !strcmp(le->hist[le->n_hist - 1], line))) return;
    if (le->n_hist == le->cap_hist) {
        le->cap_hist = le->cap_hist ? le->cap_hist * 2 : 32;
        le->hist = realloc(le->hist, (size_t)le->cap_hist * sizeof *le->hist);
    }
    le->hist[le->n_hist++] = strdup(line);
}

static char *read_plain(const char *prompt)
{
    fputs(prompt, stdout);
    fflush(stdout);
    size_t cap = 256, n = 0;
    char *buf = malloc(cap);
    int c;
    while ((c = getchar()) != EOF && c != '\n') {
        if (n + 1 >= cap) buf = realloc(buf, cap *= 2);
        buf[n++] = (char)c;
    }
    if (c == EOF && n == 0) {
        free(buf);
        return NULL;
    }
    if (n && buf[n - 1] == '\r') n--;
    buf[n] = 0;
    return buf;
}

typedef struct {
    char *b;
    size_t len, cap, pos;   /* bytes; pos is a byte offset on a character boundary */
} ebuf;

static int is_cont(unsigned char c) { return (c & 0xC0) == 0x80; }

static size_t prev_char(const ebuf *e, size_t p)
{
    if (!p) return 0;
    p--;
    while (p && is_cont((unsigned char)e->b[p])) p--;
    return p;
}

static size_t next_char(const ebuf *e, size_t p)
{
    if (p >= e->len) return e->len;
    p++;
    while (p < e->len && is_cont((unsigned char)e->b[p])) p++;
    return p;
}

static size_t cols(const char *s, size_t n)
{
    size_t c = 0;
    for (size_t i = 0; i < n; i++) c += !is_cont((unsigned char)s[i]);
    return c;
}

static void redraw(const char *prompt, const ebuf *e)
{
    printf("\r\033[K%s%.*s", prompt, (int)e->len, e->b);
    size_t back = cols(e->b + e->pos, e->len - e->pos);
    if (back) printf("\033[%zuD", back);
    fflush(stdout);
}

static void set_text(ebuf *e, const char *s)
{
    size_t n = strlen(s);
    if (n + 1 > e->cap) e->b = realloc(e->b, e->cap = n + 64);
    memcpy(e->b, s, n);
    e->len = e->pos = n;
}

static void del_range(ebuf *e, size_t a, size_t b)
{
    memmove(e->b + a, e->b + b, e->len - b);
    e->len -= b - a;
    e->pos = a;
}

char *lineedit_read(lineedit *le, const char *prompt, int *cancelled)
{
    *cancelled = 0;
    if (!le->tty) return read_plain(prompt);
    struct termios saved, raw;
    if (tcgetattr(0, &saved) != 0) return read_plain(prompt);
    raw = saved;
    raw.c_iflag &= (tcflag_t) ~(BRKINT | ICRNL | INPCK | ISTRIP | IXON);
    raw.c_lflag &= (tcflag_t) ~(ECHO | ICANON | IEXTEN | ISIG);
    raw.c_cc[VMIN] = 1;
    raw.c_cc[VTIME] = 0;
    tcsetattr(0, TCSADRAIN, &raw); /* DRAIN, not FLUSH: keep what was typed ahead */
    ebuf e = {.b = malloc(64), .cap = 64};
    int hist_at = le->n_hist;
    char *saved_line = NULL;
    char *result = NULL;
    redraw(prompt, &e);
    for (;;) {
        unsigned char c;
        ssize_t r = read(0, &c, 1);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break; /* EOF */
        if (c == '\r' || c == '\n') {
            e.b[e.len] = 0;
            result = e.b;
            e.b = NULL;
            break;
        }
        if (c == 3) { /* Ctrl-C */
            *cancelled = 1;
            result = strdup("");
            break;
        }
        if (c == 4) { /* Ctrl-D */
            if (!e.len) break;
            if (e.pos < e.len) del_range(&e, e.pos, next_char(&e, e.pos));
        } else if (c == 127 || c == 8) {
            if (e.pos) del_range(&e, prev_char(&e, e.pos), e.pos);
        } else if (c == 1) {
            e.pos = 0;
        } else if (c == 5) {
            e.pos = e.len;
        } else if (c == 2) {
            e.pos = prev_char(&e, e.pos);
        } else if (c == 6) {
            e.pos = next_char(&e, e.pos);
        } else if (c == 21) { /* Ctrl-U */
            del_range(&e, 0, e.pos);
        } else if (c == 11) { /* Ctrl-K */
            e.len = e.pos;
        } else if (c == 23) { /* Ctrl-W */
            size_t p = e.pos;
            while (p && e.b[p - 1] == ' ') p--;
            while (p && e.b[p - 1] != ' ') p--;
            del_range(&e, p, e.pos);
        } else if (c == 27) {
            unsigned char seq[3] = {0};
            if (read(0, &seq[0], 1) != 1 || read(0, &seq[1], 1) != 1) continue;
            int key = 0;
            if (seq[0] == '[' && seq[1] >= '0' && seq[1] <= '9') {
                if (read(0, &seq[2], 1) != 1) continue;
                if (seq[2] == '~') key = seq[1] == '3' ? 'X' : (seq[1] == '1' || seq[1] == '7') ? 'H'
                                                           : (seq[1] == '4' || seq[1] == '8') ? 'F' : 0;
            } else if (seq[0] == '[' || seq[0] == 'O') {
                key = seq[1];
            }
            if (key == 'D') e.pos = prev_char(&e, e.pos);
            else if (key == 'C') e.pos = next_char(&e, e.pos);
            else if (key == 'H') e.pos = 0;
            else if (key == 'F') e.pos = e.len;
            else if (key == 'X' && e.pos < e.len) del_range(&e, e.pos, next_char(&e, e.pos));
            else if ((key == 'A' && hist_at > 0) || (key == 'B' && hist_at < le->n_hist)) {
                if (hist_at == le->n_hist) {
                    e.b[e.len] = 0;
                    free(saved_line);
                    saved_line = strdup(e.b);
                }
                hist_at += key == 'A' ? -1 : 1;
                set_text(&e, hist_at == le->n_hist ? (saved_line ? saved_line : "") : le->hist[hist_at]);
            }
        } else if (c >= 32 || c >= 0x80) {
            if (e.len + 2 > e.cap) e.b = realloc(e.b, e.cap *= 2);
            memmove(e.b + e.pos + 1, e.b + e.pos, e.len - e.pos);
            e.b[e.pos++] = (char)c;
            e.len++;
        }
        redraw(prompt, &e);
    }
    tcsetattr(0, TCSADRAIN, &saved);
    printf("\r\n");
    fflush(stdout);
    free(e.b);
    free(saved_line);
    return result;
}
