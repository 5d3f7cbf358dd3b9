// MMIDIDX v1 reader and writer. See indexed_dataset.h for the layout. The reader validates the
// whole index on open (O(N)) so later accesses need only cheap bounds checks; tokens are copied
// out with memcpy, so no access depends on the alignment of the mapping.
#include "data/indexed_dataset.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>

#include "core/error.h"
#include "core/input_bounds.h"

static_assert(std::endian::native == std::endian::little,
              "the indexed dataset format is little-endian; big-endian hosts are not supported");

namespace megatron::data {

namespace {

constexpr char kMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};
constexpr uint64_t kVersion = 1;
constexpr size_t kHeaderSize = 34;

std::string errno_text() { return std::strerror(errno); }

// A file descriptor closed on scope exit.
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

template <typename T>
T load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

template <typename T>
void convert_out(const uint8_t* src, int64_t n, int32_t* dst, const std::string& prefix) {
  for (int64_t k = 0; k < n; ++k) {
    T v = load<T>(src + k * int64_t(sizeof(T)));
    if constexpr (sizeof(T) >= 4 && !std::is_same_v<T, int32_t>) {
      MG_REQUIRE(v >= T(std::numeric_limits<int32_t>::min()) &&
                     v <= T(std::numeric_limits<int32_t>::max()),
                 "token value ", double(v), " in ", prefix, ".bin does not fit in int32");
    }
    dst[k] = int32_t(v);
  }
}

template <typename T>
void convert_in(std::span<const int32_t> tokens, uint8_t* dst, const std::string& prefix,
                IndexDType dtype) {
  for (size_t k = 0; k < tokens.size(); ++k) {
    int32_t v = tokens[k];
    if constexpr (std::is_integral_v<T> && sizeof(T) < 4) {
      MG_REQUIRE(v >= int32_t(std::numeric_limits<T>::min()) &&
                     v <= int32_t(std::numeric_limits<T>::max()),
                 "token id ", v, " does not fit the ", index_dtype_name(dtype), " dtype of ",
                 prefix, " (choose a wider dtype for this vocabulary)");
    }
    T t = T(v);
    std::memcpy(dst + k * sizeof(T), &t, sizeof(T));
  }
}

}  // namespace

IndexDType optimal_token_dtype(int64_t vocab_size) {
  return vocab_size < 65500 ? IndexDType::U16 : IndexDType::I32;
}

bool is_valid_index_dtype_code(uint8_t code) { return code >= 1 && code <= 8; }

size_t index_dtype_size(IndexDType dtype) {
  switch (dtype) {
    case IndexDType::U8:
    case IndexDType::I8: return 1;
    case IndexDType::I16:
    case IndexDType::U16: return 2;
    case IndexDType::I32:
    case IndexDType::F32: return 4;
    case IndexDType::I64:
    case IndexDType::F64: return 8;
  }
  MG_CHECK(false, "bad IndexDType ", int(dtype));
  return 0;
}

const char* index_dtype_name(IndexDType dtype) {
  switch (dtype) {
    case IndexDType::U8: return "uint8";
    case IndexDType::I8: return "int8";
    case IndexDType::I16: return "int16";
    case IndexDType::I32: return "int32";
    case IndexDType::I64: return "int64";
    case IndexDType::F64: return "float64";
    case IndexDType::F32: return "float32";
    case IndexDType::U16: return "uint16";
  }
  return "invalid";
}

std::string data_file_path(const std::string& prefix) { return prefix + ".bin"; }
std::string index_file_path(const std::string& prefix) { return prefix + ".idx"; }

// ------------------------------------------------------------------------------------ reader

