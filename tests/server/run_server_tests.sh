#!/usr/bin/env bash
# run_server_tests.sh - end-to-end tests of `deltafin serve` on the tiny test model.
#
# Starts two servers on free loopback ports (one with --queue 4 --max-request-bytes 1M,
# one with --api-key), waits for /health, runs curl checks (among them the SDK
# request fixtures in fixtures/ and a 200 MiB body), the slow-client test
# (slowloris_test.mjs, on a third server with --conn-timeout 2), the chat page in
# headless Chromium (page_test.mjs: needs Debian's chromium package), the SDK
# tests in server_test.mjs, the Responses API in responses_test.mjs (on a server of
# its own), drafts on vs off (draft_test.mjs), structured output on the default model
# (run_schema_tests.sh: structured_test.mjs and schema_property_test.mjs) (needs `npm ci --prefix tests/server`; works offline
# afterwards), and stops the servers.  Usage: tests/server/run_server_tests.sh [build/deltafin]
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=${1:-build/deltafin}
MODEL=testdata/k3-tiny-a/checkpoint
LOG=$(mktemp -d)
fail=0
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done; rm -rf "$LOG"; }
trap cleanup EXIT

[ -x "$BIN" ] || { echo "server: $BIN not built"; exit 1; }
[ -d tests/server/node_modules ] || { echo "server: run 'npm ci --prefix tests/server' first"; exit 1; }

