#!/usr/bin/env bash
# Azurite, Azure's storage emulator (npm), into .cache/azurite: the test suite starts its blob service on
# 127.0.0.1 to test az:// stores (tests/store/conftest.py). Pinned by scripts/azurite/package-lock.json;
# a second run with the same lock file does nothing. Without node/npm it says so and exits 0: the az://
# tests then skip, naming the missing tool; so does a failed npm ci (no registry), which it reports.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
dest="$here/.cache/azurite"
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  echo "install_azurite: node/npm not found; the az:// store tests will skip (install Node.js 20+ to run them)" >&2
  exit 0
fi
if [ -x "$dest/node_modules/.bin/azurite-blob" ] && cmp -s "$here/scripts/azurite/package-lock.json" "$dest/package-lock.json"; then
  exit 0
fi
mkdir -p "$dest"
cp "$here/scripts/azurite/package.json" "$here/scripts/azurite/package-lock.json" "$dest/"
if ! npm ci --prefix "$dest" --ignore-scripts --no-audit --no-fund --loglevel=error; then
  rm -rf "$dest/node_modules"
  echo "install_azurite: npm ci failed (above); the az:// store tests will skip until \`make azurite\` succeeds" >&2
fi
