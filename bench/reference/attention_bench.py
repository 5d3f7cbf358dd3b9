"""PyTorch's CPU attention, forward and backward, beside build/bench/attention_bench.

Causal self-attention of q, k, v [batch, heads, seq, head_dim] through PyTorch 1.13's
scaled-dot-product attention (torch.nn.functional._scaled_dot_product_attention with is_causal:
on the CPU the math path, softmax(q k^T / sqrt(d)) v with the probabilities kept for backward),
in fp32 and with the tensors in bf16. Prints lines in attention_bench's format: name, "saved",
forward and backward milliseconds (process CPU time, then wall time; median of reps after a
warm-up) and GFLOP of the causal products per CPU second.
Usage: /usr/bin/python3 bench/reference/attention_bench.py [--batch 4] [--seq 1024] [--heads 12]
       [--head-dim 64] [--reps 3] [--threads 1]
"""
import argparse
import statistics
import time

import torch
import torch.nn.functional as F


def attention(q, k, v):
    if hasattr(F, "scaled_dot_product_attention"):  # PyTorch 2
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return F._scaled_dot_product_attention(q, k, v, None, 0.0, False, True)[0]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    b, s, n, d = a.batch, a.seq, a.heads, a.head_dim
    causal_flop = 2.0 * b * n * s * (s + 1) / 2 * d  # one product
    for name, dtype in (("PyTorch 1.13 fp32", torch.float32), ("PyTorch 1.13 bf16", torch.bfloat16)):
        base = torch.randn(3, b, n, s, d).to(dtype)
        dout = torch.randn(b, n, s, d).to(dtype)
        fc, bc, fw, bw = [], [], [], []
        for r in range(a.reps + 1):  # r == 0: warm-up
            q, k, v = (base[i].clone().requires_grad_() for i in range(3))
            c0, w0 = time.process_time(), time.perf_counter()
            out = attention(q, k, v)
            c1, w1 = time.process_time(), time.perf_counter()
            out.backward(dout)
            c2, w2 = time.process_time(), time.perf_counter()
            if r == 0:
                continue
            fc.append(c1 - c0)
            bc.append(c2 - c1)
            fw.append(w1 - w0)
            bw.append(w2 - w1)
        f, g = statistics.median(fc), statistics.median(bc)
        print(f"{name}\tsaved\t{1e3 * f:.1f}\t{1e3 * g:.1f}\t{1e3 * statistics.median(fw):.1f}\t"
              f"{1e3 * statistics.median(bw):.1f}\t{causal_flop * 6 / (f + g) * 1e-9:.1f}", flush=True)


if __name__ == "__main__":
    main()
