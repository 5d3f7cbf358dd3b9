// Span-corruption loss of a T5 model over micro-batches (t5_evaluate.h).
#include "inference/t5_evaluate.h"

#include <algorithm>

#include "core/error.h"
#include "training/metrics.h"

namespace megatron::inference {

T5LossTotals evaluate_t5_loss(model::T5Model& model, int64_t count,
                              const std::function<model::Batch(int64_t)>& micro_batch,
                              const std::function<void(int64_t)>& progress) {
  T5LossTotals total;
  model::ChunkForward fwd;
  fwd.training = false;  // no dropout, nothing kept for a backward
  for (int64_t i = 0; i < count; ++i) {
    if (progress) progress(i);
    const model::Batch in = micro_batch(i);
    model::LossResult loss;
    model.forward(i, in, Tensor(), fwd, &loss);
    total.micro_batches += 1;
    total.loss_sum += loss.loss_sum;
    total.tokens += loss.num_tokens;
  }
  return total;
}

std::string t5_loss_result_line(const std::string& prefix, const T5LossTotals& t) {
  return training::format_evaluation_line(prefix, t.loss_sum / std::max(t.tokens, 1.0)) +
         str("tokens: ", int64_t(t.tokens), " |");
}

}  // namespace megatron::inference
