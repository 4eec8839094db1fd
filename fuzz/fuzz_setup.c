/* fuzz_setup.c - libFuzzer target for the parsers of `deltafin setup`
 * (src/app/setup_parse.c, src/base/http.c, src/store/expert_manifest.c):
 * the first byte picks HTTP header lines (the rest split at newlines, fed
 * to one header state), a streamed install's expert manifest, or a tree
 * listing page (JSON) and the path rule. */
#include "expert_manifest.h"
#include "setup_parse.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* An accepted path never leaves the install: not absolute, and no
 * component is empty, "." or "..". */
static int inside(const char *p)
{
    if (p[0] == '/') return 0;
    for (const char *s = p;;) {
        const char *e = strchr(s, '/');
        size_t k = e ? (size_t)(e - s) : strlen(s);
        if (!k || (k == 1 && s[0] == '.') || (k == 2 && s[0] == '.' && s[1] == '.')) return 0;
        if (!e) return 1;
        s = e + 1;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!size) return 0;
    const char *p = (const char *)data + 1;
    size_t n = size - 1;
    if (data[0] & 1) {
        http_hdrs h = {.retry_after = -1};
        while (n) {
            const char *nl = memchr(p, '\n', n);
            size_t k = nl ? (size_t)(nl - p) + 1 : n;
            http_header_line(&h, p, k);
            if (strlen(h.next) >= sizeof h.next || strlen(h.range) >= sizeof h.range) abort();
            p += k, n -= k;
        }
        return 0;
    }
    df_error err = {0};
    if (data[0] & 2) {
        /* an accepted manifest only names experts inside its shards */
        expert_manifest m;
        if (expert_manifest_parse(p, n, &m, &err)) return 0;
        for (size_t k = 0; k < (size_t)m.n_layers * (size_t)m.n_experts; k++) {
            if (m.shard[k] < 0) continue;
            if (m.shard[k] >= m.n_shards || m.off[k] + m.len[k] > m.shards[m.shard[k]].size || !m.len[k]) abort();
        }
        for (int i = 0; i < m.n_shards; i++)
            if (strchr(m.shards[i].name, '/')) abort();
        expert_manifest_free(&m);
        return 0;
    }
    json_doc *d = json_parse(p, n, &err);
    if (!d) return 0;
    setup_file *files = NULL;
    int nf = 0, cap = 0;
    if (setup_listing_entries(json_root(d), &files, &nf, &cap, "fuzz", &err) == 0)
        for (int i = 0; i < nf; i++)
            if (!inside(files[i].path)) abort();
    setup_files_free(files, nf);
    json_free(d);
    return 0;
}
