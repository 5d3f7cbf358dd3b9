// See t5_dataset.h.
#include "data/t5_dataset.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/log.h"
#include "data/gpt_dataset.h"

namespace megatron::data {

namespace {

constexpr const char* kClassName = "T5MaskedWordPieceDataset";
constexpr int64_t kSpecialTokens = 2;  // one [BOS] and one [EOS]
constexpr int64_t kMaxNgram = 10;      // pretrain_t5.py's masking_max_ngram

void check_config(const T5DataConfig& c) {
  MG_REQUIRE(c.vocab, "the T5 dataset needs the tokenizer's vocabulary (wordpiece_vocab)");
  MG_REQUIRE(!c.vocab->sentinels.empty(),
             "T5 needs sentinel tokens: give --vocab-extra-ids N (N > 0; Megatron's T5 uses 100) so that the "
             "tokenizer adds <extra_id_0> .. <extra_id_{N-1}>");
  MG_REQUIRE(c.encoder_seq_length >= 4, "--encoder-seq-length ", c.encoder_seq_length,
             " is too short for T5: samples hold up to --encoder-seq-length - 2 tokens of text and need at least "
             "2, so it must be at least 4");
  MG_REQUIRE(c.decoder_seq_length >= 3, "--decoder-seq-length ", c.decoder_seq_length,
             " is too short for T5: a masked span needs [BOS], a sentinel and the span's tokens, so it must be at "
             "least 3 (Megatron's T5 uses 128 for an encoder of 512)");
  check_masking_flags(c.mask_prob, c.short_seq_prob, c.seed, "T5");
}

MaskedSampleIndexParams index_params(const T5DataConfig& c) {
  MaskedSampleIndexParams p;
  p.max_length = int32_t(c.encoder_seq_length - kSpecialTokens);
  p.short_seq_prob = c.short_seq_prob;
  p.seed = int32_t(c.seed);
  p.min_sentences = 1;
  return p;
}

nlohmann::ordered_json t5_description(const IndexedDataset& data, Split split, std::optional<int64_t> num_samples,
                                      const T5DataConfig& config, const std::string& split_string,
                                      const SplitMatrix& split_matrix) {
  check_config(config);
  auto d = dataset_description(kClassName, data.prefix(), num_samples, split, config.seed, config.encoder_seq_length,
                               split_string, split_matrix, config.tokenizer);
  d["masking_probability"] = config.mask_prob;
  d["short_sequence_probability"] = config.short_seq_prob;
  d["masking_max_ngram"] = kMaxNgram;
  d["masking_do_full_word"] = true;
  d["masking_do_permutation"] = false;
  d["masking_use_longer_ngrams"] = false;
  d["masking_use_geometric_distribution"] = true;
  d["sequence_length_decoder"] = config.decoder_seq_length;
  return d;
}

}  // namespace

T5MaskedWordPieceDataset::T5MaskedWordPieceDataset(std::shared_ptr<const IndexedDataset> data, Split split,
                                                   std::pair<int64_t, int64_t> documents,
                                                   std::optional<int64_t> num_samples, const T5DataConfig& config,
                                                   const std::string& split_string, const SplitMatrix& split_matrix)
    : MaskedDatasetIndex(*data, split, documents, num_samples, kClassName,
                         t5_description(*data, split, num_samples, config, split_string, split_matrix),
                         index_params(config),
                         config.use_cache ? std::optional<std::string>(config.data_cache_path) : std::nullopt),
      data_(std::move(data)),
      config_(config) {
  // Megatron takes documents of one sentence too (each a sample cut to the target length), so data
  // preprocessed without --split-sentences is not an error; but most of each document is lost.
  const auto docs = data_->document_indices();
  bool split_sentences = false;
  for (int64_t d = documents.first; d < documents.second && !split_sentences; ++d)
    split_sentences = docs[size_t(d) + 1] - docs[size_t(d)] > 1;
  if (!split_sentences)
    log_warn(data_->prefix(), ": no document of the ", split_name(split), " split has more than one sentence: "
             "was it preprocessed without --split-sentences? Each document then gives one sample cut to "
             "--encoder-seq-length - 2 tokens");
}

T5Sample T5MaskedWordPieceDataset::sample(int64_t k) const {
  MG_REQUIRE(k >= 0 && k < size(), "sample ", k, " is outside the dataset (", size(), " samples)");
  const auto [beg, end, target] = sample_index().row(k);
  const WordPieceVocab& vocab = *config_.vocab;
  const auto sentences = read_sentences(*data_, beg, end, vocab.size());
  NumpyRandomState rng(uint32_t((uint64_t(config_.seed) + uint64_t(k)) % (uint64_t(1) << 32)));
  MG_CHECK(target <= config_.encoder_seq_length);

  std::vector<int64_t> tokens;
  for (const auto& s : sentences) tokens.insert(tokens.end(), s.begin(), s.end());
  T5Sample out;
  out.truncated = int64_t(tokens.size()) > target;
  if (out.truncated) tokens.resize(size_t(target));

  MaskingConfig masking;
  masking.masking_probability = config_.mask_prob;
  masking.max_ngram = kMaxNgram;
  masking.use_geometric_distribution = true;
  const int64_t mask_id = vocab.mask;
  auto token_mask = [mask_id](NumpyRandomState&) -> std::optional<int64_t> { return mask_id; };
  const MaskedPredictions m = create_masked_lm_predictions(tokens, target, vocab, masking, rng, token_mask);

  const size_t spans = m.spans.size();
  MG_REQUIRE(spans <= vocab.sentinels.size(), data_->prefix(), ": T5 sample ", k, " masks ", spans,
             " spans but --vocab-extra-ids gives only ", vocab.sentinels.size(),
             " sentinels; raise --vocab-extra-ids to at least floor(--mask-prob * (--encoder-seq-length - 2)) = ",
             int64_t(std::floor(config_.mask_prob * double(config_.encoder_seq_length - kSpecialTokens))));
  std::vector<int64_t>& enc = out.text_enc;
  std::vector<int64_t>& dec = out.text_dec;
  std::vector<int64_t>& labels = out.labels;
  dec.push_back(vocab.bos);
  size_t from = 0;
  for (size_t i = 0; i < spans; ++i) {
    const std::vector<int64_t>& span = m.spans[i];
    const int64_t sentinel = vocab.sentinels[i];
    enc.insert(enc.end(), m.tokens.begin() + std::ptrdiff_t(std::min(from, size_t(span.front()))),
               m.tokens.begin() + std::ptrdiff_t(span.front()));
    enc.push_back(sentinel);
    dec.push_back(sentinel);
    labels.push_back(sentinel);
    for (int64_t p : span) {
      dec.push_back(tokens[size_t(p)]);
      labels.push_back(tokens[size_t(p)]);
    }
    from = size_t(span.back()) + 1;
  }
  enc.insert(enc.end(), m.tokens.begin() + std::ptrdiff_t(std::min(from, m.tokens.size())), m.tokens.end());
  labels.push_back(vocab.eos);

  const size_t se = size_t(config_.encoder_seq_length), sd = size_t(config_.decoder_seq_length);
  const size_t enc_len = enc.size(), dec_len = dec.size();
  MG_CHECK(enc_len <= se);
  MG_REQUIRE(dec_len <= sd, data_->prefix(), ": T5 sample ", k, " needs ", dec_len, " decoder positions ([BOS], ",
             spans, " sentinels and ", m.positions.size(), " masked tokens) but --decoder-seq-length is ", sd,
             "; raise --decoder-seq-length (at most 1 + 2 * floor(--mask-prob * (--encoder-seq-length - 2)) = ",
             1 + 2 * int64_t(std::floor(config_.mask_prob * double(config_.encoder_seq_length - kSpecialTokens))),
             " are ever needed)");
  enc.resize(se, vocab.pad);
  dec.resize(sd, vocab.pad);
  labels.resize(sd, -1);
  out.loss_mask.assign(dec_len, 1);
  out.loss_mask.resize(sd, 0);
  out.enc_mask.assign(enc_len, 1);
  out.enc_mask.resize(se, 0);
  out.dec_mask = out.loss_mask;
  return out;
}

T5Datasets build_t5_datasets(const T5DataConfig& c, std::array<int64_t, 3> num_samples) {
  check_config(c);
  const int64_t max_spans = int64_t(std::floor(c.mask_prob * double(c.encoder_seq_length - kSpecialTokens)));
  if (max_spans > int64_t(c.vocab->sentinels.size()))
    log_warn("--vocab-extra-ids gives ", c.vocab->sentinels.size(), " sentinels but a sample of --encoder-seq-length ",
             c.encoder_seq_length, " can mask up to ", max_spans, " spans: as in Megatron, a sample that needs more "
             "fails when it is read");
  auto splits = build_masked_datasets<T5MaskedWordPieceDataset, T5Sample>(c, num_samples);
  return {splits[0], splits[1], splits[2]};
}

T5Batch make_t5_batch(const T5SampleSource& dataset, std::span<const int64_t> sample_ids) {
  MG_REQUIRE(!sample_ids.empty(), "a T5 batch needs at least one sample");
  std::vector<T5Sample> samples;
  for (int64_t k : sample_ids) samples.push_back(dataset.sample(k));
  const int64_t b = int64_t(samples.size());
  const int64_t se = int64_t(samples[0].text_enc.size()), sd = int64_t(samples[0].text_dec.size());
  T5Batch out;
  out.tokens_enc = Tensor::empty({b, se}, DType::I32);
  out.enc_mask = Tensor::empty({b, se}, DType::I32);
  out.tokens_dec = Tensor::empty({b, sd}, DType::I32);
  out.labels = Tensor::empty({b, sd}, DType::I32);
  out.loss_mask = Tensor::empty({b, sd}, DType::F32);
  out.dec_mask = Tensor::empty({b, sd}, DType::I32);
  for (int64_t r = 0; r < b; ++r) {
    const T5Sample& x = samples[size_t(r)];
    MG_CHECK(int64_t(x.text_enc.size()) == se && int64_t(x.text_dec.size()) == sd,
             "T5 samples of different lengths in one batch");
    for (int64_t i = 0; i < se; ++i) {
      out.tokens_enc.data<int32_t>()[r * se + i] = int32_t(x.text_enc[size_t(i)]);
      out.enc_mask.data<int32_t>()[r * se + i] = int32_t(x.enc_mask[size_t(i)]);
    }
    for (int64_t i = 0; i < sd; ++i) {
      const size_t j = size_t(i), o = size_t(r * sd + i);
      out.tokens_dec.data<int32_t>()[o] = int32_t(x.text_dec[j]);
      out.labels.data<int32_t>()[o] = int32_t(x.labels[j]);
      out.loss_mask.data<float>()[o] = float(x.loss_mask[j]);
      out.dec_mask.data<int32_t>()[o] = int32_t(x.dec_mask[j]);
    }
  }
  out.sample_ids.assign(sample_ids.begin(), sample_ids.end());
  return out;
}

namespace {

// _build_b1ss_attention_mask: [b, 1, q, kv], 1 where query or key id is < 1 (or key after query).
Tensor b1ss_mask(const Tensor& queries, const Tensor& keys, bool causal) {
  const int64_t b = queries.shape()[0], q = queries.shape()[1], kv = keys.shape()[1];
  Tensor out = Tensor::empty({b, 1, q, kv}, DType::U8);
  uint8_t* o = out.data<uint8_t>();
  for (int64_t r = 0; r < b; ++r)
    for (int64_t i = 0; i < q; ++i)
      for (int64_t j = 0; j < kv; ++j) {
        const bool attend = keys.data<int32_t>()[r * kv + j] >= 1 && queries.data<int32_t>()[r * q + i] >= 1 &&
                            (!causal || j <= i);
        o[(r * q + i) * kv + j] = attend ? 0 : 1;
      }
  return out;
}

}  // namespace

T5AttentionMasks t5_local_attention_masks(const T5Batch& batch) {
  T5AttentionMasks m;
  m.enc_mask = b1ss_mask(batch.tokens_enc, batch.tokens_enc, false);
  m.dec_mask = b1ss_mask(batch.tokens_dec, batch.tokens_dec, true);
  m.enc_dec_mask = b1ss_mask(batch.tokens_dec, batch.tokens_enc, false);
  return m;
}

std::string t5_sample_json(const T5Sample& s) {
  nlohmann::ordered_json j;
  if (s.dataset_id) j["dataset_id"] = *s.dataset_id;
  j["text_enc"] = s.text_enc;
  j["text_dec"] = s.text_dec;
  j["labels"] = s.labels;
  j["loss_mask"] = s.loss_mask;
  j["truncated"] = s.truncated;
  j["enc_mask"] = s.enc_mask;
  j["dec_mask"] = s.dec_mask;
  return j.dump();
}

}  // namespace megatron::data
