// The distributed optimizer's default torch_dist state, dp_reshardable, of mixture-of-experts
// models (training/torch_dist_buckets_moe.h): under expert parallelism Megatron-LM keeps the
// experts in a gradient buffer and optimizer of their own (a ChainedOptimizer: "chained_0." the
// dense one over the data-parallel group, "chained_1." the experts' over the expert data-parallel
// group, numbered by the expert tensor-model-pipeline rank).
// - tests/reference/write_torch_dist_moe_dp.py writes that state as Megatron does, saved by
//   TP2 x PP2 x EP2 with DP 2 (two dense DP ranks, one expert DP rank), for an all-MoE model with
//   Transformer Engine's order and a mixed one with local modules, a tied embedding and a gated
//   shared expert, and that one with its MoE layers on the second pipeline stage only (the first
//   stage's single optimizer keeps unprefixed keys): merged, every parameter's state is the
//   writer's, bit for bit.
// - Loaded by a one-rank run with the state, training continues exactly as from the same state
//   converted to this build's format; under mpirun -np 2 the fixture resumed at EP 1 x DP 2 and at
//   EP 2 follows the same curve.
// - pretrain-gpt --ckpt-format torch_dist --use-distributed-optimizer with experts writes it: at
//   EP 1 (experts in the dense buffer, no chain) and under -np 2 at EP 2, -np 4 at EP 2 x DP 4
//   (the experts' buckets split over 2 expert DP ranks, each rank its pieces) the run resumes bit
//   for bit; the Python reader assembles the buckets
//   under Megatron's keys; the EP 2 folder resumes at EP 1 x DP 2 on the curve.
#include <gtest/gtest.h>

#include <fstream>

#include "core/error.h"
#include "moe_test_util.h"
#include "training/checkpoint_convert.h"
#include "training/torch_dist_checkpoint.h"

