// See gpt_dataset.h.
#include "data/gpt_dataset.h"

#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "core/log.h"
#include "data/blended_builder.h"
#include "data/npy.h"

namespace megatron::data {

namespace fs = std::filesystem;

std::string md5_hex(const std::string& msg) {
  static const uint32_t K[64] = {
      0xd76aa478, 0xe8c7b756, 0x242070db, 0xc1bdceee, 0xf57c0faf, 0x4787c62a, 0xa8304613, 0xfd469501,
      0x698098d8, 0x8b44f7af, 0xffff5bb1, 0x895cd7be, 0x6b901122, 0xfd987193, 0xa679438e, 0x49b40821,
      0xf61e2562, 0xc040b340, 0x265e5a51, 0xe9b6c7aa, 0xd62f105d, 0x02441453, 0xd8a1e681, 0xe7d3fbc8,
      0x21e1cde6, 0xc33707d6, 0xf4d50d87, 0x455a14ed, 0xa9e3e905, 0xfcefa3f8, 0x676f02d9, 0x8d2a4c8a,
      0xfffa3942, 0x8771f681, 0x6d9d6122, 0xfde5380c, 0xa4beea44, 0x4bdecfa9, 0xf6bb4b60, 0xbebfbc70,
      0x289b7ec6, 0xeaa127fa, 0xd4ef3085, 0x04881d05, 0xd9d4d039, 0xe6db99e5, 0x1fa27cf8, 0xc4ac5665,
      0xf4292244, 0x432aff97, 0xab9423a7, 0xfc93a039, 0x655b59c3, 0x8f0ccc92, 0xffeff47d, 0x85845dd1,
      0x6fa87e4f, 0xfe2ce6e0, 0xa3014314, 0x4e0811a1, 0xf7537e82, 0xbd3af235, 0x2ad7d2bb, 0xeb86d391};
  static const int R[64] = {7, 12, 17, 22, 7, 12, 17, 22, 7, 12, 17, 22, 7, 12, 17, 22, 5, 9,  14, 20, 5, 9,
                            14, 20, 5, 9,  14, 20, 5, 9,  14, 20, 4, 11, 16, 23, 4, 11, 16, 23, 4, 11, 16, 23,
                            4, 11, 16, 23, 6, 10, 15, 21, 6, 10, 15, 21, 6, 10, 15, 21, 6, 10, 15, 21};
  std::string m = msg;
  uint64_t bits = uint64_t(msg.size()) * 8;
  m.push_back(char(0x80));
  while (m.size() % 64 != 56) m.push_back(0);
  for (int i = 0; i < 8; ++i) m.push_back(char((bits >> (8 * i)) & 0xff));
  uint32_t h[4] = {0x67452301, 0xefcdab89, 0x98badcfe, 0x10325476};
  for (size_t off = 0; off < m.size(); off += 64) {
    uint32_t w[16];
    for (int i = 0; i < 16; ++i) {
      const auto* p = reinterpret_cast<const unsigned char*>(m.data() + off + 4 * size_t(i));
      w[i] = uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24;
    }
    uint32_t a = h[0], b = h[1], c = h[2], d = h[3];
    for (int i = 0; i < 64; ++i) {
      uint32_t f;
      int g;
      if (i < 16) { f = (b & c) | (~b & d); g = i; }
      else if (i < 32) { f = (d & b) | (~d & c); g = (5 * i + 1) % 16; }
      else if (i < 48) { f = b ^ c ^ d; g = (3 * i + 5) % 16; }
      else { f = c ^ (b | ~d); g = (7 * i) % 16; }
      uint32_t t = d;
      d = c;
      c = b;
      uint32_t x = a + f + K[i] + w[g];
      b = b + ((x << R[i]) | (x >> (32 - R[i])));
      a = t;
    }
    h[0] += a; h[1] += b; h[2] += c; h[3] += d;
  }
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (uint32_t v : h)
    for (int i = 0; i < 4; ++i) {
      unsigned byte = (v >> (8 * i)) & 0xff;
      out.push_back(hex[byte >> 4]);
      out.push_back(hex[byte & 15]);
    }
  return out;
}

nlohmann::ordered_json dataset_description(const std::string& class_name, const std::string& dataset_path,
                                           std::optional<int64_t> num_samples, Split split, uint32_t seed,
                                           int64_t sequence_length, const std::string& split_string,
                                           const SplitMatrix& split_matrix, const std::string& tokenizer) {
  // Key for key as Megatron's unique_identifiers (json.dumps(indent=4)).
  nlohmann::ordered_json d;
  d["class"] = class_name;
  d["dataset_path"] = dataset_path;
  d["num_samples"] = num_samples ? nlohmann::ordered_json(*num_samples) : nlohmann::ordered_json(nullptr);
  d["index_split"] = split_name(split);
  d["random_seed"] = seed;
  d["sequence_length"] = sequence_length;
  d["split"] = split_string;
  auto sm = nlohmann::ordered_json::array();
  for (auto& m : split_matrix)
    sm.push_back(m ? nlohmann::ordered_json({m->first, m->second}) : nlohmann::ordered_json(nullptr));
  d["split_matrix"] = sm;
  d["tokenizer"] = tokenizer;
  return d;
}

bool load_index_cache(const std::vector<std::string>& files, const std::string& description_file,
                      const std::string& description, const std::string& files_pattern,
                      const std::function<void()>& load) {
  for (const auto& f : files)
    if (!fs::exists(f)) return false;
  try {
    std::ifstream f(description_file, std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    MG_REQUIRE(ss.str() == description, "description differs");
    load();
    return true;
  } catch (const std::exception& e) {  // megatron::Error from the checks; anything else too
    log_warn("ignoring the index cache ", files_pattern, " (", e.what(), "); rebuilding it");
    return false;
  }
}

void write_index_cache(const std::string& dir, const std::string& description_file, const std::string& description,
                       const std::function<void()>& write) {
  try {
    std::error_code ec;
    fs::create_directories(dir, ec);
    MG_REQUIRE(!ec, "cannot create ", dir, ": ", ec.message());
    write();
    const std::string tmp = description_file + ".tmp" + std::to_string(::getpid());
    {
      std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
      f << description;
      MG_REQUIRE(f.good(), "cannot write ", tmp);
    }
    fs::rename(tmp, description_file, ec);
    MG_REQUIRE(!ec, "cannot rename ", tmp, ": ", ec.message());
  } catch (const Error& e) {
    log_warn("could not write the index cache in ", dir, " (", e.what(),
             "); continuing without it (set --data-cache-path to a writable folder)");
  }
}

GPTDataset::GPTDataset(std::shared_ptr<const LowLevelDataset> data, Split split, std::pair<int64_t, int64_t> range,
                       std::optional<int64_t> num_samples, const GPTDatasetOptions& options)
    : data_(std::move(data)), split_(split), options_(options) {
  MG_CHECK(data_);
  MG_CHECK(range.first >= 0 && range.first <= range.second && range.second <= data_->num_sequences());
  description_ = dataset_description("GPTDataset", data_->prefix(), num_samples, split, options.seed,
                                     options.seq_length, options.split, options.split_matrix, options.tokenizer)
                     .dump(4);
  hash_ = md5_hex(description_);
  if (options.use_cache)
    cache_dir_ = options.data_cache_path.empty() ? data_->prefix() + "/cache/GPTDataset_indices" : options.data_cache_path;

  if (!cache_dir_.empty() && try_load_cache()) {
    from_cache_ = true;
  } else {
    std::vector<int32_t> ids;
    for (int64_t i = range.first; i < range.second; ++i) ids.push_back(int32_t(i));
    GPTIndexParams p;
    p.seq_length = options.seq_length;
    p.seed = options.seed;
    p.num_samples = num_samples;
    p.drop_last_partial_sequence = split != Split::Valid || options.drop_last_partial_validation_sequence;
    try {
      indices_ = build_gpt_indices(data_->sequence_lengths(), ids, p);
    } catch (const Error& e) {
      MG_THROW(data_->prefix(), " (", split_name(split), " split, sequences [", range.first, ", ", range.second,
               ")): ", e.what());
    }
    if (!cache_dir_.empty()) write_cache();
  }
  MG_REQUIRE(!num_samples || size() >= *num_samples, data_->prefix(), ": ", split_name(split), " split has ", size(),
             " samples but ", *num_samples, " were requested");
}

std::string GPTDataset::cache_file(const std::string& suffix) const {
  if (cache_dir_.empty()) return "";
  return (fs::path(cache_dir_) / (hash_ + "-GPTDataset-" + split_name(split_) + "-" + suffix)).string();
}

bool GPTDataset::try_load_cache() {
  std::vector<std::string> files;
  for (const char* s : {"description.txt", "document_index.npy", "sample_index.npy", "shuffle_index.npy"})
    files.push_back(cache_file(s));
  return load_index_cache(files, files[0], description_, cache_file("*"), [&] {
    auto doc = read_npy(cache_file("document_index.npy"));
    auto smp = read_npy(cache_file("sample_index.npy"));
    auto shf = read_npy(cache_file("shuffle_index.npy"));
    MG_REQUIRE(doc.shape.size() == 1 && smp.shape.size() == 2 && smp.shape[1] == 2 && smp.shape[0] >= 1 &&
                   shf.shape.size() == 1 && shf.shape[0] == smp.shape[0] - 1,
               "index shapes disagree");
    const int64_t nseq = data_->num_sequences(), ndoc = int64_t(doc.values.size());
    auto lengths = data_->sequence_lengths();
    for (int64_t v : doc.values) MG_REQUIRE(v >= 0 && v < nseq, "document index out of range");
    for (size_t r = 0; r < smp.values.size(); r += 2) {
      int64_t pos = smp.values[r], off = smp.values[r + 1];
      MG_REQUIRE(pos >= 0 && pos < ndoc && off >= -1 && off < lengths[size_t(doc.values[size_t(pos)])],
                 "sample index out of range");
      if (r >= 2) MG_REQUIRE(pos > smp.values[r - 2] || (pos == smp.values[r - 2] && off >= smp.values[r - 1]),
                             "sample index not ascending");
    }
    const int64_t n = shf.shape[0];
    for (int64_t v : shf.values) MG_REQUIRE(v >= 0 && v < n, "shuffle index out of range");
    indices_ = GPTIndices{};
    indices_.document_index.assign(doc.values.begin(), doc.values.end());
    indices_.sample_index = std::move(smp.values);
    indices_.shuffle_index = std::move(shf.values);
  });
}

void GPTDataset::write_cache() const {
  write_index_cache(cache_dir_, cache_file("description.txt"), description_, [&] {
    int64_t n = size();
    int64_t max_len = 0;
    for (int32_t l : data_->sequence_lengths()) max_len = std::max<int64_t>(max_len, l);
    bool i32 = std::max<int64_t>(int64_t(indices_.document_index.size()), max_len) <= INT32_MAX;
    std::vector<int64_t> doc(indices_.document_index.begin(), indices_.document_index.end());
    write_npy_i64_as(cache_file("document_index.npy"), "<i4", doc, {int64_t(doc.size())});
    write_npy_i64_as(cache_file("sample_index.npy"), i32 ? "<i4" : "<i8", indices_.sample_index, {n + 1, 2});
    write_npy_i64_as(cache_file("shuffle_index.npy"), n >= int64_t(UINT32_MAX) - 1 ? "<i8" : "<u4",
                     indices_.shuffle_index, {n});
  });
}

std::vector<int32_t> GPTDataset::sample(int64_t k) const {
  MG_REQUIRE(k >= 0 && k < size(), "sample ", k, " is outside the dataset (", size(), " samples)");
  const auto& I = indices_;
  int64_t j = I.shuffle_index[size_t(k)];
  int64_t p0 = I.sample_index[size_t(2 * j)], o0 = I.sample_index[size_t(2 * j + 1)];
  int64_t p1 = I.sample_index[size_t(2 * j + 2)], o1 = I.sample_index[size_t(2 * j + 3)];
  std::vector<int32_t> out;
  out.reserve(size_t(options_.seq_length + 1));
  if (p0 == p1) {
    data_->read(I.document_index[size_t(p0)], o0, o1 - o0 + 1, out);
  } else {
    int32_t first = I.document_index[size_t(p0)];
    data_->read(first, o0, data_->sequence_length(first) - o0, out);
    for (int64_t p = p0 + 1; p < p1; ++p) {
      int32_t d = I.document_index[size_t(p)];
      data_->read(d, 0, data_->sequence_length(d), out);
    }
    data_->read(I.document_index[size_t(p1)], 0, o1 + 1, out);
  }
  out.resize(size_t(options_.seq_length + 1), options_.pad_id);
  return out;
}

BlendedDataset::BlendedDataset(std::vector<std::shared_ptr<const SampleDataset>> datasets, std::vector<double> weights,
                               int64_t size)
    : datasets_(std::move(datasets)), map_(component_sizes(datasets_), weights, size) {}

BlendedDataset::BlendedDataset(std::vector<std::shared_ptr<const SampleDataset>> datasets)
    : datasets_(std::move(datasets)), map_(component_sizes(datasets_)) {}

std::vector<int32_t> BlendedDataset::sample(int64_t k) const {
  const auto [d, j] = map_.locate(k);
  return datasets_[size_t(d)]->sample(j);
}

}  // namespace megatron::data
