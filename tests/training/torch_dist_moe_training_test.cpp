// pretrain-gpt --ckpt-format torch_dist with mixture-of-experts layers (training/torch_dist_moe.h):
// the trainer writes Megatron-Core's MoE keys (experts on a global expert axis, the router, the
// shared expert) with the plain optimizer's state per parameter; the independent Python reader
// (tests/reference/write_torch_dist_moe.py summary) assembles every key from the items and finds
// the trained weights in them; --load resumes on the uninterrupted run's curve bit for bit. Under
// mpirun -np 2 the same at EP 2 (each expert-parallel rank writing its own experts), and the EP 2
// folder resumed at EP 1 x DP 2 follows the curve within 1e-5. (The distributed optimizer's state:
// torch_dist_moe_dp_test.cpp.)
#include <gtest/gtest.h>

#include "core/error.h"
#include "moe_test_util.h"
#include "training/torch_dist_moe.h"

namespace megatron::training {
namespace {

using namespace parallel_test;

// The Python reader's view of our folder against the uninterrupted run's weights at that
// iteration (this build's format): every weight's key present, its assembled sum equal.
void expect_python_reads(const fs::path& iter_dir, const TrainingArgs& a, const std::string& full_save, int64_t it) {
  const auto r = testing::run_command("/usr/bin/python3 " +
                                      (testing::source_dir() / "tests/reference/write_torch_dist_moe.py").string() +
                                      " summary " + iter_dir.string() + " 2>&1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const json got = json::parse(r.output)["tensors"];
  std::map<std::string, double> want;
  const torch_dist_moe::MoeLayout moe = torch_dist_moe::moe_layout(a);
  for (const auto& [name, v] : gathered_model(full_save, it)) {
    if (name == "output_layer.weight" && !a.model.untie_embeddings_and_output_weights) continue;
    double s = 0;
    for (float x : v) s += x;
    want[torch_dist_moe::sharded_key(name, a.transformer_impl == "transformer_engine", moe).key] += s;
  }
  for (const auto& [key, s] : want) {
    ASSERT_TRUE(got.contains(key)) << key;
    EXPECT_NEAR(got[key]["sum"].get<double>(), s, 1e-4 * (1 + std::abs(s))) << key;
    // The router's expert_bias is a buffer: no optimizer state.
    EXPECT_EQ(got.contains("optimizer.state.exp_avg." + key), !key.ends_with(".router.expert_bias")) << key;
  }
  // The experts' key: [E, F1, h] of one layer (per-layer keys), or [L, E, F1, h].
  const std::string fc1 = moe.per_layer_keys ? "decoder.layers.1.mlp.experts.experts.linear_fc1.weight"
                                             : "decoder.layers.mlp.experts.experts.linear_fc1.weight";
  std::vector<int64_t> shape = {4, 2 * a.model.moe_ffn_hidden_size, 32};
  if (!moe.per_layer_keys) shape.insert(shape.begin(), 2);
  ASSERT_TRUE(got.contains(fc1)) << r.output.substr(0, 2000);
  EXPECT_EQ(got[fc1]["shape"].get<std::vector<int64_t>>(), shape);
}

// 4 iterations in our format (saved at 2 and 4); 2 with --ckpt-format torch_dist, then a resume
// from that folder for the last 2 (save_in_format_and_resume: the same losses, grad norms and MoE
// losses), its final weights the uninterrupted run's. Returns the torch_dist folder.
std::string save_and_resume(const Fixture& f, TrainingArgs a, const std::string& name) {
  const FormatResume r = save_in_format_and_resume(f.dir, a, name, "torch_dist", "dist", [&](const fs::path& it) {
    expect_python_reads(it, a, f.dir / (name + "_full"), 2);
  });
  // (merged for conversion, the router's expert_bias state is left out: compared in the resume)
  if (world()->rank() == 0 && !a.model.moe_router_enable_expert_bias)
    expect_same_merged_model(r.saved.save, f.dir / (name + "_full"), 4);
  world()->barrier();
  return r.saved.save;
}

TEST(TorchDistMoeTraining, SavesMegatronsMoeKeysAndResumesBitForBit) {
  Fixture f;
  save_and_resume(f, moe_args(f, 4), "mixed");  // --moe-layer-freq [0,1]: one key per layer
  TrainingArgs g = moe_args(f, 4);              // every layer MoE, grouped experts: layer axis
  g.model.moe_layer_freq = "1";
  g.model.moe_grouped_gemm = true;
  save_and_resume(f, g, "grouped");
  TrainingArgs b = moe_args(f, 4);  // sigmoid routing with the router's expert_bias buffer
  b.model.moe_router_score_function = "sigmoid";
  b.model.moe_router_enable_expert_bias = true;
  b.model.moe_router_bias_update_rate = 0.125f;  // steps a float32 buffer holds exactly
  save_and_resume(f, b, "expert_bias");
}

TEST(MpiTorchDistMoeTraining, ExpertParallelSaveResumeAndAnotherExpertParallelSize) {
  SKIP_ON_ONE_RANK();
  if (world()->size() != 2) GTEST_SKIP() << "runs at -np 2 (EP 2)";
  Fixture f;
  TrainingArgs a = moe_args(f, 4);
  a.parallel.expert_model_parallel_size = 2;
  const std::string dist = save_and_resume(f, a, "ep2");
  // The EP 2 folder at iteration 2 under EP 1 x DP 2: every rank reads every expert it holds.
  expect_curve_resumed_under(moe_args(f, 4), "torch_dist", dist, 2, a, f.dir);
}

TEST(MpiTorchDistMoeTraining, MegatronsFolderTrainsAlikeUnderExpertParallelSizes) {
  SKIP_ON_ONE_RANK();
  if (world()->size() != 2) GTEST_SKIP() << "runs at -np 2 (EP 1 x DP 2 and EP 2)";
  // tests/reference/write_torch_dist_moe.py's "moe" (saved under TP 2 x PP 2 x EP 2), fine-tuned
  // for one iteration: its loss (the loaded weights' forward) alike under both layouts.
  Fixture f;
  if (world()->rank() == 0) {
    const auto r = testing::run_command("/usr/bin/python3 " +
                                        (testing::source_dir() / "tests/reference/write_torch_dist_moe.py").string() +
                                        " make " + (f.dir / "megatron") + " 2>&1");
    EXPECT_EQ(r.exit_code, 0) << r.output;
  }
  world()->barrier();
  std::vector<double> first;
  for (int ep : {1, 2}) {
    TrainingArgs a = torch_dist_moe_fixture_args(f, 4, ep);
    a.exit_interval = 1;
    a.load = f.dir / "megatron/moe";
    a.finetune = true;
    const TrainingSummary r = pretrain(a);
    ASSERT_EQ(r.losses.size(), 1u);
    first.push_back(r.losses[0]);
  }
  EXPECT_NEAR(first[0], first[1], 1e-6 * first[0]);
  EXPECT_LT(first[0], 20.0);
}

}  // namespace
}  // namespace megatron::training
