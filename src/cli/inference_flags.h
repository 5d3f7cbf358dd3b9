// Megatron's model, tokenizer and checkpoint flags for the commands that load a model for
// generation (generate, serve). The flags fill an InferenceModelOptions; finish() resolves the
// flag combinations (e.g. --group-query-attention needs --num-query-groups) after parsing.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>

#include "cli/tokenizer_options.h"
#include "core/error.h"
#include "inference/model_loader.h"

namespace megatron::cli {

struct InferenceFlags {
  inference::InferenceModelOptions options;
  int64_t ckpt_step = -1;
  int64_t seq_length = 0;
  bool group_query_attention = false;
  bool swiglu = false;
  bool openai_gelu = false;
  bool no_bias_gelu_fusion = false;
  bool disable_bias_linear = false;
  bool add_qkv_bias = false;
  std::string normalization = "LayerNorm";
  std::string position_embedding_type = "learned_absolute";

  void add(CLI::App& sub) {
    auto& o = options;
    auto& g = o.gpt;
    sub.add_option("--load", o.load, "Checkpoint folder (Megatron layout)")->required();
    sub.add_option("--ckpt-step", ckpt_step, "Iteration to load instead of the latest");
    sub.add_option("--num-layers", g.num_layers, "Transformer layers")->required();
    sub.add_option("--hidden-size", g.hidden_size, "Hidden size")->required();
    sub.add_option("--num-attention-heads", g.num_attention_heads, "Attention heads")->required();
    sub.add_option("--ffn-hidden-size", g.ffn_hidden_size, "MLP hidden size (default 4 x hidden)");
    sub.add_option("--kv-channels", g.kv_channels, "Per-head size (default hidden / heads)");
    sub.add_flag("--group-query-attention", group_query_attention, "Grouped-query attention");
    sub.add_option("--num-query-groups", g.num_query_groups, "Query groups with --group-query-attention");
    sub.add_option("--max-position-embeddings", g.max_position_embeddings,
                   "Longest sequence (default --seq-length)");
    sub.add_option("--seq-length", seq_length, "Training sequence length");
    sub.add_option("--normalization", normalization, "LayerNorm or RMSNorm")
        ->check(CLI::IsMember({"LayerNorm", "RMSNorm"}))
        ->capture_default_str();
    sub.add_option("--norm-epsilon,--layernorm-epsilon", g.layernorm_epsilon, "Norm epsilon")
        ->capture_default_str();
    sub.add_flag("--swiglu", swiglu, "SwiGLU MLP");
    sub.add_flag("--openai-gelu", openai_gelu, "GeLU in its tanh approximation");
    sub.add_flag("--no-bias-gelu-fusion", no_bias_gelu_fusion,
                 "Exact (erf) GeLU; Megatron's default fused bias-GeLU is the tanh form");
    sub.add_option("--position-embedding-type", position_embedding_type, "learned_absolute or rope")
        ->check(CLI::IsMember({"learned_absolute", "rope"}))
        ->capture_default_str();
    sub.add_option("--rotary-percent", g.rotary_percent, "Fraction of each head rotated")
        ->capture_default_str();
    sub.add_option("--rotary-base", g.rotary_base, "Rotary base")->capture_default_str();
    sub.add_flag("--disable-bias-linear", disable_bias_linear, "No biases in linear layers");
    sub.add_flag("--add-qkv-bias", add_qkv_bias, "QKV bias even with --disable-bias-linear");
    sub.add_flag("--untie-embeddings-and-output-weights", g.untie_embeddings_and_output_weights,
                 "Separate output layer");
    sub.add_option("--make-vocab-size-divisible-by", o.make_vocab_size_divisible_by,
                   "Vocabulary padding multiple")
        ->capture_default_str();
    add_tokenizer_options(sub, o.tokenizer)->required();
  }

  inference::InferenceModelOptions finish() {
    auto o = options;
    auto& g = o.gpt;
    if (ckpt_step >= 0) o.ckpt_step = ckpt_step;
    MG_REQUIRE(!group_query_attention || g.num_query_groups > 0,
               "--group-query-attention needs --num-query-groups");
    if (!group_query_attention) g.num_query_groups = 0;
    if (g.max_position_embeddings == 0) g.max_position_embeddings = seq_length;
    MG_REQUIRE(g.max_position_embeddings > 0, "pass --max-position-embeddings or --seq-length");
    MG_REQUIRE(seq_length == 0 || seq_length <= g.max_position_embeddings || position_embedding_type == "rope",
               "--seq-length ", seq_length, " exceeds --max-position-embeddings ",
               g.max_position_embeddings);
    g.normalization = normalization == "RMSNorm" ? inference::GPTInferenceConfig::Norm::RMSNorm
                                                 : inference::GPTInferenceConfig::Norm::LayerNorm;
    // Megatron: SwiGLU; else --openai-gelu or the fused bias-GeLU (default, needs biases) use the
    // tanh approximation; otherwise F.gelu (erf).
    const bool tanh_gelu = openai_gelu || (!no_bias_gelu_fusion && !disable_bias_linear);
    g.activation = swiglu      ? inference::GPTInferenceConfig::Activation::SwiGLU
                   : tanh_gelu ? inference::GPTInferenceConfig::Activation::GeluTanh
                               : inference::GPTInferenceConfig::Activation::Gelu;
    g.position_embedding_type = position_embedding_type == "rope"
                                    ? inference::GPTInferenceConfig::Position::Rope
                                    : inference::GPTInferenceConfig::Position::LearnedAbsolute;
    g.add_bias_linear = !disable_bias_linear;
    g.add_qkv_bias = !disable_bias_linear || add_qkv_bias;
    return o;
  }
};

}  // namespace megatron::cli
