#!/usr/bin/env bash
# Builds the libFuzzer targets of this folder (clang, -fsanitize=fuzzer,address,undefined) and
# runs each for a set time, printing the executions and the outcome. Not part of CI: run by hand.
#   tests/fuzz/run_fuzzers.sh [SECONDS_PER_TARGET] [TARGET ...]     (default 600 s, all targets)
#   RUNS=1000000 tests/fuzz/run_fuzzers.sh 0 npy     (stop after RUNS inputs; 0 s = no time limit)
# Targets: http_request npy safetensors indexed_dataset jsonl gpt2_bpe parquet hf_tokenizer
# sampling hf_import. Findings (crash-*,
# leak-*, timeout-*) are written to build-fuzz/findings/TARGET/; the corpus grows in
# build-fuzz/corpus/TARGET (seeded from tests/fuzz/seeds/TARGET). Needs clang and libclang-rt
# (Debian: clang, libclang-rt-14-dev), pkg-config and the development packages the library
# links (the same as the main build: nlohmann-json3-dev, libutf8proc-dev,
# libsentencepiece-dev, libpcre2-dev, libsnappy-dev, libzstd-dev, zlib1g-dev; all installed
# by scripts/setup.sh), and GPT-2's files in .cache/gpt2 for gpt2_bpe (scripts/get-corpus.sh).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${FUZZ_BUILD:-$ROOT/build-fuzz}
SECONDS_PER_TARGET=${1:-600}
RUNS=${RUNS:-}
shift || true
TARGETS=("$@")
if [ ${#TARGETS[@]} -eq 0 ]; then
  TARGETS=(http_request npy safetensors indexed_dataset jsonl gpt2_bpe parquet hf_tokenizer sampling
           hf_import)
fi
CXX=${FUZZ_CXX:-clang++}
FLAGS=(-std=c++20 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined
       -I"$ROOT/src" -DMEGATRON_VERSION='"fuzz"' -Wno-unused-command-line-argument)

# The library code the targets reach: core and data, and the HTTP parser, built once with the
# sanitizers (without main; libFuzzer provides it) into a static archive, so that a target links
# only the objects it uses.
mkdir -p "$OUT/obj"
# sampling: the sampler and the request parsers; hf_import: the Hugging Face importer with the
# checks it calls (check_finite_tensor). The rest of src/training, model and comm is not built: the
# importer never calls into it: hf_import links with a trap for each function its objects name
# from there (a call would crash the target, a finding, not a silent pass).
LIB_SOURCES=("$ROOT"/src/core/*.cpp "$ROOT"/src/data/*.cpp "$ROOT/src/inference/server_http_parser.cpp"
             "$ROOT"/src/inference/{sampling,server_api,server_completions,server_fields}.cpp
             "$ROOT"/src/training/{hf_checkpoint_import,hf_checkpoint,checkpoint_integrity}.cpp)
OBJECTS=()
for src in "${LIB_SOURCES[@]}"; do
  obj="$OUT/obj/$(basename "$(dirname "$src")")_$(basename "${src%.cpp}").o"
  if [ ! -f "$obj" ] || [ "$src" -nt "$obj" ]; then
    echo "fuzz: compiling $src" >&2
    "$CXX" "${FLAGS[@]/-fsanitize=fuzzer,/-fsanitize=fuzzer-no-link,}" -c "$src" -o "$obj"
  fi
  OBJECTS+=("$obj")
done
LIB="$OUT/libmegatron_fuzz.a"
if [ ! -f "$LIB" ] || [ -n "$(find "$OUT/obj" -newer "$LIB" -name '*.o' | head -1)" ]; then
  rm -f "$LIB"
  ar rcs "$LIB" "${OBJECTS[@]}"
fi
# The libraries src/core and src/data link (as in CMakeLists.txt).
read -r -a LIBS <<< "$(pkg-config --libs sentencepiece libpcre2-8 snappy libzstd zlib) -lutf8proc -lpthread"

summary=()
for t in "${TARGETS[@]}"; do
  src="$ROOT/tests/fuzz/fuzz_$t.cpp"
  bin="$OUT/fuzz_$t"
  [ -f "$src" ] || { echo "fuzz: no target $t ($src)" >&2; exit 1; }
  if [ ! -f "$bin" ] || [ "$src" -nt "$bin" ] || [ "$LIB" -nt "$bin" ]; then
    echo "fuzz: linking $bin" >&2
    extra=()
    if [ "$t" = hf_import ]; then
      # The functions of src/training and src/model that the importer's objects name but never
      # call (the export's, the checkpoint writer's) become traps: a call would be a crash.
      stubs="$OUT/hf_import_stubs.cpp"
      { "$CXX" "${FLAGS[@]}" "$src" "$LIB" -o "$bin" "${LIBS[@]}" -lcrypto -Wl,--no-demangle 2>&1 || true; } |
        grep -o "undefined reference to \`[^']*'" | sed "s/undefined reference to \`\(.*\)'/\1/" |
        sort -u | awk '{printf "extern \"C\" void trap_%d() __asm__(\"%s\");\n", NR, $0;
                        printf "extern \"C\" void trap_%d() { __builtin_trap(); }\n", NR}' > "$stubs"
      extra=("$stubs" -lcrypto)
    fi
    "$CXX" "${FLAGS[@]}" "$src" "${extra[@]}" "$LIB" -o "$bin" "${LIBS[@]}"
  fi
  corpus="$OUT/corpus/$t" findings="$OUT/findings/$t"
  mkdir -p "$corpus" "$findings"
  [ -d "$ROOT/tests/fuzz/seeds/$t" ] && cp -n "$ROOT/tests/fuzz/seeds/$t"/* "$corpus"/ 2>/dev/null || true
  max_len=65536
  [ "$t" = gpt2_bpe ] && max_len=8192  # long texts only slow it down: pieces are short
  [ "$t" = sampling ] && max_len=4096
  log="$OUT/fuzz_$t.log"
  limits=(-max_total_time="$SECONDS_PER_TARGET")
  [ -n "$RUNS" ] && limits+=(-runs="$RUNS")
  echo "fuzz: running $t (${limits[*]}; log $log)" >&2
  start=$(date +%s)
  set +e
  (cd "$ROOT" && GPT2_DIR="$ROOT/.cache/gpt2" "$bin" "${limits[@]}" \
     -timeout=10 -rss_limit_mb=2048 -max_len=$max_len -print_final_stats=1 \
     -artifact_prefix="$findings/" "$corpus" > "$log" 2>&1)
  rc=$?
  set -e
  elapsed=$(( $(date +%s) - start ))
  runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -1)
  units=$(find "$corpus" -type f | wc -l)
  result=$([ $rc -eq 0 ] && echo "no crash" || echo "FAILED (exit $rc; see $log and $findings)")
  summary+=("$t: ${runs:-?} executions in $elapsed s, corpus $units files, $result")
done
printf '%s\n' "${summary[@]}"
