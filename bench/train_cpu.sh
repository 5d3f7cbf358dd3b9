#!/usr/bin/env bash
# Training throughput on the CPU, side by side in one run: `megatron pretrain-gpt` in fp32 and with
# --bf16 against bench/reference/train_gpt_torch.py (PyTorch, same model, data and thread count) in
# fp32, under torch.autocast bf16 and with the model in bf16, for each thread count; and the
# ceiling of this CPU's matrix products for the same model (build/bench/gemm_rate: the step's
# products run alone through oneDNN) in each precision, so each row shows the fraction of it the
# whole step reaches. The table opens with the CPU model, its flags and the kernels picked.
# Each program runs twice, for 2 and for 2 + STEPS iterations: a step's cost is the difference
# over STEPS, in wall seconds and in CPU seconds (user + system, /usr/bin/time), so start-up and
# the first steps (weights drawn, kernels created) drop out. On a shared machine the CPU seconds
# of a 1-thread run are the ones to compare; wall seconds count the waits for a core too.
# MODEL=small (default): 6 layers, hidden 384, 6 heads, seq 256, micro-batch 4, global batch 4.
# MODEL=gpt2: GPT-2 124M at llm.c's CPU configuration (12 layers, hidden 768, 12 heads, seq 64,
# micro-batch 4, global batch 4, vocab 50304); SEQ=1024 gives it llm.c's GPU sequence length.
# MBS=n sets the micro-batch (default 4; the global batch is the micro-batch, one micro-batch a step).
# BASE=path/to/another/megatron adds its fp32 and --bf16 rows, each measured right after this
# build's: a before/after pair from one run. TORCH=0 leaves the PyTorch rows out.
# ARCH=llama trains the Llama-style model of the same size instead (RMSNorm, rotary, SwiGLU,
# 2 query groups, no biases, untied output layer) on both sides. No dropout anywhere.
# Usage: [MODEL=small|gpt2] [ARCH=gpt|llama] [SEQ=n] [MBS=n] [BASE=megatron] [TORCH=0|1] bench/train_cpu.sh [BUILD_DIR] [STEPS] [THREADS...]
#        (default: build 4 1 2; needs .cache/demo or preprocesses it)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR="${1:-build}"; STEPS="${2:-4}"; shift $(( $# < 2 ? $# : 2 ))
THREADS=("$@"); [ ${#THREADS[@]} -gt 0 ] || THREADS=(1 2)
ARCH="${ARCH:-gpt}"; MODEL="${MODEL:-small}"
if [ "$MODEL" = gpt2 ]; then
  L=12; H=768; NH=12; S="${SEQ:-64}"; FFN=3072
else
  L=6; H=384; NH=6; S="${SEQ:-256}"; FFN=1536
fi
MBS="${MBS:-4}"; GBS=$MBS; TORCH="${TORCH:-1}"
ARCH_FLAGS=(); REF_ARCH=(--arch "$ARCH"); FC1=$FFN; QKV=$((3 * H)); QUERY_GROUPS=$NH; GATED=1
# (not GROUPS: bash keeps that name for the user's group ids and ignores assignments to it)
if [ "$ARCH" = llama ]; then
  FFN=$((H * 8 / 3 / 64 * 64)); FC1=$((2 * FFN)); QUERY_GROUPS=2; GATED=1.5
  QKV=$(((NH + 2 * QUERY_GROUPS) * H / NH))
  ARCH_FLAGS=(--normalization RMSNorm --swiglu --ffn-hidden-size "$FFN" --position-embedding-type rope
              --group-query-attention --num-query-groups 2 --disable-bias-linear
              --untie-embeddings-and-output-weights)
  REF_ARCH+=(--ffn "$FFN")
fi
MEGATRON="$BUILD_DIR/megatron"
DATA=.cache/demo/demo_text_document
TOK=(--tokenizer-type GPT2BPETokenizer --vocab-file .cache/gpt2/gpt2-vocab.json --merge-file .cache/gpt2/gpt2-merges.txt)
if [ ! -s "$DATA.idx" ]; then
  mkdir -p .cache/demo
  "$MEGATRON" preprocess-data --input .cache/corpus/demo.jsonl --output-prefix .cache/demo/demo "${TOK[@]}" --append-eod --workers 2
fi
export OPENBLAS_NUM_THREADS=1
RESULTS=$(mktemp); OUT=$(mktemp); TIMES=$(mktemp)
trap 'rm -f "$RESULTS" "$OUT" "$TIMES"' EXIT

megatron_cmd() {  # binary iterations [flags...]
  local bin=$1 iters=$2; shift 2
  echo "$bin" pretrain-gpt --num-layers $L --hidden-size $H --num-attention-heads $NH --seq-length $S \
    --max-position-embeddings $S "${ARCH_FLAGS[@]}" "${TOK[@]}" --micro-batch-size $MBS \
    --global-batch-size $GBS --train-iters "$iters" --lr 1e-4 --lr-decay-style constant \
    --hidden-dropout 0 --attention-dropout 0 --data-path "$DATA" --split 100,0,0 \
    --data-cache-path .cache/demo/cache --log-interval 1 --eval-iters 0 "$@"
}
torch_cmd() {  # iterations threads precision
  echo /usr/bin/python3 bench/reference/train_gpt_torch.py --bin "$DATA.bin" --threads "$2" --steps "$1" \
    --layers $L --hidden $H --heads $NH --seq $S --mbs $MBS --gbs $GBS "${REF_ARCH[@]}" --precision "$3"
}
# Runs a command line; appends "wall cpu" seconds to $TIMES and keeps its output in $OUT.
timed() {  # threads command...
  local t=$1; shift
  OMP_NUM_THREADS=$t /usr/bin/time -f "%e %U %S" -o "$TIMES.one" "$@" >"$OUT" 2>&1 || { cat "$OUT" >&2; exit 1; }
  awk '{print $1, $2 + $3}' "$TIMES.one" >>"$TIMES"
}
measure() {  # name threads kind(megatron|base|torch) args...
  local name=$1 t=$2 kind=$3; shift 3
  : >"$TIMES"
  if [ "$kind" != torch ]; then
    local bin="$MEGATRON"; [ "$kind" = base ] && bin="$BASE"
    timed "$t" $(megatron_cmd "$bin" 2 "$@"); timed "$t" $(megatron_cmd "$bin" $((2 + STEPS)) "$@")
    loss=$(grep "iteration " "$OUT" | tail -1 | sed 's/.*lm loss: \([0-9.E+-]*\).*/\1/')
  else
    timed "$t" $(torch_cmd 2 "$t" "$@"); timed "$t" $(torch_cmd $((2 + STEPS)) "$t" "$@")
    loss=$(tail -1 "$OUT" | python3 -c 'import json,sys; print(json.load(sys.stdin)["loss"])')
  fi
  python3 - "$name" "$t" "$STEPS" "$loss" "$TIMES" >>"$RESULTS" <<'PY'
import json, sys
name, t, steps, loss, times = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), sys.argv[5]
(w2, c2), (wn, cn) = [tuple(map(float, l.split())) for l in open(times)]
print(json.dumps({"name": name, "threads": t, "wall_s": (wn - w2) / steps, "cpu_s": (cn - c2) / steps,
                  "loss": loss}))
PY
}

for t in "${THREADS[@]}"; do
  echo "{\"ceiling\": $(OMP_NUM_THREADS=$t "$BUILD_DIR/bench/gemm_rate" --layers $L --hidden $H \
    --qkv $QKV --fc1 $FC1 --ffn $FFN --rows $((MBS * S))), \"threads\": $t}" >>"$RESULTS"
  measure "megatron pretrain-gpt fp32" "$t" megatron
  [ -z "${BASE:-}" ] || measure "base: megatron pretrain-gpt fp32" "$t" base
  measure "megatron pretrain-gpt --bf16" "$t" megatron --bf16
  [ -z "${BASE:-}" ] || measure "base: megatron pretrain-gpt --bf16" "$t" base --bf16
  [ "$TORCH" = 0 ] && continue
  measure "PyTorch 1.13 fp32" "$t" torch fp32
  measure "PyTorch 1.13 autocast bf16" "$t" torch autocast
  measure "PyTorch 1.13 bf16 model" "$t" torch bf16
done

python3 - "$RESULTS" "$MODEL $ARCH, $L layers, hidden $H, seq $S, micro-batch $MBS, global batch $GBS, $STEPS steps" \
  $GBS $S $L $H $NH $QUERY_GROUPS $FFN $GATED "$(uptime)" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
B, S, L, H, NH, G, F, gated = (float(x) for x in sys.argv[3:11])
# Megatron-LM's num_floating_point_operations (training.py) for this model, vocabulary 50304.
flops = 12 * B * S * L * H * H * ((1 + G / NH + S / H) + F / H * gated + 50304 / (2 * L * H))
ceil = {r["threads"]: r["ceiling"] for r in rows if "ceiling" in r}
first = next(iter(ceil.values()))
print(f"model: {sys.argv[2]}; {flops / 1e9:.1f} GFLOP per step (Megatron's formula)")
print(f"cpu: {first['cpu']} ({first['flags']}); oneDNN ISA {first['isa']}; fp32 products: "
      f"{first['fp32_kernel']}; bf16 products: {first['bf16_kernel']}; OpenBLAS core {first['openblas']} (not used)")
print(f"load: {sys.argv[11].strip()}")
print("| threads | program | CPU s/step | wall s/step | PyTorch bf16 model / this (CPU s) "
      "| GFLOP per CPU s | of the products' ceiling | of it, each layer its own operands | loss |")
print("|---|---|---|---|---|---|---|---|---|")
for t in sorted(ceil):
    rs = [r for r in rows if r.get("threads") == t and "name" in r]
    ref = next((r["cpu_s"] for r in rs if r["name"].endswith("bf16 model")), float("nan"))
    for r in rs:
        bf16 = "bf16" in r["name"]
        p = "bf16" if bf16 else "fp32"
        c, d = ceil[t][p + "_step_gflops"], ceil[t][p + "_step_distinct_gflops"]
        g = flops / r["cpu_s"] / 1e9
        vs = "-" if ref != ref else f"{ref / r['cpu_s']:.2f}x"  # no PyTorch rows (TORCH=0)
        print(f"| {t} | {r['name']} | {r['cpu_s']:.3f} | {r['wall_s']:.3f} | {vs} "
              f"| {g:.1f} | {100 * g / c:.0f}% of {c:.1f} ({p}) | {100 * g / d:.0f}% of {d:.1f} "
              f"| {r['loss']:.4f} |")
    print(f"| {t} | ceiling: a 1024^3 product alone | | | | fp32 {ceil[t]['fp32_square_gflops']:.1f}, "
          f"bf16 {ceil[t]['bf16_square_gflops']:.1f} | | | |")
PY
