#!/usr/bin/env bash
# Seed every fuzz target's corpus from tests/fixtures, then run each for
# SECONDS (default 10). Needs the nightly toolchain and cargo-fuzz.
#
#   fuzz/run.sh [SECONDS] [TARGET...]     (default: every target)
#
# A crash leaves its input under fuzz/artifacts/TARGET/ and fails the run;
# add it as a regression test where the decoder or parser lives.
#
# LODESTAR_FUZZ_DEV=1 builds and runs the targets unoptimised (`cargo fuzz
# --dev`, still with AddressSanitizer): tests/run's smoke run, where the
# release build (the whole tree at opt-level 3 in one codegen unit, with
# ASan) costs far more than the seconds of fuzzing it serves.
set -euo pipefail
cd "$(dirname "$0")"
secs="${1:-10}"
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(documents decoders rest xds)
mkdir -p corpus/documents corpus/decoders
for f in ../tests/fixtures/istio/*/*.yaml; do
  cp "$f" "corpus/documents/istio-$(basename "$(dirname "$f")")-$(basename "$f")"
done
for d in ../tests/fixtures/translate/*/; do
  cp "$d/input.yaml" "corpus/documents/translate-$(basename "$d").yaml"
done
# The decoders' first byte picks the type (fuzz_targets/decoders.rs).
seed() { { printf "\\x$(printf %02x "$1")"; xxd -r -p "../tests/fixtures/codec/$2.v1.hex"; } >"corpus/decoders/$2"; }
seed 0 log_entry
seed 6 vote
seed 8 backup_file
# rest and xds: framed requests and bodies built from the fixtures.
python3 seeds.py corpus
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
