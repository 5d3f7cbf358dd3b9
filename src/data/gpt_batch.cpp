// See gpt_batch.h.
#include "data/gpt_batch.h"

#include "core/error.h"

namespace megatron::data {

GPTBatch make_gpt_batch(const std::vector<std::vector<int32_t>>& texts, const GPTBatchOptions& o) {
  MG_REQUIRE(!texts.empty() && texts[0].size() >= 2, "a GPT batch needs at least one sample of 2+ tokens");
  const int64_t b = int64_t(texts.size()), s = int64_t(texts[0].size()) - 1;
  GPTBatch g;
  g.tokens = Tensor::empty({b, s}, DType::I32);
  g.labels = Tensor::empty({b, s}, DType::I32);
  g.loss_mask = Tensor::empty({b, s}, DType::F32);
  g.position_ids = Tensor::empty({b, s}, DType::I32);
  if (o.reset_attention_mask) g.attention_start = Tensor::empty({b, s}, DType::I32);
  for (int64_t r = 0; r < b; ++r) {
    const auto& t = texts[size_t(r)];
    MG_REQUIRE(int64_t(t.size()) == s + 1, "sample ", r, " has ", t.size(), " tokens, expected ", s + 1);
    if (o.vocab_size > 0)
      for (int32_t id : t)
        MG_REQUIRE((id >= 0 && id < o.vocab_size) || id == o.pad_id, "a training sample holds token id ", id,
                   ", outside the tokenizer's vocabulary of ", o.vocab_size,
                   " ids: the dataset was made with another tokenizer (or its .bin is corrupted); "
                   "preprocess it with this run's --tokenizer-type and vocabulary");
    int32_t* tok = g.tokens.data<int32_t>() + r * s;
    int32_t* lab = g.labels.data<int32_t>() + r * s;
    float* mask = g.loss_mask.data<float>() + r * s;
    int32_t* pos = g.position_ids.data<int32_t>() + r * s;
    int32_t* start = o.reset_attention_mask ? g.attention_start.data<int32_t>() + r * s : nullptr;
    int64_t doc_start = 0;  // one past the last EOD input seen before position i
    for (int64_t i = 0; i < s; ++i) {
      int32_t in = t[size_t(i)], out = t[size_t(i + 1)];
      mask[i] = 1.0f;
      if (o.eod_mask_loss && in == o.eod_id) mask[i] = 0.0f;
      if (out == o.pad_id) mask[i] = 0.0f;
      pos[i] = int32_t(o.reset_position_ids ? i - doc_start : i);
      if (start) start[i] = int32_t(doc_start);
      if (in == o.eod_id) doc_start = i + 1;
      tok[i] = in == o.pad_id ? 0 : in;
      lab[i] = out == o.pad_id ? 0 : out;
    }
  }
  return g;
}

GPTBatch make_batch(const SampleDataset& dataset, int64_t consumed, int64_t mbs, int64_t dp_rank, int64_t dp_size,
                    const GPTBatchOptions& o) {
  MG_REQUIRE(mbs > 0 && dp_size > 0 && dp_rank >= 0 && dp_rank < dp_size, "bad micro-batch size ", mbs,
             " or data-parallel rank ", dp_rank, " of ", dp_size);
  MG_REQUIRE(consumed >= 0 && consumed + mbs * dp_size <= dataset.size(), "the dataset has ", dataset.size(),
             " samples; a block of ", mbs * dp_size, " starting at consumed sample ", consumed,
             " runs past its end (request more samples: --train-iters/--train-samples)");
  std::vector<std::vector<int32_t>> texts;
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < mbs; ++i) {
    int64_t k = consumed + dp_rank * mbs + i;
    texts.push_back(dataset.sample(k));
    ids.push_back(k);
  }
  GPTBatch g = make_gpt_batch(texts, o);
  g.sample_ids = std::move(ids);
  return g;
}

PretrainingSampler::PretrainingSampler(const SampleDataset& dataset, int64_t consumed, int64_t mbs, int64_t dp_rank,
                                       int64_t dp_size, GPTBatchOptions options)
    : dataset_(dataset), consumed_(consumed), mbs_(mbs), rank_(dp_rank), dp_(dp_size), options_(options) {
  MG_REQUIRE(consumed >= 0, "consumed samples must be >= 0 (got ", consumed, ")");
  MG_REQUIRE(mbs > 0 && dp_size > 0 && dp_rank >= 0 && dp_rank < dp_size, "bad micro-batch size ", mbs,
             " or data-parallel rank ", dp_rank, " of ", dp_size);
}

bool PretrainingSampler::has_next() const { return consumed_ + mbs_ * dp_ <= dataset_.size(); }

GPTBatch PretrainingSampler::next() {
  GPTBatch g = make_batch(dataset_, consumed_, mbs_, rank_, dp_, options_);
  consumed_ += mbs_ * dp_;
  return g;
}

}  // namespace megatron::data
