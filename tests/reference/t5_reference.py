#!/usr/bin/env python3
"""PyTorch reference for megatron.cpp's T5Model (tests/model/t5_reference_test.cpp).

An independent float64 implementation of Megatron-Core's T5, with autograd, written from
megatron/core/models/T5/t5_model.py, t5_spec.py (the local specs), transformer_layer.py,
attention.py (SelfAttention, CrossAttention), models/common/embeddings/relative_pos_embedding.py
and pretrain_t5.py (get_batch, loss_func = pretrain_gpt.py's):
  - LanguageModelEmbedding shared by both sides: word embedding + learned absolute positions
    (t5_position_ids: 0..s-1 of each side) unless the position embedding is "relative";
  - encoder layers: x += proj(attn(ln(x))) with bidirectional attention under the encoder's
    padding mask (keys that are padding are invisible), x += mlp(ln(x)); encoder.final_layernorm;
  - decoder layers: causal self-attention, then pre_cross_attn_layernorm and CrossAttention
    (query = linear_q(x) viewed [s, b, np, hn]; linear_kv(encoder output) viewed [s, b, np, 2*hn]
    and split into key, value; the encoder's padding mask on the keys), then the MLP;
    decoder.final_layernorm;
  - "rope": rotary embeddings (halves rotated) of the queries and keys of both self-attentions,
    positions 0..s-1 of each side; cross-attention has none;
  - "relative": RelativePositionEmbedding (bidirectional buckets for the encoder, causal for the
    decoder), [1, np, sq, sk] added to the scaled scores of every self-attention of its block;
  - T5LMHead: logits = hidden @ word_embeddings^T + output bias (tied) or hidden @ own weight;
  - loss: sum(ce * loss_mask) and loss_mask.sum() (labels -1 outside the mask).

Usage: t5_reference.py DIR
  DIR/config.json  {"model": <TransformerConfig as in checkpoints>, "batch", "enc_seq", "dec_seq",
                    "grad_scale", "params": [{"name", "shape"}...]}
  DIR/weights.bin  float32 params in the listed order
  DIR/batch.bin    int32 enc tokens [b*se], enc mask [b*se], dec tokens [b*sd], labels [b*sd],
                   then float32 loss_mask [b*sd]
Writes DIR/out.bin: float64 loss sum, token count, logits [b*sd*V], then every param's grad of
grad_scale * loss sum in the listed order.
"""
import json
import math
import sys

import numpy as np
import torch
import torch.nn.functional as F


def relative_position_bucket(relative_position, bidirectional, num_buckets, max_distance):
    # relative_pos_embedding.py's _relative_position_bucket
    relative_buckets = 0
    if bidirectional:
        num_buckets //= 2
        relative_buckets += (relative_position > 0).to(torch.long) * num_buckets
        relative_position = torch.abs(relative_position)
    else:
        relative_position = -torch.min(relative_position, torch.zeros_like(relative_position))
    max_exact = num_buckets // 2
    is_small = relative_position < max_exact
    relative_position_if_large = max_exact + (
        torch.log(relative_position.float() / max_exact)
        / math.log(max_distance / max_exact)
        * (num_buckets - max_exact)
    ).to(torch.long)
    relative_position_if_large = torch.min(
        relative_position_if_large, torch.full_like(relative_position_if_large, num_buckets - 1))
    relative_buckets += torch.where(is_small, relative_position, relative_position_if_large)
    return relative_buckets


