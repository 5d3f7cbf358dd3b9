// Slow and idle clients against the text generation server: an in-process server (a constant
// model, so generation costs nothing) on a loopback port, N attacking connections that send a
// request one byte every --interval-ms (or nothing at all, or a large body slowly), reconnecting
// whenever the server closes them, while one well-behaved client asks GET /health and PUT /api
// every --poll-ms on a fresh connection. Prints how many of its requests were answered within
// one second and the latency percentiles: the server is usable only if all of them are.
// --mode big-chunked / big-gzip instead sends one 200 MB body (chunked, or labelled gzip) and
// prints how much was sent before the server answered and its memory before and after.
// --mode parse-burst: --slow-clients N clients send a 1 MiB JSON body of small objects at once
// (each parsed, then refused with a 400 for its unknown field); prints the server's resident
// memory before, at its peak and after.
//   build/bench/server_slow_clients_bench [--slow-clients 100 --mode trickle|idle|body
//       --interval-ms 1000 --seconds 20 --poll-ms 200 --api-key KEY]
//   build/bench/server_slow_clients_bench --mode big-chunked
//   build/bench/server_slow_clients_bench --mode parse-burst --slow-clients 64
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "core/log.h"
#include "data/tokenizer.h"
#include "inference/server.h"

using namespace megatron;
using Clock = std::chrono::steady_clock;

namespace {

// Logits that always favour token 1: generation is instant, only the transport is measured.
class ConstantModel final : public inference::LanguageModel {
 public:
  int64_t vocab_size() const override { return 128; }
  int64_t max_sequence_length() const override { return 64; }
  void start(int64_t batch, int64_t) override {
    batch_ = batch;
    pos_ = 0;
  }
  Tensor forward(std::span<const int32_t>, int64_t n, bool all_positions) override {
    const int64_t out_n = all_positions ? n : 1;
    Tensor t = Tensor::zeros({batch_, out_n, 128}, DType::F32);
    for (int64_t i = 0; i < batch_ * out_n; ++i) t.data<float>()[i * 128 + 1] = 5.0f;
    pos_ += n;
    return t;
  }
  void reorder(std::span<const int64_t> src) override { batch_ = int64_t(src.size()); }
  int64_t position() const override { return pos_; }
  bool supports_slots() const override { return true; }
  void start_slots(int64_t, int64_t) override {}
  void clear_slot(int64_t) override {}
  void grow_slots(int64_t) override {}
  Tensor forward_slots(std::span<const int64_t> slots, std::span<const int32_t>,
                       std::span<const int64_t> counts, bool all_positions) override {
    int64_t longest = 1;
    for (int64_t c : counts) longest = std::max(longest, c);
    const int64_t k = int64_t(slots.size()), out_n = all_positions ? longest : 1;
    Tensor t = Tensor::zeros({k, out_n, 128}, DType::F32);
    for (int64_t i = 0; i < k * out_n; ++i) t.data<float>()[i * 128 + 1] = 5.0f;
    return t;
  }

