/*
 * k3gen safetensors writer: assigns the roster to shards, writes each
 * model-NNNNN-of-NNNNNN.safetensors (8-byte little-endian header length,
 * JSON header, data) and model.safetensors.index.json.
 * Invariants:
 *  - a shard holds the F32, then BF16, then U8 group, each strcmp-sorted, no
 *    gaps, so an expert's six tensors are contiguous; a layer (so all its
 *    experts) never spans shards; embed_tokens is in the first shard,
 *    lm_head/model.norm/output_* in the last.
 *  - --shards N splits the layers by count (as k3-tiny-a: 5,4,4); otherwise a
 *    new shard starts before a layer that would push one past --shard-max-mb.
 *  - the index json is written last, so its presence means the directory is
 *    complete.
 */
#include "k3gen.h"

/* ----------------------------------------------------------- shards/index */

static int cmp_in_shard(const void *a, const void *b)
{
    const tensor *x = *(const tensor *const *)a, *y = *(const tensor *const *)b;
    if (x->dtype != y->dtype)
        return x->dtype - y->dtype;
    return strcmp(x->name, y->name);
}

int cmp_by_name(const void *a, const void *b)
{
    const tensor *x = *(const tensor *const *)a, *y = *(const tensor *const *)b;
    return strcmp(x->name, y->name);
}

/* Assign tensors to shards; returns the number of shards. */
int assign_shards(const model_cfg *c, tensor_list *tl, int shards, long shard_max_mb)
{
    const long ngroups = c->num_hidden_layers + 2;
    uint64_t *gbytes = calloc((size_t)ngroups, sizeof *gbytes);
    int *gshard = calloc((size_t)ngroups, sizeof *gshard);
    if (!gbytes || !gshard)
        die("out of memory");
    for (size_t i = 0; i < tl->n; i++)
        gbytes[tl->t[i].group] += tensor_bytes(&tl->t[i]);
    int nshards;
    if (shards > 0) {
        long NL = c->num_hidden_layers;
        if (shards > NL)
            die("--shards %d exceeds the number of layers (%ld); a layer never spans shards",
                shards, NL);
        /* the first NL % shards shards get one extra layer (13 / 3 -> 5, 4, 4 as k3-tiny-a) */
        long base = NL / shards, extra = NL % shards, l = 0;
        for (int s = 0; s < shards; s++) {
            long cnt = base + (s < extra ? 1 : 0);
            for (long k = 0; k < cnt; k++, l++)
                gshard[1 + l] = s;
        }
        gshard[0] = 0;
        gshard[ngroups - 1] = shards - 1;
        nshards = shards;
    } else {
        uint64_t max = (uint64_t)shard_max_mb << 20, cur = 0;
        int s = 0;
        for (long g = 0; g < ngroups; g++) {
            if (gbytes[g] > max && g > 0 && g < ngroups - 1)
                fprintf(stderr, "k3gen: note: layer %ld alone is %.1f MiB, over --shard-max-mb %ld; "
                        "it gets a shard of its own\n", g - 1, (double)gbytes[g] / (1 << 20), shard_max_mb);
            if (cur > 0 && cur + gbytes[g] > max) {
                s++;
                cur = 0;
            }
            gshard[g] = s;
            cur += gbytes[g];
        }
        nshards = s + 1;
    }
    for (size_t i = 0; i < tl->n; i++)
        tl->t[i].shard = gshard[tl->t[i].group];
    free(gbytes);
    free(gshard);
    return nshards;
}

static void shard_name(char *buf, size_t n, int idx, int total)
{
    snprintf(buf, n, "model-%05d-of-%06d.safetensors", idx + 1, total);
}

/* Writes every shard; returns the total data bytes. */
uint64_t write_shards(const char *dir, tensor_list *tl, int nshards, uint64_t seed,
                             int dry_run)
{
    tensor **order = xmalloc(tl->n * sizeof *order);
    unsigned char *buf = dry_run ? NULL : xmalloc(CHUNK_BYTES);
    uint64_t total = 0;
    for (int s = 0; s < nshards; s++) {
        size_t cnt = 0;
        for (size_t i = 0; i < tl->n; i++)
            if (tl->t[i].shard == s)
                order[cnt++] = &tl->t[i];
        if (cnt == 0)
            die("internal: shard %d is empty", s + 1);
        qsort(order, cnt, sizeof *order, cmp_in_shard);
        sbuf hdr = {0};
        uint64_t off = 0;
        sb_add(&hdr, "{");
        for (size_t i = 0; i < cnt; i++) {
            tensor *t = order[i];
            t->offset = off;
            uint64_t nb = tensor_bytes(t);
            sb_json_str(&hdr, t->name);
            sb_printf(&hdr, ":{\"dtype\":\"%s\",\"shape\":[", dtype_names[t->dtype]);
            for (int d = 0; d < t->ndim; d++)
                sb_printf(&hdr, "%s%lld", d ? "," : "", (long long)t->shape[d]);
            sb_printf(&hdr, "],\"data_offsets\":[%llu,%llu]},", (unsigned long long)off,
                      (unsigned long long)(off + nb));
            off += nb;
        }
        sb_add(&hdr, "\"__metadata__\":{\"format\":\"pt\"}}");
        while (hdr.len % 8)
            sb_add(&hdr, " ");
        total += off;
        if (!dry_run) {
            char name[64];
            shard_name(name, sizeof name, s, nshards);
            out_file o = out_open(dir, name);
            unsigned char len8[8];
            for (int i = 0; i < 8; i++)
                len8[i] = (unsigned char)((uint64_t)hdr.len >> (8 * i));
            write_all(o.f, len8, 8, o.tmp_path);
            write_all(o.f, hdr.buf, hdr.len, o.tmp_path);
            for (size_t i = 0; i < cnt; i++)
                write_tensor_data(o.f, o.tmp_path, order[i], seed, buf);
            out_close(&o);
        }
        free(hdr.buf);
    }
    free(order);
    free(buf);
    return total;
}

void write_index(const char *dir, tensor_list *tl, int nshards, uint64_t total)
{
    tensor **order = xmalloc(tl->n * sizeof *order);
    for (size_t i = 0; i < tl->n; i++)
        order[i] = &tl->t[i];
    qsort(order, tl->n, sizeof *order, cmp_by_name);
    sbuf sb = {0};
    sb_printf(&sb, "{\n  \"metadata\": {\n    \"total_size\": %llu\n  },\n  \"weight_map\": {\n",
              (unsigned long long)total);
    for (size_t i = 0; i < tl->n; i++) {
        char name[64];
        shard_name(name, sizeof name, order[i]->shard, nshards);
        sb_add(&sb, "    ");
        sb_json_str(&sb, order[i]->name);
        sb_add(&sb, ": ");
        sb_json_str(&sb, name);
        sb_add(&sb, i + 1 < tl->n ? ",\n" : "\n");
    }
    sb_add(&sb, "  }\n}");
    write_text_file(dir, "model.safetensors.index.json", sb.buf, sb.len);
    free(sb.buf);
    free(order);
}

