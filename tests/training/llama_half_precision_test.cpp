// Llama-family pretraining in bf16 and fp16 (llama_test_util.h's model) by parity with the
// single-rank run of the same precision, and exact resume. Compute is fp32 here (the bf16/fp16
// weights are converted to an fp32 working copy, gradients accumulate in fp32: gpt_model.h), so
// what half precision changes is the rounding of the weights after every step (the optimizer keeps
// fp32 main weights). Three precisions:
//   bf16;
//   fp16 with Megatron's dynamic scaler defaults (initial scale 2^32, window 1000, hysteresis 2,
//        minimum 1): in fp32 compute 2^32 never overflows, no step is skipped;
//   fp16 with overflows: initial scale 2^133 and window 2, so the scaled fp32 gradients overflow
//        (the scale is a double; each micro-batch's factor scale / (tokens x micro-batches) is a
//        float) and steps are skipped all along the run (single rank: iterations 1-3, 5, 10-11,
//        14-15, 18-20), with backoff after hysteresis and growth every 2 clean steps.
// Parity (20 iterations; losses, grad norms and validation losses per iteration, skipped
// iterations, final parameters: the bf16/fp16 weights of the checkpoint, gathered over TP and PP,
// and the fp32 main weights and Adam moments of the optimizer state, merged over TP, PP and DP):
//   np 2: PP2 (1F1B), PP2 interleaved, DP2 with the distributed optimizer, overlapped reduction
//         and parameter gather, CP2 ring, CP2 all-gather, TP2 + SP;
//   np 4: TP2 x PP2 + SP, PP2 interleaved x DP2 (distributed optimizer, overlap), CP2 x PP2
//         interleaved, TP2 + SP x CP2.
// Resume (np 2, PP2 interleaved and DP2 with the distributed optimizer, every precision): save at
// 10, resume to 20: losses and grad norms of 11..20 equal the uninterrupted run's, so do the
// skipped iterations, the final checkpoint's tensors (weights and every optimizer tensor) and
// loss-scaler state (scale, growth tracker, hysteresis tracker). With overflows also from 12: the
// checkpoint at 10 is between the two skipped steps of a backoff (hysteresis tracker 1), the one at
// 12 one clean step into the growth window (growth tracker 1).
// Set MG_PRINT_PARAM_DIFF=1 to print the measured differences behind the tolerances.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "llama_test_util.h"
#include "training/checkpoint.h"

