/* fuzz_safetensors.c - libFuzzer target: arbitrary bytes as a whole
 * safetensors file.  The parser must return 0 or -1 with a message, never
 * crash, leak or read out of bounds (ASan + UBSan).  On success the table's
 * invariants are re-checked. */
#include "safetensors.h"
#include "util.h"

#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    st_file f;
    df_error err = {0};
    if (st_parse(data, size, size, "fuzz.safetensors", &f, &err) == 0) {
        for (size_t i = 0; i < f.n_tensors; i++) {
            const st_tensor *t = &f.tensors[i];
            if (t->offset < f.data_start || t->offset + t->nbytes > size) abort();
            if (st_find(&f, t->name) != t) abort();
        }
        st_deinit(&f);
    } else if (!err.msg[0]) {
        abort();
    }
    return 0;
}
