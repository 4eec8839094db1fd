/* heat.c - see heat.h. */
#define _GNU_SOURCE
#include "heat.h"
#include "file.h"
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define HEAT_MAGIC "DFHEAT01"
#define HEAT_HDR 20

static void put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t get32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

int heat_load(const char *path, int layers, int experts, float *out, df_error *err)
{
    size_t n = (size_t)layers * (size_t)experts, len;
    char *buf;
    if (read_small_file(path, &buf, &len, HEAT_HDR + n * 4 + 1, err)) return -1;
    const uint8_t *b = (const uint8_t *)buf;
    int rc = -1;
    if (len != HEAT_HDR + n * 4 || memcmp(b, HEAT_MAGIC, 8))
        df_err_set(err, DF_ERR_FORMAT, 0, "%s: not a heat file for this model (size or magic)", path);
    else if (get32(b + 8) != (uint32_t)layers || get32(b + 12) != (uint32_t)experts)
        df_err_set(err, DF_ERR_FORMAT, 8, "%s: heat file is for %u layers x %u experts, the model has %d x %d", path,
                   get32(b + 8), get32(b + 12), layers, experts);
    else if (df_crc32(0, b + HEAT_HDR, n * 4) != get32(b + 16))
        df_err_set(err, DF_ERR_FORMAT, 16, "%s: heat file checksum mismatch", path);
    else {
        for (size_t i = 0; i < n; i++) {
            uint32_t u = get32(b + HEAT_HDR + 4 * i);
            float f;
            memcpy(&f, &u, 4);
            out[i] = f == f && f >= 0 && f < 1e30f ? f : 0.0f;
        }
        rc = 0;
    }
    free(buf);
    return rc;
}

int heat_save(const char *path, int layers, int experts, const float *counts, df_error *err)
{
    size_t n = (size_t)layers * (size_t)experts, len = HEAT_HDR + n * 4;
    uint8_t *b = xmalloc(len);
    memcpy(b, HEAT_MAGIC, 8);
    put32(b + 8, (uint32_t)layers);
    put32(b + 12, (uint32_t)experts);
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &counts[i], 4);
        put32(b + HEAT_HDR + 4 * i, u);
    }
    put32(b + 16, df_crc32(0, b + HEAT_HDR, n * 4));
    atomic_file af;
    int rc = atomic_file_open(&af, path, err);
    if (!rc) rc = atomic_file_write(&af, b, len, err);
    if (!rc) rc = atomic_file_commit(&af, err);
    else if (af.tmp) atomic_file_abort(&af);
    free(b);
    return rc ? -1 : 0;
}
