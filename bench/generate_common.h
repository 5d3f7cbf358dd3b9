// Shared by the generation benchmarks: a GPT of a given shape with random weights (the values
// do not matter for speed) and a tiny flag parser.
#pragma once

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>

#include "core/rng.h"
#include "inference/gpt_engine.h"
#include "model/gpt_model.h"

namespace megatron::bench {

// A GPT-2-style shape, or with arch "llama" a Llama-style one (RMSNorm, SwiGLU, rotary, no biases,
// untied output, query groups = heads / 4).
inline model::TransformerConfig bench_config(int64_t layers, int64_t hidden, int64_t heads,
                                             int64_t vocab, int64_t max_len,
                                             const std::string& arch = "gpt") {
  model::TransformerConfig c;
  c.num_layers = int(layers);
  c.hidden_size = int(hidden);
  c.num_attention_heads = int(heads);
  c.padded_vocab_size = vocab;
  c.max_position_embeddings = int(max_len);
  c.seq_length = int(max_len);
  c.hidden_dropout = c.attention_dropout = 0.0f;
  if (arch == "llama") {
    c.normalization = "RMSNorm";
    c.activation = "swiglu";
    c.position_embedding_type = "rope";
    c.num_query_groups = std::max<int>(1, int(heads) / 4);
    c.ffn_hidden_size = int(hidden) * 8 / 3 / 64 * 64;
    c.add_bias_linear = false;
    c.untie_embeddings_and_output_weights = true;
  }
  return c;
}

// Megatron's initial weights of that shape (the values do not matter for speed).
inline std::map<std::string, Tensor> random_weights(const model::TransformerConfig& c) {
  model::GPTModel m(c, 7);
  std::map<std::string, Tensor> w;
  for (model::Parameter* p : m.parameters()) w[p->name] = p->value.clone();
  return w;
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
  std::string text(const std::string& name, const std::string& fallback) const {
    auto it = values.find(name);
    return it == values.end() ? fallback : it->second;
  }
  std::map<std::string, std::string> values;
};

}  // namespace megatron::bench
