// Megatron's masked-LM predictions (MaskedWordPieceDataset._create_masked_lm_predictions in
// megatron/core/datasets/masked_dataset.py), draw for draw with NumPy's legacy RandomState.
//
// Candidates: every token but [CLS] and [SEP]; with whole-word masking a "##" piece joins the
// candidate before it. The number of masked tokens is
//   min(masking_probability * target_length, max(1, round_half_even(len(tokens) * p)))
// (a float bound, so a short target can allow none). Candidate c's n-grams are the slices
// candidates[c : c + n] for n = 1 .. max_ngram (cut off at the end, never empty). The candidate
// order is shuffled once (RandomState.shuffle). For each candidate in that order, until enough
// tokens are masked: n is drawn by RandomState.choice([1 .. max_ngram], p ∝ 1/n) (one random()
// against the cumulative probabilities), or with the geometric distribution (T5, SpanBERT) as
// min(RandomState.geometric(0.2), max_ngram); the n-gram is shortened until it fits the remaining
// budget (skipped if even its 1-gram does not); it is skipped if it overlaps a masked token;
// otherwise each of its tokens is masked with the family's replacement rule (BERT: 80% [MASK],
// 10% a random id, 10% kept, drawn per token), in order. Positions and labels come back sorted
// by position, and the masked n-grams (spans) sorted by their first position. Megatron shuffles
// the candidates once more afterwards; neither BERT nor T5 draws again, so that is left out.
// Permutation (off for BERT and T5) is not implemented.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <vector>

#include "data/numpy_random.h"
#include "data/tokenizer.h"

namespace megatron::data {

// What the masked datasets take from a WordPiece tokenizer: the special ids and, per id,
// whether its token is a "##" continuation piece (Megatron's inv_vocab[id].startswith("##")).
struct WordPieceVocab {
  int32_t cls = -1, sep = -1, pad = -1, mask = -1, bos = -1, eos = -1;
  std::vector<int32_t> sentinels;     // <extra_id_0..N-1> (--vocab-extra-ids), in order
  std::vector<uint8_t> continuation;  // [vocab size]
  // Random replacements draw from Megatron's token_lookup = list(inv_vocab.keys()): every id.
  int64_t size() const { return int64_t(continuation.size()); }
};

// From a BertWordPieceLowerCase/BertWordPieceCase tokenizer (with Megatron's added [BOS], [EOS]
// and extra ids). Throws megatron::Error for another kind of tokenizer.
WordPieceVocab wordpiece_vocab(const Tokenizer& tokenizer);

struct MaskingConfig {
  double masking_probability = 0.15;  // (0, 1)
  int64_t max_ngram = 3;
  bool do_full_word = true;
  bool use_longer_ngrams = false;
  bool use_geometric_distribution = false;  // n = min(geometric(0.2), max_ngram)
};

struct MaskedPredictions {
  std::vector<int64_t> tokens;     // the input with replacements applied
  std::vector<int64_t> positions;  // masked positions, ascending
  std::vector<int64_t> labels;     // the original ids at those positions
  // The masked n-grams, each its positions in order, sorted by their first position (Megatron's
  // masked_spans; the labels are the input's ids there).
  std::vector<std::vector<int64_t>> spans;
};

// The family's replacement for one masked token (Megatron's _get_token_mask): nullopt keeps it.
using TokenMaskFn = std::function<std::optional<int64_t>(NumpyRandomState&)>;

// `tokens`: ids inside the vocabulary ([CLS] A [SEP] (B [SEP]) for BERT, plain text for T5).
MaskedPredictions create_masked_lm_predictions(std::span<const int64_t> tokens, int64_t target_length,
                                               const WordPieceVocab& vocab, const MaskingConfig& config,
                                               NumpyRandomState& rng, const TokenMaskFn& token_mask);

// The cumulative probabilities RandomState.choice compares its draw with for n-gram sizes
// 1 .. n_ngrams (p ∝ 1/n over max_ngram, renormalised over the first n_ngrams), computed with
// NumPy's float64 operations in its order (exposed for tests).
std::vector<double> ngram_cdf(int64_t max_ngram, int64_t n_ngrams, bool use_longer_ngrams);

}  // namespace megatron::data
