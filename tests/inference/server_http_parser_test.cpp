// The server's HTTP request parser on its own: requests fed whole and byte by byte parse alike,
// chunked bodies decode, pipelined requests stay separate, and every malformed or oversized
// input ends in the right status with a message (never an exception or unbounded memory).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "inference/server_http_parser.h"

namespace megatron::inference {
namespace {

using State = HttpRequestParser::State;

HttpLimits small_limits() {
  HttpLimits l;
  l.max_head_bytes = 1024;
  l.max_headers = 16;
  l.max_body_bytes = 100;
  return l;
}

// Feeds `input` in pieces of `step` bytes (0: all at once) until the parser stops.
HttpRequestParser parse(const std::string& input, size_t step = 0, size_t* used = nullptr) {
  HttpRequestParser p(small_limits());
  size_t pos = 0;
  while (pos < input.size() && p.state() != State::Complete && p.state() != State::Error) {
    const size_t n = step == 0 ? input.size() - pos : std::min(step, input.size() - pos);
    const size_t took = p.feed(std::string_view(input).substr(pos, n));
    pos += took;
    if (took < n) break;  // stopped at the end of a request or at an error
  }
  if (used) *used = pos;
  return p;
}

TEST(HttpParser, RequestsParseAlikeWholeOrByteByByte) {
  const std::string req =
      "\r\nPOST /v1/completions?x=1 HTTP/1.1\r\nHost: a\r\nContent-Type: application/json\r\n"
      "Content-Length: 11\r\nAuthorization:  Bearer k  \r\n\r\n{\"a\": true}";
  for (size_t step : {0, 1, 2, 7}) {
    const auto p = parse(req, step);
    ASSERT_EQ(p.state(), State::Complete) << step << ": " << p.error_message();
    const auto& r = p.request();
    EXPECT_EQ(r.method, "POST");
    EXPECT_EQ(r.path, "/v1/completions");
    EXPECT_EQ(r.query, "x=1");
    EXPECT_EQ(r.body, "{\"a\": true}");
    EXPECT_EQ(r.header("authorization"), "Bearer k");
    EXPECT_EQ(r.header("content-type"), "application/json");
    EXPECT_TRUE(r.keep_alive);
  }
  // Bare LF line ends, HTTP/1.0 (closes unless keep-alive), absolute-form target.
  auto p = parse("GET http://host:5000/health HTTP/1.0\nX: y\n\n");
  ASSERT_EQ(p.state(), State::Complete);
  EXPECT_EQ(p.request().path, "/health");
  EXPECT_FALSE(p.request().keep_alive);
  p = parse("GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n");
  EXPECT_TRUE(p.request().keep_alive);
  p = parse("GET / HTTP/1.1\r\nConnection: close\r\n\r\n");
  EXPECT_FALSE(p.request().keep_alive);
}

TEST(HttpParser, ChunkedBodiesDecodeAndStopAtTheLimit) {
  const std::string req =
      "PUT /api HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
      "5;ext=1\r\nhello\r\n1\r\n \r\n0005\r\nworld\r\n0\r\nTrailer: x\r\n\r\n";
  for (size_t step : {0, 1, 3}) {
    const auto p = parse(req, step);
    ASSERT_EQ(p.state(), State::Complete) << step << ": " << p.error_message();
    EXPECT_EQ(p.request().body, "hello world");
  }
  // A chunk that would take the body past the limit is refused before it is read.
  auto p = parse("PUT /api HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nBEBC200\r\n");
  EXPECT_EQ(p.state(), State::Error);
  EXPECT_EQ(p.error_status(), 413);
  // Many small chunks: stopped when the decoded size passes the limit.
  std::string many = "PUT /api HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n";
  for (int i = 0; i < 50; ++i) many += "a\r\n0123456789\r\n";
  size_t used = 0;
  p = parse(many, 0, &used);
  EXPECT_EQ(p.error_status(), 413);
  EXPECT_LT(used, many.size());
  EXPECT_LE(p.request().body.size(), 100u);
  // Sizes beyond 64 bits, and garbage.
  p = parse("PUT /api HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nffffffffffffffffffff\r\n");
  EXPECT_EQ(p.error_status(), 413);
  p = parse("PUT /api HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n");
  EXPECT_EQ(p.error_status(), 400);
  p = parse("PUT /api HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabc\r\n");
  EXPECT_EQ(p.error_status(), 400);
}

TEST(HttpParser, PipelinedRequestsStaySeparate) {
  const std::string two = "GET /health HTTP/1.1\r\n\r\nPUT /api HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}";
  HttpRequestParser p(small_limits());
  size_t used = p.feed(two);
  ASSERT_EQ(p.state(), State::Complete);
  EXPECT_EQ(p.request().path, "/health");
  p.reset();
  EXPECT_EQ(p.feed(std::string_view(two).substr(used)), two.size() - used);
  ASSERT_EQ(p.state(), State::Complete);
  EXPECT_EQ(p.request().path, "/api");
  EXPECT_EQ(p.request().body, "{}");
}

TEST(HttpParser, EveryDefectHasItsStatus) {
  struct Case {
    std::string input;
    int status;
    const char* says;
  };
  const std::vector<Case> cases = {
      {"PUT /api HTTP/1.1\r\nContent-Length: -5\r\n\r\n", 400, "malformed Content-Length"},
      {"PUT /api HTTP/1.1\r\nContent-Length: 12abc\r\n\r\n", 400, "malformed Content-Length"},
      {"PUT /api HTTP/1.1\r\nContent-Length:\r\n\r\n", 400, "Content-Length"},
      {"PUT /api HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n", 400, "conflicting"},
      {"PUT /api HTTP/1.1\r\nContent-Length: 99999999999999999999999\r\n\r\n", 413, "larger than"},
      {"PUT /api HTTP/1.1\r\nContent-Length: 101\r\n\r\n", 413, "--max-request-bytes"},
      {"PUT /api HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n", 400, "both"},
      {"PUT /api HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", 501, "only chunked"},
      {"PUT /api HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n", 400, "HTTP/1.0"},
      {"PUT /api HTTP/1.1\r\nContent-Encoding: gzip\r\nContent-Length: 3\r\n\r\n", 415, "uncompressed"},
      {"PUT /api HTTP/1.1\r\nExpect: 200-ok\r\n\r\n", 417, "Expect"},
      {"PUT /api HTTP/2.0\r\n\r\n", 505, "HTTP version"},
      {"PUT /api\r\n\r\n", 400, "request line"},
      {"PUT  /api HTTP/1.1\r\n\r\n", 400, "request line"},
      {"P(T /api HTTP/1.1\r\n\r\n", 400, "method"},
      {"GET api HTTP/1.1\r\n\r\n", 400, "target"},
      {"GET / HTTP/1.1\r\nX: a\r\n  folded\r\n\r\n", 400, "folding"},
      {"GET / HTTP/1.1\r\nNo colon\r\n\r\n", 400, "malformed header"},
      {"GET / HTTP/1.1\r\nBad Name: x\r\n\r\n", 400, "malformed header"},
      {"GET / HTTP/1.1\r\nX: a\x01z\r\n\r\n", 400, "control characters"},
      {"GET / HTTP/1.1\r\nX: " + std::string(2000, 'a') + "\r\n\r\n", 431, "larger than"},
  };
  for (const auto& c : cases) {
    for (size_t step : {0, 1}) {
      const auto p = parse(c.input, step);
      EXPECT_EQ(p.state(), State::Error) << c.input;
      EXPECT_EQ(p.error_status(), c.status) << c.input << " -> " << p.error_message();
      EXPECT_NE(p.error_message().find(c.says), std::string::npos) << c.input << " -> " << p.error_message();
    }
  }
  std::string many = "GET / HTTP/1.1\r\n";
  for (int i = 0; i < 17; ++i) many += "X" + std::to_string(i) + ": v\r\n";
  EXPECT_EQ(parse(many + "\r\n").error_status(), 431);
  // Expect: 100-continue is noted (the transport answers it); the body then arrives.
  auto p = parse("PUT /api HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n", 0);
  EXPECT_EQ(p.state(), State::Body);
  EXPECT_TRUE(p.request().expect_continue);
  EXPECT_TRUE(p.head_done());
}

TEST(HttpParser, IncompleteInputWaitsWithoutGrowingPastTheLimits) {
  // A head that never ends stops at the head limit.
  HttpRequestParser p(small_limits());
  std::string endless = "GET / HTTP/1.1\r\n";
  while (endless.size() < 5000) endless += "X-A: b\r\n";
  size_t used = p.feed(endless);
  EXPECT_EQ(p.error_status(), 431);
  EXPECT_LE(used, 1025u);
  // Half a request: nothing decided yet.
  HttpRequestParser q(small_limits());
  EXPECT_EQ(q.feed("PUT /api HTTP/1.1\r\nContent-Length: 10\r\n\r\n12345"), 46u);
  EXPECT_EQ(q.state(), State::Body);
  EXPECT_TRUE(q.started());
}

}  // namespace
}  // namespace megatron::inference
