// GPT forward with a KV cache on the CPU. The matrix products go to OpenBLAS (multi-threaded);
// the rest is plain loops on the calling thread: mixing OpenMP regions with OpenBLAS's own
// threads made both spin against each other (2-4x slower decoding on 2 cores).
#include "inference/gpt_inference.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace megatron::inference {
namespace {

using Config = GPTInferenceConfig;

// y[rows, out] = x[rows, in] W^T (+ b), W stored [out, in] (PyTorch nn.Linear layout).
void linear(const float* x, const std::vector<float>& w, const std::vector<float>& b, float* y,
            int64_t rows, int64_t in, int64_t out) {
  if (rows == 1) {  // decoding one sequence: a matrix-vector product
    cblas_sgemv(CblasRowMajor, CblasNoTrans, int(out), int(in), 1.0f, w.data(), int(in), x, 1,
                0.0f, y, 1);
  } else {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(rows), int(out), int(in), 1.0f, x,
                int(in), w.data(), int(in), 0.0f, y, int(out));
  }
  if (!b.empty()) {
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t o = 0; o < out; ++o) y[r * out + o] += b[size_t(o)];
  }
}

std::vector<float> fetch(const WeightLookup& lookup, const std::string& name, const Shape& shape,
                         bool required = true) {
  Tensor t = lookup(name);
  if (!t.defined()) {
    MG_REQUIRE(!required, "the model weights have no tensor '", name, "'");
    return {};
  }
  MG_REQUIRE(t.shape() == shape, "weight '", name, "' has shape ", shape_str(t.shape()),
             ", the configuration needs ", shape_str(shape));
  Tensor f = t.dtype() == DType::F32 ? t.contiguous() : t.to(DType::F32);
  const float* p = f.data<float>();
  return std::vector<float>(p, p + f.numel());
}

}  // namespace

GPTInferenceConfig inference_config(const model::GPTConfig& m) {
  GPTInferenceConfig c;
  c.num_layers = m.num_layers;
  c.hidden_size = m.hidden_size;
  c.num_attention_heads = m.num_attention_heads;
  c.kv_channels = m.kv_channels;
  c.ffn_hidden_size = m.ffn_hidden_size;
  c.padded_vocab_size = m.padded_vocab_size;
  c.max_position_embeddings = m.max_position_embeddings > 0 ? m.max_position_embeddings : m.seq_length;
  c.layernorm_epsilon = m.layernorm_epsilon;
  c.activation = m.gelu_tanh ? GPTInferenceConfig::Activation::GeluTanh
                             : GPTInferenceConfig::Activation::Gelu;
  return c.resolved();
}

WeightLookup parameter_lookup(const model::ParameterList& params) {
  return [&params](const std::string& name) {
    for (const model::Parameter* p : params)
      if (p && p->name == name) return p->value;
    return Tensor();
  };
}

GPTInferenceConfig GPTInferenceConfig::resolved() const {
  Config c = *this;
  MG_REQUIRE(c.num_layers >= 1 && c.hidden_size >= 1 && c.num_attention_heads >= 1,
             "the GPT needs num_layers, hidden_size and num_attention_heads >= 1");
  if (c.num_query_groups == 0) c.num_query_groups = c.num_attention_heads;
  if (c.kv_channels == 0) {
    MG_REQUIRE(c.hidden_size % c.num_attention_heads == 0, "hidden_size ", c.hidden_size,
               " is not divisible by num_attention_heads ", c.num_attention_heads);
    c.kv_channels = c.hidden_size / c.num_attention_heads;
  }
  if (c.ffn_hidden_size == 0) c.ffn_hidden_size = 4 * c.hidden_size;
  MG_REQUIRE(c.num_attention_heads % c.num_query_groups == 0, "num_attention_heads ",
             c.num_attention_heads, " is not divisible by num_query_groups ", c.num_query_groups);
  MG_REQUIRE(c.padded_vocab_size >= 1 && c.max_position_embeddings >= 1,
             "the GPT needs padded_vocab_size and max_position_embeddings >= 1");
  MG_REQUIRE(c.rotary_percent > 0.0 && c.rotary_percent <= 1.0, "rotary_percent must be in (0, 1]");
  return c;
}

