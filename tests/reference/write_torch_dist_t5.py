#!/usr/bin/env python3
"""A Megatron-LM T5 checkpoint in --ckpt-format torch_dist, written by Debian's torch in the
structure Megatron-Core's dist_checkpointing gives T5Model (megatron/core/models/T5/t5_model.py:
its sharded_state_dict is LanguageModule's, MegatronModule's default walk over named_children;
transformer_block.py for each block's layer axis), with the DCP stand-ins and file writer of
write_torch_dist.py and the T5 model (t5_spec.py's local layer spec, relative position bias, output
layer tied to the word embedding) of megatron_t5_checkpoint.py:

  embedding.word_embeddings.weight       [padded vocab, h], TP chunks along the rows
  {encoder,decoder}_relative_pos_emb.relative_attention_bias.weight   [buckets, heads] replicated
                                         (a plain torch Embedding: TP rank 0 writes it)
  encoder.layers.<module>.<param>        the encoder block's layers, axis 0 of encoder_num_layers;
                                         input_layernorm and pre_mlp_layernorm keyed by the local
                                         spec's sharded_state_dict_keys_map (self_attention.
                                         linear_qkv.layer_norm_*, mlp.linear_fc1.layer_norm_*), in
                                         both blocks
  decoder.layers.<module>.<param>        the decoder block's, axis 0 of decoder_num_layers, with
                                         pre_cross_attn_layernorm (replicated, not mapped) and
                                         cross_attention.{linear_q, linear_kv} (TP chunks along the
                                         rows) and cross_attention.linear_proj (along the columns)
  {encoder,decoder}.final_layernorm.*    replicated
  lm_head.output_layer.bias              [padded vocab], TP chunks (ColumnParallelLinear's bias);
                                         T5Model's self.output_layer is the same module, which
                                         MegatronModule's named_children walk yields only once
  *._extra_state/shard_<l>_<L>           the local modules' (None) ShardedObjects, per layer

  write_torch_dist_t5.py make OUT   OUT/t5/ saved as TP2 (PP1) would save it, OUT/t5.ref/ (config.json's
      params with our names and shapes, weights.bin of the merged weights), and OUT/t5_dp/ and
      OUT/t5_dp_te/: the same model saved by TP2 x DP2 with the distributed optimizer's default
      dp_reshardable state (the flat buckets of each rank's gradient buffer, laid out from
      T5Model's module tree with Megatron-Core's local and Transformer Engine modules:
      torch_dist_tree_buckets.py; the TE variant under the fused norms' keys), with
      OUT/t5_dp.ref/ (the state merged: optimizer.json and optimizer.bin as
      write_torch_dist.write_reference writes them).
  write_torch_dist_t5.py check ITER_DIR FIXTURE_ITER_DIR   reads both with read_torch_dist.py's
      independent reader: the globals, every tensor key, global shape, dtype and value (bit for
      bit), the ShardedObjects' keys, and common.pt's iteration and args. Prints "ok" or fails.
"""
import json
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import megatron_t5_checkpoint as t5c  # noqa: E402
import torch_dist_tree_buckets as tdb  # noqa: E402
import write_torch_dist as wtd  # noqa: E402

T5 = dict(L=t5c.ENC_L, H=t5c.H, heads=t5c.HEADS, groups=t5c.HEADS, ffn=t5c.FFN, swiglu=False, norm="LayerNorm",
          bias=True, untied=False, pe="relative", te=False)
LOCAL_MODULES = ("self_attention.linear_proj", "self_attention.linear_qkv", "mlp.linear_fc1", "mlp.linear_fc2")
CROSS_MODULES = ("cross_attention.linear_proj", "cross_attention.linear_q", "cross_attention.linear_kv")


def weights():
    """The merged weights under Megatron-Core's names, which are ours for T5 (the head's output
    layer under our name output_layer.*)."""
    return dict(t5c.full_weights("relative", False, 500))


