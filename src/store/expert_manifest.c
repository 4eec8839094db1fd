/* expert_manifest.c - see expert_manifest.h. */
#define _GNU_SOURCE
#include "expert_manifest.h"
#include "file.h"
#include "sha.h"
#include "util.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int expert_manifest_init(expert_manifest *m, int n_layers, int n_experts, df_error *err)
{
    memset(m, 0, sizeof *m);
    if (n_layers < 1 || n_experts < 1 || n_layers > 4096 || n_experts > 65536 ||
        (uint64_t)n_layers * (uint64_t)n_experts > MANIFEST_MAX_ENTRIES)
        return df_err_set(err, DF_ERR_FORMAT, -1, "manifest: %d layers x %d experts is out of range", n_layers,
                          n_experts);
    size_t nk = (size_t)n_layers * (size_t)n_experts;
    m->n_layers = n_layers;
    m->n_experts = n_experts;
    m->shard = xmalloc(nk * sizeof *m->shard);
    for (size_t k = 0; k < nk; k++) m->shard[k] = -1;
    m->off = xcalloc(nk, sizeof *m->off);
    m->len = xcalloc(nk, sizeof *m->len);
    m->sha = xcalloc(nk, sizeof *m->sha);
    m->has_sha = xcalloc(nk, 1);
    return 0;
}

int expert_manifest_add_shard(expert_manifest *m, const char *name, uint64_t size, df_error *err)
{
    if (!name[0] || strchr(name, '/') || strchr(name, ' ') || !strcmp(name, "..") || !strcmp(name, ".") ||
        strlen(name) > 255)
        return df_err_set(err, DF_ERR_FORMAT, -1, "manifest: \"%s\" is not a plain shard file name", name);
    if (m->n_shards >= 100000) return df_err_set(err, DF_ERR_FORMAT, -1, "manifest: too many shards");
    m->shards = xrealloc(m->shards, (size_t)(m->n_shards + 1) * sizeof *m->shards);
    m->shards[m->n_shards] = (manifest_shard){.name = xstrdup(name), .size = size};
    return m->n_shards++;
}

int hex_sha256(const char *hex, uint8_t out[32])
{
    for (int i = 0; i < 32; i++) {
        int v = 0;
        for (int j = 0; j < 2; j++) {
            char c = hex[2 * i + j];
            int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
            if (d < 0) return -1;
            v = v * 16 + d;
        }
        out[i] = (uint8_t)v;
    }
    return hex[64] ? -1 : 0;
}

/* a decimal without sign or leading junk, at most max */
static int num(const char *s, uint64_t max, uint64_t *out)
{
    if (!*s || strspn(s, "0123456789") != strlen(s) || strlen(s) > 19) return -1;
    uint64_t v = strtoull(s, NULL, 10);
    if (v > max) return -1;
    *out = v;
    return 0;
}

/* hash field: 64 lowercase hex digits or "-" */
static int hash_field(const char *s, uint8_t out[32], int *has)
{
    if (!strcmp(s, "-")) {
        *has = 0;
        return 0;
    }
    *has = 1;
    return hex_sha256(s, out);
}

