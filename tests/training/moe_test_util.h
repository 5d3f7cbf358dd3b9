// Helpers of the mixture-of-experts training tests (moe_training_test.cpp,
// moe_parallel_test.cpp): the tiny MoE GPT they train and the comparison of a parallel run's
// loss curve, MoE losses included, with the single-rank run's.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <sstream>
#include <string>
#include <vector>

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

// The architecture of tests/reference/write_torch_dist_moe.py's "moe" model (4 layers, all MoE:
// 4 SwiGLU experts of width 16, top-2; RMSNorm, GQA, rope, untied) at expert-parallel size ep.
inline TrainingArgs torch_dist_moe_fixture_args(const Fixture& f, int64_t iters, int ep) {
  TrainingArgs a = f.args(iters);
  a.model.num_layers = 4;
  a.model.num_query_groups = 2;
  a.model.max_position_embeddings = 32;
  a.model.ffn_hidden_size = 48;
  a.model.activation = "swiglu";
  a.model.normalization = "RMSNorm";
  a.model.position_embedding_type = "rope";
  a.model.add_bias_linear = false;
  a.model.untie_embeddings_and_output_weights = true;
  a.model.num_moe_experts = 4;
  a.model.moe_ffn_hidden_size = 16;
  a.model.moe_router_topk = 2;
  a.model.moe_aux_loss_coeff = 0.01f;  // the checkpoint's MoE flags
  a.model.moe_token_dispatcher_type = "alltoall";
  a.model.moe_router_load_balancing_type = "aux_loss";
  a.parallel.expert_model_parallel_size = ep;
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

// `megatron pretrain-gpt` on the Fixture's corpus with the flags of moe_args' shape (2 layers,
// 4 SwiGLU experts of width 24, top-2, the load-balancing and z losses), logging every iteration;
// the caller adds --moe-layer-freq and what its run varies.
inline std::string moe_cli_command(const Fixture& f, int iters) {
  return "pretrain-gpt --num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 16 "
         "--max-position-embeddings 16 --micro-batch-size 2 --global-batch-size 8 --train-iters " +
         std::to_string(iters) + " --lr 3e-3 --tokenizer-type NullTokenizer --vocab-size 64 "
         "--make-vocab-size-divisible-by 16 --hidden-dropout 0 --attention-dropout 0 --data-path " +
         f.prefix + " --data-cache-path " + (f.dir / "cache") + " --split 90,10,0 "
         "--eval-interval 1000 --eval-iters 1 --log-interval 1 --disable-bias-linear --swiglu "
         "--ffn-hidden-size 48 --num-experts 4 --moe-ffn-hidden-size 24 --moe-router-topk 2 "
         "--moe-aux-loss-coeff 0.01 --moe-z-loss-coeff 0.001 ";
}

// The records of a --log-metrics-jsonl file, one per line.
inline std::vector<json> metrics_lines(const std::string& path) {
  std::vector<json> out;
  std::istringstream in(testing::read_file(path));
  for (std::string line; std::getline(in, line);) out.push_back(json::parse(line));
  return out;
}

}  // namespace megatron::training::parallel_test
