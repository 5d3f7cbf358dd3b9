// Rotary position embedding on the fused QKV activation, in place, on the GPU (ops::rope_fwd /
// rope_bwd; the CPU kernel's formula and pair layouts). Inverse frequencies and angles are
// computed in double, as the CPU does, and rounded once (nothing is copied to the device). One
// thread per (row, rotated head, frequency). Positions are not range-checked here (the CPU checks
// them; they come from the model, not from user data), so no copy back is needed.
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_common.cuh"

namespace megatron::cuda {

using detail::stream;

namespace {

constexpr int kThreads = 256;

struct RopeArgs {
  float* x;
  const int32_t* pos;
  double base;
  int rotary_dim;
  int64_t n, width, half;
  int rotated_per_group, hpg, d;  // rotated heads per group: hpg queries + 1 key
  int64_t rotated;                // rotated heads per row: groups * rotated_per_group
  float sign;                     // +1 forward, -1 backward (the transposed rotation)
  bool interleaved;
};

__global__ void rope_kernel(RopeArgs a) {
  MG_GRID_STRIDE(e, a.n * a.rotated * a.half) {
    const int64_t i = e % a.half;
    const int64_t rh = (e / a.half) % a.rotated;
    const int64_t r = e / (a.half * a.rotated);
    const int64_t g = rh / a.rotated_per_group, h = rh - g * a.rotated_per_group;
    float* head = a.x + r * a.width + (g * (a.hpg + 2) + h) * a.d;
    const double inv_freq = pow(a.base, -double(2 * i) / double(a.rotary_dim));
    const double angle = double(a.pos[r]) * inv_freq;
    const float cs = float(cos(angle)), sn = a.sign * float(sin(angle));
    float* pa = a.interleaved ? head + 2 * i : head + i;
    float* pb = a.interleaved ? head + 2 * i + 1 : head + i + a.half;
    const float va = *pa, vb = *pb;
    *pa = va * cs - vb * sn;
    *pb = vb * cs + va * sn;
  }
}

void rope_apply(const char* op, const Tensor& qkv, const Tensor& positions,
                const ops::AttentionShape& sh, const ops::RotaryConfig& rope, bool transpose) {
  detail::require_f32(op, "qkv", qkv);
  MG_CHECK(sh.heads > 0 && sh.groups > 0 && sh.heads % sh.groups == 0 && sh.head_dim > 0, op,
           ": heads ", sh.heads, " must be a positive multiple of groups ", sh.groups,
           " and head_dim ", sh.head_dim, " positive");
  const int hpg = sh.heads / sh.groups;
  const int64_t d = sh.head_dim, width = int64_t(sh.groups) * (hpg + 2) * d;
  MG_CHECK(qkv.dim() >= 1 && qkv.size(-1) == width, op, ": qkv ", shape_str(qkv.shape()),
           " does not end in the fused width ", width, " = groups ", sh.groups, " x (", hpg,
           " + 2) x head_dim ", d);
  MG_CHECK(rope.rotary_dim > 0 && rope.rotary_dim % 2 == 0 && rope.rotary_dim <= d, op,
           ": rotary_dim ", rope.rotary_dim, " must be even and in (0, head_dim ", d, "]");
  MG_CHECK(rope.base > 0, op, ": rotary base ", rope.base, " must be positive");
  const int64_t n = qkv.numel() / width, half = rope.rotary_dim / 2;
  detail::require_cuda(op, "positions", positions);
  MG_CHECK(positions.dtype() == DType::I32 && positions.numel() == n, op,
           ": positions must be contiguous int32 [", n, "] (one per row of qkv)");
  if (n == 0) return;
  RopeArgs a{qkv.data<float>(), positions.data<int32_t>(), rope.base, rope.rotary_dim, n, width, half,
             hpg + 1, hpg, int(d), int64_t(sh.groups) * (hpg + 1), transpose ? -1.0f : 1.0f,
             rope.interleaved};
  rope_kernel<<<detail::grid_for(n * a.rotated * half, kThreads), kThreads, 0, stream()>>>(a);
  MG_CUDA_LAUNCH_CHECK();
}

}  // namespace

void rope_fwd(const Tensor& qkv, const Tensor& positions, const ops::AttentionShape& shape,
              const ops::RotaryConfig& rope) {
  rope_apply("rope_fwd", qkv, positions, shape, rope, false);
}

void rope_bwd(const Tensor& dqkv, const Tensor& positions, const ops::AttentionShape& shape,
              const ops::RotaryConfig& rope) {
  rope_apply("rope_bwd", dqkv, positions, shape, rope, true);
}

}  // namespace megatron::cuda
