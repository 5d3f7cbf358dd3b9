// Megatron's LR / weight-decay schedule formulas (optimizer_param_scheduler.py), in samples.
#include "optim/lr_scheduler.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace megatron::optim {

LRDecayStyle parse_lr_decay_style(const std::string& s) {
  if (s == "constant") return LRDecayStyle::Constant;
  if (s == "linear") return LRDecayStyle::Linear;
  if (s == "cosine") return LRDecayStyle::Cosine;
  if (s == "inverse-square-root") return LRDecayStyle::InverseSquareRoot;
  if (s == "WSD") return LRDecayStyle::WSD;
  MG_THROW("--lr-decay-style: unknown value '", s,
           "'; use one of constant, linear, cosine, inverse-square-root, WSD");
}

const char* lr_decay_style_name(LRDecayStyle s) {
  switch (s) {
    case LRDecayStyle::Constant: return "constant";
    case LRDecayStyle::Linear: return "linear";
    case LRDecayStyle::Cosine: return "cosine";
    case LRDecayStyle::InverseSquareRoot: return "inverse-square-root";
    case LRDecayStyle::WSD: return "WSD";
  }
  return "?";
}

const char* wsd_decay_style_name(WSDDecayStyle s) {
  switch (s) {
    case WSDDecayStyle::Exponential: return "exponential";
    case WSDDecayStyle::Linear: return "linear";
    case WSDDecayStyle::Cosine: return "cosine";
    case WSDDecayStyle::MinusSqrt: return "minus_sqrt";
  }
  return "?";
}

const char* wd_incr_style_name(WDIncrStyle s) {
  switch (s) {
    case WDIncrStyle::Constant: return "constant";
    case WDIncrStyle::Linear: return "linear";
    case WDIncrStyle::Cosine: return "cosine";
  }
  return "?";
}

WSDDecayStyle parse_wsd_decay_style(const std::string& s) {
  if (s == "exponential") return WSDDecayStyle::Exponential;
  if (s == "linear") return WSDDecayStyle::Linear;
  if (s == "cosine") return WSDDecayStyle::Cosine;
  if (s == "minus_sqrt") return WSDDecayStyle::MinusSqrt;
  MG_THROW("--lr-wsd-decay-style: unknown value '", s,
           "'; use one of exponential, linear, cosine, minus_sqrt");
}

WDIncrStyle parse_wd_incr_style(const std::string& s) {
  if (s == "constant") return WDIncrStyle::Constant;
  if (s == "linear") return WDIncrStyle::Linear;
  if (s == "cosine") return WDIncrStyle::Cosine;
  MG_THROW("--weight-decay-incr-style: unknown value '", s,
           "'; use one of constant, linear, cosine");
}

LRScheduler::LRScheduler(const LRSchedulerConfig& cfg) : cfg_(cfg) {
  MG_REQUIRE(cfg.max_lr >= 0.0, "--lr must be >= 0 (got ", cfg.max_lr, ")");
  MG_REQUIRE(cfg.min_lr >= 0.0 && cfg.min_lr <= cfg.max_lr, "--min-lr (", cfg.min_lr,
             ") must be between 0 and --lr (", cfg.max_lr, ")");
  MG_REQUIRE(cfg.lr_decay_steps > 0, "LR decay steps must be > 0 (got ", cfg.lr_decay_steps,
             "); set --lr-decay-iters/--lr-decay-samples or --train-iters/--train-samples");
  MG_REQUIRE(cfg.lr_warmup_steps >= 0 && cfg.lr_warmup_steps < cfg.lr_decay_steps,
             "LR warmup (", cfg.lr_warmup_steps, " samples) must be shorter than the decay (",
             cfg.lr_decay_steps, " samples); lower --lr-warmup-iters/samples/fraction");
  if (cfg.decay_style == LRDecayStyle::WSD)
    MG_REQUIRE(cfg.wsd_decay_steps > 0 && cfg.wsd_decay_steps <= cfg.lr_decay_steps,
               "--lr-decay-style WSD needs --lr-wsd-decay-iters/samples in (0, decay steps]");
  if (cfg.has_decoupled_lr())
    MG_REQUIRE(cfg.decoupled_min_lr >= 0.0 && cfg.decoupled_min_lr <= cfg.decoupled_max_lr,
               "--decoupled-min-lr (", cfg.decoupled_min_lr, "; --min-lr when not given) must be "
               "between 0 and --decoupled-lr (", cfg.decoupled_max_lr, ")");
  MG_REQUIRE(cfg.start_wd >= 0.0 && cfg.end_wd >= cfg.start_wd,
             "--end-weight-decay (", cfg.end_wd, ") must be >= --start-weight-decay (",
             cfg.start_wd, ") >= 0");
}

