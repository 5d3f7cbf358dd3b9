// ProgressLine and its text helpers (progress.h); the drawing itself is in core/log.cpp, under
// the logger's lock.
#include "core/progress.h"

#include <cstdio>

#include "core/log.h"

namespace megatron {

ProgressLine::ProgressLine(bool enabled, double plain_interval_seconds)
    : enabled_(enabled),
      live_(enabled && stderr_is_terminal()),
      plain_interval_(plain_interval_seconds),
      start_(Clock::now()),
      last_(start_) {}

ProgressLine::~ProgressLine() { finish(); }

bool ProgressLine::due() const {
  if (!enabled_ || (!live_ && plain_interval_ <= 0)) return false;
  const double since = std::chrono::duration<double>(Clock::now() - last_).count();
  return live_ ? (!shown_ || since >= 0.25) : since >= plain_interval_;
}

void ProgressLine::update(const std::string& text, bool force) {
  if (!enabled_ || (!force && !due())) return;
  if (!live_ && plain_interval_ <= 0) return;
  last_ = Clock::now();
  if (live_) {
    set_live_log_line(text);
    shown_ = true;
  } else {
    log_info(text);
  }
}

double ProgressLine::elapsed() const {
  return std::chrono::duration<double>(Clock::now() - start_).count();
}

void ProgressLine::finish() {
  if (live_ && shown_) set_live_log_line("");
  shown_ = false;
}

std::string format_duration(double s) {
  if (!(s >= 0) || s > 1e7) return "?";
  const int64_t t = int64_t(s + 0.5);
  char buf[48];
  if (t >= 3600)
    std::snprintf(buf, sizeof buf, "%lldh%02lldm", (long long)(t / 3600), (long long)(t / 60 % 60));
  else if (t >= 60)
    std::snprintf(buf, sizeof buf, "%lldm%02llds", (long long)(t / 60), (long long)(t % 60));
  else
    std::snprintf(buf, sizeof buf, "%llds", (long long)t);
  return buf;
}

std::string progress_text(int64_t done, int64_t total, double elapsed, const std::string& unit) {
  const double rate = elapsed > 0 ? double(done) / elapsed : 0;
  char buf[256];
  if (total > 0) {
    const double eta = rate > 0 ? double(total - done) / rate : -1;
    std::snprintf(buf, sizeof buf, "%lld/%lld %s (%.1f%%), %.1f %s/s, ETA %s", (long long)done,
                  (long long)total, unit.c_str(), 100.0 * double(done) / double(total), rate,
                  unit.c_str(), format_duration(eta).c_str());
  } else {
    std::snprintf(buf, sizeof buf, "%lld %s, %.1f %s/s", (long long)done, unit.c_str(), rate,
                  unit.c_str());
  }
  return buf;
}

}  // namespace megatron
