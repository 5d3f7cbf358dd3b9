#!/usr/bin/python3
"""PyTorch reference for GPT generation: a full causal forward (no KV cache), in float64.

Usage: generate_reference.py MODEL.json
MODEL.json: {"config": {...GPTInferenceConfig fields...}, "weights_file": "w.bin",
             "tensors": {name: {"shape": [...], "offset": float_index}}, "tokens": [[...]],
             "generate": n}
Prints JSON: {"logits": [b][s][vocab] for "tokens", "greedy": [b][s + n] tokens generated
greedily by recomputing the whole prefix at each step}.
"""
import json
import math
import sys

import numpy as np
import torch
import torch.nn.functional as F


def load(spec, base):
    raw = np.fromfile(base + spec["weights_file"], dtype=np.float32)
    return {name: torch.from_numpy(raw[t["offset"]:t["offset"] + int(np.prod(t["shape"]))]
                                   .reshape(t["shape"]).astype(np.float64))
            for name, t in spec["tensors"].items()}


def norm(cfg, x, w, b):
    eps = cfg["layernorm_epsilon"]
    if cfg["normalization"] == "LayerNorm":
        return F.layer_norm(x, (x.shape[-1],), w, b, eps)
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps) * w


def rope(cfg, x, d):  # x [b, s, heads, d]
    rot = int(d * cfg["rotary_percent"])
    inv = 1.0 / (cfg["rotary_base"] ** (torch.arange(0, rot, 2, dtype=torch.float64) / rot))
    pos = torch.arange(x.shape[1], dtype=torch.float64)
    freqs = torch.outer(pos, inv)
    emb = torch.cat([freqs, freqs], -1)[None, :, None, :]
    xr, rest = x[..., :rot], x[..., rot:]
    x1, x2 = xr[..., :rot // 2], xr[..., rot // 2:]
    rotated = torch.cat([-x2, x1], -1)
    return torch.cat([xr * emb.cos() + rotated * emb.sin(), rest], -1)


def forward(cfg, W, tokens):
    b, s = tokens.shape
    heads, groups = cfg["num_attention_heads"], cfg["num_query_groups"]
    d, hpg = cfg["kv_channels"], heads // groups
    x = W["embedding.word_embeddings.weight"][tokens]
    if cfg["position_embedding_type"] == "LearnedAbsolute":
        x = x + W["embedding.position_embeddings.weight"][:s][None]
    mask = torch.triu(torch.ones(s, s, dtype=torch.bool), 1)
    for i in range(cfg["num_layers"]):
        p = "decoder.layers.%d." % i
        y = norm(cfg, x, W[p + "input_layernorm.weight"], W.get(p + "input_layernorm.bias"))
        qkv = F.linear(y, W[p + "self_attention.linear_qkv.weight"],
                       W.get(p + "self_attention.linear_qkv.bias"))
        qkv = qkv.view(b, s, groups, (hpg + 2) * d)
        q = qkv[..., :hpg * d].reshape(b, s, heads, d)
        k = qkv[..., hpg * d:(hpg + 1) * d]
        v = qkv[..., (hpg + 1) * d:]
        if cfg["position_embedding_type"] == "Rope":
            q, k = rope(cfg, q, d), rope(cfg, k, d)
        k = k.repeat_interleave(hpg, dim=2)
        v = v.repeat_interleave(hpg, dim=2)
        scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(d)
        scores = scores.masked_fill(mask, float("-inf"))
        ctx = torch.einsum("bhqk,bkhd->bqhd", F.softmax(scores, -1), v).reshape(b, s, heads * d)
        x = x + F.linear(ctx, W[p + "self_attention.linear_proj.weight"],
                         W.get(p + "self_attention.linear_proj.bias"))
        y = norm(cfg, x, W[p + "pre_mlp_layernorm.weight"], W.get(p + "pre_mlp_layernorm.bias"))
        h = F.linear(y, W[p + "mlp.linear_fc1.weight"], W.get(p + "mlp.linear_fc1.bias"))
        act = cfg["activation"]
        if act == "Gelu":
            h = F.gelu(h)
        elif act == "GeluTanh":
            h = F.gelu(h, approximate="tanh")
        else:
            a, g = torch.chunk(h, 2, -1)
            h = F.silu(a) * g
        x = x + F.linear(h, W[p + "mlp.linear_fc2.weight"], W.get(p + "mlp.linear_fc2.bias"))
    x = norm(cfg, x, W["decoder.final_layernorm.weight"], W.get("decoder.final_layernorm.bias"))
    out = W.get("output_layer.weight", W["embedding.word_embeddings.weight"])
    return x @ out.T


def main():
    path = sys.argv[1]
    spec = json.load(open(path))
    base = path[:path.rfind("/") + 1]
    cfg, W = spec["config"], load(spec, base)
    tokens = torch.tensor(spec["tokens"], dtype=torch.long)
    logits = forward(cfg, W, tokens)
    greedy = tokens.clone()
    vocab = spec.get("vocab", cfg["padded_vocab_size"])
    for _ in range(spec["generate"]):
        nxt = forward(cfg, W, greedy)[:, -1, :vocab].argmax(-1)
        greedy = torch.cat([greedy, nxt[:, None]], 1)
    json.dump({"logits": logits.tolist(), "greedy": greedy.tolist()}, sys.stdout)


if __name__ == "__main__":
    main()
