#!/usr/bin/env bash
# run_agent_tests.sh - coding agents, as released on npm (tests/agents/package.json,
# pinned by package-lock.json), driving `deltafin serve` on the default model
# unchanged: Claude Code (`claude -p`, JSON output; a second turn of the same
# session and a second session), Codex (`codex exec`, then `exec resume`),
# Continue (`cn -p`) and OpenCode (`opencode run`),
# each through record_proxy.mjs so the requests they sent are kept in the log
# directory.  Each must complete a turn and print a reply; the second turn
# of a Claude Code or Codex session must reuse the first turn's prefix, and a
# second Claude Code session the first's system prompt and tools (cached
# tokens reported; /metrics); then each of Claude Code's tools forced by name
# on its recorded request, the arguments validated against the tool's schema
# with ajv (forced_tools_test.mjs; ajv from tests/server's packages); then a
# client leaving a long prompt (prompt_cut_test.mjs).  Before that,
# test_agent_requests renders the recorded requests in tests/agents/recorded
# by the documented rules.  The agents' telemetry, update checks and nonessential traffic are off through
# their own environment variables, every proxy and package registry they
# could use points at a closed port (no network), and their HOME is a
# scratch directory.
# Usage: tests/agents/run_agent_tests.sh [build/deltafin]
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=${1:-build/deltafin}
BDIR=$(dirname "$BIN")
MODEL=models/k3-mini
A=tests/agents/node_modules/.bin
T=$(mktemp -d /tmp/deltafin-agents.XXXXXX)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done; rm -rf "$T"; }
trap cleanup EXIT
fail=0
ok() { echo "ok - agents: $1"; }
bad() { echo "not ok - agents: $1"; fail=1; }
[ -x "$BIN" ] || { echo "agents: $BIN not built"; exit 1; }
[ -d tests/server/node_modules/ajv ] || { echo "agents: run 'npm ci --prefix tests/server' (ajv for forced_tools_test.mjs)"; exit 1; }
for b in claude codex cn opencode; do
    [ -x "$A/$b" ] || { echo "agents: $A/$b missing: run 'npm install --prefix tests/agents' (.ci/setup does)"; exit 1; }
done

