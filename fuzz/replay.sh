#!/usr/bin/env bash
# CI's fuzz step, on stable: builds every fuzz target with the main build's
# dependencies (no sanitizer, no coverage), runs each over its seed corpus
# (every seed must pass: no panic, no hang) and then mutates the seeds
# blindly for SECONDS more (default 2). Coverage-guided fuzzing with
# AddressSanitizer is run.sh on nightly (.ci/nightly).
#
#   fuzz/replay.sh [SECONDS] [TARGET...]     (default: every target)
set -euo pipefail
cd "$(dirname "$0")"
secs="${1:-2}"
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(documents decoders rest xds)
./seed.sh
# Built as part of the test build's set of targets (every member's tests
# and binaries), so features unify as in `cargo nextest run --workspace`:
# after that build only the fuzz binaries are new (`-p lodestar-fuzz`
# alone unifies differently and rebuilds a dozen crates).
cargo build --locked --workspace --tests --bins
dir="$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')/debug"
mkdir -p artifacts
for target in "${targets[@]}"; do
  seeds=$(find "corpus/$target" -type f | wc -l)
  echo "fuzz: $target: $seeds seeds, then ${secs}s of blind mutation"
  mkdir -p "artifacts/$target"
  # libFuzzer exits non-zero on a crash, a leak or a timeout, and
  # writes the input under artifacts/TARGET/.
  rc=0
  "$dir/$target" "corpus/$target" -max_total_time="$secs" -rss_limit_mb=1024 -timeout=10 \
    -artifact_prefix="artifacts/$target/" >"artifacts/$target.log" 2>&1 || rc=$?
  grep -E '^(#[0-9]+ +DONE|Done|==[0-9]+==|SUMMARY|Test unit written|ERROR)' "artifacts/$target.log" || true
  if [ "$rc" != 0 ] || [ -n "$(ls -A "artifacts/$target")" ]; then
    tail -40 "artifacts/$target.log"
    echo "fuzz: $target failed (exit $rc): fuzz/artifacts/$target"
    exit 1
  fi
done