GPTInference::GPTInference(const GPTInferenceConfig& config, const WeightLookup& w)
    : cfg_(config.resolved()) {
  const int64_t h = cfg_.hidden_size;
  heads_ = cfg_.num_attention_heads;
  groups_ = cfg_.num_query_groups;
  d_ = cfg_.kv_channels;
  qkv_dim_ = (heads_ + 2 * groups_) * d_;
  ffn_ = cfg_.ffn_hidden_size;
  const int64_t fc1_out = cfg_.activation == Config::Activation::SwiGLU ? 2 * ffn_ : ffn_;
  const bool norm_bias = cfg_.normalization == Config::Norm::LayerNorm;
  const int64_t V = cfg_.padded_vocab_size;

  word_emb_ = fetch(w, "embedding.word_embeddings.weight", {V, h});
  if (cfg_.position_embedding_type == Config::Position::LearnedAbsolute)
    pos_emb_ = fetch(w, "embedding.position_embeddings.weight", {cfg_.max_position_embeddings, h});
  final_w_ = fetch(w, "decoder.final_layernorm.weight", {h});
  if (norm_bias) final_b_ = fetch(w, "decoder.final_layernorm.bias", {h});
  if (cfg_.untie_embeddings_and_output_weights) output_w_ = fetch(w, "output_layer.weight", {V, h});

  // Norms live under input_layernorm/pre_mlp_layernorm (local spec) or are fused into the next
  // linear as layer_norm_weight/bias (Transformer Engine spec).
  auto norm_weight = [&](const std::string& local, const std::string& fused, const char* suffix) {
    Tensor t = w(local + "." + suffix);
    return fetch(w, t.defined() ? local + "." + suffix : fused + ".layer_norm_" + suffix, {h});
  };
  layers_.resize(size_t(cfg_.num_layers));
  for (int64_t i = 0; i < cfg_.num_layers; ++i) {
    auto& L = layers_[size_t(i)];
    const std::string p = "decoder.layers." + std::to_string(i) + ".";
    L.ln1_w = norm_weight(p + "input_layernorm", p + "self_attention.linear_qkv", "weight");
    if (norm_bias) L.ln1_b = norm_weight(p + "input_layernorm", p + "self_attention.linear_qkv", "bias");
    L.qkv_w = fetch(w, p + "self_attention.linear_qkv.weight", {qkv_dim_, h});
    if (cfg_.add_qkv_bias) L.qkv_b = fetch(w, p + "self_attention.linear_qkv.bias", {qkv_dim_});
    L.proj_w = fetch(w, p + "self_attention.linear_proj.weight", {h, heads_ * d_});
    if (cfg_.add_bias_linear) L.proj_b = fetch(w, p + "self_attention.linear_proj.bias", {h});
    L.ln2_w = norm_weight(p + "pre_mlp_layernorm", p + "mlp.linear_fc1", "weight");
    if (norm_bias) L.ln2_b = norm_weight(p + "pre_mlp_layernorm", p + "mlp.linear_fc1", "bias");
    L.fc1_w = fetch(w, p + "mlp.linear_fc1.weight", {fc1_out, h});
    if (cfg_.add_bias_linear) L.fc1_b = fetch(w, p + "mlp.linear_fc1.bias", {fc1_out});
    L.fc2_w = fetch(w, p + "mlp.linear_fc2.weight", {h, ffn_});
    if (cfg_.add_bias_linear) L.fc2_b = fetch(w, p + "mlp.linear_fc2.bias", {h});
  }
  if (cfg_.position_embedding_type == Config::Position::Rope) {
    const int64_t rot = int64_t(double(d_) * cfg_.rotary_percent);
    MG_REQUIRE(rot >= 2 && rot % 2 == 0, "rotary dimension ", rot, " must be even and >= 2");
    for (int64_t i = 0; i < rot; i += 2)
      inv_freq_.push_back(float(1.0 / std::pow(cfg_.rotary_base, double(i) / double(rot))));
  }
}

