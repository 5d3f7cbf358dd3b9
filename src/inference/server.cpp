// HTTP transport of the text generation server (cpp-httplib): routes, API key, limits, errors.
#include "inference/server.h"

#include <httplib.h>

#include <arpa/inet.h>
#include <sys/socket.h>

#include <chrono>
#include <random>

#include "core/error.h"
#include "core/log.h"
#include "data/tokenizer.h"
#include "inference/server_api.h"
#include "inference/server_queue.h"

namespace megatron::inference {

bool is_loopback_host(const std::string& host) {
  if (host == "localhost" || host == "::1" || host == "[::1]") return true;
  in_addr addr{};
  if (inet_pton(AF_INET, host.c_str(), &addr) == 1) return (ntohl(addr.s_addr) >> 24) == 127;
  return false;
}

namespace {

void send_error(httplib::Response& res, int status, const std::string& message) {
  res.status = status;
  res.set_content(dump_json(nlohmann::json{{"error", message}}), "application/json");
}

bool same_secret(const std::string& a, const std::string& b) {
  // Constant time in the length of the expected key.
  unsigned diff = unsigned(a.size() != b.size());
  for (size_t i = 0; i < b.size(); ++i) diff |= unsigned(uint8_t(i < a.size() ? a[i] : 0) ^ uint8_t(b[i]));
  return diff == 0;
}

}  // namespace

struct TextGenerationServer::Impl {
  Impl(LanguageModel& model, const data::Tokenizer& tokenizer, ServerOptions o)
      : options(std::move(o)),
        scheduler(model, tokenizer.vocab_size(), SpecialTokens::from_tokenizer(tokenizer),
                  options.max_batch_size, options.max_queue_size, options.batch_window_ms) {
    ctx.tokenizer = &tokenizer;
    ctx.vocab = tokenizer.vocab_size();
    ctx.max_sequence_length = model.max_sequence_length();
    ctx.max_tokens_to_generate = options.max_tokens_to_generate;
    seed_base = std::random_device{}();
  }

  uint64_t next_seed() { return seed_base + 0x9E3779B97F4A7C15ull * ++counter; }

  // Submits and waits; a full queue is a 503, an engine failure a 500.
  void run(const std::shared_ptr<Job>& job) {
    if (!scheduler.submit(job))
      throw ApiError(503, str("the server is busy (", options.max_queue_size,
                              " requests queued); retry later"));
    job->wait();
    if (!job->error.empty()) throw ApiError(500, job->error);
  }

  template <typename Fn>
  void guarded(httplib::Response& res, Fn&& fn) {
    try {
      fn();
    } catch (const ApiError& e) {
      send_error(res, e.status, e.what());
    } catch (const std::exception& e) {
      log_warn("server: internal error: ", e.what());
      send_error(res, 500, str("internal error: ", e.what()));
    }
  }

  void handle_api(const httplib::Request& req, httplib::Response& res) {
    guarded(res, [&] {
      auto request = parse_megatron_request(parse_json_body(req.body), ctx, next_seed());
      if (!request.no_log)
        log_info("PUT /api from ", req.remote_addr, ": ",
                 request.job->kind == Job::Kind::BeamSearch
                     ? str("beam search, width ", request.job->beam.beam_width)
                     : str(request.job->rows.size(), " prompt(s)"));
      run(request.job);
      res.set_content(dump_json(megatron_response(request, ctx)), "application/json");
    });
  }

  void handle_completions(const httplib::Request& req, httplib::Response& res) {
    guarded(res, [&] {
      const std::string id = str("cmpl-", std::hex, next_seed());
      auto request = parse_completion_request(parse_json_body(req.body), ctx, next_seed(), id);
      if (!request.stream) {
        run(request.job);
        res.set_content(dump_json(completion_response(request, ctx)), "application/json");
        return;
      }
      if (!scheduler.submit(request.job))
        throw ApiError(503, str("the server is busy (", options.max_queue_size,
                                " requests queued); retry later"));
      auto channel = request.channel;
      res.set_header("Cache-Control", "no-cache");
      res.set_chunked_content_provider(
          "text/event-stream",
          [channel](size_t, httplib::DataSink& sink) {
            std::string event;
            if (!channel->pop(event)) {
              sink.done();
              return true;
            }
            if (!sink.write(event.data(), event.size())) {
              channel->cancel();
              return false;
            }
            return true;
          },
          [channel](bool success) {
            if (!success) channel->cancel();
          });
    });
  }