 private:
  int64_t batch_ = 0, pos_ = 0;
};

int connect_loopback(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(uint16_t(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// One request on a fresh connection; the seconds until the whole response arrived, or -1 when
// none came within `timeout_s` (or the connection failed). Status in *status.
double timed_request(int port, const std::string& request, double timeout_s, int* status) {
  const auto start = Clock::now();
  auto left_ms = [&] {
    const double used = std::chrono::duration<double>(Clock::now() - start).count();
    return int(std::max(0.0, timeout_s - used) * 1000);
  };
  *status = 0;
  const int fd = connect_loopback(port);
  if (fd < 0) return -1;
  ::send(fd, request.data(), request.size(), MSG_NOSIGNAL);
  std::string got;
  char buf[4096];
  for (;;) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, left_ms()) <= 0) break;
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    got.append(buf, size_t(n));
    const size_t head = got.find("\r\n\r\n");
    if (head == std::string::npos) continue;
    size_t length = 0;
    const size_t cl = got.find("Content-Length: ");
    if (cl != std::string::npos && cl < head) length = std::stoul(got.substr(cl + 16));
    if (got.size() >= head + 4 + length) {
      *status = std::atoi(got.c_str() + 9);
      ::close(fd);
      return std::chrono::duration<double>(Clock::now() - start).count();
    }
  }
  ::close(fd);
  return -1;
}

// Resident memory of this process (the server runs in it), MB.
double rss_mb() {
  long pages = 0, resident = 0;
  if (FILE* f = std::fopen("/proc/self/statm", "r")) {
    if (std::fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
    std::fclose(f);
  }
  return double(resident) * double(::sysconf(_SC_PAGESIZE)) / 1e6;
}

// One client sends a 200 MB body in 64 KiB chunks (chunked transfer coding, or gzip-labelled
// with a Content-Length): the bytes it got to send before the server answered, the answer, and
// the server's memory before and after.
void big_body(int port, bool gzip) {
  const double before = rss_mb();
  const int fd = connect_loopback(port);
  const size_t total = 200u << 20, piece = 64u << 10;
  const std::string head = gzip ? "PUT /api HTTP/1.1\r\nHost: x\r\nContent-Encoding: gzip\r\n"
                                  "Content-Length: " + std::to_string(total) + "\r\n\r\n"
                                : "PUT /api HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n";
  ::send(fd, head.data(), head.size(), MSG_NOSIGNAL);
  const std::string data(piece, 'a');
  char hex[32];
  std::snprintf(hex, sizeof hex, "%zx\r\n", piece);
  size_t sent = 0;
  std::string answer;
  while (sent < total && answer.empty()) {
    std::string chunk = gzip ? data : std::string(hex) + data + "\r\n";
    if (::send(fd, chunk.data(), chunk.size(), MSG_NOSIGNAL) <= 0) break;
    sent += piece;
    pollfd p{fd, POLLIN, 0};
    char buf[512];
    if (::poll(&p, 1, 0) == 1) {
      const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
      if (n > 0) answer.assign(buf, size_t(n));
    }
  }
  if (answer.empty()) {
    pollfd p{fd, POLLIN, 0};
    char buf[512];
    if (::poll(&p, 1, 2000) == 1) {
      const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
      if (n > 0) answer.assign(buf, size_t(n));
    }
  }
  ::close(fd);
  std::printf("200 MB %s body: %zu KB sent before the answer '%s'; server RSS %.1f MB before, %.1f MB after\n",
              gzip ? "gzip-labelled" : "chunked", sent >> 10,
              answer.substr(0, answer.find("\r\n")).c_str(), before, rss_mb());
}

// Peak resident memory of this process so far (VmHWM), MB.
double peak_rss_mb() {
  double kb = 0;
  if (FILE* f = std::fopen("/proc/self/status", "r")) {
    char line[256];
    while (std::fgets(line, sizeof line, f))
      if (std::strncmp(line, "VmHWM:", 6) == 0) kb = std::atof(line + 6);
    std::fclose(f);
  }
  return kb / 1e3;
}

// `clients` connections each send one 1 MiB body of small JSON objects at once (all from one
// shared buffer: the client side holds no copies).
void parse_burst(int port, int clients) {
  std::string body = R"({"prompts": ["1"], "padding": [)";
  while (body.size() < (1u << 20) - 8) body += "{},";
  body += "{}]}";
  const std::string request = "PUT /api HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                              "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
  int status = 0;
  timed_request(port, request, 60, &status);  // threads and buffers exist before the baseline
  const double before = rss_mb();
  std::atomic<int> refused{0};
  std::vector<std::thread> threads;
  const auto start = Clock::now();
  for (int k = 0; k < clients; ++k)
    threads.emplace_back([&] {
      int s = 0;
      timed_request(port, request, 120, &s);
      refused += s == 400;
    });
  for (auto& t : threads) t.join();
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  std::printf("%d concurrent 1 MiB bodies: %d answered 400 in %.2f s; server RSS %.1f MB before, "
              "peak %.1f MB, %.1f MB after\n",
              clients, refused.load(), seconds, before, peak_rss_mb(), rss_mb());
}

double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, size_t(q * double(v.size())))];
}

}  // namespace

