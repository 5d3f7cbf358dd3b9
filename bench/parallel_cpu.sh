#!/usr/bin/env bash
# CPU scaling of `megatron pretrain-gpt` over MPI ranks: 1, 2 and 4 ranks, data parallel (plain,
# distributed optimizer, overlapped reduction, and with the distributed optimizer the parameter
# all-gather overlapped with the next forward) vs tensor parallel (with and without sequence
# parallelism) vs TP2 x DP2 vs pipeline parallel (1F1B, interleaved) vs context parallel, on one
# GPT (4 layers, hidden 256, 8 heads, seq 256, vocab 4096,
# micro-batch 4, global batch 16, fp32, no dropout) and a synthetic corpus (NullTokenizer ids).
# For each run: mean ms per iteration and tokens/s over iterations 3..N (the JSONL metrics of the
# last rank), and the communication time: the time that rank spent blocked in collectives
# (launch + wait, src/comm/timed_communicator.h), i.e. the part not hidden behind compute.
# Usage: [SET=all|cp|moe] [SEQ=256] [MBS=4] [GBS=16] bench/parallel_cpu.sh [BUILD_DIR] [ITERS] [TOTAL_THREADS]
# TOTAL_THREADS (default: nproc) OpenMP threads are split over the ranks (at least 1 each), so
# every row uses the same cores; 4 ranks on 2 cores are oversubscribed. Ranks are not bound to
# cores (--bind-to none): Open MPI's default binding puts a lone rank's 2 threads on one core.
# SET=cp runs only the context-parallel comparison: one rank vs CP2 / CP4 with the ring
# (--cp-comm-type p2p) and with the all-gather, at sequence length SEQ (e.g. SEQ=2048 MBS=1:
# long sequences, where attention dominates).
# SET=moe runs expert parallelism on a small Mixtral-shaped model (the same shape with SwiGLU
# experts: 8 experts of width 256 in every layer, top-2, RMSNorm, rotary, no biases): one rank vs
# DP2 / DP4 (every rank holds every expert) vs EP2 / EP4 with the all-to-all and the all-gather
# dispatcher (EP4 on 2 cores is oversubscribed), and the grouped experts (--moe-grouped-gemm)
# against the sequential ones on one rank and under EP2. The communication share is then mostly
# the token dispatch (all-to-all-v or all-gather/reduce-scatter, forward and backward); a last
# EP2 run with MEGATRON_OP_PROFILE=1 prints rank 0's time in the dispatch, the combine and the
# experts (rows of the op profile, src/kernels/op_profile.h).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR="${1:-build}"; ITERS="${2:-12}"; TOTAL="${3:-$(nproc)}"
SET="${SET:-all}"; SEQ="${SEQ:-256}"; MBS="${MBS:-4}"; GBS="${GBS:-16}"
MEGATRON="$BUILD_DIR/megatron"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

/usr/bin/python3 - "$WORK/corpus.jsonl" <<'PY'
import json, random, sys
random.seed(1)
with open(sys.argv[1], "w") as f:
    for d in range(3000):  # 3000 documents of 200-400 ids with some structure
        step = 1 + d % 7
        n = random.randint(200, 400)
        f.write(json.dumps({"text": " ".join(str((d + i * step) % 4000) for i in range(n))}) + "\n")
PY
"$MEGATRON" preprocess-data --input "$WORK/corpus.jsonl" --output-prefix "$WORK/c" \
  --tokenizer-type NullTokenizer --vocab-size 4096 --append-eod --workers 1 >/dev/null 2>&1

COMMON=(pretrain-gpt --num-layers 4 --hidden-size 256 --num-attention-heads 8 --seq-length "$SEQ"
  --max-position-embeddings "$SEQ" --tokenizer-type NullTokenizer --vocab-size 4096
  --micro-batch-size "$MBS" --global-batch-size "$GBS" --train-iters "$ITERS" --lr 1e-4
  --lr-decay-style constant --hidden-dropout 0 --attention-dropout 0
  --data-path "$WORK/c_text_document" --split 100,0,0 --data-cache-path "$WORK/cache"
  --log-interval 1 --eval-iters 0)

