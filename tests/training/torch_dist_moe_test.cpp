// Mixture-of-experts layers in Megatron-LM's torch_dist checkpoints (training/torch_dist_moe.h):
// tests/reference/write_torch_dist_moe.py writes two MoE models as Megatron-Core keys them, saved
// under TP2 x PP2 x EP2 (every layer MoE with the layer and expert axes; and --moe-layer-freq
// [0,1,0,1] with a gated shared expert, one key per layer). Each merges to the writer's weights
// exactly, the experts under the sequential or the grouped experts' names as the reader asks;
// `checkpoint convert --save-format torch_dist` writes what the independent Python reader reads
// back key for key and bit for bit; what is not read is refused by name.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "test_util.h"
#include "training/checkpoint.h"
#include "training/checkpoint_convert.h"
#include "training/torch_dist_checkpoint.h"
#include "training/torch_dist_moe.h"

namespace megatron::training {
namespace {

namespace fs = std::filesystem;
namespace mt = megatron::testing;
using json = nlohmann::json;

const fs::path& fixtures() {
  static mt::TempDir dir;
  static const bool made = [] {
    const auto r = mt::run_command("/usr/bin/python3 " +
                                   (mt::source_dir() / "tests/reference/write_torch_dist_moe.py").string() +
                                   " make " + dir.path().string() + " 2>&1");
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return r.exit_code == 0;
  }();
  EXPECT_TRUE(made);
  return dir.path();
}

// The writer's merged weights of model `name` (our names, float32).
std::map<std::string, std::vector<float>> reference(const std::string& name) {
  const fs::path ref = fixtures() / (name + ".ref");
  const json j = json::parse(mt::read_file(ref / "weights.json"));
  std::ifstream in(ref / "weights.bin", std::ios::binary);
  std::map<std::string, std::vector<float>> out;
  for (size_t i = 0; i < j["names"].size(); ++i) {
    int64_t n = 1;
    for (const json& d : j["shapes"][i]) n *= d.get<int64_t>();
    std::vector<float> v(static_cast<size_t>(n));
    in.read(reinterpret_cast<char*>(v.data()), std::streamsize(n * 4));
    out[j["names"][i].get<std::string>()] = v;
  }
  EXPECT_TRUE(in.good());
  return out;
}

void expect_reference(const std::map<std::string, Tensor>& got, const std::string& name) {
  const auto want = reference(name);
  EXPECT_EQ(got.size(), want.size()) << name;
  for (const auto& [n, v] : want) {
    auto it = got.find(n);
    ASSERT_NE(it, got.end()) << name << ": " << n << " missing";
    EXPECT_EQ(it->second.to(DType::F32).to_float_vector(), v) << name << ": " << n;
  }
}

CheckpointOnDisk open(const fs::path& dir) {
  const auto c = find_checkpoint(dir, std::nullopt);
  EXPECT_TRUE(c.has_value());
  EXPECT_EQ(c->format, "torch_dist");
  return *c;
}

TEST(TorchDistMoe, FixturesMergeToTheWritersWeights) {
  for (const std::string name : {"moe", "moe_mixed"}) {
    const CheckpointOnDisk c = open(fixtures() / name);
    const json& model = c.state.args["model"];
    EXPECT_EQ(model["num_moe_experts"].get<int>(), 4) << name;
    EXPECT_EQ(model["num_layers"].get<int>(), 4) << name;
    const MergedCheckpoint m = merge_checkpoint(c, false);
    expect_reference(m.model, name);
    // The expert tensors keep their layout's shard rules: fc1 along its rows, fc2 its columns.
    const std::string e = "decoder.layers.1.mlp.experts.local_experts.3.";
    EXPECT_EQ(m.rules.at(e + "linear_fc1.weight").dim, 0) << name;
    EXPECT_EQ(m.rules.at(e + "linear_fc2.weight").dim, 1) << name;
  }
}

TEST(TorchDistMoe, GroupedExpertNamesReadTheSameTensors) {
  // TEGroupedMLP and SequentialMLP share their sharded keys: a run of grouped experts asks for
  // mlp.experts.linear_fc1.weight<e> and gets the same tensor.
  const CheckpointOnDisk c = open(fixtures() / "moe");
  const auto grouped = read_torch_dist_model(c, [](const std::string& n) {
    return n.find(".mlp.experts.linear_fc") != std::string::npos;
  });
  const auto want = reference("moe");
  EXPECT_EQ(grouped.size(), 4u * 4u * 2u);
  for (int l = 0; l < 4; ++l)
    for (int e = 0; e < 4; ++e)
      for (const std::string fc : {"linear_fc1", "linear_fc2"}) {
        const auto [seq, grp] = torch_dist_moe::expert_names(l, fc + ".weight", e);
        ASSERT_TRUE(grouped.count(grp)) << grp;
        EXPECT_EQ(grouped.at(grp).to_float_vector(), want.at(seq)) << grp;
      }
  // Cut for expert-parallel rank 1 of 2 at TP 2: its experts' shards only, by their global names.
  std::map<std::string, Shape> params = {{"decoder.layers.2.mlp.experts.local_experts.3.linear_fc1.weight", {16, 32}},
                                         {"decoder.layers.2.mlp.experts.local_experts.3.linear_fc2.weight", {32, 8}}};
  CheckpointRank r;
  r.tp_size = 2;
  r.tp_rank = 1;
  r.ep_size = 2;
  r.ep_rank = 1;
  const auto shards = read_torch_dist_shards(c, params, r);
  ASSERT_EQ(shards.size(), 2u);
  const std::vector<float>& fc1 = want.at("decoder.layers.2.mlp.experts.local_experts.3.linear_fc1.weight");
  const std::vector<float> got = shards.begin()->second.to_float_vector();
  // SwiGLU's [gate; up] per TP rank: gate rows 8..15 and up rows 24..31 of the 32.
  for (int i = 0; i < 8 * 32; ++i) {
    EXPECT_EQ(got[size_t(i)], fc1[size_t(8 * 32 + i)]) << i;
    EXPECT_EQ(got[size_t(8 * 32 + i)], fc1[size_t(24 * 32 + i)]) << i;
  }
}

TEST(TorchDistMoe, ConvertWritesWhatThePythonReaderReads) {
  mt::TempDir out;
  for (const std::string name : {"moe", "moe_mixed"}) {
    ConvertOptions o;
    o.load = (fixtures() / name).string();
    o.save = (out.path() / (name + "_dist")).string();
    o.save_format = "torch_dist";
    o.target_tp = 2;
    o.target_pp = 1;
    o.transformer_impl = name == "moe" ? "transformer_engine" : "local";
    convert_checkpoint(o);
    const auto r = mt::run_command("/usr/bin/python3 " +
                                   (mt::source_dir() / "tests/reference/write_torch_dist_moe.py").string() +
                                   " check " + name + " " + (fs::path(o.save) / "iter_0000007").string() + " 2>&1");
    EXPECT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("ok:"), std::string::npos) << r.output;
    // And back: the folder we wrote merges to the same weights.
    expect_reference(merge_checkpoint(open(o.save), false).model, name);
  }
}

TEST(TorchDistMoe, RefusesSingletonExpertKeysByName) {
  try {
    torch_dist_moe::refuse_singleton_expert_key("decoder.layers.mlp.experts.experts.3.linear_fc1.weight", "x/.metadata");
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("singleton_local_shards"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("x/.metadata"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(torch_dist_moe::refuse_singleton_expert_key("decoder.layers.mlp.experts.experts.linear_fc1.weight",
                                                              "x/.metadata"));
}

TEST(TorchDistMoe, KeysOfOurNames) {
  TrainingArgs a;
  a.model.num_layers = 4;
  a.model.num_moe_experts = 4;
  a.model.moe_layer_freq = "1";
  const torch_dist_moe::MoeLayout every = torch_dist_moe::moe_layout(a);
  EXPECT_FALSE(every.per_layer_keys);
  auto k = torch_dist_moe::sharded_key("decoder.layers.2.mlp.experts.local_experts.3.linear_fc1.weight", true, every);
  EXPECT_EQ(k.key, "decoder.layers.mlp.experts.experts.linear_fc1.weight");
  EXPECT_EQ(k.layer, 2);
  EXPECT_EQ(k.expert, 3);
  k = torch_dist_moe::sharded_key("decoder.layers.1.mlp.experts.linear_fc2.weight2", true, every);
  EXPECT_EQ(k.key, "decoder.layers.mlp.experts.experts.linear_fc2.weight");
  EXPECT_EQ(k.expert, 2);
  // An MoE layer keeps its pre-MLP norm under Transformer Engine's names; attention fuses its own.
  EXPECT_EQ(torch_dist_moe::sharded_key("decoder.layers.0.pre_mlp_layernorm.weight", true, every).key,
            "decoder.layers.pre_mlp_layernorm.weight");
  EXPECT_EQ(torch_dist_moe::sharded_key("decoder.layers.0.input_layernorm.weight", true, every).key,
            "decoder.layers.self_attention.linear_qkv.layer_norm_weight");
  a.model.moe_layer_freq = "[0,1,0,1]";
  const torch_dist_moe::MoeLayout mixed = torch_dist_moe::moe_layout(a);
  EXPECT_TRUE(mixed.per_layer_keys);
  k = torch_dist_moe::sharded_key("decoder.layers.0.pre_mlp_layernorm.weight", true, mixed);  // a dense layer
  EXPECT_EQ(k.key, "decoder.layers.0.mlp.linear_fc1.layer_norm_weight");
  EXPECT_EQ(k.layer, -1);
  EXPECT_EQ(k.number, 0);
  a.model.moe_layer_freq = "2";  // every second layer: non-homogeneous too
  EXPECT_TRUE(torch_dist_moe::moe_layout(a).per_layer_keys);
}

}  // namespace
}  // namespace megatron::training
