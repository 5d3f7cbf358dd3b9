// The generation engine (the model's own layers with a KV cache): incremental decoding equals a
// full causal forward over the same prefix, and both equal a PyTorch reference
// (tests/reference/generate_reference.py) on the same random weights, for a GPT-2 style and a
// Llama style configuration; a mixture-of-experts model decodes as it recomputes.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "core/rng.h"
#include "inference/beam_search.h"
#include "inference/generation.h"
#include "inference/gpt_engine.h"
#include "kernels/cpu/cpu_attention_bf16.h"
#include "test_util.h"
#include "tiny_gpt.h"

namespace megatron::inference {
namespace {

using Config = model::TransformerConfig;
using testing::gpt2_config;
using testing::llama_config;
using testing::random_weights;
using testing::Weights;

// The same network without a cache: every forward recomputes the whole prefix.
class RecomputeModel final : public LanguageModel {
 public:
  explicit RecomputeModel(GPTEngine& inner) : inner_(inner) {}
  int64_t vocab_size() const override { return inner_.vocab_size(); }
  int64_t max_sequence_length() const override { return inner_.max_sequence_length(); }
  void start(int64_t batch, int64_t) override { rows_.assign(size_t(batch), {}); }
  Tensor forward(std::span<const int32_t> tokens, int64_t n, bool all_positions) override {
    const int64_t b = int64_t(rows_.size());
    for (int64_t i = 0; i < b; ++i)
      rows_[i].insert(rows_[i].end(), tokens.begin() + i * n, tokens.begin() + (i + 1) * n);
    const int64_t len = int64_t(rows_[0].size());
    std::vector<int32_t> all;
    for (auto& r : rows_) all.insert(all.end(), r.begin(), r.end());
    inner_.start(b, len);
    Tensor full = inner_.forward(all, len, true);
    return full.narrow(1, all_positions ? len - n : len - 1, all_positions ? n : 1).contiguous();
  }
  void reorder(std::span<const int64_t> src) override {
    std::vector<std::vector<int32_t>> next;
    for (int64_t s : src) next.push_back(rows_[size_t(s)]);
    rows_ = next;
  }
  int64_t position() const override { return rows_.empty() ? 0 : int64_t(rows_[0].size()); }

