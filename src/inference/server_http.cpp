// The server's event-driven HTTP front; see server_http.h.
#include "inference/server_http.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "core/error.h"
#include "core/log.h"

namespace megatron::inference {

namespace {

using Clock = std::chrono::steady_clock;
constexpr uint64_t kListenId = 0, kWakeId = ~uint64_t(0);
constexpr size_t kReadChunk = 64 * 1024;
constexpr auto kLingerTime = std::chrono::seconds(1);

std::string json_error(const std::string& message) {
  std::string out = "{\"error\": \"";
  for (char c : message) {
    if (c == '"' || c == '\\') out.push_back('\\');
    if (static_cast<unsigned char>(c) < 0x20) continue;
    out.push_back(c);
  }
  return out + "\"}";
}

HttpResponse error_response(int status, const std::string& message) {
  HttpResponse r;
  r.status = status;
  r.body = json_error(message);
  return r;
}

// Between the loop and a worker streaming to one connection.
struct StreamGate {
  std::atomic<bool> closed{false};   // the connection is gone: stop producing
  std::atomic<bool> aborted{false};  // the client read too slowly: the stream was cut
  std::atomic<size_t> queued{0};     // bytes posted but not yet written to the socket
};

struct Task {
  uint64_t conn = 0;
  HttpRequest request;
  HttpHandler handler;
  std::shared_ptr<StreamGate> gate;
};

// A worker's message to the loop.
struct Completion {
  enum class Kind { Response, StreamStart, Chunk, StreamEnd };
  Kind kind = Kind::Response;
  uint64_t conn = 0;
  HttpResponse response;
  std::string data;
};

struct Conn {
  enum class Phase { Idle, Reading, Handling, Writing, Draining };
  int fd = -1;
  uint64_t id = 0;
  std::string remote;
  HttpRequestParser parser;
  std::string in;   // read but not yet parsed: the start of a pipelined next request
  std::string out;  // to write
  size_t out_sent = 0;
  Phase phase = Phase::Idle;
  Clock::time_point since;     // start of the wait for the current request (eviction order)
  Clock::time_point deadline;  // of the current phase
  bool head_checked = false;
  HttpRoute route;
  bool keep_alive = true;  // of the request being answered
  int version_minor = 1;
  bool streaming = false;  // a streamed response is open
  bool chunked = false;
  std::shared_ptr<StreamGate> gate;
  uint32_t events = 0;
};

}  // namespace

std::string serialize_response_head(const HttpResponse& r, size_t content_length, bool keep_alive,
                                    bool chunked) {
  std::string head = str("HTTP/1.1 ", r.status, " ", http_reason(r.status), "\r\n");
  if (!r.content_type.empty()) head += "Content-Type: " + r.content_type + "\r\n";
  if (chunked) head += "Transfer-Encoding: chunked\r\n";
  else if (content_length != SIZE_MAX) head += str("Content-Length: ", content_length, "\r\n");
  for (const auto& [name, value] : r.headers) head += name + ": " + value + "\r\n";
  if (!keep_alive) head += "Connection: close\r\n";
  return head + "\r\n";
}

struct HttpFront::Impl {
  Impl(HttpFrontOptions options, HttpRouter r) : o(std::move(options)), router(std::move(r)) {}

  HttpFrontOptions o;
  HttpRouter router;
  int listen_fd = -1, epoll_fd = -1, wake_fd = -1;
  std::atomic<bool> stopping{false};
  std::unordered_map<uint64_t, std::unique_ptr<Conn>> conns;
  std::vector<uint64_t> dead;
  std::vector<uint64_t> ready;  // answered, with a pipelined request already buffered
  uint64_t next_id = 1;
  bool listen_paused = false;
  Clock::time_point listen_resume;

  std::mutex task_mutex;
  std::condition_variable task_cv;
  std::deque<Task> tasks;
  bool workers_stop = false;
  std::vector<std::thread> workers;

