#!/usr/bin/env bash
# bench_conv.sh - conversations that never pay twice: a coding-agent-like trace
# (bench/conv_trace.mjs: a ~4,000-token system prompt shared by two
# conversations, 10 turns each, interleaved, every turn sending the whole
# history) against `deltafin serve` on the trained default model with its
# experts streaming (--expert-cache 120K: 6 of its 224 experts), once as the
# server was before prefix reuse across turns (--parallel 1 --checkpoints 0:
# only a prompt extending the last one reuses anything) and once with it
# (--parallel 2, checkpoints): prompt tokens evaluated, expert bytes read and
# the time, side by side, and the ratios.  Env: BENCH_TURNS (10),
# BENCH_WORDS (system prompt words, 3200 = ~4,000 tokens with k3-mini).
set -euo pipefail
cd "$(dirname "$0")/.."
make -s build/deltafin
turns=${BENCH_TURNS:-10}
words=${BENCH_WORDS:-3200}
free_port() { node -e 'const s=require("net").createServer();s.listen(0,"127.0.0.1",()=>{console.log(s.address().port);s.close()})'; }
metric() { curl -s "$1/metrics" | sed -n "s/^$2 \([0-9.e+-]*\)$/\1/p"; }
run() { # run LABEL SERVER-OPTIONS...
    local label=$1; shift
    local port; port=$(free_port)
    build/deltafin serve --model models/k3-mini --port "$port" --ctx 16384 --expert-cache 120K --no-prefetch "$@" \
        >/tmp/bench_conv.$$.log 2>&1 &
    local pid=$!
    for _ in $(seq 1 100); do curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break; sleep 0.1; done
    local out; out=$(node bench/conv_trace.mjs "http://127.0.0.1:$port" "$turns" "$words")
    local bytes; bytes=$(metric "http://127.0.0.1:$port" deltafin_expert_bytes_read_total)
    kill "$pid"; wait "$pid" 2>/dev/null || true
    echo "$label $out $bytes"
}
a=$(run before --parallel 1 --checkpoints 0)
b=$(run after --parallel 2 --checkpoints 2)
echo "trace: 2 conversations x $turns turns, a shared system prompt of $words words; k3-mini, experts streamed"
for l in "$a" "$b"; do
    node -e '
      const [label, json, bytes] = process.argv.slice(1); const j = JSON.parse(json);
      console.log(`  ${label.padEnd(7)} prompt tokens sent ${j.prompt_tokens}, evaluated ${j.evaluated_tokens}, reused ${j.reused_tokens}; expert MiB read ${(Number(bytes) / 1048576).toFixed(1)}; ${j.seconds} s`);
    ' "$(echo "$l" | cut -d' ' -f1)" "$(echo "$l" | cut -d' ' -f2)" "$(echo "$l" | cut -d' ' -f3)"
done
node -e '
  const [a, b] = process.argv.slice(1).map((l) => { const p = l.split(" "); return { j: JSON.parse(p[1]), bytes: Number(p[2]) }; });
  console.log(`  evaluated tokens ${(a.j.evaluated_tokens / b.j.evaluated_tokens).toFixed(1)}x fewer, expert bytes ${(a.bytes / b.bytes).toFixed(1)}x fewer, time ${(a.j.seconds / b.j.seconds).toFixed(1)}x less with reuse`);
' "$a" "$b"
