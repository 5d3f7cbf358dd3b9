// --mock-data: Megatron's MockGPTLowLevelDataset / MockGPTDataset against
// tests/reference/numpy_gpt_indices.py's "mock" request (numpy.random.default_rng(0) lengths,
// documents 1 .. L-1 EOD, split 1,1,1, GPTDataset indices written from Megatron's source), plus
// the generator's first values and the builder's errors.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "data/data_builder.h"
#include "data/mock_gpt_dataset.h"
#include "test_util.h"

namespace megatron::data {
namespace {

using nlohmann::json;

TEST(MockGPTData, LengthsAreNumpysDefaultRng) {
  // numpy 1.24: default_rng(0).integers(1, 4096, size=100000, dtype=int32)[:5], [-3:], sum.
  MockGPTLowLevelDataset d(63999);
  ASSERT_EQ(d.num_sequences(), 100000);
  const auto L = d.sequence_lengths();
  EXPECT_EQ(std::vector<int32_t>(L.begin(), L.begin() + 5), (std::vector<int32_t>{3484, 2609, 2094, 1105, 1261}));
  EXPECT_EQ(std::vector<int32_t>(L.end() - 3, L.end()), (std::vector<int32_t>{61, 100, 769}));
  int64_t sum = 0;
  for (int32_t l : L) sum += l;
  EXPECT_EQ(sum, 204637097);
  // The first raw 64-bit output of PCG64 seeded with SeedSequence(0).
  NumpyPCG64 rng(0);
  EXPECT_EQ(rng.next_uint64(), 11749869230777074271ULL);
  // Document 3 (length 1105): 1 2 ... 1104 EOD; a slice of it.
  std::vector<int32_t> out;
  d.read(3, 0, 1105, out);
  ASSERT_EQ(out.size(), 1105u);
  for (int32_t k = 0; k < 1104; ++k) ASSERT_EQ(out[size_t(k)], k + 1);
  EXPECT_EQ(out.back(), 63999);
  out.clear();
  d.read(3, 1100, 5, out);
  EXPECT_EQ(out, (std::vector<int32_t>{1101, 1102, 1103, 1104, 63999}));
  EXPECT_THROW(d.read(3, 1100, 6, out), Error);
}

GPTDataConfig mock_config(int64_t seq_length, int32_t eod) {
  GPTDataConfig c;
  c.mock = true;
  c.split = "90,10,0";  // ignored: Megatron forces 1,1,1 for mock data
  c.seq_length = seq_length;
  c.seed = 1234;
  c.eod_id = eod;
  c.vocab_size = 64000;
  return c;
}

TEST(MockGPTData, SamplesEqualMegatronsConstruction) {
  // Long sequences keep the reference's Python loop over one epoch's samples short.
  const int64_t S = 1024;
  const int32_t eod = 63999;
  const std::array<int64_t, 3> n = {100, 40, 8};
  const GPTDatasets ds = build_gpt_datasets(mock_config(S, eod), n);
  ASSERT_TRUE(ds.train && ds.valid && ds.test);  // 1,1,1: every split has a third
  // The reference, one request per split.
  testing::TempDir dir;
  std::string in;
  for (int split = 0; split < 3; ++split)
    in += json{{"op", "mock"}, {"split", split}, {"num_samples", n[size_t(split)]}, {"seq_length", S},
               {"seed", 1234}, {"eod", eod}, {"count", 6}}.dump() + "\n";
  testing::write_file(dir / "req.jsonl", in);
  const auto script = (testing::source_dir() / "tests/reference/numpy_gpt_indices.py").string();
  const auto res = testing::run_command("/usr/bin/python3 '" + script + "' < '" + (dir / "req.jsonl").string() + "'");
  ASSERT_EQ(res.exit_code, 0) << res.output;
  std::istringstream lines(res.output);
  const SampleDataset* splits[3] = {ds.train.get(), ds.valid.get(), ds.test.get()};
  const std::pair<int64_t, int64_t> ranges[3] = {{0, 33333}, {33333, 66667}, {66667, 100000}};
  for (int split = 0; split < 3; ++split) {
    std::string line;
    ASSERT_TRUE(std::getline(lines, line));
    const json ref = json::parse(line);
    EXPECT_EQ(ref["lengths_sum"], 204637097);
    EXPECT_EQ(ref["range"][0], ranges[split].first);
    EXPECT_EQ(ref["range"][1], ranges[split].second);
    for (int k = 0; k < 6; ++k)
      EXPECT_EQ(json(splits[split]->sample(k)), ref["samples"][size_t(k)]) << "split " << split << " sample " << k;
  }
}

TEST(MockGPTData, BuilderErrorsNameTheFlags) {
  GPTDataConfig c = mock_config(16, 63);
  c.data_path = {"somewhere"};
  try {
    build_gpt_datasets(c, {10, 10, 10});
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--mock-data cannot be combined with --data-path"), std::string::npos) << e.what();
  }
  c = mock_config(16, 63);
  c.vocab_size = 64;  // the documents hold ids up to 4094
  try {
    build_gpt_datasets(c, {10, 10, 10});
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--mock-data: Megatron's mock documents hold token ids up to 4094"),
              std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace megatron::data