def t5_rank_shards(m, w, opt, t, p, d):
    assert p == 0
    out, objects = [], []
    T = wtd.TP
    if opt is not None:  # ("dp_reshardable", state): the flat buckets of the gradient buffer
        out, objects = wtd.dp_reshardable_items(m, opt[1], t, p, d)

    def add(key, full, axis, layer=None, layers=None):
        if axis is None:
            if t != 0:
                return
            off, piece = 0, full
        else:
            n = full.shape[axis] // T
            off, piece = t * n, full.narrow(axis, t * n, n)
        offsets = [0] * full.dim()
        if axis is not None:
            offsets[axis] = off
        data = piece.contiguous().clone()
        if layer is None:
            out.append(wtd.Shard(key, full.shape, offsets, data))
        else:
            out.append(wtd.Shard(key, [layers] + list(full.shape), [layer] + offsets, data.unsqueeze(0)))

    if d != 0:
        return out, objects
    for name, full in w.items():
        axis = t5c.split_dim(name)
        for side, layers in (("encoder", t5c.ENC_L), ("decoder", t5c.DEC_L)):
            lp = side + ".layers."
            if name.startswith(lp):
                layer, sub = name[len(lp):].split(".", 1)
                add(lp + wtd.megatron_key(m, sub), full, axis, int(layer), layers)
                break
        else:
            if name == "output_layer.bias":
                add("lm_head.output_layer.bias", full, 0)
            else:
                add(name, full, axis)
    if t == 0:
        for side, layers in (("encoder", t5c.ENC_L), ("decoder", t5c.DEC_L)):
            mods = LOCAL_MODULES + (CROSS_MODULES if side == "decoder" else ())
            for layer in range(layers):
                for mod in mods:
                    objects.append((f"{side}.layers.{mod}._extra_state/shard_{layer}_{layers}", None))
        objects.append(("lm_head.output_layer._extra_state/shard_0_1", None))
    objects.append((f"rng_state/shard_{p}.{t}_{wtd.PP}.{wtd.TP}",
                    {"random_rng_state": (3, tuple(range(4)), None), "np_rng_state": None}))
    return out, objects


def t5_args():
    """pretrain_t5.py's arguments over write_torch_dist's (num_layers: the encoder's depth)."""
    return dict(encoder_num_layers=t5c.ENC_L, decoder_num_layers=t5c.DEC_L, seq_length=t5c.SE,
                encoder_seq_length=t5c.SE, decoder_seq_length=t5c.SD, max_position_embeddings=t5c.SE,
                relative_attention_num_buckets=t5c.BUCKETS, relative_attention_max_distance=t5c.MAX_DISTANCE,
                padded_vocab_size=t5c.PADDED, make_vocab_size_divisible_by=t5c.DIVISOR,
                vocab_extra_ids=t5c.EXTRA_IDS, vocab_size=t5c.VOCAB, bias_gelu_fusion=True,
                micro_batch_size=2, global_batch_size=4, consumed_train_samples=wtd.ITERATION * 4,
                mask_prob=0.15, short_seq_prob=0.1, lr=1e-3, min_lr=1e-4, lr_decay_style="linear",
                use_distributed_optimizer=False)


def make(out):
    wtd.TP, wtd.PP = 2, 1
    w = weights()
    wtd.rank_shards = t5_rank_shards
    wtd.write_checkpoint(os.path.join(out, "t5"), T5, w, None, args=t5_args())
    # The same with the distributed optimizer's dp_reshardable state, saved by DP 2, in the order
    # of T5Model's parameters with the local and the Transformer Engine modules.
    state = wtd.optimizer_state(T5, w, 502)
    for name, te in (("t5_dp", False), ("t5_dp_te", True)):
        wtd.dp_reshardable_buckets = lambda m, t, p: tdb.tree_buckets(
            tdb.t5_module(w, "te" if m["te"] else "local", "relative", False, t, wtd.TP)[0], m["dp"], lambda q: False,
            t5c.split_dim)
        wtd.write_checkpoint(os.path.join(out, name), dict(T5, dp=2, te=te), w, ("dp_reshardable", state),
                             args=dict(t5_args(), use_distributed_optimizer=True))
    wtd.write_reference(os.path.join(out, "t5_dp.ref"), T5, w, state)
    ref = os.path.join(out, "t5.ref")
    os.makedirs(ref, exist_ok=True)
    names = sorted(w)
    with open(os.path.join(ref, "config.json"), "w") as f:
        json.dump({"params": [{"name": n, "shape": list(w[n].shape)} for n in names]}, f)
    np.concatenate([w[n].numpy().ravel() for n in names]).astype(np.float32).tofile(os.path.join(ref, "weights.bin"))


def check(it, fixture_it):
    (_, _, tensors, objects), (_, _, _, fobjects) = wtd.same_tensors(it, fixture_it)
    want_objects = {k for k in fobjects if not k.startswith("rng_state/")}
    got_objects = {k for k in objects if not k.startswith("rng_state/")}
    assert got_objects == want_objects, ("objects differ", sorted(got_objects ^ want_objects))
    common = torch.load(os.path.join(it, "common.pt"), weights_only=False)
    a = common["args"]
    assert common["iteration"] == wtd.ITERATION and common["checkpoint_version"] == 3.0, common
    assert a.num_layers == t5c.ENC_L and a.decoder_num_layers == t5c.DEC_L and a.hidden_size == t5c.H, a
    print("ok: %d tensor keys, %d bytes items" % (len(tensors), len(objects)))


if __name__ == "__main__":
    wtd.cli(__doc__, make, check)
