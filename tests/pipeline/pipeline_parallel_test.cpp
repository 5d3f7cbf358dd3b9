// Pipeline parallelism by parity with the single-rank model. Tests named Mpi* run as a plain
// process (world of one: only the P = 1 cases) and under mpirun -np 2 / -np 4 (label mpi), where
// every case whose TP x PP divides the world runs (at -np 4 the PP2 cases run as PP2 x DP2).
// Every rank also builds the single-rank GPTModel with the same weights and runs the trainer's
// loop over the same micro-batches; the schedule (no pipelining, 1F1B, interleaved 1F1B) must
// give the same loss on every rank, every parameter gradient (gathered over TP) within 1e-5 of the
// tensor's scale, the tied embedding gradients equal on the first and last stage (bitwise), the
// same grad norm, and, after a few plain SGD steps, the same losses and weights.
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "comm/parallel_state.h"
#include "core/error.h"
#include "pipeline/forward_backward.h"
#include "pipeline_test_util.h"

namespace megatron::pipeline {
namespace {

using model::TransformerConfig;
using model::GPTModel;
using model::StageModel;
using model::Parameter;
using model::testing::rel_diff;

struct Case {
  std::string name;
  int tp = 1, pp = 1, layers = 4, layers_per_virtual_stage = 0, microbatches = 4, cp = 1;
  bool sequence_parallel = false;
  float dropout = 0.0f;
  std::string recompute_method;  // "" or "uniform" / "block" (full recomputation of 1 layer)
  bool grad_ready = false;       // --overlap-grad-reduce's hook (ForwardBackwardOptions::grad_ready)

