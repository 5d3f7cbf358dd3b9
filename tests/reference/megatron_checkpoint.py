"""Megatron-LM torch checkpoints (iter_N/mp_rank_TT[_PPP]/model_optim_rng.pt) written and checked by
Debian's torch as an independent reference for training/torch_checkpoint.h.

The model modules below mirror Megatron-LM's module trees (registration order, hence state_dict
and named_parameters order, and Megatron's state_dict_for_save_checkpoint nesting):
  legacy   megatron/model: GPTModel > language_model > embedding, encoder (or the older
           "transformer" with "attention." names), word_embeddings (last stage copy)
  core     megatron/core GPTModel, local layer spec
  core-te  megatron/core GPTModel, Transformer Engine spec (fused norms, _extra_state)
and the same for BERT (family "bert", or "bert-nohead" for --bert-no-binary-head): legacy
megatron/model BertModel (language_model with tokentype embeddings and the pooler, lm_head with
its bias, dense and layernorm, binary_head) and Megatron-Core's BertModel (embedding with
tokentype_embeddings, encoder, lm_head (dense, layer_norm), output_layer with its bias,
binary_head, pooler) with, as variants, the LM heads of earlier Megatron-Core versions (the output
layer inside lm_head: lm_head.output_layer with its bias, or lm_head.bias first and
lm_head.output_layer without one; the norm named lm_head.layernorm),
and the optimizer is torch.optim.Adam over Megatron's parameter groups, wrapped as Megatron's
FP32Optimizer or Float16OptimizerWithFloat16Params state_dict.

  megatron_checkpoint.py make OUT          every variant under OUT/<name>/ (see VARIANTS): the
      Megatron folder megatron/, our-format weights for generation ours/ (one rank, model only) and
      reference.safetensors (single-rank tensors "model/<name>", "<kind>/<name>", "step") with
      reference.json (iteration, samples, schedule)
  megatron_checkpoint.py check DIR ITER T P V IMPL DTYPE [DIR ITER ...]
  megatron_checkpoint.py check-family DIR ITER T P V IMPL DTYPE FAMILY [DIR ...]
      loads every rank file of a checkpoint we wrote with torch.load into these modules
      (load_state_dict strict=True), its optimizer into torch.optim.Adam over Megatron's groups,
      its RNG state into random / numpy / torch; prints one JSON line per rank (or the problem)
"""
import argparse
import collections
import io
import json
import os
import random
import struct
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))

L, H, HEADS, SEQ, VOCAB, DIVISOR = 4, 32, 4, 32, 60, 16
if os.environ.get("MEGATRON_REFERENCE_TINY"):  # fuzzing seeds: the smallest files of each kind
    L, H, HEADS, SEQ, VOCAB, DIVISOR = 4, 8, 2, 4, 12, 4
FFN = 4 * H
HEAD_DIM = H // HEADS


def padded_vocab(tp):
    m = DIVISOR * tp
    return (VOCAB + m - 1) // m * m


# ---------------------------------------------------------------------------------------------
# Module trees


class Holder(torch.nn.Module):
    """A module whose parameters are registered in the given order; each remembers our name
    (`_ours`, "" for the last stage's tied copy of the word embedding)."""

    def __init__(self, params=()):
        super().__init__()
        for name, t, ours in params:
            prm = torch.nn.Parameter(t)
            prm._ours = ours
            self.register_parameter(name, prm)


class TE(Holder):
    """A Transformer Engine module: it saves extra state (older TE: an io.BytesIO)."""

    def get_extra_state(self):
        return io.BytesIO(b"fp8-meta")

    def set_extra_state(self, state):
        pass


class ParallelLinear(Holder):
    """Megatron-Core's ColumnParallelLinear / RowParallelLinear (local spec, and the output layer
    of every spec): get_extra_state returns None, so the state dict has an _extra_state of None."""

    def get_extra_state(self):
        return None

    def set_extra_state(self, state):
        pass


def shard(full, dim, t, tp):
    if dim is None or tp == 1:
        return full.clone()
    return torch.chunk(full, tp, dim=dim)[t].clone()


def qkv_shard_stored(qkv, t, tp, version):
    """Our [n, 3, d, h] QKV, TP shard t, in the layout checkpoint_version stores it."""
    s = shard(qkv, 0, t, tp)
    n = HEADS // tp
    tail = s.shape[1:]
    v = s.reshape(n, 3, HEAD_DIM, *tail)
    if version == 0:
        v = v.transpose(0, 1)
    elif version == 1:
        v = v.transpose(1, 2)
    return v.contiguous().reshape(s.shape)


