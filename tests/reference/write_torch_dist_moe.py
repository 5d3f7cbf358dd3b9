#!/usr/bin/env python3
"""Mixture-of-experts models in Megatron-LM's torch_dist format, written by Debian's torch in the
structure Megatron-Core's dist_checkpointing writes (the folder, .metadata and .distcp items as in
write_torch_dist.py, whose stand-ins for torch.distributed.checkpoint's classes this reuses), for
training/torch_dist_moe.h. The MoE keys, from Megatron-LM's megatron/core sources:

  transformer_block.py sharded_state_dict: every layer tensor under one key with the global layer
      as a prepended axis, unless the layers are non-homogeneous (--moe-layer-freq a list, or an
      int > 1): then one key per layer, "decoder.layers.<N>.<module>", no layer axis
  moe/router.py TopKRouter: weight [E, h], replicated over TP (replica id TP rank)
  moe/experts.py SequentialMLP.sharded_state_dict: local_experts.<J> -> "experts.", the global
      expert EP rank * E/EP + J as an axis after the prepended ones (num_global_experts long);
      replica id (PP, TP, expert data-parallel rank); each expert an MLP (mlp.py: fc1 along rows,
      fc2 along columns over TP, apply_swiglu_sharded_factory's [gate; up] as two chunks of TP
      rank t at rows t and T + t of 2T); TEGroupedMLP writes the same keys
  moe/shared_experts.py SharedExpertMLP: an MLP, and gate_weight [1, h] replicated
  models/gpt/gpt_layer_specs.py (Transformer Engine): attention fuses input_layernorm into
      linear_qkv (layer_norm_weight); an MoE layer keeps pre_mlp_layernorm (TENorm), a dense one
      fuses it into mlp.linear_fc1; TE modules' _extra_state are ShardedObjects with the prepended
      axes as offsets/shape ("<key>/shard_<l>.<e>_<L>.<E>", "shard_0_1" without axes). The local
      spec (get_gpt_layer_local_submodules) keys both norms of every layer, dense or MoE, by the
      fused names (its sharded_state_dict_keys_map): write_torch_dist.megatron_key

  write_torch_dist_moe.py make OUT   OUT/<name>/ saved as TP2 x PP2 x EP2 (DP 2: each data-parallel
      rank one expert-parallel rank) and OUT/<name>.ref/{weights.json, weights.bin} (the merged
      weights under our names: {"names": [...], "shapes": [...]}, float32 in that order), for
      moe (every layer MoE: SwiGLU experts, RMSNorm, GQA, rope, untied, TE names) and moe_mixed
      (--moe-layer-freq [0,1,0,1]: GeLU, LayerNorm, learned positions, tied, local spec, a gated
      shared expert; one key per layer)
  write_torch_dist_moe.py summary ITER_DIR   the same reader's view of any folder as one JSON line:
      {"tensors": {key: {"shape", "sum" (float64)}}, "objects": [bytes item keys]}
  write_torch_dist_moe.py check NAME ITER_DIR   reads ITER_DIR with read_torch_dist.py's reader
      (every item at its place, every chunk once) and compares every tensor key, shape, dtype and
      value (bit for bit) with model NAME's global tensors as Megatron-Core keys them
"""
import argparse
import json
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import write_torch_dist as w  # noqa: E402  (the stand-in classes, Shard, torch_save_bytes)

TP, PP, EP = 2, 2, 2
DP = EP
VOCAB, DIVISOR, SEQ, ITERATION = 60, 16, 32, 7

MODELS = {
    "moe": dict(L=4, H=32, heads=4, groups=2, ffn=48, swiglu=True, norm="RMSNorm", untied=True, pe="rope",
                te=True, E=4, moe_ffn=16, shared=0, freq=1),
    "moe_mixed": dict(L=4, H=32, heads=4, groups=4, ffn=64, swiglu=False, norm="LayerNorm", untied=False,
                      pe="learned_absolute", te=False, E=4, moe_ffn=16, shared=24, freq=[0, 1, 0, 1]),
}


def padded_vocab():
    m = DIVISOR * TP
    return (VOCAB + m - 1) // m * m


def moe_layers(m):
    f = m["freq"]
    return [1 if i % f == 0 else 0 for i in range(m["L"])] if isinstance(f, int) else list(f)


def per_layer_keys(m):
    return not isinstance(m["freq"], int) or m["freq"] > 1


