#!/usr/bin/python3
"""An independent Mixtral and Qwen2-MoE (transformers' MixtralForCausalLM and
Qwen2MoeForCausalLM), for the Hugging Face MoE tests.

It knows nothing of megatron.cpp. The model is written by hand from the definitions of
transformers' models/mixtral/modeling_mixtral.py (transformers itself is not needed), in float64:
  - MixtralModel: embed_tokens, layers, norm; MixtralForCausalLM: lm_head (or the embedding when
    tie_word_embeddings);
  - MixtralDecoderLayer: x + self_attn(input_layernorm(x)), then
    x + block_sparse_moe(post_attention_layernorm(x));
  - MixtralRMSNorm: weight * x * rsqrt(mean(x^2) + rms_norm_eps);
  - MixtralAttention: q/k/v/o_proj without biases, head_dim (or hidden / heads), rotate-half
    rotary with inv_freq = 1 / rope_theta^(arange(0, d, 2) / d), grouped-query attention by
    repeat_kv, scores scaled by head_dim^-0.5, the causal mask and, with sliding_window W, the
    overlay of masking_utils.sliding_window_overlay: key kv is seen by query q iff kv > q - W;
  - MixtralSparseMoeBlock: router_logits = gate(x); weights = softmax(router_logits) over all
    experts; top num_experts_per_tok; weights /= their sum; sum over the chosen experts of
    weight * w2(silu(w1(x)) * w3(x)) (MixtralBlockSparseTop2MLP).
Qwen2MoeForCausalLM (models/qwen2_moe/modeling_qwen2_moe.py) differs by:
  - biases on q_proj, k_proj and v_proj (not o_proj), heads of hidden / heads channels;
  - Qwen2MoeDecoderLayer: layer i has a Qwen2MoeSparseMoeBlock (as .mlp) when i is not in
    mlp_only_layers and (i + 1) % decoder_sparse_step == 0, else a dense Qwen2MoeMLP of
    intermediate_size (gate_proj, up_proj, down_proj: down(silu(gate(x)) * up(x)));
  - Qwen2MoeSparseMoeBlock: softmax over all experts, top num_experts_per_tok, renormalised only
    with norm_topk_prob; experts of moe_intermediate_size; plus
    sigmoid(shared_expert_gate(x)) * shared_expert(x), a Qwen2MoeMLP of
    shared_expert_intermediate_size.
The safetensors files are written and read by hand (megatron_checkpoint.py's writer,
tests/interop/hf_reference.py's reader: 8-byte little-endian header length, JSON header, data).

Usage:
  mixtral_reference.py fixture DIR [--window W] [--tied] [--seed S] [--qwen]
      writes DIR/config.json and DIR/model.safetensors (float32) of a small Mixtral: vocabulary
      64, hidden 16, 2 layers, 4 heads of 4 in 2 key-value groups, 4 experts of width 24, top-2,
      rope_theta 500, rms_norm_eps 1e-5, 32 positions; random weights from the seed. With --qwen a
      Qwen2-MoE of the same sizes with 3 layers, the middle one dense (mlp_only_layers [1], width
      32), a shared expert of width 20 with its gate, norm_topk_prob false, q/k/v biases
  mixtral_reference.py logprobs TOKENS.json DIR...
      TOKENS.json: [[id, ...], ...]; prints {"logprobs": {DIR: [[log p(t_i | t_<i) for i >= 1],
      ...]}, "routing": {DIR: [smallest gap between the k-th and (k+1)-th router probability over
      every token and layer]}}
"""
import json
import math
import os
import sys

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "interop"))
from hf_reference import load_folder, rms_norm, rotate_half  # noqa: E402 (safetensors by hand)
from megatron_checkpoint import write_safetensors  # noqa: E402


def random_weights(seed):
    """rnd(*shape, std): float32 normal weights drawn in float64 from one seeded generator."""
    gen = torch.Generator().manual_seed(seed)

    def rnd(*shape, std=0.3):
        return (torch.randn(*shape, generator=gen, dtype=torch.float64) * std).to(torch.float32)
    return rnd


