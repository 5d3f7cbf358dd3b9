"""The distributed optimizer's dp_reshardable buckets (distrib_optimizer.py
sharded_param_state_dp_reshardable) of BERT and T5 models, laid out from Megatron-Core's module
trees: megatron_checkpoint.py's Stage (BertModel: embedding with tokentype_embeddings, encoder,
lm_head, output_layer, binary_head, pooler) and megatron_t5_checkpoint.py's build (T5Model:
embedding, relative position embeddings, encoder, decoder with cross-attention, lm_head), with
megatron_distrib_optim.py's _ParamAndGradBuffer layout over module.parameters() (reverse order,
64-element starts, the shared_embedding in a bucket of its own, lcm(DP, 128) bucket padding).

tree_buckets() gives the layout as write_torch_dist.dp_reshardable_items takes it (for the
fixtures); check_dp() reads a dp_reshardable checkpoint with read_torch_dist.py and checks its
buckets against the trees built from the model keys of the same folder: every bucket's size and
the per_bucket_numel objects, and each parameter's "param" slice equal to its saved weight shard
(an fp32 model's main weights are its weights) with exp_avg_sq >= 0 there.
"""
import math
import os
import re
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import megatron_checkpoint as mc  # noqa: E402
import megatron_distrib_optim as mdo  # noqa: E402
import megatron_t5_checkpoint as t5c  # noqa: E402

DTYPE = "dtype_(torch.float32, torch.float32)"


def tree_layout(module, dp, shared):
    """[(unpadded, padded, [(parameter, start)])] of one model-parallel rank's buffer."""
    layout = mdo.buffer_layout(module, dp, None, shared)
    sizes = mdo.bucket_sizes(layout, math.lcm(dp, 128))
    return [(n, padded, params) for (n, params), padded in zip(layout, sizes)]


def tree_buckets(module, dp, shared, split_dim):
    """The same as write_torch_dist.dp_reshardable_buckets gives it: (start, our name, TP axis,
    local numel); the last stage's tied copy under the word embedding's name."""
    out = []
    for n, padded, params in tree_layout(module, dp, shared):
        entries = []
        for q, start in params:
            ours = q._ours or "embedding.word_embeddings.weight"
            entries.append((start, ours, split_dim(ours), q.numel()))
        out.append((n, padded, entries))
    return out


def bert_module(w, scheme, t, tp, p, pp, untied):
    mc.L = sum(1 for n in w if n.startswith("encoder.layers.") and n.endswith(".input_layernorm.weight"))
    family = "bert" if "binary_head.weight" in w else "bert-nohead"
    stage = mc.Stage(scheme, w, t, tp, p, pp, 0, 1, 3, untied, family=family)
    return stage.module, mdo.shared_fn(stage, p, pp, untied)


def t5_module(w, spec, pos, untied, t, tp):
    t5c.ENC_L = sum(1 for n in w if n.startswith("encoder.layers.") and n.endswith(".input_layernorm.weight"))
    t5c.DEC_L = sum(1 for n in w if n.startswith("decoder.layers.") and n.endswith(".input_layernorm.weight"))
    t5c.TP = tp
    return t5c.build(w, spec, pos, untied, t), (lambda q: False)


FUSED = (("self_attention.linear_qkv.layer_norm_", "input_layernorm."),
         ("mlp.linear_fc1.layer_norm_", "pre_mlp_layernorm."))


def model_space(tensors):
    """Megatron's model keys -> our names: the layer axis split, fused norms and T5's
    lm_head.output_layer under our names."""
    w = {}
    for k, x in tensors.items():
        if k.startswith(("optimizer.", "rng_state")):
            continue
        if k.startswith("lm_head.output_layer."):
            k = k[len("lm_head."):]
        m = re.match(r"(encoder|decoder)\.layers\.(.+)$", k)
        if m is None:
            w[k] = x
            continue
        sub = m.group(2)
        for fused, ours in FUSED:
            if sub.startswith(fused):
                sub = ours + sub[len(fused):]
        for i in range(x.shape[0]):
            w["%s.layers.%d.%s" % (m.group(1), i, sub)] = x[i]
    return w


def check_dp(it):
    import read_torch_dist as r
    _, _, tensors, objects = r.read(it)
    a = torch.load(os.path.join(it, "common.pt"), weights_only=False)["args"]
    assert torch.load(os.path.join(it, "common.pt"), weights_only=False)["optimizer"][
        "param_state_sharding_type"] == "dp_reshardable"
    tp, pp, dp = a.tensor_model_parallel_size, a.pipeline_model_parallel_size, a.data_parallel_size
    te = getattr(a, "transformer_impl", "transformer_engine") != "local"
    untied = a.untie_embeddings_and_output_weights
    w = model_space(tensors)
    t5 = any(n.startswith("decoder.layers.") for n in w)
    checked = 0
    for p in range(pp):
        for t in range(tp):
            if t5:
                module, shared = t5_module(w, "te" if te else "local", a.position_embedding_type, untied, t, tp)
            else:
                module, shared = bert_module(w, "core-te" if te else "core", t, tp, p, pp, untied)
            layout = tree_layout(module, dp, shared)
            g = "optimizer.distributed.dp_group_idx_%d." % (t + tp * p)
            numel = objects[g + "per_bucket_numel/shard_0_1"][0]
            unpadded = objects[g + "per_bucket_numel_unpadded/shard_0_1"][0]
            assert list(numel[0].values())[0] == [b[1] for b in layout], (g, numel, [b[1] for b in layout])
            assert list(unpadded[0].values())[0] == [b[0] for b in layout], (g, unpadded, [b[0] for b in layout])
            keys = sorted(k for k in tensors if k.startswith(g))
            assert len(keys) == 3 * len(layout), (g, keys)
            for b, (n, _, params) in enumerate(layout):
                key = g + "gbuf_idx_0.%s.bucket_idx_%d." % (DTYPE, b)
                flat = {k: tensors[key + k] for k in ("param", "exp_avg", "exp_avg_sq")}
                assert tuple(flat["param"].shape) == (n,), (key, flat["param"].shape, n)
                for q, start in params:
                    got = flat["param"][start:start + q.numel()]
                    assert torch.equal(got, q.detach().reshape(-1)), (key, q._ours, start)
                    assert bool((flat["exp_avg_sq"][start:start + q.numel()] >= 0).all()), (key, q._ours)
                    checked += 1
    print("ok: %d parameter slices in the buckets of %d x %d ranks" % (checked, tp, pp))


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "check-dp":
        sys.exit(__doc__ + "\n  torch_dist_tree_buckets.py check-dp ITER_DIR")
    check_dp(sys.argv[2])
