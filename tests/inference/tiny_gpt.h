// Tiny GPT configurations with deterministic random weights, for engine and CLI tests; and a
// safetensors writer to put them in a checkpoint folder.
#pragma once

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "core/rng.h"
#include "inference/gpt_engine.h"

namespace megatron::inference::testing {

using Config = model::TransformerConfig;
using Weights = std::map<std::string, Tensor>;

inline Config gpt2_config() {
  Config c;
  c.num_layers = 2;
  c.hidden_size = 32;
  c.num_attention_heads = 4;
  c.padded_vocab_size = 64;
  c.max_position_embeddings = 32;
  c.seq_length = 32;
  c.activation = "gelu_tanh";  // Megatron's default fused bias-GeLU
  return c;
}

inline Config llama_config() {
  Config c;
  c.num_layers = 2;
  c.hidden_size = 32;
  c.num_attention_heads = 4;
  c.num_query_groups = 2;
  c.ffn_hidden_size = 48;
  c.padded_vocab_size = 64;
  c.max_position_embeddings = 32;
  c.seq_length = 32;
  c.normalization = "RMSNorm";
  c.activation = "swiglu";
  c.position_embedding_type = "rope";
  c.rotary_percent = 0.5f;
  c.add_bias_linear = false;
  c.add_qkv_bias = false;
  c.untie_embeddings_and_output_weights = true;
  return c;
}

inline Weights random_weights(const Config& c) {
  Weights w;
  uint64_t stream = 0;
  auto add = [&](const std::string& name, Shape shape, float mean, float stddev) {
    Tensor t = Tensor::empty(shape, DType::F32);
    Philox(1234, stream++).fill_normal(t.data<float>(), t.numel(), mean, stddev);
    w[name] = t;
  };
  const int64_t h = c.hidden_size, V = c.padded_vocab_size, ffn = c.ffn();
  const bool ln = c.normalization == "LayerNorm";
  const int64_t qkv = int64_t(c.num_attention_heads + 2 * c.query_groups()) * c.head_dim();
  const int64_t fc1 = c.activation == "swiglu" ? 2 * ffn : ffn;
  add("embedding.word_embeddings.weight", {V, h}, 0.0f, 0.5f);
  if (c.learned_position_embedding())
    add("embedding.position_embeddings.weight", {c.max_position_embeddings, h}, 0.0f, 0.5f);
  for (int64_t i = 0; i < c.num_layers; ++i) {
    const std::string p = "decoder.layers." + std::to_string(i) + ".";
    add(p + "input_layernorm.weight", {h}, 1.0f, 0.1f);
    add(p + "pre_mlp_layernorm.weight", {h}, 1.0f, 0.1f);
    if (ln) {
      add(p + "input_layernorm.bias", {h}, 0.0f, 0.1f);
      add(p + "pre_mlp_layernorm.bias", {h}, 0.0f, 0.1f);
    }
    add(p + "self_attention.linear_qkv.weight", {qkv, h}, 0.0f, 0.3f);
    add(p + "self_attention.linear_proj.weight", {h, int64_t(c.num_attention_heads) * c.head_dim()}, 0.0f, 0.2f);
    add(p + "mlp.linear_fc1.weight", {fc1, h}, 0.0f, 0.2f);
    add(p + "mlp.linear_fc2.weight", {h, ffn}, 0.0f, 0.2f);
    if (c.qkv_bias()) add(p + "self_attention.linear_qkv.bias", {qkv}, 0.0f, 0.1f);
    if (c.add_bias_linear) {
      add(p + "self_attention.linear_proj.bias", {h}, 0.0f, 0.1f);
      add(p + "mlp.linear_fc1.bias", {fc1}, 0.0f, 0.1f);
      add(p + "mlp.linear_fc2.bias", {h}, 0.0f, 0.1f);
    }
  }
  add("decoder.final_layernorm.weight", {h}, 1.0f, 0.1f);
  if (ln) add("decoder.final_layernorm.bias", {h}, 0.0f, 0.1f);
  if (c.untie_embeddings_and_output_weights) add("output_layer.weight", {V, h}, 0.0f, 0.5f);
  return w;
}

// Writes `w` as DIR/iter_{step}/mp_rank_00/model.safetensors plus the tracker file.
inline void write_checkpoint(const std::filesystem::path& dir, const Weights& w, int step) {
  char sub[32];
  std::snprintf(sub, sizeof(sub), "iter_%07d", step);
  const auto folder = dir / sub / "mp_rank_00";
  std::filesystem::create_directories(folder);
  nlohmann::json header = nlohmann::json::object();
  uint64_t offset = 0;
  for (const auto& [name, t] : w) {
    header[name] = {{"dtype", "F32"}, {"shape", t.shape()}, {"data_offsets", {offset, offset + t.nbytes()}}};
    offset += t.nbytes();
  }
  std::string h = header.dump();
  while (h.size() % 8) h += ' ';
  std::ofstream out(folder / "model.safetensors", std::ios::binary);
  const uint64_t n = h.size();
  for (int i = 0; i < 8; ++i) out.put(char((n >> (8 * i)) & 0xff));
  out << h;
  for (const auto& [name, t] : w) out.write(static_cast<const char*>(t.raw_data()), std::streamsize(t.nbytes()));
  std::ofstream(dir / "latest_checkpointed_iteration.txt") << step;
}

}  // namespace megatron::inference::testing
