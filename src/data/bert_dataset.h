// Megatron-Core's BERTMaskedWordPieceDataset (megatron/core/datasets/bert_dataset.py over
// masked_dataset.py) as pretrain_bert.py configures it, built from the same data flags as GPT
// (blended_builder.h: blends, --split over documents, per-split paths).
//
// Data: `_text_sentence` indexed datasets, one sequence per sentence, sentences grouped into
// documents (`preprocess-data --split-sentences` with a BERT WordPiece tokenizer).
// Sample index: masked_sample_index.h with target length --seq-length - 3 and two sentences per
// sample with the binary head (one without), cached as
//   <cache>/<md5>-BERTMaskedWordPieceDataset-description.txt
//   <cache>/<md5>-BERTMaskedWordPieceDataset-sample_index.npy   (uint32 [n, 3])
// where <cache> is --data-cache-path or PREFIX/cache/BERTMaskedWordPieceDataset_indices and <md5>
// hashes the JSON description (Megatron's unique_description, with the tokenizer identifier as
// for GPT). A cache that is corrupt or describes something else is rebuilt.
//
// Sample idx (bert_dataset.py __getitem__), drawing from RandomState((seed + idx) % 2^32):
//   1. with the binary head: the pivot randint(1, n_sentences) when there are 3+ sentences (else
//      1), then is_random = random() < 0.5, which swaps segments A and B;
//   2. while len(A) + len(B) > target: trim the longer segment (B on ties) at the front when
//      random() < 0.5, else at the back; truncated = 1 if anything was trimmed;
//   3. tokens = [CLS] A [SEP] (B [SEP] when B is not empty), types 0 for [CLS] A [SEP], 1 after;
//   4. masking (masked_lm.h) with masking_max_ngram 3, whole words, replacement 80% [MASK],
//      10% randint(0, vocab size) (every id, [BOS]/[EOS]/extra ids included), 10% kept;
//   5. padded to --seq-length: text with [PAD]; types and padding_mask (ones over the tokens)
//      also with the [PAD] id, as Megatron does (0 for BERT's vocab.txt); labels -1 except the
//      original id at masked positions; loss_mask 1 at masked positions.
// Megatron returns int64 arrays and Python ints for is_random and truncated; a blend adds
// dataset_id.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "data/blended_builder.h"
#include "data/gpt_indices.h"
#include "data/masked_dataset.h"
#include "data/masked_lm.h"
#include "data/masked_sample_index.h"

namespace megatron::data {

// pretrain_bert.py's BERTMaskedWordPieceDatasetConfig from Megatron's flags (the shared ones in
// MaskedDataConfig).
struct BertDataConfig : MaskedDataConfig {
  int64_t seq_length = 0;    // --seq-length: the whole sample, [CLS] and [SEP]s included
  bool binary_head = true;   // --bert-binary-head (default) / --bert-no-binary-head
};

// One sample, key for key the dict Megatron's __getitem__ returns.
struct BertSample {
  std::vector<int64_t> text, types, labels, padding_mask, loss_mask;  // [seq_length] each
  int64_t is_random = 0, truncated = 0;
  std::optional<int64_t> dataset_id;  // set by a blend (BlendedDataset adds "dataset_id" first)
};

// A train, valid or test split: one BERT dataset or a blend of several.
using BertSampleSource = SampleSource<BertSample>;

class BertMaskedWordPieceDataset : public BertSampleSource, public MaskedDatasetIndex {
 public:
  // `document_range`: the split's documents [lo, hi), not empty. num_samples nullopt: one epoch.
  // split_string/matrix: as given and parsed (part of the cache description).
  BertMaskedWordPieceDataset(std::shared_ptr<const IndexedDataset> data, Split split,
                             std::pair<int64_t, int64_t> document_range, std::optional<int64_t> num_samples,
                             const BertDataConfig& config, const std::string& split_string,
                             const SplitMatrix& split_matrix);

  int64_t size() const override { return sample_index().size(); }
  BertSample sample(int64_t k) const override;

 private:
  std::shared_ptr<const IndexedDataset> data_;
  BertDataConfig config_;
};

// Megatron's BlendedDataset over BERT datasets.
using BertBlendedDataset = BlendedSamples<BertSample>;

struct BertDatasets {
  std::shared_ptr<const BertSampleSource> train, valid, test;  // null when the split is empty
};

// The train, valid and test datasets for num_samples (a negative count builds one epoch), as
// pretrain_bert.py's train_valid_test_datasets_provider. Throws megatron::Error for a config
// Megatron cannot use (no vocabulary, a --seq-length below 5, probabilities out of range, a
// --seed outside [1, 2^31-2]) and for data that gives no sample (e.g. documents of one
// sentence with the binary head: data preprocessed without --split-sentences).
BertDatasets build_bert_datasets(const BertDataConfig& config, std::array<int64_t, 3> num_samples);

// One micro-batch from samples of a dataset, as pretrain_bert.py's get_batch gives them.
struct BertBatch {
  Tensor tokens;        // int32 [b, s] ("text")
  Tensor types;         // int32 [b, s]
  Tensor labels;        // int32 [b, s], -1 where not masked
  Tensor loss_mask;     // float32 [b, s]
  Tensor padding_mask;  // int32 [b, s], 1 = real token (for BERT's vocab, whose [PAD] is 0)
  Tensor is_random;     // int32 [b] (the sentence-order label)
  std::vector<int64_t> sample_ids;
};
BertBatch make_bert_batch(const BertSampleSource& dataset, std::span<const int64_t> sample_ids);

// The sample as one JSON object: text, types, labels, is_random, padding_mask, loss_mask,
// truncated (dataset_id first for a blend), arrays as lists; no newline.
std::string bert_sample_json(const BertSample& sample);

}  // namespace megatron::data