int main(int argc, char** argv) {
  std::map<std::string, std::string> flags;
  for (int i = 1; i + 1 < argc; i += 2) flags[argv[i]] = argv[i + 1];
  auto get = [&](const char* name, const char* fallback) {
    return flags.count(name) ? flags[name] : std::string(fallback);
  };
  const int slow = std::stoi(get("--slow-clients", "100"));
  const std::string mode = get("--mode", "trickle");
  const int interval_ms = std::stoi(get("--interval-ms", "1000"));
  const double seconds = std::stod(get("--seconds", "20"));
  const int poll_ms = std::stoi(get("--poll-ms", "200"));
  const std::string key = get("--api-key", "");

  set_log_level(LogLevel::Warn);
  ConstantModel model;
  data::NullTokenizer tokenizer(100);
  inference::ServerOptions options;
  options.port = 0;
  options.api_key = key;
  inference::TextGenerationServer server(model, tokenizer, options);
  const int port = server.bind();
  std::thread serving([&] { server.serve(); });
  if (mode == "parse-burst") {
    parse_burst(port, slow);
    server.stop();
    serving.join();
    return 0;
  }
  if (mode == "big-chunked" || mode == "big-gzip") {
    big_body(port, mode == "big-gzip");
    server.stop();
    serving.join();
    return 0;
  }

  // The attackers: one thread drives every slow connection.
  const std::string auth = key.empty() ? "" : "Authorization: Bearer " + key + "\r\n";
  const std::string slow_request =
      mode == "body" ? "PUT /api HTTP/1.1\r\nHost: x\r\n" + auth +
                           "Content-Type: application/json\r\nContent-Length: 1000000\r\n\r\n" +
                           std::string(1000000, ' ')
                     : "PUT /api HTTP/1.1\r\nHost: x\r\nX-Padding: " + std::string(4000, 'a') + "\r\n";
  std::atomic<bool> stop{false};
  std::atomic<int64_t> reconnects{0}, bytes_sent{0};
  std::thread attackers([&] {
    struct Conn {
      int fd = -1;
      size_t sent = 0;
    };
    std::vector<Conn> conns(static_cast<size_t>(slow));
    for (auto& c : conns) c.fd = connect_loopback(port);
    while (!stop) {
      for (auto& c : conns) {
        if (c.fd < 0 || c.sent >= slow_request.size()) {
          if (c.fd >= 0) ::close(c.fd);
          c = {connect_loopback(port), 0};
          ++reconnects;
          continue;
        }
        if (mode == "idle") {  // connected, sending nothing; reconnect if the server hung up
          pollfd p{c.fd, POLLIN, 0};
          char b;
          if (::poll(&p, 1, 0) == 1 && ::recv(c.fd, &b, 1, MSG_DONTWAIT) <= 0) {
            ::close(c.fd);
            c.fd = -1;
          }
          continue;
        }
        // body: the headers at once, then the body a byte at a time; else everything byte-wise.
        const size_t chunk = mode == "body" && c.sent == 0 ? slow_request.find("\r\n\r\n") + 4 : 1;
        if (::send(c.fd, slow_request.data() + c.sent, chunk, MSG_NOSIGNAL | MSG_DONTWAIT) <= 0) {
          ::close(c.fd);
          c.fd = -1;
          continue;
        }
        c.sent += chunk;
        ++bytes_sent;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(interval_ms));
    }
    for (auto& c : conns)
      if (c.fd >= 0) ::close(c.fd);
  });

  // The well-behaved client.
  std::this_thread::sleep_for(std::chrono::milliseconds(std::min(2000, interval_ms * 2)));
  const std::string health = "GET /health HTTP/1.1\r\nHost: x\r\n" + auth + "\r\n";
  const std::string body = R"({"prompts": ["1 2 3"], "tokens_to_generate": 4})";
  const std::string api = "PUT /api HTTP/1.1\r\nHost: x\r\n" + auth +
                          "Content-Type: application/json\r\nContent-Length: " +
                          std::to_string(body.size()) + "\r\n\r\n" + body;
  std::vector<double> latencies;
  int64_t polls = 0, answered = 0, within_1s = 0, ok = 0;
  const auto start = Clock::now();
  while (std::chrono::duration<double>(Clock::now() - start).count() < seconds) {
    for (const std::string* req : {&health, &api}) {
      int status = 0;
      const double t = timed_request(port, *req, 5.0, &status);
      ++polls;
      if (t >= 0) {
        ++answered;
        latencies.push_back(t);
        within_1s += t <= 1.0;
        ok += status == 200;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(poll_ms));
  }
  stop = true;
  attackers.join();
  server.stop();
  serving.join();
  std::printf("slow clients %d (mode %s, one byte every %d ms%s), %.0f s: %lld requests, "
              "%lld answered (%lld with 200), %lld within 1 s; latency p50 %.1f ms, p99 %.1f ms, "
              "max %.1f ms; attacker reconnects %lld, bytes %lld\n",
              slow, mode.c_str(), interval_ms, key.empty() ? "" : ", --api-key", seconds,
              (long long)polls, (long long)answered, (long long)ok, (long long)within_1s,
              percentile(latencies, 0.5) * 1e3, percentile(latencies, 0.99) * 1e3,
              latencies.empty() ? 0.0 : *std::max_element(latencies.begin(), latencies.end()) * 1e3,
              (long long)reconnects, (long long)bytes_sent);
  return 0;
}