 private:
  GPTEngine& inner_;
  std::vector<std::vector<int32_t>> rows_;
};

// Three rows with prompts of 1, 3 and 5 tokens, log-probs on; row 1 samples at temperature 0.7,
// row 2 with top-p 0.8 (row 0 as set by the caller).
std::vector<SequenceRequest> sampled_rows(int64_t tokens_to_generate, uint64_t seed) {
  std::vector<SequenceRequest> rows(3);
  for (int i = 0; i < 3; ++i) {
    for (int j = 0; j <= 2 * i; ++j) rows[i].prompt.push_back(int32_t((i * 11 + j * 3) % 60));
    rows[i].tokens_to_generate = tokens_to_generate;
    rows[i].return_logprobs = true;
    rows[i].seed = seed;
    rows[i].sequence = uint64_t(i);
  }
  rows[1].sampling.temperature = 0.7f;
  rows[2].sampling.top_p = 0.8f;
  return rows;
}

class GPTEngineTest : public ::testing::TestWithParam<int> {
 protected:
  Config config() const {
    if (GetParam() == 2) return llama_config();
    Config c = gpt2_config();
    if (GetParam() == 1) c.activation = "gelu";  // --no-bias-gelu-fusion
    return c;
  }
};

TEST_P(GPTEngineTest, DecodingWithTheCacheEqualsAFullForward) {
  const Config c = config();
  const Weights w = random_weights(c);
  GPTEngine model(c, w);
  const int64_t b = 2, s = 12;
  std::vector<int32_t> tokens;
  for (int64_t i = 0; i < b * s; ++i) tokens.push_back(int32_t((i * 37 + 5) % 60));
  model.start(b, s);
  const Tensor full = model.forward(tokens, s, true);
  // Prefill 5 positions, then one token per step.
  model.start(b, s);
  const int64_t p = 5;
  std::vector<int32_t> prefix;
  for (int64_t i = 0; i < b; ++i)
    prefix.insert(prefix.end(), tokens.begin() + i * s, tokens.begin() + i * s + p);
  Tensor part = model.forward(prefix, p, true);
  float worst = 0.0f;
  for (int64_t i = 0; i < b; ++i)
    for (int64_t j = 0; j < p; ++j)
      for (int64_t v = 0; v < c.padded_vocab_size; ++v)
        worst = std::max(worst, std::abs(part.data<float>()[(i * p + j) * c.padded_vocab_size + v] -
                                         full.data<float>()[(i * s + j) * c.padded_vocab_size + v]));
  for (int64_t j = p; j < s; ++j) {
    std::vector<int32_t> step = {tokens[size_t(j)], tokens[size_t(s + j)]};
    Tensor l = model.decode_step(step);
    for (int64_t i = 0; i < b; ++i)
      for (int64_t v = 0; v < c.padded_vocab_size; ++v)
        worst = std::max(worst, std::abs(l.data<float>()[i * c.padded_vocab_size + v] -
                                         full.data<float>()[(i * s + j) * c.padded_vocab_size + v]));
  }
  EXPECT_LT(worst, 1e-5f);
}

TEST_P(GPTEngineTest, GenerationAndBeamSearchEqualRecomputation) {
  const Config c = config();
  const Weights w = random_weights(c);
  GPTEngine cached(c, w), inner(c, w);
  RecomputeModel recompute(inner);
  std::vector<SequenceRequest> rows = sampled_rows(8, 7);
  rows[0].sampling.top_k = 1;
  SpecialTokens special;
  const auto a = generate(cached, rows, 60, special);
  const auto b = generate(recompute, rows, 60, special);
  for (size_t i = 0; i < rows.size(); ++i) {
    EXPECT_EQ(a[i].tokens, b[i].tokens) << i;
    ASSERT_EQ(a[i].logprobs.size(), b[i].logprobs.size());
    for (size_t j = 0; j < a[i].logprobs.size(); ++j) EXPECT_NEAR(a[i].logprobs[j], b[i].logprobs[j], 1e-5);
  }
  BeamSearchRequest req;
  req.prompt = {3, 14, 15};
  req.tokens_to_generate = 6;
  req.beam_width = 3;
  req.stop_token = 9;
  const auto ha = beam_search(cached, req, 60), hb = beam_search(recompute, req, 60);
  ASSERT_EQ(ha.size(), hb.size());
  for (size_t i = 0; i < ha.size(); ++i) {
    EXPECT_EQ(ha[i].tokens, hb[i].tokens);
    EXPECT_NEAR(ha[i].score, hb[i].score, 1e-5);
  }
}

// A mixture-of-experts model (layer 1: 4 SwiGLU experts, top-2, a gated shared expert) decodes
// with the cache as it recomputes: inference routes each token alone (no capacity), so the
// experts a token gets do not depend on the other tokens of the forward.
TEST(GPTEngine, MixtureOfExpertsGenerationEqualsRecomputation) {
  Config c = llama_config();
  c.num_moe_experts = 4;
  c.moe_layer_freq = "[0,1]";
  c.moe_ffn_hidden_size = 24;
  c.moe_router_topk = 2;
  c.moe_shared_expert_intermediate_size = 16;
  c.moe_shared_expert_gate = true;
  Weights w = random_weights(c);
  w.erase("decoder.layers.1.mlp.linear_fc1.weight");
  w.erase("decoder.layers.1.mlp.linear_fc2.weight");
  uint64_t stream = 100;
  auto add = [&](const std::string& name, Shape shape, float stddev) {
    Tensor t = Tensor::empty(shape, DType::F32);
    Philox(99, stream++).fill_normal(t.data<float>(), t.numel(), 0.0f, stddev);
    w[name] = t;
  };
  const std::string m = "decoder.layers.1.mlp.";
  add(m + "router.weight", {4, c.hidden_size}, 1.0f);
  for (int e = 0; e < 4; ++e) {
    const std::string x = m + "experts.local_experts." + std::to_string(e) + ".";
    add(x + "linear_fc1.weight", {48, c.hidden_size}, 0.3f);
    add(x + "linear_fc2.weight", {c.hidden_size, 24}, 0.3f);
  }
  add(m + "shared_experts.linear_fc1.weight", {32, c.hidden_size}, 0.3f);
  add(m + "shared_experts.linear_fc2.weight", {c.hidden_size, 16}, 0.3f);
  add(m + "shared_experts.gate_weight", {1, c.hidden_size}, 0.5f);
  GPTEngine cached(c, w), inner(c, w);
  RecomputeModel recompute(inner);
  std::vector<SequenceRequest> rows = sampled_rows(10, 5);
  SpecialTokens special;
  const auto a = generate(cached, rows, 60, special);
  const auto b = generate(recompute, rows, 60, special);
  for (size_t i = 0; i < rows.size(); ++i) {
    EXPECT_EQ(a[i].tokens, b[i].tokens) << i;
    EXPECT_GT(a[i].tokens.size(), rows[i].prompt.size()) << i;
    ASSERT_EQ(a[i].logprobs.size(), b[i].logprobs.size());
    for (size_t j = 0; j < a[i].logprobs.size(); ++j) EXPECT_NEAR(a[i].logprobs[j], b[i].logprobs[j], 1e-5);
  }
}

TEST_P(GPTEngineTest, MatchesThePyTorchReference) {
  const Config c = config();
  const Weights w = random_weights(c);
  megatron::testing::TempDir dir;
  nlohmann::json spec;
  spec["config"] = {{"num_layers", c.num_layers}, {"num_attention_heads", c.num_attention_heads},
                    {"num_query_groups", c.query_groups()}, {"kv_channels", c.head_dim()},
                    {"padded_vocab_size", c.padded_vocab_size},
                    {"layernorm_epsilon", c.layernorm_epsilon},
                    {"normalization", c.normalization},
                    {"activation", c.activation == "gelu" ? "Gelu"
                                   : c.activation == "gelu_tanh" ? "GeluTanh" : "SwiGLU"},
                    {"position_embedding_type",
                     c.rope() ? "Rope" : "LearnedAbsolute"},
                    {"rotary_base", c.rotary_base}, {"rotary_percent", c.rotary_percent}};
  std::ofstream bin(dir / "w.bin", std::ios::binary);
  int64_t offset = 0;
  for (const auto& [name, t] : w) {
    bin.write(static_cast<const char*>(t.raw_data()), std::streamsize(t.nbytes()));
    spec["tensors"][name] = {{"shape", t.shape()}, {"offset", offset}};
    offset += t.numel();
  }
  bin.close();
  const std::vector<std::vector<int32_t>> prompts = {{1, 2, 3, 4, 5, 6}, {7, 50, 9, 10, 11, 12}};
  spec["weights_file"] = "w.bin";
  spec["tokens"] = prompts;
  spec["generate"] = 6;
  spec["vocab"] = 60;
  megatron::testing::write_file(dir / "model.json", spec.dump());
  const auto run = megatron::testing::run_command(
      "/usr/bin/python3 " + (megatron::testing::source_dir() / "tests/reference/generate_reference.py").string() +
      " " + (dir / "model.json").string());
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const auto ref = nlohmann::json::parse(run.output);

  GPTEngine model(c, w);
  std::vector<int32_t> flat;
  for (const auto& p : prompts) flat.insert(flat.end(), p.begin(), p.end());
  model.start(2, 6);
  const Tensor logits = model.forward(flat, 6, true);
  double worst = 0.0;
  for (int64_t i = 0; i < 2; ++i)
    for (int64_t j = 0; j < 6; ++j)
      for (int64_t v = 0; v < c.padded_vocab_size; ++v)
        worst = std::max(worst, std::abs(double(logits.data<float>()[(i * 6 + j) * c.padded_vocab_size + v]) -
                                         ref["logits"][i][j][v].get<double>()));
  EXPECT_LT(worst, 1e-4);

  std::vector<SequenceRequest> rows(2);
  for (int i = 0; i < 2; ++i) {
    rows[i].prompt = prompts[size_t(i)];
    rows[i].tokens_to_generate = 6;
    rows[i].sampling.top_k = 1;
    rows[i].return_logprobs = true;
  }
  const auto out = generate(model, rows, 60, SpecialTokens{});
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(out[i].tokens, ref["greedy"][i].get<std::vector<int32_t>>()) << i;
    // Prompt log-probs: log-softmax of the reference logits.
    for (int j = 1; j < 6; ++j) {
      const auto& row = ref["logits"][i][j - 1];
      double mx = -1e300, sum = 0.0;
      for (const auto& v : row) mx = std::max(mx, v.get<double>());
      for (const auto& v : row) sum += std::exp(v.get<double>() - mx);
      const double lp = row[prompts[size_t(i)][size_t(j)]].get<double>() - mx - std::log(sum);
      EXPECT_NEAR(out[i].logprobs[size_t(j - 1)], lp, 1e-4);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Configs, GPTEngineTest, ::testing::Values(0, 1, 2), [](const auto& info) {
  return info.param == 0 ? "GPT2Style" : info.param == 1 ? "GPT2StyleErfGelu" : "LlamaStyle";
});

// bf16 weights are kept in the configuration's dtype and computed in fp32: close to, not equal
// to, the fp32 weights.
// The model on the checking device (memory host code cannot touch outside ops and explicit
// copies): sampling, log-probs, slots of the continuous batcher and beam search give exactly the
// CPU run's results, so generation reads and writes the model's tensors only through ops.
TEST_P(GPTEngineTest, GenerationOnTheCheckingDeviceEqualsTheCpu) {
  Config c = config();
  if (GetParam() == 0) c.params_dtype = DType::BF16;  // weights cast into working copies there
  const Weights w = random_weights(c);
  GPTEngine cpu(c, w), dev(c, w, megatron::testing::checked_device());
  EXPECT_TRUE(dev.model().parameters()[0]->value.device().is_checked());
  std::vector<SequenceRequest> rows = sampled_rows(7, 11);
  const auto a = generate(cpu, rows, 60, SpecialTokens{});
  const auto b = generate(dev, rows, 60, SpecialTokens{});
  for (size_t i = 0; i < rows.size(); ++i) {
    EXPECT_EQ(a[i].tokens, b[i].tokens) << i;
    EXPECT_EQ(a[i].logprobs, b[i].logprobs) << i;
  }
  // Slots as the continuous batcher drives them: ragged prefill, one slot decoding, a cleared
  // slot reused, the cache grown.
  for (GPTEngine* e : {&cpu, &dev}) e->start_slots(2, 8);
  const std::vector<int64_t> both = {0, 1}, one = {1};
  const std::vector<int32_t> prompt = {5, 6, 7, 8, 9};
  const std::vector<int64_t> counts = {3, 2}, single = {1};
  const std::vector<int32_t> next = {21};
  std::vector<Tensor> out[2];
  int k = 0;
  for (GPTEngine* e : {&cpu, &dev}) {
    out[k].push_back(e->forward_slots(both, prompt, counts, true));
    out[k].push_back(e->forward_slots(one, next, single, false));
    e->clear_slot(0);
    e->grow_slots(12);
    out[k].push_back(e->forward_slots(both, prompt, counts, false));
    ++k;
  }
  for (size_t i = 0; i < out[0].size(); ++i) {
    EXPECT_TRUE(out[1][i].device().is_cpu());
    EXPECT_EQ(out[0][i].to_float_vector(), out[1][i].to_float_vector()) << "call " << i;
  }
  BeamSearchRequest req;
  req.prompt = {3, 14, 15};
  req.tokens_to_generate = 5;
  req.beam_width = 3;
  req.stop_token = 9;
  const auto ha = beam_search(cpu, req, 60), hb = beam_search(dev, req, 60);
  ASSERT_EQ(ha.size(), hb.size());
  for (size_t i = 0; i < ha.size(); ++i) {
    EXPECT_EQ(ha[i].tokens, hb[i].tokens);
    EXPECT_EQ(ha[i].score, hb[i].score);
  }
  // An input outside the vocabulary is still a clear error there.
  dev.start(1, 4);
  const std::vector<int32_t> bad = {1, int32_t(c.padded_vocab_size)};
  EXPECT_THROW(dev.forward(bad, 2, false), Error);
}

TEST(GPTEngine, HalfPrecisionWeights) {
  Config c = gpt2_config();
  const Weights w = random_weights(c);
  Config c16 = c;
  c16.params_dtype = DType::BF16;
  GPTEngine bf16(c16, w), fp32(c, w);
  EXPECT_EQ(bf16.model().parameters()[0]->value.dtype(), DType::BF16);
  std::vector<int32_t> tokens = {1, 2, 3, 4};
  bf16.start(1, 4);
  fp32.start(1, 4);
  const Tensor a = bf16.forward(tokens, 4, false), b = fp32.forward(tokens, 4, false);
  double worst = 0.0;
  for (int64_t v = 0; v < c.padded_vocab_size; ++v)
    worst = std::max(worst, double(std::abs(a.data<float>()[v] - b.data<float>()[v])));
  EXPECT_LT(worst, 0.1);
  EXPECT_GT(worst, 0.0);
}

// bf16 weights on the CPU keep the KV cache in bf16 (half the bytes a decode step reads): cached
// decoding (prefill on the packed bf16 products, then one row per step read from the cache in
// place) follows the full forward over the same prefix, which runs the same bf16 attention, at
// bf16 tolerance, on the CPU's bf16 unit and on the forced fp32 unit; and stays within the bf16
// weights' distance of the fp32 model.
TEST(GPTEngine, Bf16WeightsDecodeFromABf16Cache) {
  Config c = gpt2_config();
  const Weights w = random_weights(c);
  Config c16 = c;
  c16.params_dtype = DType::BF16;
  GPTEngine model(c16, w), fp32(c, w);
  const int64_t b = 2, s = 12, p = 5, V = c.padded_vocab_size;
  std::vector<int32_t> tokens;
  for (int64_t i = 0; i < b * s; ++i) tokens.push_back(int32_t((i * 37 + 5) % 60));
  fp32.start(b, s);
  const std::vector<float> ref32 = fp32.forward(tokens, s, true).to_float_vector();
  EXPECT_EQ(fp32.cache().key_cache[0].dtype(), DType::F32);
  for (const ops::cpu::Bf16Unit unit : ops::cpu::bf16_units_available()) {
    ops::cpu::set_bf16_tile_unit(unit);
    SCOPED_TRACE(ops::cpu::bf16_unit_name(unit));
    model.start(b, s);
    EXPECT_EQ(model.cache().key_cache[0].dtype(), DType::BF16);
    EXPECT_EQ(model.cache().value_cache[1].dtype(), DType::BF16);
    const std::vector<float> full = model.forward(tokens, s, true).to_float_vector();
    model.start(b, s);
    std::vector<int32_t> prefix;
    for (int64_t i = 0; i < b; ++i)
      prefix.insert(prefix.end(), tokens.begin() + i * s, tokens.begin() + i * s + p);
    const std::vector<float> part = model.forward(prefix, p, true).to_float_vector();
    float worst = 0.0f, worst32 = 0.0f;
    for (int64_t i = 0; i < b; ++i)
      for (int64_t j = 0; j < p; ++j)
        for (int64_t v = 0; v < V; ++v)
          worst = std::max(worst, std::abs(part[size_t((i * p + j) * V + v)] -
                                           full[size_t((i * s + j) * V + v)]));
    for (int64_t j = p; j < s; ++j) {
      std::vector<int32_t> step = {tokens[size_t(j)], tokens[size_t(s + j)]};
      const std::vector<float> l = model.decode_step(step).to_float_vector();
      for (int64_t i = 0; i < b; ++i)
        for (int64_t v = 0; v < V; ++v) {
          const size_t at = size_t((i * s + j) * V + v);
          worst = std::max(worst, std::abs(l[size_t(i * V + v)] - full[at]));
          worst32 = std::max(worst32, std::abs(l[size_t(i * V + v)] - ref32[at]));
        }
    }
    EXPECT_LT(worst, 2e-3f);
    EXPECT_LT(worst32, 0.25f);
  }
  ops::cpu::reset_bf16_tile_unit();
}

TEST(GPTEngine, MissingOrMisshapenWeightsAreClearErrors) {
  const Config c = gpt2_config();
  Weights w = random_weights(c);
  w.erase("decoder.layers.1.mlp.linear_fc2.weight");
  EXPECT_THROW(GPTEngine(c, w), Error);
  w = random_weights(c);
  w["decoder.final_layernorm.weight"] = Tensor::zeros({5}, DType::F32);
  EXPECT_THROW(GPTEngine(c, w), Error);
  w = random_weights(c);
  w["decoder.layers.0.self_attention.q_layernorm.weight"] = Tensor::zeros({8}, DType::F32);
  EXPECT_THROW(GPTEngine(c, w), Error);  // a tensor the configuration does not use
  w = random_weights(c);
  w["decoder.final_layernorm.weight"].data<float>()[3] = std::nanf("");
  EXPECT_THROW(GPTEngine(c, w), Error);  // non-finite weights
}

}  // namespace
}  // namespace megatron::inference
