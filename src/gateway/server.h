// The Idempotency-Key gateway's server: an HTTP/1.1 reverse proxy that applies SPEC §6 in
// front of one upstream, plus an admin listener with /metrics, /healthz and /readyz.
//
//   auto server = gateway::Server::Start(config, *store, registry);
//   ...                    // serve until told to stop
//   (*server)->Shutdown();  // stop accepting, finish or release what is in flight
//
// Design: one io_context per I/O thread, each with its own SO_REUSEPORT acceptor and its own
// pool of keep-alive upstream connections, so threads share nothing on the request path.
// Store calls that can block (a log store waiting for its group commit, a network store) run
// on a separate pool of threads; the memory store is called inline. Boost.Beast is confined to
// server.cc.
#ifndef IDEM_GATEWAY_SERVER_H_
#define IDEM_GATEWAY_SERVER_H_

#include <memory>

#include "gateway/config.h"
#include "idem/metrics.h"
#include "idem/status.h"
#include "idem/store.h"

namespace idem::gateway {

class Server {
 public:
  // Binds both listeners and starts the threads. The store and registry must outlive the
  // server. kInvalidArgument for a bad upstream URL, kUnavailable when a port cannot be bound.
  static Result<std::unique_ptr<Server>> Start(const Config& config, Store& store,
                                               Registry& registry);
  ~Server();  // Shutdown() if not done
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // The bound addresses (the real port when the config asked for port 0).
  Endpoint listening() const;
  Endpoint admin() const;

  // Graceful stop: stop accepting, close idle connections, let requests in flight finish
  // within config.shutdown_grace; then cancel their upstream calls, which releases their keys
  // (a retry runs again), and join every thread. Idempotent.
  void Shutdown();

 private:
  struct Impl;
  explicit Server(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace idem::gateway

#endif  // IDEM_GATEWAY_SERVER_H_
