#!/usr/bin/env python3
"""PyTorch reference for scripts/gpu-check.sh: GPT-2 124M as a user would train and run it in
PyTorch on one GPU, for comparison with `megatron pretrain-gpt --device cuda` and
bench/generate_bench --device cuda in the same call.

The model is the one `megatron pretrain-gpt` builds from GPT-2's shape: learned positions,
pre-LayerNorm (eps 1e-5), tanh GeLU MLP of 4 x hidden, biases, tied output layer, no dropout.

train:  bf16 autocast over fp32 weights, fused AdamW (lr 6e-4, betas .9/.95, wd .1), gradient
        clipping at 1.0, micro-batches accumulated into the global batch, attention through
        scaled_dot_product_attention with its flash kernel; --compile runs torch.compile first.
        Prints tokens/s over the timed steps, TFLOP/s with the FLOPs count `megatron pretrain-gpt
        --log-throughput` prints (Megatron's formula), and MFU against the GPU's dense bf16 peak.
decode: a preallocated KV cache, prefill of --prompt tokens, then --gen greedy steps of one token
        per sequence, at each --batches size; prints decode tokens/s (all sequences).
gemm:   the products of a `megatron` run's MEGATRON_OP_PROFILE=1 table (--profile-log: the rows
        "gemm MxKxN dtype TT"), each timed in PyTorch in the same shape, dtype and transposes
        (torch.matmul, whose output has the operands' dtype; for half precision also with an fp32
        output, as our products write, where torch.mm takes out_dtype); prints one line per shape
        with our mean time from the profile beside PyTorch's, and TFLOP/s of each.

Every result is one JSON line on stdout. Runs on the CPU too (--device cpu, with a small --layers /
--hidden), which is how the script's dry run checks it without a GPU.
"""
import argparse
import contextlib
import json
import math
import re
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

p = argparse.ArgumentParser()
p.add_argument("--mode", choices=["train", "decode", "gemm"], required=True)
p.add_argument("--profile-log", default="")
p.add_argument("--top", type=int, default=12)
p.add_argument("--device", default="cuda")
p.add_argument("--layers", type=int, default=12)
p.add_argument("--hidden", type=int, default=768)
p.add_argument("--heads", type=int, default=12)
p.add_argument("--seq", type=int, default=1024)
p.add_argument("--vocab", type=int, default=50304)  # GPT-2's 50257 padded to a multiple of 128
p.add_argument("--mbs", type=int, default=8)
p.add_argument("--gbs", type=int, default=64)
p.add_argument("--steps", type=int, default=30)
p.add_argument("--warmup", type=int, default=5)
p.add_argument("--compile", action="store_true")
p.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16")
p.add_argument("--prompt", type=int, default=128)
p.add_argument("--gen", type=int, default=64)
p.add_argument("--batches", default="1,16")
a = p.parse_args()
dev = torch.device(a.device)
on_gpu = dev.type == "cuda"
torch.manual_seed(1234)
if on_gpu:
    torch.backends.cuda.matmul.allow_tf32 = True  # what a PyTorch user gets with bf16 autocast
    torch.backends.cudnn.allow_tf32 = True


def flash_only(dtype=torch.bfloat16):
    """SDPA restricted to its flash kernel where this PyTorch can say so (half precision only:
    the flash kernel has no float32 path, where SDPA picks its memory-efficient kernel)."""
    if not on_gpu or dtype == torch.float32:
        return contextlib.nullcontext()
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
        return sdpa_kernel(SDPBackend.FLASH_ATTENTION)
    except ImportError:
        return contextlib.nullcontext()


def manual_attention(q, k, v, is_causal):
    """scaled_dot_product_attention for PyTorch older than 2.0 (the dry run's, on the CPU)."""
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if is_causal:
        t, n = q.shape[-2], k.shape[-2]
        s = s.masked_fill(torch.ones(t, n, dtype=torch.bool, device=q.device).triu(n - t + 1),
                          float("-inf"))
    return s.softmax(-1) @ v


sdpa = getattr(F, "scaled_dot_product_attention", manual_attention)


