/* heat.c - see heat.h. */
#define _GNU_SOURCE
#include "heat.h"
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define HEAT_MAGIC "DFHEAT01"
#define HEAT_HDR 20

static uint32_t crc32_bytes(const uint8_t *p, size_t n)
{
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int k = 0; k < 8; k++) c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1)));
    }
    return ~c;
}

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
    else if (crc32_bytes(b + HEAT_HDR, n * 4) != get32(b + 16))
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
    put32(b + 16, crc32_bytes(b + HEAT_HDR, n * 4));
    char tmp[4096];
    if ((size_t)snprintf(tmp, sizeof tmp, "%s.tmp", path) >= sizeof tmp) {
        free(b);
        return df_err_set(err, DF_ERR_ARG, -1, "%s: path too long", path);
    }
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        free(b);
        return df_err_set(err, DF_ERR_IO, -1, "%s: cannot create: %s", tmp, strerror(errno));
    }
    size_t done = 0;
    int rc = 0;
    while (done < len) {
        ssize_t w = write(fd, b + done, len - done);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            rc = df_err_set(err, DF_ERR_IO, -1, "%s: write failed: %s", tmp, strerror(errno));
            break;
        }
        done += (size_t)w;
    }
    if (!rc && fsync(fd) != 0) rc = df_err_set(err, DF_ERR_IO, -1, "%s: fsync failed: %s", tmp, strerror(errno));
    close(fd);
    free(b);
    if (!rc && rename(tmp, path) != 0)
        rc = df_err_set(err, DF_ERR_IO, -1, "cannot rename %s to %s: %s", tmp, path, strerror(errno));
    if (rc) {
        unlink(tmp);
        return -1;
    }
    /* make the rename durable */
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", path);
    int dfd = open(dirname(dir), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        fsync(dfd);
        close(dfd);
    }
    return 0;
}
