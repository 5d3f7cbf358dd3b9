"""A mixture-of-experts checkpoint as Megatron-LM writes it with --ckpt-format torch under expert
parallelism, written by Debian's torch from Megatron's source, for training/torch_checkpoint.h:

  megatron/training/checkpointing.py get_checkpoint_name: one folder per TP x PP x EP rank,
      mp_rank_TT[_PPP]_EEE (the EP rank appended when expert_model_parallel_size > 1), each a
      model_optim_rng.pt written by expert-data-parallel rank 0 (get_data_modulo_expert_parallel_rank)
  megatron/core/transformer/moe/moe_layer.py MoELayer: router (TopKRouter: weight [E, h]), experts,
      shared_experts, in that registration order; experts.py SequentialMLP: local_experts.J, J
      numbered from 0 on every EP rank (its state_dict is the module's own; only the sharded
      state dict maps J to the global expert); shared_experts.py SharedExpertMLP: gate_weight
      [1, h] (its own parameter, before its linear_fc1 / linear_fc2)
  gpt_layer_specs.py, Transformer Engine spec: a dense layer fuses its pre-MLP norm into
      mlp.linear_fc1 (layer_norm_weight), an MoE layer keeps pre_mlp_layernorm (TENorm); TE linears
      save _extra_state
  megatron/core/optimizer/__init__.py get_megatron_optimizer: with expert parallelism the expert
      weights (allreduce False: is_expert and expert_model_parallel_size > 1) get their own
      optimizer, and ChainedOptimizer.state_dict() is the list [dense, expert] of the two
      optimizers' state dicts (each FP32Optimizer: torch's Adam state_dict over its groups)
  arguments.py: num_experts, moe_layer_freq (moe_freq_type: a list), moe_ffn_hidden_size,
      moe_router_topk, moe_router_load_balancing_type, moe_aux_loss_coeff,
      expert_model_parallel_size, moe_shared_expert_intermediate_size, moe_shared_expert_gate

  megatron_moe_checkpoint.py make OUT   OUT/moe_ep2/megatron (TP 1 x EP 2) and
      OUT/moe_ep2/reference.safetensors ("model/<our name>", "exp_avg/<name>", "exp_avg_sq/<name>",
      "step"; experts under their global numbers)
  megatron_moe_checkpoint.py check DIR ITER EP   torch.load every EP rank's file we wrote, load its
      model state dict strictly into these modules (names and shapes), its optimizer into Adam
      over Megatron's groups; prints one JSON line per rank
"""
import argparse
import collections
import json
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import megatron_checkpoint as mc  # noqa: E402  (Holder, TE, param_groups, write_safetensors)

L, H, HEADS, SEQ, VOCAB, DIVISOR = 2, 32, 4, 32, 60, 16
FFN, E, MOE_FFN, SHARED = 64, 4, 16, 24
MOE_LAYERS = [0, 1]  # --moe-layer-freq [0,1]
ITERATION = 7


def full_weights(seed, vocab_rows=None):
    g = torch.Generator().manual_seed(seed)

    def r(*shape):
        return torch.randn(*shape, generator=g) * 0.2

    w = collections.OrderedDict()
    w["embedding.word_embeddings.weight"] = r(vocab_rows or mc.padded_vocab(1), H)
    w["embedding.position_embeddings.weight"] = r(SEQ, H)
    for i in range(L):
        p = "decoder.layers.%d." % i
        w[p + "input_layernorm.weight"] = 1 + r(H) * 0.1
        w[p + "input_layernorm.bias"] = r(H)
        w[p + "self_attention.linear_qkv.weight"] = r(3 * H, H)
        w[p + "self_attention.linear_proj.weight"] = r(H, H)
        w[p + "pre_mlp_layernorm.weight"] = 1 + r(H) * 0.1
        w[p + "pre_mlp_layernorm.bias"] = r(H)
        if MOE_LAYERS[i]:
            w[p + "mlp.router.weight"] = r(E, H)
            for x in range(E):
                w[p + "mlp.experts.local_experts.%d.linear_fc1.weight" % x] = r(MOE_FFN, H)
                w[p + "mlp.experts.local_experts.%d.linear_fc2.weight" % x] = r(H, MOE_FFN)
            w[p + "mlp.shared_experts.gate_weight"] = r(1, H)
            w[p + "mlp.shared_experts.linear_fc1.weight"] = r(SHARED, H)
            w[p + "mlp.shared_experts.linear_fc2.weight"] = r(H, SHARED)
        else:
            w[p + "mlp.linear_fc1.weight"] = r(FFN, H)
            w[p + "mlp.linear_fc2.weight"] = r(H, FFN)
    w["decoder.final_layernorm.weight"] = 1 + r(H) * 0.1
    w["decoder.final_layernorm.bias"] = r(H)
    return w


