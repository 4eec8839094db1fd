#!/usr/bin/env bash
# check_layers.sh - the shape rules of HACKING.md, run by `make check`.
# Fails (exit status 1, the offending lines printed) when:
#   - a file under src/ (any depth) includes a header of a higher layer, a
#     header in no layer folder, or sits outside the layer folders;
#   - a source file is over 1,500 lines;
#   - a function in src/ or tools/ (tools/train excepted: not C of ours) has
#     a body over 150 lines (a brace-depth scan of top-level bodies);
#   - two files of src/ form a circle: each calls a function that only the
#     other defines, read from the symbol tables of their objects (nm on
#     $BUILD/<file>.o; `make all` first when an object is missing or older
#     than its source).
# An exception is allowed only from the lists below, each with its reason,
# which is printed on every run.  Keep the lists short and empty them.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
MAX_LINES=1500
MAX_FUNC=150

# Functions over MAX_FUNC lines, allowed for now: "file function: reason".
FUNC_ALLOW=(
)

# Circles allowed: "a b: reason" (a and b are file names without .c).
CIRCLE_ALLOW=(
    # by design
    "kernels_avx512 kernels_ref: the ISA table is chosen once in kernels_ref.c (kernels_avx512() gives its table), and the AVX-512 file takes the reference's kernels for what it does not vectorize (kernels_ref(), kernels_cpu_has()): a dispatch table (kernels.h)"
    "grammar grammar_match: one module over grammar_impl.h cut by concern (build / match): freeing a grammar frees the matcher's token classes, and the matcher asks the builder's gr_viable"
)

