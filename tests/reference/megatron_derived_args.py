"""The defaults Megatron-LM derives from other flags, transcribed from megatron/training/
arguments.py (the parser's defaults and validate_args) and tokenizer.py (_vocab_size_with_padding),
as an independent reference for what pretrain-gpt records in a --ckpt-format torch checkpoint.

  megatron_derived_args.py check VOCAB_JSON RUNS_JSON
      RUNS: [{"world_size": N, "save": DIR, "flags": [...]}, ...]. For each run, derives the
      arguments its flags give under its world size, loads the "args" Namespace of the latest
      checkpoint in its save folder (torch.load) and prints one JSON line:
      {"save": DIR, "compared": [names], "mismatches": ["name: megatron X, checkpoint Y", ...]}
"""
import argparse
import json
import os
import sys

import torch


def parser():
    # The flags involved, with Megatron's names, types and defaults (arguments.py).
    p = argparse.ArgumentParser(allow_abbrev=False)
    add = p.add_argument
    add("--num-layers", type=int, default=None)
    add("--hidden-size", type=int, default=None)
    add("--ffn-hidden-size", type=int, default=None)
    add("--num-attention-heads", type=int, default=None)
    add("--kv-channels", type=int, default=None)
    add("--group-query-attention", action="store_true")
    add("--num-query-groups", type=int, default=1)
    add("--max-position-embeddings", type=int, default=None)
    add("--seq-length", type=int, default=None)
    add("--position-embedding-type", type=str, default="learned_absolute")
    add("--use-rotary-position-embeddings", action="store_true")
    add("--swiglu", action="store_true")
    add("--disable-bias-linear", action="store_false", dest="add_bias_linear")
    add("--add-qkv-bias", action="store_true")
    add("--no-bias-gelu-fusion", action="store_false", dest="bias_gelu_fusion")
    add("--make-vocab-size-divisible-by", type=int, default=128)
    add("--tensor-model-parallel-size", type=int, default=1)
    add("--pipeline-model-parallel-size", type=int, default=1)
    add("--context-parallel-size", type=int, default=1)
    add("--num-layers-per-virtual-pipeline-stage", type=int, default=None)
    add("--num-virtual-stages-per-pipeline-rank", type=int, default=None)
    add("--micro-batch-size", type=int, default=None)
    add("--global-batch-size", type=int, default=None)
    add("--weight-decay", type=float, default=0.01)
    add("--start-weight-decay", type=float)
    add("--end-weight-decay", type=float)
    add("--weight-decay-incr-style", type=str, default="constant")
    add("--sequence-parallel", action="store_true")
    add("--fp16", action="store_true")
    add("--bf16", action="store_true")
    return p


def derive(flags, world_size, vocab_size):
    args, _ = parser().parse_known_args(flags)  # the run's other flags play no part here
    tp, pp, cp = args.tensor_model_parallel_size, args.pipeline_model_parallel_size, args.context_parallel_size
    args.data_parallel_size = world_size // (tp * pp * cp)
    if args.global_batch_size is None:
        args.global_batch_size = args.micro_batch_size * args.data_parallel_size
    if args.num_layers_per_virtual_pipeline_stage is not None or \
            args.num_virtual_stages_per_pipeline_rank is not None:
        if args.num_virtual_stages_per_pipeline_rank is None:
            num_layers_per_pipeline_stage = args.num_layers // pp
            args.virtual_pipeline_model_parallel_size = \
                num_layers_per_pipeline_stage // args.num_layers_per_virtual_pipeline_stage
        else:
            args.virtual_pipeline_model_parallel_size = args.num_virtual_stages_per_pipeline_rank
        if args.virtual_pipeline_model_parallel_size == 1:
            args.virtual_pipeline_model_parallel_size = None
    else:
        args.virtual_pipeline_model_parallel_size = None
    args.params_dtype = torch.float
    if args.fp16:
        args.params_dtype = torch.half
    if args.bf16:
        args.params_dtype = torch.bfloat16
    args.encoder_num_layers = args.num_layers
    if args.ffn_hidden_size is None:
        if args.swiglu:
            args.ffn_hidden_size = int((4 * args.hidden_size * 2 / 3) / 64) * 64
        else:
            args.ffn_hidden_size = 4 * args.hidden_size
    if args.kv_channels is None:
        assert args.hidden_size % args.num_attention_heads == 0
        args.kv_channels = args.hidden_size // args.num_attention_heads
    args.encoder_seq_length = args.seq_length
    if args.weight_decay_incr_style == "constant":
        args.start_weight_decay = args.weight_decay
        args.end_weight_decay = args.weight_decay
    if tp == 1:
        args.sequence_parallel = False
    if not args.add_bias_linear:
        args.bias_gelu_fusion = False
    if args.add_bias_linear:
        args.add_qkv_bias = True
    if args.use_rotary_position_embeddings:
        args.position_embedding_type = "rope"
    # tokenizer.py: _vocab_size_with_padding
    after = vocab_size
    multiple = args.make_vocab_size_divisible_by * tp
    while after % multiple != 0:
        after += 1
    args.padded_vocab_size = after
    return args


COMPARED = ["ffn_hidden_size", "kv_channels", "num_query_groups", "group_query_attention",
            "padded_vocab_size", "virtual_pipeline_model_parallel_size", "global_batch_size",
            "data_parallel_size", "encoder_num_layers", "encoder_seq_length", "start_weight_decay",
            "end_weight_decay", "add_qkv_bias", "add_bias_linear", "bias_gelu_fusion",
            "position_embedding_type", "params_dtype", "sequence_parallel",
            "max_position_embeddings", "micro_batch_size"]


def check(vocab, world, save, flags):
    expect = derive(flags, world, vocab)
    with open(os.path.join(save, "latest_checkpointed_iteration.txt")) as f:
        it = int(f.read().strip())
    folder = os.path.join(save, "iter_%07d" % it)
    first = sorted(os.listdir(folder))[0]
    got = torch.load(os.path.join(folder, first, "model_optim_rng.pt"), map_location="cpu")["args"]
    mismatches = []
    for k in COMPARED:
        x, y = getattr(expect, k), getattr(got, k, "<missing>")
        if x != y or type(x) is not type(y) and not (isinstance(x, (int, float)) and isinstance(y, (int, float))):
            mismatches.append("%s: megatron %r, checkpoint %r" % (k, x, y))
    print(json.dumps({"save": save, "compared": COMPARED, "mismatches": mismatches}))


def main():
    assert sys.argv[1] == "check"
    with open(sys.argv[2]) as f:
        vocab = len(json.load(f))  # GPT2BPETokenizer: the encoder's entries
    with open(sys.argv[3]) as f:
        runs = json.load(f)
    for r in runs:
        check(vocab, r["world_size"], r["save"], r["flags"])


if __name__ == "__main__":
    main()
