// Data, tensor and sequence parallel training by parity with the single-rank run. Tests named
// Mpi* run under mpirun -np 2 / -np 4 (label mpi; they skip themselves in a world of one): every
// rank trains the tiny GPT once alone (a self communicator: the reference) and once over the
// world in the layout under test, on a corpus written by rank 0 (dropout 0, fp32, vocabulary 64
// padded to 64 under TP 1, 2 and 4). Per iteration the loss must follow the reference within 1e-5
// relative (the grad norm within 1e-4), and the parameters at the end, gathered from the
// checkpoint's per-rank shards, must equal the reference checkpoint's within 1e-5 of each
// tensor's scale (but for the QKV key bias, see expect_same_params).
// Save/resume under DP2 (with --overlap-grad-reduce --overlap-param-gather: the checkpoint is
// written after the pending parameter gathers) and TP2 x DP2 continues the uninterrupted curve
// exactly; distributed-optimizer
// shards load under another data-parallel size and into the plain optimizer; a checkpoint of
// another tensor-parallel size is a clear error. ParallelCli tests launch mpirun themselves.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>

#include "comm/communicator.h"
#include "core/error.h"
#include "core/safetensors.h"
#include "data/indexed_dataset.h"
#include "model/tensor_parallel.h"
#include "test_util.h"
#include "training/trainer.h"
#include "parallel_test_util.h"

