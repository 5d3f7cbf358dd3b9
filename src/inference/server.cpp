// The text generation server: routes, API key and error responses over the HTTP front.
#include "inference/server.h"

#include <arpa/inet.h>
#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include <condition_variable>
#include <mutex>
#include <utility>

#include "core/error.h"
#include "core/log.h"
#include "data/tokenizer.h"
#include "inference/server_api.h"
#include "inference/server_http.h"
#include "inference/server_queue.h"

namespace megatron::inference {

bool is_loopback_host(const std::string& host) {
  if (host == "localhost" || host == "::1" || host == "[::1]") return true;
  in_addr addr{};
  if (inet_pton(AF_INET, host.c_str(), &addr) == 1) return (ntohl(addr.s_addr) >> 24) == 127;
  return false;
}

namespace {

void send_error(HttpResponse& res, int status, const std::string& message) {
  res.status = status;
  res.content_type = "application/json";
  res.body = dump_json(nlohmann::json{{"error", message}});
}

HttpResponse error_response(int status, const std::string& message) {
  HttpResponse res;
  send_error(res, status, message);
  return res;
}

bool same_secret(const std::string& a, const std::string& b) {
  // Constant time in the length of the expected key.
  unsigned diff = unsigned(a.size() != b.size());
  for (size_t i = 0; i < b.size(); ++i) diff |= unsigned(uint8_t(i < a.size() ? a[i] : 0) ^ uint8_t(b[i]));
  return diff == 0;
}

// Parsing a request builds its JSON document (up to tens of bytes per body byte) and tokenizes
// its prompts. Bodies of kLargeBody bytes or more are parsed kSlots at a time, so a burst of large
// bodies holds at most kSlots documents at once however many workers take them. The allocator is
// told to keep blocks of 256 KiB and more in mappings of their own (returned when freed) and to
// use at most kArenas per-thread heaps (each worker would otherwise keep a document's worth in its
// own), and when the last large body of a burst is done its free memory is given back to the
// system (glibc's malloc_trim): the resident size returns near its baseline after a burst instead
// of staying at its peak. (64 concurrent 1 MiB bodies: peak 288 MiB instead of 1.3 GiB, and 12 MB
// left instead of 1.15 GB; bench/RESULTS.md.)
class ParseGate {
 public:
  static constexpr size_t kLargeBody = 64 << 10;
  static constexpr int kSlots = 4;
  static constexpr int kArenas = 8;

  ParseGate() {
#if defined(__GLIBC__)
    // A fixed threshold (glibc's adaptive one would rise to the size of a body and keep bodies in
    // the heap after a burst) and a bounded number of heaps; see above.
    mallopt(M_MMAP_THRESHOLD, 256 << 10);
    mallopt(M_ARENA_MAX, kArenas);
#endif
  }

  class Pass {
   public:
    explicit Pass(ParseGate* gate) : gate_(gate) {}
    Pass(Pass&& o) noexcept : gate_(std::exchange(o.gate_, nullptr)) {}
    Pass& operator=(Pass&&) = delete;
    ~Pass() {
      if (gate_) gate_->leave();
    }

   private:
    ParseGate* gate_;
  };

  // Holds a slot until the Pass is destroyed (no slot for a small body).
  Pass enter(size_t body_bytes) {
    if (body_bytes < kLargeBody) return Pass(nullptr);
    std::unique_lock lock(mutex_);
    ++waiting_;
    cv_.wait(lock, [&] { return busy_ < kSlots; });
    --waiting_;
    ++busy_;
    return Pass(this);
  }

 private:
  void leave() {
    bool last = false;
    {
      std::lock_guard lock(mutex_);
      --busy_;
      last = busy_ == 0 && waiting_ == 0;
    }
    cv_.notify_one();
#if defined(__GLIBC__)
    if (last) malloc_trim(0);
#else
    (void)last;
#endif
  }

