// Pipeline-parallel pretraining by parity with the single-rank run. Tests named Mpi* run under
// mpirun -np 2 / 4 / 8 (label mpi; they skip themselves in a world of one). The tiny GPT of
// parallel_test_util.h with 4 layers (2 per stage, or 2 model chunks of 1 layer per stage when
// interleaved), fp32, dropout 0: rank 0 trains the reference alone and hands its curve to the
// others, then the world trains the layout under test. Per iteration the loss must follow the
// reference within 1e-5 relative (grad norm 1e-4: the tied embedding counted once; validation
// loss 1e-5), and the parameters at the end, gathered from the per-stage, per-TP-rank checkpoint
// files, must equal the reference's within 1e-5 of each tensor's scale.
//   np 2: PP2 (1F1B), PP2 interleaved (2 virtual stages per rank);
//   np 4: TP2 x PP2 with sequence parallelism, PP2 interleaved x DP2 with the distributed
//         optimizer, overlapped gradient reduction and parameter all-gather (2000-element
//         buckets), CP2 x PP2 interleaved with the distributed optimizer, and PP2 x DP2 with
//         --overlap-grad-reduce in small buckets (1F1B; interleaved), every bucket but the tied
//         embedding's launched during the backward passes;
//   np 8: TP2 x PP2 x DP2, sequence parallel, distributed optimizer, overlapped gradient
//         reduction and parameter all-gather (its own ctest entry), and
//         TP2 x CP2 x PP2 with sequence parallelism;
// and bf16 PP2 interleaved within bf16 precision of the single-rank bf16 curve (np 2).
// Save/resume under PP (np 2: PP2 interleaved; np 4: TP2 x PP2) continues the uninterrupted curve
// bit for bit, the checkpoint records the layout, leaves out the tied copy, and does not load under
// another layout. PipelineCli tests launch mpirun themselves: one log line per interval from a
// PP2 run, and a rank that dies or hangs mid-step ends the job with an error (the launcher's, or
// --distributed-timeout-minutes') while the last checkpoint still loads.
#include <gtest/gtest.h>

#include <chrono>
#include <fstream>

#include "core/error.h"
#include "parallel_test_util.h"

