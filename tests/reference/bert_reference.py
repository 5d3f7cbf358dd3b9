#!/usr/bin/env python3
"""PyTorch reference for megatron.cpp's BertModel (tests/model/bert_reference_test.cpp).

An independent float64 implementation of Megatron-Core's BERT, with autograd, written from
megatron/core/models/bert/bert_model.py, bert_lm_head.py, pooler.py, bert_layer_specs.py and
pretrain_bert.py's loss_func:
  - LanguageModelEmbedding: word + learned position (ids 0..s-1) + token-type embeddings;
  - TransformerBlock "encoder" of pre-LayerNorm layers (bert_layer_local_spec) whose
    self-attention uses the padding mask: a query attends every key that is not padding (the
    b11s mask of Transformer Engine >= 1.10); grouped-query attention over the fused QKV layout
    (per query group: its query heads, one key head, one value head); encoder.final_layernorm;
  - BertLMHead: dense (h -> h), torch.nn.functional.gelu (exact erf form), LayerNorm;
  - the output layer: logits = h @ word_embeddings^T (or its own weight when untied) + bias;
  - Pooler: dense + tanh on each sequence's first token; binary_head: Linear(h, 2);
  - loss_func: lm_loss = sum(ce * loss_mask) / loss_mask.sum(), plus, with the binary head,
    sop_loss = F.cross_entropy(binary_logits, sentence_order, ignore_index=-1); loss = their sum.

Usage: bert_reference.py DIR
  DIR/config.json  {"model": <TransformerConfig as in checkpoints>, "batch", "seq", "grad_scale",
                    "params": [{"name", "shape"}...]}
  DIR/weights.bin  float32 values of the params, concatenated in the listed order
  DIR/batch.bin    int32 tokens, token types, labels, padding_mask [b*s each], sentence order [b],
                   then float32 loss_mask [b*s]
Writes DIR/out.bin: float64 lm_loss, sop_loss (0 without the binary head), logits [b*s*V],
binary logits [b*2] (zeros without the head), then every param's grad of grad_scale * loss in
the listed order; and DIR/metrics.json: the two losses, the masked positions and those whose
argmax is the label, the labelled sentence pairs and those whose argmax is their order.
"""
import json
import math
import sys