def qwen_fixture(tied, seed):
    V, h, L, n, g, d, f, fs, fd, E, k = 64, 16, 3, 4, 2, 4, 24, 20, 32, 4, 2
    rnd = random_weights(seed)

    def mlp(w, p, width):
        w[p + "gate_proj.weight"] = rnd(width, h)
        w[p + "up_proj.weight"] = rnd(width, h)
        w[p + "down_proj.weight"] = rnd(h, width)

    w = {"model.embed_tokens.weight": rnd(V, h, std=1.0)}
    for i in range(L):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = 1 + rnd(h, std=0.1)
        w[p + "post_attention_layernorm.weight"] = 1 + rnd(h, std=0.1)
        for proj, rows in (("q_proj", n * d), ("k_proj", g * d), ("v_proj", g * d)):
            w[p + f"self_attn.{proj}.weight"] = rnd(rows, h)
            w[p + f"self_attn.{proj}.bias"] = rnd(rows, std=0.1)
        w[p + "self_attn.o_proj.weight"] = rnd(h, n * d)
        if i == 1:
            mlp(w, p + "mlp.", fd)
            continue
        w[p + "mlp.gate.weight"] = rnd(E, h, std=1.0)
        for e in range(E):
            mlp(w, p + f"mlp.experts.{e}.", f)
        mlp(w, p + "mlp.shared_expert.", fs)
        w[p + "mlp.shared_expert_gate.weight"] = rnd(1, h)
    w["model.norm.weight"] = 1 + rnd(h, std=0.1)
    if not tied:
        w["lm_head.weight"] = rnd(V, h)
    config = {
        "architectures": ["Qwen2MoeForCausalLM"], "model_type": "qwen2_moe", "vocab_size": V,
        "hidden_size": h, "intermediate_size": fd, "moe_intermediate_size": f,
        "shared_expert_intermediate_size": fs, "num_hidden_layers": L, "num_attention_heads": n,
        "num_key_value_heads": g, "hidden_act": "silu", "max_position_embeddings": 32,
        "initializer_range": 0.02, "rms_norm_eps": 1e-6, "use_cache": True, "rope_theta": 10000.0,
        "use_sliding_window": False, "sliding_window": None, "attention_dropout": 0.0,
        "decoder_sparse_step": 1, "mlp_only_layers": [1], "num_experts_per_tok": k,
        "num_experts": E, "norm_topk_prob": False, "output_router_logits": False,
        "router_aux_loss_coef": 0.001, "qkv_bias": True, "tie_word_embeddings": tied,
        "torch_dtype": "float32", "bos_token_id": 1, "eos_token_id": 2,
    }
    return config, w


def mixtral_fixture(window, tied, seed):
    V, h, L, n, g, d, f, E, k = 64, 16, 2, 4, 2, 4, 24, 4, 2
    rnd = random_weights(seed)
    w = {"model.embed_tokens.weight": rnd(V, h, std=1.0)}
    for i in range(L):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = 1 + rnd(h, std=0.1)
        w[p + "post_attention_layernorm.weight"] = 1 + rnd(h, std=0.1)
        w[p + "self_attn.q_proj.weight"] = rnd(n * d, h)
        w[p + "self_attn.k_proj.weight"] = rnd(g * d, h)
        w[p + "self_attn.v_proj.weight"] = rnd(g * d, h)
        w[p + "self_attn.o_proj.weight"] = rnd(h, n * d)
        w[p + "block_sparse_moe.gate.weight"] = rnd(E, h, std=1.0)
        for e in range(E):
            q = p + f"block_sparse_moe.experts.{e}."
            w[q + "w1.weight"] = rnd(f, h)
            w[q + "w2.weight"] = rnd(h, f)
            w[q + "w3.weight"] = rnd(f, h)
    w["model.norm.weight"] = 1 + rnd(h, std=0.1)
    if not tied:
        w["lm_head.weight"] = rnd(V, h)
    config = {
        "architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "vocab_size": V,
        "hidden_size": h, "intermediate_size": f, "num_hidden_layers": L,
        "num_attention_heads": n, "num_key_value_heads": g, "head_dim": d, "hidden_act": "silu",
        "max_position_embeddings": 32, "initializer_range": 0.02, "rms_norm_eps": 1e-5,
        "use_cache": True, "rope_theta": 500.0, "sliding_window": window,
        "attention_dropout": 0.0, "num_experts_per_tok": k, "num_local_experts": E,
        "output_router_logits": False, "router_aux_loss_coef": 0.02, "router_jitter_noise": 0.0,
        "tie_word_embeddings": tied, "torch_dtype": "float32", "bos_token_id": 1, "eos_token_id": 2,
    }
    return config, w


def fixture(folder, window, tied, seed, qwen):
    config, w = qwen_fixture(tied, seed) if qwen else mixtral_fixture(window, tied, seed)
    os.makedirs(folder, exist_ok=True)
    write_safetensors(os.path.join(folder, "model.safetensors"), w)
    with open(os.path.join(folder, "config.json"), "w") as fh:
        json.dump(config, fh, indent=2)


