// Parity of the NumPy RandomState shuffle, the GPT document/sample/shuffle indices and the blending
// indices with tests/reference/numpy_gpt_indices.py (NumPy's RandomState, Megatron's loops in Python).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "core/error.h"
#include "data/gpt_indices.h"
#include "data/numpy_random.h"
#include "test_util.h"

using namespace megatron::data;
using megatron::testing::TempDir;
using nlohmann::json;

namespace {

// Runs every request through the Python reference in one process.
std::vector<json> ask_numpy(const std::vector<json>& requests) {
  TempDir dir;
  std::string in;
  for (auto& r : requests) in += r.dump() + "\n";
  megatron::testing::write_file(dir / "req.jsonl", in);
  auto script = (megatron::testing::source_dir() / "tests/reference/numpy_gpt_indices.py").string();
  auto res = megatron::testing::run_command("/usr/bin/python3 '" + script + "' < '" + (dir / "req.jsonl").string() + "'");
  EXPECT_EQ(res.exit_code, 0) << res.output;
  std::vector<json> out;
  std::istringstream is(res.output);
  for (std::string line; std::getline(is, line);) out.push_back(json::parse(line));
  EXPECT_EQ(out.size(), requests.size());
  return out;
}

}  // namespace

TEST(NumpyRandom, ShuffleMatchesNumpy) {
  std::vector<json> reqs;
  std::vector<std::pair<uint32_t, int64_t>> cases;
  for (uint32_t seed : {0u, 1u, 1234u, 42u, 4294967295u})
    for (int64_t n : {0, 1, 2, 3, 7, 64, 65, 1000, 65537}) cases.push_back({seed, n});
  for (auto [s, n] : cases) reqs.push_back({{"op", "shuffle"}, {"seed", s}, {"n", n}});
  auto ans = ask_numpy(reqs);
  ASSERT_EQ(ans.size(), cases.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    NumpyRandomState rng(cases[i].first);
    auto v = rng.permutation<int64_t>(cases[i].second);
    EXPECT_EQ(json(v), ans[i]) << "seed " << cases[i].first << " n " << cases[i].second;
  }
}

TEST(NumpyRandom, FirstOutputsOfMt19937) {
  // np.random.RandomState(1234).randint(0, 2**32, dtype=np.uint64) uses the 32-bit stream; the
  // first raw output of MT19937 seeded with 5489 is the classic 3499211612.
  NumpyRandomState rng(5489);
  EXPECT_EQ(rng.next_uint32(), 3499211612u);
}

TEST(NumpyRandom, SixtyFourBitIntervalUsesTwoDraws) {
  NumpyRandomState a(7), b(7);
  uint64_t big = (uint64_t(1) << 40) + 5;
  uint64_t v = a.random_interval(big);
  EXPECT_LE(v, big);
  // The 64-bit path consumes 32-bit outputs in pairs, high word first.
  uint64_t mask = (uint64_t(1) << 41) - 1;
  uint64_t expect;
  do {
    expect = b.next_uint64() & mask;
  } while (expect > big);
  EXPECT_EQ(v, expect);
}