namespace megatron::training {
namespace {

using namespace parallel_test;

TrainingArgs pipeline_args(const Fixture& f, int64_t iters = 20) {
  TrainingArgs a = f.args(iters);
  a.model.num_layers = 4;
  return a;
}

struct PipeLayout {
  std::string name;
  int tp = 1, pp = 2, layers_per_virtual_stage = 0;
  bool sp = false, dist_opt = false, overlap = false;
  int cp = 1;
  int64_t bucket = 0;         // --ddp-bucket-size
  bool param_gather = false;  // --overlap-param-gather
};

TrainingArgs with_layout(TrainingArgs a, const PipeLayout& l) {
  a.parallel.tensor_model_parallel_size = l.tp;
  a.parallel.pipeline_model_parallel_size = l.pp;
  a.parallel.num_layers_per_virtual_pipeline_stage = l.layers_per_virtual_stage;
  a.parallel.context_parallel_size = l.cp;
  a.model.sequence_parallel = l.sp;
  a.parallel.use_distributed_optimizer = l.dist_opt;
  a.parallel.overlap_grad_reduce = l.overlap;
  a.parallel.ddp_bucket_size = l.bucket;
  a.parallel.overlap_param_gather = l.param_gather;
  return a;
}

void check_pipeline_layout(const Fixture& f, const PipeLayout& l, const TrainingSummary& ref,
                           const std::string& ref_save) {
  SCOPED_TRACE(l.name);
  TrainingArgs par = with_layout(pipeline_args(f), l);
  par.save = f.dir / ("par_" + l.name);
  par.save_interval = 1000;
  const TrainingSummary p = pretrain(par);
  EXPECT_EQ(p.world_size, world()->size());
  EXPECT_EQ(p.iterations, 20);
  EXPECT_EQ(p.consumed_samples, ref.consumed_samples);
  expect_same_curve(p, ref, 1e-5, l.name);
  EXPECT_LT(ref.losses.back(), ref.losses.front() - 0.3);  // it learns: the comparison is not idle
  if (l.overlap) {
    // Every bucket but the one holding the tied word embedding (on every stage at PP 2) started
    // its reduction during the backward passes, in every iteration.
    if (l.bucket > 0) {
      EXPECT_GE(p.grad_buckets, 3);
    }
    EXPECT_EQ(p.grad_buckets_launched_in_backward, p.grad_buckets - 1);
  } else {
    EXPECT_EQ(p.grad_buckets_launched_in_backward, 0);
  }
  if (world()->rank() == 0) expect_same_params(par.save, ref_save, 20, 1e-5);
  world()->barrier();
}

TEST(MpiPipelineTraining, PipelineLayoutsFollowTheSingleRankCurve) {
  SKIP_ON_ONE_RANK();
  Fixture f;
  const int W = world()->size();
  const std::string ref_save = f.dir / "ref";
  const TrainingSummary ref = reference_curve(pipeline_args(f), ref_save);
  ASSERT_EQ(ref.losses.size(), 20u);
  ASSERT_EQ(ref.valid_losses.size(), 3u);  // iterations 10 and 20, then the end of training
  if (W == 2) {
    check_pipeline_layout(f, {"pp2", 1, 2}, ref, ref_save);
    check_pipeline_layout(f, {"pp2_interleaved", 1, 2, 1}, ref, ref_save);
  } else if (W == 4) {
    check_pipeline_layout(f, {"tp2_pp2_sp", 2, 2, 0, true}, ref, ref_save);
    check_pipeline_layout(f, {"pp2_interleaved_dp2_distopt_overlap_pgather", 1, 2, 1, false, true,
                              true, 1, 2000, true}, ref, ref_save);
    check_pipeline_layout(f, {"cp2_pp2_interleaved_distopt", 1, 2, 1, false, true, false, 2}, ref,
                          ref_save);
    // --overlap-grad-reduce with several buckets: reduced during the pipeline's backward.
    check_pipeline_layout(f, {"pp2_dp2_overlap", 1, 2, 0, false, false, true, 1, 3000}, ref,
                          ref_save);
    check_pipeline_layout(f, {"pp2_interleaved_dp2_overlap", 1, 2, 1, false, false, true, 1, 3000},
                          ref, ref_save);
  } else if (W == 8) {
    check_pipeline_layout(f, {"tp2_pp2_dp2_sp_distopt_overlap_pgather", 2, 2, 0, true, true, true,
                              1, 2000, true}, ref, ref_save);
    check_pipeline_layout(f, {"tp2_cp2_pp2_sp", 2, 2, 0, true, false, false, 2}, ref, ref_save);
  }
}

TEST(MpiPipelineTraining, SaveAndResumeContinueTheSameCurve) {
  SKIP_ON_ONE_RANK();
  const int W = world()->size();
  if (W != 2 && W != 4) GTEST_SKIP() << "runs at -np 2 (PP2 interleaved) and 4 (TP2 x PP2)";
  Fixture f;
  const PipeLayout l = W == 4 ? PipeLayout{"tp2_pp2", 2, 2, 0, true, true}
                              : PipeLayout{"pp2_interleaved", 1, 2, 1};
  TrainingArgs a = with_layout(pipeline_args(f, 12), l);
  a.save = f.dir / "full";
  a.save_interval = 1000;
  const TrainingSummary full = pretrain(a);
  TrainingArgs b = a;
  b.save = f.dir / "split";
  b.exit_interval = 6;  // saves at 6 and stops
  const TrainingSummary first = pretrain(b);
  EXPECT_EQ(first.iterations, 6);
  b.exit_interval = 0;
  b.load = b.save;
  const TrainingSummary second = pretrain(b);
  EXPECT_EQ(second.start_iteration, 6);
  ASSERT_EQ(second.losses.size(), 6u);
  for (size_t i = 0; i < 6; ++i) {
    EXPECT_EQ(first.losses[i], full.losses[i]) << "iteration " << i + 1;
    EXPECT_EQ(second.losses[i], full.losses[6 + i]) << "iteration " << i + 7;  // bit for bit
    EXPECT_EQ(second.grad_norms[i], full.grad_norms[6 + i]) << "iteration " << i + 7;
  }
  if (world()->rank() == 0) {
    expect_same_params(b.save, a.save, 12, 0.0);
    // The layout is recorded; the last stage does not save the tied copy of the word embedding.
    const fs::path it = fs::path(b.save) / "iter_0000006";
    const json meta = json::parse(testing::read_file(it / "metadata.json"));
    EXPECT_EQ(meta["parallel"]["tensor_model_parallel_size"], l.tp);
    EXPECT_EQ(meta["parallel"]["pipeline_model_parallel_size"], 2);
    EXPECT_EQ(meta["parallel"]["virtual_pipeline_model_parallel_size"], l.layers_per_virtual_stage ? 2 : 1);
    EXPECT_EQ(meta["args"]["parallel"]["num_layers_per_virtual_pipeline_stage"], l.layers_per_virtual_stage);
    const auto first_stage = read_safetensors(it / "mp_rank_00_000/model.safetensors");
    const auto last_stage = read_safetensors(it / "mp_rank_00_001/model.safetensors");
    EXPECT_TRUE(first_stage.tensors.count("embedding.word_embeddings.weight"));
    EXPECT_FALSE(last_stage.tensors.count("output_layer.weight"));
    EXPECT_TRUE(last_stage.tensors.count("decoder.final_layernorm.weight"));
    // Interleaved: rank 0 holds layers 0 and 2, rank 1 layers 1 and 3 (global names).
    const std::string rank1_layer = l.layers_per_virtual_stage ? "decoder.layers.1." : "decoder.layers.2.";
    bool found = false;
    for (const auto& [n, t] : last_stage.tensors) found = found || n.starts_with(rank1_layer);
    EXPECT_TRUE(found) << rank1_layer;

    // Another layout (one rank: PP1) is a clear error naming the converter.
    TrainingArgs c = pipeline_args(f, 12);
    c.load = b.save;
    {
      const std::string m = megatron::testing::error_of([&] { run_single(c); });
      EXPECT_NE(m.find(str("saved with TP=", l.tp, " PP=2")), std::string::npos) << m;
      EXPECT_NE(m.find("this run has TP=1 PP=1"), std::string::npos) << m;
      EXPECT_NE(m.find("--pipeline-model-parallel-size 2"), std::string::npos) << m;
      EXPECT_NE(m.find("megatron checkpoint convert --load " + b.save), std::string::npos) << m;
      EXPECT_NE(m.find("--target-tensor-parallel-size 1 --target-pipeline-parallel-size 1`"),
                std::string::npos) << m;
    }
  }
  world()->barrier();
  if (l.layers_per_virtual_stage > 0) {  // same TP and PP, no virtual stages: every rank refuses
    TrainingArgs d = with_layout(pipeline_args(f, 12), PipeLayout{"pp2", l.tp, 2});
    d.load = b.save;
    {
      const std::string m = megatron::testing::error_of([&] { pretrain(d); });
      EXPECT_NE(m.find("2 virtual stages per pipeline rank); this run has TP=1 PP=2."),
                std::string::npos) << m;
      EXPECT_NE(m.find("run with --num-layers-per-virtual-pipeline-stage 1"), std::string::npos) << m;
    }
    world()->barrier();
  }
}

// bf16 weights (fp32 main weights in the optimizer): PP2 interleaved follows the single-rank bf16
// curve within bf16 precision, and resumes bit for bit (the tied copy's fp32 main weights come
// from the optimizer state, its bf16 value from the first stage).
TEST(MpiPipelineTraining, Bf16PipelineTrainsAndResumes) {
  SKIP_ON_ONE_RANK();
  if (world()->size() != 2) GTEST_SKIP() << "runs at -np 2";
  Fixture f;
  TrainingArgs a = with_layout(pipeline_args(f, 8), PipeLayout{"pp2_interleaved", 1, 2, 1});
  a.bf16 = true;
  TrainingArgs single = pipeline_args(f, 8);
  single.bf16 = true;
  const TrainingSummary ref = reference_curve(single, f.dir / "ref");
  const TrainingSummary full = pretrain(a);
  ASSERT_EQ(full.losses.size(), 8u);
  for (size_t i = 0; i < 8; ++i) EXPECT_NEAR(full.losses[i], ref.losses[i], 2e-2 * ref.losses[i]) << i;
  TrainingArgs b = a;
  b.save = f.dir / "bf16";
  b.save_interval = 1000;
  b.exit_interval = 4;
  pretrain(b);
  b.exit_interval = 0;
  b.load = b.save;
  const TrainingSummary second = pretrain(b);
  ASSERT_EQ(second.losses.size(), 4u);
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(second.losses[i], full.losses[4 + i]) << "iteration " << i + 5;
  world()->barrier();
}

#ifdef MEGATRON_HAVE_MPI
std::string mpirun(int np, const std::string& env = "") {
  return "OMP_NUM_THREADS=1 " + env + " mpirun --oversubscribe --allow-run-as-root -np " +
         std::to_string(np) + (env.empty() ? "" : " -x MEGATRON_TEST_FAULT") + " " +
         testing::cli_path().string() + " ";
}

size_t count(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t at = 0; (at = text.find(needle, at)) != std::string::npos; ++at) ++n;
  return n;
}

std::string pipeline_cli_flags(const Fixture& f) {
  return "pretrain-gpt --num-layers 2 --hidden-size 16 --num-attention-heads 2 --seq-length 16 "
         "--micro-batch-size 2 --global-batch-size 4 --lr 1e-3 --tokenizer-type NullTokenizer "
         "--vocab-size 64 --make-vocab-size-divisible-by 8 --data-path " + f.prefix +
         " --data-cache-path " + (f.dir / "cache") + " --split 90,10,0 --eval-iters 1 "
         "--pipeline-model-parallel-size 2";
}

TEST(PipelineCli, PipelineRunLogsOncePerInterval) {
  if (world()->size() > 1) GTEST_SKIP() << "launches mpirun itself";
  Fixture f;
  auto r = testing::run_command(mpirun(2) + pipeline_cli_flags(f) +
                                " --train-iters 4 --log-interval 2 --eval-interval 4 "
                                "--log-metrics-jsonl " + (f.dir / "m.jsonl") + " 2>&1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string metrics = testing::read_file(f.dir / "m.jsonl");
  EXPECT_EQ(std::count(metrics.begin(), metrics.end(), '\n'), 2) << metrics;  // last stage only
  EXPECT_EQ(count(r.output, "| consumed samples:"), 2u) << r.output;
  // The in-loop evaluation at --eval-interval, then Megatron's end-of-training one.
  EXPECT_EQ(count(r.output, "validation loss at iteration 4 |"), 1u) << r.output;
  EXPECT_EQ(count(r.output, "validation loss at iteration 4 on validation set |"), 1u) << r.output;
  EXPECT_EQ(count(r.output, "training finished"), 1u) << r.output;
  EXPECT_NE(r.output.find("TP 1 x PP 2 x CP 1 x DP 1, 1F1B pipeline schedule"), std::string::npos)
      << r.output;
}

// A rank that dies (SIGKILL) or hangs (SIGSTOP) at the start of iteration 4 while its peer is
// mid-step: the job ends with an error, not a hang, and the checkpoint of iteration 2 loads.
TEST(PipelineCli, ARankLostMidStepEndsTheJobAndTheLastCheckpointLoads) {
  if (world()->size() > 1) GTEST_SKIP() << "launches mpirun itself";
  Fixture f;
  const std::string ck = f.dir / "ck";
  // 0.1 minutes: the survivor's receive gives up after 6 s.
  const std::string run = pipeline_cli_flags(f) + " --train-iters 6 --log-interval 1 --save " + ck +
                          " --save-interval 2 --distributed-timeout-minutes 0.1";
  for (const std::string fault : {"hang:0:4", "kill:1:4"}) {
    SCOPED_TRACE(fault);
    const auto t0 = std::chrono::steady_clock::now();
    auto r = testing::run_command(mpirun(2, "MEGATRON_TEST_FAULT=" + fault) + run + " 2>&1");
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (std::getenv("MG_PRINT_OUTPUT")) std::printf("%s\n(%.1f s)\n", r.output.c_str(), secs);
    EXPECT_NE(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("MEGATRON_TEST_FAULT: world rank"), std::string::npos) << r.output;
    if (fault.starts_with("hang")) {  // only the timeout can end this one
      EXPECT_NE(r.output.find("distributed timeout"), std::string::npos) << r.output;
    }
    EXPECT_LT(secs, 45.0) << r.output;  // 6 s timeout + start-up on loaded CI cores, not a hang
    EXPECT_EQ(count(r.output, "iteration        3/"), 1u) << r.output;
    EXPECT_EQ(r.output.find("iteration        4/"), std::string::npos) << r.output;
    EXPECT_EQ(testing::read_file(fs::path(ck) / "latest_checkpointed_iteration.txt"), "2");
  }
  auto resumed = testing::run_command(mpirun(2) + run + " --load " + ck + " 2>&1");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("successfully loaded checkpoint from " + ck + " at iteration 2"),
            std::string::npos)
      << resumed.output;
  EXPECT_NE(resumed.output.find("iteration        6/"), std::string::npos) << resumed.output;
}
#endif

}  // namespace
}  // namespace megatron::training