def full_weights(dtype, seed, untied=False, vocab_rows=None, family="gpt"):
    vocab_rows = vocab_rows or padded_vocab(2)
    g = torch.Generator().manual_seed(seed)

    def r(*shape):
        return (torch.randn(*shape, generator=g) * 0.2).to(dtype)

    w = collections.OrderedDict()
    w["embedding.word_embeddings.weight"] = r(vocab_rows, H)
    w["embedding.position_embeddings.weight"] = r(SEQ, H)
    block = "encoder" if family.startswith("bert") else "decoder"
    if family == "bert":
        w["embedding.tokentype_embeddings.weight"] = r(2, H)
    for i in range(L):
        p = block + ".layers.%d." % i
        w[p + "input_layernorm.weight"] = (1 + r(H).float() * 0.1).to(dtype)
        w[p + "input_layernorm.bias"] = r(H)
        w[p + "self_attention.linear_qkv.weight"] = r(3 * H, H)
        w[p + "self_attention.linear_qkv.bias"] = r(3 * H)
        w[p + "self_attention.linear_proj.weight"] = r(H, H)
        w[p + "self_attention.linear_proj.bias"] = r(H)
        w[p + "pre_mlp_layernorm.weight"] = (1 + r(H).float() * 0.1).to(dtype)
        w[p + "pre_mlp_layernorm.bias"] = r(H)
        w[p + "mlp.linear_fc1.weight"] = r(FFN, H)
        w[p + "mlp.linear_fc1.bias"] = r(FFN)
        w[p + "mlp.linear_fc2.weight"] = r(H, FFN)
        w[p + "mlp.linear_fc2.bias"] = r(H)
    w[block + ".final_layernorm.weight"] = (1 + r(H).float() * 0.1).to(dtype)
    w[block + ".final_layernorm.bias"] = r(H)
    if block == "encoder":
        w["lm_head.dense.weight"] = r(H, H)
        w["lm_head.dense.bias"] = r(H)
        w["lm_head.layer_norm.weight"] = (1 + r(H).float() * 0.1).to(dtype)
        w["lm_head.layer_norm.bias"] = r(H)
    if untied:
        w["output_layer.weight"] = r(vocab_rows, H)
    if block == "encoder":
        w["output_layer.bias"] = r(vocab_rows)
        if family == "bert":
            w["binary_head.weight"] = r(2, H)
            w["binary_head.bias"] = r(2)
            w["pooler.dense.weight"] = r(H, H)
            w["pooler.dense.bias"] = r(H)
    return w


SPLIT = {"linear_qkv.weight": 0, "linear_qkv.bias": 0, "linear_fc1.weight": 0, "linear_fc1.bias": 0,
         "linear_proj.weight": 1, "linear_fc2.weight": 1, "word_embeddings.weight": 0,
         "output_layer.weight": 0, "output_layer.bias": 0}


def split_dim(name):
    for k, d in SPLIT.items():
        if name.endswith(k):
            return d
    return None


