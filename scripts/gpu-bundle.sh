#!/usr/bin/env bash
# Builds the bundle scripts/gpu-check.sh unpacks on a GPU machine that has a driver, CUDA, PyTorch,
# CMake and Ninja but none of the Debian libraries this project links (no package registry
# either): the CUDA build of `megatron`, the test binaries of the op-case table and the CUDA
# backend, and generate_bench, with every shared library they load except those the GPU machine
# has (the C library, libstdc++ and libgcc_s, the driver, cuBLAS(Lt) and NCCL: CUDA's own or
# PyTorch's). Host code is built for a portable x86-64 level (MEGATRON_CPU_ARCH, default
# x86-64-v3) instead of this CPU's, device code for Hopper (sm_90, with PTX).
#
# Usage: scripts/gpu-bundle.sh [BUILD_DIR]      (default build-gpu; needs nvcc: a CUDA build)
# Writes BUILD_DIR/bundle/megatron-gpu.tar.xz (under 64 MiB, checked) and prints its size. The
# folder BUILD_DIR/bundle is what a device call carries (it is ignored by git, as every build*).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR="${1:-build-gpu}"
ARCH="${MEGATRON_CPU_ARCH:-x86-64-v3}"
LIMIT=$((64 * 1024 * 1024))
TARGETS=(megatron test_kernels test_cuda generate_bench)

command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ] ||
  { echo "error: no nvcc: the bundle is a CUDA build (install the CUDA toolkit)" >&2; exit 1; }
export PATH="$PATH:/usr/local/cuda/bin"
if [ ! -f "$BUILD_DIR/build.ninja" ]; then
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMEGATRON_CPU_ARCH="$ARCH" \
    -DMEGATRON_CUDA_ARCHITECTURES=90 -DCMAKE_CXX_COMPILER_LAUNCHER=ccache \
    -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache >/dev/null
fi
grep -q "MEGATRON_HAVE_CUDA" "$BUILD_DIR/build.ninja" ||
  { echo "error: $BUILD_DIR is not a CUDA build (configured without nvcc?)" >&2; exit 1; }
cmake --build "$BUILD_DIR" -j "${JOBS:-2}" --target "${TARGETS[@]}"

STAGE="$BUILD_DIR/bundle-stage/megatron-gpu"
rm -rf "$BUILD_DIR/bundle-stage" && mkdir -p "$STAGE/bin" "$STAGE/lib"
cp "$BUILD_DIR/megatron" "$BUILD_DIR/tests/test_kernels" "$BUILD_DIR/tests/test_cuda" \
   "$BUILD_DIR/bench/generate_bench" "$STAGE/bin/"
strip --strip-unneeded "$STAGE"/bin/*

# Libraries the GPU machine provides itself (or must: the driver, cuBLAS, NCCL are far too large
# to carry; gpu-check.sh finds them there and says which are missing). libcudart is carried: the
# runtime this build compiled against is small (the driver must support it).
keep_out='^(linux-vdso|ld-linux|libc\.so|libm\.so|libdl\.so|libpthread\.so|librt\.so|'
keep_out+='libresolv\.so|libstdc\+\+\.so|libgcc_s\.so|libcuda\.so|libcublas|libnccl)'
for bin in "$STAGE"/bin/*; do
  ldd "$bin" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}'
done | sort -u | while read -r name path; do
  if ! [[ "$name" =~ $keep_out ]]; then cp -L "$path" "$STAGE/lib/$name"; fi
done
{
  echo "megatron.cpp GPU bundle"
  changes=$(git diff --quiet HEAD -- src CMakeLists.txt || echo ' (with uncommitted changes)')
  echo "commit: $(git rev-parse HEAD)$changes"
  echo "built: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -m)," \
       "$(. /etc/os-release && echo "$PRETTY_NAME")"
  echo "host code: -march=$ARCH; device code: sm_90 + PTX; $(nvcc --version | tail -1)"
  echo "needs from the machine: glibc >= $(ldd --version | head -1 | awk '{print $NF}')," \
       "libstdc++, libcublasLt.so.13, (multi-GPU) libnccl.so.2"
  echo "binaries:"; (cd "$STAGE/bin" && ls -l | awk 'NR > 1 {print "  " $9, $5}')
  echo "libraries:"; (cd "$STAGE/lib" && ls -l | awk 'NR > 1 {print "  " $9, $5}')
} >"$STAGE/MANIFEST"

mkdir -p "$BUILD_DIR/bundle"
OUT_FILE="$BUILD_DIR/bundle/megatron-gpu.tar.xz"
tar -C "$BUILD_DIR/bundle-stage" -cf - megatron-gpu | xz -T0 -9 >"$OUT_FILE.tmp"
mv "$OUT_FILE.tmp" "$OUT_FILE"
size=$(stat -c %s "$OUT_FILE")
unpacked=$(du -sb "$STAGE" | awk '{print $1}')
awk -v f="$OUT_FILE" -v s="$size" -v u="$unpacked" -v n="$(ls "$STAGE/lib" | wc -l)" \
  'BEGIN {printf "bundle: %s: %.1f MiB (%.1f MiB unpacked, %d libraries)\n", f, s / 1048576,
          u / 1048576, n}'
if [ "$size" -ge "$LIMIT" ]; then
  echo "error: the bundle is over 64 MiB: a device call carries at most 64 MiB with the tree" >&2
  exit 1
fi
