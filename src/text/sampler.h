/* sampler.h - choosing the next token from logits (L1), for the CLI and the
 * server alike.
 *
 * Greedy at temperature 0 (df_argmax: the first maximum); otherwise
 * softmax(logits / T) computed in double, optionally restricted to the top_k
 * most probable ids and then to the top_p nucleus (the smallest prefix, in
 * order of probability with ties to the lower id, whose mass reaches top_p),
 * and one uniform draw from a splitmix64 stream: the same seed gives the
 * same tokens on every machine, thread count and batch width.  Owns its
 * scratch ([vocab] doubles and pairs, allocated at init): a draw allocates
 * nothing.  The nucleus order is an in-place heapsort, not qsort (glibc's
 * qsort allocates).
 *
 * Also the log-softmax helpers for logprobs (top alternatives by logit,
 * ties to the lower id).
 */
#ifndef DF_SAMPLER_H
#define DF_SAMPLER_H

#include <stdint.h>

typedef struct sampler_pair {
    double p;
    int id;
} sampler_pair;

typedef struct sampler {
    int vocab;
    double temperature;       /* 0 = greedy */
    double top_p;             /* (0, 1]; 1 = no nucleus */
    int top_k;                /* 0 = all ids */
    uint64_t rng;             /* splitmix64 state, starts at the seed */
    double *work;             /* [vocab] */
    sampler_pair *pairs;      /* [vocab] */
} sampler;

/* Owns [vocab] scratch until sampler_free. */
void sampler_init(sampler *s, int vocab, double temperature, double top_p, int top_k, uint64_t seed);
void sampler_free(sampler *s);
/* Restart the stream (a new request) with new settings. */
void sampler_reset(sampler *s, double temperature, double top_p, int top_k, uint64_t seed);
int32_t sampler_next(sampler *s, const float *logits);
/* The next id given a drafted one (speculative decoding): greedy accepts
 * the draft when it is the argmax; sampling accepts it with its probability
 * and otherwise draws from the rest, so the result is distributed exactly
 * as sampler_next's (the stream's draws differ).  *accepted says which. */
int32_t sampler_verify(sampler *s, const float *logits, int32_t draft, int *accepted);

/* log(sum exp(logits)) in double. */
double sampler_logsumexp(const float *logits, int vocab);
/* The k largest logits' ids, descending, ties to the lower id (k <= 64). */
int sampler_top_ids(const float *logits, int vocab, int k, int *ids);

#endif
