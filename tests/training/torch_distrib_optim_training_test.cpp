// pretrain-gpt --ckpt-format torch --use-distributed-optimizer: every rank folder gets Megatron's
// distrib_optim.pt beside model_optim_rng.pt (training/torch_distrib_optim.h), which the reference
// (tests/reference/megatron_distrib_optim.py check) loads and finds laid out as Megatron's gradient
// buffer with the values of our own checkpoint of the same iteration, and --load of the folder
// resumes on the uninterrupted run's curve bit for bit (losses, grad norms, final weights): the
// Adam moments and fp32 main weights came back. On one rank (DP1), and Mpi*: DP2 at np 2, PP2 x
// DP2 at np 4; a DP2 folder also resumes on one rank (another data-parallel size).
#include <gtest/gtest.h>

#include <sstream>

#include "parallel_test_util.h"
#include "training/torch_checkpoint.h"

namespace megatron::training {
namespace {

using namespace parallel_test;

// The reference's check of our .pt folder at `iteration` against our format's checkpoint of the
// same iteration (`ours`, merged into "model/<name>", "<kind>/<name>"): one JSON line per rank.
std::vector<json> reference_check(const std::string& folder, const std::string& ours, int64_t iteration, int tp,
                                  int pp, const std::string& impl) {
  const auto ckpt = find_checkpoint(ours, iteration);
  EXPECT_TRUE(ckpt.has_value());
  if (!ckpt) return {};
  const MergedCheckpoint m = merge_checkpoint(*ckpt, true);
  std::vector<std::pair<std::string, Tensor>> ref;
  for (const auto& [n, t] : m.model) ref.emplace_back("model/" + n, t);
  for (const auto& [kind, ts] : m.optimizer)
    for (const auto& [n, t] : ts) ref.emplace_back(kind + "/" + n, t);
  const fs::path ref_file = fs::path(folder) / "reference.safetensors";
  write_safetensors(ref_file, ref);
  const auto r = testing::run_command(
      "/usr/bin/python3 " + (testing::source_dir() / "tests/reference/megatron_distrib_optim.py").string() +
      " check " + folder + " " + std::to_string(iteration) + " " + std::to_string(tp) + " " + std::to_string(pp) +
      " fp32 " + ref_file.string() + " " + impl + " 2>&1");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  std::vector<json> out;
  std::istringstream in(r.output);
  for (std::string line; std::getline(in, line);)
    if (line.starts_with("{")) out.push_back(json::parse(line));
  return out;
}

// Trains 4 iterations uninterrupted (our format, saved at 2 and 4), then 2 with --ckpt-format
// torch and the distributed optimizer, checks the folder, resumes from it for the last 2 (on
// `resume_world` ranks' layout when given: rank 0 alone).
void save_check_resume(const Fixture& f, TrainingArgs a, const std::string& name, bool resume_alone = false) {
  a.parallel.use_distributed_optimizer = true;
  a.save = f.dir / (name + "_full");
  a.save_interval = 2;
  const TrainingSummary full = pretrain(a);
  ASSERT_EQ(full.losses.size(), 4u);
  TrainingArgs b = a;
  b.ckpt_format = "torch";
  b.save = f.dir / (name + "_torch");
  b.save_interval = 1000;
  b.exit_interval = 2;
  EXPECT_EQ(pretrain(b).iterations, 2);
  const int tp = a.parallel.tensor_model_parallel_size, pp = a.parallel.pipeline_model_parallel_size;
  if (world()->rank() == 0) {
    const fs::path it = fs::path(b.save) / "iter_0000002";
    for (int p = 0; p < pp; ++p)
      for (int t = 0; t < tp; ++t)
        EXPECT_TRUE(fs::exists(it / checkpoint_rank_dir(t, pp, p, 1, 0) / "distrib_optim.pt")) << name;
    const std::vector<json> ranks = reference_check(b.save, a.save, 2, tp, pp, a.transformer_impl);
    EXPECT_EQ(ranks.size(), size_t(tp * pp));
    for (const json& r : ranks) EXPECT_EQ(r["steps"], json::array({2})) << r.dump();
  }
  world()->barrier();
  b.exit_interval = 0;
  b.load = b.save;
  TrainingSummary second;
  if (resume_alone) {
    b.parallel.pipeline_model_parallel_size = 1;
    if (world()->rank() == 0) second = run_single(b);
  } else {
    second = pretrain(b);
  }
  if (!resume_alone || world()->rank() == 0) {
    EXPECT_EQ(second.start_iteration, 2);
    ASSERT_EQ(second.losses.size(), 2u);
    for (size_t i = 0; i < 2; ++i) {
      if (resume_alone) {  // another data-parallel size: another summation order
        EXPECT_NEAR(second.losses[i], full.losses[2 + i], 1e-5) << name << ": iteration " << i + 3;
      } else {
        EXPECT_EQ(second.losses[i], full.losses[2 + i]) << name << ": iteration " << i + 3;
        EXPECT_EQ(second.grad_norms[i], full.grad_norms[2 + i]) << name << ": grad norm " << i + 3;
      }
    }
  }
  if (world()->rank() == 0 && !resume_alone) {  // the resumed run ends on the uninterrupted run's weights
    const auto torch_ckpt = find_checkpoint(b.save, std::nullopt);
    ASSERT_TRUE(torch_ckpt.has_value() && torch_ckpt->state.iteration == 4);
    const MergedCheckpoint m = merge_checkpoint(*torch_ckpt, true);
    const auto ref = gathered_model(a.save, 4);
    EXPECT_EQ(m.model.size(), ref.size());
    for (const auto& [n, v] : ref) EXPECT_TRUE(m.model.count(n) && m.model.at(n).to_float_vector() == v) << n;
    EXPECT_EQ(m.optimizer_step, 4);
  }
  world()->barrier();
}

TEST(TorchDistribOptimTraining, OneRankSavesDistribOptimAndResumesBitForBit) {
  Fixture f;
  save_check_resume(f, f.args(4), "single");
  TrainingArgs local = f.args(4);
  local.transformer_impl = "local";
  save_check_resume(f, local, "single_local");
}

TEST(MpiTorchDistribOptimTraining, DataAndPipelineParallelSaveAndResume) {
  SKIP_ON_ONE_RANK();
  const int W = world()->size();
  if (W != 2 && W != 4) GTEST_SKIP() << "runs at -np 2 (DP2) and 4 (PP2 x DP2)";
  Fixture f;
  TrainingArgs a = f.args(4);
  a.parallel.pipeline_model_parallel_size = W / 2;
  save_check_resume(f, a, "dp2");
  if (W == 2) save_check_resume(f, a, "dp2_alone", /*resume_alone=*/true);
}

}  // namespace
}  // namespace megatron::training
