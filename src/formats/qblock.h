/* qblock.h - ggml's block-quantized weight formats (GGUF files): what the
 * bytes of one block mean, as values.
 *
 * A format packs `block` consecutive values of a row (32, or 256 for the
 * K-quants) into `bytes` bytes; rows are whole blocks.  decode() gives the
 * block's values exactly as ggml's dequantize_row_<type> computes them, the
 * same float operations in the same order (tests/test_kernels checks every
 * format against the library's own function, bit for bit): that f32 is
 * what a weight IS for deltafin, and the kernels multiply by it in the one
 * reduction order of kernels.h.  Types read: Q8_0, Q4_0, Q4_1, Q5_0, Q5_1,
 * IQ4_NL, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K (llama.cpp's quantizer writes the
 * 32-value ones into K-quant files wherever a row is not whole 256-blocks).
 */
#ifndef DF_QBLOCK_H
#define DF_QBLOCK_H

#include <stddef.h>
#include <stdint.h>

#define QBLOCK_MAX 256 /* the most values a block holds */

typedef struct qblock_fmt {
    const char *name;       /* ggml's: "Q4_K" */
    uint32_t ggml_type;     /* GGUF tensor type id */
    int block;              /* values per block */
    int bytes;              /* bytes per block */
    void (*decode)(const uint8_t *blk, float *out); /* out: `block` values */
} qblock_fmt;

/* One Q8_0 block from 32 values, as ggml's quantize_row_q8_0_ref writes it:
 * d = max|x| / 127 stored as F16 (nearest even), q = roundf(x * (1 / d)). */
void q8_0_quantize_block(const float *x, uint8_t *out);

/* The K-quants' packed scales, as their decoders read them (the kernel
 * files' vector decoders share them): Q4_K/Q5_K's 6-bit scale and min of
 * sub-block j (of 8) from the 12 scale bytes q; Q3_K's sixteen 6-bit scales
 * of the block b, before the decoder's minus 32. */
void qblock_k4_scale_min(int j, const uint8_t *q, uint8_t *d, uint8_t *m);
void qblock_q3_k_scales(const uint8_t *b, int8_t scales[16]);

/* The format of a GGUF tensor type, or NULL when it is not one read here. */
const qblock_fmt *qblock_fmt_of_ggml(uint32_t ggml_type);
/* Every format read, for messages: "Q8_0, Q4_0, ..." */
const char *qblock_names(void);

#endif
