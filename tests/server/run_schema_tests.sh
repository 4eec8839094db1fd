#!/usr/bin/env bash
# run_schema_tests.sh - structured output end to end (issue 36): starts `deltafin serve` on the
# default model (models/k3-mini, --parallel 2) on a free loopback port for each of
# structured_test.mjs (the openai and @anthropic-ai/sdk helpers, forced tool calls and round
# trips on the three APIs) and schema_property_test.mjs (random schemas sampled at
# temperature 1, refused keywords, annotations), then looks for sanitizer reports in the
# servers' log.  run_server_tests.sh calls it (50 schemas); `make check-slow` runs the
# property test alone with SCHEMAS=300.
# Usage: tests/server/run_schema_tests.sh [build/deltafin] [all|property]
# Environment: SCHEMAS, SEEDS, SCHEMA_SEED, MAX_CUT (schema_property_test.mjs).
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=${1:-build/deltafin}
WHAT=${2:-all}
MODEL=models/k3-mini
LOG=$(mktemp -d)
pid=
cleanup() { if [ -n "$pid" ]; then kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; fi; rm -rf "$LOG"; }
trap cleanup EXIT
[ -x "$BIN" ] || { echo "schema: $BIN not built"; exit 1; }
[ -d tests/server/node_modules/ajv ] || { echo "schema: run 'npm ci --prefix tests/server' first (ajv, zod)"; exit 1; }

start() { # a server on a free port: PORT, pid
    PORT=$(node -e 'const s=require("net").createServer();s.listen(0,"127.0.0.1",()=>{console.log(s.address().port);s.close()})')
    "$BIN" serve --model "$MODEL" --port "$PORT" --parallel 2 >>"$LOG/server.log" 2>&1 &
    pid=$!
    for _ in $(seq 1 100); do
        curl -sf "http://127.0.0.1:$PORT/health" >/dev/null 2>&1 && return 0
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    cat "$LOG/server.log"; echo "schema: the server did not start"; exit 1
}

fail=0
tests=(tests/server/schema_property_test.mjs)
[ "$WHAT" = all ] && tests=(tests/server/structured_test.mjs tests/server/schema_property_test.mjs)
for t in "${tests[@]}"; do
    # a server per file: a crash in one is reported there and leaves the other's results
    start
    DELTAFIN_URL_SCHEMA=http://127.0.0.1:$PORT node --test --test-reporter=spec "$t" || fail=1
    if kill -0 "$pid" 2>/dev/null; then
        kill "$pid"; wait "$pid" 2>/dev/null || true
    else
        wait "$pid" && rc=0 || rc=$?
        echo "not ok - schema: the server died during $(basename "$t") (exit status $rc)"; tail -5 "$LOG/server.log"; fail=1
    fi
    pid=
done
if grep -q 'Sanitizer\|runtime error' "$LOG/server.log"; then echo "not ok - schema: sanitizer report:"; cat "$LOG/server.log"; fail=1; fi
[ "$fail" = 0 ] && echo "schema tests: all passed" || echo "schema tests: FAILED"
exit "$fail"
