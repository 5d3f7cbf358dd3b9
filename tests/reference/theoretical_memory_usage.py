#!/usr/bin/python3
"""Megatron-LM's theoretical memory footprint, written out independently for the plan tests.

What it follows: megatron/training/theoretical_memory_usage.py (compute_weight_and_optimizer_memory,
compute_activation_memory for sequence parallelism with selective recomputation,
compute_activation_memory_without_sp otherwise, report_theoretical_memory with verbose output) and
the argument processing of megatron/training/arguments.py that feeds it (kv_channels, the SwiGLU
FFN width, query groups, sequence parallelism dropped at TP 1, the virtual pipeline size, the data
parallel size, the padded vocabulary, micro-batches per iteration, --num-experts 0 read as None,
--moe-ffn-hidden-size defaulting to the FFN width, --moe-layer-freq read as moe_freq_type reads
it). Mixture-of-experts layers count num_experts expert MLPs and the shared expert in place of
the dense MLP; the multi-token-prediction and multi-latent-attention terms are zero.

Input (stdin): a JSON list of runs, each {"flags": {megatron flag name without dashes, with
underscores: value}, "world_size": N, "vocab_size": V}. Output (stdout): a JSON list with, per
run, the raw byte counts as Python floats (repr, so they read back exactly), the MB figures and
the lines Megatron prints.
"""
import json
import math
import sys

MIB = 1024 * 1024
# Flags of the runs that the formula does not read.
IGNORED = {"recompute_method", "recompute_num_layers", "bf16", "fp16", "position_embedding_type",
           "disable_bias_linear", "max_position_embeddings", "qk_layernorm", "use_rotary_position_embeddings",
           "moe_router_topk", "moe_aux_loss_coeff", "moe_router_load_balancing_type",
           "moe_expert_capacity_factor", "moe_pad_expert_input_to_capacity", "moe_z_loss_coeff"}


def moe_freq_type(x):
    """--moe-layer-freq: an int k, the same as a string, or a Python list expression."""
    if isinstance(x, int):
        return x
    if "[" in x:
        return eval(x, {"__builtins__": {}})
    return int(x)


def megatron_args(flags, world_size, vocab_size):
    """Megatron's args after parse_args/validate_args, for the fields the formula reads."""
    a = dict(
        num_layers=None, hidden_size=None, num_attention_heads=None, ffn_hidden_size=None,
        kv_channels=None, group_query_attention=False, num_query_groups=1, swiglu=False,
        normalization="LayerNorm", untie_embeddings_and_output_weights=False,
        seq_length=None, micro_batch_size=None, global_batch_size=None,
        tensor_model_parallel_size=1, pipeline_model_parallel_size=1, context_parallel_size=1,
        num_layers_per_virtual_pipeline_stage=None, use_distributed_optimizer=False,
        sequence_parallel=False, recompute_granularity=None, recompute_activations=False,
        make_vocab_size_divisible_by=128, num_experts=None, moe_ffn_hidden_size=None,
        moe_shared_expert_intermediate_size=None, moe_layer_freq=1)
    for k, v in flags.items():
        if k in IGNORED:
            continue
        if k not in a:
            raise SystemExit("unknown flag " + k)
        a[k] = v
    h, heads = a["hidden_size"], a["num_attention_heads"]
    if a["kv_channels"] is None:
        a["kv_channels"] = h // heads
    if a["ffn_hidden_size"] is None:
        a["ffn_hidden_size"] = int((4 * h * 2 / 3) / 64) * 64 if a["swiglu"] else 4 * h
    if a["num_experts"] == 0:
        a["num_experts"] = None
    if a["num_experts"] is not None and a["moe_ffn_hidden_size"] is None:
        a["moe_ffn_hidden_size"] = a["ffn_hidden_size"]
    a["moe_layer_freq"] = moe_freq_type(a["moe_layer_freq"])
    if a["recompute_activations"]:
        a["recompute_granularity"] = "selective"
    tp, pp, cp = (a["tensor_model_parallel_size"], a["pipeline_model_parallel_size"],
                  a["context_parallel_size"])
    if tp == 1:
        a["sequence_parallel"] = False
    a["data_parallel_size"] = world_size // (tp * pp * cp)
    per_stage = a["num_layers"] // pp
    nlv = a["num_layers_per_virtual_pipeline_stage"]
    a["virtual_pipeline_model_parallel_size"] = None if nlv is None else per_stage // nlv
    multiple = a["make_vocab_size_divisible_by"] * tp
    padded = vocab_size
    while padded % multiple != 0:
        padded += 1
    a["padded_vocab_size"] = padded
    gbs = a["global_batch_size"] or a["micro_batch_size"] * a["data_parallel_size"]
    num_microbatches = gbs // (a["micro_batch_size"] * a["data_parallel_size"])
    return a, num_microbatches