  std::mutex mutex_;
  std::condition_variable cv_;
  int busy_ = 0, waiting_ = 0;
};

struct Endpoint {
  const char* path;
  const char* method;
  HttpRoute::Kind kind;
};
// /health runs on the event loop (it only reads counters); the others on the workers.
constexpr Endpoint kEndpoints[] = {{"/api", "PUT", HttpRoute::Kind::Worker},
                                   {"/v1/completions", "POST", HttpRoute::Kind::Worker},
                                   {"/completions", "POST", HttpRoute::Kind::Worker},
                                   {"/health", "GET", HttpRoute::Kind::Inline}};

}  // namespace

struct TextGenerationServer::Impl {
  Impl(LanguageModel& model, const data::Tokenizer& tokenizer, ServerOptions o)
      : options(std::move(o)),
        scheduler(model, tokenizer.vocab_size(), SpecialTokens::from_tokenizer(tokenizer),
                  options.max_batch_size, options.max_queue_size, options.batch_window_ms) {
    ctx.tokenizer = &tokenizer;
    ctx.vocab = tokenizer.vocab_size();
    ctx.max_sequence_length = model.max_sequence_length();
    ctx.encoder_decoder = model.encoder_decoder();
    ctx.max_tokens_to_generate = options.max_tokens_to_generate;
    seed_base = options.seed;
    HttpFrontOptions f;
    f.host = options.host;
    f.port = options.port;
    f.limits.max_body_bytes = options.max_request_bytes;
    f.worker_threads = std::max(1, options.http_threads);
    f.max_connections = options.max_connections;
    f.max_unauthenticated = options.max_unauthenticated;
    f.request_timeout_ms = options.request_timeout_ms;
    f.idle_timeout_ms = options.idle_timeout_ms;
    f.heads_authenticate = !options.api_key.empty();
    front = std::make_unique<HttpFront>(f, [this](const HttpRequest& head) { return route(head); });
  }

  uint64_t next_seed() { return seed_base + 0x9E3779B97F4A7C15ull * ++counter; }

  // Called with the request head, before any body byte is read: the key, then the endpoint.
  HttpRoute route(const HttpRequest& head) {
    HttpRoute r;
    if (!options.api_key.empty()) {
      const std::string auth = head.header("authorization");
      const std::string prefix = "Bearer ";
      if (auth.rfind(prefix, 0) != 0 || !same_secret(auth.substr(prefix.size()), options.api_key)) {
        r.response = error_response(
            401, "missing or invalid API key: send the header 'Authorization: Bearer <key>'");
        r.response.headers.emplace_back("WWW-Authenticate", "Bearer");
        return r;
      }
    }
    for (const Endpoint& e : kEndpoints) {
      if (head.path != e.path) continue;
      if (head.method != e.method) {
        r.response = error_response(405, str(head.method, " is not allowed on ", head.path, "; use ", e.method));
        r.response.headers.emplace_back("Allow", e.method);
        return r;
      }
      r.kind = e.kind;
      const std::string path = e.path;
      if (path == "/health") r.handler = [this](const HttpRequest&, HttpResponse& res) { health(res); };
      else if (path == "/api") r.handler = [this](const HttpRequest& req, HttpResponse& res) { handle_api(req, res); };
      else r.handler = [this](const HttpRequest& req, HttpResponse& res) { handle_completions(req, res); };
      return r;
    }
    r.response = error_response(404, str("no endpoint ", head.method, " ", head.path,
                                         "; endpoints: PUT /api, POST /v1/completions, GET /health"));
    return r;
  }

  // Submits and waits; a full queue is a 503, an engine failure a 500.
  void run(const std::shared_ptr<Job>& job) {
    if (!scheduler.submit(job))
      throw ApiError(503, str("the server is busy (", options.max_queue_size,
                              " requests queued); retry later"));
    job->wait();
    if (!job->error.empty()) throw ApiError(500, job->error);
  }

  template <typename Fn>
  void guarded(HttpResponse& res, Fn&& fn) {
    try {
      fn();
    } catch (const ApiError& e) {
      send_error(res, e.status, e.what());
    } catch (const std::bad_alloc&) {
      log_warn("server: out of memory handling a request");
      send_error(res, 503, "the server has not enough memory for this request now; retry later "
                           "or send a smaller one");
    } catch (const std::exception& e) {
      log_warn("server: internal error: ", e.what());
      send_error(res, 500, str("internal error: ", e.what()));
    }
  }

