/* fuzz_config.c - libFuzzer target: arbitrary bytes as config.json.  The K3
 * config parser must accept or reject with a message, never crash or leak;
 * accepted configs must satisfy the invariants the engine relies on. */
#include "model.h"
#include "util.h"

#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    k3_config c;
    df_error err = {0};
    if (k3_config_parse((const char *)data, size, &c, &err) == 0) {
        if (c.k > c.E || c.Lt % 32 || c.I % 32 || c.Hk > c.Dk || c.P != c.Hk * c.Dk) abort();
        for (int L = 0; L < c.NL; L++)
            if (c.layer_kind[L] > LAYER_MLA) abort();
        k3_config_free(&c);
    } else if (!err.msg[0]) {
        abort();
    }
    return 0;
}
