// The KV cache on the CPU: each new row's key and value heads written into its slot at its
// position. Attention against the cache is the core attention op (cpu_attention.cpp, or
// cpu_attention_bf16.cpp for a bf16 cache: a bf16 model's, half the bytes read per decode step).
#include <algorithm>

#include "kernels/cpu/cpu_common.h"
#include "kernels/cpu/cpu_backend.h"

namespace megatron::ops::cpu {
namespace {

struct CacheLayout {
  int64_t n = 0, width = 0, ctx_width = 0, slots = 0, max_len = 0;
  int heads = 0, groups = 0, hpg = 0, d = 0;
  const int32_t* slot = nullptr;
  const int32_t* pos = nullptr;
  int64_t q(int head) const { return int64_t(head / hpg) * (hpg + 2) * d + int64_t(head % hpg) * d; }
  int64_t k(int group) const { return int64_t(group) * (hpg + 2) * d + int64_t(hpg) * d; }
  int64_t v(int group) const { return k(group) + d; }
  // Offset of (slot, group, position 0) in a cache.
  int64_t cache(int64_t s, int group) const { return (s * groups + group) * max_len * d; }
};

void check_index_vec(const char* op, const char* name, const Tensor& t, int64_t n, int64_t limit) {
  cpu::require_host(op, t);
  MG_CHECK(t.defined() && t.dtype() == DType::I32 && t.is_contiguous() && t.numel() == n, op, ": ",
           name, " must be contiguous int32 [", n, "] (one per row of qkv)");
  const int32_t* p = t.data<int32_t>();
  for (int64_t i = 0; i < n; ++i)
    MG_CHECK(p[i] >= 0 && p[i] < limit, op, ": ", name, "[", i, "] = ", p[i], " outside [0, ",
             limit, ")");
}

CacheLayout check_cache(const char* op, const Tensor& k_cache, const Tensor& v_cache,
                        const Tensor& qkv, const Tensor& row_slot, const Tensor& row_pos,
                        const AttentionShape& sh) {
  for (const Tensor* t : {&k_cache, &v_cache, &qkv}) {
    cpu::require_host(op, *t);
    MG_CHECK(t->defined() && t->is_contiguous() &&
                 (t->dtype() == DType::F32 || t->dtype() == DType::BF16),
             op, ": the caches and qkv must be contiguous float32 or bfloat16 tensors");
  }
  MG_CHECK(k_cache.dtype() == v_cache.dtype() && k_cache.dtype() == qkv.dtype(), op,
           ": k_cache (", dtype_name(k_cache.dtype()), "), v_cache (", dtype_name(v_cache.dtype()),
           ") and qkv (", dtype_name(qkv.dtype()), ") must have one dtype");
  MG_CHECK(sh.heads > 0 && sh.groups > 0 && sh.heads % sh.groups == 0 && sh.head_dim > 0, op,
           ": heads ", sh.heads, " must be a positive multiple of groups ", sh.groups);
  CacheLayout L;
  L.heads = sh.heads;
  L.groups = sh.groups;
  L.hpg = sh.heads / sh.groups;
  L.d = sh.head_dim;
  L.width = int64_t(L.groups) * (L.hpg + 2) * L.d;
  L.ctx_width = int64_t(L.heads) * L.d;
  MG_CHECK(k_cache.dim() == 4 && k_cache.size(1) == L.groups && k_cache.size(3) == L.d, op,
           ": k_cache ", shape_str(k_cache.shape()), " must be [slots, groups ", L.groups,
           ", max_len, head_dim ", L.d, "]");
  MG_CHECK(v_cache.shape() == k_cache.shape(), op, ": v_cache ", shape_str(v_cache.shape()),
           " differs from k_cache ", shape_str(k_cache.shape()));
  L.slots = k_cache.size(0);
  L.max_len = k_cache.size(2);
  MG_CHECK(qkv.dim() >= 1 && qkv.size(-1) == L.width, op, ": qkv ", shape_str(qkv.shape()),
           " does not end in the fused width ", L.width);
  L.n = qkv.numel() / L.width;
  check_index_vec(op, "row_slot", row_slot, L.n, L.slots);
  check_index_vec(op, "row_pos", row_pos, L.n, L.max_len);
  L.slot = row_slot.data<int32_t>();
  L.pos = row_pos.data<int32_t>();
  return L;
}

template <class T>
void append_rows(const CacheLayout& L, const T* x, T* kc, T* vc) {
  cpu::parallel_for(L.n, L.n * L.width, [&](int64_t r) {
    const T* row = x + r * L.width;
    for (int g = 0; g < L.groups; ++g) {
      const int64_t at = L.cache(L.slot[r], g) + int64_t(L.pos[r]) * L.d;
      std::copy_n(row + L.k(g), L.d, kc + at);
      std::copy_n(row + L.v(g), L.d, vc + at);
    }
  });
}

}  // namespace

void kv_cache_append(const Tensor& k_cache, const Tensor& v_cache, const Tensor& qkv,
                     const Tensor& row_slot, const Tensor& row_pos, const AttentionShape& shape) {
  const CacheLayout L =
      check_cache("kv_cache_append", k_cache, v_cache, qkv, row_slot, row_pos, shape);
  if (qkv.dtype() == DType::BF16)
    append_rows(L, qkv.data<bf16>(), k_cache.data<bf16>(), v_cache.data<bf16>());
  else
    append_rows(L, qkv.data<float>(), k_cache.data<float>(), v_cache.data<float>());
}

}  // namespace megatron::ops::cpu
