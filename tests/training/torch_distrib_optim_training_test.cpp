// pretrain-gpt --ckpt-format torch --use-distributed-optimizer: every rank folder gets Megatron's
// distrib_optim.pt beside model_optim_rng.pt (training/torch_distrib_optim.h), which the reference
// (tests/reference/megatron_distrib_optim.py check) loads and finds laid out as Megatron's gradient
// buffer with the values of our own checkpoint of the same iteration, and --load of the folder
// resumes on the uninterrupted run's curve bit for bit (losses, grad norms, final weights): the
// Adam moments and fp32 main weights came back. On one rank (DP1), and Mpi*: DP2 at np 2, PP2 x
// DP2 at np 4; a DP2 folder also resumes on one rank (another data-parallel size).
#include <gtest/gtest.h>

#include <sstream>

#include "json_lines.h"
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
  std::vector<json> out = testing::json_lines(r.output);
  return out;
}

// Trains 4 iterations uninterrupted (our format, saved at 2 and 4), then 2 with --ckpt-format
// torch and the distributed optimizer, checks the folder through the reference, and resumes from
// it for the last 2 on the uninterrupted curve bit for bit (save_in_format_and_resume); the
// resumed run's final .pt weights are the uninterrupted run's.
FormatResume save_check_resume(const Fixture& f, TrainingArgs a, const std::string& name) {
  a.parallel.use_distributed_optimizer = true;
  const int tp = a.parallel.tensor_model_parallel_size, pp = a.parallel.pipeline_model_parallel_size;
  const std::string ours = f.dir / (name + "_full");
  const FormatResume r = save_in_format_and_resume(f.dir, a, name, "torch", "torch", [&](const fs::path& it) {
    for (int p = 0; p < pp; ++p)
      for (int t = 0; t < tp; ++t)
        EXPECT_TRUE(fs::exists(it / checkpoint_rank_dir(t, pp, p, 1, 0) / "distrib_optim.pt")) << name;
    const std::vector<json> ranks = reference_check(it.parent_path().string(), ours, 2, tp, pp, a.transformer_impl);
    EXPECT_EQ(ranks.size(), size_t(tp * pp));
    for (const json& j : ranks) EXPECT_EQ(j["steps"], json::array({2})) << j.dump();
  });
  if (world()->rank() == 0) expect_same_merged_model(r.saved.save, ours, 4);
  world()->barrier();
  return r;
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
  const FormatResume r = save_check_resume(f, a, "dp2");
  if (W == 2 && world()->rank() == 0) {  // the DP2 folder's iteration 2 on one rank: another DP size
    TrainingArgs b = r.saved;
    b.ckpt_step = 2;
    b.save = f.dir / "dp2_alone";
    const TrainingSummary alone = run_single(b);
    EXPECT_EQ(alone.start_iteration, 2);
    ASSERT_EQ(alone.losses.size(), 2u);
    for (size_t i = 0; i < 2; ++i)  // another summation order of the data-parallel gradients
      EXPECT_NEAR(alone.losses[i], r.whole.losses[2 + i], 1e-5) << "iteration " << i + 3;
  }
  world()->barrier();
}

}  // namespace
}  // namespace megatron::training