namespace megatron::training {
namespace {

using namespace parallel_test;

const fs::path& fixtures() {
  static testing::TempDir dir;
  static const bool made = [] {
    const auto r = testing::run_command("/usr/bin/python3 " +
                                        (testing::source_dir() / "tests/reference/write_torch_dist_moe_dp.py").string() +
                                        " make " + dir.path().string() + " 2>&1");
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return r.exit_code == 0;
  }();
  EXPECT_TRUE(made);
  return dir.path();
}

// The writer's merged state of fixture `name`: kind -> our name -> values.
std::map<std::string, std::map<std::string, std::vector<float>>> reference_state(const std::string& name) {
  const fs::path ref = fixtures() / (name + ".ref");
  const json j = json::parse(testing::read_file(ref / "optimizer.json"));
  std::ifstream in(ref / "optimizer.bin", std::ios::binary);
  std::map<std::string, std::map<std::string, std::vector<float>>> out;
  for (const json& kind : j["kinds"])
    for (size_t i = 0; i < j["names"].size(); ++i) {
      int64_t n = 1;
      for (const json& d : j["shapes"][i]) n *= d.get<int64_t>();
      std::vector<float> v(static_cast<size_t>(n));
      in.read(reinterpret_cast<char*>(v.data()), std::streamsize(n * 4));
      out[kind.get<std::string>()][j["names"][i].get<std::string>()] = v;
    }
  EXPECT_TRUE(in.good());
  return out;
}

// The fixture's "moe" model with its state, to train from iteration 7 to 9.
TrainingArgs fixture_moe_args(const Fixture& f, int ep) {
  TrainingArgs a = torch_dist_moe_fixture_args(f, 9, ep);
  a.model.seq_length = 32;
  a.parallel.use_distributed_optimizer = true;
  a.use_checkpoint_opt_param_scheduler = true;  // the fixture's LR schedule
  a.load = fixtures() / "moe_dp";
  a.save = "";
  return a;
}

TEST(TorchDistMoeDp, StateMergesToTheWritersValues) {
  for (const std::string name : {"moe_dp", "moe_mixed_dp", "moe_late_dp"}) {
    SCOPED_TRACE(name);
    const auto ckpt = find_checkpoint(fixtures() / name, std::nullopt);
    ASSERT_TRUE(ckpt.has_value());
    const MergedCheckpoint m = merge_torch_dist_checkpoint(*ckpt, true);
    EXPECT_EQ(m.optimizer_type, "adam");
    EXPECT_EQ(m.optimizer_step, 9);  // from chained_0's "optimizer" ShardedObject
    const auto want = reference_state(name);
    for (const char* kind : {"exp_avg", "exp_avg_sq"}) {
      ASSERT_TRUE(m.optimizer.count(kind)) << kind;
      const auto& got = m.optimizer.at(kind);
      EXPECT_EQ(got.size(), want.at(kind).size()) << kind;
      for (const auto& [n, v] : want.at(kind)) {
        auto it = got.find(n);
        ASSERT_NE(it, got.end()) << kind << " " << n;
        EXPECT_EQ(it->second.to_float_vector(), v) << kind << " " << n;
      }
    }
  }
}

// One rank loading the fixture with its state trains exactly as from that state in this
// build's format (`checkpoint convert`, the merged path): the per-rank read cuts the same values.
TEST(TorchDistMoeDp, ResumesAsFromTheConvertedState) {
  Fixture f;
  ConvertOptions o;
  o.load = (fixtures() / "moe_dp").string();
  o.save = f.dir / "ours";
  convert_checkpoint(o);
  TrainingArgs a = fixture_moe_args(f, 1);
  const TrainingSummary from_dist = run_single(a);
  a.load = f.dir / "ours";
  const TrainingSummary from_ours = run_single(a);
  ASSERT_EQ(from_dist.start_iteration, 7);
  ASSERT_EQ(from_dist.losses.size(), 2u);
  EXPECT_EQ(from_dist.losses, from_ours.losses);
  EXPECT_EQ(from_dist.grad_norms, from_ours.grad_norms);
  a.load = fixtures() / "moe_dp";
  a.no_load_optim = true;  // the state matters: a fresh optimizer goes elsewhere
  const TrainingSummary fresh = run_single(a);
  EXPECT_NE(fresh.losses.back(), from_dist.losses.back());
}

// Saves with --ckpt-format torch_dist and the distributed optimizer, resumes bit for bit
// (save_in_format_and_resume); the Python reader assembles every bucket under Megatron's keys.
// Returns the folder and the reader's JSON of it.
struct Saved {
  std::string dir;
  json summary;
};
Saved save_and_resume(const Fixture& f, TrainingArgs a, const std::string& name) {
  a.parallel.use_distributed_optimizer = true;
  json summary;
  const FormatResume r = save_in_format_and_resume(f.dir, a, name, "torch_dist", "dist", [&](const fs::path& it) {
    const auto py = testing::run_command("/usr/bin/python3 " +
                                         (testing::source_dir() / "tests/reference/write_torch_dist_moe_dp.py").string() +
                                         " summary " + it.string() + " 2>&1");
    ASSERT_EQ(py.exit_code, 0) << py.output;
    summary = json::parse(py.output);
  });
  world()->barrier();
  return {r.saved.save, summary};
}

TEST(TorchDistMoeDpTraining, WritesTheStateAndResumesBitForBit) {
  Fixture f;
  // EP 1: the experts stay in the dense buffer, one optimizer, no chain.
  const json s = save_and_resume(f, moe_args(f, 4), "ep1").summary;
  EXPECT_EQ(s["common"], json::array({"param_state_sharding_type"})) << s.dump();
  EXPECT_EQ(s["buckets"].size(), 1u) << s.dump();
  EXPECT_TRUE(s["buckets"].contains("optimizer.distributed.dp_group_idx_0.")) << s.dump();
  TrainingArgs g = moe_args(f, 4);  // grouped experts with Transformer Engine's order
  g.model.moe_grouped_gemm = true;
  g.transformer_impl = "transformer_engine";
  save_and_resume(f, g, "grouped");
}

TEST(TorchDistMoeDpTraining, RefusesWhatItDoesNotWrite) {
  Fixture f;
  TrainingArgs a = moe_args(f, 4);
  a.save = f.dir / "never";
  a.save_interval = 2;
  a.ckpt_format = "torch_dist";
  a.parallel.use_distributed_optimizer = true;
  a.transformer_impl = "local";
  EXPECT_NO_THROW(validate_args(a));
  a.model.moe_grouped_gemm = true;  // Megatron's legacy GroupedMLP
  try {
    validate_args(a);
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("GroupedMLP"), std::string::npos) << e.what();
  }
  a.no_save_optim = true;
  EXPECT_NO_THROW(validate_args(a));
}

TEST(MpiTorchDistMoeDp, FixtureResumesAlikeUnderExpertParallelSizes) {
  SKIP_ON_ONE_RANK();
  if (world()->size() != 2) GTEST_SKIP() << "runs at -np 2 (EP 1 x DP 2 and EP 2)";
  Fixture f;
  std::vector<std::vector<double>> curves;
  for (int ep : {1, 2}) {
    const TrainingSummary r = pretrain(fixture_moe_args(f, ep));
    ASSERT_EQ(r.start_iteration, 7);
    ASSERT_EQ(r.losses.size(), 2u);
    curves.push_back(r.losses);
  }
  for (size_t i = 0; i < 2; ++i) EXPECT_NEAR(curves[0][i], curves[1][i], 1e-5 * curves[1][i]) << i;
}

TEST(MpiTorchDistMoeDpTraining, ExpertParallelSaveResumeAndAnotherLayout) {
  SKIP_ON_ONE_RANK();
  const int W = world()->size();
  if (W != 2 && W != 4) GTEST_SKIP() << "runs at -np 2 (EP 2) and 4 (EP 2 x DP 4: 2 expert DP ranks)";
  Fixture f;
  TrainingArgs a = moe_args(f, 4);
  a.parallel.expert_model_parallel_size = 2;
  const std::string name = "ep2_" + std::to_string(W);
  const Saved saved = save_and_resume(f, a, name);
  const json& s = saved.summary;
  if (world()->rank() == 0) {
    // Dense: dp_group_idx_<t> over DP; experts: dp_group_idx_<t + T e> over the expert DP group.
    EXPECT_EQ(s["common"], json::array({"0", "1"})) << s.dump();
    const int T = a.parallel.tensor_model_parallel_size;
    EXPECT_EQ(s["buckets"].size(), size_t(T + 2 * T)) << s.dump();
    for (int t = 0; t < T; ++t) {
      EXPECT_TRUE(s["buckets"].contains("chained_0.optimizer.distributed.dp_group_idx_" + std::to_string(t) + "."));
      for (int e = 0; e < 2; ++e)
        EXPECT_TRUE(s["buckets"].contains("chained_1.optimizer.distributed.dp_group_idx_" +
                                          std::to_string(t + T * e) + "."))
            << s.dump();
    }
  }
  if (W != 2) return;  // (the other layout once)
  // The folder at iteration 2 under EP 1 x DP 2: the state merged back, the same curve.
  TrainingArgs under = a;
  under.parallel.expert_model_parallel_size = 1;
  expect_curve_resumed_under(under, "torch_dist", saved.dir, 2, a, f.dir);
}

}  // namespace
}  // namespace megatron::training
