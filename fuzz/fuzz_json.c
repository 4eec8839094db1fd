/* fuzz_json.c - libFuzzer target for the JSON reader used by every parser. */
#include "json.h"

#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    df_error err = {0};
    json_doc *d = json_parse((const char *)data, size, &err);
    if (!d && !err.msg[0]) abort();
    json_free(d);
    return 0;
}