namespace megatron::training {
namespace {

using namespace parallel_test;

struct Layout {
  std::string name;
  int tp = 1;
  bool sp = false, dist_opt = false, overlap = false;
  int64_t bucket = 0;
  int cp = 1;  // --context-parallel-size
  bool param_gather = false;  // --overlap-param-gather (needs dist_opt and overlap)
};

// Trains the reference and `layout` for 20 iterations; compares curves and final parameters.
void check_layout(const Fixture& f, const Layout& l, const TrainingArgs& base, double tol = 1e-5) {
  SCOPED_TRACE(l.name);
  TrainingArgs ref = base, par = base;
  ref.save = world()->rank() == 0 ? f.dir / ("ref_" + l.name) : "";
  ref.save_interval = 1000;
  par.save = f.dir / ("par_" + l.name);
  par.save_interval = 1000;
  par.parallel.tensor_model_parallel_size = l.tp;
  par.model.sequence_parallel = l.sp;
  par.parallel.use_distributed_optimizer = l.dist_opt;
  par.parallel.overlap_grad_reduce = l.overlap;
  par.parallel.ddp_bucket_size = l.bucket;
  par.parallel.context_parallel_size = l.cp;
  par.parallel.overlap_param_gather = l.param_gather;
  const TrainingSummary r = run_single(ref);
  const TrainingSummary p = pretrain(par);
  EXPECT_EQ(p.world_size, world()->size());
  EXPECT_EQ(p.iterations, 20);
  EXPECT_EQ(p.consumed_samples, r.consumed_samples);
  expect_same_curve(p, r, tol, l.name);
  EXPECT_LT(r.losses.back(), r.losses.front() - 0.3);  // it learns: the comparison is not idle
  if (world()->rank() == 0) expect_same_params(par.save, ref.save, 20, tol);
  world()->barrier();
}

TEST(MpiParallelTraining, DataParallelFollowsTheSingleRankCurve) {
  SKIP_ON_ONE_RANK();
  Fixture f;
  const int W = world()->size();
  check_layout(f, {"dp", 1}, f.args());
  check_layout(f, {"dp_distopt_overlap", 1, false, true, true, 3000}, f.args());
  // Parameter all-gathers overlapped with the next forward, over ~25 buckets of 1000 elements.
  check_layout(f, {"dp_distopt_overlap_pgather", 1, false, true, true, 1000, 1, true}, f.args());
  if (W == 4) check_layout(f, {"dp_overlap", 1, false, false, true, 5000}, f.args());
}

TEST(MpiParallelTraining, TensorAndSequenceParallelFollowTheSingleRankCurve) {
  SKIP_ON_ONE_RANK();
  Fixture f;
  check_layout(f, {"tp2", 2}, f.args());
  check_layout(f, {"tp2_sp", 2, true}, f.args());
  if (world()->size() == 4) {  // TP2 x DP2
    check_layout(f, {"tp2_dp2_sp_distopt_overlap_pgather", 2, true, true, true, 2000, 1, true},
                 f.args());
    check_layout(f, {"tp4_sp", 4, true}, f.args());
  }
}

// Context parallelism (the ring exchange, and once the all-gather): each CP rank trains on its
// zig-zag half (quarter) of every sequence; losses, token counts and gradients are summed over
// DP x CP. The corpus' documents (41 tokens) span sequence boundaries, so the 16-token samples
// have uneven content across the chunks.
TEST(MpiParallelTraining, ContextParallelFollowsTheSingleRankCurve) {
  SKIP_ON_ONE_RANK();
  Fixture f;
  Layout cp2{"cp2", 1};
  cp2.cp = 2;
  check_layout(f, cp2, f.args());  // the ring exchange (--cp-comm-type p2p, the default)
  TrainingArgs allgather = f.args();
  allgather.model.cp_comm_type = "allgather";
  cp2.name = "cp2_allgather";
  check_layout(f, cp2, allgather);
  // Document resets: per-token attention starts and position ids are sliced with the tokens.
  // With --eod-mask-loss the CP slices hold unequal loss-token counts, and Megatron's default
  // normalisation divides each slice's loss by its own count (loss_normalisation_test.cpp checks
  // that against PyTorch), which is not the single-rank run's gradient; the global token mean of
  // --calculate-per-token-loss is, so this parity check uses it.
  TrainingArgs resets = f.args();
  resets.data.reset_attention_mask = resets.data.reset_position_ids = true;
  resets.data.eod_mask_loss = true;
  resets.calculate_per_token_loss = true;
  cp2.name = "cp2_resets";
  check_layout(f, cp2, resets);
  // Dropout masks are indexed by position in the unsplit tensors: the same as one rank's.
  TrainingArgs dropout = f.args();
  dropout.model.hidden_dropout = dropout.model.attention_dropout = 0.1f;
  cp2.name = "cp2_dropout";
  check_layout(f, cp2, dropout);
  if (world()->size() == 4) {
    Layout cp2_dp2{"cp2_dp2_distopt_overlap", 1, false, true, true, 3000};
    cp2_dp2.cp = 2;
    check_layout(f, cp2_dp2, f.args());
    Layout tp2_cp2{"tp2_cp2_sp", 2, true};
    tp2_cp2.cp = 2;
    check_layout(f, tp2_cp2, f.args());
  }
}

// Save and resume under CP2 (x DP2 at -np 4) with the distributed optimizer (shards over DP x CP)
// continue the uninterrupted curve bit for bit; the checkpoint loads on one rank (CP1, plain
// optimizer), whose curve then follows within 1e-5.
TEST(MpiParallelTraining, ContextParallelSaveAndResume) {
  SKIP_ON_ONE_RANK();
  Fixture f;
  TrainingArgs a = f.args();
  a.parallel.context_parallel_size = 2;
  a.parallel.use_distributed_optimizer = true;
  a.save = f.dir / "cp_full";
  a.save_interval = 1000;
  const TrainingSummary full = pretrain(a);
  TrainingArgs b = a;
  b.save = f.dir / "cp_split";
  b.exit_interval = 10;
  EXPECT_EQ(pretrain(b).iterations, 10);
  b.exit_interval = 0;
  b.load = b.save;
  const TrainingSummary second = pretrain(b);
  ASSERT_EQ(second.losses.size(), 10u);
  for (size_t i = 0; i < 10; ++i)
    EXPECT_EQ(second.losses[i], full.losses[10 + i]) << "iteration " << i + 11;
  if (world()->rank() == 0) {
    expect_same_params(b.save, a.save, 20, 0.0);
    TrainingArgs c = f.args();
    c.load = b.save;
    c.ckpt_step = 10;
    const TrainingSummary s = run_single(c);
    ASSERT_EQ(s.losses.size(), 10u);
    for (size_t i = 0; i < 10; ++i)
      EXPECT_NEAR(s.losses[i], full.losses[10 + i], 1e-5 * full.losses[10 + i]) << i;
  }
  world()->barrier();
}

TEST(MpiParallelTraining, Bf16DataParallelTrains) {
  SKIP_ON_ONE_RANK();
  Fixture f;
  TrainingArgs a = f.args();
  a.bf16 = true;
  // bf16 weights: rounding differences grow; the curve stays within bf16 precision.
  for (bool dist : {false, true}) {
    TrainingArgs p = a;
    p.parallel.use_distributed_optimizer = dist;
    const TrainingSummary r = run_single(a), s = pretrain(p);
    ASSERT_EQ(s.losses.size(), 20u);
    for (size_t i = 0; i < 20; ++i) EXPECT_NEAR(s.losses[i], r.losses[i], 2e-2 * r.losses[i]) << i;
    EXPECT_LT(s.losses.back(), s.losses.front() - 0.3);
  }
}

// --grad-reduce-in-bf16 under DP (all-reduce and the distributed optimizer's reduce-scatter):
// the first forward is the same as without it, the reduced gradients are bf16 values (the grad
// norm of iteration 1 differs from the fp32 reduction's; tests/optim checks the exact sums), and
// the curve stays within bf16 precision of the single-rank one.
TEST(MpiParallelTraining, Bf16GradReduceRoundsTheDataParallelSum) {
  SKIP_ON_ONE_RANK();
  Fixture f;
  TrainingArgs a = f.args();
  a.bf16 = true;
  const TrainingSummary single = run_single(a);
  for (bool dist : {false, true}) {
    TrainingArgs p = a;
    p.parallel.use_distributed_optimizer = dist;
    const TrainingSummary fp32_reduce = pretrain(p);
    p.grad_reduce_in_bf16 = true;
    const TrainingSummary bf16_reduce = pretrain(p);
    ASSERT_EQ(bf16_reduce.losses.size(), 20u);
    EXPECT_EQ(bf16_reduce.losses[0], fp32_reduce.losses[0]);
    EXPECT_NE(bf16_reduce.grad_norms[0], fp32_reduce.grad_norms[0]);
    EXPECT_NEAR(bf16_reduce.grad_norms[0], fp32_reduce.grad_norms[0], 1e-2 * fp32_reduce.grad_norms[0]);
    for (size_t i = 0; i < 20; ++i)
      EXPECT_NEAR(bf16_reduce.losses[i], single.losses[i], 2e-2 * single.losses[i]) << i;
    EXPECT_LT(bf16_reduce.losses.back(), bf16_reduce.losses.front() - 0.3);
  }
}

// A batch-size ramp-up under data parallelism (plain and distributed optimizer) and pipeline
// parallelism (the micro-batch count of the 1F1B schedule changes between iterations) follows the
// single-rank ramp-up curve: each iteration's micro-batches split over the DP ranks from the same
// consumed-sample offsets. With unit = micro-batch x DP: one unit per iteration until 4 units are
// consumed, then 2 units.
TEST(MpiParallelTraining, BatchSizeRampUpFollowsTheSingleRankCurve) {
  SKIP_ON_ONE_RANK();
  Fixture f;
  TrainingArgs a = f.args();
  const int64_t unit = a.micro_batch_size * world()->size();
  a.global_batch_size = 2 * unit;
  a.rampup_batch_size = {unit, unit, 4 * unit};
  a.train_iters = 0;
  a.train_samples = 20 * unit;
  a.lr_warmup_iters = 0;
  a.lr_warmup_samples = 3 * unit;
  const TrainingSummary r = run_single(a);
  // Megatron's update_train_iters: 5 ramp-up iterations (1 1 1 1 2 units: 6), then (20 - 6) // 2.
  ASSERT_EQ(r.losses.size(), 12u);
  for (int layout = 0; layout < 3; ++layout) {
    TrainingArgs p = a;
    p.parallel.use_distributed_optimizer = layout == 1;
    p.parallel.pipeline_model_parallel_size = layout == 2 ? 2 : 1;  // 1F1B over 2 stages x DP/2
    const TrainingSummary s = pretrain(p);
    EXPECT_EQ(s.consumed_samples, r.consumed_samples);
    expect_same_curve(s, r, 1e-5, layout == 0 ? "rampup" : layout == 1 ? "rampup, distributed optimizer"
                                                                        : "rampup, PP2");
  }
}

TEST(MpiParallelTraining, SaveAndResumeContinueTheSameCurve) {
  SKIP_ON_ONE_RANK();
  Fixture f;
  const int W = world()->size();
  TrainingArgs a = f.args();
  a.parallel.tensor_model_parallel_size = W == 4 ? 2 : 1;  // TP2 x DP2 at -np 4, DP2 at -np 2
  a.model.sequence_parallel = W == 4;
  a.parallel.use_distributed_optimizer = true;
  if (W == 2) {  // DP2: overlapped gradient reduction and parameter all-gather, several buckets
    a.parallel.overlap_grad_reduce = a.parallel.overlap_param_gather = true;
    a.parallel.ddp_bucket_size = 2000;
    a.eval_iters = 0;  // no evaluation before the saves: the save itself must wait for the gathers
  }
  a.save = f.dir / "full";
  a.save_interval = 1000;
  const TrainingSummary full = pretrain(a);
  TrainingArgs b = a;
  b.save = f.dir / "split";
  b.exit_interval = 10;  // saves at 10 and stops
  const TrainingSummary first = pretrain(b);
  EXPECT_EQ(first.iterations, 10);
  b.exit_interval = 0;
  b.load = b.save;
  const TrainingSummary second = pretrain(b);
  EXPECT_EQ(second.start_iteration, 10);
  ASSERT_EQ(second.losses.size(), 10u);
  for (size_t i = 0; i < 10; ++i) {
    EXPECT_EQ(first.losses[i], full.losses[i]) << "iteration " << i + 1;
    EXPECT_EQ(second.losses[i], full.losses[10 + i]) << "iteration " << i + 11;  // bit for bit
  }
  if (world()->rank() == 0) expect_same_params(b.save, a.save, 20, 0.0);

  // The distributed optimizer's shards under another data-parallel size (one rank) and into the
  // plain optimizer: the resumed curve follows the uninterrupted one.
  if (W == 2 && world()->rank() == 0) {
    for (bool dist : {true, false}) {
      TrainingArgs c = f.args();
      c.parallel.use_distributed_optimizer = dist;
      c.load = f.dir / "split";
      c.ckpt_step = 10;
      const TrainingSummary s = run_single(c);
      ASSERT_EQ(s.losses.size(), 10u);
      for (size_t i = 0; i < 10; ++i)
        EXPECT_NEAR(s.losses[i], full.losses[10 + i], 1e-5 * full.losses[10 + i]) << dist << " " << i;
    }
  }
  world()->barrier();
}

TEST(MpiParallelTraining, ALayoutMismatchIsAClearError) {
  SKIP_ON_ONE_RANK();
  Fixture f;
  TrainingArgs a = f.args(4);
  a.parallel.tensor_model_parallel_size = 2;
  a.save = f.dir / "tp2";
  a.save_interval = 1000;
  pretrain(a);
  if (world()->rank() == 0) {
    TrainingArgs b = f.args(8);
    b.load = a.save;
    {
      const std::string m = megatron::testing::error_of([&] { run_single(b); });
      EXPECT_NE(m.find("saved with TP=2 PP=1 (DP="), std::string::npos) << m;
      EXPECT_NE(m.find("this run has TP=1 PP=1."), std::string::npos) << m;
      EXPECT_NE(m.find("--tensor-model-parallel-size 2"), std::string::npos) << m;
      EXPECT_NE(m.find("`megatron checkpoint convert --load " + a.save + " --save " + a.save +
                       "_tp1_pp1 --target-tensor-parallel-size 1 --target-pipeline-parallel-size 1`"),
                std::string::npos)
          << m;
    }
  }
  world()->barrier();
}

TEST(ParallelArgs, LayoutErrorsNameTheFlags) {
  Fixture f;
  auto expect_error = [&](TrainingArgs a, int world_size, const std::string& needle) {
    const std::string m = megatron::testing::error_of([&] { validate_parallel_args(a, world_size); });
    EXPECT_NE(m.find(needle), std::string::npos) << m;
  };
  TrainingArgs a = f.args();
  EXPECT_NO_THROW(validate_parallel_args(a, 4));
  a.parallel.tensor_model_parallel_size = 3;
  expect_error(a, 4, "not divisible by --tensor-model-parallel-size 3");
  a = f.args();
  a.parallel.pipeline_model_parallel_size = 3;
  expect_error(a, 6, "--num-layers 2 is not divisible by --pipeline-model-parallel-size 3");
  a = f.args();
  a.parallel.pipeline_model_parallel_size = 2;
  a.parallel.num_layers_per_virtual_pipeline_stage = 2;  // 2 layers / PP 2 = 1 per stage
  expect_error(a, 4, "are not divisible by --num-layers-per-virtual-pipeline-stage 2");
  a.model.num_layers = 4;
  a.parallel.num_layers_per_virtual_pipeline_stage = 1;
  EXPECT_NO_THROW(validate_parallel_args(a, 4));  // DP 2: 2 micro-batches, divisible by PP 2
  a.global_batch_size = 6;                         // DP 1: 3 micro-batches
  expect_error(a, 2, "is not divisible by --pipeline-model-parallel-size 2 as the interleaved");
  a.parallel.num_layers_per_virtual_pipeline_stage = 0;  // plain 1F1B takes any number
  EXPECT_NO_THROW(validate_parallel_args(a, 2));
  a.parallel.pipeline_model_parallel_size = 1;
  a.parallel.num_layers_per_virtual_pipeline_stage = 1;
  expect_error(a, 2, "--num-layers-per-virtual-pipeline-stage needs --pipeline-model-parallel-size > 1");
  a = f.args();
  a.parallel.context_parallel_size = 2;
  EXPECT_NO_THROW(validate_parallel_args(a, 4));  // CP2 x DP2
  a.model.seq_length = 18;
  expect_error(a, 4, "--seq-length 18 is not divisible by 2 x --context-parallel-size = 4");
  a = f.args();
  a.parallel.context_parallel_size = 2;
  a.parallel.tensor_model_parallel_size = 2;
  a.model.seq_length = 20;  // 20 / CP 2 = 10 tokens per CP rank, 5 per TP rank: fine
  a.model.sequence_parallel = true;
  EXPECT_NO_THROW(validate_parallel_args(a, 4));
  a.parallel.tensor_model_parallel_size = 4;  // 10 tokens per CP rank do not split over TP 4
  expect_error(a, 8, "--seq-length 20 / --context-parallel-size 2 is not divisible by "
               "--tensor-model-parallel-size 4");
  a = f.args();
  a.global_batch_size = 6;  // 6 % (2 x 4)
  expect_error(a, 4, "data-parallel size (4");
  a = f.args();
  a.parallel.overlap_param_gather = true;
  expect_error(a, 2, "--overlap-param-gather requires");
}

#ifdef MEGATRON_HAVE_MPI
// The CLI under mpirun: one log line per logged iteration (the last rank prints), metrics written
// once, and an error on one rank ends the whole job quickly with the failing rank named.
std::string mpirun(int np) {
  return "OMP_NUM_THREADS=1 mpirun --oversubscribe --allow-run-as-root -np " + std::to_string(np) +
         " " + testing::cli_path().string() + " ";
}

TEST(ParallelCli, DataParallelRunLogsOnceAndRankErrorsEndTheJob) {
  if (world()->size() > 1) GTEST_SKIP() << "launches mpirun itself";
  Fixture f;
  const std::string common =
      "pretrain-gpt --num-layers 1 --hidden-size 16 --num-attention-heads 2 --seq-length 16 "
      "--micro-batch-size 2 --global-batch-size 4 --lr 1e-3 --tokenizer-type NullTokenizer "
      "--vocab-size 64 --make-vocab-size-divisible-by 8 --data-path " + f.prefix +
      " --data-cache-path " + (f.dir / "cache") + " --split 90,10,0 --log-interval 2 --eval-iters 1";
  const std::string ck = f.dir / "ck";
  auto ok = testing::run_command(mpirun(2) + common + " --train-iters 4 --use-distributed-optimizer "
                                 "--save " + ck + " --save-interval 4 --log-metrics-jsonl " +
                                 (f.dir / "m.jsonl") + " 2>&1");
  ASSERT_EQ(ok.exit_code, 0) << ok.output;
  size_t lines = 0;
  for (size_t at = 0; (at = ok.output.find("| consumed samples:", at)) != std::string::npos; ++at) ++lines;
  EXPECT_EQ(lines, 2u) << ok.output;
  EXPECT_NE(ok.output.find("TP 1 x PP 1 x CP 1 x DP 2"), std::string::npos) << ok.output;
  const std::string metrics = testing::read_file(f.dir / "m.jsonl");
  EXPECT_EQ(std::count(metrics.begin(), metrics.end(), '\n'), 2) << metrics;
  EXPECT_NE(metrics.find("\"world_size\": 2"), std::string::npos) << metrics;
  const fs::path it = fs::path(ck) / "iter_0000004";
  EXPECT_TRUE(fs::exists(it / "mp_rank_00/model.safetensors"));
  EXPECT_TRUE(fs::exists(it / "mp_rank_00/distrib_optim_dp_000.safetensors"));
  EXPECT_TRUE(fs::exists(it / "mp_rank_00/distrib_optim_dp_001.safetensors"));

  auto bad = testing::run_command(mpirun(2) + common + " --train-iters 4 --pipeline-model-parallel-size 2 2>&1");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.output.find("--num-layers 1 is not divisible by --pipeline-model-parallel-size 2"),
            std::string::npos)
      << bad.output;

