// Megatron-LM's BERT checkpoints (--ckpt-format torch): folders written by Debian's torch in the
// exact structure of Megatron-Core's BertModel (encoder, lm_head, output_layer with its bias,
// binary_head, pooler; local and Transformer Engine layer specs; the earlier heads that kept the
// output layer inside lm_head) and of the legacy megatron/model
// BertModel (language_model with the pooler and tokentype embeddings, lm_head with its own bias,
// binary_head, word_embeddings_for_head) by tests/reference/megatron_checkpoint.py, read bit for
// bit with their optimizer state; BERT checkpoints written as .pt at other layouts load into that
// script's Megatron-Core module trees (strict state dicts, the optimizer's parameter groups) and
// come back bit for bit.
#include <gtest/gtest.h>

#include <cstring>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/safetensors.h"
#include "interop/checkpoint_test_util.h"
#include "test_util.h"
#include "training/checkpoint.h"
#include "training/checkpoint_convert.h"
#include "training/torch_checkpoint.h"

namespace megatron::training {
namespace {

namespace fs = std::filesystem;
namespace mt = megatron::testing;
using json = nlohmann::json;

const char* const kVariants[] = {"bert_core_te_tp2pp2_fp32", "bert_core_pp2_bf16_nohead_untied",
                                 "bert_legacy_v3_tp2pp2_fp16", "bert_core_inner_head_tp2pp2_fp32",
                                 "bert_core_inner_bias_nohead_untied_tp2_bf16"};

using interop_testing::everything;
using interop_testing::expect_bit_equal;

std::string reference(const std::string& args) { return interop_testing::megatron_reference(args); }

const fs::path& variants() {
  static mt::TempDir dir;
  static bool made = false;
  if (!made) {
    std::string names;
    for (const char* v : kVariants) names += std::string(" ") + v;
    reference("make " + dir.path().string() + names);
    made = true;
  }
  return dir.path();
}

void expect_reference(const fs::path& folder, const fs::path& variant, const std::string& what) {
  const CheckpointOnDisk c = find_checkpoint(folder, std::nullopt).value();
  expect_bit_equal(everything(merge_checkpoint(c, true)),
                   read_safetensors(variant / "reference.safetensors").tensors, what);
}

TEST(MegatronBertCheckpoint, CoreAndLegacyFoldersReadBitForBit) {
  for (const std::string name : kVariants) {
    SCOPED_TRACE(name);
    const fs::path dir = variants() / name;
    const CheckpointOnDisk c = find_checkpoint(dir / "megatron", std::nullopt).value();
    EXPECT_EQ(c.format, "torch");
    const TrainingArgs a = training_args_from_json(c.state.args);
    EXPECT_EQ(a.model.model_family, "bert");
    EXPECT_EQ(a.model.attention_mask_type, "bidirectional");
    EXPECT_EQ(a.model.bert_binary_head, name.find("nohead") == std::string::npos);
    EXPECT_EQ(c.state.optimizer_type, "adam");
    expect_reference(dir / "megatron", dir, name);
  }
}

ConvertResult convert(const fs::path& from, const fs::path& to, int tp, int pp,
                      const std::string& format, const std::string& impl = "transformer_engine") {
  return interop_testing::convert_to(from, to, tp, pp, format, impl, 60);
}

TEST(MegatronBertCheckpoint, WrittenFoldersLoadIntoMegatronCoresBertModelAndComeBack) {
  struct Case {
    const char* variant;
    int tp, pp;
    const char* impl;
    const char* dtype;
    const char* family;
  };
  const Case cases[] = {
      {"bert_core_te_tp2pp2_fp32", 2, 2, "local", "fp32", "bert"},
      {"bert_core_te_tp2pp2_fp32", 1, 2, "transformer_engine", "fp32", "bert"},
      {"bert_core_pp2_bf16_nohead_untied", 2, 1, "transformer_engine", "bf16", "bert-nohead"},
      {"bert_legacy_v3_tp2pp2_fp16", 2, 2, "transformer_engine", "fp16", "bert"},
  };
  for (const Case& k : cases) {
    const std::string what = str(k.variant, " -> TP", k.tp, " PP", k.pp, " ", k.impl);
    SCOPED_TRACE(what);
    mt::TempDir tmp;
    const fs::path dir = variants() / k.variant;
    // Through our format (the weights record) and back out as Megatron-Core's files.
    convert(dir / "megatron", tmp / "ours", 1, 1, "safetensors");
    const json record = read_checkpoint_metadata(find_checkpoint(tmp / "ours", std::nullopt)->dir)
                            .at("weights");
    EXPECT_EQ(record.at("lm_head.dense.weight").at("partition_dim"), -1);
    EXPECT_EQ(record.at("output_layer.bias").at("partition_dim"), 0);
    const ConvertResult r = convert(tmp / "ours", tmp / "pt", k.tp, k.pp, "torch", k.impl);
    EXPECT_EQ(r.num_files, size_t(k.tp * k.pp));
    const std::string out = reference(str("check-family ", (tmp / "pt").string(), " 7 ", k.tp, " ",
                                          k.pp, " 1 ", k.impl, " ", k.dtype, " ", k.family));
    std::istringstream lines(out);
    std::string line;
    int ranks = 0;
    while (std::getline(lines, line)) {
      const json j = json::parse(line, nullptr, false);
      ASSERT_FALSE(j.is_discarded()) << line;
      ++ranks;
      EXPECT_EQ(j["bert_binary_head"], std::string(k.family) == "bert") << line;
      EXPECT_EQ(j["groups"].size(), 2u) << line;
    }
    EXPECT_EQ(ranks, k.tp * k.pp) << out;
    expect_reference(tmp / "pt", dir, what + " (read back)");
  }
}

// Encoder and decoder layers together are a T5 (its own names: t5_torch_checkpoint_test.cpp);
// the legacy megatron/model T5 is refused by name.
TEST(MegatronBertCheckpoint, AT5CheckpointIsToldApart) {
  std::vector<std::string> names = {"encoder.layers.0.input_layernorm.weight",
                                    "decoder.layers.0.input_layernorm.weight"};
  EXPECT_EQ(torch_names::family_of(names), "t5");
  bool alias = false;
  const std::string legacy = megatron::testing::error_of(
      [&] { torch_names::t5_to_ours("language_model.encoder.layers.0.input_layernorm.weight", &alias); });
  EXPECT_NE(legacy.find("legacy megatron/model T5"), std::string::npos) << legacy;
  EXPECT_EQ(torch_names::family_of({"language_model.encoder.layers.0.input_layernorm.weight"}), "gpt");
  EXPECT_EQ(torch_names::family_of({"language_model.encoder.layers.0.input_layernorm.weight",
                                    "lm_head.dense.weight"}),
            "bert");
  bool tied_copy = false, legacy_qkv = false;
  EXPECT_EQ(torch_names::to_ours("lm_head.layernorm.weight", 0, true, &tied_copy, &legacy_qkv, "encoder"),
            "lm_head.layer_norm.weight");
  EXPECT_EQ(torch_names::to_ours("lm_head.bias", 0, true, &tied_copy, &legacy_qkv, "encoder"),
            "output_layer.bias");
}

// Earlier Megatron-Core BertLMHeads kept the output layer inside the head; their folders are read
// (CoreAndLegacyFoldersReadBitForBit). A head tensor of no known layout is refused by name, with
// the names that are read.
TEST(MegatronBertCheckpoint, EarlierHeadNamesMapAndUnknownHeadTensorsAreRefusedByName) {
  bool tied_copy = false, legacy_qkv = false;
  EXPECT_EQ(torch_names::to_ours("lm_head.output_layer.bias", 0, true, &tied_copy, &legacy_qkv, "encoder"),
            "output_layer.bias");
  EXPECT_EQ(torch_names::to_ours("lm_head.output_layer.weight", 0, true, &tied_copy, &legacy_qkv, "encoder"),
            "output_layer.weight");
  EXPECT_TRUE(tied_copy);  // the last stage's copy of the tied word embedding
  EXPECT_EQ(torch_names::to_ours("lm_head.output_layer.weight", 0, false, &tied_copy, &legacy_qkv, "encoder"),
            "output_layer.weight");
  EXPECT_FALSE(tied_copy);
  for (const char* name : {"lm_head.decoder.weight", "lm_head.output_layer.scale", "output_layer.extra"}) {
    try {
      torch_names::to_ours(name, 0, true, &tied_copy, &legacy_qkv, "encoder");
      ADD_FAILURE() << name << " was mapped";
    } catch (const Error& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find(std::string("'") + name + "'"), std::string::npos) << m;
      EXPECT_NE(m.find("lm_head.output_layer.{weight,bias}"), std::string::npos) << m;
    }
  }
}

}  // namespace
}  // namespace megatron::training
