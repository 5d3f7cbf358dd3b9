#!/usr/bin/env bash
# How close `megatron plan` comes to real CPU runs of the same command lines: for each run, the
# predicted peak of the host allocator and of the resident set (plan --json) against the
# measured ones (Megatron's report_memory line of every rank, "max allocated" / "max reserved"),
# then, for a small model on a world of 2, the step time of the search's pick and of one layout
# of each kind (the fastest step after the first of a 2-rank run).
# Usage: bench/plan_accuracy.sh [BUILD_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
MEGATRON="${1:-build}/megatron"
COMMON=(--lr 1e-4 --mock-data --tokenizer-type NullTokenizer --eval-iters 0 --train-iters 3 --log-interval 1)
peaks() {  # NAME WORLD RANKS_PER_STAGE FLAGS...
  local name=$1 world=$2 per=$3; shift 3
  local plan train
  plan=$("$MEGATRON" plan "$@" "${COMMON[@]}" --world-size "$world" --json)
  if [ "$world" -gt 1 ]; then
    train=$("$MEGATRON" launch --nproc_per_node "$world" pretrain-gpt "$@" "${COMMON[@]}" 2>&1)
  else
    train=$("$MEGATRON" pretrain-gpt "$@" "${COMMON[@]}" 2>&1)
  fi
  PLAN="$plan" TRAIN="$train" NAME="$name" PER="$per" /usr/bin/python3 - <<'PY'
import json, os, re
plan = json.loads(os.environ["PLAN"][os.environ["PLAN"].index("{"):])
mib, process = 1024 * 1024, plan["prediction"]["process_resident"]
last = {}
for m in re.finditer(r"\[Rank (\d+)\] \(after \d+ iterations\) memory \(MB\) \| allocated: \S+ \| "
                     r"max allocated: (\S+) \| reserved: \S+ \| max reserved: (\S+)", os.environ["TRAIN"]):
    last[int(m[1])] = (float(m[2]), float(m[3]))
for rank, (alloc, res) in sorted(last.items()):
    st = plan["prediction"]["stages"][rank // int(os.environ["PER"])]
    pa, pr = st["peak"] / mib, (st["peak"] + st["resident_overhead"] + process) / mib
    print(f"| {os.environ['NAME']} | {rank} | {pa:.1f} | {alloc:.1f} | {100 * (pa / alloc - 1):+.1f}% "
          f"| {pr:.1f} | {res:.1f} | {100 * (pr / res - 1):+.1f}% |")
PY
}
echo "| run | rank | allocator predicted (MiB) | measured | error | resident predicted (MiB) | measured | error |"
echo "|---|---|---|---|---|---|---|---|"
peaks "fp32 GPT, position table 65536" 1 1 --num-layers 1 --hidden-size 256 --num-attention-heads 4 \
  --seq-length 256 --max-position-embeddings 65536 --micro-batch-size 1 --global-batch-size 2 --vocab-size 4100
peaks "bf16 Llama-style, seq 1024" 1 1 --num-layers 2 --hidden-size 256 --num-attention-heads 8 \
  --group-query-attention --num-query-groups 4 --swiglu --normalization RMSNorm \
  --position-embedding-type rope --untie-embeddings-and-output-weights --disable-bias-linear \
  --ffn-hidden-size 512 --bf16 --seq-length 1024 --micro-batch-size 1 --global-batch-size 1 --vocab-size 4100
peaks "fp32 GPT h512 vocab 32000" 1 1 --num-layers 4 --hidden-size 512 --num-attention-heads 8 \
  --seq-length 256 --max-position-embeddings 256 --micro-batch-size 2 --global-batch-size 4 --vocab-size 32000
peaks "TP2 x PP2 + SP" 4 2 --num-layers 4 --hidden-size 256 --num-attention-heads 8 --seq-length 512 \
  --max-position-embeddings 32768 --micro-batch-size 1 --global-batch-size 4 \
  --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 --sequence-parallel --vocab-size 4100
peaks "DP2 x CP2, dist-opt, bf16" 4 4 --num-layers 2 --hidden-size 256 --num-attention-heads 8 \
  --group-query-attention --num-query-groups 4 --swiglu --normalization RMSNorm \
  --position-embedding-type rope --disable-bias-linear --ffn-hidden-size 512 --bf16 --seq-length 1024 \
  --micro-batch-size 1 --global-batch-size 2 --context-parallel-size 2 --use-distributed-optimizer \
  --vocab-size 4100
peaks "MoE fp32, top-2 of 4" 1 1 --num-layers 2 --hidden-size 128 --num-attention-heads 4 --seq-length 64 \
  --micro-batch-size 1 --global-batch-size 2 --num-experts 4 --moe-router-topk 2 --disable-bias-linear \
  --vocab-size 4100
peaks "MoE bf16 SwiGLU + shared, seq 1024" 1 1 --num-layers 2 --hidden-size 256 --num-attention-heads 8 \
  --swiglu --normalization RMSNorm --position-embedding-type rope --disable-bias-linear --bf16 \
  --seq-length 1024 --micro-batch-size 1 --global-batch-size 1 --num-experts 4 --moe-router-topk 2 \
  --moe-ffn-hidden-size 512 --moe-shared-expert-intermediate-size 256 --vocab-size 4100
peaks "MoE TP2 x DP2, dist-opt" 4 4 --num-layers 2 --hidden-size 256 --num-attention-heads 8 \
  --seq-length 512 --micro-batch-size 1 --global-batch-size 2 --num-experts 4 --moe-router-topk 2 \
  --moe-ffn-hidden-size 512 --disable-bias-linear --tensor-model-parallel-size 2 \
  --use-distributed-optimizer --vocab-size 4100
echo
MODEL=(--num-layers 4 --hidden-size 128 --num-attention-heads 4 --seq-length 512 --max-position-embeddings 512
       --global-batch-size 4 --lr 1e-4 --mock-data --tokenizer-type NullTokenizer --vocab-size 4096 --eval-iters 0)
"$MEGATRON" plan "${MODEL[@]}" --micro-batch-size 1 --train-iters 5 --world-size 2 --search --device cpu --top 5 |
  sed -n '/layout search/,$p'
echo
echo "| layout (2 ranks) | fastest step after the first (ms) |"
echo "|---|---|"
for L in "--micro-batch-size 1 --use-distributed-optimizer" "--micro-batch-size 1" "--micro-batch-size 2" \
         "--micro-batch-size 1 --tensor-model-parallel-size 2 --sequence-parallel" \
         "--micro-batch-size 1 --pipeline-model-parallel-size 2" "--micro-batch-size 1 --context-parallel-size 2"; do
  # shellcheck disable=SC2086
  ms=$("$MEGATRON" launch --nproc_per_node 2 pretrain-gpt "${MODEL[@]}" $L --train-iters 5 --log-interval 1 2>&1 |
       grep -o "elapsed time per iteration (ms): [0-9.]*" | awk 'NR > 1 {print $NF}' | sort -n | head -1)
  echo "| $L | $ms |"
done
