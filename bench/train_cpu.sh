#!/usr/bin/env bash
# Training throughput on the CPU, side by side in one run: `megatron pretrain-gpt` in fp32 and with
# --bf16 against bench/reference/train_gpt_torch.py (PyTorch, same model, data and thread count) in
# fp32, under torch.autocast bf16 and with the model in bf16, for each thread count; and the
# ceiling of this CPU's matrix products for the same model (build/bench/gemm_rate: the step's
# products run alone through oneDNN) in each precision, so each row shows the fraction of it the
# whole step reaches. The table opens with the CPU model, its flags and the kernels picked.
# MODEL=small (default): 6 layers, hidden 384, 6 heads, seq 256, micro-batch 4, global batch 8.
# MODEL=gpt2: GPT-2 124M at llm.c's CPU configuration (12 layers, hidden 768, 12 heads, seq 64,
# micro-batch 4, global batch 4, vocab 50304); SEQ=1024 gives it llm.c's GPU sequence length.
# ARCH=llama trains the Llama-style model of the same size instead (RMSNorm, rotary, SwiGLU,
# 2 query groups, no biases, untied output layer) on both sides. No dropout anywhere.
# Usage: [MODEL=small|gpt2] [ARCH=gpt|llama] [SEQ=n] bench/train_cpu.sh [BUILD_DIR] [STEPS] [THREADS...]
#        (default: build 5 "1 2"; needs .cache/demo or preprocesses it)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR="${1:-build}"; STEPS="${2:-5}"; shift $(( $# < 2 ? $# : 2 )); THREADS=("${@:-1 2}")
read -r -a THREADS <<<"${THREADS[*]}"
ARCH="${ARCH:-gpt}"; MODEL="${MODEL:-small}"
if [ "$MODEL" = gpt2 ]; then
  L=12; H=768; NH=12; S="${SEQ:-64}"; MBS=4; GBS=4; FFN=3072
else
  L=6; H=384; NH=6; S="${SEQ:-256}"; MBS=4; GBS=8; FFN=1536
fi
ARCH_FLAGS=(); REF_ARCH=(--arch "$ARCH"); FC1=$FFN; QKV=$((3 * H))
if [ "$ARCH" = llama ]; then
  FFN=$((H * 8 / 3 / 64 * 64)); FC1=$((2 * FFN)); QKV=$(((NH + 4) * H / NH))
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
RESULTS=$(mktemp)
trap 'rm -f "$RESULTS"' EXIT

# megatron pretrain-gpt: one JSON line (mean step s over iterations 2.., TFLOP/s, loss, RSS).
run_megatron() {  # name threads [flags...]
  local name=$1 threads=$2 log; shift 2
  log=$(mktemp)
  OMP_NUM_THREADS=$threads /usr/bin/time -v "$MEGATRON" pretrain-gpt --num-layers $L --hidden-size $H \
    --num-attention-heads $NH --seq-length $S --max-position-embeddings $S "${ARCH_FLAGS[@]}" "${TOK[@]}" \
    --micro-batch-size $MBS --global-batch-size $GBS --train-iters "$STEPS" --lr 1e-4 \
    --lr-decay-style constant --hidden-dropout 0 --attention-dropout 0 --data-path "$DATA" \
    --split 100,0,0 --data-cache-path .cache/demo/cache --log-interval 1 --log-throughput \
    --eval-iters 0 "$@" >"$log" 2>&1 || { cat "$log" >&2; exit 1; }
  python3 - "$name" "$threads" "$log" >>"$RESULTS" <<'PY'
import json, re, sys
name, threads, text = sys.argv[1], int(sys.argv[2]), open(sys.argv[3]).read()
its = re.findall(r"per iteration \(ms\): ([0-9.]+).*?lm loss: ([0-9.E+-]+)", text)
ms = [float(m) for m, _ in its[1:]] or [float(its[0][0])]
rss = float(re.search(r"Maximum resident set size \(kbytes\): (\d+)", text).group(1)) / 1024
print(json.dumps({"name": name, "threads": threads, "step_s": sum(ms) / len(ms) / 1000,
                  "loss": float(its[-1][1]), "rss_mb": rss}))
PY
  rm -f "$log"
}
run_torch() {  # name threads precision
  python3 - "$1" "$2" "$(/usr/bin/python3 bench/reference/train_gpt_torch.py --bin "$DATA.bin" \
    --threads "$2" --steps "$STEPS" --layers $L --hidden $H --heads $NH --seq $S --mbs $MBS \
    --gbs $GBS "${REF_ARCH[@]}" --precision "$3")" >>"$RESULTS" <<'PY'
import json, sys
r = json.loads(sys.argv[3])
print(json.dumps({"name": sys.argv[1], "threads": int(sys.argv[2]), "step_s": r["step_s"],
                  "loss": r["loss"], "rss_mb": r["peak_rss_mb"]}))
PY
}

