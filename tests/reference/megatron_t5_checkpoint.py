"""Megatron-LM torch checkpoints of a T5 model (iter_N/mp_rank_TT/model_optim_rng.pt), written and
checked by Debian's torch as an independent reference for training/torch_checkpoint.h.

The module tree below mirrors Megatron-Core's T5Model (megatron/core/models/T5/t5_model.py) with
t5_spec.py's layer specs, in registration order (hence state_dict and named_parameters order):
  embedding (word_embeddings, position_embeddings with learned_absolute positions),
  encoder_relative_pos_emb / decoder_relative_pos_emb (relative_attention_bias: an Embedding of
  [buckets, heads], whole on every tensor-parallel rank: Megatron scatters the computed bias),
  encoder (layers, final_layernorm), decoder (layers with pre_cross_attn_layernorm and
  cross_attention: linear_proj, linear_q, linear_kv; final_layernorm),
  lm_head (T5LMHead: output_layer, a ColumnParallelLinear with a bias when tied to the word
  embedding, else a weight of its own), and output_layer again: T5Model sets
  self.output_layer = self.lm_head.output_layer, so the state dict holds the head's tensors under
  both names.
Layer specs: "local" (ColumnParallelLinear / RowParallelLinear: _extra_state None, norms of their
own) and "te" (Transformer Engine: TELayerNormColumnParallelLinear with the input and MLP norms
fused as layer_norm_weight/bias, TEDotProductAttention, TERowParallelLinear, TEColumnParallelLinear
for linear_q and linear_kv, a TENorm as pre_cross_attn_layernorm).
Tensor-parallel splits: the word embedding, linear_qkv, linear_q, linear_kv, linear_fc1 and the
output layer by rows; linear_proj and linear_fc2 weights by columns; the rest whole.

  megatron_t5_checkpoint.py make OUT
      every variant under OUT/<name>/: megatron/ (the TP2 checkpoint, iteration 10),
      reference.safetensors (single-rank tensors "model/<name>" under Megatron-Core's names, and
      with an optimizer "exp_avg/<name>", "exp_avg_sq/<name>", "step"), and loss/ (config.json,
      weights.bin, batch.bin as t5_reference.py reads them, and out.bin: its float64 loss sum,
      token count, logits, gradients)
  megatron_t5_checkpoint.py check DIR ITER VARIANT_DIR
      loads every rank file of the checkpoint DIR (iteration ITER) that we wrote with torch.load
      into the variant's module tree (load_state_dict strict=True), compares every tensor (keys,
      shapes, dtypes, bytes) and the optimizer state with the variant's own files, and the
      arguments pretrain_t5.py records; prints one JSON line per rank (or the problem)
"""
import argparse
import collections
import json
import os
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from megatron_checkpoint import TE, Holder, ParallelLinear, shard, write_fake_modules, write_safetensors  # noqa: E402

ENC_L, DEC_L, H, HEADS, FFN = 2, 3, 32, 4, 64
HEAD_DIM = H // HEADS
SE, SD, VOCAB, EXTRA_IDS, DIVISOR, TP = 12, 8, 60, 10, 16, 2
PADDED = 64  # ceil(61 / (16 * TP)) * 16 * TP for the 60 tokens and the null tokenizer's EOD
BUCKETS, MAX_DISTANCE = 8, 6
ITERATION = 10

VARIANTS = {
    # name: layer spec, position embedding, untied output layer, optimizer state
    "t5_local_relative": ("local", "relative", False, True),
    "t5_te_absolute_untied": ("te", "learned_absolute", True, False),
}


def full_weights(pos, untied, seed):
    g = torch.Generator().manual_seed(seed)

    def r(*shape, scale=0.2):
        return torch.randn(*shape, generator=g) * scale

    def norm(prefix):
        w[prefix + ".weight"] = 1 + r(H) * 0.1
        w[prefix + ".bias"] = r(H)

    def linear(prefix, rows, cols):
        w[prefix + ".weight"] = r(rows, cols)
        w[prefix + ".bias"] = r(rows)

    w = collections.OrderedDict()
    w["embedding.word_embeddings.weight"] = r(PADDED, H)
    if pos == "learned_absolute":
        w["embedding.position_embeddings.weight"] = r(SE, H)
    if pos == "relative":
        for side in ("encoder", "decoder"):
            w[side + "_relative_pos_emb.relative_attention_bias.weight"] = r(BUCKETS, HEADS, scale=1.0)
    for side, layers in (("encoder", ENC_L), ("decoder", DEC_L)):
        for i in range(layers):
            p = "%s.layers.%d." % (side, i)
            norm(p + "input_layernorm")
            linear(p + "self_attention.linear_qkv", 3 * H, H)
            linear(p + "self_attention.linear_proj", H, H)
            if side == "decoder":
                norm(p + "pre_cross_attn_layernorm")
                linear(p + "cross_attention.linear_q", H, H)
                linear(p + "cross_attention.linear_kv", 2 * H, H)
                linear(p + "cross_attention.linear_proj", H, H)
            norm(p + "pre_mlp_layernorm")
            linear(p + "mlp.linear_fc1", FFN, H)
            linear(p + "mlp.linear_fc2", H, FFN)
        norm(side + ".final_layernorm")
    if untied:
        w["output_layer.weight"] = r(PADDED, H)
    else:
        w["output_layer.bias"] = r(PADDED)
    return w


