/* family.c - what type a model on disk states (family.h): config.json's
 * model_type or a GGUF's general.architecture, read without its weights;
 * which family reads that type is the registry's (engine/families.c).
 */
#include "family.h"
#include "gguf.h"
#include "json.h"
#include "util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int family_type_of(const char *path, char *out, size_t n_out, df_error *err)
{
    struct stat sb;
    if (stat(path, &sb)) return df_err_set(err, DF_ERR_IO, -1, "%s: no such file or folder", path);
    out[0] = 0;
    if (S_ISREG(sb.st_mode)) { /* a GGUF file */
        gguf_file g;
        if (gguf_open(path, &g, err)) return -1;
        const char *a;
        size_t al;
        int rc = gguf_get_str(&g, "general.architecture", &a, &al, err);
        if (!rc) snprintf(out, n_out, "%.*s", (int)al, a);
        gguf_deinit(&g);
        if (rc) df_err_prefix(err, "%s", path);
        return rc ? -1 : 0;
    }
    char p[4096], *buf = NULL;
    size_t len;
    if ((size_t)snprintf(p, sizeof p, "%s/config.json", path) >= sizeof p)
        return df_err_set(err, DF_ERR_ARG, -1, "%s: path too long", path);
    if (read_small_file(p, &buf, &len, (size_t)64 << 20, err)) return -1;
    int rc = family_config_type(buf, len, p, out, n_out, err);
    free(buf);
    if (rc) return -1;
    if (!out[0]) return df_err_set(err, DF_ERR_FORMAT, -1, "%s: no \"model_type\" (which model family is this?)", p);
    return 0;
}

int family_config_type(const char *text, size_t len, const char *label, char *out, size_t n_out, df_error *err)
{
    out[0] = 0;
    df_error je = {0};
    json_doc *d = json_parse(text, len, &je);
    if (!d) return df_err_set(err, DF_ERR_FORMAT, je.pos, "%s: %s", label, je.msg);
    const json_value *r = json_root(d);
    const char *mt = r->type == JSON_OBJECT ? json_get_str(r, "model_type") : NULL;
    if (mt) snprintf(out, n_out, "%s", mt);
    json_free(d);
    return 0;
}

uint64_t family_bytes(const df_family_info *fi, int n_ctx)
{
    return fi->weight_bytes + fi->state_fixed + fi->state_per_pos * (uint64_t)(n_ctx > 0 ? n_ctx : 0);
}
