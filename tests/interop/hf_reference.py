#!/usr/bin/python3
"""An independent reader of Hugging Face transformers folders, for the export tests.

It knows nothing of megatron.cpp: it parses safetensors files by hand (8-byte little-endian
header length, JSON header, data region), follows model.safetensors.index.json when the weights
are sharded, and runs the forward pass of transformers' GPT2LMHeadModel or LlamaForCausalLM as
their modelling code defines it (tensor names and shapes, Conv1D weights stored [in, out],
"gelu_new", LayerNorm / RMSNorm, rotate-half rotary embeddings with transformers' inv_freq,
grouped-query attention by repeat_kv), in float64.

Usage (one process for several folders: importing torch is the slow part):
  hf_reference.py logprobs TOKENS.json FOLDER... [--rounding FP32_FOLDER LOW_FOLDER]...
      TOKENS.json: [[id, ...], ...]; prints {"logprobs": {FOLDER: [[log p(t_i | t_<i) for
      i >= 1], ...]}}, and with --rounding (any number of pairs) also "rounding": {LOW_FOLDER: n}
      after checking that each of the n tensors of LOW_FOLDER (torch_dtype bfloat16 or float16)
      is its FP32_FOLDER twin rounded to that type (round to nearest even, as torch's .to does)
  hf_reference.py structure FOLDER
      prints {"name": [shape, dtype], ...}
  hf_reference.py megatron-bert INPUT.json FOLDER
      INPUT.json: {"tokens": [[id, ...], ...], "types": [[0|1, ...], ...], "attention_mask":
      [[1|0, ...], ...]}; prints {"prediction_logits": [b][s][V], "seq_relationship_logits":
      [b][2] (MegatronBertForPreTraining) or null (MegatronBertForMaskedLM)}, transformers'
      MegatronBert forward: pre-LayerNorm layers (attention.ln, then ln before the MLP), the
      encoder's final ln, no embedding LayerNorm, the key-padding attention mask, the prediction
      head (dense, hidden_act, LayerNorm, decoder tied to the word embeddings unless
      tie_word_embeddings is false, plus cls.predictions.bias) and the pooler's tanh on the first
      token
"""
import json
import math
import os
import struct
import sys

import torch
import torch.nn.functional as F

DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16,
          "F64": torch.float64, "I64": torch.int64, "I32": torch.int32}


def read_safetensors(path):
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    data = bytearray(raw[8 + n:])
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            assert info.get("format") == "pt", f"{path}: __metadata__.format must be 'pt'"
            continue
        b, e = info["data_offsets"]
        dtype = DTYPES[info["dtype"]]
        t = torch.frombuffer(data[b:e], dtype=dtype) if e > b else torch.empty(0, dtype=dtype)
        out[name] = t.reshape(info["shape"]).clone()
    return out


def load_folder(folder):
    index = os.path.join(folder, "model.safetensors.index.json")
    weights = {}
    if os.path.exists(index):
        with open(index) as f:
            idx = json.load(f)
        total = 0
        for file in sorted(set(idx["weight_map"].values())):
            part = read_safetensors(os.path.join(folder, file))
            for name, t in part.items():
                assert idx["weight_map"][name] == file, name
                total += t.numel() * t.element_size()
            weights.update(part)
        assert set(weights) == set(idx["weight_map"]), "index and files disagree"
        assert total == idx["metadata"]["total_size"], (total, idx["metadata"]["total_size"])
    else:
        weights = read_safetensors(os.path.join(folder, "model.safetensors"))
    with open(os.path.join(folder, "config.json")) as f:
        config = json.load(f)
    return config, weights


def causal_attention(q, k, v):  # [heads, s, d]
    s, d = q.shape[1], q.shape[2]
    scores = q @ k.transpose(-1, -2) / math.sqrt(d)
    mask = torch.triu(torch.ones(s, s, dtype=torch.bool), 1)
    scores = scores.masked_fill(mask, float("-inf"))
    return torch.softmax(scores, -1) @ v