def full_weights(m, seed):
    """The merged weights under our names (experts by global number, SequentialExperts' names)."""
    g = torch.Generator().manual_seed(seed)
    H, hd = m["H"], m["H"] // m["heads"]

    def r(*shape, scale=0.2):
        return torch.randn(*shape, generator=g) * scale

    def fc1_rows(n):
        return 2 * n if m["swiglu"] else n

    w_ = {"embedding.word_embeddings.weight": r(padded_vocab(), H, scale=0.5)}
    if m["pe"] == "learned_absolute":
        w_["embedding.position_embeddings.weight"] = r(SEQ, H)
    for i, is_moe in enumerate(moe_layers(m)):
        p = "decoder.layers.%d." % i
        for n in ("input_layernorm", "pre_mlp_layernorm"):
            w_[p + n + ".weight"] = 1 + r(H, scale=0.1)
            if m["norm"] == "LayerNorm":
                w_[p + n + ".bias"] = r(H, scale=0.1)
        w_[p + "self_attention.linear_qkv.weight"] = r((m["heads"] + 2 * m["groups"]) * hd, H)
        w_[p + "self_attention.linear_proj.weight"] = r(H, m["heads"] * hd)
        if not is_moe:
            w_[p + "mlp.linear_fc1.weight"] = r(fc1_rows(m["ffn"]), H)
            w_[p + "mlp.linear_fc2.weight"] = r(H, m["ffn"])
            continue
        w_[p + "mlp.router.weight"] = r(m["E"], H)
        for e in range(m["E"]):
            q = p + "mlp.experts.local_experts.%d." % e
            w_[q + "linear_fc1.weight"] = r(fc1_rows(m["moe_ffn"]), H)
            w_[q + "linear_fc2.weight"] = r(H, m["moe_ffn"])
        if m["shared"]:
            w_[p + "mlp.shared_experts.gate_weight"] = r(1, H)
            w_[p + "mlp.shared_experts.linear_fc1.weight"] = r(fc1_rows(m["shared"]), H)
            w_[p + "mlp.shared_experts.linear_fc2.weight"] = r(H, m["shared"])
    w_["decoder.final_layernorm.weight"] = 1 + r(H, scale=0.1)
    if m["norm"] == "LayerNorm":
        w_["decoder.final_layernorm.bias"] = r(H, scale=0.1)
    if m["untied"]:
        w_["output_layer.weight"] = r(padded_vocab(), H, scale=0.5)
    return w_


class Entry:
    """One sharded key: its global tensor (prepended axes included), which prepended axes it has,
    the layer of a per-layer key, its TP axis (of the module's own tensor) and whether it is
    SwiGLU's fc1."""

    def __init__(self, key, full, layer_axis, expert_axis, layer, tp_axis, swiglu):
        self.key, self.full, self.layer_axis, self.expert_axis = key, full, layer_axis, expert_axis
        self.layer, self.tp_axis, self.swiglu = layer, tp_axis, swiglu


def entries(m, weights):
    moe = moe_layers(m)
    per_layer = per_layer_keys(m)
    sub = {}  # (key, layer or None) -> {(layer, expert): tensor}
    info = {}
    for name, t in weights.items():
        if not name.startswith("decoder.layers."):
            axis = 0 if name in ("embedding.word_embeddings.weight", "output_layer.weight") else None
            info[(name, None)] = (False, False, None, axis, False)
            sub[(name, None)] = {(None, None): t}
            continue
        rest = name[len("decoder.layers."):]
        i, s = int(rest.split(".", 1)[0]), rest.split(".", 1)[1]
        expert = None
        if s.startswith("mlp.experts.local_experts."):
            e, mod = s[len("mlp.experts.local_experts."):].split(".", 1)
            expert, s = int(e), "mlp.experts.experts." + mod
        s = w.megatron_key(m, s, moe_layer=bool(moe[i]))
        fc1 = s.endswith("linear_fc1.weight")
        tp_axis = 0 if s.endswith("linear_qkv.weight") or fc1 else 1 if s.endswith(
            ("linear_proj.weight", "linear_fc2.weight")) else None
        key = ("decoder.layers.%d." % i if per_layer else "decoder.layers.") + s
        k = (key, i if per_layer else None)
        info[k] = (not per_layer, expert is not None, i if per_layer else None, tp_axis, fc1 and m["swiglu"])
        sub.setdefault(k, {})[(None if per_layer else i, expert)] = t
    out = []
    for k, parts in sub.items():
        layer_axis, expert_axis, layer, tp_axis, swiglu = info[k]
        layers = sorted({a for a, _ in parts}, key=lambda x: -1 if x is None else x)
        experts = sorted({b for _, b in parts}, key=lambda x: -1 if x is None else x)
        rows = []
        for a in layers:
            row = [parts[(a, b)] for b in experts]
            rows.append(torch.stack(row) if expert_axis else row[0])
        full = torch.stack(rows) if layer_axis else rows[0]
        out.append(Entry(k[0], full, layer_axis, expert_axis, layer, tp_axis, swiglu))
    return out


