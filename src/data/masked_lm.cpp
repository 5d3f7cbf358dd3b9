// See masked_lm.h.
#include "data/masked_lm.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"
#include "data/bert_wordpiece.h"

namespace megatron::data {

WordPieceVocab wordpiece_vocab(const Tokenizer& tokenizer) {
  const auto* wp = dynamic_cast<const BertWordPieceTokenizer*>(&tokenizer);
  MG_REQUIRE(wp, "the BERT and T5 datasets need a WordPiece tokenizer (--tokenizer-type BertWordPieceLowerCase "
                 "or BertWordPieceCase with BERT's vocab.txt), not ", tokenizer.type());
  WordPieceVocab v;
  v.cls = *wp->cls();
  v.sep = *wp->sep();
  v.pad = *wp->pad();
  v.mask = *wp->mask();
  v.bos = *wp->bos();
  v.eos = *wp->eos();
  v.sentinels = wp->extra_ids();
  v.continuation.resize(size_t(wp->vocab_size()));
  for (int64_t id = 0; id < wp->vocab_size(); ++id)
    v.continuation[size_t(id)] = wp->token(int32_t(id)).starts_with("##");
  return v;
}

std::vector<double> ngram_cdf(int64_t max_ngram, int64_t n_ngrams, bool use_longer_ngrams) {
  MG_CHECK(max_ngram >= 1 && n_ngrams >= 1 && n_ngrams <= max_ngram);
  // NumPy sums arrays of fewer than 8 elements left to right; larger ones pairwise.
  MG_CHECK(max_ngram < 8, "n-gram sizes above 7 need NumPy's pairwise summation");
  // nprobs = 1.0 / arange(1, max+1); nprobs /= nprobs.sum()
  std::vector<double> nprobs(static_cast<size_t>(max_ngram));
  for (int64_t n = 0; n < max_ngram; ++n) nprobs[size_t(n)] = 1.0 / double(n + 1);
  double sum = 0.0;
  for (double x : nprobs) sum += x;
  for (double& x : nprobs) x /= sum;
  if (use_longer_ngrams) std::reverse(nprobs.begin(), nprobs.end());
  // p = nprobs[:n] / nprobs[:n].sum(); cdf = p.cumsum(); cdf /= cdf[-1]
  std::vector<double> p(nprobs.begin(), nprobs.begin() + n_ngrams);
  double psum = 0.0;
  for (double x : p) psum += x;
  for (double& x : p) x /= psum;
  std::vector<double> cdf(p.size());
  double acc = 0.0;
  for (size_t i = 0; i < p.size(); ++i) cdf[i] = acc += p[i];
  const double last = cdf.back();
  for (double& x : cdf) x /= last;
  return cdf;
}

MaskedPredictions create_masked_lm_predictions(std::span<const int64_t> tokens, int64_t target_length,
                                               const WordPieceVocab& vocab, const MaskingConfig& config,
                                               NumpyRandomState& rng, const TokenMaskFn& token_mask) {
  // Whole-word candidates: positions of a word's first piece and its "##" pieces.
  std::vector<std::vector<int64_t>> candidates;
  for (size_t i = 0; i < tokens.size(); ++i) {
    const int64_t id = tokens[i];
    if (id == vocab.cls || id == vocab.sep) continue;
    MG_CHECK(id >= 0 && id < vocab.size());
    if (vocab.continuation[size_t(id)] && config.do_full_word && !candidates.empty())
      candidates.back().push_back(int64_t(i));
    else
      candidates.push_back({int64_t(i)});
  }
  const double n_maskings = std::min(
      config.masking_probability * double(target_length),
      double(std::max<int64_t>(1, int64_t(std::nearbyint(double(tokens.size()) * config.masking_probability)))));

  // Every candidate has max_ngram n-grams (slices, cut off at the end), so the choice is always
  // over all sizes.
  const std::vector<double> cdf = config.use_geometric_distribution
                                      ? std::vector<double>{}
                                      : ngram_cdf(config.max_ngram, config.max_ngram, config.use_longer_ngrams);
  const int64_t num_candidates = int64_t(candidates.size());
  std::vector<int64_t> order(static_cast<size_t>(num_candidates));
  std::iota(order.begin(), order.end(), 0);
  rng.shuffle(std::span<int64_t>(order));

  MaskedPredictions out;
  out.tokens.assign(tokens.begin(), tokens.end());
  std::vector<std::pair<int64_t, int64_t>> masked;  // (position, label)
  std::vector<uint8_t> is_masked(tokens.size(), 0);
  std::vector<int64_t> ngram;
  for (int64_t c : order) {
    if (double(masked.size()) >= n_maskings) break;
    int64_t n;
    if (config.use_geometric_distribution) {
      n = std::min(rng.geometric(0.2), config.max_ngram);
    } else {
      const double u = rng.random();
      n = int64_t(std::upper_bound(cdf.begin(), cdf.end(), u) - cdf.begin()) + 1;
    }
    bool skip = false;
    while (true) {
      // candidate_ngrams[c][n - 1] with Python's indexing (a geometric draw of 0 reads from the end).
      int64_t size = n >= 1 ? n : n + config.max_ngram;
      MG_CHECK(size >= 1 && size <= config.max_ngram, "n-gram index ", n - 1, " out of range");
      ngram.clear();
      for (int64_t w = c; w < std::min(c + size, num_candidates); ++w)
        ngram.insert(ngram.end(), candidates[size_t(w)].begin(), candidates[size_t(w)].end());
      n -= 1;
      if (n_maskings >= double(masked.size() + ngram.size())) break;
      if (n == 0) {
        skip = true;
        break;
      }
    }
    if (skip) continue;
    if (std::any_of(ngram.begin(), ngram.end(), [&](int64_t i) { return is_masked[size_t(i)] != 0; })) continue;
    for (int64_t i : ngram) {
      is_masked[size_t(i)] = 1;
      const std::optional<int64_t> replacement = token_mask(rng);
      out.tokens[size_t(i)] = replacement ? *replacement : tokens[size_t(i)];
      masked.emplace_back(i, tokens[size_t(i)]);
    }
    out.spans.push_back(ngram);
  }
  std::sort(out.spans.begin(), out.spans.end(),
            [](const std::vector<int64_t>& a, const std::vector<int64_t>& b) { return a[0] < b[0]; });
  std::sort(masked.begin(), masked.end());
  for (const auto& [position, label] : masked) {
    out.positions.push_back(position);
    out.labels.push_back(label);
  }
  return out;
}

}  // namespace megatron::data
