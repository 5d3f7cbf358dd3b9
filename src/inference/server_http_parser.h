// An incremental HTTP/1.x request parser for the text generation server, written for hostile
// input: every size is bounded (request head, header count, decoded body), the body limit is
// applied to what Content-Length announces before anything is read and to the decoded size of a
// chunked body as it arrives, and every defect ends the request with a status and a message.
//
// Accepted: "METHOD SP target SP HTTP/1.0|1.1" with origin-form ("/path?query") or absolute-form
// targets, headers "name: value" (CRLF or bare LF line ends; empty lines before the request line
// are skipped), a body framed by Content-Length or "Transfer-Encoding: chunked" (extensions and
// trailers ignored). Refused: both framings at once, several differing Content-Lengths, a
// Content-Length that is not a decimal number (400), other transfer codings (501), any
// Content-Encoding but identity (415: compressed bodies are not accepted, so no body can inflate
// past the limit), obsolete header folding and control characters (400), a head over the limit
// (431), a body over the limit (413), other HTTP versions (505), an Expect other than
// 100-continue (417).
//
// feed() stops at the end of one request, so the bytes of a pipelined next request stay with the
// caller, who feeds them after reset().
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace megatron::inference {

struct HttpLimits {
  size_t max_head_bytes = 16 * 1024;  // request line, headers and chunked trailers together
  size_t max_headers = 64;
  size_t max_body_bytes = 1 << 20;    // the decoded body
};

struct HttpRequest {
  std::string method;  // as sent ("GET", "PUT", ...)
  std::string target;  // as sent
  std::string path;    // the target's path, without query ("/v1/completions")
  std::string query;   // after '?', or empty
  int version_minor = 1;  // HTTP/1.<minor>
  std::vector<std::pair<std::string, std::string>> headers;  // names in lower case, values trimmed
  std::string body;    // decoded
  bool keep_alive = true;
  bool expect_continue = false;  // "Expect: 100-continue"
  bool has_body = false;         // Content-Length > 0 or chunked
  std::string remote_addr;       // filled by the transport

  // The first header of that (lower-case) name, or empty.
  std::string header(std::string_view lower_name) const;
  bool has_header(std::string_view lower_name) const;
};

class HttpRequestParser {
 public:
  enum class State { Head, Body, Complete, Error };

  explicit HttpRequestParser(HttpLimits limits = {}) : limits_(limits) {}

  // Consumes a prefix of `data` and returns its length: everything up to the end of the current
  // request (state Complete) or of the defect (state Error), else all of it.
  size_t feed(std::string_view data);
  State state() const { return state_; }
  // The request line and headers are parsed (state Body or Complete): request() has them.
  bool head_done() const { return state_ == State::Body || state_ == State::Complete; }
  // Whether any byte of the current request has arrived.
  bool started() const { return started_; }
  const HttpRequest& request() const { return request_; }
  HttpRequest& request() { return request_; }
  int error_status() const { return error_status_; }
  const std::string& error_message() const { return error_message_; }
  // Ready for the next request on the same connection.
  void reset();

 private:
  enum class BodyMode { None, Length, Chunked };
  enum class ChunkState { Size, Data, DataEnd, Trailer };

  size_t feed_head(std::string_view data);
  size_t feed_body(std::string_view data);
  void parse_head();
  void fail(int status, std::string message);

  HttpLimits limits_;
  State state_ = State::Head;
  bool started_ = false;
  std::string head_;  // bytes of the head so far
  HttpRequest request_;
  int error_status_ = 0;
  std::string error_message_;
  BodyMode body_mode_ = BodyMode::None;
  uint64_t body_left_ = 0;  // Length: bytes still to read; Chunked: of the current chunk
  ChunkState chunk_state_ = ChunkState::Size;
  std::string line_;        // the current chunk-size or trailer line
  size_t trailer_bytes_ = 0;
};

// "200 OK", "413 Content Too Large", ...: the reason phrase of a status code.
const char* http_reason(int status);

}  // namespace megatron::inference
