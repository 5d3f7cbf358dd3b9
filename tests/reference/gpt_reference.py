#!/usr/bin/env python3
"""PyTorch reference for megatron.cpp's GPTModel (tests/model/gpt_reference_test.cpp).

An independent float64 implementation of the transformer as Megatron-Core defines it, with
autograd, as ground truth for the fp32 C++ model. It covers the architecture choices of the
layer spec: LayerNorm or RMSNorm (with --apply-layernorm-1p: weight + 1), GeLU (tanh or erf),
SwiGLU (fc1 output chunked into [gate | up], silu(gate) * up), squared ReLU, learned absolute /
rotary (halves or interleaved pairs, partial rotary) / ALiBi / no position embeddings,
grouped-query attention over Megatron-Core's fused QKV layout (per query group: its query heads,
one key head, one value head), per-head query/key norms (--qk-layernorm, before rotary),
causal or bidirectional attention with a key padding mask, a sliding window, document resets,
biases on or off, tied or untied output layer.

Usage: gpt_reference.py DIR
  DIR/config.json  {"model": <TransformerConfig as in checkpoints>, "batch", "seq", "grad_scale",
                    "has_attention_start", "has_padding_mask", "params": [{"name", "shape"}...]}
  DIR/weights.bin  float32 values of the params, concatenated in the listed order
  DIR/batch.bin    int32 tokens, positions, labels, attention_start, padding_mask [b*s each],
                   then float32 loss_mask [b*s]
Writes DIR/out.bin: float64 loss_sum, num_tokens, logits [b*s*V], then every param's grad of
grad_scale * sum(loss * mask) in the listed order.
"""
import json
import math
import sys

import numpy as np
import torch
import torch.nn.functional as F


def alibi_slopes(n):
    """ALiBi head slopes (Press et al.; BLOOM's build_alibi_tensor)."""
    def power_of_2(k):
        start = 2.0 ** (-(2.0 ** -(math.log2(k) - 3)))
        return [start * start ** i for i in range(k)]
    if math.log2(n).is_integer():
        return power_of_2(n)
    closest = 2 ** math.floor(math.log2(n))
    return power_of_2(closest) + alibi_slopes(2 * closest)[0::2][:n - closest]


def rotary(t, positions, rot_dim, base, interleaved):
    """Megatron-Core's RotaryEmbedding + apply_rotary_pos_emb on t [b, s, heads, d]."""
    inv_freq = 1.0 / (base ** (torch.arange(0, rot_dim, 2, dtype=torch.float64) / rot_dim))
    freqs = positions.to(torch.float64).unsqueeze(-1) * inv_freq  # [b, s, rot/2]
    if interleaved:
        emb = torch.stack((freqs, freqs), dim=-1).reshape(*freqs.shape[:-1], rot_dim)
    else:
        emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos().unsqueeze(2), emb.sin().unsqueeze(2)
    x, rest = t[..., :rot_dim], t[..., rot_dim:]
    if interleaved:
        x1, x2 = x[..., 0::2], x[..., 1::2]
        rotated = torch.stack((-x2, x1), dim=-1).reshape(x.shape)
    else:
        x1, x2 = torch.chunk(x, 2, dim=-1)
        rotated = torch.cat((-x2, x1), dim=-1)
    return torch.cat((x * cos + rotated * sin, rest), dim=-1)


