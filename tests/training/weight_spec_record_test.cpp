// Self-describing weights: every weight's spec (model/parameter.h WeightSpec) is recorded in
// metadata.json ("weights") when a checkpoint is saved, survives every converter unchanged
// (resharding TP1 -> TP2 -> TP4 -> TP1, Megatron's .pt files and back, a Hugging Face folder and
// back), and decides how each tensor is cut: SwiGLU's fused [gate; up] fc1 shard by shard, BERT's
// lm_head.dense (a name no suffix rule knows) replicated, its output_layer.bias over the padded
// vocabulary. Formats without a record take the specs of the model their arguments describe.
#include <gtest/gtest.h>

#include <cstring>

#include <nlohmann/json.hpp>

#include "core/safetensors.h"
#include "model/bert_model.h"
#include "model/gpt_model.h"
#include "model/model_test_util.h"
#include "model/weight_spec.h"
#include "interop/checkpoint_test_util.h"
#include "test_util.h"
#include "training/checkpoint.h"
#include "training/checkpoint_convert.h"

namespace megatron::training {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

using interop_testing::bit_equal;

// A whole model of `cfg`'s family, saved at iteration 1 in `dir` with its initial weights.
std::map<std::string, Tensor> save_model(const model::TransformerConfig& cfg, const fs::path& dir) {
  TrainingArgs a;
  a.model = cfg;
  a.tokenizer.type = "NullTokenizer";
  a.tokenizer.vocab_size = 60;
  a.make_vocab_size_divisible_by = 16;
  std::unique_ptr<model::LanguageModule> m;
  if (cfg.model_family == "bert")
    m = std::make_unique<model::BertModel>(cfg, 5, model::TensorParallel::none(),
                                           model::ContextParallel::none());
  else
    m = std::make_unique<model::GPTModel>(cfg, 5);
  model::testing::randomise(*m, 3);  // distinct values everywhere (biases and norms too)
  CheckpointState st;
  st.iteration = 1;
  st.scheduler.max_lr = 1e-3;
  st.scheduler.lr_decay_steps = 10;
  st.args = training_args_to_json(a);
  save_checkpoint(dir, st, m->parameters(), nullptr);
  std::map<std::string, Tensor> out;
  for (const model::Parameter* p : m->parameters()) out[p->name] = p->value.clone();
  return out;
}

json weights_record(const fs::path& save) {
  const auto c = find_checkpoint(save, std::nullopt);
  EXPECT_TRUE(c.has_value());
  return read_checkpoint_metadata(c->dir).at("weights");
}

std::map<std::string, Tensor> merged(const fs::path& save) {
  return merge_checkpoint(find_checkpoint(save, std::nullopt).value(), false).model;
}

ConvertResult convert(const fs::path& from, const fs::path& to, int tp,
                      const std::string& save_format = "safetensors",
                      const std::string& load_format = "auto") {
  ConvertOptions o;
  o.load = from;
  o.save = to;
  o.target_tp = tp;
  o.save_format = save_format;
  o.load_format = load_format;
  o.true_vocab_size = 60;
  return convert_checkpoint(o);
}

model::TransformerConfig small(const std::string& family) {
  model::TransformerConfig c = model::testing::tiny_config();
  c.padded_vocab_size = 64;
  if (family == "bert") {
    c.model_family = "bert";
    c.attention_mask_type = "bidirectional";
    c.activation = "gelu";
  } else {
    model::testing::make_llama_style(c);
    c.num_attention_heads = 8;  // 4 query groups of 2 heads: TP 4 holds one group a rank
    c.num_query_groups = 4;
  }
  return c;
}

TEST(WeightSpecRecord, ReshardingKeepsTheRecordAndCutsByIt) {
  for (const std::string family : {"llama", "bert"}) {
    SCOPED_TRACE(family);
    testing::TempDir tmp;
    const model::TransformerConfig cfg = small(family);
    const auto original = save_model(cfg, tmp / "tp1");
    // The record is the model's own specs, weight for weight.
    const json record = weights_record(tmp / "tp1");
    const auto specs = model::model_weight_specs(cfg);
    ASSERT_EQ(record.size(), specs.size());
    for (const auto& [name, spec] : specs)
      EXPECT_EQ(record.at(name), model::weight_spec_to_json(spec)) << name;

    convert(tmp / "tp1", tmp / "tp2", 2);
    convert(tmp / "tp2", tmp / "tp4", 4);
    convert(tmp / "tp4", tmp / "back", 1);
    for (const char* hop : {"tp2", "tp4", "back"}) EXPECT_EQ(weights_record(tmp / hop), record) << hop;
    const auto back = merged(tmp / "back");
    ASSERT_EQ(back.size(), original.size());
    for (const auto& [name, t] : original) EXPECT_TRUE(bit_equal(back.at(name), t)) << name;

    // The TP2 files hold what the specs say.
    const fs::path it2 = tmp / "tp2" / "iter_0000001";
    const auto r0 = read_safetensors(it2 / "mp_rank_00" / "model.safetensors").tensors;
    const auto r1 = read_safetensors(it2 / "mp_rank_01" / "model.safetensors").tensors;
    for (const auto& [name, spec] : specs) {
      if (spec.partition_dim < 0) {
        EXPECT_TRUE(bit_equal(r0.at(name), r1.at(name))) << name << " is replicated";
        continue;
      }
      for (int r = 0; r < 2; ++r)
        EXPECT_TRUE(bit_equal((r == 0 ? r0 : r1).at(name),
                              model::shard_along(original.at(name), spec.partition_dim, r, 2,
                                                 spec.partition_parts)))
            << name << " rank " << r;
    }
    if (family == "llama")  // the fused [gate; up] rows: rank 1 holds gate rows 24..47 first
      EXPECT_EQ(record.at("decoder.layers.0.mlp.linear_fc1.weight").at("partition_parts"), 2);
    else
      EXPECT_EQ(record.at("lm_head.dense.weight").at("partition_dim"), -1);
  }
}

TEST(WeightSpecRecord, MegatronAndHuggingFaceFilesComeBackWithTheSameRecord) {
  testing::TempDir tmp;
  const model::TransformerConfig cfg = small("llama");
  const auto original = save_model(cfg, tmp / "ours");
  const json record = weights_record(tmp / "ours");
  // Megatron-LM's .pt files at TP2 (no record inside), back to ours at TP1.
  convert(tmp / "ours", tmp / "pt", 2, "torch");
  convert(tmp / "pt", tmp / "from_pt", 1);
  EXPECT_EQ(weights_record(tmp / "from_pt"), record);
  const auto from_pt = merged(tmp / "from_pt");
  for (const auto& [name, t] : original) EXPECT_TRUE(bit_equal(from_pt.at(name), t)) << name;
  // A Hugging Face folder (no record either), back to ours.
  convert(tmp / "ours", tmp / "hf", 1, "hf");
  convert(tmp / "hf", tmp / "from_hf", 1, "safetensors", "hf");
  EXPECT_EQ(weights_record(tmp / "from_hf"), record);
}

// A format-2 checkpoint (partition dims only) gets the specs of its model; a record that
// disagrees with the tensors it describes is an error naming the file.
TEST(WeightSpecRecord, OlderCheckpointsAndBadRecords) {
  testing::TempDir tmp;
  const model::TransformerConfig cfg = small("llama");
  save_model(cfg, tmp / "ours");
  const CheckpointOnDisk c = find_checkpoint(tmp / "ours", std::nullopt).value();
  json meta = read_checkpoint_metadata(c.dir);
  json old = meta;
  old.erase("weights");
  old["format_version"] = 2;
  old["parallel"]["partition_dims"] = json::object();
  for (const auto& [name, r] : meta["weights"].items())
    old["parallel"]["partition_dims"][name] = r["partition_dim"];
  const auto from_old = checkpoint_weight_specs(c, old);
  for (const auto& [name, r] : meta["weights"].items())
    EXPECT_EQ(model::weight_spec_to_json(from_old.at(name)), r) << name;
  old["parallel"]["partition_dims"]["decoder.layers.0.mlp.linear_fc2.weight"] = 0;
  EXPECT_THROW(checkpoint_weight_specs(c, old), Error);
  json bad = meta;
  bad["weights"]["decoder.layers.0.mlp.linear_fc1.weight"]["init"] = "uniform";
  try {
    checkpoint_weight_specs(c, bad);
    ADD_FAILURE() << "an unknown init method was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("uniform"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace megatron::training
