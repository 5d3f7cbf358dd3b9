// See masked_dataset.h.
#include "data/masked_dataset.h"

#include <filesystem>

#include "core/error.h"
#include "data/gpt_dataset.h"
#include "data/npy.h"

namespace megatron::data {

namespace fs = std::filesystem;

MaskedDatasetIndex::MaskedDatasetIndex(const IndexedDataset& data, Split split, std::pair<int64_t, int64_t> documents,
                                       std::optional<int64_t> num_samples, const std::string& class_name,
                                       const nlohmann::ordered_json& description,
                                       const MaskedSampleIndexParams& params,
                                       const std::optional<std::string>& cache_root)
    : class_name_(class_name), documents_(documents), num_samples_(num_samples) {
  MG_CHECK(documents.first >= 0 && documents.first < documents.second && documents.second <= data.num_documents());
  description_ = description.dump(4);
  hash_ = md5_hex(description_);
  if (cache_root)
    cache_dir_ = cache_root->empty() ? (fs::path(data.prefix()) / "cache" / (class_name + "_indices")).string()
                                     : *cache_root;
  if (!cache_dir_.empty() && try_load_cache(data, params)) {
    from_cache_ = true;
  } else {
    const auto docs = data.document_indices().subspan(size_t(documents.first),
                                                       size_t(documents.second - documents.first + 1));
    MaskedSampleIndexParams p = params;
    p.num_samples = num_samples;
    try {
      index_ = build_masked_sample_index(docs, data.sequence_lengths(), p);
    } catch (const Error& e) {
      MG_THROW(data.prefix(), " (", split_name(split), " split, documents [", documents.first, ", ",
               documents.second, ")): ", e.what());
    }
    if (!cache_dir_.empty()) write_cache();
  }
  MG_CHECK(!num_samples || index_.size() >= *num_samples);
}

std::string MaskedDatasetIndex::cache_file(const std::string& suffix) const {
  if (cache_dir_.empty()) return "";
  return (fs::path(cache_dir_) / (hash_ + "-" + class_name_ + "-" + suffix)).string();
}

bool MaskedDatasetIndex::try_load_cache(const IndexedDataset& data, const MaskedSampleIndexParams& p) {
  const std::vector<std::string> files = {cache_file("description.txt"), cache_file("sample_index.npy")};
  return load_index_cache(files, files[0], description_, cache_file("*"), [&] {
    auto a = read_npy(files[1]);
    MG_REQUIRE(a.shape.size() == 2 && a.shape[1] == 3, "the sample index is not [n, 3]");
    MG_REQUIRE(!num_samples_ || a.shape[0] >= *num_samples_, "the sample index is too short");
    const bool wide = data.num_sequences() > int64_t(UINT32_MAX);
    MG_REQUIRE(a.descr == (wide ? "<u8" : "<u4"), "the sample index dtype is ", a.descr);
    const auto docs = data.document_indices();
    const int64_t first = docs[size_t(documents_.first)], last = docs[size_t(documents_.second)];
    for (size_t r = 0; r < a.values.size(); r += 3) {
      const int64_t beg = a.values[r], end = a.values[r + 1], target = a.values[r + 2];
      MG_REQUIRE(beg >= first && end <= last && end - beg >= p.min_sentences && target >= 2 &&
                     target <= p.max_length,
                 "sample ", r / 3, " (", beg, ", ", end, ", ", target, ") is outside the split");
    }
    index_ = MaskedSampleIndex::from_rows(std::move(a.values), wide);
  });
}

void MaskedDatasetIndex::write_cache() const {
  write_index_cache(cache_dir_, cache_file("description.txt"), description_, [&] {
    write_npy_i64_as(cache_file("sample_index.npy"), index_.wide() ? "<u8" : "<u4", index_.rows(),
                     {index_.size(), 3});
  });
}

std::vector<std::vector<int64_t>> read_sentences(const IndexedDataset& data, int64_t beg, int64_t end,
                                                 int64_t vocab_size) {
  std::vector<std::vector<int64_t>> sentences;
  std::vector<int32_t> ids;
  for (int64_t s = beg; s < end; ++s) {
    ids.clear();
    data.read(s, 0, data.sequence_length(s), ids);
    for (int32_t id : ids)
      MG_REQUIRE(id >= 0 && id < vocab_size, data.prefix(), ": sentence ", s, " holds token id ", id,
                 ", outside the tokenizer's vocabulary of ", vocab_size,
                 " ids: the dataset was made with another tokenizer; preprocess it with this one");
    sentences.emplace_back(ids.begin(), ids.end());
  }
  return sentences;
}

void check_masking_flags(double mask_prob, double short_seq_prob, uint32_t seed, const char* family) {
  MG_REQUIRE(mask_prob > 0.0 && mask_prob < 1.0, "--mask-prob must be in (0, 1) (got ", mask_prob, ")");
  MG_REQUIRE(short_seq_prob >= 0.0 && short_seq_prob <= 1.0, "--short-seq-prob must be in [0, 1] (got ",
             short_seq_prob, ")");
  MG_REQUIRE(seed >= 1 && seed <= 2147483646u, "--seed must be in [1, 2147483646] for ", family, " data (got ",
             seed, "): Megatron's sample mapping takes it as a positive C int");
}

}  // namespace megatron::data
