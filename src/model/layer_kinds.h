// The norm and activation kinds a layer spec can choose (layer_spec.h), one table row each, as
// ggml's unary-op enum and its name table. A kind's id is what the ops take (ops::norm_fwd,
// ops::activation_fwd pick their kernel by it); its row is everything the rest of the program
// knows about it: its name in configurations and checkpoints, the Megatron flag that selects it,
// its help text and name in messages, its shape (bias, saved statistics, gated). The CLI, the
// recorded-settings checks, the modules (model/norm.cpp, model/mlp.cpp) and the kernels' checks
// read these rows; nothing else lists the kinds.
//
// Adding a kind (three files):
//   1. here: its id at the end of the enum and its row at the end of the table;
//   2. its CPU kernel: a specialisation of Activation<id> in src/kernels/cpu/cpu_activation.cpp
//      (per-element functions; gated ones take (gate, up)), or of NormKernel<id> in
//      src/kernels/cpu/cpu_norm.cpp (forward and backward over rows);
//   3. its cases in tests/kernels/backend_op_cases.cpp (a test fails while a kind has none);
// and, for the CUDA build, its CUDA kernel (NormKernel<id> in src/kernels/cuda/norm.cu or
// Activation<id> in src/kernels/cuda/activation.cu): that build does not compile without it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <iterator>

namespace megatron::model {

// ---- norms over the last dimension -------------------------------------------------------------
enum class NormId : uint8_t { layernorm, rmsnorm };

struct NormKind {
  NormId id;
  const char* name;  // the --normalization value
  bool has_bias;     // a bias (beta) beside the weight (gamma)
  bool saves_mean;   // forward saves the row means for backward (rstd is always saved)
};

inline constexpr NormKind kNormKinds[] = {
    // LayerNorm: (x - mean) * rstd * weight + bias, rstd = 1 / sqrt(var + eps)
    {NormId::layernorm, "LayerNorm", true, true},
    // RMSNorm (Megatron-Core's): x * rstd * weight, rstd = 1 / sqrt(mean(x^2) + eps)
    {NormId::rmsnorm, "RMSNorm", false, false},
};

// ---- the MLP's activation between linear_fc1 and linear_fc2 ------------------------------------
// A gated one (GLU) takes fc1's output of 2F columns per tensor-parallel rank, [gate | up], and
// gives F.
enum class ActivationId : uint8_t { gelu_tanh, gelu, swiglu, squared_relu };

struct ActivationKind {
  ActivationId id;
  const char* name;      // TransformerConfig::activation
  const char* flag;      // a Megatron flag of its own that selects it ("" for the GeLU forms)
  const char* help;
  const char* display;   // in messages: "SwiGLU"
  const char* asked_by;  // the flag that asks for it, for messages ("--openai-gelu" for tanh GeLU)
  bool gated;
};

inline constexpr ActivationKind kActivationKinds[] = {
    // 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
    {ActivationId::gelu_tanh, "gelu_tanh", "",
     "GeLU, tanh form (Megatron's default fused bias-GeLU; --openai-gelu)", "GeLU (tanh form)",
     "--openai-gelu", false},
    // 0.5 x (1 + erf(x / sqrt(2)))
    {ActivationId::gelu, "gelu", "",
     "GeLU, exact erf form (--no-bias-gelu-fusion, or --disable-bias-linear)",
     "GeLU (exact erf form)", "--no-bias-gelu-fusion", false},
    // gated: silu(gate) * up, silu(a) = a / (1 + e^-a)
    {ActivationId::swiglu, "swiglu", "--swiglu",
     "SwiGLU MLP: silu(gate) * up, fc1 gives [gate | up]", "SwiGLU", "--swiglu", true},
    // max(x, 0)^2
    {ActivationId::squared_relu, "squared_relu", "--squared-relu", "Squared ReLU activation",
     "squared ReLU", "--squared-relu", false},
};

// ---- lookups by id -----------------------------------------------------------------------------
inline constexpr size_t kNormKindCount = std::size(kNormKinds);
inline constexpr size_t kActivationKindCount = std::size(kActivationKinds);

// Row i of a table is the kind with id i (so a lookup by id is an index).
template <class Row, size_t N>
constexpr bool rows_in_id_order(const Row (&rows)[N]) {
  for (size_t i = 0; i < N; ++i)
    if (size_t(rows[i].id) != i) return false;
  return true;
}
static_assert(rows_in_id_order(kNormKinds), "kNormKinds: row i must be the kind with id i");
static_assert(rows_in_id_order(kActivationKinds),
              "kActivationKinds: row i must be the kind with id i");

// The row of an id; nullptr for a value outside the enum (a corrupt or uninitialised id).
constexpr const NormKind* find_norm_kind(NormId id) {
  return size_t(id) < kNormKindCount ? &kNormKinds[size_t(id)] : nullptr;
}
constexpr const ActivationKind* find_activation_kind(ActivationId id) {
  return size_t(id) < kActivationKindCount ? &kActivationKinds[size_t(id)] : nullptr;
}

}  // namespace megatron::model
