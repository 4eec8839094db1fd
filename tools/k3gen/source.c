/*
 * k3gen --from reader: opens an existing safetensors checkpoint, checks every
 * roster tensor against it (name, dtype, shape, byte count) and reads tensor
 * bytes back for the GGUF writer. It carries its own small JSON parser (for
 * the shard headers and the index weight_map) rather than the engine's, so
 * that --from stays an independent reading of the format.
 * Invariants:
 *  - every roster tensor must be present with exactly the roster's dtype and
 *    shape, and DIR may hold no other language_model.* tensor.
 *  - data offsets are checked against the file size before any read; short
 *    reads are fatal.
 * Writes nothing.
 */
#include "k3gen.h"

/* ------------------------------------------------ --from: source checkpoint */
/*
 * --from DIR takes every tensor's bytes from an existing safetensors
 * checkpoint instead of the random generator; the roster (names, dtypes,
 * shapes) still comes from the preset and --set, and each roster tensor
 * must be in DIR with exactly that dtype and shape.  The shards are found
 * through DIR/model.safetensors.index.json ("weight_map": name -> shard
 * file) or, without an index, by reading the header of every
 * DIR/NAME.safetensors.  A shard is 8 bytes of little-endian header length,
 * that many bytes of JSON {"name": {"dtype": "BF16", "shape": [..],
 * "data_offsets": [begin, end]}, "__metadata__": {..}}, then the data; the
 * offsets are relative to the data and are checked against the file size.
 * The JSON is parsed properly (escapes decoded, keys compared whole).
 */

typedef struct {
    const char *start, *p, *end;
    const char *what; /* the file, for messages */
} jcur;

static void jdie(const jcur *j, const char *msg)
{
    die("%s: malformed JSON at byte %zu: %s", j->what, (size_t)(j->p - j->start), msg);
}

static int j_peek(jcur *j)
{
    while (j->p < j->end && (*j->p == ' ' || *j->p == '\t' || *j->p == '\n' || *j->p == '\r'))
        j->p++;
    return j->p < j->end ? (unsigned char)*j->p : -1;
}

static void j_expect(jcur *j, char c)
{
    if (j_peek(j) != (unsigned char)c) {
        char m[32];
        snprintf(m, sizeof m, "expected '%c'", c);
        jdie(j, m);
    }
    j->p++;
}

/* After an object's or array's opening bracket: 1 if another element
 * follows (its separating comma consumed), 0 at the closing bracket. */
static int j_more(jcur *j, char close, int *first)
{
    int c = j_peek(j);
    if (c == (unsigned char)close) {
        j->p++;
        return 0;
    }
    if (!*first) {
        if (c != ',')
            jdie(j, close == '}' ? "expected ',' or '}'" : "expected ',' or ']'");
        j->p++;
    }
    *first = 0;
    return 1;
}

static uint32_t j_hex4(jcur *j)
{
    if (j->end - j->p < 4)
        jdie(j, "truncated \\u escape");
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) {
        char c = *j->p++;
        v <<= 4;
        if (c >= '0' && c <= '9')
            v |= (uint32_t)(c - '0');
        else if (c >= 'a' && c <= 'f')
            v |= (uint32_t)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F')
            v |= (uint32_t)(c - 'A' + 10);
        else
            jdie(j, "bad hex digit in \\u escape");
    }
    return v;
}

