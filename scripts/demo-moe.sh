#!/usr/bin/env bash
# Mixture-of-experts demo: set up, build, get the demo corpus, preprocess it with the GPT-2 BPE
# tokenizer, train a small Mixtral-shaped model on the CPU with `megatron pretrain-gpt` (Llama
# style: RMSNorm, SwiGLU, rotary positions, grouped-query attention, untied output layer; every
# layer's FFN a mixture of 8 SwiGLU experts, top-2 softmax routing, the load-balancing and z
# losses), print its loss curve and each MoE layer's share of the last iterations' routed tokens
# per expert (balanced: 1/8 each), compare its validation loss with the corpus's unigram entropy,
# export the checkpoint to Hugging Face's MixtralForCausalLM with `checkpoint convert`, read the
# export with an independent float64 forward of transformers' Mixtral definition
# (tests/reference/mixtral_reference.py) and compare its log-probs of generated sequences with
# `megatron generate`'s, and sample a few continuations from the checkpoint.
# Environment: DEMO_ITERS (training iterations, default 300), DEMO_MINUTES (training stops and
# saves after this many minutes, default 5), DEMO_THREADS (default 2), BUILD_DIR (default
# build), SKIP_SETUP=1 to skip scripts/setup.sh, SKIP_BUILD=1 to use $BUILD_DIR/megatron as built.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR="${BUILD_DIR:-build}"
ITERS="${DEMO_ITERS:-300}"
MINUTES="${DEMO_MINUTES:-5}"
export OMP_NUM_THREADS="${DEMO_THREADS:-2}" OPENBLAS_NUM_THREADS=1
[ "${SKIP_SETUP:-0}" = 1 ] || scripts/setup.sh
[ "${SKIP_BUILD:-0}" = 1 ] || BUILD_DIR="$BUILD_DIR" scripts/build.sh
scripts/get-corpus.sh
MEGATRON="$BUILD_DIR/megatron"
OUT=.cache/demo-moe
mkdir -p "$OUT"
TOK=(--tokenizer-type GPT2BPETokenizer --vocab-file .cache/gpt2/gpt2-vocab.json
     --merge-file .cache/gpt2/gpt2-merges.txt)

# --- preprocessing (the GPT demo's; shared when it has run) ---
DATA_PREFIX=.cache/demo/demo_text_document
if [ ! -s "$DATA_PREFIX.idx" ]; then
  DATA_PREFIX="$OUT/demo_text_document"
  [ -s "$DATA_PREFIX.idx" ] || "$MEGATRON" preprocess-data --input .cache/corpus/demo.jsonl \
    --output-prefix "$OUT/demo" "${TOK[@]}" --append-eod --workers "$OMP_NUM_THREADS"
fi
"$MEGATRON" inspect-data "$DATA_PREFIX" --entropy | tee "$OUT/data_summary.txt"
BASELINE="$(sed -n 's/^unigram entropy: \([0-9.]*\) .*/\1/p' "$OUT/data_summary.txt")"

# --- training ---
# Mixtral's shape at a CPU's scale: 4 layers of hidden 128, 4 heads in 2 key-value groups, each
# layer 8 experts of width 256 with top-2 routing (Mixtral: 32 layers of 4096, 8 experts, top-2).
# --make-vocab-size-divisible-by 1 keeps the vocabulary at the tokenizer's 50257 rows, as the
# export has them: padded rows would add their share to every softmax, and the log-probs of the
# two forwards would differ by it.
MODEL=(--num-layers 4 --hidden-size 128 --num-attention-heads 4 --group-query-attention
       --num-query-groups 2 --seq-length 128 --max-position-embeddings 128
       --normalization RMSNorm --swiglu --position-embedding-type rope --disable-bias-linear
       --untie-embeddings-and-output-weights --ffn-hidden-size 256 --make-vocab-size-divisible-by 1
       --num-experts 8 --moe-ffn-hidden-size 256 --moe-router-topk 2
       --moe-router-load-balancing-type aux_loss --moe-aux-loss-coeff 0.01 --moe-z-loss-coeff 0.001)
rm -rf "$OUT/ckpt" "$OUT/metrics.jsonl"
"$MEGATRON" pretrain-gpt "${MODEL[@]}" "${TOK[@]}" \
  --micro-batch-size 8 --global-batch-size 8 --train-iters "$ITERS" \
  --lr 5e-3 --min-lr 1e-4 --lr-decay-style cosine --lr-warmup-iters "$(( ITERS < 40 ? 1 : 20 ))" --adam-beta2 0.95 \
  --weight-decay 0.1 --clip-grad 1.0 --hidden-dropout 0 --attention-dropout 0 \
  --data-path "$DATA_PREFIX" --split 98,2,0 --data-cache-path "$OUT/cache" \
  --log-interval 20 --log-throughput --eval-interval 100 --eval-iters 10 \
  --log-metrics-jsonl "$OUT/metrics.jsonl" \
  --save "$OUT/ckpt" --save-interval "$ITERS" --exit-duration-in-mins "$MINUTES" 2>&1 |
  tee "$OUT/train.log"

