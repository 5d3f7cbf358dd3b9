// The text generation server: routes, authentication and error responses over the event-driven
// HTTP front (server_http.h: deadlines, connection caps, bounded bodies, pipelining). Request
// bodies become jobs through the task layer (server_api.h); jobs run on the scheduler
// (server_queue.h), which owns the model.
//
// Endpoints: PUT /api (Megatron), POST /v1/completions (OpenAI, optionally streamed as
// server-sent events), GET /health. Every error is a JSON body {"error": "..."}: 400 for bad
// requests, 401 without the API key, 404/405 for unknown routes or methods, 413 for bodies over
// the limit, 503 when the queue is full, 500 only for engine failures; the transport adds 408
// (request not received in time), 415 (compressed body), 431 (head too large), 501/505.
// The API key is checked as soon as a request's head has arrived, before its body is read.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "inference/language_model.h"

namespace megatron::data {
class Tokenizer;
}

namespace megatron::inference {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 5000;              // 0 picks a free port (see bound_port())
  std::string api_key;          // when set, every request needs "Authorization: Bearer <key>"
  int max_batch_size = 8;       // rows decoded together
  double batch_window_ms = 0.0; // how long the scheduler waits for more requests to fill a batch
  size_t max_queue_size = 64;   // jobs waiting; more get 503
  size_t max_request_bytes = 1 << 20;  // decoded body (chunked bodies included)
  int64_t max_tokens_to_generate = 1024;
  int http_threads = 64;        // workers running request handlers (they wait for generation)
  int request_timeout_ms = 10000;  // a whole request (head and body) from its first byte
  int idle_timeout_ms = 5000;      // a kept-alive connection waiting for its next request
  int max_connections = 1024;
  int max_unauthenticated = 256;   // connections between requests or still sending a head
  // --seed (Megatron's, default 1234, > 0): Megatron seeds its process-wide generator with it at
  // start-up, and a request without "random_seed" (/api; "seed" for /v1/completions) samples from
  // that generator where earlier requests left it. Here such a request takes the next seed of
  // the sequence `seed` starts (one per request, in the order requests are parsed), so servers
  // started with the same --seed answer the same requests in the same order alike.
  uint64_t seed = 1234;
};

// True for loopback names and addresses (127.0.0.0/8, ::1, localhost).
bool is_loopback_host(const std::string& host);

class TextGenerationServer {
 public:
  // Throws megatron::Error for invalid options (e.g. a non-loopback host without an API key).
  TextGenerationServer(LanguageModel& model, const data::Tokenizer& tokenizer,
                       ServerOptions options);
  ~TextGenerationServer();
  TextGenerationServer(const TextGenerationServer&) = delete;
  TextGenerationServer& operator=(const TextGenerationServer&) = delete;

  // Binds the socket; returns the port. Throws megatron::Error when it cannot.
  int bind();
  int bound_port() const { return port_; }
  // Serves until stop() (from another thread or a signal handler's thread).
  void serve();
  void stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  int port_ = -1;
};

}  // namespace megatron::inference