import numpy as np
import torch
import torch.nn.functional as F


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
    b, s, V = spec["batch"], spec["seq"], cfg["padded_vocab_size"]
    ints = np.fromfile(f"{d}/batch.bin", dtype=np.int32, count=4 * b * s + b)
    floats = np.fromfile(f"{d}/batch.bin", dtype=np.float32, offset=4 * (4 * b * s + b))
    tokens, types, labels, padding = (
        torch.tensor(ints[i * b * s:(i + 1) * b * s].astype(np.int64)).reshape(b, s)
        for i in range(4))
    sentence_order = torch.tensor(ints[4 * b * s:].astype(np.int64))
    loss_mask = torch.tensor(floats.astype(np.float64)).reshape(b, s)

    L, h, n = cfg["num_layers"], cfg["hidden_size"], cfg["num_attention_heads"]
    hd = cfg["kv_channels"] or h // n
    g = cfg["num_query_groups"] or n
    hpg = n // g
    eps = cfg["layernorm_epsilon"]
    one_p = 1.0 if cfg["apply_layernorm_1p"] else 0.0
    binary_head = cfg["bert_binary_head"]

    def layer_norm(x, prefix):
        return F.layer_norm(x, (x.shape[-1],), P[prefix + ".weight"] + one_p,
                            P[prefix + ".bias"], eps)

    def dense(x, prefix):
        y = x @ P[prefix + ".weight"].t()
        return y + P[prefix + ".bias"] if prefix + ".bias" in P else y

    mlp_act = {"gelu": F.gelu, "gelu_tanh": lambda x: F.gelu(x, approximate="tanh")}[
        cfg["activation"]]

    # LanguageModelEmbedding (no dropout: the comparison runs without it).
    position_ids = torch.arange(s).view(1, s).expand(b, s)
    x = P["embedding.word_embeddings.weight"][tokens]
    x = x + P["embedding.position_embeddings.weight"][position_ids]
    if binary_head:
        x = x + P["embedding.tokentype_embeddings.weight"][types]

    key_visible = (padding != 0).view(b, 1, 1, s)
    for li in range(L):
        pre = f"encoder.layers.{li}."
        a = layer_norm(x, pre + "input_layernorm")
        qkv = dense(a, pre + "self_attention.linear_qkv").view(b, s, g, hpg + 2, hd)
        q = qkv[:, :, :, :hpg].reshape(b, s, n, hd).permute(0, 2, 1, 3)
        k = qkv[:, :, :, hpg].permute(0, 2, 1, 3).repeat_interleave(hpg, dim=1)
        v = qkv[:, :, :, hpg + 1].permute(0, 2, 1, 3).repeat_interleave(hpg, dim=1)
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(hd)
        scores = scores.masked_fill(~key_visible, float("-inf"))
        ctx = (torch.softmax(scores, dim=-1) @ v).permute(0, 2, 1, 3).reshape(b, s, n * hd)
        x = x + dense(ctx, pre + "self_attention.linear_proj")
        m = layer_norm(x, pre + "pre_mlp_layernorm")
        x = x + dense(mlp_act(dense(m, pre + "mlp.linear_fc1")), pre + "mlp.linear_fc2")
    hidden = layer_norm(x, "encoder.final_layernorm")

    # BertLMHead and the output layer (tied to the word table unless untied).
    lm = layer_norm(F.gelu(dense(hidden, "lm_head.dense")), "lm_head.layer_norm")
    out_w = P.get("output_layer.weight", P["embedding.word_embeddings.weight"])
    logits = lm @ out_w.t() + P["output_layer.bias"]
    ce = F.cross_entropy(logits.reshape(-1, V), labels.reshape(-1), reduction="none")
    lm_loss = torch.sum(ce * loss_mask.reshape(-1)) / loss_mask.sum()
    loss = lm_loss
    sop_loss = torch.zeros((), dtype=torch.float64)
    binary_logits = torch.zeros(b, 2, dtype=torch.float64)
    if binary_head:
        pooled = torch.tanh(dense(hidden[:, 0, :], "pooler.dense"))
        binary_logits = dense(pooled, "binary_head")
        sop_loss = F.cross_entropy(binary_logits, sentence_order, ignore_index=-1)
        loss = lm_loss + sop_loss
    (spec["grad_scale"] * loss).backward()
    out = [np.array([lm_loss.item(), sop_loss.item()]), logits.detach().numpy().ravel(),
           binary_logits.detach().numpy().ravel()]
    for p in spec["params"]:
        gr = P[p["name"]].grad
        out.append((gr if gr is not None else torch.zeros_like(P[p["name"]])).numpy().ravel())
    np.concatenate(out).astype(np.float64).tofile(f"{d}/out.bin")
    # The evaluation's accuracies: masked positions whose argmax is the label, and labelled
    # sentence pairs whose argmax is their order.
    masked = loss_mask.reshape(-1) > 0
    right = logits.detach().reshape(-1, V).argmax(dim=-1) == labels.reshape(-1)
    labelled = sentence_order >= 0
    sop_right = binary_logits.detach().argmax(dim=-1) == sentence_order
    json.dump({"lm_loss": lm_loss.item(), "sop_loss": sop_loss.item(),
               "masked": int(masked.sum()), "lm_correct": int((right & masked).sum()),
               "sop_labelled": int(labelled.sum()) if binary_head else 0,
               "sop_correct": int((sop_right & labelled).sum()) if binary_head else 0},
              open(f"{d}/metrics.json", "w"))


if __name__ == "__main__":
    torch.set_num_threads(1)
    main(sys.argv[1])
