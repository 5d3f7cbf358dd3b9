#!/usr/bin/env bash
# Demo: set up, build, get the demo corpus, preprocess it with the GPT-2 BPE tokenizer, train a
# small GPT on the CPU (about 1.2M tokens: 6-8 minutes on 2 idle cores), compare its validation
# loss with the corpus's unigram entropy (the loss of a model that ignores context), print a few
# sampled generations, then start `megatron serve` on the checkpoint (a free loopback port), ask
# it one question through the REST API with curl, print the answer and stop the server.
# Environment: DEMO_ITERS (training iterations, default 600), DEMO_MINUTES (training stops and
# saves after this many minutes, default 15), DEMO_THREADS (default 2), BUILD_DIR (default
# build), SKIP_SETUP=1 to skip scripts/setup.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR="${BUILD_DIR:-build}"
ITERS="${DEMO_ITERS:-600}"
MINUTES="${DEMO_MINUTES:-15}"
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
# A small model (4 layers, hidden 128) so that most of the compute goes to tokens: with the GPT-2
# vocabulary the output layer dominates, and what lowers the loss in a few minutes is how many
# tokens the model sees, not its width.
"$MEGATRON" inspect-data "$OUT/demo_text_document" --entropy | tee "$OUT/data_summary.txt"
BASELINE="$(sed -n 's/^unigram entropy: \([0-9.]*\) .*/\1/p' "$OUT/data_summary.txt")"
MODEL=(--num-layers 4 --hidden-size 128 --num-attention-heads 4 --seq-length 128
       --max-position-embeddings 128 --openai-gelu)
rm -rf "$OUT/ckpt"
"$MEGATRON" pretrain-gpt "${MODEL[@]}" "${TOK[@]}" \
  --micro-batch-size 16 --global-batch-size 16 --train-iters "$ITERS" \
  --lr 5e-3 --min-lr 1e-4 --lr-decay-style cosine --lr-warmup-iters 20 --adam-beta2 0.95 \
  --weight-decay 0.1 --clip-grad 1.0 --hidden-dropout 0 --attention-dropout 0 \
  --data-path "$OUT/demo_text_document" --split 98,2,0 --data-cache-path "$OUT/cache" \
  --log-interval 25 --log-throughput --eval-interval 100 --eval-iters 10 \
  --save "$OUT/ckpt" --save-interval "$ITERS" --exit-duration-in-mins "$MINUTES" 2>&1 |
  tee "$OUT/train.log"
VALID="$(sed -n 's/.*validation loss at iteration *\([0-9]*\) | lm loss value: \([0-9.E+-]*\).*/\1 \2/p' \
  "$OUT/train.log" | tail -n 1)"
if [ -n "$VALID" ] && [ -n "$BASELINE" ]; then
  python3 -c 'import sys; it, v, b = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]); print(
    f"validation loss at iteration {it}: {v:.3f} nats/token; unigram baseline: {b:.3f} "
    f"({b - v:.3f} below it; perplexity {2.718281828 ** v:.0f} vs {2.718281828 ** b:.0f})")' \
    $VALID "$BASELINE"
fi

# --- generation (top-k sampling, up to the end of the paragraph; greedy decoding of so small a
# model repeats itself) ---
"$MEGATRON" generate --use-checkpoint-args "${TOK[@]}" --load "$OUT/ckpt" \
  --top_k 20 --temperature 0.7 --seed 1 --num-tokens-to-generate 40 --stop-on-double-eol \
  --prompt "The jury said" --prompt "In the morning, the" --prompt "It was"

# --- serving: the REST API on a free loopback port, one question with curl ---
# --port 0 lets the kernel pick a free port; the server prints it ("serving on http://...").
# The model shape comes from the checkpoint's metadata.json (--use-checkpoint-args).
SERVE_LOG="$OUT/serve.log"
SERVER_PID=""
stop_server() {
  if [ -n "$SERVER_PID" ] && kill -0 "$SERVER_PID" 2>/dev/null; then
    kill -TERM "$SERVER_PID" 2>/dev/null || true
    wait "$SERVER_PID" 2>/dev/null || true
  fi
  SERVER_PID=""
}
trap stop_server EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
"$MEGATRON" serve --load "$OUT/ckpt" --use-checkpoint-args "${TOK[@]}" --host 127.0.0.1 --port 0 \
  > "$SERVE_LOG" 2>&1 &
SERVER_PID=$!
URL=""
for _ in $(seq 1 600); do  # up to a minute for the model to load
  if ! kill -0 "$SERVER_PID" 2>/dev/null; then
    cat "$SERVE_LOG" >&2
    echo "demo: megatron serve exited before it was ready" >&2
    exit 1
  fi
  URL="$(sed -n 's|.*serving on \(http://127\.0\.0\.1:[0-9][0-9]*\).*|\1|p' "$SERVE_LOG" | head -n 1)"
  if [ -n "$URL" ] && curl -sf "$URL/health" >/dev/null 2>&1; then break; fi
  URL=""
  sleep 0.1
done
if [ -z "$URL" ]; then
  cat "$SERVE_LOG" >&2
  echo "demo: megatron serve did not answer $URL/health within a minute" >&2
  exit 1
fi
echo "server ready at $URL: $(curl -sf "$URL/health")"
QUESTION="The jury said"
echo "PUT $URL/api  prompt: \"$QUESTION\" (top_k 20, temperature 0.7, 30 tokens)"
REPLY="$(curl -sS -X PUT "$URL/api" -H 'Content-Type: application/json' \
  -d "{\"prompts\": [\"$QUESTION\"], \"tokens_to_generate\": 30, \"top_k\": 20,
       \"temperature\": 0.7, \"random_seed\": 1, \"stop_on_double_eol\": true}")"
ANSWER="$(printf '%s' "$REPLY" | python3 -c 'import json, sys; print(json.load(sys.stdin)["text"][0])' 2>/dev/null)" ||
  { echo "demo: unexpected reply from the server: $REPLY" >&2; exit 1; }
echo "answer: $ANSWER"
stop_server
echo "server stopped"
