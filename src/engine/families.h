/* families.h - the family registry: every model family deltafin knows
 * (family.h's table), K3's included.  K3's table is the engine's own
 * engine and sessions behind the family interface (family_k3.c), so the
 * registry lives here, above both; a dense family's table is defined in
 * its folder under src/model/.  A new family is a folder, a table and a
 * line in families.c.
 */
#ifndef DF_FAMILIES_H
#define DF_FAMILIES_H

#include "family.h"

/* Kimi K3 (family_k3.c): the engine opened with a memory plan for one
 * session, that session's eval, mark and truncate. */
extern const df_family df_family_k3;

/* The family of a type name; NULL when none reads it. */
const df_family *family_named(const char *type);
/* The family of the model at path (its config.json's model_type or its
 * GGUF's general.architecture): NULL with an error naming the type found
 * and the types known. */
const df_family *family_of(const char *path, df_error *err);

#endif
