#!/usr/bin/env bash
# web/check.sh [DIR] - is DIR/dist/index.html.gz (the page compiled into deltafin) what
# DIR/src and DIR/package-lock.json build?  (make web-check, in make check; DIR: web)
#
# Builds the page twice from the installed packages (npm ci --prefix DIR first): the two
# builds must be byte for byte the same (the build is reproducible: no timestamps, no
# paths), and the HTML they give must be the HTML inside the committed .gz.  The HTML is
# compared rather than the .gz because gzip's bytes also depend on the zlib inside node;
# a different .gz around the same HTML is only noted.  Fails with what to do.
set -euo pipefail
DIR=${1:-web}
[ -d "$DIR/node_modules/esbuild" ] || { echo "web-check: $DIR/node_modules is missing: run npm ci --prefix $DIR"; exit 1; }
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
node "$DIR/build.mjs" "$T/a.html.gz" --html "$T/a.html" >/dev/null
node "$DIR/build.mjs" "$T/b.html.gz" >/dev/null
cmp -s "$T/a.html.gz" "$T/b.html.gz" || { echo "web-check: FAILED: two builds of the same sources differ (the build is not reproducible)"; exit 1; }
gzip -dc "$DIR/dist/index.html.gz" >"$T/committed.html" 2>/dev/null || { echo "web-check: FAILED: $DIR/dist/index.html.gz is missing or not gzip"; exit 1; }
if ! cmp -s "$T/committed.html" "$T/a.html"; then
    echo "web-check: FAILED: $DIR/dist/index.html.gz is stale: it is not what $DIR/src and $DIR/package-lock.json build" \
         "($(wc -c <"$T/committed.html") bytes of HTML committed, $(wc -c <"$T/a.html") built)." \
         "Run 'make web' and commit $DIR/dist/index.html.gz."
    exit 1
fi
cmp -s "$DIR/dist/index.html.gz" "$T/a.html.gz" || echo "web-check: note: the same HTML, other gzip bytes (this node's zlib)"
echo "web-check: $DIR/dist/index.html.gz is fresh ($(wc -c <"$T/a.html") bytes of HTML, reproducible)"
