/* heat.h - the persisted per-(layer, expert) heat histogram.
 *
 * Owns: the heat file format and its atomic replacement.  The file is a
 * fixed-size binary record: magic "DFHEAT01", u32 layers, u32 experts, u32
 * CRC-32 of the counts, then layers * experts little-endian f32 decayed use
 * counts.  Its size is bounded by the model (K3: 333 KB).  Saving writes a
 * temporary file beside the target, fsyncs it and renames it over the old
 * one, so a crash at any moment leaves either the old or the new file, never
 * a torn one.  Loading rejects a file for another model shape or with a bad
 * checksum (the caller then starts cold).
 */
#ifndef DF_HEAT_H
#define DF_HEAT_H

#include "df_error.h"

/* Read counts into out[layers * experts].  Returns 0, or -1 with err
 * (DF_ERR_IO when the file does not exist). */
int heat_load(const char *path, int layers, int experts, float *out, df_error *err);
int heat_save(const char *path, int layers, int experts, const float *counts, df_error *err);

#endif
