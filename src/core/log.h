// Logging with levels and a rank prefix. Lines go to stderr, except `log_print` which writes to
// stdout (training log lines and summaries users pipe into files). Thread-safe per line.
#pragma once

#include <string>

#include "core/error.h"

namespace megatron {

enum class LogLevel { Debug = 0, Info = 1, Warn = 2, Error = 3, Off = 4 };

void set_log_level(LogLevel level);
LogLevel log_level();
LogLevel log_level_from_name(const std::string& name);  // "debug", "info", "warn", "error"
// Rank prefix ("[rank 3] ") is printed when the world has more than one rank.
void set_log_rank(int rank, int world_size);
void log_message(LogLevel level, const std::string& msg);
void log_print(const std::string& msg);  // stdout, always, no prefix
// True when stderr is a terminal (progress lines may use '\r').
bool stderr_is_terminal();

template <typename... Args>
void log_debug(Args&&... a) {
  if (log_level() <= LogLevel::Debug) log_message(LogLevel::Debug, str(std::forward<Args>(a)...));
}
template <typename... Args>
void log_info(Args&&... a) {
  if (log_level() <= LogLevel::Info) log_message(LogLevel::Info, str(std::forward<Args>(a)...));
}
template <typename... Args>
void log_warn(Args&&... a) {
  if (log_level() <= LogLevel::Warn) log_message(LogLevel::Warn, str(std::forward<Args>(a)...));
}
template <typename... Args>
void log_error(Args&&... a) {
  if (log_level() <= LogLevel::Error) log_message(LogLevel::Error, str(std::forward<Args>(a)...));
}

}  // namespace megatron
