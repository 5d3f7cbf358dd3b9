// HTTP/1.x request parsing for the server; see server_http_parser.h.
#include "inference/server_http_parser.h"

#include <algorithm>
#include <cctype>

#include "core/error.h"

namespace megatron::inference {

namespace {

bool is_tchar(unsigned char c) {
  return std::isalnum(c) || std::string_view("!#$%&'*+-.^_`|~").find(char(c)) != std::string_view::npos;
}

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = char(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// The comma-separated elements of a header value, trimmed; empty elements dropped.
std::vector<std::string_view> list_elements(std::string_view value) {
  std::vector<std::string_view> out;
  size_t start = 0;
  while (start <= value.size()) {
    size_t comma = value.find(',', start);
    if (comma == std::string_view::npos) comma = value.size();
    const std::string_view item = trim(value.substr(start, comma - start));
    if (!item.empty()) out.push_back(item);
    start = comma + 1;
  }
  return out;
}

// A short printable rendering of client bytes for error messages.
std::string printable(std::string_view s) {
  std::string out;
  for (char c : s.substr(0, 64)) out.push_back(c >= 0x20 && c < 0x7f ? c : '?');
  if (s.size() > 64) out += "...";
  return out;
}

}  // namespace

std::string HttpRequest::header(std::string_view lower_name) const {
  for (const auto& [name, value] : headers)
    if (name == lower_name) return value;
  return {};
}

bool HttpRequest::has_header(std::string_view lower_name) const {
  return std::any_of(headers.begin(), headers.end(),
                     [&](const auto& h) { return h.first == lower_name; });
}

void HttpRequestParser::reset() {
  state_ = State::Head;
  started_ = false;
  head_.clear();
  request_ = HttpRequest{};
  error_status_ = 0;
  error_message_.clear();
  body_mode_ = BodyMode::None;
  body_left_ = 0;
  chunk_state_ = ChunkState::Size;
  line_.clear();
  trailer_bytes_ = 0;
}

void HttpRequestParser::fail(int status, std::string message) {
  state_ = State::Error;
  error_status_ = status;
  error_message_ = std::move(message);
}

size_t HttpRequestParser::feed(std::string_view data) {
  if (state_ == State::Complete || state_ == State::Error) return 0;
  size_t used = 0;
  if (state_ == State::Head) {
    used = feed_head(data);
    if (state_ != State::Body) return used;
  }
  return used + feed_body(data.substr(used));
}

size_t HttpRequestParser::feed_head(std::string_view data) {
  size_t i = 0;
  if (!data.empty()) started_ = true;
  // Empty lines before a request line are skipped (clients send a CRLF after a POST body).
  if (head_.empty())
    while (i < data.size() && (data[i] == '\r' || data[i] == '\n')) ++i;
  for (; i < data.size(); ++i) {
    head_.push_back(data[i]);
    if (head_.size() > limits_.max_head_bytes) {
      fail(431, str("the request line and headers are larger than ", limits_.max_head_bytes,
                    " bytes"));
      return i + 1;
    }
    if (data[i] != '\n') continue;
    const size_t n = head_.size();
    const bool blank_line = (n >= 2 && head_[n - 2] == '\n') ||
                            (n >= 3 && head_[n - 2] == '\r' && head_[n - 3] == '\n');
    if (blank_line) {
      parse_head();
      return i + 1;
    }
  }
  return i;
}

void HttpRequestParser::parse_head() {
  std::vector<std::string_view> lines;
  std::string_view rest(head_);
  while (!rest.empty()) {
    size_t nl = rest.find('\n');
    std::string_view line = rest.substr(0, nl);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    lines.push_back(line);
    rest.remove_prefix(nl == std::string_view::npos ? rest.size() : nl + 1);
  }
  while (!lines.empty() && lines.back().empty()) lines.pop_back();
  if (lines.empty()) return fail(400, "empty request");

  // Request line: METHOD SP target SP HTTP/1.x
  const std::string_view request_line = lines[0];
  const size_t sp1 = request_line.find(' ');
  const size_t sp2 = sp1 == std::string_view::npos ? sp1 : request_line.find(' ', sp1 + 1);
  if (sp2 == std::string_view::npos || request_line.find(' ', sp2 + 1) != std::string_view::npos)
    return fail(400, "malformed request line '" + printable(request_line) +
                         "'; expected 'METHOD /path HTTP/1.1'");
  const std::string_view method = request_line.substr(0, sp1);
  const std::string_view target = request_line.substr(sp1 + 1, sp2 - sp1 - 1);
  const std::string_view version = request_line.substr(sp2 + 1);
  if (method.empty() || method.size() > 16 ||
      !std::all_of(method.begin(), method.end(), [](char c) { return is_tchar(static_cast<unsigned char>(c)); }))
    return fail(400, "malformed method '" + printable(method) + "'");
  if (version == "HTTP/1.1") request_.version_minor = 1;
  else if (version == "HTTP/1.0") request_.version_minor = 0;
  else if (version.starts_with("HTTP/"))
    return fail(505, "HTTP version '" + printable(version) + "' is not supported; use HTTP/1.1");
  else
    return fail(400, "malformed request line '" + printable(request_line) +
                         "'; expected 'METHOD /path HTTP/1.1'");
  if (target.empty() || !std::all_of(target.begin(), target.end(), [](char c) {
        return static_cast<unsigned char>(c) > 0x20 && static_cast<unsigned char>(c) != 0x7f;
      }))
    return fail(400, "malformed request target '" + printable(target) + "'");
  std::string_view path = target;
  for (std::string_view scheme : {"http://", "https://"}) {
    if (lower(path.substr(0, scheme.size())) == scheme) {  // absolute-form: drop the authority
      const size_t slash = path.find('/', scheme.size());
      path = slash == std::string_view::npos ? std::string_view("/") : path.substr(slash);
    }
  }
  if (path != "*" && path.front() != '/')
    return fail(400, "malformed request target '" + printable(target) + "'");
  const size_t fragment = path.find('#');
  if (fragment != std::string_view::npos) path = path.substr(0, fragment);
  const size_t q = path.find('?');
  request_.method = std::string(method);
  request_.target = std::string(target);
  request_.path = std::string(path.substr(0, q));
  request_.query = q == std::string_view::npos ? std::string() : std::string(path.substr(q + 1));

  // Header fields.
  for (size_t k = 1; k < lines.size(); ++k) {
    const std::string_view line = lines[k];
    if (line.front() == ' ' || line.front() == '\t')
      return fail(400, "folded header lines (obsolete line folding) are not accepted");
    const size_t colon = line.find(':');
    if (colon == std::string_view::npos || colon == 0 ||
        !std::all_of(line.begin(), line.begin() + long(colon),
                     [](char c) { return is_tchar(static_cast<unsigned char>(c)); }))
      return fail(400, "malformed header line '" + printable(line) + "'");
    const std::string_view value = trim(line.substr(colon + 1));
    if (!std::all_of(value.begin(), value.end(), [](char c) {
          const auto u = static_cast<unsigned char>(c);
          return u == '\t' || (u >= 0x20 && u != 0x7f);
        }))
      return fail(400, "control characters in header '" + printable(line.substr(0, colon)) + "'");
    if (request_.headers.size() >= limits_.max_headers)
      return fail(431, str("more than ", limits_.max_headers, " header fields"));
    request_.headers.emplace_back(lower(line.substr(0, colon)), std::string(value));
  }

  // Framing and the headers that change how the request is read.
  std::vector<std::string> transfer, lengths;
  bool keep_alive_token = false, close_token = false;
  for (const auto& [name, value] : request_.headers) {
    if (name == "transfer-encoding") {
      for (auto e : list_elements(value)) transfer.push_back(lower(e));
    } else if (name == "content-length") {
      const auto elements = list_elements(value);
      if (elements.empty()) return fail(400, "empty Content-Length header");
      for (auto e : elements) lengths.emplace_back(e);
    } else if (name == "content-encoding") {
      for (auto e : list_elements(value))
        if (lower(e) != "identity")
          return fail(415, "compressed request bodies are not accepted (Content-Encoding: " +
                               printable(value) + "); send the body uncompressed");
    } else if (name == "expect") {
      if (lower(value) != "100-continue")
        return fail(417, "unsupported Expect: '" + printable(value) + "' (only 100-continue)");
      request_.expect_continue = request_.version_minor >= 1;
    } else if (name == "connection") {
      for (auto e : list_elements(value)) {
        keep_alive_token = keep_alive_token || lower(e) == "keep-alive";
        close_token = close_token || lower(e) == "close";
      }
    }
  }
  // HTTP/1.1 keeps the connection unless told to close; HTTP/1.0 closes unless told to keep it.
  request_.keep_alive = request_.version_minor >= 1 ? !close_token : keep_alive_token && !close_token;
  if (!transfer.empty()) {
    if (!lengths.empty())
      return fail(400, "both Transfer-Encoding and Content-Length are set; send one of them");
    if (request_.version_minor == 0)
      return fail(400, "Transfer-Encoding is not allowed in HTTP/1.0 requests");
    if (transfer.size() != 1 || transfer[0] != "chunked")
      return fail(501, "Transfer-Encoding '" + printable(request_.header("transfer-encoding")) +
                           "' is not supported (only chunked)");
    body_mode_ = BodyMode::Chunked;
    request_.has_body = true;
    state_ = State::Body;
    return;
  }
  if (!lengths.empty()) {
    for (const auto& l : lengths)
      if (l != lengths[0])
        return fail(400, "conflicting Content-Length values '" + printable(lengths[0]) + "' and '" +
                             printable(l) + "'");
    const std::string& l = lengths[0];
    if (!std::all_of(l.begin(), l.end(), [](char c) { return c >= '0' && c <= '9'; }))
      return fail(400, "malformed Content-Length '" + printable(l) +
                           "'; it must be a non-negative decimal number of bytes");
    const size_t first = std::min(l.find_first_not_of('0'), l.size());
    uint64_t n = 0;
    if (l.size() - first > 19) n = UINT64_MAX;  // more than fits: over any limit
    else
      for (char c : l) n = n * 10 + uint64_t(c - '0');
    if (n > limits_.max_body_bytes)
      return fail(413, str("the request body (", l.size() - first > 19 ? std::string(l) : str(n),
                           " bytes) is larger than the limit of ", limits_.max_body_bytes,
                           " bytes (--max-request-bytes)"));
    if (n > 0) {
      body_mode_ = BodyMode::Length;
      body_left_ = n;
      request_.has_body = true;
      state_ = State::Body;
      return;
    }
  }
  state_ = State::Complete;
}

size_t HttpRequestParser::feed_body(std::string_view data) {
  size_t i = 0;
  if (body_mode_ == BodyMode::Length) {
    const size_t n = size_t(std::min<uint64_t>(body_left_, data.size()));
    request_.body.append(data.data(), n);
    body_left_ -= n;
    if (body_left_ == 0) state_ = State::Complete;
    return n;
  }
  // Chunked: size line, data, CRLF, ..., a zero-size chunk, trailer lines, an empty line.
  auto too_large = [&] {
    fail(413, str("the request body is larger than the limit of ", limits_.max_body_bytes,
                  " bytes (--max-request-bytes)"));
  };
  while (i < data.size() && state_ == State::Body) {
    if (chunk_state_ == ChunkState::Data) {
      const size_t n = size_t(std::min<uint64_t>(body_left_, data.size() - i));
      request_.body.append(data.data() + i, n);
      body_left_ -= n;
      i += n;
      if (body_left_ == 0) chunk_state_ = ChunkState::DataEnd;
      continue;
    }
    // A line: the chunk size, the CRLF after a chunk's data, or a trailer line.
    const char c = data[i++];
    if (c != '\n') {
      line_.push_back(c);
      if (line_.size() > 1024) {
        fail(400, "malformed chunked body: a line longer than 1024 bytes");
        return i;
      }
      continue;
    }
    std::string_view line(line_);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (chunk_state_ == ChunkState::DataEnd) {
      if (!line.empty()) {
        fail(400, "malformed chunked body: chunk data longer than its size");
        return i;
      }
      chunk_state_ = ChunkState::Size;
    } else if (chunk_state_ == ChunkState::Size) {
      size_t digits = 0, significant = 0;
      uint64_t size = 0;
      for (; digits < line.size() && std::isxdigit(static_cast<unsigned char>(line[digits])); ++digits) {
        const char h = line[digits];
        if (significant > 0 || h != '0') ++significant;
        if (significant > 15) break;  // over 2^60 bytes: over any limit
        size = size * 16 + uint64_t(std::isdigit(static_cast<unsigned char>(h)) ? h - '0'
                                                                                : std::tolower(h) - 'a' + 10);
      }
      if (significant > 15) {
        too_large();
        return i;
      }
      const std::string_view after = trim(line.substr(digits));
      if (digits == 0 || (!after.empty() && after.front() != ';')) {
        fail(400, "malformed chunked body: bad chunk size line '" + printable(line) + "'");
        return i;
      }
      if (size == 0) {
        chunk_state_ = ChunkState::Trailer;
      } else {
        if (size > limits_.max_body_bytes - request_.body.size()) {
          too_large();  // stop at the limit: nothing of this chunk is read
          return i;
        }
        body_left_ = size;
        chunk_state_ = ChunkState::Data;
      }
    } else {  // Trailer
      trailer_bytes_ += line_.size() + 1;
      if (head_.size() + trailer_bytes_ > limits_.max_head_bytes) {
        fail(431, str("the request headers and trailers are larger than ", limits_.max_head_bytes,
                      " bytes"));
        return i;
      }
      if (line.empty()) state_ = State::Complete;
    }
    line_.clear();
  }
  return i;
}

const char* http_reason(int status) {
  switch (status) {
    case 100: return "Continue";
    case 200: return "OK";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 411: return "Length Required";
    case 413: return "Content Too Large";
    case 415: return "Unsupported Media Type";
    case 417: return "Expectation Failed";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    case 505: return "HTTP Version Not Supported";
    default: return "Status";
  }
}

}  // namespace megatron::inference
