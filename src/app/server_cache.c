/* server_cache.c - `serve --prompt-cache DIR`: conversations that leave a
 * seat (another conversation takes it, or the server stops) are saved as
 * session files (engine.h df_session_save) in DIR, and a request whose
 * prompt extends a saved one resumes from it instead of evaluating it
 * again, across evictions and restarts.
 *
 * What is saved: the conversation up to its last checkpoint (the end of
 * the last user or tool message, where the next turn's prompt parts from
 * the reply's reasoning) when it has one, else all it holds; a file is
 * named by a hash of its ids.  Choosing: every file's ids are read (not its
 * state: df_session_file_ids) and the longest that is a proper prefix of
 * the prompt wins.  The directory is kept under --prompt-cache-max bytes
 * by deleting the least recently used files (a file used is touched);
 * files of another model, or damaged, are skipped when choosing and
 * deleted when found; anything but a regular file is skipped (never
 * opened: a FIFO would block the worker), and a killed save's temporary
 * file is deleted at start and at every eviction.
 */
#define _GNU_SOURCE
#include "server_impl.h"
#include "options.h"
#include "util.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <utime.h>

#define SUFFIX ".session"

static int is_session(const char *name)
{
    size_t n = strlen(name), k = strlen(SUFFIX);
    return n > k && !strcmp(name + n - k, SUFFIX) && name[0] != '.';
}

/* A save's temporary file ("NAME.session.tmp", atomic_file): left behind
 * only by a save that was killed, since the one worker saves and evicts in
 * turn. */
static int is_stale_tmp(const char *name)
{
    size_t n = strlen(name), k = strlen(SUFFIX ".tmp");
    return n > k && !strcmp(name + n - k, SUFFIX ".tmp");
}

/* Delete the least recently used files until the directory fits the budget. */
static void evict(srv *S)
{
    for (;;) {
        DIR *d = opendir(S->pcache_dir);
        if (!d) return;
        uint64_t total = 0;
        char oldest[1024] = "";
        time_t t_old = 0;
        struct dirent *e;
        while ((e = readdir(d))) {
            char p[1024];
            struct stat st;
            snprintf(p, sizeof p, "%s/%s", S->pcache_dir, e->d_name);
            if (is_stale_tmp(e->d_name)) {
                unlink(p);
                continue;
            }
            if (!is_session(e->d_name)) continue;
            if (lstat(p, &st) || !S_ISREG(st.st_mode)) continue;
            total += (uint64_t)st.st_size;
            if (!oldest[0] || st.st_mtime < t_old) {
                t_old = st.st_mtime;
                snprintf(oldest, sizeof oldest, "%s", p);
            }
        }
        closedir(d);
        if (total <= S->pcache_max || !oldest[0]) return;
        unlink(oldest);
    }
}

/* At start: a killed save's temporary files go, and the directory is
 * brought under --prompt-cache-max. */
void pcache_init(srv *S)
{
    if (S->pcache_dir) evict(S);
}

int pcache_save(srv *S, seat *sl)
{
    if (!S->pcache_dir || !sl->hist_ok) return 0;
    df_error err = {0};
    if (gen_settle(&sl->gl, 0, &err)) return -1;
    size_t n;
    const int32_t *h = gen_history(&sl->gl, &n);
    int pos = df_session_pos(sl->s);
    /* up to the last checkpoint when the session still has it */
    if (sl->ck_pos > 0 && sl->ck_pos < pos && df_session_reachable(sl->s, sl->ck_pos) == sl->ck_pos) {
        if (gen_rewind(&sl->gl, (size_t)sl->ck_pos, &err)) return -1;
        pos = sl->ck_pos;
    }
    if (pos < 16) return 0; /* not worth a file */
    uint64_t hash = 0xcbf29ce484222325ull;
    for (int i = 0; i < pos; i++) hash = (hash ^ (uint32_t)h[i]) * 0x100000001b3ull;
    char path[1024];
    snprintf(path, sizeof path, "%s/%016llx" SUFFIX, S->pcache_dir, (unsigned long long)hash);
    if (df_session_save(sl->s, h, pos, path, &err)) {
        fprintf(stderr, "deltafin: --prompt-cache: %s\n", err.msg);
        return -1;
    }
    evict(S);
    return 0;
}

int pcache_find(srv *S, const job *j, size_t longer_than, char *path, size_t n_path)
{
    if (!S->pcache_dir) return 0;
    DIR *d = opendir(S->pcache_dir);
    if (!d) return 0;
    int best = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!is_session(e->d_name)) continue;
        char p[1024];
        snprintf(p, sizeof p, "%s/%s", S->pcache_dir, e->d_name);
        struct stat st;
        if (lstat(p, &st) || !S_ISREG(st.st_mode)) continue; /* a FIFO would block the worker */
        int n = 0;
        df_error err = {0};
        if (df_session_file_ids(S->eng, p, S->pc_ids, S->n_ctx, &n, &err)) {
            /* another model's or damaged: not ours to keep */
            if (err.code != DF_ERR_IO) unlink(p);
            continue;
        }
        if ((size_t)n <= longer_than || (size_t)n >= j->n_ids || n <= best) continue;
        if (memcmp(S->pc_ids, j->ids, (size_t)n * sizeof *j->ids)) continue;
        best = n;
        snprintf(path, n_path, "%s", p);
    }
    closedir(d);
    if (best) utime(path, NULL); /* used: the most recent */
    return best;
}
