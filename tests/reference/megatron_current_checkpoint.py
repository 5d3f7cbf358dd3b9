"""A checkpoint as current Megatron-LM (core v0.18 and later) writes it with --ckpt-format torch,
written by Debian's torch from Megatron's source (megatron/training/checkpointing.py's
generate_state_dict and save_checkpoint, arguments.py's validate_args), for
training/torch_checkpoint.h and core/pickle.h:

  root: args (argparse.Namespace), checkpoint_version 3.0, iteration, model (Transformer Engine
  spec: fused norms, _extra_state of each kind Transformer Engine writes: None, io.BytesIO of a
  torch.save, a uint8 tensor of a pickle, an empty uint8 tensor; the output layer's None),
  optimizer (Float16OptimizerWithFloat16Params over Transformer Engine's FusedAdam: the step per
  parameter group), opt_param_scheduler, rerun_state_machine (an OrderedDict with RerunMode /
  RerunState enums), rng_state, num_floating_point_operations_so_far.
  args hold what validate_args leaves there: AttnBackend (by value), InferenceCudaGraphScope (by
  name: getattr), a list of CudaGraphScope, torch dtypes, NumPy scalars, a nested
  types.SimpleNamespace, and a newer release's unknown argument (an enum of a module this build
  has never seen).

  megatron_current_checkpoint.py make OUT     OUT/current/ (the checkpoint), OUT/moe/ (the same
      with multi_latent_attention, a model feature this build lacks), OUT/evil_*/ (files that run code under torch.load), OUT/fake_modules
  megatron_current_checkpoint.py args FILE OURS   torch.load both, compare their "args"
      Namespaces attribute by attribute (OURS written by our pickler); prints "same" or the diffs
"""
import argparse
import collections
import enum
import functools
import io
import os
import pickle
import random
import subprocess
import sys
import types

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import megatron_checkpoint as mc  # noqa: E402  (the module trees of Megatron-Core's specs)
from torch_files import Call  # noqa: E402  (unpickles to f(*args))

ENUMS = {
    "megatron/core/transformer/enums.py": (
        "import enum\n"
        "class AttnBackend(enum.Enum):\n    flash = 1\n    fused = 2\n    unfused = 3\n    local = 4\n    auto = 5\n"
        "    def __reduce_ex__(self, proto):  # Python 3.12's form: by value\n"
        "        return self.__class__, (self._value_,)\n"
        "class CudaGraphScope(enum.Enum):\n    full_iteration = 1\n    attn = 2\n    mlp = 3\n    moe = 4\n"
        "class InferenceCudaGraphScope(enum.Enum):\n    none = 1\n    layer = 2\n    block = 3\n"
        "    def __reduce_ex__(self, proto):  # Python 3.11's form: by name\n"
        "        return getattr, (self.__class__, self._name_)\n"),
    "megatron/core/rerun_state_machine.py": (
        "import enum\n"
        "class RerunMode(str, enum.Enum):\n    DISABLED = 'disabled'\n    VALIDATE_RESULTS = 'validate_results'\n"
        "class RerunState(enum.Enum):\n    NOT_RUNNING_YET = 0\n    INITIAL_RUN = 1\n"
        "from typing import NamedTuple\n"
        "class Caller(NamedTuple):\n    message: str\n    rank: int\n"),
    "megatron/core/future_feature/enums.py": (
        "import enum\nclass FutureKnob(enum.Enum):\n    off = 0\n    on = 1\n"),
    "megatron/core/utils.py": "import os\ndef run_command(cmd):\n    return os.system(cmd)\n",
}


def write_fake_modules(out):
    base = os.path.join(out, "fake_modules")
    for path, text in ENUMS.items():
        full = os.path.join(base, path)
        d = os.path.dirname(full)
        while d != base:
            os.makedirs(d, exist_ok=True)
            open(os.path.join(d, "__init__.py"), "a").close()
            d = os.path.dirname(d)
        with open(full, "w") as f:
            f.write(text)
    sys.path.insert(0, base)


