// Incremental decoding of a T5Model: encode once, then decode with the caches (see t5_engine.h).
#include "inference/t5_engine.h"

#include <algorithm>

#include "core/error.h"
#include "inference/checkpoint_weights.h"
#include "inference/gpt_engine.h"
#include "kernels/ops.h"

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

T5Engine::T5Engine(std::unique_ptr<model::T5Model> model, int64_t vocab_width)
    : model_(std::move(model)), vocab_width_(vocab_width) {
  MG_CHECK(model_ != nullptr, "T5Engine: no model");
  MG_CHECK(vocab_width_ >= 0 && vocab_width_ <= model_->config().padded_vocab_size,
           "T5Engine: logits width ", vocab_width_, " beyond the model's ",
           model_->config().padded_vocab_size);
}

T5Engine::~T5Engine() = default;

int64_t T5Engine::vocab_size() const {
  return vocab_width_ > 0 ? vocab_width_ : model_->config().padded_vocab_size;
}

int64_t T5Engine::max_sequence_length() const { return model_->config().max_position_embeddings; }

void T5Engine::check_input(size_t index, std::span<const int32_t> input) const {
  const int64_t V = vocab_size(), limit = model_->config().max_position_embeddings;
  MG_REQUIRE(!input.empty(), "encoder input ", index, " has no tokens");
  MG_REQUIRE(int64_t(input.size()) <= limit, "encoder input ", index, " has ", input.size(),
             " tokens, more than the model's --max-position-embeddings ", limit);
  for (int32_t t : input)
    MG_REQUIRE(t >= 0 && t < V, "encoder input ", index, " has token id ", t,
               " outside the vocabulary [0, ", V, ")");
}

void T5Engine::check_inputs(const std::vector<std::vector<int32_t>>& inputs) const {
  MG_REQUIRE(!inputs.empty(), "T5 generation needs at least one encoder input");
  for (size_t i = 0; i < inputs.size(); ++i) check_input(i, inputs[i]);
}

void T5Engine::set_encoder_inputs(std::vector<std::vector<int32_t>> inputs) {
  check_inputs(inputs);
  inputs_ = std::move(inputs);
}

void T5Engine::check_start(int64_t batch, int64_t max_len) const {
  MG_REQUIRE(!inputs_.empty(), "T5 generation: set the encoder inputs before start");
  MG_REQUIRE(batch >= 1 && (int64_t(inputs_.size()) == batch || inputs_.size() == 1), "T5 "
             "generation: ", batch, " rows but ", inputs_.size(), " encoder inputs");
  MG_REQUIRE(max_len >= 1 && max_len <= max_sequence_length(), "decoder length ", max_len,
             " exceeds max_position_embeddings ", max_sequence_length());
}

void T5Engine::start(int64_t batch, int64_t max_len) {
  check_start(batch, max_len);
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
  slot_mode_ = false;
}

void T5Engine::check_start_slots(int64_t slots, int64_t max_len) const {
  MG_REQUIRE(slots >= 1, "T5 generation needs at least one cache slot");
  MG_REQUIRE(max_len >= 1 && max_len <= max_sequence_length(), "decoder length ", max_len,
             " exceeds max_position_embeddings ", max_sequence_length());
}

void T5Engine::start_slots(int64_t slots, int64_t max_len) {
  check_start_slots(slots, max_len);
  const model::TransformerConfig& c = model_->config();
  model::TransformerBlock& dec = model_->decoder();
  const int layers = dec.first_layer() + dec.num_layers();
  cache_.allocate(layers, slots, c.num_attention_heads / model_->tensor_parallel_size(), max_len,
                  c.head_dim(), model_->device(), dec.first_layer(),
                  model::cache_dtype_for(c.params_dtype, model_->device()));
  // Each slot has room for the longest encoder input; its cross-attention keys and values are
  // written by set_slot_encoder_input (the layers' tensors are made at the first).
  cache_.cross_seq = c.max_position_embeddings;
  cache_.cross_kv.assign(size_t(layers), Tensor());
  cache_.cross_padding = Tensor::zeros({slots, cache_.cross_seq}, DType::I32, model_->device());
  pos_.assign(size_t(slots), 0);
  has_input_.assign(size_t(slots), false);
  slot_mode_ = true;
}