class Stage:
    """One TP x PP rank's model chunk: the Megatron module tree and our names of its params."""

    def __init__(self, scheme, w, t, tp, p, pp, c, vp, version, untied, family="gpt",
                 head_layout="final"):
        per_chunk = L // (pp * vp)
        first = (c * pp + p) * per_chunk
        pre = p == 0 and c == 0
        post = p == pp - 1 and c == vp - 1

        def get(name, stored=None):
            return stored if stored is not None else shard(w[name], split_dim(name), t, tp)

        def param(name, stored=None):
            return get(name, stored), name

        self.scheme = scheme

        def reg(holder_params):
            return [(local_name, tensor, ours) for local_name, (tensor, ours) in holder_params]

        block = "encoder" if family.startswith("bert") else "decoder"
        layers = []
        for i in range(first, first + per_chunk):
            p_ = block + ".layers.%d." % i
            qkv_w = param(p_ + "self_attention.linear_qkv.weight",
                          qkv_shard_stored(w[p_ + "self_attention.linear_qkv.weight"], t, tp, version)
                          if scheme == "legacy" else None)
            qkv_b = param(p_ + "self_attention.linear_qkv.bias",
                          qkv_shard_stored(w[p_ + "self_attention.linear_qkv.bias"], t, tp, version)
                          if scheme == "legacy" else None)
            if scheme == "legacy":
                layer = torch.nn.Module()
                layer.input_layernorm = Holder(reg([("weight", param(p_ + "input_layernorm.weight")),
                                                    ("bias", param(p_ + "input_layernorm.bias"))]))
                attn = torch.nn.Module()
                attn.query_key_value = Holder(reg([("weight", qkv_w), ("bias", qkv_b)]))
                attn.dense = Holder(reg([("weight", param(p_ + "self_attention.linear_proj.weight")),
                                         ("bias", param(p_ + "self_attention.linear_proj.bias"))]))
                setattr(layer, "attention" if version < 2 else "self_attention", attn)
                layer.post_attention_layernorm = Holder(reg([("weight", param(p_ + "pre_mlp_layernorm.weight")),
                                                             ("bias", param(p_ + "pre_mlp_layernorm.bias"))]))
                mlp = torch.nn.Module()
                mlp.dense_h_to_4h = Holder(reg([("weight", param(p_ + "mlp.linear_fc1.weight")),
                                                ("bias", param(p_ + "mlp.linear_fc1.bias"))]))
                mlp.dense_4h_to_h = Holder(reg([("weight", param(p_ + "mlp.linear_fc2.weight")),
                                                ("bias", param(p_ + "mlp.linear_fc2.bias"))]))
                layer.mlp = mlp
            elif scheme == "core":
                layer = torch.nn.Module()
                layer.input_layernorm = Holder(reg([("weight", param(p_ + "input_layernorm.weight")),
                                                    ("bias", param(p_ + "input_layernorm.bias"))]))
                attn = torch.nn.Module()
                attn.core_attention = Holder()
                attn.linear_proj = ParallelLinear(reg([("weight", param(p_ + "self_attention.linear_proj.weight")),
                                                       ("bias", param(p_ + "self_attention.linear_proj.bias"))]))
                attn.linear_qkv = ParallelLinear(reg([("weight", qkv_w), ("bias", qkv_b)]))
                layer.self_attention = attn
                layer.pre_mlp_layernorm = Holder(reg([("weight", param(p_ + "pre_mlp_layernorm.weight")),
                                                      ("bias", param(p_ + "pre_mlp_layernorm.bias"))]))
                mlp = torch.nn.Module()
                mlp.linear_fc1 = ParallelLinear(reg([("weight", param(p_ + "mlp.linear_fc1.weight")),
                                                     ("bias", param(p_ + "mlp.linear_fc1.bias"))]))
                mlp.linear_fc2 = ParallelLinear(reg([("weight", param(p_ + "mlp.linear_fc2.weight")),
                                                     ("bias", param(p_ + "mlp.linear_fc2.bias"))]))
                layer.mlp = mlp
            else:  # core-te
                layer = torch.nn.Module()
                layer.input_layernorm = torch.nn.Identity()
                attn = torch.nn.Module()
                attn.core_attention = TE()
                attn.linear_proj = TE(reg([("weight", param(p_ + "self_attention.linear_proj.weight")),
                                           ("bias", param(p_ + "self_attention.linear_proj.bias"))]))
                attn.linear_qkv = TE(reg([("layer_norm_weight", param(p_ + "input_layernorm.weight")),
                                          ("layer_norm_bias", param(p_ + "input_layernorm.bias")),
                                          ("weight", qkv_w), ("bias", qkv_b)]))
                layer.self_attention = attn
                layer.pre_mlp_layernorm = torch.nn.Identity()
                mlp = torch.nn.Module()
                mlp.linear_fc1 = TE(reg([("layer_norm_weight", param(p_ + "pre_mlp_layernorm.weight")),
                                         ("layer_norm_bias", param(p_ + "pre_mlp_layernorm.bias")),
                                         ("weight", param(p_ + "mlp.linear_fc1.weight")),
                                         ("bias", param(p_ + "mlp.linear_fc1.bias"))]))
                mlp.linear_fc2 = TE(reg([("weight", param(p_ + "mlp.linear_fc2.weight")),
                                         ("bias", param(p_ + "mlp.linear_fc2.bias"))]))
                layer.mlp = mlp
            layers.append(layer)

        emb = None
        if pre:
            emb = torch.nn.Module()
            emb.word_embeddings = Holder(reg([("weight", param("embedding.word_embeddings.weight"))]))
            emb.position_embeddings = Holder(reg([("weight", param("embedding.position_embeddings.weight"))]))
            if family == "bert":
                emb.tokentype_embeddings = Holder(reg([("weight", param("embedding.tokentype_embeddings.weight"))]))
        final = None
        if post:
            final = Holder(reg([("weight", param(block + ".final_layernorm.weight")),
                                ("bias", param(block + ".final_layernorm.bias"))]))
        head = None
        if post and (untied or not pre):
            name = "output_layer.weight" if untied else "embedding.word_embeddings.weight"
            cls = Holder if scheme == "legacy" else ParallelLinear
            head = cls([("weight", get(name), "output_layer.weight" if untied else "")])
        elif post and scheme != "legacy" and block == "decoder":
            # Megatron-Core's GPTModel builds the output layer on the last stage even when it
            # shares the word embedding's weight there (skip_weight_param_allocation).
            head = ParallelLinear()

        self.module = torch.nn.Module()
        if scheme == "legacy":
            lm = torch.nn.Module()
            if emb is not None:
                lm.embedding = emb
            enc = torch.nn.Module()
            enc.layers = torch.nn.ModuleList(layers)
            if final is not None:
                enc.final_layernorm = final
            self.stack_key = "transformer" if version < 2 else "encoder"
            setattr(lm, self.stack_key, enc)
            if head is not None and untied:
                lm.output_layer = head
            self.module.language_model = lm
            if head is not None and not untied:
                self.module.word_embeddings = head
        else:
            if emb is not None:
                self.module.embedding = emb
            dec = torch.nn.Module()
            dec.layers = torch.nn.ModuleList(layers)
            if final is not None:
                dec.final_layernorm = final
            setattr(self.module, block, dec)
            if head is not None and block == "decoder":
                self.module.output_layer = head
        self.emb, self.enc_final, self.head, self.untied = emb, final, head, untied
        self.lm = self.module.language_model if scheme == "legacy" else None
        self.family = family
        self.head_layout = head_layout
        if post and block == "encoder":  # BertModel's heads, in its registration order
            self.bert_heads(scheme, param, reg, head)

    def bert_heads(self, scheme, param, reg, head):
        """Megatron-Core BertModel: lm_head (dense, layer_norm), output_layer (a
        ColumnParallelLinear with a bias: its weight only when untied or on a later stage than the
        embedding), binary_head and pooler (plain linears). The legacy BertModel: the pooler inside
        language_model, lm_head with its own bias first, then dense and layernorm."""
        # Earlier Megatron-Core BertLMHeads (head_layout): "inner" keeps the output layer, with
        # its bias, inside the head (lm_head.output_layer.{weight,bias}, lm_head.layernorm);
        # "inner-bias" has the head's own bias first and an output layer without one
        # (lm_head.bias, lm_head.output_layer.weight, lm_head.layernorm).
        inner = scheme != "legacy" and self.head_layout != "final"
        lm_head = torch.nn.Module()
        bias = param("output_layer.bias")
        if scheme == "legacy" or self.head_layout == "inner-bias":
            lm_head.register_parameter("bias", torch.nn.Parameter(bias[0]))
            lm_head.bias._ours = bias[1]
        lm_head.dense = Holder(reg([("weight", param("lm_head.dense.weight")),
                                    ("bias", param("lm_head.dense.bias"))]))
        setattr(lm_head, "layernorm" if scheme == "legacy" or inner else "layer_norm",
                Holder(reg([("weight", param("lm_head.layer_norm.weight")),
                            ("bias", param("lm_head.layer_norm.bias"))])))
        self.module.lm_head = lm_head
        if scheme != "legacy":
            out = []
            if head is not None:
                hw = next(head.parameters())
                out.append(("weight", hw.detach().clone(), hw._ours))
            if self.head_layout != "inner-bias":
                out.append(("bias", bias[0], bias[1]))
            setattr(lm_head if inner else self.module, "output_layer", ParallelLinear(out))
        if self.family == "bert":
            pooler = torch.nn.Module()
            pooler.dense = Holder(reg([("weight", param("pooler.dense.weight")),
                                       ("bias", param("pooler.dense.bias"))]))
            if scheme == "legacy":
                self.lm.pooler = pooler
            self.module.binary_head = Holder(reg([("weight", param("binary_head.weight")),
                                                  ("bias", param("binary_head.bias"))]))
            if scheme != "legacy":
                self.module.pooler = pooler

    def state_dict_for_save_checkpoint(self):
        if self.scheme != "legacy":
            return self.module.state_dict()
        lm = self.lm
        d = {}
        if hasattr(lm, "embedding"):
            d["embedding"] = {k: getattr(lm.embedding, k).state_dict()
                              for k in ("word_embeddings", "position_embeddings", "tokentype_embeddings")
                              if hasattr(lm.embedding, k)}
        d[self.stack_key] = getattr(lm, self.stack_key).state_dict()
        if hasattr(lm, "pooler"):
            d["pooler"] = lm.pooler.state_dict()
        if hasattr(lm, "output_layer"):
            d["output_layer"] = lm.output_layer.state_dict()
        out = {"language_model": d}
        for k in ("lm_head", "binary_head"):
            if hasattr(self.module, k):
                out[k] = getattr(self.module, k).state_dict()
        if hasattr(self.module, "word_embeddings"):
            out["word_embeddings_for_head"] = self.module.word_embeddings.state_dict()
        return out


