// Micro-batches for GPT pretraining (Megatron's GPTDataset.__getitem__ + get_ltor_masks_and_position_ids
// + MegatronPretrainingSampler). Each sample has S+1 tokens: tokens = text[0:S], labels = text[1:S+1].
// Instead of a dense [S, S] mask, --reset-attention-mask yields attention_start[b, i]: the first key
// position query i may attend (one past the last EOD input at a position < i, else 0); causal
// masking is implied. The sampler's only state is consumed_samples, so resuming from a checkpoint
// continues with exactly the next sample.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "data/gpt_dataset.h"

namespace megatron::data {

struct GPTBatchOptions {
  int32_t eod_id = 0;
  int32_t pad_id = -1;  // -1: no padding id (Megatron's default when the tokenizer's pad collides)
  bool reset_position_ids = false;
  bool reset_attention_mask = false;
  bool eod_mask_loss = false;
  // The tokenizer's vocabulary size: a token id at or above it (a dataset made with another
  // tokenizer) is an error naming the sample. 0: unchecked.
  int64_t vocab_size = 0;
};

struct GPTBatch {
  Tensor tokens;           // int32 [b, s]
  Tensor labels;           // int32 [b, s]
  Tensor loss_mask;        // float32 [b, s]
  Tensor position_ids;     // int32 [b, s]
  Tensor attention_start;  // int32 [b, s]; undefined unless reset_attention_mask
  std::vector<int64_t> sample_ids;  // global sample ids in the dataset
};

// From raw S+1-token samples (all the same length).
GPTBatch make_gpt_batch(const std::vector<std::vector<int32_t>>& texts, const GPTBatchOptions& options);

// The DP rank's micro-batch of the block that starts at consumed_samples: global samples
// [consumed + dp_rank*mbs, consumed + (dp_rank+1)*mbs). Throws megatron::Error when the block
// runs past the end of the dataset (Megatron drops an incomplete last block).
GPTBatch make_batch(const SampleDataset& dataset, int64_t consumed_samples, int64_t micro_batch_size,
                    int64_t dp_rank, int64_t dp_size, const GPTBatchOptions& options);

// MegatronPretrainingSampler (--dataloader-type single).
class PretrainingSampler {
 public:
  PretrainingSampler(const SampleDataset& dataset, int64_t consumed_samples, int64_t micro_batch_size,
                     int64_t dp_rank, int64_t dp_size, GPTBatchOptions options);
  // Whether a complete block of micro_batch_size x dp_size samples remains.
  bool has_next() const;
  // This rank's next micro-batch; consumed_samples advances by micro_batch_size x dp_size.
  GPTBatch next();
  int64_t consumed_samples() const { return consumed_; }

 private:
  const SampleDataset& dataset_;
  int64_t consumed_, mbs_, rank_, dp_;
  GPTBatchOptions options_;
};

}  // namespace megatron::data