void T5Engine::check_slot(int64_t slot) const {
  MG_CHECK(slot_mode_ && slot >= 0 && slot < cache_.slots, "T5Engine: slot ", slot, " of ",
           cache_.slots, slot_mode_ ? "" : " (no start_slots)");
}

void T5Engine::set_slot_encoder_input(int64_t slot, std::span<const int32_t> input) {
  check_slot(slot);
  check_input(size_t(slot), input);
  const int64_t se = int64_t(input.size()), cross = cache_.cross_seq;
  const Device dev = model_->device();
  // The encoder over this input alone, and every decoder layer's cross-attention keys and values
  // of its output (a one-slot context), copied into the slot's rows.
  model::InferenceContext one;
  model_->start_inference(one, Tensor::from_vector(std::vector<int32_t>(input.begin(), input.end()),
                                                   {1, se}, dev),
                          Tensor(), 1);
  for (size_t l = 0; l < one.cross_kv.size(); ++l) {
    const Tensor& kv = one.cross_kv[l];
    if (!kv.defined()) continue;
    Tensor& all = cache_.cross_kv[l];
    if (!all.defined()) all = Tensor::zeros({cache_.slots * cross, kv.size(1)}, DType::F32, dev);
    all.narrow(0, slot * cross, se).copy_(kv);
  }
  std::vector<int32_t> mask(size_t(cross), 0);
  std::fill_n(mask.begin(), se, 1);
  cache_.cross_padding.narrow(0, slot, 1).copy_(Tensor::from_vector(mask, {1, cross}, dev));
  pos_[size_t(slot)] = 0;
  has_input_[size_t(slot)] = true;
}

void T5Engine::clear_slot(int64_t slot) {
  check_slot(slot);
  pos_[size_t(slot)] = 0;  // stale keys and values beyond the position are never read
  has_input_[size_t(slot)] = false;
}

void T5Engine::check_grow(int64_t max_len) const {
  MG_CHECK(slot_mode_, "grow_slots before start_slots");
  MG_REQUIRE(max_len <= max_sequence_length(), "decoder length ", max_len,
             " exceeds max_position_embeddings ", max_sequence_length());
}

void T5Engine::grow_slots(int64_t max_len) {
  check_grow(max_len);
  cache_.grow(max_len);
}

void T5Engine::check_run(std::span<const int64_t> slots, std::span<const int32_t> tokens,
                         std::span<const int64_t> counts) const {
  MG_CHECK(!slots.empty() && counts.size() == slots.size(), "T5Engine: ", slots.size(),
           " rows, ", counts.size(), " counts");
  int64_t total = 0;
  for (size_t b = 0; b < slots.size(); ++b) {
    const int64_t s = slots[b], n = counts[b];
    MG_CHECK(s >= 0 && s < int64_t(pos_.size()) && n >= 1, "T5Engine: bad row ", s);
    if (slot_mode_)
      MG_REQUIRE(has_input_[size_t(s)], "T5 slot ", s, " has no encoder input "
                 "(set_slot_encoder_input before its first tokens)");
    MG_REQUIRE(pos_[size_t(s)] + n <= cache_.max_len, "decoder position ", pos_[size_t(s)] + n,
               " exceeds the cache length ", cache_.max_len);
    total += n;
  }
  MG_CHECK(int64_t(tokens.size()) == total, "T5Engine: ", tokens.size(), " tokens for ", total);
  for (int32_t t : tokens)
    MG_REQUIRE(t >= 0 && t < vocab_size(), "token id ", t, " outside the vocabulary [0, ",
               vocab_size(), ")");
}

