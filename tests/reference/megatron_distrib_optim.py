"""Megatron-LM's distributed optimizer in --ckpt-format torch checkpoints, written and checked by
Debian's torch as an independent reference for training/torch_distrib_optim.h.

What Megatron-LM writes (megatron/training/checkpointing.py save_checkpoint: each rank's
model_optim_rng.pt, and optimizer.save_parameter_state(<its folder>/distrib_optim.pt)):
  model_optim_rng.pt   "optimizer" is DistributedOptimizer.state_dict(): {"optimizer":
                       {"param_groups": [...]}} (the torch optimizer's state dict without "state",
                       each group without "params", the step in each group), "grad_scaler" with
                       fp16; the args record use_distributed_optimizer, data_parallel_size,
                       overlap_grad_reduce and ddp_bucket_size.
  distrib_optim.pt     written by data-parallel rank 0 of each TP x PP rank:
                       get_parameter_state_dp_zero() = {"buckets_coalesced": True,
                       gbuf_idx: {(param_dtype, grad_dtype): {"param", "exp_avg", "exp_avg_sq":
                       float32 tensors of the gradient buffer's unpadded elements (its buckets'
                       unpadded parts one after the other), "numel_unpadded": int}}}
The gradient buffer (megatron/core/distributed/param_and_grad_buffer.py, _ParamAndGradBuffer):
the parameters of module.parameters() in reverse, each start padded to a multiple of 64
elements (_pad_start_of_param_if_needed), a bucket closed when it reaches bucket_size
(DistributedDataParallel: max(4e7, 1e6 DP) or --ddp-bucket-size with --overlap-grad-reduce, none
without it or on a pipeline stage after the first), a shared_embedding parameter (the tied word
embedding of a pipelined model, on the first and the last stage) in a bucket of its own, each
bucket's end padded to lcm(DP, 128) (_pad_end_of_bucket_if_needed); the gaps hold zeros in the
saved tensors (the local shards are torch.zeros before the parameters' ranges are copied in).

  megatron_distrib_optim.py make OUT
      OUT/<variant>/ for each variant (see VARIANTS): megatron/ (the checkpoint), reference.safetensors
      and reference.json as megatron_checkpoint.py writes them (single-rank model, exp_avg,
      exp_avg_sq, fp32_param tensors and the step)
  megatron_distrib_optim.py check DIR ITER T P DTYPE REF IMPL
      loads a checkpoint we wrote: every rank's model_optim_rng.pt into the module trees
      (strict), its optimizer entry as DistributedOptimizer.state_dict's structure, and its
      distrib_optim.pt: keys, the dtype key, each tensor's size against the buffer rebuilt here
      from the module tree and the args, and every parameter's slice against REF's (our name ->
      single-rank tensor) shard; prints one JSON line per rank, or raises
"""
import collections
import json
import math
import os
import struct
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import megatron_checkpoint as mc  # noqa: E402  (Megatron-Core's module trees, the .pt writer)

KINDS = ("param", "exp_avg", "exp_avg_sq")


def buffer_layout(module, dp, bucket_size, shared):
    """_ParamAndGradBuffer's layout: [(bucket unpadded numel, [(param, start in bucket)])]."""
    params = [q for q in module.parameters() if q.requires_grad]
    buckets, cur = [], []
    param_start = bucket_start = 0
    divisor = math.lcm(dp, 128)

    def close(end):
        nonlocal bucket_start, cur
        buckets.append((end - bucket_start, cur))
        bucket_end = (end + divisor - 1) // divisor * divisor
        bucket_start, cur = bucket_end, []
        return bucket_end

    param_end = 0
    for q in params[::-1]:
        param_start = (param_start + 63) // 64 * 64
        if shared(q) and cur:
            param_start = close(param_start)
        param_end = param_start + q.numel()
        cur.append((q, param_start - bucket_start))
        if (bucket_size is not None and param_end - bucket_start >= bucket_size) or shared(q):
            param_start = close(param_end)
        else:
            param_start = param_end
    if cur:
        close(param_end)
    return buckets


def grad_dtype_of(args):
    """DistributedDataParallel's grad dtype: fp32 with accumulate_allreduce_grads_in_fp32, which
    validate_args turns on for bf16 unless --grad-reduce-in-bf16."""
    fp32 = getattr(args, "accumulate_allreduce_grads_in_fp32", False) or (
        args.params_dtype == torch.bfloat16 and not getattr(args, "grad_reduce_in_bf16", False))
    return torch.float32 if fp32 else args.params_dtype


def bucket_sizes(layout, divisor):
    """Each bucket's padded size: from its start to its end padded to lcm(DP, 128)."""
    sizes = []
    start = 0
    for n, _ in layout:
        end = (start + n + divisor - 1) // divisor * divisor
        sizes.append(end - start)
        start = end
    return sizes


def settings(args, p):
    dp = args.data_parallel_size
    bucket_size = None
    if getattr(args, "overlap_grad_reduce", False) and p == 0:
        bucket_size = args.ddp_bucket_size or max(40000000, 1000000 * dp)
    return dp, bucket_size