IndexedDataset::IndexedDataset(const std::string& prefix) try : prefix_(prefix) {
  const std::string idx_path = index_file_path(prefix);
  const std::string bin_path = data_file_path(prefix);

  // --- index file: read whole (it is small next to the .bin) and validate.
  Fd idx;
  idx.fd = ::open(idx_path.c_str(), O_RDONLY | O_CLOEXEC);
  MG_REQUIRE(idx.fd >= 0, "cannot open index file ", idx_path, ": ", errno_text(),
             " (a dataset prefix names PREFIX.idx and PREFIX.bin; pass it without extension)");
  struct stat st {};
  MG_REQUIRE(::fstat(idx.fd, &st) == 0, "cannot stat ", idx_path, ": ", errno_text());
  const uint64_t idx_size = uint64_t(st.st_size);
  MG_REQUIRE(idx_size >= kHeaderSize, "index file ", idx_path, " is truncated: ", idx_size,
             " bytes, shorter than the 34-byte MMIDIDX header");

  auto read_at = [&](void* dst, uint64_t n, uint64_t off) {
    uint8_t* p = static_cast<uint8_t*>(dst);
    while (n > 0) {
      ssize_t r = ::pread(idx.fd, p, n, off_t(off));
      if (r < 0 && errno == EINTR) continue;
      MG_REQUIRE(r > 0, "cannot read ", idx_path, " at byte ", off, ": ",
                 r < 0 ? errno_text() : std::string("unexpected end of file"));
      p += r;
      n -= uint64_t(r);
      off += uint64_t(r);
    }
  };

  uint8_t header[kHeaderSize];
  read_at(header, kHeaderSize, 0);
  MG_REQUIRE(std::memcmp(header, kMagic, 9) == 0, "index file ", idx_path,
             " does not start with the MMIDIDX magic: not a Megatron indexed dataset (or the "
             "legacy pre-2021 format, which is not supported)");
  const uint64_t version = load<uint64_t>(header + 9);
  MG_REQUIRE(version == kVersion, "index file ", idx_path, " has version ", version,
             "; only MMIDIDX version 1 is supported");
  const uint8_t code = header[17];
  MG_REQUIRE(is_valid_index_dtype_code(code), "index file ", idx_path, " has invalid dtype code ",
             int(code), " (valid codes are 1..8)");
  dtype_ = IndexDType(code);
  const uint64_t n = load<uint64_t>(header + 18);
  const uint64_t d = load<uint64_t>(header + 26);
  // Bound the counts by the file size first, so the size arithmetic below cannot overflow.
  MG_REQUIRE(n <= idx_size / 12 && d <= idx_size / 8, "index file ", idx_path,
             " is corrupted or truncated: header claims ", n, " sequences and ", d,
             " document boundaries but the file has only ", idx_size, " bytes");
  const uint64_t expected = kHeaderSize + 12 * n + 8 * d;
  // Multimodal datasets append one i8 mode per sequence; the modes are ignored here.
  MG_REQUIRE(idx_size == expected || idx_size == expected + n, "index file ", idx_path,
             " has ", idx_size, " bytes but its header (", n, " sequences, ", d,
             " document boundaries) implies ", expected,
             " bytes: the file is truncated or corrupted");
  MG_REQUIRE(d >= 1, "index file ", idx_path,
             " is corrupted: document_count is 0 (it must be at least 1)");

  lengths_.resize(n);
  pointers_.resize(n);
  document_indices_.resize(d);
  if (n) read_at(lengths_.data(), 4 * n, kHeaderSize);
  if (n) read_at(pointers_.data(), 8 * n, kHeaderSize + 4 * n);
  read_at(document_indices_.data(), 8 * d, kHeaderSize + 12 * n);

  // --- data file
  Fd bin;
  bin.fd = ::open(bin_path.c_str(), O_RDONLY | O_CLOEXEC);
  MG_REQUIRE(bin.fd >= 0, "cannot open data file ", bin_path, ": ", errno_text());
  MG_REQUIRE(::fstat(bin.fd, &st) == 0, "cannot stat ", bin_path, ": ", errno_text());
  bin_size_ = size_t(st.st_size);

  const int64_t item = int64_t(index_dtype_size(dtype_));
  num_tokens_ = 0;
  for (uint64_t i = 0; i < n; ++i) {
    const int64_t len = lengths_[i], ptr = pointers_[i];
    MG_REQUIRE(len >= 0, "index file ", idx_path, " is corrupted: sequence ", i,
               " has negative length ", len);
    MG_REQUIRE(ptr >= 0 && uint64_t(ptr) <= bin_size_ &&
                   uint64_t(len * item) <= bin_size_ - uint64_t(ptr),
               "sequence ", i, " of ", idx_path, " (byte offset ", ptr, ", ", len, " x ", item,
               " bytes) lies outside data file ", bin_path, " (", bin_size_,
               " bytes): the .bin is truncated or does not belong to this .idx");
    num_tokens_ += len;
  }
  // Megatron's writer (and ours) lays the sequences out back to back from byte 0, so every
  // pointer is the sum of the lengths before it times the element size, and the .bin holds
  // exactly those bytes. This catches what the bounds above cannot: a dtype byte changed (the
  // pointers advance by another element size), a .bin of another dataset, lengths or pointers
  // altered within bounds.
  // The element size the offsets and the .bin's size are consistent with, if not the dtype's:
  // then the dtype byte is what was changed.
  auto layout_element_size = [&]() -> uint64_t {
    for (uint64_t k : {1, 2, 4, 8}) {
      uint64_t at = 0;
      bool fits = true;
      for (uint64_t i = 0; i < n && fits; ++i) {
        fits = uint64_t(pointers_[i]) == at;
        at += uint64_t(lengths_[i]) * k;
      }
      if (fits && at == bin_size_) return k;
    }
    return 0;
  };
  uint64_t expected_pointer = 0;
  for (uint64_t i = 0; i < n; ++i) {
    if (uint64_t(pointers_[i]) != expected_pointer) {
      const uint64_t k = layout_element_size();
      if (k != 0 && k != uint64_t(item))
        MG_THROW("index file ", idx_path, " is corrupted: its sequence offsets and ", bin_path,
                 " advance by ", k, " bytes per token but the dtype byte says ",
                 index_dtype_name(dtype_), " (", item, " bytes); the dtype byte was changed");
      MG_THROW("index file ", idx_path, " is corrupted: sequence ", i, " starts at byte ",
               pointers_[i], " of ", bin_path, " but the sequences before it end at byte ",
               expected_pointer, " (sequences are stored back to back; a length or an offset was "
               "altered)");
    }
    expected_pointer += uint64_t(lengths_[i]) * uint64_t(item);
  }
  MG_REQUIRE(expected_pointer == bin_size_, "data file ", bin_path, " has ", bin_size_,
             " bytes but ", idx_path, " describes ", num_tokens_, " tokens of ", item, " bytes (",
             expected_pointer, " bytes): the .bin does not belong to this .idx (or one of them was "
             "truncated, extended or rewritten)");
  MG_REQUIRE(document_indices_[0] == 0, "index file ", idx_path,
             " is corrupted: document_indices must start with 0, found ", document_indices_[0]);
  for (uint64_t k = 1; k < d; ++k)
    MG_REQUIRE(document_indices_[k] >= document_indices_[k - 1], "index file ", idx_path,
               " is corrupted: document_indices decrease at entry ", k, " (",
               document_indices_[k - 1], " then ", document_indices_[k], ")");
  MG_REQUIRE(uint64_t(document_indices_[d - 1]) == n, "index file ", idx_path,
             " is corrupted: the last document index is ", document_indices_[d - 1],
             " but there are ", n, " sequences");

  if (bin_size_ > 0) {
    void* p = ::mmap(nullptr, bin_size_, PROT_READ, MAP_SHARED, bin.fd, 0);
    MG_REQUIRE(p != MAP_FAILED, "cannot memory-map ", bin_path, ": ", errno_text());
    bin_ = static_cast<const uint8_t*>(p);
  }
} MG_CATCH_OUT_OF_MEMORY(prefix + " (.idx/.bin)")