def current_args(lacking=False):
    from megatron.core.transformer.enums import AttnBackend, CudaGraphScope, InferenceCudaGraphScope
    from megatron.core.future_feature.enums import FutureKnob
    a = argparse.Namespace(
        num_layers=mc.L, encoder_num_layers=mc.L, decoder_num_layers=None, hidden_size=mc.H,
        ffn_hidden_size=mc.FFN, num_attention_heads=mc.HEADS, kv_channels=mc.HEAD_DIM,
        group_query_attention=False, num_query_groups=1, seq_length=mc.SEQ, encoder_seq_length=mc.SEQ,
        max_position_embeddings=mc.SEQ, position_embedding_type="learned_absolute",
        add_position_embedding=True, use_rotary_position_embeddings=False, rotary_percent=1.0,
        rotary_base=10000, rotary_interleaved=False, normalization="LayerNorm", norm_epsilon=1e-5,
        apply_layernorm_1p=False, swiglu=False, squared_relu=False, openai_gelu=False,
        quick_geglu=False, bias_gelu_fusion=True, add_bias_linear=True, add_qkv_bias=True,
        untie_embeddings_and_output_weights=False, qk_layernorm=False, qk_l2_norm=False,
        softmax_type="vanilla", window_size=None, no_rope_freq=None, num_experts=None,
        moe_router_topk=2, multi_latent_attention=lacking, mtp_num_layers=None, fp8=None, fp4=None,
        make_vocab_size_divisible_by=mc.DIVISOR, padded_vocab_size=mc.padded_vocab(1),
        vocab_size=mc.VOCAB, tokenizer_type="NullTokenizer", tensor_model_parallel_size=1,
        pipeline_model_parallel_size=1, virtual_pipeline_model_parallel_size=None,
        context_parallel_size=1, data_parallel_size=1, world_size=1, rank=0,
        micro_batch_size=2, global_batch_size=8, rampup_batch_size=None,
        step_batch_size_schedule=None, train_iters=20, train_samples=None, lr=3e-3,
        min_lr=np.float64(3e-4), lr_decay_style="cosine", weight_decay=0.1,
        start_weight_decay=0.1, end_weight_decay=0.1, adam_beta1=0.9, adam_beta2=0.95,
        adam_eps=1e-8, clip_grad=1.0, seed=1234, hidden_dropout=0.0, attention_dropout=0.0,
        init_method_std=np.float32(0.02), bf16=True, fp16=False, params_dtype=torch.bfloat16,
        main_grads_dtype=torch.float32, main_params_dtype=torch.float32,
        exp_avg_dtype=torch.float32, exp_avg_sq_dtype=torch.uint8, optimizer="adam",
        use_distributed_optimizer=False, ckpt_format="torch", transformer_impl="transformer_engine",
        attention_backend=AttnBackend.auto, cuda_graph_scope=[CudaGraphScope.attn],
        cuda_graph_impl="none", inference_cuda_graph_scope=InferenceCudaGraphScope.none,
        iterations_to_skip=[], cp_comm_type=["p2p"], consumed_train_samples=40,
        skipped_train_samples=0, consumed_valid_samples=16, use_legacy_models=False,
        future_knob=FutureKnob.off, future_window_policy=("sliding", 8),
        model_parallel=types.SimpleNamespace(tensor_model_parallel_size=1,
                                             sequence_parallel=False,
                                             pipeline_dtype=torch.bfloat16))
    return a


def extra_states(sd):
    """Transformer Engine's _extra_state encodings, one of each kind across the modules."""
    kinds = [
        None,
        io.BytesIO(b"PK\x03\x04 an older TE's torch.save of its fp8 metadata"),
        torch.frombuffer(bytearray(pickle.dumps({"recipe": None, "scale_fwd": [1.0, 2.0]})), dtype=torch.uint8),
        torch.empty(0, dtype=torch.uint8),
    ]
    i = 0
    for k in list(sd.keys()):
        if k.endswith("._extra_state") and not k.startswith("output_layer"):
            sd[k] = kinds[i % len(kinds)]
            i += 1
    return sd


