// Learning-rate and weight-decay schedule (Megatron's OptimizerParamScheduler).
// The schedule counts samples: step(increment) is called after every successful optimizer step
// with the global batch size; iteration-based flags are converted to samples by the caller
// (x global batch). Warmup is linear from lr_warmup_init to max_lr, then constant, linear,
// cosine, inverse-square-root or WSD decay to min_lr; past decay_steps the LR is min_lr.
#pragma once

#include <cstdint>
#include <string>

namespace megatron::optim {

enum class LRDecayStyle { Constant, Linear, Cosine, InverseSquareRoot, WSD };
enum class WSDDecayStyle { Exponential, Linear, Cosine, MinusSqrt };
enum class WDIncrStyle { Constant, Linear, Cosine };

LRDecayStyle parse_lr_decay_style(const std::string& s);    // Megatron's names; Error otherwise
WSDDecayStyle parse_wsd_decay_style(const std::string& s);
WDIncrStyle parse_wd_incr_style(const std::string& s);
// Megatron's names of each style (what the parsers read).
const char* lr_decay_style_name(LRDecayStyle s);
const char* wsd_decay_style_name(WSDDecayStyle s);
const char* wd_incr_style_name(WDIncrStyle s);

struct LRSchedulerConfig {
  double max_lr = 0.0, min_lr = 0.0, lr_warmup_init = 0.0;
  int64_t lr_warmup_steps = 0;  // samples
  int64_t lr_decay_steps = 0;   // samples (> 0)
  LRDecayStyle decay_style = LRDecayStyle::Linear;
  int64_t wsd_decay_steps = 0;  // samples of the WSD anneal phase
  WSDDecayStyle wsd_decay_style = WSDDecayStyle::Exponential;
  double start_wd = 0.01, end_wd = 0.01;
  int64_t wd_incr_steps = 0;  // samples
  WDIncrStyle wd_incr_style = WDIncrStyle::Constant;
  // --decoupled-lr / --decoupled-min-lr (Megatron's is_decoupled_lr parameter group: the word
  // embedding and the output layer): the same warmup from lr_warmup_init and the same decay, to
  // and from these values instead of max_lr / min_lr. Negative: no decoupled group.
  double decoupled_max_lr = -1, decoupled_min_lr = -1;
  bool has_decoupled_lr() const { return decoupled_max_lr >= 0; }
};

class LRScheduler {
 public:
  explicit LRScheduler(const LRSchedulerConfig& cfg);  // validates (Error on bad values)
  double lr() const;            // at the current step
  // Megatron's get_lr(param_group): the schedule for a group with its own max_lr / min_lr.
  double lr(double max_lr, double min_lr) const;
  // The decoupled group's LR (config().has_decoupled_lr() must hold).
  double decoupled_lr() const;
  double weight_decay() const;  // at the current step
  void step(int64_t increment) { num_steps_ += increment; }
  int64_t num_steps() const { return num_steps_; }
  void set_num_steps(int64_t n) { num_steps_ = n; }
  const LRSchedulerConfig& config() const { return cfg_; }

 private:
  LRSchedulerConfig cfg_;
  int64_t num_steps_ = 0;
};

}  // namespace megatron::optim