class Block(nn.Module):
    def __init__(self, h, heads):
        super().__init__()
        self.heads, self.d = heads, h // heads
        self.ln1, self.ln2 = nn.LayerNorm(h), nn.LayerNorm(h)
        self.qkv, self.proj = nn.Linear(h, 3 * h), nn.Linear(h, h)
        self.fc1, self.fc2 = nn.Linear(h, 4 * h), nn.Linear(4 * h, h)

    def forward(self, x, cache=None, pos=0):
        b, t, h = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, self.d).unbind(2)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # [b, heads, t, d]
        if cache is None:
            y = sdpa(q, k, v, is_causal=True)
        else:
            kc, vc = cache
            kc[:b, :, pos:pos + t] = k
            vc[:b, :, pos:pos + t] = v
            k, v = kc[:b, :, :pos + t], vc[:b, :, :pos + t]
            y = sdpa(q, k, v, is_causal=t > 1)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, h))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(a.vocab, a.hidden), nn.Embedding(a.seq, a.hidden)
        self.blocks = nn.ModuleList(Block(a.hidden, a.heads) for _ in range(a.layers))
        self.ln_f = nn.LayerNorm(a.hidden)
        for m in self.modules():  # Megatron's init: N(0, 0.02), zero biases
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, 0.0, 0.02)
            if isinstance(m, nn.Linear):
                nn.init.zeros_(m.bias)

    def forward(self, idx, caches=None, pos=0):
        x = self.wte(idx) + self.wpe(torch.arange(pos, pos + idx.shape[1], device=idx.device))
        for i, blk in enumerate(self.blocks):
            x = blk(x, None if caches is None else caches[i], pos)
        return self.ln_f(x) @ self.wte.weight.t()  # tied output layer


def flops_per_iteration(batch):
    """`megatron pretrain-gpt --log-throughput`'s count (src/training/metrics.cpp)."""
    B, s, h, L, V = batch, a.seq, a.hidden, a.layers, a.vocab
    q = kv = h
    F_ = 4 * h
    return B * s * (6 * h * F_ * 2 * L + 6 * L * (h * (q + 2 * kv) + q * h) + 6 * h * V) + \
        B * s * s * 6 * q * L


def peak_tflops():
    """Dense bf16 tensor-core peak of the GPU (NVIDIA's datasheets), or None if unknown."""
    if not on_gpu:
        return None
    name = torch.cuda.get_device_name(dev)
    for key, peak in (("H200", 989.4), ("H100 PCIe", 756.0), ("H100", 989.4), ("A100", 312.0)):
        if key in name:
            return peak
    return None


def sync():
    if on_gpu:
        torch.cuda.synchronize(dev)


def train():
    model = GPT().to(dev)
    if a.compile:
        model = torch.compile(model)
    fused = {"fused": True} if on_gpu else {}  # older PyTorch (Debian's, CPU) has no fused AdamW
    opt = torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.95), weight_decay=0.1,
                            **fused)
    accum = a.gbs // a.mbs
    amp = torch.autocast(dev.type, dtype=torch.bfloat16, enabled=a.dtype == "bf16")
    times, loss = [], float("nan")
    for step in range(a.warmup + a.steps):
        sync()
        t0 = time.perf_counter()
        for _ in range(accum):
            x = torch.randint(0, 50257, (a.mbs, a.seq + 1), device=dev)
            with amp, flash_only():
                logits = model(x[:, :-1])
                l = F.cross_entropy(logits.float().view(-1, a.vocab), x[:, 1:].reshape(-1)) / accum
            l.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss = float(l.detach()) * accum
        sync()
        if step >= a.warmup:
            times.append(time.perf_counter() - t0)
    sec = sum(times) / len(times)
    tflops = flops_per_iteration(a.gbs) / sec / 1e12
    peak = peak_tflops()
    print(json.dumps({
        "what": "pytorch train" + (" compiled" if a.compile else " eager"),
        "device": torch.cuda.get_device_name(dev) if on_gpu else "cpu", "torch": torch.__version__,
        "sdpa": sdpa is not manual_attention, "dtype": a.dtype, "mbs": a.mbs, "gbs": a.gbs,
        "seq": a.seq, "steps": len(times),
        "ms_per_iteration": 1e3 * sec, "tokens_per_second": a.gbs * a.seq / sec,
        "tflops": tflops, "mfu": tflops / peak if peak else None, "last_loss": loss}), flush=True)