double LRScheduler::weight_decay() const {
  // Megatron asserts start == end for the constant style; the value is end_wd.
  if (cfg_.wd_incr_style == WDIncrStyle::Constant || cfg_.wd_incr_steps <= 0) return cfg_.end_wd;
  if (num_steps_ > cfg_.wd_incr_steps) return cfg_.end_wd;
  const double r = double(num_steps_) / double(cfg_.wd_incr_steps);
  const double delta = cfg_.end_wd - cfg_.start_wd;
  const double c = cfg_.wd_incr_style == WDIncrStyle::Linear ? r
                                                             : 0.5 * (std::cos(M_PI * (1 - r)) + 1.0);
  return cfg_.start_wd + c * delta;
}

double LRScheduler::lr() const { return lr(cfg_.max_lr, cfg_.min_lr); }

double LRScheduler::decoupled_lr() const {
  MG_CHECK(cfg_.has_decoupled_lr(), "decoupled_lr() without --decoupled-lr");
  return lr(cfg_.decoupled_max_lr, cfg_.decoupled_min_lr);
}

double LRScheduler::lr(double max_lr, double min_lr) const {
  const int64_t W = cfg_.lr_warmup_steps, D = cfg_.lr_decay_steps, k = num_steps_;
  if (W > 0 && k <= W) return cfg_.lr_warmup_init + (max_lr - cfg_.lr_warmup_init) * double(k) / double(W);
  if (cfg_.decay_style == LRDecayStyle::Constant) return max_lr;
  if (k > D) return min_lr;
  if (cfg_.decay_style == LRDecayStyle::InverseSquareRoot) {
    const double warm = double(std::max<int64_t>(W, 1)), num = double(std::max<int64_t>(k, 1));
    return std::max(min_lr, max_lr * std::sqrt(warm) / std::sqrt(num));
  }
  const double r = double(k - W) / double(D - W);
  double c = 0.0;
  switch (cfg_.decay_style) {
    case LRDecayStyle::Linear: c = 1.0 - r; break;
    case LRDecayStyle::Cosine: c = 0.5 * (std::cos(M_PI * r) + 1.0); break;
    case LRDecayStyle::WSD: {
      const int64_t anneal_start = D - cfg_.wsd_decay_steps;
      if (k <= anneal_start) {
        c = 1.0;
      } else {
        const double q = double(k - anneal_start) / double(cfg_.wsd_decay_steps);
        switch (cfg_.wsd_decay_style) {
          case WSDDecayStyle::Exponential: c = 2.0 * std::pow(0.5, q) - 1.0; break;
          case WSDDecayStyle::Linear: c = 1.0 - q; break;
          case WSDDecayStyle::Cosine: c = 0.5 * (std::cos(M_PI * q) + 1.0); break;
          case WSDDecayStyle::MinusSqrt: c = 1.0 - std::sqrt(q); break;
        }
      }
      break;
    }
    default: MG_CHECK(false, "unhandled LR decay style");
  }
  return min_lr + c * (max_lr - min_lr);
}

}  // namespace megatron::optim
