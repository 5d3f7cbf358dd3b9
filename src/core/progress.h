// Progress of long work (DESIGN: "long work shows progress on a terminal and plain lines in
// logs"). On a terminal (stderr) a ProgressLine is one live line redrawn in place, at most every
// 250 ms; lines logged meanwhile (log.h: log_print, log_info, ...) erase it, are written whole,
// and it is drawn again below them, so stdout and stderr stay readable together and files and
// pipes never see it. Elsewhere it is silent, or, with a plain interval, writes the same text as
// an ordinary log line at most that often. preprocess-data, pretrain-gpt, evaluate, checkpoint
// convert, inspect-data and plan --measure use it.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace megatron {

class ProgressLine {
 public:
  // enabled: the command's own switch (false: never shows anything). plain_interval_seconds > 0:
  // without a terminal, update() logs its text (log_info) at most that often.
  explicit ProgressLine(bool enabled = true, double plain_interval_seconds = 0);
  ~ProgressLine();
  ProgressLine(const ProgressLine&) = delete;
  ProgressLine& operator=(const ProgressLine&) = delete;

  bool live() const { return live_; }  // drawing on a terminal
  // True when update() would show something now (callers skip building the text otherwise).
  bool due() const;
  // Shows `text` when due (or when `force`).
  void update(const std::string& text, bool force = false);
  // Erases the live line (also done by the destructor).
  void finish();
  double elapsed() const;  // seconds since construction

 private:
  using Clock = std::chrono::steady_clock;
  bool enabled_, live_;
  double plain_interval_;
  Clock::time_point start_, last_;
  bool shown_ = false;
};

// "1h02m", "3m05s", "12s"; "?" for a negative or absurd estimate.
std::string format_duration(double seconds);
// "DONE/TOTAL UNIT (P%), R UNIT/s, ETA T" (TOTAL <= 0: "DONE UNIT, R UNIT/s").
std::string progress_text(int64_t done, int64_t total, double elapsed_seconds,
                          const std::string& unit);

// The live line's hooks inside the logger (core/log.cpp): the text redrawn after each log line;
// empty erases it.
void set_live_log_line(const std::string& text);

}  // namespace megatron