void GPTInference::start(int64_t batch, int64_t max_len) {
  MG_REQUIRE(batch >= 1, "generation needs at least one sequence");
  MG_REQUIRE(max_len >= 1 && max_len <= cfg_.max_position_embeddings, "sequence length ", max_len,
             " exceeds max_position_embeddings ", cfg_.max_position_embeddings);
  batch_ = batch;
  max_len_ = max_len;
  row_pos_.assign(static_cast<size_t>(batch), 0);
  const size_t cache = size_t(batch * groups_ * max_len * d_);
  for (auto& L : layers_) {
    L.k_cache.assign(cache, 0.0f);
    L.v_cache.assign(cache, 0.0f);
  }
}

void GPTInference::norm(const float* x, const std::vector<float>& w, const std::vector<float>& b,
                        float* y, int64_t rows) const {
  const int64_t h = cfg_.hidden_size;
  const bool layer = cfg_.normalization == Config::Norm::LayerNorm;
  const double eps = cfg_.layernorm_epsilon;
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * h;
    float* yr = y + r * h;
    double mean = 0.0, var = 0.0;
    if (layer) {
      for (int64_t i = 0; i < h; ++i) mean += xr[i];
      mean /= double(h);
    }
    for (int64_t i = 0; i < h; ++i) var += (xr[i] - mean) * (xr[i] - mean);
    const float inv = float(1.0 / std::sqrt(var / double(h) + eps));
    for (int64_t i = 0; i < h; ++i)
      yr[i] = float(xr[i] - mean) * inv * w[size_t(i)] + (layer ? b[size_t(i)] : 0.0f);
  }
}

// Megatron's rotary embedding (non-interleaved): the first rot dims are split in halves
// x1, x2 and rotated as (x1 cos - x2 sin, x2 cos + x1 sin) with frequency index i < rot/2.
void GPTInference::rope(float* v, int64_t position) const {
  const int64_t half = int64_t(inv_freq_.size());
  for (int64_t i = 0; i < half; ++i) {
    const double angle = double(position) * double(inv_freq_[size_t(i)]);
    const float c = float(std::cos(angle)), s = float(std::sin(angle));
    const float x1 = v[i], x2 = v[i + half];
    v[i] = x1 * c - x2 * s;
    v[i + half] = x2 * c + x1 * s;
  }
}

