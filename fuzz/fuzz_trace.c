/* fuzz_trace.c - libFuzzer target for the route trace reader
 * (research/trace.c): both formats, every record read; a refusal must say
 * why. */
#include "trace.h"

#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    df_error err = {0};
    df_trace *t;
    if (df_trace_from_memory(data, size, "fuzz", &t, &err)) {
        if (!err.msg[0]) abort();
        return 0;
    }
    const df_trace_info *in = df_trace_header(t);
    df_trace_rec r;
    int rc;
    volatile long sum = 0;
    while ((rc = df_trace_next(t, &r, &err)) == 1) {
        size_t n = r.tag == TRACE_EVAL ? (size_t)r.n : (size_t)r.n * (size_t)(r.n_heads ? r.n_heads : 1) * (size_t)r.k;
        for (size_t i = 0; i < n; i++) {
            if (r.tag == TRACE_ROUTE && (r.ids[i] < 0 || r.ids[i] >= in->experts)) abort();
            if (r.ids) sum += r.ids[i];
            if (r.weight && r.weight[i] != r.weight[i]) abort(); /* a NaN let through */
        }
    }
    if (rc < 0 && !err.msg[0]) abort();
    df_trace_rewind(t);
    if (df_trace_next(t, &r, &err) < -1) abort();
    df_trace_close(t);
    return 0;
}
