// The sample index of Megatron's masked datasets (BERT, T5): helpers.cpp build_mapping, as
// MaskedWordPieceDataset._build_sample_index calls it. A sample is a run of whole sentences of
// one document, recorded as (first sentence, end sentence, target length).
//
// Per epoch, documents in order. A document is skipped when it has fewer than min_sentences
// sentences, or when it has at least two and one of them is longer than 512 tokens (a single
// long sentence is kept). For a kept document a target length is drawn; sentences are added
// until the running length reaches the target while more than one sentence remains after it
// and the sample has min_sentences, or until the document ends; then the sample is recorded and
// the next target drawn. Targets come from one std::mt19937(seed) stream across all epochs:
// with ratio = round(1 / short_seq_prob) (0 when the probability is 0), a draw r gives
// 2 + r % (max_length - 1) when r % ratio == 0, else max_length. With a requested count, whole
// epochs are built until it is reached (checked before each epoch), so the index may hold more;
// without one, one epoch. Finally all samples are shuffled: for i = n-1 .. 1, swap i with
// std::mt19937_64(seed + 1)() % (i + 1).
//
// Worked example (max_length 6, short_seq_prob 0, min_sentences 2, one epoch, no shuffle
// shown): sentence lengths [2 3 4 1 1] | [7] | [3 600] give (0, 3, 6) (2+3+4 >= 6 with two
// sentences left) and (3, 5, 6) (the document's end); [7] has one sentence and [3 600] a long
// one, so both are skipped. With min_sentences 1, [7] gives (5, 6, 6).
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace megatron::data {

struct MaskedSampleIndexParams {
  // Target tokens per sample before the special tokens (BERT: --seq-length - 3); must be > 1.
  int32_t max_length = 0;
  double short_seq_prob = 0.0;  // in [0, 1]
  int32_t seed = 1234;          // > 0 and < 2^31 - 1 (Megatron passes it as a C int)
  int32_t min_sentences = 1;    // BERT: 2 with the binary head, else 1
  std::optional<int64_t> num_samples;  // nullopt: one epoch
};

// The sentences longer than this make a multi-sentence document unusable (helpers.cpp).
constexpr int32_t kLongSentenceLength = 512;

class MaskedSampleIndex {
 public:
  MaskedSampleIndex() = default;
  // From stored rows (first, end, target) x n; `wide`: 64-bit rows (more than 2^32-1 sentences).
  static MaskedSampleIndex from_rows(std::vector<int64_t> rows, bool wide);

  int64_t size() const { return int64_t(wide_ ? rows64_.size() : rows32_.size()) / 3; }
  // (first sentence, end sentence (exclusive), target length) of sample k.
  std::array<int64_t, 3> row(int64_t k) const;
  // Megatron stores uint32 rows unless the dataset has more than 2^32-1 sentences.
  bool wide() const { return wide_; }
  // All rows as int64, row-major [size, 3] (for the .npy cache).
  std::vector<int64_t> rows() const;

  int64_t num_epochs = 0;
  // First-epoch counts, as Megatron's verbose log reports them.
  int64_t empty_documents = 0, one_sentence_documents = 0, long_sentence_documents = 0;

 private:
  friend MaskedSampleIndex build_masked_sample_index(std::span<const int64_t>, std::span<const int32_t>,
                                                     const MaskedSampleIndexParams&);
  bool wide_ = false;
  std::vector<uint32_t> rows32_;
  std::vector<uint64_t> rows64_;
};

// `documents`: the split's document boundaries as sentence ids (Megatron's
// document_indices[lo .. hi], hi - lo + 1 values); `sentence_lengths`: every sentence of the
// dataset. Throws megatron::Error for bad parameters, and when samples are requested but no
// document can give one (the message says why: too few sentences or long sentences).
MaskedSampleIndex build_masked_sample_index(std::span<const int64_t> documents,
                                            std::span<const int32_t> sentence_lengths,
                                            const MaskedSampleIndexParams& params);

}  // namespace megatron::data
