#!/usr/bin/env bash
# Fuzzes the readers of PyTorch checkpoints (core/zip_archive.h, core/pickle.h, core/torch_file.h)
# with libFuzzer, AddressSanitizer and UndefinedBehaviorSanitizer (clang and libclang-rt-14-dev
# from Debian). Not part of CI: a run of a few million inputs takes tens of minutes.
#
#   tests/fuzz/run_torch_checkpoint_fuzzer.sh            # RUNS=2000000 inputs, in build-fuzz/torch_checkpoint/
#   RUNS=5000000 JOBS=2 tests/fuzz/run_torch_checkpoint_fuzzer.sh
#
# Seeds: PyTorch files written by Debian's torch (tests/reference/torch_files.py: every dtype,
# views, the legacy format, files naming os.system; tests/reference/megatron_checkpoint.py with the
# smallest dimensions: Megatron-LM rank files of every name scheme), each as a whole file (first
# byte odd) and its data.pkl alone (first byte even). The grown corpus stays in
# build-fuzz/torch_checkpoint/corpus/ for the next run; crashes land in .../crashes/.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
OUT="${OUT:-$ROOT/build-fuzz/torch_checkpoint}"
RUNS="${RUNS:-2000000}"
JOBS="${JOBS:-1}"
CXX="${CXX:-clang++}"
mkdir -p "$OUT/corpus" "$OUT/seeds" "$OUT/crashes"

echo "building $OUT/torch_checkpoint_fuzzer"
"$CXX" -std=c++20 -O2 -g -fno-omit-frame-pointer \
  -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
  -I "$ROOT/src" "$ROOT/tests/fuzz/torch_checkpoint_fuzzer.cc" \
  "$ROOT"/src/core/{zip_archive,pickle,pickle_reader,pickle_globals,pickle_writer,torch_file,tensor,dtype,error,checked_memory,input_bounds}.cpp \
  -o "$OUT/torch_checkpoint_fuzzer"

echo "writing seeds"
/usr/bin/python3 "$ROOT/tests/reference/torch_files.py" objects "$OUT/seeds/objects" >/dev/null
/usr/bin/python3 "$ROOT/tests/reference/torch_files.py" forbidden "$OUT/seeds/forbidden" "$OUT/seeds/NEVER" >/dev/null
MEGATRON_REFERENCE_TINY=1 /usr/bin/python3 "$ROOT/tests/reference/megatron_checkpoint.py" make \
  "$OUT/seeds/megatron" legacy_v0_tp2_fp16 legacy_v3_tp2pp2_fp16 core_te_tp2pp2_fp32 \
  core_pp2_vp2_fp16 >/dev/null
/usr/bin/python3 - "$OUT/seeds" "$OUT/corpus" <<'PY'
import hashlib, os, sys, zipfile
seeds, corpus = sys.argv[1], sys.argv[2]
for dirpath, _, files in os.walk(seeds):
    for f in files:
        if not f.endswith(".pt"):
            continue
        raw = open(os.path.join(dirpath, f), "rb").read()
        items = [b"\x01" + raw]
        if zipfile.is_zipfile(os.path.join(dirpath, f)):
            z = zipfile.ZipFile(os.path.join(dirpath, f))
            items += [b"\x00" + z.read(n) for n in z.namelist() if n.endswith("data.pkl")]
        for item in items:
            name = hashlib.sha1(item).hexdigest()
            open(os.path.join(corpus, name), "wb").write(item)
print(len(os.listdir(corpus)), "corpus files")
PY

echo "fuzzing: $RUNS inputs"
cd "$OUT"
start=$(date +%s)
./torch_checkpoint_fuzzer corpus -dict="$ROOT/tests/fuzz/torch_checkpoint.dict" -runs="$RUNS" \
  -max_len=100000 -rss_limit_mb=4096 -timeout=20 -artifact_prefix="$OUT/crashes/" \
  $( [ "$JOBS" -gt 1 ] && echo "-jobs=$JOBS -workers=$JOBS" ) -print_final_stats=1 2>&1 | tee "$OUT/fuzz.log" | grep -E "^#[0-9]+.*(DONE|pulse)|ERROR|SUMMARY|stat::" || true
echo "elapsed: $(( $(date +%s) - start )) s; log in $OUT/fuzz.log; crashes in $OUT/crashes/"
ls "$OUT/crashes" | head
