// `megatron inspect-data --samples K`: the first K training samples from the training data flags.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <sstream>

#include "data/data_builder.h"
#include "data/indexed_dataset.h"
#include "test_util.h"

using namespace megatron::data;
using megatron::testing::run_cli;
using megatron::testing::TempDir;

namespace {
void write_counting_dataset(const std::string& prefix, int ndocs) {
  IndexedDatasetBuilder b(prefix, IndexDType::U16);
  for (int d = 0; d < ndocs; ++d) {
    std::vector<int32_t> t;
    for (int i = 0; i < 5 + d % 7; ++i) t.push_back(1 + (d * 13 + i) % 500);
    t.push_back(0);
    b.add_item(t);
    b.end_document();
  }
  b.finalize();
}
}  // namespace

TEST(InspectSamplesCli, IdsMatchTheLibrary) {
  TempDir dir;
  auto a = (dir / "a").string(), b = (dir / "b").string();
  write_counting_dataset(a, 300);
  write_counting_dataset(b, 200);
  auto r = run_cli("inspect-data --samples 5 --format ids --data-path 0.3 '" + a + "' 0.7 '" + b +
                   "' --split 90,8,2 --seq-length 8 --seed 7 --micro-batch-size 2 --global-batch-size 4 "
                   "--train-iters 10 --eval-interval 5 --eval-iters 2 --data-cache-path '" + (dir / "c").string() + "'");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  GPTDataConfig c;
  c.data_path = {"0.3", a, "0.7", b};
  c.split = "90,8,2";
  c.seq_length = 8;
  c.seed = 7;
  c.data_cache_path = (dir / "c").string();
  auto expect = first_training_samples(c, train_valid_test_num_samples(-1, 10, 4, 5, 2), 5);
  std::istringstream is(r.output);
  std::vector<std::vector<int32_t>> got;
  for (std::string line; std::getline(is, line);)
    if (!line.empty() && line[0] == '[') got.push_back(nlohmann::json::parse(line).get<std::vector<int32_t>>());
  EXPECT_EQ(got, expect);
  EXPECT_EQ(got.size(), 5u);
  EXPECT_EQ(got[0].size(), 9u);
}

TEST(InspectSamplesCli, ClearErrors) {
  TempDir dir;
  auto a = (dir / "a").string();
  write_counting_dataset(a, 50);
  auto r = run_cli("inspect-data --samples 2 --data-path '" + a + "' --seq-length 8 --train-iters 2");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("--format ids"), std::string::npos) << r.output;
  r = run_cli("inspect-data --samples 2 --format ids --data-path 0.5 '" + a + "' zz '" + a +
              "' --seq-length 8 --train-iters 2");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("not a number"), std::string::npos) << r.output;
  r = run_cli("inspect-data --samples 2 --format ids --seq-length 8 --train-iters 2");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("--data-path"), std::string::npos) << r.output;
}
