// MEGATRON_OP_PROFILE=1: the per-op time table a process prints at exit (kernels/op_profile.h).
#include <gtest/gtest.h>

#include <cstdlib>
#include <regex>
#include <sstream>
#include <string>

#include "test_util.h"

namespace megatron::testing {
namespace {

const char* kRun =
    "pretrain-gpt --num-layers 1 --hidden-size 32 --num-attention-heads 2 --seq-length 16 "
    "--max-position-embeddings 16 --micro-batch-size 2 --global-batch-size 2 --train-iters 3 "
    "--lr 1e-3 --mock-data --tokenizer-type NullTokenizer --vocab-size 4100 --eval-iters 0 "
    "--device cpu 2>&1";

TEST(OpProfile, TableCountsEveryDispatchedCallAndSharesAddUp) {
  ::setenv("MEGATRON_OP_PROFILE", "1", 1);
  const CommandResult r = run_cli(kRun);
  ::unsetenv("MEGATRON_OP_PROFILE");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const size_t at = r.output.find("op profile (MEGATRON_OP_PROFILE=1");
  ASSERT_NE(at, std::string::npos) << r.output;
  // Rows: op (a product's with its shape, dtype and transposes), calls, total ms, mean us, share.
  std::istringstream table(r.output.substr(at));
  const std::regex row(R"(^(\S.*?\S) +(\d+) +([0-9.]+) +([0-9.]+) +([0-9.]+)%$)");
  std::string line;
  double shares = 0.0;
  long gemm_calls = 0, attention_calls = 0;
  int rows = 0;
  while (std::getline(table, line)) {
    std::smatch m;
    if (!std::regex_match(line, m, row)) continue;
    ++rows;
    shares += std::stod(m[5]);
    if (m[1].str().rfind("gemm ", 0) == 0) gemm_calls += std::stol(m[2]);
    if (m[1] == "attention_fwd") attention_calls = std::stol(m[2]);
  }
  EXPECT_GT(rows, 5) << r.output.substr(at);
  // Each share is printed to 0.1%: the printed shares add up to 100 within 0.05 a row.
  EXPECT_NEAR(shares, 100.0, 0.05 * rows + 1e-9) << r.output.substr(at);
  // One layer, three iterations of one micro-batch, the first left out: QKV, projection, fc1, fc2
  // forward (4) and backward (8, data and weight gradients) per iteration, plus the output
  // layer's products.
  EXPECT_GE(gemm_calls, 2 * 12) << r.output.substr(at);
  EXPECT_LT(gemm_calls, 3 * 12) << r.output.substr(at);
  EXPECT_EQ(attention_calls, 2) << r.output.substr(at);
  // The QKV product of 2 x 16 tokens by hidden 32 into 3 x 32 columns, one per iteration.
  EXPECT_NE(r.output.find("\ngemm 32x32x96 float32 NT "), std::string::npos)
      << r.output.substr(at);
  EXPECT_NE(r.output.find("outside ops (from the first op)"), std::string::npos);
}

TEST(OpProfile, NoTableWithoutTheVariable) {
  ::unsetenv("MEGATRON_OP_PROFILE");
  const CommandResult r = run_cli(kRun);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.find("op profile"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace megatron::testing
