// The gateway server (see server.h). Every request runs as one coroutine on its connection's
// I/O thread:
//
//   read request -> route? key? -> fingerprint, principal scope -> store Begin
//     Acquired -> forward upstream -> Complete (stored status) or Release (else) -> answer
//     Replay   -> the stored response + Idempotent-Replayed: true
//     Busy     -> 409, or poll until the outcome is there (route in_flight = "wait")
//     Conflict -> 422
//   store error at any point before the upstream call -> 503 + Retry-After, upstream not called
#include "gateway/server.h"

#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <boost/asio.hpp>
#include <boost/asio/as_tuple.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <exception>
#include <functional>
#include <initializer_list>
#include <iterator>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <tuple>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "core/thread_name.h"
#include "core/url_text.h"
#include "gateway/admin.h"
#include "gateway/asio_parts.h"
#include "gateway/rules.h"
#include "idem/receiver.h"
#include "idem/store_gauges.h"

namespace idem::gateway {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using asio::awaitable;
using asio::use_awaitable;
using SteadyClock = std::chrono::steady_clock;
using Request = http::request<http::string_body>;
using Response = http::response<http::string_body>;

constexpr auto kNoThrow = asio::as_tuple(asio::use_awaitable);
constexpr std::size_t kMaxUpstreamBody = std::size_t{1} << 30;
// Beast's default (8 KiB) is smaller than what upstreams send (large Set-Cookie, CSP or Link
// headers). Over it, the answer is a 502 and the key is released, so each retry would run the
// upstream again: generous, since the upstream is trusted.
constexpr std::uint32_t kMaxUpstreamHeader = 64 * 1024;
constexpr std::string_view kReplayedHeader = "Idempotent-Replayed";
constexpr std::string_view kAttemptHeader = "Idempotency-Attempt";
// A completion the store did not answer is tried this often in all, pausing 20 ms, then 40 ms.
constexpr int kCompleteTries = 3;
constexpr std::chrono::milliseconds kCompleteRetryPause{20};

// ---- text (Debian's abseil has its own string_view, so std only here) ----

void Append(std::string& out, std::string_view v) { out.append(v); }
void Append(std::string& out, const char* v) { out.append(v); }
void Append(std::string& out, double v) {
  char buf[32];
  const int n = std::snprintf(buf, sizeof buf, "%.3f", v);
  out.append(buf, static_cast<std::size_t>(n));
}
template <class T>
requires std::is_integral_v<T>
void Append(std::string& out, T v) {
  char buf[24];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
  out.append(buf, end);
}
// A log value between double quotes, escaped (core::AppendLogQuoted).
struct Quoted {
  std::string_view value;
};
void Append(std::string& out, Quoted q) { core::AppendLogQuoted(out, q.value); }
template <class... Parts>
std::string Cat(const Parts&... parts) {
  std::string out;
  (Append(out, parts), ...);
  return out;
}

// Runs `f` when the scope ends, however it ends: a count taken on entry is given back even when
// an exception unwinds a coroutine, or when a stopped io_context destroys its frame.
template <class F>
class [[nodiscard]] OnExit {
 public:
  explicit OnExit(F f) : f_(std::move(f)) {}
  OnExit(const OnExit&) = delete;
  OnExit& operator=(const OnExit&) = delete;
  ~OnExit() { f_(); }

 private:
  F f_;
};

// ---- logging: one line per event, one write(2) per line so lines never interleave ----

enum class Level : std::uint8_t { kDebug, kInfo, kWarn, kError };

Level ParseLevel(std::string_view s) {
  if (s == "debug") return Level::kDebug;
  if (s == "warn") return Level::kWarn;
  if (s == "error") return Level::kError;
  return Level::kInfo;
}

class Logger {
 public:
  explicit Logger(Level min) : min_(min) {}
  bool Enabled(Level l) const { return l >= min_; }
  void Write(Level l, std::string_view fields) const {
    if (!Enabled(l)) return;
    static constexpr std::string_view kNames[] = {"debug", "info", "warn", "error"};
    const auto now = std::chrono::system_clock::now();
    const std::time_t secs = std::chrono::system_clock::to_time_t(now);
    const auto ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() %
        1000;
    std::tm tm{};
    ::gmtime_r(&secs, &tm);
    char ts[64];
    std::snprintf(ts, sizeof ts, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900,
                  tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                  static_cast<int>(ms));
    std::string line = Cat("ts=", ts, " level=", kNames[static_cast<int>(l)], " ", fields, "\n");
    [[maybe_unused]] auto n = ::write(2, line.data(), line.size());
  }

 private:
  Level min_;
};

// What happened to a request, for the log line and the metrics labels.
enum class Outcome : std::uint8_t {
  kForwarded,         // first request with its key: upstream answered, outcome stored
  kReleased,          // upstream answered with a status that is not stored: key released
  kReplayed,          // stored response returned
  kInFlight,          // 409: the first request is still upstream
  kKeyReuse,          // 422
  kBadRequest,        // 400/413/431: key or body or headers
  kStoreUnavailable,  // 503
  kUpstreamError,     // 502/504: key released
  kPassThrough,       // no idempotency semantics on this route/method
  kCount,
};
constexpr std::string_view kOutcomeNames[] = {
    "forwarded",   "released",          "replayed",       "in_flight",   "key_reuse",
    "bad_request", "store_unavailable", "upstream_error", "pass_through"};
static_assert(std::size(kOutcomeNames) == static_cast<std::size_t>(Outcome::kCount));

// What a lookup under the secondary secret's scope (rotation) found.
enum class SecondaryResult : std::uint8_t {
  kAbsent,    // nothing there, or an abandoned attempt: the request runs under the primary
  kReplayed,  // a completion with this payload: replayed
  kKeyReuse,  // a completion with another payload: 422
  kInFlight,  // a running lease: 409
  kError,     // the store could not answer: 503
  kCount,
};
constexpr std::string_view kSecondaryResultNames[] = {"absent", "replayed", "key_reuse",
                                                      "in_flight", "error"};
static_assert(std::size(kSecondaryResultNames) ==
              static_cast<std::size_t>(SecondaryResult::kCount));

// ---- metrics ----

struct RouteMetrics {
  Counter* requests[static_cast<int>(Outcome::kCount)];
  Histogram* seconds[static_cast<int>(Outcome::kCount)];
};

class GatewayMetrics {
 public:
  GatewayMetrics(Registry& registry, const Config& config) : store(registry, "gateway") {
    // Route label "-" is traffic no route matched.
    labels_.push_back("-");
    for (const Route& r : config.routes) labels_.push_back(r.prefix);
    for (const std::string& label : labels_) {
      RouteMetrics m{};
      for (int o = 0; o < static_cast<int>(Outcome::kCount); ++o) {
        Labels l = {{"route", label}, {"outcome", std::string(kOutcomeNames[o])}};
        m.requests[o] = &registry.AddCounter("idemd_requests_total",
                                             "HTTP requests answered, by route and outcome", l);
        m.seconds[o] =
            &registry.AddHistogram("idemd_request_seconds",
                                   "Time from request read to response ready, by route and "
                                   "outcome",
                                   l);
      }
      routes_.push_back(m);
    }
    upstream_seconds =
        &registry.AddHistogram("idemd_upstream_seconds", "Time the upstream took to answer");
    upstream_connects =
        &registry.AddCounter("idemd_upstream_connections_total", "Upstream connections opened");
    upstream_retries = &registry.AddCounter(
        "idemd_upstream_retries_total",
        "Idempotent pass-through requests sent again on a new connection because the upstream "
        "had closed the pooled one");
    connections = &registry.AddGauge("idemd_connections", "Client connections open");
    for (int r = 0; r < static_cast<int>(SecondaryResult::kCount); ++r) {
      secondary_lookups_[r] = &registry.AddCounter(
          "idemd_secondary_scope_lookups_total",
          "Keys new under the principal secret's scope also looked up under the secondary "
          "secret's (rotation), by what was found",
          {{"result", std::string(kSecondaryResultNames[r])}});
    }
  }

  void CountSecondary(SecondaryResult r) { secondary_lookups_[static_cast<int>(r)]->Inc(); }

  void Count(const Route* route, const Config& config, Outcome o, std::chrono::nanoseconds d) {
    // Label "-" unless the route is one of the configured ones (RouteFor may return a built-in
    // default route).
    const Route* first = config.routes.data();
    const Route* end = first + config.routes.size();
    const std::less<const Route*> before;
    const std::size_t i = route != nullptr && !before(route, first) && before(route, end)
                              ? static_cast<std::size_t>(route - first) + 1
                              : 0;
    routes_[i].requests[static_cast<int>(o)]->Inc();
    routes_[i].seconds[static_cast<int>(o)]->ObserveDuration(d);
  }