  explicit Case(std::string n = "") : name(std::move(n)) {}
  Case& TP(int v) { tp = v; return *this; }
  Case& PP(int v) { pp = v; return *this; }
  Case& CP(int v) { cp = v; return *this; }
  Case& L(int v) { layers = v; return *this; }
  Case& layers_per_vstage(int v) { layers_per_virtual_stage = v; return *this; }
  Case& M(int v) { microbatches = v; return *this; }
  Case& SP() { sequence_parallel = true; return *this; }
  Case& drop(float p) { dropout = p; return *this; }
  Case& recompute(const std::string& method) { recompute_method = method; return *this; }
  Case& hook() { grad_ready = true; return *this; }
};

std::shared_ptr<Communicator> world() { return world_communicator(); }

TransformerConfig config_of(const Case& c) {
  TransformerConfig cfg = model::testing::tiny_config();  // h 32, 4 heads, seq 16, vocab 96
  cfg.num_layers = c.layers;
  cfg.sequence_parallel = c.sequence_parallel;
  cfg.hidden_dropout = cfg.attention_dropout = c.dropout;
  if (!c.recompute_method.empty()) {
    cfg.recompute_granularity = "full";
    cfg.recompute_method = c.recompute_method;
    cfg.recompute_num_layers = 1;
  }
  return cfg;
}

void sgd(const model::ParameterList& ps, float lr) {
  for (Parameter* p : ps) {
    float* v = p->value.data<float>();
    const float* g = p->grad.data<float>();
    for (int64_t i = 0; i < p->value.numel(); ++i) v[i] -= lr * g[i];
  }
}

// Runs `iterations` training steps of case `c` on this world (if TP x PP x CP divides it). With
// CP > 1 each rank runs its slice of every micro-batch; losses and gradients are summed over CP.
void check_case(const Case& c, int iterations = 2) {
  auto w = world();
  if (w->size() % (c.tp * c.pp * c.cp) != 0) return;
  SCOPED_TRACE(c.name);
  const ParallelState ps = model::testing::parallel_state(w, c.tp, c.pp, c.cp);
  const TransformerConfig cfg = config_of(c);
  TransformerConfig ref_cfg = cfg;
  ref_cfg.recompute_granularity.clear();
  ref_cfg.recompute_method.clear();
  ref_cfg.recompute_num_layers = 0;
  GPTModel ref(ref_cfg, 42);
  model::testing::randomise(ref, 3);
  StageModel st(cfg, 42, ps, c.layers_per_virtual_stage);
  const int T = c.tp, tp_rank = ps.tp_rank();
  model::testing::load_from(st.parameters(), ref, tp_rank, T);
  ASSERT_EQ(st.pipeline_rank(), ps.pp_rank());
  const ScheduleKind want_kind = c.pp == 1 ? ScheduleKind::NoPipelining
                                 : st.num_chunks() > 1 ? ScheduleKind::Interleaved
                                                       : ScheduleKind::OneFOneB;

  // Every single-rank parameter is held by exactly one stage (per TP rank).
  int held = 0;
  for (Parameter* p : st.parameters()) held += p->shared ? 0 : 1;
  Tensor count = Tensor::full({1}, double(held), DType::F64);
  ps.pp().all_reduce(count);
  EXPECT_EQ(size_t(count.item_as_double(0)), ref.parameters().size());

  for (int it = 0; it < iterations; ++it) {
    SCOPED_TRACE("iteration " + std::to_string(it));
    const auto mbs = model::testing::microbatches(c.microbatches, cfg, 100 + 31 * uint64_t(it));
    const float scale = float(1.0 / model::testing::total_tokens(mbs));
    // Dropout keys numbered as the trainer numbers a DP rank's micro-batches (m * DP + dp_rank),
    // here as for rank 1 of DP 2.
    const uint64_t offset = 1000 + uint64_t(2 * it * c.microbatches) + 1, stride = 2;
    const auto want = model::testing::reference_step(ref, mbs, scale, offset, stride);

    model::testing::zero_grads(st.parameters());
    ForwardBackwardOptions o;
    o.grad_scale = scale;
    o.dropout_offset = offset;
    o.dropout_offset_stride = stride;
    // With the hook: the pass during which each parameter was reported (passes counted by
    // progress) and its gradient then.
    struct Report {
      size_t pass;
      std::vector<float> grad;
    };
    std::map<const Parameter*, Report> reported;
    size_t passes = 0;
    if (c.grad_ready) {
      o.grad_ready = [&](const model::ParameterList& ready) {
        for (const Parameter* p : ready)
          EXPECT_TRUE(reported.emplace(p, Report{passes, p->grad.to_float_vector()}).second)
              << p->name << " reported twice";
      };
      o.progress = [&] { ++passes; };
    }
    std::vector<model::Batch> local;
    for (const auto& in : mbs)
      local.push_back(model::slice_for_context_parallel(in, ps.cp_rank(), ps.cp_size()));
    ForwardBackwardResult res = forward_backward(st, local, o);
    if (c.grad_ready) {
      // Every parameter once, with its final (model-parallel finalised) gradient: nothing added
      // or reduced after the report. Chunk k's during its last backward pass; the tied embedding
      // after the schedule, once summed over the embedding group.
      const Schedule sched = make_schedule(c.pp, ps.pp_rank(), c.microbatches, st.num_chunks());
      EXPECT_EQ(passes, sched.steps.size());
      EXPECT_EQ(reported.size(), st.parameters().size());
      for (int k = 0; k < st.num_chunks(); ++k) {
        size_t last_backward = 0;
        for (size_t i = 0; i < sched.steps.size(); ++i)
          if (sched.steps[i].pass == Pass::Backward && sched.steps[i].chunk == k) last_backward = i;
        for (const Parameter* p : st.chunk(k).parameters()) {
          auto it = reported.find(p);
          ASSERT_NE(it, reported.end()) << p->name << " not reported";
          const bool tied = p == st.shared_embedding();
          EXPECT_EQ(it->second.pass, tied ? sched.steps.size() : last_backward) << p->name;
          EXPECT_EQ(it->second.grad, p->grad.to_float_vector()) << p->name;
        }
      }
    }
    if (c.cp > 1) {  // partial sums over the CP group (the trainer reduces over DP x CP)
      Tensor sums = Tensor::from_vector(std::vector<double>{res.loss_sum, res.num_tokens}, {2});
      ps.cp().all_reduce(sums);
      res.loss_sum = sums.data<double>()[0];
      res.num_tokens = sums.data<double>()[1];
      for (Parameter* p : st.parameters()) ps.cp().all_reduce(p->grad);
    }
    EXPECT_EQ(res.kind, want_kind);
    EXPECT_NEAR(res.loss_sum, want.loss_sum, 1e-5 * want.loss_sum);
    EXPECT_EQ(res.num_tokens, want.tokens);
    const Schedule s = make_schedule(c.pp, ps.pp_rank(), c.microbatches, st.num_chunks());
    EXPECT_LE(res.max_in_flight, s.num_warmup + 1);

    for (Parameter* p : st.parameters()) {
      const Tensor full = model::gather_along(st.tensor_group(), p->grad, p->partition_dim);
      EXPECT_LE(rel_diff(full, want.grads.at(model::testing::reference_name(*p))), 1e-5)
          << p->name;
    }
    // The tied copies hold the same summed gradient, bit for bit.
    if (c.pp > 1 && (st.is_first_stage() || st.is_last_stage())) {
      Parameter* word = st.is_first_stage() ? st.chunk(0).word_embedding()
                                            : st.chunk(st.num_chunks() - 1).word_embedding();
      ASSERT_NE(word, nullptr);
      EXPECT_EQ(word->shared, st.is_last_stage());
      Tensor last = word->grad.clone();
      ps.group(GroupKind::EMBEDDING).broadcast(last, 1);
      EXPECT_EQ(last.to_float_vector(), word->grad.to_float_vector());
    }
    // Grad norm over the model-parallel group: TP duplicates and the tied copy counted once.
    Tensor ss = Tensor::full({1}, model::local_grad_sum_of_squares(st.parameters(), tp_rank),
                             DType::F64);
    ps.mp().all_reduce(ss);
    const double ref_norm = std::sqrt(model::local_grad_sum_of_squares(ref.parameters(), 0));
    EXPECT_NEAR(std::sqrt(ss.item_as_double(0)), ref_norm, 1e-5 * ref_norm);

    sgd(ref.parameters(), 0.5f);
    sgd(st.parameters(), 0.5f);
  }
  // Same weights after the steps (the tied copies stayed equal).
  for (Parameter* p : st.parameters()) {
    const Tensor full = model::gather_along(st.tensor_group(), p->value, p->partition_dim);
    Parameter* r = model::testing::find_param(ref, model::testing::reference_name(*p));
    EXPECT_LE(rel_diff(full, r->value), 1e-5) << p->name;
  }
}

TEST(MpiPipelineParallel, NoPipelining) {
  check_case(Case("PP1").L(3).M(3));
  check_case(Case("PP1 dropout").L(2).M(2).drop(0.1f));
}

TEST(MpiPipelineParallel, OneFOneB) {
  check_case(Case("PP2 M4").PP(2));
  check_case(Case("PP2 M3").PP(2).M(3));
  check_case(Case("PP2 M1 (fewer micro-batches than stages)").PP(2).M(1));
  check_case(Case("PP4 M6").PP(4).M(6));
  check_case(Case("PP4 M2").PP(4).L(8).M(2));
}

TEST(MpiPipelineParallel, Interleaved) {
  check_case(Case("PP2 v2 M4").PP(2).layers_per_vstage(1));
  check_case(Case("PP2 v2 M2 (all warm-up)").PP(2).layers_per_vstage(1).M(2));
  check_case(Case("PP2 v4 M6").PP(2).L(8).layers_per_vstage(1).M(6));
  check_case(Case("PP4 v2 M8").PP(4).L(8).layers_per_vstage(1).M(8));
  check_case(Case("PP4 v2 M4").PP(4).L(8).layers_per_vstage(1));
}

TEST(MpiPipelineParallel, DropoutAndRecompute) {
  check_case(Case("PP2 dropout").PP(2).M(3).drop(0.1f));
  check_case(
      Case("PP2 v2 dropout uniform").PP(2).layers_per_vstage(1).drop(0.1f).recompute("uniform"));
  check_case(Case("PP4 block").PP(4).L(8).M(5).recompute("block"));
}

TEST(MpiPipelineParallel, TensorTimesPipeline) {
  check_case(Case("TP2 x PP2").TP(2).PP(2));
  check_case(Case("TP2 x PP2 SP").TP(2).PP(2).M(3).SP());
  check_case(Case("TP2 x PP2 SP v2").TP(2).PP(2).L(8).layers_per_vstage(2).SP());
  check_case(Case("TP2 x PP2 SP dropout").TP(2).PP(2).M(2).SP().drop(0.1f));
}

// --overlap-grad-reduce's hook: the same gradients, each parameter reported once during its
// chunk's last backward (the tied embedding after the flush) with its final gradient (sequence-
// parallel sums done once, in the hook, not again at the end).
TEST(MpiPipelineParallel, GradReadyHookReportsFinalGradients) {
  check_case(Case("PP2 hook").PP(2).M(3).hook(), 1);
  check_case(Case("PP2 v2 hook").PP(2).layers_per_vstage(1).hook(), 1);
  check_case(Case("TP2 x PP2 SP v2 hook").TP(2).PP(2).L(8).layers_per_vstage(2).SP().hook(), 1);
  check_case(Case("PP4 v2 hook").PP(4).L(8).layers_per_vstage(1).hook(), 1);
}

// Context x pipeline parallelism at the model level (pretrain-gpt: tests/training/pipeline_training_test.cpp).
TEST(MpiPipelineParallel, ContextTimesPipeline) {
  check_case(Case("CP2 x PP2").CP(2).PP(2));
  check_case(Case("CP2 x PP2 v2 dropout").CP(2).PP(2).layers_per_vstage(1).drop(0.1f));
}

// Evaluation through the pipeline: forward only, the loss on every rank, nothing kept.
TEST(MpiPipelineParallel, ForwardOnly) {
  auto w = world();
  for (int pp : {1, 2, 4}) {
    if (w->size() % pp != 0) continue;
    ParallelConfig pc;
    pc.pipeline_model_parallel_size = pp;
    const ParallelState ps = ParallelState::create(w, pc);
    const TransformerConfig cfg = config_of(Case("").L(8));
    GPTModel ref(cfg, 8);
    for (int lpvs : {0, 2}) {
      if (lpvs && pp == 1) continue;
      StageModel st(cfg, 8, ps, lpvs);
      const auto mbs = model::testing::microbatches(4, cfg, 5);
      double want = 0;
      for (const auto& in : mbs) want += ref.forward_loss(in).loss_sum;
      ForwardBackwardOptions o;
      o.forward_only = true;
      const ForwardBackwardResult res = forward_backward(st, mbs, o);
      EXPECT_NEAR(res.loss_sum, want, 1e-5 * want) << "PP" << pp << " lpvs " << lpvs;
      EXPECT_EQ(res.max_in_flight, 0);
      for (Parameter* p : st.parameters())
        for (float g : p->grad.to_float_vector()) ASSERT_EQ(g, 0.0f) << p->name;
    }
  }
}

TEST(MpiPipelineParallel, BadConfigurationsGiveClearErrors) {
  auto w = world();
  auto message = [](auto f) -> std::string {
    try {
      f();
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  for (int pp : {2, 4}) {
    if (w->size() % pp != 0) continue;
    ParallelConfig pc;
    pc.pipeline_model_parallel_size = pp;
    const ParallelState ps = ParallelState::create(w, pc);
    TransformerConfig cfg = config_of(Case("").L(2 * pp + 1));
    EXPECT_NE(message([&] { StageModel st(cfg, 1, ps); })
                  .find("is not divisible by --pipeline-model-parallel-size " + std::to_string(pp)),
              std::string::npos);
    cfg = config_of(Case("").L(4 * pp));
    EXPECT_NE(message([&] { StageModel st(cfg, 1, ps, 3); })
                  .find("not divisible by --num-layers-per-virtual-pipeline-stage 3"),
              std::string::npos);
    // Interleaving needs a multiple of P micro-batches; the error comes before any transfer.
    StageModel st(cfg, 1, ps, 2);
    const auto mbs = model::testing::microbatches(pp + 1, cfg, 1);
    EXPECT_NE(message([&] { forward_backward(st, mbs); })
                  .find("is not divisible by --pipeline-model-parallel-size"),
              std::string::npos);
    EXPECT_THROW(forward_backward_pipelining_without_interleaving(st, mbs), Error);
  }
}

}  // namespace
}  // namespace megatron::pipeline
