// Training from a Hugging Face import (training/hf_checkpoint.h): the Llama-style tiny model of
// llama_training_test.cpp, trained a few steps, exported as a transformers folder and imported
// again, once for one rank and once for this run's layout (TP2 at np 2, TP2 x PP2 at np 4); both
// imports are release checkpoints (weights only) and pretraining from them follows the same loss
// curve: the parallel run within 1e-5 of the single-rank run per iteration, starting below the
// random initialisation's first loss. What the parallel run saves (TP2 x PP2 at np 4) exports to
// the transformers tensors of the one-rank run's within 1e-5 of each tensor's scale.
#include <gtest/gtest.h>

#include "model/model_test_util.h"
#include "parallel_test_util.h"
#include "training/checkpoint_convert.h"

namespace megatron::training {
namespace {

using namespace parallel_test;

TrainingArgs llama_args(const Fixture& f, int64_t iters) {
  TrainingArgs a = f.args(iters);
  model::testing::make_llama_style(a.model);
  return a;
}

ConvertResult import_for(const std::string& hf, const std::string& save, int tp, int pp) {
  ConvertOptions o;
  o.load = hf;
  o.save = save;
  o.load_format = "hf";
  o.make_vocab_size_divisible_by = 16;  // the training run's
  o.target_tp = tp;
  o.target_pp = pp;
  return convert_checkpoint(o);
}

TEST(MpiHfImport, TrainingFromAnImportFollowsTheSingleRankCurve) {
  SKIP_ON_ONE_RANK();
  Fixture f;
  const int W = world()->size();
  const int tp = 2, pp = W / 2;
  double fresh_first_loss = 0;  // rank 0: the first loss from random weights
  if (world()->rank() == 0) {
    TrainingArgs first = llama_args(f, 5);
    first.save = f.dir / "trained";
    first.save_interval = 1000;
    fresh_first_loss = run_single(first).losses.at(0);
    ConvertOptions o;
    o.load = first.save;
    o.save = f.dir / "hf";
    o.save_format = "hf";
    convert_checkpoint(o);
    import_for(f.dir / "hf", f.dir / "tp1", 1, 1);
    const ConvertResult r = import_for(f.dir / "hf", f.dir / "parallel", tp, pp);
    EXPECT_EQ(r.to.tensor_model_parallel_size, tp);
    EXPECT_EQ(r.to.pipeline_model_parallel_size, pp);
  }
  world()->barrier();
  TrainingArgs one = llama_args(f, 10);
  one.load = f.dir / "tp1";
  const TrainingSummary ref = reference_curve(one, f.dir / "ref_save");
  TrainingArgs par = llama_args(f, 10);
  par.load = f.dir / "parallel";
  par.parallel.tensor_model_parallel_size = tp;
  par.parallel.pipeline_model_parallel_size = pp;
  par.save = f.dir / "parallel_trained";
  par.save_interval = 1000;
  const TrainingSummary p = pretrain(par);
  ASSERT_EQ(ref.losses.size(), 10u);
  // The imported weights are the trained ones: the same first batch has a lower loss.
  if (world()->rank() == 0) {
    EXPECT_LT(ref.losses[0], fresh_first_loss - 0.05);
  }
  expect_same_curve(p, ref, 1e-5, "import under TP2 x PP" + std::to_string(pp));
  if (world()->rank() == 0) {
    // What the parallel run saved exports to the same transformers tensors as the one-rank run's.
    std::map<std::string, Tensor> exported[2];
    int i = 0;
    for (const std::string name : {"ref_save", "parallel_trained"}) {
      ConvertOptions o;
      o.load = f.dir / name;
      o.save = f.dir / (name + "_hf");
      o.save_format = "hf";
      convert_checkpoint(o);
      exported[i++] = read_safetensors(fs::path(f.dir / (name + "_hf")) / "model.safetensors").tensors;
    }
    ASSERT_EQ(exported[0].size(), exported[1].size());
    for (const auto& [n, t] : exported[0]) {
      ASSERT_TRUE(exported[1].count(n)) << n;
      const std::vector<float> a = t.to_float_vector(), b = exported[1].at(n).to_float_vector();
      ASSERT_EQ(a.size(), b.size()) << n;
      double scale = 1e-30, worst = 0;
      for (size_t k = 0; k < a.size(); ++k) {
        scale = std::max(scale, double(std::abs(a[k])));
        worst = std::max(worst, double(std::abs(a[k] - b[k])));
      }
      EXPECT_LE(worst / scale, 1e-5) << n;
    }
  }
  world()->barrier();
}

}  // namespace
}  // namespace megatron::training
