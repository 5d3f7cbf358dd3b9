// The norms' keys of --transformer-impl local runs in torch_dist. Megatron-Core's local layer specs
// (gpt_layer_specs.py get_gpt_layer_local_submodules, dense and MoE layers; bert_layer_specs.py;
// t5_spec.py) set sharded_state_dict_keys_map, which TransformerLayer.sharded_state_dict applies
// to the sharded keys: a local run keys input_layernorm and pre_mlp_layernorm under Transformer
// Engine's fused names (self_attention.linear_qkv.layer_norm_*, mlp.linear_fc1.layer_norm_*), as a
// TE run does, except that under TE an MoE layer's pre-MLP norm is a TENorm of its own. What this
// build writes for a local run is read by the independent Python reader with those keys, model and
// optimizer state alike; a folder with the module names (as earlier builds wrote local runs) still
// loads to the same weights and optimizer state; a folder holding one norm under both names is
// refused, naming both keys.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "test_util.h"
#include "torch_dist_test_util.h"
#include "training/checkpoint.h"
#include "training/checkpoint_convert.h"
#include "training/torch_dist_moe.h"

namespace megatron {
namespace {

namespace fs = std::filesystem;
namespace mt = megatron::testing;
using json = nlohmann::json;

const char* const kTokenizer = " --tokenizer-type NullTokenizer --vocab-size 60";

const fs::path& fixtures() { return mt::python_fixtures("tests/reference/write_torch_dist.py"); }

std::string key_of(const std::string& ours, bool te, const training::torch_dist_moe::MoeLayout& moe) {
  return training::torch_dist_moe::sharded_key(ours, te, moe).key;
}

TEST(TorchDistLocalKeys, NormsAreKeyedAsMegatronCoreKeysThemForEachImplAndLayerKind) {
  const training::torch_dist_moe::MoeLayout dense;
  for (const bool te : {false, true}) {
    SCOPED_TRACE(te ? "transformer_engine" : "local");
    EXPECT_EQ(key_of("decoder.layers.1.input_layernorm.weight", te, dense),
              "decoder.layers.self_attention.linear_qkv.layer_norm_weight");
    EXPECT_EQ(key_of("decoder.layers.1.input_layernorm.bias", te, dense),
              "decoder.layers.self_attention.linear_qkv.layer_norm_bias");
    EXPECT_EQ(key_of("decoder.layers.0.pre_mlp_layernorm.weight", te, dense),
              "decoder.layers.mlp.linear_fc1.layer_norm_weight");
    // BertModel's and T5's encoder block: the same map.
    EXPECT_EQ(key_of("encoder.layers.2.pre_mlp_layernorm.bias", te, dense),
              "encoder.layers.mlp.linear_fc1.layer_norm_bias");
    EXPECT_EQ(key_of("encoder.layers.2.input_layernorm.weight", te, dense),
              "encoder.layers.self_attention.linear_qkv.layer_norm_weight");
    // T5's pre-cross-attention norm is in neither map; the final norm is the block's.
    EXPECT_EQ(key_of("decoder.layers.0.pre_cross_attn_layernorm.weight", te, dense),
              "decoder.layers.pre_cross_attn_layernorm.weight");
    EXPECT_EQ(key_of("decoder.final_layernorm.weight", te, dense), "decoder.final_layernorm.weight");
  }
  training::TrainingArgs a;
  a.model.num_layers = 4;
  a.model.num_moe_experts = 4;
  a.model.moe_layer_freq = "1";
  const auto every = training::torch_dist_moe::moe_layout(a);
  // An MoE layer's pre-MLP norm: fused by the local spec's map, a TENorm of its own under TE.
  EXPECT_EQ(key_of("decoder.layers.0.pre_mlp_layernorm.weight", false, every),
            "decoder.layers.mlp.linear_fc1.layer_norm_weight");
  EXPECT_EQ(key_of("decoder.layers.0.pre_mlp_layernorm.weight", true, every), "decoder.layers.pre_mlp_layernorm.weight");
  EXPECT_EQ(key_of("decoder.layers.3.input_layernorm.weight", false, every),
            "decoder.layers.self_attention.linear_qkv.layer_norm_weight");
  a.model.moe_layer_freq = "[0,1,0,1]";
  const auto mixed = training::torch_dist_moe::moe_layout(a);
  EXPECT_EQ(key_of("decoder.layers.1.pre_mlp_layernorm.bias", false, mixed),
            "decoder.layers.1.mlp.linear_fc1.layer_norm_bias");
  EXPECT_EQ(key_of("decoder.layers.1.pre_mlp_layernorm.bias", true, mixed), "decoder.layers.1.pre_mlp_layernorm.bias");
  EXPECT_EQ(key_of("decoder.layers.2.pre_mlp_layernorm.bias", true, mixed),
            "decoder.layers.2.mlp.linear_fc1.layer_norm_bias");
}

// The independent reader (tests/reference/read_torch_dist.py through write_torch_dist_moe.py
// summary) lists the tensor keys of a local save: the fused names, for the weights and for each
// state of the optimizer, and no module name of a layer norm.
TEST(TorchDistLocalKeys, ALocalSaveHoldsMegatronsFusedNormKeys) {
  mt::TempDir out;
  const auto r = mt::run_cli("checkpoint convert --load " + (fixtures() / "gpt2").string() + " --save " +
                             (out / "td").string() + " --save-format torch_dist --transformer-impl local" +
                             kTokenizer + " 2>&1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto py = mt::run_command("/usr/bin/python3 " +
                                  (mt::source_dir() / "tests/reference/write_torch_dist_moe.py").string() +
                                  " summary " + (out / "td" / "iter_0000007").string() + " 2>&1");
  ASSERT_EQ(py.exit_code, 0) << py.output;
  const json tensors = json::parse(py.output).at("tensors");
  for (const char* prefix : {"", "optimizer.state.param.", "optimizer.state.exp_avg.", "optimizer.state.exp_avg_sq."})
    for (const char* norm : {"self_attention.linear_qkv.layer_norm_weight", "self_attention.linear_qkv.layer_norm_bias",
                             "mlp.linear_fc1.layer_norm_weight", "mlp.linear_fc1.layer_norm_bias"}) {
      const std::string key = std::string(prefix) + "decoder.layers." + norm;
      ASSERT_TRUE(tensors.contains(key)) << key << "\n" << py.output;
      EXPECT_EQ(tensors[key]["shape"], json::array({4, 32})) << key;  // 4 layers of hidden size 32
    }
  for (const auto& [key, _] : tensors.items())
    EXPECT_TRUE(key.find("input_layernorm") == std::string::npos && key.find("pre_mlp_layernorm") == std::string::npos)
        << key;
}

// A local run's folder with the norms under their module names (decoder.layers.input_layernorm.*,
// as earlier builds of this program wrote them) loads to the writer's weights and to the same
// model and optimizer state as the folder with Megatron's fused keys; each TP rank streams its cut.
TEST(TorchDistLocalKeys, AFolderWithTheNormsModuleNamesStillLoads) {
  const auto fused = training::find_checkpoint(fixtures() / "gpt2", std::nullopt);
  const auto unfused = training::find_checkpoint(fixtures() / "gpt2_unfused", std::nullopt);
  ASSERT_TRUE(fused && unfused);
  const training::MergedCheckpoint a = training::merge_checkpoint(*fused, true);
  const training::MergedCheckpoint b = training::merge_checkpoint(*unfused, true);
  const auto want = mt::reference_weights(fixtures() / "gpt2.ref");
  mt::expect_same_weights(b.model, want, "unfused");
  mt::expect_same_weights(a.model, want, "fused");
  EXPECT_EQ(b.optimizer_type, "adam");
  ASSERT_EQ(a.optimizer.size(), b.optimizer.size());
  for (const auto& [kind, tensors] : a.optimizer) {
    ASSERT_TRUE(b.optimizer.count(kind)) << kind;
    mt::expect_same_weights(b.optimizer.at(kind), tensors, "optimizer " + kind);
  }
  mt::expect_tp_shards(*unfused, want, 2);
}

TEST(TorchDistLocalKeys, AFolderHoldingANormUnderBothNamesIsRefused) {
  mt::TempDir out;
  const auto r = mt::run_cli("checkpoint convert --load " + (fixtures() / "gpt2_both_names").string() + " --save " +
                             (out / "never").string() + kTokenizer + " 2>&1");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  for (const char* part : {"'decoder.layers.input_layernorm.bias' and "
                           "'decoder.layers.self_attention.linear_qkv.layer_norm_bias' both hold "
                           "'decoder.layers.0.input_layernorm.bias'",
                           "save the checkpoint again from one run"})
    EXPECT_NE(r.output.find(part), std::string::npos) << part << "\n" << r.output;
  EXPECT_EQ(r.output.find("internal error"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(out / "never"));
}

}  // namespace
}  // namespace megatron