  Metrics store;
  Histogram* upstream_seconds;
  Counter* upstream_connects;
  Counter* upstream_retries;
  Gauge* connections;

 private:
  std::vector<std::string> labels_;
  std::vector<RouteMetrics> routes_;
  Counter* secondary_lookups_[static_cast<int>(SecondaryResult::kCount)];
};

// ---- upstream target ----

struct UpstreamTarget {
  std::string host;  // for the Host header: HOST:PORT
  std::string base;  // path prefix prepended to every target, without a trailing '/'
  tcp::endpoint endpoint;
};

// The first address `host` names (an IP literal or a name), for `port`.
using asio_parts::Resolve;

Result<UpstreamTarget> ResolveUpstream(std::string_view url) {
  auto parsed = ParseUpstreamUrl(url);
  if (!parsed) return InvalidArgumentError(Cat("upstream: ", parsed.error().message()));
  auto endpoint = Resolve(parsed->endpoint.host, parsed->endpoint.port);
  if (!endpoint) return InvalidArgumentError(Cat("upstream: ", endpoint.error().message()));
  const std::string& host = parsed->endpoint.host;
  const bool v6 = host.find(':') != std::string::npos;
  return UpstreamTarget{.host = Cat(v6 ? "[" : "", host, v6 ? "]" : "", ":", parsed->endpoint.port),
                        .base = std::move(parsed->base),
                        .endpoint = *endpoint};
}

// Removes hop-by-hop headers and the ones named by any of the Connection headers, except
// those in `kept`.
template <class Fields>
void StripHopByHop(Fields& fields, std::initializer_list<std::string_view> kept = {}) {
  std::vector<std::string> named;
  for (auto [it, end] = fields.equal_range(http::field::connection); it != end; ++it) {
    AnyListItem(std::string_view(it->value()), [&](std::string_view token) {
      named.emplace_back(token);
      return false;
    });
  }
  for (auto it = fields.begin(); it != fields.end();) {
    if (IsHopByHop(std::string_view(it->name_string()))) {
      it = fields.erase(it);
    } else {
      ++it;
    }
  }
  for (const std::string& n : named) {
    const bool keep = std::any_of(kept.begin(), kept.end(),
                                  [&](std::string_view k) { return EqualsIgnoreCase(k, n); });
    if (!keep) fields.erase(n);
  }
}

template <class Fields>
std::size_t FieldCount(const Fields& fields) {
  return static_cast<std::size_t>(std::distance(fields.begin(), fields.end()));
}

// Erases the fields after the first `count` (Beast keeps fields in the order they arrived).
template <class Fields>
void DropFieldsAfter(Fields& fields, std::size_t count) {
  auto it = fields.begin();
  std::advance(it, static_cast<std::ptrdiff_t>(std::min(count, FieldCount(fields))));
  while (it != fields.end()) it = fields.erase(it);
}

void AppendHeader(std::string& out, std::string_view name, std::string_view value) {
  out += name;
  out += ": ";
  out += value;
  out += "\r\n";
}

// The reason phrase for a status sent without the upstream's (a replay: the phrase is not
// stored). Beast knows the registered codes; for others (299, 470) it has only a placeholder,
// "<unknown-status>", so the status class's name stands in (the phrase carries no meaning,
// RFC 9112 §4).
std::string_view ReasonFor(unsigned status) {
  const auto code = static_cast<http::status>(status);
  if (http::int_to_status(status) == code) return std::string_view(http::obsolete_reason(code));
  switch (status / 100) {
    case 1:
      return "Informational";
    case 2:
      return "Success";
    case 3:
      return "Redirection";
    case 4:
      return "Client Error";
    default:
      return "Server Error";
  }
}

void AppendStatusLine(std::string& out, unsigned version, unsigned status,
                      std::string_view reason) {
  out += version == 10 ? "HTTP/1.0 " : "HTTP/1.1 ";
  Append(out, status);
  out += ' ';
  out += reason.empty() ? ReasonFor(status) : reason;
  out += "\r\n";
}

// RFC 9110 §9.2.2: the methods a client (and so idemd) may send again after a failure.
bool IsIdempotent(http::verb m) {
  return m == http::verb::get || m == http::verb::head || m == http::verb::options ||
         m == http::verb::trace || m == http::verb::put || m == http::verb::delete_;
}

// Statuses whose answer never has content (RFC 9110 §6.4.1).
bool Bodiless(unsigned status) { return status < 200 || status == 204 || status == 304; }

// The message as it goes on the wire, in one buffer: Beast's serializer walks a buffer
// sequence per field, which costs more than the copy for messages of this size. The message
// must have its Content-Length (prepare_payload) or be bodiless by its status.
template <bool kIsRequest>
std::string Serialize(const http::message<kIsRequest, http::string_body>& m, bool with_body) {
  std::string out;
  out.reserve(256 + m.body().size());
  if constexpr (kIsRequest) {
    out += std::string_view(m.method_string());
    out += ' ';
    out += std::string_view(m.target());
    out += m.version() == 10 ? " HTTP/1.0\r\n" : " HTTP/1.1\r\n";
  } else {
    AppendStatusLine(out, m.version(), m.result_int(), std::string_view(m.reason()));
  }
  for (const auto& field : m) {
    AppendHeader(out, std::string_view(field.name_string()), std::string_view(field.value()));
  }
  out += "\r\n";
  if (with_body) out += m.body();
  return out;
}

// The access log names a key by this hash, not by the key itself. Computed only when the
// access log is on (its level is fixed at start), and formatted (KeyHashText) with the line.
std::size_t KeyHash(std::string_view scope, std::string_view key) {
  return std::hash<std::string_view>{}(key) ^
         (std::hash<std::string_view>{}(scope)*0x9e3779b97f4a7c15ULL);
}

std::string KeyHashText(std::optional<std::size_t> hash) {
  if (!hash) return "-";
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016zx", *hash);
  return buf;
}

// ---- per-thread state ----

struct UpstreamResult {
  std::optional<Response> res{};  // empty: failed
  bool timeout = false;
  std::string error{};
  // Failed on a pooled connection before any byte of an answer: the upstream had closed it.
  bool stale_connection = false;
};

// Keep-alive connections to the upstream, owned by one I/O thread: no locks.
class UpstreamPool {
 public:
  UpstreamPool(asio::io_context& io, const UpstreamTarget& target, std::size_t max_idle,
               GatewayMetrics& metrics)
      : io_(io), target_(target), max_idle_(max_idle), metrics_(metrics) {}

  // Sends `req` and reads the final answer. One deadline, `timeout`, covers the connect, the
  // write and the read, so a lease longer than upstream_timeout outlasts the whole call.
  // Interim 1xx answers are dropped; 101 fails, since idemd cannot relay another protocol.
  // After CancelAll no call starts: it fails as a connection error, so its key is released
  // like those of the cancelled calls.
  // `idempotent`: the request may be sent twice (RFC 9112 §9.3.1: an idempotent method, and no
  // key to release instead). A pooled connection the upstream closed just as the request went
  // out (its keep-alive timeout, within TakeIdle's unchecked kFreshIdle) fails before any
  // answer; such a request is then sent once more, on a new connection.
  awaitable<UpstreamResult> Send(Request& req, bool head, std::chrono::milliseconds timeout,
                                 bool idempotent = false) {
    UpstreamResult r = co_await SendOnce(req, head, timeout, /*pooled=*/true);
    if (r.stale_connection && idempotent && !closing_) {
      metrics_.upstream_retries->Inc();
      r = co_await SendOnce(req, head, timeout, /*pooled=*/false);
    }
    co_return r;
  }

  // Shutdown: fail every upstream call in flight (their keys are released) and drop idle ones.
  void CancelAll() {
    closing_ = true;
    for (beast::tcp_stream* s : active_) s->socket().close();
    idle_.clear();
  }

