// The admin listener of idemd (the gateway and `idemd consume` alike): GET /metrics (the
// registry in the Prometheus text format), /healthz (200 while the liveness check passes: the
// process runs and its store has not failed for good, Store::Broken; else 503 with its
// message, so that a supervisor restarts it), /readyz (200 when the readiness check passes, else
// 503 with its message); HEAD alike, without the body; other methods
// are 405. A query string is ignored. Keep it on loopback.
//
//   auto admin = gateway::AdminServer::Start({"127.0.0.1", 9090}, registry,
//                                            [&] { return gateway::StoreReady(*store); });
//   ... (*admin)->bound() ...
//   (*admin)->Stop();
//
// One thread serves, another runs readiness checks; Boost.Asio is confined to admin.cc.
#ifndef IDEM_GATEWAY_ADMIN_H_
#define IDEM_GATEWAY_ADMIN_H_

#include <functional>
#include <memory>

#include "gateway/config.h"
#include "idem/metrics.h"
#include "idem/status.h"
#include "idem/store.h"

namespace idem::gateway {

class AdminServer {
 public:
  // ok: ready. An error: not ready, its message is the 503's body. Called on a thread of its
  // own, one check at a time, so a slow one never delays /healthz or /metrics.
  using Readiness = std::function<Status()>;

  // kUnavailable when the address cannot be bound, kInvalidArgument when it does not resolve.
  // `live` (optional) is /healthz's check: it must not block (it runs on the serving thread).
  static Result<std::unique_ptr<AdminServer>> Start(const Endpoint& at, Registry& registry,
                                                    Readiness ready, Readiness live = nullptr);
  ~AdminServer();  // Stop()
  AdminServer(const AdminServer&) = delete;
  AdminServer& operator=(const AdminServer&) = delete;

  Endpoint bound() const;  // the real port when `at` asked for port 0
  void Stop();             // closes the listener and joins the thread; idempotent

 private:
  struct Impl;
  explicit AdminServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Readiness of a store (Store::Ready), as kUnavailable "store unavailable: ...".
Status StoreReady(Store& store);

}  // namespace idem::gateway

#endif  // IDEM_GATEWAY_ADMIN_H_