IndexedDataset::~IndexedDataset() {
  if (bin_) ::munmap(const_cast<uint8_t*>(bin_), bin_size_);
}

IndexedDataset::IndexedDataset(IndexedDataset&& o) noexcept
    : prefix_(std::move(o.prefix_)),
      dtype_(o.dtype_),
      lengths_(std::move(o.lengths_)),
      pointers_(std::move(o.pointers_)),
      document_indices_(std::move(o.document_indices_)),
      num_tokens_(o.num_tokens_),
      bin_(o.bin_),
      bin_size_(o.bin_size_) {
  o.bin_ = nullptr;
  o.bin_size_ = 0;
}

IndexedDataset& IndexedDataset::operator=(IndexedDataset&& o) noexcept {
  if (this != &o) {
    if (bin_) ::munmap(const_cast<uint8_t*>(bin_), bin_size_);
    prefix_ = std::move(o.prefix_);
    dtype_ = o.dtype_;
    lengths_ = std::move(o.lengths_);
    pointers_ = std::move(o.pointers_);
    document_indices_ = std::move(o.document_indices_);
    num_tokens_ = o.num_tokens_;
    bin_ = o.bin_;
    bin_size_ = o.bin_size_;
    o.bin_ = nullptr;
    o.bin_size_ = 0;
  }
  return *this;
}