 private:
  awaitable<UpstreamResult> SendOnce(Request& req, bool head, std::chrono::milliseconds timeout,
                                     bool pooled) {
    if (closing_) co_return UpstreamResult{{}, false, "upstream not called: idemd is stopping"};
    std::unique_ptr<Connection> conn = pooled ? TakeIdle() : nullptr;
    const bool fresh = !conn;
    if (fresh) conn = std::make_unique<Connection>(io_);
    beast::tcp_stream& stream = conn->stream;
    // Tracked from before the connect, so CancelAll also stops a call still connecting.
    active_.insert(&stream);
    const OnExit untrack([this, &stream] { active_.erase(&stream); });
    stream.expires_after(timeout);
    if (fresh) {
      metrics_.upstream_connects->Inc();
      if (auto [ec] = co_await stream.async_connect(target_.endpoint, kNoThrow); ec) {
        co_return Failure(ec, "connect");
      }
    }
    // The upstream closed a pooled connection without answering anything on it.
    const auto stale = [&](UpstreamResult r, const boost::system::error_code& ec) {
      r.stale_connection = !fresh && conn->buffer.size() == 0 &&
                           (ec == http::error::end_of_stream || ec == asio::error::eof ||
                            ec == asio::error::connection_reset || ec == asio::error::broken_pipe);
      return r;
    };
    const std::string wire = Serialize(req, true);
    if (auto [ec, n] = co_await asio::async_write(stream, asio::buffer(wire), kNoThrow); ec) {
      co_return stale(Failure(ec, "write"), ec);
    }
    bool answered = false;  // a byte of an answer came (an interim one counts)
    std::optional<http::response_parser<http::string_body>> parser;
    for (;;) {
      parser.emplace();
      parser->header_limit(kMaxUpstreamHeader);
      parser->body_limit(kMaxUpstreamBody);
      parser->skip(head);
      if (auto [ec, n] = co_await http::async_read_header(stream, conn->buffer, *parser, kNoThrow);
          ec) {
        UpstreamResult r = Failure(ec, "read");
        co_return answered ? r : stale(std::move(r), ec);
      }
      answered = true;
      const unsigned status = parser->get().result_int();
      if (status == 101) {
        co_return UpstreamResult{{}, false, "upstream switched protocols (101)"};
      }
      if (status >= 200) break;
    }
    const std::size_t header_fields = FieldCount(parser->get());
    if (!parser->is_done()) {
      if (auto [ec, n] = co_await http::async_read(stream, conn->buffer, *parser, kNoThrow); ec) {
        co_return Failure(ec, "read");
      }
    }
    // Beast adds a chunked body's trailer fields to the header. They describe the body, were
    // sent after it, and are neither relayed nor stored: a header idemd cannot vouch for.
    DropFieldsAfter(parser->get(), header_fields);
    stream.expires_never();
    // The parser's keep_alive is false for a body that ran to the close, too.
    if (parser->keep_alive() && conn->buffer.size() == 0 && !closing_ && idle_.size() < max_idle_) {
      conn->idle_since = SteadyClock::now();
      idle_.push_back(std::move(conn));
    }
    co_return UpstreamResult{parser->release()};
  }

  static UpstreamResult Failure(const boost::system::error_code& ec, std::string_view what) {
    if (ec == beast::error::timeout) return {{}, true, "upstream did not answer in time"};
    return {{}, false, Cat("upstream ", what, ": ", ec.message())};
  }

  struct Connection {
    explicit Connection(asio::io_context& io) : stream(io) {}
    beast::tcp_stream stream;
    beast::flat_buffer buffer;
    SteadyClock::time_point idle_since{};
  };

  // An idle connection the upstream has not closed, most recently used first. One idle for a
  // while is checked first: a closed one shows as readable with 0 bytes, and a request sent on
  // it could not tell "not received" from "received, no answer". Connections idle for less
  // than kFreshIdle skip the check (a syscall per request); an upstream that closes sooner
  // than that announces it with Connection: close.
  std::unique_ptr<Connection> TakeIdle() {
    constexpr auto kFreshIdle = std::chrono::milliseconds(200);
    const auto now = SteadyClock::now();
    while (!idle_.empty()) {
      std::unique_ptr<Connection> c = std::move(idle_.back());
      idle_.pop_back();
      if (now - c->idle_since < kFreshIdle) return c;
      char byte;
      const ssize_t n =
          ::recv(c->stream.socket().native_handle(), &byte, 1, MSG_PEEK | MSG_DONTWAIT);
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return c;
    }
    return nullptr;
  }

  asio::io_context& io_;
  const UpstreamTarget& target_;
  std::size_t max_idle_;
  GatewayMetrics& metrics_;
  std::vector<std::unique_ptr<Connection>> idle_;
  std::set<beast::tcp_stream*> active_;
  bool closing_ = false;
};

// Store calls from one I/O thread, batched. Operations that arrive while the thread's batches
// are at the store wait, and go together in the next batch: one BeginBatch and one
// CompleteBatch, so one thread hop (and, for the log store, one group commit) for all of them.
// Handing each call to a store thread on its own cost more in context switches than the store
// call itself (perf: 57% of idemd's time in finish_task_switch with the log store).
// Used only on its I/O thread; Run() is the only part that runs on a store thread.
class StoreBatcher {
  // A suspended caller's completion handler (move-only), type-erased.
  struct Resume {
    virtual ~Resume() = default;
    virtual void operator()() = 0;
  };
  template <class Handler>
  struct ResumeWith final : Resume {
    explicit ResumeWith(Handler h) : handler(std::move(h)) {}
    void operator()() override { std::move(handler)(); }
    Handler handler;
  };

 public:
  // `started` counts the batches handed to the store's StartBatch whose answers have not
  // come back yet (shared by every I/O thread; shutdown waits for it to reach 0).
  StoreBatcher(asio::io_context& io, asio::thread_pool& pool, Store& store,
               std::size_t max_in_flight, std::atomic<int>& started)
      : io_(io), pool_(pool), store_(store), max_in_flight_(max_in_flight), started_(started) {}

  awaitable<Result<BeginAnswer>> Begin(const BeginRequest& req) {
    Op op{.kind = Op::kBegin, .begin = &req};
    co_await Submit(op);
    co_return std::move(*op.begin_result);
  }
  awaitable<Result<WriteAnswer>> Complete(const CompleteRequest& req) {
    Op op{.kind = Op::kComplete, .complete = &req};
    co_await Submit(op);
    co_return std::move(*op.write_result);
  }
  awaitable<Result<WriteAnswer>> Release(std::string_view scope, std::string_view key,
                                         Token token) {
    Op op{.kind = Op::kRelease, .scope = scope, .key = key, .token = token};
    co_await Submit(op);
    co_return std::move(*op.write_result);
  }
  awaitable<Result<std::optional<Record>>> Get(std::string_view scope, std::string_view key) {
    Op op{.kind = Op::kGet, .scope = scope, .key = key};
    co_await Submit(op);
    co_return std::move(*op.get_result);
  }

 private:
  struct Op {
    enum Kind : std::uint8_t { kBegin, kComplete, kRelease, kGet } kind;
    const BeginRequest* begin = nullptr;
    const CompleteRequest* complete = nullptr;
    std::string_view scope{}, key{};
    Token token = 0;
    std::optional<Result<BeginAnswer>> begin_result{};
    std::optional<Result<WriteAnswer>> write_result{};
    std::optional<Result<std::optional<Record>>> get_result{};
    std::unique_ptr<Resume> done{};
  };
  using Batch = std::vector<Op*>;

  // Suspends the caller until its operation's batch has been to the store. The Op lives in the
  // caller's frame, which stays alive while suspended.
  awaitable<void> Submit(Op& op) {
    co_await asio::async_initiate<decltype(use_awaitable), void()>(
        [this, &op](auto handler) {
          op.done = std::make_unique<ResumeWith<decltype(handler)>>(std::move(handler));
          queue_.push_back(&op);
          Dispatch();
        },
        use_awaitable);
  }

  void Dispatch() {
    while (in_flight_ < max_in_flight_ && !queue_.empty()) {
      ++in_flight_;
      auto batch = std::make_shared<Batch>(std::move(queue_));
      queue_.clear();
      if (can_start_ && Start(batch)) continue;
      asio::post(pool_, [this, batch] {
        Run(*batch);
        asio::post(io_, [this, batch] { Finish(*batch); });
      });
    }
  }

  // On the I/O thread, once the batch's answers are in its ops.
  void Finish(Batch& batch) {
    --in_flight_;
    for (Op* op : batch) {
      std::unique_ptr<Resume> done = std::move(op->done);
      (*done)();  // resumes the caller, which may free `op`
    }
    Dispatch();
  }

