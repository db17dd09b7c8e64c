#!/usr/bin/env bash
# Seeds every fuzz target's corpus (fuzz/corpus/TARGET/) from
# tests/fixtures: Istio and translation fixtures for documents, codec
# fixtures for decoders, framed requests built from the fixtures for rest
# and xds (seeds.py). Used by run.sh and replay.sh.
set -euo pipefail
cd "$(dirname "$0")"
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
