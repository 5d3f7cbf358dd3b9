// What the torch_dist family tests share: a Python fixture writer's folder, its merged weights
// (<name>.ref: config.json's params, weights.bin), and the checks of merged and TP-cut weights.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>

#include "parallel_test_util.h"
#include "test_util.h"
#include "training/checkpoint.h"
#include "training/checkpoint_convert.h"
#include "training/torch_dist_checkpoint.h"

namespace megatron::testing {

// The folder `/usr/bin/python3 <script> make DIR` wrote, once per script and process.
inline const std::filesystem::path& python_fixtures(const std::string& script) {
  static std::map<std::string, std::unique_ptr<TempDir>> made;
  auto& dir = made[script];
  if (!dir) {
    dir = std::make_unique<TempDir>();
    const auto r = run_command("/usr/bin/python3 " + (source_dir() / script).string() + " make " +
                               dir->path().string() + " 2>&1");
    EXPECT_EQ(r.exit_code, 0) << r.output;
  }
  return dir->path();
}

// The writer's merged weights under our names: config.json's "params" (name, shape) in order over
// weights.bin's float32 values.
inline std::map<std::string, Tensor> reference_weights(const std::filesystem::path& ref) {
  const nlohmann::json cfg = nlohmann::json::parse(read_file(ref / "config.json"));
  std::ifstream in(ref / "weights.bin", std::ios::binary);
  std::map<std::string, Tensor> out;
  for (const nlohmann::json& p : cfg["params"]) {
    Tensor t = Tensor::empty(p["shape"].get<Shape>(), DType::F32);
    in.read(static_cast<char*>(t.raw_data()), std::streamsize(t.numel() * 4));
    out.emplace(p["name"].get<std::string>(), t);
  }
  EXPECT_TRUE(in.good());
  return out;
}

// `got` holds exactly the tensors of `want`, each of its shape and values (bit for bit).
inline void expect_same_weights(const std::map<std::string, Tensor>& got, const std::map<std::string, Tensor>& want,
                                const std::string& what) {
  EXPECT_EQ(got.size(), want.size()) << what;
  for (const auto& [name, t] : want) {
    auto it = got.find(name);
    ASSERT_NE(it, got.end()) << what << ": " << name;
    EXPECT_EQ(it->second.shape(), t.shape()) << what << ": " << name;
    EXPECT_EQ(it->second.to(DType::F32).to_float_vector(), t.to(DType::F32).to_float_vector()) << what << ": " << name;
  }
}

// Each rank of TP `T` streams from the checkpoint the reference cut by the weights' shard rules.
inline void expect_tp_shards(const training::CheckpointOnDisk& ckpt, const std::map<std::string, Tensor>& want, int T) {
  const auto specs = training::checkpoint_weight_specs(ckpt, nlohmann::json());
  for (int r = 0; r < T; ++r) {
    training::CheckpointRank rank;
    rank.tp_size = T;
    rank.tp_rank = r;
    std::map<std::string, Shape> params;
    std::map<std::string, Tensor> cut;
    for (const auto& [name, t] : want) {
      cut[name] = training::split_shard(t, training::shard_rule(specs.at(name)), r, T);
      params[name] = cut[name].shape();
    }
    expect_same_weights(training::read_torch_dist_shards(ckpt, params, rank), cut, "TP rank " + std::to_string(r));
  }
}

// A torch_dist iteration folder `it` that pretraining saved: found as torch_dist, read as a model
// of `family`, its merged weights those of this build's save `ours` at iteration 2.
inline void expect_saved_torch_dist(const std::filesystem::path& it, const std::string& family,
                                    const std::string& ours) {
  const auto ckpt = training::find_checkpoint(it.parent_path(), std::nullopt);
  ASSERT_TRUE(ckpt.has_value());
  EXPECT_EQ(ckpt->format, "torch_dist");
  EXPECT_EQ(training::training_args_from_json(ckpt->state.args).model.model_family, family);
  training::parallel_test::expect_same_merged_model(it.parent_path().string(), ours, 2);
}

}  // namespace megatron::testing
