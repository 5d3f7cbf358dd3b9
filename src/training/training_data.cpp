// The families' datasets behind one interface (training_data.h).
#include "training/training_data.h"

#include "core/error.h"
#include "data/data_builder.h"
#include "training/trainer.h"

namespace megatron::training {

namespace {

// GPT: Megatron's GPTDataset splits (or a blend of them) and make_batch's micro-batches.
class GPTTrainingData final : public TrainingData {
 public:
  GPTTrainingData(data::GPTDatasets ds, data::GPTBatchOptions options)
      : ds_(std::move(ds)), options_(options) {}

  int64_t size(DataSplit s) const override {
    const data::SampleDataset* d = split(s);
    return d ? d->size() : 0;
  }

  model::Batch micro_batch(DataSplit s, int64_t first, int64_t mbs, int dp_rank,
                           int dp) const override {
    const data::SampleDataset* d = split(s);
    MG_CHECK(d != nullptr, "micro_batch of an empty split");
    const data::GPTBatch b = data::make_batch(*d, first, mbs, dp_rank, dp, options_);
    model::Batch in;
    in.tokens = b.tokens;
    in.position_ids = b.position_ids;
    in.attention_start = b.attention_start;
    in.labels = b.labels;
    in.loss_mask = b.loss_mask;
    return in;
  }

 private:
  const data::SampleDataset* split(DataSplit s) const {
    switch (s) {
      case DataSplit::train: return ds_.train.get();
      case DataSplit::valid: return ds_.valid.get();
      case DataSplit::test: return ds_.test.get();
    }
    return nullptr;
  }
  data::GPTDatasets ds_;
  data::GPTBatchOptions options_;
};

}  // namespace

std::unique_ptr<TrainingData> build_training_data(const TrainingArgs& a, const data::Tokenizer&,
                                                  std::array<int64_t, 3> num_samples) {
  return std::make_unique<GPTTrainingData>(data::build_gpt_datasets(a.data, num_samples),
                                           data::batch_options(a.data));
}

}  // namespace megatron::training