def forward(config, w, tokens):
    """log-probs [S, V] of one sequence, float64."""
    W = {name: t.to(torch.float64) for name, t in w.items()}
    qwen = config["model_type"] == "qwen2_moe"
    h = config["hidden_size"]
    n, g = config["num_attention_heads"], config["num_key_value_heads"]
    d = config.get("head_dim") or h // n
    eps, theta = config["rms_norm_eps"], config["rope_theta"]
    E, k = config["num_experts" if qwen else "num_local_experts"], config["num_experts_per_tok"]
    window = config.get("sliding_window") if not qwen or config.get("use_sliding_window") else None
    assert not (qwen and window is not None), "Qwen2-MoE's sliding window is not modelled here"
    renormalise = config.get("norm_topk_prob", False) if qwen else True
    S = len(tokens)
    x = W["model.embed_tokens.weight"][torch.tensor(tokens)]
    pos = torch.arange(S, dtype=torch.float64)
    inv_freq = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.int64).to(torch.float64) / d))
    emb = torch.cat((pos[:, None] * inv_freq[None, :],) * 2, dim=-1)
    cos, sin = emb.cos(), emb.sin()
    q_idx, kv_idx = torch.arange(S)[:, None], torch.arange(S)[None, :]
    allowed = kv_idx <= q_idx
    if window is not None:
        allowed = allowed & (kv_idx > q_idx - window)
    mask = torch.zeros(S, S, dtype=torch.float64).masked_fill(~allowed, float("-inf"))
    gaps = []
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        r = x
        y = rms_norm(x, W[p + "input_layernorm.weight"], eps)
        def proj(name):
            out = y @ W[p + f"self_attn.{name}.weight"].T
            return out + W[p + f"self_attn.{name}.bias"] if qwen else out

        q = proj("q_proj").view(S, n, d).transpose(0, 1)
        kk = proj("k_proj").view(S, g, d).transpose(0, 1)
        v = proj("v_proj").view(S, g, d).transpose(0, 1)
        q, kk = q * cos + rotate_half(q) * sin, kk * cos + rotate_half(kk) * sin
        kk = kk.repeat_interleave(n // g, dim=0)
        v = v.repeat_interleave(n // g, dim=0)
        a = torch.softmax(q @ kk.transpose(1, 2) * d ** -0.5 + mask, dim=-1) @ v
        x = r + a.transpose(0, 1).reshape(S, n * d) @ W[p + "self_attn.o_proj.weight"].T
        r = x
        y = rms_norm(x, W[p + "post_attention_layernorm.weight"], eps)
        # (Mixtral: block_sparse_moe, w1 gate, w3 up, w2 down; Qwen2-MoE: mlp, *_proj.)
        block = p + ("mlp." if qwen else "block_sparse_moe.")
        gate, up, down = ("gate_proj", "up_proj", "down_proj") if qwen else ("w1", "w3", "w2")

        def swiglu(q_, z):
            return W[q_ + f"{down}.weight"] @ (F.silu(W[q_ + f"{gate}.weight"] @ z) * (W[q_ + f"{up}.weight"] @ z))

        sparse = not qwen or (i not in config.get("mlp_only_layers", []) and
                              (i + 1) % config.get("decoder_sparse_step", 1) == 0)
        if not sparse:
            x = r + torch.stack([swiglu(block, y[t]) for t in range(S)])
            continue
        probs = torch.softmax(y @ W[block + "gate.weight"].T, dim=-1)
        top, chosen = torch.topk(probs, k, dim=-1)
        if k < E:
            gaps.append(float((top[:, -1] - torch.topk(probs, k + 1, dim=-1).values[:, -1]).min()))
        if renormalise:
            top = top / top.sum(-1, keepdim=True)
        out = torch.zeros_like(y)
        for t in range(S):
            for j in range(k):
                out[t] += top[t, j] * swiglu(block + f"experts.{int(chosen[t, j])}.", y[t])
            if qwen:
                shared_gate = torch.sigmoid(W[block + "shared_expert_gate.weight"] @ y[t])
                out[t] += shared_gate * swiglu(block + "shared_expert.", y[t])
        x = r + out
    x = rms_norm(x, W["model.norm.weight"], eps)
    head = W["lm_head.weight"] if not config.get("tie_word_embeddings", False) else W["model.embed_tokens.weight"]
    return torch.log_softmax(x @ head.T, dim=-1), min(gaps) if gaps else math.inf


def main():
    cmd = sys.argv[1]
    if cmd == "fixture":
        args = sys.argv[2:]
        folder, window, tied, seed, qwen = args[0], None, False, 1234, False
        i = 1
        while i < len(args):
            if args[i] == "--window":
                window, i = int(args[i + 1]), i + 2
            elif args[i] == "--seed":
                seed, i = int(args[i + 1]), i + 2
            elif args[i] == "--tied":
                tied, i = True, i + 1
            elif args[i] == "--qwen":
                qwen, i = True, i + 1
            else:
                raise SystemExit(f"unknown argument {args[i]}")
        fixture(folder, window, tied, seed, qwen)
        print(json.dumps({"written": folder}))
    elif cmd == "logprobs":
        with open(sys.argv[2]) as f:
            seqs = json.load(f)
        out, routing = {}, {}
        for folder in sys.argv[3:]:
            config, w = load_folder(folder)
            assert config["model_type"] in ("mixtral", "qwen2_moe"), config["model_type"]
            lps, gap = [], math.inf
            for s in seqs:
                lp, g_ = forward(config, w, s)
                lps.append([float(lp[i - 1, s[i]]) for i in range(1, len(s))])
                gap = min(gap, g_)
            out[folder], routing[folder] = lps, gap
        print(json.dumps({"logprobs": out, "routing": routing}))
    else:
        raise SystemExit(f"unknown command {cmd}")


if __name__ == "__main__":
    main()