def make_checkpoint(folder, iteration, lacking=False):
    w = mc.full_weights(torch.bfloat16, seed=7)
    stage = mc.Stage("core-te", w, 0, 1, 0, 1, 0, 1, 3, False)
    sd = {"args": current_args(lacking), "checkpoint_version": 3.0, "iteration": iteration}
    sd["model"] = extra_states(stage.module.state_dict())
    groups = mc.param_groups([stage.module], sort=True)
    g = torch.Generator().manual_seed(5)
    mains = [[torch.nn.Parameter(p.detach().float().clone()) for p in grp["params"]] for grp in groups]
    state, ids, param_groups = {}, 0, []
    for grp, ms in zip(groups, mains):
        members = []
        for m in ms:
            # Transformer Engine's FusedAdam: the moments per parameter, the step per group.
            state[ids] = {"exp_avg": torch.randn(m.shape, generator=g) * 1e-3,
                          "exp_avg_sq": torch.rand(m.shape, generator=g) * 1e-6}
            members.append(ids)
            ids += 1
        pg = {k: v for k, v in grp.items() if k != "params"}
        pg.update({"lr": 2e-3, "bias_correction": True, "betas": (0.9, 0.95), "eps": 1e-8,
                   "weight_decay": 0.1 * grp["wd_mult"], "amsgrad": False, "step": iteration,
                   "max_lr": 3e-3, "min_lr": 3e-4, "params": members})
        param_groups.append(pg)
    sd["optimizer"] = {"optimizer": {"state": state, "param_groups": param_groups},
                       "fp32_from_fp16_params": [list(ms) for ms in mains]}
    sd["opt_param_scheduler"] = {"max_lr": 3e-3, "lr_warmup_steps": 16, "num_steps": iteration * 8,
                                 "lr_decay_style": "cosine", "lr_decay_steps": 160, "min_lr": 3e-4,
                                 "start_wd": 0.1, "end_wd": 0.1, "wd_incr_style": "constant",
                                 "wd_incr_steps": 160}
    from megatron.core.rerun_state_machine import Caller, RerunMode, RerunState
    counts = collections.defaultdict(int)
    counts[Caller("loss is finite", 0)] = iteration
    sd["rerun_state_machine"] = collections.OrderedDict(
        mode=RerunMode.DISABLED, state=RerunState.NOT_RUNNING_YET, current_iteration=iteration,
        rerun_requested=False, checkpoint_requested=False, restart_again_requested=False,
        continue_requested=False, logged_sdc_enabled=False, error_injector={"injection_rate": 0},
        validation_counts=counts, failed_validation_call=None,
        data_iterator_checkpoints=None, last_loss=None, saved_results={})
    random.seed(1234)
    np.random.seed(1234)
    torch.manual_seed(1234)
    sd["rng_state"] = [{"random_rng_state": random.getstate(), "np_rng_state": np.random.get_state(),
                        "torch_rng_state": torch.get_rng_state(),
                        "cuda_rng_state": torch.zeros(16, dtype=torch.uint8),
                        "rng_tracker_states": {"model-parallel-rng": torch.zeros(16, dtype=torch.uint8)}}]
    sd["num_floating_point_operations_so_far"] = 1.25e12
    rank_dir = os.path.join(folder, "iter_%07d" % iteration, "mp_rank_00")
    os.makedirs(rank_dir, exist_ok=True)
    torch.save(sd, os.path.join(rank_dir, "model_optim_rng.pt"))
    with open(os.path.join(folder, "latest_checkpointed_iteration.txt"), "w") as f:
        f.write(str(iteration))


def make_evil(out, marker):
    from megatron.core import utils as mutils
    from megatron.core.transformer.enums import AttnBackend
    cmd = "touch " + marker
    payloads = {
        "partial": Call(Call(functools.partial, (os.system, cmd)), ()),
        "popen": Call(subprocess.Popen, (["touch", marker],)),
        "exec": Call(exec, ("import os; os.system(%r)" % cmd,)),
        "megatron_function": Call(mutils.run_command, (cmd,)),
        "enum_then_system": [AttnBackend.auto, Call(os.system, (cmd,))],
    }
    for name, payload in payloads.items():
        folder = os.path.join(out, "evil_" + name)
        os.makedirs(os.path.join(folder, "iter_0000001", "mp_rank_00"), exist_ok=True)
        args = current_args()
        args.future_knob = payload
        torch.save({"args": args, "checkpoint_version": 3.0, "iteration": 1, "model": {}},
                   os.path.join(folder, "iter_0000001", "mp_rank_00", "model_optim_rng.pt"))
        with open(os.path.join(folder, "latest_checkpointed_iteration.txt"), "w") as f:
            f.write("1")


def compare_args(path, ours):
    a = torch.load(path, map_location="cpu")["args"]
    b = torch.load(ours, map_location="cpu")["args"]
    diffs = []
    for k in sorted(set(vars(a)) | set(vars(b))):
        x, y = getattr(a, k, "<missing>"), getattr(b, k, "<missing>")
        if isinstance(x, types.SimpleNamespace) or isinstance(y, types.SimpleNamespace):
            same = type(x) is type(y) and vars(x) == vars(y)
        else:
            same = type(x) is type(y) and x == y or (isinstance(x, np.generic) and float(x) == y)
        if not same:
            diffs.append("%s: %r (%s) != %r (%s)" % (k, x, type(x).__name__, y, type(y).__name__))
    print("same" if not diffs else "\n".join(diffs))


def main():
    out = sys.argv[2]
    if sys.argv[1] == "make":
        write_fake_modules(out)
        make_checkpoint(os.path.join(out, "current"), 5)
        make_checkpoint(os.path.join(out, "mla"), 5, lacking=True)
        make_evil(out, os.path.join(out, "MARKER"))
    elif sys.argv[1] == "args":
        write_fake_modules(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(out)))))
        compare_args(out, sys.argv[3])
    else:
        raise SystemExit("unknown command " + sys.argv[1])


if __name__ == "__main__":
    main()