def main(d):
    spec = json.load(open(f"{d}/config.json"))
    cfg = spec["model"]
    raw = np.fromfile(f"{d}/weights.bin", dtype=np.float32)
    params, off = {}, 0
    for p in spec["params"]:
        n = int(np.prod(p["shape"]))
        t = torch.tensor(raw[off:off + n].astype(np.float64)).reshape(p["shape"])
        params[p["name"]] = t.requires_grad_(True)
        off += n
    assert off == raw.size, "weights.bin size does not match config"
    P = params
    b, s, V = spec["batch"], spec["seq"], cfg["padded_vocab_size"]
    ints = np.fromfile(f"{d}/batch.bin", dtype=np.int32, count=5 * b * s)
    mask = np.fromfile(f"{d}/batch.bin", dtype=np.float32, offset=20 * b * s)
    tokens, pos, labels, start, padding = (
        torch.tensor(ints[i * b * s:(i + 1) * b * s].astype(np.int64)).reshape(b, s) for i in range(5))
    mask = torch.tensor(mask.astype(np.float64)).reshape(b, s)

    L, h, n = cfg["num_layers"], cfg["hidden_size"], cfg["num_attention_heads"]
    hd = cfg["kv_channels"] or h // n
    g = cfg["num_query_groups"] or n
    hpg = n // g
    ffn = cfg["ffn_hidden_size"] or 4 * h
    eps = cfg["layernorm_epsilon"]
    one_p = 1.0 if cfg["apply_layernorm_1p"] else 0.0
    pe = cfg["position_embedding_type"]

    def norm(x, prefix, width):
        w = P[prefix + ".weight"] + one_p
        if cfg["normalization"] == "RMSNorm":
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w
        return F.layer_norm(x, (width,), w, P[prefix + ".bias"], eps)

    def linear(x, prefix):
        y = x @ P[prefix + ".weight"].t()
        return y + P[prefix + ".bias"] if prefix + ".bias" in P else y

    act = {
        "gelu": F.gelu,
        "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
        "squared_relu": lambda x: F.relu(x) ** 2,
        "swiglu": lambda x: F.silu(torch.chunk(x, 2, dim=-1)[0]) * torch.chunk(x, 2, dim=-1)[1],
    }[cfg["activation"]]

    # Which key each query sees.
    i_idx = torch.arange(s).view(s, 1)
    j_idx = torch.arange(s).view(1, s)
    allowed = torch.ones(s, s, dtype=torch.bool)
    if cfg["attention_mask_type"] == "causal":
        allowed &= j_idx <= i_idx
    if cfg["window_left"] >= 0:
        allowed &= j_idx >= i_idx - cfg["window_left"]
    if cfg["window_right"] >= 0:
        allowed &= j_idx <= i_idx + cfg["window_right"]
    allowed = allowed.view(1, 1, s, s).expand(b, 1, s, s)
    if spec["has_attention_start"]:
        allowed = allowed & (j_idx.view(1, 1, 1, s) >= start.view(b, 1, s, 1))
    if spec["has_padding_mask"]:
        allowed = allowed & (padding.view(b, 1, 1, s) != 0)
    alibi = None
    if pe == "alibi":
        slopes = torch.tensor(alibi_slopes(n), dtype=torch.float64).view(1, n, 1, 1)
        alibi = slopes * (j_idx - i_idx).to(torch.float64).view(1, 1, s, s)
    rope_pos = torch.arange(s).view(1, s).expand(b, s)
    rot_dim = int(hd * cfg["rotary_percent"])

    x = P["embedding.word_embeddings.weight"][tokens]
    if pe == "learned_absolute":
        x = x + P["embedding.position_embeddings.weight"][pos]
    for li in range(L):
        pre = f"decoder.layers.{li}."
        a = norm(x, pre + "input_layernorm", h)
        qkv = linear(a, pre + "self_attention.linear_qkv").view(b, s, g, hpg + 2, hd)
        q = qkv[:, :, :, :hpg].reshape(b, s, n, hd)
        k, v = qkv[:, :, :, hpg], qkv[:, :, :, hpg + 1]  # [b, s, g, d]
        if cfg["qk_layernorm"]:
            q = norm(q, pre + "self_attention.q_layernorm", hd)
            k = norm(k, pre + "self_attention.k_layernorm", hd)
        if pe == "rope":
            q = rotary(q, rope_pos, rot_dim, cfg["rotary_base"], cfg["rotary_interleaved"])
            k = rotary(k, rope_pos, rot_dim, cfg["rotary_base"], cfg["rotary_interleaved"])
        q = q.permute(0, 2, 1, 3)  # [b, n, s, d]
        k, v = (t.permute(0, 2, 1, 3).repeat_interleave(hpg, dim=1) for t in (k, v))
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(hd)
        if alibi is not None:
            scores = scores + alibi
        scores = scores.masked_fill(~allowed, float("-inf"))
        probs = torch.nan_to_num(torch.softmax(scores, dim=-1), nan=0.0)  # a row seeing no key: 0
        ctx = (probs @ v).permute(0, 2, 1, 3).reshape(b, s, n * hd)
        x = x + linear(ctx, pre + "self_attention.linear_proj")
        m = norm(x, pre + "pre_mlp_layernorm", h)
        x = x + linear(act(linear(m, pre + "mlp.linear_fc1")), pre + "mlp.linear_fc2")
    xf = norm(x, "decoder.final_layernorm", h)
    out_w = P["output_layer.weight"] if "output_layer.weight" in P else P["embedding.word_embeddings.weight"]
    logits = xf @ out_w.t()
    loss = F.cross_entropy(logits.reshape(-1, V), labels.reshape(-1), reduction="none")
    loss_sum = (loss * mask.reshape(-1)).sum()
    (spec["grad_scale"] * loss_sum).backward()
    out = [np.array([loss_sum.item(), mask.sum().item()]), logits.detach().numpy().ravel()]
    for p in spec["params"]:
        gr = params[p["name"]].grad
        out.append((gr if gr is not None else torch.zeros_like(params[p["name"]])).numpy().ravel())
    np.concatenate(out).astype(np.float64).tofile(f"{d}/out.bin")


if __name__ == "__main__":
    torch.set_num_threads(1)
    main(sys.argv[1])
