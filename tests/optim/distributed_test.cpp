// Data-parallel buffers and the distributed optimizer. The layout tests are pure arithmetic; tests
// named Mpi* run as plain processes (a data-parallel group of one) and under mpirun -np 2 / -np 4
// (label mpi), where the whole world is the data-parallel group:
//  - the bucketed all-reduce and reduce-scatter deliver known sums (each rank contributes values
//    built from its rank id) at the places the layout says, padding stays zero, and overlapped
//    launches (register_grads_ready) give the same result as the blocking path;
//  - --grad-reduce-in-bf16: each rank's gradient rounded to bf16, the sum rounded to bf16;
//  - the all-gather of the parameter buffer puts every rank's shard everywhere; launched without
//    waiting (--overlap-param-gather) and then waited for bucket by bucket in forward order
//    (wait_params) or all at once (finish_param_sync) it gives the blocking gather's parameters,
//    and steps of the distributed optimizer with overlapped gathers (including a skipped one)
//    equal the blocking ones bit for bit;
//  - the sharded AdamW/SGD equals the unsharded optimizer run on the summed gradients (bitwise for
//    the parameters without clipping, 1e-6 with clipping; bf16 parameters too), the grad norm is
//    the global one, and an inf on one rank makes every rank skip.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <numeric>

#include "comm/communicator.h"
#include "core/half.h"
#include "core/rng.h"
#include "optim/distributed_optimizer.h"
#include "optim/grad_buffer.h"
#include "optim/optimizer.h"

