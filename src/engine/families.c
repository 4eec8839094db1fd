/* families.c - the family registry (families.h): which family reads the
 * type a model on disk states.  Knows the families only by their tables.
 */
#include "families.h"
#include "util.h"

#include <stdio.h>
#include <string.h>

static const df_family *const families[] = {&df_family_k3, &df_family_qwen3};
enum { N_FAMILIES = (int)(sizeof families / sizeof families[0]) };

const df_family *family_named(const char *type)
{
    for (int i = 0; i < N_FAMILIES; i++)
        for (const char *const *t = families[i]->types; *t; t++)
            if (!strcmp(*t, type)) return families[i];
    return NULL;
}

const df_family *family_of(const char *path, df_error *err)
{
    char type[128];
    if (family_type_of(path, type, sizeof type, err)) return NULL;
    const df_family *f = family_named(type);
    if (f) return f;
    char known[512];
    size_t k = 0;
    known[0] = 0;
    for (int i = 0; i < N_FAMILIES; i++)
        for (const char *const *t = families[i]->types; *t; t++)
            k += (size_t)snprintf(known + k, k < sizeof known ? sizeof known - k : 0, "%s\"%s\"", k ? ", " : "", *t);
    df_err_set(err, DF_ERR_UNSUPPORTED, -1, "%s: a model of type \"%s\", which deltafin does not run (it reads %s)",
               path, type, known);
    return NULL;
}
