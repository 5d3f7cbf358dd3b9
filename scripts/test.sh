#!/usr/bin/env bash
# Everything a fresh machine needs to run the whole test suite: install, build, run every test.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/node-deps.sh
scripts/get-corpus.sh
scripts/build.sh
cd "${BUILD_DIR:-build}"
ctest --output-on-failure -j "${JOBS:-$(nproc)}" --timeout 900 "$@"
