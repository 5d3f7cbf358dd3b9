# PyTorch reference for bench/train_cpu.sh: a GPT of the same shape as `megatron pretrain-gpt`
# (learned positions, pre-LayerNorm, GeLU MLP, tied embeddings, no dropout), AdamW with clipping,
# trained on consecutive windows of the same uint16 token file. Prints JSON with step time,
# tokens/s, peak RSS and the final loss.
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
a = p.parse_args()
torch.set_num_threads(a.threads)
torch.manual_seed(1234)

class Block(nn.Module):
    def __init__(s):
        super().__init__()
        s.ln1, s.ln2 = nn.LayerNorm(a.hidden), nn.LayerNorm(a.hidden)
        s.qkv, s.proj = nn.Linear(a.hidden, 3 * a.hidden), nn.Linear(a.hidden, a.hidden)
        s.fc1, s.fc2 = nn.Linear(a.hidden, 4 * a.hidden), nn.Linear(4 * a.hidden, a.hidden)
    def forward(s, x):
        b, t, h = x.shape
        q, k, v = s.qkv(s.ln1(x)).view(b, t, 3, a.heads, h // a.heads).permute(2, 0, 3, 1, 4)
        att = (q @ k.transpose(-1, -2)) / (h // a.heads) ** 0.5
        att = att.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf")).softmax(-1)
        x = x + s.proj((att @ v).transpose(1, 2).reshape(b, t, h))
        return x + s.fc2(F.gelu(s.fc1(s.ln2(x))))

class GPT(nn.Module):
    def __init__(s):
        super().__init__()
        s.wte, s.wpe = nn.Embedding(a.vocab, a.hidden), nn.Embedding(a.seq, a.hidden)
        s.blocks = nn.ModuleList(Block() for _ in range(a.layers))
        s.lnf = nn.LayerNorm(a.hidden)
    def forward(s, idx):
        x = s.wte(idx) + s.wpe(torch.arange(idx.shape[1]))
        for blk in s.blocks:
            x = blk(x)
        return s.lnf(x) @ s.wte.weight.t()

model = GPT()
for n, prm in model.named_parameters():
    if prm.dim() > 1:
        nn.init.normal_(prm, std=0.02)
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
        loss = F.cross_entropy(model(x[:, :-1]).reshape(-1, a.vocab), x[:, 1:].reshape(-1))
        (loss / (a.gbs // a.mbs)).backward()
        total += loss.item() / (a.gbs // a.mbs)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    times.append(time.perf_counter() - t0)
    loss_v = total
step_t = sum(times[1:]) / max(1, len(times) - 1)
print(json.dumps({"step_s": step_t, "tokens_per_s": a.gbs * a.seq / step_t, "loss": loss_v,
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