  void health(HttpResponse& res) {
    const auto st = scheduler.stats();
    res.body = dump_json({{"status", "ok"},
                          {"queued", st.queued},
                          {"requests_done", st.jobs_done},
                          {"running", st.running},
                          {"steps", st.steps},
                          {"rejected", st.rejected}});
  }

  void handle_api(const HttpRequest& req, HttpResponse& res) {
    guarded(res, [&] {
      auto request = [&] {
        const auto pass = parse_gate.enter(req.body.size());
        return parse_megatron_request(parse_json_body(req.body), ctx, next_seed());
      }();
      if (!request.no_log)
        log_info("PUT /api from ", req.remote_addr, ": ",
                 request.job->kind == Job::Kind::BeamSearch
                     ? str("beam search, width ", request.job->beam.beam_width)
                     : str(request.job->rows.size(), " prompt(s)"));
      run(request.job);
      res.body = dump_json(megatron_response(request, ctx));
    });
  }

  void handle_completions(const HttpRequest& req, HttpResponse& res) {
    guarded(res, [&] {
      const std::string id = str("cmpl-", std::hex, next_seed());
      auto request = [&] {
        const auto pass = parse_gate.enter(req.body.size());
        return parse_completion_request(parse_json_body(req.body), ctx, next_seed(), id);
      }();
      if (!request.stream) {
        run(request.job);
        res.body = dump_json(completion_response(request, ctx));
        return;
      }
      if (!scheduler.submit(request.job))
        throw ApiError(503, str("the server is busy (", options.max_queue_size,
                                " requests queued); retry later"));
      auto channel = request.channel;
      res.content_type = "text/event-stream";
      res.headers.emplace_back("Cache-Control", "no-cache");
      res.stream = [channel](const std::function<bool(std::string_view)>& write) {
        std::string event;
        while (channel->pop(event)) {
          if (!write(event)) {
            channel->cancel();  // the rows stop at their next token; the job then closes the channel
            return;
          }
        }
      };
    });
  }

  ServerOptions options;
  ParseGate parse_gate;
  ApiContext ctx;
  Scheduler scheduler;
  std::unique_ptr<HttpFront> front;
  uint64_t seed_base = 0;
  std::atomic<uint64_t> counter{0};
};

TextGenerationServer::TextGenerationServer(LanguageModel& model, const data::Tokenizer& tokenizer,
                                           ServerOptions options) {
  MG_REQUIRE(options.api_key.empty() || options.api_key.find_first_of(" \t\r\n") == std::string::npos,
             "--api-key must not contain whitespace");
  MG_REQUIRE(is_loopback_host(options.host) || !options.api_key.empty(), "--host ", options.host,
             " would expose the server beyond this machine without authentication; pass "
             "--api-key KEY (clients send 'Authorization: Bearer KEY') or bind 127.0.0.1");
  MG_REQUIRE(options.port >= 0 && options.port <= 65535, "--port must be in [0, 65535], got ",
             options.port);
  MG_REQUIRE(options.max_batch_size >= 1, "--max-batch-size must be >= 1");
  MG_REQUIRE(options.batch_window_ms >= 0.0 && options.batch_window_ms <= 1000.0,
             "--batch-window-ms must be in [0, 1000]");
  MG_REQUIRE(options.max_request_bytes >= 64, "--max-request-bytes must be >= 64");
  MG_REQUIRE(options.max_tokens_to_generate >= 1, "--max-tokens-to-generate must be >= 1");
  MG_REQUIRE(options.request_timeout_ms >= 1 && options.idle_timeout_ms >= 1 &&
                 options.max_connections >= 1 && options.max_unauthenticated >= 1,
             "server timeouts and connection limits must be positive");
  impl_ = std::make_unique<Impl>(model, tokenizer, std::move(options));
}

TextGenerationServer::~TextGenerationServer() { stop(); }

int TextGenerationServer::bind() {
  port_ = impl_->front->bind();
  return port_;
}

void TextGenerationServer::serve() {
  MG_REQUIRE(port_ > 0, "serve() before bind()");
  impl_->front->serve();
}

void TextGenerationServer::stop() {
  if (!impl_) return;
  // The loop first (no new requests), then the scheduler (waiting handlers get their answer),
  // then the workers can be joined.
  impl_->front->stop();
  impl_->scheduler.stop();
  impl_->front->join_workers();
}

}  // namespace megatron::inference
