#!/usr/bin/env bash
# get_gguf_py.sh - prints the path of gguf-py, llama.cpp's Python GGUF
# package, taken from the llama.cpp source that the npm package
# node-llama-cpp@3.21.1 bundles (llama/gitRelease.bundle): the same release
# (v0.4.0) as the prebuilt libraries the oracle runs.  `npm pack` downloads
# the tarball and runs no install script; the bundle is a git bundle.
# Cached in $BUILD/gguf-py (default build/).  Needs npm, tar and git.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
dest=${BUILD:-$root/build}/gguf-py
case $dest in /*) ;; *) dest=$root/$dest ;; esac
if [ -f "$dest/gguf/quants.py" ]; then echo "$dest"; exit 0; fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && npm pack node-llama-cpp@3.21.1 --silent >/dev/null 2>"$tmp/npm.err") ||
    { echo "get_gguf_py.sh: npm pack node-llama-cpp@3.21.1 failed: $(tail -1 "$tmp/npm.err")" >&2; exit 1; }
tar -xzf "$tmp/node-llama-cpp-3.21.1.tgz" -C "$tmp" package/llama/gitRelease.bundle
git -c advice.detachedHead=false clone -q "$tmp/package/llama/gitRelease.bundle" "$tmp/src"
[ -f "$tmp/src/gguf-py/gguf/quants.py" ] || { echo "get_gguf_py.sh: the bundle has no gguf-py/gguf/quants.py" >&2; exit 1; }
mkdir -p "$(dirname "$dest")"
rm -rf "$dest.new"
cp -r "$tmp/src/gguf-py" "$dest.new"
rm -rf "$dest"
mv "$dest.new" "$dest"
echo "$dest"
