// pretrain-gpt --ckpt-format torch_dist: the trainer saves Megatron-Core's torch_dist folder
// (iter_N/.metadata, common.pt, metadata.json and one pair of __R_0/__R_1.distcp files per rank,
// each rank writing its own items; the tracker last, no temporary folder left behind), with the
// plain optimizer's state per parameter or the distributed optimizer's in Megatron's default
// dp_reshardable buckets. --load of that folder resumes on the uninterrupted run's curve bit for
// bit under the same layout, and a single-rank run loading it continues exactly as one loading
// the same iteration in this build's format. Mpi*: PP 2 (np 2) and TP 2 x DP 2 (np 4) with the
// distributed optimizer, every data-parallel rank writing its pieces of the buckets.
#include <gtest/gtest.h>

#include "core/error.h"
#include "core/torch_file.h"
#include "parallel_test_util.h"
#include "training/checkpoint_convert.h"
#include "training/torch_dist_format.h"

namespace megatron::training {
namespace {

using namespace parallel_test;

// Trains 4 iterations uninterrupted (our format, saved at 2 and 4), then 2 with --ckpt-format
// torch_dist and a resume from that folder for the last 2 (save_in_format_and_resume), then
// (rank 0 alone) 2 more from each format's iteration 2 on one rank; returns the torch_dist folder.
std::string save_and_resume(const Fixture& f, TrainingArgs a, const std::string& name,
                            const std::string& sharding) {
  const FormatResume r = save_in_format_and_resume(f.dir, a, name, "torch_dist", "dist", [&](const fs::path& it) {
    const fs::path save = it.parent_path();
    EXPECT_EQ(testing::read_file(save / "latest_checkpointed_iteration.txt"), "2");
    EXPECT_FALSE(fs::exists(save / ".tmp_iter_0000002"));
    for (const char* file : {".metadata", "common.pt", "metadata.json"}) EXPECT_TRUE(fs::exists(it / file)) << file;
    for (int r = 0; r < world()->size(); ++r)
      for (int n = 0; n < 2; ++n)
        EXPECT_TRUE(fs::exists(it / ("__" + std::to_string(r) + "_" + std::to_string(n) + ".distcp"))) << r;
    const json marker = json::parse(testing::read_file(it / "metadata.json"));
    EXPECT_EQ(marker["sharded_backend"], "torch_dist");
    const TorchFile common = TorchFile::open(it / "common.pt");
    const pickle::Value* o = common.root().get("optimizer");
    EXPECT_NE(o, nullptr);
    const pickle::Value* type = o != nullptr ? o->get("param_state_sharding_type") : nullptr;
    EXPECT_EQ(type != nullptr ? type->text : std::string("plain"), sharding);
    const DistcpFolder folder = DistcpFolder::open(it);  // every chunk covered, none overlapping
    bool buckets = false;
    for (const auto& [key, e] : folder.entries()) buckets = buckets || key.find(".bucket_idx_") != std::string::npos;
    EXPECT_EQ(buckets, sharding == "dp_reshardable");
  });
  a.save = f.dir / (name + "_full");
  const TrainingArgs& b = r.saved;
  if (world()->rank() == 0) {  // under another layout: one rank, the plain optimizer
    TrainingArgs c = f.args(4);
    c.save = "";
    c.ckpt_step = 2;
    c.load = b.save;
    const TrainingSummary from_dist = run_single(c);
    if (a.parallel.tensor_model_parallel_size > 1 || a.parallel.pipeline_model_parallel_size > 1) {
      // our format loads under its own TP x PP only: converted first
      ConvertOptions o;
      o.load = a.save;
      o.save = f.dir / (name + "_full_tp1");
      o.ckpt_step = 2;
      o.true_vocab_size = 64;
      convert_checkpoint(o);
      c.load = o.save;
    } else {
      c.load = a.save;
    }
    const TrainingSummary from_ours = run_single(c);
    EXPECT_EQ(from_dist.start_iteration, 2);
    EXPECT_EQ(from_dist.losses, from_ours.losses) << name;
    EXPECT_EQ(from_dist.grad_norms, from_ours.grad_norms) << name;
  }
  world()->barrier();
  return b.save;
}

// The distributed optimizer's buckets in the order of Megatron-Core's local modules and of
// Transformer Engine's (Megatron-LM's default): what is read back is the state saved, read by the
// reader the fixture tests check against Megatron-Core's layout (torch_dist_checkpoint_test.cpp).
TEST(TorchDistTraining, SavesMegatronsFolderAndResumesOnTheSameCurve) {
  Fixture f;
  save_and_resume(f, f.args(4), "plain", "plain");
  for (const char* impl : {"local", "transformer_engine"}) {
    TrainingArgs d = f.args(4);
    d.parallel.use_distributed_optimizer = true;
    d.transformer_impl = impl;
    save_and_resume(f, d, std::string("distributed_") + impl, "dp_reshardable");
  }
}

TEST(TorchDistTraining, RefusesWhatItCannotWriteBeforeTraining) {
  Fixture f;
  TrainingArgs a = f.args(4);
  a.save = f.dir / "never";
  a.save_interval = 2;
  a.ckpt_format = "torch_dist";
  a.parallel.use_distributed_optimizer = true;  // Transformer Engine's order and the local one
  EXPECT_NO_THROW(validate_args(a));
  a.transformer_impl = "local";
  EXPECT_NO_THROW(validate_args(a));
  a.model.num_moe_experts = 4;  // Megatron's legacy GroupedMLP's buffer is not written
  a.model.moe_grouped_gemm = true;
  try {
    validate_args(a);
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--no-save-optim"), std::string::npos) << e.what();
  }
}

TEST(MpiTorchDistTraining, DistributedOptimizerSaveAndResume) {
  SKIP_ON_ONE_RANK();
  const int W = world()->size();
  if (W != 2 && W != 4) GTEST_SKIP() << "runs at -np 2 (PP2: the tied embedding's own buckets) and 4 (TP2 x DP2)";
  Fixture f;
  TrainingArgs a = f.args(4);
  if (W == 2) a.parallel.pipeline_model_parallel_size = 2;
  else a.parallel.tensor_model_parallel_size = 2;
  a.parallel.use_distributed_optimizer = true;
  save_and_resume(f, a, "dp_" + std::to_string(W), "dp_reshardable");
}

}  // namespace
}  // namespace megatron::training