ROWS = ("word_embeddings.weight", "linear_qkv.weight", "linear_qkv.bias", "linear_q.weight",
        "linear_q.bias", "linear_kv.weight", "linear_kv.bias", "linear_fc1.weight",
        "linear_fc1.bias", "output_layer.weight", "output_layer.bias")
COLUMNS = ("linear_proj.weight", "linear_fc2.weight")


def split_dim(name):
    if name.endswith(ROWS):
        return 0
    if name.endswith(COLUMNS):
        return 1
    return None


class Module(torch.nn.Module):
    """A module whose submodules are registered in the given order."""

    def __init__(self, children=()):
        super().__init__()
        for name, m in children:
            self.add_module(name, m)


def build(w, spec, pos, untied, t):
    """T5Model's module tree for tensor-parallel rank t: (module, [(parameter, our name)])."""
    te = spec == "te"

    def p(name):
        return name, shard(w[name], split_dim(name), t, TP), name

    def linear(prefix, bias=True):
        cls = TE if te else ParallelLinear
        return cls([(n.split(".")[-1], v, o) for n, v, o in
                    [p(prefix + ".weight")] + ([p(prefix + ".bias")] if bias else [])])

    def fused(prefix, norm):  # TELayerNormColumnParallelLinear: the norm, then the linear
        return TE([("layer_norm_weight",) + p(norm + ".weight")[1:],
                   ("layer_norm_bias",) + p(norm + ".bias")[1:],
                   ("weight",) + p(prefix + ".weight")[1:], ("bias",) + p(prefix + ".bias")[1:]])

    def norm(prefix):
        return Holder([("weight",) + p(prefix + ".weight")[1:], ("bias",) + p(prefix + ".bias")[1:]])

    def layer(side, i):
        pre = "%s.layers.%d." % (side, i)
        kids = []
        if te:
            attn = Module([("core_attention", TE()), ("linear_proj", linear(pre + "self_attention.linear_proj")),
                           ("linear_qkv", fused(pre + "self_attention.linear_qkv", pre + "input_layernorm"))])
            kids += [("input_layernorm", Module()), ("self_attention", attn)]
        else:
            attn = Module([("core_attention", Module()), ("linear_proj", linear(pre + "self_attention.linear_proj")),
                           ("linear_qkv", linear(pre + "self_attention.linear_qkv"))])
            kids += [("input_layernorm", norm(pre + "input_layernorm")), ("self_attention", attn)]
        if side == "decoder":
            cross = Module([("core_attention", TE() if te else Module()),
                            ("linear_proj", linear(pre + "cross_attention.linear_proj")),
                            ("linear_q", linear(pre + "cross_attention.linear_q")),
                            ("linear_kv", linear(pre + "cross_attention.linear_kv"))])
            kids += [("pre_cross_attn_layernorm", norm(pre + "pre_cross_attn_layernorm")),
                     ("cross_attention", cross)]
        if te:
            mlp = Module([("linear_fc1", fused(pre + "mlp.linear_fc1", pre + "pre_mlp_layernorm")),
                          ("linear_fc2", linear(pre + "mlp.linear_fc2"))])
            kids += [("pre_mlp_layernorm", Module()), ("mlp", mlp)]
        else:
            mlp = Module([("linear_fc1", linear(pre + "mlp.linear_fc1")),
                          ("linear_fc2", linear(pre + "mlp.linear_fc2"))])
            kids += [("pre_mlp_layernorm", norm(pre + "pre_mlp_layernorm")), ("mlp", mlp)]
        return Module(kids)

    emb = [("word_embeddings", Holder([("weight",) + p("embedding.word_embeddings.weight")[1:]]))]
    if pos == "learned_absolute":
        emb.append(("position_embeddings", Holder([("weight",) + p("embedding.position_embeddings.weight")[1:]])))
    kids = [("embedding", Module(emb))]
    if pos == "relative":
        for side in ("encoder", "decoder"):
            name = side + "_relative_pos_emb.relative_attention_bias.weight"
            kids.append((side + "_relative_pos_emb",
                         Module([("relative_attention_bias", Holder([("weight",) + p(name)[1:]]))])))
    for side, layers in (("encoder", ENC_L), ("decoder", DEC_L)):
        blk = Module([("layers", torch.nn.ModuleList([layer(side, i) for i in range(layers)])),
                      ("final_layernorm", norm(side + ".final_layernorm"))])
        kids.append((side, blk))
    out_name = "output_layer.weight" if untied else "output_layer.bias"
    head = ParallelLinear([(out_name.split(".")[1],) + p(out_name)[1:]])
    kids.append(("lm_head", Module([("output_layer", head)])))
    model = Module(kids)
    model.output_layer = model.lm_head.output_layer  # T5Model's second name of the same module
    return model