namespace megatron::optim {
namespace {

TEST(BufferLayout, WorkedExampleFromTheHeader) {
  const BufferLayout L = BufferLayout::build({100, 10}, 0, 2, true);
  ASSERT_EQ(L.buckets.size(), 1u);
  EXPECT_EQ(L.params[1].offset, 0);   // B first (reverse order)
  EXPECT_EQ(L.params[0].offset, 64);  // A aligned to 64
  EXPECT_EQ(L.buckets[0].begin, 0);
  EXPECT_EQ(L.buckets[0].end, 256);
  EXPECT_EQ(L.total, 256);
  EXPECT_EQ(L.shard_size(0), 128);
  const auto r0 = L.shard_pieces(0), r1 = L.shard_pieces(1);
  ASSERT_EQ(r0.size(), 2u);
  EXPECT_EQ(r0[0].param, 1u);
  EXPECT_EQ(r0[0].length, 10);
  EXPECT_EQ(r0[1].param, 0u);
  EXPECT_EQ(r0[1].param_offset, 0);
  EXPECT_EQ(r0[1].length, 64);
  EXPECT_EQ(r0[1].shard_offset, 64);
  ASSERT_EQ(r1.size(), 1u);
  EXPECT_EQ(r1[0].param_offset, 64);
  EXPECT_EQ(r1[0].length, 36);
  EXPECT_EQ(r1[0].shard_offset, 0);
  EXPECT_EQ(r1[0].buffer_offset, 128);
}

TEST(BufferLayout, BucketsCloseAtTheSizeInReverseOrderWithoutPadding) {
  // model order sizes; buffer order is reversed: 5, 40, 30, 20, 10
  const BufferLayout L = BufferLayout::build({10, 20, 30, 40, 5}, 45, 3, false);
  ASSERT_EQ(L.buckets.size(), 3u);
  EXPECT_EQ(L.buckets[0].params, (std::vector<size_t>{4, 3}));     // 45 elements
  EXPECT_EQ(L.buckets[1].params, (std::vector<size_t>{2, 1}));     // 50
  EXPECT_EQ(L.buckets[2].params, (std::vector<size_t>{0}));        // 10 (the rest)
  EXPECT_EQ(L.buckets[1].begin, 45);
  EXPECT_EQ(L.buckets[2].end, 105);
  EXPECT_EQ(L.total, 105);
  EXPECT_EQ(L.params[0].bucket, 2);
}

TEST(BufferLayout, ShardPiecesTileEveryParameterExactlyOnce) {
  const std::vector<int64_t> numels = {1000, 3, 129, 64, 777, 1, 2048};
  for (int dp : {1, 2, 3, 4, 8}) {
    for (int64_t bucket : {int64_t(0), int64_t(100), int64_t(1500)}) {
      const BufferLayout L = BufferLayout::build(numels, bucket, dp, true);
      std::vector<std::vector<int>> covered(numels.size());
      for (size_t i = 0; i < numels.size(); ++i) covered[i].assign(size_t(numels[i]), 0);
      for (const auto& b : L.buckets) EXPECT_EQ((b.end - b.begin) % (std::lcm(dp, 128)), 0);
      for (int r = 0; r < dp; ++r) {
        int64_t prev_end = -1;
        for (const auto& p : L.shard_pieces(r)) {
          EXPECT_GT(p.shard_offset, prev_end - 1);
          prev_end = p.shard_offset + p.length;
          EXPECT_LE(prev_end, L.total_shard_size());
          EXPECT_EQ(p.buffer_offset, L.params[p.param].offset + p.param_offset);
          for (int64_t k = 0; k < p.length; ++k) ++covered[p.param][size_t(p.param_offset + k)];
        }
      }
      for (size_t i = 0; i < numels.size(); ++i)
        for (int c : covered[i]) ASSERT_EQ(c, 1) << "dp " << dp << " bucket " << bucket;
    }
  }
}

// ---- multi-rank -----------------------------------------------------------------------------

std::shared_ptr<Communicator> world() { return world_communicator(); }

// A small "model": parameters of assorted sizes; biases without weight decay.
struct ToyParams {
  std::vector<std::unique_ptr<model::Parameter>> owned;
  model::ParameterList list;
  ToyParams(DType dtype, uint64_t seed) {
    const std::vector<Shape> shapes = {{7, 5}, {5}, {33, 4}, {130}, {3, 3, 3}, {1}};
    for (size_t i = 0; i < shapes.size(); ++i) {
      auto p = std::make_unique<model::Parameter>();
      p->name = "p" + std::to_string(i);
      Tensor v = Tensor::empty(shapes[i], DType::F32);
      Philox(seed, i).fill_normal(v.data<float>(), v.numel(), 0.0f, 0.5f);
      p->value = v.to(dtype);
      p->grad = Tensor::zeros(shapes[i], DType::F32);
      p->weight_decay = shapes[i].size() > 1;
      list.push_back(p.get());
      owned.push_back(std::move(p));
    }
  }
};

// Rank r's gradient of parameter i, element k, at step s: a known value.
float grad_value(int rank, size_t i, int64_t k, int step) {
  return 0.01f * float((rank + 1) * (k % 7 + 1)) - 0.003f * float(i) + 0.002f * float(step) *
         float((k + rank) % 3);
}

void fill_grads(const model::ParameterList& ps, int rank, int step) {
  for (size_t i = 0; i < ps.size(); ++i) {
    float* g = ps[i]->grad.data<float>();
    for (int64_t k = 0; k < ps[i]->grad.numel(); ++k) g[k] = grad_value(rank, i, k, step);
  }
}

// The sum over `ranks` ranks, accumulated in rank order as a check value (tolerance-compared).
float summed_grad(int ranks, size_t i, int64_t k, int step) {
  double s = 0;
  for (int r = 0; r < ranks; ++r) s += grad_value(r, i, k, step);
  return float(s);
}

TEST(MpiGradBuffer, AllReduceGivesKnownSumsWithAndWithoutOverlap) {
  auto w = world();
  for (int64_t bucket : {int64_t(0), int64_t(40)}) {
    for (bool overlap : {false, true}) {
      ToyParams t(DType::F32, 1);
      ParamAndGradBuffer buf(t.list, w, GradBufferConfig{bucket, false});
      EXPECT_EQ(buf.layout().total, 35 + 5 + 132 + 130 + 27 + 1);  // no padding
      fill_grads(t.list, w->rank(), 0);
      if (overlap) {
        // Report in backward order; a bucket starts once all its parameters are in.
        for (size_t i = t.list.size(); i-- > 0;) buf.register_grads_ready({t.list[i]});
        EXPECT_EQ(buf.launched_buckets(), int(buf.layout().buckets.size()));
      }
      buf.finish_grad_sync();
      for (size_t i = 0; i < t.list.size(); ++i) {
        const Tensor& g = t.list[i]->grad;  // a view into the buffer now
        EXPECT_EQ(g.storage(), buf.grad_data().storage());
        for (int64_t k = 0; k < g.numel(); ++k)
          ASSERT_NEAR(g.item_as_double(k), summed_grad(w->size(), i, k, 0), 1e-6) << i << " " << k;
      }
      EXPECT_EQ(buf.launched_buckets(), 0);  // reset for the next step
    }
  }
}

TEST(MpiGradBuffer, ReduceScatterFillsThisRanksShardAndPaddingStaysZero) {
  auto w = world();
  for (int64_t bucket : {int64_t(0), int64_t(50)}) {
    ToyParams t(DType::F32, 1);
    ParamAndGradBuffer buf(t.list, w, GradBufferConfig{bucket, true});
    const BufferLayout& L = buf.layout();
    EXPECT_EQ(L.total % std::lcm(w->size(), 128), 0);
    fill_grads(t.list, w->rank(), 3);
    buf.finish_grad_sync();
    const Tensor shard = buf.main_grad_shard();
    std::vector<bool> used(size_t(shard.numel()), false);
    for (const auto& p : L.shard_pieces(w->rank())) {
      for (int64_t k = 0; k < p.length; ++k) {
        used[size_t(p.shard_offset + k)] = true;
        ASSERT_NEAR(shard.item_as_double(p.shard_offset + k),
                    summed_grad(w->size(), p.param, p.param_offset + k, 3), 1e-6);
      }
    }
    for (int64_t k = 0; k < shard.numel(); ++k) {
      if (!used[size_t(k)]) {
        ASSERT_EQ(shard.item_as_double(k), 0.0) << "padding " << k;
      }
    }
  }
}

// --grad-reduce-in-bf16: every rank's gradient goes out rounded to bf16 and the sum comes back
// rounded to bf16, for the all-reduce and the distributed optimizer's reduce-scatter. The sums of
// these few bf16 values are exact in fp32, so the expected value is exact whatever the order.
float bf16_round(double x) { return bf16_to_float(float_to_bf16(float(x))); }

TEST(MpiGradBuffer, Bf16ReductionRoundsEachRanksGradientAndTheSum) {
  auto w = world();
  for (bool sharded : {false, true}) {
    ToyParams t(DType::F32, 1);
    GradBufferConfig cfg{40, sharded};
    cfg.reduce_in_bf16 = true;
    ParamAndGradBuffer buf(t.list, w, cfg);
    fill_grads(t.list, w->rank(), 5);
    for (size_t i = t.list.size(); i-- > 0;) buf.register_grads_ready({t.list[i]});
    buf.finish_grad_sync();
    auto expected = [&](size_t i, int64_t k) {
      double s = 0;
      for (int r = 0; r < w->size(); ++r) s += bf16_round(grad_value(r, i, k, 5));
      return bf16_round(s);
    };
    int64_t differs_from_fp32 = 0, checked = 0;
    auto check = [&](double got, size_t i, int64_t k) {
      ASSERT_EQ(got, double(expected(i, k))) << i << " " << k;
      differs_from_fp32 += got != double(summed_grad(w->size(), i, k, 5));
      ++checked;
    };
    if (sharded) {
      for (const auto& p : buf.layout().shard_pieces(w->rank()))
        for (int64_t k = 0; k < p.length; ++k)
          check(buf.main_grad_shard().item_as_double(p.shard_offset + k), p.param, p.param_offset + k);
    } else {
      for (size_t i = 0; i < t.list.size(); ++i)
        for (int64_t k = 0; k < t.list[i]->grad.numel(); ++k) check(t.list[i]->grad.item_as_double(k), i, k);
    }
    EXPECT_GT(checked, 0);
    EXPECT_GT(differs_from_fp32, checked / 2) << "the bf16 rounding must show";
  }
}

TEST(MpiGradBuffer, AllGatherPutsEveryShardEverywhere) {
  auto w = world();
  ToyParams t(DType::BF16, 1);
  ParamAndGradBuffer buf(t.list, w, GradBufferConfig{60, true});
  // Each rank writes the element index into the pieces it owns (nowhere else), then gathers.
  for (const auto& p : buf.layout().shard_pieces(w->rank())) {
    Tensor v = t.list[p.param]->value.view({-1}).narrow(0, p.param_offset, p.length);
    Tensor src = Tensor::empty({p.length}, DType::F32);
    for (int64_t k = 0; k < p.length; ++k) src.data<float>()[k] = float(p.param_offset + k);
    v.copy_(src);
  }
  buf.all_gather_params();
  for (size_t i = 0; i < t.list.size(); ++i)
    for (int64_t k = 0; k < t.list[i]->value.numel(); ++k)
      ASSERT_EQ(t.list[i]->value.item_as_double(k), double(bf16_to_float(float_to_bf16(float(k)))))
          << i << " " << k;
}

// This rank writes a value derived from (round, parameter, element) into the pieces it owns;
// elements it does not own keep their old values until the gather brings them.
void write_owned(ParamAndGradBuffer& buf, const model::ParameterList& ps, int round) {
  for (const auto& p : buf.layout().shard_pieces(buf.dp().rank())) {
    Tensor v = ps[p.param]->value.view({-1}).narrow(0, p.param_offset, p.length);
    Tensor src = Tensor::empty({p.length}, DType::F32);
    for (int64_t k = 0; k < p.length; ++k)
      src.data<float>()[k] = float(round * 1000 + int64_t(p.param) * 100 + (p.param_offset + k) % 97);
    v.copy_(src);
  }
}

void expect_same_values(const model::ParameterList& got, const model::ParameterList& want,
                        size_t i, const std::string& what) {
  ASSERT_EQ(got[i]->value.to_float_vector(), want[i]->value.to_float_vector())
      << what << ": parameter " << i;
}

TEST(MpiGradBuffer, OverlappedParamGatherEqualsTheBlockingOne) {
  auto w = world();
  ToyParams ref(DType::F32, 4), ovl(DType::F32, 4);
  ParamAndGradBuffer blocking(ref.list, w, GradBufferConfig{40, true, false});
  ParamAndGradBuffer overlapped(ovl.list, w, GradBufferConfig{40, true, true});
  const BufferLayout& L = overlapped.layout();
  const int nb = int(L.buckets.size());
  ASSERT_GE(nb, 3);  // several buckets: the per-bucket waits are exercised
  for (int round = 1; round <= 3; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    write_owned(blocking, ref.list, round);
    write_owned(overlapped, ovl.list, round);
    blocking.start_param_sync();  // blocking without overlap_param_gather
    EXPECT_FALSE(blocking.param_sync_pending());
    // The blocking gather really brought the other ranks' values (the comparison is not idle).
    const std::vector<float> last = ref.list.back()->value.to_float_vector();
    EXPECT_EQ(last[0], float(round * 1000 + int64_t(ref.list.size() - 1) * 100));
    overlapped.start_param_sync();
    if (round == 3) overlapped.start_param_sync();  // a second launch finishes the first one
    ASSERT_TRUE(overlapped.param_sync_pending());
    for (int b = 0; b < nb; ++b) EXPECT_TRUE(overlapped.param_bucket_pending(b)) << b;
    if (round == 2) {
      // A reader outside the forward: finish_param_sync waits for every bucket.
      overlapped.finish_param_sync();
      EXPECT_FALSE(overlapped.param_sync_pending());
      for (size_t i = 0; i < ref.list.size(); ++i) expect_same_values(ovl.list, ref.list, i, "finish");
      continue;
    }
    // The forward's order: the last bucket (the first parameters in model order) first. Waiting
    // for one bucket leaves the earlier ones pending.
    for (int b = nb; b-- > 0;) {
      model::ParameterList used;
      for (size_t i : L.buckets[size_t(b)].params) used.push_back(ovl.list[i]);
      overlapped.wait_params(used);
      EXPECT_FALSE(overlapped.param_bucket_pending(b));
      for (int e = 0; e < b; ++e) EXPECT_TRUE(overlapped.param_bucket_pending(e)) << b << " " << e;
      for (size_t i : L.buckets[size_t(b)].params) expect_same_values(ovl.list, ref.list, i, "wait");
      EXPECT_EQ(overlapped.bucket_of(used[0]), b);
    }
    EXPECT_FALSE(overlapped.param_sync_pending());
    overlapped.finish_param_sync();  // nothing left: a no-op
  }
}

TEST(MpiDistributedOptimizer, OverlappedParamGatherStepsEqualBlockingSteps) {
  auto w = world();
  OptimizerConfig oc;
  ToyParams ref(DType::BF16, 5), ovl(DType::BF16, 5);
  ParamAndGradBuffer bref(ref.list, w, GradBufferConfig{50, true, false});
  ParamAndGradBuffer bovl(ovl.list, w, GradBufferConfig{50, true, true});
  DistributedOptimizer oref(bref, oc, *w, 0), oovl(bovl, oc, *w, 0);
  GradScaler s1 = GradScaler::dynamic(1024.0, 1.0, 1000, 1);
  GradScaler s2 = GradScaler::dynamic(1024.0, 1.0, 1000, 1);
  for (int step = 0; step < 4; ++step) {
    for (auto* c : {&bref, &bovl}) {
      c->zero_grad();
      const model::ParameterList& ps = c == &bref ? ref.list : ovl.list;
      fill_grads(ps, w->rank(), step);
      // Step 2 overflows on the last rank: both skip, and nothing stays pending.
      if (step == 2 && w->rank() == w->size() - 1)
        ps[1]->grad.data<float>()[0] = std::numeric_limits<float>::infinity();
      c->finish_grad_sync();
    }
    const StepResult a = oref.step(1e-2, 0.1, s1);
    const StepResult b = oovl.step(1e-2, 0.1, s2);  // finishes the previous step's gathers first
    EXPECT_EQ(a.skipped, step == 2);
    EXPECT_EQ(b.skipped, a.skipped);
    EXPECT_EQ(bovl.param_sync_pending(), !b.skipped) << step;
    EXPECT_FALSE(bref.param_sync_pending());
  }
  bovl.finish_param_sync();
  for (size_t i = 0; i < ref.list.size(); ++i) expect_same_values(ovl.list, ref.list, i, "steps");
  EXPECT_EQ(oovl.step_count(), 3);
}

struct OptCase {
  OptimizerType type;
  DType dtype;
  double clip;
};

void check_sharded_equals_unsharded(const OptCase& c) {
  auto w = world();
  const int R = w->size();
  SCOPED_TRACE(std::string(c.type == OptimizerType::Adam ? "adam" : "sgd") + " " +
               dtype_name(c.dtype) + " clip " + std::to_string(c.clip));
  OptimizerConfig oc;
  oc.type = c.type;
  oc.clip_grad = c.clip;
  ToyParams ref(c.dtype, 9), dist(c.dtype, 9);
  Optimizer ref_opt(ref.list, oc);
  ParamAndGradBuffer buf(dist.list, w, GradBufferConfig{50, true});
  DistributedOptimizer dopt(buf, oc, *w, 0);
  GradScaler s1 = GradScaler::constant(1.0), s2 = GradScaler::constant(1.0);
  for (int step = 0; step < 5; ++step) {
    // Reference: the summed gradient, formed in rank order like the reduction (tolerance below).
    for (size_t i = 0; i < ref.list.size(); ++i) {
      float* g = ref.list[i]->grad.data<float>();
      for (int64_t k = 0; k < ref.list[i]->grad.numel(); ++k) g[k] = summed_grad(R, i, k, step);
    }
    dopt.zero_grad();
    fill_grads(dist.list, w->rank(), step);
    buf.finish_grad_sync();
    // Replace the reduced shard by the reference's exact sums so the update itself is compared.
    const Tensor shard = buf.main_grad_shard();
    for (const auto& p : dopt.state_pieces())
      shard.narrow(0, p.shard_offset, p.length)
          .copy_(ref.list[p.param]->grad.view({-1}).narrow(0, p.param_offset, p.length));
    const StepResult a = ref_opt.step(1e-2, 0.1, s1);
    const StepResult b = dopt.step(1e-2, 0.1, s2);
    EXPECT_FALSE(b.skipped);
    EXPECT_NEAR(b.grad_norm, a.grad_norm, 1e-12 * a.grad_norm);
    for (size_t i = 0; i < ref.list.size(); ++i) {
      const std::vector<float> x = dist.list[i]->value.to_float_vector();
      const std::vector<float> y = ref.list[i]->value.to_float_vector();
      for (size_t k = 0; k < x.size(); ++k) {
        if (c.clip == 0.0) {
          ASSERT_EQ(x[k], y[k]) << "param " << i << " elem " << k << " step " << step;
        } else {
          ASSERT_NEAR(x[k], y[k], 1e-6 * (1 + std::abs(y[k]))) << i << " " << k << " " << step;
        }
      }
    }
  }
  EXPECT_EQ(dopt.step_count(), 5);
}

TEST(MpiDistributedOptimizer, ShardedUpdateEqualsUnshardedOptimizer) {
  check_sharded_equals_unsharded({OptimizerType::Adam, DType::F32, 0.0});
  check_sharded_equals_unsharded({OptimizerType::Adam, DType::F32, 0.05});
  check_sharded_equals_unsharded({OptimizerType::Adam, DType::BF16, 0.0});
  check_sharded_equals_unsharded({OptimizerType::SGD, DType::F32, 0.0});
}

TEST(MpiDistributedOptimizer, InfOnOneRankSkipsEverywhere) {
  auto w = world();
  ToyParams t(DType::F32, 2);
  const std::vector<float> before = t.list[2]->value.to_float_vector();
  ParamAndGradBuffer buf(t.list, w, GradBufferConfig{0, true});
  DistributedOptimizer dopt(buf, OptimizerConfig{}, *w, 0);
  fill_grads(t.list, w->rank(), 0);
  if (w->rank() == w->size() - 1) t.list[0]->grad.data<float>()[3] = std::numeric_limits<float>::infinity();
  buf.finish_grad_sync();
  GradScaler s = GradScaler::dynamic(1024.0, 1.0, 1000, 1);
  const StepResult r = dopt.step(1e-2, 0.0, s);
  EXPECT_TRUE(r.skipped);
  EXPECT_EQ(s.scale(), 512.0);  // every rank backed off
  EXPECT_EQ(dopt.step_count(), 0);
  EXPECT_EQ(t.list[2]->value.to_float_vector(), before);
}

TEST(MpiOptimizer, GradStatsGroupGivesTheGlobalNormAndSkipsTogether) {
  auto w = world();
  ToyParams t(DType::F32, 3);
  Optimizer opt(t.list, OptimizerConfig{});
  // Rank r holds rank-specific "sharded" gradients: the global norm sums them all.
  for (model::Parameter* p : t.list) p->partition_dim = 0;
  fill_grads(t.list, w->rank(), 1);
  double expect_sq = 0;
  for (int r = 0; r < w->size(); ++r)
    for (size_t i = 0; i < t.list.size(); ++i)
      for (int64_t k = 0; k < t.list[i]->grad.numel(); ++k)
        expect_sq += double(grad_value(r, i, k, 1)) * grad_value(r, i, k, 1);
  opt.set_grad_stats_group(w.get(), w->rank());
  GradScaler s = GradScaler::constant(1.0);
  EXPECT_NEAR(opt.step(1e-3, 0.0, s).grad_norm, std::sqrt(expect_sq), 1e-6 * std::sqrt(expect_sq));
  // Replicated parameters count on TP rank 0 only.
  for (model::Parameter* p : t.list) p->partition_dim = -1;
  fill_grads(t.list, w->rank(), 1);
  double rank0_sq = 0;
  for (size_t i = 0; i < t.list.size(); ++i)
    for (int64_t k = 0; k < t.list[i]->grad.numel(); ++k)
      rank0_sq += double(grad_value(0, i, k, 1)) * grad_value(0, i, k, 1);
  EXPECT_NEAR(opt.step(1e-3, 0.0, s).grad_norm, std::sqrt(rank0_sq), 1e-6 * std::sqrt(rank0_sq));
  fill_grads(t.list, w->rank(), 1);
  if (w->rank() == 0) t.list[1]->grad.data<float>()[0] = std::nanf("");
  EXPECT_TRUE(opt.step(1e-3, 0.0, s).skipped);
}

}  // namespace
}  // namespace megatron::optim