def gelu_new(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


def gpt2_logits(cfg, W, ids):
    W = {k: v.double() for k, v in W.items()}
    h, n = cfg["n_embd"], cfg["n_head"]
    d, eps = h // n, cfg["layer_norm_epsilon"]
    act = {"gelu_new": gelu_new, "gelu": F.gelu}[cfg["activation_function"]]
    s = len(ids)
    x = W["transformer.wte.weight"][ids] + W["transformer.wpe.weight"][torch.arange(s)]
    for i in range(cfg["n_layer"]):
        p = f"transformer.h.{i}."
        a = F.layer_norm(x, (h,), W[p + "ln_1.weight"], W[p + "ln_1.bias"], eps)
        qkv = a @ W[p + "attn.c_attn.weight"] + W[p + "attn.c_attn.bias"]  # Conv1D: x W + b
        q, k, v = qkv.split(h, dim=-1)
        q, k, v = (t.view(s, n, d).transpose(0, 1) for t in (q, k, v))
        ctx = causal_attention(q, k, v).transpose(0, 1).reshape(s, h)
        x = x + ctx @ W[p + "attn.c_proj.weight"] + W[p + "attn.c_proj.bias"]
        m = F.layer_norm(x, (h,), W[p + "ln_2.weight"], W[p + "ln_2.bias"], eps)
        m = act(m @ W[p + "mlp.c_fc.weight"] + W[p + "mlp.c_fc.bias"])
        x = x + m @ W[p + "mlp.c_proj.weight"] + W[p + "mlp.c_proj.bias"]
    x = F.layer_norm(x, (h,), W["transformer.ln_f.weight"], W["transformer.ln_f.bias"], eps)
    head = W["transformer.wte.weight"] if cfg.get("tie_word_embeddings", True) else W["lm_head.weight"]
    return x @ head.T


def rms_norm(x, w, eps):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def llama_logits(cfg, W, ids):
    bias = cfg.get("attention_bias", False)
    W = {k: v.double() for k, v in W.items()}
    h, n = cfg["hidden_size"], cfg["num_attention_heads"]
    g = cfg.get("num_key_value_heads", n)
    d = cfg.get("head_dim", h // n)
    eps = cfg["rms_norm_eps"]
    s = len(ids)
    # transformers' default rotary: inv_freq in float32, then cos/sin of cat(freqs, freqs).
    inv_freq = 1.0 / (cfg["rope_theta"] ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
    freqs = torch.outer(torch.arange(s).float(), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos().double(), emb.sin().double()

    def linear(x, name):
        y = x @ W[name + ".weight"].T
        return y + W[name + ".bias"] if name + ".bias" in W else y

    x = W["model.embed_tokens.weight"][ids]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        a = rms_norm(x, W[p + "input_layernorm.weight"], eps)
        q = linear(a, p + "self_attn.q_proj").view(s, n, d).transpose(0, 1)
        k = linear(a, p + "self_attn.k_proj").view(s, g, d).transpose(0, 1)
        v = linear(a, p + "self_attn.v_proj").view(s, g, d).transpose(0, 1)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        rep = n // g  # repeat_kv: key/value head j serves query heads j*rep .. j*rep+rep-1
        k = k[:, None].expand(g, rep, s, d).reshape(n, s, d)
        v = v[:, None].expand(g, rep, s, d).reshape(n, s, d)
        ctx = causal_attention(q, k, v).transpose(0, 1).reshape(s, n * d)
        x = x + linear(ctx, p + "self_attn.o_proj")
        m = rms_norm(x, W[p + "post_attention_layernorm.weight"], eps)
        m = F.silu(linear(m, p + "mlp.gate_proj")) * linear(m, p + "mlp.up_proj")
        x = x + linear(m, p + "mlp.down_proj")
    x = rms_norm(x, W["model.norm.weight"], eps)
    head = W["model.embed_tokens.weight"] if cfg.get("tie_word_embeddings", False) else W["lm_head.weight"]
    assert not bias or "model.layers.0.self_attn.q_proj.bias" in W
    return x @ head.T


def logprobs(folder, seqs):
    cfg, W = load_folder(folder)
    forward = {"gpt2": gpt2_logits, "llama": llama_logits}[cfg["model_type"]]
    out = []
    for ids in seqs:
        logits = forward(cfg, W, torch.tensor(ids))
        assert logits.shape[-1] == cfg["vocab_size"]
        lp = torch.log_softmax(logits, -1)
        out.append([lp[i - 1, ids[i]].item() for i in range(1, len(ids))])
    return out


def rounding(fp32_folder, low_folder):
    c32, w32 = load_folder(fp32_folder)
    c16, w16 = load_folder(low_folder)
    assert c32["torch_dtype"] == "float32", c32["torch_dtype"]
    low = {"bfloat16": torch.bfloat16, "float16": torch.float16}[c16["torch_dtype"]]
    assert set(w32) == set(w16), set(w32) ^ set(w16)
    for name, t in w32.items():
        b = w16[name]
        assert b.dtype == low, (name, b.dtype)
        assert torch.equal(t.to(low), b), f"{name}: not the fp32 weights rounded to {low}"
    return len(w32)


def megatron_bert(folder, tokens, types, attention_mask):
    cfg, W = load_folder(folder)
    W = {k[5:] if k.startswith("bert.") else k: v.double() for k, v in W.items()}
    h, n, eps = cfg["hidden_size"], cfg["num_attention_heads"], cfg["layer_norm_eps"]
    d = h // n
    act = {"gelu": F.gelu, "gelu_new": gelu_new}[cfg["hidden_act"]]
    ids, tt = torch.tensor(tokens), torch.tensor(types)
    b, s = ids.shape
    x = (W["embeddings.word_embeddings.weight"][ids] + W["embeddings.position_embeddings.weight"][torch.arange(s)]
         + W["embeddings.token_type_embeddings.weight"][tt])
    # get_extended_attention_mask: (1 - mask) * the dtype's minimum, added to every query's scores.
    bias = (1.0 - torch.tensor(attention_mask, dtype=torch.float64))[:, None, None, :] * torch.finfo(torch.float64).min
    lin = lambda t, name: t @ W[name + ".weight"].T + W[name + ".bias"]  # noqa: E731
    for i in range(cfg["num_hidden_layers"]):
        p = f"encoder.layer.{i}."
        a = F.layer_norm(x, (h,), W[p + "attention.ln.weight"], W[p + "attention.ln.bias"], eps)
        q, k, v = (lin(a, p + "attention.self." + m).view(b, s, n, d).transpose(1, 2) for m in ("query", "key", "value"))
        scores = q @ k.transpose(-1, -2) / math.sqrt(d) + bias
        ctx = (torch.softmax(scores, -1) @ v).transpose(1, 2).reshape(b, s, h)
        x = x + lin(ctx, p + "attention.output.dense")
        m = F.layer_norm(x, (h,), W[p + "ln.weight"], W[p + "ln.bias"], eps)
        x = x + lin(act(lin(m, p + "intermediate.dense")), p + "output.dense")
    x = F.layer_norm(x, (h,), W["encoder.ln.weight"], W["encoder.ln.bias"], eps)
    t = act(lin(x, "cls.predictions.transform.dense"))
    t = F.layer_norm(t, (h,), W["cls.predictions.transform.LayerNorm.weight"],
                     W["cls.predictions.transform.LayerNorm.bias"], eps)
    dec = W["embeddings.word_embeddings.weight"] if cfg.get("tie_word_embeddings", True) \
        else W["cls.predictions.decoder.weight"]
    out = {"prediction_logits": (t @ dec.T + W["cls.predictions.bias"]).tolist(), "seq_relationship_logits": None}
    if "cls.seq_relationship.weight" in W:
        pooled = torch.tanh(lin(x[:, 0], "pooler.dense"))
        out["seq_relationship_logits"] = lin(pooled, "cls.seq_relationship").tolist()
    return out


def structure(folder):
    _, W = load_folder(folder)
    print(json.dumps({k: [list(v.shape), str(v.dtype).replace("torch.", "")] for k, v in W.items()}))


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "logprobs":
        args = sys.argv[3:]
        result = {}
        while "--rounding" in args:
            at = args.index("--rounding")
            result.setdefault("rounding", {})[args[at + 2]] = rounding(args[at + 1], args[at + 2])
            args = args[:at] + args[at + 3:]
        with open(sys.argv[2]) as f:
            seqs = json.load(f)
        result["logprobs"] = {folder: logprobs(folder, seqs) for folder in args}
        print(json.dumps(result))
    elif cmd == "megatron-bert":
        with open(sys.argv[2]) as f:
            inp = json.load(f)
        print(json.dumps(megatron_bert(sys.argv[3], inp["tokens"], inp["types"], inp["attention_mask"])))
    elif cmd == "structure":
        structure(sys.argv[2])
    else:
        sys.exit(f"unknown command {cmd}")
