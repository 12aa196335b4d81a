// Servers a test starts for itself, so that it may stop, kill or restart them without
// disturbing the shared servers of scripts/servers.sh: a redis-server, a Redis Cluster, a
// PostgreSQL instance, a nats-server with JetStream. Each runs as a ChildProcess of the test
// (reaped, killed on destruction).
//
// Binaries: IDEM_REDIS_SERVER (redis-server), IDEM_PG_BIN (PostgreSQL's bin directory) and
// IDEM_NATS_SERVER (nats-server), as scripts/servers.sh exports them, else Debian's paths;
// redis-cli from PATH. PostgreSQL runs as the `postgres` user (setpriv, no extra process in
// between), since it refuses to run as root.
#ifndef IDEM_TESTS_SUPPORT_SERVERS_H_
#define IDEM_TESTS_SUPPORT_SERVERS_H_

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "idem/status.h"
#include "tests/support/process.h"

namespace idem::testing {

// The value of environment variable `name`, or kFailedPrecondition saying to start the shared
// servers: a test that needs a server fails when it is missing, it never skips.
Result<std::string> RequiredEnv(const char* name);

// A loopback TCP port that nobody listened on a moment ago (bound to port 0, then closed).
Result<std::uint16_t> FreePort();

// Runs `path args...` to the end; its exit code and stdout. kUnavailable on timeout.
Result<std::pair<int, std::string>> RunToEnd(const std::string& path,
                                             const std::vector<std::string>& args,
                                             std::chrono::milliseconds timeout);

// One redis-server on 127.0.0.1:port with its files in `dir`.
class RedisServer {
 public:
  // Starts it and waits until it answers PING. `extra` are redis-server options
  // ("--appendonly", "yes", ...).
  static Result<RedisServer> Start(std::filesystem::path dir, std::uint16_t port,
                                   std::vector<std::string> extra = {});

  std::uint16_t port() const { return port_; }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  pid_t pid() const { return process_ ? process_->pid() : -1; }

  // Sends a signal (SIGKILL, SIGSTOP, SIGCONT, ...). After SIGKILL, Wait() reaps it.
  Status Signal(int signal);
  // SIGKILL and reap.
  Status Kill();
  // Starts it again on the same port and directory (an AOF is replayed) after Kill().
  Status Restart();
  // What the server logged so far (its stdout).
  std::string Log() const { return process_ ? process_->Stdout() : std::string(); }
  // redis-cli -p PORT args..., its stdout.
  Result<std::string> Cli(const std::vector<std::string>& args) const;

 private:
  RedisServer() = default;
  Status Launch();

  std::filesystem::path dir_;
  std::uint16_t port_ = 0;
  std::vector<std::string> extra_;
  std::optional<ChildProcess> process_;
};

// A Redis Cluster of `masters` masters with `replicas_per_master` replicas each, on free ports,
// created with redis-cli --cluster create and ready (cluster_state:ok on every node).
class RedisCluster {
 public:
  static Result<RedisCluster> Start(
      const std::filesystem::path& dir, int masters, int replicas_per_master,
      std::chrono::milliseconds node_timeout = std::chrono::seconds(2),
      std::vector<std::string> extra = {});

  std::vector<RedisServer>& nodes() { return nodes_; }
  // "127.0.0.1:P1,127.0.0.1:P2,..." for a redis+cluster:// URL.
  std::string addresses() const;
  // The node currently serving `slot` as master (asks the first node that answers).
  Result<std::size_t> MasterOf(int slot);
  // Polls until every live node reports cluster_state:ok and `slot` has a live master.
  Status WaitHealthy(int slot, std::chrono::milliseconds timeout);
  // Polls until the master of `slot` has `replicas` replicas with their link up.
  Status WaitReplicas(int slot, int replicas, std::chrono::milliseconds timeout);

 private:
  RedisCluster() = default;
  std::vector<RedisServer> nodes_;
};

// A PostgreSQL 15 instance on 127.0.0.1:port, its data directory under `dir` (owned by the
// postgres user), database `idem_test` created. fsync stays on unless `fast`.
class PostgresServer {
 public:
  static Result<PostgresServer> Start(std::filesystem::path dir, std::uint16_t port,
                                      bool fast = false);
  ~PostgresServer();
  PostgresServer(PostgresServer&&) noexcept = default;
  PostgresServer& operator=(PostgresServer&&) noexcept = default;

  std::uint16_t port() const { return port_; }
  std::string url() const {
    return "postgres://postgres@127.0.0.1:" + std::to_string(port_) + "/idem_test";
  }
  // Immediate shutdown (SIGQUIT to the postmaster: no checkpoint, like a crash), reaped.
  Status Stop();
  // Starts it again on the same port and data (crash recovery runs).
  Status Restart();

 private:
  PostgresServer() = default;
  Status Launch();

  std::filesystem::path dir_;
  std::uint16_t port_ = 0;
  bool fast_ = false;
  std::unique_ptr<ChildProcess> process_;
};

// One nats-server with JetStream on 127.0.0.1:port, its store under `dir` (kept across Restart).
class NatsServer {
 public:
  // Starts it and waits until it accepts connections and has logged "Server is ready".
  static Result<NatsServer> Start(std::filesystem::path dir, std::uint16_t port);

  std::uint16_t port() const { return port_; }
  std::string url() const { return "nats://127.0.0.1:" + std::to_string(port_); }
  pid_t pid() const { return process_ ? process_->pid() : -1; }

  // SIGKILL and reap (a crash: nothing is flushed).
  Status Kill();
  // SIGTERM (a clean shutdown) and reap.
  Status Stop();
  // Starts it again on the same port and store directory after Kill() or Stop() (or kills it
  // first when it still runs).
  Status Restart();
  // What the server logged so far.
  std::string Log() const;

 private:
  NatsServer() = default;
  Status Launch();
  Status End(int signal);

  std::filesystem::path dir_;
  std::uint16_t port_ = 0;
  std::optional<ChildProcess> process_;
};

}  // namespace idem::testing

#endif  // IDEM_TESTS_SUPPORT_SERVERS_H_