  ServerOptions options;
  ApiContext ctx;
  Scheduler scheduler;
  httplib::Server http;
  uint64_t seed_base = 0;
  std::atomic<uint64_t> counter{0};
  int listen_socket = -1;
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
  impl_ = std::make_unique<Impl>(model, tokenizer, std::move(options));
  Impl& s = *impl_;
  auto& http = s.http;
  const int threads = std::max(4, s.options.http_threads);
  http.new_task_queue = [threads] { return new httplib::ThreadPool(size_t(threads)); };
  http.set_payload_max_length(s.options.max_request_bytes);
  http.set_read_timeout(30, 0);
  // Remember the listening socket so bind() can raise its backlog: the library listens with a
  // backlog of 5, which drops connections when many clients connect at once.
  http.set_socket_options([&s](socket_t sock) {
    int yes = 1;
    ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    s.listen_socket = sock;
  });
  http.set_write_timeout(30, 0);

  http.set_pre_routing_handler([&s](const httplib::Request& req, httplib::Response& res) {
    if (s.options.api_key.empty()) return httplib::Server::HandlerResponse::Unhandled;
    const std::string auth = req.get_header_value("Authorization");
    const std::string prefix = "Bearer ";
    if (auth.rfind(prefix, 0) == 0 && same_secret(auth.substr(prefix.size()), s.options.api_key))
      return httplib::Server::HandlerResponse::Unhandled;
    res.set_header("WWW-Authenticate", "Bearer");
    send_error(res, 401, "missing or invalid API key: send the header 'Authorization: Bearer <key>'");
    return httplib::Server::HandlerResponse::Handled;
  });
  http.Put("/api", [&s](const auto& req, auto& res) { s.handle_api(req, res); });
  http.Post("/v1/completions", [&s](const auto& req, auto& res) { s.handle_completions(req, res); });
  http.Post("/completions", [&s](const auto& req, auto& res) { s.handle_completions(req, res); });
  http.Get("/health", [&s](const auto&, auto& res) {
    const auto st = s.scheduler.stats();
    res.set_content(dump_json({{"status", "ok"},
                               {"queued", st.queued},
                               {"requests_done", st.jobs_done},
                               {"running", st.running},
                               {"steps", st.steps},
                               {"rejected", st.rejected}}),
                    "application/json");
  });
  auto wrong_method = [](const char* allowed) {
    return [allowed](const httplib::Request& req, httplib::Response& res) {
      res.set_header("Allow", allowed);
      send_error(res, 405, str(req.method, " is not allowed on ", req.path, "; use ", allowed));
    };
  };
  for (auto [path, allowed] : {std::pair{"/api", "PUT"}, std::pair{"/v1/completions", "POST"},
                               std::pair{"/completions", "POST"}, std::pair{"/health", "GET"}}) {
    const std::string m = allowed;
    if (m != "GET") http.Get(path, wrong_method(allowed));
    if (m != "PUT") http.Put(path, wrong_method(allowed));
    if (m != "POST") http.Post(path, wrong_method(allowed));
    http.Delete(path, wrong_method(allowed));
    http.Patch(path, wrong_method(allowed));
  }
  http.set_error_handler(httplib::Server::HandlerWithResponse(
      [&s](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
    std::string message;
    switch (res.status) {
      case 404:
        message = str("no endpoint ", req.method, " ", req.path,
                      "; endpoints: PUT /api, POST /v1/completions, GET /health");
        break;
      case 413:
        message = str("the request body is larger than the limit of ", s.options.max_request_bytes,
                      " bytes (--max-request-bytes)");
        break;
      default:
        message = str("HTTP status ", res.status);
    }
    send_error(res, res.status, message);
    return httplib::Server::HandlerResponse::Handled;
  }));
  http.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string what = "unknown";
    try {
      std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    send_error(res, 500, "internal error: " + what);
  });
}

TextGenerationServer::~TextGenerationServer() {
  stop();
}

int TextGenerationServer::bind() {
  auto& s = *impl_;
  if (s.options.port == 0) {
    port_ = s.http.bind_to_any_port(s.options.host);
  } else {
    port_ = s.http.bind_to_port(s.options.host, s.options.port) ? s.options.port : -1;
  }
  MG_REQUIRE(port_ > 0, "cannot listen on ", s.options.host, ":", s.options.port,
             " (address in use or not available); choose another --host/--port");
  if (s.listen_socket >= 0) ::listen(s.listen_socket, 1024);  // Linux updates the backlog
  return port_;
}

void TextGenerationServer::serve() {
  MG_REQUIRE(port_ > 0, "serve() before bind()");
  impl_->http.listen_after_bind();
}

void TextGenerationServer::stop() {
  if (!impl_) return;
  impl_->http.stop();
  impl_->scheduler.stop();
}

}  // namespace megatron::inference
