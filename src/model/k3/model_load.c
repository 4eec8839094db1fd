/* model_load.c - which loader reads a model path: a regular file is a
 * llama.cpp GGUF (model_gguf.c), anything else a checkpoint directory of
 * safetensors shards and config.json (model.c).  Apart from both loaders
 * so that neither calls the other: model_gguf.c uses model.c's binding
 * helpers, model.c knows nothing of GGUF.  A model of another family
 * deltafin knows (family.h) is refused here with what it can be used for,
 * before either loader reads it as a K3 and names a field it lacks.
 */
#include "model.h"
#include "family.h"
#include "util.h"

#include <sys/stat.h>

int model_load(k3_model *eng, const char *dir, df_error *err)
{
    char type[128];
    df_error fe = {0};
    const df_family *f = family_type_of(dir, type, sizeof type, &fe) ? NULL : family_named(type);
    if (f && f != &df_family_k3)
        return df_err_set(err, DF_ERR_UNSUPPORTED, -1,
                          "%s is a %s model (\"%s\"): deltafin runs it as a drafter beside a K3 target "
                          "(--draft model:%s), not as the model itself",
                          dir, f->title, type, dir);
    struct stat sb;
    if (stat(dir, &sb) == 0 && S_ISREG(sb.st_mode)) return model_load_gguf(eng, dir, err);
    return model_load_safetensors(eng, dir, err);
}