def shared_fn(stage, p, pp, untied):
    """LanguageModule.setup_embeddings_and_output_layer: shared_embedding on the tied weight of a
    pipelined model (the first stage's embedding, the last stage's output layer)."""
    if untied or pp == 1:
        return lambda q: False
    mod = stage.module
    tagged = set()
    if p == 0 and hasattr(mod, "embedding"):
        tagged.add(id(mod.embedding.word_embeddings.weight))
    if p == pp - 1 and hasattr(mod, "output_layer") and "weight" in dict(mod.output_layer.named_parameters()):
        tagged.add(id(mod.output_layer.weight))
    return lambda q: id(q) in tagged


def full_of(state, q, kind, t, tp):
    ours = q._ours if q._ours else "embedding.word_embeddings.weight"  # the last stage's tied copy
    return mc.shard(state[kind][ours], mc.split_dim(ours), t, tp)


def make_variant(out, name, scheme, tp, pp, dtype_name, dp, bucket_size, per_bucket=False, iteration=7):
    dtype = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[dtype_name]
    w, full_state = mc.make_variant(out, name, scheme, 3, tp, pp, 1, dtype_name, "adam", True,
                                    iteration=iteration)
    state = {k: {ours: kinds[k if k != "param" else "fp32_param"] for ours, kinds in full_state.items()}
             for k in KINDS}
    if dtype == torch.float32:  # FP32: the main parameter is the model's own
        state["param"] = {ours: v.clone() for ours, v in w.items()}
    folder = os.path.join(out, name, "megatron", "iter_%07d" % iteration)
    for p in range(pp):
        for t in range(tp):
            rank_dir = "mp_rank_%02d" % t if pp == 1 else "mp_rank_%02d_%03d" % (t, p)
            path = os.path.join(folder, rank_dir, "model_optim_rng.pt")
            sd = torch.load(path, map_location="cpu", weights_only=False)
            a = sd["args"]
            a.data_parallel_size = dp
            a.transformer_impl = "transformer_engine" if scheme == "core-te" else "local"
            a.overlap_grad_reduce = bucket_size is not None
            a.ddp_bucket_size = bucket_size
            a.world_size = tp * pp * dp
            # DistributedOptimizer.state_dict(): no "state", no "params", the step in each group.
            old = sd["optimizer"]["optimizer"] if dtype != torch.float32 else sd["optimizer"]
            groups = []
            for g in old["param_groups"]:
                g = {k: v for k, v in g.items() if k != "params"}
                g["step"] = iteration
                groups.append(g)
            sd["optimizer"] = {"optimizer": {"param_groups": groups}}
            if dtype == torch.float16:
                sd["optimizer"]["grad_scaler"] = {"scale": torch.tensor([512.0]), "growth_tracker": 3,
                                                  "hysteresis_tracker": 2}
            torch.save(sd, path)
            stage = mc.Stage(scheme, w, t, tp, p, pp, 0, 1, 3, False)
            dp_, bs = settings(a, p)
            layout = buffer_layout(stage.module, dp_, bs, shared_fn(stage, p, pp, False))
            numel = sum(n for n, _ in layout)
            world = {k: torch.zeros(numel, dtype=torch.float32) for k in KINDS}
            offset = 0
            for n, slots in layout:
                for q, start in slots:
                    for k in KINDS:
                        world[k][offset + start:offset + start + q.numel()] = \
                            full_of(state, q, k, t, tp).float().reshape(-1)
                offset += n
            world["numel_unpadded"] = numel
            key = (dtype, grad_dtype_of(a))
            if per_bucket:  # releases before buckets_coalesced: a list of padded buckets per state
                divisor = math.lcm(dp_, 128)
                padded = bucket_sizes(layout, divisor)
                lists, offset = {k: [] for k in KINDS}, 0
                for (n, _), size in zip(layout, padded):
                    for k in KINDS:  # torch.empty's garbage past the unpadded elements
                        t_ = torch.full((size,), float("nan"))
                        t_[:n] = world[k][offset:offset + n]
                        lists[k].append(t_)
                    offset += n
                saved = {"per_bucket_numel": {0: {key: padded}},
                         "per_bucket_numel_unpadded": {0: {key: [n for n, _ in layout]}}, 0: {key: lists}}
            else:
                saved = {"buckets_coalesced": True, 0: {key: world}}
            torch.save(saved, os.path.join(folder, rank_dir, "distrib_optim.pt"))
    with open(os.path.join(out, name, "reference.json")) as f:
        ref = json.load(f)
    ref.update({"dp": dp, "bucket_size": bucket_size})
    with open(os.path.join(out, name, "reference.json"), "w") as f:
        json.dump(ref, f)


VARIANTS = [
    # name, module tree (--transformer-impl local / transformer_engine), TP, PP, dtype, DP,
    # --ddp-bucket-size with --overlap-grad-reduce (None: off), the per-bucket form of earlier
    # releases
    ("dense_dp2_bf16", "core", 1, 1, "bf16", 2, None),
    ("dense_tp2pp2_dp2_fp32", "core", 2, 2, "fp32", 2, 3000),
    ("dense_te_pp2_dp2_fp16", "core-te", 1, 2, "fp16", 2, 5000),
    ("dense_per_bucket_tp2_dp2_bf16", "core", 2, 1, "bf16", 2, 3000, True),
]


