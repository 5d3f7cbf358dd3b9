// Constant and dynamic loss scalers; see grad_scaler.h for the update rule.
#include "optim/grad_scaler.h"

#include <algorithm>

#include "core/error.h"

namespace megatron::optim {

GradScaler GradScaler::constant(double scale) {
  MG_REQUIRE(scale > 0.0, "--loss-scale must be > 0 (got ", scale, ")");
  GradScaler g;
  g.state_.scale = scale;
  return g;
}

GradScaler GradScaler::dynamic(double initial_scale, double min_scale, int64_t growth_interval,
                               int64_t hysteresis, double growth_factor, double backoff_factor) {
  MG_REQUIRE(initial_scale > 0.0, "--initial-loss-scale must be > 0 (got ", initial_scale, ")");
  MG_REQUIRE(min_scale > 0.0 && min_scale <= initial_scale, "--min-loss-scale (", min_scale,
             ") must be > 0 and <= --initial-loss-scale (", initial_scale, ")");
  MG_REQUIRE(growth_interval > 0, "--loss-scale-window must be > 0 (got ", growth_interval, ")");
  MG_REQUIRE(hysteresis > 0, "--hysteresis must be > 0 (got ", hysteresis, ")");
  MG_CHECK(growth_factor > 1.0 && backoff_factor > 0.0 && backoff_factor < 1.0,
           "bad scaler factors");
  GradScaler g;
  g.dynamic_ = true;
  g.min_scale_ = min_scale;
  g.growth_factor_ = growth_factor;
  g.backoff_factor_ = backoff_factor;
  g.growth_interval_ = growth_interval;
  g.hysteresis_ = hysteresis;
  g.state_ = {initial_scale, 0, hysteresis};
  return g;
}

void GradScaler::update(bool found_inf) {
  if (!dynamic_) return;
  if (found_inf) {
    state_.growth_tracker = 0;
    state_.hysteresis_tracker -= 1;
    if (state_.hysteresis_tracker <= 0)
      state_.scale = std::max(state_.scale * backoff_factor_, min_scale_);
  } else {
    state_.growth_tracker += 1;
    if (state_.growth_tracker == growth_interval_) {
      state_.growth_tracker = 0;
      state_.hysteresis_tracker = hysteresis_;
      state_.scale *= growth_factor_;
    }
  }
}

}  // namespace megatron::optim
