#!/usr/bin/env bash
# The prepared device check: everything about the CUDA build that needs a GPU, in one run of a few
# minutes on a machine with one NVIDIA GPU (driver, CUDA, PyTorch; no Debian libraries, no
# package registry). It unpacks the bundle scripts/gpu-bundle.sh built on a CPU machine, then:
#   1. environment: the GPU, the libraries the binaries need (cuBLASLt and NCCL from CUDA or
#      PyTorch's wheels), nothing missing;
#   2. ops: the CUDA op-case table (every op against the CPU, tests/kernels/backend_ops_test.cpp)
#      and the CUDA backend's own tests (tests/cuda);
#   3. parity: one training step of GPT-2 124M (seq 1024, dropout on, attention dropout included)
#      from the same weights and batch on the GPU and on the CPU: fp32 gradients of every tensor
#      (SGD, lr 100: g = (w0 - w1) / 100) and the loss; then bf16 loss and gradient norm; then
#      the fp32 step again for a smaller model with the other attention paths (grouped-query
#      attention, RoPE, a sliding window; RMSNorm, SwiGLU);
#   4. train: GPT-2 124M, seq 1024, bf16, 30 iterations of 64 x 1024 tokens: tokens/s, TFLOP/s
#      (Megatron's formula) and MFU against the GPU's dense bf16 peak, beside the same model in
#      PyTorch (bench/reference/gpt2_gpu_torch.py: SDPA flash attention, fused AdamW; eager, then
#      torch.compile if the time allows);
#   5. decode: batch-1 and batch-16 decode tokens/s (bench/generate_bench --device cuda) beside
#      PyTorch with a KV cache;
#   6. profile: 3 training iterations of the same model under MEGATRON_OP_PROFILE=1: the ops (and
#      product shapes) that take the step's time; then the largest products timed in PyTorch in
#      the same shapes and dtypes (gemm_torch: ours from the profile beside torch.matmul's);
#   7. cpu: the GPU machine's own CPU (an Intel Xeon with AMX on the machines seen so far), when
#      the budget leaves time: GPT-2 124M at llm.c's CPU configuration (micro-batch 4, sequence
#      64) on one thread, ours with --bf16 and in fp32 beside PyTorch's bf16 model and fp32
#      (bench/reference/train_gpt_torch.py, as bench/train_cpu.sh runs it), seconds per step and
#      the CPU, its flags and the product kernels picked (`megatron version`);
# and writes OUT/summary.md (a table of every phase: pass/fail, seconds, figures), OUT/results.jsonl,
# OUT/MANIFEST and OUT/logs.tar.gz with one log per phase (OUT: $OUT when set, as on the device
# machine, else build-gpu/gpu-check-out).
#
# Usage: scripts/gpu-check.sh [--dry-run] [--bundle FILE] [--exec PROGRAM ARGS...]
#   --exec      instead of the phases: unpack the bundle, set up its libraries as phase 1 does,
#               and run one of its programs (megatron, test_kernels, test_cuda, generate_bench)
#               with ARGS; e.g. `--exec megatron pretrain-gpt ...` under MEGATRON_OP_PROFILE=1
#               for a per-op time table. Its exit status is the script's.
#   --dry-run   on a machine without a GPU: the same phases with --device cpu on both sides and a
#               small model (2 layers, hidden 64, seq 128), PyTorch on the CPU; checks the bundle,
#               its libraries and every step of this script except the GPU itself.
#   --bundle    the bundle (default build-gpu/bundle/megatron-gpu.tar.xz).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
DRY=0
BUNDLE=build-gpu/bundle/megatron-gpu.tar.xz
EXEC=()
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) DRY=1 ;;
    --bundle) BUNDLE="$2"; shift ;;
    --exec) shift; EXEC=("$@"); [ ${#EXEC[@]} -gt 0 ] || set -- "--exec needs a program"; break ;;
    *) echo "usage: scripts/gpu-check.sh [--dry-run] [--bundle FILE] [--exec PROGRAM ARGS...]" >&2
       exit 2 ;;
  esac
  shift
done
if [ ${#EXEC[@]} = 0 ] && [ "${1:-}" = "--exec needs a program" ]; then
  echo "error: --exec needs a program of the bundle (megatron, test_kernels, test_cuda," \
       "generate_bench) and its arguments" >&2
  exit 2
fi
OUT_DIR="${OUT:-build-gpu/gpu-check-out}"
mkdir -p "$OUT_DIR" && OUT_DIR=$(cd "$OUT_DIR" && pwd)
rm -f "$OUT_DIR"/*.log  # each phase appends to its log: start from none
RESULTS="$OUT_DIR/results.jsonl"
: >"$RESULTS"
T_START=$(date +%s)
BUDGET="${GPU_CHECK_BUDGET_S:-480}"
WORK=$(mktemp -d /tmp/megatron-gpu-check.XXXXXX)
FAILED=0
PY=python3
if [ "$DRY" = 1 ] && [ -x /usr/bin/python3 ]; then PY=/usr/bin/python3; fi
TOOLS="$ROOT/scripts/gpu_check_tools.py"

say() { echo "[gpu-check $(($(date +%s) - T_START))s] $*"; }
elapsed() { echo $(($(date +%s) - T_START)); }
left() { echo $((BUDGET - $(elapsed))); }
# record PHASE SECONDS JSON: one results line, the phase and its time put in front of JSON's fields.
record() {
  local json="$3"
  [ "${json:0:1}" = "{" ] || json="{\"status\": \"fail\", \"why\": \"no result\"}"
  [ "$json" = "{}" ] && json='{"status": "pass"}'
  echo "{\"phase\": \"$1\", \"seconds\": $2, ${json:1}" >>"$RESULTS"
  if grep -q '"status": "fail"' <<<"$json"; then FAILED=1; say "$1: FAIL (see $OUT_DIR/$1.log)"
  else say "$1: $(grep -o '"status": "[a-z]*"' <<<"$json" | cut -d'"' -f4)"; fi
}
# run PHASE LIMIT_S CMD...: runs CMD under a time limit, its output in WORK/last.log and appended
# to OUT/PHASE.log; 0 when it succeeded.
run() {
  local phase="$1" limit="$2" rc; shift 2
  say "$phase: $*"
  timeout "$limit" "$@" >"$WORK/last.log" 2>&1
  rc=$?
  cat "$WORK/last.log" >>"$OUT_DIR/$phase.log"
  return $rc
}
# torch_result PHASE T0: records the JSON line(s) bench/reference/gpt2_gpu_torch.py printed.
torch_result() {
  local lines
  lines=$(grep '^{' "$WORK/last.log" | paste -sd, -)
  record "$1" $(($(date +%s) - $2)) "{\"status\": \"pass\", \"results\": [$lines]}"
}
# check PHASE T0 CMD...: runs a gpu_check_tools.py check and records its JSON line.
check() {
  local phase="$1" t0="$2"; shift 2
  local json
  json=$("$PY" "$TOOLS" "$@" 2>>"$OUT_DIR/$phase.log" | tail -1)
  record "$phase" $(($(date +%s) - t0)) "$json"
}
finish() {
  "$PY" "$TOOLS" summary --results "$RESULTS" --out "$OUT_DIR/summary.md" || cat "$RESULTS"
  rm -rf "$WORK"
  # A device call brings back at most 8 files from $OUT: the phase logs go into one archive.
  if (cd "$OUT_DIR" && ls ./*.log >/dev/null 2>&1 && tar czf logs.tar.gz ./*.log); then
    rm -f "$OUT_DIR"/*.log
    say "logs: $OUT_DIR/logs.tar.gz (one per phase)"
  fi
  if [ $FAILED = 0 ]; then say "done in $(elapsed) s: every phase passed"
  else say "done in $(elapsed) s: FAILURES above"; fi
  exit $FAILED
}

# ---- 0. the bundle ------------------------------------------------------------------------------
t=$(date +%s)
if [ ! -f "$BUNDLE" ]; then
  echo "error: no bundle at $BUNDLE: build it on a CPU machine with scripts/gpu-bundle.sh" \
       "and carry its folder (build-gpu/bundle) with the call" >&2
  exit 2
fi
if ! tar -C "$WORK" -xJf "$BUNDLE" 2>/dev/null; then  # no xz binary: Python's lzma
  "$PY" -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' \
    "$BUNDLE" "$WORK" ||
    { echo "error: cannot unpack $BUNDLE" >&2; exit 2; }
fi
B="$WORK/megatron-gpu"
cp "$B/MANIFEST" "$OUT_DIR/MANIFEST"

# ---- 1. environment ----------------------------------------------------------------------------
# cuBLASLt and NCCL: the CUDA toolkit's, else PyTorch's wheels (site-packages/nvidia/*/lib).
LIBDIRS=$(
  for d in ${CUDA_HOME:+$CUDA_HOME/lib64} /usr/local/cuda/lib64 /usr/local/cuda/lib \
           /usr/local/cuda/targets/x86_64-linux/lib; do [ -d "$d" ] && echo "$d"; done
  "$PY" - 2>/dev/null <<'EOF'
import glob, site
for p in site.getsitepackages():
    for d in sorted(glob.glob(p + "/nvidia/*/lib")):
        print(d)
EOF
)
LD_LIBRARY_PATH="$B/lib:$(echo "$LIBDIRS" | paste -sd: -)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export LD_LIBRARY_PATH
missing=$(for bin in "$B"/bin/*; do ldd "$bin" | awk '/not found/ {print $1}'; done | sort -u |
          paste -sd' ' -)
GPU_NAME=none
if [ "$DRY" = 0 ]; then
  GPU_NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
  [ -n "$GPU_NAME" ] || GPU_NAME=unknown
fi
case "$GPU_NAME" in  # dense bf16 tensor-core peak, TFLOP/s (NVIDIA's datasheets)
  *H100*PCIe*) PEAK=756 ;;
  *H100*|*H200*) PEAK=989.4 ;;
  *A100*) PEAK=312 ;;
  *) PEAK=0 ;;
esac
nccl_dir=$(for d in $LIBDIRS; do [ -e "$d/libnccl.so.2" ] && echo "$d" && break; done)
env_status=pass
if [ -n "$missing" ]; then
  # A dry run on a CPU machine may lack only what the GPU machine provides.
  if [ "$DRY" = 1 ] && ! tr ' ' '\n' <<<"$missing" | grep -qv -E '^(libcublas|libcuda)'; then
    env_status=pass
  else
    env_status=fail
  fi
fi
env_json=$(STATUS="$env_status" GPU="$GPU_NAME" PEAK="$PEAK" MISSING="${missing:-none}" \
  NCCL="${nccl_dir:-not found (multi-GPU runs need it)}" DRY="$DRY" \
  BUNDLE="$(sed -n 2p "$B/MANIFEST")" \
  DRIVER="$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -1)" \
  TORCH="$("$PY" -c 'import torch; print(torch.__version__)' 2>/dev/null)" "$PY" -c '
import json, os
e = os.environ
print(json.dumps({"status": e["STATUS"], "gpu": e["GPU"], "peak_bf16_tflops": float(e["PEAK"]),
                  "missing_libraries": e["MISSING"], "nccl": e["NCCL"], "driver": e["DRIVER"],
                  "torch": e["TORCH"], "dry_run": e["DRY"] == "1", "bundle": e["BUNDLE"]}))')
if [ ${#EXEC[@]} -gt 0 ]; then
  [ -n "$missing" ] && echo "warning: libraries not found: $missing" >&2
  prog="$B/bin/${EXEC[0]}"
  [ -x "$prog" ] || { echo "error: --exec ${EXEC[0]}: the bundle has no such program (it has:" \
                          "$(ls "$B/bin" | paste -sd' ' -))" >&2; rm -rf "$WORK"; exit 2; }
  "$prog" "${EXEC[@]:1}"
  rc=$?
  rm -rf "$WORK"
  exit $rc
fi
record environment $(($(date +%s) - t)) "$env_json"
[ "$env_status" = pass ] || finish

if [ "$DRY" = 1 ]; then
  DEVICE=cpu
  MODEL=(--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 128
         --max-position-embeddings 128)
  TORCH_MODEL=(--device cpu --layers 2 --hidden 64 --heads 4 --seq 128 --mbs 2 --gbs 4 --steps 3
               --warmup 1 --prompt 16 --gen 8)
  TRAIN_BATCH=(--micro-batch-size 2 --global-batch-size 4 --train-iters 6 --log-interval 2)
  PROFILE_BATCH=(--micro-batch-size 2 --global-batch-size 4 --train-iters 2 --log-interval 1)
  BENCH=(--layers 2 --hidden 64 --heads 4 --vocab 50304 --prompt 16 --gen 8 --reps 1)
  GQA_MODEL=(--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 128
             --max-position-embeddings 128 --window-size 48 0)
  CPU_MODEL=("${MODEL[@]}")
  CPU_TORCH=(--layers 2 --hidden 64 --heads 4 --seq 128 --steps 3)
else
  DEVICE=cuda
  MODEL=(--num-layers 12 --hidden-size 768 --num-attention-heads 12 --seq-length 1024
         --max-position-embeddings 1024)
  TORCH_MODEL=(--device cuda)
  TRAIN_BATCH=(--micro-batch-size 8 --global-batch-size 64 --train-iters 30 --log-interval 5)
  PROFILE_BATCH=(--micro-batch-size 8 --global-batch-size 16 --train-iters 3 --log-interval 1)
  BENCH=(--layers 12 --hidden 768 --heads 12 --vocab 50304 --prompt 128 --gen 64 --reps 2)
  GQA_MODEL=(--num-layers 4 --hidden-size 512 --num-attention-heads 8 --seq-length 1024
             --max-position-embeddings 1024 --window-size 256 0)
  CPU_MODEL=(--num-layers 12 --hidden-size 768 --num-attention-heads 12 --seq-length 64
             --max-position-embeddings 1024)
  CPU_TORCH=(--layers 12 --hidden 768 --heads 12 --seq 64 --steps 4)
fi
MEGATRON="$B/bin/megatron"
DATA=(--mock-data --tokenizer-type NullTokenizer --vocab-size 50257 --seed 1234)

# ---- 2. the op-case table and the CUDA backend's tests ----------------------------------------
t=$(date +%s)
# Both binaries run whatever the first gives: one failing case must not hide the rest.
run ops 240 "$B/bin/test_cuda"
rc=$?
run ops 240 "$B/bin/test_kernels" --gtest_filter='BackendOps.*' || rc=1
record ops $(($(date +%s) - t)) "$(printf '{"status": "%s", "gtest": "%s", "skipped": %s}' \
  "$([ $rc = 0 ] && echo pass || echo fail)" \
  "$(grep -E '^\[  (PASSED|FAILED) ' "$OUT_DIR/ops.log" | paste -sd';' - | tr -d '[]')" \
  "$(grep -c '^\[  SKIPPED \] .*(' "$OUT_DIR/ops.log")")"
grep -h "ops without a CUDA kernel" "$OUT_DIR/ops.log" | head -1

# ---- 3. one training step on both devices -----------------------------------------------------
# step_parity PHASE ARGS...: the fp32 SGD step of `megatron ARGS` with lr 0 (the start weights) and
# lr 100 on the device, lr 100 on the CPU; every tensor's gradient and the loss compared.
step_parity() {
  local phase="$1" t0
  shift
  t0=$(date +%s)
  run "$phase" 300 "$MEGATRON" "$@" --device "$DEVICE" --lr 0 --save "$WORK/w0" &&
    run "$phase" 300 "$MEGATRON" "$@" --device "$DEVICE" --lr 100 --save "$WORK/w1_dev" &&
    cp "$WORK/last.log" "$WORK/dev.log" &&
    run "$phase" 300 "$MEGATRON" "$@" --device cpu --lr 100 --save "$WORK/w1_cpu" &&
    cp "$WORK/last.log" "$WORK/cpu.log"
  if [ $? = 0 ]; then
    check "$phase" "$t0" parity --w0 "$WORK/w0" --a "$WORK/w1_cpu" --b "$WORK/w1_dev" --lr 100 \
      --log-a "$WORK/cpu.log" --log-b "$WORK/dev.log"
  else
    record "$phase" $(($(date +%s) - t0)) '{"status": "fail", "why": "a run failed"}'
  fi
  rm -rf "$WORK"/w0 "$WORK"/w1_*
}
step=("${DATA[@]}" --micro-batch-size 1 --global-batch-size 1 --train-iters 1 --optimizer sgd
      --clip-grad 0 --weight-decay 0 --lr-decay-style constant --log-interval 1 --eval-iters 0
      --save-interval 1)
step_parity parity pretrain-gpt "${MODEL[@]}" "${step[@]}"
t=$(date +%s)
run parity_bf16 300 "$MEGATRON" pretrain-gpt "${MODEL[@]}" "${step[@]}" --bf16 --device "$DEVICE" \
  --lr 0 && cp "$WORK/last.log" "$WORK/dev16.log" &&
  run parity_bf16 300 "$MEGATRON" pretrain-gpt "${MODEL[@]}" "${step[@]}" --bf16 --device cpu \
    --lr 0 && cp "$WORK/last.log" "$WORK/cpu16.log"
if [ $? = 0 ]; then
  check parity_bf16 "$t" loss --log-a "$WORK/cpu16.log" --log-b "$WORK/dev16.log"
else
  record parity_bf16 $(($(date +%s) - t)) '{"status": "fail", "why": "a run failed"}'
fi
# The attention paths GPT-2 does not take, on the same fp32 step: grouped-query attention with
# RoPE and a sliding window (Llama/Mistral-style layers: RMSNorm, SwiGLU, no biases).
step_parity parity_gqa pretrain-gpt "${GQA_MODEL[@]}" --group-query-attention \
  --num-query-groups 2 --position-embedding-type rope --normalization RMSNorm --swiglu \
  --disable-bias-linear --untie-embeddings-and-output-weights "${step[@]}"

# ---- 4. training throughput, ours and PyTorch's -----------------------------------------------
t=$(date +%s)
run train 240 "$MEGATRON" pretrain-gpt "${MODEL[@]}" "${DATA[@]}" "${TRAIN_BATCH[@]}" --bf16 \
  --device "$DEVICE" --lr 6e-4 --min-lr 6e-5 --lr-decay-style cosine --lr-warmup-iters 5 \
  --weight-decay 0.1 --adam-beta2 0.95 --hidden-dropout 0 --attention-dropout 0 \
  --log-throughput --eval-iters 0
check train "$t" train --log "$OUT_DIR/train.log" --peak "$PEAK"
t=$(date +%s)
TORCH_REF="$ROOT/bench/reference/gpt2_gpu_torch.py"
if run train_torch 180 "$PY" "$TORCH_REF" --mode train "${TORCH_MODEL[@]}"; then
  torch_result train_torch "$t"
else
  record train_torch $(($(date +%s) - t)) '{"status": "fail", "why": "see the log"}'
fi
if [ "$DRY" = 1 ]; then
  record train_torch_compiled 0 '{"status": "skipped", "why": "dry run: on the GPU only"}'
elif [ "$(left)" -gt 150 ]; then
  t=$(date +%s)
  if run train_torch_compiled 150 "$PY" "$TORCH_REF" --mode train --compile "${TORCH_MODEL[@]}"
  then
    torch_result train_torch_compiled "$t"
  else
    record train_torch_compiled $(($(date +%s) - t)) \
      '{"status": "fail", "why": "see the log (torch.compile needs a working Triton)"}'
  fi
else
  record train_torch_compiled 0 \
    "{\"status\": \"skipped\", \"why\": \"$(left) s left of the ${BUDGET} s budget\"}"
fi

# ---- 5. decode throughput ---------------------------------------------------------------------
t=$(date +%s)
run decode 120 "$B/bin/generate_bench" "${BENCH[@]}" --device "$DEVICE"
check decode "$t" decode --log "$OUT_DIR/decode.log"
for dtype in fp32 bf16; do
  t=$(date +%s)
  if run "decode_torch_$dtype" 120 "$PY" "$TORCH_REF" --mode decode --dtype "$dtype" \
       "${TORCH_MODEL[@]}"; then
    torch_result "decode_torch_$dtype" "$t"
  else
    record "decode_torch_$dtype" $(($(date +%s) - t)) '{"status": "fail", "why": "see the log"}'
  fi
done

# ---- 6. where the step's time goes ------------------------------------------------------------
t=$(date +%s)
MEGATRON_OP_PROFILE=1 run profile 120 "$MEGATRON" pretrain-gpt "${MODEL[@]}" "${DATA[@]}" \
  "${PROFILE_BATCH[@]}" --bf16 --device "$DEVICE" --lr 6e-4 --hidden-dropout 0 \
  --attention-dropout 0 --eval-iters 0
check profile "$t" profile --log "$OUT_DIR/profile.log"
t=$(date +%s)
if run gemm_torch 90 "$PY" "$TORCH_REF" --mode gemm --profile-log "$OUT_DIR/profile.log" \
     "${TORCH_MODEL[@]}"; then
  torch_result gemm_torch "$t"
else
  record gemm_torch $(($(date +%s) - t)) '{"status": "fail", "why": "see the log"}'
fi

# ---- 7. the CPU's matrix units, on this machine's CPU -----------------------------------------
if [ "$(left)" -gt 100 ]; then
  t=$(date +%s)
  if run cpu 30 "$MEGATRON" version; then
    cpu_json=$(CPU="$(sed -n 's/^cpu: //p' "$WORK/last.log")" \
      PRODUCTS="$(sed -n 's/^cpu products: //p' "$WORK/last.log")" \
      FLAGS="$(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' |
               grep -E '^(amx_|avx512_bf16|avx512_fp16|avx512f$)' | paste -sd' ' -)" "$PY" -c '
import json, os
e = os.environ
print(json.dumps({"status": "pass", "cpu": e["CPU"], "flags": e["FLAGS"],
                  "products": e["PRODUCTS"]}))')
    record cpu $(($(date +%s) - t)) "$cpu_json"
  else
    record cpu $(($(date +%s) - t)) '{"status": "fail", "why": "megatron version failed"}'
  fi
  for prec in bf16 fp32; do
    t=$(date +%s)
    flag=(); [ "$prec" = bf16 ] && flag=(--bf16)
    OMP_NUM_THREADS=1 run "cpu_$prec" 90 "$MEGATRON" pretrain-gpt "${CPU_MODEL[@]}" "${DATA[@]}" \
      --micro-batch-size 4 --global-batch-size 4 --train-iters 6 --log-interval 1 "${flag[@]}" \
      --device cpu --lr 6e-4 --hidden-dropout 0 --attention-dropout 0 --eval-iters 0
    check "cpu_$prec" "$t" train --log "$OUT_DIR/cpu_$prec.log"
  done
  "$PY" -c 'import sys, numpy as np
np.random.default_rng(1).integers(0, 50257, 200000, dtype=np.uint16).tofile(sys.argv[1])' \
    "$WORK/tokens.bin"
  for prec in bf16 fp32; do
    t=$(date +%s)
    if run "cpu_torch_$prec" 90 "$PY" "$ROOT/bench/reference/train_gpt_torch.py" \
         --bin "$WORK/tokens.bin" --threads 1 --mbs 4 --gbs 4 --precision "$prec" "${CPU_TORCH[@]}"
    then
      torch_result "cpu_torch_$prec" "$t"
    else
      record "cpu_torch_$prec" $(($(date +%s) - t)) '{"status": "fail", "why": "see the log"}'
    fi
  done
else
  record cpu 0 "{\"status\": \"skipped\", \"why\": \"$(left) s left of the ${BUDGET} s budget\"}"
fi
finish
