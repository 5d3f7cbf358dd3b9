#!/usr/bin/env bash
# T5 demo: set up, build, get the demo corpus, make a WordPiece vocabulary from it, split it into
# sentences and preprocess it with BertWordPieceLowerCase, train a small T5 on the CPU with
# `megatron pretrain-t5` (Megatron's span-corruption samples with 100 sentinels <extra_id_N>),
# compare its validation loss with unigram baselines (the loss of a model that ignores context):
# the corpus's unigram entropy, as the BERT demo prints it, the unigram entropy of the decoder's
# labels themselves (the masked words with their sentinels and [EOS], over the first 2000 training
# samples), and that of the span words alone with the sentinels and [EOS] counted as free, then
# let `megatron generate` fill the spans of a few prompts, and score its greedy fills of 300
# validation samples (scripts/t5_fill_score.py: the first word of each span).
# Environment: DEMO_ITERS (training iterations, default 15000), DEMO_MINUTES (training stops and
# saves after this many minutes, default 40), DEMO_THREADS (default 2), BUILD_DIR (default
# build), SKIP_SETUP=1 to skip scripts/setup.sh, SKIP_BUILD=1 to use $BUILD_DIR/megatron as built.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR="${BUILD_DIR:-build}"
ITERS="${DEMO_ITERS:-15000}"
MINUTES="${DEMO_MINUTES:-40}"
export OMP_NUM_THREADS="${DEMO_THREADS:-2}" OPENBLAS_NUM_THREADS=1
[ "${SKIP_SETUP:-0}" = 1 ] || scripts/setup.sh
[ "${SKIP_BUILD:-0}" = 1 ] || BUILD_DIR="$BUILD_DIR" scripts/build.sh
scripts/get-corpus.sh
MEGATRON="$BUILD_DIR/megatron"
OUT=.cache/demo-t5
mkdir -p "$OUT"

# --- vocabulary and preprocessing (documents split into sentences, as T5's samples need) ---
if [ ! -s "$OUT/vocab.txt" ]; then
  python3 tests/reference/bert_wordpiece_reference.py make-vocab "$OUT/vocab.txt" .cache/corpus/demo.jsonl
fi
TOK=(--tokenizer-type BertWordPieceLowerCase --vocab-file "$OUT/vocab.txt" --vocab-extra-ids 100)
if [ ! -s "$OUT/demo_text_sentence.idx" ]; then
  "$MEGATRON" preprocess-data --input .cache/corpus/demo.jsonl --output-prefix "$OUT/demo" \
    --tokenizer-type BertWordPieceLowerCase --vocab-file "$OUT/vocab.txt" --split-sentences \
    --workers "$OMP_NUM_THREADS"
fi
"$MEGATRON" inspect-data "$OUT/demo_text_sentence" --entropy | tee "$OUT/data_summary.txt"
BASELINE="$(sed -n 's/^unigram entropy: \([0-9.]*\) .*/\1/p' "$OUT/data_summary.txt")"

# --- training ---
# 32-token encoder samples (a sentence or two) with --mask-prob 0.3 (about 8 masked tokens in 2 or 3
# spans; 20-token decoder samples hold them with their sentinels and [EOS]): about twice the
# iterations of 64-token samples in the same time, each decoder query chooses among half the
# encoder positions, and every sample has as many span words to learn from as a 64-token one.
SEQ=(--encoder-seq-length 32 --decoder-seq-length 20 --mask-prob 0.3)
# --init-method-std 0.1 (about 1/sqrt(hidden)) rather than Megatron's 0.02: at this width, with
# 0.02, the cross-attention's queries hardly learn (their gradients stay near zero), and even a
# model that memorises a few sentences fills their spans with other words of the same text.
SHAPE=(--encoder-num-layers 2 --decoder-num-layers 2 --hidden-size 128 --num-attention-heads 8
       --max-position-embeddings 32 --init-method-std 0.1 "${SEQ[@]}"
       --position-embedding-type relative)
DATA=(--data-path "$OUT/demo_text_sentence" --split 98,2,0 --data-cache-path "$OUT/cache")
SAMPLES=(--micro-batch-size 32 --global-batch-size 32 --train-iters "$ITERS" --eval-interval 5000
         --eval-iters 20)
# The labels' baseline: the unigram entropy of the first 2000 training samples' labels (inside
# the loss mask).
"$MEGATRON" inspect-data --samples 2000 --format json --dataset-type t5 --split-name train \
  "${SEQ[@]}" "${TOK[@]}" "${DATA[@]}" "${SAMPLES[@]}" 2>/dev/null | grep '^{' >"$OUT/samples.jsonl"
