/* qwen3_dump.c - the logits of every position of a Qwen3 model
 * (src/model/qwen3/qwen3.c) for the llama.cpp oracle (tests/llama/
 * run_llama_oracle.sh):
 *   qwen3_dump MODEL IDS OUT.f32     MODEL a folder or a GGUF; IDS "1,2,3";
 * writes little-endian f32 [n_ids][vocab], as llama_peer --dump-logits.
 * A tool, so it exits on errors.
 */
#include "qwen3.h"
#include "util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: qwen3_dump MODEL IDS OUT.f32\n");
        return 2;
    }
    int32_t ids[4096];
    int n = 0;
    for (char *p = argv[2]; *p && n < 4096;) {
        char *e;
        long v = strtol(p, &e, 10);
        if (e == p) {
            fprintf(stderr, "qwen3_dump: bad ids \"%s\"\n", argv[2]);
            return 2;
        }
        ids[n++] = (int32_t)v;
        p = *e == ',' ? e + 1 : e;
    }
    qwen3_model *m;
    qwen3_state *s;
    df_error err = {0};
    if (qwen3_open(argv[1], &m, &err) || qwen3_state_new(m, n, &s, &err)) {
        fprintf(stderr, "qwen3_dump: %s\n", err.msg);
        return 1;
    }
    size_t V = (size_t)qwen3_cfg(m)->vocab;
    float *lg = xmalloc((size_t)n * V * sizeof *lg);
    if (qwen3_eval(m, s, ids, n, lg, &err)) {
        fprintf(stderr, "qwen3_dump: %s\n", err.msg);
        return 1;
    }
    FILE *f = fopen(argv[3], "wb");
    if (!f || fwrite(lg, sizeof *lg, (size_t)n * V, f) != (size_t)n * V || fclose(f)) {
        fprintf(stderr, "qwen3_dump: cannot write %s\n", argv[3]);
        return 1;
    }
    free(lg);
    qwen3_state_free(s);
    qwen3_free(m);
    return 0;
}