  // TP2: rank 1 alone reads mp_rank_01. Corrupt it: only rank 1 fails (checksum); rank 0 would
  // wait in its next collective for the 10-minute timeout, but the job is aborted at once. The
  // longer run overrides the checkpoint's LR schedule so that the checksum is the only error.
  const std::string ck2 = f.dir / "ck2";
  auto tp2 = testing::run_command(mpirun(2) + common + " --train-iters 2 --tensor-model-parallel-size 2 "
                                  "--save " + ck2 + " --save-interval 2 2>&1");
  ASSERT_EQ(tp2.exit_code, 0) << tp2.output;
  {
    std::fstream s(fs::path(ck2) / "iter_0000002/mp_rank_01/model.safetensors",
                   std::ios::in | std::ios::out | std::ios::binary);
    s.seekp(-1, std::ios::end);
    s.put('x');
  }
  const auto t0 = std::chrono::steady_clock::now();
  auto corrupt = testing::run_command(mpirun(2) + common + " --train-iters 8 --tensor-model-parallel-size 2 "
                                      "--load " + ck2 + " --override-opt_param-scheduler 2>&1");
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_NE(corrupt.exit_code, 0);
  EXPECT_NE(corrupt.output.find("[rank 1] error:"), std::string::npos) << corrupt.output;
  EXPECT_NE(corrupt.output.find("SHA-256 checksum mismatch"), std::string::npos) << corrupt.output;
  EXPECT_LT(secs, 60.0);
}
#endif

}  // namespace
}  // namespace megatron::training
