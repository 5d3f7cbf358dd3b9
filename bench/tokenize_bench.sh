#!/usr/bin/env bash
# Tokenizer throughput beside the reference programs, one thread each, same corpus, tokenizer
# loading excluded, texts read before timing:
#  - TikTokenizer (cl100k_base ranks, pattern v1; o200k_base ranks, pattern v2) vs tiktoken (npm,
#    WASM) with the same ranks and pattern;
#  - HuggingFaceTokenizer (tokenizer.json built from the cl100k_base / o200k_base ranks) vs
#    tiktoken's cl100k_base / o200k_base;
#  - GPTSentencePieceTokenizer / Llama2Tokenizer (BPE and unigram models trained on the Brown
#    corpus) vs python3-sentencepiece with Megatron's wrapper.
# Token counts of each pair must agree (the script says so when they do not). Prints a Markdown
# table. Builds nothing: pass the build folder holding bench/tokenize_bench_any.
# Usage: bench/tokenize_bench.sh BUILD_DIR [CORPUS.jsonl] (default .cache/corpus/demo.jsonl);
#        ROUNDS (default 3) rounds each, best reported.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${1:?usage: bench/tokenize_bench.sh BUILD_DIR [CORPUS.jsonl]}"
corpus="${2:-$root/.cache/corpus/demo.jsonl}"
rounds="${ROUNDS:-3}"
bench="$build/bench/tokenize_bench_any"
[ -x "$bench" ] || { echo "error: $bench not found (build the tokenize_bench_any target)" >&2; exit 1; }
[ -f "$corpus" ] || { echo "error: corpus $corpus not found (scripts/get-corpus.sh)" >&2; exit 1; }
ref="$root/tests/reference"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

field() { sed -E "s/.*\"$2\": ?([0-9.e+-]+).*/\1/" <<<"$1"; }
best_of() {  # command...: best JSON line by seconds
  local best="" line
  for _ in $(seq "$rounds"); do
    line=$("$@" | tail -1)
    if [ -z "$best" ] || awk "BEGIN{exit !($(field "$line" seconds) < $(field "$best" seconds))}"; then
      best="$line"
    fi
  done
  echo "$best"
}
row() {  # name json
  printf '| %s | %.2f | %.2f | %.0f | %s |\n' "$1" "$(field "$2" seconds)" "$(field "$2" mb_per_s)" \
    "$(field "$2" tokens_per_s)" "$(field "$2" tokens)"
}
pair() {  # name-ours json-ours name-ref json-ref
  row "$1" "$2"
  row "$3" "$4"
  [ "$(field "$2" tokens)" = "$(field "$4" tokens)" ] || echo "| (token counts differ!) | | | | |"
}

node "$ref/tiktoken_ranks.mjs" ranks cl100k_base "$tmp/cl100k.tiktoken"
node "$ref/tiktoken_ranks.mjs" ranks o200k_base "$tmp/o200k.tiktoken"
node "$ref/tiktoken_ranks.mjs" hf cl100k_base "$tmp/hf_cl100k"
node "$ref/tiktoken_ranks.mjs" hf o200k_base "$tmp/hf_o200k" --merge-pairs --ignore-merges
python3=/usr/bin/python3
# SentencePiece training text: the first 2 MB of the Brown corpus.
$python3 -c "
import json, sys
text = ''.join(json.loads(l)['text'] + '\\n' for l in open(sys.argv[1]) if l.strip())
open(sys.argv[2], 'w').write(text[:2000000])" "$root/.cache/corpus/brown.jsonl" "$tmp/train.txt"
for t in bpe unigram; do
  $python3 "$ref/sentencepiece_reference.py" train --input "$tmp/train.txt" --model-prefix "$tmp/sp_$t" \
    --model-type $t --vocab-size 8000
done

echo "corpus: $corpus ($(stat -c %s "$corpus") bytes), best of $rounds, one thread"
echo
echo "| encoder | seconds | MB/s | tokens/s | tokens |"
echo "|---|---|---|---|---|"
pair "TikTokenizer cl100k_base v1" \
  "$(best_of "$bench" "$corpus" 1 --tokenizer-type TikTokenizer --tokenizer-model "$tmp/cl100k.tiktoken" --tiktoken-pattern v1 --vocab-size 101256)" \
  "tiktoken cl100k_base ranks, pattern v1 (node)" \
  "$(best_of node "$ref/tiktoken_ranks.mjs" encode cl100k_base --pattern v1 --bench "$corpus")"
pair "TikTokenizer o200k_base v2 (131072)" \
  "$(best_of "$bench" "$corpus" 1 --tokenizer-type TikTokenizer --tokenizer-model "$tmp/o200k.tiktoken" --tiktoken-pattern v2)" \
  "tiktoken o200k_base ranks cut, pattern v2 (node)" \
  "$(best_of node "$ref/tiktoken_ranks.mjs" encode o200k_base --pattern v2 --cut 130072 --bench "$corpus")"
pair "HuggingFaceTokenizer cl100k tokenizer.json" \
  "$(best_of "$bench" "$corpus" 1 --tokenizer-type HuggingFaceTokenizer --tokenizer-model "$tmp/hf_cl100k")" \
  "tiktoken cl100k_base (node)" \
  "$(best_of node "$ref/tiktoken_ranks.mjs" encode cl100k_base --all-special --bench "$corpus")"
pair "HuggingFaceTokenizer o200k tokenizer.json" \
  "$(best_of "$bench" "$corpus" 1 --tokenizer-type HuggingFaceTokenizer --tokenizer-model "$tmp/hf_o200k")" \
  "tiktoken o200k_base (node)" \
  "$(best_of node "$ref/tiktoken_ranks.mjs" encode o200k_base --all-special --bench "$corpus")"
for t in bpe unigram; do
  for flavor in GPTSentencePieceTokenizer Llama2Tokenizer; do
    pair "$flavor ($t, 8000)" \
      "$(best_of "$bench" "$corpus" 1 --tokenizer-type $flavor --tokenizer-model "$tmp/sp_$t.model")" \
      "python3-sentencepiece $flavor ($t)" \
      "$(best_of $python3 "$ref/sentencepiece_reference.py" bench --model "$tmp/sp_$t.model" --flavor $flavor "$corpus")"
  done
done
