/*
 * k3gen utilities: die (every error is fatal: message on stderr, exit 1), the
 * x-allocators, the growable string/byte buffer sbuf (with a JSON string
 * escaper), rng seeding, and the output-file helpers.
 * Invariants:
 *  - a tensor's rng stream depends only on (--seed, its name): xoshiro256**
 *    seeded by splitmix64 from the seed and the name's FNV-1a hash.
 *  - files are written as NAME.k3gen-tmp and renamed when complete
 *    (out_open/out_close); prepare_out_dir refuses a non-empty directory
 *    unless --force, and then removes only files k3gen itself writes.
 * No knowledge of the model, the tensor roster or any file format.
 */
#include "k3gen.h"

/* ------------------------------------------------------------------ errors */

void die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("k3gen: error: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(1);
}

void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p)
        die("out of memory allocating %zu bytes", n);
    return p;
}

void *xrealloc(void *p, size_t n)
{
    void *q = realloc(p, n ? n : 1);
    if (!q)
        die("out of memory reallocating %zu bytes", n);
    return q;
}

char *xstrdup(const char *s)
{
    size_t n = strlen(s) + 1;
    char *d = xmalloc(n);
    memcpy(d, s, n);
    return d;
}

/* ---------------------------------------------------------- string builder */

void sb_reserve(sbuf *sb, size_t extra)
{
    if (sb->len + extra + 1 > sb->cap) {
        size_t cap = sb->cap ? sb->cap : 1024;
        while (sb->len + extra + 1 > cap)
            cap *= 2;
        sb->buf = xrealloc(sb->buf, cap);
        sb->cap = cap;
    }
}

void sb_addn(sbuf *sb, const char *s, size_t n)
{
    sb_reserve(sb, n);
    memcpy(sb->buf + sb->len, s, n);
    sb->len += n;
    sb->buf[sb->len] = 0;
}

void sb_add(sbuf *sb, const char *s) { sb_addn(sb, s, strlen(s)); }

void sb_printf(sbuf *sb, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0)
        die("internal: vsnprintf failed");
    sb_reserve(sb, (size_t)n);
    va_start(ap, fmt);
    vsnprintf(sb->buf + sb->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    sb->len += (size_t)n;
}

/* JSON string literal with escapes. */
void sb_json_str(sbuf *sb, const char *s)
{
    sb_add(sb, "\"");
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') {
            char e[3] = {'\\', (char)c, 0};
            sb_add(sb, e);
        } else if (c < 0x20) {
            sb_printf(sb, "\\u%04x", c);
        } else {
            sb_addn(sb, (const char *)&c, 1);
        }
    }
    sb_add(sb, "\"");
}

/* --------------------------------------------------------------------- rng */

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static uint64_t fnv1a64(const char *s)
{
    uint64_t h = 0xcbf29ce484222325ULL;
    for (; *s; s++) {
        h ^= (unsigned char)*s;
        h *= 0x100000001b3ULL;
    }
    return h;
}

void rng_seed(rng *r, uint64_t seed, const char *name)
{
    uint64_t x = seed * 0xd1b54a32d192ed03ULL ^ fnv1a64(name);
    for (int i = 0; i < 4; i++)
        r->s[i] = splitmix64(&x);
    r->have_spare = 0;
    r->spare = 0.0f;
}
void write_all(FILE *f, const void *p, size_t n, const char *path)
{
    if (n && fwrite(p, 1, n, f) != n)
        die("writing %s: %s", path, strerror(errno));
}

/* ------------------------------------------------------------- file helpers */

char *path_join(const char *dir, const char *name)
{
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = xmalloc(n);
    snprintf(p, n, "%s/%s", dir, name);
    return p;
}

out_file out_open(const char *dir, const char *name)
{
    out_file o;
    o.final_path = path_join(dir, name);
    size_t n = strlen(o.final_path) + sizeof TMP_SUFFIX;
    o.tmp_path = xmalloc(n);
    snprintf(o.tmp_path, n, "%s%s", o.final_path, TMP_SUFFIX);
    o.f = fopen(o.tmp_path, "wb");
    if (!o.f)
        die("cannot create %s: %s", o.tmp_path, strerror(errno));
    return o;
}

void out_close(out_file *o)
{
    if (ferror(o->f) || fclose(o->f) != 0)
        die("writing %s failed: %s", o->tmp_path, strerror(errno));
    if (rename(o->tmp_path, o->final_path) != 0)
        die("cannot rename %s to %s: %s", o->tmp_path, o->final_path, strerror(errno));
    free(o->final_path);
    free(o->tmp_path);
}

void write_text_file(const char *dir, const char *name, const char *text, size_t len)
{
    out_file o = out_open(dir, name);
    write_all(o.f, text, len, o.tmp_path);
    out_close(&o);
}

static void mkdir_p(const char *path)
{
    char *p = xstrdup(path);
    for (char *s = p + 1; *s; s++) {
        if (*s == '/') {
            *s = 0;
            if (mkdir(p, 0777) != 0 && errno != EEXIST)
                die("cannot create directory %s: %s", p, strerror(errno));
            *s = '/';
        }
    }
    if (mkdir(p, 0777) != 0 && errno != EEXIST)
        die("cannot create directory %s: %s", p, strerror(errno));
    struct stat st;
    if (stat(p, &st) != 0 || !S_ISDIR(st.st_mode))
        die("%s exists and is not a directory", p);
    free(p);
}

static int is_our_file(const char *name)
{
    static const char *fixed[] = {"config.json", "model.safetensors.index.json",
                                  "tiktoken.model", "tokenizer_config.json"};
    for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++)
        if (!strcmp(name, fixed[i]))
            return 1;
    size_t n = strlen(name);
    if (n > strlen(TMP_SUFFIX) && !strcmp(name + n - strlen(TMP_SUFFIX), TMP_SUFFIX))
        return 1;
    /* model-NNNNN-of-NNNNNN.safetensors */
    const char *pat = "model-#####-of-######.safetensors";
    if (n != strlen(pat))
        return 0;
    for (size_t i = 0; i < n; i++) {
        if (pat[i] == '#' ? (name[i] < '0' || name[i] > '9') : name[i] != pat[i])
            return 0;
    }
    return 1;
}

/* Create dir; refuse a non-empty one unless force, in which case stale files
 * this tool writes (shards, index, config, tokenizer, temporaries) are removed. */
void prepare_out_dir(const char *dir, int force)
{
    mkdir_p(dir);
    DIR *d = opendir(dir);
    if (!d)
        die("cannot open directory %s: %s", dir, strerror(errno));
    struct dirent *de;
    int nonempty = 0;
    while ((de = readdir(d))) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
            continue;
        nonempty = 1;
        if (force && is_our_file(de->d_name)) {
            char *p = path_join(dir, de->d_name);
            if (unlink(p) != 0)
                die("cannot remove stale %s: %s", p, strerror(errno));
            free(p);
        }
    }
    closedir(d);
    if (nonempty && !force)
        die("output directory %s exists and is not empty (use --force to overwrite)", dir);
}

