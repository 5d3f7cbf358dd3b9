// Megatron-Core's T5MaskedWordPieceDataset (megatron/core/datasets/t5_dataset.py over
// masked_dataset.py, NVIDIA/Megatron-LM main as of 2025: the version whose __getitem__ returns
// 1-D enc_mask/dec_mask and whose config_attention_mask builds the attention masks in get_batch)
// as pretrain_t5.py configures it, built from the same data flags as GPT and BERT
// (blended_builder.h: blends, --split over documents, per-split paths).
//
// Data: `_text_sentence` indexed datasets (`preprocess-data --split-sentences` with a BERT
// WordPiece tokenizer). Tokenizer: BertWordPieceLowerCase/BertWordPieceCase with
// --vocab-extra-ids N (Megatron's _BertWordPieceTokenizer: [BOS], [EOS], then <extra_id_0..N-1>
// appended to vocab.txt), whose extra ids are the sentinels.
// Sample index: masked_dataset.h with target length --encoder-seq-length - 2 and samples of one
// or more sentences, cached as <cache>/<md5>-T5MaskedWordPieceDataset-{description.txt,
// sample_index.npy}.
//
// Sample idx (t5_dataset.py __getitem__), drawing from RandomState((seed + idx) % 2^32):
//   1. the sample's sentences concatenated and cut to the target length; truncated = 1 if cut;
//   2. masking (masked_lm.h) with masking_max_ngram 10, whole words, n-gram lengths
//      min(geometric(0.2), 10), every masked token replaced by [MASK] (no draw);
//   3. with the masked spans in position order and sentinel s_i = <extra_id_i> for span i:
//        text_enc = the text with span i replaced by s_i
//        text_dec = [BOS] s_0 span_0 s_1 span_1 ...
//        labels   =       s_0 span_0 s_1 span_1 ... [EOS]
//   4. text_enc padded to --encoder-seq-length and text_dec to --decoder-seq-length with [PAD],
//      labels with -1; loss_mask, enc_mask and dec_mask 1 over the tokens, 0 over the padding.
// Worked example (sentinels 100, 101; [BOS] 98, [EOS] 99; [PAD] 0; lengths 8 and 6):
//   text [7 8 9 10 11], spans {8 9} and {11}: text_enc [7 100 10 101 0 0 0 0],
//   text_dec [98 100 8 9 101 11], labels [100 8 9 101 11 99], loss_mask [1 1 1 1 1 1].
// A sample needs one sentinel per span and 1 + spans + masked tokens decoder positions (at most
// 1 + 2 * floor(mask_prob * (encoder length - 2))); Megatron fails on a sample that needs more
// (IndexError, AssertionError), this raises megatron::Error naming the sample and the fix.
// Data of one sentence per document (preprocessed without --split-sentences) is used as Megatron
// uses it, each document cut to the target length, with a warning.
// Megatron returns int64 arrays and a Python int for truncated; a blend adds dataset_id.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "data/blended_builder.h"
#include "data/masked_dataset.h"
#include "data/masked_lm.h"

namespace megatron::data {

// pretrain_t5.py's T5MaskedWordPieceDatasetConfig from Megatron's flags (the shared ones in
// MaskedDataConfig).
struct T5DataConfig : MaskedDataConfig {
  int64_t encoder_seq_length = 0;  // --encoder-seq-length (or --seq-length)
  int64_t decoder_seq_length = 0;  // --decoder-seq-length
};

// One sample, key for key the dict Megatron's __getitem__ returns.
struct T5Sample {
  std::vector<int64_t> text_enc;                    // [encoder_seq_length]
  std::vector<int64_t> text_dec, labels, loss_mask;  // [decoder_seq_length]
  int64_t truncated = 0;
  std::vector<int64_t> enc_mask;                    // [encoder_seq_length], 1 = token, 0 = padding
  std::vector<int64_t> dec_mask;                    // [decoder_seq_length], 1 = token, 0 = padding
  std::optional<int64_t> dataset_id;                // set by a blend
};

// A train, valid or test split: one T5 dataset or a blend of several. sample(k) also throws for
// a sample that needs more sentinels or decoder positions than there are.
using T5SampleSource = SampleSource<T5Sample>;

class T5MaskedWordPieceDataset : public T5SampleSource, public MaskedDatasetIndex {
 public:
  // `document_range`: the split's documents [lo, hi), not empty. num_samples nullopt: one epoch.
  // split_string/matrix: as given and parsed (part of the cache description).
  T5MaskedWordPieceDataset(std::shared_ptr<const IndexedDataset> data, Split split,
                           std::pair<int64_t, int64_t> document_range, std::optional<int64_t> num_samples,
                           const T5DataConfig& config, const std::string& split_string,
                           const SplitMatrix& split_matrix);

