// Megatron's indexed dataset (MMIDIDX v1): PREFIX.bin holds the token ids of every sequence,
// concatenated, in one element dtype; PREFIX.idx holds the index:
//
//   offset        size     field
//   0             9        magic "MMIDIDX\0\0"
//   9             8        u64 version = 1
//   17            1        u8 dtype code (IndexDType)
//   18            8        u64 sequence_count N
//   26            8        u64 document_count D+1 (length of document_indices)
//   34            4N       i32 sequence_lengths (elements)
//   34+4N         8N       i64 sequence_pointers (byte offsets into .bin)
//   34+12N        8(D+1)   i64 document_indices (0, ..., N; document k = sequences [d[k], d[k+1]))
//
// Little-endian, no padding. Worked example: two documents [5 6 7] and [8 9] as uint16 give a
// 34+8+16+24 = 82-byte .idx (N=2, D+1=3, lengths 3 2, pointers 0 6, documents 0 1 2) and a
// 10-byte .bin.
//
// Reading: the .bin is memory-mapped; the three index arrays are copied into aligned memory on
// open (their file offsets are never naturally aligned) and validated in full, so any truncated
// or corrupted pair gives a megatron::Error naming the file and the defect instead of an
// out-of-bounds read. Access to a sequence is O(1).
// Writing: IndexedDatasetBuilder writes both files under temporary names and renames them into
// place only in finalize(), so an interrupted run never leaves a pair that looks complete.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace megatron::data {

// Megatron's dtype codes (megatron/core/datasets/indexed_dataset.py, DType).
enum class IndexDType : uint8_t { U8 = 1, I8 = 2, I16 = 3, I32 = 4, I64 = 5, F64 = 6, F32 = 7, U16 = 8 };

// uint16 if vocab_size < 65500 else int32 (Megatron's DType.optimal_dtype).
IndexDType optimal_token_dtype(int64_t vocab_size);
// Bytes per element.
size_t index_dtype_size(IndexDType dtype);
// NumPy name: "uint16", "int32", ...
const char* index_dtype_name(IndexDType dtype);
// Whether `code` is one of the eight codes above.
bool is_valid_index_dtype_code(uint8_t code);

// PREFIX.bin / PREFIX.idx
std::string data_file_path(const std::string& prefix);
std::string index_file_path(const std::string& prefix);

// What a GPTDataset reads its documents from (Megatron's "low-level dataset"): an indexed
// dataset on disk, or the synthetic documents of --mock-data (data/mock_gpt_dataset.h).
class LowLevelDataset {
 public:
  virtual ~LowLevelDataset() = default;
  virtual int64_t num_sequences() const = 0;
  virtual std::span<const int32_t> sequence_lengths() const = 0;
  virtual int64_t sequence_length(int64_t i) const = 0;
  // Appends tokens [offset, offset+length) of sequence i, as int32, to `out`; throws
  // megatron::Error when the range is outside the sequence.
  virtual void read(int64_t i, int64_t offset, int64_t length, std::vector<int32_t>& out) const = 0;
  // The path prefix ("" for data that has no files).
  virtual const std::string& prefix() const = 0;
};

class IndexedDataset : public LowLevelDataset {
 public:
  // Opens PREFIX.idx and PREFIX.bin and validates them; throws megatron::Error on any defect.
  explicit IndexedDataset(const std::string& prefix);
  ~IndexedDataset();
  IndexedDataset(const IndexedDataset&) = delete;
  IndexedDataset& operator=(const IndexedDataset&) = delete;
  IndexedDataset(IndexedDataset&&) noexcept;
  IndexedDataset& operator=(IndexedDataset&&) noexcept;

  int64_t num_sequences() const override { return int64_t(lengths_.size()); }
  // document_count - 1
  int64_t num_documents() const { return int64_t(document_indices_.size()) - 1; }
  // Sum of all sequence lengths.
  int64_t num_tokens() const { return num_tokens_; }
  IndexDType dtype() const { return dtype_; }
  std::span<const int32_t> sequence_lengths() const override { return lengths_; }
  std::span<const int64_t> sequence_pointers() const { return pointers_; }
  std::span<const int64_t> document_indices() const { return document_indices_; }
  int64_t sequence_length(int64_t i) const override;
  // Appends tokens [offset, offset+length) of sequence i, converted to int32, to `out`.
  // Throws megatron::Error when the range is outside the sequence.
  void read(int64_t i, int64_t offset, int64_t length, std::vector<int32_t>& out) const override;
  std::vector<int32_t> get(int64_t i) const;
  // Raw bytes of sequence i in the file's dtype (for byte copies, e.g. merging).
  std::span<const uint8_t> raw_bytes(int64_t i) const;
  const std::string& prefix() const override { return prefix_; }

 private:
  std::string prefix_;
  IndexDType dtype_ = IndexDType::U16;
  std::vector<int32_t> lengths_;
  std::vector<int64_t> pointers_;
  std::vector<int64_t> document_indices_;
  int64_t num_tokens_ = 0;
  const uint8_t* bin_ = nullptr;  // mmap of PREFIX.bin (nullptr when it is empty)
  size_t bin_size_ = 0;
};

class IndexedDatasetBuilder {
 public:
  // Creates PREFIX.bin/.idx under temporary names beside the final ones.
  IndexedDatasetBuilder(const std::string& prefix, IndexDType dtype);
  // Removes the temporary files unless finalize() succeeded.
  ~IndexedDatasetBuilder();
  IndexedDatasetBuilder(const IndexedDatasetBuilder&) = delete;
  IndexedDatasetBuilder& operator=(const IndexedDatasetBuilder&) = delete;

  // Appends one sequence. Ids must fit the dtype (e.g. 0..65535 for uint16).
  void add_item(std::span<const int32_t> tokens);
  // Closes the current document (a boundary after the last added sequence).
  void end_document();
  // Appends tokens as sequences of the given lengths (they must sum to tokens.size()) and closes
  // the document.
  void add_document(std::span<const int32_t> tokens, std::span<const int32_t> lengths);
  // Appends all of another dataset (its dtype must equal ours); its .bin bytes are copied.
  void add_index(const std::string& other_prefix);
  // Flushes and fsyncs both files, then renames them into place (.bin first, .idx last).
  void finalize();

  int64_t num_sequences() const { return int64_t(lengths_.size()); }
  int64_t num_documents() const { return int64_t(document_indices_.size()) - 1; }
  int64_t num_tokens() const { return num_tokens_; }
  IndexDType dtype() const { return dtype_; }
  const std::string& prefix() const { return prefix_; }

 private:
  void write_bytes(const void* data, size_t n);
  void flush_buffer();
  void remove_temporaries() noexcept;

  std::string prefix_;
  IndexDType dtype_;
  std::string tmp_bin_, tmp_idx_;
  int bin_fd_ = -1;
  std::vector<uint8_t> buffer_;
  std::vector<int32_t> lengths_;
  std::vector<int64_t> document_indices_{0};
  int64_t num_tokens_ = 0;
  bool finalized_ = false;
};

}  // namespace megatron::data
