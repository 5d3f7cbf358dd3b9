// What the torch_dist layout tests (torch_dist_etp_test.cpp, torch_dist_vpp_test.cpp) share: an
// exact resume whose folders are torch_dist, and their models compared through the merge.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "parallel_test_util.h"
#include "training/checkpoint_convert.h"

namespace megatron::training::parallel_test {

// A checkpoint's model at iteration `it` as one rank's tensors (any format: through the merge).
inline std::map<std::string, std::vector<float>> merged_model(const std::string& save, int64_t it) {
  std::map<std::string, std::vector<float>> out;
  const auto ckpt = find_checkpoint(save, it);
  EXPECT_TRUE(ckpt.has_value()) << save;
  if (ckpt)
    for (const auto& [n, t] : merge_checkpoint(*ckpt, false).model) out[n] = t.to_float_vector();
  return out;
}

// The same tensors, each value within tol x the largest magnitude of the reference tensor (0: bit
// for bit).
inline void expect_same_models(const std::map<std::string, std::vector<float>>& got,
                               const std::map<std::string, std::vector<float>>& ref, double tol,
                               const std::string& what) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  for (const auto& [n, r] : ref) {
    ASSERT_TRUE(got.count(n)) << what << ": " << n;
    const std::vector<float>& g = got.at(n);
    ASSERT_EQ(g.size(), r.size()) << what << ": " << n;
    double scale = 1e-30, worst = 0;
    for (float v : r) scale = std::max(scale, double(std::abs(v)));
    for (size_t i = 0; i < r.size(); ++i) worst = std::max(worst, double(std::abs(g[i] - r[i])));
    EXPECT_LE(worst, tol * scale) << what << ": " << n;
  }
}

// `a` (saving in a.ckpt_format) trained in one go into full_dir, and in two parts (saved and
// stopped at `split` into split_dir, `at_split` on that folder on rank 0, then resumed from it):
// the resumed iterations continue the curve bit for bit and the final models are the same.
// Returns the uninterrupted run.
inline TrainingSummary expect_exact_resume_in_format(const TrainingArgs& a, const std::string& full_dir,
                                                     const std::string& split_dir, int64_t split,
                                                     const std::function<void(const fs::path&)>& at_split) {
  TrainingArgs full = a;
  full.save = full_dir;
  full.save_interval = 1000;
  const TrainingSummary whole = pretrain(full);
  TrainingArgs first = a;
  first.save = split_dir;
  first.save_interval = split;
  first.exit_interval = split;
  pretrain(first);
  if (world()->rank() == 0 && at_split) {
    char it[32];
    std::snprintf(it, sizeof it, "iter_%07lld", (long long)split);
    at_split(fs::path(split_dir) / it);
  }
  world()->barrier();
  TrainingArgs second = first;
  second.load = split_dir;
  second.exit_interval = 0;
  second.save_interval = 1000;
  const TrainingSummary rest = pretrain(second);
  expect_resumed_curve(rest, whole, split, split_dir);
  if (world()->rank() == 0)
    expect_same_models(merged_model(split_dir, a.train_iters), merged_model(full_dir, a.train_iters), 0.0,
                       "resumed vs uninterrupted");
  world()->barrier();
  return whole;
}

}  // namespace megatron::training::parallel_test