def make(out):
    os.makedirs(out, exist_ok=True)
    mc.write_fake_modules(out)
    for v in VARIANTS:
        make_variant(out, *v)


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        blob = f.read()
    codes = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "I64": torch.int64,
             "F64": torch.float64}
    out = {}
    for k, v in header.items():
        if k == "__metadata__":
            continue
        s, e = v["data_offsets"]
        t = torch.frombuffer(bytearray(blob[s:e]) or bytearray(1), dtype=codes[v["dtype"]])
        out[k] = t[: math.prod(v["shape"])].reshape(v["shape"]) if e > s else torch.zeros(v["shape"])
    return out


def check(folder, iteration, tp, pp, dtype_name, ref_path, impl):
    tp, pp, iteration = int(tp), int(pp), int(iteration)
    dtype = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[dtype_name]
    ref = read_safetensors(ref_path)  # our name -> single-rank tensor, "<kind>/<name>"
    import tempfile
    fake = tempfile.mkdtemp()
    mc.write_fake_modules(fake)  # Megatron's enums in the args
    sys.path.insert(0, os.path.join(fake, "fake_modules"))
    for p in range(pp):
        for t in range(tp):
            rank_dir = "mp_rank_%02d" % t if pp == 1 else "mp_rank_%02d_%03d" % (t, p)
            base = os.path.join(folder, "iter_%07d" % iteration, rank_dir)
            sd = torch.load(os.path.join(base, "model_optim_rng.pt"), map_location="cpu", weights_only=False)
            a = sd["args"]
            mc.L, mc.H, mc.HEADS, mc.SEQ = a.num_layers, a.hidden_size, a.num_attention_heads, a.max_position_embeddings
            mc.FFN, mc.HEAD_DIM = a.ffn_hidden_size, a.kv_channels
            untied = bool(getattr(a, "untie_embeddings_and_output_weights", False))
            zero = mc.full_weights(dtype, seed=0, vocab_rows=a.padded_vocab_size, untied=untied)
            stage = mc.Stage("core-te" if impl == "transformer_engine" else "core", zero, t, tp, p, pp, 0, 1, 3, untied)
            assert a.transformer_impl == impl, a.transformer_impl
            stage.module.load_state_dict(sd["model"], strict=True)
            assert a.use_distributed_optimizer is True
            opt = sd["optimizer"]
            assert set(opt) <= {"optimizer", "grad_scaler"}, sorted(opt)
            assert set(opt["optimizer"]) == {"param_groups"}, sorted(opt["optimizer"])
            steps = {g["step"] for g in opt["optimizer"]["param_groups"]}
            assert all("params" not in g for g in opt["optimizer"]["param_groups"])
            dp, bs = settings(a, p)
            layout = buffer_layout(stage.module, dp, bs, shared_fn(stage, p, pp, untied))
            st = torch.load(os.path.join(base, "distrib_optim.pt"), map_location="cpu", weights_only=False)
            assert set(st) == {"buckets_coalesced", 0} and st["buckets_coalesced"] is True, sorted(map(str, st))
            (key, world), = st[0].items()
            assert key == (a.params_dtype, grad_dtype_of(a)), key
            numel = sum(n for n, _ in layout)
            assert world["numel_unpadded"] == numel, (world["numel_unpadded"], numel)
            assert set(world) == set(KINDS) | {"numel_unpadded"}
            for k in KINDS:
                assert world[k].dtype == torch.float32 and world[k].shape == (numel,), (k, world[k].shape)
            covered = torch.zeros(numel, dtype=torch.bool)
            offset, checked = 0, 0
            for n, slots in layout:
                for q, start in slots:
                    ours = q._ours if q._ours else "embedding.word_embeddings.weight"
                    for k in KINDS:
                        rk = ("fp32_param" if dtype != torch.float32 else "model") if k == "param" else k
                        want = mc.shard(ref[rk + "/" + ours], mc.split_dim(ours), t, tp).float().reshape(-1)
                        got = world[k][offset + start:offset + start + q.numel()]
                        assert torch.equal(got, want), (rank_dir, k, ours)
                    covered[offset + start:offset + start + q.numel()] = True
                    checked += 1
                offset += n
            for k in KINDS:
                assert torch.all(world[k][~covered] == 0), (rank_dir, k, "gaps not zero")
            print(json.dumps({"rank": rank_dir, "buckets": [n for n, _ in layout], "numel": numel,
                              "params": checked, "steps": sorted(steps)}))


def main():
    if sys.argv[1] == "make":
        make(sys.argv[2])
    elif sys.argv[1] == "check":
        check(*sys.argv[2:9])
    else:
        raise SystemExit("unknown command " + sys.argv[1])


if __name__ == "__main__":
    main()
