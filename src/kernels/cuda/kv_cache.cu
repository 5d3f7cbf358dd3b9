// The KV-cache append on the GPU (ops::kv_cache_append): each row's key and value heads copied
// to its slot at its position, one thread per element. Slots and positions come from the
// inference engine, not from user data; they are not read back for checks (the CPU kernel checks
// them), and a row whose slot or position lies outside the cache is skipped, so no write can land
// outside it.
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_common.cuh"

namespace megatron::cuda {

using detail::stream;

namespace {

constexpr int kThreads = 256;

__global__ void kv_append_kernel(float* kc, float* vc, const float* qkv, const int32_t* slot,
                                 const int32_t* pos, int64_t n, int64_t width, int groups,
                                 int hpg, int64_t d, int64_t slots, int64_t max_len) {
  MG_GRID_STRIDE(e, n * groups * d) {
    const int64_t r = e / (groups * d), g = (e / d) % groups, c = e % d;
    const int64_t s = slot[r], p = pos[r];
    if (s < 0 || s >= slots || p < 0 || p >= max_len) continue;
    const float* k = qkv + r * width + (g * (hpg + 2) + hpg) * d;
    const int64_t at = ((s * groups + g) * max_len + p) * d + c;
    kc[at] = k[c];
    vc[at] = k[d + c];
  }
}

}  // namespace

void kv_cache_append(const Tensor& k_cache, const Tensor& v_cache, const Tensor& qkv,
                     const Tensor& row_slot, const Tensor& row_pos,
                     const ops::AttentionShape& sh) {
  const char* op = "kv_cache_append";
  detail::require_f32(op, "k_cache", k_cache);
  detail::require_f32(op, "v_cache", v_cache);
  detail::require_f32(op, "qkv", qkv);
  MG_CHECK(sh.heads > 0 && sh.groups > 0 && sh.heads % sh.groups == 0 && sh.head_dim > 0, op,
           ": heads ", sh.heads, " must be a positive multiple of groups ", sh.groups);
  const int hpg = sh.heads / sh.groups;
  const int64_t d = sh.head_dim, width = int64_t(sh.groups) * (hpg + 2) * d;
  MG_CHECK(k_cache.dim() == 4 && k_cache.size(1) == sh.groups && k_cache.size(3) == d, op,
           ": k_cache ", shape_str(k_cache.shape()), " must be [slots, groups ", sh.groups,
           ", max_len, head_dim ", d, "]");
  MG_CHECK(v_cache.shape() == k_cache.shape(), op, ": v_cache ", shape_str(v_cache.shape()),
           " differs from k_cache ", shape_str(k_cache.shape()));
  MG_CHECK(qkv.dim() >= 1 && qkv.size(-1) == width, op, ": qkv ", shape_str(qkv.shape()),
           " does not end in the fused width ", width);
  const int64_t n = qkv.numel() / width;
  for (auto [name, t] : {std::pair{"row_slot", &row_slot}, {"row_pos", &row_pos}}) {
    detail::require_cuda(op, name, *t);
    MG_CHECK(t->dtype() == DType::I32 && t->numel() == n, op, ": ", name,
             " must be contiguous int32 [", n, "] (one per row of qkv)");
  }
  if (n == 0) return;
  kv_append_kernel<<<detail::grid_for(n * sh.groups * d, kThreads), kThreads, 0, stream()>>>(
      k_cache.data<float>(), v_cache.data<float>(), qkv.data<float>(), row_slot.data<int32_t>(),
      row_pos.data<int32_t>(), n, width, sh.groups, hpg, d, k_cache.size(0), k_cache.size(2));
  MG_CUDA_LAUNCH_CHECK();
}

}  // namespace megatron::cuda