declare -A LAYER=([base]=0 [formats]=1 [text]=1 [grammar]=1 [kernels]=2 [store]=2 [model]=3 [engine]=4 [research]=5 [app]=6)
declare -A H   # header name -> its layer
bad=0
for d in src/*/; do
    d=${d%/}; name=${d#src/}
    if [ -z "${LAYER[$name]+x}" ]; then echo "check_layers: folder $d has no layer (add it here and to HACKING.md)"; bad=1; continue; fi
    while IFS= read -r h; do H[$(basename "$h")]=${LAYER[$name]}; done < <(find "$d" -name '*.h')
done
while IFS= read -r f; do echo "check_layers: $f is outside the layer folders"; bad=1; done < <(find src -maxdepth 1 -type f)
mapfile -t SRC < <(find src -mindepth 2 -name '*.[ch]' | sort)
# The model-family seam (src/model/family.h): each family's folder under
# src/model/ is its own; its headers are included by its folder and by the
# top-level folders FAMILY_USERS names (the engine is K3's: it schedules
# K3's passes), never by src/model/'s general files, another family or any
# other layer, which reach a family through family.h's table.
declare -A FAMILY_USERS=([k3]="engine" [qwen3]="")
declare -A FH  # header name -> its family folder
for d in src/model/*/; do
    fam=${d%/}; fam=${fam##*/}
    if [ -z "${FAMILY_USERS[$fam]+x}" ]; then echo "check_layers: family folder $d is not in FAMILY_USERS"; bad=1; continue; fi
    while IFS= read -r h; do FH[$(basename "$h")]=$fam; done < <(find "$d" -name '*.h')
done
for path in "${SRC[@]}"; do
    top=${path#src/}; top=${top%%/*}; mine=${LAYER[$top]:-9}
    while IFS= read -r inc; do
        if [ -z "${H[$inc]+x}" ]; then echo "check_layers: $path includes \"$inc\", which is in no layer folder"; bad=1; continue; fi
        if [ "${H[$inc]}" -gt "$mine" ]; then
            echo "check_layers: $path (L$mine) includes \"$inc\" (L${H[$inc]}): a higher layer"; bad=1
        fi
        if [ -n "${FH[$inc]+x}" ]; then
            fam=${FH[$inc]}
            case $path in
                src/model/"$fam"/*) ;;
                src/model/*) echo "check_layers: $path includes \"$inc\", a header of the $fam family (src/model/$fam/): use family.h"; bad=1 ;;
                *) if [[ " ${FAMILY_USERS[$fam]} " != *" $top "* ]]; then
                       echo "check_layers: $path includes \"$inc\", a header of the $fam family (src/model/$fam/): use family.h"; bad=1
                   fi ;;
            esac
        fi
    done < <(sed -n 's/^#include "\([^"]*\)".*/\1/p' "$path")
    n=$(wc -l < "$path")
    if [ "$n" -gt $MAX_LINES ]; then echo "check_layers: $path has $n lines (more than 1,500)"; bad=1; fi
done

# --- functions over MAX_FUNC lines ---------------------------------------
# funclen prints "FILE LINE NAME N" for each top-level function body: LINE
# is its opening brace, N its lines through the closing brace.  Comments,
# strings, character literals and preprocessor lines are skipped.
funclen() {
    awk '
    FNR == 1 { depth = 0; incom = 0; hdr = ""; pp = 0; isfn = 0 }
    {
        line = $0
        if (!incom && (pp || line ~ /^[ \t]*#/)) { pp = (line ~ /\\$/); next }
        n = length(line); i = 1
        while (i <= n) {
            c = substr(line, i, 1); c2 = substr(line, i, 2)
            if (incom) { if (c2 == "*/") { incom = 0; i += 2; continue } i++; continue }
            if (c2 == "/*") { incom = 1; i += 2; continue }
            if (c2 == "//") break
            if (c == "\"" || c == "\047") {
                q = c; i++
                while (i <= n) { d = substr(line, i, 1); if (d == "\\") { i += 2; continue } if (d == q) break; i++ }
                i++; if (depth == 0) hdr = hdr "x"; continue
            }
            if (c == "{") {
                if (depth == 0) {
                    isfn = (hdr ~ /\)[ \t]*$/ && hdr !~ /=/)
                    if (isfn) { name = hdr; sub(/[ \t]*\(.*/, "", name); sub(/.*[^A-Za-z0-9_]/, "", name); start = FNR }
                }
                depth++
            } else if (c == "}") {
                depth--
                if (depth == 0) {
                    if (isfn) print FILENAME, start, name, FNR - start + 1
                    isfn = 0; hdr = ""
                }
            } else if (depth == 0) {
                if (c == ";") hdr = ""; else hdr = hdr c
            }
            i++
        }
        if (depth == 0 && hdr != "") hdr = hdr " "
    }' "$@"
}
declare -A FALLOW
for a in "${FUNC_ALLOW[@]}"; do k=${a%%:*}; FALLOW[$k]=${a#*: }; done
n_func=0
while read -r file line fn len; do
    n_func=$((n_func + 1))
    [ "$len" -gt $MAX_FUNC ] || continue
    if [ -n "${FALLOW[$file $fn]+x}" ]; then
        echo "check_layers: allowed: $file:$line $fn has $len lines: ${FALLOW[$file $fn]}"
        unset "FALLOW[$file $fn]"
    else
        echo "check_layers: $file:$line $fn has $len lines (more than $MAX_FUNC): split it"; bad=1
    fi
done < <(funclen $(find src tools -name '*.c' -not -path 'tools/train/*' | sort))
for k in "${!FALLOW[@]}"; do echo "check_layers: FUNC_ALLOW lists \"$k\", which is not over $MAX_FUNC lines (or gone): drop it"; bad=1; done

# --- circles between two files (symbol tables) ---------------------------
mapfile -t CSRC < <(find src -mindepth 2 -name '*.c' | sort)
stale=0
for f in "${CSRC[@]}"; do
    o=$BUILD/$(basename "$f" .c).o
    if [ ! -f "$o" ] || [ "$f" -nt "$o" ]; then stale=1; break; fi
done
if [ $stale = 1 ]; then
    echo "check_layers: building the objects for the symbol tables (make all)"
    ${MAKE:-make} --no-print-directory -s BUILD="$BUILD" all >/dev/null
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for f in "${CSRC[@]}"; do
    b=$(basename "$f" .c); o=$BUILD/$b.o
    [ -f "$o" ] || { echo "check_layers: $o is missing (is $f in the Makefile?)"; bad=1; continue; }
    nm --defined-only -g "$o" | awk -v b="$b" '$2 == "T" {print $3, b}' >> "$tmp/def"
    nm -u "$o" | awk -v b="$b" '{print $NF, b}' >> "$tmp/use"
done
touch "$tmp/def" "$tmp/use"
# function -> the one file that defines it
awk '{c[$1]++; o[$1] = $2} END {for (s in c) if (c[s] == 1) print s, o[s]}' "$tmp/def" | sort > "$tmp/def1"
sort "$tmp/use" > "$tmp/use.s"
# "caller callee: functions" for each pair in a circle, caller < callee
join "$tmp/use.s" "$tmp/def1" | awk '$2 != $3 {k = $2 " " $3; e[k] = n[k]++ ? e[k] "," $1 : $1}
    END {for (k in e) {split(k, p, " "); r = p[2] " " p[1]; if ((r in e) && p[1] < p[2]) print p[1], p[2], e[k], e[r]}}' \
    | sort > "$tmp/circles"
declare -A CALLOW
for a in "${CIRCLE_ALLOW[@]}"; do k=${a%%:*}; CALLOW[$k]=${a#*: }; done
n_circle=0
while read -r a b ab ba; do
    n_circle=$((n_circle + 1))
    if [ -n "${CALLOW[$a $b]+x}" ]; then
        echo "check_layers: allowed circle $a.c <-> $b.c: ${CALLOW[$a $b]}"
        unset "CALLOW[$a $b]"
    else
        echo "check_layers: circle $a.c <-> $b.c: $a calls $ab, $b calls $ba (move a function, add a third file, or pass a callback)"; bad=1
    fi
done < "$tmp/circles"
for k in "${!CALLOW[@]}"; do echo "check_layers: CIRCLE_ALLOW lists \"$k\", which is no circle: drop it"; bad=1; done

[ $bad = 0 ] && echo "check_layers: ${#SRC[@]} files in $(ls -d src/*/ | wc -l) layer folders; every include goes to the same or a lower layer;" \
    "$n_func functions, none over $MAX_FUNC lines unless listed; $n_circle circles between files, each listed"
exit $bad
