/* setup_parse.c - see setup_parse.h. */
#define _GNU_SOURCE
#include "setup_parse.h"
#include "util.h"

#include <stdlib.h>
#include <string.h>
#include <strings.h>

int setup_safe_path(const char *p)
{
    size_t n = strlen(p);
    if (!n || p[0] == '/' || p[n - 1] == '/' || strstr(p, "//") || n > 1000) return 0;
    for (const char *s = p; s;) {
        if (!strncmp(s, "..", 2) && (s[2] == '/' || !s[2])) return 0;
        if (s[0] == '.' && (s[1] == '/' || !s[1])) return 0;
        s = strchr(s, '/');
        if (s) s++;
    }
    return 1;
}

int setup_listing_entries(const json_value *arr, setup_file **files, int *n, int *cap, const char *url,
                          df_error *err)
{
    if (!arr || arr->type != JSON_ARRAY) return df_err_set(err, DF_ERR_FORMAT, -1, "%s: not a JSON array", url);
    for (size_t i = 0; i < arr->len; i++) {
        const json_value *e = json_at(arr, i);
        const char *type = json_get_str(e, "type"), *path = json_get_str(e, "path");
        if (!type || !path) return df_err_set(err, DF_ERR_FORMAT, -1, "%s: entry %zu has no type or path", url, i);
        if (strcmp(type, "file")) continue;
        if (!setup_safe_path(path)) return df_err_set(err, DF_ERR_FORMAT, -1, "%s: unsafe path \"%s\"", url, path);
        setup_file f = {0};
        int64_t size = -1;
        const json_value *lfs = json_get(e, "lfs");
        const char *hash = NULL;
        if (lfs && lfs->type == JSON_OBJECT) {
            f.lfs = 1;
            hash = json_get_str(lfs, "oid");
            if (hash && !strncmp(hash, "sha256:", 7)) hash += 7;
            json_get_int(lfs, "size", &size);
        } else {
            hash = json_get_str(e, "oid");
            json_get_int(e, "size", &size);
        }
        size_t hl = f.lfs ? 64 : 40;
        if (size < 0 || !hash || strlen(hash) != hl || strspn(hash, "0123456789abcdef") != hl)
            return df_err_set(err, DF_ERR_FORMAT, -1, "%s: %s has no valid size and %s", url, path,
                              f.lfs ? "lfs.oid (SHA-256)" : "oid (git blob id)");
        f.path = xstrdup(path);
        f.size = (uint64_t)size;
        snprintf(f.hash, sizeof f.hash, "%s", hash);
        if (*n == *cap) {
            *cap = *cap ? *cap * 2 : 64;
            *files = xrealloc(*files, (size_t)*cap * sizeof **files);
        }
        (*files)[(*n)++] = f;
    }
    return 0;
}

void setup_files_free(setup_file *files, int n)
{
    for (int i = 0; i < n; i++) free(files[i].path);
    free(files);
}
