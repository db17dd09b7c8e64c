#!/usr/bin/env bash
# Installs the proxyless Node gRPC client the end-to-end tests use
# (@grpc/grpc-js-xds, pinned by tests/support/grpc-node/package-lock.json)
# under .cache/grpc-node/ in the repo (gitignored), idempotently, and prints
# its node_modules directory (for NODE_PATH).
#
#   export LODESTAR_GRPC_NODE="$(tests/support/install-grpc-node.sh)"
#
# Needs node and npm (Debian's `nodejs` and `npm`; installed here when
# missing and running as root). When the lock file is unchanged since the
# last install it does nothing else (no npm, no network).
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
SRC="$ROOT/tests/support/grpc-node"
DIR="$ROOT/.cache/grpc-node"

if ! { command -v node && command -v npm; } >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ]; then
    echo "install-grpc-node: installing nodejs and npm" >&2
    apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >/dev/null
  else
    echo "install-grpc-node: node and npm are needed (apt-get install nodejs npm)" >&2
    exit 1
  fi
fi

if ! cmp -s "$SRC/package-lock.json" "$DIR/package-lock.json" || [ ! -d "$DIR/node_modules/@grpc/grpc-js-xds" ]; then
  mkdir -p "$DIR"
  cp "$SRC/package.json" "$SRC/package-lock.json" "$DIR/"
  # No install scripts: the packages are plain JavaScript.
  (cd "$DIR" && npm ci --no-audit --no-fund --ignore-scripts --loglevel=error >&2)
  [ -d "$DIR/node_modules/@grpc/grpc-js-xds" ] || { echo "install-grpc-node: @grpc/grpc-js-xds did not install" >&2; exit 1; }
fi

echo "$DIR/node_modules"