def param_groups(model):
    """Megatron's get_param_groups: weight decay unless 1-D or a bias, the decayed group first."""
    groups = collections.OrderedDict(((1.0, []), (0.0, [])))
    for name, prm in model.named_parameters():
        groups[0.0 if (prm.dim() == 1 or name.endswith(".bias")) else 1.0].append(prm)
    return [{"params": v, "wd_mult": k, "lr_mult": 1.0, "weight_decay": 0.1 * k} for k, v in groups.items()]


def namespace(spec, pos, untied):
    sys.path.insert(0, os.path.join(OUT_ROOT, "fake_modules"))
    from megatron.core.transformer.enums import AttnBackend  # noqa
    # pretrain_t5.py's arguments after validate_args (num_layers is the encoder's depth).
    return argparse.Namespace(
        num_layers=ENC_L, encoder_num_layers=ENC_L, decoder_num_layers=DEC_L, hidden_size=H,
        ffn_hidden_size=FFN, num_attention_heads=HEADS, kv_channels=HEAD_DIM, num_query_groups=1,
        group_query_attention=False, seq_length=SE, encoder_seq_length=SE, decoder_seq_length=SD,
        max_position_embeddings=SE, position_embedding_type=pos,
        relative_attention_num_buckets=BUCKETS, relative_attention_max_distance=MAX_DISTANCE,
        padded_vocab_size=PADDED, make_vocab_size_divisible_by=DIVISOR, vocab_extra_ids=EXTRA_IDS,
        tokenizer_type="NullTokenizer", vocab_size=VOCAB, tensor_model_parallel_size=TP,
        pipeline_model_parallel_size=1, virtual_pipeline_model_parallel_size=None,
        data_parallel_size=1, untie_embeddings_and_output_weights=untied, swiglu=False,
        add_bias_linear=True, normalization="LayerNorm", layernorm_epsilon=1e-5,
        openai_gelu=False, bias_gelu_fusion=False, hidden_dropout=0.0, attention_dropout=0.0,
        fp16=False, bf16=False, params_dtype=torch.float32, seed=1234, micro_batch_size=2,
        global_batch_size=4, train_iters=20, lr=1e-3, min_lr=1e-4, lr_decay_style="linear",
        weight_decay=0.1, adam_beta1=0.9, adam_beta2=0.999, adam_eps=1e-8, optimizer="adam",
        mask_prob=0.15, short_seq_prob=0.1, use_distributed_optimizer=False, loss_scale=None,
        transformer_impl="transformer_engine" if spec == "te" else "local",
        attention_backend=AttnBackend.auto, iteration=ITERATION,
        consumed_train_samples=ITERATION * 4, consumed_valid_samples=0)


def optimizer_state(model, full_state):
    """FP32Optimizer.state_dict(): torch.optim.Adam's over Megatron's parameter groups."""
    groups = param_groups(model)
    opt = torch.optim.Adam(groups, lr=1e-3)
    t = model._tp_rank
    for grp in groups:
        for prm in grp["params"]:
            n = prm._ours
            opt.state[prm] = {"step": torch.tensor(float(ITERATION)),
                              "exp_avg": shard(full_state[n]["exp_avg"], split_dim(n), t, TP),
                              "exp_avg_sq": shard(full_state[n]["exp_avg_sq"], split_dim(n), t, TP)}
    return opt.state_dict()


