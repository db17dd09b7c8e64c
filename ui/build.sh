#!/usr/bin/env bash
# Builds the web console into ui/dist/ (index.html, app.js, app.css,
# icon.svg): npm ci (esbuild and typescript, pinned by package-lock.json),
# the type check (tsc --noEmit), the unit tests (test/*.test.ts), then
# esbuild's bundle. ui/dist/ is checked
# in: the Rust build embeds it (src/api/console.rs), so `cargo build`
# needs no Node. `ui/build.sh --check` builds into a scratch directory and
# fails if ui/dist/ differs from what the sources build (tests/run runs it).
set -euo pipefail
cd "$(dirname "$0")"
check=${1:-}
npm ci --no-audit --no-fund --loglevel=error >&2
node_modules/.bin/tsc --noEmit
# The pure modules' unit tests (test/*.test.ts), bundled for Node and run.
tests=$(mktemp -d)
for t in test/*.test.ts; do
  node_modules/.bin/esbuild "$t" --bundle --platform=node --log-level=warning --outfile="$tests/$(basename "$t" .ts).cjs"
  node "$tests/$(basename "$t" .ts).cjs" >&2
done
rm -rf "$tests"
out=dist
[ "$check" = --check ] && out=$(mktemp -d)
rm -rf "${out:?}"/*
mkdir -p "$out"
node_modules/.bin/esbuild src/main.ts --bundle --minify --format=iife --target=es2020 --legal-comments=none --log-level=warning --outfile="$out/app.js"
node_modules/.bin/esbuild src/app.css --minify --log-level=warning --outfile="$out/app.css"
cp src/index.html src/icon.svg "$out/"
if [ "$check" = --check ]; then
  diff -r dist "$out" >/dev/null || { echo "ui/dist/ is not what ui/src/ builds: run ui/build.sh and commit ui/dist/" >&2; rm -rf "$out"; exit 1; }
  rm -rf "$out"
  echo "ui/dist/ is up to date"
else
  echo "ui/dist/app.js: $(wc -c <dist/app.js) bytes, $(gzip -9 -c dist/app.js | wc -c) gzipped; app.css: $(gzip -9 -c dist/app.css | wc -c) gzipped"
fi