void GPTInference::attention(Layer& L, float* qkv, float* ctx, std::span<const int64_t> slots,
                             std::span<const int64_t> counts) {
  const int64_t hpg = heads_ / groups_;
  const int64_t stride = (hpg + 2) * d_;  // one query group in the fused QKV row
  const bool use_rope = cfg_.position_embedding_type == Config::Position::Rope;
  const float scale = float(1.0 / std::sqrt(double(d_)));
  std::vector<float> scores;
  int64_t first = 0;  // first token of row b in the flattened batch
  for (int64_t b = 0; b < int64_t(counts.size()); first += counts[size_t(b)], ++b) {
    const int64_t n = counts[size_t(b)], s = slots[size_t(b)], pos = row_pos_[size_t(s)];
    if (n == 0) continue;
    float* row_qkv = qkv + first * qkv_dim_;
    // Rotate the queries in place; append the (rotated) keys and the values to the cache.
    for (int64_t g = 0; g < groups_; ++g)
      for (int64_t j = 0; j < n; ++j) {
        float* row = row_qkv + j * qkv_dim_ + g * stride;
        float* k = L.k_cache.data() + ((s * groups_ + g) * max_len_ + pos + j) * d_;
        float* v = L.v_cache.data() + ((s * groups_ + g) * max_len_ + pos + j) * d_;
        std::copy_n(row + hpg * d_, d_, k);
        std::copy_n(row + (hpg + 1) * d_, d_, v);
        if (use_rope) {
          rope(k, pos + j);
          for (int64_t q = 0; q < hpg; ++q) rope(row + q * d_, pos + j);
        }
      }
    const int64_t total = pos + n;  // keys visible to the last new position
    scores.resize(size_t(n * total));
    for (int64_t head = 0; head < heads_; ++head) {
      const int64_t g = head / hpg;
      const float* Q = row_qkv + g * stride + (head % hpg) * d_;  // row stride qkv_dim_
      const float* K = L.k_cache.data() + (s * groups_ + g) * max_len_ * d_;
      const float* Vc = L.v_cache.data() + (s * groups_ + g) * max_len_ * d_;
      float* out = ctx + first * heads_ * d_ + head * d_;  // row stride heads_ * d_
      // scores[j, t] = scale * q_j . k_t for t < total; position pos + j sees t <= pos + j.
      if (n == 1) {
        cblas_sgemv(CblasRowMajor, CblasNoTrans, int(total), int(d_), scale, K, int(d_), Q, 1,
                    0.0f, scores.data(), 1);
      } else {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(n), int(total), int(d_), scale, Q,
                    int(qkv_dim_), K, int(d_), 0.0f, scores.data(), int(total));
      }
      for (int64_t j = 0; j < n; ++j) {
        float* row = scores.data() + j * total;
        const int64_t len = pos + j + 1;
        float mx = -INFINITY;
        for (int64_t t = 0; t < len; ++t) mx = std::max(mx, row[t]);
        float sum = 0.0f;
        for (int64_t t = 0; t < len; ++t) sum += row[t] = std::exp(row[t] - mx);
        const float inv = 1.0f / sum;
        for (int64_t t = 0; t < len; ++t) row[t] *= inv;
        std::fill(row + len, row + total, 0.0f);  // causal mask
      }
      if (n == 1) {
        cblas_sgemv(CblasRowMajor, CblasTrans, int(total), int(d_), 1.0f, Vc, int(d_),
                    scores.data(), 1, 0.0f, out, 1);
      } else {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(n), int(d_), int(total), 1.0f,
                    scores.data(), int(total), Vc, int(d_), 0.0f, out, int(heads_ * d_));
      }
    }
  }
}

Tensor GPTInference::forward(std::span<const int32_t> tokens, int64_t n, bool all_positions) {
  MG_CHECK(int64_t(tokens.size()) == batch_ * n, "forward: ", tokens.size(), " tokens for ",
           batch_, "x", n);
  const std::vector<int64_t> counts(static_cast<size_t>(batch_), n);
  return run(all_rows(), tokens, counts, all_positions);
}

std::vector<int64_t> GPTInference::all_rows() const {
  std::vector<int64_t> rows(static_cast<size_t>(batch_));
  for (int64_t b = 0; b < batch_; ++b) rows[size_t(b)] = b;
  return rows;
}

void GPTInference::start_slots(int64_t slots, int64_t max_len) { start(slots, max_len); }

void GPTInference::clear_slot(int64_t slot) {
  MG_CHECK(slot >= 0 && slot < batch_, "clear_slot ", slot, " of ", batch_);
  row_pos_[size_t(slot)] = 0;  // stale keys and values beyond the position are never read
}