TEST(GPTIndices, MatchNumpyReference) {
  struct Case {
    int64_t docs;
    int max_len;
    double lo, hi;
    std::optional<int64_t> n;
    int64_t S;
    uint32_t seed;
  };
  std::vector<Case> cases = {
      {50, 40, 0.0, 1.0, std::nullopt, 16, 1234},  // one epoch
      {50, 40, 0.0, 1.0, 20, 16, 1234},            // E = 1 with N
      {50, 40, 0.0, 0.9, 200, 16, 7},              // several epochs
      {30, 25, 0.1, 0.8, 0, 8, 3},                 // N = 0
      {80, 60, 0.0, 1.0, 0, 32, 99},               // filled below: separate last epoch
      {80, 60, 0.0, 1.0, 0, 32, 11},               // filled below: last epoch not separate
      {400, 300, 0.2, 1.0, 5000, 64, 1234},
      {5, 1, 0.0, 1.0, 3, 2, 5},                   // one-token documents
  };
  std::vector<std::vector<int32_t>> lengths;
  std::mt19937 gen(1);
  for (auto& c : cases) {
    std::vector<int32_t> l;
    for (int64_t i = 0; i < c.docs; ++i) l.push_back(int32_t(1 + gen() % uint32_t(c.max_len)));
    lengths.push_back(l);
  }
  auto tokens_in = [&](size_t k) {
    auto [lo, hi] = split_range({cases[k].lo, cases[k].hi}, cases[k].docs);
    int64_t t = 0;
    for (int64_t i = lo; i < hi; ++i) t += lengths[k][size_t(i)];
    return t;
  };
  // 2 epochs + a few samples (separate) and 2 epochs + almost a full one (not separate).
  int64_t T4 = tokens_in(4), T5 = tokens_in(5);
  cases[4].n = (2 * T4 - 1) / 32 + 3;
  cases[5].n = (3 * T5 - 1) / 32 - 1;

  std::vector<json> reqs;
  for (size_t k = 0; k < cases.size(); ++k) {
    auto [lo, hi] = split_range({cases[k].lo, cases[k].hi}, cases[k].docs);
    reqs.push_back({{"op", "gpt"}, {"lengths", lengths[k]}, {"split", {lo, hi}},
                    {"num_samples", cases[k].n ? json(*cases[k].n) : json(nullptr)},
                    {"seq_length", cases[k].S}, {"seed", cases[k].seed}});
  }
  auto ans = ask_numpy(reqs);
  ASSERT_EQ(ans.size(), cases.size());
  bool saw_separate = false, saw_joined_multi = false;
  for (size_t k = 0; k < cases.size(); ++k) {
    auto [lo, hi] = split_range({cases[k].lo, cases[k].hi}, cases[k].docs);
    std::vector<int32_t> split;
    for (int64_t i = lo; i < hi; ++i) split.push_back(int32_t(i));
    GPTIndexParams p;
    p.seq_length = cases[k].S;
    p.seed = cases[k].seed;
    p.num_samples = cases[k].n;
    auto got = build_gpt_indices(lengths[k], split, p);
    SCOPED_TRACE("case " + std::to_string(k));
    EXPECT_EQ(got.num_epochs, ans[k]["epochs"].get<int64_t>());
    EXPECT_EQ(got.separate_final_epoch, ans[k]["separate"].get<bool>());
    EXPECT_EQ(json(got.document_index), ans[k]["document_index"]);
    EXPECT_EQ(json(got.sample_index), ans[k]["sample_index"]);
    EXPECT_EQ(json(got.shuffle_index), ans[k]["shuffle_index"]);
    if (cases[k].n) {
      EXPECT_GE(got.num_samples(), *cases[k].n);
    }
    saw_separate |= got.separate_final_epoch;
    saw_joined_multi |= (!got.separate_final_epoch && got.num_epochs > 1);
  }
  EXPECT_TRUE(saw_separate);
  EXPECT_TRUE(saw_joined_multi);
}

TEST(GPTIndices, BlendingMatchesReference) {
  std::vector<std::vector<double>> ws = {{0.3, 0.7}, {1, 1, 1}, {0.5, 0.25, 0.125, 0.125}, {2, 0, 5}};
  std::vector<std::vector<int64_t>> sizes = {{10, 30}, {7, 0, 3, 11}};
  std::vector<json> reqs;
  for (auto& w : ws) reqs.push_back({{"op", "blend"}, {"weights", w}, {"size", 997}});
  for (auto& s : sizes) reqs.push_back({{"op", "blend_exhaustive"}, {"sizes", s}});
  auto ans = ask_numpy(reqs);
  ASSERT_EQ(ans.size(), reqs.size());
  for (size_t i = 0; i < ws.size(); ++i) {
    auto b = build_blending_indices(normalize_weights(ws[i]), 997);
    EXPECT_EQ(json(b.dataset_index), ans[i]["dataset_index"]);
    EXPECT_EQ(json(b.dataset_sample_index), ans[i]["dataset_sample_index"]);
  }
  for (size_t i = 0; i < sizes.size(); ++i) {
    auto b = build_exhaustive_blending_indices(sizes[i]);
    EXPECT_EQ(json(b.dataset_index), ans[ws.size() + i]["dataset_index"]);
    EXPECT_EQ(json(b.dataset_sample_index), ans[ws.size() + i]["dataset_sample_index"]);
  }
}

TEST(GPTIndices, SplitParsing) {
  auto f = parse_split("949,50,1");
  EXPECT_DOUBLE_EQ(f[0], 0.949);
  EXPECT_DOUBLE_EQ(f[1], 0.05);
  auto m = split_matrix(parse_split("1"));
  EXPECT_TRUE(m[0].has_value());
  EXPECT_FALSE(m[1].has_value());
  EXPECT_FALSE(m[2].has_value());
  EXPECT_EQ(split_range(*split_matrix(parse_split("949,50,1"))[0], 1000), (std::pair<int64_t, int64_t>(0, 949)));
  // Python's round: half to even.
  EXPECT_EQ(split_range({0.0, 0.5}, 5).second, 2);
  EXPECT_EQ(split_range({0.0, 0.5}, 7).second, 4);
  EXPECT_THROW(parse_split("abc"), megatron::Error);
  EXPECT_THROW(parse_split("0,0,0"), megatron::Error);
  EXPECT_THROW(parse_split("1,2,3,4"), megatron::Error);
  EXPECT_THROW(normalize_weights(std::vector<double>{0.5, -1}), megatron::Error);
}

TEST(GPTIndices, TooFewTokensIsAnError) {
  std::vector<int32_t> lengths = {3, 2};
  std::vector<int32_t> split = {0, 1};
  GPTIndexParams p;
  p.seq_length = 8;
  try {
    build_gpt_indices(lengths, split, p);
    FAIL();
  } catch (const megatron::Error& e) {
    EXPECT_NE(std::string(e.what()).find("--seq-length"), std::string::npos);
  }
}
