#!/usr/bin/env python3
"""The checks and the summary of scripts/gpu-check.sh (needs numpy only).

  parity   --w0 DIR --a DIR --b DIR --log-a LOG --log-b LOG [--tol-grad X] [--tol-loss X]
           Gradients of one SGD step (lr L, no clipping, no weight decay) from the same initial
           weights on two devices: g = (w0 - w1) / L per tensor of each run's model.safetensors;
           the largest ||g_b - g_a|| / ||g_a|| over the tensors must stay under --tol-grad, the
           iteration-1 losses within --tol-loss (relative).
  loss     --log-a LOG --log-b LOG [--tol-loss X] [--tol-norm X]
           The iteration-1 lm loss and grad norm of two runs (relative tolerances).
  train    --log LOG [--peak TFLOPS]
           Mean tokens/s and TFLOP/s of the logged intervals after the first (warm-up).
  decode   --log LOG
           generate_bench's table: decode tokens/s at each batch size.
  profile  --log LOG [--top N]
           The MEGATRON_OP_PROFILE=1 table at the end of a run: its N largest rows (op or product
           shape, calls, mean microseconds, share) and the time outside ops.
  summary  --results FILE --out FILE
           results.jsonl (one JSON object per phase) into a Markdown summary.

Every check prints one JSON line (its figures and "status": "pass" / "fail"); a failed check
exits with status 1.
"""
import argparse
import json
import math
import os
import re
import struct
import sys

import numpy as np

DTYPES = {"F32": np.float32, "F64": np.float64, "F16": np.float16, "I32": np.int32,
          "I64": np.int64, "U8": np.uint8, "I8": np.int8, "BF16": None}


