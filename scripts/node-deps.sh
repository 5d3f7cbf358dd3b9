#!/usr/bin/env bash
# Installs the Node packages the reference programs use (tests/reference/package.json, pinned by
# its package-lock.json) into tests/reference/node_modules with `npm ci`. Idempotent and quiet
# when the installed tree already matches the lock file.
set -euo pipefail
cd "$(dirname "$0")/../tests/reference"
[ -f package.json ] || exit 0
# npm writes node_modules/.package-lock.json after a complete install; newer than the lock = done.
if [ -f node_modules/.package-lock.json ] && [ node_modules/.package-lock.json -nt package-lock.json ]; then
  exit 0
fi
if ! command -v npm >/dev/null; then
  echo "error: npm not found; run scripts/setup.sh (installs node and npm)" >&2
  exit 1
fi
echo "node-deps: installing reference packages into tests/reference/node_modules"
npm ci --no-audit --no-fund --loglevel=error
