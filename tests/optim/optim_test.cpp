// Optimizer tests: LR schedule values computed by hand from Megatron's formulas, the dynamic loss
// scaler's growth/backoff/hysteresis sequence, clipping, skip on inf/NaN, bf16 main params, and
// AdamW / SGD against torch.optim on the same deterministic problem.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <sstream>

#include "core/error.h"
#include "optim/grad_scaler.h"
#include "optim/lr_scheduler.h"
#include "optim/optimizer.h"
#include "test_util.h"

namespace megatron::optim {
namespace {

LRSchedulerConfig base_cfg(LRDecayStyle style) {
  LRSchedulerConfig c;
  c.max_lr = 1e-3;
  c.min_lr = 1e-4;
  c.lr_warmup_init = 1e-5;
  c.lr_warmup_steps = 80;
  c.lr_decay_steps = 800;
  c.decay_style = style;
  return c;
}

double lr_at(LRScheduler s, int64_t k) {
  s.set_num_steps(k);
  return s.lr();
}

TEST(LRScheduler, WarmupIsLinearFromInit) {
  LRScheduler s(base_cfg(LRDecayStyle::Cosine));
  EXPECT_DOUBLE_EQ(lr_at(s, 0), 1e-5);
  EXPECT_DOUBLE_EQ(lr_at(s, 40), 1e-5 + (1e-3 - 1e-5) * 0.5);
  EXPECT_DOUBLE_EQ(lr_at(s, 80), 1e-3);
}

TEST(LRScheduler, DecayStyles) {
  // r = (k - 80) / 720; at k = 440, r = 0.5.
  EXPECT_NEAR(lr_at(LRScheduler(base_cfg(LRDecayStyle::Linear)), 440), 1e-4 + 0.5 * 9e-4, 1e-15);
  EXPECT_NEAR(lr_at(LRScheduler(base_cfg(LRDecayStyle::Cosine)), 440), 1e-4 + 0.5 * 9e-4, 1e-15);
  // cosine at r = 0.25: c = (cos(pi/4) + 1) / 2
  EXPECT_NEAR(lr_at(LRScheduler(base_cfg(LRDecayStyle::Cosine)), 260),
              1e-4 + 0.5 * (std::sqrt(0.5) + 1) * 9e-4, 1e-15);
  EXPECT_DOUBLE_EQ(lr_at(LRScheduler(base_cfg(LRDecayStyle::Constant)), 5000), 1e-3);
  EXPECT_DOUBLE_EQ(lr_at(LRScheduler(base_cfg(LRDecayStyle::Linear)), 801), 1e-4);
  EXPECT_DOUBLE_EQ(lr_at(LRScheduler(base_cfg(LRDecayStyle::Linear)), 800), 1e-4);
  // inverse-square-root: max * sqrt(80) / sqrt(320) = max / 2
  EXPECT_NEAR(lr_at(LRScheduler(base_cfg(LRDecayStyle::InverseSquareRoot)), 320), 5e-4, 1e-15);
  EXPECT_DOUBLE_EQ(lr_at(LRScheduler(base_cfg(LRDecayStyle::InverseSquareRoot)), 80000), 1e-4);
}

// --decoupled-lr: the same warmup (from the shared lr_warmup_init) and decay, between the
// decoupled bounds; the main LR is unchanged (Megatron's get_lr(param_group)).
TEST(LRScheduler, DecoupledGroupFollowsTheSameScheduleBetweenItsOwnBounds) {
  LRSchedulerConfig c = base_cfg(LRDecayStyle::Linear);
  c.decoupled_max_lr = 5e-3;
  c.decoupled_min_lr = 2e-4;
  LRScheduler s(c);
  auto dec_at = [&](int64_t k) {
    s.set_num_steps(k);
    return s.decoupled_lr();
  };
  EXPECT_DOUBLE_EQ(dec_at(0), 1e-5);                               // warmup starts at the init
  EXPECT_DOUBLE_EQ(dec_at(40), 1e-5 + (5e-3 - 1e-5) * 0.5);
  EXPECT_DOUBLE_EQ(dec_at(80), 5e-3);
  EXPECT_NEAR(dec_at(440), 2e-4 + 0.5 * (5e-3 - 2e-4), 1e-15);    // r = 0.5
  EXPECT_DOUBLE_EQ(dec_at(801), 2e-4);
  EXPECT_NEAR(lr_at(s, 440), 1e-4 + 0.5 * 9e-4, 1e-15);             // the main group's
  c.decoupled_min_lr = 6e-3;
  EXPECT_THROW(LRScheduler{c}, Error);
}

TEST(LRScheduler, WSD) {
  LRSchedulerConfig c = base_cfg(LRDecayStyle::WSD);
  c.wsd_decay_steps = 200;  // anneal from 600 to 800
  EXPECT_DOUBLE_EQ(lr_at(LRScheduler(c), 600), 1e-3);
  // q = 0.5: exponential c = 2 * 0.5^0.5 - 1
  EXPECT_NEAR(lr_at(LRScheduler(c), 700), 1e-4 + (2 * std::sqrt(0.5) - 1) * 9e-4, 1e-15);
  c.wsd_decay_style = WSDDecayStyle::MinusSqrt;
  EXPECT_NEAR(lr_at(LRScheduler(c), 750), 1e-4 + (1 - std::sqrt(0.75)) * 9e-4, 1e-15);
  c.wsd_decay_style = WSDDecayStyle::Linear;
  EXPECT_NEAR(lr_at(LRScheduler(c), 650), 1e-4 + 0.75 * 9e-4, 1e-15);
}

TEST(LRScheduler, StepsCountSamplesAndWeightDecayIncrements) {
  LRSchedulerConfig c = base_cfg(LRDecayStyle::Linear);
  c.start_wd = 0.0;
  c.end_wd = 0.1;
  c.wd_incr_steps = 800;
  c.wd_incr_style = WDIncrStyle::Linear;
  LRScheduler s(c);
  for (int i = 0; i < 5; ++i) s.step(8);
  EXPECT_EQ(s.num_steps(), 40);
  EXPECT_NEAR(s.weight_decay(), 0.1 * 40 / 800, 1e-15);
  c.wd_incr_style = WDIncrStyle::Cosine;
  LRScheduler s2(c);
  s2.set_num_steps(400);
  EXPECT_NEAR(s2.weight_decay(), 0.05, 1e-15);
}

TEST(LRScheduler, Errors) {
  LRSchedulerConfig c = base_cfg(LRDecayStyle::Linear);
  c.min_lr = 2e-3;
  EXPECT_THROW(LRScheduler{c}, Error);
  c = base_cfg(LRDecayStyle::Linear);
  c.lr_warmup_steps = 800;
  EXPECT_THROW(LRScheduler{c}, Error);
  c = base_cfg(LRDecayStyle::WSD);
  EXPECT_THROW(LRScheduler{c}, Error);  // no WSD anneal length
  EXPECT_THROW(parse_lr_decay_style("cosin"), Error);
  EXPECT_EQ(parse_lr_decay_style("inverse-square-root"), LRDecayStyle::InverseSquareRoot);
  EXPECT_THROW(parse_optimizer_type("adamw"), Error);
}

TEST(GradScaler, HysteresisBackoffAndGrowth) {
  GradScaler g = GradScaler::dynamic(1024.0, 1.0, /*window=*/3, /*hysteresis=*/2);
  g.update(true);  // hysteresis 2 -> 1: scale kept
  EXPECT_EQ(g.scale(), 1024.0);
  g.update(false);  // a clean step does not restore hysteresis
  g.update(true);   // hysteresis 1 -> 0: halve
  EXPECT_EQ(g.scale(), 512.0);
  g.update(true);  // exhausted: halve again
  EXPECT_EQ(g.scale(), 256.0);
  EXPECT_EQ(g.state().hysteresis_tracker, -1);
  g.update(false);
  g.update(false);
  EXPECT_EQ(g.scale(), 256.0);
  g.update(false);  // third clean step in a row: double, restore hysteresis
  EXPECT_EQ(g.scale(), 512.0);
  EXPECT_EQ(g.state().hysteresis_tracker, 2);
  EXPECT_EQ(g.state().growth_tracker, 0);
  GradScaler m = GradScaler::dynamic(2.0, 1.0, 1000, 1);
  m.update(true);
  m.update(true);
  EXPECT_EQ(m.scale(), 1.0);  // not below min
  GradScaler c = GradScaler::constant(128.0);
  c.update(true);
  EXPECT_EQ(c.scale(), 128.0);
  EXPECT_THROW(GradScaler::dynamic(1.0, 2.0, 10, 2), Error);
}

struct TwoParams {
  model::Parameter a, b;
  model::ParameterList list() { return {&a, &b}; }
  TwoParams(DType dtype) {
    std::vector<float> va(7), vb(5);
    for (int i = 0; i < 7; ++i) va[i] = float(std::sin(i));
    for (int i = 0; i < 5; ++i) vb[i] = float(std::sin(i + 7));
    a.name = "a";
    a.value = Tensor::from_vector(va, {7}).to(dtype);
    a.grad = Tensor::zeros({7}, DType::F32);
    b.name = "b";
    b.value = Tensor::from_vector(vb, {5}).to(dtype);
    b.grad = Tensor::zeros({5}, DType::F32);
    b.weight_decay = false;
  }
  void set_grads(int t, float scale) {
    for (int i = 0; i < 7; ++i) a.grad.data<float>()[i] = scale * float(0.1 * std::cos(0.37 * i * t + 1));
    for (int i = 0; i < 5; ++i)
      b.grad.data<float>()[i] = scale * float(0.1 * std::cos(0.37 * (i + 7) * t + 1));
  }
};

std::vector<double> torch_reference(const std::string& kind, int steps) {
  auto r = testing::run_command("/usr/bin/python3 " +
                                (testing::source_dir() / "tests/optim/adamw_reference.py").string() +
                                " " + kind + " " + std::to_string(steps));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  std::istringstream in(r.output);
  std::vector<double> v;
  double x;
  while (in >> x) v.push_back(x);
  return v;
}

void run_against_torch(OptimizerType type, const std::string& kind) {
  TwoParams p(DType::F32);
  OptimizerConfig cfg;
  cfg.type = type;
  cfg.adam_beta2 = 0.95;
  cfg.clip_grad = 0.0;
  Optimizer opt(p.list(), cfg);
  GradScaler scaler = GradScaler::dynamic(65536.0, 1.0, 1000, 2);
  for (int t = 1; t <= 5; ++t) {
    opt.zero_grad();
    p.set_grads(t, float(scaler.scale()));  // backward of scale * loss
    StepResult r = opt.step(0.01, 0.1, scaler);
    ASSERT_FALSE(r.skipped);
  }
  std::vector<double> ref = torch_reference(kind, 5);
  ASSERT_EQ(ref.size(), 12u);
  for (int i = 0; i < 7; ++i) EXPECT_NEAR(p.a.value.data<float>()[i], ref[i], 2e-6) << i;
  for (int i = 0; i < 5; ++i) EXPECT_NEAR(p.b.value.data<float>()[i], ref[7 + i], 2e-6) << i;
}

TEST(Optimizer, AdamWMatchesTorch) { run_against_torch(OptimizerType::Adam, "adam"); }

TEST(Optimizer, SGDMatchesTorch) {
  // torch's SGD couples weight decay into the gradient; Megatron passes weight_decay to it.
  run_against_torch(OptimizerType::SGD, "sgd");
}

TEST(Optimizer, ClipsByGlobalNorm) {
  TwoParams p(DType::F32);
  OptimizerConfig cfg;
  cfg.type = OptimizerType::SGD;
  cfg.sgd_momentum = 0.0;
  cfg.clip_grad = 0.05;
  Optimizer opt(p.list(), cfg);
  p.set_grads(1, 1.0f);
  double sq = 0;
  std::vector<float> g0;
  for (int i = 0; i < 7; ++i) g0.push_back(p.a.grad.data<float>()[i]);
  for (int i = 0; i < 7; ++i) sq += double(p.a.grad.data<float>()[i]) * p.a.grad.data<float>()[i];
  for (int i = 0; i < 5; ++i) sq += double(p.b.grad.data<float>()[i]) * p.b.grad.data<float>()[i];
  const double norm = std::sqrt(sq);
  ASSERT_GT(norm, 0.05);
  const float a0 = p.a.value.data<float>()[3];
  GradScaler one = GradScaler::constant(1.0);
  StepResult r = opt.step(1.0, 0.0, one);
  EXPECT_NEAR(r.grad_norm, norm, 1e-7);
  const double coeff = 0.05 / (norm + 1e-6);
  EXPECT_NEAR(p.a.value.data<float>()[3], a0 - coeff * g0[3], 1e-6);
}

TEST(Optimizer, SkipsStepOnInfAndBacksOffScale) {
  TwoParams p(DType::F32);
  Optimizer opt(p.list(), OptimizerConfig{});
  GradScaler scaler = GradScaler::dynamic(1024.0, 1.0, 1000, 1);
  p.set_grads(1, 1.0f);
  p.b.grad.data<float>()[2] = std::numeric_limits<float>::infinity();
  const float before = p.a.value.data<float>()[1];
  StepResult r = opt.step(0.1, 0.0, scaler);
  EXPECT_TRUE(r.skipped);
  EXPECT_EQ(p.a.value.data<float>()[1], before);
  EXPECT_EQ(scaler.scale(), 512.0);
  EXPECT_EQ(opt.step_count(), 0);
  p.set_grads(1, 1.0f);
  p.a.grad.data<float>()[0] = std::nanf("");
  EXPECT_TRUE(opt.step(0.1, 0.0, scaler).skipped);
}

TEST(Optimizer, Bf16ParamsKeepFp32MainCopy) {
  TwoParams p(DType::BF16);
  TwoParams ref(DType::F32);
  // Start the fp32 reference from the same (bf16-rounded) values.
  ref.a.value.copy_(p.a.value);
  ref.b.value.copy_(p.b.value);
  OptimizerConfig cfg;
  cfg.clip_grad = 0.0;
  Optimizer opt(p.list(), cfg), opt_ref(ref.list(), cfg);
  GradScaler one = GradScaler::constant(1.0);
  for (int t = 1; t <= 3; ++t) {
    p.set_grads(t, 1.0f);
    ref.set_grads(t, 1.0f);
    opt.step(1e-3, 0.1, one);
    opt_ref.step(1e-3, 0.1, one);
  }
  // Main params follow the fp32 run exactly (tiny updates would be lost in bf16 alone).
  for (int i = 0; i < 7; ++i) {
    EXPECT_FLOAT_EQ(opt.state()[0].main.data<float>()[i], ref.a.value.data<float>()[i]);
    EXPECT_EQ(p.a.value.item_as_double(i),
              Tensor::from_vector(std::vector<float>{ref.a.value.data<float>()[i]}, {1})
                  .to(DType::BF16)
                  .item_as_double(0));
  }
}

}  // namespace
}  // namespace megatron::optim
