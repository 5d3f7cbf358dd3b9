#!/usr/bin/env bash
# Training throughput on the CPU: `megatron pretrain-gpt` vs bench/reference/train_gpt_torch.py
# (torch, same thread count) on the same GPT (6 layers, hidden 384, 6 heads, seq 256, vocab 50304,
# micro-batch 4, global batch 8, no dropout) and the same GPT-2-tokenized demo corpus. ARCH=llama
# trains the Llama-style model of the same size instead (RMSNorm, rotary, SwiGLU with FFN 1024,
# 2 query groups, no biases, untied output layer) on both sides.
# Usage: [ARCH=gpt|llama] bench/train_cpu.sh [BUILD_DIR] [STEPS] [THREADS]
#        (needs .cache/demo or preprocesses it)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR="${1:-build}"; STEPS="${2:-5}"; THREADS="${3:-2}"; ARCH="${ARCH:-gpt}"
ARCH_FLAGS=()
if [ "$ARCH" = llama ]; then
  ARCH_FLAGS=(--normalization RMSNorm --swiglu --ffn-hidden-size 1024 --position-embedding-type rope
              --group-query-attention --num-query-groups 2 --disable-bias-linear
              --untie-embeddings-and-output-weights)
fi
MEGATRON="$BUILD_DIR/megatron"
DATA=.cache/demo/demo_text_document
TOK=(--tokenizer-type GPT2BPETokenizer --vocab-file .cache/gpt2/gpt2-vocab.json --merge-file .cache/gpt2/gpt2-merges.txt)
if [ ! -s "$DATA.idx" ]; then
  mkdir -p .cache/demo
  "$MEGATRON" preprocess-data --input .cache/corpus/demo.jsonl --output-prefix .cache/demo/demo "${TOK[@]}" --append-eod --workers "$THREADS"
fi
export OMP_NUM_THREADS="$THREADS" OPENBLAS_NUM_THREADS=1
LOG=$(mktemp)
/usr/bin/time -v "$MEGATRON" pretrain-gpt --num-layers 6 --hidden-size 384 --num-attention-heads 6 \
  --seq-length 256 --max-position-embeddings 256 "${ARCH_FLAGS[@]}" "${TOK[@]}" --micro-batch-size 4 --global-batch-size 8 \
  --train-iters "$STEPS" --lr 1e-4 --lr-decay-style constant --hidden-dropout 0 --attention-dropout 0 \
  --data-path "$DATA" --split 100,0,0 --data-cache-path .cache/demo/cache --log-interval 1 \
  --log-throughput --eval-iters 0 >"$LOG" 2>&1
ours_ms=$(grep "iteration " "$LOG" | tail -n +2 | sed 's/.*per iteration (ms): \([0-9.]*\).*/\1/' | awk '{s+=$1;n++} END {print s/n}')
ours_loss=$(grep "iteration " "$LOG" | tail -1 | sed 's/.*lm loss: \([0-9.E+-]*\).*/\1/')
ours_tf=$(grep "iteration " "$LOG" | tail -n +2 | sed 's/.*TFLOP\/s\/GPU): \([0-9.]*\).*/\1/' | awk '{s+=$1;n++} END {print s/n}')
ours_rss=$(grep "Maximum resident" "$LOG" | awk '{print $6/1024}')
ref=$(/usr/bin/python3 bench/reference/train_gpt_torch.py --bin "$DATA.bin" --threads "$THREADS" --steps "$STEPS" --arch "$ARCH")
# FMA peak: cores x GHz x FMA lanes (AVX-512: 16 fp32 x 2 units; AVX2: 8 x 2) x 2 FLOPs.
# Clock: CPU_GHZ, else lscpu's max MHz, else /proc/cpuinfo's cpu MHz, else BogoMIPS / 2.
ghz="${CPU_GHZ:-$(lscpu | awk -F: '/CPU max MHz|CPU MHz/ {print $2/1000; exit}')}"
[ -n "$ghz" ] || ghz=$(awk -F: '/cpu MHz/ {print $2/1000; exit}' /proc/cpuinfo)
[ -n "$ghz" ] || ghz=$(awk -F: 'tolower($1) ~ /bogomips/ {print $2/2000; exit}' /proc/cpuinfo)
lanes=$(grep -q avx512f /proc/cpuinfo && echo 32 || echo 16)
peak=$(awk -v c="$THREADS" -v g="$ghz" -v l="$lanes" 'BEGIN {print c*g*l*2}')
flops=$(awk -v t="$ours_tf" 'BEGIN {print t*1000}')
python3 - "$ours_ms" "$ours_loss" "$ours_rss" "$flops" "$peak" "$ref" <<'PY'
import json, sys
ms, loss, rss, gflops, peak, ref = float(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5]), json.loads(sys.argv[6])
tokens = 8 * 256
# Megatron's FLOPs per iteration as pretrain-gpt logs them (--log-throughput) for this model.
fl = gflops * 1e9 * (ms / 1000)
ref_gflops = fl / ref["step_s"] / 1e9
print(f"| program | tokens/s | step (ms) | peak RSS (MiB) | loss after N | GFLOP/s | of FMA peak ({peak:.0f} GFLOP/s) |")
print("|---|---|---|---|---|---|---|")
print(f"| megatron pretrain-gpt | {tokens/(ms/1000):.0f} | {ms:.0f} | {rss:.0f} | {loss:.4f} | {gflops:.1f} | {100*gflops/peak:.1f}% |")
print(f"| PyTorch 1.13 | {ref['tokens_per_s']:.0f} | {ref['step_s']*1000:.0f} | {ref['peak_rss_mb']:.0f} | {ref['loss']:.4f} | {ref_gflops:.1f} | {100*ref_gflops/peak:.1f}% |")
PY
rm -f "$LOG"
