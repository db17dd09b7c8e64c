#!/usr/bin/env bash
# Seed every fuzz target's corpus from tests/fixtures (seed.sh), then fuzz
# each for SECONDS (default 10) with coverage and AddressSanitizer. Needs
# the nightly toolchain and cargo-fuzz; the scheduled job (.ci/nightly)
# runs it. CI builds the targets on stable and replays the seeds
# through them (replay.sh).
#
#   fuzz/run.sh [SECONDS] [TARGET...]     (default: every target)
#
# A crash leaves its input under fuzz/artifacts/TARGET/ and fails the run;
# add it as a regression test where the decoder or parser lives.
#
# LODESTAR_FUZZ_DEV=1 builds and runs the targets unoptimised (`cargo fuzz
# --dev`, still with AddressSanitizer): a quick run, where the
# release build (the whole tree at opt-level 3 in one codegen unit, with
# ASan) costs far more than the seconds of fuzzing it serves.
set -euo pipefail
cd "$(dirname "$0")"
secs="${1:-10}"
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(documents decoders rest xds)
./seed.sh
# --cfg fuzzing turns on vendor/h2's fuzz module, whose lints (denied in
# h2, capped for crates.io dependencies but not for path ones) fail it.
export RUSTFLAGS="${RUSTFLAGS:-} --cap-lints=warn"
profile=()
[ -z "${LODESTAR_FUZZ_DEV:-}" ] || profile=(--dev)
start=$SECONDS
for target in "${targets[@]}"; do
  cargo +nightly fuzz build "${profile[@]}" "$target"
done
echo "time: fuzz build $((SECONDS - start)) s"
for target in "${targets[@]}"; do
  echo "fuzz: $target for ${secs}s"
  cargo +nightly fuzz run "${profile[@]}" "$target" -- -max_total_time="$secs" -rss_limit_mb=1024 -timeout=10 2>&1 | grep -E '^(#[0-9]+ +DONE|Done|==[0-9]+==|SUMMARY|artifact_prefix|Test unit written)' || true
  [ -z "$(ls -A "artifacts/$target" 2>/dev/null)" ] || { echo "fuzz: $target found a crash: fuzz/artifacts/$target"; exit 1; }
done
