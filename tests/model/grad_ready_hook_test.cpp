// GPTModel's grad-ready hook (what --overlap-grad-reduce starts bucket reductions from): every
// parameter is reported exactly once per forward_backward, in backward order (final LayerNorm,
// layers from the last, embedding), and its gradient is already final when reported, with and
// without full recomputation.
#include <gtest/gtest.h>

#include <map>

#include "model/gpt_model.h"
#include "model_test_util.h"

namespace megatron::model {
namespace {

void check_hook(TransformerConfig cfg) {
  GPTModel m(cfg, 3);
  testing::randomise(m, 4);
  const Batch in = testing::random_inputs(2, cfg.seq_length, cfg.padded_vocab_size, 5, true);
  // Accumulate onto a non-zero gradient, as the last micro-batch of a step does.
  m.forward_backward(in, 0.5f, 1);
  std::map<const Parameter*, std::vector<float>> at_report;
  std::vector<std::string> order;
  m.set_grad_ready_hook([&](const ParameterList& ready) {
    ASSERT_FALSE(ready.empty());
    for (const Parameter* p : ready) {
      EXPECT_TRUE(at_report.emplace(p, p->grad.to_float_vector()).second) << p->name << " twice";
      order.push_back(p->name);
    }
  });
  m.forward_backward(in, 0.5f, 2);
  const ParameterList ps = m.parameters();
  ASSERT_EQ(at_report.size(), ps.size());
  for (const Parameter* p : ps) EXPECT_EQ(at_report.at(p), p->grad.to_float_vector()) << p->name;
  EXPECT_EQ(order.front(), "decoder.final_layernorm.weight");
  EXPECT_EQ(order.back(), "embedding.position_embeddings.weight");
  EXPECT_EQ(order[2].rfind("decoder.layers." + std::to_string(cfg.num_layers - 1) + ".", 0), 0u)
      << order[2];
  // Cleared: no more reports.
  m.set_grad_ready_hook({});
  at_report.clear();
  m.forward_backward(in, 0.5f, 3);
  EXPECT_TRUE(at_report.empty());
}

TEST(GradReadyHook, ReportsEveryParameterOnceWithItsFinalGradient) {
  check_hook(testing::tiny_config());
  TransformerConfig full = testing::tiny_config();
  full.num_layers = 3;
  full.recompute_granularity = "full";
  full.recompute_method = "uniform";
  full.recompute_num_layers = 2;
  check_hook(full);
}

}  // namespace
}  // namespace megatron::model