for t in "${THREADS[@]}"; do
  echo "{\"ceiling\": $(OMP_NUM_THREADS=$t "$BUILD_DIR/bench/gemm_rate" --layers $L --hidden $H \
    --qkv $QKV --fc1 $FC1 --ffn $FFN --rows $((MBS * S))), \"threads\": $t}" >>"$RESULTS"
  run_megatron "megatron pretrain-gpt fp32" "$t"
  run_megatron "megatron pretrain-gpt --bf16" "$t" --bf16
  run_torch "PyTorch 1.13 fp32" "$t" fp32
  run_torch "PyTorch 1.13 autocast bf16" "$t" autocast
  run_torch "PyTorch 1.13 bf16 model" "$t" bf16
done

GQ=$([ "$ARCH" = llama ] && echo 2 || echo $NH); GATED=$([ "$ARCH" = llama ] && echo 1.5 || echo 1)
python3 - "$RESULTS" "$MODEL $ARCH, $L layers, hidden $H, seq $S, micro-batch $MBS, global batch $GBS, $STEPS steps" \
  $GBS $S $L $H $NH $GQ $FFN $GATED <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
B, S, L, H, NH, G, F, gated = (float(x) for x in sys.argv[3:11])
tokens = B * S
# Megatron-LM's num_floating_point_operations (training.py) for this model, vocabulary 50304.
flops = 12 * B * S * L * H * H * ((1 + G / NH + S / H) + F / H * gated + 50304 / (2 * L * H))
ceil = {r["threads"]: r["ceiling"] for r in rows if "ceiling" in r}
first = next(iter(ceil.values()))
print(f"model: {sys.argv[2]}")
print(f"cpu: {first['cpu']} ({first['flags']}); oneDNN ISA {first['isa']}; fp32 products: "
      f"{first['fp32_kernel']}; bf16 products: {first['bf16_kernel']}; OpenBLAS core {first['openblas']} (not used)")
print("| threads | program | s/step | tokens/s | vs PyTorch bf16 model | GFLOP/s | of the step's product ceiling | loss after N | peak RSS (MiB) |")
print("|---|---|---|---|---|---|---|---|---|")
for t in sorted(ceil):
    rs = [r for r in rows if r.get("threads") == t and "name" in r]
    ref = next(r["step_s"] for r in rs if r["name"].endswith("bf16 model"))
    for r in rs:
        bf16 = "bf16" in r["name"]
        c = ceil[t]["bf16_step_gflops" if bf16 else "fp32_step_gflops"]
        g = flops / r["step_s"] / 1e9
        print(f"| {t} | {r['name']} | {r['step_s']:.3f} | {tokens / r['step_s']:.0f} | {ref / r['step_s']:.2f}x "
              f"| {g:.1f} | {100 * g / c:.0f}% of {c:.1f} ({'bf16' if bf16 else 'fp32'}) | {r['loss']:.4f} | {r['rss_mb']:.0f} |")
    print(f"| {t} | ceiling: 1024^3 product alone | | | | fp32 {ceil[t]['fp32_square_gflops']:.1f}, "
          f"bf16 {ceil[t]['bf16_square_gflops']:.1f} | | | |")
PY
