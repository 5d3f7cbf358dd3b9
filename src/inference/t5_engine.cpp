// Incremental decoding of a T5Model: encode once, then decode with the caches (see t5_engine.h).
#include "inference/t5_engine.h"

#include <algorithm>

#include "core/error.h"
#include "inference/checkpoint_weights.h"
#include "inference/gpt_engine.h"

namespace megatron::inference {

namespace {

std::unique_ptr<model::T5Model> build_t5(const model::TransformerConfig& config,
                                         const std::map<std::string, Tensor>& weights,
                                         Device device) {
  const model::TransformerConfig cfg = inference_config(config);
  MG_REQUIRE(cfg.family_id() == model::ModelFamilyId::t5, "T5Engine needs a T5 configuration (model family '",
             cfg.model_family, "')");
  model::ModelOptions opt;
  opt.grad = false;
  opt.init_weights = false;
  opt.device = device;
  auto m = std::make_unique<model::T5Model>(
      cfg, 0, model::TensorParallel::none(), model::ContextParallel::none(),
      model::ChunkPlace{model::PipelineLayout{std::max(cfg.num_layers, 1), 1, 1}, 0, 0}, opt);
  load_weights_into(m->parameters(), weights, cfg.params_dtype);
  return m;
}

}  // namespace

T5Engine::T5Engine(const model::TransformerConfig& config,
                   const std::map<std::string, Tensor>& weights, Device device)
    : model_(build_t5(config, weights, device)) {}

T5Engine::T5Engine(std::unique_ptr<model::T5Model> model) : model_(std::move(model)) {
  MG_CHECK(model_ != nullptr, "T5Engine: no model");
}

T5Engine::~T5Engine() = default;

int64_t T5Engine::vocab_size() const { return model_->config().padded_vocab_size; }

int64_t T5Engine::max_sequence_length() const { return model_->config().max_position_embeddings; }

void T5Engine::set_encoder_inputs(std::vector<std::vector<int32_t>> inputs) {
  MG_REQUIRE(!inputs.empty(), "T5 generation needs at least one encoder input");
  const int64_t V = vocab_size(), limit = model_->config().max_position_embeddings;
  for (size_t i = 0; i < inputs.size(); ++i) {
    MG_REQUIRE(!inputs[i].empty(), "encoder input ", i, " has no tokens");
    MG_REQUIRE(int64_t(inputs[i].size()) <= limit, "encoder input ", i, " has ", inputs[i].size(),
               " tokens, more than the model's --max-position-embeddings ", limit);
    for (int32_t t : inputs[i])
      MG_REQUIRE(t >= 0 && t < V, "encoder input ", i, " has token id ", t,
                 " outside the vocabulary [0, ", V, ")");
  }
  inputs_ = std::move(inputs);
}

void T5Engine::start(int64_t batch, int64_t max_len) {
  MG_REQUIRE(!inputs_.empty(), "T5 generation: set the encoder inputs before start");
  MG_REQUIRE(batch >= 1 && (int64_t(inputs_.size()) == batch || inputs_.size() == 1), "T5 "
             "generation: ", batch, " rows but ", inputs_.size(), " encoder inputs");
  MG_REQUIRE(max_len >= 1 && max_len <= max_sequence_length(), "decoder length ", max_len,
             " exceeds max_position_embeddings ", max_sequence_length());
  size_t se = 0;
  for (const auto& in : inputs_) se = std::max(se, in.size());
  // Rows padded to the longest input (pad id 0, masked out as keys of every attention).
  std::vector<int32_t> ids(size_t(batch) * se, 0), mask(size_t(batch) * se, 0);
  for (int64_t b = 0; b < batch; ++b) {
    const auto& in = inputs_[inputs_.size() == 1 ? 0 : size_t(b)];
    std::copy(in.begin(), in.end(), ids.begin() + b * int64_t(se));
    std::fill_n(mask.begin() + b * int64_t(se), in.size(), 1);
  }
  const Device dev = model_->device();
  const Shape shape{batch, int64_t(se)};
  model_->start_inference(cache_, Tensor::from_vector(ids, shape, dev),
                          Tensor::from_vector(mask, shape, dev), max_len);
  pos_.assign(size_t(batch), 0);
}

Tensor T5Engine::forward(std::span<const int32_t> tokens, int64_t n, bool all_positions) {
  const int64_t batch = int64_t(pos_.size()), V = vocab_size();
  MG_CHECK(batch > 0 && n >= 1 && int64_t(tokens.size()) == batch * n, "T5Engine::forward: ",
           tokens.size(), " tokens for ", batch, " x ", n);
  std::vector<int32_t> slot, pos, pick;
  for (int64_t b = 0; b < batch; ++b) {
    MG_REQUIRE(pos_[size_t(b)] + n <= cache_.max_len, "decoder position ", pos_[size_t(b)] + n,
               " exceeds the cache length ", cache_.max_len);
    for (int64_t j = 0; j < n; ++j) {
      slot.push_back(int32_t(b));
      pos.push_back(int32_t(pos_[size_t(b)] + j));
      if (all_positions || j == n - 1) pick.push_back(int32_t(b * n + j));
    }
  }
  for (int32_t t : tokens)
    MG_REQUIRE(t >= 0 && t < V, "token id ", t, " outside the vocabulary [0, ", V, ")");
  const Device dev = model_->device();
  cache_.row_slot = Tensor::from_vector(slot, {int64_t(slot.size())}, dev);
  cache_.row_pos = Tensor::from_vector(pos, {int64_t(pos.size())}, dev);
  const Tensor ids =
      Tensor::from_vector(std::vector<int32_t>(tokens.begin(), tokens.end()), {batch * n}, dev);
  Tensor logits = model_->forward_inference(
      ids, cache_, Tensor::from_vector(pick, {int64_t(pick.size())}, dev));
  for (int64_t& p : pos_) p += n;
  logits = logits.view({batch, all_positions ? n : 1, V});
  return dev.is_cpu() ? logits : logits.to(Device::cpu());  // sampling reads them on the host
}

void T5Engine::reorder(std::span<const int64_t> src) {
  const int64_t batch = int64_t(pos_.size());
  MG_CHECK(!src.empty(), "reorder: no rows");
  std::vector<int32_t> idx;
  std::vector<int64_t> pos;
  for (int64_t s : src) {
    MG_CHECK(s >= 0 && s < batch, "reorder row ", s, " out of range ", batch);
    idx.push_back(int32_t(s));
    pos.push_back(pos_[size_t(s)]);
  }
  cache_.reorder(Tensor::from_vector(idx, {int64_t(idx.size())}, model_->device()));
  pos_ = std::move(pos);
}

}  // namespace megatron::inference
