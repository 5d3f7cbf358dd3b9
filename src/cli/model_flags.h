// Megatron's model-architecture flags, one definition for every command that builds a model
// (pretrain-gpt, generate, serve): sizes, normalization, activation, position embeddings,
// attention, biases, tied or untied output, regularisation. add() registers them; resolve() turns
// them into a model::TransformerConfig with Megatron's rules (the activation that --swiglu,
// --squared-relu, --openai-gelu, --no-bias-gelu-fusion and --disable-bias-linear select; query
// groups only with --group-query-attention; --no-position-embedding). The names of norms and
// activations come from the layer-spec tables (model/layer_spec.h).
#pragma once

#include <CLI/CLI.hpp>
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "model/transformer_config.h"

namespace megatron::cli {

struct ModelFlags {
  model::TransformerConfig config;  // sizes and plain fields are written here directly
  bool group_query_attention = false;
  int num_query_groups = 1;  // Megatron's default, used only with --group-query-attention
  // Per entry of model::activation_kinds() that has a flag (--swiglu, --squared-relu): given.
  std::array<bool, 16> activation_selected{};
  bool openai_gelu = false, no_bias_gelu_fusion = false, disable_bias_linear = false;
  bool no_position_embedding = false, use_rotary_position_embeddings = false;
  std::vector<std::string> window_size;  // "L R" or Megatron's "L,R"
  double hidden_dropout = 0.1, attention_dropout = 0.1;
  // The Ascend scripts' band of keys around each query (model::apply_ascend_band).
  int64_t pre_tockens = 65536, next_tockens = 0;

  // `training`: also the regularisation flags (dropouts, init).
  void add(CLI::App& app, bool training);
  // The configuration the flags describe (sizes not given stay 0). Throws megatron::Error for
  // contradictory flags, naming them.
  model::TransformerConfig resolve() const;
  // With --pre-tockens / --next-tockens given: the window they describe for `c` once its sequence
  // length and mask are final (model::apply_ascend_band); an Error when --window-size is given
  // too, or when `c` already has another window (a checkpoint's).
  void apply_band(model::TransformerConfig& c) const;
  // Whether `flag` was given on the command line (after parsing).
  bool given(const std::string& flag) const;

 private:
  CLI::App* app_ = nullptr;
};

}  // namespace megatron::cli
