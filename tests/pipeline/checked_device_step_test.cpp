// Whole training steps with the model on the checking device (memory that host code cannot read
// or write outside ops and explicit copies): the pipeline schedule's forward and backward passes
// over every chunk, the activations and gradients sent between stages, the tensor-, sequence- and
// context-parallel exchanges, the gradient finalisation and the optimizer step. Each layout runs
// the same steps on CPU tensors beside it; losses, token counts, gradient norms and the
// parameters after every step must be equal bit for bit (the same CPU kernels run on both), so a
// host read or write of model memory anywhere in the step fails here instead of passing.
// Mpi* tests: a world of one, and mpirun -np 2 / 4 (label mpi).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "comm/parallel_state.h"
#include "model/stage_model.h"
#include "model/model_test_util.h"
#include "optim/optimizer.h"
#include "pipeline_test_util.h"
#include "pipeline/forward_backward.h"
#include "test_util.h"

namespace megatron::pipeline {
namespace {

using megatron::testing::checked_device;
using model::TransformerConfig;
using model::Batch;
using model::StageModel;
using model::Parameter;

struct Layout {
  std::string name;
  int tp = 1, pp = 1, cp = 1;
  int layers_per_virtual_stage = 0;
  bool sequence_parallel = false;
  std::string cp_comm_type = "p2p";
  bool llama = false;  // RMSNorm, SwiGLU, RoPE, GQA, untied output, no biases
  bool qk_layernorm = false;
  std::string recompute;  // "", "full" (uniform, 1 layer) or "selective"
};

TransformerConfig config_of(const Layout& l) {
  TransformerConfig c = model::testing::tiny_config();
  c.num_layers = 4;
  c.hidden_dropout = 0.1f;
  c.attention_dropout = 0.1f;
  c.sequence_parallel = l.sequence_parallel;
  c.cp_comm_type = l.cp_comm_type;
  if (l.llama) {
    c.normalization = "RMSNorm";
    c.activation = "swiglu";
    c.ffn_hidden_size = 48;
    c.position_embedding_type = "rope";
    c.num_query_groups = 2;
    c.rotary_percent = 0.5f;
    c.untie_embeddings_and_output_weights = true;
    c.add_bias_linear = false;
    c.qk_layernorm = l.qk_layernorm;
  }
  if (l.recompute == "full") {
    c.recompute_granularity = "full";
    c.recompute_method = "uniform";
    c.recompute_num_layers = 1;
  } else if (l.recompute == "selective") {
    c.recompute_granularity = "selective";
  }
  return c;
}

// Every tensor of the micro-batch moved to `d` (an explicit copy).
Batch on(const Batch& in, Device d) {
  auto mv = [&](const Tensor& t) { return t.defined() ? t.to(d) : t; };
  return Batch{mv(in.tokens),    mv(in.position_ids), mv(in.attention_start),
                   mv(in.labels),    mv(in.loss_mask),    mv(in.padding_mask)};
}

// Bit for bit; on a difference, the largest one (fp32) for the message.
void expect_same(const Tensor& got, const Tensor& want, const std::string& what) {
  const Tensor g = got.to(Device::cpu());
  ASSERT_EQ(g.shape(), want.shape()) << what;
  ASSERT_EQ(g.dtype(), want.dtype()) << what;
  if (std::memcmp(g.raw_data(), want.raw_data(), want.nbytes()) == 0) return;
  double worst = 0;
  if (g.dtype() == DType::F32)
    for (int64_t i = 0; i < g.numel(); ++i)
      worst = std::max(worst, double(std::abs(g.data<float>()[i] - want.data<float>()[i])));
  ADD_FAILURE() << what << " differs (largest difference " << worst << ")";
}

void check_layout(const Layout& l) {
  auto w = world_communicator();
  if (w->size() != l.tp * l.pp * l.cp) return;
  SCOPED_TRACE(l.name);
  const ParallelState ps = model::testing::parallel_state(w, l.tp, l.pp, l.cp);
  const TransformerConfig cfg = config_of(l);
  const model::PipelineLayout layout =
      model::PipelineLayout::make(cfg.num_layers, l.pp, l.layers_per_virtual_stage);
  auto make = [&](Device d) {
    return std::make_unique<StageModel>(
        cfg, 42, layout, ps.pp_rank(), ps.group_ptr(GroupKind::TP), ps.group_ptr(GroupKind::PP),
        ps.group_ptr(GroupKind::EMBEDDING), ps.group_ptr(GroupKind::CP), d);
  };
  auto cpu = make(Device::cpu()), dev = make(checked_device());
  const model::ParameterList pc_cpu = cpu->parameters(), pc_dev = dev->parameters();
  ASSERT_EQ(pc_cpu.size(), pc_dev.size());
  for (size_t i = 0; i < pc_dev.size(); ++i) {

    expect_same(pc_dev[i]->value, pc_cpu[i]->value, "initial " + pc_dev[i]->name);
  }
  optim::OptimizerConfig oc;
  oc.clip_grad = 0.5;
  optim::Optimizer opt_cpu(pc_cpu, oc), opt_dev(pc_dev, oc);
  opt_cpu.set_grad_stats_group(&ps.mp(), ps.tp_rank());
  opt_dev.set_grad_stats_group(&ps.mp(), ps.tp_rank());
  optim::GradScaler scale_cpu = optim::GradScaler::constant(1.0), scale_dev = scale_cpu;

  const int M = 4;
  for (int it = 0; it < 2; ++it) {
    SCOPED_TRACE("iteration " + std::to_string(it));
    std::vector<Batch> mb_cpu, mb_dev;
    for (int m = 0; m < M; ++m) {
      const Batch in = model::testing::random_inputs(
          2, cfg.seq_length, cfg.padded_vocab_size, 500 + uint64_t(it * M + m), !l.llama);
      mb_cpu.push_back(model::slice_for_context_parallel(in, ps.cp_rank(), ps.cp_size()));
      mb_dev.push_back(on(mb_cpu.back(), checked_device()));
    }
    ForwardBackwardOptions o;
    o.grad_scale = 1.0f / 100.0f;
    o.dropout_offset = 10 + uint64_t(it * M);
    ForwardBackwardResult r[2];
    int k = 0;
    for (StageModel* st : {cpu.get(), dev.get()}) {
      for (Parameter* p : st->parameters()) p->grad.zero_();
      r[k] = forward_backward(*st, k == 0 ? mb_cpu : mb_dev, o);
      if (l.cp > 1)  // partial sums over the CP group (the trainer reduces over DP x CP)
        for (Parameter* p : st->parameters()) ps.cp().all_reduce(p->grad);
      ++k;
    }
    EXPECT_EQ(r[0].loss_sum, r[1].loss_sum);
    EXPECT_EQ(r[0].num_tokens, r[1].num_tokens);
    EXPECT_GT(r[0].num_tokens, 0.0);
    for (size_t i = 0; i < pc_dev.size(); ++i)
      expect_same(pc_dev[i]->grad, pc_cpu[i]->grad, "gradient of " + pc_dev[i]->name);
    const optim::StepResult s_cpu = opt_cpu.step(1e-2, 0.1, scale_cpu);
    const optim::StepResult s_dev = opt_dev.step(1e-2, 0.1, scale_dev);
    EXPECT_EQ(s_cpu.grad_norm, s_dev.grad_norm);
    EXPECT_GT(s_cpu.grad_norm, 0.0);
    if (layout.pipeline_size > 1) {
      cpu->sync_shared_embedding();
      dev->sync_shared_embedding();
    }
    for (size_t i = 0; i < pc_dev.size(); ++i)
      expect_same(pc_dev[i]->value, pc_cpu[i]->value, "parameter " + pc_dev[i]->name);
  }
}

// A layout named `name` of TP x PP x CP ranks, adjusted by `set`.
template <class F>
Layout layout(std::string name, int tp, int pp, int cp, F set) {
  Layout l;
  l.name = std::move(name);
  l.tp = tp;
  l.pp = pp;
  l.cp = cp;
  set(l);
  return l;
}
void as_is(Layout&) {}

TEST(MpiCheckedStep, OneRank) {
  check_layout(layout("GPT-2, dropout, document resets", 1, 1, 1, as_is));
  check_layout(layout("Llama-style, qk-layernorm, full recompute", 1, 1, 1, [](Layout& l) {
    l.llama = true;
    l.qk_layernorm = true;
    l.recompute = "full";
  }));
  check_layout(layout("GPT-2, selective recompute", 1, 1, 1, [](Layout& l) { l.recompute = "selective"; }));
}

TEST(MpiCheckedStep, TwoRanks) {
  check_layout(layout("PP2 1F1B", 1, 2, 1, as_is));
  check_layout(layout("PP2 interleaved, Llama-style", 1, 2, 1, [](Layout& l) {
    l.layers_per_virtual_stage = 1;
    l.llama = true;
  }));
  check_layout(layout("TP2 + SP, Llama-style", 2, 1, 1, [](Layout& l) {
    l.sequence_parallel = true;
    l.llama = true;
  }));
  check_layout(layout("CP2 ring, Llama-style", 1, 1, 2, [](Layout& l) { l.llama = true; }));
  check_layout(layout("CP2 all-gather", 1, 1, 2, [](Layout& l) { l.cp_comm_type = "allgather"; }));
}

TEST(MpiCheckedStep, FourRanks) {
  check_layout(layout("TP2 + SP x PP2", 2, 2, 1, [](Layout& l) { l.sequence_parallel = true; }));
  check_layout(layout("PP2 x CP2, Llama-style", 1, 2, 2, [](Layout& l) { l.llama = true; }));
}

// Inputs left on the host for a model on the device are a clear error, not a host access.
TEST(MpiCheckedStep, InputsOnAnotherDeviceAreAClearError) {
  if (world_communicator()->size() != 1) GTEST_SKIP() << "runs on one rank";
  const TransformerConfig cfg = config_of(Layout{});
  model::ModelOptions opt;
  opt.device = checked_device();
  model::GPTModel m(cfg, 1, model::TensorParallel::none(), model::ContextParallel::none(),
                    model::ChunkPlace{model::PipelineLayout{cfg.num_layers, 1, 1}, 0, 0}, opt);
  const Batch in = model::testing::random_inputs(1, 8, cfg.padded_vocab_size, 3, false);
  try {
    m.forward_backward(in, 1.0f, 0);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("must be on its device"), std::string::npos) << e.what();
  }
  // A token outside the vocabulary is found through an op and reported with its position.
  Batch bad = in;
  Tensor t = in.tokens.clone();
  t.data<int32_t>()[5] = int32_t(cfg.padded_vocab_size) + 3;
  bad.tokens = t;
  try {
    m.forward_backward(on(bad, checked_device()), 1.0f, 0);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("token id 99 at position 5"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace megatron::pipeline
