#!/usr/bin/env bash
# check_layers.sh - src/ is in folders along the data path, one layer each
# (HACKING.md): a file may include headers of its own layer or lower ones
# only, and no source file is over 1,500 lines.  Run by `make check`;
# exit status 1 with the offending lines otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."
declare -A LAYER=([base]=0 [formats]=1 [text]=1 [grammar]=1 [kernels]=2 [store]=2 [model]=3 [engine]=4 [app]=5)
declare -A H   # header name -> its layer
bad=0
for d in src/*/; do
    d=${d%/}; name=${d#src/}
    if [ -z "${LAYER[$name]+x}" ]; then echo "check_layers: folder $d has no layer (add it here and to HACKING.md)"; bad=1; continue; fi
    for h in "$d"/*.h; do [ -e "$h" ] && H[$(basename "$h")]=${LAYER[$name]}; done
done
for f in src/*.c src/*.h; do [ -e "$f" ] && { echo "check_layers: $f is outside the layer folders"; bad=1; }; done
for path in src/*/*.c src/*/*.h; do
    dir=$(dirname "$path"); mine=${LAYER[${dir#src/}]:-9}
    while IFS= read -r inc; do
        if [ -z "${H[$inc]+x}" ]; then echo "check_layers: $path includes \"$inc\", which is in no layer folder"; bad=1; continue; fi
        if [ "${H[$inc]}" -gt "$mine" ]; then
            echo "check_layers: $path (L$mine) includes \"$inc\" (L${H[$inc]}): a higher layer"; bad=1
        fi
    done < <(sed -n 's/^#include "\([^"]*\)".*/\1/p' "$path")
    n=$(wc -l < "$path")
    if [ "$n" -gt 1500 ]; then echo "check_layers: $path has $n lines (more than 1,500)"; bad=1; fi
done
[ $bad = 0 ] && echo "check_layers: $(ls src/*/*.[ch] | wc -l) files in $(ls -d src/*/ | wc -l) layer folders; every include goes to the same or a lower layer"
exit $bad