def build(w, e, ep):
    """Megatron-Core's GPTModel (Transformer Engine spec, one stage, TP 1) on EP rank e: the
    module tree, each parameter remembering our name (_ours) and whether it is an expert's."""
    per = E // ep

    def reg(items):
        return [(local, w[ours], ours) for local, ours in items]

    m = torch.nn.Module()
    emb = torch.nn.Module()
    emb.word_embeddings = mc.Holder(reg([("weight", "embedding.word_embeddings.weight")]))
    emb.position_embeddings = mc.Holder(reg([("weight", "embedding.position_embeddings.weight")]))
    m.embedding = emb
    layers = []
    for i in range(L):
        p = "decoder.layers.%d." % i
        layer = torch.nn.Module()
        layer.input_layernorm = torch.nn.Identity()
        attn = torch.nn.Module()
        attn.core_attention = mc.TE()
        attn.linear_proj = mc.TE(reg([("weight", p + "self_attention.linear_proj.weight")]))
        attn.linear_qkv = mc.TE(reg([("layer_norm_weight", p + "input_layernorm.weight"),
                                     ("layer_norm_bias", p + "input_layernorm.bias"),
                                     ("weight", p + "self_attention.linear_qkv.weight")]))
        layer.self_attention = attn
        if MOE_LAYERS[i]:
            layer.pre_mlp_layernorm = mc.Holder(reg([("weight", p + "pre_mlp_layernorm.weight"),
                                                     ("bias", p + "pre_mlp_layernorm.bias")]))
            moe = torch.nn.Module()
            moe.router = mc.Holder(reg([("weight", p + "mlp.router.weight")]))
            experts = torch.nn.Module()
            local = torch.nn.ModuleList()
            for j in range(per):
                x = e * per + j  # the global expert of local expert j
                ex = torch.nn.Module()
                ex.linear_fc1 = mc.TE(reg([("weight", p + "mlp.experts.local_experts.%d.linear_fc1.weight" % x)]))
                ex.linear_fc2 = mc.TE(reg([("weight", p + "mlp.experts.local_experts.%d.linear_fc2.weight" % x)]))
                for prm in ex.parameters():
                    prm.allreduce = not (ep > 1)
                local.append(ex)
            experts.local_experts = local
            moe.experts = experts
            shared = mc.Holder(reg([("gate_weight", p + "mlp.shared_experts.gate_weight")]))
            shared.linear_fc1 = mc.TE(reg([("weight", p + "mlp.shared_experts.linear_fc1.weight")]))
            shared.linear_fc2 = mc.TE(reg([("weight", p + "mlp.shared_experts.linear_fc2.weight")]))
            moe.shared_experts = shared
            layer.mlp = moe
        else:
            layer.pre_mlp_layernorm = torch.nn.Identity()
            mlp = torch.nn.Module()
            mlp.linear_fc1 = mc.TE(reg([("layer_norm_weight", p + "pre_mlp_layernorm.weight"),
                                        ("layer_norm_bias", p + "pre_mlp_layernorm.bias"),
                                        ("weight", p + "mlp.linear_fc1.weight")]))
            mlp.linear_fc2 = mc.TE(reg([("weight", p + "mlp.linear_fc2.weight")]))
            layer.mlp = mlp
        layers.append(layer)
    dec = torch.nn.Module()
    dec.layers = torch.nn.ModuleList(layers)
    dec.final_layernorm = mc.Holder(reg([("weight", "decoder.final_layernorm.weight"),
                                         ("bias", "decoder.final_layernorm.bias")]))
    m.decoder = dec
    m.output_layer = mc.ParallelLinear()  # tied: no weight, an _extra_state
    return m


