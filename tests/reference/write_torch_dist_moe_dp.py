#!/usr/bin/env python3
"""The distributed optimizer's default torch_dist state, dp_reshardable, of mixture-of-experts
models, written by Debian's torch as Megatron-LM saves it under expert parallelism (the models,
folder and keys of write_torch_dist_moe.py, saved by TP2 x PP2 x EP2 with DP 2: the dense
data-parallel group has 2 ranks, the expert one 1). From Megatron-LM's megatron/core sources:

  optimizer/__init__.py get_megatron_optimizer: the parameters with allreduce False (the experts'
      linear layers set allreduce = not (is_expert and expert_model_parallel_size > 1)) form the
      model's expert_parallel_buffers and their own DistributedOptimizer, over the expert
      data-parallel group, with data_parallel_group_idx = the rank in the expert
      tensor-model-pipeline group (tp fastest, then ep, then pp: t + TP (e + EP p)); the dense one
      keeps the model-parallel rank t + TP p. Two optimizers: a ChainedOptimizer.
  optimizer/optimizer.py ChainedOptimizer.sharded_state_dict: optimizer i's keys prefixed
      "chained_<i>." (add_prefix_for_sharding) for a format that is not fully reshardable, its
      state dicts under keys 0 and 1 (common.pt: {"optimizer": {0: {...}, 1: {...}}}).
  optimizer/distrib_optimizer.py sharded_param_state_dp_reshardable: per bucket the flat
      "optimizer.distributed.dp_group_idx_<g>.gbuf_idx_0.dtype_(...).bucket_idx_<b>.<param |
      exp_avg | exp_avg_sq>" of the unpadded size, DP rank r of the optimizer's group writing its
      contiguous 1/DP of the padded bucket (the gaps between parameters as garbage: NaN here), DP
      rank 0 the ShardedObjects "optimizer", "per_bucket_numel", "per_bucket_numel_unpadded".
  distributed/param_and_grad_buffer.py: parameters in reverse named_parameters() order, each at a
      multiple of 64 elements, buckets padded to lcm(group DP, 128); a tied embedding of a
      pipelined run in a bucket of its own.
  Registration order (named_parameters): the embedding; per layer (TransformerLayer) the input
      norm (Transformer Engine: fused into linear_qkv, after linear_proj), self_attention's
      linear_proj then linear_qkv, pre_mlp_layernorm, then the MLP: a dense one's linear_fc1,
      linear_fc2, or MoELayer's router.weight, experts (SequentialMLP: local_experts.<J>.
      linear_fc1, linear_fc2 expert by expert), shared_experts (linear_fc1, linear_fc2,
      gate_weight); the final norm; the output layer.

  write_torch_dist_moe_dp.py make OUT   OUT/<name>_dp/ (the model of write_torch_dist_moe.py with
      that state) and OUT/<name>_dp.ref/{optimizer.json, optimizer.bin}: the state merged under our
      names ({"names": [...], "shapes": [...], "kinds": ["param", "exp_avg", "exp_avg_sq"]},
      float32, kind by kind, names in that order), for moe and moe_mixed
  write_torch_dist_moe_dp.py summary ITER_DIR   the dp_reshardable state of any folder (ours) read
      by read_torch_dist.py's reader as one JSON line: the bucket sizes per optimizer key prefix
      (checked against its "per_bucket_numel_unpadded" object, every value finite) and common.pt's
      optimizer entries
"""
import json
import math
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import write_torch_dist as w  # noqa: E402
import write_torch_dist_moe as wm  # noqa: E402

TP, PP, EP, DP = wm.TP, wm.PP, wm.EP, wm.DP
EDP = DP // EP
KINDS = ("param", "exp_avg", "exp_avg_sq")
STEP = 9
DTYPE = (torch.float32, torch.float32)


def registration_order(m, weights, p):
    """Our names of stage p's parameters in Megatron-Core's named_parameters() order (the last
    stage's copy of a tied embedding as ("output_layer.weight", the embedding's name))."""
    per = m["L"] // PP
    moe = wm.moe_layers(m)
    out = []
    if p == 0:
        out += ["embedding.word_embeddings.weight", "embedding.position_embeddings.weight"]
    for layer in range(p * per, (p + 1) * per):
        q = "decoder.layers.%d." % layer
        norm = [q + "input_layernorm.weight", q + "input_layernorm.bias"]
        proj = [q + "self_attention.linear_proj.weight"]
        out += (proj + norm if m["te"] else norm + proj) + [q + "self_attention.linear_qkv.weight"]
        out += [q + "pre_mlp_layernorm.weight", q + "pre_mlp_layernorm.bias"]
        if not moe[layer]:
            out += [q + "mlp.linear_fc1.weight", q + "mlp.linear_fc2.weight"]
            continue
        out.append(q + "mlp.router.weight")
        for e in range(m["E"]):
            out += [q + "mlp.experts.local_experts.%d.linear_fc%d.weight" % (e, i) for i in (1, 2)]
        out += [q + "mlp.shared_experts." + s for s in ("linear_fc1.weight", "linear_fc2.weight", "gate_weight")]
    if p == PP - 1:
        out += ["decoder.final_layernorm.weight", "decoder.final_layernorm.bias"]
    named = [(n, n) for n in out if n in weights]
    if p == PP - 1:
        if m["untied"]:
            named.append(("output_layer.weight", "output_layer.weight"))
        elif PP > 1:
            named.append(("output_layer.weight", "embedding.word_embeddings.weight"))
    return named


