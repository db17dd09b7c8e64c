#!/usr/bin/env bash
# Builds the previous release of Lodestar (the commit the upgrade test
# names, tests/e2e/upgrade.rs: PREVIOUS) once into .cache/upgrade/COMMIT/
# and prints the path of its `lodestar` binary. Idempotent: a binary that
# is already there is printed at once (no cargo, no git).
#
#   tests/support/build-previous.sh            # the default commit
#   tests/support/build-previous.sh 7a825a0    # another one
#
# The sources come from `git archive` of the commit. The build shares this
# checkout's target/ directory and, when the commit's vendored crates
# (vendor/) are those of the checkout, points its [patch] entries at the
# checkout's copies: the dependencies then have the same package ids as
# the current build's, so only the `lodestar` crate itself is compiled
# (measured in benches/RESULTS.md). Otherwise every patched crate and what
# depends on it is built again, once.
set -euo pipefail

COMMIT="${1:-7a825a0}"
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
DIR="$ROOT/.cache/upgrade/$COMMIT"
BIN="$DIR/lodestar"

if [ -x "$BIN" ]; then
  echo "$BIN"
  exit 0
fi

cd "$ROOT"
git cat-file -e "$COMMIT^{commit}" 2>/dev/null || { echo "build-previous: commit $COMMIT is not in this repository (git fetch it)" >&2; exit 1; }
rm -rf "$DIR/src"
mkdir -p "$DIR/src"
git archive "$COMMIT" | tar -x -C "$DIR/src"
if git diff --quiet "$COMMIT" HEAD -- vendor Cargo.lock; then
  sed -i -E "s#^(h2|openraft|sled) = \{ path = \"vendor/#\1 = { path = \"$ROOT/vendor/#" "$DIR/src/Cargo.toml"
fi
start=$SECONDS
( cd "$DIR/src" && CARGO_TARGET_DIR="$ROOT/target" cargo build --locked --bin lodestar --quiet ) >&2
# Copied out: the shared target/debug/lodestar is the current build's.
cp "$ROOT/target/debug/lodestar" "$BIN.tmp"
mv "$BIN.tmp" "$BIN"
echo "build-previous: built $COMMIT in $((SECONDS - start)) s" >&2
echo "$BIN"