def split_groups(module, ep):
    """get_megatron_optimizer: the dense optimizer's groups, then (EP > 1) the experts'."""
    dense = [(n, p) for n, p in module.named_parameters() if getattr(p, "allreduce", True)]
    expert = [(n, p) for n, p in module.named_parameters() if not getattr(p, "allreduce", True)]
    out = []
    for members in ([dense, expert] if ep > 1 else [dense + expert]):
        groups = collections.OrderedDict()
        for name, p in members:
            groups.setdefault(0.0 if (p.dim() == 1 or name.endswith(".bias")) else 1.0, []).append(p)
        out.append([{"params": groups[k], "wd_mult": k, "lr_mult": 1.0, "weight_decay": 0.1 * k,
                     "is_expert_parallel": members is expert and ep > 1}
                    for k in sorted(groups, reverse=True)])
    return out


def namespace(ep):
    return argparse.Namespace(
        num_layers=L, hidden_size=H, ffn_hidden_size=FFN, num_attention_heads=HEADS,
        kv_channels=H // HEADS, seq_length=SEQ, max_position_embeddings=SEQ,
        padded_vocab_size=mc.padded_vocab(1), make_vocab_size_divisible_by=DIVISOR,
        tensor_model_parallel_size=1, pipeline_model_parallel_size=1,
        expert_model_parallel_size=ep, expert_tensor_parallel_size=1,
        virtual_pipeline_model_parallel_size=None, consumed_train_samples=ITERATION * 8,
        consumed_valid_samples=16, fp16=False, bf16=False, params_dtype=torch.float32,
        tokenizer_type="NullTokenizer", vocab_size=VOCAB, optimizer="adam", lr=3e-3, min_lr=3e-4,
        lr_decay_style="cosine", weight_decay=0.1, adam_beta1=0.9, adam_beta2=0.95, adam_eps=1e-8,
        seed=1234, micro_batch_size=2, global_batch_size=8, train_iters=20,
        untie_embeddings_and_output_weights=False, swiglu=False, add_bias_linear=False,
        normalization="LayerNorm", layernorm_epsilon=1e-5, hidden_dropout=0.0, attention_dropout=0.0,
        position_embedding_type="learned_absolute", use_distributed_optimizer=False,
        data_path=["corpus"], split="90,10,0", iteration=ITERATION, data_parallel_size=ep,
        transformer_impl="transformer_engine", num_experts=E, moe_layer_freq=MOE_LAYERS,
        moe_ffn_hidden_size=MOE_FFN, moe_router_topk=2, moe_router_load_balancing_type="aux_loss",
        moe_aux_loss_coeff=0.01, moe_z_loss_coeff=None, moe_grouped_gemm=False,
        moe_shared_expert_intermediate_size=SHARED, moe_shared_expert_gate=True,
        moe_token_dispatcher_type="alltoall", moe_router_score_function="softmax")