def loss_files(d, w, pos, untied):
    """t5_reference.py's inputs for these weights and a batch (padding in both sides)."""
    os.makedirs(d, exist_ok=True)
    model = {"hidden_size": H, "num_attention_heads": HEADS, "kv_channels": HEAD_DIM,
             "num_query_groups": 0, "num_layers": ENC_L, "decoder_num_layers": DEC_L,
             "layernorm_epsilon": 1e-5, "apply_layernorm_1p": False, "position_embedding_type": pos,
             "rotary_percent": 1.0, "rotary_interleaved": False, "rotary_base": 10000,
             "normalization": "LayerNorm", "activation": "gelu", "padded_vocab_size": PADDED,
             "relative_attention_num_buckets": BUCKETS, "relative_attention_max_distance": MAX_DISTANCE}
    b = 2
    spec = {"model": model, "batch": b, "enc_seq": SE, "dec_seq": SD, "grad_scale": 1.0,
            "params": [{"name": k, "shape": list(v.shape)} for k, v in w.items()]}
    json.dump(spec, open(os.path.join(d, "config.json"), "w"))
    np.concatenate([v.numpy().ravel() for v in w.values()]).astype(np.float32).tofile(os.path.join(d, "weights.bin"))
    rng = np.random.default_rng(7)
    enc = rng.integers(0, VOCAB, (b, SE)).astype(np.int32)
    enc_mask = np.ones((b, SE), np.int32)
    enc_mask[1, SE - 3:] = 0
    dec = rng.integers(0, VOCAB, (b, SD)).astype(np.int32)
    labels = rng.integers(0, VOCAB, (b, SD)).astype(np.int32)
    loss_mask = np.ones((b, SD), np.float32)
    labels[1, SD - 2:] = -1
    loss_mask[1, SD - 2:] = 0
    with open(os.path.join(d, "batch.bin"), "wb") as f:
        for a in (enc, enc_mask, dec, labels):
            f.write(a.tobytes())
        f.write(loss_mask.tobytes())
    import t5_reference
    t5_reference.main(d)


def make_variant(out, name):
    spec, pos, untied, with_optimizer = VARIANTS[name]
    w = full_weights(pos, untied, seed=sum(name.encode()))
    root = os.path.join(out, name)
    folder = os.path.join(root, "megatron", "iter_%07d" % ITERATION)
    ref = collections.OrderedDict(("model/" + k, v) for k, v in w.items())
    g = torch.Generator().manual_seed(99)
    full_state = {k: {"exp_avg": torch.randn(v.shape, generator=g) * 1e-3,
                      "exp_avg_sq": torch.rand(v.shape, generator=g) * 1e-6} for k, v in w.items()}
    if with_optimizer:
        for k, kinds in full_state.items():
            for kind, v in kinds.items():
                ref[kind + "/" + k] = v
        ref["step"] = torch.tensor(ITERATION, dtype=torch.int64)
    for t in range(TP):
        model = build(w, spec, pos, untied, t)
        model._tp_rank = t
        sd = {"args": namespace(spec, pos, untied), "checkpoint_version": 3.0, "iteration": ITERATION,
              "model": model.state_dict()}
        if with_optimizer:
            sd["optimizer"] = optimizer_state(model, full_state)
            sd["opt_param_scheduler"] = {"max_lr": 1e-3, "lr_warmup_steps": 0, "num_steps": ITERATION * 4,
                                         "lr_decay_style": "linear", "lr_decay_steps": 80, "min_lr": 1e-4,
                                         "start_wd": 0.1, "end_wd": 0.1, "wd_incr_style": "constant",
                                         "wd_incr_steps": 80}
        os.makedirs(os.path.join(folder, "mp_rank_%02d" % t), exist_ok=True)
        torch.save(sd, os.path.join(folder, "mp_rank_%02d" % t, "model_optim_rng.pt"))
    with open(os.path.join(root, "megatron", "latest_checkpointed_iteration.txt"), "w") as f:
        f.write(str(ITERATION))
    write_safetensors(os.path.join(root, "reference.safetensors"), ref)
    loss_files(os.path.join(root, "loss"), w, pos, untied)


def make(out):
    global OUT_ROOT
    OUT_ROOT = out
    os.makedirs(out, exist_ok=True)
    write_fake_modules(out)
    for name in VARIANTS:
        make_variant(out, name)


