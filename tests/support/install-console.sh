#!/usr/bin/env bash
# Installs what the web console's browser tests (tests/e2e/console.rs)
# need: Debian's Chromium (headless) and playwright-core (pinned by
# tests/console/package-lock.json) under .cache/console/ in the repo
# (gitignored), idempotently, and prints its node_modules directory (for
# NODE_PATH).
#
#   export LODESTAR_CONSOLE_NODE="$(tests/support/install-console.sh)"
#
# Needs chromium, node and npm (Debian's `chromium`, `nodejs`, `npm`):
# installed here when missing and running as root, else it fails saying
# what is missing (the test then fails: it never passes without a browser).
# When the lock file is unchanged since the last install it does nothing
# else (no npm, no network).
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
SRC="$ROOT/tests/console"
DIR="$ROOT/.cache/console"

missing=()
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
command -v node >/dev/null 2>&1 || missing+=(nodejs)
command -v npm >/dev/null 2>&1 || missing+=(npm)
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then
    echo "install-console: installing ${missing[*]}" >&2
    apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  else
    echo "install-console: ${missing[*]} needed for the console's browser tests (apt-get install ${missing[*]})" >&2
    exit 1
  fi
fi

if ! cmp -s "$SRC/package-lock.json" "$DIR/package-lock.json" || [ ! -d "$DIR/node_modules/playwright-core" ]; then
  mkdir -p "$DIR"
  cp "$SRC/package.json" "$SRC/package-lock.json" "$DIR/"
  # No install scripts: playwright-core is plain JavaScript, and the
  # browser is Debian's, not a download.
  (cd "$DIR" && npm ci --no-audit --no-fund --ignore-scripts --loglevel=error >&2)
  [ -d "$DIR/node_modules/playwright-core" ] || { echo "install-console: playwright-core did not install" >&2; exit 1; }
fi

echo "$DIR/node_modules"
