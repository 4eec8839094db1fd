#!/usr/bin/env bash
# bench_agent.sh - what coding agents cost per request: the recorded requests
# of real agents (tests/agents/recorded: two Claude Code sessions, the second
# session's first request after the first's two turns; a Codex session of two
# turns; an OpenCode turn) replayed in order by bench/agent_replay.mjs against
# `deltafin serve` on the default model with its experts streaming
# (--expert-cache 120K: 6 of its 224 experts, --no-prefetch), once without
# reuse between requests (--parallel 1 --checkpoints 0: only a prompt that
# extends the previous one reuses anything) and once as serve runs by default
# (conversation slots, checkpoints where the system prompt ends and after the
# last message, prefixes copied between conversations).  Per request: prompt
# tokens, tokens evaluated, expert bytes read and the time to the first token,
# side by side; then the totals and their ratios.  BASELINE=PATH (another
# build of deltafin, e.g. an earlier commit's) adds a third run: that binary
# as serve runs by default, against this one, on the same requests.
set -euo pipefail
cd "$(dirname "$0")/.."
make -s build/deltafin
reqs=(claude-code/session-a-turn1 claude-code/session-a-turn2 codex/turn1 claude-code/session-b-turn1 codex/turn2
      opencode/turn1 claude-code/session-a-turn2)
free_port() { node -e 'const s=require("net").createServer();s.listen(0,"127.0.0.1",()=>{console.log(s.address().port);s.close()})'; }
BIN=build/deltafin
run() { # run OUT SERVER-OPTIONS...
    local out=$1; shift
    local port; port=$(free_port)
    "$BIN" serve --model models/k3-mini --port "$port" --expert-cache 120K --no-prefetch "$@" \
        >"/tmp/bench_agent.$$.log" 2>&1 &
    local pid=$!
    for _ in $(seq 1 100); do curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break; sleep 0.1; done
    node bench/agent_replay.mjs "http://127.0.0.1:$port" "${reqs[@]}" >"$out"
    kill "$pid"; wait "$pid" 2>/dev/null || true
}
A=$(mktemp) B=$(mktemp)
trap 'rm -f "$A" "$B" /tmp/bench_agent.$$.log' EXIT
run "$A" --parallel 1 --checkpoints 0
run "$B"
node -e '
  const fs = require("fs");
  const [a, b] = process.argv.slice(1).map((f) => fs.readFileSync(f, "utf8").trim().split("\n").map(JSON.parse));
  const mib = (x) => (x / 1048576).toFixed(1);
  console.log("recorded agent requests on k3-mini, experts streamed (--expert-cache 120K); without reuse | with reuse");
  console.log("request                         prompt   evaluated        expert MiB read     first token s");
  for (let i = 0; i < a.length; i++)
    console.log(`${a[i].name.padEnd(30)} ${String(a[i].prompt).padStart(7)} ${String(a[i].evaluated).padStart(6)} | ${String(b[i].evaluated).padStart(6)}` +
      `   ${mib(a[i].expert_bytes).padStart(7)} | ${mib(b[i].expert_bytes).padStart(7)}   ${a[i].seconds.toFixed(2).padStart(6)} | ${b[i].seconds.toFixed(2).padStart(6)}`);
  const sum = (r, k) => r.reduce((s, x) => s + x[k], 0);
  console.log(`total: evaluated ${sum(a, "evaluated")} | ${sum(b, "evaluated")} (${(sum(a, "evaluated") / sum(b, "evaluated")).toFixed(1)}x fewer), ` +
    `expert MiB ${mib(sum(a, "expert_bytes"))} | ${mib(sum(b, "expert_bytes"))} (${(sum(a, "expert_bytes") / Math.max(1, sum(b, "expert_bytes"))).toFixed(1)}x fewer), ` +
    `seconds ${sum(a, "seconds").toFixed(1)} | ${sum(b, "seconds").toFixed(1)} (${(sum(a, "seconds") / sum(b, "seconds")).toFixed(1)}x less)`);
' "$A" "$B"
if [ -n "${BASELINE:-}" ]; then
    C=$(mktemp)
    BIN=$BASELINE run "$C"
    node -e '
      const fs = require("fs");
      const [c, b] = process.argv.slice(1).map((f) => fs.readFileSync(f, "utf8").trim().split("\n").map(JSON.parse));
      const sum = (r, k) => r.reduce((s, x) => s + x[k], 0), mib = (x) => (x / 1048576).toFixed(1);
      console.log(`as serve runs by default, BASELINE | this build: evaluated ${sum(c, "evaluated")} | ${sum(b, "evaluated")}, ` +
        `expert MiB ${mib(sum(c, "expert_bytes"))} | ${mib(sum(b, "expert_bytes"))} ` +
        `(${(sum(c, "expert_bytes") / Math.max(1, sum(b, "expert_bytes"))).toFixed(1)}x fewer), ` +
        `seconds ${sum(c, "seconds").toFixed(1)} | ${sum(b, "seconds").toFixed(1)}`);
    ' "$C" "$B"
    rm -f "$C"
fi
