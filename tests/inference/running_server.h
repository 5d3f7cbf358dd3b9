// A text generation server for tests: on a free loopback port, on its own thread, over a FakeModel
// (128 logits wide, 64 positions, logits from `fn`) and a NullTokenizer of 100 ids (EOD 99);
// stopped and joined on destruction.
#pragma once

#include <httplib.h>

#include <memory>
#include <thread>

#include "core/log.h"
#include "data/tokenizer.h"
#include "fake_model.h"
#include "inference/server.h"

namespace megatron::inference::testing {

struct RunningServer {
  static constexpr int64_t kVocab = 100, kWidth = 128, kContext = 64;

  explicit RunningServer(ServerOptions options, LogitsFn fn = hashed_logits)
      : model(kWidth, kContext, std::move(fn)), tokenizer(kVocab) {
    options.port = 0;
    set_log_level(LogLevel::Warn);  // no request log lines in test output
    server = std::make_unique<TextGenerationServer>(model, tokenizer, options);
    port = server->bind();
    thread = std::thread([this] { server->serve(); });
  }
  ~RunningServer() {
    server->stop();
    thread.join();
  }
  httplib::Client client() const {
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(60, 0);
    return c;
  }
  FakeModel model;
  data::NullTokenizer tokenizer;
  std::unique_ptr<TextGenerationServer> server;
  int port = 0;
  std::thread thread;
};

}  // namespace megatron::inference::testing
