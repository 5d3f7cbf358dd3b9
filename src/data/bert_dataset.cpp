// See bert_dataset.h.
#include "data/bert_dataset.h"

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/log.h"
#include "data/gpt_dataset.h"
#include "data/npy.h"

namespace megatron::data {

namespace fs = std::filesystem;

namespace {

constexpr const char* kClassName = "BERTMaskedWordPieceDataset";
constexpr int64_t kSpecialTokens = 3;  // [CLS] and two [SEP]

void check_config(const BertDataConfig& c) {
  MG_REQUIRE(c.vocab, "the BERT dataset needs the tokenizer's vocabulary (wordpiece_vocab)");
  MG_REQUIRE(c.seq_length >= 5, "--seq-length ", c.seq_length, " is too short for BERT: a sample holds [CLS], "
             "two [SEP] and at least two tokens of text, so it must be at least 5");
  MG_REQUIRE(c.mask_prob > 0.0 && c.mask_prob < 1.0, "--mask-prob must be in (0, 1) (got ", c.mask_prob, ")");
  MG_REQUIRE(c.short_seq_prob >= 0.0 && c.short_seq_prob <= 1.0, "--short-seq-prob must be in [0, 1] (got ",
             c.short_seq_prob, ")");
  MG_REQUIRE(c.seed >= 1 && c.seed <= 2147483646u, "--seed must be in [1, 2147483646] for BERT data (got ",
             c.seed, "): Megatron's sample mapping takes it as a positive C int");
}

MaskedSampleIndexParams index_params(const BertDataConfig& c, std::optional<int64_t> num_samples) {
  MaskedSampleIndexParams p;
  p.max_length = int32_t(c.seq_length - kSpecialTokens);
  p.short_seq_prob = c.short_seq_prob;
  p.seed = int32_t(c.seed);
  p.min_sentences = c.binary_head ? 2 : 1;
  p.num_samples = num_samples;
  return p;
}

}  // namespace

BertMaskedWordPieceDataset::BertMaskedWordPieceDataset(std::shared_ptr<const IndexedDataset> data, Split split,
                                                       std::pair<int64_t, int64_t> documents,
                                                       std::optional<int64_t> num_samples,
                                                       const BertDataConfig& config, const std::string& split_string,
                                                       const SplitMatrix& split_matrix)
    : data_(std::move(data)), split_(split), documents_(documents), num_samples_(num_samples), config_(config) {
  MG_CHECK(data_);
  check_config(config_);
  MG_CHECK(documents.first >= 0 && documents.first < documents.second &&
           documents.second <= data_->num_documents());
  auto d = dataset_description(kClassName, data_->prefix(), num_samples, split, config.seed, config.seq_length,
                               split_string, split_matrix, config.tokenizer);
  d["masking_probability"] = config.mask_prob;
  d["short_sequence_probability"] = config.short_seq_prob;
  d["masking_max_ngram"] = 3;
  d["masking_do_full_word"] = true;
  d["masking_do_permutation"] = false;
  d["masking_use_longer_ngrams"] = false;
  d["masking_use_geometric_distribution"] = false;
  d["classification_head"] = config.binary_head;
  description_ = d.dump(4);
  hash_ = md5_hex(description_);
  if (config.use_cache)
    cache_dir_ = config.data_cache_path.empty()
                     ? (fs::path(data_->prefix()) / "cache" / (std::string(kClassName) + "_indices")).string()
                     : config.data_cache_path;
  if (!cache_dir_.empty() && try_load_cache()) {
    from_cache_ = true;
  } else {
    const auto docs = data_->document_indices().subspan(size_t(documents.first),
                                                        size_t(documents.second - documents.first + 1));
    try {
      index_ = build_masked_sample_index(docs, data_->sequence_lengths(), index_params(config_, num_samples));
    } catch (const Error& e) {
      MG_THROW(data_->prefix(), " (", split_name(split), " split, documents [", documents.first, ", ",
               documents.second, ")): ", e.what());
    }
    if (!cache_dir_.empty()) write_cache();
  }
  MG_CHECK(!num_samples || size() >= *num_samples);
}

std::string BertMaskedWordPieceDataset::cache_file(const std::string& suffix) const {
  if (cache_dir_.empty()) return "";
  return (fs::path(cache_dir_) / (hash_ + "-" + kClassName + "-" + suffix)).string();
}

bool BertMaskedWordPieceDataset::try_load_cache() {
  const std::vector<std::string> files = {cache_file("description.txt"), cache_file("sample_index.npy")};
  return load_index_cache(files, files[0], description_, cache_file("*"), [&] {
    auto a = read_npy(files[1]);
    MG_REQUIRE(a.shape.size() == 2 && a.shape[1] == 3, "the sample index is not [n, 3]");
    MG_REQUIRE(!num_samples_ || a.shape[0] >= *num_samples_, "the sample index is too short");
    const bool wide = data_->num_sequences() > int64_t(UINT32_MAX);
    MG_REQUIRE(a.descr == (wide ? "<u8" : "<u4"), "the sample index dtype is ", a.descr);
    const auto docs = data_->document_indices();
    const int64_t first = docs[size_t(documents_.first)], last = docs[size_t(documents_.second)];
    const auto p = index_params(config_, std::nullopt);
    for (size_t r = 0; r < a.values.size(); r += 3) {
      const int64_t beg = a.values[r], end = a.values[r + 1], target = a.values[r + 2];
      MG_REQUIRE(beg >= first && end <= last && end - beg >= p.min_sentences && target >= 2 &&
                     target <= p.max_length,
                 "sample ", r / 3, " (", beg, ", ", end, ", ", target, ") is outside the split");
    }
    index_ = MaskedSampleIndex::from_rows(std::move(a.values), wide);
  });
}

void BertMaskedWordPieceDataset::write_cache() const {
  write_index_cache(cache_dir_, cache_file("description.txt"), description_, [&] {
    write_npy_i64_as(cache_file("sample_index.npy"), index_.wide() ? "<u8" : "<u4", index_.rows(), {size(), 3});
  });
}

BertSample BertMaskedWordPieceDataset::sample(int64_t k) const {
  MG_REQUIRE(k >= 0 && k < size(), "sample ", k, " is outside the dataset (", size(), " samples)");
  const auto [beg, end, target] = index_.row(k);
  const WordPieceVocab& vocab = *config_.vocab;
  // The sentences, checked against the vocabulary (Megatron would fail on inv_vocab[id]).
  std::vector<std::vector<int64_t>> sentences;
  std::vector<int32_t> ids;
  for (int64_t s = beg; s < end; ++s) {
    ids.clear();
    data_->read(s, 0, data_->sequence_length(s), ids);
    for (int32_t id : ids)
      MG_REQUIRE(id >= 0 && id < vocab.size(), data_->prefix(), ": sentence ", s, " holds token id ", id,
                 ", outside the tokenizer's vocabulary of ", vocab.size(),
                 " ids: the dataset was made with another tokenizer; preprocess it with this one");
    sentences.emplace_back(ids.begin(), ids.end());
  }
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

BertBlendedDataset::BertBlendedDataset(std::vector<std::shared_ptr<const BertSampleSource>> parts,
                                       std::vector<double> weights, int64_t size)
    : parts_(std::move(parts)), map_(component_sizes(parts_), weights, size) {}

BertBlendedDataset::BertBlendedDataset(std::vector<std::shared_ptr<const BertSampleSource>> parts)
    : parts_(std::move(parts)), map_(component_sizes(parts_)) {}

BertSample BertBlendedDataset::sample(int64_t k) const {
  const auto [d, j] = map_.locate(k);
  BertSample s = parts_[size_t(d)]->sample(j);
  s.dataset_id = d;
  return s;
}

BertDatasets build_bert_datasets(const BertDataConfig& c, std::array<int64_t, 3> num_samples) {
  check_config(c);
  if (c.vocab->pad != 0)
    log_warn("the tokenizer's [PAD] id is ", c.vocab->pad, ", not 0: as Megatron, BERT samples pad types and "
             "padding_mask with it, so padding_mask does not mark padding as 0");
  DatasetFamily<BertSampleSource> family;
  family.unit = SplitUnit::Documents;
  family.make = [&c](const MidLevelRequest& r) -> std::shared_ptr<const BertSampleSource> {
    return std::make_shared<const BertMaskedWordPieceDataset>(r.data, r.split, r.range, r.num_samples, c,
                                                              r.split_string, r.split_matrix);
  };
  family.blend = [](std::vector<std::shared_ptr<const BertSampleSource>> parts,
                    const std::optional<std::vector<double>>& weights,
                    int64_t size) -> std::shared_ptr<const BertSampleSource> {
    if (!weights) return std::make_shared<const BertBlendedDataset>(std::move(parts));
    return std::make_shared<const BertBlendedDataset>(std::move(parts), *weights, size);
  };
  auto splits = build_blended_datasets(data_sources(c, c.vocab->size()), num_samples, family);
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