# the output layer on scripted model output (tool calls: the random test model never makes one)
BDIR=$(dirname "$BIN")
SAN=
if grep -qa __asan_init "$BIN"; then SAN="-fsanitize=address,undefined"; fi
LIBS=$(make -s --no-print-directory print-ldlibs) # what libdeltafin.a needs (curl, uring, MPI where built in)
${CC:-cc} -std=c11 -O1 -g -pthread $SAN -Wall -Wextra -Wshadow -Wstrict-prototypes -Wmissing-prototypes -Wpointer-arith \
    -Wcast-qual -Wvla -Wformat=2 -Werror $(for d in src/*/; do printf -- "-I%s " "${d%/}"; done) -Itests tests/server/test_server_emit.c tests/harness.c "$BDIR/libdeltafin.a" "$BDIR/web_page.o" \
    $LIBS -lutil \
    -o "$LOG/test_server_emit"
"$LOG/test_server_emit" || fail=1

free_port() { node -e 'const s=require("net").createServer();s.listen(0,"127.0.0.1",()=>{console.log(s.address().port);s.close()})'; }

start() { # start PORT ARGS...: starts a server, waits for /health
    local port=$1; shift
    "$BIN" serve --model "$MODEL" --port "$port" "$@" >"$LOG/server-$port.log" 2>&1 &
    pids+=($!)
    for _ in $(seq 1 100); do
        if curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1; then return 0; fi
        kill -0 "${pids[-1]}" 2>/dev/null || { cat "$LOG/server-$port.log"; echo "server: did not start"; exit 1; }
        sleep 0.1
    done
    echo "server: /health did not come up on port $port"; cat "$LOG/server-$port.log"; exit 1
}

P1=$(free_port); start "$P1" --queue 4 --max-request-bytes 1M --parallel 2
PID1=${pids[-1]}
P2=$(free_port); start "$P2" --api-key test-key --parallel 1
U=http://127.0.0.1:$P1

check() { # check NAME EXPECTED ACTUAL
    if [ "$2" = "$3" ]; then echo "ok - curl: $1"; else echo "not ok - curl: $1: expected '$2', got '$3'"; fail=1; fi
}
check "health 200" 200 "$(curl -s -o /dev/null -w '%{http_code}' "$U/health")"
check "page at /" 200 "$(curl -s -o /dev/null -w '%{http_code}' "$U/")"
# the page is the committed bundle (web/dist/index.html.gz, compiled in) sent as it is to a client
# taking gzip; one that does not take it gets a page saying so (200, never the compressed bytes)
gzip -dc web/dist/index.html.gz >"$LOG/page.want"
check "page at / with gzip: the committed bundle" "gzip same" \
    "$(curl -s -D "$LOG/page.hdr" --compressed -o "$LOG/page.got" "$U/" && grep -qi '^content-encoding: gzip' "$LOG/page.hdr" && echo gzip || echo plain) $(cmp -s "$LOG/page.want" "$LOG/page.got" && echo same || echo differs)"
check "page at / without gzip: a page naming --compressed" "200 1" \
    "$(curl -s -o "$LOG/page.plain" -w '%{http_code}' "$U/") $(grep -c -- '--compressed' "$LOG/page.plain")"
for ae in 'gzip;q=0' 'identity' '*;q=0, deflate'; do
    check "Accept-Encoding: $ae: not gzip" 0 "$(curl -s -D - -o /dev/null -H "Accept-Encoding: $ae" "$U/" | grep -ci '^content-encoding: gzip')"
done
for ae in 'br, gzip;q=0.5' 'x-gzip' '*' 'GZIP'; do
    check "Accept-Encoding: $ae: gzip" 1 "$(curl -s -D - -o /dev/null -H "Accept-Encoding: $ae" "$U/" | grep -ci '^content-encoding: gzip')"
done
check "metrics has tokens" 1 "$(curl -s "$U/metrics" | grep -c '^deltafin_generated_tokens_total ')"
check "malformed JSON 400" 400 "$(curl -s -o /dev/null -w '%{http_code}' -d '{"messages":' "$U/v1/chat/completions")"
check "413 over --max-request-bytes" 413 "$(head -c 2000000 /dev/zero | tr '\0' a | curl -s -o /dev/null -w '%{http_code}' --data-binary @- "$U/v1/chat/completions")"
check "401 without key" 401 "$(curl -s -o /dev/null -w '%{http_code}' -d '{}' "http://127.0.0.1:$P2/v1/chat/completions")"
check "/v1/responses: 401 without key" 401 "$(curl -s -o /dev/null -w '%{http_code}' -d '{"input":"hi"}' "http://127.0.0.1:$P2/v1/responses")"
check "/v1/responses: Bearer key accepted" 200 "$(curl -s -o /dev/null -w '%{http_code}' -H 'Authorization: Bearer test-key' -d '{"input":"hi","max_output_tokens":2}' "http://127.0.0.1:$P2/v1/responses")"
check "x-api-key accepted" 200 "$(curl -s -o /dev/null -w '%{http_code}' -H 'x-api-key: test-key' -d '{"max_tokens":2,"messages":[{"role":"user","content":"hi"}]}' "http://127.0.0.1:$P2/v1/messages")"
check "SSE content type" "text/event-stream" "$(curl -s -o /dev/null -w '%{content_type}' -d '{"stream":true,"max_tokens":2,"messages":[{"role":"user","content":"hi"}]}' "$U/v1/chat/completions")"
check "stream ends with [DONE]" "data: [DONE]" "$(curl -sN -d '{"stream":true,"max_tokens":3,"messages":[{"role":"user","content":"hi"}]}' "$U/v1/chat/completions" | grep -v '^$' | tail -1)"

# the exact bodies the SDKs send (captured by capture_fixtures.mjs), replayed as they are
for f in tests/server/fixtures/*.json; do
    name=$(basename "$f" .json)
    # responses.* (the Codex-shaped body) needs a larger context: responses_test.mjs replays it
    case $name in chat.*) ep=chat/completions ;; completions.*) ep=completions ;; messages.*) ep=messages ;; *) continue ;; esac
    code=$(curl -s -o "$LOG/fixture.out" -w '%{http_code}' -H 'Content-Type: application/json' --data-binary @"$f" "$U/v1/$ep")
    shape=$(node tests/server/check_fixture_reply.mjs "$name" "$LOG/fixture.out" || true)
    check "fixture $name: 200 and a valid response" "200 ok" "$code $shape"
done

# a 200 MiB body against --max-request-bytes 1M: 413 within seconds, whether the client
# announces its length or sends it chunked (read and dropped, so the reply is never lost to a
# reset while the client still sends); the server lives on
head -c 200M /dev/zero | tr '\0' ' ' >"$LOG/big.json"
t0=$(date +%s%N)
res=$(curl -s -o /dev/null -w '%{http_code} %{size_upload}' -H 'Content-Type: application/json' -H 'Expect:' -T "$LOG/big.json" -X POST "$U/v1/chat/completions" || true)
ms=$(( ($(date +%s%N) - t0) / 1000000 ))
code=${res%% *}
echo "# 200 MiB body with Content-Length: $code in $ms ms, $(echo "$res" | cut -d' ' -f2) bytes sent"
check "200 MiB body (Content-Length): 413 within 5 s" "413 fast" "$code $([ "$ms" -lt 5000 ] && echo fast || echo "slow (${ms} ms)")"
# read to its end and dropped (not refused while the client sends, which a reset can overtake)
check "200 MiB body (Content-Length): the whole body read before the 413" "209715200" "$(echo "$res" | cut -d' ' -f2)"
t0=$(date +%s%N)
code=$(curl -s -o /dev/null -w '%{http_code}' -H 'Content-Type: application/json' -H 'Transfer-Encoding: chunked' -T "$LOG/big.json" -X POST "$U/v1/messages" || true)
ms=$(( ($(date +%s%N) - t0) / 1000000 ))
echo "# 200 MiB body chunked: $code in $ms ms"
check "200 MiB body (chunked): 413 within 10 s" "413 fast" "$code $([ "$ms" -lt 10000 ] && echo fast || echo "slow (${ms} ms)")"
rm -f "$LOG/big.json"
# a 10 GiB body announced with "Expect: 100-continue" (what curl sends for a large upload): the
# 413 comes before any of it is sent, and nothing is read
t0=$(date +%s%N)
code=$(head -c 4096 /dev/zero | curl -s -o /dev/null -w '%{http_code}' -H 'Content-Type: application/json' \
    -H 'Expect: 100-continue' -H 'Content-Length: 10737418240' --data-binary @- --max-time 20 "$U/v1/chat/completions" || true)
ms=$(( ($(date +%s%N) - t0) / 1000000 ))
echo "# 10 GiB announced, Expect: 100-continue: $code in $ms ms"
check "10 GiB announced with Expect: 100-continue: 413 before the body" "413 fast" "$code $([ "$ms" -lt 5000 ] && echo fast || echo "slow (${ms} ms)")"
# without --max-request-bytes the body cap is derived from the context and a document's base64
# (the api-key server: the size is refused before the key is asked for); it is at most 128 MiB,
# so a 135 MB prompt is refused at once
B30=$(head -c 135000000 /dev/zero | tr '\0' a | curl -s -w ' %{http_code}' --data-binary @- "http://127.0.0.1:$P2/v1/completions")
check "135 MB body, no --max-request-bytes: 413 naming --ctx" "413 ctx" \
    "$(echo "$B30" | grep -o '[0-9]*$') $(echo "$B30" | grep -q 'derived from --ctx' && echo ctx || echo "$B30" | head -c 200)"
# the derived cap counts a document's base64 (4 / 3 of 32 MiB): a 20 MB body passes the size
# check (the key is asked for next: 401), where 1 MiB + 8 x the text alone (~9 MB at 64K) refused it
B20=$(head -c 20000000 /dev/zero | tr '\0' a | curl -s -o /dev/null -w '%{http_code}' --data-binary @- "http://127.0.0.1:$P2/v1/completions")
check "20 MB body, no --max-request-bytes: within the cap a document needs (401: the key)" 401 "$B20"
check "alive after the 200 MiB bodies" 200 "$(curl -s -o /dev/null -w '%{http_code}' -d '{"max_tokens":2,"messages":[{"role":"user","content":"hi"}]}' "$U/v1/chat/completions")"

# RSS is meaningless under AddressSanitizer (freed memory sits in its quarantine)
RSS_PID=$PID1
if grep -qa __asan_init "$BIN"; then RSS_PID=; echo "# sanitizer build: RSS check skipped"; fi
# keep-alive: a long prefill one position at a time must send SSE comment pings
P3=$(free_port); start "$P3" --batch 1 --threads 1 --ping-ms 100
node -e 'console.log(JSON.stringify({prompt: "hello world ".repeat(300), max_tokens: 2, stream: true}))' >"$LOG/long.json"
curl -sN -d @"$LOG/long.json" "http://127.0.0.1:$P3/v1/completions" >"$LOG/long.sse" || true
pings=$(grep -c '^: ping' "$LOG/long.sse" || true)
check "SSE pings during a long prefill" yes "$([ "$pings" -ge 1 ] && echo yes || echo "no ($pings)")"
# ... and they say how far the prompt is (server.c progress_ping; the chat page's progress bar):
# one total (the prompt's ids, as /v1/completions counts them), ids done never going back, some
# pings inside the prompt
check "the pings carry the prompt's progress" ok "$(node -e '
const fs = require("fs"), t = fs.readFileSync(process.argv[1], "utf8");
const p = t.split("\n").filter((l) => l.startsWith(": ping {")).map((l) => JSON.parse(l.slice(7)));
const tot = new Set(p.map((x) => x.prompt_total)), usage = JSON.parse(fs.readFileSync(process.argv[2], "utf8"));
let ok = p.length >= 1 && tot.size === 1 && p[0].prompt_total === usage.prompt_tokens && p.some((x) => x.prompt_done > 0 && x.prompt_done < x.prompt_total);
for (let i = 1; i < p.length; i++) ok = ok && p[i].prompt_done >= p[i - 1].prompt_done && p[i].seconds >= p[i - 1].seconds;
console.log(ok ? "ok" : "bad: " + JSON.stringify(p.slice(0, 5)) + " of " + p.length);
' "$LOG/long.sse" <(curl -s -d "$(sed 's/"stream":true/"stream":false/' "$LOG/long.json")" "http://127.0.0.1:$P3/v1/completions" | node -e '
let s = ""; process.stdin.on("data", (d) => s += d).on("end", () => console.log(JSON.stringify(JSON.parse(s).usage)))'))"
PID3=${pids[-1]} # kept for the chat page's progress test (page_test.mjs), stopped after it
# what the live view reads: progress on every API, /metrics during a request, /v1/routes, /v1/plan
DELTAFIN_URL_PREFILL=http://127.0.0.1:$P3 DELTAFIN_BIN=$BIN NODE_PATH=tests/server/node_modules \
    node --test --test-reporter=spec tests/server/live_test.mjs || fail=1

# /v1/messages/count_tokens: the prompt /v1/messages renders, counted (no max_tokens needed)
CT=$(curl -s "$U/v1/messages/count_tokens" -d '{"model":"m","system":"be brief","messages":[{"role":"user","content":"count me"}]}' \
     | sed -n 's/.*"input_tokens":\([0-9]*\).*/\1/p')
MT=$(curl -s "$U/v1/messages" -d '{"model":"m","max_tokens":1,"system":"be brief","messages":[{"role":"user","content":"count me"}]}' \
     | sed -n 's/.*"input_tokens":\([0-9]*\),"cache_read_input_tokens":\([0-9]*\).*/\1 \2/p' | awk '{print $1 + $2}')
check "count_tokens equals the prompt /v1/messages evaluates" "$MT" "${CT:-none}"

# --timeout covers the prompt: a prefill longer than it ends as "timeout" (its own finish reason),
# what was evaluated kept for the same request sent again
P5=$(free_port); start "$P5" --batch 1 --threads 1 --timeout 1
node -e 'console.log(JSON.stringify({prompt: "hello world ".repeat(1500), max_tokens: 2}))' >"$LOG/long2.json"
fr=$(curl -s -d @"$LOG/long2.json" "http://127.0.0.1:$P5/v1/completions" | sed -n 's/.*"finish_reason":"\([a-z_]*\)".*/\1/p')
check "--timeout during a long prefill: finish_reason timeout" timeout "$fr"
check "--timeout during a prefill is logged with what was kept" 1 "$(grep -c -- '--timeout passed during its prompt: stopped after' "$LOG/server-$P5.log")"
kill "${pids[-1]}"; wait "${pids[-1]}" 2>/dev/null || true; unset 'pids[-1]'

# slow clients, on a server whose connections time out after 2 s
P4=$(free_port); start "$P4" --conn-timeout 2
DELTAFIN_URL_SLOW=http://127.0.0.1:$P4 NODE_PATH=tests/server/node_modules node --test --test-reporter=spec \
    tests/server/slowloris_test.mjs || fail=1
kill -0 "${pids[-1]}" 2>/dev/null || { echo "not ok - the --timeout 2 server died"; cat "$LOG/server-$P4.log"; fail=1; }
kill "${pids[-1]}"; wait "${pids[-1]}" 2>/dev/null || true; unset 'pids[-1]'

# the chat page (web/) in headless Chromium (Debian's chromium; a missing browser fails)
# (screenshots of its main states: $BUILD/page-shots)
DELTAFIN_URL=$U DELTAFIN_URL_PREFILL=http://127.0.0.1:$P3 PAGE_SHOTS=$BDIR/page-shots \
    NODE_PATH=tests/server/node_modules node --test --test-reporter=spec tests/server/page_test.mjs || fail=1
kill "$PID3"; wait "$PID3" 2>/dev/null || true

# the research wing's plots (trace stats|cache --svg) rendered by the same Chromium
"$BIN" run --model "$MODEL" --prompt "the plots of a route trace" --max-new 40 --trace "$LOG/plots.trace" --trace-lookahead 2 \
    >/dev/null 2>"$LOG/plots.log" || { echo "not ok - run --trace"; cat "$LOG/plots.log"; fail=1; }
"$BIN" trace stats "$LOG/plots.trace" --svg "$LOG/svg" >/dev/null && \
    "$BIN" trace cache "$LOG/plots.trace" --slots 2,8,32 --prior "$LOG/plots.trace" --svg "$LOG/svg" >/dev/null || { echo "not ok - trace --svg"; fail=1; }
SHAPE=$("$BIN" trace stats "$LOG/plots.trace" --json | node -e \
    'let s="";process.stdin.on("data",d=>s+=d).on("end",()=>{const j=JSON.parse(s);console.log(j.layers.length, j.experts)})')
"$BIN" run --model "$MODEL" --prompt "an attention map" --max-new 12 --dump-attention "$LOG/plots.attn" \
    --attn-top 4 >/dev/null 2>>"$LOG/plots.log" || { echo "not ok - run --dump-attention"; fail=1; }
ALAYER=$("$BIN" trace dump "$LOG/plots.attn" | sed -n 's/^{"attn":{"pos":[0-9]*,"layer":\([0-9]*\),.*/\1/p' | head -1)
ACELLS=$("$BIN" trace attention "$LOG/plots.attn" --layer "$ALAYER" --svg "$LOG/svg" | sed -n 's/.*: \([0-9]*\) weights.*/\1/p')
SVG_DIR=$LOG/svg SVG_LAYERS=${SHAPE% *} SVG_EXPERTS=${SHAPE#* } SVG_ATTN=attention-$ALAYER-0.svg SVG_ATTN_CELLS=$ACELLS \
    NODE_PATH=tests/server/node_modules node --test --test-reporter=spec tests/server/svg_test.mjs || fail=1

DELTAFIN_URL=$U DELTAFIN_URL_KEY=http://127.0.0.1:$P2 DELTAFIN_PID=$RSS_PID DELTAFIN_BIN=$BIN DELTAFIN_MODEL=$MODEL \
    NODE_PATH=tests/server/node_modules node --test --test-reporter=spec tests/server/server_test.mjs || fail=1
# documents (text, Markdown, PDF through poppler's pdftotext) in the three APIs and `run --attach`
DELTAFIN_URL=$U DELTAFIN_BIN=$BIN DELTAFIN_MODEL=$MODEL \
    NODE_PATH=tests/server/node_modules node --test --test-reporter=spec tests/server/docs_test.mjs || fail=1
# --spec-state in serve and chat: the learned state followed by the first request, and written back
DELTAFIN_BIN=$BIN DELTAFIN_MODEL=$MODEL \
    NODE_PATH=tests/server/node_modules node --test --test-reporter=spec tests/server/spec_state_test.mjs || fail=1

# the Responses API: a context that holds the Codex-shaped fixture (5.2K tokens on this
# tokenizer), a --max-tokens cap (Codex sends no max_output_tokens; the random model never
# stops) and a 10 ms ping interval (keepalive events during any prompt of a few thousand tokens)
PR=$(free_port); start "$PR" --ctx 16384 --max-tokens 64 --parallel 2 --ping-ms 10
DELTAFIN_URL_RESP=http://127.0.0.1:$PR NODE_PATH=tests/server/node_modules node --test --test-reporter=spec \
    tests/server/responses_test.mjs || fail=1
kill -0 "${pids[-1]}" 2>/dev/null || { echo "not ok - the responses server died"; cat "$LOG/server-$PR.log"; fail=1; }
kill "${pids[-1]}"; wait "${pids[-1]}" 2>/dev/null || true; unset 'pids[-1]'

# a model holding a NaN weight: a JSON error naming the layer (500, or an error event when
# streaming), never "logprob":nan; the server keeps answering
cp -r "$MODEL" "$LOG/nanm"
node tests/flip_tensor.mjs "$LOG/nanm" "layers.2.self_attn.o_proj.weight" 0 ff >/dev/null
node tests/flip_tensor.mjs "$LOG/nanm" "layers.2.self_attn.o_proj.weight" 1 ff >/dev/null
PN=$(free_port); MODEL_SAVE=$MODEL; MODEL=$LOG/nanm; start "$PN"; MODEL=$MODEL_SAVE
NAN1=$(curl -s -w ' %{http_code}' -d '{"max_tokens":3,"logprobs":true,"messages":[{"role":"user","content":"hi"}]}' "http://127.0.0.1:$PN/v1/chat/completions")
check "NaN weight: a 500 JSON error naming layer 2" "500 named" \
    "$(echo "$NAN1" | grep -o '[0-9]*$') $(echo "$NAN1" | grep -q '"error".*non-finite.*layer 2' && echo named || echo "$NAN1" | head -c 200)"
NAN2=$(curl -s -N -d '{"max_tokens":3,"stream":true,"messages":[{"role":"user","content":"hi"}]}' "http://127.0.0.1:$PN/v1/chat/completions")
check "NaN weight, streaming: an error event, no nan" "event clean" \
    "$(echo "$NAN2" | grep -q '^data: {"error".*non-finite' && echo event || echo none) $(echo "$NAN2" | grep -qi 'nan[,}]' && echo nan || echo clean)"
NAN3=$(curl -s -w ' %{http_code}' -d '{"model":"m","max_tokens":3,"messages":[{"role":"user","content":"hi"}]}' "http://127.0.0.1:$PN/v1/messages")
check "NaN weight, /v1/messages: an Anthropic error" "500 error" \
    "$(echo "$NAN3" | grep -o '[0-9]*$') $(echo "$NAN3" | grep -q '"type":"error"' && echo error || echo "$NAN3" | head -c 200)"
check "NaN weight: the server still answers /health" 200 "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$PN/health")"
kill "${pids[-1]}"; wait "${pids[-1]}" 2>/dev/null || true; unset 'pids[-1]'

# no --ctx: serve's default context (plan.c plan_serve_ctx) on the default model holds a
# coding agent's first request (10-17K tokens): 64K, and the plan line says why; a prompt
# past it is refused naming --ctx on every API
PD=$(free_port); MODEL_SAVE=$MODEL; MODEL=models/k3-mini; start "$PD"; MODEL=$MODEL_SAVE
CL=$(curl -s "http://127.0.0.1:$PD/v1/models" | grep -o '"context_length":[0-9]*' | grep -o '[0-9]*$' || echo 0)
check "no --ctx on $(basename models/k3-mini): context_length >= 65536" yes "$([ "${CL:-0}" -ge 65536 ] && echo yes || echo "no (${CL:-none})")"
check "no --ctx: the plan line gives the reason" 1 \
    "$(grep -c '^deltafin: plan: .*context 65536 tokens (default for serve: 64K fits beside the expert cache)' "$LOG/server-$PD.log" || true)"
node -e 'const t="x ".repeat(80000); for (const [f, b] of [["chat", {messages: [{role: "user", content: t}]}],
    ["completions", {prompt: t, max_tokens: 1}], ["messages", {model: "m", max_tokens: 1, messages: [{role: "user", content: t}]}],
    ["responses", {input: t}]]) require("fs").writeFileSync(process.argv[1] + "/over-" + f + ".json", JSON.stringify(b))' "$LOG"
