// A float64 reference of the core attention op, written from its definition in ops.h with plain
// loops over (batch row, head, query row, key row): the visibility rule per (query, key), the
// scaled score plus bias and ALiBi, softmax, the Philox dropout keep mask by global head and
// positions, and the gradients by the textbook softmax backward. Operands are plain arrays
// (q [b, sq, n, d], k and v [kv sequences, skv, g, d], bias [1 or b, n, q_span, kv_span]); the
// tests pack them into the fused layouts the kernels read. reference_finite_differences gives the
// gradients by central differences of the forward, which the tests compare both the analytic
// reference and the kernels with.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "core/rng.h"
#include "kernels/ops.h"

namespace megatron::ops::testing {

struct RefAttention {
  int64_t b = 0, sq = 0, skv = 0, q_span = 0, kv_span = 0;
  int n = 0, g = 0, d = 0;
  double scale = 1.0;
  int head_offset = 0, total_heads = 0;  // total_heads 0: n
  bool causal = true, alibi = false;
  int64_t window_left = -1, window_right = -1;
  std::vector<int32_t> qpos;      // [b * sq] (every row's position)
  std::vector<int32_t> kpos;      // [skv]
  std::vector<int32_t> kv_index;  // [b] (the kv sequence of each batch row)
  std::vector<int32_t> start;     // [b * sq], or empty
  std::vector<int32_t> pad;       // [kv sequences, kv_span], or empty
  int64_t bias_batch = 0;         // 0: no bias
  DropoutSpec dropout;
};

struct RefValues {
  std::vector<double> q, k, v, bias;
};

struct RefForward {
  std::vector<double> out, lse, probs;  // [b, sq, n, d], [b, n, sq] (-inf: no key), [b, n, sq, skv]
};

inline int ref_heads(const RefAttention& a) { return a.total_heads > 0 ? a.total_heads : a.n; }

inline bool ref_visible(const RefAttention& a, int64_t bi, int64_t i, int64_t j) {
  const int64_t p = a.qpos[size_t(bi * a.sq + i)], k = a.kpos[size_t(j)];
  if (!a.start.empty() && k < a.start[size_t(bi * a.sq + i)]) return false;
  if (a.causal && k > p) return false;
  if (a.window_left >= 0 && k < p - a.window_left) return false;
  if (!a.causal && a.window_right >= 0 && k > p + a.window_right) return false;
  if (!a.pad.empty() && a.pad[size_t(a.kv_index[size_t(bi)] * a.kv_span + k)] == 0) return false;
  return true;
}

// keep factor (0 or 1/(1-p)) of (bi, local head h, query row i, key row j).
inline double ref_keep(const RefAttention& a, int64_t bi, int h, int64_t i, int64_t j) {
  if (!a.dropout.active()) return 1.0;
  const uint64_t e = a.dropout.element_offset +
                     uint64_t(((bi * ref_heads(a) + a.head_offset + h) * a.q_span +
                               a.qpos[size_t(bi * a.sq + i)]) * a.kv_span + a.kpos[size_t(j)]);
  const Philox rng(a.dropout.seed, a.dropout.stream);
  return rng.uniform(e) >= a.dropout.p ? 1.0 / (1.0 - double(a.dropout.p)) : 0.0;
}

inline double ref_score(const RefAttention& a, const RefValues& x, const std::vector<float>& slopes,
                        int64_t bi, int h, int64_t i, int64_t j) {
  const int64_t s = a.kv_index[size_t(bi)], grp = h / (a.n / a.g);
  double dot = 0;
  for (int e = 0; e < a.d; ++e)
    dot += x.q[size_t(((bi * a.sq + i) * a.n + h) * a.d + e)] *
           x.k[size_t(((s * a.skv + j) * a.g + grp) * a.d + e)];
  double score = dot * a.scale;
  const int64_t p = a.qpos[size_t(bi * a.sq + i)], k = a.kpos[size_t(j)];
  if (a.bias_batch > 0)
    score += x.bias[size_t((((a.bias_batch == 1 ? 0 : bi) * a.n + h) * a.q_span + p) * a.kv_span + k)];
  if (a.alibi) score += double(slopes[size_t(a.head_offset + h)]) * double(k - p);
  return score;
}

inline RefForward reference_forward(const RefAttention& a, const RefValues& x) {
  RefForward r;
  r.out.assign(size_t(a.b * a.sq * a.n * a.d), 0.0);
  r.lse.assign(size_t(a.b * a.n * a.sq), -INFINITY);
  r.probs.assign(size_t(a.b * a.n * a.sq * a.skv), 0.0);
  const std::vector<float> slopes = alibi_slopes(ref_heads(a));
  for (int64_t bi = 0; bi < a.b; ++bi)
    for (int h = 0; h < a.n; ++h)
      for (int64_t i = 0; i < a.sq; ++i) {
        double mx = -INFINITY;
        for (int64_t j = 0; j < a.skv; ++j)
          if (ref_visible(a, bi, i, j)) mx = std::max(mx, ref_score(a, x, slopes, bi, h, i, j));
        if (mx == -INFINITY) continue;  // sees no key
        double sum = 0;
        for (int64_t j = 0; j < a.skv; ++j)
          if (ref_visible(a, bi, i, j)) sum += std::exp(ref_score(a, x, slopes, bi, h, i, j) - mx);
        r.lse[size_t((bi * a.n + h) * a.sq + i)] = mx + std::log(sum);
        const int64_t s = a.kv_index[size_t(bi)], grp = h / (a.n / a.g);
        for (int64_t j = 0; j < a.skv; ++j) {
          if (!ref_visible(a, bi, i, j)) continue;
          const double pr = std::exp(ref_score(a, x, slopes, bi, h, i, j) - mx) / sum;
          r.probs[size_t(((bi * a.n + h) * a.sq + i) * a.skv + j)] = pr;
          const double w = pr * ref_keep(a, bi, h, i, j);
          for (int e = 0; e < a.d; ++e)
            r.out[size_t(((bi * a.sq + i) * a.n + h) * a.d + e)] +=
                w * x.v[size_t(((s * a.skv + j) * a.g + grp) * a.d + e)];
        }
      }
  return r;
}

// Gradients of sum(out * dout) with respect to q, k, v and the bias (analytic).
inline RefValues reference_backward(const RefAttention& a, const RefValues& x,
                                    const std::vector<double>& dout) {
  const RefForward f = reference_forward(a, x);
  RefValues g{std::vector<double>(x.q.size()), std::vector<double>(x.k.size()),
              std::vector<double>(x.v.size()), std::vector<double>(x.bias.size())};
  for (int64_t bi = 0; bi < a.b; ++bi)
    for (int h = 0; h < a.n; ++h)
      for (int64_t i = 0; i < a.sq; ++i) {
        const int64_t s = a.kv_index[size_t(bi)], grp = h / (a.n / a.g);
        const double* go = dout.data() + ((bi * a.sq + i) * a.n + h) * a.d;
        std::vector<double> dp(size_t(a.skv), 0.0);  // d loss / d probability (pre-dropout)
        double dot = 0;
        for (int64_t j = 0; j < a.skv; ++j) {
          const double pr = f.probs[size_t(((bi * a.n + h) * a.sq + i) * a.skv + j)];
          if (pr == 0.0) continue;
          const double keep = ref_keep(a, bi, h, i, j);
          double gv = 0;
          for (int e = 0; e < a.d; ++e) {
            gv += go[e] * x.v[size_t(((s * a.skv + j) * a.g + grp) * a.d + e)];
            g.v[size_t(((s * a.skv + j) * a.g + grp) * a.d + e)] += pr * keep * go[e];
          }
          dp[size_t(j)] = keep * gv;
          dot += pr * dp[size_t(j)];
        }
        for (int64_t j = 0; j < a.skv; ++j) {
          const double pr = f.probs[size_t(((bi * a.n + h) * a.sq + i) * a.skv + j)];
          if (pr == 0.0) continue;
          const double ds = pr * (dp[size_t(j)] - dot);  // d loss / d score
          for (int e = 0; e < a.d; ++e) {
            g.q[size_t(((bi * a.sq + i) * a.n + h) * a.d + e)] +=
                a.scale * ds * x.k[size_t(((s * a.skv + j) * a.g + grp) * a.d + e)];
            g.k[size_t(((s * a.skv + j) * a.g + grp) * a.d + e)] +=
                a.scale * ds * x.q[size_t(((bi * a.sq + i) * a.n + h) * a.d + e)];
          }
          if (a.bias_batch > 0)
            g.bias[size_t((((a.bias_batch == 1 ? 0 : bi) * a.n + h) * a.q_span +
                           a.qpos[size_t(bi * a.sq + i)]) * a.kv_span + a.kpos[size_t(j)])] += ds;
        }
      }
  return g;
}

// The same gradients by central differences of reference_forward (step 1e-6).
inline RefValues reference_finite_differences(const RefAttention& a, RefValues x,
                                              const std::vector<double>& dout) {
  auto loss = [&](const RefValues& y) {
    const std::vector<double> out = reference_forward(a, y).out;
    double s = 0;
    for (size_t e = 0; e < out.size(); ++e) s += out[e] * dout[e];
    return s;
  };
  RefValues g{std::vector<double>(x.q.size()), std::vector<double>(x.k.size()),
              std::vector<double>(x.v.size()), std::vector<double>(x.bias.size())};
  const double h = 1e-6;
  for (auto [in, out] : {std::pair{&x.q, &g.q}, {&x.k, &g.k}, {&x.v, &g.v}, {&x.bias, &g.bias}})
    for (size_t e = 0; e < in->size(); ++e) {
      const double orig = (*in)[e];
      (*in)[e] = orig + h;
      const double up = loss(x);
      (*in)[e] = orig - h;
      const double dn = loss(x);
      (*in)[e] = orig;
      (*out)[e] = (up - dn) / (2 * h);
    }
  return g;
}

}  // namespace megatron::ops::testing
