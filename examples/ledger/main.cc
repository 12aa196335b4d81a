// ledger: the example upstream behind idemd. It "charges" accounts and records every charge, so
// a request that reached it twice is visible as two charges.
//
//   ledger [--listen HOST:PORT] [--threads N]     (default 127.0.0.1:9000; port 0 = any free)
//
// When ready it prints one line to stdout, `ledger listening on HOST:PORT`. SIGTERM or SIGINT
// stops it with exit code 0.
//
//   POST /charges {"account":"acc-1","amount":1250}
//        201 {"id":1,"account":"acc-1","amount":1250,"idempotency_key":"<header>"|null,
//             "attempt":"<Idempotency-Attempt header>"|null}, with Location: /charges/1
//        400 {"error":"..."} when the body is not such an object (amount: a positive integer)
//   GET  /charges        200, a JSON array of every charge in id order
//   GET  /charges/count  200 {"count":N}
//   GET  /charges/ID     200 the charge, or 404
//   GET  /healthz        200 ok
//   GET|POST /ping       200 {"pong":true}; records nothing (the benchmark's upstream)
//
// Test controls, honoured on every request:
//   X-Ledger-Delay-Ms: N   answer N ms later without blocking other connections. A charge is
//                          recorded when the delay ends, even if the client has gone by then
//                          (an upstream that did the work but answered too late).
//   X-Ledger-Status: S     answer with status S (200..599; 201 means "as usual") and record
//                          nothing.
// A charge is recorded only when the answer is 201.
#include <pthread.h>
#include <signal.h>

#include <charconv>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

constexpr std::size_t kBodyLimit = 1 << 20;
constexpr std::int64_t kMaxDelayMs = 600'000;

struct Charge {
  std::int64_t id = 0;
  std::string account;
  std::int64_t amount = 0;
  std::optional<std::string> idempotency_key;
  std::optional<std::string> attempt;
};

void AppendJsonString(std::string& out, std::string_view s) {
  static constexpr char kHex[] = "0123456789abcdef";
  out += '"';
  for (const char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (u < 0x20) {
      out += "\\u00";
      out += kHex[u >> 4];
      out += kHex[u & 0xf];
    } else {
      out += c;
    }
  }
  out += '"';
}

void AppendOptionalJsonString(std::string& out, const std::optional<std::string>& s) {
  if (s) {
    AppendJsonString(out, *s);
  } else {
    out += "null";
  }
}

void AppendCharge(std::string& out, const Charge& c) {
  out += "{\"id\":" + std::to_string(c.id) + ",\"account\":";
  AppendJsonString(out, c.account);
  out += ",\"amount\":" + std::to_string(c.amount) + ",\"idempotency_key\":";
  AppendOptionalJsonString(out, c.idempotency_key);
  out += ",\"attempt\":";
  AppendOptionalJsonString(out, c.attempt);
  out += '}';
}

// Every charge, in id order. Thread-safe.
class Ledger {
 public:
  Charge Record(Charge c) {
    std::lock_guard lock(mu_);
    c.id = static_cast<std::int64_t>(charges_.size()) + 1;
    charges_.push_back(c);
    return c;
  }
  std::string ListJson() const {
    std::lock_guard lock(mu_);
    std::string out = "[";
    for (const Charge& c : charges_) {
      if (out.size() > 1) out += ',';
      AppendCharge(out, c);
    }
    out += ']';
    return out;
  }
  std::optional<std::string> OneJson(std::int64_t id) const {
    std::lock_guard lock(mu_);
    if (id < 1 || id > static_cast<std::int64_t>(charges_.size())) return std::nullopt;
    std::string out;
    AppendCharge(out, charges_[static_cast<std::size_t>(id - 1)]);
    return out;
  }
  std::size_t Count() const {
    std::lock_guard lock(mu_);
    return charges_.size();
  }

 private:
  mutable std::mutex mu_;
  std::vector<Charge> charges_;
};

// A strict reader for the charge body: one JSON object with a string "account" and a positive
// integer "amount"; other members of any JSON type are skipped.
class ChargeBodyReader {
 public:
  explicit ChargeBodyReader(std::string_view text) : s_(text) {}