void GPTInference::grow_slots(int64_t max_len) {
  MG_CHECK(batch_ > 0, "grow_slots before start_slots");
  if (max_len <= max_len_) return;
  MG_REQUIRE(max_len <= cfg_.max_position_embeddings, "sequence length ", max_len,
             " exceeds max_position_embeddings ", cfg_.max_position_embeddings);
  // [slot, group, position, d]: each (slot, group) block keeps its positions at a longer stride.
  const int64_t blocks = batch_ * groups_, old_block = max_len_ * d_, new_block = max_len * d_;
  for (auto& L : layers_)
    for (auto* cache : {&L.k_cache, &L.v_cache}) {
      std::vector<float> grown(size_t(blocks * new_block), 0.0f);
      for (int64_t b = 0; b < blocks; ++b)
        std::copy_n(cache->data() + b * old_block, old_block, grown.data() + b * new_block);
      cache->swap(grown);
    }
  max_len_ = max_len;
}

Tensor GPTInference::forward_slots(std::span<const int64_t> slots, std::span<const int32_t> tokens,
                                   std::span<const int64_t> counts, bool all_positions) {
  MG_CHECK(!slots.empty() && slots.size() == counts.size(), "forward_slots: ", slots.size(),
           " slots, ", counts.size(), " counts");
  std::vector<bool> seen(static_cast<size_t>(batch_), false);
  for (int64_t s : slots) {
    MG_CHECK(s >= 0 && s < batch_ && !seen[size_t(s)], "forward_slots: bad or repeated slot ", s);
    seen[size_t(s)] = true;
  }
  return run(slots, tokens, counts, all_positions);
}

