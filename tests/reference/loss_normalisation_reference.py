#!/usr/bin/env python3
"""PyTorch reference for Megatron-LM's two loss normalisations
(tests/training/loss_normalisation_test.cpp).

Given the initial weights of a GPT-2-style model and the samples of one global batch, computes
in float64 the gradient that one Megatron-LM training step applies, for each requested layout
(data-parallel size DP, context-parallel size CP; micro-batch size 1) and each mode, following
Megatron-LM's code step by step, simulating every rank:

  default (calculate_per_token_loss off):
    pretrain_gpt.py loss_func, per micro-batch on each rank: loss = sum(losses * loss_mask),
      num_tokens = loss_mask.sum() (of the rank's CP slice: get_batch_on_this_cp_rank keeps
      chunks r and 2CP-1-r of 2CP);
    schedules.py forward_step_calc_loss: output /= clamp(num_tokens, min=1); output /= num_microbatches;
    distributed_data_parallel.py: gradient_scaling_factor = 1 / dp_cp_group.size(), then the
      gradients are summed over the DP x CP group.
  per-token (--calculate-per-token-loss):
    loss_func as above, no division in forward_step; gradient_scaling_factor = 1;
    finalize_model_grads: num_tokens summed over the micro-batches and the DP x CP group, the
      summed gradients divided by it.

A CP rank's loss only covers its own tokens, and context-parallel attention is exact, so the
gradient summed over the CP ranks of their local objectives is the gradient of the sum of those
objectives computed on the whole sequence, which is what this script differentiates.
Data-parallel rank r takes micro-batch j = global sample j * DP + r (Megatron's
MegatronPretrainingSampler with micro-batch size 1).

Usage: loss_normalisation_reference.py DIR
  DIR/spec.json    {"model": <TransformerConfig as in checkpoints>, "eod": id, "eod_mask_loss": bool,
                    "params": [{"name", "shape"}...], "layouts": [{"name", "dp", "cp"}...]}
  DIR/weights.bin  float32 initial values of the params, concatenated in the listed order
  DIR/samples.bin  int32 [num_samples, seq + 1] token ids of the global batch, in sample order
Writes DIR/out.bin: float64, for each layout in order, the default-mode gradient then the
per-token gradient, each as every param's gradient in the listed order; and prints the
micro-batches' loss-token counts and the largest difference between the two modes.
"""
import json
import math
import sys

import numpy as np
import torch
import torch.nn.functional as F


def per_token_losses(cfg, P, tokens, labels):
    """Megatron-Core GPTModel (LayerNorm, GeLU, learned positions, tied output) in float64:
    the cross-entropy of every token, [b, s]."""
    for key, want in (("normalization", "LayerNorm"), ("position_embedding_type", "learned_absolute"),
                      ("attention_mask_type", "causal"), ("apply_layernorm_1p", False),
                      ("qk_layernorm", False), ("untie_embeddings_and_output_weights", False)):
        assert cfg[key] == want, f"this reference covers {key} = {want}, not {cfg[key]}"
    assert cfg["window_left"] < 0 and cfg["window_right"] <= 0, "no sliding window here"
    assert cfg["activation"] in ("gelu", "gelu_tanh")
    b, s = tokens.shape
    h, n = cfg["hidden_size"], cfg["num_attention_heads"]
    hd = cfg["kv_channels"] or h // n
    assert (cfg["num_query_groups"] or n) == n, "no grouped-query attention here"
    eps = cfg["layernorm_epsilon"]
    approx = "tanh" if cfg["activation"] == "gelu_tanh" else "none"

    def ln(x, prefix):
        return F.layer_norm(x, (h,), P[prefix + ".weight"], P[prefix + ".bias"], eps)

    def linear(x, prefix):
        y = x @ P[prefix + ".weight"].t()
        return y + P[prefix + ".bias"] if prefix + ".bias" in P else y

    pos = torch.arange(s).view(1, s).expand(b, s)
    x = P["embedding.word_embeddings.weight"][tokens] + P["embedding.position_embeddings.weight"][pos]
    causal = torch.ones(s, s, dtype=torch.bool).tril()
    for li in range(cfg["num_layers"]):
        pre = f"decoder.layers.{li}."
        qkv = linear(ln(x, pre + "input_layernorm"), pre + "self_attention.linear_qkv")
        qkv = qkv.view(b, s, n, 3, hd)  # per head: query, key, value
        q, k, v = (qkv[:, :, :, i].permute(0, 2, 1, 3) for i in range(3))  # [b, n, s, d]
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(hd)
        probs = torch.softmax(scores.masked_fill(~causal, float("-inf")), dim=-1)
        ctx = (probs @ v).permute(0, 2, 1, 3).reshape(b, s, n * hd)
        x = x + linear(ctx, pre + "self_attention.linear_proj")
        m = ln(x, pre + "pre_mlp_layernorm")
        x = x + linear(F.gelu(linear(m, pre + "mlp.linear_fc1"), approximate=approx), pre + "mlp.linear_fc2")
    logits = ln(x, "decoder.final_layernorm") @ P["embedding.word_embeddings.weight"].t()
    V = logits.shape[-1]
    return F.cross_entropy(logits.reshape(-1, V), labels.reshape(-1), reduction="none").view(b, s)


