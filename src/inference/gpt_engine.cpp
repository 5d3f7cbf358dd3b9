// Incremental decoding of a GPTModel with its KV cache (see gpt_engine.h).
#include "inference/gpt_engine.h"

#include <algorithm>

#include "core/error.h"
#include "inference/checkpoint_weights.h"
#include "kernels/ops.h"

namespace megatron::inference {

model::TransformerConfig inference_config(model::TransformerConfig c) {
  c.hidden_dropout = c.attention_dropout = 0.0f;
  c.recompute_granularity.clear();
  c.recompute_method.clear();
  c.recompute_num_layers = 0;
  c.sequence_parallel = false;
  if (c.seq_length <= 0 || c.seq_length > c.max_position_embeddings)
    c.seq_length = int(c.max_position_embeddings);
  return c;
}

GPTEngine::GPTEngine(const model::TransformerConfig& config,
                     const std::map<std::string, Tensor>& weights, Device device)
    : cfg_(inference_config(config)) {
  model::ModelOptions opt;
  opt.grad = false;
  opt.init_weights = false;
  opt.device = device;
  model_ = std::make_unique<model::GPTModel>(cfg_, 0, model::TensorParallel::none(),
                                             model::ContextParallel::none(), model::ChunkPlace{
                                                 model::PipelineLayout{cfg_.num_layers, 1, 1}, 0, 0},
                                             opt);
  // The MoE layers' expert biases (float64 buffers beside the weights) route as in training.
  model::ParameterList params = model_->parameters();
  for (model::MoELayer* m : model_->moe_layers())
    if (model::Parameter* p = m->expert_bias_state()) params.push_back(p);
  load_weights_into(params, weights, cfg_.params_dtype);
  for (model::MoELayer* m : model_->moe_layers()) m->load_expert_bias_state();
}

GPTEngine::GPTEngine(const model::TransformerConfig& config,
                     std::unique_ptr<model::GPTModel> model, std::shared_ptr<Communicator> pp_group)
    : cfg_(inference_config(config)), model_(std::move(model)), pp_(std::move(pp_group)) {
  MG_CHECK(model_ && pp_, "GPTEngine: a stage needs its model and pipeline group");
  MG_CHECK(model_->pre_process() == (pp_->rank() == 0) &&
               model_->post_process() == (pp_->rank() == pp_->size() - 1),
           "GPTEngine: the model chunk is not pipeline stage ", pp_->rank(), " of ", pp_->size());
}

GPTEngine::~GPTEngine() = default;

void GPTEngine::check_start(int64_t batch, int64_t max_len) const {
  MG_REQUIRE(batch >= 1, "generation needs at least one sequence");
  MG_REQUIRE(max_len >= 1 && max_len <= cfg_.max_position_embeddings, "sequence length ", max_len,
             " exceeds max_position_embeddings ", cfg_.max_position_embeddings);
}

void GPTEngine::check_grow(int64_t max_len) const {
  MG_CHECK(batch_ > 0, "grow_slots before start_slots");
  MG_REQUIRE(max_len <= cfg_.max_position_embeddings, "sequence length ", max_len,
             " exceeds max_position_embeddings ", cfg_.max_position_embeddings);
}

void GPTEngine::check_run(std::span<const int64_t> slots, std::span<const int32_t> tokens,
                          std::span<const int64_t> counts) const {
  MG_CHECK(batch_ > 0 && counts.size() == slots.size() && !slots.empty(),
           "forward before start or bad batch");
  const int64_t V = cfg_.padded_vocab_size;
  int64_t rows = 0;
  std::vector<bool> seen(size_t(batch_), false);
  for (size_t b = 0; b < slots.size(); ++b) {
    const int64_t s = slots[b];
    MG_CHECK(s >= 0 && s < batch_ && !seen[size_t(s)], "forward: bad or repeated slot ", s);
    seen[size_t(s)] = true;
    MG_CHECK(counts[b] >= 1, "forward: no tokens for slot ", s);
    MG_REQUIRE(row_pos_[size_t(s)] + counts[b] <= cache_.max_len, "sequence position ",
               row_pos_[size_t(s)] + counts[b], " exceeds the cache length ", cache_.max_len);
    rows += counts[b];
  }
  MG_CHECK(int64_t(tokens.size()) == rows, "forward: ", tokens.size(), " tokens for ", rows);
  for (int32_t t : tokens)
    MG_REQUIRE(t >= 0 && t < V, "token id ", t, " outside the vocabulary [0, ", V, ")");
}

void GPTEngine::start(int64_t batch, int64_t max_len) {
  check_start(batch, max_len);
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
  check_grow(max_len);
  if (max_len <= cache_.max_len) return;
  cache_.grow(max_len);
}

Tensor GPTEngine::forward_slots(std::span<const int64_t> slots, std::span<const int32_t> tokens,
                                std::span<const int64_t> counts, bool all_positions) {
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
  check_run(slots, tokens, counts);
  const int64_t V = cfg_.padded_vocab_size, calls = int64_t(slots.size());
  int64_t rows = 0, max_count = 0;
  for (int64_t n : counts) {
    rows += n;
    max_count = std::max(max_count, n);
  }
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
  const Tensor picked =
      run_stage(ids, Tensor::from_vector(pick, {int64_t(pick.size())}, dev), rows);
  for (int64_t b = 0; b < calls; ++b) row_pos_[size_t(slots[size_t(b)])] += counts[size_t(b)];
  Tensor logits;
  if (picked.defined()) {
    logits = Tensor::zeros({calls, out_n, V}, DType::F32, dev);
    ops::index_copy_rows(logits.view({calls * out_n, V}), picked,
                         Tensor::from_vector(dest, {int64_t(dest.size())}, dev));
  }
  logits = logits_to_first_stage(logits, calls, out_n);
  if (!logits.defined()) return logits;
  return dev.is_cpu() ? logits : logits.to(Device::cpu());  // sampling reads them on the host
}

Tensor GPTEngine::run_stage(const Tensor& ids, const Tensor& pick, int64_t rows) {
  if (!pp_ || pp_->size() == 1) return model_->forward_inference(ids, cache_, pick);
  Tensor hidden;
  if (!model_->pre_process()) {
    hidden = Tensor::empty({rows, cfg_.hidden_size}, DType::F32, model_->device());
    pp_->recv(hidden, pp_->rank() - 1);
  }
  Tensor out = model_->forward_inference(ids, cache_, pick, hidden);
  if (model_->post_process()) return out;
  pp_->send(out.contiguous(), pp_->rank() + 1);
  return Tensor();
}

Tensor GPTEngine::logits_to_first_stage(Tensor logits, int64_t calls, int64_t out_n) {
  if (!pp_) return logits;
  // Every tensor-parallel rank of the last stage holds the gathered logits; the first stage's
  // rank 0 (the leader) needs them.
  if (model_->tensor_parallel_rank() != 0) return Tensor();
  if (pp_->size() == 1) return logits;
  if (model_->post_process()) {
    pp_->send(logits, 0);
    return Tensor();
  }
  if (!model_->pre_process()) return Tensor();
  logits = Tensor::empty({calls, out_n, cfg_.padded_vocab_size}, DType::F32, model_->device());
  pp_->recv(logits, pp_->size() - 1);
  return logits;
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