  // Hands the batch to a store that can take it without blocking (the log store): its
  // begins and completes share one group commit, and the answers come back from the store's
  // flusher, with no store thread in between. False: use a store thread (releases and reads,
  // which are rare, always do; a store that declines once is not asked again).
  bool Start(const std::shared_ptr<Batch>& batch) {
    const Requests reqs = Split(*batch);
    if (reqs.others) return false;
    started_.fetch_add(1);
    can_start_ =
        store_.StartBatch(reqs.begins, reqs.completes, [this, batch](BatchAnswers answers) {
          asio::post(io_, [this, batch, answers = std::move(answers)]() mutable {
            Deliver(*batch, answers.begins, answers.completes);
            Finish(*batch);
          });
          started_.fetch_sub(1);
        });
    if (!can_start_) started_.fetch_sub(1);
    return can_start_;
  }

  // The batch's begins and completes, in its order; whether it releases or reads a key too.
  struct Requests {
    std::vector<BeginRequest> begins;
    std::vector<CompleteRequest> completes;
    bool others = false;
  };
  static Requests Split(const Batch& batch) {
    Requests r;
    for (const Op* op : batch) {
      if (op->kind == Op::kBegin) r.begins.push_back(*op->begin);
      if (op->kind == Op::kComplete) r.completes.push_back(*op->complete);
      if (op->kind == Op::kRelease || op->kind == Op::kGet) r.others = true;
    }
    return r;
  }

  // On a store thread.
  void Run(Batch& batch) {
    const Requests reqs = Split(batch);
    const std::vector<BeginRequest>& begins = reqs.begins;
    const std::vector<CompleteRequest>& completes = reqs.completes;
    std::vector<Result<BeginAnswer>> began;
    std::vector<Result<WriteAnswer>> completed;
    if (begins.size() == 1) began.push_back(store_.Begin(begins[0]));
    if (begins.size() > 1) began = store_.BeginBatch(begins);
    if (completes.size() == 1) completed.push_back(store_.Complete(completes[0]));
    if (completes.size() > 1) completed = store_.CompleteBatch(completes);
    Deliver(batch, began, completed);
  }

  // Puts the answers (in the batch's order of begins and of completes) into the ops, and runs
  // the releases and reads.
  void Deliver(Batch& batch, std::vector<Result<BeginAnswer>>& began,
               std::vector<Result<WriteAnswer>>& completed) {
    std::size_t b = 0, c = 0;
    for (Op* op : batch) {
      switch (op->kind) {
        case Op::kBegin:
          op->begin_result.emplace(std::move(began[b++]));
          break;
        case Op::kComplete:
          op->write_result.emplace(std::move(completed[c++]));
          break;
        case Op::kRelease:
          op->write_result.emplace(store_.Release(op->scope, op->key, op->token));
          break;
        case Op::kGet:
          op->get_result.emplace(store_.Get(op->scope, op->key));
          break;
      }
    }
  }

  asio::io_context& io_;
  asio::thread_pool& pool_;
  Store& store_;
  std::size_t max_in_flight_;
  std::atomic<int>& started_;
  std::size_t in_flight_ = 0;
  bool can_start_ = true;
  Batch queue_;
};

}  // namespace

// ---- the server ----

struct Server::Impl {
  Impl(const Config& c, Store& s, Registry& r, UpstreamTarget u)
      : config(c),
        store(s),
        registry(r),
        upstream(std::move(u)),
        log(ParseLevel(c.log_level)),
        metrics(r, c) {}

  struct Worker {
    // Declared before the io_context, so it outlives it: a coroutine still suspended in
    // UpstreamPool::Send when the io_context goes (past the shutdown's cancel window) is
    // destroyed with it and unregisters its call from the pool then. Shutdown drops the pool's
    // connections first: none of its sockets may outlive the io_context.
    std::optional<UpstreamPool> pool;
    asio::io_context io{1};
    std::optional<tcp::acceptor> acceptor;
    std::optional<StoreBatcher> batcher;         // empty: the store is called inline
    std::set<beast::tcp_stream*> idle_sessions;  // waiting for a next request
    std::thread thread;
  };

  Config config;
  Store& store;
  Registry& registry;
  UpstreamTarget upstream;
  Logger log;
  GatewayMetrics metrics;
  std::unique_ptr<asio::thread_pool> store_pool;  // null: store calls run inline
  std::vector<std::unique_ptr<Worker>> workers;
  std::unique_ptr<AdminServer> admin;
  std::unique_ptr<StoreGauges> gauges;  // SPEC §7's gauges of the store's contents
  Endpoint bound{}, admin_bound{};
  std::atomic<bool> draining{false};
  std::atomic<int> busy_requests{0};
  std::atomic<int> started_batches{0};  // handed to Store::StartBatch, answers not yet back
  std::once_flag shutdown_once;

  // Store calls: through the I/O thread's batcher, or inline (memory store, store_threads 0).
  awaitable<Result<BeginAnswer>> StoreBegin(Worker& w, const BeginRequest& req) {
    if (!w.batcher) co_return store.Begin(req);
    co_return co_await w.batcher->Begin(req);
  }
  awaitable<Result<WriteAnswer>> StoreComplete(Worker& w, const CompleteRequest& req) {
    if (!w.batcher) co_return store.Complete(req);
    co_return co_await w.batcher->Complete(req);
  }
  awaitable<Result<WriteAnswer>> StoreRelease(Worker& w, const std::string& scope,
                                              const std::string& key, Token token) {
    if (!w.batcher) co_return store.Release(scope, key, token);
    co_return co_await w.batcher->Release(scope, key, token);
  }
  awaitable<Result<std::optional<Record>>> StoreGet(Worker& w, const std::string& scope,
                                                    const std::string& key) {
    if (!w.batcher) co_return store.Get(scope, key);
    co_return co_await w.batcher->Get(scope, key);
  }

  // ---- responses ----

  static Response MakeProblem(const Request& req, const Problem& p) {
    return MakeProblem(req.version(), p);
  }
  static Response MakeProblem(unsigned version, const Problem& p) {
    Response res{static_cast<http::status>(p.status), version};
    res.set(http::field::content_type, "application/problem+json");
    res.body() = ProblemJson(p);
    return res;
  }

  Response Unavailable(const Request& req, std::string detail) {
    Response res = MakeProblem(req, problems::StoreUnavailable(std::move(detail)));
    res.set(http::field::retry_after, std::to_string(config.retry_after.count()));
    return res;
  }

  // Whether an upstream answer keeps the upstream's Content-Length rather than one idemd
  // computes from the body: an answer to HEAD and a 304 have no body to measure, and their
  // Content-Length is the size a GET's 200 would have (RFC 9110 §8.6). A 204 must not have
  // one; other answers get their body's.
  static bool KeepsLength(unsigned status, bool head) {
    return status != 204 && (head || status == 304);
  }

  // A replay on the wire, straight from the stored response (the hot path of duplicates).
  static std::string SerializeReplay(const StoredResponse& stored, unsigned version, bool keep,
                                     bool head) {
    std::string out;
    out.reserve(192 + stored.body.size());
    AppendStatusLine(out, version, stored.status, {});
    for (const auto& [name, value] : stored.headers) AppendHeader(out, name, value);
    AppendHeader(out, kReplayedHeader, "true");
    const bool bodiless = Bodiless(stored.status);
    // Only answers without their body are stored with their Content-Length (ToStored): a HEAD
    // answer (only a HEAD request replays it: the method is in the fingerprint) and a 304.
    const bool has_length =
        std::any_of(stored.headers.begin(), stored.headers.end(),
                    [](const auto& h) { return EqualsIgnoreCase(h.first, "Content-Length"); });
    if (!bodiless && !has_length) {
      AppendHeader(out, "Content-Length", std::to_string(stored.body.size()));
    }
    if (version == 10 && keep) AppendHeader(out, "Connection", "keep-alive");
    if (version != 10 && !keep) AppendHeader(out, "Connection", "close");
    out += "\r\n";
    if (!head && !bodiless) out += stored.body;
    return out;
  }

  // `head`: the answer to a HEAD request. See KeepsLength for the Content-Length kept.
  StoredResponse ToStored(const Response& res, bool head) const {
    StoredResponse s;
    s.status = res.result_int();
    const bool keep_length = KeepsLength(s.status, head);
    for (const auto& field : res) {
      std::string_view name(field.name_string());
      if ((field.name() == http::field::content_length && !keep_length) || IsHopByHop(name)) {
        continue;
      }
      bool strip = false;
      for (const std::string& h : config.strip_headers) strip |= EqualsIgnoreCase(h, name);
      if (!strip) s.headers.emplace_back(name, std::string_view(field.value()));
    }
    s.body_size = res.body().size();
    if (res.body().size() > config.max_stored_body_bytes) {
      s.body_omitted = true;
    } else {
      s.body = res.body();
    }
    return s;
  }

  // ---- one request ----