def cp_slice(s, cp, r):
    """get_batch_on_this_cp_rank: the sequence in 2 x CP chunks; rank r keeps chunks r and 2CP-1-r."""
    c = s // (2 * cp)
    return list(range(r * c, (r + 1) * c)) + list(range((2 * cp - 1 - r) * c, (2 * cp - r) * c))


def megatron_objectives(losses, mask, dp, cp):
    """The scalar whose gradient is the step's gradient, for both modes (see the module doc)."""
    num_samples, s = mask.shape
    assert num_samples % dp == 0 and s % (2 * cp) == 0
    num_micro = num_samples // dp
    default = torch.zeros((), dtype=torch.float64)
    total_loss = torch.zeros((), dtype=torch.float64)
    total_tokens = 0.0
    for r in range(dp):
        for c in range(cp):
            idx = cp_slice(s, cp, c) if cp > 1 else list(range(s))
            for j in range(num_micro):
                k = j * dp + r  # the global sample of DP rank r's micro-batch j
                loss = torch.sum(losses[k, idx] * mask[k, idx])  # loss_func
                num_tokens = float(mask[k, idx].sum())
                total_loss = total_loss + loss
                total_tokens += num_tokens
                out = loss / max(num_tokens, 1.0) / num_micro  # forward_step_calc_loss
                default = default + out / (dp * cp)  # gradient_scaling_factor, then the DP x CP sum
    per_token = total_loss / total_tokens  # finalize_model_grads' division by the summed tokens
    return default, per_token


def main(d):
    spec = json.load(open(f"{d}/spec.json"))
    cfg = spec["model"]
    raw = np.fromfile(f"{d}/weights.bin", dtype=np.float32)
    P, off = {}, 0
    for p in spec["params"]:
        n = int(np.prod(p["shape"]))
        P[p["name"]] = torch.tensor(raw[off:off + n].astype(np.float64)).reshape(p["shape"]).requires_grad_(True)
        off += n
    assert off == raw.size, "weights.bin size does not match spec.json"
    s = cfg["seq_length"]
    samples = torch.tensor(np.fromfile(f"{d}/samples.bin", dtype=np.int32).astype(np.int64)).view(-1, s + 1)
    tokens, labels = samples[:, :-1], samples[:, 1:]
    # GPTDataset: loss_mask 1, 0 where the input token is EOD with --eod-mask-loss.
    mask = torch.ones(tokens.shape, dtype=torch.float64)
    if spec["eod_mask_loss"]:
        mask[tokens == spec["eod"]] = 0.0
    counts = mask.sum(dim=1).tolist()
    print("loss tokens per micro-batch:", counts)
    losses = per_token_losses(cfg, P, tokens, labels)
    names = [p["name"] for p in spec["params"]]
    out = []
    for lay in spec["layouts"]:
        grads = []
        for objective in megatron_objectives(losses, mask, lay["dp"], lay["cp"]):
            g = torch.autograd.grad(objective, [P[n] for n in names], retain_graph=True, allow_unused=True)
            grads.append(torch.cat([(gi if gi is not None else torch.zeros_like(P[n])).reshape(-1)
                                    for gi, n in zip(g, names)]))
        diff = (grads[0] - grads[1]).abs().max().item()
        print(f"{lay['name']}: largest |default - per-token| gradient difference {diff:.3e}")
        out += [g.detach().numpy() for g in grads]
    np.concatenate(out).astype(np.float64).tofile(f"{d}/out.bin")


if __name__ == "__main__":
    torch.set_num_threads(1)
    main(sys.argv[1])
