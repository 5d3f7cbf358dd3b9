#!/usr/bin/env python3
"""Megatron-LM checkpoints in its default format, --ckpt-format torch_dist, written by Debian's
torch (which has no torch.distributed.checkpoint) in exactly the structure Megatron-Core's
dist_checkpointing writes over PyTorch's distributed checkpoint (DCP), for
training/torch_dist_checkpoint.h. From Megatron-LM's main-branch sources (commit 00caa53):
dist_checkpointing/serialization.py (save: common state, sharded state, metadata.json),
strategies/common.py (common.pt), strategies/torch.py (MCoreSavePlanner: ShardedObjects as
io.BytesIO of torch.save([obj...]) written as they are; sharded tensors with their prepended
axes), strategies/filesystem_async.py (each rank's items in thread_count=2 files
__<rank>_<n>.distcp), mapping.py (ShardedObject.unique_key "key/shard_<offsets>_<shape>"),
transformer_block.py / transformer_layer.py (layer tensors under one key per module with the
global layer index as a prepended axis 0), mlp.py (apply_swiglu_sharded_factory: fc1's [gate; up]
of TP rank r as two chunks at rows r and T + r of 2T), gpt_model.py (the tied output layer is a
non-main replica of the word embedding: not written); and from PyTorch's current
torch/distributed/checkpoint: metadata.py (Metadata, TensorStorageMetadata, ChunkStorageMetadata,
BytesStorageMetadata, MetadataIndex, TensorProperties with its tuple __getstate__ and the
_MEM_FORMAT_ENCODING enum, StorageMeta), filesystem.py (_StorageInfo without its None fields;
each tensor item a torch.save of the contiguous chunk, each bytes item its raw bytes, back to
back; .metadata a pickle.dump of the Metadata). The classes are stand-ins of the same module,
name, fields and reduce protocol, so the pickle's opcodes are those the real classes produce.

  write_torch_dist.py make OUT     OUT/gpt2/ (GPT-2 style: LayerNorm, GeLU, learned positions,
      biases, tied; --transformer-impl local, its norms keyed as Transformer Engine's; saved with DP 2 and the distributed optimizer's
      state in its fully_reshardable format, distrib_optimizer.py sharded_param_state_fully_
      reshardable, its common part as DistributedOptimizer.state_dict leaves it), OUT/llama/ (RMSNorm, SwiGLU, GQA, rope,
      no biases, untied; Transformer Engine's _extra_state objects) and
      OUT/llama_layers/ (the same with one key per layer and fc1's gate/up keys), each
      saved as TP2 x PP2 would save it, with OUT/<name>.ref/ (config.json and weights.bin of the
      merged weights under our names, for gpt_reference.py; for gpt2 also optimizer.json and
      optimizer.bin, the optimizer state merged); OUT/dp_reshardable (gpt2 and the same optimizer
      state in the distributed optimizer's default format, dp_reshardable: flat buckets of
      Megatron's gradient buffers, saved by each of the DP 2 ranks, see dp_reshardable_items) and
      a variant whose args contradict its layout (OUT/dp_reshardable_overlap) and the same model
      with Transformer Engine's modules (OUT/dp_reshardable_te: their parameter order in the
      buffer) and with 2 virtual pipeline stages (OUT/dp_reshardable_vpp: a buffer per model
      chunk; OUT/dp_reshardable_vpp_buckets: with --overlap-grad-reduce, only the first stage's
      first chunk bucketed); OUT/evil_* (hostile variants of gpt2) and OUT/marker (must never
      appear: the hostile pickles would create it); OUT/gpt2_unfused (gpt2 and its optimizer
      state with the local run's norms under their module names, input_layernorm.*, as earlier
      builds of megatron.cpp keyed them) and OUT/gpt2_both_names (gpt2 with its input norms under
      both names).
"""
import argparse
import dataclasses
import io
import json
import os
import pickle
import shutil
import sys
import types
from enum import Enum
from typing import Any, List, Optional

import numpy as np
import torch

VOCAB, DIVISOR, SEQ = 60, 16, 32
TP, PP = 2, 2
ITERATION = 7
OPTIMIZER_STEP = 6  # one step skipped (as an fp16 run's overflow would)
WEIGHTS_NUMEL = {}  # our name -> elements of the merged weight (dp_reshardable's layout)


def padded_vocab(tp):
    m = DIVISOR * tp
    return (VOCAB + m - 1) // m * m


# ---------------------------------------------------------------------------------------------
# Stand-ins for torch.distributed.checkpoint's classes (same module, qualname and pickled form).

def _module(name):
    m = types.ModuleType(name)
    sys.modules[name] = m
    return m


for _pkg in ("torch.distributed", "torch.distributed.checkpoint"):
    try:
        __import__(_pkg)
    except Exception:  # noqa: BLE001  (Debian's torch has no torch.distributed.checkpoint)
        _module(_pkg)
_meta = _module("torch.distributed.checkpoint.metadata")
_fs = _module("torch.distributed.checkpoint.filesystem")


def _in(mod, cls):
    cls.__module__ = mod.__name__
    setattr(mod, cls.__name__, cls)
    return cls


@dataclasses.dataclass
class ChunkStorageMetadata:
    offsets: Any
    sizes: Any


class _MEM_FORMAT_ENCODING(Enum):
    TORCH_CONTIGUOUS_FORMAT = 0
    TORCH_CHANNELS_LAST = 1
    TORCH_PRESERVE_FORMAT = 2


