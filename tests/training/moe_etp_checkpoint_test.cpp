// Checkpoints with --expert-tensor-parallel-size other than the tensor-parallel size (Megatron's
// parallel folding; training/checkpoint.h): under mpirun, ETP 1 with TP 2 (np 2) and ETP 1 with
// TP 2 x DP 2 (np 4) save one folder per TP rank, each with its dense shards and the experts'
// whole weights (expert-tensor shard t % ETP), and resume from them bit for bit (losses,
// MoE losses, grad norms, final parameters and optimizer state); the checkpoint converts to a
// single rank with the same parameters, and a run of another expert-tensor-parallel size is told
// which size to use.
#include <gtest/gtest.h>

#include "moe_test_util.h"
#include "training/checkpoint_convert.h"

namespace megatron::training {
namespace {

using namespace parallel_test;

TEST(MpiMoeEtpCheckpoint, ExpertTensorParallelOtherThanTensorParallelResumesBitForBit) {
  SKIP_ON_ONE_RANK();
  const int n = world()->size();
  if (n != 2 && n != 4) GTEST_SKIP() << "runs at -np 2 (TP 2, ETP 1) and 4 (TP 2 x DP 2, ETP 1)";
  Fixture f;
  TrainingArgs base = moe_args(f, 10);
  base.parallel.tensor_model_parallel_size = 2;
  base.model.sequence_parallel = true;
  base.parallel.expert_tensor_parallel_size = 1;
  TrainingArgs full = base;
  full.save = f.dir / "full";
  full.save_interval = 1000;
  const TrainingSummary whole = pretrain(full);
  TrainingArgs first = base;
  first.save = f.dir / "split";
  first.save_interval = 5;
  first.exit_interval = 5;
  pretrain(first);
  if (world()->rank() == 0) {
    const fs::path it = fs::path(first.save) / "iter_0000005";
    const json meta = json::parse(testing::read_file(it / "metadata.json"));
    EXPECT_EQ(meta["parallel"]["expert_tensor_parallel_size"], 1);
    for (int t = 0; t < 2; ++t) {
      const fs::path folder = it / checkpoint_rank_dir(t, 1, 0, 1, 0);
      EXPECT_TRUE(fs::exists(folder / "model.safetensors")) << folder;
      EXPECT_TRUE(fs::exists(folder / "optimizer.safetensors")) << folder;
    }
  }
  TrainingArgs second = first;
  second.load = first.save;
  second.exit_interval = 0;
  second.save_interval = 1000;
  const TrainingSummary rest = pretrain(second);
  ASSERT_EQ(rest.start_iteration, 5);
  ASSERT_EQ(rest.losses.size(), 5u);
  for (size_t i = 0; i < 5; ++i) {
    EXPECT_EQ(rest.losses[i], whole.losses[5 + i]) << "iteration " << i + 6;
    EXPECT_EQ(rest.grad_norms[i], whole.grad_norms[5 + i]) << "iteration " << i + 6;
    EXPECT_EQ(rest.more_losses[i], whole.more_losses[5 + i]) << "iteration " << i + 6;
  }
  if (world()->rank() == 0) {
    expect_same_params(second.save, full.save, 10, 0.0);
    expect_same_optimizer_state(second.save, full.save, 10, 0.0, 0.0);
    // One rank's tensors: the experts once (from the folders of expert-tensor shard 0).
    ConvertOptions o;
    o.load = first.save;
    o.save = f.dir / "single";
    const ConvertResult r = convert_checkpoint(o);
    EXPECT_EQ(r.to.tensor_model_parallel_size, 1);
    const auto ckpt = find_checkpoint(first.save, std::nullopt);
    ASSERT_TRUE(ckpt.has_value());
    const MergedCheckpoint m = merge_checkpoint(*ckpt, true);
    const std::string w1 = "decoder.layers.1.mlp.experts.local_experts.0.linear_fc1.weight";
    ASSERT_TRUE(m.model.count(w1));
    EXPECT_EQ(m.model.at(w1).size(0), 2 * 24);  // SwiGLU's gate and up, whole
    EXPECT_EQ(m.model.at("decoder.layers.0.self_attention.linear_qkv.weight").size(0), 3 * 32);
  }
  world()->barrier();
  // Another expert-tensor-parallel size on load is refused with the one to use; EP 2 with ETP 1
  // under TP 2 is refused with checkpoints (the expert ranks follow the TP ranks there).
  TrainingArgs other = base;
  other.parallel.expert_tensor_parallel_size = 2;
  other.load = first.save;
  other.save = "";
  try {
    pretrain(other);
    ADD_FAILURE() << "loaded ETP 1 experts under ETP 2";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--expert-tensor-parallel-size 1"), std::string::npos) << e.what();
  }
  if (n == 4) {
    TrainingArgs ep2 = base;
    ep2.parallel.expert_model_parallel_size = 2;
    ep2.save = f.dir / "ep2";
    ep2.save_interval = 5;
    try {
      pretrain(ep2);
      ADD_FAILURE() << "saved ETP 1 x EP 2 under TP 2";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("at expert-parallel size 1"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace megatron::training
