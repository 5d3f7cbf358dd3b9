// Tiny GPT checkpoints for the tests of sharded and model-parallel generation: random weights
// saved as a single-rank training checkpoint (with its metadata.json), and resharded by
// `megatron checkpoint convert`'s library.
#pragma once

#include <filesystem>

#include "tiny_gpt.h"
#include "training/checkpoint.h"
#include "training/checkpoint_convert.h"

namespace megatron::inference {

// Saves `w` as a single-rank training checkpoint (iteration 7) of a model with the NullTokenizer
// of `vocab` tokens padded with `divisor`.
inline void save_training_checkpoint(const std::filesystem::path& dir, const testing::Weights& w, const testing::Config& c,
                              int64_t vocab, int64_t divisor) {
  training::TrainingArgs a;
  a.model = c;  // the architecture too (Llama-style: RMSNorm, SwiGLU, rotary, GQA, untied)
  a.model.seq_length = int(c.max_position_embeddings);
  a.make_vocab_size_divisible_by = divisor;
  a.tokenizer.type = "NullTokenizer";
  a.tokenizer.vocab_size = vocab;
  training::CheckpointState st;
  st.iteration = 7;
  st.args = training::training_args_to_json(a);
  std::vector<model::Parameter> params(w.size());
  model::ParameterList list;
  const auto specs = training::config_weight_specs(a.model);
  size_t i = 0;
  for (const auto& [name, t] : w) {
    static_cast<model::WeightSpec&>(params[i]) = specs.at(name);
    params[i].value = t;
    list.push_back(&params[i++]);
  }
  training::save_checkpoint(dir, st, list, nullptr);
}

inline void convert(const std::filesystem::path& from, const std::filesystem::path& to, int tp, int pp) {
  training::ConvertOptions o;
  o.load = from;
  o.save = to;
  o.target_tp = tp;
  o.target_pp = pp;
  training::convert_checkpoint(o);
}

}  // namespace megatron::inference