def make(out):
    os.makedirs(out, exist_ok=True)
    ep = 2
    root = os.path.join(out, "moe_ep2")
    folder = os.path.join(root, "megatron", "iter_%07d" % ITERATION)
    w = full_weights(4242)
    g = torch.Generator().manual_seed(99)
    state = {k: {"exp_avg": torch.randn(v.shape, generator=g) * 1e-3,
                 "exp_avg_sq": torch.rand(v.shape, generator=g) * 1e-6} for k, v in w.items()}
    ref = collections.OrderedDict(("model/" + k, v) for k, v in w.items())
    for k, kinds in state.items():
        for kind, v in kinds.items():
            ref[kind + "/" + k] = v
    ref["step"] = torch.tensor(ITERATION, dtype=torch.int64)
    for e in range(ep):
        module = build(w, e, ep)
        sd = {"args": namespace(ep), "checkpoint_version": 3.0, "iteration": ITERATION,
              "model": module.state_dict()}
        optimizers = []
        for groups in split_groups(module, ep):
            opt = torch.optim.Adam(groups, lr=3e-3, betas=(0.9, 0.95))
            for grp in groups:
                for prm in grp["params"]:
                    opt.state[prm] = {"step": torch.tensor(float(ITERATION)),
                                      "exp_avg": state[prm._ours]["exp_avg"].clone(),
                                      "exp_avg_sq": state[prm._ours]["exp_avg_sq"].clone()}
            optimizers.append(opt.state_dict())
        sd["optimizer"] = optimizers if len(optimizers) > 1 else optimizers[0]
        sd["opt_param_scheduler"] = {"max_lr": 3e-3, "lr_warmup_steps": 16, "num_steps": ITERATION * 8,
                                     "lr_decay_style": "cosine", "lr_decay_steps": 160, "min_lr": 3e-4,
                                     "start_wd": 0.1, "end_wd": 0.1, "wd_incr_style": "constant",
                                     "wd_incr_steps": 160}
        rank_dir = "mp_rank_00_%03d" % e
        os.makedirs(os.path.join(folder, rank_dir), exist_ok=True)
        torch.save(sd, os.path.join(folder, rank_dir, "model_optim_rng.pt"))
    with open(os.path.join(root, "megatron", "latest_checkpointed_iteration.txt"), "w") as f:
        f.write(str(ITERATION))
    mc.write_safetensors(os.path.join(root, "reference.safetensors"), ref)


def check(folder, iteration, ep):
    iteration, ep = int(iteration), int(ep)
    for e in range(ep):
        rank_dir = "mp_rank_00" + ("_%03d" % e if ep > 1 else "")
        sd = torch.load(os.path.join(folder, "iter_%07d" % iteration, rank_dir, "model_optim_rng.pt"),
                        map_location="cpu", weights_only=False)
        a = sd["args"]
        global L, H, HEADS, SEQ, FFN, E, MOE_FFN, SHARED, MOE_LAYERS  # the model the args describe
        L, H, HEADS, SEQ = a.num_layers, a.hidden_size, a.num_attention_heads, a.max_position_embeddings
        FFN, E, MOE_FFN = a.ffn_hidden_size, a.num_experts, a.moe_ffn_hidden_size
        SHARED = a.moe_shared_expert_intermediate_size
        freq = a.moe_layer_freq
        MOE_LAYERS = freq if isinstance(freq, list) else [int(i % freq == 0) for i in range(L)]
        zero = full_weights(0, a.padded_vocab_size)
        module = build(zero, e, ep)
        module.load_state_dict(sd["model"], strict=True)  # Megatron-Core's names and shapes
        res = {"rank": rank_dir, "num_experts": a.num_experts, "moe_layer_freq": a.moe_layer_freq,
               "expert_model_parallel_size": a.expert_model_parallel_size,
               "moe_ffn_hidden_size": a.moe_ffn_hidden_size}
        osd = sd["optimizer"]
        parts = osd if isinstance(osd, list) else [osd]
        res["optimizers"] = len(parts)
        for groups, part in zip(split_groups(module, ep), parts):
            if all("step" in st for st in part["state"].values()):
                opt = torch.optim.Adam(groups, lr=1.0)
                opt.load_state_dict(part)  # group sizes and ids as Megatron's
            else:  # Transformer Engine's FusedAdam: the step per group
                mc.te_fused_adam_accepts(part)
                assert [len(g["params"]) for g in part["param_groups"]] == \
                    [len(g["params"]) for g in groups]
                for grp, pg in zip(groups, part["param_groups"]):
                    for prm, i in zip(grp["params"], pg["params"]):
                        assert part["state"][i]["exp_avg"].shape == prm.shape
            assert [g.get("is_expert_parallel") for g in part["param_groups"]] == \
                [g["is_expert_parallel"] for g in groups]
        res["groups"] = [[len(g["params"]) for g in p["param_groups"]] for p in parts]
        res["router_0"] = module.decoder.layers[1].mlp.router.weight[0, 0].item()
        print(json.dumps(res, sort_keys=True))


def main():
    if sys.argv[1] == "make":
        make(sys.argv[2])
    elif sys.argv[1] == "check":
        check(*sys.argv[2:5])
    else:
        raise SystemExit("unknown command " + sys.argv[1])


if __name__ == "__main__":
    main()
