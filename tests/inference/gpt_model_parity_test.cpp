// The inference engine on a training GPTModel's weights: KV-cache decoding reproduces
// GPTModel::forward_logits over the same prefix, and greedy generation equals generation by
// recomputing the whole prefix with forward_logits at every step, for every architecture the
// layer spec builds (GeLU forms, Llama-style, per-head q/k norms, ALiBi, sliding window,
// interleaved partial rotary, zero-centred norms).
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <string>

#include "inference/generation.h"
#include "inference/gpt_engine.h"
#include "model/gpt_model.h"

namespace megatron::inference {
namespace {

model::TransformerConfig tiny_model_config() {
  model::TransformerConfig c;
  c.num_layers = 2;
  c.hidden_size = 32;
  c.num_attention_heads = 4;
  c.seq_length = 16;
  c.max_position_embeddings = 16;
  c.padded_vocab_size = 64;
  c.hidden_dropout = 0.0f;
  c.attention_dropout = 0.0f;
  c.init_method_std = 0.2f;  // large enough that logits differ clearly between tokens
  return c;
}

// Logits [s, V] of one sequence from the training model.
std::vector<float> model_logits(model::GPTModel& m, const std::vector<int32_t>& tokens) {
  const int64_t s = int64_t(tokens.size());
  std::vector<int32_t> pos(tokens.size());
  for (int64_t i = 0; i < s; ++i) pos[size_t(i)] = int32_t(i);
  const Tensor t = Tensor::from_vector(tokens, {1, s});
  const Tensor p = Tensor::from_vector(pos, {1, s});
  return m.forward_logits(t, p).to_float_vector();
}

// The configuration named by the test parameter.
model::TransformerConfig config_for(const std::string& name) {
  model::TransformerConfig c = tiny_model_config();
  if (name == "ErfGelu") c.activation = "gelu";
  if (name == "Llama" || name == "LlamaQkNormInterleaved") {
    c.normalization = "RMSNorm";
    c.activation = "swiglu";
    c.position_embedding_type = "rope";
    c.num_query_groups = 2;
    c.ffn_hidden_size = 48;
    c.add_bias_linear = false;
    c.untie_embeddings_and_output_weights = true;
  }
  if (name == "LlamaQkNormInterleaved") {
    c.qk_layernorm = true;
    c.rotary_interleaved = true;
    c.rotary_percent = 0.5f;
    c.apply_layernorm_1p = true;
  }
  if (name == "AlibiWindowSquaredRelu") {
    c.position_embedding_type = "alibi";
    c.window_left = 5;
    c.activation = "squared_relu";
  }
  return c;
}

// The model's own parameters as the engine's weights.
std::map<std::string, Tensor> weights_of(model::GPTModel& m) {
  std::map<std::string, Tensor> w;
  for (model::Parameter* p : m.parameters()) w[p->name] = p->value;
  return w;
}

class GPTModelParity : public ::testing::TestWithParam<std::string> {};

TEST_P(GPTModelParity, CachedDecodingEqualsForwardLogits) {
  model::TransformerConfig mc = config_for(GetParam());
  model::GPTModel m(mc, 1234);
  GPTEngine engine(mc, weights_of(m));
  const std::vector<int32_t> tokens = {3, 17, 42, 5, 9, 60, 1, 33, 8, 2, 50, 11};
  const auto want = model_logits(m, tokens);
  const int64_t V = mc.padded_vocab_size, s = int64_t(tokens.size());
  engine.start(1, s);
  const Tensor pre = engine.forward(std::span(tokens).first(4), 4, true);
  double worst = 0.0;
  for (int64_t j = 0; j < 4; ++j)
    for (int64_t v = 0; v < V; ++v)
      worst = std::max(worst, double(std::abs(pre.data<float>()[j * V + v] - want[size_t(j * V + v)])));
  for (int64_t j = 4; j < s; ++j) {
    const Tensor l = engine.decode_step(std::span(tokens).subspan(size_t(j), 1));
    for (int64_t v = 0; v < V; ++v)
      worst = std::max(worst, double(std::abs(l.data<float>()[v] - want[size_t(j * V + v)])));
  }
  EXPECT_LT(worst, 1e-5);
}

TEST_P(GPTModelParity, GreedyGenerationAndLogprobsEqualRecomputation) {
  model::TransformerConfig mc = config_for(GetParam());
  model::GPTModel m(mc, 99);
  GPTEngine engine(mc, weights_of(m));
  std::vector<SequenceRequest> rows(1);
  rows[0].prompt = {7, 8, 9};
  rows[0].tokens_to_generate = 10;
  rows[0].sampling.top_k = 1;
  rows[0].return_logprobs = true;
  const auto out = generate(engine, rows, 60, SpecialTokens{});
  // Reference: argmax of forward_logits over the whole prefix at every step.
  std::vector<int32_t> seq = rows[0].prompt;
  for (int step = 0; step < 10; ++step) {
    const auto logits = model_logits(m, seq);
    const float* last = logits.data() + (seq.size() - 1) * size_t(mc.padded_vocab_size);
    seq.push_back(int32_t(std::max_element(last, last + 60) - last));
  }
  EXPECT_EQ(out[0].tokens, seq);
  // Log-probs: log-softmax of one full forward pass over the final sequence.
  const auto logits = model_logits(m, seq);
  ASSERT_EQ(out[0].logprobs.size(), seq.size() - 1);
  for (size_t j = 1; j < seq.size(); ++j) {
    const float* row = logits.data() + (j - 1) * size_t(mc.padded_vocab_size);
    double mx = -1e30, sum = 0.0;
    for (int64_t v = 0; v < mc.padded_vocab_size; ++v) mx = std::max(mx, double(row[v]));
    for (int64_t v = 0; v < mc.padded_vocab_size; ++v) sum += std::exp(double(row[v]) - mx);
    EXPECT_NEAR(out[0].logprobs[j - 1], double(row[seq[j]]) - mx - std::log(sum), 1e-5) << j;
  }
}

INSTANTIATE_TEST_SUITE_P(Architectures, GPTModelParity,
                         ::testing::Values("TanhGelu", "ErfGelu", "Llama", "LlamaQkNormInterleaved",
                                           "AlibiWindowSquaredRelu"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace megatron::inference
