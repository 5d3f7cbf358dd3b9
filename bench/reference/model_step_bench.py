#!/usr/bin/env python3
"""PyTorch CPU reference for bench/model_step_bench.cpp: the same GPT (pre-LN, fused QKV,
tanh GELU, tied output, dropout 0.1) in fp32, timing one forward+backward of a micro-batch.
Usage: model_step_bench.py [--layers 6 --hidden 384 --heads 6 --seq 256 --vocab 50304 --mbs 4
--iters 5 --threads ncpu]."""
import argparse
import math
import os
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Layer(nn.Module):
    def __init__(self, h, n, p):
        super().__init__()
        self.n, self.p = n, p
        self.ln1, self.ln2 = nn.LayerNorm(h), nn.LayerNorm(h)
        self.qkv, self.proj = nn.Linear(h, 3 * h), nn.Linear(h, h)
        self.fc1, self.fc2 = nn.Linear(h, 4 * h), nn.Linear(4 * h, h)

    def forward(self, x, mask):
        b, s, h = x.shape
        d = h // self.n
        qkv = self.qkv(self.ln1(x)).view(b, s, self.n, 3, d)
        q, k, v = (qkv[:, :, :, i].transpose(1, 2) for i in range(3))
        att = (q @ k.transpose(-1, -2)) / math.sqrt(d)
        att = F.dropout(torch.softmax(att.masked_fill(mask, float("-inf")), -1), self.p)
        ctx = (att @ v).transpose(1, 2).reshape(b, s, h)
        x = x + F.dropout(self.proj(ctx), self.p)
        return x + F.dropout(self.fc2(F.gelu(self.fc1(self.ln2(x)), approximate="tanh")), self.p)


class GPT(nn.Module):
    def __init__(self, L, h, n, s, V, p=0.1):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(V, h), nn.Embedding(s, h)
        self.layers = nn.ModuleList(Layer(h, n, p) for _ in range(L))
        self.lnf, self.p = nn.LayerNorm(h), p
        self.register_buffer("mask", torch.ones(s, s, dtype=torch.bool).triu(1))

    def forward(self, tok, pos, labels):
        x = F.dropout(self.wte(tok) + self.wpe(pos), self.p)
        for l in self.layers:
            x = l(x, self.mask)
        logits = self.lnf(x) @ self.wte.weight.t()
        return F.cross_entropy(logits.view(-1, logits.size(-1)), labels.view(-1))


def main():
    ap = argparse.ArgumentParser()
    for k, v in dict(layers=6, hidden=384, heads=6, seq=256, vocab=50304, mbs=4, iters=5).items():
        ap.add_argument("--" + k, type=int, default=v)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    m = GPT(a.layers, a.hidden, a.heads, a.seq, a.vocab).train()
    tok = torch.randint(0, a.vocab, (a.mbs, a.seq))
    lab = torch.randint(0, a.vocab, (a.mbs, a.seq))
    pos = torch.arange(a.seq).expand(a.mbs, a.seq)
    m(tok, pos, lab).backward()  # warm-up
    times, cpu = [], 0.0
    for _ in range(a.iters):
        t0, c0 = time.perf_counter(), time.process_time()
        m(tok, pos, lab).backward()
        times.append((time.perf_counter() - t0) * 1000)
        cpu += (time.process_time() - c0) * 1000
    mean = sum(times) / len(times)
    print(f"pytorch {torch.__version__} forward+backward: layers={a.layers} h={a.hidden} "
          f"heads={a.heads} seq={a.seq} vocab={a.vocab} mbs={a.mbs} threads={torch.get_num_threads()}\n"
          f"  mean {mean:.1f} ms  best {min(times):.1f} ms  {a.mbs * a.seq / (mean / 1000):.0f} tokens/s (mean)"
          f"  cpu {cpu / a.iters:.1f} ms/step")


if __name__ == "__main__":
    main()