echo "| layout | ranks | threads/rank | ms/iter | tokens/s | vs 1 rank | comm ms/iter | comm share |"
echo "|---|---|---|---|---|---|---|---|"
BASE=""
run() {  # name np threads-per-rank (0: TOTAL / np) flags...
  local name=$1 np=$2 threads=$3; shift 3
  [ "$threads" -gt 0 ] || threads=$(( TOTAL / np )); [ "$threads" -ge 1 ] || threads=1
  OMP_NUM_THREADS=$threads OPENBLAS_NUM_THREADS=1 mpirun --oversubscribe --allow-run-as-root --bind-to none \
    -np "$np" "$MEGATRON" "${COMMON[@]}" "$@" --log-metrics-jsonl "$WORK/$name.jsonl" \
    >"$WORK/$name.log" 2>&1 || { echo "$name failed:"; tail -20 "$WORK/$name.log"; exit 1; }
  local row
  row=$(/usr/bin/python3 - "$WORK/$name.jsonl" "$name" "$np" "$threads" "${BASE:-0}" <<'PY'
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
recs = [r for r in recs if r["iteration"] >= 3] or recs
ms = sum(r["ms_per_iteration"] for r in recs) / len(recs)
tps = sum(r["tokens_per_second"] for r in recs) / len(recs)
comm = sum(r["comm_ms_per_iteration"] for r in recs) / len(recs)
base = float(sys.argv[5])
rel = f"{tps / base:.2f}x" if base > 0 else "1.00x"
print(f"| {sys.argv[2]} | {sys.argv[3]} | {sys.argv[4]} | {ms:.1f} | {tps:.0f} | {rel} | {comm:.1f} | {100 * comm / ms:.0f}% |\t{tps:.3f}")
PY
)
  echo "${row%%$'\t'*}"
  [ -n "$BASE" ] || BASE="${row##*$'\t'}"
}
if [ "$SET" = moe ]; then
  COMMON+=(--swiglu --disable-bias-linear --normalization RMSNorm --position-embedding-type rope
    --num-experts 8 --moe-router-topk 2 --moe-ffn-hidden-size 256 --moe-aux-loss-coeff 0.01)
  run "MoE, 1 rank (EP1)" 1 0
  run "MoE, 1 rank (EP1), grouped experts" 1 0 --moe-grouped-gemm
  run "MoE, DP2 (EP1)" 2 0
  run "MoE, EP2, alltoall" 2 0 --expert-model-parallel-size 2 --moe-token-dispatcher-type alltoall
  run "MoE, EP2, alltoall, grouped experts" 2 0 --expert-model-parallel-size 2 \
    --moe-token-dispatcher-type alltoall --moe-grouped-gemm
  run "MoE, EP2, allgather" 2 0 --expert-model-parallel-size 2 --moe-token-dispatcher-type allgather
  run "MoE, DP4 (EP1)" 4 0
  run "MoE, EP4, alltoall" 4 0 --expert-model-parallel-size 4 --moe-token-dispatcher-type alltoall
  run "MoE, EP2 x DP2, alltoall" 4 0 --expert-model-parallel-size 2 --moe-token-dispatcher-type alltoall
  echo
  echo "Op profile of rank 0, EP2 alltoall (MEGATRON_OP_PROFILE=1; shares of the time in ops):"
  MEGATRON_OP_PROFILE=1 OMP_NUM_THREADS=$(( TOTAL / 2 > 0 ? TOTAL / 2 : 1 )) OPENBLAS_NUM_THREADS=1 \
    mpirun --oversubscribe --allow-run-as-root --bind-to none --tag-output -np 2 "$MEGATRON" \
    "${COMMON[@]}" --expert-model-parallel-size 2 --moe-token-dispatcher-type alltoall \
    >"$WORK/profile.log" 2>&1 || { echo "profile run failed:"; tail -20 "$WORK/profile.log"; exit 1; }
  sed -n 's/^\[1,0\]<stderr>://p' "$WORK/profile.log" | sed -n '/^op profile/,$p'
  exit 0
fi
run "1 rank" 1 0
if [ "$SET" = cp ]; then
  # One rank without the saved [s, s] softmax probabilities (the CP ring never keeps them).
  run "1 rank, selective recompute" 1 0 --recompute-granularity selective
  for c in 2 4; do
    run "CP$c, ring (p2p)" "$c" 0 --context-parallel-size "$c" --cp-comm-type p2p
    run "CP$c, all-gather" "$c" 0 --context-parallel-size "$c" --cp-comm-type allgather
  done
  exit 0
fi
run "1 rank, 1 thread" 1 1
run "DP2" 2 0
run "DP2, distributed optimizer" 2 0 --use-distributed-optimizer
run "DP2, overlap (1M-element buckets)" 2 0 --overlap-grad-reduce --ddp-bucket-size 1000000
run "DP2, dist. optimizer, overlap (1M buckets)" 2 0 --use-distributed-optimizer \
  --overlap-grad-reduce --ddp-bucket-size 1000000
run "DP2, dist. optimizer, overlap + param gather (1M buckets)" 2 0 --use-distributed-optimizer \
  --overlap-grad-reduce --overlap-param-gather --ddp-bucket-size 1000000
run "TP2" 2 0 --tensor-model-parallel-size 2
run "TP2 + SP" 2 0 --tensor-model-parallel-size 2 --sequence-parallel
run "DP4" 4 0
run "TP2 x DP2" 4 0 --tensor-model-parallel-size 2
run "TP4" 4 0 --tensor-model-parallel-size 4
run "PP2 (1F1B)" 2 0 --pipeline-model-parallel-size 2
run "PP2 interleaved (2 virtual stages)" 2 0 --pipeline-model-parallel-size 2 \
  --num-layers-per-virtual-pipeline-stage 1
run "PP4" 4 0 --pipeline-model-parallel-size 4
run "TP2 x PP2" 4 0 --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2
run "PP2 x DP2" 4 0 --pipeline-model-parallel-size 2
run "PP2 x DP2, overlap (1M buckets)" 4 0 --pipeline-model-parallel-size 2 --overlap-grad-reduce \
  --ddp-bucket-size 1000000
run "CP2" 2 0 --context-parallel-size 2
run "CP2 x DP2" 4 0 --context-parallel-size 2
