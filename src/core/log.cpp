#include "core/log.h"

#include <sys/ioctl.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <mutex>
#include <string>

#include "core/progress.h"

namespace megatron {

namespace {
std::atomic<LogLevel> g_level{LogLevel::Info};
int g_rank = 0;
int g_world = 1;
std::mutex g_mutex;
std::string g_live_line;  // the progress line shown on the terminal (progress.h), or empty

// Around every log line: the live line is erased before and drawn again after, under g_mutex.
void erase_live_line() {
  if (!g_live_line.empty()) std::fputs("\r\x1b[K", stderr);
}
void redraw_live_line() {
  if (g_live_line.empty()) return;
  std::fputs(g_live_line.c_str(), stderr);
  std::fflush(stderr);
}
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
  erase_live_line();
  if (level == LogLevel::Info)
    std::fprintf(stderr, "%s%s\n", prefix.c_str(), msg.c_str());
  else
    std::fprintf(stderr, "%s%s: %s\n", prefix.c_str(), names[int(level)], msg.c_str());
  std::fflush(stderr);
  redraw_live_line();
}

void log_print(const std::string& msg) {
  std::lock_guard<std::mutex> lock(g_mutex);
  erase_live_line();
  std::fflush(stderr);
  std::fwrite(msg.data(), 1, msg.size(), stdout);
  std::fputc('\n', stdout);
  std::fflush(stdout);
  redraw_live_line();
}

void set_live_log_line(const std::string& text) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (text.empty() && g_live_line.empty()) return;
  std::fputs("\r\x1b[K", stderr);
  g_live_line = text;
  // One terminal row: a wrapped line could not be erased by "\r ESC[K".
  winsize ws{};
  if (ioctl(STDERR_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 1 && g_live_line.size() >= ws.ws_col)
    g_live_line.resize(size_t(ws.ws_col) - 1);
  redraw_live_line();
  std::fflush(stderr);
}

bool stderr_is_terminal() { return isatty(STDERR_FILENO) == 1; }

}  // namespace megatron