def tp_chunks(t, axis, swiglu, tp):
    if axis is None:
        return [(0, t)] if tp == 0 else []  # replicated: TP rank 0 is the main replica
    if swiglu:
        half = t.shape[axis] // 2
        n = half // TP
        return [(tp * n, t.narrow(axis, tp * n, n)), (half + tp * n, t.narrow(axis, half + tp * n, n))]
    n = t.shape[axis] // TP
    return [(tp * n, t.narrow(axis, tp * n, n))]


def rank_shards(m, ents, t, p, d):
    """What global rank (t, p, d) writes: the dense tensors by DP rank 0, expert-parallel rank
    d's experts (its expert data-parallel rank is 0), the objects."""
    L, per = m["L"], m["L"] // PP
    stage = range(p * per, (p + 1) * per)
    local_experts = range(d * m["E"] // EP, (d + 1) * m["E"] // EP)
    shards, objects = [], []
    for en in ents:
        if not en.expert_axis and d != 0:
            continue
        if en.layer_axis:
            layers = list(stage)
        elif en.layer is not None:
            layers = [None] if en.layer in stage else []
        else:
            first = en.key.startswith("embedding.")
            layers = [None] if (p == 0 if first else p == PP - 1) else []
        for layer in layers:
            for e in (local_experts if en.expert_axis else [None]):
                x, pre = en.full, []
                if layer is not None:
                    x, pre = x[layer], pre + [layer]
                if e is not None:
                    x, pre = x[e], pre + [e]
                for off, piece in tp_chunks(x, en.tp_axis, en.swiglu, t):
                    offsets = [0] * x.dim()
                    if en.tp_axis is not None:
                        offsets[en.tp_axis] = off
                    data = piece.contiguous().clone().reshape([1] * len(pre) + list(piece.shape))
                    shards.append(w.Shard(en.key, list(en.full.shape), pre + offsets, data))
    if t == 0:  # the modules' _extra_state (Transformer Engine), output_layer's
        moe = moe_layers(m)
        for layer in (stage if m["te"] else []):
            pl = per_layer_keys(m)
            pre = "decoder.layers.%d." % layer if pl else "decoder.layers."
            shard = "0_1" if pl else "%d_%d" % (layer, L)
            mods = ["self_attention.linear_qkv", "self_attention.core_attention", "self_attention.linear_proj"]
            if d == 0:
                mods += [] if moe[layer] else ["mlp.linear_fc1", "mlp.linear_fc2"]
                objects += [(pre + mod + "._extra_state/shard_" + shard, None) for mod in mods]
            if moe[layer]:
                for e in local_experts:
                    at = "%d_%d" % (e, m["E"]) if pl else "%d.%d_%d.%d" % (layer, e, L, m["E"])
                    objects += [(pre + "mlp.experts.experts.%s._extra_state/shard_%s" % (f, at), None)
                                for f in ("linear_fc1", "linear_fc2")]
        if p == PP - 1 and d == 0:
            objects.append(("output_layer._extra_state/shard_0_1", None))
    if d == 0:  # Megatron-LM's get_rng_state: (PP, TP), the data-parallel rank as replica id
        objects.append(("rng_state/shard_%d.%d_%d.%d" % (p, t, PP, TP),
                        {"random_rng_state": (3, tuple(range(4)), None), "np_rng_state": None}))
    return shards, objects


def args_namespace(m):
    """write_torch_dist.py's arguments of the model, with the experts' (arguments.py's names)."""
    ns = w.args_namespace(dict(m, bias=False, dp=DP))
    for k, v in dict(expert_model_parallel_size=EP, expert_tensor_parallel_size=TP, num_experts=m["E"],
                     moe_layer_freq=m["freq"], moe_ffn_hidden_size=m["moe_ffn"], moe_router_topk=2,
                     moe_router_load_balancing_type="aux_loss", moe_aux_loss_coeff=0.01, moe_z_loss_coeff=None,
                     moe_grouped_gemm=False, moe_shared_expert_intermediate_size=m["shared"] or None,
                     moe_shared_expert_gate=bool(m["shared"]), moe_token_dispatcher_type="alltoall",
                     moe_router_score_function="softmax").items():
        setattr(ns, k, v)
    return ns


def write_checkpoint(folder, m, weights, extra=None, common_optimizer=None):
    """extra(t, p, d) -> (shards, objects) more of rank (t, p, d) (optimizer state);
    common_optimizer: common.pt's "optimizer"."""
    it = os.path.join(folder, "iter_%07d" % ITERATION)
    os.makedirs(it, exist_ok=True)
    ents = entries(m, weights)
    state_md, storage = {}, {}
    for p, d, t in [(p, d, t) for p in range(PP) for d in range(DP) for t in range(TP)]:
        rank = t + TP * (d + DP * p)  # Megatron's order: TP fastest, then DP (EP within it), then PP
        shards, objects = rank_shards(m, ents, t, p, d)
        if extra is not None:
            more = extra(t, p, d)
            shards, objects = shards + more[0], objects + more[1]
        items = [("t", s) for s in shards] + [("b", o) for o in objects]
        files = [bytearray(), bytearray()]
        for i, (kind, x) in enumerate(items):
            f = i % 2
            offset = len(files[f])
            if kind == "t":
                files[f] += w.torch_save_bytes(x.data)
                md = state_md.setdefault(x.key, w.TensorStorageMetadata(
                    w.TensorProperties(x.data.dtype), torch.Size(x.global_shape), []))
                md.chunks.append(w.ChunkStorageMetadata(torch.Size(x.offsets), torch.Size(x.data.shape)))
                index = w.MetadataIndex(x.key, x.offsets, len(md.chunks) - 1)
            else:
                files[f] += w.torch_save_bytes([x[1]])
                state_md[x[0]] = w.BytesStorageMetadata()
                index = w.MetadataIndex(x[0])
            storage[index] = w._StorageInfo("__%d_%d.distcp" % (rank, f), offset, len(files[f]) - offset)
        for f in range(2):
            with open(os.path.join(it, "__%d_%d.distcp" % (rank, f)), "wb") as out:
                out.write(bytes(files[f]))
    meta = w.Metadata(state_md, planner_data={}, storage_data=storage,
                      storage_meta=w.StorageMeta(checkpoint_id=it, save_id="0"), version="1.0.0")
    with open(os.path.join(it, ".metadata"), "wb") as f:
        w.pickle.dump(meta, f)
    common = {"args": args_namespace(m), "checkpoint_version": 3.0, "iteration": ITERATION,
              "opt_param_scheduler": {"max_lr": 3e-3, "min_lr": 3e-4, "lr_warmup_steps": 0,
                                      "num_steps": ITERATION * 8, "lr_decay_steps": 160,
                                      "lr_decay_style": "cosine", "start_wd": 0.1, "end_wd": 0.1},
              "num_floating_point_operations_so_far": 0.0}
    if common_optimizer is not None:
        common["optimizer"] = common_optimizer
        common["args"].use_distributed_optimizer = True
    torch.save(common, os.path.join(it, "common.pt"))
    with open(os.path.join(it, "metadata.json"), "w") as f:
        json.dump({"sharded_backend": "torch_dist", "sharded_backend_version": 1,
                   "common_backend": "torch", "common_backend_version": 1}, f)
    with open(os.path.join(folder, "latest_checkpointed_iteration.txt"), "w") as f:
        f.write(str(ITERATION))


def make(out):
    for i, (name, m) in enumerate(MODELS.items()):
        weights = full_weights(m, 300 + i)
        write_checkpoint(os.path.join(out, name), m, weights)
        ref = os.path.join(out, name + ".ref")
        os.makedirs(ref, exist_ok=True)
        names = sorted(weights)
        with open(os.path.join(ref, "weights.json"), "w") as f:
            json.dump({"names": names, "shapes": [list(weights[n].shape) for n in names]}, f)
        np.concatenate([weights[n].numpy().ravel() for n in names]).astype(np.float32).tofile(
            os.path.join(ref, "weights.bin"))


def check(name, it):
    import read_torch_dist as reader
    m = MODELS[name]
    _, _, tensors, objects = reader.read(it)
    want = {en.key: en.full for en in entries(m, full_weights(m, 300 + list(MODELS).index(name)))}
    assert set(tensors) == set(want), ("keys differ", sorted(set(tensors) ^ set(want)))
    for k, t in want.items():
        got = tensors[k]
        assert got.dtype == t.dtype and got.shape == t.shape, (k, got.dtype, got.shape, t.dtype, t.shape)
        assert torch.equal(got, t), k + ": values differ"
    common = torch.load(os.path.join(it, "common.pt"))
    assert common["args"].num_experts == m["E"], common["args"]
    print("ok: %d tensor keys, %d bytes items" % (len(tensors), len(objects)))


def summary(it):
    """Every tensor key of ITER_DIR as the reader assembles it: its shape and float64 sum; and the
    bytes items' keys."""
    import read_torch_dist as reader
    _, _, tensors, objects = reader.read(it)
    print(json.dumps({"tensors": {k: {"shape": list(t.shape), "sum": float(t.double().sum())}
                                  for k, t in tensors.items()}, "objects": sorted(objects)}))


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "make":
        os.makedirs(sys.argv[2], exist_ok=True)
        make(sys.argv[2])
    elif len(sys.argv) == 3 and sys.argv[1] == "summary":
        summary(sys.argv[2])
    elif len(sys.argv) == 4 and sys.argv[1] == "check":
        check(sys.argv[2], sys.argv[3])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