  std::mutex done_mutex;
  std::vector<Completion> done;

  std::atomic<int64_t> accepted{0}, evicted{0}, timed_out{0}, refused{0}, requests{0};

  // ---- workers ------------------------------------------------------------------------------
  void post(Completion c) {
    {
      std::lock_guard lock(done_mutex);
      done.push_back(std::move(c));
    }
    const uint64_t one = 1;
    [[maybe_unused]] ssize_t n = ::write(wake_fd, &one, sizeof one);
  }

  void worker_loop() {
    for (;;) {
      Task t;
      {
        std::unique_lock lock(task_mutex);
        task_cv.wait(lock, [&] { return workers_stop || !tasks.empty(); });
        if (workers_stop) return;
        t = std::move(tasks.front());
        tasks.pop_front();
      }
      HttpResponse res;
      try {
        t.handler(t.request, res);
      } catch (const std::exception& e) {
        log_warn("server: internal error: ", e.what());
        res = error_response(500, str("internal error: ", e.what()));
      }
      if (!res.stream) {
        post({Completion::Kind::Response, t.conn, std::move(res), {}});
        continue;
      }
      auto stream = std::move(res.stream);
      res.stream = nullptr;
      post({Completion::Kind::StreamStart, t.conn, std::move(res), {}});
      auto& gate = *t.gate;
      const auto write = [&](std::string_view piece) {
        if (gate.closed || stopping) return false;
        if (gate.queued.load() > o.max_stream_backlog) {
          gate.aborted = true;
          return false;
        }
        gate.queued += piece.size();
        post({Completion::Kind::Chunk, t.conn, {}, std::string(piece)});
        return true;
      };
      try {
        stream(write);
      } catch (const std::exception& e) {
        log_warn("server: streaming a response failed: ", e.what());
        gate.aborted = true;
      }
      post({Completion::Kind::StreamEnd, t.conn, {}, {}});
    }
  }

  // ---- connections --------------------------------------------------------------------------
  void set_events(Conn& c) {
    if (c.fd < 0) return;
    uint32_t want = 0;
    if (c.phase == Conn::Phase::Idle || c.phase == Conn::Phase::Reading ||
        c.phase == Conn::Phase::Draining)
      want |= EPOLLIN;
    if (c.out_sent < c.out.size()) want |= EPOLLOUT;
    if (want == c.events) return;
    epoll_event ev{};
    ev.events = want;
    ev.data.u64 = c.id;
    ::epoll_ctl(epoll_fd, EPOLL_CTL_MOD, c.fd, &ev);
    c.events = want;
  }

  void close_conn(Conn& c) {
    if (c.fd < 0) return;
    ::epoll_ctl(epoll_fd, EPOLL_CTL_DEL, c.fd, nullptr);
    ::close(c.fd);
    c.fd = -1;
    if (c.gate) c.gate->closed = true;
    dead.push_back(c.id);
  }

  // Between requests, or sending a head not yet accepted (or, without an API key, any request
  // not yet complete): the connections a newcomer may displace.
  bool evictable(const Conn& c) const {
    if (c.fd < 0) return false;
    if (c.phase == Conn::Phase::Idle || c.phase == Conn::Phase::Draining) return true;
    return c.phase == Conn::Phase::Reading && (!c.head_checked || !o.heads_authenticate);
  }

  void start_waiting(Conn& c, Clock::time_point now) {
    c.phase = Conn::Phase::Idle;
    c.since = now;
    c.deadline = now + std::chrono::milliseconds(o.idle_timeout_ms);
    c.parser.reset();
    c.head_checked = false;
    c.route = HttpRoute{};
    c.gate.reset();
    c.streaming = false;
  }

