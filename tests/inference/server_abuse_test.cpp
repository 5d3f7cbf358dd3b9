// The server against slow, idle, oversized and malformed clients on loopback, with raw sockets:
// 100 slow clients do not keep a well-behaved client from answers within a second, with or
// without an API key; a request that does not arrive in time gets 408; the key is checked at the
// head, before the body; oversized chunked bodies and compressed bodies are refused at once;
// pipelined requests are answered in order; malformed framing gets 400. Bounded: a few seconds.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "inference/server.h"
#include "running_server.h"

namespace megatron::inference {
namespace {

using Clock = std::chrono::steady_clock;

using Server = testing::RunningServer;

int connect_to(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(uint16_t(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

void send_all(int fd, const std::string& s) {
  size_t sent = 0;
  while (sent < s.size()) {
    const ssize_t n = ::send(fd, s.data() + sent, s.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) return;
    sent += size_t(n);
  }
}

// Everything the server sends until it closes the connection, `responses` complete responses
// have arrived, or `timeout_s` passes.
std::string read_responses(int fd, int responses, double timeout_s) {
  std::string got;
  const auto end = Clock::now() + std::chrono::duration<double>(timeout_s);
  auto complete = [&] {
    int count = 0;
    size_t pos = 0;
    while (count < responses) {
      const size_t head = got.find("\r\n\r\n", pos);
      if (head == std::string::npos) return false;
      const size_t cl = got.find("Content-Length: ", pos);
      if (cl == std::string::npos || cl > head) return false;
      const size_t len = std::stoul(got.substr(cl + 16));
      if (got.size() < head + 4 + len) return false;
      pos = head + 4 + len;
      ++count;
    }
    return true;
  };
  char buf[65536];
  while (!complete()) {
    const int left = int(std::chrono::duration_cast<std::chrono::milliseconds>(end - Clock::now()).count());
    if (left <= 0) break;
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, left) <= 0) break;
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    got.append(buf, size_t(n));
  }
  return got;
}

// One request on a fresh connection: the response text and the seconds it took.
std::pair<std::string, double> exchange(int port, const std::string& request, double timeout_s = 5) {
  const auto start = Clock::now();
  const int fd = connect_to(port);
  if (fd < 0) return {"", -1};
  send_all(fd, request);
  std::string r = read_responses(fd, 1, timeout_s);
  ::close(fd);
  return {r, std::chrono::duration<double>(Clock::now() - start).count()};
}

int status_of(const std::string& response) {
  return response.size() > 12 && response.rfind("HTTP/1.1 ", 0) == 0 ? std::atoi(response.c_str() + 9) : 0;
}

const std::string kHealth = "GET /health HTTP/1.1\r\nHost: t\r\n\r\n";

std::string api_request(const std::string& auth = "") {
  const std::string body = R"({"prompts": ["1 2 3"], "tokens_to_generate": 3, "top_k": 1})";
  return "PUT /api HTTP/1.1\r\nHost: t\r\n" + auth + "Content-Length: " + std::to_string(body.size()) +
         "\r\n\r\n" + body;
}

// 100 connections that each send a request head one byte every 100 ms, reconnecting when closed,
// while a client asks for /health and /api: every answer within a second.
void expect_served_despite_slow_clients(const ServerOptions& options, const std::string& auth) {
  Server s(options);
  std::atomic<bool> stop{false};
  std::thread attackers([&] {
    const std::string slow = "PUT /api HTTP/1.1\r\nHost: t\r\nX-Pad: " + std::string(1000, 'a');
    std::vector<std::pair<int, size_t>> conns;
    for (int i = 0; i < 100; ++i) conns.emplace_back(connect_to(s.port), 0);
    while (!stop) {
      for (auto& [fd, sent] : conns) {
        if (fd < 0 || sent >= slow.size() || ::send(fd, slow.data() + sent, 1, MSG_NOSIGNAL | MSG_DONTWAIT) != 1) {
          if (fd >= 0) ::close(fd);
          fd = connect_to(s.port);
          sent = 0;
          continue;
        }
        ++sent;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    for (auto& [fd, sent] : conns)
      if (fd >= 0) ::close(fd);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const std::string health = "GET /health HTTP/1.1\r\nHost: t\r\n" + auth + "\r\n";
  for (int i = 0; i < 6; ++i) {
    for (const std::string& req : {health, api_request(auth)}) {
      const auto [response, seconds] = exchange(s.port, req, 3);
      EXPECT_EQ(status_of(response), 200) << response;
      EXPECT_LT(seconds, 1.0) << "request " << i << " took " << seconds << " s";
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  stop = true;
  attackers.join();
}

TEST(ServerAbuse, SlowClientsDoNotStopOthers) {
  ServerOptions o;
  o.max_unauthenticated = 64;  // fewer than the attackers: the oldest are displaced
  expect_served_despite_slow_clients(o, "");
}

TEST(ServerAbuse, SlowClientsDoNotStopOthersWithAnApiKey) {
  ServerOptions o;
  o.api_key = "sekrit";
  o.max_unauthenticated = 64;
  expect_served_despite_slow_clients(o, "Authorization: Bearer sekrit\r\n");
}

TEST(ServerAbuse, ARequestThatDoesNotArriveInTimeGets408AndIdleConnectionsClose) {
  ServerOptions o;
  o.request_timeout_ms = 400;
  o.idle_timeout_ms = 300;
  Server s(o);
  const int slow = connect_to(s.port);
  send_all(slow, "PUT /api HTTP/1.1\r\nContent-Length: 10\r\n\r\n12");
  const auto start = Clock::now();
  const std::string r = read_responses(slow, 1, 3);
  const double waited = std::chrono::duration<double>(Clock::now() - start).count();
  EXPECT_EQ(status_of(r), 408) << r;
  EXPECT_NE(r.find("Connection: close"), std::string::npos) << r;
  EXPECT_LT(waited, 1.5);
  ::close(slow);
  const int idle = connect_to(s.port);
  char c;
  pollfd p{idle, POLLIN, 0};
  ASSERT_EQ(::poll(&p, 1, 2000), 1);
  EXPECT_EQ(::recv(idle, &c, 1, 0), 0);  // closed without a word
  ::close(idle);
}

TEST(ServerAbuse, TheKeyIsCheckedBeforeTheBody) {
  ServerOptions o;
  o.api_key = "sekrit";
  Server s(o);
  // A head announcing a large body, without the key: 401 at once, the body never sent.
  const auto [r, seconds] = exchange(s.port, "PUT /api HTTP/1.1\r\nContent-Length: 900000\r\n\r\n", 3);
  EXPECT_EQ(status_of(r), 401) << r;
  EXPECT_NE(r.find("WWW-Authenticate: Bearer"), std::string::npos);
  EXPECT_LT(seconds, 1.0);
  // Unknown routes and methods reveal nothing without the key either.
  EXPECT_EQ(status_of(exchange(s.port, "GET /nope HTTP/1.1\r\n\r\n").first), 401);
  EXPECT_EQ(status_of(exchange(s.port, "GET /health HTTP/1.1\r\nAuthorization: Bearer sekrit\r\n\r\n").first), 200);
}

TEST(ServerAbuse, OversizedAndCompressedBodiesAreRefusedAtOnce) {
  ServerOptions o;
  o.max_request_bytes = 4096;
  Server s(o);
  // 200 MB announced in one chunk: refused before a byte of it is sent.
  auto [r, seconds] = exchange(s.port, "PUT /api HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nBEBC200\r\n");
  EXPECT_EQ(status_of(r), 413) << r;
  EXPECT_NE(r.find("--max-request-bytes"), std::string::npos) << r;
  EXPECT_LT(seconds, 1.0);
  // Small chunks past the limit: refused at the limit while the client is still sending.
  {
    const int fd = connect_to(s.port);
    send_all(fd, "PUT /api HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n");
    std::string got;
    for (int i = 0; i < 2000 && got.empty(); ++i) {
      send_all(fd, "400\r\n" + std::string(1024, ' ') + "\r\n");
      pollfd p{fd, POLLIN, 0};
      if (::poll(&p, 1, 0) == 1) got = read_responses(fd, 1, 2);
    }
    if (got.empty()) got = read_responses(fd, 1, 2);
    EXPECT_EQ(status_of(got), 413) << got;
    ::close(fd);
  }
  r = exchange(s.port, "PUT /api HTTP/1.1\r\nContent-Encoding: gzip\r\nContent-Length: 20\r\n\r\n").first;
  EXPECT_EQ(status_of(r), 415) << r;
  r = exchange(s.port, "PUT /api HTTP/1.1\r\nContent-Length: 209715200\r\n\r\n").first;
  EXPECT_EQ(status_of(r), 413) << r;
  // The server is fine afterwards.
  EXPECT_EQ(status_of(exchange(s.port, kHealth).first), 200);
}

TEST(ServerAbuse, PipelinedRequestsAreAnsweredInOrder) {
  Server s(ServerOptions{});
  const int fd = connect_to(s.port);
  send_all(fd, kHealth + api_request() + "GET /nope HTTP/1.1\r\n\r\n");
  const std::string r = read_responses(fd, 3, 5);
  ::close(fd);
  const size_t first = r.find("HTTP/1.1 200"), second = r.find("HTTP/1.1 200", first + 1),
               third = r.find("HTTP/1.1 404");
  ASSERT_NE(first, std::string::npos) << r;
  ASSERT_NE(second, std::string::npos) << r;
  ASSERT_NE(third, std::string::npos) << r;
  EXPECT_LT(second, third);
  EXPECT_NE(r.find("\"status\""), std::string::npos);  // /health first
  EXPECT_LT(r.find("\"status\""), r.find("\"tokens\""));
}

TEST(ServerAbuse, MalformedFramingGets400) {
  Server s(ServerOptions{});
  for (const char* req : {"PUT /api HTTP/1.1\r\nContent-Length: -5\r\n\r\n",
                          "PUT /api HTTP/1.1\r\nContent-Length: 5x\r\n\r\n",
                          "PUT /api HTTP/1.1\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n",
                          "PUT /api HTTP/1.1\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n",
                          "garbage\r\n\r\n"}) {
    const std::string r = exchange(s.port, req).first;
    EXPECT_EQ(status_of(r), 400) << req << " -> " << r;
    EXPECT_NE(r.find("{\"error\""), std::string::npos) << r;
  }
  // Expect: 100-continue gets its interim answer, then the request is served.
  const int fd = connect_to(s.port);
  const std::string body = R"({"prompts": ["1"], "tokens_to_generate": 1})";
  send_all(fd, "PUT /api HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: " +
                   std::to_string(body.size()) + "\r\n\r\n");
  char buf[64] = {};
  pollfd p{fd, POLLIN, 0};
  ASSERT_EQ(::poll(&p, 1, 2000), 1);
  const ssize_t n = ::recv(fd, buf, sizeof buf - 1, 0);
  EXPECT_EQ(std::string(buf, size_t(std::max<ssize_t>(n, 0))), "HTTP/1.1 100 Continue\r\n\r\n");
  send_all(fd, body);
  EXPECT_EQ(status_of(read_responses(fd, 1, 3)), 200);
  ::close(fd);
}

}  // namespace
}  // namespace megatron::inference
