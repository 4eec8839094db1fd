/* safetensors.h - strict reader for one safetensors file's header.
 *
 * Owns: parsing and validating the header (u64 LE length, UTF-8 JSON with
 * dtype / shape / data_offsets per tensor) into a table of tensors with
 * absolute file offsets.  Validates every entry: known dtype, shape of
 * non-negative dims whose byte size does not overflow, data_offsets matching
 * that size and lying inside the file, and no two tensors overlapping.
 * Does not own: mapping or reading tensor data (model / expert_store do that),
 * knowing which tensors a model needs.
 */
#ifndef DF_SAFETENSORS_H
#define DF_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>
#include "df_error.h"

enum st_dtype { ST_F32, ST_BF16, ST_F16, ST_U8, ST_I8, ST_I32, ST_I64, ST_F64, ST_BOOL, ST_U16, ST_I16, ST_U32, ST_U64 };

#define ST_MAX_DIMS 8
#define ST_MAX_HEADER (256u << 20)   /* a 256 MiB JSON header is corrupt, not big */

typedef struct st_tensor {
    char *name;
    enum st_dtype dtype;
    int n_dims;
    int64_t shape[ST_MAX_DIMS];
    uint64_t offset;      /* absolute byte offset in the file */
    uint64_t nbytes;
} st_tensor;

typedef struct st_file {
    char *path;
    uint64_t file_size;
    uint64_t data_start;  /* 8 + header length */
    size_t n_tensors;
    st_tensor *tensors;
} st_file;

/* Parse a header from memory.  `head` holds the first head_len bytes of a
 * file of file_size bytes (head_len may be the whole file).  `label` names
 * the file in messages.  On failure fills err and leaves *out empty. */
int st_parse(const uint8_t *head, size_t head_len, uint64_t file_size, const char *label,
             st_file *out, df_error *err);
/* Read and parse the header of the file at path. */
int st_open(const char *path, st_file *out, df_error *err);
void st_deinit(st_file *f);

const char *st_dtype_name(enum st_dtype t);
size_t st_dtype_size(enum st_dtype t);
const st_tensor *st_find(const st_file *f, const char *name);

#endif
