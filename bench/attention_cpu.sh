#!/usr/bin/env bash
# The core attention op on the CPU beside PyTorch's, side by side in one run: forward and backward
# of causal self-attention at GPT-2 124M's shape (12 heads of 64) and llm.c's micro-batch 4 at
# sequence 1024 (by default), for each thread count: our fp32 kernel, our bf16 kernel on the CPU's
# bf16 unit and forced onto its fp32 unit (build/bench/attention_bench; probabilities saved for
# backward as in training, and recomputed as under selective recompute), and PyTorch 1.13's
# scaled-dot-product attention in fp32 and bf16 (bench/reference/attention_bench.py, Debian's
# /usr/bin/python3). Times are process CPU milliseconds (the figure to compare on a shared
# machine) and wall milliseconds, the median of REPS after a warm-up; GFLOP/s counts the causal
# products' useful work per CPU second.
# Usage: [SEQ=1024] [BATCH=4] [REPS=3] bench/attention_cpu.sh [BUILD_DIR] [THREADS...]  (default: build 1 2)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR="${1:-build}"; shift $(( $# < 1 ? $# : 1 ))
THREADS=("$@"); [ ${#THREADS[@]} -gt 0 ] || THREADS=(1 2)
SEQ="${SEQ:-1024}"; BATCH="${BATCH:-4}"; REPS="${REPS:-3}"
SHAPE=(--batch "$BATCH" --seq "$SEQ" --heads 12 --head-dim 64 --reps "$REPS")
echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //')"
echo "flags: $(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -E '^(avx2|avx512f|avx512_bf16|avx512_fp16|amx_tile|amx_bf16)$' | tr '\n' ' ')"
echo "date: $(date -u '+%Y-%m-%d %H:%M UTC'), load average: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "shape: batch $BATCH, seq $SEQ, 12 heads of 64, causal; forward + backward"
echo
printf '| threads | program | probabilities | fwd CPU ms | bwd CPU ms | fwd wall ms | bwd wall ms | GFLOP per CPU s |\n'
printf '|---|---|---|---|---|---|---|---|\n'
for t in "${THREADS[@]}"; do
  {
    OMP_NUM_THREADS=$t OPENBLAS_NUM_THREADS=1 "$BUILD_DIR/bench/attention_bench" "${SHAPE[@]}"
    OMP_NUM_THREADS=$t /usr/bin/python3 bench/reference/attention_bench.py "${SHAPE[@]}" --threads "$t"
  } | grep -v '^#' | while IFS=$'\t' read -r name probs f b fw bw g; do
    printf '| %s | %s | %s | %s | %s | %s | %s | %s |\n' "$t" "$name" "$probs" "$f" "$b" "$fw" "$bw" "$g"
  done
done
echo
echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
