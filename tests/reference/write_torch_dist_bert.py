#!/usr/bin/env python3
"""A Megatron-LM BERT checkpoint in --ckpt-format torch_dist, written by Debian's torch in the
structure Megatron-Core's dist_checkpointing gives BertModel (megatron/core/models/bert/
bert_model.py, bert_lm_head.py, pooler.py; the default sharded_state_dict of MegatronModule and
LanguageModule), with the DCP stand-ins and file writer of write_torch_dist.py:

  embedding.word_embeddings.weight       [padded vocab, h], TP chunks along the rows
  embedding.position_embeddings.weight   replicated (TP rank 0 writes it)
  embedding.tokentype_embeddings.weight  [2, h] replicated (num_tokentypes 2 with the binary head)
  encoder.layers.<module>.<param>        the TransformerBlock's layers under one key per module,
                                         the global layer index as axis 0, TP chunks as GPT's; the
                                         norms keyed by bert_layer_local_spec's sharded_state_dict_
                                         keys_map (self_attention.linear_qkv.layer_norm_*,
                                         mlp.linear_fc1.layer_norm_*)
  encoder.final_layernorm.{weight,bias}  replicated
  lm_head.dense.{weight,bias}, lm_head.layer_norm.{weight,bias}   replicated (get_linear_layer and
                                         a norm: no sharded_state_dict of their own)
  output_layer.bias                      [padded vocab], TP chunks (ColumnParallelLinear's bias);
                                         the tied output_layer.weight is not written
  pooler.dense.{weight,bias}, binary_head.{weight,bias}   replicated

  write_torch_dist_bert.py make OUT   OUT/bert/ (vocabulary 107, padded to 128) saved as TP2 x PP2
      would save it,
      OUT/bert.ref/ (config.json with our names and shapes, weights.bin of the merged weights), and
      OUT/bert_dp/ and OUT/bert_dp_te/: the same model saved by TP2 x PP2 x DP2 with the
      distributed optimizer's default dp_reshardable state (the flat buckets of each rank's
      gradient buffer, laid out from BertModel's module tree with Megatron-Core's local and
      Transformer Engine modules: torch_dist_tree_buckets.py), with OUT/bert_dp.ref/ (the state
      merged, optimizer.json and optimizer.bin as write_torch_dist.write_reference writes them).
  write_torch_dist_bert.py check ITER_DIR FIXTURE_ITER_DIR   reads ITER_DIR with read_torch_dist.py's
      independent reader and compares it with the fixture's: the classes and globals of .metadata
      and their fields, every tensor key, global shape, dtype and value (bit for bit), common.pt's
      iteration and args, and the RNG states. Prints "ok" or fails with what differs.
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import megatron_checkpoint as mc  # noqa: E402
import torch_dist_tree_buckets as tdb  # noqa: E402
import write_torch_dist as wtd  # noqa: E402

BERT = dict(L=4, H=32, heads=4, groups=4, ffn=128, swiglu=False, norm="LayerNorm", bias=True, untied=False,
            pe="learned_absolute", te=False)
_gpt_rank_shards = wtd.rank_shards


def heads(m, seed):
    """BERT's own tensors under our names (Megatron-Core's names: the same)."""
    g = torch.Generator().manual_seed(seed)
    H, V = m["H"], wtd.padded_vocab(wtd.TP)

    def r(*shape, scale=0.1):
        return torch.randn(*shape, generator=g) * scale

    return {"embedding.tokentype_embeddings.weight": r(2, H, scale=0.2),
            "lm_head.dense.weight": r(H, H), "lm_head.dense.bias": r(H),
            "lm_head.layer_norm.weight": 1 + r(H), "lm_head.layer_norm.bias": r(H),
            "output_layer.bias": r(V), "pooler.dense.weight": r(H, H), "pooler.dense.bias": r(H),
            "binary_head.weight": r(2, H), "binary_head.bias": r(2)}


def bert_rank_shards(m, w, opt, t, p, d):
    """What rank (t, p, d) writes: the GPT layer stack's shards (write_torch_dist.rank_shards) with
    the block renamed to "encoder.", and the heads on the stages that hold them."""
    gpt = {("decoder." + n[len("encoder."):] if n.startswith("encoder.") else n): x for n, x in w.items()
           if n.startswith(("encoder.", "embedding.word_", "embedding.position_"))}
    out, objects = _gpt_rank_shards(m, gpt, opt, t, p, d)
    for s in out:
        if s.key.startswith("decoder."):
            s.key = "encoder." + s.key[len("decoder."):]
    objects = [("encoder." + k[len("decoder."):] if k.startswith("decoder.") else k, o) for k, o in objects]
    if d != 0:
        return out, objects
    V = wtd.padded_vocab(wtd.TP)
    names = ["embedding.tokentype_embeddings.weight"] if p == 0 else []
    if p == wtd.PP - 1:
        names += [n for n in w if n.startswith(("lm_head.", "pooler.", "binary_head.", "output_layer."))]
    for n in names:
        full = w[n]
        if n == "output_layer.bias":  # ColumnParallelLinear: TP chunks along the vocabulary
            k = V // wtd.TP
            out.append(wtd.Shard(n, full.shape, [t * k], full[t * k:(t + 1) * k].clone()))
        elif t == 0:  # replicated: TP rank 0's is the main replica
            out.append(wtd.Shard(n, full.shape, [0] * full.dim(), full.clone()))
    return out, objects


def make(out):
    m = BERT
    # The vocabulary of the BERT training tests (107 WordPiece tokens), padded to 128 under TP 2.
    wtd.VOCAB, wtd.DIVISOR = 107, 32
    w = {("encoder." + n[len("decoder."):] if n.startswith("decoder.") else n): x
         for n, x in wtd.full_weights(m, 300).items()}
    w.update(heads(m, 301))
    wtd.rank_shards = bert_rank_shards
    wtd.write_checkpoint(os.path.join(out, "bert"), m, w, None,
                         args={"bert_binary_head": True})
    wtd.write_reference(os.path.join(out, "bert.ref"), m, w)
    # The distributed optimizer's dp_reshardable buckets, saved by DP 2, in the order of
    # BertModel's parameters with the local and the Transformer Engine modules.
    state = wtd.optimizer_state(m, w, 302)
    for name, te in (("bert_dp", False), ("bert_dp_te", True)):
        mdp = dict(m, dp=2, te=te)
        wtd.dp_reshardable_buckets = lambda m_, t, p: dp_buckets(w, m_, t, p)
        wtd.write_checkpoint(os.path.join(out, name), mdp, w, ("dp_reshardable", state),
                             args={"bert_binary_head": True, "use_distributed_optimizer": True})
    wtd.write_reference(os.path.join(out, "bert_dp.ref"), m, w, state)


def dp_buckets(w, m, t, p):
    """The buckets of rank (t, p) from BertModel's module tree with the modules `m` names."""
    module, shared = tdb.bert_module(w, "core-te" if m["te"] else "core", t, wtd.TP, p, wtd.PP, m["untied"])
    return tdb.tree_buckets(module, m["dp"], shared, mc.split_dim)


def check(it, fixture_it):
    import read_torch_dist as r
    (meta, _, tensors, objects), (fmeta, _, _, _) = wtd.same_tensors(it, fixture_it)
    ours_fields, fixture_fields = {}, {}
    r.fields(meta, ours_fields)
    r.fields(fmeta, fixture_fields)
    assert ours_fields == fixture_fields, ("object fields differ", ours_fields, fixture_fields)
    common = torch.load(os.path.join(it, "common.pt"))
    assert common["iteration"] == wtd.ITERATION and common["checkpoint_version"] == 3.0, common
    assert common["args"].num_layers == BERT["L"] and common["args"].hidden_size == BERT["H"], common["args"]
    rng = [k for k in objects if k.startswith("rng_state/shard_")]
    assert rng and all(isinstance(objects[k], list) and "random_rng_state" in objects[k][0] for k in rng), rng
    print("ok: %d tensor keys, %d bytes items" % (len(tensors), len(objects)))


if __name__ == "__main__":
    wtd.cli(__doc__, make, check)
