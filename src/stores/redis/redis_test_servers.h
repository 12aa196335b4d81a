// Redis servers a test starts for itself (the redis-server named by IDEM_REDIS_SERVER), on
// loopback ports in 28000-28999, with persistence off; and a plain synchronous client to set
// them up. For tests that stop, kill or reshard a server: never the shared ones.
#ifndef IDEM_STORES_REDIS_REDIS_TEST_SERVERS_H_
#define IDEM_STORES_REDIS_REDIS_TEST_SERVERS_H_

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "idem/status.h"
#include "stores/redis/connection.h"
#include "tests/support/process.h"

namespace idem::redis::testing {

class RedisServer {
 public:
  // A server on a free port; `extra` are more redis-server arguments.
  static Result<std::unique_ptr<RedisServer>> Start(std::vector<std::string> extra = {});
  ~RedisServer();

  int port() const { return port_; }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }

  // SIGSTOP, returning once the server has stopped (kill() returns while it may still answer),
  // and SIGCONT: a server that stops answering, then answers again.
  Status Freeze();
  Status Thaw();
  // SIGKILL and reap.
  Status Kill();
  // Starts it again on the same port and directory (after Kill).
  Status Restart();

 private:
  RedisServer() = default;
  Status Launch();

  int port_ = 0;
  std::string dir_;
  std::vector<std::string> extra_;
  std::optional<::idem::testing::ChildProcess> process_;
};

// One command on 127.0.0.1:port over a fresh connection; the reply, or kUnavailable.
Result<Reply> Cmd(int port, const std::vector<std::string>& args);
// The reply as text: a status or string as is, an integer in decimal; else an error naming it.
Result<std::string> CmdText(int port, const std::vector<std::string>& args);

// Polls `condition` every 50 ms until it holds or `timeout` passes.
bool Eventually(const std::function<bool()>& condition, std::chrono::milliseconds timeout);

// A cluster of `masters` masters with `replicas` replicas each, slots spread evenly, every
// node agreeing (cluster_state:ok).
struct Cluster {
  std::vector<std::unique_ptr<RedisServer>> nodes;  // masters first
  std::vector<std::string> Addresses() const;
};
Result<Cluster> StartCluster(int masters, int replicas, std::chrono::milliseconds node_timeout);

}  // namespace idem::redis::testing

#endif  // IDEM_STORES_REDIS_REDIS_TEST_SERVERS_H_
