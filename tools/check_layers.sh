#!/usr/bin/env bash
# check_layers.sh - no file includes a header of a higher layer, and no
# source file is over 1,500 lines (HACKING.md's layer table, as data).
# Run by `make check`.  Exit status 1 with the offending lines otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."
declare -A L
for f in util df_error df_plan threadpool json json_write file; do L[$f]=0; done
for f in safetensors quant mathfn gguf tokenizer chat_template sampler; do L[$f]=1; done
for f in kernels kernels_ref kernels_avx2 kernels_avx512 kernels_drivers backend_cpu expert_store expert_cache heat \
         prefetch_timing; do L[$f]=2; done
for f in model model_gguf attnres kda mla moe prefetch expert_fetch plan; do L[$f]=3; done
for f in engine engine_impl trunk_stream place cachesim iobench; do L[$f]=4; done
for f in cli cli_chat cli_bench options server server_impl server_request server_emit lineedit; do L[$f]=5; done
# files still over the size limit, each with the reason; the list only shrinks
declare -A OVERSIZE_OK=()
bad=0
for path in src/*.c src/*.h; do
    base=$(basename "$path"); base=${base%.*}
    if [ -z "${L[$base]+x}" ]; then echo "check_layers: $path has no layer (add it to tools/check_layers.sh and HACKING.md)"; bad=1; continue; fi
    mine=${L[$base]}
    while IFS= read -r inc; do
        h=${inc%.h}
        if [ -z "${L[$h]+x}" ]; then echo "check_layers: $path includes \"$inc\", which has no layer"; bad=1; continue; fi
        if [ "${L[$h]}" -gt "$mine" ]; then
            echo "check_layers: $path (L$mine) includes \"$inc\" (L${L[$h]}): a higher layer"; bad=1
        fi
    done < <(sed -n 's/^#include "\([^"]*\)".*/\1/p' "$path")
    n=$(wc -l < "$path")
    if [ "$n" -gt 1500 ]; then
        if [ -n "${OVERSIZE_OK[$path]+x}" ]; then echo "check_layers: note: $path has $n lines (${OVERSIZE_OK[$path]})"
        else echo "check_layers: $path has $n lines (more than 1,500)"; bad=1; fi
    fi
done
[ $bad = 0 ] && echo "check_layers: every include goes to the same or a lower layer"
exit $bad
