// The MLP activations on the GPU (ops::activation_fwd / activation_bwd): one Activation<id> per
// kind of kernels/op_kinds.h with its per-element functions (a kind without one does not
// compile: detail::with_kind), run by one element-wise kernel for plain kinds and one over
// [gate | up] rows for gated ones. Exact libm forms (tanhf, erff, expf) where the CPU uses its
// vectorised approximations; both agree within fp32 rounding.
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_common.cuh"

namespace megatron::cuda {

using detail::stream;
using ops::ActivationId;

namespace {

constexpr int kThreads = 256;
constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kInvSqrt2 = 0.7071067811865476f;

template <ActivationId K>
struct Activation;

template <>
struct Activation<ActivationId::gelu_tanh> {
  static __device__ float fwd(float v) {
    return 0.5f * v * (1.0f + tanhf(kSqrt2OverPi * (v + 0.044715f * v * v * v)));
  }
  static __device__ float bwd(float v, float g) {
    const float t = tanhf(kSqrt2OverPi * (v + 0.044715f * v * v * v));
    const float dt = (1.0f - t * t) * kSqrt2OverPi * (1.0f + 3.0f * 0.044715f * v * v);
    return g * (0.5f * (1.0f + t) + 0.5f * v * dt);
  }
};

template <>
struct Activation<ActivationId::gelu> {
  static __device__ float fwd(float v) { return 0.5f * v * (1.0f + erff(v * kInvSqrt2)); }
  static __device__ float bwd(float v, float g) {
    const float cdf = 0.5f * (1.0f + erff(v * kInvSqrt2));
    const float pdf = 0.3989422804014327f * expf(-0.5f * v * v);
    return g * (cdf + v * pdf);
  }
};

template <>
struct Activation<ActivationId::swiglu> {
  static __device__ float sigmoid(float a) { return 1.0f / (1.0f + expf(-a)); }
  static __device__ float fwd(float gate, float up) { return gate * sigmoid(gate) * up; }
  static __device__ void bwd(float a, float up, float g, float& dgate, float& dup) {
    const float s = sigmoid(a);
    dgate = g * up * s * (1.0f + a * (1.0f - s));  // silu'(a) = s (1 + a (1 - s))
    dup = g * a * s;
  }
};

template <>
struct Activation<ActivationId::squared_relu> {
  static __device__ float fwd(float v) {
    const float r = v > 0.0f ? v : 0.0f;
    return r * r;
  }
  static __device__ float bwd(float v, float g) { return v > 0.0f ? 2.0f * v * g : 0.0f; }
};

template <ActivationId K>
constexpr bool kGated = ops::kActivationOps[size_t(K)].gated;

// Plain: out[i] = act(x[i]) over numel. Gated: out [n, f] from x rows [gate | up] of 2f. O: fp32,
// or bf16 rounded as ops::cast rounds.
template <ActivationId K, class O>
__global__ void activation_fwd_kernel(O* out, const float* x, int64_t count, int64_t f) {
  MG_GRID_STRIDE(i, count) {
    if constexpr (kGated<K>) {
      const int64_t row = i / f, j = i - row * f;
      detail::store_f(out, i, Activation<K>::fwd(x[row * 2 * f + j], x[row * 2 * f + f + j]));
    } else {
      detail::store_f(out, i, Activation<K>::fwd(x[i]));
    }
  }
}

// Four values to out[4i, 4i + 4): one 16-byte store (fp32) or one 8-byte store (bf16).
__device__ inline void store4(float* out, int64_t i, float a, float b, float c, float d) {
  reinterpret_cast<float4*>(out)[i] = make_float4(a, b, c, d);
}
__device__ inline void store4(__nv_bfloat16* out, int64_t i, float a, float b, float c, float d) {
  __nv_bfloat162* p = reinterpret_cast<__nv_bfloat162*>(out) + 2 * i;
  p[0] = __floats2bfloat162_rn(a, b);
  p[1] = __floats2bfloat162_rn(c, d);
}

// A plain kind four elements a thread (x and out aligned for the wide loads and stores).
template <ActivationId K, class O>
__global__ void activation_fwd4_kernel(O* out, const float4* x, int64_t count4) {
  using A = Activation<K>;
  MG_GRID_STRIDE(i, count4) {
    const float4 v = x[i];
    store4(out, i, A::fwd(v.x), A::fwd(v.y), A::fwd(v.z), A::fwd(v.w));
  }
}

template <ActivationId K, class O>
void launch_fwd(O* out, const float* x, int64_t count, int64_t f) {
  if constexpr (!kGated<K>) {
    if (count % 4 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
        reinterpret_cast<uintptr_t>(out) % (4 * sizeof(O)) == 0) {
      activation_fwd4_kernel<K><<<detail::grid_for(count / 4, kThreads), kThreads, 0, stream()>>>(
          out, reinterpret_cast<const float4*>(x), count / 4);
      return;
    }
  }
  activation_fwd_kernel<K><<<detail::grid_for(count, kThreads), kThreads, 0, stream()>>>(
      out, x, count, f);
}

template <ActivationId K>
__global__ void activation_bwd_kernel(float* dx, const float* dout, const float* x, int64_t count,
                                      int64_t f) {
  MG_GRID_STRIDE(i, count) {
    if constexpr (kGated<K>) {
      const int64_t row = i / f, j = i - row * f;
      const int64_t at = row * 2 * f + j;
      float dgate = 0.0f, dup = 0.0f;
      Activation<K>::bwd(x[at], x[at + f], dout[i], dgate, dup);
      dx[at] = dgate;
      dx[at + f] = dup;
    } else {
      dx[i] = Activation<K>::bwd(x[i], dout[i]);
    }
  }
}

// Checks x against `half` (out or dout: x's shape, or half of it for a gated kind; fp32, or bf16
// where bf16_ok: the forward's out); returns the gated kind's half width f (0 for a plain one).
int64_t check_activation(const char* op, ActivationId kind, const Tensor& x, const Tensor& half,
                         const char* half_name, bool bf16_ok = false) {
  const ops::ActivationOp* k = ops::find_activation_op(kind);
  if (k == nullptr) ops::detail::throw_no_kind_kernel(op, kind, x.device());
  detail::require_f32(op, "x", x);
  if (bf16_ok && half.defined() && half.dtype() == DType::BF16)
    detail::require_bf16_output(op, half, x, k->gated ? x.numel() / 2 : x.numel());
  else
    detail::require_f32(op, half_name, half);
  if (!k->gated) {
    detail::require_same_numel(op, half, x);
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
  const int64_t count = out.numel();
  if (count == 0) return;
  detail::with_kind<ops::kActivationOpCount>(op, kind, x.device(), [&]<ActivationId K>() {
    if (out.dtype() == DType::BF16)
      launch_fwd<K>(static_cast<__nv_bfloat16*>(out.raw_data()), x.data<float>(), count, f);
    else
      launch_fwd<K>(out.data<float>(), x.data<float>(), count, f);
  });
  MG_CUDA_LAUNCH_CHECK();
}

void activation_bwd(ActivationId kind, const Tensor& dx, const Tensor& dout, const Tensor& x) {
  const char* op = "activation_bwd";
  const int64_t f = check_activation(op, kind, x, dout, "dout");
  detail::require_f32(op, "dx", dx);
  detail::require_same_numel(op, dx, x);
  const int64_t count = dout.numel();
  if (count == 0) return;
  detail::with_kind<ops::kActivationOpCount>(op, kind, x.device(), [&]<ActivationId K>() {
    activation_bwd_kernel<K><<<detail::grid_for(count, kThreads), kThreads, 0, stream()>>>(
        dx.data<float>(), dout.data<float>(), x.data<float>(), count, f);
  });
  MG_CUDA_LAUNCH_CHECK();
}

}  // namespace megatron::cuda
