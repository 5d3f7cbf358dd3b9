// The MLP activations on the CPU (ops::activation_fwd / activation_bwd): one Activation<id> per
// kind of kernels/op_kinds.h with its per-element functions, and the loops that run them: one
// elementwise loop for plain activations, one row loop over [gate | up] for gated ones. The kind
// is resolved once per call (cpu::with_kind), so every kind gets its own vectorised loop.
#include <cmath>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/cpu_common.h"

namespace megatron::ops::cpu {

namespace {


constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kInvSqrt2 = 0.7071067811865476f;
// tanh(u) = 1 - 2 / (exp(2u) + 1), vectorisable through fast_exp.
inline float fast_tanh(float u) { return 1.0f - 2.0f / (cpu::fast_exp(2.0f * u) + 1.0f); }
// 1 / (1 + e^-a), vectorisable; fast_exp's clamp keeps it finite for any a.
inline float sigmoid(float a) { return 1.0f / (1.0f + cpu::fast_exp(-a)); }

// The kernel of activation kind K, inlined into the loops below (keep it free of calls that do
// not vectorise). A plain kind: fwd(x) and bwd(x, dout) = dout * act'(x). A gated kind (its row
// says gated): fwd(gate, up) and bwd(gate, up, dout, dgate, dup).
template <ActivationId K>
struct Activation;

template <>
struct Activation<ActivationId::gelu_tanh> {
  static float fwd(float v) {
    return 0.5f * v * (1.0f + fast_tanh(kSqrt2OverPi * (v + 0.044715f * v * v * v)));
  }
  static float bwd(float v, float g) {
    const float t = fast_tanh(kSqrt2OverPi * (v + 0.044715f * v * v * v));
    const float dt = (1.0f - t * t) * kSqrt2OverPi * (1.0f + 3.0f * 0.044715f * v * v);
    return g * (0.5f * (1.0f + t) + 0.5f * v * dt);
  }
};

template <>
struct Activation<ActivationId::gelu> {
  static float fwd(float v) { return 0.5f * v * (1.0f + std::erf(v * kInvSqrt2)); }
  static float bwd(float v, float g) {
    const float cdf = 0.5f * (1.0f + std::erf(v * kInvSqrt2));
    const float pdf = 0.3989422804014327f * std::exp(-0.5f * v * v);
    return g * (cdf + v * pdf);
  }
};

template <>
struct Activation<ActivationId::swiglu> {
  static float fwd(float gate, float up) { return gate * sigmoid(gate) * up; }
  static void bwd(float a, float up, float g, float& dgate, float& dup) {
    const float s = sigmoid(a), silu = a * s;
    // silu'(a) = s (1 + a (1 - s))
    dgate = g * up * s * (1.0f + a * (1.0f - s));
    dup = g * silu;
  }
};

template <>
struct Activation<ActivationId::squared_relu> {
  static float fwd(float v) {
    const float r = v > 0.0f ? v : 0.0f;
    return r * r;
  }
  static float bwd(float v, float g) { return v > 0.0f ? 2.0f * v * g : 0.0f; }
};

// ---- the loops ---------------------------------------------------------------------------------
template <ActivationId K>
constexpr bool kGated = kActivationOps[size_t(K)].gated;

// out [numel] = act(x); or, gated, out [n, f] = act(gate, up) over rows [gate | up] of x [n, 2f].
// O: fp32 or bf16.
template <ActivationId K, class O>
void run_fwd(O* o, const float* xp, int64_t numel, int64_t f) {
  using A = Activation<K>;
  if constexpr (kGated<K>) {
    const int64_t n = f > 0 ? numel / (2 * f) : 0;
    cpu::parallel_for(n, n * f, [&](int64_t i) {
      const float *gate = xp + i * 2 * f, *up = gate + f;
      O* oi = o + i * f;
#pragma omp simd
      for (int64_t j = 0; j < f; ++j) cpu::put(oi + j, A::fwd(gate[j], up[j]));
    });
  } else {
    cpu::parallel_for_simd(numel, [&](int64_t i) { cpu::put(o + i, A::fwd(xp[i])); });
  }
}

// dx = dout * act'(x); gated: dx rows [dgate | dup] from dout [n, f].
template <ActivationId K>
void run_bwd(float* d, const float* g, const float* xp, int64_t numel, int64_t f) {
  using A = Activation<K>;
  if constexpr (kGated<K>) {
    const int64_t n = f > 0 ? numel / (2 * f) : 0;
    cpu::parallel_for(n, n * f, [&](int64_t i) {
      const float *gate = xp + i * 2 * f, *up = gate + f, *gi = g + i * f;
      float *dgate = d + i * 2 * f, *dup = dgate + f;
#pragma omp simd
      for (int64_t j = 0; j < f; ++j) A::bwd(gate[j], up[j], gi[j], dgate[j], dup[j]);
    });
  } else {
    cpu::parallel_for_simd(numel, [&](int64_t i) { d[i] = A::bwd(xp[i], g[i]); });
  }
}

// Checks x against `half` (out or dout: x's shape, or half of it for a gated kind; fp32, or bf16
// where bf16_ok: the forward's out); returns the gated kind's half width f (0 for a plain one).
int64_t check_activation(const char* op, ActivationId kind, const Tensor& x, const Tensor& half,
                         const char* half_name, bool bf16_ok = false) {
  const ActivationOp* k = find_activation_op(kind);
  if (k == nullptr) detail::throw_no_kind_kernel(op, kind, x.device());
  require_f32(op, "x", x);
  if (bf16_ok && half.defined() && half.dtype() == DType::BF16)
    require_bf16_output(op, half, x, k->gated ? x.numel() / 2 : x.numel());
  else
    require_f32(op, half_name, half);
  if (!k->gated) {
    cpu::require_numel(op, half, x);
    return 0;
  }
  MG_CHECK(x.dim() >= 1 && x.size(-1) % 2 == 0, op, ": x ", shape_str(x.shape()),
           " must have an even last dim ([gate | up] of ", k->name, ")");
  MG_CHECK(half.numel() * 2 == x.numel(), op, ": ", half_name, " ", shape_str(half.shape()),
           " must have half the elements of x ", shape_str(x.shape()), " (", k->name,
           " is gated)");
  return x.size(-1) / 2;
}

}  // namespace

void activation_fwd(ActivationId kind, const Tensor& out, const Tensor& x) {
  const char* op = "activation_fwd";
  const int64_t f = check_activation(op, kind, x, out, "out", true);
  const float* xp = x.data<float>();
  auto run = [&](auto* o) {
    cpu::with_kind<kActivationOpCount>(
        op, kind, [&]<ActivationId K>() { run_fwd<K>(o, xp, x.numel(), f); });
  };
  if (out.dtype() == DType::BF16)
    run(out.data<bf16>());
  else
    run(out.data<float>());
}

void activation_bwd(ActivationId kind, const Tensor& dx, const Tensor& dout, const Tensor& x) {
  const char* op = "activation_bwd";
  const int64_t f = check_activation(op, kind, x, dout, "dout");
  require_f32(op, "dx", dx);
  cpu::require_numel(op, dx, x);
  float* d = dx.data<float>();
  const float *g = dout.data<float>(), *xp = x.data<float>();
  cpu::with_kind<kActivationOpCount>(
      op, kind, [&]<ActivationId K>() { run_bwd<K>(d, g, xp, x.numel(), f); });
}

}  // namespace megatron::ops::cpu
