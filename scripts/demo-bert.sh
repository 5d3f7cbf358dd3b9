#!/usr/bin/env bash
# BERT demo: set up, build, get the demo corpus, make a WordPiece vocabulary from it, split it
# into sentences and preprocess it with BertWordPieceLowerCase, train a small BERT on the CPU
# with `megatron pretrain-bert` (Megatron's masked samples and masked-LM loss; without the
# sentence-order head, --bert-no-binary-head, so the small model's steps all go to the masked
# tokens), then compare its validation masked-LM loss with the corpus's unigram entropy (the loss
# of a model that ignores context), and score the checkpoint with `megatron evaluate` (the
# masked-LM loss and accuracy on the validation split).
# Environment: DEMO_ITERS (training iterations, default 5000), DEMO_MINUTES (training stops and
# saves after this many minutes, default 10), DEMO_THREADS (default 2), BUILD_DIR (default
# build), SKIP_SETUP=1 to skip scripts/setup.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR="${BUILD_DIR:-build}"
ITERS="${DEMO_ITERS:-5000}"
MINUTES="${DEMO_MINUTES:-10}"
export OMP_NUM_THREADS="${DEMO_THREADS:-2}" OPENBLAS_NUM_THREADS=1
[ "${SKIP_SETUP:-0}" = 1 ] || scripts/setup.sh
BUILD_DIR="$BUILD_DIR" scripts/build.sh
scripts/get-corpus.sh
MEGATRON="$BUILD_DIR/megatron"
OUT=.cache/demo-bert
mkdir -p "$OUT"

# --- vocabulary and preprocessing (documents split into sentences, as BERT's samples need) ---
if [ ! -s "$OUT/vocab.txt" ]; then
  python3 tests/reference/bert_wordpiece_reference.py make-vocab "$OUT/vocab.txt" .cache/corpus/demo.jsonl
fi
TOK=(--tokenizer-type BertWordPieceLowerCase --vocab-file "$OUT/vocab.txt")
if [ ! -s "$OUT/demo_text_sentence.idx" ]; then
  "$MEGATRON" preprocess-data --input .cache/corpus/demo.jsonl --output-prefix "$OUT/demo" \
    "${TOK[@]}" --split-sentences --workers "$OMP_NUM_THREADS"
fi
"$MEGATRON" inspect-data "$OUT/demo_text_sentence" --entropy | tee "$OUT/data_summary.txt"
BASELINE="$(sed -n 's/^unigram entropy: \([0-9.]*\) .*/\1/p' "$OUT/data_summary.txt")"

# --- training ---
rm -rf "$OUT/ckpt"
"$MEGATRON" pretrain-bert --num-layers 2 --hidden-size 128 --num-attention-heads 4 \
  --seq-length 64 --max-position-embeddings 64 "${TOK[@]}" --bert-no-binary-head \
  --micro-batch-size 32 --global-batch-size 32 --train-iters "$ITERS" \
  --lr 5e-4 --min-lr 5e-5 --lr-decay-style linear --lr-warmup-iters 300 \
  --weight-decay 0.01 --clip-grad 1.0 --hidden-dropout 0 --attention-dropout 0 \
  --data-path "$OUT/demo_text_sentence" --split 98,2,0 --data-cache-path "$OUT/cache" \
  --log-interval 100 --eval-interval 500 --eval-iters 20 \
  --save "$OUT/ckpt" --save-interval "$ITERS" --exit-duration-in-mins "$MINUTES" 2>&1 |
  tee "$OUT/train.log"
VALID="$(sed -n 's/.*validation loss at iteration *\([0-9]*\) | lm loss value: \([0-9.E+-]*\).*/\1 \2/p' \
  "$OUT/train.log" | tail -n 1)"
if [ -n "$VALID" ] && [ -n "$BASELINE" ]; then
  python3 -c 'import sys; it, v, b = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]);
w = "below" if v < b else "above"; print(
    f"validation masked-LM loss at iteration {it}: {v:.3f} nats/token; unigram baseline: {b:.3f} "
    f"({abs(b - v):.3f} {w} it)")' $VALID "$BASELINE"
fi

# --- the checkpoint's masked-LM accuracy on the validation split (from its first sample) ---
if [ -s "$OUT/ckpt/latest_checkpointed_iteration.txt" ]; then
  "$MEGATRON" evaluate --load "$OUT/ckpt" --use-checkpoint-args "${TOK[@]}" \
    --data-path "$OUT/demo_text_sentence" --split 98,2,0 --data-cache-path "$OUT/cache" \
    --micro-batch-size 32 --global-batch-size 32 --train-iters "$ITERS" --eval-interval 500 \
    --eval-iters 20 2>&1 | tee "$OUT/evaluate.log"
fi