def param_groups(chunks, sort):
    """Megatron's get_param_groups: weight decay unless 1-D or a bias; keys in insertion order
    (older Megatron) or sorted with the default group first (Megatron-Core)."""
    groups = collections.OrderedDict()
    for m in chunks:
        for name, p in m.named_parameters():
            key = 0.0 if (p.dim() == 1 or name.endswith(".bias")) else 1.0
            groups.setdefault(key, []).append(p)
    keys = sorted(groups, reverse=True) if sort else list(groups)
    return [{"params": groups[k], "wd_mult": k, "lr_mult": 1.0, "weight_decay": 0.1 * k} for k in keys]


def make_variant(out, name, scheme, version, tp, pp, vp, dtype_name, optimizer="adam",
                 distributed=False, untied=False, family="gpt", head_layout="final", iteration=7):
    dtype = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[dtype_name]
    w = full_weights(dtype, seed=sum(name.encode()), untied=untied, family=family)
    root = os.path.join(out, name)
    folder = os.path.join(root, "megatron", "iter_%07d" % iteration)
    ref = collections.OrderedDict(("model/" + k, v) for k, v in w.items())
    g = torch.Generator().manual_seed(99)
    full_state = {}  # our name -> kind -> full tensor
    for k, v in w.items():
        full_state[k] = {
            "exp_avg": torch.randn(v.shape, generator=g) * 1e-3,
            "exp_avg_sq": torch.rand(v.shape, generator=g) * 1e-6,
            "fp32_param": v.float() + torch.randn(v.shape, generator=g) * 1e-4,
        }
    if optimizer:
        for k, kinds in full_state.items():
            for kind, v in kinds.items():
                if kind == "fp32_param" and dtype == torch.float32:
                    continue
                ref[kind + "/" + k] = v
        ref["step"] = torch.tensor(iteration, dtype=torch.int64)
    enums = None
    if scheme == "legacy":
        sys.path.insert(0, os.path.join(out, "fake_modules"))
        from megatron.model.enums import PositionEmbeddingType  # noqa
        enums = PositionEmbeddingType.absolute
    else:
        sys.path.insert(0, os.path.join(out, "fake_modules"))
        from megatron.core.transformer.enums import AttnBackend  # noqa
        enums = AttnBackend.auto
    for p in range(pp):
        for t in range(tp):
            stages = [Stage(scheme, w, t, tp, p, pp, c, vp, version, untied, family, head_layout)
                      for c in range(vp)]
            args = argparse.Namespace(
                num_layers=L, hidden_size=H, ffn_hidden_size=FFN, num_attention_heads=HEADS,
                kv_channels=HEAD_DIM, seq_length=SEQ, max_position_embeddings=SEQ,
                padded_vocab_size=padded_vocab(tp), make_vocab_size_divisible_by=DIVISOR,
                pipeline_model_parallel_size=pp,
                virtual_pipeline_model_parallel_size=vp if vp > 1 else None,
                consumed_train_samples=iteration * 8, consumed_valid_samples=16,
                fp16=dtype == torch.float16, bf16=dtype == torch.bfloat16, params_dtype=dtype,
                tokenizer_type="NullTokenizer", vocab_size=VOCAB, optimizer=optimizer or "adam",
                lr=3e-3, min_lr=3e-4, lr_decay_style="cosine", weight_decay=0.1, adam_beta1=0.9,
                adam_beta2=0.95, adam_eps=1e-8, seed=1234, micro_batch_size=2, global_batch_size=8,
                train_iters=20, untie_embeddings_and_output_weights=untied, swiglu=False,
                add_bias_linear=True, normalization="LayerNorm", layernorm_epsilon=1e-5,
                hidden_dropout=0.0, attention_dropout=0.0, openai_gelu=False, bias_gelu_fusion=True,
                use_distributed_optimizer=distributed, data_path=["corpus"], split="90,10,0",
                loss_scale=None, initial_loss_scale=2.0 ** 16, group_query_attention=False,
                num_query_groups=1, iteration=iteration, data_parallel_size=1)
            if family.startswith("bert"):  # pretrain_bert.py's arguments
                args.bert_binary_head = family == "bert"
                args.tokenizer_type = "BertWordPieceLowerCase"
            if version >= 3:
                args.tensor_model_parallel_size = tp
            else:
                args.model_parallel_size = tp
            if scheme == "legacy":
                args.position_embedding_type = enums
            else:
                args.position_embedding_type = "learned_absolute"
                args.attention_backend = enums
            sd = {"args": args, "checkpoint_version": float(version) if version else 0, "iteration": iteration}
            if vp == 1:
                sd["model"] = stages[0].state_dict_for_save_checkpoint()
            else:
                for c in range(vp):
                    sd["model%d" % c] = stages[c].state_dict_for_save_checkpoint()
            if version == 0:
                del sd["checkpoint_version"]  # the oldest checkpoints have none
            if optimizer:
                modules = [s.module for s in stages]
                fp16 = dtype != torch.float32
                groups = param_groups(modules, sort=(scheme != "legacy"))
                main_groups = [[(prm, prm._ours) for prm in grp["params"]] for grp in groups]

                def state_of(prm, n, kind, tensor_shard_of):
                    name = n if n else "embedding.word_embeddings.weight"  # the tied copy
                    return tensor_shard_of(full_state[name][kind], name)

                def shard_of(full, name):
                    return shard(full, split_dim(name), t, tp)

                opt_params = []
                for mains in main_groups:
                    lst = []
                    for prm, n in mains:
                        lst.append(torch.nn.Parameter(state_of(prm, n, "fp32_param", shard_of)) if fp16 else prm)
                    opt_params.append(lst)
                opt = torch.optim.Adam([dict(grp, params=lst) for grp, lst in zip(groups, opt_params)],
                                       lr=3e-3, betas=(0.9, 0.95))
                for mains, lst in zip(main_groups, opt_params):
                    for (prm, n), q in zip(mains, lst):
                        opt.state[q] = {"step": torch.tensor(float(iteration)),
                                        "exp_avg": state_of(prm, n, "exp_avg", shard_of),
                                        "exp_avg_sq": state_of(prm, n, "exp_avg_sq", shard_of)}
                inner = opt.state_dict()
                if distributed:
                    inner = {"param_groups": inner["param_groups"]}
                if fp16:
                    o = {"optimizer": inner, "fp32_from_fp16_params": [list(l) for l in opt_params]}
                    if dtype == torch.float16:
                        o["grad_scaler"] = {"scale": torch.tensor([512.0]), "growth_tracker": 3,
                                            "hysteresis_tracker": 2}
                    sd["optimizer"] = o
                else:
                    sd["optimizer"] = inner
                sd["opt_param_scheduler"] = {"max_lr": 3e-3, "lr_warmup_steps": 16, "num_steps": iteration * 8,
                                             "lr_decay_style": "cosine", "lr_decay_steps": 160,
                                             "min_lr": 3e-4, "start_wd": 0.1, "end_wd": 0.1,
                                             "wd_incr_style": "constant", "wd_incr_steps": 160}
            random.seed(1234 + 100 * p)
            np.random.seed(1234 + 100 * p)
            torch.manual_seed(1234 + 100 * p)
            sd["rng_state"] = [{"random_rng_state": random.getstate(), "np_rng_state": np.random.get_state(),
                                "torch_rng_state": torch.get_rng_state(),
                                "cuda_rng_state": torch.zeros(16, dtype=torch.uint8),
                                "rng_tracker_states": {"model-parallel-rng": torch.zeros(16, dtype=torch.uint8)}}]
            rank_dir = "mp_rank_%02d" % t if pp == 1 else "mp_rank_%02d_%03d" % (t, p)
            os.makedirs(os.path.join(folder, rank_dir), exist_ok=True)
            torch.save(sd, os.path.join(folder, rank_dir, "model_optim_rng.pt"))
    with open(os.path.join(root, "megatron", "latest_checkpointed_iteration.txt"), "w") as f:
        f.write(str(iteration))
    # The same weights in our format, for generation (one rank, model tensors only).
    ours_dir = os.path.join(root, "ours", "iter_%07d" % iteration, "mp_rank_00")
    os.makedirs(ours_dir, exist_ok=True)
    write_safetensors(os.path.join(ours_dir, "model.safetensors"), w)
    with open(os.path.join(root, "ours", "latest_checkpointed_iteration.txt"), "w") as f:
        f.write(str(iteration))
    write_safetensors(os.path.join(root, "reference.safetensors"), ref)
    with open(os.path.join(root, "reference.json"), "w") as f:
        json.dump({"iteration": iteration, "consumed_train_samples": iteration * 8,
                   "consumed_valid_samples": 16, "max_lr": 3e-3, "lr_warmup_steps": 16,
                   "num_steps": iteration * 8, "tp": tp, "pp": pp, "vp": vp,
                   "grad_scale": 512.0 if dtype == torch.float16 and optimizer else None}, f)
    return w, full_state


