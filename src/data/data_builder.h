// Builds the train/valid/test GPT datasets from Megatron's data flags
// (blended_megatron_dataset_builder.py, training.py get_train_valid_test_num_samples):
// --data-path as "w1 p1 w2 p2 ..." or "p1 p2 ...", --split over sequences, or separate
// --train-data-path/--valid-data-path/--test-data-path blends that use whole datasets
// (blended_builder.h holds the rules every dataset family shares).
#pragma once

#include <array>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "data/blended_builder.h"
#include "data/gpt_batch.h"
#include "data/gpt_dataset.h"

namespace megatron::data {

struct GPTDataConfig {
  std::vector<std::string> data_path;  // --data-path
  // --mock-data: Megatron's synthetic documents (data/mock_gpt_dataset.h) instead of files; the
  // split is "1,1,1" whatever --split says (as Megatron), indices cached only with
  // --data-cache-path.
  bool mock = false;
  std::string split = "969, 30, 1";    // --split (Megatron's legacy default)
  std::vector<std::string> train_data_path, valid_data_path, test_data_path;
  int64_t seq_length = 0;
  uint32_t seed = 1234;
  std::string data_cache_path;
  bool mmap = true;  // --no-mmap-bin-files is accepted; the .bin is always memory-mapped
  std::string tokenizer;  // identifier recorded in the cache description
  int32_t pad_id = -1;
  double mid_level_dataset_surplus = 0.005;
  bool use_cache = true;
  // Batch construction (--eod id from the tokenizer, --reset-position-ids, --reset-attention-mask,
  // --eod-mask-loss); see batch_options().
  int32_t eod_id = 0;
  // The tokenizer's vocabulary size (0: unknown): datasets whose dtype cannot hold its ids, and
  // samples with ids outside it, are errors.
  int64_t vocab_size = 0;
  bool reset_position_ids = false;
  bool reset_attention_mask = false;
  bool eod_mask_loss = false;
};

// The batch options the config implies (eod, pad and the three mask/position flags).
GPTBatchOptions batch_options(const GPTDataConfig& config);

struct GPTDatasets {
  std::shared_ptr<const SampleDataset> train, valid, test;  // null when the split is empty
};

// num_samples: samples requested per split (train, valid, test); a negative count builds one epoch.
GPTDatasets build_gpt_datasets(const GPTDataConfig& config, std::array<int64_t, 3> num_samples);

// Megatron's get_train_valid_test_num_samples. train_samples < 0: train_iters x global batch.
std::array<int64_t, 3> train_valid_test_num_samples(int64_t train_samples, int64_t train_iters,
                                                    int64_t global_batch_size, int64_t eval_interval,
                                                    int64_t eval_iters);

}  // namespace megatron::data

namespace megatron::data {

// The first `count` training samples (S+1 tokens each) in the order a single data-parallel rank
// consumes them (global sample ids 0, 1, ...). Throws when the train split is empty.
std::vector<std::vector<int32_t>> first_training_samples(const GPTDataConfig& config,
                                                         std::array<int64_t, 3> num_samples, int64_t count);

}  // namespace megatron::data
