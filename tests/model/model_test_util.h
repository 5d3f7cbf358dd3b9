// Helpers for the model tests: tiny configurations, random batches (with document resets for
// attention_start) and randomised weights, so biases and norm parameters are not trivial.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/rng.h"
#include "kernels/ops.h"
#include "model/gpt_model.h"
#include "test_util.h"

namespace megatron::model::testing {

// Appends n values to a reference script's binary input file.
template <typename T>
void append(std::ofstream& f, const T* p, int64_t n) {
  f.write(reinterpret_cast<const char*>(p), std::streamsize(n * int64_t(sizeof(T))));
}

// Runs tests/reference/<script> on `dir` (its inputs written there) and returns the doubles it
// writes to dir/out.bin; a failing script is a test failure with its output.
inline std::vector<double> run_reference_script(const std::string& script,
                                                const std::filesystem::path& dir) {
  const auto r = megatron::testing::run_command(
      "/usr/bin/python3 " + (megatron::testing::source_dir() / "tests/reference" / script).string() +
      " " + dir.string() + " 2>&1");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  const std::string raw = megatron::testing::read_file(dir / "out.bin");
  std::vector<double> out(raw.size() / sizeof(double));
  std::copy_n(raw.data(), out.size() * sizeof(double), reinterpret_cast<char*>(out.data()));
  return out;
}

inline TransformerConfig tiny_config() {
  TransformerConfig c;
  c.num_layers = 2;
  c.hidden_size = 32;
  c.num_attention_heads = 4;
  c.seq_length = 16;
  c.max_position_embeddings = 20;
  c.padded_vocab_size = 96;
  c.hidden_dropout = 0.0f;
  c.attention_dropout = 0.0f;
  return c;
}

// The Llama-shaped test model on top of `c`'s sizes: 4 layers, RMSNorm, SwiGLU (ffn 48), rotary,
// 2 query groups, no biases, an untied output layer.
inline void make_llama_style(TransformerConfig& c) {
  c.num_layers = 4;
  c.normalization = "RMSNorm";
  c.activation = "swiglu";
  c.position_embedding_type = "rope";
  c.num_query_groups = 2;
  c.ffn_hidden_size = 48;
  c.add_bias_linear = false;
  c.untie_embeddings_and_output_weights = true;
}

// tokens/labels uniform in [0, vocab); every third sequence gets a document boundary so
// attention_start and position_ids reset there (Megatron's --reset-* flags).
inline Batch random_inputs(int64_t b, int64_t s, int64_t vocab, uint64_t seed,
                               bool with_resets) {
  Philox rng(seed, 7);
  std::vector<int32_t> tok(size_t(b * s)), lab(size_t(b * s)), pos(size_t(b * s)),
      start(size_t(b * s));
  std::vector<float> mask(size_t(b * s));
  uint64_t k = 0;
  for (int64_t bi = 0; bi < b; ++bi) {
    const int64_t boundary = with_resets ? 1 + int64_t(rng.u32(k++) % uint32_t(s - 1)) : s;
    for (int64_t i = 0; i < s; ++i) {
      const size_t at = size_t(bi * s + i);
      tok[at] = int32_t(rng.u32(k++) % uint32_t(vocab));
      lab[at] = int32_t(rng.u32(k++) % uint32_t(vocab));
      const int64_t doc_start = i >= boundary ? boundary : 0;
      start[at] = int32_t(doc_start);
      pos[at] = int32_t(with_resets ? i - doc_start : i);
      mask[at] = rng.uniform(k++) < 0.8f ? 1.0f : 0.0f;
    }
  }
  Batch in;
  in.tokens = Tensor::from_vector(tok, {b, s});
  in.labels = Tensor::from_vector(lab, {b, s});
  in.position_ids = Tensor::from_vector(pos, {b, s});
  if (with_resets) in.attention_start = Tensor::from_vector(start, {b, s});
  in.loss_mask = Tensor::from_vector(mask, {b, s});
  return in;
}

// Replaces every parameter by N(0, 0.1) (weights initialised to ones, the norms', 1 + N(0, 0.1)).
inline void randomise(LanguageModule& m, uint64_t seed) {
  ParameterList ps = m.parameters();
  for (size_t i = 0; i < ps.size(); ++i) {
    Tensor v = Tensor::empty(ps[i]->value.shape(), DType::F32);
    Philox(seed, 100 + i).fill_normal(v.data<float>(), v.numel(), 0.0f, 0.1f);
    if (ps[i]->init == InitMethod::ones) {
      float* p = v.data<float>();
      for (int64_t j = 0; j < v.numel(); ++j) p[j] += 1.0f;
    }
    ops::cast(ps[i]->value, v);
  }
}

inline void zero_grads(LanguageModule& m) {
  for (Parameter* p : m.parameters()) p->grad.zero_();
}

// Every element within |got - ref| <= atol + rtol * |ref|, atol = rtol * the tensor's scale
// (its largest |ref|); the count of elements off and the worst ratio otherwise.
inline void expect_close_to_reference(const std::string& what, const float* got, const double* ref,
                                      int64_t n, double rtol) {
  double scale = 0;
  for (int64_t i = 0; i < n; ++i) scale = std::max(scale, std::abs(ref[i]));
  const double atol = rtol * scale + 1e-12;
  int64_t bad = 0;
  double worst = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double err = std::abs(double(got[i]) - ref[i]);
    worst = std::max(worst, err / (atol + rtol * std::abs(ref[i])));
    if (err > atol + rtol * std::abs(ref[i])) ++bad;
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << n << " elements off; worst err/tol "
                    << worst << " (scale " << scale << ")";
}

// A reference script's parameters: their names and shapes into j["params"], their values (as
// float32, in parameters() order) into dir/weights.bin.
template <class Json>
void write_parameters(LanguageModule& m, const std::filesystem::path& dir, Json& j) {
  std::ofstream wf(dir / "weights.bin", std::ios::binary);
  for (Parameter* p : m.parameters()) {
    j["params"].push_back({{"name", p->name}, {"shape", p->value.shape()}});
    Tensor v = p->value.to(DType::F32);
    append(wf, v.data<float>(), v.numel());
  }
}

// Every parameter's gradient against the reference's values ref[off..] (parameters() order);
// the reference must end with the last gradient.
inline void expect_grads_close_to_reference(LanguageModule& m, const std::vector<double>& ref,
                                            int64_t off, double rtol) {
  for (Parameter* p : m.parameters()) {
    ASSERT_LE(off + p->grad.numel(), int64_t(ref.size()));
    expect_close_to_reference(p->name + " grad", p->grad.data<float>(), ref.data() + off,
                              p->grad.numel(), rtol);
    off += p->grad.numel();
  }
  EXPECT_EQ(off, int64_t(ref.size()));
}

}  // namespace megatron::model::testing
