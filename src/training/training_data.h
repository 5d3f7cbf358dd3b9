// The data of a pretraining run as the loop sees it: the train, validation and test splits and
// the micro-batches taken from them, one interface over the families' datasets (GPT's
// data/data_builder.h, BERT's masked samples data/bert_dataset.h, T5's span corruption
// data/t5_dataset.h or its synthetic --mock-data, t5_mock_data.h). A micro-batch is a
// model::Batch with the fields the family's model reads.
#pragma once

#include <array>
#include <cstdint>
#include <memory>

#include "data/t5_dataset.h"
#include "data/tokenizer.h"
#include "model/model_chunk.h"

namespace megatron::training {

struct TrainingArgs;

enum class DataSplit { train = 0, valid = 1, test = 2 };

class TrainingData {
 public:
  virtual ~TrainingData() = default;
  // Samples in a split; 0 when the split is empty.
  virtual int64_t size(DataSplit split) const = 0;
  bool has(DataSplit split) const { return size(split) > 0; }
  // Data-parallel rank dp_rank's micro-batch of the block that starts at sample `first`:
  // samples [first + dp_rank * mbs, first + (dp_rank + 1) * mbs) of the split (Megatron's
  // sampler). An error when the block runs past the end of the split.
  virtual model::Batch micro_batch(DataSplit split, int64_t first, int64_t mbs, int dp_rank,
                                   int dp) const = 0;
};

// Builds the datasets of `args`' model family for num_samples per split (a negative count: one
// epoch), as the family's pretrain_*.py provider; `tokenizer` is the run's. Rank 0 builds and
// caches the indices first (the caller orders the ranks).
std::unique_ptr<TrainingData> build_training_data(const TrainingArgs& args,
                                                  const data::Tokenizer& tokenizer,
                                                  std::array<int64_t, 3> num_samples);

// pretrain_t5.py's T5 dataset config from `args` and the run's tokenizer (an Error when the
// tokenizer is not WordPiece).
data::T5DataConfig t5_data_config(const TrainingArgs& args, const data::Tokenizer& tokenizer);

}  // namespace megatron::training