int64_t IndexedDataset::sequence_length(int64_t i) const {
  MG_REQUIRE(i >= 0 && i < num_sequences(), "sequence index ", i, " is out of range for ",
             prefix_, " (", num_sequences(), " sequences)");
  return lengths_[size_t(i)];
}

std::span<const uint8_t> IndexedDataset::raw_bytes(int64_t i) const {
  const int64_t len = sequence_length(i);
  const size_t bytes = size_t(len) * index_dtype_size(dtype_);
  if (bytes == 0) return {};
  return {bin_ + pointers_[size_t(i)], bytes};
}

void IndexedDataset::read(int64_t i, int64_t offset, int64_t length,
                          std::vector<int32_t>& out) const {
  const int64_t len = sequence_length(i);
  MG_REQUIRE(offset >= 0 && length >= 0 && offset <= len && length <= len - offset,
             "token range [", offset, ", ", offset + length, ") is outside sequence ", i, " of ",
             prefix_, " (length ", len, ")");
  if (length == 0) return;
  const size_t item = index_dtype_size(dtype_);
  const uint8_t* src = bin_ + pointers_[size_t(i)] + size_t(offset) * item;
  const size_t base = out.size();
  out.resize(base + size_t(length));
  int32_t* dst = out.data() + base;
  const std::string& p = prefix_;
  switch (dtype_) {
    case IndexDType::U8: convert_out<uint8_t>(src, length, dst, p); break;
    case IndexDType::I8: convert_out<int8_t>(src, length, dst, p); break;
    case IndexDType::I16: convert_out<int16_t>(src, length, dst, p); break;
    case IndexDType::U16: convert_out<uint16_t>(src, length, dst, p); break;
    case IndexDType::I32: std::memcpy(dst, src, size_t(length) * 4); break;
    case IndexDType::I64: convert_out<int64_t>(src, length, dst, p); break;
    case IndexDType::F32: convert_out<float>(src, length, dst, p); break;
    case IndexDType::F64: convert_out<double>(src, length, dst, p); break;
  }
}

std::vector<int32_t> IndexedDataset::get(int64_t i) const {
  std::vector<int32_t> out;
  read(i, 0, sequence_length(i), out);
  return out;
}

// ------------------------------------------------------------------------------------ writer

namespace {

std::string temp_name(const std::string& final_path) {
  return final_path + ".tmp" + std::to_string(::getpid());
}

void write_all(int fd, const void* data, size_t n, const std::string& path) {
  const uint8_t* p = static_cast<const uint8_t*>(data);
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    MG_REQUIRE(w > 0, "cannot write ", path, ": ", errno_text());
    p += w;
    n -= size_t(w);
  }
}

void fsync_directory(const std::string& file_path) {
  std::filesystem::path dir = std::filesystem::path(file_path).parent_path();
  if (dir.empty()) dir = ".";
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {
    ::fsync(fd);  // best effort: some file systems refuse fsync on directories
    ::close(fd);
  }
}

constexpr size_t kBufferSize = 1 << 20;

}  // namespace

