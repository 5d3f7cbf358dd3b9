// KV-cache attention for inference on the CPU: appending the new rows' keys and values to their
// cache slots, and attention of those rows against their slots' cached sequences (continuous
// batching: any mix of prefill chunks and single decode rows in one call). Rows of one slot at
// consecutive positions form a run; each (run, head) is one OpenMP task: a prefill run computes
// in 64-row tiles with sgemm, a single row with matrix-vector products. Causal, with an optional sliding window
// and ALiBi, as attention_fwd.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/cpu_attention_common.h"
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
  cpu::require_f32(op, "k_cache", k_cache);
  cpu::require_f32(op, "v_cache", v_cache);
  cpu::require_f32(op, "qkv", qkv);
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

}  // namespace

void kv_cache_append(const Tensor& k_cache, const Tensor& v_cache, const Tensor& qkv,
                     const Tensor& row_slot, const Tensor& row_pos, const AttentionShape& shape) {
  const CacheLayout L =
      check_cache("kv_cache_append", k_cache, v_cache, qkv, row_slot, row_pos, shape);
  const float* x = qkv.data<float>();
  float* kc = k_cache.data<float>();
  float* vc = v_cache.data<float>();
  cpu::parallel_for(L.n, L.n * L.width, [&](int64_t r) {
    const float* row = x + r * L.width;
    for (int g = 0; g < L.groups; ++g) {
      const int64_t at = L.cache(L.slot[r], g) + int64_t(L.pos[r]) * L.d;
      std::copy_n(row + L.k(g), L.d, kc + at);
      std::copy_n(row + L.v(g), L.d, vc + at);
    }
  });
}

void attention_kv_cache_fwd(const Tensor& ctx, const Tensor& qkv, const Tensor& k_cache,
                            const Tensor& v_cache, const Tensor& row_slot, const Tensor& row_pos,
                            const AttentionShape& shape) {
  const char* op = "attention_kv_cache_fwd";
  const CacheLayout L = check_cache(op, k_cache, v_cache, qkv, row_slot, row_pos, shape);
  cpu::require_f32(op, "ctx", ctx);
  MG_CHECK(ctx.numel() == L.n * L.ctx_width, op, ": ctx ", shape_str(ctx.shape()), " must be [",
           L.n, ", heads * head_dim = ", L.ctx_width, "]");
  cpu::check_mask_fields(op, shape);
  MG_CHECK(shape.causal, op, ": a KV cache holds earlier positions only; causal must be true");
  const int total = shape.total_heads > 0 ? shape.total_heads : shape.heads;
  MG_CHECK(shape.head_offset >= 0 && shape.head_offset + shape.heads <= total, op, ": heads [",
           shape.head_offset, ", ", shape.head_offset + shape.heads, ") outside the layer's ", total);
  const std::vector<float> slopes = cpu::local_alibi_slopes(shape);
  const int64_t window = shape.window_left;
  // Runs of rows [first, first + len) of one slot at consecutive positions.
  std::vector<std::pair<int64_t, int64_t>> runs;
  for (int64_t r = 0; r < L.n; ++r) {
    if (!runs.empty()) {
      auto& [first, len] = runs.back();
      const int64_t last = first + len - 1;
      if (L.slot[r] == L.slot[last] && L.pos[r] == L.pos[last] + 1) {
        ++len;
        continue;
      }
    }
    runs.emplace_back(r, 1);
  }
  const float* x = qkv.data<float>();
  const float* kc = k_cache.data<float>();
  const float* vc = v_cache.data<float>();
  float* out = ctx.data<float>();
  const float scale = shape.softmax_scale;
  constexpr int64_t kTileRows = 64;
  const int64_t tasks = int64_t(runs.size()) * L.heads;
  const size_t scratch = size_t(std::min<int64_t>(kTileRows, L.n) * L.max_len);
  auto run_task = [&](int64_t task, std::vector<float>& P) {
    const auto [first, len] = runs[size_t(task / L.heads)];
    const int head = int(task % L.heads), group = head / L.hpg;
    const float* K = kc + L.cache(L.slot[first], group);
    const float* V = vc + L.cache(L.slot[first], group);
    for (int64_t t0 = 0; t0 < len; t0 += kTileRows) {
      const int64_t nt = std::min(kTileRows, len - t0), r0 = first + t0;
      const int64_t p0 = L.pos[r0], p1 = L.pos[r0 + nt - 1];
      // Keys [k0, k1) cover the tile: the first row's window start to the last row's position.
      const int64_t k0 = window >= 0 ? std::max<int64_t>(0, p0 - window) : 0, k1 = p1 + 1;
      const int64_t kw = k1 - k0;
      const float* Q = x + r0 * L.width + L.q(head);
      float* O = out + r0 * L.ctx_width + int64_t(head) * L.d;
      if (nt == 1) {
        cpu::matvec(false, {K + k0 * L.d, DType::F32, kw, L.d, L.d}, Q, 1, scale, 0.0f, P.data(),
                    1);
      } else {
        cpu::sgemm(false, true, nt, kw, L.d, scale, Q, L.width, K + k0 * L.d, L.d, 0.0f,
                   P.data(), kw);
      }
      for (int64_t i = 0; i < nt; ++i) {
        float* row = P.data() + i * kw;
        const int64_t p = p0 + i, lo = window >= 0 ? std::max<int64_t>(0, p - window) : 0;
        if (!slopes.empty())
          for (int64_t j = lo; j <= p; ++j) row[j - k0] += slopes[size_t(head)] * float(j - p);
        float mx = -std::numeric_limits<float>::infinity();
        for (int64_t j = lo; j <= p; ++j) mx = std::max(mx, row[j - k0]);
        float sum = 0;
        for (int64_t j = lo; j <= p; ++j) {
          row[j - k0] = cpu::fast_exp(row[j - k0] - mx);
          sum += row[j - k0];
        }
        const float inv = 1.0f / sum;
        for (int64_t j = k0; j < lo; ++j) row[j - k0] = 0;
        for (int64_t j = lo; j <= p; ++j) row[j - k0] *= inv;
        for (int64_t j = p + 1; j < k1; ++j) row[j - k0] = 0;
      }
      if (nt == 1) {
        cpu::matvec(true, {V + k0 * L.d, DType::F32, kw, L.d, L.d}, P.data(), 1, 1.0f, 0.0f, O,
                    1);
      } else {
        cpu::sgemm(false, false, nt, L.d, kw, 1.0f, P.data(), kw, V + k0 * L.d, L.d, 0.0f, O,
                   L.ctx_width);
      }
    }
  };
  if (tasks * L.max_len * L.d <= kMinParallelWork) {  // on this thread, outside any OpenMP region
    std::vector<float> P(scratch);
    for (int64_t task = 0; task < tasks; ++task) run_task(task, P);
    return;
  }
#pragma omp parallel
  {
    std::vector<float> P(scratch);
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < tasks; ++task) run_task(task, P);
  }
}

}  // namespace megatron::ops::cpu