def t5_logits(P, cfg, enc_tokens, enc_mask, dec_tokens):
    """Megatron-Core T5Model's logits [b, sd, V] for the parameters P (name -> tensor), the model
    config cfg, encoder tokens and padding mask [b, se] and decoder tokens [b, sd]."""
    b, se = enc_tokens.shape
    sd = dec_tokens.shape[1]
    h, n = cfg["hidden_size"], cfg["num_attention_heads"]
    hd = cfg["kv_channels"] or h // n
    assert (cfg["num_query_groups"] or n) == n, "T5 has no grouped-query attention"
    enc_layers = cfg["num_layers"]
    dec_layers = cfg["decoder_num_layers"] or enc_layers
    eps = cfg["layernorm_epsilon"]
    one_p = 1.0 if cfg["apply_layernorm_1p"] else 0.0
    pos_type = cfg["position_embedding_type"]
    assert pos_type in ("learned_absolute", "relative", "rope")
    assert cfg["rotary_percent"] == 1.0 and not cfg["rotary_interleaved"]

    def norm(x, prefix):
        w = P[prefix + ".weight"] + one_p
        if cfg["normalization"] == "RMSNorm":
            return x * torch.rsqrt(torch.mean(x * x, dim=-1, keepdim=True) + eps) * w
        return F.layer_norm(x, (x.shape[-1],), w, P[prefix + ".bias"], eps)

    def dense(x, prefix):
        y = x @ P[prefix + ".weight"].t()
        return y + P[prefix + ".bias"] if prefix + ".bias" in P else y

    act = {"gelu": F.gelu, "gelu_tanh": lambda x: F.gelu(x, approximate="tanh")}[cfg["activation"]]

    def attend(q, k, v, visible, bias):
        # q [b, n, sq, hd], k/v [b, n, sk, hd], visible [b or 1, 1, sq, sk] bool
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(hd)
        if bias is not None:
            scores = scores + bias
        scores = scores.masked_fill(~visible, float("-inf"))
        return torch.softmax(scores, dim=-1) @ v

    def heads(x, s):  # [b, s, n*hd] -> [b, n, s, hd]
        return x.view(b, s, n, hd).permute(0, 2, 1, 3)

    def merge(c, s):
        return c.permute(0, 2, 1, 3).reshape(b, s, n * hd)

    def rotary(x, s):  # rope_utils.apply_rotary_pos_emb, halves rotated, positions 0..s-1
        inv = 1.0 / (cfg["rotary_base"] ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
        ang = torch.outer(torch.arange(s, dtype=torch.float64), inv)
        ang = torch.cat([ang, ang], dim=-1)
        x1, x2 = x[..., :hd // 2], x[..., hd // 2:]
        ang = ang.to(x.dtype)
        return x * torch.cos(ang) + torch.cat([-x2, x1], dim=-1) * torch.sin(ang)

    def self_attention(x, prefix, s, visible, bias):
        qkv = dense(x, prefix + ".linear_qkv").view(b, s, n, 3, hd)  # per head: q, k, v
        q, k, v = (qkv[:, :, :, i].permute(0, 2, 1, 3) for i in range(3))
        if pos_type == "rope":
            q, k = rotary(q, s), rotary(k, s)
        return dense(merge(attend(q, k, v, visible, bias), s), prefix + ".linear_proj")

    def cross_attention(x, ctx, prefix, visible):
        q = heads(dense(x, prefix + ".linear_q"), sd)
        kv = dense(ctx, prefix + ".linear_kv").view(b, se, n, 2 * hd)
        k, v = (kv[..., i * hd:(i + 1) * hd].permute(0, 2, 1, 3) for i in range(2))
        return dense(merge(attend(q, k, v, visible, None), sd), prefix + ".linear_proj")

    def mlp(x, prefix):
        return dense(act(dense(x, prefix + ".linear_fc1")), prefix + ".linear_fc2")

    def embed(tokens, s):
        x = P["embedding.word_embeddings.weight"][tokens]
        if pos_type == "learned_absolute":
            x = x + P["embedding.position_embeddings.weight"][torch.arange(s).view(1, s)]
        return x

    def relative_bias(name, bidirectional, s):
        if pos_type != "relative":
            return None
        pos = torch.arange(s)
        bucket = relative_position_bucket(pos[None, :] - pos[:, None], bidirectional,
                                          cfg["relative_attention_num_buckets"],
                                          cfg["relative_attention_max_distance"])
        w = P[name + ".relative_attention_bias.weight"]
        return w[bucket].permute(2, 0, 1).unsqueeze(0)  # [1, n, s, s]

    key_visible = (enc_mask != 0).view(b, 1, 1, se)
    enc_bias = relative_bias("encoder_relative_pos_emb", True, se)
    x = embed(enc_tokens, se)
    for li in range(enc_layers):
        pre = f"encoder.layers.{li}."
        x = x + self_attention(norm(x, pre + "input_layernorm"), pre + "self_attention", se,
                               key_visible.expand(b, 1, se, se), enc_bias)
        x = x + mlp(norm(x, pre + "pre_mlp_layernorm"), pre + "mlp")
    encoded = norm(x, "encoder.final_layernorm")

    causal = torch.tril(torch.ones(sd, sd, dtype=torch.bool)).view(1, 1, sd, sd)
    dec_bias = relative_bias("decoder_relative_pos_emb", False, sd)
    y = embed(dec_tokens, sd)
    for li in range(dec_layers):
        pre = f"decoder.layers.{li}."
        y = y + self_attention(norm(y, pre + "input_layernorm"), pre + "self_attention", sd,
                               causal, dec_bias)
        y = y + cross_attention(norm(y, pre + "pre_cross_attn_layernorm"), encoded,
                                pre + "cross_attention", key_visible.expand(b, 1, sd, se))
        y = y + mlp(norm(y, pre + "pre_mlp_layernorm"), pre + "mlp")
    decoded = norm(y, "decoder.final_layernorm")

    if "output_layer.weight" in P:
        logits = decoded @ P["output_layer.weight"].t()
    else:
        logits = decoded @ P["embedding.word_embeddings.weight"].t() + P["output_layer.bias"]
    return logits


def main(d):
    spec = json.load(open(f"{d}/config.json"))
    cfg = spec["model"]
    raw = np.fromfile(f"{d}/weights.bin", dtype=np.float32)
    P, off = {}, 0
    for p in spec["params"]:
        n = int(np.prod(p["shape"]))
        P[p["name"]] = torch.tensor(raw[off:off + n].astype(np.float64)).reshape(p["shape"])
        P[p["name"]].requires_grad_(True)
        off += n
    assert off == raw.size, "weights.bin size does not match config"
    b, se, sd = spec["batch"], spec["enc_seq"], spec["dec_seq"]
    V = cfg["padded_vocab_size"]
    nint = 2 * b * se + 2 * b * sd
    ints = np.fromfile(f"{d}/batch.bin", dtype=np.int32, count=nint)
    floats = np.fromfile(f"{d}/batch.bin", dtype=np.float32, offset=4 * nint)
    t = lambda a, s: torch.tensor(a.astype(np.int64)).reshape(b, s)
    enc_tokens = t(ints[:b * se], se)
    enc_mask = t(ints[b * se:2 * b * se], se)
    dec_tokens = t(ints[2 * b * se:2 * b * se + b * sd], sd)
    labels = t(ints[2 * b * se + b * sd:], sd)
    loss_mask = torch.tensor(floats.astype(np.float64)).reshape(b, sd)

    logits = t5_logits(P, cfg, enc_tokens, enc_mask, dec_tokens)
    ce = F.cross_entropy(logits.reshape(-1, V), labels.clamp(min=0).reshape(-1), reduction="none")
    loss_sum = torch.sum(ce * loss_mask.reshape(-1))
    (spec["grad_scale"] * loss_sum).backward()
    out = [np.array([loss_sum.item(), loss_mask.sum().item()]), logits.detach().numpy().ravel()]
    for p in spec["params"]:
        gr = P[p["name"]].grad
        out.append((gr if gr is not None else torch.zeros_like(P[p["name"]])).numpy().ravel())
    np.concatenate(out).astype(np.float64).tofile(f"{d}/out.bin")


if __name__ == "__main__":
    torch.set_num_threads(1)
    main(sys.argv[1])