  struct Answer {
    Response res;
    Outcome outcome;
    std::optional<std::size_t> key_hash{};  // KeyHash; none without a key or access log
    unsigned upstream_status = 0;
    const Route* route = nullptr;
    std::optional<StoredResponse> replay{};  // a replay: sent as stored, `res` unused
  };

  awaitable<Answer> Handle(Worker& w, Request& req) {
    if (std::optional<Problem> problem = Normalize(req)) {
      co_return Answer{MakeProblem(req, *problem), Outcome::kBadRequest};
    }
    const std::string_view target(req.target());
    const std::string_view path = target.substr(0, target.find('?'));
    const Route* route = config.RouteFor(path);
    Answer a = co_await HandleOnRoute(w, req, route);
    a.route = route;
    co_return a;
  }

  // Brings the request into the form routing and forwarding expect, or says why it cannot be:
  // an origin-form target (absolute-form, which a server must accept, is reduced to its path
  // and query), and no TRACE with content (RFC 9110 §9.3.8; Beast refuses to frame one).
  static std::optional<Problem> Normalize(Request& req) {
    if (req.method() == http::verb::trace && !req.body().empty()) {
      return problems::InvalidBody("a TRACE request must not have content");
    }
    const std::string_view target(req.target());
    if (target.starts_with('/')) return std::nullopt;
    Result<std::string> origin = OriginForm(target);
    if (!origin) return problems::InvalidTarget(Cat("the target ", origin.error().message()));
    req.target(*origin);
    return std::nullopt;
  }

  // What a request's headers decide on `route`, before its body is read: it is keyed (`key`),
  // refused (`problem`), or neither, and passes through.
  struct Keying {
    std::optional<Problem> problem{};
    std::optional<std::string> key{};
  };
  Keying KeyingOf(const Request& req, const Route* route) const {
    if (route == nullptr || route->key == KeyMode::kOff ||
        !route->Applies(std::string_view(req.method_string()))) {
      return {};
    }
    const std::size_t count = req.count(config.key_header);
    if (count == 0) {
      if (route->key == KeyMode::kOptional) return {};
      return {problems::MissingKey()};
    }
    if (count > 1) {
      return {problems::InvalidKey(Cat("more than one ", config.key_header, " header"))};
    }
    auto key = ParseIdempotencyKey(std::string_view(req[config.key_header]), config.max_key_bytes);
    if (!key) return {problems::InvalidKey(key.error().message())};
    // The key's scope is one principal's; the upstream would get both headers and might take
    // the other one.
    if (req.count(config.principal_header) > 1) {
      return {problems::InvalidPrincipal(
          Cat("more than one ", config.principal_header, " header: whose key is this?"))};
    }
    if (req[config.principal_header].empty() && route->anonymous == AnonymousPolicy::kRefuse) {
      return {problems::MissingPrincipal(config.principal_header)};
    }
    return {std::nullopt, std::move(*key)};
  }

  awaitable<Answer> HandleOnRoute(Worker& w, Request& req, const Route* route) {
    const std::string_view target(req.target());
    const std::string_view method(req.method_string());
    Keying keying = KeyingOf(req, route);
    if (keying.problem) co_return Answer{MakeProblem(req, *keying.problem), Outcome::kBadRequest};
    if (!keying.key) co_return co_await PassThrough(w, req);
    const std::string& key = *keying.key;
    std::string encoding;  // every Content-Encoding line, as one list
    for (auto [it, end] = req.equal_range(http::field::content_encoding); it != end; ++it) {
      if (!encoding.empty()) encoding += ',';
      encoding.append(it->value());
    }
    auto fp = RequestFingerprint(method, target, std::string_view(req[http::field::content_type]),
                                 req.body(), encoding);
    if (!fp) {
      co_return Answer{MakeProblem(req, problems::InvalidBody(fp.error().message())),
                       Outcome::kBadRequest};
    }
    const std::string_view principal(req[config.principal_header]);
    const std::string scope = PrincipalScope(route->scope, principal, config.principal_secret);
    // Rotation: the scope the secondary secret gives ("" when there is none, or no principal:
    // the anonymous scope is the same under every secret).
    const std::string secondary =
        config.principal_secret_secondary && !principal.empty()
            ? PrincipalScope(route->scope, principal, *config.principal_secret_secondary)
            : std::string();
    Answer a = co_await Gate(w, req, *route, scope, secondary, key, *fp);
    if (log.Enabled(Level::kInfo)) a.key_hash = KeyHash(scope, key);
    co_return a;
  }

  awaitable<Answer> Gate(Worker& w, Request& req, const Route& route, const std::string& scope,
                         const std::string& secondary, const std::string& key,
                         const Fingerprint& fp) {
    const auto deadline = SteadyClock::now() + route.wait;
    auto pause = std::chrono::milliseconds(2);
    for (;;) {
      const BeginRequest begin{.scope = scope, .key = key, .fingerprint = fp, .lease = route.lease};
      const auto t0 = SteadyClock::now();
      Result<BeginAnswer> answer = co_await StoreBegin(w, begin);
      const auto now = SteadyClock::now();
      metrics.store.store_begin_seconds->ObserveDuration(now - t0);
      // A busy key that this request will poll again is not its answer yet: idem_begin_total
      // counts one answer per request, the one it ends with.
      const bool poll_again = answer && std::holds_alternative<Busy>(*answer) &&
                              route.in_flight == InFlightPolicy::kWait && now + pause < deadline;
      // Under rotation an Acquired is not the answer yet either: what the secondary secret's
      // scope holds may decide it instead (FromSecondary counts that).
      const bool looks_further =
          answer && std::holds_alternative<Acquired>(*answer) && !secondary.empty();
      if (!poll_again && !looks_further) CountBegin(metrics.store, answer);
      if (!answer && answer.error().code() == StatusCode::kInvalidArgument) {
        // The store refuses this request's input: the config bounds everything else it checks
        // (durations, max_key_bytes, the scope), so what is left is the key, e.g. longer than a
        // store URL's own max_key_bytes. A retry with the same key fails the same way, so this
        // is §6's "key too long" 400, never a retryable 503.
        log.Write(Level::kWarn,
                  Cat("event=store_refused op=begin error=", Quoted{answer.error().ToString()}));
        co_return Answer{
            MakeProblem(req, problems::InvalidKey("the idempotency store does not accept this key "
                                                  "(longer than the store's limit?)")),
            Outcome::kBadRequest};
      }
      if (!answer) {
        log.Write(Level::kWarn,
                  Cat("event=store_error op=begin error=", Quoted{answer.error().ToString()}));
        co_return Answer{Unavailable(req, "the idempotency store cannot be reached"),
                         Outcome::kStoreUnavailable};
      }
      if (auto* acquired = std::get_if<Acquired>(&*answer)) {
        // Ours under this scope (new, or an abandoned attempt taken over): it may have been
        // begun, or even completed after such an attempt, under the secondary secret's scope.
        // Every holder of both secrets begins first and looks second, so two that began the
        // same key under different scopes see each other.
        if (!secondary.empty()) {
          if (std::optional<Answer> found =
                  co_await FromSecondary(w, req, scope, secondary, key, fp, acquired->token)) {
            co_return std::move(*found);
          }
          CountBegin(metrics.store, answer);
        }
        co_return co_await Forward(w, req, route, scope, key, *acquired);
      }
      if (auto* replay = std::get_if<Replay>(&*answer)) co_return Replayed(req, replay->response);
      if (std::holds_alternative<Busy>(*answer)) {
        if (poll_again) {
          asio::steady_timer timer(w.io, pause);
          co_await timer.async_wait(kNoThrow);
          pause = std::min(pause * 2, std::chrono::milliseconds(50));
          continue;
        }
        co_return Answer{MakeProblem(req, problems::InFlight(key)), Outcome::kInFlight};
      }
      if (std::holds_alternative<Conflict>(*answer)) {
        co_return Answer{MakeProblem(req, problems::KeyReuse(key)), Outcome::kKeyReuse};
      }
      // Stale: records have no versions, so not reachable.
      co_return Answer{Unavailable(req, "unexpected store answer"), Outcome::kStoreUnavailable};
    }
  }

