#!/usr/bin/env bash
# Shared by the install scripts: `pip_venv NAME DIR SPEC` puts the pinned
# PyPI package SPEC into the venv DIR/venv (made with $PYTHON, python3 by
# default; a half-made venv from an interrupted run is recreated). Sourced.

pip_venv() {
  local name="$1" dir="$2" spec="$3"
  local python="${PYTHON:-python3}"
  echo "installing $spec into $dir" >&2
  command -v "$python" >/dev/null || { echo "$name: $python not found (python3 with venv and pip is required)" >&2; exit 1; }
  if [ ! -x "$dir/venv/bin/python" ]; then
    rm -rf "$dir/venv"
    "$python" -m venv "$dir/venv" >&2
  fi
  "$dir/venv/bin/python" -m pip install --quiet --disable-pip-version-check "$spec" >&2
}
