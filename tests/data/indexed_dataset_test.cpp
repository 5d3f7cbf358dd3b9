// Indexed dataset: byte-exact format on a hand-computed example, round trips in every dtype,
// cross-checks with the NumPy implementation of Megatron's reader/writer, merging, and
// corrupted or truncated files (each must give megatron::Error, never a crash).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "data/indexed_dataset.h"
#include "test_util.h"

namespace megatron::data {
namespace {

using megatron::testing::read_file;
using megatron::testing::run_command;
using megatron::testing::source_dir;
using megatron::testing::TempDir;
using megatron::testing::write_file;
namespace fs = std::filesystem;

std::string le(uint64_t v, int bytes) {
  std::string s;
  for (int i = 0; i < bytes; ++i) s.push_back(char((v >> (8 * i)) & 0xff));
  return s;
}

// Documents as lists of sequences.
using Docs = std::vector<std::vector<std::vector<int32_t>>>;

void write_docs(const std::string& prefix, IndexDType dtype, const Docs& docs) {
  IndexedDatasetBuilder b(prefix, dtype);
  for (const auto& doc : docs) {
    std::vector<int32_t> tokens, lengths;
    for (const auto& seq : doc) {
      tokens.insert(tokens.end(), seq.begin(), seq.end());
      lengths.push_back(int32_t(seq.size()));
    }
    b.add_document(tokens, lengths);
  }
  b.finalize();
}

void expect_docs(const IndexedDataset& ds, const Docs& docs) {
  ASSERT_EQ(ds.num_documents(), int64_t(docs.size()));
  int64_t seq = 0;
  for (size_t d = 0; d < docs.size(); ++d) {
    ASSERT_EQ(ds.document_indices()[d], seq);
    for (const auto& s : docs[d]) EXPECT_EQ(ds.get(seq++), s);
  }
  EXPECT_EQ(ds.num_sequences(), seq);
}

std::string python() { return "/usr/bin/python3 '" + (source_dir() / "tests/reference/megatron_indexed.py").string() + "'"; }

TEST(IndexedDataset, ByteExactTinyExample) {
  TempDir dir;
  const std::string prefix = (dir / "tiny").string();
  write_docs(prefix, IndexDType::U16, {{{5, 6, 7}}, {{8, 9}}});
  std::string idx = std::string("MMIDIDX\0\0", 9) + le(1, 8) + le(8, 1) + le(2, 8) + le(3, 8) +
                    le(3, 4) + le(2, 4) + le(0, 8) + le(6, 8) + le(0, 8) + le(1, 8) + le(2, 8);
  ASSERT_EQ(idx.size(), 82u);
  EXPECT_EQ(read_file(prefix + ".idx"), idx);
  EXPECT_EQ(read_file(prefix + ".bin"), le(5, 2) + le(6, 2) + le(7, 2) + le(8, 2) + le(9, 2));
  // Nothing else is left in the folder (temporary files were renamed).
  EXPECT_EQ(std::distance(fs::directory_iterator(dir.path()), fs::directory_iterator()), 2);
}

TEST(IndexedDataset, RoundTripEveryDtypeWithSentencesAndEmptyDocuments) {
  TempDir dir;
  const Docs docs = {{{1, 2, 3}, {4}}, {}, {{}}, {{120, 0, 7}}, {{9}, {10, 11}, {12}}};
  for (uint8_t code = 1; code <= 8; ++code) {
    const std::string prefix = (dir / ("d" + std::to_string(code))).string();
    write_docs(prefix, IndexDType(code), docs);
    IndexedDataset ds(prefix);
    EXPECT_EQ(ds.dtype(), IndexDType(code));
    expect_docs(ds, docs);
    EXPECT_EQ(ds.num_tokens(), 11);
    std::vector<int32_t> part;
    ds.read(5, 1, 1, part);  // sequence 5 is {10, 11}
    EXPECT_EQ(part, std::vector<int32_t>{11});
    EXPECT_EQ(ds.sequence_pointers()[5], 8 * int64_t(index_dtype_size(IndexDType(code))));
  }
}

TEST(IndexedDataset, OptimalDtypeAndRangeChecks) {
  EXPECT_EQ(optimal_token_dtype(50257), IndexDType::U16);
  EXPECT_EQ(optimal_token_dtype(65499), IndexDType::U16);
  EXPECT_EQ(optimal_token_dtype(65500), IndexDType::I32);
  TempDir dir;
  {
    IndexedDatasetBuilder b((dir / "r").string(), IndexDType::U16);
    std::vector<int32_t> big = {70000};
    EXPECT_THROW(b.add_item(big), Error);
  }
  EXPECT_FALSE(fs::exists(dir / "r.bin"));
  EXPECT_EQ(std::distance(fs::directory_iterator(dir.path()), fs::directory_iterator()), 0)
      << "temporary files must be removed when the builder is dropped";
  write_docs((dir / "x").string(), IndexDType::I32, {{{1, 2}}});
  IndexedDataset ds((dir / "x").string());
  std::vector<int32_t> out;
  EXPECT_THROW(ds.read(0, 1, 2, out), Error);
  EXPECT_THROW(ds.read(1, 0, 0, out), Error);
  EXPECT_THROW(ds.sequence_length(-1), Error);
}

TEST(IndexedDataset, UnwritableFolderIsAClearError) {
  try {
    IndexedDatasetBuilder b("/nonexistent-folder/x", IndexDType::U16);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent-folder/x.bin"), std::string::npos);
  }
}

TEST(IndexedDataset, NumpyReadsOurFiles) {
  TempDir dir;
  const Docs docs = {{{1, 2, 3}, {4}}, {}, {{70000, 5}}, {{9}}};
  const std::string prefix = (dir / "ours").string();
  write_docs(prefix, IndexDType::I32, docs);
  auto r = run_command(python() + " read '" + prefix + "'");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto j = nlohmann::json::parse(r.output);
  EXPECT_EQ(j["dtype"], "int32");
  EXPECT_EQ(j["sequence_lengths"], nlohmann::json({3, 1, 2, 1}));
  EXPECT_EQ(j["sequence_pointers"], nlohmann::json({0, 12, 16, 24}));
  EXPECT_EQ(j["document_indices"], nlohmann::json({0, 2, 2, 3, 4}));
  EXPECT_EQ(j["sequences"], nlohmann::json({{1, 2, 3}, {4}, {70000, 5}, {9}}));
}

TEST(IndexedDataset, WeReadNumpyFilesAndMergeIdentically) {
  TempDir dir;
  const Docs a = {{{1, 2, 3}, {4}}, {}, {{7, 5}}};
  const Docs b = {{{9}}, {{10, 11, 12}}};
  for (const char* dtype : {"uint16", "int32"}) {
    const std::string pa = (dir / (std::string("a_") + dtype)).string();
    const std::string pb = (dir / (std::string("b_") + dtype)).string();
    auto r = run_command("echo '[[[1,2,3],[4]],[],[[7,5]]]' | " + python() + " write '" + pa + "' " + dtype);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    r = run_command("echo '[[[9]],[[10,11,12]]]' | " + python() + " write '" + pb + "' " + dtype);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    IndexedDataset da(pa);
    EXPECT_EQ(da.dtype(), std::string(dtype) == "int32" ? IndexDType::I32 : IndexDType::U16);
    expect_docs(da, a);
    // Our files are byte-identical to NumPy's for the same documents.
    const std::string ours = (dir / (std::string("ours_") + dtype)).string();
    write_docs(ours, da.dtype(), a);
    EXPECT_EQ(read_file(ours + ".idx"), read_file(pa + ".idx"));
    EXPECT_EQ(read_file(ours + ".bin"), read_file(pa + ".bin"));
    // Merging: ours vs Megatron's add_index logic.
    const std::string m_np = (dir / (std::string("m_np_") + dtype)).string();
    r = run_command(python() + " merge '" + m_np + "' '" + pa + "' '" + pb + "'");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const std::string m = (dir / (std::string("m_") + dtype)).string();
    {
      IndexedDatasetBuilder builder(m, da.dtype());
      builder.add_index(pa);
      builder.add_index(pb);
      builder.finalize();
    }
    EXPECT_EQ(read_file(m + ".idx"), read_file(m_np + ".idx"));
    EXPECT_EQ(read_file(m + ".bin"), read_file(m_np + ".bin"));
    Docs all = a;
    all.insert(all.end(), b.begin(), b.end());
    expect_docs(IndexedDataset(m), all);
  }
  // Mismatched dtypes cannot be merged.
  IndexedDatasetBuilder builder((dir / "mix").string(), IndexDType::U16);
  builder.add_index((dir / "a_uint16").string());
  EXPECT_THROW(builder.add_index((dir / "a_int32").string()), Error);
}

// Every corruption must raise an Error that names the file.
void expect_error(const std::string& prefix, const std::string& needle) {
  try {
    IndexedDataset ds(prefix);
    ADD_FAILURE() << "opening " << prefix << " should fail with '" << needle << "'";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find(needle), std::string::npos) << msg;
    EXPECT_NE(msg.find(prefix), std::string::npos) << msg;
  }
}

TEST(IndexedDataset, CorruptedAndTruncatedFiles) {
  TempDir dir;
  const std::string good = (dir / "good").string();
  write_docs(good, IndexDType::U16, {{{1, 2, 3}, {4}}, {{5, 6}}});
  const std::string idx = read_file(good + ".idx"), bin = read_file(good + ".bin");
  const std::string p = (dir / "bad").string();
  auto with = [&](const std::string& i, const std::string& b) {
    write_file(p + ".idx", i);
    write_file(p + ".bin", b);
  };
  // Every truncation of the .idx.
  for (size_t n = 0; n < idx.size(); ++n) {
    with(idx.substr(0, n), bin);
    EXPECT_THROW(IndexedDataset ds(p), Error) << "idx truncated to " << n;
  }
  with(idx.substr(0, 20), bin);
  expect_error(p, "truncated");
  // Every truncation of the .bin.
  for (size_t n = 0; n < bin.size(); ++n) {
    with(idx, bin.substr(0, n));
    EXPECT_THROW(IndexedDataset ds(p), Error) << "bin truncated to " << n;
  }
  with(idx, bin.substr(0, 5));
  expect_error(p, "outside data file");
  auto patched = [&](size_t off, const std::string& bytes) {
    std::string s = idx;
    s.replace(off, bytes.size(), bytes);
    return s;
  };
  with(patched(0, "XMIDIDX"), bin);
  expect_error(p, "magic");
  with(patched(9, le(2, 8)), bin);
  expect_error(p, "version 2");
  with(patched(17, le(9, 1)), bin);
  expect_error(p, "dtype code 9");
  with(patched(18, le(1ull << 62, 8)), bin);
  expect_error(p, "corrupted or truncated");
  with(patched(18, le(2, 8)), bin);  // N smaller than the arrays
  expect_error(p, "implies");
  with(patched(34, le(uint32_t(-1), 4)), bin);  // negative length
  expect_error(p, "negative length");
  with(patched(34 + 12, le(1000, 8)), bin);  // pointer past the end
  expect_error(p, "outside data file");
  const size_t docs_off = 34 + 12 * 3;
  with(patched(docs_off, le(1, 8)), bin);
  expect_error(p, "start with 0");
  with(patched(docs_off + 8, le(3, 8)), bin);  // 0 3 3 ok-ish, then...
  IndexedDataset ok(p);                     // monotone and ending at N: valid (empty last doc)
  EXPECT_EQ(ok.num_documents(), 2);
  with(patched(docs_off + 16, le(2, 8)), bin);
  expect_error(p, "last document index");
  with(patched(docs_off + 8, le(3, 8)).substr(0, docs_off + 8) + le(3, 8) + le(1, 8), bin);
  expect_error(p, "decrease");
  // Within bounds but not what any writer produces: a length or an offset altered.
  with(patched(34, le(2, 4)), bin);  // first sequence 3 -> 2 tokens
  expect_error(p, "starts at byte");
  with(patched(34 + 12 + 8, le(4, 8)), bin);  // second sequence's offset 6 -> 4
  expect_error(p, "starts at byte 4");
  // The dtype byte changed uint16 -> uint8: the offsets still advance by 2 bytes per token.
  with(patched(17, le(1, 1)), bin);
  expect_error(p, "advance by 2 bytes per token but the dtype byte says uint8");
  // A .bin of another dataset (or one extended): its size does not match.
  with(idx, bin + std::string(4, '\0'));
  expect_error(p, "does not belong to this .idx");
  {
    const std::string other = (dir / "other").string();
    write_docs(other, IndexDType::U16, {{{9, 9, 9, 9}}, {{9}}, {{9, 9, 9, 9, 9}}});
    with(idx, read_file(other + ".bin"));
    expect_error(p, "does not belong to this .idx");
  }
  // Missing files.
  fs::remove(p + ".bin");
  with(idx, bin);
  fs::remove(p + ".bin");
  expect_error(p, "cannot open data file");
  expect_error((dir / "nothing").string(), "cannot open index file");
}

// Random byte corruptions of the .idx: opening either fails with Error or yields the same tokens
// (only a document boundary can move undetected: the format has no checksum), never a dataset
// that reads other bytes.
TEST(IndexedDataset, RandomCorruptionsNeverReadOutOfBounds) {
  TempDir dir;
  const std::string good = (dir / "good").string();
  write_docs(good, IndexDType::I32, {{{1, 2, 3}, {4}}, {}, {{5, 6}}, {{7}}});
  const std::string idx = read_file(good + ".idx"), bin = read_file(good + ".bin");
  const std::string p = (dir / "bad").string();
  write_file(p + ".bin", bin);
  uint64_t state = 12345;
  auto next = [&] {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return state >> 33;
  };
  IndexedDataset original(good);
  int opened = 0, changed = 0;
  for (int trial = 0; trial < 500; ++trial) {
    std::string s = idx;
    const int flips = 1 + int(next() % 3);
    for (int f = 0; f < flips; ++f) s[next() % s.size()] = char(next() & 0xff);
    write_file(p + ".idx", s);
    try {
      IndexedDataset ds(p);
      ++opened;
      changed += s != idx;
      ASSERT_EQ(ds.num_sequences(), original.num_sequences()) << trial;
      for (int64_t i = 0; i < ds.num_sequences(); ++i) EXPECT_EQ(ds.get(i), original.get(i)) << trial;
    } catch (const Error&) {
    }
  }
  EXPECT_LT(changed, 25) << opened;  // only some document-boundary changes pass
}

TEST(IndexedDataset, MultimodalModesAreIgnored) {
  TempDir dir;
  const std::string p = (dir / "mm").string();
  write_docs(p, IndexDType::U16, {{{1, 2}}, {{3}}});
  write_file(p + ".idx", read_file(p + ".idx") + std::string("\0\0", 2));  // one mode per sequence
  IndexedDataset ds(p);
  EXPECT_EQ(ds.get(1), std::vector<int32_t>{3});
}

}  // namespace
}  // namespace megatron::data
