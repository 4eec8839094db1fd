/* expert_store.h - where each routed expert's bytes live and how to read them.
 *
 * Owns: the table (layer, expert) -> file, byte range, and the position of
 * its six tensors (w1/w2/w3 packed + scales) inside that range; the read
 * file descriptors; read counters.  In K3 the six tensors of an expert are
 * contiguous, so one expert is one pread into a slot; a layout that is not
 * contiguous is read tensor by tensor into the same slot layout.
 * Does not own: slots or any caching policy (expert_cache), nor deciding
 * what to read (moe).  Reads use plain pread for now; O_DIRECT, io_uring and
 * prefetch come later behind the same expert_store_read call.
 */
#ifndef DF_EXPERT_STORE_H
#define DF_EXPERT_STORE_H

#include <stddef.h>
#include <stdint.h>
#include "df_error.h"

enum { EX_W1P, EX_W1S, EX_W2P, EX_W2S, EX_W3P, EX_W3S, EX_N };

typedef struct expert_loc {
    int file;                 /* index into the store's files, -1 = not a MoE layer */
    int contiguous;           /* the six tensors form one gap-free range */
    uint64_t offset;          /* contiguous: start of the range in the file */
    uint64_t src[EX_N];       /* absolute file offset of each tensor */
    uint32_t rel[EX_N];       /* offset of each tensor inside the slot */
} expert_loc;

typedef struct expert_store {
    int n_layers, n_experts;
    expert_loc *loc;          /* [n_layers][n_experts] */
    uint32_t sizes[EX_N];     /* byte size of each tensor (same for all experts) */
    uint64_t expert_bytes;    /* slot size: sum of sizes */
    int n_files;
    int *fds;
    char **paths;
    uint64_t n_reads, bytes_read;   /* counters (owner: the session thread) */
} expert_store;

void expert_store_init(expert_store *s, int n_layers, int n_experts, const uint32_t sizes[EX_N]);
/* Register a file (opened read-only); returns its index or -1. */
int expert_store_add_file(expert_store *s, const char *path, df_error *err);
/* Record tensor `which` of expert (il, e) at absolute offset `off` in file. */
void expert_store_set(expert_store *s, int il, int e, int which, int file, uint64_t off);
/* After all set calls: decide contiguity and slot layout; checks every MoE
 * layer's experts are complete.  `moe_layer[il]` says which layers have experts. */
int expert_store_finish(expert_store *s, const uint8_t *moe_layer, df_error *err);
/* Read expert (il, e) into dst (expert_bytes long). */
int expert_store_read(expert_store *s, int il, int e, uint8_t *dst, df_error *err);
void expert_store_deinit(expert_store *s);

#endif