  // The answer to a replay of a stored (EncodeStoredResponse) response.
  Answer Replayed(const Request& req, std::string_view response) {
    auto stored = DecodeStoredResponse(response);
    if (!stored) {
      log.Write(Level::kError,
                Cat("event=stored_response_unreadable error=", Quoted{stored.error().ToString()}));
      return Answer{
          MakeProblem(req, problems::UpstreamFailed("the stored response cannot be read")),
          Outcome::kReplayed};
    }
    if (stored->body_omitted) {
      Response res = MakeProblem(req, problems::ReplayTooLarge(stored->body_size));
      res.set(kReplayedHeader, "true");
      return Answer{std::move(res), Outcome::kReplayed, {}, stored->status};
    }
    Answer a{Response{}, Outcome::kReplayed, {}, stored->status};
    a.replay = std::move(*stored);
    return a;
  }

  // The key was just acquired under `scope`; what the secondary secret's scope holds for it
  // decides the answer instead, as Begin would have there: a completion is replayed (or 422
  // for another payload), a running lease is 409; the key under `scope` is then released.
  // nullopt: nothing there (or an abandoned attempt): run it under `scope`. A store that
  // cannot answer is 503, the key released (fail closed).
  awaitable<std::optional<Answer>> FromSecondary(Worker& w, const Request& req,
                                                 const std::string& scope,
                                                 const std::string& secondary,
                                                 const std::string& key, const Fingerprint& fp,
                                                 Token token) {
    Result<std::optional<Record>> found = co_await StoreGet(w, secondary, key);
    std::optional<Answer> answer;
    SecondaryResult result = SecondaryResult::kAbsent;
    Counter* begin_answer = nullptr;
    if (!found) {
      log.Write(Level::kWarn,
                Cat("event=store_error op=get error=", Quoted{found.error().ToString()}));
      metrics.store.store_errors->Inc();
      answer.emplace(Unavailable(req, "the idempotency store cannot be reached"),
                     Outcome::kStoreUnavailable);
      result = SecondaryResult::kError;
    } else if (!found->has_value()) {
      // Nothing there: run it under `scope`.
    } else if (const Record& r = **found; r.state == RecordState::kInProgress) {
      if (r.lease_deadline > Clock::System().Now()) {
        answer.emplace(MakeProblem(req, problems::InFlight(key)), Outcome::kInFlight);
        result = SecondaryResult::kInFlight;
        begin_answer = metrics.store.begin_busy;
      }
    } else if (r.fingerprint && *r.fingerprint != fp) {
      answer.emplace(MakeProblem(req, problems::KeyReuse(key)), Outcome::kKeyReuse);
      result = SecondaryResult::kKeyReuse;
      begin_answer = metrics.store.begin_conflict;
    } else {
      answer.emplace(Replayed(req, r.response));
      result = SecondaryResult::kReplayed;
      begin_answer = metrics.store.begin_replay;
    }
    metrics.CountSecondary(result);
    // The request's begin answer is the secondary scope's (a lookup that failed is a store
    // error, counted above).
    if (begin_answer != nullptr) begin_answer->Inc();
    if (!answer) co_return std::nullopt;
    co_await ReleaseKey(w, scope, key, token);
    co_return answer;
  }

  // Sends the request upstream as the owner of the key, then stores or releases the outcome.
  awaitable<Answer> Forward(Worker& w, Request& req, const Route& route, const std::string& scope,
                            const std::string& key, const Acquired& acquired) {
    const bool head = req.method() == http::verb::head;
    PrepareUpstream(req);
    req.set(kAttemptHeader, std::to_string(acquired.attempt));
    const auto t0 = SteadyClock::now();
    UpstreamResult up = co_await w.pool->Send(req, head, config.upstream_timeout);
    metrics.upstream_seconds->ObserveDuration(SteadyClock::now() - t0);
    metrics.store.handler_seconds->ObserveDuration(SteadyClock::now() - t0);
    if (!up.res) {
      co_await ReleaseKey(w, scope, key, acquired.token);
      log.Write(Level::kWarn,
                Cat("event=upstream_error error=", Quoted{up.error}, " key_released=true"));
      co_return UpstreamProblem(req, up);
    }
    std::optional<Response>& res = up.res;
    StripHopByHop(*res);
    const unsigned status = res->result_int();
    if (!route.Stores(status)) {
      co_await ReleaseKey(w, scope, key, acquired.token);
      co_return Answer{std::move(*res), Outcome::kReleased, {}, status};
    }
    const std::string encoded = EncodeStoredResponse(ToStored(*res, head));
    const CompleteRequest complete{.scope = scope,
                                   .key = key,
                                   .token = acquired.token,
                                   .outcome = idem::Outcome::kSuccess,
                                   .response = encoded,
                                   .retention = route.retention};
    // The upstream acted, so a store error here would leave the key IN_PROGRESS and let the
    // client's retry run the upstream again after the lease: the completion is tried again
    // (it is fenced by the token, so a try that did land makes a later one LeaseLost, never a
    // second write), as the consumer does.
    Result<WriteAnswer> done = UnavailableError("not tried");
    for (int attempt = 0; attempt < kCompleteTries; ++attempt) {
      if (attempt > 0) {
        metrics.store.store_errors->Inc();
        asio::steady_timer pause(w.io, kCompleteRetryPause * attempt);
        co_await pause.async_wait(kNoThrow);
      }
      const auto t1 = SteadyClock::now();
      done = co_await StoreComplete(w, complete);
      metrics.store.store_complete_seconds->ObserveDuration(SteadyClock::now() - t1);
      if (done) {
        // After a try that failed mid-way, "not yours" most likely means that try landed.
        if (attempt > 0 && *done == WriteAnswer::kLeaseLost) done = WriteAnswer::kApplied;
        break;
      }
      // A response the store refuses (over its own limit) is refused the same way again.
      if (done.error().code() == StatusCode::kInvalidArgument) break;
    }
    if (!done) {
      // The upstream acted; its answer is the truth for this client. The key stays in progress
      // until its lease ends, then a retry runs again with the next attempt number. A refused
      // response is not a store that failed to answer, so it is no store error.
      const bool refused = done.error().code() == StatusCode::kInvalidArgument;
      if (!refused) metrics.store.store_errors->Inc();
      log.Write(Level::kError, Cat(refused ? "event=store_refused op=complete error="
                                           : "event=completion_lost error=",
                                   Quoted{done.error().ToString()}));
    } else if (*done == WriteAnswer::kLeaseLost) {
      metrics.store.lease_lost->Inc();
      log.Write(Level::kWarn,
                "event=lease_lost detail=\"the upstream took longer than the lease\"");
    } else {
      metrics.store.complete_success->Inc();
    }
    co_return Answer{std::move(*res), Outcome::kForwarded, {}, status};
  }

  awaitable<void> ReleaseKey(Worker& w, const std::string& scope, const std::string& key,
                             Token token) {
    const auto t0 = SteadyClock::now();
    Result<WriteAnswer> r = co_await StoreRelease(w, scope, key, token);
    metrics.store.store_release_seconds->ObserveDuration(SteadyClock::now() - t0);
    if (!r) {
      metrics.store.store_errors->Inc();
      log.Write(Level::kError, Cat("event=release_failed error=", Quoted{r.error().ToString()}));
    } else if (*r == WriteAnswer::kApplied) {
      metrics.store.releases->Inc();
    } else {
      metrics.store.lease_lost->Inc();  // taken over while the upstream ran
    }
  }

  static Answer UpstreamProblem(const Request& req, const UpstreamResult& up) {
    return Answer{MakeProblem(req, up.timeout ? problems::UpstreamTimeout()
                                              : problems::UpstreamFailed(up.error)),
                  Outcome::kUpstreamError};
  }

  awaitable<Answer> PassThrough(Worker& w, Request& req) {
    const bool head = req.method() == http::verb::head;
    PrepareUpstream(req);
    UpstreamResult up =
        co_await w.pool->Send(req, head, config.upstream_timeout, IsIdempotent(req.method()));
    if (!up.res) co_return UpstreamProblem(req, up);
    std::optional<Response>& res = up.res;
    StripHopByHop(*res);
    const unsigned status = res->result_int();
    co_return Answer{std::move(*res), Outcome::kPassThrough, {}, status};
  }

  void PrepareUpstream(Request& req) const {
    // The upstream gets the key (SPEC §6) and the principal idemd scoped it by, whatever the
    // client's Connection header names.
    StripHopByHop(req, {config.key_header, config.principal_header});
    // Only idemd says which attempt this is (Forward sets it on keyed requests).
    req.erase(kAttemptHeader);
    // idemd has read the whole body already: an upstream asked to say 100 Continue first would
    // only add an interim answer.
    req.erase(http::field::expect);
    req.set(http::field::host, upstream.host);
    if (!upstream.base.empty()) {
      req.target(Cat(upstream.base, std::string_view(req.target())));
    }
    req.version(11);
    req.keep_alive(true);
    req.prepare_payload();
  }