def weight_and_optimizer(a, out):
    n_heads, h = a["num_attention_heads"], a["hidden_size"]
    groups = a["num_query_groups"] if a["group_query_attention"] else n_heads
    q_ratio = (a["kv_channels"] * n_heads) / h
    glu = 3 / 2 if a["swiglu"] else 1
    norm = 1 if a["normalization"] == "RMSNorm" else 2
    experts = a["num_experts"]
    shared = a["moe_shared_expert_intermediate_size"] or 0
    if experts is None:
        pattern, expert_ffn, experts = [0] * a["num_layers"], 0, 1
    else:
        freq = a["moe_layer_freq"]
        pattern = ([1 if i % freq == 0 else 0 for i in range(a["num_layers"])]
                   if isinstance(freq, int) else freq)
        assert len(pattern) == a["num_layers"]
        expert_ffn = a["moe_ffn_hidden_size"]
    moe_layers = sum(pattern)
    dense_layers = a["num_layers"] - moe_layers
    attention = 2 * h * h * ((1 + (groups / n_heads)) * q_ratio)
    dense_layer = 2 * h * ((a["ffn_hidden_size"] * glu) + norm) + attention
    expert_layer = 2 * h * (+(expert_ffn * experts * glu) + (shared * glu) + norm) + attention
    table = h * a["padded_vocab_size"]
    embeddings = 2 * table if a["untie_embeddings_and_output_weights"] else table
    block = dense_layer * dense_layers + expert_layer * moe_layers + norm * h
    mtp = dense_layer * 0 + expert_layer * 0
    total = block + mtp + embeddings
    out.append(f"Number of parameters in transformer block in billions: {block / 10**9: .2f}")
    out.append(f"Number of parameters in embedding layers in billions: {embeddings / 10**9:.2f}")
    out.append(f"Total number of parameters in billions: {total / 10**9:.2f}")
    tp, pp = a["tensor_model_parallel_size"], a["pipeline_model_parallel_size"]
    shard = ((block / pp) + mtp + table) / tp
    if a["untie_embeddings_and_output_weights"] and pp == 1:
        shard += table / tp
    out.append(f"Number of parameters in most loaded shard in billions: {shard / 10**9:.4f}")
    if pp > 1:
        out.append(f"Number of parameters in other shards in billions: "
                   f"{block / (pp * tp) / 10**9:.4f}")
    per_param = 18 if not a["use_distributed_optimizer"] else 6 + (12 / a["data_parallel_size"])
    return shard * per_param


def in_flight(a, num_microbatches, memory, out):
    pp, vp = a["pipeline_model_parallel_size"], a["virtual_pipeline_model_parallel_size"]
    if vp is not None:
        penalty = 1 + ((pp - 1) / (pp * vp))
        out.append(f"Memory penalty from interleaved schedule: {penalty:.2f}")
        out.append(f"Number of in-flight microbatches: {math.ceil(penalty * pp)}")
        memory *= penalty
    if vp is None and pp > 1:
        memory *= min(1, num_microbatches / pp)
        out.append(f"Number of in-flight microbatches: {min(num_microbatches, pp)}")
    return memory


def activations_sp(a, num_microbatches, out):
    s, b, h = a["seq_length"], a["micro_batch_size"], a["hidden_size"]
    tp, pp = a["tensor_model_parallel_size"], a["pipeline_model_parallel_size"]
    memory = (s * b * h) * (18 + (4 * (a["ffn_hidden_size"] / h)))
    out.append(f"Activation memory footprint per transformer layer: {memory / MIB / tp:.1f} MB")
    memory *= a["num_layers"]
    memory += 8 * s * b * pp
    memory += s * b * h * pp
    memory = in_flight(a, num_microbatches, memory, out)
    if pp == 1:
        memory += s * b * h * 4 * (1 + (a["padded_vocab_size"] / h))
    return memory / tp


def activations_without_sp(a, num_microbatches, out):
    s, b, h = a["seq_length"], a["micro_batch_size"], a["hidden_size"]
    tp, pp = a["tensor_model_parallel_size"], a["pipeline_model_parallel_size"]
    per_layer = s * b * h * (10 + (24 / tp))
    out.append("Activation memory footprint per transformer layer (precise, without SP): "
               f"{per_layer / MIB:.1f} MB")
    memory = per_layer * a["num_layers"]
    memory += 8 * s * b * pp
    memory += s * b * h * pp
    memory = in_flight(a, num_microbatches, memory, out)
    if pp == 1:
        logits = s * b * a["padded_vocab_size"]
        logits /= tp
        memory += (logits + s * b * h) * 2
    return memory * 1.05


def report(run):
    a, num_microbatches = megatron_args(run["flags"], run["world_size"], run["vocab_size"])
    lines = []
    weights = weight_and_optimizer(a, lines)
    if a["sequence_parallel"] and a["recompute_granularity"] == "selective":
        lines.append("compute_activation_memory with SP")
        act = activations_sp(a, num_microbatches, lines)
    else:
        lines.append("compute_activation_memory_without_sp")
        act = activations_without_sp(a, num_microbatches, lines)
    weights_mb, act_mb = weights / MIB, act / MIB
    total_mb = weights_mb + act_mb
    lines.append(f"Theoretical memory footprints: weight and optimizer={weights_mb:.2f} MB, "
                 f"activation={act_mb:.2f} MB, total={total_mb:.2f} MB")
    return {"weight_and_optimizer_bytes": weights, "activation_bytes": act,
            "weight_and_optimizer_mb": weights_mb, "activation_mb": act_mb,
            "total_mb": total_mb, "num_microbatches": num_microbatches,
            "padded_vocab_size": a["padded_vocab_size"], "lines": lines}


if __name__ == "__main__":
    json.dump([report(r) for r in json.load(sys.stdin)], sys.stdout)
