// metadata.json's one codec (training/checkpoint.h: CheckpointMetadata): what is written is read
// back field for field, an older format version still reads, and malformed files are errors
// naming the file and the key.
#include <gtest/gtest.h>

#include <string>

#include "core/error.h"
#include "training/checkpoint.h"

namespace megatron::training {
namespace {

using json = nlohmann::json;

CheckpointMetadata sample() {
  CheckpointMetadata m;
  m.state.iteration = 12;
  m.state.consumed_train_samples = 96;
  m.state.consumed_valid_samples = 8;
  m.state.grad_scaler_dynamic = true;
  m.state.grad_scaler.scale = 1024.0;
  m.state.grad_scaler.growth_tracker = 3;
  m.state.scheduler.max_lr = 1e-3;
  m.state.scheduler.lr_decay_steps = 100;
  m.state.scheduler_num_steps = 12;
  m.state.rng = RngState{1234, 56};
  m.state.optimizer_type = "adam";
  m.state.args = {{"model", {{"num_layers", 2}}}};
  m.optimizer = {{"type", "adam"}, {"distributed", true}};
  m.parallel = CheckpointParallel{2, 1, 2, 1, true};
  m.weights = {{"w", {{"init", "normal"}}}};
  m.files = {{"mp_rank_00/model.safetensors", {{"bytes", 10}, {"sha256", "ab"}}}};
  m.converted_from = {{"tool", "megatron checkpoint convert"}};
  return m;
}

TEST(CheckpointMetadata, WrittenIsReadBackFieldForField) {
  const CheckpointMetadata m = sample();
  const json j = checkpoint_metadata_to_json(m);
  EXPECT_EQ(j["format_version"], kCheckpointFormatVersion);
  const CheckpointMetadata r = checkpoint_metadata_from_json(j, "meta.json");
  EXPECT_EQ(r.state.iteration, 12);
  EXPECT_EQ(r.state.consumed_train_samples, 96);
  EXPECT_EQ(r.state.consumed_valid_samples, 8);
  EXPECT_TRUE(r.state.grad_scaler_dynamic);
  EXPECT_EQ(r.state.grad_scaler.scale, 1024.0);
  EXPECT_EQ(r.state.grad_scaler.growth_tracker, 3);
  EXPECT_EQ(r.state.scheduler.max_lr, 1e-3);
  EXPECT_EQ(r.state.scheduler.lr_decay_steps, 100);
  EXPECT_EQ(r.state.scheduler_num_steps, 12);
  ASSERT_TRUE(r.state.rng.has_value());
  EXPECT_EQ(r.state.rng->seed, 1234u);
  EXPECT_EQ(r.state.rng->dropout_offset, 56u);
  EXPECT_EQ(r.state.optimizer_type, "adam");
  EXPECT_EQ(r.state.args, m.state.args);
  EXPECT_EQ(r.optimizer, m.optimizer);
  ASSERT_TRUE(r.parallel.has_value());
  EXPECT_EQ(r.parallel->tensor_model_parallel_size, 2);
  EXPECT_EQ(r.parallel->data_parallel_size, 2);
  EXPECT_TRUE(r.parallel->distributed_optimizer);  // from optimizer.distributed
  EXPECT_EQ(r.weights, m.weights);
  EXPECT_EQ(r.files, m.files);
  EXPECT_EQ(r.converted_from, m.converted_from);
  // Written again, the same text.
  EXPECT_EQ(checkpoint_metadata_to_json(r).dump(), checkpoint_metadata_to_json(m).dump());
}

TEST(CheckpointMetadata, OptionalPartsAreLeftOut) {
  CheckpointMetadata m;  // a fresh import: no parallel layout, weights, files or RNG
  const json j = checkpoint_metadata_to_json(m);
  EXPECT_FALSE(j.contains("parallel"));
  EXPECT_FALSE(j.contains("weights"));
  EXPECT_FALSE(j.contains("files"));
  EXPECT_TRUE(j["rng_state"].is_null());
  const CheckpointMetadata r = checkpoint_metadata_from_json(j, "meta.json");
  EXPECT_FALSE(r.parallel.has_value());
  EXPECT_TRUE(r.weights.is_null());
  EXPECT_FALSE(r.state.rng.has_value());
}

// Format version 2 (before weight specs; single-rank ones without "parallel") still reads.
TEST(CheckpointMetadata, AnOlderVersionStillReads) {
  json j = checkpoint_metadata_to_json(sample());
  j["format_version"] = 2;
  j.erase("weights");
  j.erase("parallel");
  j["optimizer"] = {{"type", "adam"}};
  const CheckpointMetadata r = checkpoint_metadata_from_json(j, "old/metadata.json");
  EXPECT_EQ(r.state.iteration, 12);
  EXPECT_TRUE(r.weights.is_null());
  EXPECT_FALSE(r.parallel.has_value());
}

TEST(CheckpointMetadata, MalformedFilesAreErrorsNamingTheKey) {
  auto fails = [](json j, const std::string& want) {
    try {
      checkpoint_metadata_from_json(j, "ck/metadata.json");
      ADD_FAILURE() << "accepted: " << j.dump();
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("ck/metadata.json"), std::string::npos) << what;
      EXPECT_NE(what.find(want), std::string::npos) << what;
    }
  };
  const json good = checkpoint_metadata_to_json(sample());
  json v = good;
  v["format_version"] = 99;
  fails(v, "format_version 99 is not supported");
  v = good;
  v.erase("format_version");
  fails(v, "no format_version");
  v = good;
  v["parallel"]["tensor_model_parallel_size"] = 0;
  fails(v, "parallel sizes must be >= 1");
  v = good;
  v["optimizer"]["distributed"] = "yes";
  fails(v, "optimizer.distributed must be true or false");
  v = good;
  v.erase("iteration");
  fails(v, "\"iteration\"");
}

}  // namespace
}  // namespace megatron::training
