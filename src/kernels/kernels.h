/* kernels.h - matrix kernels: one table per ISA, chosen once at startup.
 *
 * Every kernel computes, for rows r in [r0, r1) and positions t in [0, T):
 *     y[t*ys + r] = sum_c W[r, c] * x[t*xs + c]
 * with ONE reduction order, fixed by this contract and followed by every ISA:
 *
 *   Dense (F32 / BF16 weights): 16 lanes; lane l accumulates the columns
 *   c = 16k + l in increasing k with fused multiply-add starting from +0
 *   (columns past C contribute fma(0, 0, acc)); the lanes are then combined
 *   by the tree s[i] = a[i] + a[i+8] (i < 8), s[i] += s[i+4] (i < 4),
 *   s[i] += s[i+2] (i < 2), y = s[0] + s[1].
 *
 *   F16 and Q8_0 weights follow the dense order exactly, w being the stored
 *   value as f32: F16 converted exactly; Q8_0 (ggml blocks of 32: an F16
 *   scale d, then 32 int8 q) w = (float)q * d, an exact product.  So a
 *   matrix in either format gives the bits of matmul_f32 on its values.
 *
 *   Any other block format of qblock.h (Q4_0 ... Q6_K): the same, w being
 *   the value its decode() gives; C is a multiple of the block.
 *
 *   MXFP4: per block b of 32 columns and lane j < 16, with the activation
 *   reordered by mxfp4_prep_x (xe = even columns, xo = odd columns):
 *     p = e2m1(lo nibble of byte j) * xe[j];  p = fma(e2m1(hi nibble), xo[j], p);
 *     acc[j] = fma(p, 2^(scale_b - 127), acc[j]);
 *   then the same lane tree.  C must be a multiple of 32.
 *
 * The result of a row depends only on that row and that position: not on T,
 * on [r0, r1), on the thread that runs it or on the ISA.  kernels_ref.c is
 * the specification; kernels_avx2.c and kernels_avx512.c must match it bit
 * for bit, and so must kernels_neon.c on AArch64 (tests/test_kernels.c
 * checks, under qemu-aarch64 on x86-64 machines).  Kernels never allocate.
 *
 * MLA attention (mla_attend, for mla.c): nh heads of one query row over the
 * first n rows of a latent cache, row p = [lat_p (Rkv) | k_rope_p (dr)].
 * Per head h, with q_h = [ql + h*qls (Rkv floats) | qr + h*qrs (dr floats)]:
 *   s_p   = (float)(sum over j = 0 .. Rkv+dr-1 in order of (double)q_h[j] * (double)row_p[j],
 *                   from +0) * scale                         (float product)
 *   mx    = the largest s_p as `if (s_p > mx) mx = s_p` over p in order, from -inf (double)
 *   e_p   = (float)df_exp((double)s_p - mx)
 *   sum   = sum over p in order of (double)e_p, from +0;   inv = (float)(1.0 / sum)
 *   pp_p  = e_p * inv                                         (float)
 *   ctx[h][j] = sum over p in order of pp_p * lat_p[j], from +0: float product, then float add
 * The score products are exact in double, so a double FMA rounds exactly as
 * the product-then-add; the context products are float roundings, so there
 * it is a multiply, then an add, never an FMA.  Heads never mix: a head's
 * results do not depend on nh, on the other heads or on the ISA.
 */
#ifndef DF_KERNELS_H
#define DF_KERNELS_H

#include <stddef.h>
#include <stdint.h>
#include "df_error.h"
#include "qblock.h"

