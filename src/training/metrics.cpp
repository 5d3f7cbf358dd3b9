// FLOPs formula and log-line formatting (Megatron's field order and number formats).
#include "training/metrics.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>

#include "core/error.h"
#include "model/layer_spec.h"
#include "model/moe/moe_pattern.h"

namespace megatron::training {

double flops_per_iteration(const FlopsModel& m, int64_t global_batch_size) {
  const double B = double(global_batch_size), s = double(m.seq_length), h = double(m.hidden_size);
  const double n = double(m.num_attention_heads);
  const double d = m.kv_channels > 0 ? double(m.kv_channels) : h / n;
  const double g = m.num_query_groups > 0 ? double(m.num_query_groups) : n;
  const double q = d * n, kv = d * g;
  const double F = m.ffn_hidden_size > 0 ? double(m.ffn_hidden_size) : 4 * h;
  const double f_exp = m.swiglu ? 3.0 : 2.0;
  const double L = double(m.num_layers), V = double(m.padded_vocab_size);
  // The MLP widths summed over layers: dense layers F, MoE layers topk routed experts' widths
  // plus the shared expert's.
  const double Lmoe = double(m.num_moe_layers);
  const double widths = F * (L - Lmoe) + Lmoe * (double(m.moe_ffn_hidden_size * m.moe_router_topk) +
                                                 double(m.moe_shared_expert_intermediate_size));
  return B * s * (6 * h * widths * f_exp + 6 * L * (h * (q + 2 * kv) + q * h) + 6 * h * V) +
         B * s * s * 6 * q * L;
}

FlopsModel flops_model(const model::TransformerConfig& c) {
  int64_t moe_layers = 0;
  if (c.num_moe_experts > 0)
    for (int v : model::moe_layer_pattern(c.moe_layer_freq, c.num_layers)) moe_layers += v;
  return {c.num_layers,          c.hidden_size,
          c.num_attention_heads, c.kv_channels,
          c.num_query_groups,    c.ffn(),
          c.seq_length,          c.padded_vocab_size,
          model::activation_kind(c.activation).gated,
          moe_layers,            c.moe_ffn(),
          c.moe_router_topk,     c.moe_shared_expert_intermediate_size};
}

namespace {
std::string timestamp() {
  auto now = std::chrono::system_clock::now();
  std::time_t t = std::chrono::system_clock::to_time_t(now);
  auto us = std::chrono::duration_cast<std::chrono::microseconds>(now.time_since_epoch()).count() %
            1000000;
  std::tm tm{};
  localtime_r(&t, &tm);
  char buf[64];
  std::snprintf(buf, sizeof buf, "[%04d-%02d-%02d %02d:%02d:%02d.%06lld]", tm.tm_year + 1900,
                tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, (long long)us);
  return buf;
}
}  // namespace

std::string format_log_line(const IntervalStats& s) {
  char buf[1024];
  std::string out = timestamp();
  std::snprintf(buf, sizeof buf, " iteration %8lld/%8lld | consumed samples: %12lld | ",
                (long long)s.iteration, (long long)s.train_iters, (long long)s.consumed_samples);
  out += buf;
  std::snprintf(buf, sizeof buf, "elapsed time per iteration (ms): %.1f | ", s.elapsed_ms_per_iter);
  out += buf;
  if (s.log_throughput) {
    std::snprintf(buf, sizeof buf, "throughput per GPU (TFLOP/s/GPU): %.1f | ", s.tflops_per_device);
    out += buf;
  }
  std::snprintf(buf, sizeof buf, "tokens per second: %.1f | learning rate: %.6E | ", s.tokens_per_second,
                s.learning_rate);
  out += buf;
  if (s.decoupled_learning_rate) {  // Megatron: after the main one, with --decoupled-lr
    std::snprintf(buf, sizeof buf, "decoupled learning rate: %.6E | ", *s.decoupled_learning_rate);
    out += buf;
  }
  std::snprintf(buf, sizeof buf, "global batch size: %5lld | ", (long long)s.global_batch_size);
  out += buf;
  std::snprintf(buf, sizeof buf, "lm loss: %.6E | ", s.lm_loss);
  out += buf;
  for (const auto& [name, value] : s.more_losses) {
    std::snprintf(buf, sizeof buf, "%s: %.6E | ", name.c_str(), value);
    out += buf;
  }
  std::snprintf(buf, sizeof buf, "loss scale: %.1f | ", s.loss_scale);
  out += buf;
  if (!std::isnan(s.grad_norm)) {
    std::snprintf(buf, sizeof buf, "grad norm: %.3f | ", s.grad_norm);
    out += buf;
  }
  std::snprintf(buf, sizeof buf, "number of skipped iterations: %3lld | number of nan iterations: %3lld |",
                (long long)s.skipped_iterations, (long long)s.nan_iterations);
  out += buf;
  return out;
}

NamedLosses named_losses(const std::vector<std::string>& names, const model::LossResult& sums) {
  MG_CHECK(!names.empty() && sums.more.size() + 1 >= names.size(), "named_losses: ", names.size(),
           " names for ", sums.more.size() + 1, " losses");
  NamedLosses out = {{names[0], sums.loss_sum / std::max(sums.num_tokens, 1.0)}};
  for (size_t k = 1; k < names.size(); ++k)
    out.emplace_back(names[k], sums.more[k - 1].sum / std::max(sums.more[k - 1].count, 1.0));
  return out;
}

std::string format_evaluation_line(const std::string& prefix, const NamedLosses& losses) {
  std::string out = " validation loss at " + prefix + " | ";
  char buf[512];
  for (const auto& [name, value] : losses) {
    std::snprintf(buf, sizeof buf, "%s value: %.6E | %s PPL: %.6E | ", name.c_str(), value,
                  name.c_str(), std::exp(std::min(20.0, value)));
    out += buf;
  }
  return out;
}

std::string format_validation_line(int64_t iteration, const NamedLosses& losses) {
  return format_evaluation_line(str("iteration ", iteration), losses);
}

std::string format_evaluation_line(const std::string& prefix, double loss) {
  return format_evaluation_line(prefix, NamedLosses{{"lm loss", loss}});
}

std::string format_validation_line(int64_t iteration, double loss) {
  return format_validation_line(iteration, NamedLosses{{"lm loss", loss}});
}

}  // namespace megatron::training
