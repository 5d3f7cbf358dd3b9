#!/usr/bin/env bash
# Installs the Node packages the reference programs use (tests/reference/package.json).
set -euo pipefail
cd "$(dirname "$0")/../tests/reference"
if [ -f package.json ] && [ ! -d node_modules ]; then
  npm ci --silent --no-audit --no-fund >/dev/null 2>&1 || npm install --silent --no-audit --no-fund >/dev/null
fi
