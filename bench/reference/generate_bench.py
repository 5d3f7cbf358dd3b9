#!/usr/bin/python3
"""PyTorch counterpart of bench/generate_bench.cpp: the same GPT shape (LayerNorm, GeLU,
learned positions, tied output), fp32 on the CPU (--bf16 1: the model and its KV cache in bf16),
with a preallocated KV cache; prefill tokens/s and decode tokens/s at batch 1 and 16, per wall
second and per CPU second of the process, best of --reps after one warm-up round.

Usage: /usr/bin/python3 bench/reference/generate_bench.py [--layers 6 --hidden 512 --heads 8
       --vocab 50304 --prompt 128 --gen 32 --threads 2 --bf16 0]
"""
import argparse
import math
import time

import torch
import torch.nn.functional as F


class Layer(torch.nn.Module):
    def __init__(self, h, heads):
        super().__init__()
        self.heads, self.d = heads, h // heads
        self.ln1, self.ln2 = torch.nn.LayerNorm(h), torch.nn.LayerNorm(h)
        self.qkv, self.proj = torch.nn.Linear(h, 3 * h), torch.nn.Linear(h, h)
        self.fc1, self.fc2 = torch.nn.Linear(h, 4 * h), torch.nn.Linear(4 * h, h)

    def forward(self, x, cache, pos):
        b, n, h = x.shape
        qkv = self.qkv(self.ln1(x)).view(b, n, self.heads, 3, self.d)
        q, k, v = qkv.unbind(3)  # [b, n, heads, d]
        kc, vc = cache
        kc[:, :, pos:pos + n] = k.transpose(1, 2)
        vc[:, :, pos:pos + n] = v.transpose(1, 2)
        keys, values = kc[:, :, :pos + n], vc[:, :, :pos + n]
        scores = q.transpose(1, 2) @ keys.transpose(2, 3) / math.sqrt(self.d)
        if n > 1:
            mask = torch.ones(n, pos + n, dtype=torch.bool).triu(pos + 1)
            scores = scores.masked_fill(mask, float("-inf"))
        ctx = (F.softmax(scores, -1) @ values).transpose(1, 2).reshape(b, n, h)
        x = x + self.proj(ctx)
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class GPT(torch.nn.Module):
    def __init__(self, layers, h, heads, vocab, max_len):
        super().__init__()
        self.emb, self.pos = torch.nn.Embedding(vocab, h), torch.nn.Embedding(max_len, h)
        self.layers = torch.nn.ModuleList(Layer(h, heads) for _ in range(layers))
        self.final = torch.nn.LayerNorm(h)
        self.heads, self.d, self.max_len = heads, h // heads, max_len

    def start(self, batch):
        shape = (batch, self.heads, self.max_len, self.d)
        dt = self.emb.weight.dtype
        self.cache = [(torch.zeros(shape, dtype=dt), torch.zeros(shape, dtype=dt)) for _ in self.layers]
        self.position = 0

    def forward(self, tokens):  # logits of the last position
        n = tokens.shape[1]
        x = self.emb(tokens) + self.pos(torch.arange(self.position, self.position + n))[None]
        for layer, cache in zip(self.layers, self.cache):
            x = layer(x, cache, self.position)
        self.position += n
        return self.final(x[:, -1]) @ self.emb.weight.T


def main():
    p = argparse.ArgumentParser()
    for name, default in [("layers", 6), ("hidden", 512), ("heads", 8), ("vocab", 50304),
                          ("prompt", 128), ("gen", 32), ("reps", 3), ("threads", 2), ("bf16", 0)]:
        p.add_argument("--" + name, type=int, default=default)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    model = GPT(a.layers, a.hidden, a.heads, a.vocab, a.prompt + a.gen).eval()
    if a.bf16:
        model = model.to(torch.bfloat16)
    print("torch %s, %d threads; model: %d layers, hidden %d, heads %d, vocab %d, %s; prompt %d, "
          "generate %d" % (torch.__version__, a.threads, a.layers, a.hidden, a.heads, a.vocab,
                           "bf16" if a.bf16 else "fp32", a.prompt, a.gen))
    print("| batch | prefill tokens/s | decode tokens/s | decode ms/step | prefill tokens per CPU s "
          "| decode tokens per CPU s |\n|---|---|---|---|---|---|")
    with torch.inference_mode():
        for batch in (1, 16):
            tokens = torch.randint(0, a.vocab, (batch, a.prompt))
            step = torch.full((batch, 1), 42)
            best_prefill = best_decode = cpu_prefill = cpu_decode = float("inf")
            for r in range(a.reps + 1):
                model.start(batch)
                t0, c0 = time.perf_counter(), time.process_time()
                model(tokens)
                t1, c1 = time.perf_counter(), time.process_time()
                for _ in range(a.gen):
                    model(step)
                t2, c2 = time.perf_counter(), time.process_time()
                if r:
                    best_prefill, best_decode = min(best_prefill, t1 - t0), min(best_decode, t2 - t1)
                    cpu_prefill, cpu_decode = min(cpu_prefill, c1 - c0), min(cpu_decode, c2 - c1)
            print("| %d | %.0f | %.1f | %.2f | %.0f | %.1f |" % (
                batch, batch * a.prompt / best_prefill, batch * a.gen / best_decode,
                1e3 * best_decode / a.gen, batch * a.prompt / cpu_prefill, batch * a.gen / cpu_decode))

if __name__ == "__main__":
    main()