def write_safetensors(path, tensors):
    codes = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16", torch.int64: "I64"}
    header, blobs, offset = {}, [], 0
    for k, v in tensors.items():
        v = v.detach().contiguous()
        raw = v.view(torch.uint8).numpy().tobytes() if v.dim() > 0 else v.reshape(1).view(torch.uint8).numpy().tobytes()
        header[k] = {"dtype": codes[v.dtype], "shape": list(v.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def write_fake_modules(out):
    """Megatron's enum modules, so that the arguments pickle as Megatron's do."""
    base = os.path.join(out, "fake_modules", "megatron")
    for sub in ["", "model", "core", "core/transformer"]:
        os.makedirs(os.path.join(base, sub), exist_ok=True)
        open(os.path.join(base, sub, "__init__.py"), "w").close()
    with open(os.path.join(base, "model", "enums.py"), "w") as f:
        f.write("import enum\nclass PositionEmbeddingType(enum.Enum):\n    rotary = 1\n    absolute = 2\n")
    with open(os.path.join(base, "core", "transformer", "enums.py"), "w") as f:
        f.write("import enum\nclass AttnBackend(enum.Enum):\n    flash = 1\n    fused = 2\n"
                "    unfused = 3\n    local = 4\n    auto = 5\n")


VARIANTS = [
    # name, scheme, checkpoint_version, TP, PP, VP, dtype, optimizer, distributed, untied,
    # family, BERT's LM head layout
    ("legacy_v0_tp2_fp16", "legacy", 0, 2, 1, 1, "fp16", "adam", False, False),
    ("legacy_v1_pp2_fp32", "legacy", 1, 1, 2, 1, "fp32", "adam", False, False),
    ("legacy_v2_tp2pp2_bf16", "legacy", 2, 2, 2, 1, "bf16", "adam", False, False),
    ("legacy_v3_tp2pp2_fp16", "legacy", 3, 2, 2, 1, "fp16", "adam", False, False),
    ("core_tp2pp2_bf16", "core", 3, 2, 2, 1, "bf16", "adam", False, False),
    ("core_te_tp2pp2_fp32", "core-te", 3, 2, 2, 1, "fp32", "adam", False, False),
    ("core_pp2_vp2_fp16", "core", 3, 1, 2, 2, "fp16", "adam", False, False),
    ("core_distributed_tp2", "core", 3, 2, 1, 1, "bf16", "adam", True, False),
    ("core_no_optimizer_untied", "core", 3, 2, 2, 1, "fp32", None, False, True),
    ("bert_core_te_tp2pp2_fp32", "core-te", 3, 2, 2, 1, "fp32", "adam", False, False, "bert"),
    ("bert_core_pp2_bf16_nohead_untied", "core", 3, 1, 2, 1, "bf16", "adam", False, True, "bert-nohead"),
    ("bert_legacy_v3_tp2pp2_fp16", "legacy", 3, 2, 2, 1, "fp16", "adam", False, False, "bert"),
    ("bert_core_inner_head_tp2pp2_fp32", "core", 3, 2, 2, 1, "fp32", "adam", False, False, "bert",
     "inner"),
    ("bert_core_inner_bias_nohead_untied_tp2_bf16", "core", 3, 2, 1, 1, "bf16", "adam", False, True,
     "bert-nohead", "inner-bias"),
]


def make(out):
    os.makedirs(out, exist_ok=True)
    write_fake_modules(out)
    names = sys.argv[3:] if len(sys.argv) > 3 else None
    for v in VARIANTS:
        if names is None or v[0] in names:
            make_variant(out, *v)


# ---------------------------------------------------------------------------------------------
# Checking what we write


def check(folder, iteration, tp, pp, vp, impl, dtype_name, family="gpt"):
    tp, pp, vp, iteration = int(tp), int(pp), int(vp), int(iteration)
    dtype = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[dtype_name]
    scheme = "core-te" if impl == "transformer_engine" else "core"
    results = []
    for p in range(pp):
        for t in range(tp):
            rank_dir = "mp_rank_%02d" % t if pp == 1 else "mp_rank_%02d_%03d" % (t, p)
            path = os.path.join(folder, "iter_%07d" % iteration, rank_dir, "model_optim_rng.pt")
            sd = torch.load(path, map_location="cpu")
            a = sd["args"]
            global L, H, HEADS, SEQ, FFN, HEAD_DIM
            L, H, HEADS, SEQ = a.num_layers, a.hidden_size, a.num_attention_heads, a.max_position_embeddings
            FFN, HEAD_DIM = a.ffn_hidden_size, a.kv_channels
            untied = bool(getattr(a, "untie_embeddings_and_output_weights", False))
            zero = full_weights(dtype, seed=0, vocab_rows=a.padded_vocab_size, untied=untied, family=family)
            res = {"folder": folder, "rank": rank_dir, "keys": sorted(k for k in sd.keys())}
            stages = [Stage(scheme, zero, t, tp, p, pp, c, vp, 3, untied, family) for c in range(vp)]
            for c, s in enumerate(stages):
                key = "model" if vp == 1 else "model%d" % c
                s.module.load_state_dict(sd[key], strict=True)  # Megatron's names and shapes
                res["params_%d" % c] = sum(1 for _ in s.module.parameters())
            res["args"] = {k: getattr(a, k, None) for k in [
                "num_layers", "hidden_size", "num_attention_heads", "ffn_hidden_size", "kv_channels",
                "tensor_model_parallel_size", "pipeline_model_parallel_size",
                "virtual_pipeline_model_parallel_size", "padded_vocab_size", "iteration",
                "consumed_train_samples", "add_position_embedding", "swiglu", "add_bias_linear",
                "untie_embeddings_and_output_weights", "tokenizer_type", "transformer_impl"]}
            res["params_dtype"] = str(a.params_dtype)
            res["bert_binary_head"] = getattr(a, "bert_binary_head", None)
            res["param_names_%d" % 0] = [n for n, _ in stages[0].module.named_parameters()]
            res["checkpoint_version"] = sd["checkpoint_version"]
            res["iteration"] = sd["iteration"]
            if getattr(a, "use_distributed_optimizer", False):  # megatron_distrib_optim.py checks it
                res["distributed_optimizer"] = sorted(sd["optimizer"])
            elif "optimizer" in sd:
                modules = [s.module for s in stages]
                groups = param_groups(modules, sort=True)
                fp16 = dtype != torch.float32
                osd = sd["optimizer"]["optimizer"] if fp16 else sd["optimizer"]
                params = [[torch.nn.Parameter(q.detach().float().clone()) for q in g["params"]] if fp16
                          else g["params"] for g in groups]
                # Group sizes and parameter ids as Megatron's (torch's Optimizer.load_state_dict
                # checks); each state's shapes.
                assert [len(g["params"]) for g in osd["param_groups"]] == [len(ps) for ps in params]
                ids = [i for g in osd["param_groups"] for i in g["params"]]
                for i, q in zip(ids, [q for ps in params for q in ps]):
                    st = osd["state"][i]
                    assert st["exp_avg"].shape == q.shape and st["exp_avg_sq"].shape == q.shape
                if impl == "transformer_engine":
                    te_fused_adam_accepts(osd)
                if fp16:
                    mains = sd["optimizer"]["fp32_from_fp16_params"]
                    assert [len(m) for m in mains] == [len(ps) for ps in params]
                    for m, ps in zip(mains, params):
                        for x, q in zip(m, ps):
                            assert x.shape == q.shape and x.dtype == torch.float32
                res["groups"] = [len(g["params"]) for g in osd["param_groups"]]
                res["steps"] = sorted({float(s["step"]) for s in osd["state"].values() if "step" in s} |
                                      {float(g["step"]) for g in osd["param_groups"] if "step" in g})
                res["step_per"] = ("group" if all("step" in g for g in osd["param_groups"]) else "") + \
                                  ("param" if all("step" in s for s in osd["state"].values()) else "")
                if impl != "transformer_engine":  # torch's AdamW loads and steps from this state
                    opt = torch.optim.AdamW([dict(g, params=ps) for g, ps in zip(groups, params)], lr=1.0)
                    opt.load_state_dict(osd)
                    for g, ps in zip(opt.param_groups, params):
                        for q in ps:
                            q.grad = torch.zeros_like(q)
                    opt.step()
                res["scheduler"] = sd["opt_param_scheduler"]
            rs = sd["rng_state"][0]
            random.setstate(rs["random_rng_state"])
            np.random.set_state(rs["np_rng_state"])
            torch.set_rng_state(rs["torch_rng_state"])
            seed = 1234 + 100 * p
            random.seed(seed)
            np.random.seed(seed)
            torch.manual_seed(seed)
            res["rng_equal"] = [random.getstate() == rs["random_rng_state"],
                                bool((np.random.get_state()[1] == rs["np_rng_state"][1]).all()) and
                                np.random.get_state()[2] == rs["np_rng_state"][2],
                                bool(torch.equal(torch.get_rng_state(), rs["torch_rng_state"]))]
            if hasattr(torch.serialization, "add_safe_globals"):
                torch.serialization.add_safe_globals([argparse.Namespace])
                torch.load(path, map_location="cpu", weights_only=True)
                res["weights_only"] = True
            else:
                res["weights_only"] = "torch %s has no add_safe_globals" % torch.__version__
            results.append(res)
    for r in results:
        print(json.dumps(r, sort_keys=True, default=str))


def te_fused_adam_accepts(osd):
    """What Transformer Engine's FusedAdam.load_state_dict and step() need of a state dict
    (transformer_engine/pytorch/optimizers/fused_adam.py): every per-parameter entry is one of
    the states it scales (set_scaled_state looks each name up in name_to_dtype_map, a KeyError for
    any other, 'step' included), float32; the step is an int in each parameter group."""
    for k, v in osd["state"].items():
        for name, x in v.items():
            if x is None:
                continue
            assert name in ("exp_avg", "exp_avg_sq", "master_param"), \
                "FusedAdam.load_state_dict: KeyError %r (parameter %s)" % (name, k)
            assert x.float().dtype == torch.float32
    for g in osd["param_groups"]:
        assert isinstance(g.get("step"), int), "FusedAdam keeps an int step per group: %r" % g.get("step")


def main():
    if sys.argv[1] == "make":
        make(sys.argv[2])
    elif sys.argv[1] == "check":  # one or more groups of DIR ITER T P V IMPL DTYPE
        rest = sys.argv[2:]
        for i in range(0, len(rest), 7):
            check(*rest[i:i + 7])
    elif sys.argv[1] == "check-family":  # groups of DIR ITER T P V IMPL DTYPE FAMILY
        rest = sys.argv[2:]
        for i in range(0, len(rest), 8):
            check(*rest[i:i + 8])
    else:
        raise SystemExit("unknown command " + sys.argv[1])


if __name__ == "__main__":
    main()
