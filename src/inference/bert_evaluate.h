// Masked-LM evaluation of a BERT model (`megatron evaluate` on a BERT checkpoint): the losses
// pretrain-bert's evaluation logs and the accuracies behind them, over micro-batches of a data
// split. Per micro-batch, as pretrain_bert.py's loss_func:
//   - lm loss: the cross entropy (over the padded vocabulary) of the masked positions, averaged
//     over the loss mask; lm accuracy counts the masked positions whose argmax is the label;
//   - with the binary head, sop loss: the cross entropy of the two sentence-order logits averaged
//     over the sequences whose label is not -1; sop accuracy counts those whose argmax is it.
// The logged losses are the micro-batches' means averaged over the micro-batches (Megatron's
// evaluate(): each micro-batch counts once), the accuracies are over all positions (sequences).
// A micro-batch without masked tokens (labelled sequences) scores zero for that loss, as the
// model's own loss does.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "model/bert_model.h"

namespace megatron::inference {

struct MaskedLMTotals {
  double micro_batches = 0;
  double lm_loss = 0;      // sum over micro-batches of each one's mean masked-LM loss (nats)
  double masked = 0;       // masked positions
  double lm_correct = 0;   // masked positions whose argmax is the label
  double sop_loss = 0;     // sum over micro-batches of each one's mean sentence-order loss
  double sop_labelled = 0; // sequences with a sentence-order label
  double sop_correct = 0;

  MaskedLMTotals& operator+=(const MaskedLMTotals& o);
  // The fields in order (for a sum over ranks), and back.
  std::vector<double> values() const;
  static MaskedLMTotals from_values(std::span<const double> v);
};

// One micro-batch's scores from its LM logits [b, s, V] and, with the binary head, its
// sentence-order logits [b, 2] (undefined without), computed in double precision on the host.
// Reads the batch's labels, loss mask and sentence-order labels.
MaskedLMTotals score_masked_lm(const Tensor& lm_logits, const Tensor& sop_logits,
                               const model::Batch& in);

// Runs a whole BERT model (every rank of its tensor-parallel group calls it alike) over `count`
// micro-batches (micro_batch(i) gives the i-th) and sums their scores. `progress` (may be empty)
// is called before each micro-batch with its index.
MaskedLMTotals evaluate_masked_lm(model::BertModel& model, int64_t count,
                                  const std::function<model::Batch(int64_t)>& micro_batch,
                                  const std::function<void(int64_t)>& progress = {});

// Megatron's evaluation line (training/metrics.h) for `prefix` with the losses of `t`, followed by
// "lm accuracy: ... |" and, with the binary head, "sop accuracy: ... |".
std::string masked_lm_result_line(const std::string& prefix, const MaskedLMTotals& t,
                                  bool binary_head);

}  // namespace megatron::inference
