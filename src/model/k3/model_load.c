/* model_load.c - which loader reads a K3 model path: a regular file is a
 * llama.cpp GGUF (model_gguf.c), anything else a checkpoint directory of
 * safetensors shards and config.json (model.c).  Apart from both loaders
 * so that neither calls the other: model_gguf.c uses model.c's binding
 * helpers, model.c knows nothing of GGUF.  Which family a path is (and the
 * refusal of a model of another family) is the engine's question, asked
 * before this (engine.c, family.h).
 */
#include "model.h"

#include <sys/stat.h>

int model_load(k3_model *eng, const char *dir, df_error *err)
{
    struct stat sb;
    if (stat(dir, &sb) == 0 && S_ISREG(sb.st_mode)) return model_load_gguf(eng, dir, err);
    return model_load_safetensors(eng, dir, err);
}