def expert_of(name):
    if ".mlp.experts.local_experts." not in name:
        return None
    return int(name.split(".mlp.experts.local_experts.")[1].split(".")[0])


def tp_local(m, name, full, t):
    """TP rank t's shard of our tensor `name`, flat."""
    if name.endswith(("linear_qkv.weight", "linear_fc1.weight")) or name in (
            "embedding.word_embeddings.weight", "output_layer.weight"):
        if name.endswith("linear_fc1.weight") and m["swiglu"]:
            half = full.shape[0] // 2
            n = half // TP
            return torch.cat([full[t * n:(t + 1) * n], full[half + t * n:half + (t + 1) * n]]).reshape(-1)
        n = full.shape[0] // TP
        return full[t * n:(t + 1) * n].reshape(-1)
    if name.endswith(("linear_proj.weight", "linear_fc2.weight")):
        n = full.shape[1] // TP
        return full[:, t * n:(t + 1) * n].contiguous().reshape(-1)
    return full.reshape(-1)


def buckets_of(m, weights, params, group_dp, tied_pp, p):
    """[(unpadded, padded, [(start, megatron name, our name, numel)])] of one buffer: the
    parameters [(megatron name, our name)] in registration order, padded to lcm(group DP, 128)."""
    def shared(name):
        return tied_pp and ((p == 0 and name == "embedding.word_embeddings.weight") or
                            (p == PP - 1 and name == "output_layer.weight"))

    return w.lay_out_buckets([(name, tp_local(m, ours, weights[ours], 0).numel(), (name, ours))
                              for name, ours in params], group_dp * 128 // math.gcd(group_dp, 128), shared)


def optimizer_items(m, state, buckets, prefix, t, r, group_dp):
    """What rank r of an optimizer's data-parallel group writes of its buckets."""
    shards, objects = [], []
    for b, (unpadded, padded, params) in enumerate(buckets):
        local = padded // group_dp
        lo, hi = r * local, (r + 1) * local
        cover = []  # (start, end, {kind: tensor}) in the bucket, the gaps included
        at = lo
        for start, _, ours, n in params:
            s, e = max(start, lo), min(start + n, hi)
            if s >= e:
                continue
            if s > at:
                cover.append((at, s, None))
            cover.append((s, e, {k: tp_local(m, ours, state[k][ours], t)[s - start:e - start].clone() for k in KINDS}))
            at = e
        if at < min(hi, unpadded):
            cover.append((at, min(hi, unpadded), None))
        key = prefix + "gbuf_idx_0.dtype_%s.bucket_idx_%d." % (str(DTYPE), b)
        for s, e, x in cover:
            for k in KINDS:
                data = x[k] if x is not None else torch.full((e - s,), float("nan"))
                shards.append(w.Shard(key + k, [unpadded], [s], data))
    if r == 0:
        group = {"wd_mult": 1.0, "lr_mult": 1.0, "is_expert_parallel": "chained_1." in prefix,
                 "is_decoupled_lr": False, "lr": 3e-3, "bias_correction": True, "betas": (0.9, 0.999),
                 "eps": 1e-8, "weight_decay": 0.1, "amsgrad": False, "step": STEP}
        objects.append((prefix + "optimizer/shard_0_1",
                        {"param_groups": [group, dict(group, wd_mult=0.0, weight_decay=0.0)]}))
        objects.append((prefix + "per_bucket_numel/shard_0_1", [{DTYPE: [n for _, n, _ in buckets]}]))
        objects.append((prefix + "per_bucket_numel_unpadded/shard_0_1", [{DTYPE: [u for u, _, _ in buckets]}]))
    return shards, objects


def layouts(m, weights, t, p, e):
    """[(key prefix, buckets, group DP, this rank's place in it)] of the optimizers of rank (t, p)
    with expert-parallel rank e (DP rank d = e here, expert DP rank d // EP = 0)."""
    params = registration_order(m, weights, p)
    per = m["L"] // PP
    chained = EP > 1 and any(wm.moe_layers(m)[p * per:(p + 1) * per])
    dense = [x for x in params if not (chained and expert_of(x[1]) is not None)]
    tied_pp = not m["untied"] and PP > 1
    out = [(("chained_0." if chained else "") + "optimizer.distributed.dp_group_idx_%d." % (t + TP * p),
            buckets_of(m, weights, dense, DP, tied_pp, p), DP, e)]
    if chained:
        mine = range(e * m["E"] // EP, (e + 1) * m["E"] // EP)
        experts = [x for x in params if expert_of(x[1]) in mine]
        out.append(("chained_1.optimizer.distributed.dp_group_idx_%d." % (t + TP * (e + EP * p)),
                    buckets_of(m, weights, experts, EDP, False, p), EDP, e // EP))
    return out


def optimizer_state(weights, seed):
    g = torch.Generator().manual_seed(seed)
    return {"param": {n: x.clone() for n, x in weights.items()},
            "exp_avg": {n: torch.randn(x.shape, generator=g) * 0.01 for n, x in weights.items()},
            "exp_avg_sq": {n: torch.rand(x.shape, generator=g) * 1e-4 for n, x in weights.items()}}


# write_torch_dist_moe.py's models, and the mixed one with its MoE layers on the second stage only:
# the first stage's ranks hold no experts, so their one optimizer's keys have no "chained_" prefix.
MODELS = dict(wm.MODELS, moe_late=dict(wm.MODELS["moe_mixed"], freq=[0, 0, 1, 1]))


def make(out):
    for i, (name, m) in enumerate(MODELS.items()):
        weights = wm.full_weights(m, 300 + i)
        state = optimizer_state(weights, 500 + i)

        def extra(t, p, d, m=m, weights=weights, state=state):
            shards, objects = [], []
            for prefix, buckets, group_dp, r in layouts(m, weights, t, p, d):
                s, o = optimizer_items(m, state, buckets, prefix, t, r, group_dp)
                shards, objects = shards + s, objects + o
            return shards, objects

        chain = {0: {"param_state_sharding_type": "dp_reshardable"}, 1: {"param_state_sharding_type": "dp_reshardable"}}
        first_stage = wm.moe_layers(m)[:m["L"] // PP]
        common = chain if any(first_stage) else chain[0]  # rank 0's optimizer
        wm.write_checkpoint(os.path.join(out, name + "_dp"), m, weights, extra, common)
        ref = os.path.join(out, name + "_dp.ref")
        os.makedirs(ref, exist_ok=True)
        names = sorted(weights)
        with open(os.path.join(ref, "optimizer.json"), "w") as f:
            json.dump({"names": names, "shapes": [list(weights[n].shape) for n in names], "kinds": list(KINDS)}, f)
        np.concatenate([state[k][n].numpy().ravel() for k in KINDS for n in names]).astype(np.float32).tofile(
            os.path.join(ref, "optimizer.bin"))


def summary(it):
    """The dp_reshardable state of any folder (ours) as one JSON line: per optimizer key prefix
    ("[chained_<i>.]optimizer.distributed.dp_group_idx_<g>.") the sizes of its buckets (each
    key of every state assembled from its chunks, once each, finite, its size the
    "per_bucket_numel_unpadded" object's), and common.pt's "optimizer" keys."""
    import read_torch_dist as reader
    _, _, tensors, objects = reader.read(it)
    out = {}
    for key, x in tensors.items():
        if ".bucket_idx_" not in key:
            continue
        prefix, rest = key.split("gbuf_idx_0.dtype_%s.bucket_idx_" % str(DTYPE))
        b, kind = rest.split(".")
        assert kind in KINDS and x.dtype == torch.float32 and x.dim() == 1, key
        assert torch.isfinite(x).all(), key + ": not finite"
        sizes = out.setdefault(prefix, {})
        assert sizes.setdefault(int(b), x.numel()) == x.numel(), key
    buckets = {}
    for prefix, sizes in out.items():
        assert sorted(sizes) == list(range(len(sizes))), (prefix, sizes)
        buckets[prefix] = [sizes[b] for b in range(len(sizes))]
        unpadded = objects[prefix + "per_bucket_numel_unpadded/shard_0_1"]
        while isinstance(unpadded, list) and len(unpadded) == 1:
            unpadded = unpadded[0]
        assert unpadded == {DTYPE: buckets[prefix]}, (prefix, unpadded, buckets[prefix])
        groups = objects[prefix + "optimizer/shard_0_1"]
        while isinstance(groups, list) and len(groups) == 1:
            groups = groups[0]
        assert groups["param_groups"][0]["step"] >= 1, groups
        # Megatron-Core's experts' optimizer holds the is_expert_parallel groups.
        assert all(g["is_expert_parallel"] == ("chained_1." in prefix) for g in groups["param_groups"]), \
            (prefix, groups)
    common = torch.load(os.path.join(it, "common.pt"), weights_only=False)
    o = common["optimizer"]
    print(json.dumps({"buckets": buckets, "common": sorted(str(k) for k in o),
                      "sharding": [o[k]["param_state_sharding_type"] for k in sorted(o)] if 0 in o
                      else [o["param_state_sharding_type"]]}))


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "make":
        os.makedirs(sys.argv[2], exist_ok=True)
        make(sys.argv[2])
    elif len(sys.argv) == 3 and sys.argv[1] == "summary":
        summary(sys.argv[2])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
