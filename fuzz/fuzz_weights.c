/* fuzz_weights.c - libFuzzer target for model/weights.c: arbitrary bytes as
 * a folder's model.safetensors.index.json, beside one valid shard
 * (a.safetensors, tensor "x"; names from "v." are skipped).  wset_open
 * must accept or refuse with a message, never crash or leak; when it
 * accepts, every indexed name resolves to an opened file that holds it or
 * is refused naming the tensor, and no two names are equal. */
#define _GNU_SOURCE
#include "weights.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char dir[64];

static int skip_v(const char *name) { return !strncmp(name, "v.", 2); }

static void setup_dir(void)
{
    if (dir[0]) return;
    snprintf(dir, sizeof dir, "/tmp/fuzz_weights_XXXXXX");
    if (!mkdtemp(dir)) abort();
    char p[128];
    snprintf(p, sizeof p, "%s/a.safetensors", dir);
    static const char head[] = "{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}";
    FILE *f = fopen(p, "wb");
    uint64_t n = sizeof head - 1;
    uint8_t len[8];
    for (int i = 0; i < 8; i++) len[i] = (uint8_t)(n >> (8 * i));
    static const uint8_t body[8] = {0};
    if (!f || fwrite(len, 1, 8, f) != 8 || fwrite(head, 1, n, f) != n || fwrite(body, 1, 8, f) != 8 || fclose(f))
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    setup_dir();
    char p[128];
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
    FILE *f = fopen(p, "wb");
    if (!f || fwrite(data, 1, size, f) != size || fclose(f)) abort();
    wset w;
    df_error err = {0};
    if (wset_open(dir, skip_v, &w, &err)) {
        if (!err.msg[0]) abort();
        return 0;
    }
    if (w.format != WSET_SAFETENSORS || !w.index_path) abort();
    for (size_t i = 0; i < w.n_names; i++) {
        if (w.names[i].file < 0 || w.names[i].file >= w.n_files || skip_v(w.names[i].name)) abort();
        if (i && strcmp(w.names[i - 1].name, w.names[i].name) >= 0) abort();
        int file = -1;
        df_error e2 = {0};
        const st_tensor *t = wset_st(&w, w.names[i].name, &file, &e2);
        if (t ? file != w.names[i].file || strcmp(t->name, w.names[i].name) : !e2.msg[0]) abort();
    }
    wset_close(&w);
    return 0;
}
