/* tokenizer_load.c - tokenizer_load (tokenizer.h): which loader reads a
 * model's tokenizer.  A file is a llama.cpp GGUF (its "gpt2" vocabulary); a
 * folder with tiktoken.model is K3's (tokenizer.c); a GGUF's vocabulary is
 * K3's or, with tokenizer.ggml.pre "qwen2", Qwen's; a folder with only
 * tokenizer.json is a Hugging Face file of a family deltafin implements
 * (tokenizer_hf.c: Qwen2/Qwen3's).  Every error names the path.
 */
#include "tokenizer.h"
#include "tokenizer_impl.h"
#include "gguf.h"
#include "util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int tokenizer_from_gguf(const gguf_file *g, tokenizer **out, df_error *err)
{
    *out = NULL;
    tokenizer *t = xcalloc(1, sizeof *t);
    t->fam = &tok_family_k3;
    t->n_special = TOK_K3_SPECIALS;
    const gguf_kv *pre = gguf_find_kv(g, "tokenizer.ggml.pre");
    int qwen2 = pre && pre->type == GGUF_KV_STRING && pre->len == 5 && !memcmp(pre->data, "qwen2", 5);
    if ((qwen2 ? tok_load_gguf_qwen2(t, g, err) : tok_load_gguf_k3(t, g, err)) || tok_finish_load(t, err)) {
        df_err_prefix(err, "tokenizer");
        tokenizer_free(t);
        return -1;
    }
    *out = t;
    return 0;
}

int tokenizer_load(const char *model_dir, tokenizer **out, df_error *err)
{
    *out = NULL;
    if (!model_dir) return df_err_set(err, DF_ERR_ARG, -1, "tokenizer_load: NULL model_dir");
    struct stat sb;
    if (stat(model_dir, &sb) == 0 && S_ISREG(sb.st_mode)) {
        gguf_file g;
        if (gguf_open(model_dir, &g, err)) {
            df_err_prefix(err, "tokenizer");
            return -1;
        }
        int rc = tokenizer_from_gguf(&g, out, err);
        gguf_deinit(&g);
        return rc;
    }
    tokenizer *t = xcalloc(1, sizeof *t);
    t->fam = &tok_family_k3;
    size_t dl = strlen(model_dir);
    char *path = xmalloc(dl + 32);
    int rc;
    snprintf(path, dl + 32, "%s/tiktoken.model", model_dir);
    if (stat(path, &sb) == 0) {
        rc = tok_load_tiktoken(t, model_dir, err);
    } else {
        snprintf(path, dl + 32, "%s/tokenizer.json", model_dir);
        if (stat(path, &sb) == 0) rc = tok_load_hf(t, path, err);
        else rc = df_err_set(err, DF_ERR_IO, -1, "%s holds neither tiktoken.model (K3) nor tokenizer.json", model_dir);
    }
    free(path);
    if (!rc) rc = tok_finish_load(t, err);
    if (rc) {
        df_err_prefix(err, "tokenizer");
        tokenizer_free(t);
        return -1;
    }
    *out = t;
    return 0;
}
