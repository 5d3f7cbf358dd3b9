// Mixture-of-experts checkpoints in Megatron-LM's torch format (training/torch_checkpoint.h):
// a TP 1 x EP 2 folder written by Debian's torch as Megatron-LM writes it
// (tests/reference/megatron_moe_checkpoint.py: mp_rank_00_EEE folders, local expert numbers,
// the ChainedOptimizer's dense and expert state dicts) reads bit for bit into the single-rank
// tensors under their global expert numbers, under any expert-parallel size; written back here
// as EP 2 and, converted from that .pt, as EP 1, the files load strictly into the reference's
// module trees and optimizers (torch.load) and read back bit for bit.
#include <gtest/gtest.h>

#include <set>

#include "checkpoint_test_util.h"
#include "core/safetensors.h"
#include "training/torch_checkpoint.h"

namespace megatron::training {
namespace {

namespace fs = std::filesystem;
using namespace interop_testing;

std::string moe_reference(const std::string& args) {
  const auto r = testing::run_command(
      "/usr/bin/python3 " +
      (testing::source_dir() / "tests/reference/megatron_moe_checkpoint.py").string() + " " + args +
      " 2>&1");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return r.output;
}

std::set<int> experts_in(const SafetensorsContents& st) {
  std::set<int> out;
  for (const auto& [n, t] : st.tensors)
    if (const int x = torch_names::expert_number(n); x >= 0) out.insert(x);
  return out;
}

class MegatronMoeCheckpoint : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new testing::TempDir();
    moe_reference("make " + dir_->path().string());
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  static fs::path fixture() { return dir_->path() / "moe_ep2"; }
  static std::map<std::string, Tensor> reference() {
    return read_safetensors(fixture() / "reference.safetensors").tensors;
  }
  static testing::TempDir* dir_;
};
testing::TempDir* MegatronMoeCheckpoint::dir_ = nullptr;

TEST_F(MegatronMoeCheckpoint, ReadsExpertFoldersBitForBit) {
  const auto ckpt = find_checkpoint(fixture() / "megatron", std::nullopt);
  ASSERT_TRUE(ckpt.has_value());
  EXPECT_EQ(ckpt->format, "torch");
  EXPECT_EQ(ckpt->parallel.expert_model_parallel_size, 2);  // mp_rank_00_EEE: EP, as args say
  EXPECT_EQ(ckpt->parallel.pipeline_model_parallel_size, 1);
  const TrainingArgs a = training_args_from_json(ckpt->state.args);
  EXPECT_EQ(a.model.num_moe_experts, 4);
  EXPECT_EQ(a.model.moe_layer_freq, "[0,1]");
  EXPECT_EQ(a.model.moe_ffn_hidden_size, 16);
  EXPECT_EQ(a.model.moe_shared_expert_intermediate_size, 24);
  EXPECT_TRUE(a.model.moe_shared_expert_gate);
  EXPECT_EQ(ckpt->state.optimizer_type, "adam");
  // Experts under their global numbers, the dense and the expert optimizer's state, the step.
  const MergedCheckpoint m = merge_checkpoint(*ckpt, true);
  expect_bit_equal(everything(m), reference(), "merged .pt");
  // An EP 2 rank reads its own folder (experts 2, 3 on rank 1); an EP 1 rank both (all four).
  CheckpointRank r;
  r.ep_size = 2;
  r.ep_rank = 1;
  bool resharded = true;
  const TorchRankContents own = read_torch_rank_for(*ckpt, r, true, &resharded);
  EXPECT_FALSE(resharded);
  EXPECT_EQ(experts_in(own.model), (std::set<int>{2, 3}));
  ASSERT_TRUE(own.optimizer.has_value());
  EXPECT_TRUE(own.optimizer->tensors.count(
      "optimizer.state.exp_avg.decoder.layers.1.mlp.experts.local_experts.3.linear_fc2.weight"));
  const TorchRankContents all = read_torch_rank_for(*ckpt, CheckpointRank{}, true, &resharded);
  EXPECT_TRUE(resharded);
  EXPECT_EQ(experts_in(all.model), (std::set<int>{0, 1, 2, 3}));
}

TEST_F(MegatronMoeCheckpoint, WritesExpertFoldersThatTorchLoadsAndConvertsEp2ToEp1) {
  testing::TempDir out;
  ConvertOptions o;
  o.load = fixture() / "megatron";
  o.save = out / "pt_ep2";
  o.save_format = "torch";
  o.target_ep = 2;
  const ConvertResult r2 = convert_checkpoint(o);
  EXPECT_EQ(r2.to.expert_model_parallel_size, 2);
  for (const char* d : {"mp_rank_00_000", "mp_rank_00_001"})
    EXPECT_TRUE(fs::exists(out / "pt_ep2" / "iter_0000007" / d / kTorchCheckpointFile)) << d;
  // EP 2 -> EP 1 in the torch format itself.
  o.load = out / "pt_ep2";
  o.save = out / "pt_ep1";
  o.target_ep = 1;
  convert_checkpoint(o);
  EXPECT_TRUE(fs::exists(out / "pt_ep1" / "iter_0000007" / "mp_rank_00" / kTorchCheckpointFile));
  EXPECT_FALSE(fs::exists(out / "pt_ep1" / "iter_0000007" / "mp_rank_00_000"));
  // torch.load into Megatron's module trees (strict) and optimizers: two chained optimizers under
  // EP 2 (dense: weight-decayed and not; experts: their weights), one under EP 1.
  const std::string ep2 = moe_reference("check " + (out / "pt_ep2").string() + " 7 2");
  EXPECT_NE(ep2.find("\"groups\": [[12, 10], [4]]"), std::string::npos) << ep2;
  EXPECT_NE(ep2.find("\"moe_layer_freq\": [0, 1]"), std::string::npos) << ep2;
  EXPECT_NE(ep2.find("\"num_experts\": 4"), std::string::npos) << ep2;
  const std::string ep1 = moe_reference("check " + (out / "pt_ep1").string() + " 7 1");
  EXPECT_NE(ep1.find("\"groups\": [[20, 10]]"), std::string::npos) << ep1;
  EXPECT_NE(ep1.find("\"optimizers\": 1"), std::string::npos) << ep1;
  // Both read back bit for bit.
  for (const char* name : {"pt_ep2", "pt_ep1"}) {
    const auto ckpt = find_checkpoint(out / name, std::nullopt);
    ASSERT_TRUE(ckpt.has_value()) << name;
    EXPECT_EQ(ckpt->parallel.expert_model_parallel_size, std::string(name) == "pt_ep2" ? 2 : 1);
    expect_bit_equal(everything(merge_checkpoint(*ckpt, true)), reference(), name);
  }
}

// Experts that do not split over the target's expert-parallel ranks, and an EP folder missing
// (the arguments say EP 2), are errors naming what is wrong.
TEST_F(MegatronMoeCheckpoint, RefusesAnUnevenExpertSplitAndAMissingExpertFolder) {
  testing::TempDir out;
  ConvertOptions o;
  o.load = fixture() / "megatron";
  o.save = out / "pt";
  o.save_format = "torch";
  o.target_ep = 3;
  try {
    convert_checkpoint(o);
    FAIL() << "4 experts split over 3 expert-parallel ranks";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not a positive multiple of 3"), std::string::npos) << e.what();
  }
  // The EP 2 folders without their second rank: the missing file is named.
  fs::copy(fixture() / "megatron", out / "incomplete", fs::copy_options::recursive);
  fs::remove_all(out / "incomplete" / "iter_0000007" / "mp_rank_00_001");
  try {
    find_checkpoint(out / "incomplete", std::nullopt);
    FAIL() << "a missing EP folder";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("mp_rank_00_001"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace megatron::training
