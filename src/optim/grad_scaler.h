// Loss scaling for fp16 training (Megatron's ConstantGradScaler / DynamicGradScaler).
// Dynamic rule after every step: an overflow resets the growth tracker, spends one unit of
// hysteresis and, once hysteresis is exhausted, halves the scale (not below min_scale); a clean
// step advances the growth tracker and, after `growth_interval` clean steps in a row, doubles the
// scale and restores the hysteresis budget (only there). Static scaling never changes.
#pragma once

#include <cstdint>

namespace megatron::optim {

struct GradScalerState {
  double scale = 1.0;
  int64_t growth_tracker = 0;
  int64_t hysteresis_tracker = 0;
};

class GradScaler {
 public:
  static GradScaler constant(double scale);  // --loss-scale X (or 1.0 for fp32/bf16)
  static GradScaler dynamic(double initial_scale, double min_scale, int64_t growth_interval,
                            int64_t hysteresis, double growth_factor = 2.0,
                            double backoff_factor = 0.5);
  double scale() const { return state_.scale; }
  double inv_scale() const { return 1.0 / state_.scale; }
  bool is_dynamic() const { return dynamic_; }
  void update(bool found_inf);
  const GradScalerState& state() const { return state_; }
  void load_state(const GradScalerState& s) { state_ = s; }

 private:
  bool dynamic_ = false;
  double min_scale_ = 1.0, growth_factor_ = 2.0, backoff_factor_ = 0.5;
  int64_t growth_interval_ = 1000, hysteresis_ = 2;
  GradScalerState state_;
};

}  // namespace megatron::optim