IndexedDatasetBuilder::IndexedDatasetBuilder(const std::string& prefix, IndexDType dtype)
    : prefix_(prefix), dtype_(dtype) {
  MG_REQUIRE(is_valid_index_dtype_code(uint8_t(dtype)), "invalid dtype code ", int(dtype));
  tmp_bin_ = temp_name(data_file_path(prefix));
  tmp_idx_ = temp_name(index_file_path(prefix));
  bin_fd_ = ::open(tmp_bin_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  MG_REQUIRE(bin_fd_ >= 0, "cannot create ", tmp_bin_, ": ", errno_text(),
             " (check that the output folder exists and is writable)");
  buffer_.reserve(kBufferSize);
}

IndexedDatasetBuilder::~IndexedDatasetBuilder() {
  if (!finalized_) remove_temporaries();
}

void IndexedDatasetBuilder::remove_temporaries() noexcept {
  if (bin_fd_ >= 0) {
    ::close(bin_fd_);
    bin_fd_ = -1;
  }
  ::unlink(tmp_bin_.c_str());
  ::unlink(tmp_idx_.c_str());
}

void IndexedDatasetBuilder::flush_buffer() {
  if (!buffer_.empty()) write_all(bin_fd_, buffer_.data(), buffer_.size(), tmp_bin_);
  buffer_.clear();
}

void IndexedDatasetBuilder::write_bytes(const void* data, size_t n) {
  if (buffer_.size() + n > kBufferSize) flush_buffer();
  if (n >= kBufferSize) {
    write_all(bin_fd_, data, n, tmp_bin_);
    return;
  }
  const uint8_t* p = static_cast<const uint8_t*>(data);
  buffer_.insert(buffer_.end(), p, p + n);
}

void IndexedDatasetBuilder::add_item(std::span<const int32_t> tokens) {
  MG_CHECK(!finalized_, "add_item after finalize");
  MG_REQUIRE(tokens.size() <= size_t(std::numeric_limits<int32_t>::max()), "a sequence of ",
             tokens.size(), " tokens exceeds the format's 2^31-1 limit per sequence (", prefix_,
             "); use --split-sentences or shorter documents");
  const size_t item = index_dtype_size(dtype_);
  const size_t bytes = tokens.size() * item;
  if (dtype_ == IndexDType::I32) {
    write_bytes(tokens.data(), bytes);
  } else {
    // Convert in bounded chunks straight into the write buffer.
    constexpr size_t kChunk = 1 << 16;
    for (size_t start = 0; start < tokens.size(); start += kChunk) {
      auto part = tokens.subspan(start, std::min(kChunk, tokens.size() - start));
      if (buffer_.size() + part.size() * item > kBufferSize) flush_buffer();
      const size_t base = buffer_.size();
      buffer_.resize(base + part.size() * item);
      uint8_t* dst = buffer_.data() + base;
      switch (dtype_) {
        case IndexDType::U8: convert_in<uint8_t>(part, dst, prefix_, dtype_); break;
        case IndexDType::I8: convert_in<int8_t>(part, dst, prefix_, dtype_); break;
        case IndexDType::I16: convert_in<int16_t>(part, dst, prefix_, dtype_); break;
        case IndexDType::U16: convert_in<uint16_t>(part, dst, prefix_, dtype_); break;
        case IndexDType::I32: break;
        case IndexDType::I64: convert_in<int64_t>(part, dst, prefix_, dtype_); break;
        case IndexDType::F32: convert_in<float>(part, dst, prefix_, dtype_); break;
        case IndexDType::F64: convert_in<double>(part, dst, prefix_, dtype_); break;
      }
    }
  }
  lengths_.push_back(int32_t(tokens.size()));
  num_tokens_ += int64_t(tokens.size());
}

void IndexedDatasetBuilder::end_document() {
  MG_CHECK(!finalized_, "end_document after finalize");
  document_indices_.push_back(int64_t(lengths_.size()));
}

void IndexedDatasetBuilder::add_document(std::span<const int32_t> tokens,
                                         std::span<const int32_t> lengths) {
  size_t start = 0;
  for (int32_t len : lengths) {
    MG_CHECK(len >= 0 && size_t(len) <= tokens.size() - start,
             "add_document: lengths exceed the token count");
    add_item(tokens.subspan(start, size_t(len)));
    start += size_t(len);
  }
  MG_CHECK(start == tokens.size(), "add_document: lengths sum to ", start, " but there are ",
           tokens.size(), " tokens");
  end_document();
}

void IndexedDatasetBuilder::add_index(const std::string& other_prefix) {
  MG_CHECK(!finalized_, "add_index after finalize");
  IndexedDataset other(other_prefix);
  MG_REQUIRE(other.dtype() == dtype_, "cannot merge ", other_prefix, " (dtype ",
             index_dtype_name(other.dtype()), ") into ", prefix_, " (dtype ",
             index_dtype_name(dtype_), "): all datasets must have the same dtype");
  const int64_t offset = int64_t(lengths_.size());
  // Copy the token bytes, coalescing runs of adjacent sequences into one write.
  const int64_t n = other.num_sequences();
  int64_t i = 0;
  while (i < n) {
    auto first = other.raw_bytes(i);
    const uint8_t* run_start = first.data();
    size_t run_bytes = first.size();
    int64_t j = i + 1;
    while (j < n) {
      auto next = other.raw_bytes(j);
      if (!next.empty() && run_start && next.data() != run_start + run_bytes) break;
      if (!run_start) run_start = next.data();
      run_bytes += next.size();
      ++j;
    }
    if (run_bytes) write_bytes(run_start, run_bytes);
    i = j;
  }
  auto other_lengths = other.sequence_lengths();
  lengths_.insert(lengths_.end(), other_lengths.begin(), other_lengths.end());
  num_tokens_ += other.num_tokens();
  auto docs = other.document_indices();
  for (size_t k = 1; k < docs.size(); ++k) document_indices_.push_back(offset + docs[k]);
}

void IndexedDatasetBuilder::finalize() {
  MG_CHECK(!finalized_, "finalize called twice");
  const std::string final_bin = data_file_path(prefix_);
  const std::string final_idx = index_file_path(prefix_);
  try {
    flush_buffer();
    MG_REQUIRE(::fsync(bin_fd_) == 0, "cannot fsync ", tmp_bin_, ": ", errno_text());
    MG_REQUIRE(::close(bin_fd_) == 0, "cannot close ", tmp_bin_, ": ", errno_text());
    bin_fd_ = -1;

    Fd idx;
    idx.fd = ::open(tmp_idx_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    MG_REQUIRE(idx.fd >= 0, "cannot create ", tmp_idx_, ": ", errno_text());
    const uint64_t n = lengths_.size(), d = document_indices_.size();
    uint8_t header[kHeaderSize];
    std::memcpy(header, kMagic, 9);
    std::memcpy(header + 9, &kVersion, 8);
    header[17] = uint8_t(dtype_);
    std::memcpy(header + 18, &n, 8);
    std::memcpy(header + 26, &d, 8);
    write_all(idx.fd, header, kHeaderSize, tmp_idx_);
    write_all(idx.fd, lengths_.data(), 4 * n, tmp_idx_);
    // Pointers are byte offsets, recomputed from the lengths in 64-bit (as Megatron does).
    const int64_t item = int64_t(index_dtype_size(dtype_));
    std::vector<int64_t> pointers;
    pointers.reserve(std::min<uint64_t>(n, 1 << 20));
    int64_t ptr = 0;
    for (uint64_t i = 0; i < n; ++i) {
      pointers.push_back(ptr);
      ptr += int64_t(lengths_[i]) * item;
      if (pointers.size() == (1u << 20)) {
        write_all(idx.fd, pointers.data(), 8 * pointers.size(), tmp_idx_);
        pointers.clear();
      }
    }
    write_all(idx.fd, pointers.data(), 8 * pointers.size(), tmp_idx_);
    write_all(idx.fd, document_indices_.data(), 8 * d, tmp_idx_);
    MG_REQUIRE(::fsync(idx.fd) == 0, "cannot fsync ", tmp_idx_, ": ", errno_text());
    MG_REQUIRE(::close(idx.fd) == 0, "cannot close ", tmp_idx_, ": ", errno_text());
    idx.fd = -1;

    // A stale .idx from an earlier run must not pair with the new .bin, even for a moment.
    if (::unlink(final_idx.c_str()) != 0)
      MG_REQUIRE(errno == ENOENT, "cannot replace ", final_idx, ": ", errno_text());
    MG_REQUIRE(::rename(tmp_bin_.c_str(), final_bin.c_str()) == 0, "cannot rename ", tmp_bin_,
               " to ", final_bin, ": ", errno_text());
    MG_REQUIRE(::rename(tmp_idx_.c_str(), final_idx.c_str()) == 0, "cannot rename ", tmp_idx_,
               " to ", final_idx, ": ", errno_text());
    fsync_directory(final_idx);
    finalized_ = true;
  } catch (...) {
    remove_temporaries();
    throw;
  }
}

}  // namespace megatron::data
