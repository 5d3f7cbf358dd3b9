// T5Model (loss, logits, every parameter's gradient) against tests/reference/t5_reference.py
// (PyTorch, float64, written from Megatron-Core's T5) on the same weights and batch, dropout off:
// encoder and decoder of different lengths and depths, learned absolute positions, rotary ones and
// the relative position bias (small and default buckets), tied and untied output layer, padding in
// the encoder mask and padded decoder labels (-1 outside the loss mask). Also the parameters and
// specs Megatron-Core's T5Model has, the bucket formula, and the configurations T5 refuses.
#include <gtest/gtest.h>

#include <fstream>

#include <nlohmann/json.hpp>

#include "model/model_family.h"
#include "model/relative_position.h"
#include "model/t5_model.h"
#include "model_test_util.h"
#include "test_util.h"

namespace megatron::model {
namespace {

using megatron::testing::TempDir;
using testing::append;

TransformerConfig t5_config(const std::string& positions) {
  TransformerConfig c = testing::tiny_config();
  c.model_family = "t5";
  c.num_layers = 2;          // encoder
  c.decoder_num_layers = 3;  // decoder
  c.seq_length = 12;
  c.decoder_seq_length = 8;
  c.position_embedding_type = positions;
  return c;
}

// A T5 batch: random encoder and decoder tokens; sequence 1's encoder ends in 3 padding tokens and
// its decoder in 2 (labels -1 there, outside the loss mask, as Megatron's dataset pads them).
Batch t5_batch(int64_t b, int64_t se, int64_t sd, int64_t V) {
  Batch dec = testing::random_inputs(b, sd, V, 5, false);
  Batch enc = testing::random_inputs(b, se, V, 6, false);
  std::vector<int32_t> pad(size_t(b * se), 1), labels(size_t(b * sd));
  std::vector<float> mask(size_t(b * sd), 1.0f);
  for (int64_t i = 0; i < b * sd; ++i) labels[size_t(i)] = dec.labels.data<int32_t>()[i];
  for (int64_t i = se - 3; i < se; ++i) pad[size_t(se + i)] = 0;
  for (int64_t i = sd - 2; i < sd; ++i) {
    labels[size_t(sd + i)] = -1;
    mask[size_t(sd + i)] = 0.0f;
  }
  mask[2] = 0.0f;
  Batch in;
  in.encoder_tokens = enc.tokens;
  in.encoder_padding_mask = Tensor::from_vector(pad, {b, se});
  in.tokens = dec.tokens;
  in.labels = Tensor::from_vector(labels, {b, sd});
  in.loss_mask = Tensor::from_vector(mask, {b, sd});
  return in;
}

void check_against_pytorch(const TransformerConfig& cfg) {
  const int64_t b = 2, se = cfg.seq_length, sd = cfg.decoder_seq_length, V = cfg.padded_vocab_size;
  T5Model model(cfg, 1234, TensorParallel::none());
  testing::randomise(model, 99);
  const Batch in = t5_batch(b, se, sd, V);
  const float grad_scale = 0.37f;
  testing::zero_grads(model);
  const LossResult res = model.forward_backward(in, grad_scale, 0);
  const Tensor logits = model.forward_logits(in);

  TempDir dir;
  nlohmann::json j;
  j["model"] = cfg;
  j["batch"] = b;
  j["enc_seq"] = se;
  j["dec_seq"] = sd;
  j["grad_scale"] = grad_scale;
  testing::write_parameters(model, dir.path(), j);
  megatron::testing::write_file(dir / "config.json", j.dump());
  std::ofstream bf(dir / "batch.bin", std::ios::binary);
  for (const Tensor* t : {&in.encoder_tokens, &in.encoder_padding_mask, &in.tokens, &in.labels})
    append(bf, t->data<int32_t>(), t->numel());
  append(bf, in.loss_mask.data<float>(), in.loss_mask.numel());
  bf.close();
  const std::vector<double> out = testing::run_reference_script("t5_reference.py", dir.path());
  ASSERT_GE(out.size(), size_t(2 + b * sd * V));
  // pretrain_gpt.py's loss_func: the masked sum and the token count.
  EXPECT_NEAR(res.loss_sum, out[0], 1e-5 * std::abs(out[0]));
  EXPECT_EQ(res.num_tokens, out[1]);
  testing::expect_close_to_reference("logits", logits.data<float>(), out.data() + 2, b * sd * V,
                                     1e-5);
  testing::expect_grads_close_to_reference(model, out, 2 + b * sd * V, 1e-5);
}

TEST(T5Reference, MatchesPyTorchLearnedAbsolute) {
  check_against_pytorch(t5_config("learned_absolute"));
}

TEST(T5Reference, MatchesPyTorchRotary) { check_against_pytorch(t5_config("rope")); }

// Small buckets: distances beyond max_exact share buckets logarithmically and the far ones the
// last bucket, in both directions.
TEST(T5Reference, MatchesPyTorchRelativeBiasSmallBuckets) {
  TransformerConfig c = t5_config("relative");
  c.relative_attention_num_buckets = 8;
  c.relative_attention_max_distance = 6;
  check_against_pytorch(c);
}

TEST(T5Reference, MatchesPyTorchRelativeBiasUntiedRmsNorm) {
  TransformerConfig c = t5_config("relative");
  c.untie_embeddings_and_output_weights = true;
  c.normalization = "RMSNorm";
  c.activation = "gelu";
  c.num_layers = 1;
  c.decoder_num_layers = 2;
  c.seq_length = 16;
  c.decoder_seq_length = 6;
  check_against_pytorch(c);
}

// Hugging Face's / Megatron-Core's buckets for the default 32 buckets and distance 128, worked by
// hand: exact below 8 (16 in each direction, the positive side offset by 16), then logarithmic.
TEST(T5RelativePosition, BucketsAreMegatronCores) {
  EXPECT_EQ(relative_position_bucket(0, true, 32, 128), 0);
  EXPECT_EQ(relative_position_bucket(-7, true, 32, 128), 7);
  EXPECT_EQ(relative_position_bucket(7, true, 32, 128), 23);
  // d = 8..: 8 + int(log(d/8) / log(16) * 8): d = 12 -> 8 + 1, d = 100 -> 8 + 7, d >= 128 -> 15.
  EXPECT_EQ(relative_position_bucket(-12, true, 32, 128), 9);
  EXPECT_EQ(relative_position_bucket(100, true, 32, 128), 16 + 15);
  EXPECT_EQ(relative_position_bucket(-1000, true, 32, 128), 15);
  // Causal: future keys fall in bucket 0; 32 buckets, 16 exact.
  EXPECT_EQ(relative_position_bucket(5, false, 32, 128), 0);
  EXPECT_EQ(relative_position_bucket(-15, false, 32, 128), 15);
  // d = 20: 16 + int(log(20/16) / log(8) * 16) = 16 + 1.
  EXPECT_EQ(relative_position_bucket(-20, false, 32, 128), 17);
  EXPECT_EQ(relative_position_bucket(-5000, false, 32, 128), 31);
}

TEST(T5ModelTest, ParametersAndSpecsAreMegatronCores) {
  TransformerConfig c = t5_config("relative");
  c.num_layers = 1;
  c.decoder_num_layers = 1;
  T5Model m(c, 1, TensorParallel::none());
  std::vector<std::string> names;
  for (const Parameter* p : m.parameters()) names.push_back(p->name);
  const std::string enc = "encoder.layers.0.", dec = "decoder.layers.0.";
  const std::vector<std::string> want = {
      "embedding.word_embeddings.weight",
      "encoder_relative_pos_emb.relative_attention_bias.weight",
      "decoder_relative_pos_emb.relative_attention_bias.weight",
      enc + "input_layernorm.weight", enc + "input_layernorm.bias",
      enc + "self_attention.linear_qkv.weight", enc + "self_attention.linear_qkv.bias",
      enc + "self_attention.linear_proj.weight", enc + "self_attention.linear_proj.bias",
      enc + "pre_mlp_layernorm.weight", enc + "pre_mlp_layernorm.bias",
      enc + "mlp.linear_fc1.weight", enc + "mlp.linear_fc1.bias", enc + "mlp.linear_fc2.weight",
      enc + "mlp.linear_fc2.bias", "encoder.final_layernorm.weight", "encoder.final_layernorm.bias",
      dec + "input_layernorm.weight", dec + "input_layernorm.bias",
      dec + "self_attention.linear_qkv.weight", dec + "self_attention.linear_qkv.bias",
      dec + "self_attention.linear_proj.weight", dec + "self_attention.linear_proj.bias",
      dec + "pre_cross_attn_layernorm.weight", dec + "pre_cross_attn_layernorm.bias",
      dec + "cross_attention.linear_q.weight", dec + "cross_attention.linear_q.bias",
      dec + "cross_attention.linear_kv.weight", dec + "cross_attention.linear_kv.bias",
      dec + "cross_attention.linear_proj.weight", dec + "cross_attention.linear_proj.bias",
      dec + "pre_mlp_layernorm.weight", dec + "pre_mlp_layernorm.bias",
      dec + "mlp.linear_fc1.weight", dec + "mlp.linear_fc1.bias", dec + "mlp.linear_fc2.weight",
      dec + "mlp.linear_fc2.bias", "decoder.final_layernorm.weight",
      "decoder.final_layernorm.bias", "output_layer.bias"};
  EXPECT_EQ(names, want);
  auto spec = [&](const std::string& n) -> const Parameter& {
    for (const Parameter* p : m.parameters())
      if (p->name == n) return *p;
    throw std::runtime_error("no " + n);
  };
  const Parameter& rel = spec("encoder_relative_pos_emb.relative_attention_bias.weight");
  EXPECT_EQ(rel.value.shape(), Shape({32, 4}));
  EXPECT_EQ(rel.partition_dim, -1);  // whole on every tensor-parallel rank, as in Megatron
  EXPECT_EQ(rel.init, InitMethod::normal);
  EXPECT_EQ(spec(dec + "cross_attention.linear_kv.weight").value.shape(), Shape({64, 32}));
  EXPECT_EQ(spec(dec + "cross_attention.linear_kv.weight").partition_dim, 0);
  EXPECT_EQ(spec(dec + "cross_attention.linear_q.weight").partition_dim, 0);
  EXPECT_EQ(spec(dec + "cross_attention.linear_proj.weight").partition_dim, 1);
  EXPECT_EQ(spec(dec + "cross_attention.linear_proj.weight").init, InitMethod::scaled_normal);
  EXPECT_GT(ops::l2_norm_squared(rel.value), 0.0);
  EXPECT_EQ(&model_family_of(c), &model_family_of(c));
  EXPECT_STREQ(model_family_of(c).command, "pretrain-t5");
}

TEST(T5ModelTest, UntiedHeadHasItsOwnWeightAndNoBias) {
  TransformerConfig c = t5_config("learned_absolute");
  c.untie_embeddings_and_output_weights = true;
  T5Model m(c, 1, TensorParallel::none());
  const ParameterList ps = m.parameters();
  EXPECT_EQ(ps.front()->name, "embedding.word_embeddings.weight");
  EXPECT_EQ(ps[1]->name, "embedding.position_embeddings.weight");
  EXPECT_EQ(ps.back()->name, "output_layer.weight");
}

TEST(T5ModelTest, RefusesWhatItDoesNotSupport) {
  auto expect_error = [](TransformerConfig c, const ChunkPlace& place, const TensorParallel& tp,
                         const std::string& needle) {
    try {
      T5Model m(c, 1, tp, ContextParallel::none(), place);
      ADD_FAILURE() << "no error for " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  const ChunkPlace whole{PipelineLayout{2, 1, 1}, 0, 0};
  TransformerConfig gqa = t5_config("learned_absolute");
  gqa.num_query_groups = 2;
  expect_error(gqa, whole, TensorParallel::none(), "--num-query-groups");
  TransformerConfig alibi = t5_config("alibi");
  expect_error(alibi, whole, TensorParallel::none(), "--position-embedding-type");
  expect_error(t5_config("learned_absolute"), ChunkPlace{PipelineLayout{2, 2, 1}, 0, 0},
               TensorParallel::none(), "--pipeline-model-parallel-size");
  TransformerConfig gpt = testing::tiny_config();
  gpt.position_embedding_type = "relative";
  EXPECT_THROW(gpt.validate(), Error);
  // A label of -1 inside the loss mask is a user error, not a silent zero.
  T5Model m(t5_config("learned_absolute"), 1, TensorParallel::none());
  Batch in = t5_batch(2, 12, 8, 96);
  in.loss_mask = Tensor::full({2, 8}, 1.0, DType::F32);
  EXPECT_THROW(m.forward_loss(in), Error);
  Batch no_encoder = t5_batch(2, 12, 8, 96);
  no_encoder.encoder_tokens = Tensor();
  EXPECT_THROW(m.forward_loss(no_encoder), Error);
}

}  // namespace
}  // namespace megatron::model