@torch.no_grad()
def decode():
    model = GPT().to(dev).eval()
    dtype = torch.bfloat16 if a.dtype == "bf16" else torch.float32
    model = model.to(dtype)
    for batch in (int(b) for b in a.batches.split(",")):
        caches = [(torch.zeros(batch, a.heads, a.prompt + a.gen, a.hidden // a.heads, device=dev,
                               dtype=dtype),
                   torch.zeros(batch, a.heads, a.prompt + a.gen, a.hidden // a.heads, device=dev,
                               dtype=dtype)) for _ in range(a.layers)]
        best = math.inf
        for rep in range(3):  # the first round warms up
            prompt = torch.randint(0, 50257, (batch, a.prompt), device=dev)
            with flash_only(dtype):
                nxt = model(prompt, caches, 0)[:, -1].argmax(-1, keepdim=True)
            sync()
            t0 = time.perf_counter()
            for g in range(a.gen):
                nxt = model(nxt, caches, a.prompt + g)[:, -1].argmax(-1, keepdim=True)
            sync()
            if rep > 0:
                best = min(best, time.perf_counter() - t0)
        print(json.dumps({
            "what": "pytorch decode",
            "device": torch.cuda.get_device_name(dev) if on_gpu else "cpu",
            "torch": torch.__version__, "dtype": a.dtype, "batch": batch, "prompt": a.prompt,
            "gen": a.gen, "decode_tokens_per_second": batch * a.gen / best,
            "ms_per_step": 1e3 * best / a.gen}), flush=True)


def profile_products(path):
    """The product rows of a MEGATRON_OP_PROFILE=1 table: (M, K, N, dtype, ta, tb, calls, mean us)."""
    row = re.compile(r"^gemm (\d+)x(\d+)x(\d+) (\w+) ([NT])([NT]) +(\d+) +[0-9.]+ +([0-9.]+) ")
    out = []
    with open(path, errors="replace") as f:
        for line in f:
            if line.startswith("op profile (MEGATRON_OP_PROFILE=1"):
                out = []  # the last table of the log
            m = row.match(line)
            if m:
                out.append((int(m.group(1)), int(m.group(2)), int(m.group(3)), m.group(4),
                            m.group(5) == "T", m.group(6) == "T", int(m.group(7)),
                            float(m.group(8))))
    return out


def time_us(fn, reps=20):
    fn()
    sync()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    sync()
    return 1e6 * (time.perf_counter() - t0) / reps


@torch.no_grad()
def gemm():
    rows = profile_products(a.profile_log)
    if not rows:
        raise SystemExit(f"no product rows in {a.profile_log}")
    # The products that take the most time: calls x mean.
    rows.sort(key=lambda r: -r[6] * r[7])
    dtypes = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    for M, K, N, dt, ta, tb, calls, ours_us in rows[:a.top]:
        dtype = dtypes.get(dt, torch.float32)
        x = torch.randn((K, M) if ta else (M, K), device=dev, dtype=dtype)
        w = torch.randn((N, K) if tb else (K, N), device=dev, dtype=dtype)
        xa, wb = (x.t() if ta else x), (w.t() if tb else w)
        flop = 2.0 * M * K * N
        res = {"what": "product", "shape": f"{M}x{K}x{N} {dt} {'T' if ta else 'N'}{'T' if tb else 'N'}",
               "calls": calls, "ours_us": ours_us, "torch_us": time_us(lambda: torch.matmul(xa, wb))}
        if dtype != torch.float32:
            try:
                res["torch_fp32_out_us"] = time_us(lambda: torch.mm(xa, wb, out_dtype=torch.float32))
            except (TypeError, RuntimeError) as e:  # out_dtype is in recent PyTorch only
                res["torch_fp32_out"] = f"not available: {str(e)[:80]}"
        res["ours_tflops"] = flop / ours_us / 1e6
        res["torch_tflops"] = flop / res["torch_us"] / 1e6
        print(json.dumps(res), flush=True)


{"train": lambda: train(), "decode": lambda: decode(), "gemm": lambda: gemm()}[a.mode]()