/* A JSON string, decoded to a new NUL-terminated UTF-8 string. */
static char *j_string(jcur *j)
{
    j_expect(j, '"');
    sbuf sb = {0};
    sb_reserve(&sb, 0);
    for (;;) {
        if (j->p >= j->end)
            jdie(j, "unterminated string");
        unsigned char c = (unsigned char)*j->p++;
        if (c == '"')
            break;
        if (c < 0x20)
            jdie(j, "control character in a string");
        if (c != '\\') {
            sb_addn(&sb, (const char *)&c, 1);
            continue;
        }
        if (j->p >= j->end)
            jdie(j, "unterminated string");
        c = (unsigned char)*j->p++;
        const char *e = NULL;
        switch (c) {
        case '"': e = "\""; break;
        case '\\': e = "\\"; break;
        case '/': e = "/"; break;
        case 'b': e = "\b"; break;
        case 'f': e = "\f"; break;
        case 'n': e = "\n"; break;
        case 'r': e = "\r"; break;
        case 't': e = "\t"; break;
        case 'u': break;
        default: jdie(j, "bad escape in a string");
        }
        if (e) {
            sb_add(&sb, e);
            continue;
        }
        uint32_t cp = j_hex4(j);
        if (cp >= 0xDC00 && cp < 0xE000)
            jdie(j, "lone low surrogate in \\u escape");
        if (cp >= 0xD800 && cp < 0xDC00) {
            if (j->end - j->p < 2 || j->p[0] != '\\' || j->p[1] != 'u')
                jdie(j, "high surrogate without its low half");
            j->p += 2;
            uint32_t lo = j_hex4(j);
            if (lo < 0xDC00 || lo >= 0xE000)
                jdie(j, "high surrogate without its low half");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
        }
        if (cp == 0)
            jdie(j, "\\u0000 in a string");
        unsigned char u[4];
        int n;
        if (cp < 0x80) {
            u[0] = (unsigned char)cp;
            n = 1;
        } else if (cp < 0x800) {
            u[0] = (unsigned char)(0xC0 | cp >> 6);
            u[1] = (unsigned char)(0x80 | (cp & 63));
            n = 2;
        } else if (cp < 0x10000) {
            u[0] = (unsigned char)(0xE0 | cp >> 12);
            u[1] = (unsigned char)(0x80 | (cp >> 6 & 63));
            u[2] = (unsigned char)(0x80 | (cp & 63));
            n = 3;
        } else {
            u[0] = (unsigned char)(0xF0 | cp >> 18);
            u[1] = (unsigned char)(0x80 | (cp >> 12 & 63));
            u[2] = (unsigned char)(0x80 | (cp >> 6 & 63));
            u[3] = (unsigned char)(0x80 | (cp & 63));
            n = 4;
        }
        sb_addn(&sb, (const char *)u, (size_t)n);
    }
    return sb.buf;
}

/* A non-negative JSON integer (no sign, fraction or exponent). */
static uint64_t j_uint(jcur *j)
{
    int c = j_peek(j);
    if (c < '0' || c > '9')
        jdie(j, "expected a non-negative integer");
    uint64_t v = 0;
    while (j->p < j->end && *j->p >= '0' && *j->p <= '9') {
        unsigned d = (unsigned)(*j->p - '0');
        if (v > (UINT64_MAX - d) / 10)
            jdie(j, "integer too large");
        v = v * 10 + d;
        j->p++;
    }
    if (j->p < j->end && (*j->p == '.' || *j->p == 'e' || *j->p == 'E'))
        jdie(j, "expected an integer");
    return v;
}

/* Skips any JSON value. */
static void j_skip(jcur *j, int depth)
{
    if (depth > 64)
        jdie(j, "nested too deeply");
    int c = j_peek(j), first = 1;
    if (c == '{') {
        j->p++;
        while (j_more(j, '}', &first)) {
            free(j_string(j));
            j_expect(j, ':');
            j_skip(j, depth + 1);
        }
    } else if (c == '[') {
        j->p++;
        while (j_more(j, ']', &first))
            j_skip(j, depth + 1);
    } else if (c == '"') {
        free(j_string(j));
    } else if (c == 't' || c == 'f' || c == 'n') {
        const char *lit = c == 't' ? "true" : c == 'f' ? "false" : "null";
        size_t n = strlen(lit);
        if ((size_t)(j->end - j->p) < n || memcmp(j->p, lit, n))
            jdie(j, "bad literal");
        j->p += n;
    } else if (c == '-' || (c >= '0' && c <= '9')) {
        const char *s = j->p;
        while (j->p < j->end && *j->p && strchr("+-0123456789.eE", *j->p))
            j->p++;
        if (j->p == s + (c == '-'))
            jdie(j, "bad number");
    } else {
        jdie(j, "expected a value");
    }
}

