// pretrain-gpt --ckpt-format torch with mixture-of-experts layers (training/torch_checkpoint.h):
// the trainer saves Megatron-LM's files (one mp_rank_00[_EEE] folder per expert-parallel rank,
// local expert numbers, the dense and expert optimizers' state), torch.load reads them into
// Megatron's modules (tests/reference/megatron_moe_checkpoint.py check), and --load of the folder
// resumes on the uninterrupted run's curve bit for bit; under mpirun -np 2 the same at EP 2, and an
// EP 2 folder resumed at EP 1 x DP 2 (resharded on load) follows the curve within 1e-5.
#include <gtest/gtest.h>

#include "moe_test_util.h"
#include "training/torch_checkpoint.h"

namespace megatron::training {
namespace {

using namespace parallel_test;

// The MoE model of moe_test_util.h at GPT-2's shape for the torch checkpoint reference: 2 layers
// (the second MoE with 4 GeLU experts of 16 channels and a gated shared expert of 24).
TrainingArgs torch_moe_args(const Fixture& f, int ep) {
  TrainingArgs a = moe_args(f, 4);
  a.model.activation = "gelu";
  a.model.ffn_hidden_size = 64;
  a.model.moe_ffn_hidden_size = 16;
  a.model.moe_shared_expert_intermediate_size = 24;
  a.model.moe_shared_expert_gate = true;
  a.parallel.expert_model_parallel_size = ep;
  return a;
}

// 4 iterations in our format (saved at 2 and 4); 2 with --ckpt-format torch, then a resume from
// that folder for the last 2 (save_in_format_and_resume: the same losses, grad norms and MoE
// losses), and its final .pt weights are the uninterrupted run's. Returns the torch folder.
std::string save_and_resume(const Fixture& f, TrainingArgs a, const std::string& name) {
  const int ep = a.parallel.expert_model_parallel_size;
  const FormatResume r = save_in_format_and_resume(f.dir, a, name, "torch", "torch", [&](const fs::path& it) {
    // Megatron's module trees and optimizers take the files
    for (int e = 0; e < ep; ++e) {
      EXPECT_TRUE(fs::exists(it / checkpoint_rank_dir(0, 1, 0, ep, e) / kTorchCheckpointFile)) << e;
    }
    const auto c = testing::run_command(
        "/usr/bin/python3 " + (testing::source_dir() / "tests/reference/megatron_moe_checkpoint.py").string() +
        " check " + it.parent_path().string() + " 2 " + std::to_string(ep) + " 2>&1");
    EXPECT_EQ(c.exit_code, 0) << c.output;
    EXPECT_NE(c.output.find(ep > 1 ? "\"optimizers\": 2" : "\"optimizers\": 1"), std::string::npos) << c.output;
  });
  if (world()->rank() == 0) {
    const auto torch_ckpt = find_checkpoint(r.saved.save, std::nullopt);
    EXPECT_TRUE(torch_ckpt.has_value() && torch_ckpt->parallel.expert_model_parallel_size == ep);
    expect_same_merged_model(r.saved.save, f.dir / (name + "_full"), 4);
  }
  world()->barrier();
  return r.saved.save;
}

TEST(MoeTorchCheckpoint, SavesMegatronFilesAndResumesBitForBit) {
  if (world()->size() > 1) GTEST_SKIP() << "single-rank test";
  Fixture f;
  save_and_resume(f, torch_moe_args(f, 1), "ep1");
}

TEST(MpiMoeTorchCheckpoint, ExpertParallelSaveResumeAndAnotherExpertParallelSize) {
  SKIP_ON_ONE_RANK();
  if (world()->size() != 2) GTEST_SKIP() << "runs at -np 2 (EP 2)";
  Fixture f;
  const std::string pt = save_and_resume(f, torch_moe_args(f, 2), "ep2");
  // The EP 2 folder at iteration 2 under EP 1 x DP 2: every rank reads both EP folders.
  expect_curve_resumed_under(torch_moe_args(f, 1), "torch", pt, 2, torch_moe_args(f, 2), f.dir);
}

}  // namespace
}  // namespace megatron::training