  // ---- connections ----

  awaitable<void> Session(Worker& w, tcp::socket socket) {
    metrics.connections->Add(1);
    const OnExit closed([this] { metrics.connections->Add(-1); });
    beast::tcp_stream stream(std::move(socket));
    // A throw (from a library; idemd's own code does not throw) ends this connection only.
    // co_spawn's detached handler would drop it without a word.
    try {
      co_await ServeRequests(w, stream);
    } catch (const std::exception& e) {
      log.Write(Level::kError, Cat("event=connection_error error=", Quoted{e.what()}));
    }
    boost::system::error_code ignored;
    stream.socket().shutdown(tcp::socket::shutdown_send, ignored);
  }

  awaitable<void> ServeRequests(Worker& w, beast::tcp_stream& stream) {
    beast::flat_buffer buffer;
    for (;;) {
      if (buffer.size() == 0) {
        // Idle keep-alive: wait for the first byte of the next request.
        if (draining.load(std::memory_order_relaxed)) co_return;
        w.idle_sessions.insert(&stream);
        stream.expires_after(config.idle_timeout);
        auto [ec, n] = co_await stream.async_read_some(buffer.prepare(4096), kNoThrow);
        w.idle_sessions.erase(&stream);
        if (ec) co_return;
        buffer.commit(n);
      }
      busy_requests.fetch_add(1, std::memory_order_relaxed);
      const OnExit served([this] { busy_requests.fetch_sub(1, std::memory_order_relaxed); });
      if (!co_await ServeOne(w, stream, buffer)) co_return;
    }
  }

  static constexpr std::string_view k100Continue = "HTTP/1.1 100 Continue\r\n\r\n";
  // An HTTP/1.1 client waiting for 100 Continue before its body (1.0 clients never are).
  static bool ContinueExpected(const http::request<http::string_body>& req) {
    return req.version() >= 11 && beast::iequals(req[http::field::expect], "100-continue");
  }

  // Answers `problem` on a connection that then closes: the rest of the request is not read.
  awaitable<void> Refuse(beast::tcp_stream& stream, const Problem& problem, std::string_view why) {
    Response res = MakeProblem(11, problem);
    res.keep_alive(false);
    res.prepare_payload();
    stream.expires_after(config.client_timeout);
    co_await http::async_write(stream, res, kNoThrow);
    metrics.Count(nullptr, config, Outcome::kBadRequest, {});
    log.Write(Level::kInfo,
              Cat("outcome=bad_request status=", problem.status, " error=", Quoted{why}));
  }

  // What HTTP/1.1 itself refuses in a request's head, checked before its body is read. Its
  // framing: Beast frames a body by a final "chunked" coding or by Content-Length and ignores
  // any other transfer coding, so a request another server would read differently (request
  // smuggling: what Beast takes for the next request is this one's body) is refused, RFC 9112
  // §6.3 and §6.1. And its Host: missing from an HTTP/1.1 request, or given twice (§3.2).
  static std::optional<Problem> ProtocolProblem(const Request& req) {
    std::vector<std::string_view> codings;
    std::size_t lines = 0;
    for (auto [it, end] = req.equal_range(http::field::transfer_encoding); it != end; ++it) {
      ++lines;
      AnyListItem(std::string_view(it->value()), [&](std::string_view coding) {
        codings.push_back(coding);
        return false;
      });
    }
    if (lines > 0) {
      if (req.version() < 11) {
        return problems::MalformedRequest("Transfer-Encoding in an HTTP/1.0 request");
      }
      if (codings.empty() || !EqualsIgnoreCase(codings.back(), "chunked")) {
        return problems::MalformedRequest(
            "the request's final transfer coding is not chunked: its length is unknown");
      }
      for (std::size_t i = 0; i + 1 < codings.size(); ++i) {
        if (EqualsIgnoreCase(codings[i], "chunked")) {
          return problems::MalformedRequest("chunked is applied more than once");
        }
      }
      if (codings.size() > 1) {
        return problems::UnsupportedTransferCoding(
            Cat("idemd decodes only the chunked transfer coding, not ", codings.front()));
      }
    }
    const std::size_t hosts = req.count(http::field::host);
    if (hosts > 1) return problems::MalformedRequest("more than one Host header");
    if (hosts == 0 && req.version() >= 11) {
      return problems::MalformedRequest("an HTTP/1.1 request needs a Host header");
    }
    return std::nullopt;
  }

  // The problem a request's headers alone give it on its route, if any (for a client waiting
  // for 100 Continue, which then need not send its body).
  std::optional<Problem> RouteProblem(const Request& req) const {
    const Result<std::string> origin = OriginForm(std::string_view(req.target()));
    if (!origin) return problems::InvalidTarget(Cat("the target ", origin.error().message()));
    const std::string_view path = std::string_view(*origin).substr(0, origin->find('?'));
    return KeyingOf(req, config.RouteFor(path)).problem;
  }

  // A header block over max_header_bytes: 414 when the request line alone is (in practice its
  // target), else 431. The line is the parser's once it has taken it, else the buffer's up to
  // its first CRLF (none: longer than all that came).
  std::optional<Problem> HeaderLimitProblem(const Request& req,
                                            const beast::flat_buffer& buffer) const {
    std::size_t line = 0;
    if (!req.target().empty()) {
      line = req.method_string().size() + req.target().size() +
             std::string_view(" HTTP/1.1").size() + 1;
    } else {
      const std::string_view data(static_cast<const char*>(buffer.data().data()), buffer.size());
      const std::size_t eol = data.find("\r\n");
      line = eol == std::string_view::npos ? std::numeric_limits<std::size_t>::max() : eol;
    }
    return line > config.max_header_bytes ? problems::TargetTooLong() : problems::HeadersTooLarge();
  }

