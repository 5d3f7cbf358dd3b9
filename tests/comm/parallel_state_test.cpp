// Rank layouts: Megatron's worked example (spec 8.1) and a brute-force reference that groups
// ranks by their coordinates, over many sizes and orders. Pure arithmetic, no MPI.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>

#include "comm/parallel_state.h"

namespace megatron {
namespace {

RankGroups brute_force(const std::vector<std::string>& names, const std::vector<int>& sizes,
                       const std::vector<std::string>& masked) {
  int world = 1;
  for (int s : sizes) world *= s;
  // Key = coordinates of the dimensions not in the token set.
  std::map<std::vector<int>, std::vector<int>> by_key;
  for (int r = 0; r < world; ++r) {
    int rem = r;
    std::vector<int> key;
    for (size_t i = 0; i < names.size(); ++i) {
      const int c = rem % sizes[i];
      rem /= sizes[i];
      if (std::find(masked.begin(), masked.end(), names[i]) == masked.end()) key.push_back(c);
    }
    by_key[key].push_back(r);
  }
  RankGroups out;
  for (auto& [k, v] : by_key) out.push_back(v);
  std::sort(out.begin(), out.end());
  return out;
}

TEST(RankGenerator, SpecExample16RanksTp2Pp2Dp4) {
  ParallelConfig c;
  c.world_size = 16;
  c.tensor_model_parallel_size = 2;
  c.pipeline_model_parallel_size = 2;
  const auto L = ParallelLayout::build(c);
  EXPECT_EQ(L.data_parallel_size, 4);
  RankGroups tp = {{0, 1}, {2, 3}, {4, 5}, {6, 7}, {8, 9}, {10, 11}, {12, 13}, {14, 15}};
  EXPECT_EQ(L.all(GroupKind::TP), tp);
  RankGroups dp = {{0, 2, 4, 6}, {1, 3, 5, 7}, {8, 10, 12, 14}, {9, 11, 13, 15}};
  EXPECT_EQ(L.all(GroupKind::DP), dp);
  RankGroups pp = {{0, 8}, {1, 9}, {2, 10}, {3, 11}, {4, 12}, {5, 13}, {6, 14}, {7, 15}};
  EXPECT_EQ(L.all(GroupKind::PP), pp);
  RankGroups mp = {{0, 1, 8, 9}, {2, 3, 10, 11}, {4, 5, 12, 13}, {6, 7, 14, 15}};
  EXPECT_EQ(L.all(GroupKind::MP), mp);
  EXPECT_EQ(L.all(GroupKind::EMBEDDING), pp);  // first and last stage = both stages here
  EXPECT_TRUE(L.group_of(GroupKind::POSITION_EMBEDDING, 9).empty());  // last stage
  EXPECT_EQ(L.group_of(GroupKind::POSITION_EMBEDDING, 1), std::vector<int>({1}));
  EXPECT_EQ(L.rank_in(GroupKind::DP, 12), 2);
  EXPECT_EQ(L.rank_in(GroupKind::PP, 12), 1);
  EXPECT_EQ(L.rank_in(GroupKind::TP, 13), 1);
  // global rank = tp + TP*(cp + CP*(dp + DP*pp))
  for (int r = 0; r < 16; ++r) {
    const int tpr = L.rank_in(GroupKind::TP, r), dpr = L.rank_in(GroupKind::DP, r);
    const int ppr = L.rank_in(GroupKind::PP, r);
    EXPECT_EQ(r, tpr + 2 * (dpr + 4 * ppr));
  }
}

TEST(RankGenerator, EmbeddingGroupsSkipMiddleStages) {
  ParallelConfig c;
  c.world_size = 8;
  c.pipeline_model_parallel_size = 4;
  const auto L = ParallelLayout::build(c);
  RankGroups pp = {{0, 2, 4, 6}, {1, 3, 5, 7}};
  EXPECT_EQ(L.all(GroupKind::PP), pp);
  RankGroups embd = {{0, 6}, {1, 7}};
  EXPECT_EQ(L.all(GroupKind::EMBEDDING), embd);
  EXPECT_TRUE(L.group_of(GroupKind::EMBEDDING, 2).empty());
  EXPECT_EQ(L.rank_in(GroupKind::EMBEDDING, 4), -1);
  RankGroups pos = {{0}, {1}};
  EXPECT_EQ(L.all(GroupKind::POSITION_EMBEDDING), pos);
}

TEST(RankGenerator, MatchesBruteForceOverSizesAndOrders) {
  const std::vector<std::string> orders = {"tp-cp-ep-dp-pp", "tp-pp-dp", "tp-dp-pp", "pp-dp-tp",
                                           "tp-cp-dp-pp"};
  int checked = 0;
  for (const auto& order : orders) {
    for (int tp : {1, 2, 4}) for (int pp : {1, 2, 3}) for (int cp : {1, 2}) for (int dp : {1, 2, 3}) {
      if (cp > 1 && order.find("cp") == std::string::npos) continue;
      const RankGenerator g(tp, 1, dp, pp, cp, order);
      // Dimension names in the generator's order (missing ones appended).
      std::vector<std::string> names;
      std::vector<int> sizes;
      std::string o = g.order();
      size_t pos = 0;
      while (pos <= o.size()) {
        size_t next = o.find('-', pos);
        if (next == std::string::npos) next = o.size();
        names.push_back(o.substr(pos, next - pos));
        pos = next + 1;
      }
      for (const auto& n : names) {
        sizes.push_back(n == "tp" ? tp : n == "pp" ? pp : n == "dp" ? dp : n == "cp" ? cp : 1);
      }
      for (const std::string tokens : {"tp", "pp", "dp", "cp", "dp-cp", "tp-pp", "tp-cp",
                                       "tp-dp-cp", "cp-dp"}) {
        std::vector<std::string> masked;
        size_t p = 0;
        while (p <= tokens.size()) {
          size_t n = tokens.find('-', p);
          if (n == std::string::npos) n = tokens.size();
          masked.push_back(tokens.substr(p, n - p));
          p = n + 1;
        }
        auto got = g.get_ranks(tokens);
        EXPECT_EQ(got, brute_force(names, sizes, masked)) << order << " " << tokens << " tp" << tp
                                                           << " pp" << pp << " cp" << cp << " dp" << dp;
        ++checked;
      }
    }
  }
  EXPECT_GT(checked, 500);
}

TEST(RankGenerator, RankOffsetShiftsEverything) {
  const RankGenerator g(2, 1, 2, 1, 1, "tp-dp", 4);
  EXPECT_EQ(g.get_ranks("dp"), RankGroups({{4, 6}, {5, 7}}));
}

TEST(ParallelLayout, ExpertGroups) {
  ParallelConfig c;
  c.world_size = 8;
  c.tensor_model_parallel_size = 2;
  c.expert_model_parallel_size = 2;
  c.expert_tensor_parallel_size = 1;
  const auto L = ParallelLayout::build(c);
  EXPECT_EQ(L.expert_data_parallel_size, 4);
  EXPECT_EQ(L.all(GroupKind::EP), RankGroups({{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(L.all(GroupKind::EXPERT_DP), RankGroups({{0, 2, 4, 6}, {1, 3, 5, 7}}));
  EXPECT_EQ(L.all(GroupKind::EXPERT_TP).size(), 8u);
}

TEST(ParallelLayout, RejectsIndivisibleWorldWithFlagNames) {
  ParallelConfig c;
  c.world_size = 6;
  c.tensor_model_parallel_size = 4;
  try {
    ParallelLayout::build(c);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--tensor-model-parallel-size"), std::string::npos);
  }
  c.tensor_model_parallel_size = 1;
  c.order = "tp-xx-dp";
  EXPECT_THROW(ParallelLayout::build(c), Error);
  c.order = "tp-dp";  // pp missing from the order while PP > 1
  c.pipeline_model_parallel_size = 2;
  EXPECT_THROW(ParallelLayout::build(c), Error);
}

TEST(ParallelState, WorldOfOneWithoutMpi) {
  auto world = make_self_communicator("world");
  auto ps = ParallelState::create(world, {});
  EXPECT_EQ(ps.tp_size(), 1);
  EXPECT_EQ(ps.dp_size(), 1);
  EXPECT_EQ(ps.tp().size(), 1);
  EXPECT_TRUE(ps.is_first_pp_stage());
  EXPECT_TRUE(ps.is_last_pp_stage());
  EXPECT_TRUE(ps.has_group(GroupKind::EMBEDDING));
  EXPECT_EQ(ps.dp_cp().name(), "dp-cp");
}

}  // namespace
}  // namespace megatron
