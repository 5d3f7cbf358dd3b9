// Shared by the generation benchmarks: a GPT of a given shape with random weights (the values
// do not matter for speed) and a tiny flag parser.
#pragma once

#include <cstdlib>
#include <cstring>
#include <map>
#include <string>

#include "core/rng.h"
#include "inference/gpt_inference.h"

namespace megatron::bench {

inline inference::GPTInferenceConfig bench_config(int64_t layers, int64_t hidden, int64_t heads,
                                                  int64_t vocab, int64_t max_len) {
  inference::GPTInferenceConfig c;
  c.num_layers = layers;
  c.hidden_size = hidden;
  c.num_attention_heads = heads;
  c.padded_vocab_size = vocab;
  c.max_position_embeddings = max_len;
  return c.resolved();
}

// Random normal(0, 0.02) weights by name, generated on demand (norm weights 1, biases 0).
inline inference::WeightLookup random_lookup(const inference::GPTInferenceConfig& c) {
  return [c](const std::string& name) -> Tensor {
    const int64_t h = c.hidden_size, V = c.padded_vocab_size;
    const int64_t qkv = (c.num_attention_heads + 2 * c.num_query_groups) * c.kv_channels;
    Shape shape;
    bool ones = false, zeros = false;
    auto ends = [&](const char* s) {
      return name.size() >= std::strlen(s) && name.compare(name.size() - std::strlen(s), std::string::npos, s) == 0;
    };
    if (name == "embedding.word_embeddings.weight") shape = {V, h};
    else if (name == "embedding.position_embeddings.weight") shape = {c.max_position_embeddings, h};
    else if (ends("layernorm.weight")) { shape = {h}; ones = true; }
    else if (ends("layernorm.bias")) { shape = {h}; zeros = true; }
    else if (ends("linear_qkv.weight")) shape = {qkv, h};
    else if (ends("linear_qkv.bias")) { shape = {qkv}; zeros = true; }
    else if (ends("linear_proj.weight")) shape = {h, c.num_attention_heads * c.kv_channels};
    else if (ends("linear_proj.bias") || ends("linear_fc2.bias")) { shape = {h}; zeros = true; }
    else if (ends("linear_fc1.weight")) shape = {c.ffn_hidden_size, h};
    else if (ends("linear_fc1.bias")) { shape = {c.ffn_hidden_size}; zeros = true; }
    else if (ends("linear_fc2.weight")) shape = {h, c.ffn_hidden_size};
    else return Tensor();
    if (ones) return Tensor::full(shape, 1.0, DType::F32);
    if (zeros) return Tensor::zeros(shape, DType::F32);
    Tensor t = Tensor::empty(shape, DType::F32);
    Philox(7, std::hash<std::string>{}(name)).fill_normal(t.data<float>(), t.numel(), 0.0f, 0.02f);
    return t;
  };
}

// --name value pairs into a map; flag(name, default).
struct Flags {
  Flags(int argc, char** argv) {
    for (int i = 1; i + 1 < argc; i += 2) values[argv[i]] = argv[i + 1];
  }
  int64_t get(const std::string& name, int64_t fallback) const {
    auto it = values.find(name);
    return it == values.end() ? fallback : std::atoll(it->second.c_str());
  }
  std::map<std::string, std::string> values;
};

}  // namespace megatron::bench