for ep in chat/completions completions messages responses; do
    f=$LOG/over-${ep%%/*}.json
    R=$(curl -s -w ' %{http_code}' -H 'Content-Type: application/json' --data-binary @"$f" "http://127.0.0.1:$PD/v1/$ep")
    check "/v1/$ep: a prompt past the default context names --ctx" "400 named" \
        "$(echo "$R" | grep -o '[0-9]*$') $(echo "$R" | grep -q 'larger --ctx (now 65536)' && echo named || echo "$R" | head -c 300)"
done
kill "${pids[-1]}"; wait "${pids[-1]}" 2>/dev/null || true; unset 'pids[-1]'

# --parallel N is planned before the expert cache: on a model whose experts do not all fit,
# --parallel 3 at --mem 64M takes a little cache instead of being refused (it was: the
# cache had taken everything and the later sessions found no room)
"$(dirname "$BIN")/k3gen" --out "$LOG/m512" --preset small --set num_experts=512 --seed 9 >/dev/null
PP=$(free_port)
"$BIN" serve --model "$LOG/m512" --port "$PP" --mem 64M --parallel 3 >"$LOG/par.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 100); do curl -sf "http://127.0.0.1:$PP/health" >/dev/null 2>&1 && break; kill -0 "${pids[-1]}" 2>/dev/null || break; sleep 0.1; done
check "--parallel 3 at --mem 64M: three sessions planned before the cache" "deltafin_conversations_kept 3" \
    "$(curl -s "http://127.0.0.1:$PP/metrics" | grep '^deltafin_conversations_kept ' || tail -2 "$LOG/par.log")"
kill "${pids[-1]}" 2>/dev/null; wait "${pids[-1]}" 2>/dev/null || true; unset 'pids[-1]'

# serve feeds a prompt one forward pass (the plan's chunk, --batch) at a time, so each chunk
# reads its layers' experts once: a 1,000-id prompt with experts streaming (a 1 MiB cache)
# reads far fewer experts at --batch 1024 than at --batch 256 (it read as many: the prompt
# went in 256-id pieces whatever the chunk)
IDS=$(node -e 'console.log(JSON.stringify(Array.from({length:1000},(_,i)=>(i*37)%500+3)))')
declare -A READS CHAT
cat >"$LOG/chat8.json" <<'JSON'
{"max_tokens":1,"messages":[
{"role":"system","content":"You are a careful assistant who answers questions about the files of a project."},
{"role":"user","content":"Read the first file of the project and tell me what it holds in a few words please."},
{"role":"assistant","content":"It holds the build rules of the project, the compiler flags and the list of the sources."},
{"role":"user","content":"Now read the second file of the project and tell me what it holds in a few words please."},
{"role":"assistant","content":"It holds the design notes, the layers of the engine and the rules for the tests of it."},
{"role":"user","content":"And the third file of the project, what does that one hold, again in a few words please?"},
{"role":"assistant","content":"It holds the readme with the two commands a newcomer needs and the list of the features."},
{"role":"user","content":"Which of the three files would you read first if you were new to the project and why?"}]}
JSON
for b in 256 1024; do
    PB=$(free_port)
    "$BIN" serve --model "$LOG/m512" --port "$PB" --batch "$b" --expert-cache 1M --no-prefetch --ctx 4096 \
        >"$LOG/batch$b.log" 2>&1 &
    pids+=($!)
    for _ in $(seq 1 100); do curl -sf "http://127.0.0.1:$PB/health" >/dev/null 2>&1 && break; sleep 0.1; done
    curl -s "http://127.0.0.1:$PB/v1/completions" -H 'Content-Type: application/json' \
        -d "{\"prompt\":$IDS,\"max_tokens\":1}" >/dev/null
    READS[$b]=$(curl -s "http://127.0.0.1:$PB/metrics" | sed -n 's/^deltafin_expert_reads_total //p')
    # a conversation of 8 messages (476 ids): serve keeps a checkpoint at each message end,
    # taken inside the pass, so one pass at --batch 1024 still reads fewer than two at 256
    curl -s "http://127.0.0.1:$PB/v1/chat/completions" -H 'Content-Type: application/json' \
        --data-binary @"$LOG/chat8.json" >/dev/null
    CHAT[$b]=$(( $(curl -s "http://127.0.0.1:$PB/metrics" | sed -n 's/^deltafin_expert_reads_total //p') - READS[$b] ))
    kill "${pids[-1]}" 2>/dev/null; wait "${pids[-1]}" 2>/dev/null || true; unset 'pids[-1]'
done
check "a prompt is fed one chunk per pass: expert reads at --batch 1024 under half of --batch 256" "fewer" \
    "$([ -n "${READS[1024]}" ] && [ -n "${READS[256]}" ] && [ $((READS[1024] * 2)) -lt "${READS[256]}" ] && echo fewer \
       || echo "reads: --batch 256 ${READS[256]:-?}, --batch 1024 ${READS[1024]:-?}")"
check "checkpoints at message ends do not split the pass: a chat prompt reads less at --batch 1024 than at 256" "fewer" \
    "$([ -n "${CHAT[1024]}" ] && [ -n "${CHAT[256]}" ] && [ "${CHAT[1024]}" -lt "${CHAT[256]}" ] && echo fewer \
       || echo "reads: --batch 256 ${CHAT[256]:-?}, --batch 1024 ${CHAT[1024]:-?}")"

# --prompt-cache: conversations leaving the only slot, and those kept at exit, resume from files
PC=$LOG/prompt-cache
P7=$(free_port); start "$P7" --parallel 1 --prompt-cache "$PC"
for phase in 1 2; do
    DELTAFIN_URL=http://127.0.0.1:$P7 DELTAFIN_URL_FRESH=http://127.0.0.1:$P2 DELTAFIN_CACHE_DIR=$PC \
        DELTAFIN_CACHE_STATE=$LOG/cache-state.json DELTAFIN_CACHE_PHASE=$phase \
        NODE_PATH=tests/server/node_modules node --test --test-reporter=spec tests/server/cache_test.mjs || fail=1
    # a clean stop (SIGTERM) saves the kept conversation; the same directory after a restart
    kill "${pids[-1]}"; wait "${pids[-1]}" 2>/dev/null || true; unset 'pids[-1]'
    [ "$phase" = 1 ] && start "$P7" --parallel 1 --prompt-cache "$PC"
done

# --prompt-cache-max: a cap that holds about one saved conversation; after two more
# conversations leave the slot, the directory is within the cap
BIG=$(find "$PC" -name '*.session' -printf '%s\n' | sort -n | tail -1)
CAP=$((BIG * 3 / 2))
# a killed save's temporary file (larger than the cap) is removed at start, and a
# FIFO named like a session file never blocks the worker (it used to hang every request)
head -c $((CAP * 2)) /dev/zero >"$PC/0123456789abcdef.session.tmp"
mkfifo "$PC/fifo.session"
P8=$(free_port); start "$P8" --parallel 1 --prompt-cache "$PC" --prompt-cache-max "$CAP"
check "a killed save's temporary file is removed at start" gone \
    "$([ -e "$PC/0123456789abcdef.session.tmp" ] && echo present || echo gone)"
for who in one two three; do
    code=$(curl -s -m 60 -o /dev/null -w '%{http_code}' -d "{\"max_tokens\":4,\"messages\":[{\"role\":\"user\",\"content\":\"conversation $who with enough words to be saved\"}]}" \
        "http://127.0.0.1:$P8/v1/chat/completions")
    check "a request beside a FIFO named *.session is answered ($who)" 200 "$code"
done
rm -f "$PC/fifo.session"
USED=$(find "$PC" -name '*.session' -printf '%s\n' | awk '{s += $1} END {print s + 0}')
check "--prompt-cache-max keeps the directory within its cap" "within" \
    "$([ "$USED" -le "$CAP" ] && [ "$USED" -gt 0 ] && echo within || echo "$USED bytes for a cap of $CAP")"
kill "${pids[-1]}"; wait "${pids[-1]}" 2>/dev/null || true; unset 'pids[-1]'

# speculative decoding: servers drafting with the model itself (every draft
# accepted) and with prompt lookup answer exactly as the drafts-off server
P5=$(free_port); start "$P5" --draft "model:$MODEL" --draft-k 3
P6=$(free_port); start "$P6" --draft ngram --draft-k 4
# without --parallel: as many conversations as --mem holds, up to 4 (the tiny model: 4)
check "default --parallel" "deltafin_conversations_kept 4" "$(curl -s "http://127.0.0.1:$P6/metrics" | grep '^deltafin_conversations_kept ')"
DELTAFIN_URL=$U DELTAFIN_URL_DRAFTS="http://127.0.0.1:$P5 http://127.0.0.1:$P6" \
    NODE_PATH=tests/server/node_modules node --test --test-reporter=spec tests/server/draft_test.mjs || fail=1

# structured output (issue 36) on the default model, a server of its own: the SDK helpers,
# forced tool calls, round trips, and 50 random schemas sampled at temperature 1
tests/server/run_schema_tests.sh "$BIN" || fail=1

kill -0 "$PID1" 2>/dev/null || { echo "not ok - the server died"; cat "$LOG/server-$P1.log"; fail=1; }
# stop both (SIGTERM: a clean shutdown) and look for sanitizer reports when built with SANITIZE=
for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
pids=()
if grep -l 'Sanitizer\|runtime error' "$LOG"/server-*.log >/dev/null 2>&1; then
    echo "not ok - sanitizer report:"; cat "$LOG"/server-*.log; fail=1
fi
if [ "$fail" = 0 ]; then echo "server tests: all passed"; else echo "server tests: FAILED"; tail -20 "$LOG/server-$P1.log"; fi
exit "$fail"
