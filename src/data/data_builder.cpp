// See data_builder.h.
#include "data/data_builder.h"

#include <cmath>
#include <cstdlib>
#include <filesystem>

#include "core/error.h"
#include "core/log.h"
#include "data/mock_gpt_dataset.h"

namespace megatron::data {

static std::optional<double> parse_number(const std::string& s) {
  if (s.empty()) return std::nullopt;
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  if (!end || *end != 0) return std::nullopt;
  return v;
}

Blend parse_blend(const std::vector<std::string>& args, const std::string& flag) {
  MG_REQUIRE(!args.empty(), flag, " is empty; give PREFIX or WEIGHT PREFIX pairs");
  Blend b;
  if (args.size() % 2 == 1) {
    b.prefixes = args;
    return b;
  }
  std::vector<double> w;
  size_t numeric = 0;
  for (size_t i = 0; i < args.size(); i += 2) numeric += parse_number(args[i]).has_value();
  if (numeric == 0) {
    b.prefixes = args;
    return b;
  }
  for (size_t i = 0; i < args.size(); i += 2) {
    auto v = parse_number(args[i]);
    MG_REQUIRE(v, flag, ": weight '", args[i], "' (position ", i + 1,
               ") is not a number; give WEIGHT PREFIX pairs like '0.3 data/a 0.7 data/b'");
    MG_REQUIRE(std::isfinite(*v) && *v >= 0, flag, ": weight ", args[i], " for ", args[i + 1],
               " must be a finite, non-negative number");
    w.push_back(*v);
    b.prefixes.push_back(args[i + 1]);
  }
  double sum = 0;
  for (double x : w) sum += x;
  MG_REQUIRE(sum > 0, flag, ": the weights sum to 0");
  b.weights = normalize_weights(w);
  return b;
}

GPTBatchOptions batch_options(const GPTDataConfig& c) {
  GPTBatchOptions o;
  o.eod_id = c.eod_id;
  o.pad_id = c.pad_id;
  o.reset_position_ids = c.reset_position_ids;
  o.reset_attention_mask = c.reset_attention_mask;
  o.eod_mask_loss = c.eod_mask_loss;
  o.vocab_size = c.vocab_size;
  return o;
}

std::array<int64_t, 3> train_valid_test_num_samples(int64_t train_samples, int64_t train_iters, int64_t gbs,
                                                    int64_t eval_interval, int64_t eval_iters) {
  int64_t train = train_samples >= 0 ? train_samples : train_iters * gbs;
  int64_t iters = train_samples >= 0 ? train_samples / gbs : train_iters;
  MG_REQUIRE(eval_interval > 0, "--eval-interval must be positive (got ", eval_interval, ")");
  int64_t evals = iters / eval_interval + 1;
  return {train, evals * eval_iters * gbs, eval_iters * gbs};
}

namespace {

// The largest token id a dataset dtype can hold.
double dtype_max_id(IndexDType d) {
  switch (d) {
    case IndexDType::U8: return 255;
    case IndexDType::I8: return 127;
    case IndexDType::I16: return 32767;
    case IndexDType::U16: return 65535;
    default: return 9.0e15;
  }
}

GPTDatasetOptions options_for(const GPTDataConfig& c, const std::string& split, const SplitMatrix& m) {
  GPTDatasetOptions o;
  o.seq_length = c.seq_length;
  o.seed = c.seed;
  o.split = split;
  o.split_matrix = m;
  o.data_cache_path = c.data_cache_path;
  o.tokenizer = c.tokenizer;
  o.pad_id = c.pad_id;
  o.use_cache = c.use_cache;
  return o;
}

}  // namespace

std::shared_ptr<const IndexedDataset> PrefixCache::open(const std::string& prefix, const std::string& flag,
                                                        int64_t vocab_size) {
  auto it = open_.find(prefix);
  if (it != open_.end()) return it->second;
  for (const auto& f : {index_file_path(prefix), data_file_path(prefix)})
    MG_REQUIRE(std::filesystem::exists(f), flag, ": dataset prefix '", prefix, "' has no ", f,
               " (give the path without .bin/.idx, as written by preprocess-data)");
  auto d = std::make_shared<const IndexedDataset>(prefix);
  // Megatron writes uint16 below 65500 ids and int32 above: a narrower dtype cannot hold this
  // vocabulary's ids (another tokenizer's dataset, or a changed dtype byte).
  MG_REQUIRE(vocab_size <= 0 || double(vocab_size - 1) <= dtype_max_id(d->dtype()), flag, ": dataset ",
             prefix, " stores tokens as ", index_dtype_name(d->dtype()), ", which cannot hold the ids of "
             "this run's vocabulary (", vocab_size, " tokens): it was made with another tokenizer, "
             "or its .idx dtype byte was changed; preprocess it again with this tokenizer");
  open_[prefix] = d;
  return d;
}

GPTDatasets build_gpt_datasets(const GPTDataConfig& c, std::array<int64_t, 3> n) {
  MG_REQUIRE(c.seq_length > 0, "--seq-length must be positive (got ", c.seq_length, ")");
  GPTDatasets out;
  std::shared_ptr<const SampleDataset>* slots[3] = {&out.train, &out.valid, &out.test};
  if (c.mock) {
    MG_REQUIRE(c.data_path.empty() && c.train_data_path.empty() && c.valid_data_path.empty() &&
                   c.test_data_path.empty(),
               "--mock-data cannot be combined with --data-path/--train-data-path/--valid-data-path/"
               "--test-data-path: keep one (Megatron builds mock data only when no blend is given)");
    // The mock documents hold the ids 1 .. 4094 (and EOD).
    MG_REQUIRE(c.vocab_size <= 0 || c.vocab_size >= MockGPTLowLevelDataset::kMaxSequenceLength - 1,
               "--mock-data: Megatron's mock documents hold token ids up to ",
               MockGPTLowLevelDataset::kMaxSequenceLength - 2, ", but the vocabulary has ", c.vocab_size,
               " tokens; use a larger --vocab-size (NullTokenizer) or another tokenizer");
    auto data = std::make_shared<const MockGPTLowLevelDataset>(c.eod_id);
    const std::string split = "1,1,1";  // BlendedMegatronDatasetConfig: "an arbitrarily even split"
    const SplitMatrix m = split_matrix(parse_split(split, "--split"));
    for (int s = 0; s < 3; ++s) {
      if (!m[size_t(s)]) continue;
      GPTDatasetOptions o = options_for(c, split, m);
      o.use_cache = c.use_cache && !c.data_cache_path.empty();
      const auto range = split_range(*m[size_t(s)], data->num_sequences());
      *slots[s] = std::make_shared<const GPTDataset>(data, Split(s), range,
                                                     blended_builder_detail::count(n[size_t(s)]), o);
    }
    return out;
  }
  DatasetFamily<SampleDataset> family;
  family.unit = SplitUnit::Sequences;
  family.make = [&c](const MidLevelRequest& r) -> std::shared_ptr<const SampleDataset> {
    return std::make_shared<const GPTDataset>(r.data, r.split, r.range, r.num_samples,
                                              options_for(c, r.split_string, r.split_matrix));
  };
  family.blend = [](std::vector<std::shared_ptr<const SampleDataset>> parts,
                    const std::optional<std::vector<double>>& weights,
                    int64_t size) -> std::shared_ptr<const SampleDataset> {
    if (!weights) return std::make_shared<const BlendedDataset>(std::move(parts));
    return std::make_shared<const BlendedDataset>(std::move(parts), *weights, size);
  };
  auto splits = build_blended_datasets(data_sources(c, c.vocab_size), n, family);
  out.train = splits[0];
  out.valid = splits[1];
  out.test = splits[2];
  return out;
}

}  // namespace megatron::data

namespace megatron::data {

std::vector<std::vector<int32_t>> first_training_samples(const GPTDataConfig& config,
                                                         std::array<int64_t, 3> num_samples, int64_t count) {
  MG_REQUIRE(count >= 0, "the number of samples to show must be >= 0 (got ", count, ")");
  auto ds = build_gpt_datasets(config, num_samples);
  MG_REQUIRE(ds.train, "the training split is empty (check --split / --train-data-path)");
  MG_REQUIRE(count <= ds.train->size(), "asked for ", count, " samples but the training dataset has ",
             ds.train->size());
  std::vector<std::vector<int32_t>> out;
  for (int64_t k = 0; k < count; ++k) out.push_back(ds.train->sample(k));
  return out;
}

}  // namespace megatron::data
