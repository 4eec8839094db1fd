/* expert_store.h - where each routed expert's bytes live and how to read them.
 *
 * Owns: the table (layer, expert) -> file, byte range, and the position of
 * its six tensors (w1/w2/w3 packed + scales) inside that range; the shard
 * files (opened for O_DIRECT where possible) and the io_queue that reads
 * them; read counters.  In K3 the six tensors of an expert are contiguous,
 * so one expert is ONE read: of the 4 KiB-aligned span around it, straight
 * into a cache slot (the expert's data starts `lead` bytes into the slot).
 * A layer's misses are submitted together, sorted by file and offset, and
 * complete out of order.  An expert whose tensors are not contiguous is read
 * tensor by tensor with buffered preads into the same slot layout.
 * A GGUF (llama.cpp) expert is three pieces instead: its slice of the
 * ffn_gate/down/up_exps 3-D tensors, each in ggml's MXFP4 block layout
 * (scale byte + 16 nibble bytes per 32 values).  Each piece is one aligned
 * read into its own part of the slot, and the kernels read the blocks where
 * they land (kernel_table.matmul_mxfp4_gg: same results as the packed
 * layout, no conversion pass).  A GGUF's pieces may also be requantized
 * (any block format of qblock.h, or F32/F16/BF16), each layer's three in
 * types of their own (llama.cpp's K-quant mixes give some layers' down
 * projections more bits): gg_type/gg_bytes say which, the slot holds the
 * largest, and a piece is still one aligned read of exactly its bytes.
 * Does not own: slots or any caching policy (expert_cache), nor deciding
 * what to read (moe).  Thread: the session thread.
 */
#ifndef DF_EXPERT_STORE_H
#define DF_EXPERT_STORE_H

#include <stddef.h>
#include <stdint.h>
#include "df_error.h"
#include "file.h"

enum { EX_W1P, EX_W1S, EX_W2P, EX_W2S, EX_W3P, EX_W3S, EX_N };

typedef struct expert_loc {
    int file;                 /* index into the store's files, -1 = not a MoE layer */
    int contiguous;           /* the six tensors form one gap-free range */
    uint64_t offset;          /* contiguous: start of the range in the file */
    uint64_t span_off;        /* aligned read: start (<= offset) */
    uint32_t span_len;        /* aligned read: length */
    uint32_t lead;            /* offset - span_off: where the data starts in the slot */
    uint64_t src[EX_N];       /* absolute file offset of each tensor */
    uint32_t rel[EX_N];       /* offset of each tensor from the data start */
    /* GGUF pieces (store.ggml): w1, w2, w3 in ggml MXFP4 blocks */
    uint64_t psrc[3];         /* absolute file offset of each piece */
    int pfile[3];             /* the file of each piece (split GGUFs may put them in different files) */
    uint64_t pspan_off[3];    /* aligned read of each piece */
    uint32_t pspan_len[3];
    uint32_t plead[3];        /* where the piece's bytes start in its part of the slot */
} expert_loc;

typedef struct expert_store_stats {
    uint64_t n_reads;         /* read requests completed */
    uint64_t bytes_read;      /* expert bytes delivered */
    uint64_t bytes_io;        /* bytes transferred (aligned spans) */
    double wait_sec;          /* time the session thread waited for reads */
} expert_store_stats;

#define EXPERT_BATCH_MAX 4096
#define EXPERT_MAX_SOURCES 8

/* Where expert bytes can be read from: source 0 is the model directory's
 * shards; sources 1.. are --expert-path directories holding copies of some
 * or all experts at the same offsets in files of the same names (written by
 * `deltafin place`).  With expert paths, reads go only to them; each read
 * picks, among the sources holding the expert, the one with the fewest
 * reads in flight (replicas hedge each other; stripes spread the load). */
typedef struct expert_source {
    char *dir;
    df_file *files;           /* [n_files], fd -1 where this source has no copy */
    int in_flight;
    uint64_t reads, bytes;
} expert_source;