static void j_finish(jcur *j)
{
    if (j_peek(j) != -1)
        jdie(j, "trailing data after the top-level object");
}

src_ckpt *g_src; /* set by --from */

int have_source(void) { return g_src != NULL; }

static int cmp_entry(const void *a, const void *b)
{
    return strcmp(((const src_entry *)a)->name, ((const src_entry *)b)->name);
}

static const src_entry *src_find(const src_shard *sh, const char *name)
{
    size_t lo = 0, hi = sh->n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        int c = strcmp(sh->e[mid].name, name);
        if (!c)
            return &sh->e[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

/* Reads exactly n bytes at off; dies naming what on a short read. */
static void pread_full(int fd, void *buf, size_t n, uint64_t off, const char *path,
                       const char *what)
{
    unsigned char *p = buf;
    while (n) {
        ssize_t r = pread(fd, p, n, (off_t)off);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            die("%s: reading %s: %s", path, what, strerror(errno));
        if (r == 0)
            die("%s: reading %s: unexpected end of file (truncated?)", path, what);
        p += r;
        n -= (size_t)r;
        off += (uint64_t)r;
    }
}

/* Opens DIR/file and parses its header; returns its index (opened once). */
static size_t src_shard_open(src_ckpt *sc, const char *file)
{
    for (size_t i = 0; i < sc->n; i++)
        if (!strcmp(sc->s[i].file, file))
            return i;
    if (!*file || strchr(file, '/') || !strcmp(file, ".") || !strcmp(file, ".."))
        die("--from %s: shard name '%s' is not a file name in that directory", sc->dir, file);
    if (sc->n == sc->cap) {
        sc->cap = sc->cap ? 2 * sc->cap : 16;
        sc->s = xrealloc(sc->s, sc->cap * sizeof *sc->s);
    }
    src_shard *sh = &sc->s[sc->n];
    memset(sh, 0, sizeof *sh);
    sh->file = xstrdup(file);
    sh->path = path_join(sc->dir, file);
    sh->fd = open(sh->path, O_RDONLY);
    if (sh->fd < 0)
        die("--from: cannot open %s: %s", sh->path, strerror(errno));
    struct stat st;
    if (fstat(sh->fd, &st) != 0 || !S_ISREG(st.st_mode))
        die("--from: %s is not a regular file", sh->path);
    sh->size = (uint64_t)st.st_size;
    if (sh->size < 8)
        die("%s: %llu bytes, too short for a safetensors header", sh->path,
            (unsigned long long)sh->size);
    unsigned char len8[8];
    pread_full(sh->fd, len8, 8, 0, sh->path, "the header length");
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--)
        hlen = hlen << 8 | len8[i];
    if (hlen > sh->size - 8)
        die("%s: header length %llu runs past the end of the file (%llu bytes)", sh->path,
            (unsigned long long)hlen, (unsigned long long)sh->size);
    if (hlen > (256u << 20))
        die("%s: header length %llu is implausibly large", sh->path, (unsigned long long)hlen);
    char *hdr = xmalloc((size_t)hlen);
    pread_full(sh->fd, hdr, (size_t)hlen, 8, sh->path, "the header");
    const uint64_t data0 = 8 + hlen, data_bytes = sh->size - data0;
    jcur j = {hdr, hdr, hdr + hlen, sh->path};
    size_t cap = 0;
    int first = 1;
    j_expect(&j, '{');
    while (j_more(&j, '}', &first)) {
        char *name = j_string(&j);
        j_expect(&j, ':');
        if (!strcmp(name, "__metadata__")) {
            j_skip(&j, 0);
            free(name);
            continue;
        }
        src_entry e = {name, NULL, -1, {0}, 0, 0};
        int have_off = 0, f2 = 1;
        j_expect(&j, '{');
        while (j_more(&j, '}', &f2)) {
            char *key = j_string(&j);
            j_expect(&j, ':');
            if (!strcmp(key, "dtype")) {
                free(e.dtype);
                e.dtype = j_string(&j);
            } else if (!strcmp(key, "shape")) {
                int f3 = 1;
                e.ndim = 0;
                j_expect(&j, '[');
                while (j_more(&j, ']', &f3)) {
                    uint64_t d = j_uint(&j);
                    if (d > (uint64_t)INT64_MAX)
                        jdie(&j, "dimension too large");
                    if (e.ndim < SRC_MAX_DIMS)
                        e.shape[e.ndim] = (int64_t)d;
                    if (++e.ndim > 64)
                        jdie(&j, "too many dimensions");
                }
            } else if (!strcmp(key, "data_offsets")) {
                int f3 = 1, k = 0;
                uint64_t o[2] = {0, 0};
                j_expect(&j, '[');
                while (j_more(&j, ']', &f3)) {
                    if (k == 2)
                        jdie(&j, "data_offsets has more than two entries");
                    o[k++] = j_uint(&j);
                }
                if (k != 2)
                    jdie(&j, "data_offsets needs two entries");
                if (o[0] > o[1] || o[1] > data_bytes)
                    die("%s: tensor %s: data_offsets [%llu, %llu] are not within the %llu data "
                        "bytes after the header", sh->path, name, (unsigned long long)o[0],
                        (unsigned long long)o[1], (unsigned long long)data_bytes);
                e.begin = data0 + o[0];
                e.end = data0 + o[1];
                have_off = 1;
            } else {
                j_skip(&j, 0);
            }
            free(key);
        }
        if (!e.dtype || e.ndim < 0 || !have_off)
            die("%s: tensor %s lacks %s in the header", sh->path, name,
                !e.dtype ? "\"dtype\"" : e.ndim < 0 ? "\"shape\"" : "\"data_offsets\"");
        if (sh->n == cap) {
            cap = cap ? 2 * cap : 256;
            sh->e = xrealloc(sh->e, cap * sizeof *sh->e);
        }
        sh->e[sh->n++] = e;
    }
    j_finish(&j);
    free(hdr);
    if (sh->n)
        qsort(sh->e, sh->n, sizeof *sh->e, cmp_entry);
    for (size_t i = 1; i < sh->n; i++)
        if (!strcmp(sh->e[i - 1].name, sh->e[i].name))
            die("%s: tensor %s appears twice in the header", sh->path, sh->e[i].name);
    return sc->n++;
}

typedef struct {
    char *name, *file;
} wm_entry;

static int cmp_wm(const void *a, const void *b)
{
    return strcmp(((const wm_entry *)a)->name, ((const wm_entry *)b)->name);
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* "weight_map" of DIR/model.safetensors.index.json, sorted by name. */
static wm_entry *read_weight_map(const char *path, size_t *n_out)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        die("--from: cannot open %s: %s", path, strerror(errno));
    sbuf sb = {0};
    char buf[65536];
    size_t r;
    while ((r = fread(buf, 1, sizeof buf, f)) > 0) {
        sb_addn(&sb, buf, r);
        if (sb.len > (1u << 30))
            die("%s: larger than 1 GiB; not an index", path);
    }
    if (ferror(f))
        die("reading %s: %s", path, strerror(errno));
    fclose(f);
    sb_reserve(&sb, 0);
    jcur j = {sb.buf, sb.buf, sb.buf + sb.len, path};
    wm_entry *wm = NULL;
    size_t n = 0, cap = 0;
    int first = 1, found = 0;
    j_expect(&j, '{');
    while (j_more(&j, '}', &first)) {
        char *key = j_string(&j);
        j_expect(&j, ':');
        if (!strcmp(key, "weight_map")) {
            if (found)
                die("%s: \"weight_map\" appears twice", path);
            found = 1;
            int f2 = 1;
            j_expect(&j, '{');
            while (j_more(&j, '}', &f2)) {
                if (n == cap) {
                    cap = cap ? 2 * cap : 1024;
                    wm = xrealloc(wm, cap * sizeof *wm);
                }
                wm[n].name = j_string(&j);
                j_expect(&j, ':');
                wm[n].file = j_string(&j);
                n++;
            }
        } else {
            j_skip(&j, 0);
        }
        free(key);
    }
    j_finish(&j);
    free(sb.buf);
    if (!found)
        die("%s has no \"weight_map\"", path);
    if (n)
        qsort(wm, n, sizeof *wm, cmp_wm);
    for (size_t i = 1; i < n; i++)
        if (!strcmp(wm[i - 1].name, wm[i].name))
            die("%s: tensor %s appears twice in \"weight_map\"", path, wm[i].name);
    *n_out = n;
    return wm;
}

static void shape_str(char *buf, size_t n, int ndim, const int64_t *shape)
{
    size_t len = 0;
    len += (size_t)snprintf(buf, n, "[");
    for (int d = 0; d < ndim && d < SRC_MAX_DIMS && len < n; d++)
        len += (size_t)snprintf(buf + len, n - len, "%s%lld", d ? ", " : "", (long long)shape[d]);
    if (ndim > SRC_MAX_DIMS && len < n)
        len += (size_t)snprintf(buf + len, n - len, ", ...");
    if (len < n)
        snprintf(buf + len, n - len, "]");
}

/* Roster tensor t against DIR's entry: same dtype, shape and byte count. */
static void src_check(const src_ckpt *sc, const src_shard *sh, const src_entry *e, const tensor *t)
{
    char want[160], got[160];
    shape_str(want, sizeof want, t->ndim, t->shape);
    shape_str(got, sizeof got, e->ndim, e->shape);
    int same = e->ndim == t->ndim;
    for (int d = 0; same && d < t->ndim; d++)
        same = e->shape[d] == t->shape[d];
    if (strcmp(e->dtype, dtype_names[t->dtype]) || !same)
        die("--from %s: tensor %s is %s %s in %s, but the preset/--set shape needs %s %s "
            "(%s)", sc->dir, t->name, e->dtype, got, sh->file, dtype_names[t->dtype], want,
            strcmp(e->dtype, dtype_names[t->dtype]) ? "dtype mismatch" : "shape mismatch");
    if (e->end - e->begin != tensor_bytes(t))
        die("--from %s: tensor %s in %s has %llu data bytes, but %s %s is %llu bytes", sc->dir,
            t->name, sh->file, (unsigned long long)(e->end - e->begin), e->dtype, got,
            (unsigned long long)tensor_bytes(t));
}

/* Opens DIR, finds every roster tensor there and checks it; dies naming the
 * first tensor that is missing or differs, and refuses a DIR with further
 * language_model.* tensors (the shape options would then not describe it). */
void src_open(src_ckpt *sc, const char *dir, tensor_list *tl)
{
    memset(sc, 0, sizeof *sc);
    sc->dir = dir;
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
        die("--from %s: not a directory", dir);
    char **roster = xmalloc(tl->n * sizeof *roster);
    for (size_t i = 0; i < tl->n; i++)
        roster[i] = tl->t[i].name;
    qsort(roster, tl->n, sizeof *roster, cmp_str);
    size_t extra = 0;
    char *first_extra = NULL;
    char *index = path_join(dir, "model.safetensors.index.json");
    if (stat(index, &st) == 0) {
        size_t nwm;
        wm_entry *wm = read_weight_map(index, &nwm);
        for (size_t i = 0; i < tl->n; i++) {
            tensor *t = &tl->t[i];
            wm_entry key = {t->name, NULL};
            const wm_entry *w = nwm ? bsearch(&key, wm, nwm, sizeof *wm, cmp_wm) : NULL;
            if (!w)
                die("--from %s: tensor %s is not in %s (\"weight_map\")", dir, t->name, index);
            size_t s = src_shard_open(sc, w->file);
            const src_entry *e = src_find(&sc->s[s], t->name);
            if (!e)
                die("--from %s: tensor %s: the index names %s, whose header lacks it", dir,
                    t->name, sc->s[s].file);
            src_check(sc, &sc->s[s], e, t);
            t->src_shard = (int)s;
            t->src_off = e->begin;
        }
        for (size_t i = 0; i < nwm; i++) {
            if (!strncmp(wm[i].name, PFX, strlen(PFX)) &&
                !bsearch(&wm[i].name, roster, tl->n, sizeof *roster, cmp_str) && !extra++)
                first_extra = xstrdup(wm[i].name);
            free(wm[i].name);
            free(wm[i].file);
        }
        free(wm);
    } else {
        if (errno != ENOENT)
            die("--from: cannot stat %s: %s", index, strerror(errno));
        DIR *d = opendir(dir);
        if (!d)
            die("--from: cannot open directory %s: %s", dir, strerror(errno));
        char **files = NULL;
        size_t nf = 0;
        struct dirent *de;
        while ((de = readdir(d))) {
            size_t l = strlen(de->d_name);
            if (de->d_name[0] != '.' && l > 12 && !strcmp(de->d_name + l - 12, ".safetensors")) {
                files = xrealloc(files, (nf + 1) * sizeof *files);
                files[nf++] = xstrdup(de->d_name);
            }
        }
        closedir(d);
        if (!nf)
            die("--from %s: neither model.safetensors.index.json nor any *.safetensors file", dir);
        qsort(files, nf, sizeof *files, cmp_str);
        for (size_t i = 0; i < nf; i++) {
            src_shard_open(sc, files[i]);
            free(files[i]);
        }
        free(files);
        for (size_t i = 0; i < tl->n; i++) {
            tensor *t = &tl->t[i];
            const src_entry *e = NULL;
            size_t at = 0;
            for (size_t s = 0; s < sc->n; s++) {
                const src_entry *x = src_find(&sc->s[s], t->name);
                if (x && e)
                    die("--from %s: tensor %s is in both %s and %s", dir, t->name,
                        sc->s[at].file, sc->s[s].file);
                if (x) {
                    e = x;
                    at = s;
                }
            }
            if (!e)
                die("--from %s: tensor %s is in none of its %zu *.safetensors files", dir,
                    t->name, sc->n);
            src_check(sc, &sc->s[at], e, t);
            t->src_shard = (int)at;
            t->src_off = e->begin;
        }
        for (size_t s = 0; s < sc->n; s++)
            for (size_t i = 0; i < sc->s[s].n; i++) {
                const char *nm = sc->s[s].e[i].name;
                if (!strncmp(nm, PFX, strlen(PFX)) &&
                    !bsearch(&nm, roster, tl->n, sizeof *roster, cmp_str) && !extra++)
                    first_extra = xstrdup(nm);
            }
    }
    if (extra)
        die("--from %s: %zu language_model tensor%s (first: %s) %s not part of the model the "
            "preset/--set options describe; pick options matching DIR's config.json", dir,
            extra, extra == 1 ? "" : "s", first_extra, extra == 1 ? "is" : "are");
    free(index);
    free(roster);
}

void src_close(src_ckpt *sc)
{
    for (size_t s = 0; s < sc->n; s++) {
        src_shard *sh = &sc->s[s];
        close(sh->fd);
        for (size_t i = 0; i < sh->n; i++) {
            free(sh->e[i].name);
            free(sh->e[i].dtype);
        }
        free(sh->e);
        free(sh->file);
        free(sh->path);
    }
    free(sc->s);
}

void src_read_tensor(const tensor *t, unsigned char *buf, sink_fn emit, void *ctx)
{
    const src_shard *sh = &g_src->s[t->src_shard];
    uint64_t left = tensor_bytes(t), off = t->src_off;
    while (left) {
        size_t n = left < CHUNK_BYTES ? (size_t)left : CHUNK_BYTES;
        pread_full(sh->fd, buf, n, off, sh->path, t->name);
        emit(ctx, buf, n);
        off += n;
        left -= n;
    }
}

