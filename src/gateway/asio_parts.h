// Socket set-up shared by the translation units that use Boost.Asio (server.cc, admin.cc).
// Include only from those: it pulls in Asio.
#ifndef IDEM_GATEWAY_ASIO_PARTS_H_
#define IDEM_GATEWAY_ASIO_PARTS_H_

#include <sys/socket.h>

#include <boost/asio.hpp>
#include <cstdint>
#include <string>

#include "gateway/config.h"
#include "idem/status.h"

namespace idem::gateway::asio_parts {

// An IP literal as is, else the first address the name resolves to.
inline Result<boost::asio::ip::tcp::endpoint> Resolve(const std::string& host, std::uint16_t port) {
  namespace asio = boost::asio;
  boost::system::error_code ec;
  const auto address = asio::ip::make_address(host, ec);
  if (!ec) return asio::ip::tcp::endpoint(address, port);
  asio::io_context io;
  asio::ip::tcp::resolver resolver(io);
  auto results = resolver.resolve(host, std::to_string(port), ec);
  if (ec || results.empty()) {
    return InvalidArgumentError("cannot resolve '" + host + "': " + ec.message());
  }
  return results.begin()->endpoint();
}

// kUnavailable when something listens on `at` already. A socket without SO_REUSEPORT cannot
// bind a port another listens on, whatever that one set: so idemd, whose I/O threads each bind
// the port with SO_REUSEPORT, checks first that nobody else has it (a second idemd joined the
// first one's port, each with its own store, and a retry landing on the other one ran again).
inline Status CheckNobodyListens(const Endpoint& at) {
  namespace asio = boost::asio;
  if (at.port == 0) return OkStatus();  // a port of the kernel's choosing is free
  auto resolved = Resolve(at.host, at.port);
  if (!resolved) return resolved.error();
  asio::io_context io;
  asio::ip::tcp::acceptor probe(io);
  boost::system::error_code ec;
  probe.open(resolved->protocol(), ec);
  if (!ec) probe.set_option(asio::ip::tcp::acceptor::reuse_address(true), ec);
  if (!ec) probe.bind(*resolved, ec);
  if (ec) {
    return UnavailableError(
        "cannot listen on " + at.host + ":" + std::to_string(at.port) + ": " + ec.message() +
        (ec == asio::error::address_in_use ? " (another process listens there)" : ""));
  }
  return OkStatus();
}

// Opens, binds and listens; the bound endpoint (its real port when `at` asked for 0).
inline Result<boost::asio::ip::tcp::endpoint> Bind(boost::asio::ip::tcp::acceptor& acceptor,
                                                   const Endpoint& at, bool reuse_port) {
  namespace asio = boost::asio;
  auto resolved = Resolve(at.host, at.port);
  if (!resolved) return resolved.error();
  boost::system::error_code ec;
  acceptor.open(resolved->protocol(), ec);
  if (!ec) acceptor.set_option(asio::ip::tcp::acceptor::reuse_address(true), ec);
  if (!ec && reuse_port) {
    acceptor.set_option(asio::detail::socket_option::boolean<SOL_SOCKET, SO_REUSEPORT>(true), ec);
  }
  if (!ec) acceptor.bind(*resolved, ec);
  if (!ec) acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    return UnavailableError("cannot listen on " + at.host + ":" + std::to_string(at.port) + ": " +
                            ec.message());
  }
  return acceptor.local_endpoint();
}

}  // namespace idem::gateway::asio_parts

#endif  // IDEM_GATEWAY_ASIO_PARTS_H_
