// BertModel (losses, LM and sentence-order logits, every parameter's gradient) against
// tests/reference/bert_reference.py (PyTorch, float64, written from Megatron-Core's BERT) on the
// same weights and batch, dropout off: with and without the binary head, tied and untied output
// layer, padding, and a sequence whose sentence-order label is ignored (-1); and evaluate's
// masked-LM and sentence-order scores of the batch (losses, accuracies) against the reference's.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>

#include <nlohmann/json.hpp>

#include "inference/bert_evaluate.h"
#include "model/bert_model.h"
#include "model_test_util.h"
#include "test_util.h"

namespace megatron::model {
namespace {

using megatron::testing::TempDir;

using testing::append;

TransformerConfig bert_config(bool binary_head) {
  TransformerConfig c = testing::tiny_config();
  c.model_family = "bert";
  c.attention_mask_type = "bidirectional";
  c.bert_binary_head = binary_head;
  c.activation = "gelu";
  return c;
}

// A BERT batch: random tokens, types 0 then 1 from a random split point, labels, about 30% of the
// positions masked for the loss, the last 3 positions of sequence 1 padding.
Batch bert_batch(int64_t b, int64_t s, int64_t V, std::vector<int32_t> order) {
  Batch in = testing::random_inputs(b, s, V, 5, false);
  std::vector<int32_t> types(size_t(b * s)), pad(size_t(b * s), 1);
  std::vector<float> mask(size_t(b * s));
  Philox rng(17, 3);
  for (int64_t bi = 0; bi < b; ++bi) {
    const int64_t split = 2 + int64_t(rng.u32(uint64_t(bi)) % uint32_t(s - 4));
    for (int64_t i = 0; i < s; ++i) {
      const size_t at = size_t(bi * s + i);
      types[at] = i < split ? 0 : 1;
      mask[at] = rng.uniform(100 + at) < 0.3f ? 1.0f : 0.0f;
      if (bi == 1 && i >= s - 3) {
        pad[at] = 0;
        mask[at] = 0.0f;
      }
    }
    mask[size_t(bi * s + 1)] = 1.0f;  // at least one masked token per sequence
  }
  in.token_types = Tensor::from_vector(types, {b, s});
  in.padding_mask = Tensor::from_vector(pad, {b, s});
  in.loss_mask = Tensor::from_vector(mask, {b, s});
  std::vector<int32_t> pos(size_t(b * s));
  for (int64_t i = 0; i < b * s; ++i) pos[size_t(i)] = int32_t(i % s);
  in.position_ids = Tensor::from_vector(pos, {b, s});
  in.sequence_labels = Tensor::from_vector(order, {b});
  return in;
}

void check_against_pytorch(const TransformerConfig& cfg, std::vector<int32_t> order) {
  const int64_t b = int64_t(order.size()), s = cfg.seq_length, V = cfg.padded_vocab_size;
  BertModel model(cfg, 1234, TensorParallel::none(), ContextParallel::none());
  testing::randomise(model, 99);
  Batch in = bert_batch(b, s, V, order);
  {  // every other masked position labelled with the model's own prediction: a non-trivial accuracy
    const Tensor z = model.forward_logits(in);
    int32_t* labels = in.labels.data<int32_t>();
    for (int64_t r = 0; r < b * s; r += 2) {
      const float* row = z.data<float>() + r * V;
      labels[r] = int32_t(std::max_element(row, row + V) - row);
    }
  }
  const float grad_scale = 0.37f;
  testing::zero_grads(model);
  const LossResult res = model.forward_backward(in, grad_scale, 0);
  const Tensor logits = model.forward_logits(in);
  const Tensor binary = cfg.bert_binary_head ? model.forward_binary_logits(in) : Tensor();

  TempDir dir;
  nlohmann::json j;
  j["model"] = cfg;
  j["batch"] = b;
  j["seq"] = s;
  j["grad_scale"] = grad_scale;
  std::ofstream wf(dir / "weights.bin", std::ios::binary);
  for (Parameter* p : model.parameters()) {
    j["params"].push_back({{"name", p->name}, {"shape", p->value.shape()}});
    Tensor v = p->value.to(DType::F32);
    append(wf, v.data<float>(), v.numel());
  }
  wf.close();
  megatron::testing::write_file(dir / "config.json", j.dump());
  std::ofstream bf(dir / "batch.bin", std::ios::binary);
  for (const Tensor* t : {&in.tokens, &in.token_types, &in.labels, &in.padding_mask,
                          &in.sequence_labels})
    append(bf, t->data<int32_t>(), t->numel());
  append(bf, in.loss_mask.data<float>(), in.loss_mask.numel());
  bf.close();
  const std::vector<double> out = testing::run_reference_script("bert_reference.py", dir.path());
  ASSERT_FALSE(out.empty());
  const double* ref = out.data();
  const int64_t nref = int64_t(out.size());

  // pretrain_bert.py's losses: the masked-LM mean and the sentence-order mean, count 1 each.
  EXPECT_NEAR(res.loss_sum, ref[0], 1e-5 * std::abs(ref[0]));
  EXPECT_EQ(res.num_tokens, 1.0);
  ASSERT_EQ(res.more.size(), cfg.bert_binary_head ? 1u : 0u);
  if (cfg.bert_binary_head) {
    EXPECT_NEAR(res.more[0].sum, ref[1], 1e-5 * std::abs(ref[1]));
  }
  int64_t off = 2;
  testing::expect_close_to_reference("logits", logits.data<float>(), ref + off, b * s * V, 1e-5);
  off += b * s * V;
  if (cfg.bert_binary_head) {
    testing::expect_close_to_reference("binary logits", binary.data<float>(), ref + off, b * 2,
                                       1e-5);
  }
  off += b * 2;
  for (Parameter* p : model.parameters()) {
    ASSERT_LE(off + p->grad.numel(), nref);
    testing::expect_close_to_reference(p->name + " grad", p->grad.data<float>(), ref + off,
                                       p->grad.numel(), 1e-5);
    off += p->grad.numel();
  }
  EXPECT_EQ(off, nref);

  // evaluate's scores of the micro-batch (inference/bert_evaluate.h) against the reference's.
  const auto want = nlohmann::json::parse(megatron::testing::read_file(dir / "metrics.json"));
  const inference::MaskedLMTotals got = inference::score_masked_lm(logits, binary, in);
  EXPECT_NEAR(got.lm_loss, want["lm_loss"].get<double>(), 1e-5 * std::abs(ref[0]));
  EXPECT_EQ(got.masked, want["masked"].get<double>());
  EXPECT_EQ(got.lm_correct, want["lm_correct"].get<double>());
  EXPECT_GT(got.lm_correct, 0.0);
  EXPECT_LT(got.lm_correct, got.masked);
  if (cfg.bert_binary_head) {
    EXPECT_NEAR(got.sop_loss, want["sop_loss"].get<double>(), 1e-5 * std::abs(ref[1]));
    EXPECT_EQ(got.sop_labelled, want["sop_labelled"].get<double>());
    EXPECT_EQ(got.sop_correct, want["sop_correct"].get<double>());
  }
}

TEST(BertReference, MatchesPyTorchWithBinaryHead) {
  check_against_pytorch(bert_config(true), {1, 0, -1});
}

TEST(BertReference, MatchesPyTorchWithoutBinaryHead) {
  TransformerConfig c = bert_config(false);
  c.activation = "gelu_tanh";
  check_against_pytorch(c, {0, 0});
}

TEST(BertReference, MatchesPyTorchUntiedWithGroupedQueryAttention) {
  TransformerConfig c = bert_config(true);
  c.untie_embeddings_and_output_weights = true;
  c.num_query_groups = 2;
  c.num_layers = 1;
  check_against_pytorch(c, {0, 1});
}

// The parameters Megatron-Core's BertModel has, in its order, with the specs its modules give
// them: initialisation, sharding and whether the gradient is a partial sum under sequence
// parallelism.
TEST(BertModelTest, ParametersAndSpecsAreMegatronCores) {
  TransformerConfig c = bert_config(true);
  c.num_layers = 1;
  BertModel m(c, 1, TensorParallel::none(), ContextParallel::none());
  std::vector<std::string> names;
  for (const Parameter* p : m.parameters()) names.push_back(p->name);
  const std::vector<std::string> want = {
      "embedding.word_embeddings.weight", "embedding.position_embeddings.weight",
      "embedding.tokentype_embeddings.weight", "encoder.layers.0.input_layernorm.weight",
      "encoder.layers.0.input_layernorm.bias", "encoder.layers.0.self_attention.linear_qkv.weight",
      "encoder.layers.0.self_attention.linear_qkv.bias",
      "encoder.layers.0.self_attention.linear_proj.weight",
      "encoder.layers.0.self_attention.linear_proj.bias",
      "encoder.layers.0.pre_mlp_layernorm.weight", "encoder.layers.0.pre_mlp_layernorm.bias",
      "encoder.layers.0.mlp.linear_fc1.weight", "encoder.layers.0.mlp.linear_fc1.bias",
      "encoder.layers.0.mlp.linear_fc2.weight", "encoder.layers.0.mlp.linear_fc2.bias",
      "encoder.final_layernorm.weight", "encoder.final_layernorm.bias", "lm_head.dense.weight",
      "lm_head.dense.bias", "lm_head.layer_norm.weight", "lm_head.layer_norm.bias",
      "output_layer.bias", "binary_head.weight", "binary_head.bias", "pooler.dense.weight",
      "pooler.dense.bias"};
  EXPECT_EQ(names, want);
  auto spec = [&](const std::string& n) -> const Parameter& {
    for (const Parameter* p : m.parameters())
      if (p->name == n) return *p;
    throw std::runtime_error("no " + n);
  };
  // A LayerNorm weight whose name lacks "layernorm" is still set to ones.
  EXPECT_EQ(spec("lm_head.layer_norm.weight").init, InitMethod::ones);
  EXPECT_EQ(spec("lm_head.layer_norm.bias").init, InitMethod::zeros);
  EXPECT_EQ(spec("lm_head.dense.weight").init, InitMethod::normal);
  EXPECT_EQ(spec("encoder.layers.0.mlp.linear_fc2.weight").init, InitMethod::scaled_normal);
  EXPECT_EQ(spec("lm_head.dense.weight").partition_dim, -1);
  EXPECT_EQ(spec("output_layer.bias").partition_dim, 0);
  EXPECT_TRUE(spec("output_layer.bias").padded_vocab);
  EXPECT_FALSE(spec("output_layer.bias").weight_decay);
  // The initial values follow the specs.
  const Tensor ln = spec("lm_head.layer_norm.weight").value;
  for (int64_t i = 0; i < ln.numel(); ++i) ASSERT_EQ(ln.data<float>()[i], 1.0f);
  EXPECT_EQ(ops::sum(spec("output_layer.bias").value), 0.0);
  EXPECT_GT(ops::l2_norm_squared(spec("pooler.dense.weight").value), 0.0);
}

}  // namespace
}  // namespace megatron::model
