/* trace_format.h - deltafin's binary route trace, version 1 (the default of
 * --trace FILE; `--trace-format jsonl` writes the older JSON lines).
 *
 * Little-endian throughout (the writer refuses to build elsewhere).  A file:
 *   magic    8 bytes "DFTRACE\n" (a JSON-lines trace starts with '{', so
 *            the first byte says which format a file is)
 *   version  u32 = 1
 *   hlen     u32, a multiple of 4; then hlen bytes: a JSON object padded
 *            with spaces, the model's identity:
 *              {"trace":"deltafin routes","version":1,"model":PATH,
 *               "layers":NL,"experts":E,"top_k":k,"hidden":h,"vocab":V,
 *               "shared_experts":Ns,"moe_layers":[il, ...]}
 *   records, each: u32 tag, u32 len (payload bytes, a multiple of 4), payload
 *     TRACE_EVAL  = 1: u32 pos0, u32 n, i32 ids[n]
 *                 one evaluation (a prompt or a chunk of it, a decode step,
 *                 a verify pass of drafts) of n positions from pos0; the
 *                 routes that follow, until the next EVAL, are its own
 *     TRACE_ROUTE = 2: u32 pos0, u32 layer, u32 T, u32 k,
 *                 i32 ids[T][k], f32 score[T][k], f32 weight[T][k]
 *                 the routes of positions pos0 .. pos0+T-1 at MoE layer
 *                 `layer`: each position's k experts in the router's order
 *                 (highest biased score first), the router's score of each
 *                 (sigmoid, before the bias) and the weight its output is
 *                 summed with, as the engine computed them, bit for bit
 *     TRACE_ATTN  = 3: u32 pos0, u32 layer, u32 T, u32 head0, u32 nh, u32 K,
 *                 i32 pos[T][nh][K], f32 weight[T][nh][K]
 *                 an attention dump's (--dump-attention): for query
 *                 positions pos0 .. pos0+T-1 at MLA layer `layer`, heads
 *                 head0 .. head0+nh-1, the K largest attention weights
 *                 (largest first, ties to the earlier position) and the
 *                 positions they fall on; -1 / 0 past the query's context.
 *     TRACE_KDA   = 4: u32 pos0, u32 layer, u32 T, u32 Hk, f32 stat[T][Hk][4]
 *                 the dump's KDA layers: per position and head, beta (the
 *                 delta rule's write strength), the decay's mean and min
 *                 over the head's channels, the output gate's mean (means
 *                 summed in channel order in double)
 *                 Such a file's header adds "attention":{"top":K,"head0",
 *                 "heads","layers":[MLA layers],"kda_layers":[...]}.
 *     TRACE_PREDICT = 5: u32 pos0, u32 from, u32 to, u32 d, u32 T, u32 k,
 *                 i32 ids[T][k]
 *                 --trace-lookahead D: after layer `from`, the router of the
 *                 d-th MoE layer after it (`to`) applied to the hidden state
 *                 of positions pos0 .. pos0+T-1 as the prefetcher applies it
 *                 (prefetch.c), its top k by biased score in order (the
 *                 prefetcher's m experts are the first m); the header adds
 *                 "lookahead":D
 * Readers skip records of tags they do not know (len says how far), so a
 * later version can add records without breaking them.  The reader is
 * src/research/trace.c (and tools/router/dftrace.py).
 */
#ifndef DF_TRACE_FORMAT_H
#define DF_TRACE_FORMAT_H

#define TRACE_MAGIC "DFTRACE\n"
#define TRACE_MAGIC_LEN 8
#define TRACE_VERSION 1
enum { TRACE_EVAL = 1, TRACE_ROUTE = 2, TRACE_ATTN = 3, TRACE_KDA = 4, TRACE_PREDICT = 5 };

#endif
