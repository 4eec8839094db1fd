/* family_k3.c - Kimi K3's entry in the family table (family.h).  K3 is an
 * engine family: the engine (src/engine/) opens it (model_load), plans its
 * memory (engine_plan.c) and schedules its passes over streamed experts;
 * here it states the types it reads and what a model is from its
 * configuration alone: layers, width, vocabulary and the bytes of its
 * weight files (a safetensors folder's shards, or a GGUF and its splits).
 */
#include "family.h"
#include "gguf.h"
#include "model.h"
#include "util.h"

#include <dirent.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

static uint64_t file_bytes(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISREG(sb.st_mode) ? (uint64_t)sb.st_size : 0;
}

/* The bytes of a folder's *.safetensors files. */
static uint64_t folder_weight_bytes(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) return 0;
    uint64_t n = 0;
    struct dirent *e;
    char p[4096];
    while ((e = readdir(d))) {
        size_t l = strlen(e->d_name);
        if (l > 12 && !strcmp(e->d_name + l - 12, ".safetensors") &&
            (size_t)snprintf(p, sizeof p, "%s/%s", dir, e->d_name) < sizeof p)
            n += file_bytes(p);
    }
    closedir(d);
    return n;
}

static int k3_info(const char *path, df_family_info *fi, df_error *err)
{
    memset(fi, 0, sizeof *fi);
    k3_config c;
    struct stat sb;
    if (stat(path, &sb)) return df_err_set(err, DF_ERR_IO, -1, "%s: no such file or folder", path);
    if (S_ISREG(sb.st_mode)) {
        gguf_file g;
        if (gguf_open(path, &g, err)) return -1;
        int rc = k3_config_from_gguf(&g, &c, err);
        uint64_t count = 1;
        if (!rc && gguf_find_kv(&g, "split.count")) rc = gguf_get_u64(&g, "split.count", &count, err);
        gguf_deinit(&g);
        if (rc) {
            df_err_prefix(err, "%s", path);
            return -1;
        }
        /* split files are named PREFIX-0000i-of-0000n.gguf (model_gguf.c) */
        fi->weight_bytes = file_bytes(path);
        size_t pl = strlen(path);
        for (uint64_t i = 1; i < count && pl > 20; i++) {
            char p[4096];
            snprintf(p, sizeof p, "%.*s-%05llu-of-%05llu.gguf", (int)(pl - 20), path, (unsigned long long)i + 1,
                     (unsigned long long)count);
            fi->weight_bytes += file_bytes(p);
        }
    } else {
        char p[4096], *text = NULL;
        size_t len;
        if ((size_t)snprintf(p, sizeof p, "%s/config.json", path) >= sizeof p)
            return df_err_set(err, DF_ERR_ARG, -1, "%s: path too long", path);
        if (read_small_file(p, &text, &len, 64u << 20, err)) return -1;
        int rc = k3_config_parse(text, len, &c, err);
        free(text);
        if (rc) {
            df_err_prefix(err, "%s", path);
            return -1;
        }
        fi->weight_bytes = folder_weight_bytes(path);
    }
    fi->layers = c.NL, fi->hidden = c.h, fi->vocab = c.V;
    snprintf(fi->summary, sizeof fi->summary, "Kimi K3, %d layers, %d wide, %d experts of %d per token: %.2f GiB of "
             "weight files (the engine plans what stays in memory)", c.NL, c.h, c.E, c.k,
             (double)fi->weight_bytes / (1u << 30));
    k3_config_free(&c);
    return 0;
}

static const char *const k3_types[] = {"kimi_k3", "kimi_linear", "kimi-k3", NULL};

const df_family df_family_k3 = {
    .name = "kimi_k3",
    .title = "Kimi K3 (MoE)",
    .types = k3_types,
    .engine = 1,
    .info = k3_info,
};
