#!/usr/bin/env bash
# Installs the proxyless gRPC client the end-to-end tests use (Python
# `grpcio`, pinned) into a venv under .cache/grpc-python/ in the repo
# (gitignored), idempotently, and prints the venv's python.
#
#   export LODESTAR_GRPC_PYTHON="$(tests/support/install-grpc-python.sh)"
#
# When the venv already has the pinned version it does nothing else (no
# pip, no network).
set -euo pipefail

VERSION="1.85.1"
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
DIR="$ROOT/.cache/grpc-python"
PY="$DIR/venv/bin/python"
# shellcheck source=tests/support/pip-venv.sh
. "$ROOT/tests/support/pip-venv.sh"

installed() {
  local v
  [ -x "$PY" ] && v="$("$PY" -c 'import grpc; print(grpc.__version__)' 2>/dev/null)" && [ "$v" = "$VERSION" ]
}

if ! installed; then
  pip_venv install-grpc-python "$DIR" "grpcio==$VERSION"
  installed || { echo "install-grpc-python: grpcio $VERSION did not install" >&2; exit 1; }
fi

echo "$PY"
