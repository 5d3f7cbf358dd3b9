// GPT inference with a key/value cache: a LanguageModel for the generation loop, built from the
// weights of a Megatron-Core GPT (parameter names as in checkpoints:
// embedding.word_embeddings.weight, decoder.layers.{i}.self_attention.linear_qkv.weight, ...).
// Weights are copied to fp32 once; the cache holds fp32 K and V for [batch, groups, max_len, d]
// per layer, allocated by start(). Prefill runs the prompt tokens of every row as matrix
// products; each decode step appends one position. Attention reads only cached positions
// < the current one, so results equal a full causal forward pass over the same prefix.
//
// Architecture knobs follow Megatron's flags: LayerNorm or RMSNorm, GeLU (erf or tanh form) or
// SwiGLU, learned absolute or rotary position embeddings, grouped-query attention, biases on
// or off, tied or untied output layer.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "inference/language_model.h"
#include "model/gpt_model.h"
#include "model/parameter.h"

namespace megatron::inference {

struct GPTInferenceConfig {
  enum class Norm { LayerNorm, RMSNorm };
  enum class Activation { Gelu, GeluTanh, SwiGLU };
  enum class Position { LearnedAbsolute, Rope };

  int64_t num_layers = 0;
  int64_t hidden_size = 0;
  int64_t num_attention_heads = 0;
  int64_t num_query_groups = 0;   // 0: = num_attention_heads (no GQA)
  int64_t kv_channels = 0;        // 0: hidden_size / num_attention_heads
  int64_t ffn_hidden_size = 0;    // 0: 4 * hidden_size
  int64_t padded_vocab_size = 0;
  int64_t max_position_embeddings = 0;
  double layernorm_epsilon = 1e-5;
  Norm normalization = Norm::LayerNorm;
  Activation activation = Activation::Gelu;
  Position position_embedding_type = Position::LearnedAbsolute;
  double rotary_base = 10000.0;
  double rotary_percent = 1.0;
  bool add_bias_linear = true;
  bool add_qkv_bias = true;
  bool untie_embeddings_and_output_weights = false;

  // Resolves the defaults above and checks consistency (throws megatron::Error).
  GPTInferenceConfig resolved() const;
};

// Returns the named weight (any float dtype, CPU), or an undefined Tensor when there is none.
using WeightLookup = std::function<Tensor(const std::string& name)>;

// The inference configuration of a training GPTModel's configuration (local spec: LayerNorm,
// GeLU (tanh form unless gelu_tanh is off), learned absolute positions, biases, tied output).
GPTInferenceConfig inference_config(const model::GPTConfig& config);

// Weights from a model's parameters (Parameter::name -> Parameter::value), e.g. a GPTModel's
// parameters(); the list must outlive the lookup.
WeightLookup parameter_lookup(const model::ParameterList& params);

class GPTInference final : public LanguageModel {
 public:
  GPTInference(const GPTInferenceConfig& config, const WeightLookup& weights);

  int64_t vocab_size() const override { return cfg_.padded_vocab_size; }
  int64_t max_sequence_length() const override { return cfg_.max_position_embeddings; }
  void start(int64_t batch, int64_t max_len) override;
  Tensor forward(std::span<const int32_t> tokens, int64_t n, bool all_positions) override;
  void reorder(std::span<const int64_t> src) override;
  int64_t position() const override { return row_pos_.empty() ? 0 : row_pos_[0]; }
  bool supports_ragged() const override { return true; }
  Tensor prefill_ragged(std::span<const std::vector<int32_t>> prompts, bool all_positions) override;
  // Slots are rows of the same cache; a forward over some slots leaves the others as they are.
  bool supports_slots() const override { return true; }
  void start_slots(int64_t slots, int64_t max_len) override;
  void clear_slot(int64_t slot) override;
  void grow_slots(int64_t max_len) override;
  Tensor forward_slots(std::span<const int64_t> slots, std::span<const int32_t> tokens,
                       std::span<const int64_t> counts, bool all_positions) override;
  const GPTInferenceConfig& config() const { return cfg_; }

 private:
  struct Layer {
    std::vector<float> ln1_w, ln1_b, qkv_w, qkv_b, proj_w, proj_b;
    std::vector<float> ln2_w, ln2_b, fc1_w, fc1_b, fc2_w, fc2_b;
    std::vector<float> k_cache, v_cache;  // [batch, groups, max_len, d]
  };
  void norm(const float* x, const std::vector<float>& w, const std::vector<float>& b, float* y,
            int64_t rows) const;
  // Appends counts[b] tokens to cache row slots[b] at its own position (the lockstep forward is
  // every row with counts all n).
  Tensor run(std::span<const int64_t> slots, std::span<const int32_t> tokens,
             std::span<const int64_t> counts, bool all_positions);
  void attention(Layer& layer, float* qkv, float* ctx, std::span<const int64_t> slots,
                 std::span<const int64_t> counts);
  std::vector<int64_t> all_rows() const;  // 0 .. batch_ - 1
  void rope(float* vec, int64_t position) const;

  GPTInferenceConfig cfg_;
  int64_t heads_, groups_, d_, qkv_dim_, ffn_;
  std::vector<float> word_emb_, pos_emb_, final_w_, final_b_, output_w_;
  std::vector<Layer> layers_;
  std::vector<float> inv_freq_;
  int64_t batch_ = 0, max_len_ = 0;
  std::vector<int64_t> row_pos_;  // positions fed per row
};

}  // namespace megatron::inference
