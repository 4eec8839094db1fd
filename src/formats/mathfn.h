/* mathfn.h - the project's own exp, tanh, sigmoid and activations.
 *
 * Every code path (reference or SIMD kernels, any thread count) calls these
 * same scalar functions, so transcendental results never depend on the libm
 * or the CPU.  They work in double internally (exp by range reduction and a
 * degree-13 Taylor polynomial, error far below one float ulp) and round once
 * to float, so results are also within an ulp of the true value.
 */
#ifndef DF_MATHFN_H
#define DF_MATHFN_H

#include <stddef.h>

double df_exp(double x);
float df_expf(float x);
float df_tanhf(float x);
float df_sigmoidf(float x);
float df_siluf(float x);
/* SiTU(g, u) = (b1*tanh(g/b1) * sigmoid(g)) * (b2*tanh(u/b2)), in the
 * operation order of Kimi's SituAndMul. */
float df_situ(float g, float u, float b1, float b2);
/* (The forward pass calls these through the kernel table's sigmoid_n,
 * silu_n and situ_n, which are these functions bit for bit in each ISA's
 * vector lanes: kernels.h.) */

/* RMSNorm: y = w * (x * 1/sqrt(mean(x^2) + eps)); sum in double, in order.
 * w may be NULL (no weight).  y may alias x. */
void rmsnorm(const float *x, const float *w, int n, float eps, float *y);
/* L2 norm of a vector, double sum in order (debug / tests). */
double l2norm(const float *x, int n);
/* The k largest of v[0..n) (k <= n): their indices in ids[0..k), in
 * descending order of value, ties to the lower index.  The one top-k of the
 * project: the router's routes and predictions, the sampler's logprob
 * alternatives.  Returns k (fewer when n < k). */
int df_topk(const float *v, int n, int k, int *ids);
/* K3's router score, the one the MoE router (moe.c) and the prefetch
 * predictor (prefetch.c) both rank experts by: for e < n,
 * sig[e] = sigmoid(logits[e]) (skipped when sig is NULL) and
 * choice[e] = sigmoid(logits[e]) + bias[e] (e_score_correction_bias), each
 * rounded to float.  Top-k of choice picks the experts; sig weighs them. */
void df_router_score(const float *logits, const float *bias, int n, float *sig, float *choice);

#endif
