// Helpers of the op-case table (backend_ops.h): inputs made on the host from fixed seeds and moved
// to the device under test, and the table the case files add to.
#pragma once

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "backend_ops.h"
#include "core/rng.h"
#include "kernels/ops.h"

namespace megatron::ops::testing {

using Outs = std::vector<Tensor>;

inline Tensor on(Device d, const Tensor& host) { return d.is_cpu() ? host : host.to(d); }

inline Tensor rnd(Device d, const Shape& s, uint64_t stream, float stddev = 1.0f,
                  DType dtype = DType::F32) {
  Tensor t = Tensor::empty(s, DType::F32);
  Philox(4242, stream).fill_normal(t.data<float>(), t.numel(), 0.0f, stddev);
  return on(d, dtype == DType::F32 ? t : t.to(dtype));
}

inline Tensor fill(Device d, const Shape& s, double value, DType dtype = DType::F32) {
  return Tensor::full(s, value, dtype, d);
}

inline Tensor ints(Device d, const std::vector<int32_t>& v, const Shape& s) {
  return Tensor::from_vector(v, s, d);
}

inline int64_t qkv_width(int n, int g, int d) { return int64_t(g) * (n / g + 2) * d; }

inline AttentionShape attention_shape(int64_t b, int64_t s, int n, int g, int d) {
  return AttentionShape{b, s, n, g, d, 1.0f / std::sqrt(float(d))};
}

class Table {
 public:
  void add(std::string op, std::string what, std::function<Outs(Device)> run,
           std::vector<Tolerance> cuda = {Tolerance{}}) {
    cases_.push_back({std::move(op), std::move(what), std::move(run), std::move(cuda), {}});
  }
  // A case of a kind-taking op (norm_*, activation_*) for the kind named `kind`.
  void add_kind(std::string op, std::string kind, std::string what,
                std::function<Outs(Device)> run, std::vector<Tolerance> cuda = {Tolerance{}}) {
    add(std::move(op), kind + ": " + std::move(what), std::move(run), std::move(cuda));
    cases_.back().kind = std::move(kind);
  }
  std::vector<OpCase> take() { return std::move(cases_); }

 private:
  std::vector<OpCase> cases_;
};

// The attention and KV-cache cases (backend_op_cases_attention.cpp).
void attention_cases(Table& t);

}  // namespace megatron::ops::testing