  // Reads one request (the whole of it within client_timeout), answers it; false: close.
  awaitable<bool> ServeOne(Worker& w, beast::tcp_stream& stream, beast::flat_buffer& buffer) {
    http::request_parser<http::string_body> parser;
    parser.header_limit(static_cast<std::uint32_t>(config.max_header_bytes));
    parser.body_limit(config.max_body_bytes);
    // The whole request must arrive within client_timeout (slow clients hold no thread, but
    // they must not hold a connection forever either). A timer rather than the stream's own
    // expiry, which would close the socket before the 408 could be written.
    stream.expires_never();
    bool timed_out = false;
    asio::steady_timer deadline(w.io, config.client_timeout);
    deadline.async_wait([&](const boost::system::error_code& timer_ec) {
      if (timer_ec) return;
      timed_out = true;
      boost::system::error_code ignored;
      stream.socket().cancel(ignored);
    });
    auto [ec, n] = co_await http::async_read_header(stream, buffer, parser, kNoThrow);
    // A request refused before all of it is read (its framing, or for a client waiting for
    // 100 Continue, its headers): the connection closes after the answer.
    std::optional<Problem> refused;
    std::size_t header_fields = 0;
    if (!ec) {
      header_fields = FieldCount(parser.get());
      // The parser checks its limit against what it has not parsed yet, so a header block that
      // arrived whole may pass it: `n` is what it parsed.
      refused = n > config.max_header_bytes ? HeaderLimitProblem(parser.get(), buffer)
                                            : ProtocolProblem(parser.get());
    }
    if (!ec && !refused && !parser.is_done()) {
      if (ContinueExpected(parser.get()) && buffer.size() == 0) {
        // The client holds its body back for this (RFC 9110 §10.1.1); without it, it waits a
        // while (curl: 1 s) and sends anyway. A body over max_body_bytes was refused with the
        // header already (its Content-Length), and so is a request its headers already fail,
        // before the client is told to go on.
        refused = RouteProblem(parser.get());
        if (!refused) {
          std::tie(ec, n) =
              co_await asio::async_write(stream, asio::buffer(k100Continue), kNoThrow);
        }
      }
      if (!ec && !refused) {
        std::tie(ec, n) = co_await http::async_read(stream, buffer, parser, kNoThrow);
      }
    }
    deadline.cancel();
    if (timed_out && ec) ec = beast::error::timeout;
    if (ec) {
      std::optional<Problem> problem;
      if (ec == http::error::header_limit) {
        problem = HeaderLimitProblem(parser.get(), buffer);
      } else if (ec == http::error::body_limit) {
        problem = problems::BodyTooLarge(config.max_body_bytes);
      } else if (ec == beast::error::timeout) {
        problem = Problem{.status = 408,
                          .type = "https://idem.dev/problems/request-timeout",
                          .title = "Request Timeout",
                          .detail = "the request did not arrive within client_timeout"};
      } else if (ec.category() == http::make_error_code(http::error::bad_target).category() &&
                 ec != http::error::end_of_stream && ec != http::error::partial_message) {
        problem = problems::MalformedRequest(Cat("not a valid HTTP/1.1 request: ", ec.message()));
      }
      if (problem) co_await Refuse(stream, *problem, ec.message());
      co_return false;
    }
    // Beast adds a chunked body's trailer fields to the header, where they would act as
    // headers (the key, the principal) though they arrived after the body.
    if (!refused && FieldCount(parser.get()) > header_fields) {
      refused = problems::MalformedRequest(
          "trailer fields after a chunked body are not accepted: send them as headers");
    }
    if (refused) {
      co_await Refuse(stream, *refused, refused->detail);
      co_return false;
    }
    stream.expires_never();
    const auto t0 = SteadyClock::now();
    Request req = parser.release();
    const bool client_keeps = req.keep_alive();
    const bool head = req.method() == http::verb::head;
    const unsigned version = req.version();
    std::string method, path;  // for the log line, before the request is rewritten upstream
    if (log.Enabled(Level::kInfo)) {
      method = std::string(req.method_string());
      const std::string_view target(req.target());
      path = std::string(target.substr(0, target.find('?')));
    }
    Answer a = co_await Handle(w, req);
    // Once draining, the connection ends after this answer: say so, also to a request that was
    // already in flight when it began, so the client does not send its next one on it.
    const bool keep = client_keeps && !draining.load(std::memory_order_relaxed);
    const unsigned status = a.replay ? a.replay->status : a.res.result_int();
    if (!a.replay) {
      a.res.version(version);
      a.res.keep_alive(keep);
      if (status == 204) {
        a.res.erase(http::field::content_length);
      } else if (!KeepsLength(status, head) && !Bodiless(status)) {
        a.res.prepare_payload();
      }
    }
    const auto elapsed = SteadyClock::now() - t0;
    metrics.Count(a.route, config, a.outcome, elapsed);
    if (log.Enabled(Level::kInfo)) {
      log.Write(Level::kInfo,
                Cat("method=", method, " path=", Quoted{path},
                    " route=", Quoted{a.route ? std::string_view(a.route->prefix) : "-"},
                    " key=", KeyHashText(a.key_hash),
                    " outcome=", kOutcomeNames[static_cast<int>(a.outcome)], " status=", status,
                    " upstream_status=", a.upstream_status,
                    " ms=", std::chrono::duration<double, std::milli>(elapsed).count()));
    }
    stream.expires_after(config.client_timeout);
    const std::string wire =
        a.replay ? SerializeReplay(*a.replay, version, keep, head) : Serialize(a.res, !head);
    auto [wec, wn] = co_await asio::async_write(stream, asio::buffer(wire), kNoThrow);
    stream.expires_never();
    co_return !wec && keep;
  }

  awaitable<void> Accept(Worker& w) {
    for (;;) {
      auto [ec, socket] = co_await w.acceptor->async_accept(kNoThrow);
      if (ec == asio::error::operation_aborted || !w.acceptor->is_open()) co_return;
      if (ec) {
        log.Write(Level::kWarn, Cat("event=accept_error error=", Quoted{ec.message()}));
        asio::steady_timer t(w.io, std::chrono::milliseconds(10));  // e.g. EMFILE: back off
        co_await t.async_wait(kNoThrow);
        continue;
      }
      boost::system::error_code ignored;
      socket.set_option(tcp::no_delay(true), ignored);
      asio::co_spawn(w.io, Session(w, std::move(socket)), asio::detached);
    }
  }

  // ---- lifecycle ----

  Status Start() {
    std::size_t threads = config.threads;
    if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
    if (config.store_threads > 0 && store.Name() != "memory") {
      store_pool = std::make_unique<asio::thread_pool>(config.store_threads);
    }
    const std::size_t idle_per_thread =
        std::max<std::size_t>(1, config.upstream_connections / threads);
    Endpoint listen_at = config.listen;
    IDEM_RETURN_IF_ERROR(asio_parts::CheckNobodyListens(listen_at));
    for (std::size_t i = 0; i < threads; ++i) {
      auto w = std::make_unique<Worker>();
      w->acceptor.emplace(w->io);
      auto bound_at = asio_parts::Bind(*w->acceptor, listen_at, true);
      if (!bound_at) return bound_at.error();
      if (i == 0) {
        listen_at.port = bound_at->port();  // port 0: every thread binds the one it got
        bound = Endpoint{bound_at->address().to_string(), bound_at->port()};
      }
      w->pool.emplace(w->io, upstream, idle_per_thread, metrics);
      if (store_pool) {
        w->batcher.emplace(w->io, *store_pool, store,
                           std::max<std::size_t>(1, config.store_threads / threads),
                           started_batches);
      }
      workers.push_back(std::move(w));
    }
    gauges = std::make_unique<StoreGauges>(store, registry);
    auto admin_server = AdminServer::Start(
        config.admin, registry,
        [this]() -> Status {
          IDEM_RETURN_IF_ERROR(StoreReady(store));
          if (draining) return UnavailableError("draining");
          return OkStatus();
        },
        [this] { return store.Broken(); });
    if (!admin_server) return admin_server.error();
    admin = std::move(*admin_server);
    admin_bound = admin->bound();

    for (auto& w : workers) {
      asio::co_spawn(w->io, Accept(*w), asio::detached);
      Worker* raw = w.get();
      w->thread = std::thread([raw] {
        core::NameThisThread("idemd-io");
        raw->io.run();
      });
    }
    log.Write(Level::kInfo,
              Cat("event=started listen=", bound.host, ":", bound.port, " admin=", admin_bound.host,
                  ":", admin_bound.port, " threads=", threads, " store=", store.Name(),
                  " store_url=", Quoted{core::RedactUrlPassword(config.store)},
                  " upstream=", config.upstream));
    return OkStatus();
  }

  void Shutdown() {
    std::call_once(shutdown_once, [this] {
      draining = true;
      log.Write(Level::kInfo, "event=draining");
      for (auto& w : workers) {
        Worker* raw = w.get();
        asio::post(raw->io, [raw] {
          boost::system::error_code ignored;
          if (raw->acceptor) raw->acceptor->close(ignored);
          for (beast::tcp_stream* s : raw->idle_sessions) s->socket().cancel(ignored);
        });
      }
      const auto grace_end = SteadyClock::now() + config.shutdown_grace;
      while (busy_requests.load() > 0 && SteadyClock::now() < grace_end) {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
      if (const int left = busy_requests.load(); left > 0) {
        log.Write(Level::kWarn, Cat("event=shutdown_cancel in_flight=", left,
                                    " detail=\"grace over: upstream calls cancelled, "
                                    "keys released\""));
        for (auto& w : workers) {
          Worker* raw = w.get();
          asio::post(raw->io, [raw] { raw->pool->CancelAll(); });
        }
        const auto cancel_end = SteadyClock::now() + std::chrono::seconds(5);
        while (busy_requests.load() > 0 && SteadyClock::now() < cancel_end) {
          std::this_thread::sleep_for(std::chrono::milliseconds(5));
        }
      }
      for (auto& w : workers) w->io.stop();
      for (auto& w : workers) {
        if (w->thread.joinable()) w->thread.join();
      }
      for (auto& w : workers) {
        if (w->pool) w->pool->CancelAll();  // its threads are gone: no race
      }
      if (admin) admin->Stop();
      gauges.reset();
      if (store_pool) store_pool->join();
      // The store calls back for every batch it started (failing them if it cannot write),
      // and the callbacks touch the batchers: wait for them before the workers go.
      while (started_batches.load() > 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      log.Write(Level::kInfo, "event=stopped");
    });
  }
};

Result<std::unique_ptr<Server>> Server::Start(const Config& config, Store& store,
                                              Registry& registry) {
  auto upstream = ResolveUpstream(config.upstream);
  if (!upstream) return upstream.error();
  auto impl = std::make_unique<Impl>(config, store, registry, std::move(*upstream));
  if (Status s = impl->Start(); !s.ok()) {
    impl->Shutdown();
    return s;
  }
  return std::unique_ptr<Server>(new Server(std::move(impl)));
}

Server::Server(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Server::~Server() { Shutdown(); }
Endpoint Server::listening() const { return impl_->bound; }
Endpoint Server::admin() const { return impl_->admin_bound; }
void Server::Shutdown() { impl_->Shutdown(); }

}  // namespace idem::gateway
