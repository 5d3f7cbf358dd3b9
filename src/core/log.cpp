#include "core/log.h"

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <mutex>

namespace megatron {

namespace {
std::atomic<LogLevel> g_level{LogLevel::Info};
int g_rank = 0;
int g_world = 1;
std::mutex g_mutex;
}  // namespace

void set_log_level(LogLevel level) { g_level = level; }
LogLevel log_level() { return g_level; }

LogLevel log_level_from_name(const std::string& name) {
  if (name == "debug") return LogLevel::Debug;
  if (name == "info") return LogLevel::Info;
  if (name == "warn" || name == "warning") return LogLevel::Warn;
  if (name == "error") return LogLevel::Error;
  if (name == "off") return LogLevel::Off;
  MG_THROW("unknown log level '", name, "' (expected debug, info, warn, error or off)");
}

void set_log_rank(int rank, int world_size) {
  g_rank = rank;
  g_world = world_size;
}

void log_message(LogLevel level, const std::string& msg) {
  static const char* names[] = {"debug", "info", "warning", "error"};
  std::lock_guard<std::mutex> lock(g_mutex);
  std::string prefix = g_world > 1 ? str("[rank ", g_rank, "] ") : std::string();
  if (level == LogLevel::Info)
    std::fprintf(stderr, "%s%s\n", prefix.c_str(), msg.c_str());
  else
    std::fprintf(stderr, "%s%s: %s\n", prefix.c_str(), names[int(level)], msg.c_str());
  std::fflush(stderr);
}

void log_print(const std::string& msg) {
  std::lock_guard<std::mutex> lock(g_mutex);
  std::fwrite(msg.data(), 1, msg.size(), stdout);
  std::fputc('\n', stdout);
  std::fflush(stdout);
}

bool stderr_is_terminal() { return isatty(STDERR_FILENO) == 1; }

}  // namespace megatron