typedef struct expert_store {
    int n_layers, n_experts;
    expert_loc *loc;          /* [n_layers][n_experts] */
    uint32_t sizes[EX_N];     /* byte size of each tensor (same for all experts) */
    uint64_t expert_bytes;    /* sum of sizes */
    size_t slot_bytes;        /* what a cache slot must hold: aligned span bound */
    int n_files;
    df_file *files;           /* read files (O_DIRECT when possible) */
    int *plain_fds;           /* buffered fds for non-contiguous experts */
    char **paths;
    enum io_mode mode;
    int n_src;                /* sources in use: 1 = the model directory only */
    expert_source src[EXPERT_MAX_SOURCES];
    uint8_t *holders;         /* [n_layers][n_experts] bit s = source s holds it (NULL: only source 0) */
    io_queue *q;
    io_req batch[EXPERT_BATCH_MAX];
    int n_batch;
    int64_t sync_done[EXPERT_BATCH_MAX];   /* tags of reads finished inside queue or flush */
    uint8_t sync_ok[EXPERT_BATCH_MAX];
    int n_sync_done;
    /* a streamed install (expert_remote.h): experts come from its disk
     * cache or the network, never from the shards (their expert ranges
     * are holes); stream is set before expert_store_finish */
    int stream;
    struct expert_remote *remote;
    expert_store_stats st;
    double probe_direct_bps, probe_buffered_bps;   /* IO_AUTO's startup measurement */
    int probe_warm;             /* experts of the buffered probe found in the page cache before it
                                   read them (0: the probe was cold, as it must be) */
    /* GGUF experts (ggml = 1) */
    int ggml;
    uint32_t piece_bytes[3];      /* the largest slice of each piece over the layers */
    uint32_t *gg_type;            /* [n_layers][3] ggml type of each layer's pieces (MXFP4 unless set) */
    uint32_t *gg_bytes;           /* [n_layers][3] bytes of one expert's slice of each piece */
    size_t piece_slot;            /* bytes of the slot given to each piece */
    uint8_t *gg_left;             /* [n_layers][n_experts] pieces still in flight */
    uint8_t *gg_bad;              /* [n_layers][n_experts] a piece failed */
} expert_store;

/* K3's experts: w1 / w3 [I, Lt] and w2 [Lt, I] in MXFP4 (packed + scales). */
void expert_store_init(expert_store *s, int n_layers, int n_experts, int I, int Lt);
/* GGUF layout: w1/w3 are [I, Lt] and w2 [Lt, I] matrices stored as ggml
 * MXFP4 blocks, three pieces per expert (set with expert_store_set_piece). */
void expert_store_init_ggml(expert_store *s, int n_layers, int n_experts, int I, int Lt);
void expert_store_set_piece(expert_store *s, int il, int e, int piece, int file, uint64_t off);
/* Layer il's piece is stored in ggml type `type`, `bytes` per expert (call
 * before its set_piece calls; finish sizes the slot from the largest). */
void expert_store_set_piece_type(expert_store *s, int il, int piece, uint32_t type, uint32_t bytes);
/* Register a shard path; returns its index (the file is opened in finish). */
int expert_store_add_file(expert_store *s, const char *path, df_error *err);
/* Record tensor `which` of expert (il, e) at absolute offset `off` in file. */
void expert_store_set(expert_store *s, int il, int e, int which, int file, uint64_t off);
/* After all set calls: open files, decide contiguity, aligned spans and the
 * slot layout; checks every MoE layer's experts are complete and inside
 * their files.  `moe_layer[il]` says which layers have experts. */
int expert_store_finish(expert_store *s, const uint8_t *moe_layer, enum io_mode mode, int depth,
                        enum io_backend backend, df_error *err);

/* Use the directories dirs[0..n) as the expert sources instead of the model
 * directory; holders(dir index, il, e) says which experts each one has.
 * Called after finish.  Every MoE expert must be held somewhere. */
int expert_store_set_sources(expert_store *s, const char *const *dirs, int n, const uint8_t *const *held,
                             const uint8_t *moe_layer, df_error *err);

/* Projection p (0: w1 [I, Lt], 1: w2 [Lt, I], 2: w3 [I, Lt]) of the expert
 * whose bytes are in slot: packed bytes (and *scales), or, for a GGUF store
 * (s->ggml), its ggml blocks (*scales = NULL). */
static inline const uint8_t *expert_store_proj(const expert_store *s, const expert_loc *l, const uint8_t *slot,
                                               int p, const uint8_t **scales)
{
    if (s->ggml) {
        *scales = NULL;
        return slot + (size_t)p * s->piece_slot + l->plead[p];
    }
    *scales = slot + l->lead + l->rel[2 * p + 1];
    return slot + l->lead + l->rel[2 * p];
}

/* Queue a read of expert (il, e) into slot; `tag` comes back from wait.
 * Non-contiguous experts are read synchronously here. Returns -1 on error. */
int expert_store_queue(expert_store *s, int il, int e, uint8_t *slot, int64_t tag, df_error *err);
/* Submit everything queued, sorted by file and offset. */
void expert_store_flush(expert_store *s);
/* Wait for at least one queued expert; writes up to max completions:
 * tags[i] with ok[i] = 1, or ok[i] = 0 for a failed or short read (the
 * first failure also fills err, naming the expert and the file).  Returns
 * the count, 0 when nothing is in flight. */
int expert_store_wait(expert_store *s, int64_t *tags, int *ok, int max, df_error *err);
/* The same without blocking: the completions already there (0 when none
 * has landed yet); reads waiting for a free place in the queue go out. */
int expert_store_poll(expert_store *s, int64_t *tags, int *ok, int max, df_error *err);
int expert_store_in_flight(const expert_store *s);
void expert_store_deinit(expert_store *s);

#endif