@dataclasses.dataclass
class TensorProperties:
    dtype: Any = torch.float32
    layout: Any = torch.strided
    requires_grad: bool = False
    memory_format: Any = torch.contiguous_format
    pin_memory: bool = False

    def __getstate__(self):  # torch.memory_format cannot be pickled
        return (self.dtype, self.layout, self.requires_grad,
                _MEM_FORMAT_ENCODING.TORCH_CONTIGUOUS_FORMAT, self.pin_memory)

    def __setstate__(self, state):
        self.dtype, self.layout, self.requires_grad, _, self.pin_memory = state
        self.memory_format = torch.contiguous_format


@dataclasses.dataclass
class TensorStorageMetadata:
    properties: TensorProperties
    size: Any
    chunks: List[ChunkStorageMetadata]


@dataclasses.dataclass
class BytesStorageMetadata:
    pass


@dataclasses.dataclass
class StorageMeta:
    checkpoint_id: Any = None
    save_id: Optional[str] = None
    load_id: Optional[str] = None
    modules: List[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class Metadata:
    state_dict_metadata: dict
    planner_data: Any = None
    storage_data: Any = None
    storage_meta: Optional[StorageMeta] = None
    version: Optional[str] = None


@dataclasses.dataclass(frozen=True)
class MetadataIndex:
    fqn: str
    offset: Optional[Any] = None
    index: Optional[int] = dataclasses.field(hash=False, compare=False, default=None)

    def __init__(self, fqn, offset=None, index=None):
        object.__setattr__(self, "fqn", fqn)
        object.__setattr__(self, "index", index)
        if offset is not None:
            object.__setattr__(self, "offset", torch.Size(offset))


@dataclasses.dataclass
class _StorageInfo:
    relative_path: str
    offset: int
    length: int
    transform_descriptors: Optional[Any] = None

    def __getstate__(self):
        return {k: v for k, v in self.__dict__.items() if v is not None}


for _c in (ChunkStorageMetadata, _MEM_FORMAT_ENCODING, TensorProperties, TensorStorageMetadata,
           BytesStorageMetadata, StorageMeta, Metadata, MetadataIndex):
    _in(_meta, _c)
_in(_fs, _StorageInfo)


# ---------------------------------------------------------------------------------------------
# The models: merged weights under our names, and Megatron-Core's sharded keys for them.

MODELS = {
    "gpt2": dict(L=4, H=32, heads=4, groups=4, ffn=128, swiglu=False, norm="LayerNorm",
                 bias=True, untied=False, pe="learned_absolute", te=False, dp=2, optimizer=True),
    "llama": dict(L=4, H=32, heads=4, groups=2, ffn=48, swiglu=True, norm="RMSNorm",
                  bias=False, untied=True, pe="rope", te=True),
}
# The Llama model as Megatron-Core saves it with metadata non_homogeneous_layers (one key per
# layer, no layer axis: MoE and hybrid models) and singleton_local_shards (fc1's gate and up under
# keys of their own, "<key>_w" and "<key>_v").
MODELS["llama_layers"] = dict(MODELS["llama"], per_layer=True, singleton=True)


def full_weights(m, seed):
    g = torch.Generator().manual_seed(seed)
    H, hd = m["H"], m["H"] // m["heads"]
    qkv_rows = (m["heads"] + 2 * m["groups"]) * hd
    fc1_rows = 2 * m["ffn"] if m["swiglu"] else m["ffn"]
    V = padded_vocab(TP)

    def r(*shape, scale=0.1):
        return torch.randn(*shape, generator=g) * scale

    w = {"embedding.word_embeddings.weight": r(V, H, scale=0.5)}
    if m["pe"] == "learned_absolute":
        w["embedding.position_embeddings.weight"] = r(SEQ, H, scale=0.2)
    for i in range(m["L"]):
        p = f"decoder.layers.{i}."
        for n in ("input_layernorm", "pre_mlp_layernorm"):
            w[p + n + ".weight"] = 1 + r(H)
            if m["norm"] == "LayerNorm":
                w[p + n + ".bias"] = r(H)
        w[p + "self_attention.linear_qkv.weight"] = r(qkv_rows, H)
        w[p + "self_attention.linear_proj.weight"] = r(H, m["heads"] * hd)
        w[p + "mlp.linear_fc1.weight"] = r(fc1_rows, H)
        w[p + "mlp.linear_fc2.weight"] = r(H, m["ffn"])
        if m["bias"]:
            w[p + "self_attention.linear_qkv.bias"] = r(qkv_rows)
            w[p + "self_attention.linear_proj.bias"] = r(H)
            w[p + "mlp.linear_fc1.bias"] = r(fc1_rows)
            w[p + "mlp.linear_fc2.bias"] = r(H)
    w["decoder.final_layernorm.weight"] = 1 + r(H)
    if m["norm"] == "LayerNorm":
        w["decoder.final_layernorm.bias"] = r(H)
    if m["untied"]:
        w["output_layer.weight"] = r(V, H, scale=0.5)
    return w


def megatron_key(m, sub, moe_layer=False):
    """Megatron-Core's sharded key of a layer tensor `sub` ("input_layernorm.weight", ...). Under
    Transformer Engine the layer's norms are parts of TELayerNormColumnParallelLinear
    (linear_qkv.layer_norm_weight, linear_fc1.layer_norm_weight), except an MoE layer's
    pre_mlp_layernorm, a TENorm of its own. The local specs (gpt_layer_specs.py
    get_gpt_layer_local_submodules, dense and MoE layers; bert_layer_specs.py bert_layer_local_spec;
    t5_spec.py encoder/decoder_model_with_local_spec) give the same keys: their
    sharded_state_dict_keys_map, which TransformerLayer.sharded_state_dict applies to the sharded
    keys (apply_prefix_mapping). m["unfused"]: the module names instead, as earlier builds of
    megatron.cpp keyed local runs (a folder that must still load)."""
    if not m.get("unfused"):
        for ours, fused in (("input_layernorm.", "self_attention.linear_qkv.layer_norm_"),
                            ("pre_mlp_layernorm.", "mlp.linear_fc1.layer_norm_")):
            if sub.startswith(ours) and not (m["te"] and moe_layer and ours == "pre_mlp_layernorm."):
                return fused + sub[len(ours):]
    return sub


def tp_axis(sub):
    """The tensor-parallel axis of a tensor (ColumnParallel: 0, RowParallel weight: 1), or None."""
    if sub.startswith(("self_attention.linear_qkv.", "mlp.linear_fc1.")) and "layer_norm" not in sub:
        return 0
    if sub in ("self_attention.linear_proj.weight", "mlp.linear_fc2.weight"):
        return 1
    return None


class Shard:
    """One ShardedTensor chunk: key, global shape, offsets and the data (with prepended axes)."""

    def __init__(self, key, global_shape, offsets, data):
        self.key, self.global_shape, self.offsets, self.data = key, list(global_shape), list(offsets), data


def optimizer_state(m, w, seed):
    """The distributed optimizer's state in model space, under our names: the fp32 main weights
    ("param": the weights themselves in an fp32 model) and Adam's moments (exp_avg_sq positive)."""
    g = torch.Generator().manual_seed(seed)
    return {"param": {n: t.clone() for n, t in w.items()},
            "exp_avg": {n: torch.randn(*t.shape, generator=g) * 1e-2 for n, t in w.items()},
            "exp_avg_sq": {n: torch.randn(*t.shape, generator=g) ** 2 * 1e-4 for n, t in w.items()}}


def rank_shards(m, w, opt, t, p, d):
    """What global rank (t, p, d) of a TP x PP x DP run writes. Main replicas only: the model's
    shards by DP rank 0; the optimizer's (fully_reshardable: Megatron's sharded_param_state_
    fully_reshardable, each state tensor a ShardedTensor of its parameter's key, offsets and
    replica id under "optimizer.state.<param|exp_avg|exp_avg_sq>.<key>") by the last DP rank, as
    the fully parallel save spreads the main replicas over the data-parallel ranks."""
    L = m["L"]
    DP = m.get("dp", 1)
    out, objects = [], []

    def tp_chunks(full, axis, swiglu):
        if axis is None:
            return [(0, full)] if t == 0 else []  # replicated: TP rank 0 is the main replica
        n = full.shape[axis] // TP
        if swiglu:  # apply_swiglu_sharded_factory: [gate_t; up_t] at rows t and T + t of 2T
            half = full.shape[axis] // 2
            n = half // TP
            return [(t * n, full.narrow(axis, t * n, n)), (half + t * n, full.narrow(axis, half + t * n, n))]
        return [(t * n, full.narrow(axis, t * n, n))]

    def add(key, full, axis, layer=None, swiglu=False):
        if swiglu and m.get("singleton"):  # gate and up as two tensors of their own
            gate, up = torch.chunk(full, 2, dim=axis)
            add(key + "_w", gate, axis, layer)
            add(key + "_v", up, axis, layer)
            return
        for off, piece in tp_chunks(full, axis, swiglu):
            offsets = [0] * full.dim()
            if axis is not None:
                offsets[axis] = off
            data = piece.contiguous().clone()
            if layer is None:
                out.append(Shard(key, full.shape, offsets, data))
            else:
                out.append(Shard(key, [L] + list(full.shape), [layer] + offsets, data.unsqueeze(0)))

    sources = []
    if d == 0:
        sources.append(("", w))
    if isinstance(opt, tuple):  # ("dp_reshardable", state): flat buckets of the gradient buffers
        shards, objs = dp_reshardable_items(m, opt[1], t, p, d)
        out += shards
        objects += objs
    elif opt is not None and d == DP - 1:
        sources += [("optimizer.state.%s." % k, opt[k]) for k in ("param", "exp_avg", "exp_avg_sq")]
    for prefix, src in sources:
        if p == 0:
            add(prefix + "embedding.word_embeddings.weight", src["embedding.word_embeddings.weight"], 0)
            if "embedding.position_embeddings.weight" in src:
                add(prefix + "embedding.position_embeddings.weight", src["embedding.position_embeddings.weight"], None)
        for layer in stage_layers(m, p):
            lp = f"decoder.layers.{layer}."
            for name in [n for n in src if n.startswith(lp)]:
                sub = name[len(lp):]
                swiglu = m["swiglu"] and sub.startswith("mlp.linear_fc1.")
                if m.get("per_layer"):
                    add(prefix + lp + megatron_key(m, sub), src[name], tp_axis(sub), None, swiglu)
                else:
                    add(prefix + "decoder.layers." + megatron_key(m, sub), src[name], tp_axis(sub), layer, swiglu)
        if p == PP - 1:
            for n in ("decoder.final_layernorm.weight", "decoder.final_layernorm.bias"):
                if n in src:
                    add(prefix + n, src[n], None)
            if m["untied"]:
                add(prefix + "output_layer.weight", src["output_layer.weight"], 0)
    if m["te"] and t == 0 and d == 0:  # Transformer Engine modules' _extra_state: ShardedObjects
        for layer in stage_layers(m, p):
            for mod in ("self_attention.linear_qkv", "self_attention.core_attention",
                        "self_attention.linear_proj", "mlp.linear_fc1", "mlp.linear_fc2"):
                objects.append((f"decoder.layers.{mod}._extra_state/shard_{layer}_{L}", None))
    # Megatron-LM's get_rng_state (checkpointing.py): a ShardedObject of global shape (PP, TP) at
    # (p, t) with the data-parallel rank as replica id: data-parallel rank 0 writes it.
    if d == 0:
        objects.append((f"rng_state/shard_{p}.{t}_{PP}.{TP}",
                        {"random_rng_state": (3, tuple(range(4)), None), "np_rng_state": None}))
    return out, objects


# The distributed optimizer's default checkpoint format, dp_reshardable (distrib_optimizer.py
# sharded_param_state_dp_reshardable), from Megatron-Core's gradient-buffer layout
# (param_and_grad_buffer.py _ParamAndGradBuffer, distributed_data_parallel.py):
# - each model-parallel rank's buffer holds its parameters in the REVERSE order of
#   module.named_parameters() (registration order: the embedding, then per layer input_layernorm,
#   self_attention.linear_proj (Attention.__init__ builds it before SelfAttention builds
#   linear_qkv), self_attention.linear_qkv, pre_mlp_layernorm, mlp.linear_fc1, mlp.linear_fc2,
#   then the final norm and the output layer; weight before bias);
# - every parameter starts at a multiple of 64 elements (_pad_start_of_param_if_needed);
# - without --overlap-grad-reduce one bucket, except that a tied word embedding of a pipelined run
#   (shared_embedding: the first stage's embedding, the last stage's output_layer.weight) gets a
#   bucket of its own; each bucket is padded to a multiple of lcm(DP, 128);
# - DP rank r owns elements [r * n / DP, (r + 1) * n / DP) of each bucket of n (padded) elements
#   and saves every parameter piece (and each gap between them that lies before the unpadded end)
#   as a chunk of "optimizer.distributed.dp_group_idx_<g>.gbuf_idx_0.dtype_(torch.float32,
#   torch.float32).bucket_idx_<b>.<param | exp_avg | exp_avg_sq>" of global shape [unpadded size],
#   g the model-parallel rank t + T p; the gaps hold torch.empty's garbage (NaN here);
# - DP rank 0 saves the non-tensor state as ShardedObjects of that prefix: "optimizer"
#   (DistributedOptimizer.state_dict: the param groups with the step), "per_bucket_numel" and
#   "per_bucket_numel_unpadded" ([{(param dtype, grad dtype): [n per bucket]}] per buffer).
def chunk_layers(m, p, v):
    """The global layers of model chunk v of pipeline rank p (virtual pipeline stages, m["vp"]
    chunks per rank: Megatron's layer offset v L / V + p L / (P V))."""
    V = m.get("vp", 1)
    per = m["L"] // (PP * V)
    return range((v * PP + p) * per, (v * PP + p + 1) * per)


def stage_layers(m, p):
    return [layer for v in range(m.get("vp", 1)) for layer in chunk_layers(m, p, v)]


def megatron_params(m, t, p, v=0):
    """(Megatron name, our name, TP axis) of model-parallel rank (t, p)'s parameters in
    named_parameters() order (of its model chunk v: the embedding in chunk 0 of the first stage,
    the final norm and output layer in the last chunk of the last stage)."""
    V = m.get("vp", 1)
    first, last = p == 0 and v == 0, p == PP - 1 and v == V - 1
    out = []
    if first:
        out.append(("embedding.word_embeddings.weight", "embedding.word_embeddings.weight", 0))
        if m["pe"] == "learned_absolute":
            out.append(("embedding.position_embeddings.weight", "embedding.position_embeddings.weight", None))
    # Transformer Engine's TELayerNormColumnParallelLinear (layernorm_linear.py) registers
    # layer_norm_weight and layer_norm_bias before weight and bias: the layer's norms, fused into
    # linear_qkv and linear_fc1, come after linear_proj and at the head of the MLP.
    norms_fused = ("self_attention.linear_proj.weight", "self_attention.linear_proj.bias",
                   "input_layernorm.weight", "input_layernorm.bias")
    norms_own = norms_fused[2:] + norms_fused[:2]
    layers = chunk_layers(m, p, v)
    for layer in layers:
        for sub in (norms_fused if m["te"] else norms_own) + (
                "self_attention.linear_qkv.weight", "self_attention.linear_qkv.bias",
                "pre_mlp_layernorm.weight", "pre_mlp_layernorm.bias",
                "mlp.linear_fc1.weight", "mlp.linear_fc1.bias", "mlp.linear_fc2.weight", "mlp.linear_fc2.bias"):
            name = "decoder.layers.%d.%s" % (layer - layers[0], sub)
            ours = "decoder.layers.%d.%s" % (layer, sub)
            if ours.endswith(".bias") and not m["bias"] and "layernorm" not in sub:
                continue
            if "layernorm.bias" in sub and m["norm"] != "LayerNorm":
                continue
            out.append((name, ours, tp_axis(sub)))
    if last:
        out.append(("decoder.final_layernorm.weight", "decoder.final_layernorm.weight", None))
        if m["norm"] == "LayerNorm":
            out.append(("decoder.final_layernorm.bias", "decoder.final_layernorm.bias", None))
        if m["untied"]:
            out.append(("output_layer.weight", "output_layer.weight", 0))
        elif PP > 1:  # the last stage's copy of the tied embedding: its own state, equal
            out.append(("output_layer.weight", "embedding.word_embeddings.weight", 0))
    return out


def lay_out_buckets(params, divisor, shared, bucket_size=None):
    """_ParamAndGradBuffer.__init__'s buckets of `params` [(Megatron name, local numel, payload)]
    in registration order: [(numel_unpadded, numel, [(start in bucket, *payload, local numel)])],
    laid out in reverse, `shared(name)` in a bucket of its own, and with a bucket_size a bucket
    closed after the parameter that takes it to bucket_size elements or more."""
    def pad(x, d):
        return (x + d - 1) // d * d

    buckets, current, bucket_start, start, end = [], [], 0, 0, 0

    def close(end):
        buckets.append((end - bucket_start, pad(end, divisor) - bucket_start, current))
        return pad(end, divisor)

    for name, numel, payload in reversed(params):
        start = pad(start, 64)
        if shared(name) and current:
            start = bucket_start = close(start)
            current = []
        current.append((start - bucket_start,) + tuple(payload) + (numel,))
        end = start + numel
        if shared(name) or (bucket_size is not None and end - bucket_start >= bucket_size):
            start = bucket_start = close(end)
            current = []
        else:
            start = end
    if current:
        close(end)
    return buckets


def dp_reshardable_buckets(m, t, p, v=0):
    """[(numel_unpadded, numel, [(start in bucket, our name, TP axis, local numel)])] of the
    buffer of rank (t, p)'s model chunk v, as _ParamAndGradBuffer.__init__ lays it out
    (bucket_size None)."""
    DP = m["dp"]
    divisor = DP * 128 // __import__("math").gcd(DP, 128)
    tied_pp = not m["untied"] and PP > 1
    V = m.get("vp", 1)

    def shared(name):
        return tied_pp and ((p == 0 and v == 0 and name == "embedding.word_embeddings.weight") or
                            (p == PP - 1 and v == V - 1 and name == "output_layer.weight"))

    # --overlap-grad-reduce's buckets (m["bucket"] elements): DistributedDataParallel turns
    # bucketing off on every pipeline stage but the first and for every model chunk but the first
    # (training.py's disable_bucketing=(model_chunk_idx > 0)).
    bucket = m.get("bucket") if p == 0 and v == 0 else None
    return lay_out_buckets([(name, WEIGHTS_NUMEL[ours] // (TP if axis is not None else 1), (ours, axis))
                            for name, ours, axis in megatron_params(m, t, p, v)], divisor, shared, bucket)


def local_flat(full, axis, t):
    if axis is None:
        return full.reshape(-1)
    n = full.shape[axis] // TP
    return full.narrow(axis, t * n, n).contiguous().reshape(-1)


def dp_reshardable_items(m, state, t, p, d):
    """Rank (t, p, d)'s pieces of its distributed optimizer's buckets: with virtual pipeline
    stages one optimizer over the rank's model chunks, chunk v's buffer gbuf_idx_<v>
    (DistributedOptimizer chains per_model_buffers in chunk order), and the ShardedObjects list one
    entry per buffer."""
    g = t + TP * p
    prefix = "optimizer.distributed.dp_group_idx_%d." % g
    dtype = (torch.float32, torch.float32)
    shards, objects = [], []
    V = m.get("vp", 1)  # the BERT and T5 writers lay out one chunk (their buckets take no v)
    per_chunk = [dp_reshardable_buckets(m, t, p, v) for v in range(V)] if V > 1 else [dp_reshardable_buckets(m, t, p)]
    for v, buckets in enumerate(per_chunk):
        shards += buffer_shards(m, state, t, d, prefix + "gbuf_idx_%d.dtype_%s." % (v, str(dtype)), buckets)
    if d == 0:
        group = {"wd_mult": 1.0, "lr_mult": 1.0, "is_expert_parallel": False, "is_decoupled_lr": False,
                 "lr": 3e-3, "bias_correction": True, "betas": (0.9, 0.999), "eps": 1e-8,
                 "weight_decay": 0.1, "amsgrad": False, "step": OPTIMIZER_STEP}
        objects.append((prefix + "optimizer/shard_0_1",
                        {"param_groups": [group, dict(group, wd_mult=0.0, weight_decay=0.0)]}))
        objects.append((prefix + "per_bucket_numel/shard_0_1",
                        [{dtype: [n for _, n, _ in buckets]} for buckets in per_chunk]))
        objects.append((prefix + "per_bucket_numel_unpadded/shard_0_1",
                        [{dtype: [u for u, _, _ in buckets]} for buckets in per_chunk]))
    return shards, objects


def buffer_shards(m, state, t, d, key_prefix, buckets):
    """DP rank d's chunks of one gradient buffer's buckets (keys key_prefix + "bucket_idx_<b>.<kind>")."""
    DP = m["dp"]
    shards = []
    for b, (unpadded, numel, params) in enumerate(buckets):
        local = numel // DP
        lo, hi = d * local, (d + 1) * local
        pieces = []  # (gbuf_local_start, gbuf_local_end, {key: tensor})
        for start, ours, axis, n in params:
            s, e = max(start, lo), min(start + n, hi)
            if s >= e:
                continue
            pieces.append((s - lo, e - lo, {k: local_flat(state[k][ours], axis, t)[s - start:e - start].clone()
                                            for k in ("param", "exp_avg", "exp_avg_sq")}))
        assert pieces, "empty bucket encountered"
        # Megatron's padding: the gaps before the unpadded end, as chunks of garbage.
        full = []
        for i in range(-1, len(pieces)):
            if i >= 0:
                full.append(pieces[i])
            end = 0 if i == -1 else pieces[i][1]
            nxt = local if i == len(pieces) - 1 else pieces[i + 1][0]
            if nxt != end and d * local + end < unpadded:
                full.append((end, nxt, {k: torch.full((nxt - end,), float("nan"))
                                        for k in ("param", "exp_avg", "exp_avg_sq")}))
        key = key_prefix + "bucket_idx_%d." % b
        for s, e, tensors in full:
            for k in ("param", "exp_avg", "exp_avg_sq"):
                shards.append(Shard(key + k, [unpadded], [d * local + s], tensors[k]))
    return shards


def torch_save_bytes(obj):
    b = io.BytesIO()
    torch.save(obj, b)
    return b.getvalue()


def args_namespace(m):
    hd = m["H"] // m["heads"]
    return argparse.Namespace(
        num_layers=m["L"], hidden_size=m["H"], ffn_hidden_size=m["ffn"], num_attention_heads=m["heads"],
        kv_channels=hd, group_query_attention=m["groups"] != m["heads"], num_query_groups=m["groups"],
        seq_length=SEQ, max_position_embeddings=SEQ, padded_vocab_size=padded_vocab(TP),
        make_vocab_size_divisible_by=DIVISOR, tensor_model_parallel_size=TP,
        pipeline_model_parallel_size=PP, virtual_pipeline_model_parallel_size=m.get("vp"),
        num_layers_per_virtual_pipeline_stage=m["L"] // (PP * m["vp"]) if m.get("vp") else None,
        data_parallel_size=m.get("dp", 1), swiglu=m["swiglu"], normalization=m["norm"], layernorm_epsilon=1e-5,
        add_bias_linear=m["bias"], add_qkv_bias=m["bias"], untie_embeddings_and_output_weights=m["untied"],
        position_embedding_type=m["pe"], rotary_percent=1.0, rotary_base=10000, openai_gelu=False,
        apply_layernorm_1p=False, transformer_impl="transformer_engine" if m["te"] else "local",
        hidden_dropout=0.0, attention_dropout=0.0, fp16=False, bf16=False, params_dtype=torch.float32,
        tokenizer_type="NullTokenizer", vocab_size=VOCAB, consumed_train_samples=ITERATION * 8,
        consumed_valid_samples=0, seed=1234, micro_batch_size=2, global_batch_size=8, train_iters=20,
        lr=3e-3, min_lr=3e-4, lr_decay_style="cosine", weight_decay=0.1, optimizer="adam",
        use_distributed_optimizer=bool(m.get("optimizer")), ckpt_format="torch_dist", iteration=ITERATION,
        overlap_grad_reduce=False, ddp_bucket_size=None, dist_ckpt_optim_fully_reshardable=False)


def write_checkpoint(folder, m, w, opt=None, evil=None, args=None):
    """folder/iter_0000007/ as Megatron's save_checkpoint leaves it, and the tracker (`args`: values
    that replace those of args_namespace)."""
    it = os.path.join(folder, "iter_%07d" % ITERATION)
    os.makedirs(it, exist_ok=True)
    state_md, storage = {}, {}
    DP = m.get("dp", 1)
    for p, d, t in [(p, d, t) for p in range(PP) for d in range(DP) for t in range(TP)]:
        rank = t + TP * (d + DP * p)  # Megatron's order: TP fastest, then DP, then PP
        shards, objects = rank_shards(m, w, opt, t, p, d)
        items = [("t", s) for s in shards] + [("b", o) for o in objects]
        files = [bytearray(), bytearray()]  # thread_count = 2: __<rank>_0, __<rank>_1
        for i, (kind, x) in enumerate(items):
            f = i % 2
            name = f"__{rank}_{f}.distcp"
            offset = len(files[f])
            if kind == "t":
                files[f] += torch_save_bytes(x.data)
                md = state_md.setdefault(x.key, TensorStorageMetadata(
                    TensorProperties(x.data.dtype), torch.Size(x.global_shape), []))
                md.chunks.append(ChunkStorageMetadata(torch.Size(x.offsets), torch.Size(x.data.shape)))
                index = MetadataIndex(x.key, x.offsets, len(md.chunks) - 1)
            else:
                files[f] += torch_save_bytes([x[1]])  # _mcore_to_torch_sharded_object
                state_md[x[0]] = BytesStorageMetadata()
                index = MetadataIndex(x[0])
            storage[index] = _StorageInfo(name, offset, len(files[f]) - offset)
        for f in range(2):
            with open(os.path.join(it, f"__{rank}_{f}.distcp"), "wb") as out:
                out.write(bytes(files[f]))
    if evil == "offset":  # one item past the end of its file
        k = next(k for k in storage if k.fqn == "decoder.final_layernorm.weight")
        storage[k] = _StorageInfo(storage[k].relative_path, storage[k].offset, 10 ** 7)
    if evil == "shape":
        state_md["decoder.final_layernorm.weight"].size = torch.Size([1 << 40, 1 << 40])
    if evil == "overlap":  # a second chunk over the first's rows
        md = state_md["embedding.word_embeddings.weight"]
        md.chunks[1] = ChunkStorageMetadata(torch.Size([8, 0]), md.chunks[1].sizes)
    if evil == "missing":  # TP rank 1's half of a layer's QKV
        md = state_md["decoder.layers.self_attention.linear_qkv.weight"]
        md.chunks = [c for c in md.chunks if not (c.offsets[0] == 1 and c.offsets[1] > 0)]
    meta = Metadata(state_md, planner_data={}, storage_data=storage,
                    storage_meta=StorageMeta(checkpoint_id=it, save_id="0"), version="1.0.0")
    with open(os.path.join(it, ".metadata"), "wb") as f:
        pickle.dump(meta, f)
    namespace = args_namespace(m)
    for k, v in (args or {}).items():
        setattr(namespace, k, v)
    common = {"args": namespace, "checkpoint_version": 3.0, "iteration": ITERATION,
              "opt_param_scheduler": {"max_lr": 3e-3, "min_lr": 3e-4, "lr_warmup_steps": 0,
                                      "num_steps": ITERATION * 8, "lr_decay_steps": 160,
                                      "lr_decay_style": "cosine", "start_wd": 0.1, "end_wd": 0.1},
              "num_floating_point_operations_so_far": 0.0}
    if isinstance(opt, tuple):  # everything else of it is in ShardedObjects
        common["optimizer"] = {"param_state_sharding_type": "dp_reshardable"}
    elif opt is not None:  # the distributed optimizer's common part (DistributedOptimizer.state_dict)
        group = {"wd_mult": 1.0, "lr_mult": 1.0, "is_expert_parallel": False, "is_decoupled_lr": False,
                 "lr": 3e-3, "bias_correction": True, "betas": (0.9, 0.999), "eps": 1e-8,
                 "weight_decay": 0.1, "amsgrad": False, "step": OPTIMIZER_STEP}
        common["optimizer"] = {"optimizer": {"param_groups": [group, dict(group, wd_mult=0.0, weight_decay=0.0)]},
                               "param_state": {}, "param_state_sharding_type": "fully_reshardable"}
    torch.save(common, os.path.join(it, "common.pt"))
    with open(os.path.join(it, "metadata.json"), "w") as f:  # serialization.save_config
        json.dump({"sharded_backend": "torch_dist", "sharded_backend_version": 1,
                   "common_backend": "torch", "common_backend_version": 1}, f)
    with open(os.path.join(folder, "latest_checkpointed_iteration.txt"), "w") as f:
        f.write(str(ITERATION))
    return it


def write_reference(folder, m, w, opt=None):
    """config.json and weights.bin of the merged weights for gpt_reference.py (our names), and with
    optimizer state optimizer.bin: its kinds in optimizer.json's order, each over the names of
    config.json's "params" in order, float32."""
    os.makedirs(folder, exist_ok=True)
    names = sorted(w)
    if opt is not None:
        kinds = ["param", "exp_avg", "exp_avg_sq"]
        with open(os.path.join(folder, "optimizer.json"), "w") as f:
            json.dump({"kinds": kinds, "step": OPTIMIZER_STEP}, f)
        np.concatenate([opt[k][n].numpy().ravel() for k in kinds for n in names]).astype(np.float32).tofile(
            os.path.join(folder, "optimizer.bin"))
    cfg = {"num_layers": m["L"], "hidden_size": m["H"], "num_attention_heads": m["heads"],
           "kv_channels": m["H"] // m["heads"], "num_query_groups": m["groups"], "ffn_hidden_size": m["ffn"],
           "layernorm_epsilon": 1e-5, "apply_layernorm_1p": False, "position_embedding_type": m["pe"],
           # Megatron's default --bias-gelu-fusion runs GeLU through bias_gelu_impl, the tanh form
           "normalization": m["norm"],
           "activation": "swiglu" if m["swiglu"] else "gelu_tanh" if m["bias"] else "gelu",
           "attention_mask_type": "causal", "window_left": -1, "window_right": -1, "rotary_percent": 1.0,
           "rotary_base": 10000, "rotary_interleaved": False, "qk_layernorm": False,
           "padded_vocab_size": padded_vocab(TP)}
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump({"model": cfg, "params": [{"name": n, "shape": list(w[n].shape)} for n in names],
                   "grad_scale": 1.0, "has_attention_start": False, "has_padding_mask": False}, f)
    np.concatenate([w[n].numpy().ravel() for n in names]).astype(np.float32).tofile(
        os.path.join(folder, "weights.bin"))


class _Evil:
    def __init__(self, fn, arg):
        self.fn, self.arg = fn, arg

    def __reduce__(self):
        return (self.fn, (self.arg,))


def make(out):
    for i, (name, m) in enumerate(MODELS.items()):
        w = full_weights(m, 100 + i)
        opt = optimizer_state(m, w, 200 + i) if m.get("optimizer") else None
        write_checkpoint(os.path.join(out, name), m, w, opt)
        write_reference(os.path.join(out, name + ".ref"), m, w, opt)
    m = MODELS["gpt2"]
    w = full_weights(m, 100)
    for evil in ("offset", "shape", "overlap", "missing"):
        write_checkpoint(os.path.join(out, "evil_" + evil), m, w, None, evil)
    marker = os.path.join(out, "marker")
    for evil, fn, arg in (("system", os.system, "touch " + marker),
                          ("eval", eval, "open(%r, 'w')" % marker)):
        it = write_checkpoint(os.path.join(out, "evil_" + evil), m, w)
        with open(os.path.join(it, ".metadata"), "rb") as f:
            meta = pickle.load(f)
        meta.planner_data = {"x": _Evil(fn, arg)}
        with open(os.path.join(it, ".metadata"), "wb") as f:
            pickle.dump(meta, f)
    # gpt2 with the distributed optimizer's default format, dp_reshardable: the same state.
    WEIGHTS_NUMEL.update({n: t.numel() for n, t in w.items()})
    dp = ("dp_reshardable", optimizer_state(m, w, 200))
    write_checkpoint(os.path.join(out, "dp_reshardable"), m, w, dp)
    # Buckets whose layout the args contradict (--overlap-grad-reduce with small buckets would
    # have made several): refused.
    write_checkpoint(os.path.join(out, "dp_reshardable_overlap"), m, w, dp,
                     args={"overlap_grad_reduce": True, "ddp_bucket_size": 4096})
    # The same model with Transformer Engine's modules: their names, _extra_state objects and
    # parameter order in the buffer (the same bucket sizes, other places).
    write_checkpoint(os.path.join(out, "dp_reshardable_te"), dict(m, te=True), w, dp)
    # The same saved with 2 virtual pipeline stages per rank (one layer each): one optimizer over
    # the rank's two model chunks, a gradient buffer per chunk (gbuf_idx_0, gbuf_idx_1), the
    # embedding in chunk 0 of stage 0 and the tied copy in chunk 1 of stage 1 in buckets of their own.
    write_checkpoint(os.path.join(out, "dp_reshardable_vpp"), dict(m, vp=2), w, dp)
    # And with --overlap-grad-reduce and 1024-element buckets: only chunk 0 of stage 0 is bucketed.
    write_checkpoint(os.path.join(out, "dp_reshardable_vpp_buckets"), dict(m, vp=2, bucket=1024), w, dp,
                     args={"overlap_grad_reduce": True, "ddp_bucket_size": 1024})
    # The norms of a local run under their module names (earlier builds of megatron.cpp), and a
    # folder holding one norm under both names (refused).
    write_checkpoint(os.path.join(out, "gpt2_unfused"), dict(m, unfused=True), w, optimizer_state(m, w, 200))
    global rank_shards
    fused_shards = rank_shards

    def both_names(m_, w_, opt_, t, p, d):
        shards, objects = fused_shards(m_, w_, opt_, t, p, d)
        unfused = fused_shards(dict(m_, unfused=True), w_, opt_, t, p, d)[0]
        return shards + [x for x in unfused if ".input_layernorm." in x.key], objects
    rank_shards = both_names
    write_checkpoint(os.path.join(out, "gpt2_both_names"), m, w)
    rank_shards = fused_shards
    # The same checkpoint from another sharded backend: refused by name.
    zarr = os.path.join(out, "zarr")
    shutil.copytree(os.path.join(out, "gpt2"), zarr)
    with open(os.path.join(zarr, "iter_%07d" % ITERATION, "metadata.json"), "w") as f:
        json.dump({"sharded_backend": "zarr", "sharded_backend_version": 1,
                   "common_backend": "torch", "common_backend_version": 1}, f)


def same_tensors(it, fixture_it):
    """Reads both iteration folders with read_torch_dist.py's independent reader and asserts the same
    globals, tensor keys, global shapes, dtypes and values (bit for bit); returns both readings
    (meta, globals, tensors, objects)."""
    import read_torch_dist as r
    got, want = r.read(it), r.read(fixture_it)
    assert got[1] == want[1], ("globals differ", sorted(got[1] ^ want[1]))
    tensors, ftensors = got[2], want[2]
    assert set(tensors) == set(ftensors), ("keys differ", sorted(set(tensors) ^ set(ftensors)))
    for k, t in ftensors.items():
        g = tensors[k]
        assert g.dtype == t.dtype and g.shape == t.shape, (k, g.dtype, g.shape, t.dtype, t.shape)
        assert torch.equal(g, t), k + ": values differ"
    return got, want


def cli(doc, make, check):
    """A fixture writer's commands: "make OUT" and "check ITER_DIR FIXTURE_ITER_DIR"."""
    if len(sys.argv) == 3 and sys.argv[1] == "make":
        os.makedirs(sys.argv[2], exist_ok=True)
        make(sys.argv[2])
    elif len(sys.argv) == 4 and sys.argv[1] == "check":
        check(sys.argv[2], sys.argv[3])
    else:
        sys.exit(doc)


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "make":
        os.makedirs(sys.argv[2], exist_ok=True)
        make(sys.argv[2])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
