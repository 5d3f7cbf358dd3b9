// Generation for encoder-decoder models: a LanguageModel (language_model.h) over a whole
// model::T5Model, so the generation loop, sampling, stop rules and beam search that serve GPT
// (generation.h, beam_search.h) decode T5 unchanged. The encoder inputs of the rows are given
// first (set_encoder_inputs); start() runs the encoder once over them (padded to the longest,
// under the encoder's padding mask) and fills each decoder layer's static cross-attention cache;
// forward() then appends decoder tokens with the self-attention KV cache. The decoder's input
// begins with [BOS], as Megatron's T5 samples do (text_dec), so a row's "prompt" in the loop is
// just that token. Results equal running the whole model over the decoder's prefix at every step
// (tests/inference/t5_generation_test.cpp).
// One process, the whole model (a sharded checkpoint's shards are merged in memory by the
// loader); no continuous batching (the slot interface of language_model.h).
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
  // Over a built model (whole, one rank; its weights as they are).
  explicit T5Engine(std::unique_ptr<model::T5Model> model);
  ~T5Engine() override;

  // The encoder inputs of the rows of the next start(): one token list per row (at least one
  // token, at most max_position_embeddings), or a single list every row reads (beam search).
  void set_encoder_inputs(std::vector<std::vector<int32_t>> inputs);

  int64_t vocab_size() const override;
  // The decoder's longest sequence (its position table: max_position_embeddings).
  int64_t max_sequence_length() const override;
  // Runs the encoder over the inputs set before and sizes the decoder's caches.
  void start(int64_t batch, int64_t max_len) override;
  Tensor forward(std::span<const int32_t> tokens, int64_t n, bool all_positions) override;
  void reorder(std::span<const int64_t> src) override;
  int64_t position() const override { return pos_.empty() ? 0 : pos_[0]; }

  model::T5Model& model() { return *model_; }

 private:
  std::unique_ptr<model::T5Model> model_;
  model::InferenceContext cache_;
  std::vector<std::vector<int32_t>> inputs_;
  std::vector<int64_t> pos_;  // decoder positions fed per row
};

}  // namespace megatron::inference
