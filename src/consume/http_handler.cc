#include "consume/http_handler.h"

#include <algorithm>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <optional>
#include <string>
#include <utility>

#include "gateway/asio_parts.h"

namespace idem::consume {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using SteadyClock = std::chrono::steady_clock;

constexpr std::size_t kMaxResponseBody = 1 << 20;
// The answer's header block may be this long (Beast's default, 8 KiB, made a handler that
// answered 200 with a large header look like one that never answered).
constexpr std::uint32_t kMaxResponseHeader = 64 * 1024;
constexpr std::size_t kMaxErrorText = 512;

// Why `value` cannot be sent as an HTTP field value as it is (RFC 9110 §5.5: no control bytes
// but HTAB, and no leading or trailing whitespace, which the receiver would strip); nullopt
// when it can. Beast writes what it is given: a CR LF in a message's key would have started a
// header of the message's choosing in the handler's request.
std::optional<std::string> FieldValueProblem(std::string_view value) {
  for (std::size_t i = 0; i < value.size(); ++i) {
    const auto c = static_cast<unsigned char>(value[i]);
    if ((c < 0x20 && c != '\t') || c == 0x7f) {
      return "holds a control byte (" + std::to_string(c) + ") at offset " + std::to_string(i);
    }
  }
  if (!value.empty() && (value.front() == ' ' || value.front() == '\t' || value.back() == ' ' ||
                         value.back() == '\t')) {
    return std::string("begins or ends with whitespace, which HTTP strips");
  }
  return std::nullopt;
}

bool NameEquals(std::string_view a, std::string_view b) {
  return std::equal(a.begin(), a.end(), b.begin(), b.end(), [](char x, char y) {
    return std::tolower(static_cast<unsigned char>(x)) ==
           std::tolower(static_cast<unsigned char>(y));
  });
}

std::string Excerpt(std::string_view body) {
  if (body.size() <= kMaxErrorText) return std::string(body);
  return std::string(body.substr(0, kMaxErrorText)) + "...";
}

// What one exchange got.
struct Exchanged {
  boost::system::error_code ec{};  // why no (readable) response header arrived
  // Some of an answer arrived (one that could not be read): the request is not sent again.
  bool partly = false;
  // The status line and header arrived: the handler saw the request, so it is never sent again,
  // and its verdict is the status, whatever becomes of the body.
  bool answered = false;
  unsigned status = 0;
  std::string body{};  // empty when it was not read whole
  bool reuse = false;  // the connection may carry the next request
};

}  // namespace

struct HttpHandler::Impl {
  ConsumerConfig config;
  std::string host_header;
  std::string target;
  tcp::endpoint endpoint;
  asio::io_context io{1};
  std::optional<beast::tcp_stream> stream;
  beast::flat_buffer buffer;

  // Runs the pending asynchronous operation to its end (or its stream's deadline).
  void RunIo() {
    io.restart();
    io.run();
  }

  boost::system::error_code Connect(SteadyClock::time_point deadline) {
    stream.emplace(io);
    buffer.clear();
    boost::system::error_code ec;
    stream->expires_at(deadline);
    stream->async_connect(endpoint, [&](boost::system::error_code e) { ec = e; });
    RunIo();
    if (!ec) stream->socket().set_option(tcp::no_delay(true), ec);
    if (ec) stream.reset();
    return ec;
  }

  // One exchange on the current connection.
  Exchanged Exchange(http::request<http::string_body>& req, SteadyClock::time_point deadline) {
    Exchanged out;
    stream->expires_at(deadline);
    http::async_write(*stream, req, [&](boost::system::error_code e, std::size_t) { out.ec = e; });
    RunIo();
    if (out.ec) return out;
    std::optional<http::response_parser<http::string_body>> parsing;
    // Interim answers (100 Continue, 103 Early Hints) are read past: the verdict is the final
    // status. Taken as final, a 103 left its request's real answer to be read as the next
    // request's, and every verdict after it belonged to the message before.
    for (;;) {
      parsing.emplace();
      parsing->header_limit(kMaxResponseHeader);
      // The header first, whatever the body's size: the verdict is in the status line.
      parsing->body_limit(boost::none);
      http::async_read_header(*stream, buffer, *parsing,
                              [&](boost::system::error_code e, std::size_t) { out.ec = e; });
      RunIo();
      if (out.ec) {
        out.partly = parsing->got_some() || buffer.size() > 0;
        return out;
      }
      const unsigned status = parsing->get().result_int();
      if (status >= 200 || status == 101) break;
    }
    http::response_parser<http::string_body>& parser = *parsing;
    out.answered = true;
    out.status = parser.get().result_int();
    if (out.status == 101) {  // switched protocols: no HTTP answer will follow on it
      out.reuse = false;
      return out;
    }
    if (ReadBody(parser)) {
      out.reuse = parser.get().keep_alive();
      out.body = std::move(parser.get().body());
    }
    return out;
  }