Tensor T5Engine::forward_slots(std::span<const int64_t> slots, std::span<const int32_t> tokens,
                               std::span<const int64_t> counts, bool all_positions) {
  return run(slots, tokens, counts, all_positions);
}

Tensor T5Engine::forward(std::span<const int32_t> tokens, int64_t n, bool all_positions) {
  const int64_t batch = int64_t(pos_.size());
  MG_CHECK(!slot_mode_ && batch > 0 && n >= 1 && int64_t(tokens.size()) == batch * n,
           "T5Engine::forward: ", tokens.size(), " tokens for ", batch, " x ", n);
  std::vector<int64_t> rows(static_cast<size_t>(batch)), counts(static_cast<size_t>(batch), n);
  for (int64_t b = 0; b < batch; ++b) rows[size_t(b)] = b;
  return run(rows, tokens, counts, all_positions);
}

Tensor T5Engine::run(std::span<const int64_t> slots, std::span<const int32_t> tokens,
                     std::span<const int64_t> counts, bool all_positions) {
  check_run(slots, tokens, counts);
  const int64_t V = model_->config().padded_vocab_size, calls = int64_t(slots.size());
  int64_t max_count = 0;
  for (int64_t c : counts) max_count = std::max(max_count, c);
  const int64_t out_n = all_positions ? max_count : 1;
  // Slot and position of every new token; the rows whose logits are asked for and where they go
  // in the [calls, out_n, V] result (every new position of each row, or its last one).
  std::vector<int32_t> slot, pos, pick, dest;
  for (int64_t b = 0; b < calls; ++b) {
    const int64_t s = slots[size_t(b)], n = counts[size_t(b)];
    for (int64_t j = 0; j < n; ++j) {
      if (all_positions || j == n - 1) {
        pick.push_back(int32_t(slot.size()));
        dest.push_back(int32_t(b * out_n + (all_positions ? j : 0)));
      }
      slot.push_back(int32_t(s));
      pos.push_back(int32_t(pos_[size_t(s)] + j));
    }
  }
  const Device dev = model_->device();
  const int64_t rows = int64_t(slot.size());
  cache_.row_slot = Tensor::from_vector(slot, {rows}, dev);
  cache_.row_pos = Tensor::from_vector(pos, {rows}, dev);
  const Tensor ids = Tensor::from_vector(std::vector<int32_t>(tokens.begin(), tokens.end()), {rows}, dev);
  const Tensor picked = model_->forward_inference(
      ids, cache_, Tensor::from_vector(pick, {int64_t(pick.size())}, dev));
  for (int64_t b = 0; b < calls; ++b) pos_[size_t(slots[size_t(b)])] += counts[size_t(b)];
  Tensor logits;
  if (int64_t(pick.size()) == calls * out_n) {  // every place filled, in order
    logits = picked.view({calls, out_n, V});
  } else {
    logits = Tensor::zeros({calls, out_n, V}, DType::F32, dev);
    ops::index_copy_rows(logits.view({calls * out_n, V}), picked,
                         Tensor::from_vector(dest, {int64_t(dest.size())}, dev));
  }
  if (vocab_size() < V) logits = logits.narrow(2, 0, vocab_size()).contiguous();
  return dev.is_cpu() ? logits : logits.to(Device::cpu());  // sampling reads them on the host
}

void T5Engine::check_reorder(std::span<const int64_t> src) const {
  MG_CHECK(!src.empty(), "reorder: no rows");
  for (int64_t s : src)
    MG_CHECK(s >= 0 && s < int64_t(pos_.size()), "reorder row ", s, " out of range ", pos_.size());
}

void T5Engine::reorder(std::span<const int64_t> src) {
  check_reorder(src);
  std::vector<int32_t> idx;
  std::vector<int64_t> pos;
  for (int64_t s : src) {
    idx.push_back(int32_t(s));
    pos.push_back(pos_[size_t(s)]);
  }
  cache_.reorder(Tensor::from_vector(idx, {int64_t(idx.size())}, model_->device()));
  pos_ = std::move(pos);
}

}  // namespace megatron::inference