int expert_manifest_parse(const char *text, size_t n, expert_manifest *m, df_error *err)
{
    memset(m, 0, sizeof *m);
    char line[512];
    size_t at = 0;
    int ln = 0, have_head = 0;
    while (at < n) {
        const char *s = text + at, *nl = memchr(s, '\n', n - at);
        size_t k = nl ? (size_t)(nl - s) : n - at;
        at += k + (nl != NULL);
        ln++;
        if (k >= sizeof line || memchr(s, 0, k)) {
            df_err_set(err, DF_ERR_FORMAT, ln, "manifest line %d: too long or not text", ln);
            goto bad;
        }
        memcpy(line, s, k);
        line[k] = 0;
        if (!k) continue;
        char *f[8] = {0};
        int nf = 0;
        for (char *p = strtok(line, " "); p; p = strtok(NULL, " ")) {
            if (nf == 8) break;
            f[nf++] = p;
        }
        if (!nf) {
            df_err_set(err, DF_ERR_FORMAT, ln, "manifest line %d: blank", ln);
            goto bad;
        }
        uint64_t a, b, c, d, e;
        if (!have_head) {
            if (nf != 4 || strcmp(f[0], "deltafin-manifest") || strcmp(f[1], "1") || num(f[2], 4096, &a) ||
                num(f[3], 65536, &b)) {
                df_err_set(err, DF_ERR_FORMAT, ln, "manifest line %d: expected \"deltafin-manifest 1 LAYERS EXPERTS\"",
                           ln);
                goto bad;
            }
            if (expert_manifest_init(m, (int)a, (int)b, err)) goto bad;
            have_head = 1;
        } else if (!strcmp(f[0], "shard")) {
            uint8_t h[32];
            int has;
            if (nf != 4 || num(f[2], UINT64_MAX / 2, &a) || hash_field(f[3], h, &has)) {
                df_err_set(err, DF_ERR_FORMAT, ln, "manifest line %d: expected \"shard NAME SIZE SHA256|-\"", ln);
                goto bad;
            }
            int i = expert_manifest_add_shard(m, f[1], a, err);
            if (i < 0) {
                df_err_prefix(err, "line %d", ln);
                goto bad;
            }
            memcpy(m->shards[i].trunk_sha, h, 32);
            m->shards[i].has_trunk_sha = has;
        } else if (!strcmp(f[0], "expert")) {
            uint8_t h[32];
            int has;
            if (nf != 7 || num(f[1], (uint64_t)m->n_layers - 1, &a) || num(f[2], (uint64_t)m->n_experts - 1, &b) ||
                num(f[3], 99999, &c) || c >= (uint64_t)m->n_shards ||
                num(f[4], UINT64_MAX / 2, &d) || num(f[5], 1ull << 40, &e) || !e || hash_field(f[6], h, &has)) {
                df_err_set(err, DF_ERR_FORMAT, ln,
                           "manifest line %d: expected \"expert LAYER EXPERT SHARD# OFFSET LENGTH SHA256|-\" within "
                           "the header's sizes and the shards listed before it",
                           ln);
                goto bad;
            }
            size_t key = (size_t)a * (size_t)m->n_experts + (size_t)b;
            if (m->shard[key] >= 0) {
                df_err_set(err, DF_ERR_FORMAT, ln, "manifest line %d: layer %" PRIu64 " expert %" PRIu64 " listed twice",
                           ln, a, b);
                goto bad;
            }
            if (d + e > m->shards[c].size) {
                df_err_set(err, DF_ERR_FORMAT, ln, "manifest line %d: bytes %" PRIu64 "+%" PRIu64 " past the end of %s",
                           ln, d, e, m->shards[c].name);
                goto bad;
            }
            m->shard[key] = (int32_t)c;
            m->off[key] = d;
            m->len[key] = e;
            memcpy(m->sha[key], h, 32);
            m->has_sha[key] = (uint8_t)has;
        } else {
            df_err_set(err, DF_ERR_FORMAT, ln, "manifest line %d: unknown record \"%s\"", ln, f[0]);
            goto bad;
        }
    }
    if (!have_head) {
        df_err_set(err, DF_ERR_FORMAT, 0, "manifest: empty (no \"deltafin-manifest\" line)");
        goto bad;
    }
    return 0;
bad:
    expert_manifest_free(m);
    return -1;
}

int expert_manifest_load(const char *path, expert_manifest *m, df_error *err)
{
    char *text = NULL;
    size_t len = 0;
    memset(m, 0, sizeof *m);
    if (read_small_file(path, &text, &len, 1u << 31, err)) return -1;
    int rc = expert_manifest_parse(text, len, m, err);
    free(text);
    if (rc) df_err_prefix(err, "%s", path);
    return rc;
}

int expert_manifest_save(const char *path, const expert_manifest *m, df_error *err)
{
    atomic_file af;
    if (atomic_file_open(&af, path, err)) return -1;
    char buf[512], hex[65];
    int n = snprintf(buf, sizeof buf, "deltafin-manifest 1 %d %d\n", m->n_layers, m->n_experts);
    if (atomic_file_write(&af, buf, (size_t)n, err)) goto bad;
    for (int i = 0; i < m->n_shards; i++) {
        if (m->shards[i].has_trunk_sha) sha_hex(m->shards[i].trunk_sha, 32, hex);
        n = snprintf(buf, sizeof buf, "shard %s %" PRIu64 " %s\n", m->shards[i].name, m->shards[i].size,
                     m->shards[i].has_trunk_sha ? hex : "-");
        if (atomic_file_write(&af, buf, (size_t)n, err)) goto bad;
    }
    for (int l = 0; l < m->n_layers; l++)
        for (int e = 0; e < m->n_experts; e++) {
            size_t k = (size_t)l * (size_t)m->n_experts + (size_t)e;
            if (m->shard[k] < 0) continue;
            if (m->has_sha[k]) sha_hex(m->sha[k], 32, hex);
            n = snprintf(buf, sizeof buf, "expert %d %d %d %" PRIu64 " %" PRIu64 " %s\n", l, e, m->shard[k], m->off[k],
                         m->len[k], m->has_sha[k] ? hex : "-");
            if (atomic_file_write(&af, buf, (size_t)n, err)) goto bad;
        }
    return atomic_file_commit(&af, err);
bad:
    atomic_file_abort(&af);
    return -1;
}

size_t expert_manifest_hashed(const expert_manifest *m, size_t *listed)
{
    size_t h = 0, l = 0, nk = (size_t)m->n_layers * (size_t)m->n_experts;
    for (size_t k = 0; k < nk; k++)
        if (m->shard[k] >= 0) {
            l++;
            h += m->has_sha[k];
        }
    if (listed) *listed = l;
    return h;
}

void expert_manifest_free(expert_manifest *m)
{
    for (int i = 0; i < m->n_shards; i++) free(m->shards[i].name);
    free(m->shards);
    free(m->shard);
    free(m->off);
    free(m->len);
    free(m->sha);
    free(m->has_sha);
    memset(m, 0, sizeof *m);
}
