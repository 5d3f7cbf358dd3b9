// Helpers for the pipeline tests: copying a single-rank model's weights into pipeline chunks by
// name (this rank's TP slice; the last stage's tied copy gets the word table), finding the
// single-rank parameter a chunk parameter corresponds to, and the relative difference used for
// parity (largest |a - b| over the largest |ref|).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "comm/parallel_state.h"
#include "model/gpt_model.h"
#include "model/stage_model.h"
#include "model/model_test_util.h"
#include "model/tensor_parallel.h"

namespace megatron::model::testing {

// The single-rank name of a chunk parameter (the tied copy is the word embedding).
inline std::string reference_name(const Parameter& p) {
  return p.shared ? "embedding.word_embeddings.weight" : p.name;
}

inline Parameter* find_param(GPTModel& m, const std::string& name) {
  for (Parameter* p : m.parameters())
    if (p->name == name) return p;
  ADD_FAILURE() << "no parameter " << name << " in the single-rank model";
  return nullptr;
}

inline void load_from(const ParameterList& params, GPTModel& ref, int tp_rank, int tp_size) {
  for (Parameter* p : params) {
    Parameter* r = find_param(ref, reference_name(*p));
    ASSERT_NE(r, nullptr);
    p->value.copy_(shard_along(r->value, p->partition_dim, tp_rank, tp_size));
  }
}

inline double rel_diff(const Tensor& got, const Tensor& ref) {
  EXPECT_EQ(got.shape(), ref.shape());
  if (got.shape() != ref.shape()) return 1e30;
  const std::vector<float> a = got.to_float_vector(), b = ref.to_float_vector();
  double scale = 1e-30, worst = 0;
  for (float v : b) scale = std::max(scale, double(std::abs(v)));
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(double(a[i]) - b[i]));
  return worst / scale;
}

inline void zero_grads(const ParameterList& ps) {
  for (Parameter* p : ps) p->grad.zero_();
}

// M micro-batches of b x s tokens (document resets, random loss mask), distinct per index.
inline std::vector<Batch> microbatches(int M, const TransformerConfig& cfg, uint64_t seed,
                                           int64_t b = 2) {
  std::vector<Batch> out;
  for (int m = 0; m < M; ++m)
    out.push_back(random_inputs(b, cfg.seq_length, cfg.padded_vocab_size, seed + uint64_t(m) * 7,
                                true));
  return out;
}

inline double total_tokens(const std::vector<Batch>& mbs) {
  double t = 0;
  for (const Batch& in : mbs)
    for (float v : in.loss_mask.to_float_vector()) t += v;
  return t;
}

// The single-rank model's loop over the micro-batches (the trainer's, before pipelining).
struct Reference {
  double loss_sum = 0, tokens = 0;
  std::map<std::string, Tensor> grads;
};

// Micro-batch m uses dropout offset offset + m * stride.
inline Reference reference_step(GPTModel& ref, const std::vector<Batch>& mbs, float scale,
                                uint64_t offset, uint64_t stride = 1) {
  zero_grads(ref.parameters());
  Reference r;
  for (size_t m = 0; m < mbs.size(); ++m) {
    LossResult l = ref.forward_backward(mbs[m], scale, offset + m * stride);
    r.loss_sum += l.loss_sum;
    r.tokens += l.num_tokens;
  }
  for (Parameter* p : ref.parameters()) r.grads[p->name] = p->grad.clone();
  return r;
}

// The groups of TP x PP x CP ranks over `world` (its size a multiple of the product).
inline ParallelState parallel_state(std::shared_ptr<Communicator> world, int tp, int pp, int cp) {
  ParallelConfig pc;
  pc.tensor_model_parallel_size = tp;
  pc.pipeline_model_parallel_size = pp;
  pc.context_parallel_size = cp;
  return ParallelState::create(std::move(world), pc);
}

}  // namespace megatron::model::testing
