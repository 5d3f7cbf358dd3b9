// --moe-layer-freq as Megatron reads it (an integer k, or a Python list pattern) and the MoE
// layer specs a GPT gets from it.
#include <gtest/gtest.h>

#include "model/layer_spec.h"
#include "model/moe/moe_pattern.h"
#include "test_util.h"

namespace megatron::model {
namespace {

TEST(MoePattern, IntegersAndListPatternsAsMegatronEvaluatesThem) {
  EXPECT_EQ(moe_layer_pattern("1", 3), (std::vector<int>{1, 1, 1}));
  EXPECT_EQ(moe_layer_pattern("2", 5), (std::vector<int>{1, 0, 1, 0, 1}));
  EXPECT_EQ(moe_layer_pattern("([1]*3+[0]*1)*2", 8), (std::vector<int>{1, 1, 1, 0, 1, 1, 1, 0}));
  EXPECT_EQ(moe_layer_pattern("[0]*1+[1]*3", 4), (std::vector<int>{0, 1, 1, 1}));
  EXPECT_EQ(moe_layer_pattern(" [1, 0,1 ,0] ", 4), (std::vector<int>{1, 0, 1, 0}));
}

TEST(MoePattern, MalformedPatternsNameTheFlag) {
  auto err = [](const std::string& p, int n) {
    return megatron::testing::error_of([&] { moe_layer_pattern(p, n); });
  };
  EXPECT_NE(err("[1,0]", 3).find("gives 2 layers but --num-layers is 3"), std::string::npos);
  EXPECT_NE(err("[1,2]", 2).find("entries must be 0 or 1"), std::string::npos);
  EXPECT_NE(err("([1]*2", 2).find("expected ')'"), std::string::npos);
  EXPECT_NE(err("[1]*x", 1).find("expected an integer"), std::string::npos);
  EXPECT_NE(err("0", 2).find("--moe-layer-freq must be >= 1"), std::string::npos);
  EXPECT_NE(err("__import__('os')", 2).find("--moe-layer-freq"), std::string::npos);
}

TEST(MoePattern, GptLayerSpecsFollowThePattern) {
  TransformerConfig c;
  c.num_layers = 4;
  c.num_moe_experts = 8;
  c.moe_layer_freq = "[0,1,1,0]";
  EXPECT_EQ(gpt_layer_spec(c, 0).ffn, FfnKind::dense);
  EXPECT_EQ(gpt_layer_spec(c, 1).ffn, FfnKind::moe);
  EXPECT_EQ(gpt_layer_spec(c, 3).ffn, FfnKind::dense);
  c.num_moe_experts = 0;  // a dense model ignores the pattern
  EXPECT_EQ(gpt_layer_spec(c, 1).ffn, FfnKind::dense);
}

}  // namespace
}  // namespace megatron::model
