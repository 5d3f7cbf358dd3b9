#!/usr/bin/env python3
"""PyTorch reference for megatron.cpp's GPTModel (tests/model/gpt_reference_test.cpp).

The same architecture as src/model/gpt_model.cpp (Megatron-Core local spec, pre-LN GPT, fused
QKV in per-head [q; k; v] row groups, tied output layer, learned positions), evaluated in
float64 with autograd so it serves as ground truth for the fp32 C++ model.

Usage: gpt_reference.py DIR
  DIR/config.json  {"num_layers", "hidden_size", "num_attention_heads", "groups", "head_dim",
                    "vocab", "eps", "gelu_tanh", "batch", "seq", "grad_scale",
                    "has_attention_start", "params": [{"name", "shape"}...]}
  DIR/weights.bin  float32 values of the params, concatenated in the listed order
  DIR/batch.bin    int32 tokens, positions, labels, attention_start [b*s each], then float32
                   loss_mask [b*s]
Writes DIR/out.bin: float64 loss_sum, num_tokens, logits [b*s*V], then every param's grad of
grad_scale * sum(loss * mask) in the listed order.
"""
import json
import math
import sys

import numpy as np
import torch
import torch.nn.functional as F


def main(d):
    cfg = json.load(open(f"{d}/config.json"))
    raw = np.fromfile(f"{d}/weights.bin", dtype=np.float32)
    params, off = {}, 0
    for p in cfg["params"]:
        n = int(np.prod(p["shape"]))
        t = torch.tensor(raw[off:off + n].astype(np.float64)).reshape(p["shape"])
        params[p["name"]] = t.requires_grad_(True)
        off += n
    assert off == raw.size, "weights.bin size does not match config"
    b, s, V = cfg["batch"], cfg["seq"], cfg["vocab"]
    ints = np.fromfile(f"{d}/batch.bin", dtype=np.int32, count=4 * b * s)
    mask = np.fromfile(f"{d}/batch.bin", dtype=np.float32, offset=16 * b * s)
    tokens, pos, labels, start = (torch.tensor(ints[i * b * s:(i + 1) * b * s].astype(np.int64))
                                  .reshape(b, s) for i in range(4))
    mask = torch.tensor(mask.astype(np.float64)).reshape(b, s)
    L, h, n, hd = cfg["num_layers"], cfg["hidden_size"], cfg["num_attention_heads"], cfg["head_dim"]
    eps = cfg["eps"]
    act = (lambda x: F.gelu(x, approximate="tanh")) if cfg["gelu_tanh"] else F.gelu

    i_idx = torch.arange(s).view(s, 1)
    j_idx = torch.arange(s).view(1, s)
    allowed = (j_idx <= i_idx).view(1, 1, s, s).expand(b, 1, s, s)
    if cfg["has_attention_start"]:
        allowed = allowed & (j_idx.view(1, 1, 1, s) >= start.view(b, 1, s, 1))

    P = params
    x = P["embedding.word_embeddings.weight"][tokens] + P["embedding.position_embeddings.weight"][pos]
    for li in range(L):
        pre = f"decoder.layers.{li}."
        a = F.layer_norm(x, (h,), P[pre + "input_layernorm.weight"], P[pre + "input_layernorm.bias"], eps)
        qkv = a @ P[pre + "self_attention.linear_qkv.weight"].t() + P[pre + "self_attention.linear_qkv.bias"]
        g = cfg.get("groups", n)
        hpg = n // g
        qkv = qkv.view(b, s, g, hpg + 2, hd)  # per query group: hpg query heads, 1 key, 1 value
        q = qkv[:, :, :, :hpg].reshape(b, s, n, hd).permute(0, 2, 1, 3)  # [b, n, s, d]
        k, v = (qkv[:, :, :, hpg + i].permute(0, 2, 1, 3).repeat_interleave(hpg, dim=1)
                for i in range(2))
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(hd)
        scores = scores.masked_fill(~allowed, float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        ctx = (probs @ v).permute(0, 2, 1, 3).reshape(b, s, n * hd)
        x = x + ctx @ P[pre + "self_attention.linear_proj.weight"].t() + P[pre + "self_attention.linear_proj.bias"]
        m = F.layer_norm(x, (h,), P[pre + "pre_mlp_layernorm.weight"], P[pre + "pre_mlp_layernorm.bias"], eps)
        h1 = act(m @ P[pre + "mlp.linear_fc1.weight"].t() + P[pre + "mlp.linear_fc1.bias"])
        x = x + h1 @ P[pre + "mlp.linear_fc2.weight"].t() + P[pre + "mlp.linear_fc2.bias"]
    xf = F.layer_norm(x, (h,), P["decoder.final_layernorm.weight"], P["decoder.final_layernorm.bias"], eps)
    logits = xf @ P["embedding.word_embeddings.weight"].t()
    loss = F.cross_entropy(logits.reshape(-1, V), labels.reshape(-1), reduction="none")
    loss_sum = (loss * mask.reshape(-1)).sum()
    (cfg["grad_scale"] * loss_sum).backward()
    out = [np.array([loss_sum.item(), mask.sum().item()]), logits.detach().numpy().ravel()]
    for p in cfg["params"]:
        g = params[p["name"]].grad
        out.append((g if g is not None else torch.zeros_like(params[p["name"]])).numpy().ravel())
    np.concatenate(out).astype(np.float64).tofile(f"{d}/out.bin")


if __name__ == "__main__":
    torch.set_num_threads(1)
    main(sys.argv[1])