# A third line: the loss of a model that wrote the sentinels and [EOS] at no cost and the span
# words by their unigram frequency alone (what the loss stalls at before the model uses context).
read -r LABELS WORDS < <(python3 -c 'import json, math, sys, collections
c, w = collections.Counter(), collections.Counter()
for line in open(sys.argv[1]):
    s = json.loads(line)
    ls = [l for l, m in zip(s["labels"], s["loss_mask"]) if m]
    c.update(ls)
    w.update(l for l in ls if l < s["text_dec"][0])  # [BOS], [EOS] and the sentinels come last
h = lambda c, n: -sum(k / n * math.log(k / n) for k in c.values())
n, m = sum(c.values()), sum(w.values())
print(f"{h(c, n):.4f} {m / n * h(w, m):.4f}")' "$OUT/samples.jsonl")
echo "unigram entropy of the decoder labels (2000 training samples): $LABELS nats/token"
echo "with the sentinels and [EOS] free, the span words by unigram frequency: $WORDS nats/token"

# --weight-decay 0.1 rather than Megatron's default 0.01: with 0.01 the model stays for more than
# 12000 iterations on a plateau where every fill begins with "the" (the decoder has not learned to
# read the words beside its span in the encoder); with 0.1 four of five runs left it between 5000
# and 10000 iterations (README, "Leaving the plateau: weight decay"). 8 heads of 16 rather than 4
# of 32: the one run of those five that stayed on the plateau had 4 heads; this setting's run left
# it by iteration 7500.
rm -rf "$OUT/ckpt"
"$MEGATRON" pretrain-t5 "${SHAPE[@]}" "${TOK[@]}" "${DATA[@]}" "${SAMPLES[@]}" \
  --lr 2e-3 --min-lr 1e-4 --lr-decay-style linear --lr-warmup-iters 100 \
  --weight-decay 0.1 --clip-grad 1.0 --hidden-dropout 0 --attention-dropout 0 \
  --log-interval 100 --save "$OUT/ckpt" --save-interval "$ITERS" \
  --exit-duration-in-mins "$MINUTES" 2>&1 | tee "$OUT/train.log"
VALID="$(sed -n 's/.*validation loss at iteration *\([0-9]*\) | lm loss value: \([0-9.E+-]*\).*/\1 \2/p' \
  "$OUT/train.log" | tail -n 1)"
if [ -n "$VALID" ] && [ -n "$BASELINE" ]; then
  python3 -c 'import sys; it, v, b, l, w = sys.argv[1], *map(float, sys.argv[2:])
print(f"validation loss at iteration {it}: {v:.3f} nats/token; unigram baselines: corpus {b:.3f} "
      f"({b - v:+.3f} above it), decoder labels {l:.3f} ({l - v:+.3f} above it), span words "
      f"with free sentinels {w:.3f} ({w - v:+.3f} above it)")' $VALID "$BASELINE" "$LABELS" "$WORDS"
fi

# --- span filling with the checkpoint (greedy, then sampled) ---
if [ -s "$OUT/ckpt/latest_checkpointed_iteration.txt" ]; then
  PROMPTS="$OUT/prompts.txt"
  cat >"$PROMPTS" <<'PROMPTS_END'
the president of the united <extra_id_0> said that the new law would <extra_id_1> next year .
she walked into the <extra_id_0> and sat down at the <extra_id_1> .
it was one of the <extra_id_0> days of the year , and the children <extra_id_1> outside .
the jury said it did not <extra_id_0> any evidence of fraud in the <extra_id_1> .
he turned his <extra_id_0> and looked out of the <extra_id_1> .
PROMPTS_END
  "$MEGATRON" generate --load "$OUT/ckpt" --use-checkpoint-args "${TOK[@]}" \
    --prompt-file "$PROMPTS" --num-tokens-to-generate 16 2>&1 | tee "$OUT/generate.log"
  "$MEGATRON" generate --load "$OUT/ckpt" --use-checkpoint-args "${TOK[@]}" \
    --prompt-file "$PROMPTS" --num-tokens-to-generate 16 --top_k 0 --top_p 0.9 \
    --random-seed 1 2>&1 | tee -a "$OUT/generate.log"
  # The spans of 300 validation samples filled greedily: how often the first word is the one the
  # span began with, beside always writing the most frequent first word.
  "$MEGATRON" inspect-data --samples 300 --format json --dataset-type t5 --split-name valid \
    "${SEQ[@]}" "${TOK[@]}" "${DATA[@]}" "${SAMPLES[@]}" 2>/dev/null | grep '^{' >"$OUT/valid.jsonl"
  python3 scripts/t5_fill_score.py prompts "$OUT/vocab.txt" "$OUT/valid.jsonl" "$OUT/held_out"
  "$MEGATRON" generate --load "$OUT/ckpt" --use-checkpoint-args "${TOK[@]}" \
    --prompt-file "$OUT/held_out.txt" --num-tokens-to-generate 20 --output-format jsonl \
    --micro-batch-size 32 2>/dev/null >"$OUT/held_out_fills.jsonl"
  python3 scripts/t5_fill_score.py score "$OUT/held_out" "$OUT/held_out_fills.jsonl"
fi