  void accept_all() {
    for (;;) {
      sockaddr_storage addr{};
      socklen_t len = sizeof addr;
      const int fd = ::accept4(listen_fd, reinterpret_cast<sockaddr*>(&addr), &len,
                               SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
          // Out of descriptors: stop accepting for a moment instead of spinning.
          ::epoll_ctl(epoll_fd, EPOLL_CTL_DEL, listen_fd, nullptr);
          listen_paused = true;
          listen_resume = Clock::now() + std::chrono::milliseconds(100);
        }
        return;
      }
      ++accepted;
      const auto now = Clock::now();
      size_t alive = 0, waiting = 0;
      Conn* oldest = nullptr;
      for (auto& [id, c] : conns) {
        if (c->fd < 0) continue;
        ++alive;
        if (!evictable(*c)) continue;
        ++waiting;
        if (!oldest || c->since < oldest->since) oldest = c.get();
      }
      if (waiting >= size_t(o.max_unauthenticated) || alive >= size_t(o.max_connections)) {
        if (oldest) {
          close_conn(*oldest);
          ++evicted;
        } else if (alive >= size_t(o.max_connections)) {
          ::close(fd);
          ++refused;
          continue;
        }
      }
      const int yes = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &yes, sizeof yes);
      auto c = std::make_unique<Conn>();
      c->fd = fd;
      c->id = next_id++;
      c->parser = HttpRequestParser(o.limits);
      char host[INET6_ADDRSTRLEN] = "?";
      if (addr.ss_family == AF_INET)
        ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(&addr)->sin_addr, host, sizeof host);
      else if (addr.ss_family == AF_INET6)
        ::inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(&addr)->sin6_addr, host, sizeof host);
      c->remote = host;
      start_waiting(*c, now);
      epoll_event ev{};
      ev.events = EPOLLIN;
      ev.data.u64 = c->id;
      if (::epoll_ctl(epoll_fd, EPOLL_CTL_ADD, fd, &ev) != 0) {
        ::close(fd);
        continue;
      }
      c->events = EPOLLIN;
      Conn& added = *c;
      conns.emplace(added.id, std::move(c));
      // A client usually sends its request with the connection: read it now, so that a head
      // already here takes the connection out of the displaceable set before later newcomers
      // of the same burst are accepted.
      on_readable(added);
    }
  }

  void flush(Conn& c) {
    while (c.fd >= 0 && c.out_sent < c.out.size()) {
      const ssize_t n = ::send(c.fd, c.out.data() + c.out_sent, c.out.size() - c.out_sent, MSG_NOSIGNAL);
      if (n > 0) {
        c.out_sent += size_t(n);
        if (c.phase == Conn::Phase::Writing)  // (a 100 Continue keeps the request's deadline)
          c.deadline = Clock::now() + std::chrono::milliseconds(o.write_timeout_ms);
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
      return close_conn(c);
    }
    if (c.gate) c.gate->queued = c.out.size() - c.out_sent;
    if (c.out_sent < c.out.size()) return set_events(c);
    c.out.clear();
    c.out_sent = 0;
    if (c.phase != Conn::Phase::Writing || c.streaming) return set_events(c);
    // The response is complete.
    if (!c.keep_alive) {
      // Lingering close: the client reads the response before the connection goes.
      ::shutdown(c.fd, SHUT_WR);
      c.phase = Conn::Phase::Draining;
      c.deadline = Clock::now() + kLingerTime;
      return set_events(c);
    }
    start_waiting(c, Clock::now());
    set_events(c);
    if (!c.in.empty()) ready.push_back(c.id);  // a pipelined request: parsed by the loop next
  }

  void respond(Conn& c, const HttpResponse& res) {
    // A body not (completely) read leaves the connection unusable for another request.
    if (c.parser.state() != HttpRequestParser::State::Complete) c.keep_alive = false;
    c.out += serialize_response_head(res, res.body.size(), c.keep_alive, false);
    c.out += res.body;
    c.phase = Conn::Phase::Writing;
    c.deadline = Clock::now() + std::chrono::milliseconds(o.write_timeout_ms);
    flush(c);
  }

  void dispatch(Conn& c) {
    ++requests;
    HttpRequest request = std::move(c.parser.request());
    c.keep_alive = request.keep_alive;
    c.version_minor = request.version_minor;
    if (c.route.kind == HttpRoute::Kind::Inline) {
      HttpResponse res;
      try {
        c.route.handler(request, res);
      } catch (const std::exception& e) {
        res = error_response(500, str("internal error: ", e.what()));
      }
      return respond(c, res);
    }
    {
      std::lock_guard lock(task_mutex);
      if (tasks.size() < o.max_waiting_requests) {
        c.gate = std::make_shared<StreamGate>();
        tasks.push_back({c.id, std::move(request), c.route.handler, c.gate});
        c.phase = Conn::Phase::Handling;
      }
    }
    if (c.phase != Conn::Phase::Handling)
      return respond(c, error_response(503, str("the server is busy (", o.max_waiting_requests,
                                                " requests waiting); retry later")));
    task_cv.notify_one();
    set_events(c);
  }

  // Feeds buffered input to the parser and acts on what it finds.
  void advance(Conn& c) {
    while (c.fd >= 0 && (c.phase == Conn::Phase::Idle || c.phase == Conn::Phase::Reading) &&
           !c.in.empty()) {
      const size_t used = c.parser.feed(c.in);
      c.in.erase(0, used);
      if (c.phase == Conn::Phase::Idle && c.parser.started()) {
        c.phase = Conn::Phase::Reading;
        c.deadline = Clock::now() + std::chrono::milliseconds(o.request_timeout_ms);
      }
      if (c.parser.state() == HttpRequestParser::State::Error) {
        c.keep_alive = false;
        return respond(c, error_response(c.parser.error_status(), c.parser.error_message()));
      }
      if (c.parser.head_done() && !c.head_checked) {
        c.head_checked = true;
        c.parser.request().remote_addr = c.remote;
        try {
          c.route = router(c.parser.request());
        } catch (const std::exception& e) {
          c.route = {HttpRoute::Kind::Respond, error_response(500, str("internal error: ", e.what())), {}};
        }
        if (c.route.kind == HttpRoute::Kind::Respond) {
          c.keep_alive = c.parser.request().keep_alive;
          return respond(c, c.route.response);
        }
        if (c.parser.request().expect_continue && c.parser.state() == HttpRequestParser::State::Body) {
          c.out += "HTTP/1.1 100 Continue\r\n\r\n";
          flush(c);
        }
      }
      if (c.parser.state() == HttpRequestParser::State::Complete) return dispatch(c);
    }
  }

  void on_readable(Conn& c) {
    char buf[kReadChunk];
    if (c.phase == Conn::Phase::Draining) {
      for (;;) {
        const ssize_t n = ::recv(c.fd, buf, sizeof buf, 0);
        if (n > 0) continue;
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
        return close_conn(c);
      }
    }
    if (c.phase != Conn::Phase::Idle && c.phase != Conn::Phase::Reading) return;
    const ssize_t n = ::recv(c.fd, buf, sizeof buf, 0);
    if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) return;
    if (n <= 0) return close_conn(c);  // closed by the client (or failed) before a full request
    c.in.append(buf, size_t(n));
    advance(c);
  }

  void on_event(uint64_t id, uint32_t events) {
    auto it = conns.find(id);
    if (it == conns.end() || it->second->fd < 0) return;
    Conn& c = *it->second;
    if (events & EPOLLERR) return close_conn(c);
    if (events & EPOLLHUP) {
      // Both directions are gone: nothing more can be read or written.
      if (c.phase == Conn::Phase::Idle || c.phase == Conn::Phase::Reading) on_readable(c);
      return close_conn(c);
    }
    if (events & EPOLLIN) on_readable(c);
    if (c.fd >= 0 && (events & EPOLLOUT)) flush(c);
  }

  void apply_completions() {
    std::vector<Completion> batch;
    {
      std::lock_guard lock(done_mutex);
      batch.swap(done);
    }
    for (auto& m : batch) {
      auto it = conns.find(m.conn);
      if (it == conns.end() || it->second->fd < 0) continue;
      Conn& c = *it->second;
      switch (m.kind) {
        case Completion::Kind::Response:
          respond(c, m.response);
          break;
        case Completion::Kind::StreamStart:
          c.streaming = true;
          c.chunked = c.version_minor >= 1;
          if (!c.chunked) c.keep_alive = false;  // HTTP/1.0: the end of the body is the close
          c.out += serialize_response_head(m.response, SIZE_MAX, c.keep_alive, c.chunked);
          c.phase = Conn::Phase::Writing;
          c.deadline = Clock::now() + std::chrono::milliseconds(o.write_timeout_ms);
          flush(c);
          break;
        case Completion::Kind::Chunk:
          if (m.data.empty()) break;
          if (c.chunked) c.out += str(std::hex, m.data.size(), "\r\n");
          c.out += m.data;
          if (c.chunked) c.out += "\r\n";
          flush(c);
          break;
        case Completion::Kind::StreamEnd:
          c.streaming = false;
          if (c.gate && c.gate->aborted) {
            close_conn(c);  // a cut stream must not look complete
            break;
          }
          if (c.chunked) c.out += "0\r\n\r\n";
          flush(c);
          break;
      }
    }
  }

  void sweep() {
    const auto now = Clock::now();
    if (listen_paused && now >= listen_resume) {
      epoll_event ev{};
      ev.events = EPOLLIN;
      ev.data.u64 = kListenId;
      ::epoll_ctl(epoll_fd, EPOLL_CTL_ADD, listen_fd, &ev);
      listen_paused = false;
    }
    for (auto& [id, cp] : conns) {
      Conn& c = *cp;
      if (c.fd < 0 || now < c.deadline) continue;
      switch (c.phase) {
        case Conn::Phase::Idle:
        case Conn::Phase::Draining:
          close_conn(c);
          break;
        case Conn::Phase::Reading:
          ++timed_out;
          c.keep_alive = false;
          respond(c, error_response(408, str("the request did not arrive completely within ",
                                             o.request_timeout_ms / 1000.0, " s")));
          break;
        case Conn::Phase::Writing:
          if (c.out_sent < c.out.size()) {  // no progress writing
            ++timed_out;
            close_conn(c);
          }
          break;
        case Conn::Phase::Handling:
          break;
      }
    }
  }

  // Requests that were pipelined behind an answered one, one at a time per connection and pass.
  void run_ready() {
    while (!ready.empty()) {
      std::vector<uint64_t> batch;
      batch.swap(ready);
      for (uint64_t id : batch) {
        auto it = conns.find(id);
        if (it != conns.end() && it->second->fd >= 0) advance(*it->second);
      }
    }
  }

  void reap() {
    for (uint64_t id : dead) conns.erase(id);
    dead.clear();
  }
};

