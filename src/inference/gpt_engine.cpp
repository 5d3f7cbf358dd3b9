// Incremental decoding of a GPTModel with its KV cache (see gpt_engine.h).
#include "inference/gpt_engine.h"

#include <algorithm>

#include "core/error.h"
#include "kernels/ops.h"

namespace megatron::inference {

namespace {

model::TransformerConfig for_inference(model::TransformerConfig c) {
  c.hidden_dropout = c.attention_dropout = 0.0f;
  c.recompute_granularity.clear();
  c.recompute_method.clear();
  c.recompute_num_layers = 0;
  c.sequence_parallel = false;
  if (c.seq_length <= 0 || c.seq_length > c.max_position_embeddings)
    c.seq_length = int(c.max_position_embeddings);
  return c;
}

}  // namespace

GPTEngine::GPTEngine(const model::TransformerConfig& config,
                     const std::map<std::string, Tensor>& weights, Device device)
    : cfg_(for_inference(config)) {
  model::ModelOptions opt;
  opt.grad = false;
  opt.init_weights = false;
  opt.device = device;
  model_ = std::make_unique<model::GPTModel>(cfg_, 0, model::TensorParallel::none(),
                                             model::ContextParallel::none(), model::ChunkPlace{
                                                 model::PipelineLayout{cfg_.num_layers, 1, 1}, 0, 0},
                                             opt);
  size_t used = 0;
  for (model::Parameter* p : model_->parameters()) {
    auto it = weights.find(p->name);
    MG_REQUIRE(it != weights.end(), "the model weights have no tensor '", p->name,
               "', which this configuration needs; check the model flags against the checkpoint");
    MG_REQUIRE(it->second.shape() == p->value.shape(), "weight '", p->name, "' has shape ",
               shape_str(it->second.shape()), ", the configuration needs ",
               shape_str(p->value.shape()));
    const Tensor w = it->second.contiguous();
    MG_REQUIRE(ops::all_finite(w), "weight '", p->name,
               "' holds NaN or Inf values; the checkpoint is damaged");
    if (w.device() == p->value.device()) {
      ops::cast(p->value, w);
    } else {  // cast where the weight is, then one copy to the model's device
      Tensor v = Tensor::empty(w.shape(), p->value.dtype(), w.device());
      ops::cast(v, w);
      p->value.copy_(v);
    }
    ++used;
  }
  if (used != weights.size()) {
    std::string extra;
    const model::ParameterList ps = model_->parameters();
    for (const auto& [name, t] : weights)
      if (std::none_of(ps.begin(), ps.end(), [&](const model::Parameter* p) { return p->name == name; }))
        extra += (extra.empty() ? "" : ", ") + name;
    MG_THROW("the checkpoint has tensors this model configuration does not use (", extra,
             "); check the model flags (--normalization, --swiglu, --disable-bias-linear, "
             "--untie-embeddings-and-output-weights, --position-embedding-type, --qk-layernorm)");
  }
  // Finite weights that are not finite in the model's precision overflowed it (|w| > 65504 in
  // fp16).
  for (model::Parameter* p : model_->parameters())
    MG_REQUIRE(ops::all_finite(p->value), "weight '", p->name, "' has values beyond the range of ",
               dtype_name(cfg_.params_dtype), " (|w| > 65504 overflows fp16); load it with "
               "--bf16, or without --fp16");
}

void GPTEngine::start(int64_t batch, int64_t max_len) {
  MG_REQUIRE(batch >= 1, "generation needs at least one sequence");
  MG_REQUIRE(max_len >= 1 && max_len <= cfg_.max_position_embeddings, "sequence length ", max_len,
             " exceeds max_position_embeddings ", cfg_.max_position_embeddings);
  batch_ = batch;
  row_pos_.assign(size_t(batch), 0);
  model_->allocate_inference(cache_, batch, max_len);
}

std::vector<int64_t> GPTEngine::all_rows() const {
  std::vector<int64_t> rows(static_cast<size_t>(batch_));
  for (int64_t b = 0; b < batch_; ++b) rows[size_t(b)] = b;
  return rows;
}

Tensor GPTEngine::forward(std::span<const int32_t> tokens, int64_t n, bool all_positions) {
  MG_CHECK(int64_t(tokens.size()) == batch_ * n, "forward: ", tokens.size(), " tokens for ",
           batch_, "x", n);
  const std::vector<int64_t> counts(size_t(batch_), n);
  return run(all_rows(), tokens, counts, all_positions);
}

void GPTEngine::start_slots(int64_t slots, int64_t max_len) { start(slots, max_len); }

void GPTEngine::clear_slot(int64_t slot) {
  MG_CHECK(slot >= 0 && slot < batch_, "clear_slot ", slot, " of ", batch_);
  row_pos_[size_t(slot)] = 0;  // stale keys and values beyond the position are never read
}

void GPTEngine::grow_slots(int64_t max_len) {
  MG_CHECK(batch_ > 0, "grow_slots before start_slots");
  if (max_len <= cache_.max_len) return;
  MG_REQUIRE(max_len <= cfg_.max_position_embeddings, "sequence length ", max_len,
             " exceeds max_position_embeddings ", cfg_.max_position_embeddings);
  cache_.grow(max_len);
}

Tensor GPTEngine::forward_slots(std::span<const int64_t> slots, std::span<const int32_t> tokens,
                                std::span<const int64_t> counts, bool all_positions) {
  MG_CHECK(!slots.empty() && slots.size() == counts.size(), "forward_slots: ", slots.size(),
           " slots, ", counts.size(), " counts");
  std::vector<bool> seen(size_t(batch_), false);
  for (int64_t s : slots) {
    MG_CHECK(s >= 0 && s < batch_ && !seen[size_t(s)], "forward_slots: bad or repeated slot ", s);
    seen[size_t(s)] = true;
  }
  return run(slots, tokens, counts, all_positions);
}

Tensor GPTEngine::prefill_ragged(std::span<const std::vector<int32_t>> prompts,
                                 bool all_positions) {
  MG_CHECK(int64_t(prompts.size()) == batch_, "prefill_ragged: ", prompts.size(),
           " prompts for batch ", batch_);
  std::vector<int32_t> tokens;
  std::vector<int64_t> counts;
  for (const auto& p : prompts) {
    tokens.insert(tokens.end(), p.begin(), p.end());
    counts.push_back(int64_t(p.size()));
  }
  return run(all_rows(), tokens, counts, all_positions);
}

Tensor GPTEngine::run(std::span<const int64_t> slots, std::span<const int32_t> tokens,
                      std::span<const int64_t> counts, bool all_positions) {
  MG_CHECK(batch_ > 0 && counts.size() == slots.size(), "forward before start or bad batch");
  const int64_t V = cfg_.padded_vocab_size, calls = int64_t(slots.size());
  int64_t rows = 0, max_count = 0;
  for (int64_t b = 0; b < calls; ++b) {
    const int64_t n = counts[size_t(b)], pos = row_pos_[size_t(slots[size_t(b)])];
    MG_REQUIRE(pos + n <= cache_.max_len, "sequence position ", pos + n,
               " exceeds the cache length ", cache_.max_len);
    rows += n;
    max_count = std::max(max_count, n);
  }
  MG_CHECK(int64_t(tokens.size()) == rows, "forward: ", tokens.size(), " tokens for ", rows);
  for (int64_t r = 0; r < rows; ++r)
    MG_REQUIRE(tokens[size_t(r)] >= 0 && tokens[size_t(r)] < V, "token id ", tokens[size_t(r)],
               " outside the vocabulary [0, ", V, ")");
  // Slot and position of every new token; the rows whose logits are asked for and where they go
  // in the [calls, out_n, V] result (every new position of each row, or its last one).
  const int64_t out_n = all_positions ? max_count : 1;
  std::vector<int32_t> slot(static_cast<size_t>(rows)), pos(static_cast<size_t>(rows)), pick, dest;
  for (int64_t b = 0, r = 0; b < calls; ++b) {
    const int64_t n = counts[size_t(b)], s = slots[size_t(b)], p0 = row_pos_[size_t(s)];
    for (int64_t j = 0; j < n; ++j, ++r) {
      slot[size_t(r)] = int32_t(s);
      pos[size_t(r)] = int32_t(p0 + j);
      if (all_positions || j == n - 1) {
        pick.push_back(int32_t(r));
        dest.push_back(int32_t(b * out_n + (all_positions ? j : 0)));
      }
    }
  }
  const Device dev = model_->device();
  cache_.row_slot = Tensor::from_vector(slot, {rows}, dev);
  cache_.row_pos = Tensor::from_vector(pos, {rows}, dev);
  const Tensor ids =
      Tensor::from_vector(std::vector<int32_t>(tokens.begin(), tokens.end()), {rows}, dev);
  const Tensor picked = model_->forward_inference(
      ids, cache_, Tensor::from_vector(pick, {int64_t(pick.size())}, dev));
  Tensor logits = Tensor::zeros({calls, out_n, V}, DType::F32, dev);
  ops::index_copy_rows(logits.view({calls * out_n, V}), picked,
                       Tensor::from_vector(dest, {int64_t(dest.size())}, dev));
  for (int64_t b = 0; b < calls; ++b) row_pos_[size_t(slots[size_t(b)])] += counts[size_t(b)];
  return dev.is_cpu() ? logits : logits.to(Device::cpu());  // sampling reads them on the host
}

void GPTEngine::reorder(std::span<const int64_t> src) {
  MG_CHECK(!src.empty() && int64_t(src.size()) <= batch_, "reorder: ", src.size(),
           " rows for batch ", batch_);
  std::vector<int32_t> idx;
  std::vector<int64_t> pos;
  for (int64_t s : src) {
    MG_CHECK(s >= 0 && s < batch_, "reorder row out of range");
    idx.push_back(int32_t(s));
    pos.push_back(row_pos_[size_t(s)]);
  }
  cache_.reorder(Tensor::from_vector(idx, {int64_t(idx.size())}, model_->device()));
  row_pos_ = std::move(pos);
  batch_ = int64_t(src.size());
}

}  // namespace megatron::inference