def read_safetensors(path):
    """{name: float64 array} of a safetensors file (BF16 widened exactly)."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        lo, hi = info["data_offsets"]
        raw = data[lo:hi]
        if info["dtype"] == "BF16":
            arr = (np.frombuffer(raw, np.uint16).astype(np.uint32) << 16).view(np.float32)
        else:
            arr = np.frombuffer(raw, DTYPES[info["dtype"]])
        out[name] = arr.astype(np.float64).reshape(info["shape"])
    return out


def checkpoint_weights(folder):
    """The model weights of a checkpoint folder's latest iteration (every mp_rank_* merged by
    name: the check runs one rank)."""
    with open(os.path.join(folder, "latest_checkpointed_iteration.txt")) as f:
        it = int(f.read().strip())
    root = os.path.join(folder, f"iter_{it:07d}")
    ranks = sorted(d for d in os.listdir(root) if d.startswith("mp_rank_"))
    if len(ranks) != 1:
        raise SystemExit(f"{root}: expected one mp_rank_* folder, found {ranks}")
    return read_safetensors(os.path.join(root, ranks[0], "model.safetensors"))


LINE = re.compile(r"iteration\s+(\d+)/\s*\d+ \|.*")


def iteration_lines(log):
    with open(log, errors="replace") as f:
        return [l for l in f if LINE.search(l)]


def field(line, name):
    m = re.search(re.escape(name) + r": ([-+0-9.eEna]+)", line)
    return float(m.group(1)) if m else math.nan


def first_iteration(log):
    lines = iteration_lines(log)
    if not lines:
        raise SystemExit(f"{log}: no iteration line (did the run fail? see the log)")
    return {"loss": field(lines[0], "lm loss"), "grad_norm": field(lines[0], "grad norm")}


def rel(a, b):
    return abs(a - b) / max(abs(a), 1e-30)


def report(result):
    print(json.dumps(result), flush=True)
    sys.exit(0 if result["status"] == "pass" else 1)


def cmd_parity(a):
    lr = a.lr
    w0, wa, wb = (checkpoint_weights(d) for d in (a.w0, a.a, a.b))
    worst, worst_name, compared = 0.0, "", 0
    for name, x0 in w0.items():
        if name not in wa or name not in wb:
            raise SystemExit(f"{name} is missing from a run's checkpoint")
        ga, gb = (x0 - wa[name]) / lr, (x0 - wb[name]) / lr
        r = float(np.linalg.norm(gb - ga) / max(np.linalg.norm(ga), 1e-30))
        compared += 1
        if not r <= worst:  # NaN counts as the worst
            worst, worst_name = r, name
    la, lb = first_iteration(a.log_a), first_iteration(a.log_b)
    loss_rel = rel(la["loss"], lb["loss"])
    ok = worst <= a.tol_grad and loss_rel <= a.tol_loss
    report({"check": "training step parity", "tensors": compared,
            "max_grad_rel_diff": worst, "worst_tensor": worst_name, "tol_grad": a.tol_grad,
            "loss_a": la["loss"], "loss_b": lb["loss"], "loss_rel_diff": loss_rel,
            "tol_loss": a.tol_loss, "status": "pass" if ok else "fail"})


def cmd_loss(a):
    la, lb = first_iteration(a.log_a), first_iteration(a.log_b)
    lr_, nr = rel(la["loss"], lb["loss"]), rel(la["grad_norm"], lb["grad_norm"])
    ok = lr_ <= a.tol_loss and nr <= a.tol_norm
    report({"check": "loss and grad norm parity", "loss_a": la["loss"], "loss_b": lb["loss"],
            "loss_rel_diff": lr_, "grad_norm_a": la["grad_norm"], "grad_norm_b": lb["grad_norm"],
            "grad_norm_rel_diff": nr, "tol_loss": a.tol_loss, "tol_norm": a.tol_norm,
            "status": "pass" if ok else "fail"})


def cmd_train(a):
    lines = iteration_lines(a.log)
    timed = lines[1:] if len(lines) > 1 else lines
    if not timed:
        report({"check": "training throughput", "status": "fail",
                "why": f"no iteration line in {a.log}"})
    tok = float(np.mean([field(l, "tokens per second") for l in timed]))
    tf = float(np.mean([field(l, "throughput per GPU (TFLOP/s/GPU)") for l in timed]))
    ms = float(np.mean([field(l, "elapsed time per iteration (ms)") for l in timed]))
    last = int(LINE.search(lines[-1]).group(1))
    report({"check": "training throughput", "iterations": last, "intervals_timed": len(timed),
            "ms_per_iteration": ms, "tokens_per_second": tok, "tflops": tf,
            "mfu": tf / a.peak if a.peak else None, "last_loss": field(lines[-1], "lm loss"),
            "status": "pass" if math.isfinite(tok) and tok > 0 else "fail"})


def cmd_decode(a):
    rows = {}
    with open(a.log, errors="replace") as f:
        for l in f:
            m = re.match(r"\|\s*(\d+)\s*\|\s*([0-9.]+)\s*\|\s*([0-9.]+)\s*\|\s*([0-9.]+)\s*\|", l)
            if m:
                rows[int(m.group(1))] = {"prefill_tokens_per_second": float(m.group(2)),
                                         "decode_tokens_per_second": float(m.group(3)),
                                         "ms_per_step": float(m.group(4))}
    report({"check": "decode throughput", "batches": rows,
            "status": "pass" if rows else "fail"})


def cmd_profile(a):
    rows, outside = [], math.nan
    row = re.compile(r"^(\S.*?\S) +(\d+) +([0-9.]+) +([0-9.]+) +([0-9.]+)%$")
    in_table = False
    with open(a.log, errors="replace") as f:
        for l in f:
            l = l.rstrip("\n")
            if l.startswith("op profile (MEGATRON_OP_PROFILE=1"):
                in_table, rows = True, []
                continue
            if not in_table:
                continue
            m = row.match(l)
            if m:
                rows.append({"op": m.group(1), "calls": int(m.group(2)),
                             "mean_us": float(m.group(4)), "share": float(m.group(5))})
            elif l.startswith("outside ops") or l.startswith("device idle"):
                outside = float(l.split()[-1])
    report({"check": "op profile", "top": rows[:a.top], "outside_ops_ms": outside,
            "status": "pass" if rows else "fail"})


def cmd_summary(a):
    results = []
    with open(a.results) as f:
        for l in f:
            l = l.strip()
            if l:
                results.append(json.loads(l))
    out = ["# GPU check summary", ""]
    for r in results:
        if r.get("phase") == "environment":
            out += [f"- {k}: {v}" for k, v in r.items() if k not in ("phase", "status", "seconds")]
    out += ["", "| phase | status | seconds | figures |", "| --- | --- | --- | --- |"]
    for r in results:
        if r.get("phase") == "environment":
            continue
        figures = ", ".join(f"{k} {fmt(v)}" for k, v in r.items()
                            if k not in ("phase", "status", "seconds", "check"))
        out.append(f"| {r.get('phase')} | {r.get('status')} | {fmt(r.get('seconds'))} "
                   f"| {figures} |")
    text = "\n".join(out) + "\n"
    with open(a.out, "w") as f:
        f.write(text)
    print(text)


def fmt(v):
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, dict):
        if "op" in v and "share" in v:  # a profile row
            return f"{v['op']} {v['share']:.1f}% ({v['mean_us']:.0f} us x {v['calls']})"
        return "{" + ", ".join(f"{k}: {fmt(x)}" for k, x in v.items()
                               if k not in ("what", "device", "torch", "prompt", "gen")) + "}"
    if isinstance(v, list):
        return "; ".join(fmt(x) for x in v)
    return str(v)


def main():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("parity")
    for n in ("--w0", "--a", "--b", "--log-a", "--log-b"):
        s.add_argument(n, required=True)
    s.add_argument("--lr", type=float, required=True)
    s.add_argument("--tol-grad", type=float, default=1e-3)
    s.add_argument("--tol-loss", type=float, default=1e-4)
    s = sub.add_parser("loss")
    s.add_argument("--log-a", required=True)
    s.add_argument("--log-b", required=True)
    s.add_argument("--tol-loss", type=float, default=1e-2)
    s.add_argument("--tol-norm", type=float, default=5e-2)
    s = sub.add_parser("train")
    s.add_argument("--log", required=True)
    s.add_argument("--peak", type=float, default=0.0)
    s = sub.add_parser("decode")
    s.add_argument("--log", required=True)
    s = sub.add_parser("profile")
    s.add_argument("--log", required=True)
    s.add_argument("--top", type=int, default=8)
    s = sub.add_parser("summary")
    s.add_argument("--results", required=True)
    s.add_argument("--out", required=True)
    a = p.parse_args()
    {"parity": cmd_parity, "loss": cmd_loss, "train": cmd_train, "decode": cmd_decode,
     "profile": cmd_profile, "summary": cmd_summary}[a.cmd](a)


if __name__ == "__main__":
    main()
