#include "gateway/admin.h"

#include <boost/asio.hpp>
#include <boost/asio/as_tuple.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <tuple>
#include <utility>

#include "core/thread_name.h"
#include "gateway/asio_parts.h"

namespace idem::gateway {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using asio::awaitable;

constexpr auto kNoThrow = asio::as_tuple(asio::use_awaitable);

}  // namespace

Status StoreReady(Store& store) {
  Status s = store.Ready();
  if (s.ok()) return s;
  return UnavailableError("store unavailable: " + s.ToString());
}

struct AdminServer::Impl {
  Impl(Registry& r, Readiness check, Readiness alive)
      : registry(r), ready(std::move(check)), live(std::move(alive)) {}

  Registry& registry;
  Readiness ready;
  Readiness live;
  asio::io_context io{1};
  // Readiness checks run here, not on the thread that serves: a store slow to answer (a pool
  // waiting for a connection, a statement timeout) would otherwise hold /healthz and /metrics
  // behind it, and a liveness probe would restart a process that is only waiting on its
  // database. Declared after `io`: checks still queued are destroyed before it.
  asio::thread_pool checks{1};
  std::optional<tcp::acceptor> acceptor;
  std::thread thread;
  Endpoint bound{};
  bool stopped = false;

  awaitable<void> Session(tcp::socket socket) {
    beast::tcp_stream stream(std::move(socket));
    beast::flat_buffer buffer;
    for (;;) {
      http::request<http::string_body> req;
      stream.expires_after(std::chrono::seconds(30));
      auto [ec, n] = co_await http::async_read(stream, buffer, req, kNoThrow);
      if (ec) break;
      http::response<http::string_body> res{http::status::ok, req.version()};
      res.set(http::field::content_type, "text/plain; charset=utf-8");
      const std::string_view target(req.target());
      // Routed by path: a scraper may add a query string (Prometheus' params, a cache buster).
      const std::string_view path = target.substr(0, target.find('?'));
      const bool head = req.method() == http::verb::head;
      if (req.method() != http::verb::get && !head) {
        res.result(http::status::method_not_allowed);
        res.set(http::field::allow, "GET, HEAD");
        res.body() = "method not allowed: GET or HEAD\n";
      } else if (path == "/metrics") {
        res.set(http::field::content_type, "text/plain; version=0.0.4; charset=utf-8");
        res.body() = registry.RenderPrometheus();
      } else if (path == "/healthz") {
        Status s = live ? live() : OkStatus();
        if (s.ok()) {
          res.body() = "ok\n";
        } else {
          res.result(http::status::service_unavailable);
          res.body() = s.message() + "\n";
        }
      } else if (path == "/readyz") {
        Status s = co_await asio::co_spawn(
            checks, [this]() -> awaitable<Status> { co_return ready(); }, asio::use_awaitable);
        if (s.ok()) {
          res.body() = "ready\n";
        } else {
          res.result(http::status::service_unavailable);
          res.body() = s.message() + "\n";
        }
      } else {
        res.result(http::status::not_found);
        res.body() = "not found: try /metrics, /healthz or /readyz\n";
      }
      res.keep_alive(req.keep_alive());
      res.prepare_payload();
      // A HEAD answer is the GET answer's header alone: a body after it would be read as the
      // start of the next answer on a keep-alive connection.
      http::response_serializer<http::string_body> serializer(res);
      boost::system::error_code wec;
      if (head) {
        std::tie(wec, std::ignore) =
            co_await http::async_write_header(stream, serializer, kNoThrow);
      } else {
        std::tie(wec, std::ignore) = co_await http::async_write(stream, serializer, kNoThrow);
      }
      if (wec || !req.keep_alive()) break;
    }
    boost::system::error_code ignored;
    stream.socket().shutdown(tcp::socket::shutdown_send, ignored);
  }

  awaitable<void> Accept() {
    for (;;) {
      auto [ec, socket] = co_await acceptor->async_accept(kNoThrow);
      if (ec == asio::error::operation_aborted || !acceptor->is_open()) co_return;
      if (ec) continue;
      asio::co_spawn(io, Session(std::move(socket)), asio::detached);
    }
  }
};

Result<std::unique_ptr<AdminServer>> AdminServer::Start(const Endpoint& at, Registry& registry,
                                                        Readiness ready, Readiness live) {
  auto impl = std::make_unique<Impl>(registry, std::move(ready), std::move(live));
  impl->acceptor.emplace(impl->io);
  auto bound = asio_parts::Bind(*impl->acceptor, at, false);
  if (!bound) return bound.error();
  impl->bound = Endpoint{bound->address().to_string(), bound->port()};
  asio::co_spawn(impl->io, impl->Accept(), asio::detached);
  Impl* raw = impl.get();
  impl->thread = std::thread([raw] {
    core::NameThisThread("idemd-admin");
    raw->io.run();
  });
  return std::unique_ptr<AdminServer>(new AdminServer(std::move(impl)));
}

AdminServer::AdminServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
AdminServer::~AdminServer() { Stop(); }

Endpoint AdminServer::bound() const { return impl_->bound; }

void AdminServer::Stop() {
  if (impl_->stopped) return;
  impl_->stopped = true;
  impl_->io.stop();
  if (impl_->thread.joinable()) impl_->thread.join();
  impl_->checks.stop();
  impl_->checks.join();
}

}  // namespace idem::gateway
