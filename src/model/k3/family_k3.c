/* family_k3.c - Kimi K3's entry in the family table (family.h).  K3 is an
 * engine family: the engine (src/engine/) opens it (model_load), plans its
 * memory (engine_plan.c) and schedules its passes over streamed experts;
 * here it states the types it reads and what a model is from its
 * configuration alone: layers, width, vocabulary and the bytes of its
 * weight files (a safetensors folder's shards, or a GGUF and its splits,
 * as weights.h opens them: headers only).
 */
#include "family.h"
#include "gguf.h"
#include "model.h"
#include "util.h"
#include "weights.h"

#include <stdlib.h>
#include <stdio.h>
#include <string.h>

static int k3_info(const char *path, df_family_info *fi, df_error *err)
{
    memset(fi, 0, sizeof *fi);
    k3_config c;
    wset ws;
    if (wset_open(path, NULL, &ws, err)) return -1;
    int rc;
    if (ws.format == WSET_GGUF) {
        rc = k3_config_from_gguf(&ws.gg[0], &c, err);
    } else {
        char p[4096], *text = NULL;
        size_t len;
        rc = (size_t)snprintf(p, sizeof p, "%s/config.json", path) >= sizeof p
                 ? df_err_set(err, DF_ERR_ARG, -1, "%s: path too long", path)
                 : read_small_file(p, &text, &len, 64u << 20, err);
        if (!rc) rc = k3_config_parse(text, len, &c, err);
        free(text);
    }
    fi->weight_bytes = wset_file_bytes(&ws);
    wset_close(&ws);
    if (rc) {
        df_err_prefix(err, "%s", path);
        return -1;
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
