#!/usr/bin/env bash
# Demo: set up, build, get the demo corpus, preprocess it with the GPT-2 BPE tokenizer, train a
# small GPT on the CPU for a few minutes (2 threads), and print a few greedy generations.
# Environment: DEMO_ITERS (training iterations, default 150), DEMO_THREADS (default 2),
# BUILD_DIR (default build), SKIP_SETUP=1 to skip scripts/setup.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR="${BUILD_DIR:-build}"
ITERS="${DEMO_ITERS:-150}"
export OMP_NUM_THREADS="${DEMO_THREADS:-2}" OPENBLAS_NUM_THREADS=1
[ "${SKIP_SETUP:-0}" = 1 ] || scripts/setup.sh
BUILD_DIR="$BUILD_DIR" scripts/build.sh
scripts/get-corpus.sh
MEGATRON="$BUILD_DIR/megatron"
OUT=.cache/demo
mkdir -p "$OUT"
TOK=(--tokenizer-type GPT2BPETokenizer --vocab-file .cache/gpt2/gpt2-vocab.json
     --merge-file .cache/gpt2/gpt2-merges.txt)

# --- preprocessing ---
if [ ! -s "$OUT/demo_text_document.idx" ]; then
  "$MEGATRON" preprocess-data --input .cache/corpus/demo.jsonl --output-prefix "$OUT/demo" \
    "${TOK[@]}" --append-eod --workers "$OMP_NUM_THREADS"
fi

# --- training ---
MODEL=(--num-layers 4 --hidden-size 256 --num-attention-heads 4 --seq-length 128
       --max-position-embeddings 128 --openai-gelu)
rm -rf "$OUT/ckpt"
"$MEGATRON" pretrain-gpt "${MODEL[@]}" "${TOK[@]}" \
  --micro-batch-size 8 --global-batch-size 16 --train-iters "$ITERS" \
  --lr 1e-3 --min-lr 1e-4 --lr-decay-style cosine --lr-warmup-fraction 0.05 --weight-decay 0.1 \
  --clip-grad 1.0 --hidden-dropout 0 --attention-dropout 0 \
  --data-path "$OUT/demo_text_document" --split 98,2,0 --data-cache-path "$OUT/cache" \
  --log-interval 10 --log-throughput --eval-interval 100 --eval-iters 5 \
  --save "$OUT/ckpt" --save-interval "$ITERS" --exit-duration-in-mins 5

# --- generation (greedy) ---
"$MEGATRON" generate "${MODEL[@]}" "${TOK[@]}" --load "$OUT/ckpt" --top_k 1 \
  --num-tokens-to-generate 30 \
  --prompt "The jury said" --prompt "In the morning, the" --prompt "It was"
