#!/usr/bin/env bash
# web/check_test.sh - web/check.sh can fail (make web-check, in make check).
#
# On a copy of web/ in a temporary folder (node_modules linked, not copied): the
# check passes on the committed bundle, FAILS once a source byte is edited without
# a rebuild (a string of src/main.js, then a colour of src/style.css), and passes
# again after the rebuild.  Needs npm ci --prefix web.
set -euo pipefail
cd "$(dirname "$0")"
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
mkdir "$T/web"
cp -r package.json package-lock.json build.mjs check.sh src dist "$T/web/"
ln -s "$PWD/node_modules" "$T/web/node_modules"
fail=0
expect() { # expect pass|fail WHAT
    local got=pass out
    out=$("$T/web/check.sh" "$T/web" 2>&1) || got=fail
    if [ "$got" = "$1" ]; then echo "ok - web-check: $1 on $2"; else echo "not ok - web-check should $1 on $2: $out"; fail=1; fi
    if [ "$1" = fail ] && [ "$got" = fail ] && ! grep -q "is stale.*make web" <<<"$out"; then
        echo "not ok - the failure does not say what to do: $out"; fail=1
    fi
}
expect pass "the committed bundle"
grep -q "Start a conversation below." "$T/web/src/main.js"
sed -i 's/Start a conversation below\./Start a conversation here./' "$T/web/src/main.js"
expect fail "src/main.js edited, no rebuild"
node "$T/web/build.mjs" "$T/web/dist/index.html.gz" >/dev/null
expect pass "the rebuilt bundle"
grep -q -- "--accent: #2f5fd0" "$T/web/src/style.css"
sed -i 's/--accent: #2f5fd0/--accent: #2f5fd1/' "$T/web/src/style.css"
expect fail "src/style.css edited, no rebuild"
exit "$fail"
