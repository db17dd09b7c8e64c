#!/usr/bin/env bash
# The xDS port under abuse (tests/xds.rs `xds_abuse_*`): garbage bytes,
# garbage gRPC, a 100 MiB request, a million resource names, and 4,000
# streams opened as fast as one client can, without credentials and with
# the management token, against a replica process. Prints the replica's
# memory after each (VmRSS: resident now; VmHWM: the peak so far), in KiB.
# The tests assert the refusals and that the replica keeps serving; the
# memory figures are reported here, not asserted.
#
#   benches/xds-abuse.sh
set -euo pipefail
cd "$(dirname "$0")/.."
: "${LODESTAR_ENVOY:=$PWD/.cache/envoy/bin/envoy}"
export LODESTAR_ENVOY
cargo nextest run --test xds --no-capture -E 'test(/^xds_abuse_/)' 2>&1 | grep -E '^rss:|PASS|FAIL|panicked'
