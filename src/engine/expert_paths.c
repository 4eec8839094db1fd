/* expert_paths.c - `--expert-path DIR`: reading the manifests that
 * `deltafin place` (place.c) writes and pointing the store's experts at the
 * copies (expert_store_set_sources).  A manifest must match this model
 * (expert count, shard names and sizes) or the directory is refused; a
 * directory without one (an interrupted place) is refused too.  Only reads:
 * the directories are never written here.
 */
#define _GNU_SOURCE
#include "json.h"
#include "engine_impl.h"
#include "util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *place_base_name(const char *p)
{
    const char *b = strrchr(p, '/');
    return b ? b + 1 : p;
}

/* Read DIR's manifest into held[n_layers * n_experts]. */
static int read_manifest(const df_engine *eng, const char *dir, uint8_t *held, df_error *err)
{
    const expert_store *st = &eng->m.store;
    char path[4096], *text;
    size_t len;
    snprintf(path, sizeof path, "%s/" PLACE_MANIFEST, dir);
    if (read_small_file(path, &text, &len, 64u << 20, err)) {
        df_err_prefix(err, "--expert-path %s is not a placed expert directory (run 'deltafin place')", dir);
        return -1;
    }
    df_error jerr = {0};
    json_doc *d = json_parse(text, len, &jerr);
    free(text);
    if (!d) return df_err_set(err, DF_ERR_FORMAT, jerr.pos, "%s: %s", path, jerr.msg);
    int rc = -1;
    const json_value *r = json_root(d), *shards = json_get(r, "shards"), *layers = json_get(r, "layers");
    int64_t E;
    if (json_get_int(r, "experts_per_layer", &E) || E != eng->m.cfg.E || !shards || shards->type != JSON_OBJECT ||
        !layers || layers->type != JSON_OBJECT) {
        df_err_set(err, DF_ERR_FORMAT, -1, "%s: not a manifest for this model (expert count or layout)", path);
        goto done;
    }
    for (size_t i = 0; i < shards->len; i++) {
        int f;
        for (f = 0; f < st->n_files; f++)
            if (!strcmp(place_base_name(st->paths[f]), shards->keys[i])) break;
        if (f == st->n_files || shards->items[i]->type != JSON_NUMBER ||
            (uint64_t)shards->items[i]->i != st->files[f].size) {
            df_err_set(err, DF_ERR_FORMAT, -1, "%s: shard %s does not match the model's", path, shards->keys[i]);
            goto done;
        }
    }
    for (size_t i = 0; i < layers->len; i++) {
        char *end;
        long il = strtol(layers->keys[i], &end, 10);
        const json_value *ids = layers->items[i];
        if (*end || il < 0 || il >= eng->m.cfg.NL || !eng->m.cfg.layer_moe[il] || ids->type != JSON_ARRAY) {
            df_err_set(err, DF_ERR_FORMAT, -1, "%s: bad layer entry \"%s\"", path, layers->keys[i]);
            goto done;
        }
        for (size_t j = 0; j < ids->len; j++) {
            const json_value *v = ids->items[j];
            if (v->type != JSON_NUMBER || !v->is_int || v->i < 0 || v->i >= E) {
                df_err_set(err, DF_ERR_FORMAT, -1, "%s: layer %ld: bad expert id", path, il);
                goto done;
            }
            held[(size_t)il * (size_t)E + (size_t)v->i] = 1;
        }
    }
    rc = 0;
done:
    json_free(d);
    return rc;
}

int engine_use_expert_paths(df_engine *eng, const char *const *dirs, int n, df_error *err)
{
    size_t nk = (size_t)eng->m.cfg.NL * (size_t)eng->m.cfg.E;
    uint8_t *held[EXPERT_MAX_SOURCES] = {0};
    int rc = -1;
    if (n > EXPERT_MAX_SOURCES - 1) {
        df_err_set(err, DF_ERR_ARG, -1, "at most %d --expert-path directories", EXPERT_MAX_SOURCES - 1);
        return -1;
    }
    for (int d = 0; d < n; d++) {
        held[d] = xcalloc(nk, 1);
        if (read_manifest(eng, dirs[d], held[d], err)) goto done;
    }
    rc = expert_store_set_sources(&eng->m.store, dirs, n, (const uint8_t *const *)held, eng->m.cfg.layer_moe, err);
done:
    for (int d = 0; d < n; d++) free(held[d]);
    return rc;
}
