// The span-corruption loss of a T5 model over micro-batches of a data split (`megatron evaluate`
// on a pretrain-t5 checkpoint), as pretrain_t5.py's evaluation computes it: each micro-batch's
// loss is the sum of the decoder tokens' cross entropy under loss_mask with the mask's sum as its
// count (LossReduction::sum_and_count), and Megatron's evaluate() divides the sum over every
// micro-batch by the total count. The micro-batches run through the model's own loss (the one
// training's validation runs), so the same samples in the same micro-batches give training's
// validation loss exactly.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "model/t5_model.h"

namespace megatron::inference {

struct T5LossTotals {
  double micro_batches = 0;
  double loss_sum = 0;  // nats, over the loss-masked decoder tokens
  double tokens = 0;    // the loss mask's sum
};

// Runs `count` micro-batches (micro_batch(i) gives the i-th) through the model without dropout
// and sums their losses. `progress` (may be empty) is called before each with its index.
T5LossTotals evaluate_t5_loss(model::T5Model& model, int64_t count,
                              const std::function<model::Batch(int64_t)>& micro_batch,
                              const std::function<void(int64_t)>& progress = {});

// Megatron's evaluation line for `prefix`: "validation loss at PREFIX | lm loss value: ... |
// lm loss PPL: ... |" (training/metrics.h), followed by "tokens: N |".
std::string t5_loss_result_line(const std::string& prefix, const T5LossTotals& t);

}  // namespace megatron::inference
