// The families' datasets behind one interface (training_data.h).
#include "training/training_data.h"

#include <vector>

#include "core/error.h"
#include "data/bert_dataset.h"
#include "data/data_builder.h"
#include "data/t5_dataset.h"
#include "training/t5_mock_data.h"
#include "training/trainer.h"

namespace megatron::training {

namespace {

// A split of a family's datasets struct (train, valid, test; null when empty).
template <class Datasets>
auto* split_of(const Datasets& ds, DataSplit s) {
  switch (s) {
    case DataSplit::train: return ds.train.get();
    case DataSplit::valid: return ds.valid.get();
    case DataSplit::test: return ds.test.get();
  }
  return decltype(ds.train.get())(nullptr);
}

// The sample ids of data-parallel rank dp_rank's micro-batch of the block at `first` (Megatron's
// sampler) in a split of `size` samples; an Error when the block runs past its end.
std::vector<int64_t> micro_batch_ids(int64_t first, int64_t mbs, int dp_rank, int dp, int64_t size) {
  const int64_t lo = first + int64_t(dp_rank) * mbs;
  MG_REQUIRE(first >= 0 && lo + mbs <= size, "samples [", first, ", ", first + mbs * dp,
             ") run past the end of the split's ", size, " samples");
  std::vector<int64_t> ids;
  for (int64_t k = 0; k < mbs; ++k) ids.push_back(lo + k);
  return ids;
}

// GPT: Megatron's GPTDataset splits (or a blend of them) and make_batch's micro-batches.
class GPTTrainingData final : public TrainingData {
 public:
  GPTTrainingData(data::GPTDatasets ds, data::GPTBatchOptions options)
      : ds_(std::move(ds)), options_(options) {}

  int64_t size(DataSplit s) const override {
    const data::SampleDataset* d = split_of(ds_, s);
    return d ? d->size() : 0;
  }

  model::Batch micro_batch(DataSplit s, int64_t first, int64_t mbs, int dp_rank,
                           int dp) const override {
    const data::SampleDataset* d = split_of(ds_, s);
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
  data::GPTDatasets ds_;
  data::GPTBatchOptions options_;
};

// BERT: Megatron's BERTMaskedWordPieceDataset splits and pretrain_bert.py's get_batch. Labels of
// unmasked positions (-1) become 0: the loss mask excludes them, and the cross entropy needs ids
// in the vocabulary. Token types and sentence-order labels only with the binary head (as
// forward_step passes types=None without it).
class BertTrainingData final : public TrainingData {
 public:
  BertTrainingData(data::BertDatasets ds, bool binary_head)
      : ds_(std::move(ds)), binary_head_(binary_head) {}

  int64_t size(DataSplit s) const override {
    const data::BertSampleSource* d = split_of(ds_, s);
    return d ? d->size() : 0;
  }

  model::Batch micro_batch(DataSplit s, int64_t first, int64_t mbs, int dp_rank,
                           int dp) const override {
    const data::BertSampleSource* d = split_of(ds_, s);
    MG_CHECK(d != nullptr, "micro_batch of an empty split");
    const std::vector<int64_t> ids = micro_batch_ids(first, mbs, dp_rank, dp, d->size());
    data::BertBatch b = data::make_bert_batch(*d, ids);
    const int64_t n = b.labels.numel(), seq = b.tokens.size(1);
    int32_t* labels = b.labels.data<int32_t>();
    for (int64_t i = 0; i < n; ++i) labels[i] = labels[i] < 0 ? 0 : labels[i];
    std::vector<int32_t> pos(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) pos[size_t(i)] = int32_t(i % seq);
    model::Batch in;
    in.tokens = b.tokens;
    in.position_ids = Tensor::from_vector(pos, b.tokens.shape());
    in.labels = b.labels;
    in.loss_mask = b.loss_mask;
    in.padding_mask = b.padding_mask;
    if (binary_head_) {
      in.token_types = b.types;
      in.sequence_labels = b.is_random;
    }
    return in;
  }

