// The whole GPT (logits, loss, every parameter's gradient) against tests/reference/
// gpt_reference.py (PyTorch, float64) on the same weights and batch, dropout off.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>

#include <nlohmann/json.hpp>

#include "model/gpt_model.h"
#include "model_test_util.h"
#include "test_util.h"

namespace megatron::model {
namespace {

using megatron::testing::TempDir;

using testing::append;

void check_against_pytorch(const TransformerConfig& cfg, bool resets, bool padding = false) {
  const int64_t b = 2, s = cfg.seq_length, V = cfg.padded_vocab_size;
  GPTModel model(cfg, 1234);
  testing::randomise(model, 99);
  Batch in = testing::random_inputs(b, s, V, 5, resets);
  Tensor pad = Tensor::full({b, s}, 1.0, DType::I32);
  if (padding) {  // the last 3 positions of sequence 1 are padding keys
    for (int64_t i = s - 3; i < s; ++i) pad.data<int32_t>()[s + i] = 0;
    in.padding_mask = pad;
  }
  const float grad_scale = 0.37f;
  testing::zero_grads(model);
  LossResult res = model.forward_backward(in, grad_scale, 0);
  const Tensor logits = model.forward_logits(in.tokens, in.position_ids, in.attention_start,
                                             in.padding_mask);

  TempDir dir;
  nlohmann::json j;
  j["model"] = cfg;  // the checkpoint codec
  j["batch"] = b;
  j["seq"] = s;
  j["grad_scale"] = grad_scale;
  j["has_attention_start"] = resets;
  j["has_padding_mask"] = padding;
  std::ofstream wf(dir / "weights.bin", std::ios::binary);
  for (Parameter* p : model.parameters()) {
    j["params"].push_back({{"name", p->name}, {"shape", p->value.shape()}});
    Tensor v = p->value.to(DType::F32);
    append(wf, v.data<float>(), v.numel());
  }
  wf.close();
  megatron::testing::write_file(dir / "config.json", j.dump());
  std::ofstream bf(dir / "batch.bin", std::ios::binary);
  Tensor zeros = Tensor::zeros({b, s}, DType::I32);
  for (const Tensor* t : {&in.tokens, &in.position_ids, &in.labels,
                          resets ? &in.attention_start : &zeros, &pad})
    append(bf, t->data<int32_t>(), t->numel());
  append(bf, in.loss_mask.data<float>(), in.loss_mask.numel());
  bf.close();

  const std::vector<double> out = testing::run_reference_script("gpt_reference.py", dir.path());
  ASSERT_FALSE(out.empty());
  const double* ref = out.data();
  const int64_t nref = int64_t(out.size());

  EXPECT_NEAR(res.loss_sum, ref[0], 1e-5 * std::abs(ref[0]));
  EXPECT_EQ(res.num_tokens, ref[1]);
  int64_t off = 2;
  testing::expect_close_to_reference("logits", logits.data<float>(), ref + off, b * s * V, 1e-5);
  off += b * s * V;
  for (Parameter* p : model.parameters()) {
    ASSERT_LE(off + p->grad.numel(), nref);
    testing::expect_close_to_reference(p->name + " grad", p->grad.data<float>(), ref + off,
                                       p->grad.numel(), 1e-5);
    off += p->grad.numel();
  }
  EXPECT_EQ(off, nref);
}

TEST(GPTReference, MatchesPyTorchTanhGeluWithDocumentResets) {
  check_against_pytorch(testing::tiny_config(), true);
}

TEST(GPTReference, MatchesPyTorchExactGeluPlainCausal) {
  TransformerConfig c = testing::tiny_config();
  c.activation = "gelu";
  c.num_layers = 1;
  c.ffn_hidden_size = 48;
  check_against_pytorch(c, false);
}

TEST(GPTReference, MatchesPyTorchGroupedQueryAttention) {
  TransformerConfig c = testing::tiny_config();
  c.num_layers = 1;
  c.num_query_groups = 2;  // 4 query heads share 2 key/value heads
  check_against_pytorch(c, true);
}

}  // namespace
}  // namespace megatron::model

namespace megatron::model {
namespace {

// Llama-style: RMSNorm, rotary (halves), SwiGLU, grouped-query attention, no biases, untied
// output layer; with document resets.
TransformerConfig llama_config() {
  TransformerConfig c = testing::tiny_config();
  c.normalization = "RMSNorm";
  c.activation = "swiglu";
  c.position_embedding_type = "rope";
  c.num_query_groups = 2;
  c.ffn_hidden_size = 40;
  c.add_bias_linear = false;
  c.untie_embeddings_and_output_weights = true;
  return c;
}

TEST(GPTReference, MatchesPyTorchLlamaStyle) { check_against_pytorch(llama_config(), true); }

TEST(GPTReference, MatchesPyTorchLlamaQkNormInterleavedPartialRotaryAndZeroCentredNorms) {
  TransformerConfig c = llama_config();
  c.qk_layernorm = true;
  c.rotary_interleaved = true;
  c.rotary_percent = 0.5f;
  c.rotary_base = 500.0;
  c.apply_layernorm_1p = true;
  c.add_qkv_bias = true;
  check_against_pytorch(c, false);
}

TEST(GPTReference, MatchesPyTorchAlibiSlidingWindowSquaredRelu) {
  TransformerConfig c = testing::tiny_config();
  c.hidden_size = 48;
  c.num_attention_heads = 6;  // not a power of two: the interleaved extension of the slopes
  c.position_embedding_type = "alibi";
  c.window_left = 4;
  c.activation = "squared_relu";
  check_against_pytorch(c, true);
}

TEST(GPTReference, MatchesPyTorchBidirectionalWithPaddingAndWindow) {
  TransformerConfig c = testing::tiny_config();
  c.attention_mask_type = "bidirectional";
  c.window_left = 6;
  c.window_right = 3;
  c.position_embedding_type = "none";
  check_against_pytorch(c, false, true);
}

}  // namespace
}  // namespace megatron::model
