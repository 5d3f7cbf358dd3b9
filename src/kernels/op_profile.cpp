#include "kernels/op_profile.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace megatron::ops::profile {

namespace {

struct Row {
  long calls = 0;
  double seconds = 0.0;
};

struct State {
  std::mutex mu;
  std::map<std::string, Row> rows;
  void (*sync)() = nullptr;
  DeviceTimer timer;
  std::vector<std::pair<std::string, int>> pending;  // (row, timer id) not read yet
  double first = -1.0;  // the first op's start, for the wall time
};

constexpr size_t kMaxPending = 2048;  // marks read back (one wait) when this many are queued

// Reads the pending device times into their rows (s.mu held).
void resolve(State& s) {
  for (const auto& [name, id] : s.pending) {
    Row& r = s.rows[name];
    ++r.calls;
    r.seconds += s.timer.seconds(id);
  }
  s.pending.clear();
}

State& state() {
  static State* s = new State();  // outlives the atexit report
  return *s;
}

// Ops called inside an op are counted in the outer one.
thread_local int depth = 0;

double now() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

void report() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  try {
    resolve(s);
  } catch (...) {  // the device failed: report what was read
    s.pending.clear();
  }
  if (s.rows.empty()) return;
  std::vector<std::pair<std::string, Row>> rows(s.rows.begin(), s.rows.end());
  std::sort(rows.begin(), rows.end(),
            [](const auto& a, const auto& b) { return a.second.seconds > b.second.seconds; });
  double in_ops = 0.0;
  for (const auto& r : rows) in_ops += r.second.seconds;
  const double wall = now() - s.first;
  std::fprintf(stderr, "\nop profile (MEGATRON_OP_PROFILE=1; %s)\n",
               s.timer.start ? "device time of each op, by events on its queue"
                             : "each op synchronised");
  std::fprintf(stderr, "%-32s %10s %12s %12s %7s\n", "op", "calls", "total ms", "mean us",
               "share");
  for (const auto& [name, r] : rows)
    std::fprintf(stderr, "%-32s %10ld %12.1f %12.1f %6.1f%%\n", name.c_str(), r.calls,
                 r.seconds * 1e3, r.seconds * 1e6 / double(std::max(r.calls, 1L)),
                 in_ops > 0 ? 100.0 * r.seconds / in_ops : 0.0);
  std::fprintf(stderr, "%-32s %10s %12.1f\n%-32s %10s %12.1f\n", "in ops", "", in_ops * 1e3,
               s.timer.start ? "device idle (from the first op)" : "outside ops (from the first op)",
               "", (wall - in_ops) * 1e3);
}

}  // namespace

bool enabled() {
  static const bool on = [] {
    const char* v = std::getenv("MEGATRON_OP_PROFILE");
    const bool yes = v != nullptr && std::strcmp(v, "") != 0 && std::strcmp(v, "0") != 0;
    if (yes) std::atexit(report);
    return yes;
  }();
  return on;
}

void set_device_sync(void (*sync)()) { state().sync = sync; }

void restart() {
  if (!enabled()) return;
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  try {
    resolve(s);  // frees the marks
  } catch (...) {
    s.pending.clear();
  }
  s.rows.clear();
  s.first = -1.0;
}

void set_device_timer(const DeviceTimer& timer) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  s.timer = timer;
}

Scope::Scope(const char* op) : op_(op) { begin(); }

Scope::Scope(std::string label) : op_(nullptr), label_(std::move(label)) { begin(); }

void Scope::begin() {
  if (!enabled()) return;
  State& s = state();
  if (depth++ > 0) return;
  if (s.timer.start) {
    mark_ = s.timer.start();
  } else if (s.sync) {
    s.sync();
  }
  start_ = now();
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.first < 0) s.first = start_;
}

Scope::~Scope() {
  if (!enabled()) return;
  State& s = state();
  if (--depth > 0) return;
  if (mark_ >= 0) {
    std::string name = op_ != nullptr ? std::string(op_) : label_;
    std::lock_guard<std::mutex> lock(s.mu);
    try {
      s.timer.stop(mark_);
      s.pending.emplace_back(std::move(name), mark_);
      if (s.pending.size() >= kMaxPending) resolve(s);
    } catch (...) {  // the next op reports the device's error
      s.pending.clear();
    }
    return;
  }
  try {
    if (s.sync) s.sync();
  } catch (...) {  // the next op reports the device's error
  }
  const double t = now() - start_;
  std::lock_guard<std::mutex> lock(s.mu);
  Row& r = s.rows[op_ != nullptr ? std::string(op_) : label_];
  ++r.calls;
  r.seconds += t;
}

}  // namespace megatron::ops::profile
