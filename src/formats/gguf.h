/* gguf.h - strict reader for one GGUF file's header (versions 2 and 3).
 *
 * Owns: parsing and validating the header (magic, version, counts, the
 * key/value metadata, the tensor infos) into a KV table and a tensor table
 * with absolute file offsets.  Validates everything it reads: every string
 * and array lies inside the header, KV and element types are known, arrays
 * of arrays are refused (ggml does not write them), general.alignment is a
 * UINT32 power of two, tensor names are unique and shorter than 64 bytes,
 * 1..4 dims with ne[0] a multiple of the type's block, ggml types known,
 * byte sizes computed without overflow, offsets aligned, inside the file and
 * not overlapping.  Version 1 (32-bit counts) is refused: nothing writes it
 * any more and its counts are a different width.
 * Does not own: reading tensor data (callers pread / map at t->offset),
 * knowing what a model needs (model.c), dequantizing (quant.c).
 * The first error wins and carries the byte offset of the offending field.
 * All integers are little-endian; a big-endian GGUF is refused as a bad
 * version (its version field reads as 0x03000000).
 */
#ifndef DF_GGUF_H
#define DF_GGUF_H

#include <stddef.h>
#include <stdint.h>
#include "df_error.h"

#define GGUF_MAX_DIMS 4
#define GGUF_MAX_NAME 64                  /* ggml's GGML_MAX_NAME, including the NUL */
#define GGUF_DEFAULT_ALIGNMENT 32u
#define GGUF_MAX_HEADER (1024ull << 20)   /* a 1 GiB header is corrupt, not big */

enum gguf_kv_type {
    GGUF_KV_U8 = 0, GGUF_KV_I8 = 1, GGUF_KV_U16 = 2, GGUF_KV_I16 = 3, GGUF_KV_U32 = 4,
    GGUF_KV_I32 = 5, GGUF_KV_F32 = 6, GGUF_KV_BOOL = 7, GGUF_KV_STRING = 8, GGUF_KV_ARRAY = 9,
    GGUF_KV_U64 = 10, GGUF_KV_I64 = 11, GGUF_KV_F64 = 12,
};

/* ggml type ids (ggml.h enum ggml_type); the ones this project writes or
 * reads by name.  gguf_type_info knows every current id. */
enum gguf_ggml_type {
    GGML_TYPE_F32 = 0, GGML_TYPE_F16 = 1, GGML_TYPE_Q8_0 = 8, GGML_TYPE_BF16 = 30,
    GGML_TYPE_MXFP4 = 39,
};

/* MXFP4 block (ggml block_mxfp4): 32 values in 17 bytes, e = E8M0 scale
 * byte, then 16 bytes where byte j holds value j in its low nibble and value
 * j + 16 in its high nibble (NOT the compressed-tensors order 2j / 2j+1). */
#define GGUF_MXFP4_BLOCK 32
#define GGUF_MXFP4_BYTES 17

typedef struct gguf_kv {
    char *key;                 /* NUL-terminated copy */
    enum gguf_kv_type type;
    enum gguf_kv_type arr_type;/* element type when type == GGUF_KV_ARRAY */
    uint64_t n;                /* array length (1 for scalars) */
    uint64_t pos;              /* byte offset of the key in the file */
    const uint8_t *data;       /* value bytes inside gguf_file.head (strings: the bytes after the length) */
    uint64_t len;              /* string length (type STRING) */
    uint64_t *str_off;         /* string arrays: offset of each element's bytes from data */
    uint64_t *str_len;
} gguf_kv;

typedef struct gguf_tensor {
    char *name;
    uint32_t type;             /* ggml type id */
    int n_dims;
    int64_t ne[GGUF_MAX_DIMS]; /* ne[0] moves fastest; unused dims are 1 */
    uint64_t offset;           /* absolute byte offset in the file */
    uint64_t nbytes;
    uint64_t info_pos;         /* byte offset of the tensor info (for messages) */
} gguf_tensor;

typedef struct gguf_file {
    char *path;
    uint32_t version;
    uint64_t file_size;
    uint32_t alignment;
    uint64_t data_start;       /* aligned end of the header */
    uint8_t *head;             /* owned copy of the header bytes; KV values point into it */
    size_t head_len;
    size_t n_kv;
    gguf_kv *kv;               /* file order */
    size_t n_tensors;
    gguf_tensor *tensors;      /* file order */
    uint32_t *by_name;         /* tensor indices sorted by name */
} gguf_file;

/* Parse a header from memory: `head` holds the first head_len bytes of a
 * file of file_size bytes (head_len may be the whole file).  `label` names
 * the file in messages.  On failure fills err and leaves *out empty.  If
 * the header runs past head_len (but not past file_size) the error code is
 * DF_ERR_LIMIT so a caller can retry with a longer prefix. */
int gguf_parse(const uint8_t *head, size_t head_len, uint64_t file_size, const char *label,
               gguf_file *out, df_error *err);
/* Read and parse the header of the file at path. */
int gguf_open(const char *path, gguf_file *out, df_error *err);
void gguf_deinit(gguf_file *f);

/* Lookups; NULL when absent. */
const gguf_kv *gguf_find_kv(const gguf_file *f, const char *key);
const gguf_tensor *gguf_find_tensor(const gguf_file *f, const char *name);

/* Typed getters: 0 on success; -1 with a message naming the file and key if
 * the key is missing or its value does not fit.  Integer getters accept any
 * integer KV type whose value is representable; f32 needs F32 (F64 is
 * accepted when it converts exactly); bool needs BOOL. */
int gguf_get_u32(const gguf_file *f, const char *key, uint32_t *out, df_error *err);
int gguf_get_i32(const gguf_file *f, const char *key, int32_t *out, df_error *err);
int gguf_get_u64(const gguf_file *f, const char *key, uint64_t *out, df_error *err);
int gguf_get_f32(const gguf_file *f, const char *key, float *out, df_error *err);
int gguf_get_bool(const gguf_file *f, const char *key, int *out, df_error *err);
/* String value: *s points into f->head (not NUL-terminated; valid until
 * gguf_deinit), *len its byte length. */
int gguf_get_str(const gguf_file *f, const char *key, const char **s, size_t *len, df_error *err);
/* Arrays: *n receives the length; at most max elements are stored.  The
 * int variant accepts any integer element type, the float one F32 (and F64
 * elements that convert exactly). */
int gguf_get_arr_int(const gguf_file *f, const char *key, int64_t *out, size_t max, size_t *n,
                     df_error *err);
int gguf_get_arr_f32(const gguf_file *f, const char *key, float *out, size_t max, size_t *n,
                     df_error *err);
/* Element i of a string array. */
int gguf_get_arr_str(const gguf_file *f, const char *key, size_t i, const char **s, size_t *len,
                     df_error *err);

/* Name, block size (values per block) and block bytes of a ggml type;
 * returns 0 for an unknown or removed id. */
int gguf_type_info(uint32_t type, const char **name, uint32_t *blck, uint32_t *bytes);

#endif