def check(folder, iteration, variant_dir):
    """Our files against the variant's (Megatron's) files, rank by rank."""
    iteration = int(iteration)
    results = []
    for t in range(TP):
        rank = "mp_rank_%02d" % t
        ours = torch.load(os.path.join(folder, "iter_%07d" % iteration, rank, "model_optim_rng.pt"),
                          map_location="cpu", weights_only=False)
        theirs = torch.load(os.path.join(variant_dir, "megatron", "iter_%07d" % ITERATION, rank,
                                         "model_optim_rng.pt"), map_location="cpu", weights_only=False)
        problems = []
        a, b = ours["model"], theirs["model"]
        if set(a) != set(b):
            problems.append("keys: extra %s, missing %s" % (sorted(set(a) - set(b)), sorted(set(b) - set(a))))
        for k in sorted(set(a) & set(b)):
            x, y = a[k], b[k]
            if isinstance(y, torch.Tensor):
                if not isinstance(x, torch.Tensor) or x.shape != y.shape or x.dtype != y.dtype \
                        or not torch.equal(x, y):
                    problems.append("tensor %s differs" % k)
            elif x is not None:
                problems.append("%s is %r, not None" % (k, type(x)))
        # Loads into T5Model's module tree (strict: every key and nothing else).
        spec = "te" if ours["args"].transformer_impl == "transformer_engine" else "local"
        pos = ours["args"].position_embedding_type
        untied = ours["args"].untie_embeddings_and_output_weights
        w = {k[6:]: v for k, v in read_safetensors(os.path.join(variant_dir, "reference.safetensors")).items()
             if k.startswith("model/")}
        model = build(w, spec, pos, untied, t)
        try:
            model.load_state_dict(a, strict=True)
        except Exception as e:  # noqa: BLE001
            problems.append("load_state_dict: %s" % str(e).splitlines()[0])
        args = ours["args"]
        for k in ("num_layers", "encoder_num_layers", "decoder_num_layers", "encoder_seq_length",
                  "decoder_seq_length", "seq_length", "max_position_embeddings", "vocab_extra_ids",
                  "position_embedding_type", "relative_attention_num_buckets",
                  "relative_attention_max_distance", "hidden_size", "num_attention_heads",
                  "ffn_hidden_size", "padded_vocab_size", "tensor_model_parallel_size",
                  "untie_embeddings_and_output_weights", "add_bias_linear"):
            if getattr(args, k, "missing") != getattr(theirs["args"], k):
                problems.append("args.%s = %r, Megatron's run has %r" % (k, getattr(args, k, "missing"),
                                                                         getattr(theirs["args"], k)))
        if "optimizer" in theirs:
            oa, ob = ours.get("optimizer"), theirs["optimizer"]
            if oa is None:
                problems.append("no optimizer state")
            else:
                pa, pb = oa["param_groups"], ob["param_groups"]
                if [len(g["params"]) for g in pa] != [len(g["params"]) for g in pb]:
                    problems.append("parameter groups %s, Megatron's %s" % (
                        [len(g["params"]) for g in pa], [len(g["params"]) for g in pb]))
                else:
                    for ga, gb in zip(pa, pb):
                        for ia, ib in zip(ga["params"], gb["params"]):
                            for kind in ("exp_avg", "exp_avg_sq"):
                                if not torch.equal(oa["state"][ia][kind], ob["state"][ib][kind]):
                                    problems.append("optimizer %s of parameter %d differs" % (kind, ib))
                    opt = torch.optim.Adam(param_groups(model), lr=1e-3)
                    try:
                        opt.load_state_dict(oa)
                    except Exception as e:  # noqa: BLE001
                        problems.append("Adam.load_state_dict: %s" % e)
        results.append({"rank": rank, "tensors": sum(isinstance(v, torch.Tensor) for v in a.values()),
                        "problems": problems})
    for r in results:
        print(json.dumps(r))


def read_safetensors(path):
    import struct
    codes = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "I64": torch.int64}
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for k, v in header.items():
        if k == "__metadata__":
            continue
        lo, hi = v["data_offsets"]
        out[k] = torch.frombuffer(bytearray(data[lo:hi]), dtype=codes[v["dtype"]]).reshape(v["shape"])
    return out


OUT_ROOT = ""

if __name__ == "__main__":
    torch.set_num_threads(1)
    if sys.argv[1] == "make":
        make(sys.argv[2])
    elif sys.argv[1] == "check":
        OUT_ROOT = os.path.dirname(os.path.abspath(sys.argv[4]))
        sys.path.insert(0, os.path.join(OUT_ROOT, "fake_modules"))
        check(sys.argv[2], sys.argv[3], sys.argv[4])
    else:
        sys.exit("usage: megatron_t5_checkpoint.py make OUT | check DIR ITER VARIANT_DIR")
