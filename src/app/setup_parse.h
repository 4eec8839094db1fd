/* setup_parse.h - the parsers of `deltafin setup` (L5), apart from any
 * network so that a fuzz target drives them (fuzz/fuzz_setup.c): the
 * Hugging Face tree listing's entries, with the path safety rule (the
 * HTTP header lines are base/http.c's).
 */
#ifndef DF_SETUP_PARSE_H
#define DF_SETUP_PARSE_H

#include <stddef.h>
#include <stdint.h>
#include "df_error.h"
#include "json.h"
#include "http.h"

typedef struct setup_file {
    char *path;
    uint64_t size;
    char hash[65];            /* lfs: SHA-256; else the git blob SHA-1 (40) */
    int lfs;
    int verified;
    int first_chunk, n_chunks;
} setup_file;

/* A relative path to a file that stays inside the install (no ".." or "."
 * component, no "//", no leading or trailing "/", at most 1000 bytes). */
int setup_safe_path(const char *p);

/* The file entries of one listing page (an array of {"type","path","size",
 * "oid","lfs":{"oid","size"}}), appended to *files; directories skipped;
 * an entry without a valid size and hash, or with an unsafe path, is an
 * error naming url and the entry. */
int setup_listing_entries(const json_value *arr, setup_file **files, int *n, int *cap, const char *url,
                          df_error *err);
void setup_files_free(setup_file *files, int n);

#endif