typedef struct kernel_table {
    const char *name;
    /* W: [R, C] row-major F32, rows `ld` elements apart; may be unaligned */
    void (*matmul_f32)(const void *W, size_t ld, int C, const float *x, size_t xs, int T,
                       float *y, size_t ys, int r0, int r1);
    /* W: [R, C] row-major BF16 */
    void (*matmul_bf16)(const void *W, size_t ld, int C, const float *x, size_t xs, int T,
                        float *y, size_t ys, int r0, int r1);
    /* packed: [R, C/2] U8, scales: [R, C/32] U8; xp: activations reordered
     * by mxfp4_prep_x, positions xs floats apart */
    void (*matmul_mxfp4)(const uint8_t *packed, const uint8_t *scales, int C, const float *xp,
                         size_t xs, int T, float *y, size_t ys, int r0, int r1);
    /* The same MXFP4 product with the weights in ggml's block layout (GGUF
     * files): blocks [R][C/32] of 17 bytes (E8M0 scale, then byte j holding
     * value j low and value j + 16 high); `unused` is ignored.  Results are
     * those of matmul_mxfp4 on the matrix mxfp4_from_ggml repacks, bit for
     * bit (the kernels permute each block's nibbles into that order). */
    void (*matmul_mxfp4_gg)(const uint8_t *blocks, const uint8_t *unused, int C, const float *xp,
                            size_t xs, int T, float *y, size_t ys, int r0, int r1);
    /* W: [R, C] row-major IEEE half, rows `ld` elements apart */
    void (*matmul_f16)(const void *W, size_t ld, int C, const float *x, size_t xs, int T,
                       float *y, size_t ys, int r0, int r1);
    /* blocks: [R][C/32] ggml Q8_0 blocks of 34 bytes (F16 scale, 32 int8);
     * C a multiple of 32; x plain (not reordered); `unused` is ignored */
    void (*matmul_q8_0)(const uint8_t *blocks, const uint8_t *unused, int C, const float *x, size_t xs, int T,
                        float *y, size_t ys, int r0, int r1);
    /* blocks: [R][C/f->block] blocks of format f (qblock.h), x plain */
    void (*matmul_qblock)(const qblock_fmt *f, const uint8_t *blocks, int C, const float *x, size_t xs, int T,
                          float *y, size_t ys, int r0, int r1);
    /* MLA attention by the contract above.  cache: [n][row_w] floats (row_w >=
     * Rkv + dr).  Head h's query: ql + h*qls (Rkv floats), qr + h*qrs (dr).
     * sc: n * nh floats; on return sc[p*nh + h] = pp_p of head h (the weights
     * the context was summed with: attention dumps read them).  ctx: [nh][Rkv]
     * out; it may overlap the queries (they are all read before ctx is
     * written).  1 <= nh <= MLA_NH_MAX, n >= 1. */
    void (*mla_attend)(const float *cache, size_t row_w, int Rkv, int dr, int n, const float *ql, size_t qls,
                       const float *qr, size_t qrs, int nh, float scale, float *sc, float *ctx);
    /* y[i] = df_exp(x[i]) for i < n, bit for bit: the ISA's vector exp, the
     * one mla_attend uses, exposed so tests can check it in double */
    void (*exp_n)(const double *x, double *y, size_t n);
    /* The elementwise functions of the forward pass, each equal bit for bit
     * to mathfn.h's scalar function on every input (kernels_elementwise.h
     * writes them once for every ISA); y may be x (out may be g or u):
     *   sigmoid_n: y[i] = df_sigmoidf(x[i])      silu_n: y[i] = df_siluf(x[i])
     *   situ_n:    out[i] = df_situ(g[i], u[i], b1, b2) */
    void (*sigmoid_n)(const float *x, size_t n, float *y);
    void (*silu_n)(const float *x, size_t n, float *y);
    void (*situ_n)(const float *g, const float *u, size_t n, float b1, float b2, float *out);
    /* The KDA delta rule's two passes over a head's state S [Dk][Dk]
     * (kda.c), each element a multiply then an add, never fused, and each
     * column's sum over d in increasing d (kernels_kda.h writes them once
     * for every ISA; the results equal kernels_ref.c's bit for bit):
     *   kda_decay_pred: S[d][v] *= dec[d], then pred[v] += k[d] * S[d][v]
     *   kda_update_out: S[d][v] += b[d] * p[v], then o[v] += q[d] * S[d][v] */
    void (*kda_decay_pred)(float *S, int Dk, const float *dec, const float *k, float *pred);
    void (*kda_update_out)(float *S, int Dk, const float *b, const float *p, const float *q, float *o);
} kernel_table;

/* The most heads one mla_attend call takes (its per-head state is on the stack). */
#define MLA_NH_MAX 32

enum kernel_isa { KERNEL_REF, KERNEL_AVX2, KERNEL_AVX512, KERNEL_NEON };

const kernel_table *kernels_ref(void);
const kernel_table *kernels_avx2(void);    /* NULL if not compiled in */
const kernel_table *kernels_avx512(void);  /* NULL if not compiled in */
const kernel_table *kernels_neon(void);    /* NULL if not compiled in (AArch64 only) */

/* Whether this CPU can run an ISA's table. */
int kernels_cpu_has(enum kernel_isa isa);
/* The best table for this CPU, or the one named by `force` ("ref", "avx2",
 * "avx512", "neon"; NULL or "" = best; the DF_KERNELS environment variable is read
 * by the engine, not here).  Fails if the forced ISA is unknown or the CPU
 * lacks it. */
const kernel_table *kernels_select(const char *force, df_error *err);

/* The lane tree shared by the reference code (and documented above). */
static inline float lane_tree16(const float a[16])
{
    float s[8];
    for (int i = 0; i < 8; i++) s[i] = a[i] + a[i + 8];
    for (int i = 0; i < 4; i++) s[i] = s[i] + s[i + 4];
    for (int i = 0; i < 2; i++) s[i] = s[i] + s[i + 2];
    return s[0] + s[1];
}

#endif