 private:
  data::BertDatasets ds_;
  bool binary_head_;
};

// T5: Megatron's T5MaskedWordPieceDataset splits and pretrain_t5.py's get_batch: the encoder's
// and decoder's tokens, labels (-1 on padding, outside the loss mask) and the encoder's padding
// mask (1 = token) that its self-attention and the cross-attention take as key padding; the
// decoder's self-attention is causal (dec_mask is not needed).
class T5TrainingData final : public TrainingData {
 public:
  explicit T5TrainingData(data::T5Datasets ds) : ds_(std::move(ds)) {}

  int64_t size(DataSplit s) const override {
    const data::T5SampleSource* d = split_of(ds_, s);
    return d ? d->size() : 0;
  }

  model::Batch micro_batch(DataSplit s, int64_t first, int64_t mbs, int dp_rank,
                           int dp) const override {
    const data::T5SampleSource* d = split_of(ds_, s);
    MG_CHECK(d != nullptr, "micro_batch of an empty split");
    const std::vector<int64_t> ids = micro_batch_ids(first, mbs, dp_rank, dp, d->size());
    const data::T5Batch b = data::make_t5_batch(*d, ids);
    model::Batch in;
    in.encoder_tokens = b.tokens_enc;
    in.encoder_padding_mask = b.enc_mask;
    in.tokens = b.tokens_dec;
    in.labels = b.labels;
    in.loss_mask = b.loss_mask;
    return in;
  }

 private:
  data::T5Datasets ds_;
};

// The data flags BERT and T5 share (MaskedDataConfig).
void fill_masked_data_config(const TrainingArgs& a, const data::Tokenizer& tokenizer,
                             data::MaskedDataConfig& c) {
  c.data_path = a.data.data_path;
  c.train_data_path = a.data.train_data_path;
  c.valid_data_path = a.data.valid_data_path;
  c.test_data_path = a.data.test_data_path;
  c.split = a.data.split;
  c.seed = uint32_t(a.seed);
  c.data_cache_path = a.data.data_cache_path;
  c.tokenizer = tokenizer.type();
  c.mid_level_dataset_surplus = a.data.mid_level_dataset_surplus;
  c.mask_prob = a.mask_prob;
  c.short_seq_prob = a.short_seq_prob;
  c.vocab = std::make_shared<const data::WordPieceVocab>(data::wordpiece_vocab(tokenizer));
}

data::BertDataConfig bert_data_config(const TrainingArgs& a, const data::Tokenizer& tokenizer) {
  data::BertDataConfig c;
  fill_masked_data_config(a, tokenizer, c);
  c.seq_length = a.model.seq_length;
  c.binary_head = a.model.bert_binary_head;
  return c;
}

}  // namespace

data::T5DataConfig t5_data_config(const TrainingArgs& a, const data::Tokenizer& tokenizer) {
  data::T5DataConfig c;
  fill_masked_data_config(a, tokenizer, c);
  c.encoder_seq_length = a.model.seq_length;
  c.decoder_seq_length = a.model.decoder_seq_length;
  return c;
}

std::unique_ptr<TrainingData> build_training_data(const TrainingArgs& a,
                                                  const data::Tokenizer& tokenizer,
                                                  std::array<int64_t, 3> num_samples) {
  if (a.model.family_id() == model::ModelFamilyId::t5) {
    if (a.mock_data) return build_t5_mock_data(t5_mock_config(a, tokenizer), num_samples);
    return std::make_unique<T5TrainingData>(
        data::build_t5_datasets(t5_data_config(a, tokenizer), num_samples));
  }
  if (a.model.family_id() == model::ModelFamilyId::bert)
    return std::make_unique<BertTrainingData>(
        data::build_bert_datasets(bert_data_config(a, tokenizer), num_samples),
        a.model.bert_binary_head);
  return std::make_unique<GPTTrainingData>(data::build_gpt_datasets(a.data, num_samples),
                                           data::batch_options(a.data));
}

}  // namespace megatron::training
