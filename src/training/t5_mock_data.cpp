// Synthetic T5 span-corruption samples for --mock-data (see t5_mock_data.h).
#include "training/t5_mock_data.h"

#include <algorithm>
#include <vector>

#include "core/error.h"
#include "core/rng.h"
#include "training/trainer.h"

namespace megatron::training {

namespace {

// One sample's five rows, unpadded.
struct MockSample {
  std::vector<int32_t> enc, dec, labels;
};

MockSample make_sample(const T5MockConfig& c, uint64_t stream) {
  const Philox rng(c.seed, stream);
  uint64_t k = 0;
  const int64_t first_id = 1000 < c.vocab_size - c.vocab_extra_ids ? 1000 : 1;  // past specials
  const int64_t span = std::max<int64_t>(1, c.vocab_size - c.vocab_extra_ids - first_id);
  const int64_t start = int64_t(rng.u32(k++) % uint32_t(span));
  const int64_t step = 1 + int64_t(rng.u32(k++) % 3u);
  MockSample s;
  s.dec.push_back(c.bos);
  int sentinel = 0;
  for (int64_t i = 0; i < c.encoder_seq_length;) {
    const auto token = [&](int64_t j) { return int32_t(first_id + (start + j * step) % span); };
    const int64_t len = 1 + int64_t(rng.u32(k++) % 3u);
    const bool room = sentinel < c.vocab_extra_ids && i > 0 &&
                      int64_t(s.dec.size()) + 1 + len + 1 <= c.decoder_seq_length &&
                      i + len <= c.encoder_seq_length;
    if (room && rng.uniform(k++) < c.mask_prob) {
      const int32_t id = int32_t(c.vocab_size - c.vocab_extra_ids + sentinel++);
      s.enc.push_back(id);
      s.dec.push_back(id);
      s.labels.push_back(id);
      for (int64_t j = i; j < i + len; ++j) {
        s.dec.push_back(token(j));
        s.labels.push_back(token(j));
      }
      i += len;
    } else {
      s.enc.push_back(token(i++));
    }
  }
  s.labels.push_back(c.eos);
  return s;
}

class T5MockTrainingData final : public TrainingData {
 public:
  T5MockTrainingData(T5MockConfig c, std::array<int64_t, 3> n) : c_(c) {
    for (size_t i = 0; i < 3; ++i) sizes_[i] = n[i] < 0 ? 1000 : n[i];
  }
  int64_t size(DataSplit s) const override { return sizes_[size_t(s)]; }

  model::Batch micro_batch(DataSplit split, int64_t first, int64_t mbs, int dp_rank,
                           int dp) const override {
    const int64_t lo = first + int64_t(dp_rank) * mbs, n = size(split);
    MG_REQUIRE(first >= 0 && lo + mbs <= n, "samples [", first, ", ", first + mbs * dp,
               ") run past the end of the split's ", n, " samples");
    const int64_t se = c_.encoder_seq_length, sd = c_.decoder_seq_length;
    std::vector<int32_t> enc(size_t(mbs * se), c_.pad), enc_mask(size_t(mbs * se), 0),
        dec(size_t(mbs * sd), c_.pad), labels(size_t(mbs * sd), -1);
    std::vector<float> loss_mask(size_t(mbs * sd), 0.0f);
    for (int64_t b = 0; b < mbs; ++b) {
      const MockSample s = make_sample(c_, (uint64_t(split) << 40) + uint64_t(lo + b));
      std::copy(s.enc.begin(), s.enc.end(), enc.begin() + b * se);
      std::fill_n(enc_mask.begin() + b * se, s.enc.size(), 1);
      std::copy(s.dec.begin(), s.dec.end(), dec.begin() + b * sd);
      std::copy(s.labels.begin(), s.labels.end(), labels.begin() + b * sd);
      std::fill_n(loss_mask.begin() + b * sd, s.dec.size(), 1.0f);
    }
    model::Batch in;
    in.encoder_tokens = Tensor::from_vector(enc, {mbs, se});
    in.encoder_padding_mask = Tensor::from_vector(enc_mask, {mbs, se});
    in.tokens = Tensor::from_vector(dec, {mbs, sd});
    in.labels = Tensor::from_vector(labels, {mbs, sd});
    in.loss_mask = Tensor::from_vector(loss_mask, {mbs, sd});
    return in;
  }

 private:
  T5MockConfig c_;
  std::array<int64_t, 3> sizes_{};
};

}  // namespace

T5MockConfig t5_mock_config(const TrainingArgs& a, const data::Tokenizer& tok) {
  T5MockConfig c;
  c.encoder_seq_length = a.model.seq_length;
  c.decoder_seq_length = a.model.decoder_seq_length;
  c.vocab_size = tok.vocab_size();
  c.vocab_extra_ids = a.tokenizer.vocab_extra_ids;
  c.mask_prob = a.mask_prob;
  c.seed = uint64_t(a.seed);
  MG_REQUIRE(c.vocab_extra_ids > 0, "pretrain-t5 --mock-data needs sentinel tokens: give "
             "--vocab-extra-ids N (pretrain_t5.py's examples use 100)");
  MG_REQUIRE(c.decoder_seq_length >= 3, "--decoder-seq-length ", c.decoder_seq_length,
             " leaves no room for BOS, a sentinel and a token");
  MG_REQUIRE(c.vocab_size > c.vocab_extra_ids + 1, "the vocabulary (", c.vocab_size,
             " ids) is too small for ", c.vocab_extra_ids, " sentinels");
  c.pad = tok.pad().value_or(0);
  c.bos = tok.bos().value_or(tok.cls().value_or(0));
  c.eos = tok.eos().value_or(tok.sep().value_or(0));
  return c;
}

std::unique_ptr<TrainingData> build_t5_mock_data(const T5MockConfig& c,
                                                 std::array<int64_t, 3> num_samples) {
  return std::make_unique<T5MockTrainingData>(c, num_samples);
}

}  // namespace megatron::training