Tensor GPTInference::prefill_ragged(std::span<const std::vector<int32_t>> prompts,
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

Tensor GPTInference::run(std::span<const int64_t> slots, std::span<const int32_t> tokens,
                         std::span<const int64_t> counts, bool all_positions) {
  MG_CHECK(batch_ > 0 && counts.size() == slots.size(), "forward before start or bad batch");
  const int64_t h = cfg_.hidden_size, V = cfg_.padded_vocab_size;
  const int64_t calls = int64_t(slots.size());  // rows of this forward (cache slots it touches)
  int64_t rows = 0, max_count = 0;
  for (int64_t b = 0; b < calls; ++b) {
    const int64_t n = counts[size_t(b)], pos = row_pos_[size_t(slots[size_t(b)])];
    MG_REQUIRE(pos + n <= max_len_, "sequence position ", pos + n,
               " exceeds the cache length ", max_len_);
    rows += n;
    max_count = std::max(max_count, n);
  }
  MG_CHECK(int64_t(tokens.size()) == rows, "forward: ", tokens.size(), " tokens for ", rows);
  std::vector<float> x(static_cast<size_t>(rows * h)), y(static_cast<size_t>(rows * h));
  for (int64_t b = 0, r = 0; b < calls; ++b)
    for (int64_t j = 0; j < counts[size_t(b)]; ++j, ++r) {
      const int32_t t = tokens[size_t(r)];
      MG_REQUIRE(t >= 0 && t < V, "token id ", t, " outside the vocabulary [0, ", V, ")");
      std::copy_n(word_emb_.data() + int64_t(t) * h, h, x.data() + r * h);
      if (!pos_emb_.empty()) {
        const float* pe = pos_emb_.data() + (row_pos_[size_t(slots[size_t(b)])] + j) * h;
        for (int64_t i = 0; i < h; ++i) x[size_t(r * h + i)] += pe[i];
      }
    }
  const int64_t fc1_out = cfg_.activation == Config::Activation::SwiGLU ? 2 * ffn_ : ffn_;
  std::vector<float> qkv(static_cast<size_t>(rows * qkv_dim_)), ctx(static_cast<size_t>(rows * heads_ * d_));
  std::vector<float> fc1(static_cast<size_t>(rows * fc1_out)), act(static_cast<size_t>(rows * ffn_));
  for (auto& L : layers_) {
    norm(x.data(), L.ln1_w, L.ln1_b, y.data(), rows);
    linear(y.data(), L.qkv_w, L.qkv_b, qkv.data(), rows, h, qkv_dim_);
    attention(L, qkv.data(), ctx.data(), slots, counts);
    linear(ctx.data(), L.proj_w, L.proj_b, y.data(), rows, heads_ * d_, h);
    for (size_t i = 0; i < x.size(); ++i) x[i] += y[i];
    norm(x.data(), L.ln2_w, L.ln2_b, y.data(), rows);
    linear(y.data(), L.fc1_w, L.fc1_b, fc1.data(), rows, h, fc1_out);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t i = 0; i < ffn_; ++i) {
        float* a = act.data() + r * ffn_ + i;
        const float v = fc1[size_t(r * fc1_out + i)];
        switch (cfg_.activation) {
          case Config::Activation::Gelu:
            *a = 0.5f * v * (1.0f + std::erf(v * 0.70710678118654752f));
            break;
          case Config::Activation::GeluTanh:
            *a = 0.5f * v * (1.0f + std::tanh(0.7978845608028654f * (v + 0.044715f * v * v * v)));
            break;
          case Config::Activation::SwiGLU:
            *a = v / (1.0f + std::exp(-v)) * fc1[size_t(r * fc1_out + ffn_ + i)];
            break;
        }
      }
    linear(act.data(), L.fc2_w, L.fc2_b, y.data(), rows, ffn_, h);
    for (size_t i = 0; i < x.size(); ++i) x[i] += y[i];
  }
  // Final norm and output layer for the positions asked for: every new position of each row
  // ([batch, max count, V], rows shorter than the longest padded with zeros), or the last one.
  const int64_t out_n = all_positions ? max_count : 1;
  std::vector<float> picked;
  std::vector<int64_t> dest;  // row of the logits tensor each picked position goes to
  for (int64_t b = 0, first = 0; b < calls; first += counts[size_t(b)], ++b) {
    const int64_t n = counts[size_t(b)];
    for (int64_t j = all_positions ? 0 : n - 1; j < n; ++j) {
      picked.insert(picked.end(), x.begin() + (first + j) * h, x.begin() + (first + j + 1) * h);
      dest.push_back(b * out_n + (all_positions ? j : 0));
    }
  }
  const int64_t count = int64_t(dest.size());
  std::vector<float> normed(picked.size()), out(static_cast<size_t>(count * V));
  norm(picked.data(), final_w_, final_b_, normed.data(), count);
  static const std::vector<float> no_bias;
  linear(normed.data(), output_w_.empty() ? word_emb_ : output_w_, no_bias, out.data(), count, h, V);
  Tensor logits = Tensor::zeros({calls, out_n, V}, DType::F32);
  for (int64_t k = 0; k < count; ++k)
    std::copy_n(out.data() + k * V, V, logits.data<float>() + dest[size_t(k)] * V);
  for (int64_t b = 0; b < calls; ++b) row_pos_[size_t(slots[size_t(b)])] += counts[size_t(b)];
  return logits;
}

void GPTInference::reorder(std::span<const int64_t> src) {
  MG_CHECK(!src.empty() && int64_t(src.size()) <= batch_, "reorder: ", src.size(),
           " rows for batch ", batch_);
  const int64_t row = groups_ * max_len_ * d_;
  const int64_t rows = int64_t(src.size());
  std::vector<float> tmp;
  for (auto& L : layers_)
    for (auto* cache : {&L.k_cache, &L.v_cache}) {
      tmp.resize(size_t(rows * row));
      for (int64_t b = 0; b < rows; ++b) {
        MG_CHECK(src[size_t(b)] >= 0 && src[size_t(b)] < batch_, "reorder row out of range");
        std::copy_n(cache->data() + src[size_t(b)] * row, row, tmp.data() + b * row);
      }
      cache->swap(tmp);
    }
  std::vector<int64_t> pos;
  for (int64_t b = 0; b < rows; ++b) pos.push_back(row_pos_[size_t(src[size_t(b)])]);
  row_pos_ = std::move(pos);
  batch_ = rows;
}

}  // namespace megatron::inference
