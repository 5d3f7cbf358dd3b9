// Checkpoints with --expert-tensor-parallel-size other than the tensor-parallel size (Megatron's
// parallel folding; training/checkpoint.h): under mpirun, ETP 1 with TP 2 (np 2) and ETP 1 with
// TP 2 x DP 2 (np 4), at EP 1 and EP 2, save one folder per TP (and EP) rank of the world's ranks,
// each with its dense shards and its experts' whole weights (expert-tensor shard t % ETP), and
// resume from them bit for bit (losses, MoE losses, grad norms, final parameters and optimizer
// state); the checkpoint converts to a single rank with the single-rank run's parameters, and a
// run of another expert-tensor-parallel size is told which size to use.
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
  // The single-rank run's parameters after 10 iterations: what every layout's checkpoint holds.
  TrainingArgs single = moe_args(f, 10);
  reference_curve(single, f.dir / "reference");
  for (const int ep : {1, 2}) {
    const std::string name = str("ep", ep);
    SCOPED_TRACE(name);
    TrainingArgs a = base;
    a.parallel.expert_model_parallel_size = ep;
    const std::string split = f.dir / (name + "_split");
    ResumeExtras extras;
    extras.optimizer = true;
    extras.at_split = [ep](const fs::path& it) {
      const json meta = json::parse(testing::read_file(it / "metadata.json"));
      EXPECT_EQ(meta["parallel"]["expert_tensor_parallel_size"], 1);
      // TP rank t's world ranks hold EP rank t % EP (ETP 1 x EP 2 over the TP pair): its folder.
      for (int t = 0; t < 2; ++t) {
        const fs::path folder = it / checkpoint_rank_dir(t, 1, 0, ep, t % ep);
        EXPECT_TRUE(fs::exists(folder / "model.safetensors")) << folder;
        EXPECT_TRUE(fs::exists(folder / "optimizer.safetensors")) << folder;
        if (ep == 2) {
          EXPECT_FALSE(fs::exists(it / checkpoint_rank_dir(t, 1, 0, ep, 1 - t))) << t;
        }
      }
    };
    expect_exact_resume(a, f.dir / (name + "_full"), split, [](const TrainingArgs& x) { return pretrain(x); }, 5,
                        extras);
    if (world()->rank() == 0) {
      // One rank's tensors: the experts once (from the folders of expert-tensor shard 0, under EP
      // from the other TP rank's folder where this TP rank has none), equal to the single run's.
      ConvertOptions o;
      o.load = split;
      o.save = f.dir / (name + "_single");
      const ConvertResult r = convert_checkpoint(o);
      EXPECT_EQ(r.to.tensor_model_parallel_size, 1);
      EXPECT_EQ(r.to.expert_model_parallel_size, 1);
      expect_same_params(o.save, f.dir / "reference", 10, 1e-4);
      const auto ckpt = find_checkpoint(split, std::nullopt);
      ASSERT_TRUE(ckpt.has_value());
      const MergedCheckpoint m = merge_checkpoint(*ckpt, true);
      for (int e = 0; e < 4; ++e) {
        const std::string w1 = str("decoder.layers.1.mlp.experts.local_experts.", e, ".linear_fc1.weight");
        ASSERT_TRUE(m.model.count(w1)) << w1;
        EXPECT_EQ(m.model.at(w1).size(0), 2 * 24);  // SwiGLU's gate and up, whole
      }
      EXPECT_EQ(m.model.at("decoder.layers.0.self_attention.linear_qkv.weight").size(0), 3 * 32);
    }
    world()->barrier();
  }
  // Another expert-tensor-parallel size on load is refused with the one to use; so is the
  // distributed optimizer with experts sharded otherwise than the dense layers.
  TrainingArgs other = base;
  other.parallel.expert_tensor_parallel_size = 2;
  other.load = f.dir / "ep1_split";
  other.save = "";
  try {
    pretrain(other);
    ADD_FAILURE() << "loaded ETP 1 experts under ETP 2";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--expert-tensor-parallel-size 1"), std::string::npos) << e.what();
  }
  TrainingArgs dist = base;
  dist.parallel.use_distributed_optimizer = true;
  dist.save = f.dir / "dist";
  dist.save_interval = 5;
  try {
    pretrain(dist);
    ADD_FAILURE() << "saved ETP 1 experts with the distributed optimizer under TP 2";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("with the plain optimizer"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace megatron::training