  // The charge, or nullopt with error() set.
  std::optional<Charge> Read() {
    Charge c;
    bool have_account = false;
    bool have_amount = false;
    SkipSpace();
    if (!Eat('{')) return Fail("body must be a JSON object");
    SkipSpace();
    if (!Eat('}')) {
      while (true) {
        SkipSpace();
        std::string name;
        if (!ReadString(name)) return Fail("expected a member name");
        SkipSpace();
        if (!Eat(':')) return Fail("expected ':'");
        SkipSpace();
        if (name == "account") {
          if (!ReadString(c.account) || c.account.empty()) {
            return Fail("account must be a non-empty string");
          }
          have_account = true;
        } else if (name == "amount") {
          if (!ReadPositiveInteger(c.amount)) return Fail("amount must be a positive integer");
          have_amount = true;
        } else if (!SkipValue(0)) {
          return Fail("malformed JSON value");
        }
        SkipSpace();
        if (Eat('}')) break;
        if (!Eat(',')) return Fail("expected ',' or '}'");
      }
    }
    SkipSpace();
    if (pos_ != s_.size()) return Fail("trailing data after the JSON object");
    if (!have_account) return Fail("missing account");
    if (!have_amount) return Fail("missing amount");
    return c;
  }
  const std::string& error() const { return error_; }

 private:
  std::optional<Charge> Fail(std::string message) {
    error_ = std::move(message);
    return std::nullopt;
  }
  bool Eat(char c) {
    if (pos_ < s_.size() && s_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  void SkipSpace() {
    while (pos_ < s_.size() &&
           (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r')) {
      ++pos_;
    }
  }
  bool EatWord(std::string_view w) {
    if (s_.substr(pos_, w.size()) != w) return false;
    pos_ += w.size();
    return true;
  }
  static int HexValue(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  }
  static void AppendUtf8(std::string& out, std::uint32_t cp) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xc0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3f));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xe0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
      out += static_cast<char>(0x80 | (cp & 0x3f));
    } else {
      out += static_cast<char>(0xf0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3f));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
      out += static_cast<char>(0x80 | (cp & 0x3f));
    }
  }
  bool ReadHex4(std::uint32_t& v) {
    if (s_.size() - pos_ < 4) return false;
    v = 0;
    for (int i = 0; i < 4; ++i) {
      const int h = HexValue(s_[pos_++]);
      if (h < 0) return false;
      v = v * 16 + static_cast<std::uint32_t>(h);
    }
    return true;
  }
  bool ReadString(std::string& out) {
    if (!Eat('"')) return false;
    out.clear();
    while (pos_ < s_.size()) {
      const char c = s_[pos_++];
      if (c == '"') return true;
      if (static_cast<unsigned char>(c) < 0x20) return false;
      if (c != '\\') {
        out += c;
        continue;
      }
      if (pos_ >= s_.size()) return false;
      const char e = s_[pos_++];
      switch (e) {
        case '"':
        case '\\':
        case '/':
          out += e;
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'n':
          out += '\n';
          break;
        case 'r':
          out += '\r';
          break;
        case 't':
          out += '\t';
          break;
        case 'u': {
          std::uint32_t cp = 0;
          if (!ReadHex4(cp)) return false;
          if (cp >= 0xd800 && cp < 0xdc00) {
            std::uint32_t low = 0;
            if (!EatWord("\\u") || !ReadHex4(low) || low < 0xdc00 || low >= 0xe000) return false;
            cp = 0x10000 + ((cp - 0xd800) << 10) + (low - 0xdc00);
          } else if (cp >= 0xdc00 && cp < 0xe000) {
            return false;
          }
          AppendUtf8(out, cp);
          break;
        }
        default:
          return false;
      }
    }
    return false;
  }
  bool ReadPositiveInteger(std::int64_t& v) {
    const char* begin = s_.data() + pos_;
    const char* end = s_.data() + s_.size();
    if (begin == end || *begin < '1' || *begin > '9') return false;
    const auto [p, ec] = std::from_chars(begin, end, v);
    if (ec != std::errc()) return false;
    // Reject 12.5 and 1e3: an amount is a whole number of minor units.
    if (p != end && (*p == '.' || *p == 'e' || *p == 'E')) return false;
    pos_ += static_cast<std::size_t>(p - begin);
    return true;
  }
  bool SkipNumber() {
    const std::size_t start = pos_;
    Eat('-');
    std::size_t digits = 0;
    while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') ++pos_, ++digits;
    if (digits == 0) return false;
    if (Eat('.')) {
      digits = 0;
      while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') ++pos_, ++digits;
      if (digits == 0) return false;
    }
    if (Eat('e') || Eat('E')) {
      if (!Eat('+')) Eat('-');
      digits = 0;
      while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') ++pos_, ++digits;
      if (digits == 0) return false;
    }
    return pos_ > start;
  }
  bool SkipValue(int depth) {
    if (depth > 64 || pos_ >= s_.size()) return false;
    std::string ignored;
    switch (s_[pos_]) {
      case '"':
        return ReadString(ignored);
      case 't':
        return EatWord("true");
      case 'f':
        return EatWord("false");
      case 'n':
        return EatWord("null");
      case '[':
        ++pos_;
        SkipSpace();
        if (Eat(']')) return true;
        while (true) {
          SkipSpace();
          if (!SkipValue(depth + 1)) return false;
          SkipSpace();
          if (Eat(']')) return true;
          if (!Eat(',')) return false;
        }
      case '{':
        ++pos_;
        SkipSpace();
        if (Eat('}')) return true;
        while (true) {
          SkipSpace();
          if (!ReadString(ignored)) return false;
          SkipSpace();
          if (!Eat(':')) return false;
          SkipSpace();
          if (!SkipValue(depth + 1)) return false;
          SkipSpace();
          if (Eat('}')) return true;
          if (!Eat(',')) return false;
        }
      default:
        return SkipNumber();
    }
  }

  std::string_view s_;
  std::size_t pos_ = 0;
  std::string error_;
};

