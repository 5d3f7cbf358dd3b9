# PyTorch reference for bench/train_cpu.sh: a GPT of the same shape as `megatron pretrain-gpt`
# (learned positions, pre-LayerNorm, GeLU MLP, tied embeddings, no dropout), or with --arch llama
# a Llama-style one (RMSNorm, rotary embeddings, SwiGLU, grouped-query attention, no biases,
# untied output layer), AdamW with clipping, trained on consecutive windows of the same uint16
# token file. --precision: fp32; autocast (fp32 weights, products in bf16 under
# torch.autocast('cpu', torch.bfloat16)); bf16 (the model and its optimizer state in bf16, the loss
# in fp32). Prints JSON with step time, tokens/s, peak RSS and the final loss.
import argparse, json, resource, time
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

p = argparse.ArgumentParser()
p.add_argument("--bin", required=True)
p.add_argument("--threads", type=int, default=2)
p.add_argument("--steps", type=int, default=5)
p.add_argument("--layers", type=int, default=6)
p.add_argument("--hidden", type=int, default=384)
p.add_argument("--heads", type=int, default=6)
p.add_argument("--seq", type=int, default=256)
p.add_argument("--vocab", type=int, default=50304)
p.add_argument("--mbs", type=int, default=4)
p.add_argument("--gbs", type=int, default=8)
p.add_argument("--arch", default="gpt", choices=["gpt", "llama"])
p.add_argument("--groups", type=int, default=2)
p.add_argument("--ffn", type=int, default=0)
p.add_argument("--precision", default="fp32", choices=["fp32", "autocast", "bf16"])
a = p.parse_args()
llama = a.arch == "llama"
ffn = a.ffn or (4 * a.hidden if not llama else a.hidden * 8 // 3 // 64 * 64)
groups = a.groups if llama else a.heads
torch.set_num_threads(a.threads)
torch.manual_seed(1234)

class RMSNorm(nn.Module):
    def __init__(s, h):
        super().__init__()
        s.weight = nn.Parameter(torch.ones(h))
    def forward(s, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * s.weight

def rotate(x, cos, sin):  # rotary embedding on [b, heads, t, d] (halves)
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin

class Block(nn.Module):
    def __init__(s):
        super().__init__()
        d = a.hidden // a.heads
        norm = RMSNorm if llama else nn.LayerNorm
        s.ln1, s.ln2 = norm(a.hidden), norm(a.hidden)
        s.qkv = nn.Linear(a.hidden, (a.heads + 2 * groups) * d, bias=not llama)
        s.proj = nn.Linear(a.hidden, a.hidden, bias=not llama)
        s.fc1 = nn.Linear(a.hidden, ffn * (2 if llama else 1), bias=not llama)
        s.fc2 = nn.Linear(ffn, a.hidden, bias=not llama)
    def forward(s, x, cos, sin):
        b, t, h = x.shape
        d = h // a.heads
        q, k, v = s.qkv(s.ln1(x)).split([a.heads * d, groups * d, groups * d], dim=-1)
        q = q.view(b, t, a.heads, d).transpose(1, 2)
        k, v = (z.view(b, t, groups, d).transpose(1, 2).repeat_interleave(a.heads // groups, 1) for z in (k, v))
        if llama:
            q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        att = (q @ k.transpose(-1, -2)) / d ** 0.5
        att = att.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf")).softmax(-1)
        x = x + s.proj((att @ v).transpose(1, 2).reshape(b, t, h))
        if llama:
            g, u = s.fc1(s.ln2(x)).chunk(2, dim=-1)
            return x + s.fc2(F.silu(g) * u)
        return x + s.fc2(F.gelu(s.fc1(s.ln2(x)), approximate="tanh"))

class GPT(nn.Module):
    def __init__(s):
        super().__init__()
        s.wte = nn.Embedding(a.vocab, a.hidden)
        s.wpe = None if llama else nn.Embedding(a.seq, a.hidden)
        s.blocks = nn.ModuleList(Block() for _ in range(a.layers))
        s.lnf = RMSNorm(a.hidden) if llama else nn.LayerNorm(a.hidden)
        s.out = nn.Linear(a.hidden, a.vocab, bias=False) if llama else None
        d = a.hidden // a.heads
        inv = 1.0 / (10000 ** (torch.arange(0, d, 2).float() / d))
        ang = torch.outer(torch.arange(a.seq).float(), inv)
        ang = torch.cat((ang, ang), dim=-1)
        s.cos, s.sin = ang.cos(), ang.sin()
    def forward(s, idx):
        x = s.wte(idx) if s.wpe is None else s.wte(idx) + s.wpe(torch.arange(idx.shape[1]))
        for blk in s.blocks:
            x = blk(x, s.cos, s.sin)
        x = s.lnf(x)
        return s.out(x) if s.out is not None else x @ s.wte.weight.t()

model = GPT()
for n, prm in model.named_parameters():
    if prm.dim() > 1:
        nn.init.normal_(prm, std=0.02)
if a.precision == "bf16":
    model = model.to(torch.bfloat16)
    model.cos, model.sin = model.cos.to(torch.bfloat16), model.sin.to(torch.bfloat16)
decay = [q for q in model.parameters() if q.dim() > 1]
no_decay = [q for q in model.parameters() if q.dim() == 1]
opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}],
                        lr=1e-4, betas=(0.9, 0.999), eps=1e-8)
data = np.fromfile(a.bin, dtype=np.uint16).astype(np.int64)
pos, times, loss_v = 0, [], 0.0
for step in range(a.steps):
    t0 = time.perf_counter()
    opt.zero_grad()
    total = 0.0
    for m in range(a.gbs // a.mbs):
        xs = np.stack([data[pos + i * (a.seq + 1): pos + i * (a.seq + 1) + a.seq + 1] for i in range(a.mbs)])
        pos += a.mbs * (a.seq + 1)
        x = torch.from_numpy(xs)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.precision == "autocast"):
            logits = model(x[:, :-1])
        loss = F.cross_entropy(logits.float().reshape(-1, a.vocab), x[:, 1:].reshape(-1))
        (loss / (a.gbs // a.mbs)).backward()
        total += loss.item() / (a.gbs // a.mbs)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    times.append(time.perf_counter() - t0)
    loss_v = total
step_t = sum(times[1:]) / max(1, len(times) - 1)
print(json.dumps({"step_s": step_t, "tokens_per_s": a.gbs * a.seq / step_t, "loss": loss_v,
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