  // The body of a response whose header arrived; false when it is over kMaxResponseBody or
  // did not arrive whole. The connection is then in the middle of a response: not reused.
  bool ReadBody(http::response_parser<http::string_body>& parser) {
    if (parser.is_done()) return true;
    const auto length = parser.content_length();
    if (length && *length > kMaxResponseBody) return false;
    parser.body_limit(kMaxResponseBody);  // a chunked or unsized body stops at it
    boost::system::error_code ec;
    http::async_read(*stream, buffer, parser,
                     [&](boost::system::error_code e, std::size_t) { ec = e; });
    RunIo();
    return !ec;
  }

  HandlerVerdict Handle(const HandlerContext& ctx, const BrokerMessage& m) {
    // What cannot go into the request as it is fails the message for good (dead-lettered as
    // permanent, naming why) rather than reaching the handler altered.
    const auto unsendable = [&](std::string_view what,
                                std::string_view value) -> std::optional<HandlerVerdict> {
      auto problem = FieldValueProblem(value);
      if (!problem) return std::nullopt;
      return HandlerVerdict{
          Verdict::kPermanent,
          std::string(what) + " cannot be sent in an HTTP header: it " + *problem};
    };
    if (auto v = unsendable("the key", ctx.key)) return *v;
    for (const auto& [name, value] : m.headers) {
      const bool sent = NameEquals(name, "content-type") ||
                        std::any_of(config.forward_headers.begin(), config.forward_headers.end(),
                                    [&](const std::string& f) { return NameEquals(name, f); });
      if (!sent) continue;
      if (auto v = unsendable("the message's header " + name, value)) return *v;
    }
    http::request<http::string_body> req{http::verb::post, target, 11};
    req.set(http::field::host, host_header);
    req.set(http::field::content_type, "application/json");
    for (const auto& [name, value] : m.headers) {
      if (NameEquals(name, "content-type")) req.set(http::field::content_type, value);
      for (const std::string& f : config.forward_headers) {
        if (NameEquals(name, f)) req.insert(name, value);
      }
    }
    req.set(config.key_header, ctx.key);
    req.set(config.attempt_header, std::to_string(ctx.attempt));
    req.keep_alive(true);
    req.body() = m.payload;
    req.prepare_payload();

    Exchanged x;
    // One deadline for the whole call, a reconnect included: the lease check (more than twice
    // handler_timeout) assumes a handler call never takes longer than handler_timeout.
    const auto deadline = SteadyClock::now() + config.handler_timeout;
    // A kept-alive connection the server closed meanwhile fails at once: reconnect and send
    // once more (the key goes with it, so a handler that did see the first is not fooled) --
    // but only when no answer came: a request the handler answered is never sent again.
    for (int tries = 0; tries < 2; ++tries) {
      const bool reused = stream.has_value();
      if (!stream) {
        x.ec = Connect(deadline);
        if (x.ec) break;
      }
      x = Exchange(req, deadline);
      if (x.answered) break;
      stream.reset();
      if (!reused || x.partly || x.ec == beast::error::timeout) break;
    }
    if (!x.answered) {
      return {Verdict::kRetryable,
              "handler " + config.handler + ": " +
                  (x.ec == beast::error::timeout ? "no answer within the handler timeout"
                                                 : x.ec.message())};
    }
    if (!x.reuse) stream.reset();
    if (x.status == 101) {
      return {Verdict::kRetryable, "handler " + config.handler + " switched protocols (101)"};
    }
    if (x.status >= 200 && x.status <= 299) {
      return {Verdict::kSuccess, std::to_string(x.status) + " " + x.body};
    }
    const bool permanent =
        std::any_of(config.permanent_statuses.begin(), config.permanent_statuses.end(),
                    [&](const gateway::StatusRange& r) { return r.Contains(x.status); });
    return {permanent ? Verdict::kPermanent : Verdict::kRetryable,
            "handler answered " + std::to_string(x.status) + ": " + Excerpt(x.body)};
  }
};

Result<std::unique_ptr<HttpHandler>> HttpHandler::Open(const ConsumerConfig& config) {
  auto url = gateway::ParseUpstreamUrl(config.handler);
  if (!url) return InvalidArgumentError("handler: " + url.error().message());
  auto endpoint = gateway::asio_parts::Resolve(url->endpoint.host, url->endpoint.port);
  if (!endpoint) return InvalidArgumentError("handler: " + endpoint.error().message());
  auto impl = std::make_unique<Impl>();
  impl->config = config;
  const std::string& host = url->endpoint.host;
  const bool v6 = host.find(':') != std::string::npos;
  impl->host_header = (v6 ? "[" + host + "]" : host) + ":" + std::to_string(url->endpoint.port);
  impl->target = url->base.empty() ? "/" : url->base;
  impl->endpoint = *endpoint;
  return std::unique_ptr<HttpHandler>(new HttpHandler(std::move(impl)));
}

HttpHandler::HttpHandler(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
HttpHandler::~HttpHandler() = default;

HandlerVerdict HttpHandler::Handle(const HandlerContext& context, const BrokerMessage& message) {
  return impl_->Handle(context, message);
}

}  // namespace idem::consume
