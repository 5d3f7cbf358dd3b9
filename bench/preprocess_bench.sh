#!/usr/bin/env bash
# Preprocessing speed: `megatron preprocess-data` (GPT-2 BPE, 1 and N worker threads, end to end:
# read, JSON parse, tokenize, write .bin/.idx) against tiktoken's GPT-2 encoder in Node (one
# thread: read, JSON parse, encode) on the same JSONL corpus. Both time the work after the
# tokenizer is loaded (megatron: its summary's elapsed; tiktoken: its own clock). Token counts
# (with EOD per document) must agree; the script warns when they do not. Prints a Markdown table of MB/s
# and tokens/s. Builds nothing: pass the build folder that holds `megatron`.
#
# Usage: bench/preprocess_bench.sh BUILD_DIR [CORPUS.jsonl] [N_WORKERS]
#   CORPUS defaults to .cache/corpus/demo.jsonl, N_WORKERS to the number of CPUs.
#   VOCAB / MERGES override the GPT-2 files (default .cache/gpt2/{gpt2-vocab.json,vocab.json},
#   .cache/gpt2/{gpt2-merges.txt,merges.txt}). Each program runs ROUNDS times (default 3) and
#   the best round is reported.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${1:?usage: bench/preprocess_bench.sh BUILD_DIR [CORPUS.jsonl] [N_WORKERS]}"
corpus="${2:-$root/.cache/corpus/demo.jsonl}"
workers="${3:-$(nproc)}"
rounds="${ROUNDS:-3}"
megatron="$build/megatron"
[ -x "$megatron" ] || { echo "error: $megatron not found (build the megatron target first)" >&2; exit 1; }
[ -f "$corpus" ] || { echo "error: corpus $corpus not found (scripts/get-corpus.sh downloads it)" >&2; exit 1; }
pick() { for f in "$@"; do [ -f "$f" ] && { echo "$f"; return; }; done; echo ""; }
vocab="${VOCAB:-$(pick "$root/.cache/gpt2/gpt2-vocab.json" "$root/.cache/gpt2/vocab.json")}"
merges="${MERGES:-$(pick "$root/.cache/gpt2/gpt2-merges.txt" "$root/.cache/gpt2/merges.txt")}"
[ -n "$vocab" ] && [ -n "$merges" ] || { echo "error: GPT-2 vocab/merges not found under .cache/gpt2 (set VOCAB and MERGES)" >&2; exit 1; }

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
bytes=$(stat -c %s "$corpus")

# megatron: best of $rounds; the summary line carries tokens and elapsed seconds.
run_megatron() {
  local w=$1 best="" line secs tokens
  for _ in $(seq "$rounds"); do
    line=$("$megatron" preprocess-data --input "$corpus" --output-prefix "$tmp/out" \
      --tokenizer-type GPT2BPETokenizer --vocab-file "$vocab" --merge-file "$merges" \
      --append-eod --workers "$w" --log-interval 1000000000 2>/dev/null | grep '^documents:')
    secs=$(sed -E 's/.*elapsed: ([0-9.]+) s.*/\1/' <<<"$line")
    tokens=$(sed -E 's/.*tokens: ([0-9]+),.*/\1/' <<<"$line")
    if [ -z "$best" ] || awk "BEGIN{exit !($secs < ${best%% *})}"; then best="$secs $tokens"; fi
  done
  echo "$best"
}

row() {  # name seconds tokens
  awk -v n="$1" -v s="$2" -v t="$3" -v b="$bytes" \
    'BEGIN { printf "| %s | %.2f | %.2f | %.0f | %d |\n", n, s, b / 1e6 / s, t / s, t }'
}

echo "corpus: $corpus ($(awk -v b="$bytes" 'BEGIN{printf "%.1f", b/1e6}') MB), best of $rounds"
echo
echo "| program | seconds | MB/s | tokens/s | tokens |"
echo "|---|---|---|---|---|"
read -r s t < <(run_megatron 1); row "megatron preprocess-data --workers 1" "$s" "$t"
megatron_tokens=$t
if [ "$workers" -gt 1 ]; then
  read -r s t < <(run_megatron "$workers"); row "megatron preprocess-data --workers $workers" "$s" "$t"
fi
best=""
for _ in $(seq "$rounds"); do
  json=$(node "$root/bench/tiktoken_bench.mjs" "$corpus" text 1)
  secs=$(sed -E 's/.*"seconds":([0-9.e+-]+).*/\1/' <<<"$json")
  tokens=$(sed -E 's/.*"tokens":([0-9]+).*/\1/' <<<"$json")
  if [ -z "$best" ] || awk "BEGIN{exit !($secs < ${best%% *})}"; then best="$secs $tokens"; fi
done
read -r s t <<<"$best"; row "tiktoken (node, WASM, 1 thread)" "$s" "$t"
if [ "$t" != "$megatron_tokens" ]; then
  echo
  echo "warning: token counts differ (megatron $megatron_tokens, tiktoken $t): the encoders disagree"
fi