HttpFront::HttpFront(HttpFrontOptions options, HttpRouter router)
    : impl_(std::make_unique<Impl>(std::move(options), std::move(router))) {
  auto& s = *impl_;
  MG_REQUIRE(s.o.worker_threads >= 1, "the server needs at least one worker thread");
  // Stay below the descriptor limit: each connection is one descriptor.
  rlimit lim{};
  if (::getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur != RLIM_INFINITY)
    s.o.max_connections = int(std::min<rlim_t>(rlim_t(s.o.max_connections),
                                               lim.rlim_cur > 128 ? lim.rlim_cur - 64 : 64));
  s.o.max_unauthenticated = std::max(1, std::min(s.o.max_unauthenticated, s.o.max_connections));
  s.epoll_fd = ::epoll_create1(EPOLL_CLOEXEC);
  s.wake_fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  MG_REQUIRE(s.epoll_fd >= 0 && s.wake_fd >= 0, "cannot create the server's event loop: ",
             std::strerror(errno));
  for (int i = 0; i < s.o.worker_threads; ++i) s.workers.emplace_back([&s] { s.worker_loop(); });
}

HttpFront::~HttpFront() {
  stop();
  join_workers();
  auto& s = *impl_;
  for (auto& [id, c] : s.conns)
    if (c->fd >= 0) ::close(c->fd);
  if (s.listen_fd >= 0) ::close(s.listen_fd);
  if (s.epoll_fd >= 0) ::close(s.epoll_fd);
  if (s.wake_fd >= 0) ::close(s.wake_fd);
}

