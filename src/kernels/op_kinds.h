// The norm and activation kinds the kernels implement, one row each (as ggml's unary-op enum and
// its name table): the id the ops take (ops::norm_fwd, ops::activation_fwd pick their kernel by
// it), the kind's name for messages, and the properties a kernel or its caller needs (bias, saved
// statistics, gated). Flag names, help text and the other words the model and the CLI use for a
// kind live in the model layer (model/layer_kinds.h), which extends these rows; nothing in
// src/kernels depends on the model.
//
// Adding a kind:
//   1. here: its id at the end of the enum and its row at the end of the table;
//   2. its row in model/layer_kinds.h (flag, help, name in messages);
//   3. its CPU kernel: a specialisation of Activation<id> in src/kernels/cpu/cpu_activation.cpp
//      (per-element functions; gated ones take (gate, up)), or of NormKernel<id> in
//      src/kernels/cpu/cpu_norm.cpp (forward and backward over rows);
//   4. its cases in tests/kernels/backend_op_cases.cpp (a test fails while a kind has none);
// and, for the CUDA build, its CUDA kernel (NormKernel<id> in src/kernels/cuda/norm.cu or
// Activation<id> in src/kernels/cuda/activation.cu): that build does not compile without it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <iterator>

namespace megatron::ops {

// ---- norms over the last dimension -------------------------------------------------------------
enum class NormId : uint8_t { layernorm, rmsnorm };

struct NormOp {
  NormId id;
  const char* name;  // the --normalization value (also the kind's name in messages)
  bool has_bias;     // a bias (beta) beside the weight (gamma)
  bool saves_mean;   // forward saves the row means for backward (rstd is always saved)
};

inline constexpr NormOp kNormOps[] = {
    // LayerNorm: (x - mean) * rstd * weight + bias, rstd = 1 / sqrt(var + eps)
    {NormId::layernorm, "LayerNorm", true, true},
    // RMSNorm (Megatron-Core's): x * rstd * weight, rstd = 1 / sqrt(mean(x^2) + eps)
    {NormId::rmsnorm, "RMSNorm", false, false},
};

// ---- the MLP's activation between linear_fc1 and linear_fc2 ------------------------------------
// A gated one (GLU) takes fc1's output of 2F columns per tensor-parallel rank, [gate | up], and
// gives F.
enum class ActivationId : uint8_t { gelu_tanh, gelu, swiglu, squared_relu };

struct ActivationOp {
  ActivationId id;
  const char* name;  // TransformerConfig::activation (also the kind's name in messages)
  bool gated;
};

inline constexpr ActivationOp kActivationOps[] = {
    // 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
    {ActivationId::gelu_tanh, "gelu_tanh", false},
    // 0.5 x (1 + erf(x / sqrt(2)))
    {ActivationId::gelu, "gelu", false},
    // gated: silu(gate) * up, silu(a) = a / (1 + e^-a)
    {ActivationId::swiglu, "swiglu", true},
    // max(x, 0)^2
    {ActivationId::squared_relu, "squared_relu", false},
};

// ---- lookups by id -----------------------------------------------------------------------------
inline constexpr size_t kNormOpCount = std::size(kNormOps);
inline constexpr size_t kActivationOpCount = std::size(kActivationOps);

// Row i of a table is the kind with id i (so a lookup by id is an index).
template <class Row, size_t N>
constexpr bool rows_in_id_order(const Row (&rows)[N]) {
  for (size_t i = 0; i < N; ++i)
    if (size_t(rows[i].id) != i) return false;
  return true;
}
static_assert(rows_in_id_order(kNormOps), "kNormOps: row i must be the kind with id i");
static_assert(rows_in_id_order(kActivationOps), "kActivationOps: row i must be the kind with id i");

// The row of an id; nullptr for a value outside the enum (a corrupt or uninitialised id).
constexpr const NormOp* find_norm_op(NormId id) {
  return size_t(id) < kNormOpCount ? &kNormOps[size_t(id)] : nullptr;
}
constexpr const ActivationOp* find_activation_op(ActivationId id) {
  return size_t(id) < kActivationOpCount ? &kActivationOps[size_t(id)] : nullptr;
}

}  // namespace megatron::ops
