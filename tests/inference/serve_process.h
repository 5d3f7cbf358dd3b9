// A `megatron serve` child process for end-to-end tests: started with --port 0 (a free port; the
// log line "serving on http://127.0.0.1:PORT" names it), stopped with SIGTERM by stop() and
// killed when the object goes (a failed assertion must not leave a server behind).
#pragma once

#include <httplib.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>

#include "test_util.h"

namespace megatron::inference::testing {

class ServeProcess {
 public:
  // `args`: everything after "serve" but --port; `launcher`: what goes before "serve" (e.g.
  // "launch --nproc-per-node 4 --"). Waits up to 60 s for the log line.
  ServeProcess(const std::string& args, std::filesystem::path log_file,
               const std::string& launcher = "")
      : log_(std::move(log_file)) {
    // Ranks of a launch share the cores: one OpenMP thread each.
    const std::string cmd = std::string(launcher.empty() ? "" : "OMP_NUM_THREADS=1 ") + "exec '" +
                            megatron::testing::cli_path().string() +
                            "' " + launcher + " serve " + args +
                            " --port 0 > '" + log_.string() + "' 2>&1";
    std::filesystem::remove(log_);  // an old server's port line must not be read
    pid_ = fork();
    if (pid_ == 0) {
      execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    const std::string line = "serving on http://127.0.0.1:";
    for (int i = 0; i < 1200 && port_ == 0 && pid_ > 0; ++i) {
      const std::string text = log();
      const size_t at = text.find(line);
      if (at != std::string::npos) {
        port_ = std::atoi(text.c_str() + at + line.size());
      } else {
        if (::waitpid(pid_, &status_, WNOHANG) == pid_) {  // exited before serving
          pid_ = -1;
          break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
    }
    if (port_ > 0) client_ = std::make_unique<httplib::Client>("127.0.0.1", port_);
    if (client_) client_->set_read_timeout(120, 0);
  }
  ~ServeProcess() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  ServeProcess(const ServeProcess&) = delete;
  ServeProcess& operator=(const ServeProcess&) = delete;

  int port() const { return port_; }
  int status() const { return status_; }  // waitpid's status after stop()  // 0: it did not come up (see log())
  std::string log() const {
    return std::filesystem::exists(log_) ? megatron::testing::read_file(log_) : std::string();
  }
  httplib::Result put_api(const std::string& json_body) {
    return client_->Put("/api", json_body, "application/json");
  }
  // SIGTERM and wait: true when the server exited with status 0.
  bool stop() {
    if (pid_ <= 0) return false;
    ::kill(pid_, SIGTERM);
    ::waitpid(pid_, &status_, 0);
    pid_ = -1;
    return WIFEXITED(status_) && WEXITSTATUS(status_) == 0;
  }

 private:
  std::filesystem::path log_;
  pid_t pid_ = -1;
  int port_ = 0;
  int status_ = 0;
  std::unique_ptr<httplib::Client> client_;
};

}  // namespace megatron::inference::testing