# the recorded requests, rendered by the documented rules
SAN=
if grep -qa __asan_init "$BIN"; then SAN="-fsanitize=address,undefined"; fi
LIBS=$(make -s --no-print-directory print-ldlibs)
${CC:-cc} -std=c11 -O1 -g -pthread $SAN -Wall -Wextra -Wshadow -Wstrict-prototypes -Wmissing-prototypes -Wpointer-arith \
    -Wcast-qual -Wvla -Wformat=2 -Werror $(for d in src/*/; do printf -- "-I%s " "${d%/}"; done) -Itests \
    tests/agents/test_agent_requests.c tests/harness.c "$BDIR/libdeltafin.a" "$BDIR/web_page.o" $LIBS -lutil -o "$T/test_agent_requests"
"$T/test_agent_requests" || fail=1

free_port() { node -e 'const s=require("net").createServer();s.listen(0,"127.0.0.1",()=>{console.log(s.address().port);s.close()})'; }
PS=$(free_port)
"$BIN" serve --model "$MODEL" --port "$PS" >"$T/server.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 100); do curl -sf "http://127.0.0.1:$PS/health" >/dev/null 2>&1 && break; sleep 0.1; done
curl -sf "http://127.0.0.1:$PS/health" >/dev/null || { cat "$T/server.log"; echo "agents: the server did not start"; exit 1; }
# no --ctx: serve's default context holds an agent's first request (10-17K tokens)
CTX=$(curl -s "http://127.0.0.1:$PS/v1/models" | sed -n 's/.*"context_length":\([0-9]*\).*/\1/p')
[ "${CTX:-0}" -ge 65536 ] && ok "serve's default context on the default model: $CTX tokens" || bad "default context ${CTX:-?}"
PP=$(free_port)
node tests/agents/record_proxy.mjs "$PP" "$PS" "$T/requests" >"$T/proxy.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 50); do curl -sf "http://127.0.0.1:$PP/health" >/dev/null 2>&1 && break; sleep 0.1; done
mkdir -p "$T/home" "$T/work"
export HOME="$T/home"
cd "$T/work"
# no network: besides their own switches, every proxy and package registry points at a closed
# port, so a request that leaves this machine fails (loopback goes direct)
dead=http://127.0.0.1:9
agent_env=(DISABLE_TELEMETRY=1 DISABLE_AUTOUPDATER=1 DISABLE_ERROR_REPORTING=1 CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1
           CONTINUE_CLI_ENABLE_TELEMETRY=0 CONTINUE_METRICS_ENABLED=0 OPENCODE_DISABLE_AUTOUPDATE=1 OPENCODE_DISABLE_SHARE=1
           HTTP_PROXY=$dead HTTPS_PROXY=$dead http_proxy=$dead https_proxy=$dead ALL_PROXY=$dead all_proxy=$dead
           NO_PROXY=127.0.0.1,localhost no_proxy=127.0.0.1,localhost npm_config_registry=$dead/
           NPM_CONFIG_REGISTRY=$dead/ BUN_CONFIG_REGISTRY=$dead/)
R=$OLDPWD

# ---- Claude Code: Anthropic Messages
claude() {
    env "${agent_env[@]}" ANTHROPIC_BASE_URL="http://127.0.0.1:$PP" ANTHROPIC_API_KEY=sk-deltafin-test \
        timeout 600 "$R/$A/claude" -p "$@" --output-format json
}
field() { node -e 'const o=JSON.parse(require("fs").readFileSync(process.argv[1]));const v=process.argv[2].split(".").reduce((a,k)=>a==null?a:a[k],o);console.log(typeof v=="object"?JSON.stringify(v):v)' "$1" "$2"; }
claude "What is 23 + 45?" >"$T/cc1.json" 2>"$T/cc1.err" || true
if [ "$(field "$T/cc1.json" is_error 2>/dev/null)" = false ] && [ -n "$(field "$T/cc1.json" result)" ]; then
    ok "claude -p completes a turn: \"$(field "$T/cc1.json" result)\" ($(field "$T/cc1.json" usage.input_tokens) input tokens)"
else bad "claude -p: $(head -c 600 "$T/cc1.json") $(tail -3 "$T/cc1.err")"; fi
claude --continue "And what is 10 + 5?" >"$T/cc2.json" 2>"$T/cc2.err" || true
C2=$(field "$T/cc2.json" usage.cache_read_input_tokens 2>/dev/null || echo 0)
I1=$(field "$T/cc1.json" usage.input_tokens 2>/dev/null || echo 0)
if [ "$(field "$T/cc2.json" is_error 2>/dev/null)" = false ] && [ "${C2:-0}" -ge "${I1:-1}" ]; then
    ok "the session's second turn reuses the first's prefix: $C2 cached of $((C2 + $(field "$T/cc2.json" usage.input_tokens))) tokens"
else bad "second turn: cached ${C2:-?} (first turn ${I1:-?}): $(head -c 400 "$T/cc2.json")"; fi
claude "Name a prime number." >"$T/cc3.json" 2>"$T/cc3.err" || true
C3=$(field "$T/cc3.json" usage.cache_read_input_tokens 2>/dev/null || echo 0)
# a new session shares the tool list and system prompt (~80% of the first request) with the first
if [ "$(field "$T/cc3.json" is_error 2>/dev/null)" = false ] && [ "${C3:-0}" -ge $((${I1:-0} * 3 / 4)) ] && [ "${I1:-0}" -gt 0 ]; then
    ok "a second claude session reuses the first's system prompt and tools: $C3 of $((C3 + $(field "$T/cc3.json" usage.input_tokens))) tokens: \"$(field "$T/cc3.json" result)\""
else bad "second session: ${C3:-?} tokens reused (first request ${I1:-?}): $(head -c 400 "$T/cc3.json")"; fi

# ---- Codex: the Responses API (a provider in its config; no key, no telemetry, no update check)
mkdir -p "$HOME/.codex"
cat >"$HOME/.codex/config.toml" <<TOML
model = "k3-mini"
model_provider = "deltafin"
check_for_update_on_startup = false

[model_providers.deltafin]
name = "deltafin"
base_url = "http://127.0.0.1:$PP/v1"
wire_api = "responses"
stream_idle_timeout_ms = 3600000

[analytics]
enabled = false
TOML
codex() { env "${agent_env[@]}" CODEX_HOME="$HOME/.codex" timeout 600 "$R/$A/codex" exec --skip-git-repo-check "$@" </dev/null; }
reused() { curl -s "http://127.0.0.1:$PS/metrics" | sed -n 's/^deltafin_prompt_tokens_reused_total //p'; }
if codex "What is 23 + 45?" >"$T/cx1.out" 2>"$T/cx1.err" && [ -s "$T/cx1.out" ]; then
    ok "codex exec completes a turn: \"$(tail -1 "$T/cx1.out")\""
else bad "codex exec: $(tail -5 "$T/cx1.err")"; fi
U0=$(reused)
if codex resume --last "And what is 10 + 5?" >"$T/cx2.out" 2>"$T/cx2.err" && [ -s "$T/cx2.out" ] \
       && [ $(($(reused) - U0)) -gt 1000 ]; then
    ok "codex exec resume: a second turn reusing $(($(reused) - U0)) prompt tokens: \"$(tail -1 "$T/cx2.out")\""
else bad "codex second turn (reused $(($(reused) - U0))): $(tail -5 "$T/cx2.err")"; fi

# ---- Continue: chat completions, streaming, tools
cat >"$T/cn.yaml" <<YAML
name: deltafin
version: 1.0.0
schema: v1
models:
  - name: k3-mini
    provider: openai
    model: k3-mini
    apiBase: http://127.0.0.1:$PP/v1
    apiKey: sk-deltafin-test
    roles: [chat, edit, apply]
YAML
if env "${agent_env[@]}" timeout 600 "$R/$A/cn" -p "What is 23 + 45?" --config "$T/cn.yaml" >"$T/cn.out" 2>"$T/cn.err" \
       && [ -s "$T/cn.out" ]; then ok "cn -p completes a turn: \"$(head -c 200 "$T/cn.out" | tr '\n' ' ')\""
else bad "cn -p: $(tail -5 "$T/cn.err")"; fi

# ---- OpenCode: @ai-sdk/openai-compatible against chat completions
cat >opencode.json <<JSON
{"provider": {"deltafin": {"npm": "@ai-sdk/openai-compatible", "name": "deltafin",
  "options": {"baseURL": "http://127.0.0.1:$PP/v1", "apiKey": "sk-deltafin-test"},
  "models": {"k3-mini": {"name": "k3-mini"}}}},
 "model": "deltafin/k3-mini", "autoupdate": false, "share": "disabled"}
JSON
if env "${agent_env[@]}" timeout 600 "$R/$A/opencode" run "What is 23 + 45?" >"$T/oc.out" 2>"$T/oc.err" \
       && grep -q '[0-9]' "$T/oc.out"; then ok "opencode run completes a turn: \"$(grep -m1 '[0-9]' "$T/oc.out")\""
else bad "opencode run: $(tail -5 "$T/oc.err")"; fi

# ---- forcing each of Claude Code's tools (its recorded request, tool_choice {type: tool, name}):
# the tool_use input validates against the tool's own input_schema (ajv, from tests/server)
node "$R/tests/agents/forced_tools_test.mjs" "$PS" || fail=1

# ---- a client leaving during a long prompt: keep-alives, the prefix kept, the retry continues
PC=$(free_port)
cd "$R"
"$BIN" serve --model "$MODEL" --port "$PC" --threads 1 >"$T/server-cut.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 100); do curl -sf "http://127.0.0.1:$PC/health" >/dev/null 2>&1 && break; sleep 0.1; done
node tests/agents/prompt_cut_test.mjs "$PC" "$T/server-cut.log" tests/agents/recorded/claude-code/session-a-turn1.json || fail=1
cd "$T/work"

# every request the agents sent was answered (none refused)
cd "$R"
N=$(ls "$T/requests" | wc -l)
REFUSED=$( (grep -l '"status": [45]' "$T/requests"/*.json 2>/dev/null || true) | wc -l)
echo "# the agents sent $N requests; $REFUSED refused"
[ "$N" -ge 5 ] && [ "$REFUSED" = 0 ] && ok "no request an agent sent was refused" \
    || bad "$REFUSED of $N requests refused: $(grep -l '"status": [45]' "$T/requests"/*.json | head -3)"
if grep -q "Failed\|error" "$T/server.log"; then echo "# server log: $(grep -m3 'Failed\|error' "$T/server.log")"; fi
[ "$fail" = 0 ] && echo "agent tests: all passed" || echo "agent tests: FAILED"
exit "$fail"
