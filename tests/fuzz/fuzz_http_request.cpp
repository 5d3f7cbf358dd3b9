// libFuzzer target: the server's HTTP request parser (src/inference/server_http_parser.h). The
// input is fed whole and in pieces whose sizes come from its first byte; both must reach the same
// state and request, every request and body must stay within the limits, and the parser must
// never throw.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "inference/server_http_parser.h"

using megatron::inference::HttpLimits;
using megatron::inference::HttpRequestParser;

namespace {

HttpLimits limits() {
  HttpLimits l;
  l.max_head_bytes = 2048;
  l.max_headers = 32;
  l.max_body_bytes = 4096;
  return l;
}

// Parses requests back to back (pipelining) until the input ends or a request fails; returns a
// digest of what was parsed.
std::string run(std::string_view input, size_t piece) {
  HttpRequestParser p(limits());
  std::string digest;
  size_t pos = 0;
  while (pos < input.size()) {
    const size_t n = piece == 0 ? input.size() - pos : std::min(piece, input.size() - pos);
    const size_t used = p.feed(input.substr(pos, n));
    if (used > n) std::abort();
    pos += used;
    if (p.state() == HttpRequestParser::State::Error) {
      digest += "E" + std::to_string(p.error_status());
      if (p.error_status() < 400 || p.error_status() > 599 || p.error_message().empty()) std::abort();
      break;
    }
    if (p.state() == HttpRequestParser::State::Complete) {
      const auto& r = p.request();
      if (r.body.size() > limits().max_body_bytes || r.headers.size() > limits().max_headers) std::abort();
      digest += "R" + r.method + " " + r.path + " " + std::to_string(r.body.size()) + ":" + r.body;
      p.reset();
      continue;
    }
    if (used < n) std::abort();  // only a complete request or an error stops early
  }
  digest += "S" + std::to_string(int(p.state()));
  return digest;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const size_t piece = 1 + data[0] % 13;
  const std::string_view input(reinterpret_cast<const char*>(data + 1), size - 1);
  if (run(input, 0) != run(input, piece)) std::abort();
  return 0;
}
