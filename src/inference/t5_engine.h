// Generation for encoder-decoder models: a LanguageModel (language_model.h) over a whole
// model::T5Model, so the generation loop, sampling, stop rules and beam search that serve GPT
// (generation.h, beam_search.h) decode T5 unchanged. The encoder inputs of the rows are given
// first (set_encoder_inputs); start() runs the encoder once over them (padded to the longest,
// under the encoder's padding mask) and fills each decoder layer's static cross-attention cache;
// forward() then appends decoder tokens with the self-attention KV cache. The decoder's input
// begins with [BOS], as Megatron's T5 samples do (text_dec), so a row's "prompt" in the loop is
// just that token. Results equal running the whole model over the decoder's prefix at every step
// (tests/inference/t5_generation_test.cpp).
// Continuous batching (the slot interface of language_model.h, which the server's scheduler runs):
// start_slots sizes the self-attention caches for the slots and a cross-attention cache of
// max_position_embeddings encoder positions per slot; set_slot_encoder_input runs the encoder
// over one slot's input and writes that slot's cross-attention keys and values (the positions
// past its input are masked as padding), and the slot then decodes at its own positions beside
// the others. Results equal decoding each sequence alone.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "inference/language_model.h"
#include "model/inference_context.h"
#include "model/t5_model.h"

namespace megatron::inference {

class T5Engine final : public LanguageModel {
 public:
  // A model built from `config` (model family "t5", no gradients) with the given weights (every
  // parameter by its Megatron-Core name, as GPTEngine loads them), on `device`.
  T5Engine(const model::TransformerConfig& config, const std::map<std::string, Tensor>& weights,
           Device device = Device::cpu());
  // Over a built model (whole, or this rank's tensor-parallel shard, every rank of its group
  // making the same calls; its weights as they are). `vocab_width` > 0: the logits keep their
  // first vocab_width columns (the vocabulary padded as for one rank, so a wider tensor-parallel
  // padding normalises over the same vocabulary as one process).
  explicit T5Engine(std::unique_ptr<model::T5Model> model, int64_t vocab_width = 0);
  ~T5Engine() override;

  // The encoder inputs of the rows of the next start(): one token list per row (at least one
  // token, at most max_position_embeddings), or a single list every row reads (beam search).
  bool encoder_decoder() const override { return true; }
  void set_encoder_inputs(std::vector<std::vector<int32_t>> inputs) override;

  int64_t vocab_size() const override;
  // The decoder's longest sequence (its position table: max_position_embeddings).
  int64_t max_sequence_length() const override;
  // Runs the encoder over the inputs set before and sizes the decoder's caches.
  void start(int64_t batch, int64_t max_len) override;
  Tensor forward(std::span<const int32_t> tokens, int64_t n, bool all_positions) override;
  void reorder(std::span<const int64_t> src) override;
  int64_t position() const override { return pos_.empty() ? 0 : pos_[0]; }

  bool supports_slots() const override { return true; }
  void start_slots(int64_t slots, int64_t max_len) override;
  void set_slot_encoder_input(int64_t slot, std::span<const int32_t> input) override;
  void clear_slot(int64_t slot) override;
  void grow_slots(int64_t max_len) override;
  Tensor forward_slots(std::span<const int64_t> slots, std::span<const int32_t> tokens,
                       std::span<const int64_t> counts, bool all_positions) override;

  model::T5Model& model() { return *model_; }

  // The checks each call above makes before it computes anything (megatron::Error on a request
  // the model cannot run): a leader (t5_leader.h) runs them before it sends a call to the
  // followers, so a refused call reaches no rank. forward_slots also takes the rows of a
  // lockstep start() (the follower's form of forward).
  void check_inputs(const std::vector<std::vector<int32_t>>& inputs) const;
  void check_start(int64_t batch, int64_t max_len) const;
  void check_start_slots(int64_t slots, int64_t max_len) const;
  void check_slot(int64_t slot) const;
  void check_grow(int64_t max_len) const;
  void check_run(std::span<const int64_t> slots, std::span<const int32_t> tokens,
                 std::span<const int64_t> counts) const;
  void check_reorder(std::span<const int64_t> src) const;
  void check_input(size_t index, std::span<const int32_t> input) const;
  int64_t rows() const { return int64_t(pos_.size()); }  // rows or slots of the caches

 private:
  std::unique_ptr<model::T5Model> model_;
  model::InferenceContext cache_;
  std::vector<std::vector<int32_t>> inputs_;
  int64_t vocab_width_ = 0;   // the logits' width (0: the model's padded vocabulary)
  std::vector<int64_t> pos_;  // decoder positions fed per row (slot)
  bool slot_mode_ = false;    // started by start_slots (else by start)
  std::vector<bool> has_input_;  // slot mode: the slot's encoder input is in the cache

  // Appends counts[i] tokens to row (slot) slots[i]; logits as forward_slots returns them.
  Tensor run(std::span<const int64_t> slots, std::span<const int32_t> tokens,
             std::span<const int64_t> counts, bool all_positions);
};

}  // namespace megatron::inference
