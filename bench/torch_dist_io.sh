#!/usr/bin/env bash
# Checkpoint save and load throughput of Megatron-LM's formats, side by side in one run:
# `megatron checkpoint convert` from this build's checkpoint to torch_dist (.metadata + __R_N.distcp
# + common.pt) and to torch (.pt files), and back from each to this build's format, for one GPT
# model with its Adam state, against this disk's own speed for the same bytes (dd with fsync for
# writing; cat of a file not in the page cache is not possible here, so reading is compared with
# cat of the written folder, which is cached: a ceiling, not the disk).
# Each conversion runs ROUNDS times, the formats alternating (torch_dist, torch, torch_dist, ...),
# and the median wall time is quoted with MB/s = the folder's bytes / time. A conversion reads
# one format and writes another: "save" rows read ours (safetensors) and write the format, "load"
# rows read the format and write ours, so each row also holds the other side's cost.
# MODEL: L layers, hidden H, vocabulary V (default 12 x 768, vocab 4096: 86M parameters, about
# 1 GB with Adam's moments); TP x PP of the written checkpoints: TP (default 2), PP (default 2).
# Every row also gives the command's peak resident memory (/usr/bin/time's maximum RSS, median
# over the rounds), and a "run" row loads the torch_dist folder into one process the way a run
# does (`megatron generate --load`, one token): its weights are read shard by shard into the
# model, so its peak is the process's own base plus about one copy of the weights.
# BASE=path/to/another/megatron adds the same torch_dist rows for that binary, the two binaries
# alternating within each round (before/after comparisons in one run).
# The run row's peak also holds what generation adds to the weights (the CPU's packed copies of
# the linear layers' weights): a model whose vocabulary dominates (V=65536 L=2 H=1024) shows the
# load's own peak best.
# Usage: [L=n] [H=n] [V=n] [TP=n] [PP=n] [ROUNDS=n] [BASE=megatron] bench/torch_dist_io.sh [BUILD_DIR] [WORK_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR="${1:-build}"; WORK="${2:-$(mktemp -d)}"
L="${L:-12}"; H="${H:-768}"; V="${V:-4096}"; TP="${TP:-2}"; PP="${PP:-2}"; ROUNDS="${ROUNDS:-3}"
MEGATRON="$BUILD_DIR/megatron"
TOK=(--tokenizer-type NullTokenizer --vocab-size "$V")
mkdir -p "$WORK"
echo "# $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg), $(date -u +%F)"
echo "# model: $L layers, hidden $H, vocab $V, fp32 with Adam state; written as TP $TP x PP $PP"

# The source: one iteration of training, saved in this build's format.
if [ ! -s "$WORK/ours/latest_checkpointed_iteration.txt" ]; then
  "$MEGATRON" pretrain-gpt --num-layers "$L" --hidden-size "$H" --num-attention-heads $((H / 64)) \
    --seq-length 64 --max-position-embeddings 64 --micro-batch-size 1 --global-batch-size 1 \
    --train-iters 1 --lr 1e-4 --mock-data "${TOK[@]}" --save "$WORK/ours" --save-interval 1 \
    --eval-iters 0 > "$WORK/train.log" 2>&1
fi

echo "# weights: $(find "$WORK/ours" -name 'model*.safetensors' -printf '%s\n' | awk '{s += $1} END {printf "%.0f", s / 1e6}') MB (the run rows read these)"

wall() {  # "seconds,peak RSS in KB" of one command
  /usr/bin/time -f '%e,%M' -o "$WORK/time.txt" "$@" > /dev/null 2>&1
  tail -1 "$WORK/time.txt"
}
median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR + 1) / 2)]}'; }
bytes() { du -sb "$1" | cut -f1; }
row() {  # label bytes "seconds,KB"... (bytes of the folder)
  local label=$1 b=$2; shift 2
  local m r
  m=$(printf '%s\n' "$@" | cut -d, -f1 | median)
  r=$(printf '%s\n' "$@" | cut -d, -f2 | median)
  printf '| %s | %.0f | %.2f | %.0f | %.0f |\n' "$label" "$(echo "$b / 1000000" | bc -l)" "$m" \
    "$(echo "$b / 1000000 / $m" | bc -l)" "$(echo "$r / 1024" | bc -l)"
}
BINS=(this); [ -n "${BASE:-}" ] && BINS+=(base)
bin() { if [ "$1" = base ]; then echo "$BASE"; else echo "$MEGATRON"; fi; }
GEN=(--use-checkpoint-args --prompt "1 2 3" --tokens-to-generate 1 "${TOK[@]}")

declare -A T
for r in $(seq "$ROUNDS"); do
  for fmt in torch_dist torch; do
    rm -rf "$WORK/$fmt"
    T[save_$fmt]+=" $(wall "$MEGATRON" checkpoint convert --load "$WORK/ours" --save "$WORK/$fmt" \
      --save-format "$fmt" --target-tensor-parallel-size "$TP" --target-pipeline-parallel-size "$PP" "${TOK[@]}")"
  done
  for fmt in torch_dist torch; do
    rm -rf "$WORK/back_$fmt"
    T[load_$fmt]+=" $(wall "$MEGATRON" checkpoint convert --load "$WORK/$fmt" --save "$WORK/back_$fmt" "${TOK[@]}")"
  done
  for b in "${BINS[@]}"; do
    rm -rf "$WORK/back_$b"
    T[merge_$b]+=" $(wall "$(bin "$b")" checkpoint convert --load "$WORK/torch_dist" --save "$WORK/back_$b" "${TOK[@]}")"
    T[run_$b]+=" $(wall "$(bin "$b")" generate --load "$WORK/torch_dist" "${GEN[@]}")"
  done
done
B=$(bytes "$WORK/torch_dist")
for r in $(seq "$ROUNDS"); do
  rm -f "$WORK/dd.bin"
  T[dd]+=" $(wall dd if=/dev/zero of="$WORK/dd.bin" bs=1M count=$((B / 1048576)) conv=fsync)"
  T[cat]+=" $(wall sh -c "cat '$WORK'/torch_dist/iter_*/* > /dev/null")"
done
echo
echo "| what | MB | median s | MB/s | peak RSS MB |"
echo "|---|---|---|---|---|"
# shellcheck disable=SC2086
row "save torch_dist (read ours, write .metadata + .distcp)" "$B" ${T[save_torch_dist]}
# shellcheck disable=SC2086
row "save torch (read ours, write .pt)" "$(bytes "$WORK/torch")" ${T[save_torch]}
# shellcheck disable=SC2086
row "load torch_dist (read it, write ours)" "$B" ${T[load_torch_dist]}
# shellcheck disable=SC2086
row "load torch (read .pt, write ours)" "$(bytes "$WORK/torch")" ${T[load_torch]}
W=$(du -cb "$WORK"/torch_dist/iter_*/__*.distcp | tail -1 | cut -f1)
for b in "${BINS[@]}"; do
  # shellcheck disable=SC2086
  row "[$b] load torch_dist, merged (checkpoint convert to ours)" "$B" ${T[merge_$b]}
  # shellcheck disable=SC2086
  row "[$b] load torch_dist into a run (generate --load, TP1 PP1; MB: all .distcp)" "$W" ${T[run_$b]}
done
# shellcheck disable=SC2086
row "disk: dd write with fsync, same bytes" "$B" ${T[dd]}
# shellcheck disable=SC2086
row "page cache: cat of the torch_dist folder" "$B" ${T[cat]}
