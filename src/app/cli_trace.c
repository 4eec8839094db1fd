/* cli_trace.c - `deltafin trace VERB FILE`: route traces (either format,
 * research/trace.h) read back.
 *
 *   dump   the header, then every record as a JSON line: an evaluation as
 *          {"eval":{"pos0":P,"ids":[...]}}, a route as the older format's line
 *          plus the scores: {"pos","layer","experts","scores","weights"},
 *          floats with nine significant digits (each reads back to the same
 *          f32 bits)
 * Later verbs (stats, reuse, cache, prefetch, diff) go here too.
 */
#include "cli.h"
#include "json_write.h"
#include "trace.h"

#include <stdio.h>
#include <string.h>

static void put_floats(const char *key, const float *v, int k)
{
    printf(",\"%s\":[", key);
    for (int j = 0; j < k; j++) printf("%s%.9g", j ? "," : "", (double)v[j]);
    printf("]");
}

static int trace_dump(df_trace *t, df_error *err)
{
    const df_trace_info *in = df_trace_header(t);
    json_buf b;
    json_buf_init(&b);
    json_write_string(&b, in->model, strlen(in->model));
    printf("{\"trace\":\"deltafin routes\",\"format\":\"%s\",\"model\":%s,\"layers\":%d,\"experts\":%d,\"top_k\":%d",
           in->binary ? "binary" : "jsonl", b.p ? b.p : "\"\"", in->layers, in->experts, in->top_k);
    json_buf_free(&b);
    if (in->binary) {
        printf(",\"hidden\":%d,\"vocab\":%d,\"shared_experts\":%d,\"moe_layers\":[", in->hidden, in->vocab,
               in->shared_experts);
        for (int il = 0, n = 0; il < in->layers; il++)
            if (in->moe[il]) printf("%s%d", n++ ? "," : "", il);
        printf("]");
    }
    printf("}\n");
    df_trace_rec r;
    int rc;
    while ((rc = df_trace_next(t, &r, err)) == 1) {
        if (r.tag == TRACE_EVAL) {
            printf("{\"eval\":{\"pos0\":%d,\"ids\":[", r.pos0);
            for (int i = 0; i < r.n; i++) printf("%s%d", i ? "," : "", r.ids[i]);
            printf("]}}\n");
            continue;
        }
        for (int p = 0; p < r.n; p++) {
            const int32_t *ids = r.ids + (size_t)p * r.k;
            printf("{\"pos\":%d,\"layer\":%d,\"experts\":[", r.pos0 + p, r.layer);
            for (int j = 0; j < r.k; j++) printf("%s%d", j ? "," : "", ids[j]);
            printf("]");
            if (r.score) put_floats("scores", r.score + (size_t)p * r.k, r.k);
            if (r.weight) put_floats("weights", r.weight + (size_t)p * r.k, r.k);
            printf("}\n");
        }
    }
    return rc;
}

int cmd_trace(int argc, char **argv)
{
    if (argc != 4 || strcmp(argv[2], "dump"))
        die("usage: deltafin trace dump FILE (a route trace written by 'deltafin run --trace FILE')");
    df_error err = {0};
    df_trace *t;
    if (df_trace_open(argv[3], &t, &err)) {
        fprintf(stderr, "deltafin: %s\n", err.msg);
        return 1;
    }
    int rc = trace_dump(t, &err);
    df_trace_close(t);
    if (fflush(stdout) || rc) {
        fprintf(stderr, "deltafin: %s\n", rc ? err.msg : "cannot write the dump");
        return 1;
    }
    return 0;
}
