// See bert_dataset.h.
#include "data/bert_dataset.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/log.h"
#include "data/gpt_dataset.h"

namespace megatron::data {

namespace {

constexpr const char* kClassName = "BERTMaskedWordPieceDataset";
constexpr int64_t kSpecialTokens = 3;  // [CLS] and two [SEP]

void check_config(const BertDataConfig& c) {
  MG_REQUIRE(c.vocab, "the BERT dataset needs the tokenizer's vocabulary (wordpiece_vocab)");
  MG_REQUIRE(c.seq_length >= 5, "--seq-length ", c.seq_length, " is too short for BERT: a sample holds [CLS], "
             "two [SEP] and at least two tokens of text, so it must be at least 5");
  check_masking_flags(c.mask_prob, c.short_seq_prob, c.seed, "BERT");
}

MaskedSampleIndexParams index_params(const BertDataConfig& c) {
  MaskedSampleIndexParams p;
  p.max_length = int32_t(c.seq_length - kSpecialTokens);
  p.short_seq_prob = c.short_seq_prob;
  p.seed = int32_t(c.seed);
  p.min_sentences = c.binary_head ? 2 : 1;
  return p;
}

nlohmann::ordered_json bert_description(const IndexedDataset& data, Split split, std::optional<int64_t> num_samples,
                                        const BertDataConfig& config, const std::string& split_string,
                                        const SplitMatrix& split_matrix) {
  check_config(config);
  auto d = dataset_description(kClassName, data.prefix(), num_samples, split, config.seed, config.seq_length,
                               split_string, split_matrix, config.tokenizer);
  d["masking_probability"] = config.mask_prob;
  d["short_sequence_probability"] = config.short_seq_prob;
  d["masking_max_ngram"] = 3;
  d["masking_do_full_word"] = true;
  d["masking_do_permutation"] = false;
  d["masking_use_longer_ngrams"] = false;
  d["masking_use_geometric_distribution"] = false;
  d["classification_head"] = config.binary_head;
  return d;
}

}  // namespace

BertMaskedWordPieceDataset::BertMaskedWordPieceDataset(std::shared_ptr<const IndexedDataset> data, Split split,
                                                       std::pair<int64_t, int64_t> documents,
                                                       std::optional<int64_t> num_samples,
                                                       const BertDataConfig& config, const std::string& split_string,
                                                       const SplitMatrix& split_matrix)
    : MaskedDatasetIndex(*data, split, documents, num_samples, kClassName,
                         bert_description(*data, split, num_samples, config, split_string, split_matrix),
                         index_params(config),
                         config.use_cache ? std::optional<std::string>(config.data_cache_path) : std::nullopt),
      data_(std::move(data)),
      config_(config) {}

BertSample BertMaskedWordPieceDataset::sample(int64_t k) const {
  MG_REQUIRE(k >= 0 && k < size(), "sample ", k, " is outside the dataset (", size(), " samples)");
  const auto [beg, end, target] = sample_index().row(k);
  const WordPieceVocab& vocab = *config_.vocab;
  const auto sentences = read_sentences(*data_, beg, end, vocab.size());
  NumpyRandomState rng(uint32_t((uint64_t(config_.seed) + uint64_t(k)) % (uint64_t(1) << 32)));

  // Segments A and B, and the sentence-order swap.
  const int64_t n = end - beg;
  int64_t pivot = n;
  bool is_random = false;
  if (config_.binary_head) {
    MG_CHECK(n > 1, "a sample with the binary head needs two sentences");
    pivot = n >= 3 ? rng.randint(1, n) : 1;
    is_random = rng.random() < 0.5;
  }
  std::vector<int64_t> a, b;
  for (int64_t i = 0; i < n; ++i) {
    auto& seg = i < pivot ? a : b;
    seg.insert(seg.end(), sentences[size_t(i)].begin(), sentences[size_t(i)].end());
  }
  if (is_random) std::swap(a, b);

  // Trim the longer segment (B on ties) from a random end; kept ranges [lo, hi) of each.
  size_t a_lo = 0, a_hi = a.size(), b_lo = 0, b_hi = b.size();
  bool truncated = false;
  while (int64_t(a_hi - a_lo + b_hi - b_lo) > target) {
    truncated = true;
    const bool trim_a = a_hi - a_lo > b_hi - b_lo;
    size_t& lo = trim_a ? a_lo : b_lo;
    size_t& hi = trim_a ? a_hi : b_hi;
    if (rng.random() < 0.5)
      ++lo;
    else
      --hi;
  }

  std::vector<int64_t> tokens, types;
  tokens.push_back(vocab.cls);
  tokens.insert(tokens.end(), a.begin() + std::ptrdiff_t(a_lo), a.begin() + std::ptrdiff_t(a_hi));
  tokens.push_back(vocab.sep);
  types.assign(tokens.size(), 0);
  if (b_hi > b_lo) {
    tokens.insert(tokens.end(), b.begin() + std::ptrdiff_t(b_lo), b.begin() + std::ptrdiff_t(b_hi));
    tokens.push_back(vocab.sep);
    types.resize(tokens.size(), 1);
  }

  MaskingConfig masking;
  masking.masking_probability = config_.mask_prob;
  // BERT's _get_token_mask: 80% [MASK], else half the time a random id of token_lookup.
  auto token_mask = [&vocab](NumpyRandomState& r) -> std::optional<int64_t> {
    if (r.random() < 0.8) return vocab.mask;
    if (r.random() >= 0.5) return r.randint(0, vocab.size());
    return std::nullopt;
  };
  MaskedPredictions m = create_masked_lm_predictions(tokens, target, vocab, masking, rng, token_mask);

  const size_t length = m.tokens.size(), s = size_t(config_.seq_length);
  MG_CHECK(length <= s);
  BertSample out;
  out.text = std::move(m.tokens);
  out.text.resize(s, vocab.pad);
  out.types = std::move(types);
  out.types.resize(s, vocab.pad);
  out.padding_mask.assign(length, 1);
  out.padding_mask.resize(s, vocab.pad);
  out.labels.assign(s, -1);
  out.loss_mask.assign(s, 0);
  for (size_t i = 0; i < m.positions.size(); ++i) {
    out.labels[size_t(m.positions[i])] = m.labels[i];
    out.loss_mask[size_t(m.positions[i])] = 1;
  }
  out.is_random = is_random;
  out.truncated = truncated;
  return out;
}

BertDatasets build_bert_datasets(const BertDataConfig& c, std::array<int64_t, 3> num_samples) {
  check_config(c);
  if (c.vocab->pad != 0)
    log_warn("the tokenizer's [PAD] id is ", c.vocab->pad, ", not 0: as Megatron, BERT samples pad types and "
             "padding_mask with it, so padding_mask does not mark padding as 0");
  auto splits = build_masked_datasets<BertMaskedWordPieceDataset, BertSample>(c, num_samples);
  return {splits[0], splits[1], splits[2]};
}

BertBatch make_bert_batch(const BertSampleSource& dataset, std::span<const int64_t> sample_ids) {
  MG_REQUIRE(!sample_ids.empty(), "a BERT batch needs at least one sample");
  std::vector<BertSample> samples;
  for (int64_t k : sample_ids) samples.push_back(dataset.sample(k));
  const int64_t b = int64_t(samples.size()), s = int64_t(samples[0].text.size());
  BertBatch out;
  out.tokens = Tensor::empty({b, s}, DType::I32);
  out.types = Tensor::empty({b, s}, DType::I32);
  out.labels = Tensor::empty({b, s}, DType::I32);
  out.loss_mask = Tensor::empty({b, s}, DType::F32);
  out.padding_mask = Tensor::empty({b, s}, DType::I32);
  out.is_random = Tensor::empty({b}, DType::I32);
  for (int64_t r = 0; r < b; ++r) {
    const BertSample& x = samples[size_t(r)];
    MG_CHECK(int64_t(x.text.size()) == s, "BERT samples of different lengths in one batch");
    for (int64_t i = 0; i < s; ++i) {
      const size_t j = size_t(i), o = size_t(r * s + i);
      out.tokens.data<int32_t>()[o] = int32_t(x.text[j]);
      out.types.data<int32_t>()[o] = int32_t(x.types[j]);
      out.labels.data<int32_t>()[o] = int32_t(x.labels[j]);
      out.loss_mask.data<float>()[o] = float(x.loss_mask[j]);
      out.padding_mask.data<int32_t>()[o] = int32_t(x.padding_mask[j]);
    }
    out.is_random.data<int32_t>()[r] = int32_t(x.is_random);
  }
  out.sample_ids.assign(sample_ids.begin(), sample_ids.end());
  return out;
}

std::string bert_sample_json(const BertSample& s) {
  nlohmann::ordered_json j;
  if (s.dataset_id) j["dataset_id"] = *s.dataset_id;
  j["text"] = s.text;
  j["types"] = s.types;
  j["labels"] = s.labels;
  j["is_random"] = s.is_random;
  j["padding_mask"] = s.padding_mask;
  j["loss_mask"] = s.loss_mask;
  j["truncated"] = s.truncated;
  return j.dump();
}

}  // namespace megatron::data
