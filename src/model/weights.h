/* weights.h - a model's weight files, whatever its family: the general
 * half of every family's loader (src/model/k3/model*.c, qwen3.c).
 *
 * A model on disk is one of:
 *   - a Hugging Face folder: the shards model.safetensors.index.json's
 *     weight_map names, or one model.safetensors when there is no index;
 *   - a GGUF file, with the files llama.cpp's gguf-split wrote beside it
 *     when its split.count is over 1 (the first, PREFIX-00001-of-0000N.gguf,
 *     is given; it holds the metadata; each tensor lies whole in one file).
 * wset_open reads every file's header (no tensor data), checks that the
 * files agree (a split's number and count, no tensor in two files, every
 * name the index gives a plain file name) and indexes the tensor names.
 * A family binds its own tensors by name on top (its roster): the header
 * entry and the file that holds it come from wset_st / wset_gguf, and the
 * family checks shapes and types and maps or reads the bytes itself.
 * Every failure names the file and what is wrong; nothing is written.
 */
#ifndef DF_WEIGHTS_H
#define DF_WEIGHTS_H

#include <stddef.h>
#include <stdint.h>
#include "df_error.h"
#include "gguf.h"
#include "safetensors.h"

typedef enum { WSET_SAFETENSORS = 1, WSET_GGUF = 2 } wset_format;

typedef struct wset_name {
    const char *name;   /* a tensor name (the index's, or a file header's) */
    int file;
} wset_name;

typedef struct wset {
    wset_format format;
    char *where;          /* the folder or the first GGUF file, as given */
    char *index_path;     /* the safetensors index read, or NULL (one model.safetensors) */
    int n_files;
    st_file *st;          /* [n_files] safetensors headers */
    gguf_file *gg;        /* [n_files] GGUF headers; gg[0] holds the metadata */
    wset_name *names;     /* safetensors: every tensor, sorted by name */
    size_t n_names;
    char *index_text;     /* the names above point into it (an index) */
    void *index_doc;
} wset;

/* Opens the weight files of the model at path (a folder or a GGUF file).
 * skip, when given, drops names from a safetensors index (a shard that
 * only skipped names point to is not opened: K3 skips its vision tower). */
int wset_open(const char *path, int (*skip)(const char *name), wset *w, df_error *err);
void wset_close(wset *w);

/* The path of file i. */
const char *wset_path(const wset *w, int i);

/* A safetensors tensor by name and the file holding it; NULL with the
 * index (or the file) and the name in err when it is missing. */
const st_tensor *wset_st(const wset *w, const char *name, int *file, df_error *err);
/* A GGUF tensor by name in whichever split holds it; NULL with the name
 * (and "from every split" when split) in err when it is missing. */
const gguf_tensor *wset_gguf(const wset *w, const char *name, int *file, df_error *err);

/* The bytes of all the weight files (their sizes on disk). */
uint64_t wset_file_bytes(const wset *w);

#endif