# The loss curve and the expert shares of the last logged interval, from the metrics file.
python3 - "$OUT/metrics.jsonl" <<'PY'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
print("iteration  lm loss  load_balancing_loss  z_loss")
for r in rows:
    print(f"{r['iteration']:9d}  {r['lm_loss']:7.3f}  {r.get('load_balancing_loss', 0):19.4f}  "
          f"{r.get('z_loss', 0):6.3f}")
last = rows[-1]
shares = last.get("moe_expert_token_shares", {})
E = len(next(iter(shares.values()))) if shares else 0
print(f"routed tokens per expert, iterations {rows[-2]['iteration'] + 1 if len(rows) > 1 else 1}-"
      f"{last['iteration']} (balanced: {1 / max(E, 1):.3f} each):")
for layer, s in sorted(shares.items(), key=lambda kv: int(kv[0])):
    print(f"  layer {layer}: " + " ".join(f"{v:.3f}" for v in s) +
          f"   (min {min(s) * E:.2f}x, max {max(s) * E:.2f}x of 1/{E})")
PY
VALID="$(sed -n 's/.*validation loss at iteration *\([0-9]*\) | lm loss value: \([0-9.E+-]*\).*/\1 \2/p' \
  "$OUT/train.log" | tail -n 1)"
if [ -n "$VALID" ] && [ -n "$BASELINE" ]; then
  python3 -c 'import sys; it, v, b = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]); print(
    f"validation loss at iteration {it}: {v:.3f} nats/token; unigram baseline: {b:.3f} "
    f"({b - v:.3f} below it)")' $VALID "$BASELINE"
fi

# --- Hugging Face export, read by an independent float64 Mixtral ---
rm -rf "$OUT/hf"
"$MEGATRON" checkpoint convert --load "$OUT/ckpt" --save "$OUT/hf" --save-format hf "${TOK[@]}"
python3 -c 'import json, sys; c = json.load(open(sys.argv[1])); print("exported:", c["architectures"],
  {k: c[k] for k in ("num_hidden_layers", "hidden_size", "num_local_experts", "num_experts_per_tok",
                     "num_key_value_heads", "vocab_size")})' "$OUT/hf/config.json"
PROMPTS=(--prompt "The jury said" --prompt "In the morning, the" --prompt "It was")
"$MEGATRON" --log-level warn generate --load "$OUT/ckpt" --use-checkpoint-args "${TOK[@]}" \
  "${PROMPTS[@]}" --num-tokens-to-generate 16 --top_k 1 --return-log-probs --output-format jsonl \
  | grep '^{' >"$OUT/greedy.jsonl"
python3 -c 'import json, sys; json.dump([json.loads(l)["tokens"] for l in open(sys.argv[1])],
  open(sys.argv[2], "w"))' "$OUT/greedy.jsonl" "$OUT/tokens.json"
/usr/bin/python3 tests/reference/mixtral_reference.py logprobs "$OUT/tokens.json" "$OUT/hf" \
  >"$OUT/reference.json"
python3 - "$OUT/greedy.jsonl" "$OUT/reference.json" "$OUT/hf" <<'PY'
import json, sys
ours = [json.loads(line)["logprobs"] for line in open(sys.argv[1])]
text = open(sys.argv[2]).read()
ref = json.loads(text[text.index("{"):])
theirs = ref["logprobs"][sys.argv[3]]
diff = max(abs(a - b) for o, t in zip(ours, theirs) for a, b in zip(o, t))
n = sum(len(o) for o in ours)
print(f"HF export vs megatron generate: max |log-prob difference| {diff:.2e} over {n} tokens "
      f"(float64 transformers Mixtral; smallest router margin {ref['routing'][sys.argv[3]]:.1e})")
sys.exit(0 if diff < 1e-4 else 1)
PY

# --- generation from the checkpoint (top-k sampling; greedy decoding of so small a model repeats
# itself) ---
"$MEGATRON" generate --use-checkpoint-args "${TOK[@]}" --load "$OUT/ckpt" \
  --top_k 20 --temperature 0.7 --seed 1 --num-tokens-to-generate 40 --stop-on-double-eol \
  "${PROMPTS[@]}" 2>&1 | tee "$OUT/generate.log"
