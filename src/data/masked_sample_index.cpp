// See masked_sample_index.h.
#include "data/masked_sample_index.h"

#include <cmath>
#include <limits>
#include <random>
#include <utility>

#include "core/error.h"

namespace megatron::data {

std::array<int64_t, 3> MaskedSampleIndex::row(int64_t k) const {
  MG_CHECK(k >= 0 && k < size());
  const size_t i = size_t(3 * k);
  if (wide_) return {int64_t(rows64_[i]), int64_t(rows64_[i + 1]), int64_t(rows64_[i + 2])};
  return {int64_t(rows32_[i]), int64_t(rows32_[i + 1]), int64_t(rows32_[i + 2])};
}

std::vector<int64_t> MaskedSampleIndex::rows() const {
  std::vector<int64_t> out;
  out.reserve(size_t(3 * size()));
  if (wide_)
    for (uint64_t v : rows64_) out.push_back(int64_t(v));
  else
    for (uint32_t v : rows32_) out.push_back(int64_t(v));
  return out;
}

MaskedSampleIndex MaskedSampleIndex::from_rows(std::vector<int64_t> rows, bool wide) {
  MG_CHECK(rows.size() % 3 == 0);
  MaskedSampleIndex m;
  m.wide_ = wide;
  if (wide)
    m.rows64_.assign(rows.begin(), rows.end());
  else
    for (int64_t v : rows) m.rows32_.push_back(uint32_t(v));
  return m;
}

namespace {

// helpers.cpp get_target_sample_len.
int32_t target_length(int32_t short_seq_ratio, int32_t max_length, std::mt19937& gen) {
  if (short_seq_ratio == 0) return max_length;
  const uint64_t r = gen();
  if (r % uint64_t(short_seq_ratio) == 0) return int32_t(2 + r % uint64_t(max_length - 1));
  return max_length;
}

// Megatron's loop over epochs and documents, appending (first, end, target) to `rows`.
template <class T>
void build_rows(std::span<const int64_t> docs, std::span<const int32_t> sizes, const MaskedSampleIndexParams& p,
                int32_t ratio, MaskedSampleIndex& index, std::vector<T>& rows) {
  std::mt19937 gen(uint32_t(p.seed));
  const uint64_t wanted = p.num_samples ? uint64_t(*p.num_samples) : std::numeric_limits<uint64_t>::max();
  const int64_t max_epochs = p.num_samples ? int64_t(std::numeric_limits<int32_t>::max()) - 1 : 1;
  uint64_t count = 0;
  for (int64_t epoch = 0; epoch < max_epochs; ++epoch) {
    if (count >= wanted) break;
    const uint64_t before = count;
    for (size_t doc = 0; doc + 1 < docs.size(); ++doc) {
      const int64_t first = docs[doc], last = docs[doc + 1];
      int64_t start = first, remain = last - first;
      bool long_sentence = false;
      if (remain > 1)
        for (int64_t s = first; s < last && !long_sentence; ++s) long_sentence = sizes[size_t(s)] > kLongSentenceLength;
      if (epoch == 0) {
        index.empty_documents += remain == 0;
        index.one_sentence_documents += remain == 1;
        index.long_sentence_documents += long_sentence;
      }
      if (remain < p.min_sentences || long_sentence) continue;
      int64_t length = 0, sentences = 0;
      int32_t target = target_length(ratio, p.max_length, gen);
      for (int64_t s = first; s < last; ++s) {
        length += sizes[size_t(s)];
        ++sentences;
        --remain;
        if ((length >= target && remain > 1 && sentences >= p.min_sentences) || remain == 0) {
          rows.push_back(T(start));
          rows.push_back(T(s + 1));
          rows.push_back(T(target));
          ++count;
          start = s + 1;
          target = target_length(ratio, p.max_length, gen);
          length = 0;
          sentences = 0;
        }
      }
    }
    index.num_epochs = epoch + 1;
    // Which documents qualify does not depend on the epoch: one that yields nothing means no
    // epoch ever will (Megatron would loop for 2^31 epochs).
    MG_REQUIRE(count > before || count >= wanted || !p.num_samples, "no document of the split can make a sample: of ",
               docs.size() - 1, " documents, ", index.empty_documents, " are empty, ",
               index.one_sentence_documents, " have one sentence",
               p.min_sentences > 1 ? " (a sample with the binary head needs two)" : "", " and ",
               index.long_sentence_documents, " have a sentence longer than ", kLongSentenceLength,
               " tokens",
               p.min_sentences > 1 ? "; preprocess the data with --split-sentences (documents split into "
                                     "sentences), or train without the binary head (--bert-no-binary-head)"
                                   : "");
  }
  // helpers.cpp's final shuffle.
  std::mt19937_64 shuffle_gen(uint64_t(int64_t(p.seed) + 1));
  const int64_t n = int64_t(count);
  for (int64_t i = n - 1; i > 0; --i) {
    const int64_t j = int64_t(shuffle_gen() % uint64_t(i + 1));
    std::swap(rows[size_t(3 * i)], rows[size_t(3 * j)]);
    std::swap(rows[size_t(3 * i + 1)], rows[size_t(3 * j + 1)]);
    std::swap(rows[size_t(3 * i + 2)], rows[size_t(3 * j + 2)]);
  }
}

}  // namespace

MaskedSampleIndex build_masked_sample_index(std::span<const int64_t> docs, std::span<const int32_t> sizes,
                                            const MaskedSampleIndexParams& p) {
  MG_REQUIRE(p.max_length > 1, "the target sample length must be at least 2 tokens (got ", p.max_length,
             "); raise --seq-length");
  MG_REQUIRE(p.seed > 0 && p.seed < std::numeric_limits<int32_t>::max(),
             "--seed must be in [1, 2147483646] for the masked datasets (got ", p.seed,
             "; Megatron's build_mapping needs a positive C int)");
  MG_REQUIRE(p.short_seq_prob >= 0.0 && p.short_seq_prob <= 1.0, "--short-seq-prob must be in [0, 1] (got ",
             p.short_seq_prob, ")");
  MG_REQUIRE(p.short_seq_prob == 0.0 || 1.0 / p.short_seq_prob < 2147483647.0, "--short-seq-prob ",
             p.short_seq_prob, " is too small (its inverse must fit a 32-bit int); use 0 for no short samples");
  MG_REQUIRE(p.min_sentences >= 1, "min_sentences must be >= 1");
  MG_REQUIRE(!p.num_samples || *p.num_samples >= 0, "negative sample count ", *p.num_samples);
  MG_REQUIRE(!docs.empty(), "the split has no document boundaries");
  for (size_t d = 0; d + 1 < docs.size(); ++d)
    MG_REQUIRE(docs[d] >= 0 && docs[d] <= docs[d + 1] && docs[d + 1] <= int64_t(sizes.size()),
               "document boundaries out of order or past the sentences at document ", d);
  const int32_t ratio = p.short_seq_prob > 0 ? int32_t(std::round(1.0 / p.short_seq_prob)) : 0;
  MaskedSampleIndex index;
  index.wide_ = sizes.size() > std::numeric_limits<uint32_t>::max();
  if (index.wide_)
    build_rows(docs, sizes, p, ratio, index, index.rows64_);
  else
    build_rows(docs, sizes, p, ratio, index, index.rows32_);
  return index;
}

}  // namespace megatron::data