int HttpFront::bind() {
  auto& s = *impl_;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  std::string host = s.o.host;
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  const int rc = ::getaddrinfo(host.c_str(), std::to_string(s.o.port).c_str(), &hints, &found);
  MG_REQUIRE(rc == 0 && found, "cannot resolve --host ", s.o.host, ": ", ::gai_strerror(rc));
  std::string why;
  for (addrinfo* a = found; a; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    const int yes = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
    if (::bind(fd, a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd, 1024) == 0) {
      s.listen_fd = fd;
      break;
    }
    why = std::strerror(errno);
    ::close(fd);
  }
  ::freeaddrinfo(found);
  MG_REQUIRE(s.listen_fd >= 0, "cannot listen on ", s.o.host, ":", s.o.port, " (", why,
             "); choose another --host/--port");
  sockaddr_storage addr{};
  socklen_t len = sizeof addr;
  ::getsockname(s.listen_fd, reinterpret_cast<sockaddr*>(&addr), &len);
  return addr.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port)
                                    : ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
}

void HttpFront::serve() {
  auto& s = *impl_;
  MG_REQUIRE(s.listen_fd >= 0, "serve() before bind()");
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = kListenId;
  ::epoll_ctl(s.epoll_fd, EPOLL_CTL_ADD, s.listen_fd, &ev);
  ev.data.u64 = kWakeId;
  ::epoll_ctl(s.epoll_fd, EPOLL_CTL_ADD, s.wake_fd, &ev);
  std::vector<epoll_event> events(256);
  auto last_sweep = Clock::now();
  while (!s.stopping) {
    const int n = ::epoll_wait(s.epoll_fd, events.data(), int(events.size()), 100);
    if (n < 0 && errno != EINTR) {
      log_warn("server: epoll_wait failed: ", std::strerror(errno));
      break;
    }
    for (int i = 0; i < n; ++i) {
      const uint64_t id = events[size_t(i)].data.u64;
      if (id == kListenId) {
        s.accept_all();
      } else if (id == kWakeId) {
        uint64_t count;
        while (::read(s.wake_fd, &count, sizeof count) > 0) {
        }
      } else {
        s.on_event(id, events[size_t(i)].events);
      }
    }
    s.apply_completions();
    s.run_ready();
    const auto now = Clock::now();
    if (now - last_sweep >= std::chrono::milliseconds(100)) {
      s.sweep();
      last_sweep = now;
    }
    s.reap();
  }
  for (auto& [id, c] : s.conns) s.close_conn(*c);
  s.reap();
  ::epoll_ctl(s.epoll_fd, EPOLL_CTL_DEL, s.listen_fd, nullptr);
}

void HttpFront::stop() {
  auto& s = *impl_;
  s.stopping = true;
  const uint64_t one = 1;
  [[maybe_unused]] ssize_t n = ::write(s.wake_fd, &one, sizeof one);
}

void HttpFront::join_workers() {
  auto& s = *impl_;
  {
    std::lock_guard lock(s.task_mutex);
    s.workers_stop = true;
    s.tasks.clear();
  }
  s.task_cv.notify_all();
  for (auto& t : s.workers)
    if (t.joinable()) t.join();
  s.workers.clear();
}

HttpFront::Stats HttpFront::stats() const {
  const auto& s = *impl_;
  return {s.accepted.load(), s.evicted.load(), s.timed_out.load(), s.refused.load(), s.requests.load()};
}

}  // namespace megatron::inference