std::optional<std::int64_t> ParseInt(std::string_view s) {
  std::int64_t v = 0;
  const auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size()) return std::nullopt;
  return v;
}

std::optional<std::string> HeaderValue(const http::request<http::string_body>& req,
                                       std::string_view name) {
  const auto it = req.find(beast::string_view(name.data(), name.size()));
  if (it == req.end()) return std::nullopt;
  return std::string(it->value());
}

std::string ErrorJson(std::string_view message) {
  std::string out = "{\"error\":";
  AppendJsonString(out, message);
  out += '}';
  return out;
}

// One connection: read a request, maybe wait, answer, repeat while keep-alive.
class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket socket, Ledger& ledger)
      : stream_(std::move(socket)), timer_(stream_.get_executor()), ledger_(ledger) {}

  void Start() {
    asio::dispatch(stream_.get_executor(), [self = shared_from_this()] { self->Read(); });
  }

 private:
  void Read() {
    parser_.emplace();
    parser_->body_limit(kBodyLimit);
    http::async_read(
        stream_, buffer_, *parser_,
        [self = shared_from_this()](beast::error_code ec, std::size_t) { self->OnRead(ec); });
  }

  void OnRead(beast::error_code ec) {
    if (ec == http::error::end_of_stream) return Close();
    if (ec) {
      if (ec == http::error::body_limit) {
        request_ = {};
        return Reply(http::status::payload_too_large, ErrorJson("body too large"), false);
      }
      return;  // A broken or closed connection: drop it.
    }
    request_ = parser_->release();
    std::int64_t delay_ms = 0;
    if (const auto d = HeaderValue(request_, "X-Ledger-Delay-Ms")) {
      const auto v = ParseInt(*d);
      if (!v || *v < 0 || *v > kMaxDelayMs) {
        return Reply(http::status::bad_request, ErrorJson("bad X-Ledger-Delay-Ms"),
                     request_.keep_alive());
      }
      delay_ms = *v;
    }
    if (delay_ms == 0) return Answer();
    timer_.expires_after(std::chrono::milliseconds(delay_ms));
    timer_.async_wait([self = shared_from_this()](beast::error_code) { self->Answer(); });
  }

  void Answer() {
    const bool keep_alive = request_.keep_alive();
    if (const auto forced = HeaderValue(request_, "X-Ledger-Status")) {
      const auto v = ParseInt(*forced);
      if (!v || *v < 200 || *v > 599) {
        return Reply(http::status::bad_request, ErrorJson("bad X-Ledger-Status"), keep_alive);
      }
      if (*v != 201) {
        // 204 and 304 carry no body.
        const bool bodyless = *v == 204 || *v == 304;
        return Reply(static_cast<http::status>(*v),
                     bodyless ? "" : "{\"forced_status\":" + std::to_string(*v) + "}", keep_alive);
      }
    }
    const std::string_view target(request_.target().data(), request_.target().size());
    const std::string_view path = target.substr(0, target.find('?'));
    const http::verb method = request_.method();
    const bool is_get = method == http::verb::get || method == http::verb::head;

    if (path == "/charges" && method == http::verb::post) return PostCharge(keep_alive);
    if (path == "/charges" && is_get) {
      return Reply(http::status::ok, ledger_.ListJson(), keep_alive);
    }
    if (path == "/charges/count" && is_get) {
      return Reply(http::status::ok, "{\"count\":" + std::to_string(ledger_.Count()) + "}",
                   keep_alive);
    }
    if (path.starts_with("/charges/") && is_get) {
      const auto id = ParseInt(path.substr(9));
      const auto one = id ? ledger_.OneJson(*id) : std::nullopt;
      if (one) return Reply(http::status::ok, *one, keep_alive);
      return Reply(http::status::not_found, ErrorJson("no such charge"), keep_alive);
    }
    if (path == "/healthz" && is_get) {
      return Reply(http::status::ok, "ok", keep_alive, "text/plain");
    }
    if (path == "/ping" && (is_get || method == http::verb::post)) {
      return Reply(http::status::ok, "{\"pong\":true}", keep_alive);
    }
    if (path == "/charges" || path == "/charges/count" || path == "/healthz" || path == "/ping") {
      return Reply(http::status::method_not_allowed, ErrorJson("method not allowed"), keep_alive);
    }
    return Reply(http::status::not_found, ErrorJson("not found"), keep_alive);
  }

  void PostCharge(bool keep_alive) {
    ChargeBodyReader reader(request_.body());
    std::optional<Charge> charge = reader.Read();
    if (!charge) return Reply(http::status::bad_request, ErrorJson(reader.error()), keep_alive);
    charge->idempotency_key = HeaderValue(request_, "Idempotency-Key");
    charge->attempt = HeaderValue(request_, "Idempotency-Attempt");
    const Charge recorded = ledger_.Record(std::move(*charge));
    std::string body;
    AppendCharge(body, recorded);
    Reply(http::status::created, std::move(body), keep_alive, "application/json",
          "/charges/" + std::to_string(recorded.id));
  }

  void Reply(http::status status, std::string body, bool keep_alive,
             std::string_view content_type = "application/json", std::string location = "") {
    const bool head = request_.method() == http::verb::head;
    response_ = {};
    response_.result(status);
    response_.version(11);
    response_.set(http::field::server, "ledger");
    response_.set(http::field::content_type,
                  beast::string_view(content_type.data(), content_type.size()));
    if (!location.empty()) response_.set(http::field::location, location);
    response_.keep_alive(keep_alive);
    response_.body() = std::move(body);
    response_.prepare_payload();
    if (head) response_.body().clear();
    http::async_write(stream_, response_,
                      [self = shared_from_this(), keep_alive](beast::error_code ec, std::size_t) {
                        if (ec) return;
                        if (!keep_alive) return self->Close();
                        self->Read();
                      });
  }

  void Close() {
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
  }

  beast::tcp_stream stream_;
  asio::steady_timer timer_;
  Ledger& ledger_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  http::request<http::string_body> request_;
  http::response<http::string_body> response_;
};

