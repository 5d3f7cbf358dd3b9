// The server's HTTP front: one event-loop thread (epoll) owns every connection and its bounded
// buffers; complete requests go to a pool of worker threads, which run the handlers (they may
// wait for generation) and hand the responses back to the loop to write. A slow or idle client
// therefore costs a socket and a few kilobytes, never a thread, and nothing it does can delay
// another client's request.
//
// Limits, all enforced by the loop:
//   - a request (head and body) must arrive within request_timeout_ms of its first byte (408),
//     and a kept-alive connection may wait idle_timeout_ms for its next request;
//   - at most max_unauthenticated connections may be between requests or still sending a request
//     head; a new connection beyond that closes the one that has been in that state the longest
//     (a well-behaved client sends its head at once and is never the oldest), and
//     max_connections bounds them all;
//   - the head is checked (route, API key, framing, size) as soon as it has arrived, before any
//     body byte is read; bodies are bounded by HttpLimits (server_http_parser.h);
//   - pipelined requests are answered one at a time, in order; input is not read while a request
//     is being handled, so a connection never buffers more than one read beyond its request;
//   - a response must make progress within write_timeout_ms; a streamed response whose client
//     reads too slowly (more than max_stream_backlog bytes queued) is ended.
// After an error response whose body was not read, the connection is half-closed and drained for
// up to a second (lingering close), so that the client reads the response instead of a reset.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "inference/server_http_parser.h"

namespace megatron::inference {

struct HttpResponse {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;
  // A streamed body (server-sent events): called on a worker thread after the status and headers
  // are sent; each write(piece) sends one chunk and returns false once the client is gone (or
  // reads too slowly), after which the function should return.
  std::function<void(const std::function<bool(std::string_view)>& write)> stream;
};

using HttpHandler = std::function<void(const HttpRequest&, HttpResponse&)>;

// What to do with a request whose head has arrived.
struct HttpRoute {
  enum class Kind { Respond, Inline, Worker };
  Kind kind = Kind::Respond;
  HttpResponse response;  // Respond: answered now, without reading the body; the connection closes
  HttpHandler handler;    // Inline: run on the loop thread (cheap handlers); Worker: on the pool
};
// Called on the loop thread with the request head (body still empty).
using HttpRouter = std::function<HttpRoute(const HttpRequest& head)>;

struct HttpFrontOptions {
  std::string host = "127.0.0.1";
  int port = 0;  // 0: a free port
  HttpLimits limits;
  int worker_threads = 64;
  size_t max_waiting_requests = 1024;  // complete requests waiting for a worker; more get 503
  int max_connections = 1024;          // also kept below the process's file descriptor limit
  int max_unauthenticated = 256;
  // Whether a head the router accepted proves the client (true when an API key is required):
  // such a connection is no longer displaced by newcomers while its body arrives.
  bool heads_authenticate = false;
  int idle_timeout_ms = 5000;
  int request_timeout_ms = 10000;
  int write_timeout_ms = 10000;
  size_t max_stream_backlog = 4 << 20;
};

// A response as bytes, for the loop and for tests: status line, Content-Type, Content-Length (or
// Transfer-Encoding: chunked when `chunked`), the extra headers, "Connection: close" when !keep_alive.
std::string serialize_response_head(const HttpResponse& response, size_t content_length,
                                    bool keep_alive, bool chunked);

class HttpFront {
 public:
  HttpFront(HttpFrontOptions options, HttpRouter router);
  ~HttpFront();  // stop(), then joins the workers
  HttpFront(const HttpFront&) = delete;
  HttpFront& operator=(const HttpFront&) = delete;

  // Binds and listens; returns the port. Throws megatron::Error when it cannot.
  int bind();
  // Runs the event loop until stop().
  void serve();
  // From any thread: the loop closes every connection and returns. Workers still running a
  // handler finish it (the caller must make their waits end); their responses are dropped.
  void stop();
  // Joins the workers (after stop() and after whatever they wait for has been released).
  void join_workers();

  struct Stats {
    int64_t accepted = 0, evicted = 0, timed_out = 0, refused = 0, requests = 0;
  };
  Stats stats() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace megatron::inference