  int64_t size() const override { return sample_index().size(); }
  T5Sample sample(int64_t k) const override;

 private:
  std::shared_ptr<const IndexedDataset> data_;
  T5DataConfig config_;
};

using T5BlendedDataset = BlendedSamples<T5Sample>;

struct T5Datasets {
  std::shared_ptr<const T5SampleSource> train, valid, test;  // null when the split is empty
};

// The train, valid and test datasets for num_samples (a negative count builds one epoch), as
// pretrain_t5.py's train_valid_test_datasets_provider. Throws megatron::Error for a config
// Megatron cannot use (no vocabulary, no sentinels (--vocab-extra-ids 0), an encoder length
// below 4 or a decoder length below 3, probabilities out of range, a --seed outside
// [1, 2^31-2]) and for data that gives no sample. Warns when a sample could need more sentinels
// than --vocab-extra-ids gives.
T5Datasets build_t5_datasets(const T5DataConfig& config, std::array<int64_t, 3> num_samples);

// One micro-batch, as pretrain_t5.py's get_batch gives it.
//   enc_mask/dec_mask here are the dataset's rows, 1 = a token, 0 = padding: what the core
//   attention op takes as key_padding (encoder self-attention and cross-attention keys: enc_mask;
//   the decoder's self-attention is causal). Megatron's get_batch inverts them (True = padding)
//   and, under Transformer Engine (the default --transformer-impl), passes enc_mask as
//   [b, 1, 1, se], no decoder mask (causal) and (dec, enc) padding for cross-attention;
//   t5_local_attention_masks gives the --transformer-impl local forms.
struct T5Batch {
  Tensor tokens_enc;  // int32 [b, se]
  Tensor tokens_dec;  // int32 [b, sd]
  Tensor labels;      // int32 [b, sd], -1 on padding
  Tensor loss_mask;   // float32 [b, sd]
  Tensor enc_mask;    // int32 [b, se], 1 = token
  Tensor dec_mask;    // int32 [b, sd], 1 = token
  std::vector<int64_t> sample_ids;
};
T5Batch make_t5_batch(const T5SampleSource& dataset, std::span<const int64_t> sample_ids);

// T5MaskedWordPieceDataset.config_attention_mask(use_local=True): uint8, 1 = masked (True in
// Megatron: do not attend), computed from the token ids as Megatron does (a position attends
// where both ids are >= 1, i.e. [PAD] must be id 0):
struct T5AttentionMasks {
  Tensor enc_mask;      // [b, 1, se, se]
  Tensor dec_mask;      // [b, 1, sd, sd], also masked above the diagonal (causal)
  Tensor enc_dec_mask;  // [b, 1, sd, se]: decoder queries against encoder keys
};
T5AttentionMasks t5_local_attention_masks(const T5Batch& batch);

// The sample as one JSON object: text_enc, text_dec, labels, loss_mask, truncated, enc_mask,
// dec_mask (dataset_id first for a blend), arrays as lists; no newline.
std::string t5_sample_json(const T5Sample& sample);

}  // namespace megatron::data
