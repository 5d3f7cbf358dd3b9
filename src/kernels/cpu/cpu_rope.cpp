// Rotary position embedding on the fused QKV activation, in place (Megatron-Core's
// RotaryEmbedding and _apply_rotary_pos_emb_bshd with _rotate_half, both pair layouts), and the
// ALiBi slopes. Angles are computed in double and rounded once; a table of cos/sin per distinct
// position is built when the positions span fewer values than there are rows (the usual batch of
// sequences at positions 0..s-1). OpenMP over rows.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/cpu_common.h"
#include "kernels/cpu/cpu_backend.h"

namespace megatron::ops::cpu {
namespace {

// cos and sin of position p for the rot/2 frequencies.
void angles(int64_t p, const std::vector<double>& inv_freq, float* cs, float* sn) {
  for (size_t i = 0; i < inv_freq.size(); ++i) {
    const double a = double(p) * inv_freq[i];
    cs[i] = float(std::cos(a));
    sn[i] = float(std::sin(a));
  }
}

// Rotates the first rot dims of one head by the angles (sn already carries the direction).
inline void rotate_head(float* x, int64_t half, bool interleaved, const float* cs, const float* sn) {
  if (interleaved) {
    for (int64_t i = 0; i < half; ++i) {
      const float a = x[2 * i], b = x[2 * i + 1];
      x[2 * i] = a * cs[i] - b * sn[i];
      x[2 * i + 1] = b * cs[i] + a * sn[i];
    }
  } else {
    float* y = x + half;
#pragma omp simd
    for (int64_t i = 0; i < half; ++i) {
      const float a = x[i], b = y[i];
      x[i] = a * cs[i] - b * sn[i];
      y[i] = b * cs[i] + a * sn[i];
    }
  }
}

void rope_apply(const char* op, const Tensor& qkv, const Tensor& positions,
                const AttentionShape& sh, const RotaryConfig& rope, bool transpose) {
  cpu::require_f32(op, "qkv", qkv);
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
  cpu::require_host(op, positions);
  MG_CHECK(positions.defined() && positions.dtype() == DType::I32 && positions.is_contiguous() &&
               positions.numel() == n,
           op, ": positions must be contiguous int32 [", n, "] (one per row of qkv)");
  if (n == 0) return;
  const int32_t* pos = positions.data<int32_t>();
  int64_t pmin = pos[0], pmax = pos[0];
  for (int64_t r = 0; r < n; ++r) {
    MG_CHECK(pos[r] >= 0, op, ": positions[", r, "] = ", pos[r], " is negative");
    pmin = std::min<int64_t>(pmin, pos[r]);
    pmax = std::max<int64_t>(pmax, pos[r]);
  }
  std::vector<double> inv_freq(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i)
    inv_freq[size_t(i)] = std::pow(rope.base, -double(2 * i) / double(rope.rotary_dim));
  const float sign = transpose ? -1.0f : 1.0f;
  const int64_t span = pmax - pmin + 1;
  const bool table = span <= n;
  std::vector<float> cs_tab(table ? size_t(span * half) : 0), sn_tab(cs_tab.size());
  if (table) {
    cpu::parallel_for(span, span * half, [&](int64_t p) {
      angles(pmin + p, inv_freq, cs_tab.data() + p * half, sn_tab.data() + p * half);
      for (int64_t i = 0; i < half; ++i) sn_tab[size_t(p * half + i)] *= sign;
    });
  }
  float* x = qkv.data<float>();
  auto rotate_row = [&](int64_t r, std::vector<float>& cs_row, std::vector<float>& sn_row) {
      const float *cs = nullptr, *sn = nullptr;
      if (table) {
        cs = cs_tab.data() + (pos[r] - pmin) * half;
        sn = sn_tab.data() + (pos[r] - pmin) * half;
      } else {
        angles(pos[r], inv_freq, cs_row.data(), sn_row.data());
        for (float& v : sn_row) v *= sign;
        cs = cs_row.data();
        sn = sn_row.data();
      }
      float* row = x + r * width;
      for (int g = 0; g < sh.groups; ++g)
        for (int h = 0; h <= hpg; ++h)  // the group's query heads, then its key head
          rotate_head(row + (int64_t(g) * (hpg + 2) + h) * d, half, rope.interleaved, cs, sn);
  };
  const size_t scratch = table ? 0 : size_t(half);
  if (n * half <= kMinParallelWork) {  // on this thread, outside any OpenMP region
    std::vector<float> cs_row(scratch), sn_row(scratch);
    for (int64_t r = 0; r < n; ++r) rotate_row(r, cs_row, sn_row);
    return;
  }
#pragma omp parallel
  {
    std::vector<float> cs_row(scratch), sn_row(scratch);
#pragma omp for schedule(static)
    for (int64_t r = 0; r < n; ++r) rotate_row(r, cs_row, sn_row);
  }
}

}  // namespace

void rope_fwd(const Tensor& qkv, const Tensor& positions, const AttentionShape& shape,
              const RotaryConfig& rope) {
  rope_apply("rope_fwd", qkv, positions, shape, rope, false);
}

void rope_bwd(const Tensor& dqkv, const Tensor& positions, const AttentionShape& shape,
              const RotaryConfig& rope) {
  rope_apply("rope_bwd", dqkv, positions, shape, rope, true);
}

}  // namespace megatron::ops::cpu

namespace megatron::ops {

// A host helper, not an op: the slopes are small tables the kernels and callers build.
std::vector<float> alibi_slopes(int total_heads) {
  MG_CHECK(total_heads > 0, "alibi_slopes: total_heads ", total_heads, " must be positive");
  // Slopes of a power of two n: start^(h+1) with start = 2^(-8/n).
  auto power_of_two = [](int n) {
    std::vector<double> s(static_cast<size_t>(n));
    const double start = std::pow(2.0, -8.0 / double(n));
    for (int h = 0; h < n; ++h) s[size_t(h)] = std::pow(start, double(h + 1));
    return s;
  };
  int p = 1;
  while (p * 2 <= total_heads) p *= 2;
  std::vector<double> s = power_of_two(p);
  if (p < total_heads) {  // interleave: every other slope of 2p, the first total_heads - p of them
    const std::vector<double> extra = power_of_two(2 * p);
    for (int k = 0; k < total_heads - p; ++k) s.push_back(extra[size_t(2 * k)]);
  }
  return std::vector<float>(s.begin(), s.end());
}

}  // namespace megatron::ops
