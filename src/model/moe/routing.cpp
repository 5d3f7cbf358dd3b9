// The router's arithmetic in double precision (see routing.h). Each step follows
// Megatron-Core's moe_utils.py: topk_softmax_with_capacity (score function, optional
// group-limited top-k, scaling, capacity), compute_routing_scores_for_aux_loss with
// switch_load_balancing_loss_func, and z_loss_func.
#include "model/moe/routing.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"

namespace megatron::model {

namespace {

constexpr double kSigmoidEps = 1e-20;  // Megatron's "scores.sum(...) + 1e-20"

// The k largest of v (ties: lower index first), largest first.
std::vector<int> topk_of(const std::vector<double>& v, int k) {
  std::vector<int> ix(v.size());
  std::iota(ix.begin(), ix.end(), 0);
  std::stable_sort(ix.begin(), ix.end(), [&](int a, int b) { return v[size_t(a)] > v[size_t(b)]; });
  ix.resize(size_t(k));
  return ix;
}

// group_limited_topk: groups ranked by the sum of their top (topk / group_topk) scores; the
// top-k over the experts of the group_topk best groups.
std::vector<int> choose(const std::vector<double>& v, const RouterSettings& s) {
  if (s.group_topk <= 0) return topk_of(v, s.topk);
  const int G = s.num_groups, per = s.num_experts / G;
  std::vector<double> group_score(static_cast<size_t>(G));
  for (int g = 0; g < G; ++g) {
    std::vector<double> in(v.begin() + g * per, v.begin() + (g + 1) * per);
    double sum = 0;
    for (int i : topk_of(in, s.topk / s.group_topk)) sum += in[size_t(i)];
    group_score[size_t(g)] = sum;
  }
  std::vector<double> masked(v.size(), -INFINITY);
  for (int g : topk_of(group_score, s.group_topk))
    for (int e = g * per; e < (g + 1) * per; ++e) masked[size_t(e)] = v[size_t(e)];
  return topk_of(masked, s.topk);
}

std::vector<double> softmax(const double* l, int E) {
  double m = -INFINITY;
  for (int i = 0; i < E; ++i) m = std::max(m, l[i]);
  std::vector<double> p(static_cast<size_t>(E));
  double z = 0;
  for (int i = 0; i < E; ++i) z += (p[size_t(i)] = std::exp(l[i] - m));
  for (double& x : p) x /= z;
  return p;
}
double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// Token x's choice: the experts `idx` and their (unscaled) probabilities, plus what backward
// needs: the scores the probabilities came from.
struct TokenChoice {
  std::vector<int> idx;
  std::vector<double> prob;   // before the scaling factor
  std::vector<double> score;  // [E]: softmax (pre-softmax), sigmoid; empty for plain softmax
};

TokenChoice choose_token(const double* l, const RouterSettings& s, const std::vector<double>& bias) {
  const int E = s.num_experts, k = s.topk;
  TokenChoice c;
  if (!s.sigmoid) {
    if (s.pre_softmax) {
      c.score = softmax(l, E);
      c.idx = choose(c.score, s);
      for (int e : c.idx) c.prob.push_back(c.score[size_t(e)]);
    } else {
      c.idx = choose(std::vector<double>(l, l + E), s);
      std::vector<double> v;
      for (int e : c.idx) v.push_back(l[e]);
      c.prob = softmax(v.data(), k);
    }
    return c;
  }
  c.score.resize(size_t(E));
  for (int i = 0; i < E; ++i) c.score[size_t(i)] = sigmoid(l[i]);
  std::vector<double> for_choice = c.score;
  if (!bias.empty())
    for (int i = 0; i < E; ++i) for_choice[size_t(i)] += bias[size_t(i)];
  c.idx = choose(for_choice, s);
  double sum = 0;
  for (int e : c.idx) sum += c.score[size_t(e)];
  for (int e : c.idx) c.prob.push_back(k > 1 ? c.score[size_t(e)] / (sum + kSigmoidEps)
                                             : c.score[size_t(e)]);
  return c;
}

// How a token's probabilities come from its logits: a softmax over its top-k logits, a softmax
// over all experts (pre-softmax; sinkhorn with k > 1), or sigmoids (normalised over the top-k
// when k > 1 outside sinkhorn).
bool is_sinkhorn(const RouterSettings& s) { return s.balancing == LoadBalancing::sinkhorn; }
bool full_softmax(const RouterSettings& s) {
  return is_sinkhorn(s) ? s.topk > 1 : !s.sigmoid && s.pre_softmax;
}
bool sigmoid_probs(const RouterSettings& s) { return is_sinkhorn(s) ? s.topk == 1 : s.sigmoid; }

// Sinkhorn routing's token choice (Megatron's sinkhorn_load_balancing): the scores are the
// sigmoid (k = 1) or the softmax over all experts (k > 1); the experts are `chosen` (from the
// Sinkhorn-normalised logits in training) or the top-k scores.
TokenChoice sinkhorn_choice(const double* l, const RouterSettings& s, const double* normalised) {
  const int E = s.num_experts, k = s.topk;
  TokenChoice c;
  if (k == 1) {
    c.score.resize(size_t(E));
    for (int i = 0; i < E; ++i) c.score[size_t(i)] = sigmoid(l[i]);
  } else {
    c.score = softmax(l, E);
  }
  c.idx = normalised ? topk_of(std::vector<double>(normalised, normalised + E), k) : topk_of(c.score, k);
  for (int e : c.idx) c.prob.push_back(c.score[size_t(e)]);
  return c;
}

// d(prob)/d(logits) applied to g (the gradient of c.prob), added into dl [E].
void choice_backward(const double* l, const RouterSettings& s, const TokenChoice& c,
                     const std::vector<double>& g, double* dl) {
  const int E = s.num_experts, k = s.topk;
  if (!sigmoid_probs(s) && !full_softmax(s)) {
    double dot = 0;
    for (int j = 0; j < k; ++j) dot += c.prob[size_t(j)] * g[size_t(j)];
    for (int j = 0; j < k; ++j) dl[c.idx[size_t(j)]] += c.prob[size_t(j)] * (g[size_t(j)] - dot);
    return;
  }
  std::vector<double> ds(size_t(E), 0.0);
  if (full_softmax(s)) {
    for (int j = 0; j < k; ++j) ds[size_t(c.idx[size_t(j)])] += g[size_t(j)];
    double dot = 0;
    for (int i = 0; i < E; ++i) dot += c.score[size_t(i)] * ds[size_t(i)];
    for (int i = 0; i < E; ++i) dl[i] += c.score[size_t(i)] * (ds[size_t(i)] - dot);
    return;
  }
  if (k > 1) {
    double sum = 0, gv = 0;
    for (int j = 0; j < k; ++j) {
      sum += c.score[size_t(c.idx[size_t(j)])];
      gv += g[size_t(j)] * c.score[size_t(c.idx[size_t(j)])];
    }
    const double d = sum + kSigmoidEps;
    for (int j = 0; j < k; ++j) ds[size_t(c.idx[size_t(j)])] += g[size_t(j)] / d - gv / (d * d);
  } else {
    ds[size_t(c.idx[0])] += g[0];
  }
  for (int i = 0; i < E; ++i) {
    const double sg = c.score[size_t(i)];
    dl[i] += ds[size_t(i)] * sg * (1 - sg);
  }
  (void)l;
}

// The scores of the load-balancing loss (compute_routing_scores_for_aux_loss): softmax, or the
// sigmoid normalised over the experts.
std::vector<double> aux_scores(const double* l, const RouterSettings& s) {
  if (!s.sigmoid) return softmax(l, s.num_experts);
  std::vector<double> v(static_cast<size_t>(s.num_experts));
  double sum = 0;
  for (int i = 0; i < s.num_experts; ++i) sum += (v[size_t(i)] = sigmoid(l[i]));
  for (double& x : v) x /= sum + kSigmoidEps;
  return v;
}

void aux_scores_backward(const double* l, const RouterSettings& s, const std::vector<double>& sa,
                         const std::vector<double>& dsa, double* dl) {
  const int E = s.num_experts;
  if (!s.sigmoid) {
    double dot = 0;
    for (int i = 0; i < E; ++i) dot += sa[size_t(i)] * dsa[size_t(i)];
    for (int i = 0; i < E; ++i) dl[i] += sa[size_t(i)] * (dsa[size_t(i)] - dot);
    return;
  }
  double sum = 0, gv = 0;
  std::vector<double> sg(static_cast<size_t>(E));
  for (int i = 0; i < E; ++i) sum += (sg[size_t(i)] = sigmoid(l[i]));
  for (int i = 0; i < E; ++i) gv += dsa[size_t(i)] * sg[size_t(i)];
  const double d = sum + kSigmoidEps;
  for (int i = 0; i < E; ++i) {
    const double ds = dsa[size_t(i)] / d - gv / (d * d);
    dl[i] += ds * sg[size_t(i)] * (1 - sg[size_t(i)]);
  }
}

struct Forward {
  std::vector<TokenChoice> choice;
  Routing r;
  std::vector<uint8_t> kept;  // [N, E]: the routed entry survives the capacity
};

Forward forward(const std::vector<double>& logits, int64_t N, const RouterSettings& s,
                const std::vector<double>& bias, bool training) {
  const int E = s.num_experts;
  MG_CHECK(int64_t(logits.size()) == N * E, "route: logits are not [N, E]");
  Forward f;
  Routing& r = f.r;
  r.num_tokens = N;
  r.num_experts = E;
  r.probs.assign(size_t(N * E), 0.0);
  r.map.assign(size_t(N * E), 0);
  const double sf = s.scaling_factor > 0 && !is_sinkhorn(s) ? s.scaling_factor : 1.0;
  const std::vector<double> normalised =
      is_sinkhorn(s) && training ? sinkhorn(logits, N, E) : std::vector<double>();
  for (int64_t x = 0; x < N; ++x) {
    const double* l = &logits[size_t(x * E)];
    f.choice.push_back(is_sinkhorn(s) ? sinkhorn_choice(l, s, training ? &normalised[size_t(x * E)] : nullptr)
                                      : choose_token(l, s, bias));
    const TokenChoice& c = f.choice.back();
    for (size_t j = 0; j < c.idx.size(); ++j) {
      r.probs[size_t(x * E + c.idx[j])] = c.prob[j] * sf;
      r.map[size_t(x * E + c.idx[j])] = 1;
    }
  }
  f.kept = r.map;
  if (s.capacity_factor > 0) {
    const int64_t cap = expert_capacity(N * s.topk, E, s.capacity_factor);
    if (cap <= N) {
      std::vector<uint8_t> cap_mask(size_t(N * E), 0);
      for (int e = 0; e < E; ++e) {
        std::vector<double> key(static_cast<size_t>(N));
        for (int64_t x = 0; x < N; ++x)
          key[size_t(x)] = s.drop_by_position ? double(r.map[size_t(x * E + e)])
                                              : r.probs[size_t(x * E + e)];
        for (int x : topk_of(key, int(cap))) cap_mask[size_t(int64_t(x) * E + e)] = 1;
      }
      for (size_t i = 0; i < cap_mask.size(); ++i) {
        f.kept[i] = r.map[i] && cap_mask[i];
        r.map[i] = s.pad_to_capacity ? cap_mask[i] : f.kept[i];
        if (!f.kept[i]) r.probs[i] = 0;
      }
    }
  }
  r.tokens_per_expert.assign(size_t(E), 0);
  for (int64_t x = 0; x < N; ++x)
    for (int e = 0; e < E; ++e) r.tokens_per_expert[size_t(e)] += r.map[size_t(x * E + e)];
  return f;
}

// The load-balancing loss as A * sum over tokens x and experts e of count[group(x), e] *
// scores[x, e]: aux_loss one group with the micro-batch's counts; seq_aux_loss a group per
// sequence (switch_load_balancing_loss_func over [S, B*E], divided by B); global_aux_loss one
// group with the averaged counts over the data-parallel tokens. Groups are taken over the
// micro-batch's rows (BalanceInputs::first_row).
struct AuxTerms {
  double a = 0;
  int64_t group_rows = 0, first_row = 0;  // tokens per group; the micro-batch row of x = 0
  std::vector<double> count;  // [groups, E]
  double at(int64_t x, int e, int E) const {
    return count[size_t(((first_row + x) / group_rows) * E + e)];
  }
};

int64_t micro_batch_rows(int64_t N, const BalanceInputs& b) { return b.rows > 0 ? b.rows : N; }

AuxTerms aux_terms(const std::vector<double>& logits, int64_t N, const RouterSettings& s,
                   const BalanceInputs& b) {
  const int E = s.num_experts;
  const double k = double(s.topk), c = s.aux_loss_coeff;
  const int64_t R = micro_batch_rows(N, b);
  const double C = double(b.context_parallel);  // the whole sequences' tokens are C times these
  AuxTerms t;
  t.group_rows = R;
  t.first_row = b.first_row;
  switch (s.balancing) {
    case LoadBalancing::aux_loss:
      t.a = E * c / (k * double(R) * double(R) * C * C);
      break;
    case LoadBalancing::seq_aux_loss: {
      const int64_t B = b.sequences;
      MG_REQUIRE(B >= 1 && R % B == 0, "seq_aux_loss: ", R, " tokens are not ", B, " sequences");
      const int64_t S = R / B;
      t.group_rows = S;
      t.a = E * c / (k * double(S) * double(S) * C * C * double(B));
      break;
    }
    case LoadBalancing::global_aux_loss: {
      MG_CHECK(int64_t(b.counts.size()) == E && b.global_num_tokens > 0,
               "global_aux_loss without the global token counts");
      const double T = b.global_num_tokens;
      t.a = E * c / (k * T * T);
      break;
    }
    default:
      MG_CHECK(false, "aux_terms without a load-balancing loss");
  }
  t.count = b.counts.empty() ? aux_loss_counts(logits, N, s, b) : b.counts;
  MG_CHECK(t.count.size() % size_t(E) == 0 &&
               int64_t(t.count.size() / size_t(E)) * t.group_rows >= R,
           "load-balancing counts of ", t.count.size(), " values for ", R, " rows");
  return t;
}

double logsumexp(const double* l, int E) {
  double m = -INFINITY;
  for (int i = 0; i < E; ++i) m = std::max(m, l[i]);
  double z = 0;
  for (int i = 0; i < E; ++i) z += std::exp(l[i] - m);
  return m + std::log(z);
}

}  // namespace

LoadBalancing load_balancing_of(const std::string& t) {
  if (t == "aux_loss") return LoadBalancing::aux_loss;
  if (t == "seq_aux_loss") return LoadBalancing::seq_aux_loss;
  if (t == "global_aux_loss") return LoadBalancing::global_aux_loss;
  if (t == "sinkhorn") return LoadBalancing::sinkhorn;
  if (t == "none") return LoadBalancing::none;
  MG_THROW("--moe-router-load-balancing-type '", t,
           "' is not one of: aux_loss, seq_aux_loss, global_aux_loss, sinkhorn, none");
}

const char* load_balancing_loss_name(LoadBalancing b) {
  switch (b) {
    case LoadBalancing::aux_loss: return "load_balancing_loss";
    case LoadBalancing::seq_aux_loss: return "seq_load_balancing_loss";
    case LoadBalancing::global_aux_loss: return "global_load_balancing_loss";
    default: return "";
  }
}

bool RouterSettings::has_balancing_loss() const {
  return aux_loss_coeff > 0 && (balancing == LoadBalancing::aux_loss ||
                                balancing == LoadBalancing::seq_aux_loss ||
                                balancing == LoadBalancing::global_aux_loss);
}

std::vector<double> aux_loss_counts(const std::vector<double>& logits, int64_t N,
                                    const RouterSettings& s, const BalanceInputs& b) {
  const int E = s.num_experts;
  const bool per_sequence = s.balancing == LoadBalancing::seq_aux_loss;
  const int64_t groups = per_sequence ? b.sequences : 1;
  const int64_t S = std::max<int64_t>(micro_batch_rows(N, b) / groups, 1);
  std::vector<double> count(size_t(groups * E), 0.0);
  for (int64_t x = 0; x < N; ++x) {
    const int64_t g = per_sequence ? (b.first_row + x) / S : 0;
    MG_CHECK(g < groups, "aux_loss_counts: row ", b.first_row + x, " outside the micro-batch");
    for (int e : topk_of(aux_scores(&logits[size_t(x * E)], s), s.topk)) count[size_t(g * E + e)] += 1;
  }
  return count;
}

std::vector<double> sinkhorn(const std::vector<double>& logits, int64_t N, int E) {
  std::vector<double> cost(logits.size());
  for (size_t i = 0; i < cost.size(); ++i) cost[i] = std::exp(logits[i]);
  std::vector<double> d0(size_t(N), 1.0), d1(size_t(E), 1.0), d1_old = d1;
  constexpr double kEps = 1e-8, kTol = 1e-4;
  double error = 1e9;
  for (int round = 0; error > kTol && round < 10000; ++round) {
    for (int64_t x = 0; x < N; ++x) {
      double sum = 0;
      for (int e = 0; e < E; ++e) sum += d1[size_t(e)] * cost[size_t(x * E + e)];
      d0[size_t(x)] = (1.0 / double(N)) / (sum + kEps);
    }
    for (int e = 0; e < E; ++e) {
      double sum = 0;
      for (int64_t x = 0; x < N; ++x) sum += d0[size_t(x)] * cost[size_t(x * E + e)];
      d1[size_t(e)] = (1.0 / double(E)) / (sum + kEps);
    }
    error = 0;
    for (int e = 0; e < E; ++e) error += std::abs(d1_old[size_t(e)] - d1[size_t(e)]);
    error /= double(E);
    d1_old = d1;
  }
  for (int64_t x = 0; x < N; ++x)
    for (int e = 0; e < E; ++e) cost[size_t(x * E + e)] *= d1[size_t(e)] * d0[size_t(x)];
  return cost;
}

RouterSettings RouterSettings::of(const TransformerConfig& c) {
  RouterSettings s;
  s.num_experts = c.num_moe_experts;
  s.topk = c.moe_router_topk;
  s.sigmoid = c.moe_router_score_function == "sigmoid";
  s.pre_softmax = c.moe_router_pre_softmax;
  s.scaling_factor = c.moe_router_topk_scaling_factor;
  s.num_groups = c.moe_router_num_groups;
  s.group_topk = c.moe_router_group_topk;
  s.capacity_factor = c.moe_expert_capacity_factor;
  s.drop_by_position = c.moe_token_drop_policy == "position";
  s.pad_to_capacity = c.moe_pad_expert_input_to_capacity;
  s.balancing = load_balancing_of(c.moe_router_load_balancing_type);
  s.aux_loss_coeff = c.moe_aux_loss_coeff;
  s.z_loss_coeff = c.moe_z_loss_coeff;
  return s;
}

int64_t expert_capacity(int64_t num_tokens, int num_experts, double capacity_factor) {
  return int64_t(std::ceil(double(num_tokens) / double(num_experts) * capacity_factor));
}

Routing route(const std::vector<double>& logits, int64_t N, const RouterSettings& s,
              const std::vector<double>& bias, bool training, const BalanceInputs& b) {
  Forward f = forward(logits, N, s, bias, training);
  Routing& r = f.r;
  const int E = s.num_experts;
  if (training && s.has_balancing_loss() && N > 0) {
    const AuxTerms t = aux_terms(logits, N, s, b);
    double sum = 0;
    for (int64_t x = 0; x < N; ++x) {
      const std::vector<double> sa = aux_scores(&logits[size_t(x * E)], s);
      for (int e = 0; e < E; ++e) sum += t.at(x, e, E) * sa[size_t(e)];
    }
    r.aux_loss_scaled = t.a * sum;
    r.load_balancing_loss = r.aux_loss_scaled / s.aux_loss_coeff;
  }
  return std::move(f.r);
}

std::vector<double> route_backward(const std::vector<double>& logits, int64_t N,
                                   const RouterSettings& s, const std::vector<double>& bias,
                                   const std::vector<double>& dprobs, double scale,
                                   const BalanceInputs& b) {
  const int E = s.num_experts;
  MG_CHECK(int64_t(dprobs.size()) == N * E, "route_backward: dprobs are not [N, E]");
  std::vector<double> dl(size_t(N * E), 0.0);
  if (N == 0) return dl;
  {
    const Forward f = forward(logits, N, s, bias, /*training=*/true);
    const double sf = s.scaling_factor > 0 ? s.scaling_factor : 1.0;
    for (int64_t x = 0; x < N; ++x) {
      const TokenChoice& c = f.choice[size_t(x)];
      std::vector<double> g(c.idx.size());
      for (size_t j = 0; j < c.idx.size(); ++j) {
        const size_t at = size_t(x * E + c.idx[j]);
        g[j] = f.kept[at] ? dprobs[at] * sf : 0.0;
      }
      choice_backward(&logits[size_t(x * E)], s, c, g, &dl[size_t(x * E)]);
    }
    if (s.has_balancing_loss()) {
      const AuxTerms t = aux_terms(logits, N, s, b);
      std::vector<double> dsa(static_cast<size_t>(E));
      for (int64_t x = 0; x < N; ++x) {
        for (int e = 0; e < E; ++e) dsa[size_t(e)] = scale * t.a * t.at(x, e, E);
        const double* l = &logits[size_t(x * E)];
        aux_scores_backward(l, s, aux_scores(l, s), dsa, &dl[size_t(x * E)]);
      }
    }
  }
  return dl;
}

double z_loss(const std::vector<double>& logits, int64_t N, int E) {
  if (N == 0) return 0;
  double sum = 0;
  for (int64_t x = 0; x < N; ++x) {
    const double lse = logsumexp(&logits[size_t(x * E)], E);
    sum += lse * lse;
  }
  return sum / double(N);
}

void z_loss_backward(const std::vector<double>& logits, int64_t N, int E, double scale,
                     std::vector<double>& dl) {
  for (int64_t x = 0; x < N; ++x) {
    const double* l = &logits[size_t(x * E)];
    const double lse = logsumexp(l, E);
    const std::vector<double> p = softmax(l, E);
    for (int e = 0; e < E; ++e) dl[size_t(x * E + e)] += scale * 2 * lse * p[size_t(e)] / double(N);
  }
}

void update_expert_bias(std::vector<double>& bias, const std::vector<double>& tokens, double rate) {
  MG_CHECK(bias.size() == tokens.size(), "update_expert_bias: sizes differ");
  if (tokens.empty()) return;
  const double mean = std::accumulate(tokens.begin(), tokens.end(), 0.0) / double(tokens.size());
  for (size_t e = 0; e < bias.size(); ++e) {
    const double off = mean - tokens[e];
    bias[e] += rate * double((off > 0) - (off < 0));
  }
}

}  // namespace megatron::model
