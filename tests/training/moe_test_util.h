// Helpers of the mixture-of-experts training tests (moe_training_test.cpp,
// moe_parallel_test.cpp): the tiny MoE GPT they train and the comparison of a parallel run's
// loss curve, MoE losses included, with the single-rank run's.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "parallel_test_util.h"

namespace megatron::training::parallel_test {

// The tiny GPT of parallel_test_util.h with 2 layers, the second an MoE layer of 4 SwiGLU
// experts (top-2, a shared expert), no biases, the load-balancing and z losses on.
inline TrainingArgs moe_args(const Fixture& f, int64_t iters = 20) {
  TrainingArgs a = f.args(iters);
  a.model.add_bias_linear = false;
  a.model.activation = "swiglu";
  a.model.ffn_hidden_size = 48;
  a.model.num_moe_experts = 4;
  a.model.moe_layer_freq = "[0,1]";
  a.model.moe_ffn_hidden_size = 24;
  a.model.moe_router_topk = 2;
  a.model.moe_shared_expert_intermediate_size = 16;
  a.model.moe_aux_loss_coeff = 0.01f;
  a.model.moe_z_loss_coeff = 0.001f;
  return a;
}

// The loss curve and the MoE losses of every iteration within 1e-5 of the single-rank run's.
inline void expect_same_moe_curve(const TrainingSummary& p, const TrainingSummary& r,
                                  const std::string& name) {
  expect_same_curve(p, r, 1e-5, name);
  ASSERT_EQ(p.more_losses.size(), r.more_losses.size());
  for (size_t i = 0; i < r.more_losses.size(); ++i) {
    ASSERT_EQ(p.more_losses[i].size(), r.more_losses[i].size()) << name;
    for (size_t k = 0; k < r.more_losses[i].size(); ++k)
      EXPECT_NEAR(p.more_losses[i][k], r.more_losses[i][k], 1e-5 * std::abs(r.more_losses[i][k]))
          << name << " iteration " << i + 1 << " MoE loss " << k;
  }
}

}  // namespace megatron::training::parallel_test
