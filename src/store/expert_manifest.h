/* expert_manifest.h - the per-expert manifest of a streamed install (L2).
 *
 * A streamed install (`deltafin setup --stream`) keeps the trunk on disk
 * and fetches routed experts on first use; the manifest says where each
 * expert's bytes are in the remote shards and, when it can be known, their
 * SHA-256, so that a fetched expert is checked before it is ever used.  The
 * Hub publishes whole-file hashes only: per-expert hashes come from
 * `setup --stream --verify` (every shard streamed once and hashed whole
 * against its lfs.oid) or from a manifest published beside the model.
 * It is a text file, one record per line, strictly parsed:
 *
 *   deltafin-manifest 1 <layers> <experts>
 *   shard <name> <size> <trunk-sha256|->
 *   expert <layer> <expert> <shard#> <offset> <length> <sha256|->
 *
 * `shard` lines come first and are numbered from 0 in order; the trunk
 * hash covers the shard's header and every byte outside its experts, in
 * file order.  Experts not listed are not routed experts (dense layers).
 */
#ifndef DF_EXPERT_MANIFEST_H
#define DF_EXPERT_MANIFEST_H

#include <stddef.h>
#include <stdint.h>
#include "df_error.h"

typedef struct manifest_shard {
    char *name;
    uint64_t size;
    uint8_t trunk_sha[32];
    int has_trunk_sha;
} manifest_shard;

typedef struct expert_manifest {
    int n_layers, n_experts;
    int n_shards;
    manifest_shard *shards;
    int32_t *shard;           /* [layers * experts]: shard number, -1 = not listed */
    uint64_t *off, *len;      /* [layers * experts] */
    uint8_t (*sha)[32];       /* [layers * experts] */
    uint8_t *has_sha;         /* [layers * experts] */
} expert_manifest;

#define MANIFEST_MAX_ENTRIES (1u << 24)

/* Allocates the tables for layers x experts (every expert unlisted). */
int expert_manifest_init(expert_manifest *m, int n_layers, int n_experts, df_error *err);
int expert_manifest_add_shard(expert_manifest *m, const char *name, uint64_t size, df_error *err);
/* Parses text (n bytes); errors name the line. */
int expert_manifest_parse(const char *text, size_t n, expert_manifest *m, df_error *err);
int expert_manifest_load(const char *path, expert_manifest *m, df_error *err);
/* Written through an atomically replaced file. */
int expert_manifest_save(const char *path, const expert_manifest *m, df_error *err);
/* Experts with a hash, of those listed. */
size_t expert_manifest_hashed(const expert_manifest *m, size_t *listed);
void expert_manifest_free(expert_manifest *m);

/* 64 hex digits -> 32 bytes; 0 on success. */
int hex_sha256(const char *hex, uint8_t out[32]);

#endif
