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
# Its own workspace: this checkout's root manifest is one, and cargo would
# otherwise take the copy under .cache/ for a stray member of it.
grep -q '^\[workspace\]' "$DIR/src/Cargo.toml" || printf '\n[workspace]\n' >>"$DIR/src/Cargo.toml"
locked=(--locked)
shared=0
if git diff --quiet "$COMMIT" HEAD -- vendor/h2 vendor/openraft vendor/sled; then
  shared=1
  sed -i -E "s#^(h2|openraft|sled) = \{ path = \"vendor/#\1 = { path = \"$ROOT/vendor/#" "$DIR/src/Cargo.toml"
  # A commit from before envoy-types was patched (vendor/envoy-types) gets
  # the patched copy too, whose default features are the crate's own: its
  # lock file then changes for that one source (hence no --locked).
  if [ ! -d "$DIR/src/vendor/envoy-types" ]; then
    sed -i -E "s#^\[patch.crates-io\]#[patch.crates-io]\nenvoy-types = { path = \"$ROOT/vendor/envoy-types\" }#" "$DIR/src/Cargo.toml"
    locked=()
  fi
fi
# Cargo hashes a dependency with its enabled features, so the old build
# reuses this checkout's compiled dependencies only if it asks for the same
# features. The test build turns on three that a bare `--bin lodestar` build
# of the old tree does not: cc's `parallel` (fuzz/'s libfuzzer-sys, a build
# dependency), zerocopy's `derive` (criterion, a dev-dependency) and
# bitflags' `std`. Without them, those and all that depends on them (ring,
# rand, rustls, tonic, reqwest, ...) are compiled twice (`cargo tree -e
# features` of both shows any new difference). Asked for here, the lock file keeps its
# versions; only the old tree's own edges change (hence no --locked).
if [ "$shared" = 1 ]; then
  cat >>"$DIR/src/Cargo.toml" <<'TOML'

[dependencies.zerocopy]
version = "0.8"
features = ["derive", "simd"]

[dependencies.bitflags]
version = "2"
features = ["std"]

[build-dependencies.cc]
version = "1"
features = ["parallel"]
TOML
  locked=()
fi
# Its binary is renamed lodestar-previous, so the build never writes the
# shared target/debug/lodestar, which is the current build's (tests/run
# builds this one while the tests run that one).
grep -q '^default-run = "lodestar"$' "$DIR/src/Cargo.toml" && grep -A1 '^\[\[bin\]\]$' "$DIR/src/Cargo.toml" | grep -q '^name = "lodestar"$' || {
  echo "build-previous: $COMMIT's Cargo.toml has no [[bin]] named lodestar (and default-run) to rename" >&2
  exit 1
}
sed -i -z -E 's/\[\[bin\]\]\nname = "lodestar"\n/[[bin]]\nname = "lodestar-previous"\n/; s/\ndefault-run = "lodestar"\n/\ndefault-run = "lodestar-previous"\n/' "$DIR/src/Cargo.toml"
start=$SECONDS
( cd "$DIR/src" && CARGO_TARGET_DIR="$ROOT/target" cargo build "${locked[@]}" --bin lodestar-previous --quiet ) >&2
cp "$ROOT/target/debug/lodestar-previous" "$BIN.tmp"
mv "$BIN.tmp" "$BIN"
echo "build-previous: built $COMMIT in $((SECONDS - start)) s" >&2
echo "$BIN"
