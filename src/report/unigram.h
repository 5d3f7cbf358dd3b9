// The unigram baseline of a training run: the loss of the best predictor that ignores context,
// i.e. the entropy (in nats, as the lm loss) of the training data's token distribution. A model
// whose loss does not fall below it has learnt nothing beyond token frequencies. Computed from
// Megatron's synthetic documents exactly (--mock-data: document i holds 1, 2, .., L_i - 1 and EOD),
// or from the datasets of the run's --data-path blend (each weighted as the blend weighs it),
// reading evenly spaced documents up to a token budget.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "report/run_record.h"

namespace megatron::report {

struct UnigramBaseline {
  double loss = 0;
  std::string source;  // what it was computed from
};

// From `data_path` (Megatron's "[WEIGHT] PREFIX ..." list) when given, else from the run's
// arguments (data_path, mock_data). nullopt when neither names data that can be read.
std::optional<UnigramBaseline> unigram_baseline(const RunRecord& run,
                                                const std::vector<std::string>& data_path,
                                                int64_t max_tokens = 20000000);

}  // namespace megatron::report