class Listener : public std::enable_shared_from_this<Listener> {
 public:
  Listener(asio::io_context& ioc, tcp::acceptor acceptor, Ledger& ledger)
      : ioc_(ioc), acceptor_(std::move(acceptor)), ledger_(ledger) {}

  void Accept() {
    acceptor_.async_accept(asio::make_strand(ioc_),
                           [self = shared_from_this()](beast::error_code ec, tcp::socket s) {
                             if (ec == asio::error::operation_aborted) return;
                             if (!ec) {
                               beast::error_code ignored;
                               s.set_option(tcp::no_delay(true), ignored);
                               std::make_shared<Session>(std::move(s), self->ledger_)->Start();
                             }
                             self->Accept();
                           });
  }
  void Stop() {
    asio::post(acceptor_.get_executor(), [self = shared_from_this()] {
      beast::error_code ignored;
      self->acceptor_.close(ignored);
    });
  }

 private:
  asio::io_context& ioc_;
  tcp::acceptor acceptor_;
  Ledger& ledger_;
};

int Usage(const char* why) {
  std::fprintf(stderr, "ledger: %s\nusage: ledger [--listen HOST:PORT] [--threads N]\n", why);
  return 2;
}

int Run(int argc, char** argv) {
  std::string listen = "127.0.0.1:9000";
  std::int64_t threads = 1;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::printf(
          "usage: ledger [--listen HOST:PORT] [--threads N]\n"
          "An example upstream that records every charge (see examples/ledger/main.cc).\n");
      return 0;
    }
    if ((arg == "--listen" || arg == "--threads") && i + 1 >= argc) {
      return Usage("missing value after a flag");
    }
    if (arg == "--listen") {
      listen = argv[++i];
    } else if (arg == "--threads") {
      const auto v = ParseInt(argv[++i]);
      if (!v || *v < 1 || *v > 256) return Usage("--threads must be 1..256");
      threads = *v;
    } else {
      return Usage("unknown argument");
    }
  }
  const std::size_t colon = listen.rfind(':');
  if (colon == std::string::npos) return Usage("--listen must be HOST:PORT");
  std::string host = listen.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  const auto port = ParseInt(std::string_view(listen).substr(colon + 1));
  if (!port || *port < 0 || *port > 65535) return Usage("bad port in --listen");
  beast::error_code ec;
  const asio::ip::address address = asio::ip::make_address(host, ec);
  if (ec) return Usage("--listen host must be an IP address");

  asio::io_context ioc(static_cast<int>(threads));
  tcp::acceptor acceptor(ioc);
  const tcp::endpoint endpoint(address, static_cast<unsigned short>(*port));
  acceptor.open(endpoint.protocol(), ec);
  if (!ec) acceptor.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) acceptor.bind(endpoint, ec);
  if (!ec) acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    std::fprintf(stderr, "ledger: cannot listen on %s: %s\n", listen.c_str(), ec.message().c_str());
    return 1;
  }
  const tcp::endpoint bound = acceptor.local_endpoint();

  Ledger ledger;
  auto listener = std::make_shared<Listener>(ioc, std::move(acceptor), ledger);
  listener->Accept();

  // SIGINT and SIGTERM are blocked in every thread and taken by sigwait on this one: a signal
  // handler (asio::signal_set) can miss a signal under TSan, which defers asynchronous signals.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  const std::string shown = bound.address().is_v6() ? "[" + bound.address().to_string() + "]"
                                                    : bound.address().to_string();
  std::printf("ledger listening on %s:%u\n", shown.c_str(), static_cast<unsigned>(bound.port()));
  std::fflush(stdout);

  std::vector<std::thread> workers;
  for (std::int64_t i = 0; i < threads; ++i) workers.emplace_back([&ioc] { ioc.run(); });
  int signal_number = 0;
  sigwait(&stop_signals, &signal_number);
  asio::post(ioc, [&] {
    listener->Stop();
    ioc.stop();
  });
  for (std::thread& t : workers) t.join();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return Run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ledger: %s\n", e.what());
    return 1;
  }
}
