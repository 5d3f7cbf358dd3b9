// Generation on the model's own layers: a LanguageModel (language_model.h) over a whole
// model::GPTModel and its InferenceContext (KV cache per layer, cache slots). Every computation
// is the training model's forward through ops, with attention reading and appending the cache
// (model/attention.h), so whatever architecture the model is built with (GPT-2, Llama-style, ...)
// generates with exactly the layers it was trained with.
//
// The lockstep interface (start/forward/reorder: generate(), beam search) uses slot i for row i;
// the slot interface (continuous batching) appends to any subset of slots at their own
// positions. Prefill runs each row's new tokens as matrix products; decoding appends one position
// per row. Attention reads only cached positions up to the current one, so results equal a full
// causal forward pass over the same prefix.
//
// Under tensor and pipeline parallelism each rank holds an engine over its own stage and shard
// (the stage constructor); every model-parallel rank then makes the same calls with the same
// arguments (distributed_engine.h arranges that): the tensor-parallel layers reduce inside,
// each stage passes its output [rows, h] to the next over the pipeline group, and the last
// stage's logits (gathered over tensor parallelism) come back to the first stage.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "core/tensor.h"
#include "inference/language_model.h"
#include "model/gpt_model.h"
#include "model/inference_context.h"

namespace megatron::inference {

// The configuration a model runs generation with: no dropout, recomputation or sequence
// parallelism; seq_length within max_position_embeddings.
model::TransformerConfig inference_config(model::TransformerConfig config);

class GPTEngine final : public LanguageModel {
 public:
  // A model built from `config` (whole model, one rank, no gradients) with the given weights:
  // every parameter of the model must be in `weights` (by its Megatron-Core name) with its shape;
  // values of any float dtype are converted to the configuration's params_dtype. Tensors the
  // model does not have are an error naming them, unless listed in `ignored`.
  // The model runs on `device` (weights are copied there; logits come back to the host).
  GPTEngine(const model::TransformerConfig& config, const std::map<std::string, Tensor>& weights,
            Device device = Device::cpu());
  // This rank's part of a model-parallel model: `model` is its pipeline stage (one chunk, its
  // tensor-parallel shard, weights loaded, built from inference_config), `pp_group` links the
  // stages (its rank is the stage). Every call is collective over the model-parallel ranks. The
  // logits come back on the first stage's tensor-parallel rank 0 (world rank 0 in Megatron's
  // order); every other rank gets an undefined tensor.
  GPTEngine(const model::TransformerConfig& config, std::unique_ptr<model::GPTModel> model,
            std::shared_ptr<Communicator> pp_group);
  ~GPTEngine() override;

  // The checks of start / forward_slots / grow_slots without their effects (a rank leading others
  // runs them before telling the others, so that a bad call fails on it alone).
  void check_start(int64_t batch, int64_t max_len) const;
  void check_run(std::span<const int64_t> slots, std::span<const int32_t> tokens,
                 std::span<const int64_t> counts) const;
  void check_grow(int64_t max_len) const;
  int64_t slots() const { return batch_; }

  int64_t vocab_size() const override { return cfg_.padded_vocab_size; }
  int64_t max_sequence_length() const override { return cfg_.max_position_embeddings; }
  void start(int64_t batch, int64_t max_len) override;
  Tensor forward(std::span<const int32_t> tokens, int64_t n, bool all_positions) override;
  void reorder(std::span<const int64_t> src) override;
  int64_t position() const override { return row_pos_.empty() ? 0 : row_pos_[0]; }
  bool supports_ragged() const override { return true; }
  Tensor prefill_ragged(std::span<const std::vector<int32_t>> prompts, bool all_positions) override;
  bool supports_slots() const override { return true; }
  void start_slots(int64_t slots, int64_t max_len) override;
  void clear_slot(int64_t slot) override;
  void grow_slots(int64_t max_len) override;
  Tensor forward_slots(std::span<const int64_t> slots, std::span<const int32_t> tokens,
                       std::span<const int64_t> counts, bool all_positions) override;

  const model::TransformerConfig& config() const { return cfg_; }
  model::GPTModel& model() { return *model_; }
  const model::InferenceContext& cache() const { return cache_; }

 private:
  // Appends counts[b] tokens to slot slots[b] at its own position.
  Tensor run(std::span<const int64_t> slots, std::span<const int32_t> tokens,
             std::span<const int64_t> counts, bool all_positions);
  std::vector<int64_t> all_rows() const;
  // Pipeline: the previous stage's output in, this stage's output on, the logits back to the
  // first stage's tensor-parallel rank 0.
  Tensor run_stage(const Tensor& ids, const Tensor& pick, int64_t rows);
  Tensor logits_to_first_stage(Tensor logits, int64_t calls, int64_t out_n);

  model::TransformerConfig cfg_;
  std::unique_ptr<model::GPTModel> model_;
  model::InferenceContext cache_;
  int64_t batch_ = 0;
  std::vector<int64_t> row_pos_;  // positions fed per slot
  std::shared_ptr<Communicator> pp_;  // null on one rank
};

}  // namespace megatron::inference