namespace megatron::training {
namespace {

using namespace parallel_test;

struct Precision {
  std::string name;
  bool bf16;
  double initial_loss_scale = 4294967296.0;  // Megatron's --initial-loss-scale default (2^32)
  int64_t loss_scale_window = 1000;          // Megatron's --loss-scale-window default
};

const std::vector<Precision>& precisions() {
  static const std::vector<Precision> p = {
      {"bf16", true}, {"fp16", false}, {"fp16_overflow", false, std::ldexp(1.0, 133), 2}};
  return p;
}

TrainingArgs with_precision(TrainingArgs a, const Precision& p) {
  a.bf16 = p.bf16;
  a.fp16 = !p.bf16;
  a.initial_loss_scale = p.initial_loss_scale;
  a.loss_scale_window = p.loss_scale_window;  // --hysteresis 2, --min-loss-scale 1: defaults
  a.log_interval = 1000000;
  return a;
}

// How the layout's arithmetic differs from the single rank's.
enum class Order {
  Same,         // PP: every stage computes what the single rank does, in the same order
  DpSum,        // DP: micro-batch gradients summed per rank, then over ranks
  PartialSums,  // TP (row-parallel outputs, SP gradients) and CP (attention, loss and gradient
                // partial sums over the sequence slices)
};

// Tolerances (each a few times the largest difference measured over every layout of the order
// and both fp16 precisions, on x86-64, given in the comments). curve: losses and validation losses
// relative, grad norms 10 x that (expect_same_curve); main / moments: fp32 main weights / Adam
// moments relative to each tensor's largest |value|; model: the bf16/fp16 weights, which are the
// main weights rounded to nearest, so they differ by at most the main weights' difference plus one
// ulp: 2^-7 of a tensor's largest |value| in bf16 (8 significant bits), 2^-10 in fp16 (11); the
// measured weight differences are such one-ulp flips.
// Same order: nothing differs but the grad norm's sum of squares over stages (in double, measured
// 2.5e-16): losses and all tensors exact.
struct Tolerance {
  double curve, main, moments, model;
};

// The weights' tolerance from the main weights': one ulp more (significant bits of the dtype).
Tolerance rounded(double curve, double main, double moments, int significant_bits) {
  return {curve, main, moments, main + std::ldexp(1.0, 1 - significant_bits)};
}

// DP, TP and CP sum the same fp32 terms in another order; once a rounding to bf16/fp16 weights
// flips one ulp the runs differ by the same amount whichever reordering started it (measured DP
// alone at 4.6e-8 in the loss until the cross-entropy sum was vectorised, then 3.2e-6), so the
// three share one tolerance. Measured over every such layout at np 2 and np 4:
// bf16: loss 3.2e-6, validation 5.7e-6, grad norm 8.2e-5, weights 3.9e-3, main 3.5e-4, moments
// 1.4e-3; fp16: loss 1.2e-6, validation 4.5e-7, grad norm 1.6e-5, weights 7.7e-4, main 6.2e-5,
// moments 2.8e-4.
Tolerance tolerance(Order o, bool bf16) {
  if (o == Order::Same) return {1e-14, 0.0, 0.0, 0.0};
  return bf16 ? rounded(2.5e-5, 1.2e-3, 4e-3, 8) : rounded(5e-6, 2e-4, 1e-3, 11);
}

// Skipped iterations (NaN grad norm) among iterations begin+1..end.
int64_t count_skipped(const std::vector<double>& grad_norms, size_t begin = 0,
                      size_t end = size_t(-1)) {
  end = std::min(end, grad_norms.size());
  return std::count_if(grad_norms.begin() + std::ptrdiff_t(std::min(begin, end)),
                       grad_norms.begin() + std::ptrdiff_t(end),
                       [](double g) { return !std::isfinite(g); });
}

void print_curve_diff(const std::string& what, const TrainingSummary& p,
                      const TrainingSummary& ref) {
  if (!std::getenv("MG_PRINT_PARAM_DIFF") || world()->rank() != 0) return;
  auto worst = [](const std::vector<double>& a, const std::vector<double>& b) {
    double w = 0;
    for (size_t i = 0; i < b.size() && i < a.size(); ++i)
      if (std::isfinite(b[i])) w = std::max(w, std::abs(a[i] - b[i]) / std::abs(b[i]));
    return w;
  };
  std::printf("curve diff %-45s loss %.3g grad norm %.3g validation %.3g\n", what.c_str(),
              worst(p.losses, ref.losses), worst(p.grad_norms, ref.grad_norms),
              worst(p.valid_losses, ref.valid_losses));
}

TEST(MpiLlamaHalfPrecision, LayoutsFollowTheSingleRankRun) {
  SKIP_ON_ONE_RANK();
  const int W = world()->size();
  std::vector<std::pair<Layout, Order>> layouts;
  if (W == 2) {
    layouts = {
        {{"pp2", 1, 2}, Order::Same},
        {{"pp2_interleaved", 1, 2, 1}, Order::Same},
        {{"dp2_distopt_overlap_pgather", 1, 1, 0, 1, false, true, true, true}, Order::DpSum},
        {{"cp2_ring", 1, 1, 0, 2}, Order::PartialSums},
        {{"cp2_allgather", 1, 1, 0, 2, false, false, false, false, "allgather"}, Order::PartialSums},
        {{"tp2_sp", 2, 1, 0, 1, true}, Order::PartialSums}};
  } else if (W == 4) {
    layouts = {
        {{"tp2_pp2_sp", 2, 2, 0, 1, true}, Order::PartialSums},
        {{"pp2_interleaved_dp2_distopt_overlap", 1, 2, 1, 1, false, true, true, true}, Order::DpSum},
        {{"cp2_pp2_interleaved", 1, 2, 1, 2}, Order::PartialSums},
        {{"tp2_sp_cp2", 2, 1, 0, 2, true}, Order::PartialSums}};
  } else {
    GTEST_SKIP() << "runs at np 2 and 4";
  }
  Fixture f;
  for (const Precision& prec : precisions()) {
    SCOPED_TRACE(prec.name);
    const TrainingArgs a = with_precision(llama_args(f), prec);
    const std::string ref_save = f.dir / ("ref_" + prec.name);
    const TrainingSummary ref = reference_curve(a, ref_save);
    ASSERT_EQ(ref.losses.size(), 20u);
    EXPECT_LT(ref.losses.back(), ref.losses.front() - 0.3);  // it learns: the comparison is not idle
    const int64_t ref_skipped = count_skipped(ref.grad_norms);
    EXPECT_EQ(ref_skipped, prec.name == "fp16_overflow" ? 11 : 0);
    for (const auto& [l, order] : layouts) {
      const std::string what = prec.name + " " + l.name;
      SCOPED_TRACE(what);
      const Tolerance tol = tolerance(order, prec.bf16);
      TrainingArgs par = with_layout(a, l);
      par.save = f.dir / (prec.name + "_" + l.name);
      par.save_interval = 1000;
      const TrainingSummary p = pretrain(par);
      EXPECT_EQ(p.iterations, 20);
      print_curve_diff(what, p, ref);
      if (order == Order::Same) {
        EXPECT_EQ(p.losses, ref.losses);
        EXPECT_EQ(p.valid_losses, ref.valid_losses);
      }
      expect_same_curve(p, ref, tol.curve, what);
      // Every rank skips exactly where the single rank does (the inf check is global).
      EXPECT_EQ(p.skipped_iterations, ref_skipped);
      for (size_t i = 0; i < ref.grad_norms.size(); ++i)
        EXPECT_EQ(std::isfinite(p.grad_norms[i]), std::isfinite(ref.grad_norms[i]))
            << "iteration " << i + 1;
      if (l.overlap) {
        EXPECT_EQ(p.grad_buckets_launched_in_backward, p.grad_buckets);
      }
      if (world()->rank() == 0) {
        expect_same_params(par.save, ref_save, 20, tol.model);
        expect_same_optimizer_state(par.save, ref_save, 20, tol.main, tol.moments);
      }
      world()->barrier();
    }
  }
}

// Every tensor of the two checkpoints (weights and optimizer state, per rank file as saved) and
// the loss scaler's state are equal.
void expect_identical_checkpoints(const std::string& got, const std::string& ref, int64_t it) {
  expect_same_params(got, ref, it, 0.0);
  expect_same_optimizer_state(got, ref, it, 0.0, 0.0);
  const CheckpointOnDisk g = find_checkpoint(got, it).value(), r = find_checkpoint(ref, it).value();
  EXPECT_EQ(g.state.grad_scaler.scale, r.state.grad_scaler.scale);
  EXPECT_EQ(g.state.grad_scaler.growth_tracker, r.state.grad_scaler.growth_tracker);
  EXPECT_EQ(g.state.grad_scaler.hysteresis_tracker, r.state.grad_scaler.hysteresis_tracker);
  EXPECT_EQ(g.state.scheduler_num_steps, r.state.scheduler_num_steps);
  EXPECT_EQ(g.state.consumed_train_samples, r.state.consumed_train_samples);
}

TEST(MpiLlamaHalfPrecision, SaveAndResumeAreExact) {
  SKIP_ON_ONE_RANK();
  if (world()->size() != 2) GTEST_SKIP() << "runs at np 2";
  Fixture f;
  const std::vector<Layout> layouts = {
      {"pp2_interleaved", 1, 2, 1},
      {"dp2_distopt_overlap_pgather", 1, 1, 0, 1, false, true, true, true}};
  for (const Layout& l : layouts) {
    for (const Precision& prec : precisions()) {
      const std::string what = prec.name + " " + l.name;
      SCOPED_TRACE(what);
      const bool overflow = prec.name == "fp16_overflow";
      const TrainingArgs a = with_layout(with_precision(llama_args(f), prec), l);
      TrainingArgs full = a;
      full.save = f.dir / ("full_" + prec.name + "_" + l.name);
      full.save_interval = 1000;
      const TrainingSummary whole = pretrain(full);
      ASSERT_EQ(whole.losses.size(), 20u);
      EXPECT_EQ(whole.skipped_iterations, count_skipped(whole.grad_norms));
      // The first run stops at 10 (at 12 with overflows, saving at 10 and 12).
      TrainingArgs first = a;
      first.save = f.dir / ("first_" + prec.name + "_" + l.name);
      first.save_interval = overflow ? 2 : 10;
      first.exit_interval = overflow ? 12 : 10;
      const TrainingSummary head = pretrain(first);
      for (int64_t from : overflow ? std::vector<int64_t>{10, 12} : std::vector<int64_t>{10}) {
        SCOPED_TRACE("resumed from " + std::to_string(from));
        const optim::GradScalerState saved =
            find_checkpoint(first.save, from).value().state.grad_scaler;
        if (overflow) {  // the resume points are where the scaler's state matters
          EXPECT_LT(saved.scale, prec.initial_loss_scale);
          EXPECT_EQ(saved.hysteresis_tracker, from == 10 ? 1 : 0);
          EXPECT_EQ(saved.growth_tracker, from == 10 ? 0 : 1);
          EXPECT_GT(count_skipped(whole.grad_norms, 0, size_t(from)), 0);  // skips before and after
          EXPECT_GT(count_skipped(whole.grad_norms, size_t(from)), 0);
        } else {
          EXPECT_EQ(saved.scale, prec.bf16 ? 1.0 : prec.initial_loss_scale);
          EXPECT_EQ(whole.skipped_iterations, 0);
        }
        TrainingArgs second = a;
        second.load = first.save;
        second.ckpt_step = from;
        second.save = f.dir / ("resumed" + std::to_string(from) + "_" + prec.name + "_" + l.name);
        second.save_interval = 1000;
        const TrainingSummary rest = pretrain(second);
        ASSERT_EQ(rest.losses.size(), size_t(20 - from));
        EXPECT_EQ(rest.start_iteration, from);
        for (size_t i = 0; i < rest.losses.size(); ++i) {
          const size_t j = size_t(from) + i;
          EXPECT_EQ(rest.losses[i], whole.losses[j]) << "iteration " << j + 1;
          if (std::isfinite(whole.grad_norms[j]))
            EXPECT_EQ(rest.grad_norms[i], whole.grad_norms[j]) << "iteration " << j + 1;
          else
            EXPECT_FALSE(std::isfinite(rest.grad_norms[i])) << "iteration " << j + 1 << " skips";
        }
        // The skipped iterations of the two parts add up to the uninterrupted run's.
        EXPECT_EQ(count_skipped(head.grad_norms, 0, size_t(from)) + rest.skipped_iterations,
                  whole.skipped_iterations);
        EXPECT_EQ(rest.skipped_iterations, count_skipped(whole.grad_norms, size_t(from)));
        // Evaluations at 10 and 20 and after training (Megatron's); the resumed run's from 20.
        ASSERT_EQ(whole.valid_losses.size(), 3u);
        EXPECT_EQ(rest.valid_losses,
                  std::vector<double>(whole.valid_losses.begin() + 1, whole.valid_losses.end()));
        if (world()->rank() == 0) expect_identical_checkpoints(second.save, full.save, 20);
        world()->barrier();
      }
    }
  }
}

}  // namespace
}  // namespace megatron::training
