#include "tests/support/servers.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pwd.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

namespace idem::testing {
namespace {

using namespace std::chrono_literals;

std::string EnvOr(const char* name, std::string fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::string(v) : fallback;
}

std::string RedisServerPath() { return EnvOr("IDEM_REDIS_SERVER", "/usr/bin/redis-server"); }
std::string PgBin() { return EnvOr("IDEM_PG_BIN", "/usr/lib/postgresql/15/bin"); }
std::string NatsServerPath() { return EnvOr("IDEM_NATS_SERVER", "/usr/sbin/nats-server"); }
constexpr const char* kRedisCli = "/usr/bin/redis-cli";

// Polls `ready` every 50 ms until it is true or `timeout` passes.
template <typename F>
bool PollUntil(std::chrono::milliseconds timeout, F ready) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    if (ready()) return true;
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(50ms);
  }
}

// Runs `args` as the postgres user: setpriv execs in place, so the pid is the program's own.
std::vector<std::string> AsPostgres(const std::string& program, std::vector<std::string> args) {
  std::vector<std::string> out = {"--reuid=postgres", "--regid=postgres", "--init-groups", program};
  out.insert(out.end(), args.begin(), args.end());
  return out;
}

}  // namespace

Result<std::string> RequiredEnv(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') {
    return FailedPreconditionError(std::string(name) +
                                   " is not set: this test needs the shared servers; run "
                                   "`scripts/servers.sh start` and `source /tmp/idem-servers/env`"
                                   " (scripts/test.sh does both)");
  }
  return std::string(v);
}

namespace {

// Binds 127.0.0.1:port (0: any) and closes again; the port bound, or 0 if it was taken.
std::uint16_t TryBind(std::uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return 0;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(port);
  socklen_t len = sizeof(addr);
  std::uint16_t bound = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    bound = ntohs(addr.sin_port);
  }
  ::close(fd);
  return bound;
}

// A port for a cluster node: below 55536, with port + 10000 (its cluster bus) free too.
Result<std::uint16_t> FreeClusterPort() {
  static std::mt19937 rng(static_cast<unsigned>(::getpid()));
  for (int tries = 0; tries < 1000; ++tries) {
    const auto port = static_cast<std::uint16_t>(30000 + rng() % 15000);
    if (TryBind(port) == port && TryBind(static_cast<std::uint16_t>(port + 10000)) != 0) {
      return port;
    }
  }
  return UnavailableError("no free port pair for a cluster node");
}

}  // namespace

Result<std::uint16_t> FreePort() {
  const std::uint16_t port = TryBind(0);
  if (port == 0) return UnavailableError("bind to a free port failed");
  return port;
}

Result<std::pair<int, std::string>> RunToEnd(const std::string& path,
                                             const std::vector<std::string>& args,
                                             std::chrono::milliseconds timeout) {
  auto child = ChildProcess::Spawn(path, args);
  if (!child) return child.status();
  auto code = child->Wait(timeout);
  if (!code) return UnavailableError(path + " did not finish in time; stderr: " + child->Stderr());
  const std::string out = child->Stdout();  // complete: Wait waits for end of file
  if (*code != 0) {
    return std::pair<int, std::string>{*code, out + child->Stderr()};
  }
  return std::pair<int, std::string>{*code, out};
}

// ---- RedisServer -------------------------------------------------------------------------

Result<RedisServer> RedisServer::Start(std::filesystem::path dir, std::uint16_t port,
                                       std::vector<std::string> extra) {
  RedisServer s;
  s.dir_ = std::move(dir);
  s.port_ = port;
  s.extra_ = std::move(extra);
  std::error_code ec;
  std::filesystem::create_directories(s.dir_, ec);
  if (ec) return UnavailableError("mkdir " + s.dir_.string() + ": " + ec.message());
  if (Status st = s.Launch(); !st.ok()) return st;
  return s;
}

Status RedisServer::Launch() {
  std::vector<std::string> args = {
      "--port", std::to_string(port_), "--bind", "127.0.0.1", "--dir", dir_.string(), "--save",
      "",       "--daemonize",         "no",     "--logfile", ""};
  args.insert(args.end(), extra_.begin(), extra_.end());
  auto child = ChildProcess::Spawn(RedisServerPath(), args);
  if (!child) return child.status();
  process_.emplace(std::move(*child));
  const bool up = PollUntil(10s, [&] {
    if (!process_->Running()) return true;  // it exited: fail at once
    auto r = Cli({"PING"});
    return r.has_value() && r->find("PONG") != std::string::npos;
  });
  if (!up || !process_->Running()) {
    return UnavailableError("redis-server on port " + std::to_string(port_) +
                            " did not answer PING; its output:\n" + process_->Stdout() +
                            process_->Stderr());
  }
  return Status();
}

Status RedisServer::Signal(int signal) {
  if (!process_) return FailedPreconditionError("redis-server not running");
  return process_->Kill(signal);
}

Status RedisServer::Kill() {
  if (!process_) return Status();
  if (Status st = process_->Kill(SIGKILL); !st.ok()) return st;
  auto code = process_->Wait(10s);
  if (!code) return code.status();
  process_.reset();
  return Status();
}

Status RedisServer::Restart() {
  if (process_) {
    if (Status st = Kill(); !st.ok()) return st;
  }
  return Launch();
}

Result<std::string> RedisServer::Cli(const std::vector<std::string>& args) const {
  std::vector<std::string> all = {"-h", "127.0.0.1", "-p", std::to_string(port_)};
  all.insert(all.end(), args.begin(), args.end());
  auto r = RunToEnd(kRedisCli, all, 10s);
  if (!r) return r.status();
  if (r->first != 0) return UnavailableError("redis-cli " + args.front() + ": " + r->second);
  return r->second;
}

// ---- RedisCluster ------------------------------------------------------------------------

Result<RedisCluster> RedisCluster::Start(const std::filesystem::path& dir, int masters,
                                         int replicas_per_master,
                                         std::chrono::milliseconds node_timeout,
                                         std::vector<std::string> extra) {
  RedisCluster c;
  const int count = masters * (1 + replicas_per_master);
  std::vector<std::string> create = {"--cluster", "create"};
  for (int i = 0; i < count; ++i) {
    auto port = FreeClusterPort();
    if (!port) return port.status();
    const auto node_dir = dir / ("node-" + std::to_string(*port));
    std::vector<std::string> args = {
        "--cluster-enabled",          "yes",
        "--cluster-config-file",      (node_dir / "nodes.conf").string(),
        "--cluster-node-timeout",     std::to_string(node_timeout.count()),
        "--repl-diskless-sync-delay", "0"};
    args.insert(args.end(), extra.begin(), extra.end());
    auto node = RedisServer::Start(node_dir, *port, args);
    if (!node) return node.status();
    create.push_back(node->address());
    c.nodes_.push_back(std::move(*node));
  }
  create.insert(create.end(),
                {"--cluster-replicas", std::to_string(replicas_per_master), "--cluster-yes"});
  auto made = RunToEnd(kRedisCli, create, 60s);
  if (!made) return made.status();
  if (made->first != 0) return UnavailableError("redis-cli --cluster create: " + made->second);
  const bool ok = PollUntil(30s, [&] {
    for (const RedisServer& n : c.nodes_) {
      auto info = n.Cli({"CLUSTER", "INFO"});
      if (!info || info->find("cluster_state:ok") == std::string::npos) return false;
    }
    return true;
  });
  if (!ok) return UnavailableError("the Redis Cluster did not reach cluster_state:ok");
  // A replica that has not finished its first sync cannot take over: wait for every link.
  const bool synced = PollUntil(30s, [&] {
    for (const RedisServer& n : c.nodes_) {
      auto info = n.Cli({"INFO", "replication"});
      if (!info) return false;
      if (info->find("role:slave") != std::string::npos &&
          info->find("master_link_status:up") == std::string::npos) {
        return false;
      }
    }
    return true;
  });
  if (!synced) return UnavailableError("the Redis Cluster's replicas did not sync");
  return c;
}

std::string RedisCluster::addresses() const {
  std::string out;
  for (const RedisServer& n : nodes_) {
    if (!out.empty()) out += ',';
    out += n.address();
  }
  return out;
}

Result<std::size_t> RedisCluster::MasterOf(int slot) {
  for (RedisServer& n : nodes_) {
    if (n.pid() < 0) continue;
    // CLUSTER SLOTS answers, per range: start, end, then master ip, port, id, ...
    auto slots = n.Cli({"CLUSTER", "SLOTS"});
    if (!slots) continue;
    // Raw output: one value per line; a range is "start\nend\nip\nport\nid\n" then replicas.
    std::vector<std::string> lines;
    std::size_t at = 0;
    while (at < slots->size()) {
      const auto nl = slots->find('\n', at);
      lines.push_back(slots->substr(at, nl - at));
      if (nl == std::string::npos) break;
      at = nl + 1;
    }
    for (std::size_t i = 0; i + 3 < lines.size(); ++i) {
      char* end = nullptr;
      const long lo = std::strtol(lines[i].c_str(), &end, 10);
      if (end == lines[i].c_str() || *end != '\0') continue;
      const long hi = std::strtol(lines[i + 1].c_str(), &end, 10);
      if (*end != '\0' || lines[i + 2] != "127.0.0.1") continue;
      if (slot < lo || slot > hi) continue;
      const std::string port = lines[i + 3];
      for (std::size_t k = 0; k < nodes_.size(); ++k) {
        if (std::to_string(nodes_[k].port()) == port) return k;
      }
    }
  }
  return UnavailableError("no live node knows the master of slot " + std::to_string(slot));
}

Status RedisCluster::WaitHealthy(int slot, std::chrono::milliseconds timeout) {
  const bool ok = PollUntil(timeout, [&] {
    for (const RedisServer& n : nodes_) {
      if (n.pid() < 0) continue;
      auto info = n.Cli({"CLUSTER", "INFO"});
      if (!info || info->find("cluster_state:ok") == std::string::npos) return false;
    }
    auto master = MasterOf(slot);
    return master.has_value() && nodes_[*master].pid() >= 0;
  });
  return ok ? Status() : UnavailableError("the Redis Cluster did not recover in time");
}

Status RedisCluster::WaitReplicas(int slot, int replicas, std::chrono::milliseconds timeout) {
  const std::string want = "connected_slaves:" + std::to_string(replicas) + "\r";
  const bool ok = PollUntil(timeout, [&] {
    auto master = MasterOf(slot);
    if (!master) return false;
    auto info = nodes_[*master].Cli({"INFO", "replication"});
    if (!info || info->find(want) == std::string::npos) return false;
    // Every replica listed must be online (state=online), not still syncing.
    std::size_t online = 0;
    for (std::size_t at = 0; (at = info->find("state=online", at)) != std::string::npos; ++at) {
      ++online;
    }
    return online >= static_cast<std::size_t>(replicas);
  });
  return ok ? Status()
            : UnavailableError("slot " + std::to_string(slot) + "'s master did not get " +
                               std::to_string(replicas) + " replica(s) in time");
}

// ---- PostgresServer ----------------------------------------------------------------------

Result<PostgresServer> PostgresServer::Start(std::filesystem::path dir, std::uint16_t port,
                                             bool fast) {
  PostgresServer s;
  s.dir_ = std::move(dir);
  s.port_ = port;
  s.fast_ = fast;
  std::error_code ec;
  std::filesystem::create_directories(s.dir_, ec);
  if (ec) return UnavailableError("mkdir " + s.dir_.string() + ": " + ec.message());
  // The postgres user must reach the directory: a mkdtemp parent is 0700 root.
  std::filesystem::permissions(s.dir_.parent_path(), std::filesystem::perms::others_exec,
                               std::filesystem::perm_options::add, ec);
  const passwd* pw = ::getpwnam("postgres");
  if (pw == nullptr)
    return FailedPreconditionError("no postgres user (apt-get install postgresql)");
  if (::chown(s.dir_.c_str(), pw->pw_uid, pw->pw_gid) != 0) {
    return UnavailableError("chown postgres " + s.dir_.string());
  }
  auto init = RunToEnd("/usr/bin/setpriv",
                       AsPostgres(PgBin() + "/initdb", {"-D", (s.dir_ / "data").string(), "-A",
                                                        "trust", "-U", "postgres", "--no-sync"}),
                       120s);
  if (!init) return init.status();
  if (init->first != 0) return UnavailableError("initdb: " + init->second);
  if (Status st = s.Launch(); !st.ok()) return st;
  auto db = RunToEnd(PgBin() + "/psql",
                     {"-h", "127.0.0.1", "-p", std::to_string(port), "-U", "postgres", "-q", "-c",
                      "CREATE DATABASE idem_test"},
                     30s);
  if (!db) return db.status();
  if (db->first != 0) return UnavailableError("CREATE DATABASE: " + db->second);
  return s;
}

PostgresServer::~PostgresServer() {
  if (process_) (void)Stop();
}

Status PostgresServer::Launch() {
  std::vector<std::string> args = {
      "-D", (dir_ / "data").string(),     "-p", std::to_string(port_), "-k", dir_.string(),
      "-c", "listen_addresses=127.0.0.1", "-c", "max_connections=200"};
  if (fast_) args.insert(args.end(), {"-c", "fsync=off", "-c", "synchronous_commit=off"});
  auto child = ChildProcess::Spawn("/usr/bin/setpriv", AsPostgres(PgBin() + "/postgres", args));
  if (!child) return child.status();
  process_ = std::make_unique<ChildProcess>(std::move(*child));
  const bool up = PollUntil(30s, [&] {
    if (!process_->Running()) return true;  // it exited: fail at once
    auto r = RunToEnd(PgBin() + "/pg_isready",
                      {"-h", "127.0.0.1", "-p", std::to_string(port_), "-U", "postgres"}, 5s);
    return r.has_value() && r->first == 0;
  });
  if (!up || !process_->Running()) {
    return UnavailableError("postgres on port " + std::to_string(port_) +
                            " did not get ready; its stderr:\n" + process_->Stderr());
  }
  return Status();
}

Status PostgresServer::Stop() {
  if (!process_) return Status();
  if (Status st = process_->Kill(SIGQUIT); !st.ok()) return st;
  auto code = process_->Wait(30s);
  if (!code) {
    (void)process_->Kill(SIGKILL);
    (void)process_->Wait(10s);
  }
  process_.reset();
  return Status();
}

Status PostgresServer::Restart() {
  if (Status st = Stop(); !st.ok()) return st;
  return Launch();
}

// ---- NatsServer --------------------------------------------------------------------------

Result<NatsServer> NatsServer::Start(std::filesystem::path dir, std::uint16_t port) {
  NatsServer s;
  s.dir_ = std::move(dir);
  s.port_ = port;
  std::error_code ec;
  std::filesystem::create_directories(s.dir_ / "store", ec);
  if (ec) return UnavailableError("mkdir " + s.dir_.string() + ": " + ec.message());
  if (Status st = s.Launch(); !st.ok()) return st;
  return s;
}

namespace {

bool AcceptsConnections(std::uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return false;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(port);
  const bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  ::close(fd);
  return ok;
}

}  // namespace

Status NatsServer::Launch() {
  // -l: a log file per start, so "Server is ready" is this start's.
  const auto log = dir_ / "nats.log";
  std::error_code ec;
  std::filesystem::remove(log, ec);
  auto child =
      ChildProcess::Spawn(NatsServerPath(), {"-js", "-a", "127.0.0.1", "-p", std::to_string(port_),
                                             "-sd", (dir_ / "store").string(), "-l", log.string()});
  if (!child) return child.status();
  process_.emplace(std::move(*child));
  const bool up = PollUntil(10s, [&] {
    if (!process_->Running()) return true;  // it exited: fail at once
    return AcceptsConnections(port_) && Log().find("Server is ready") != std::string::npos;
  });
  if (!up || !process_->Running()) {
    return UnavailableError("nats-server on port " + std::to_string(port_) +
                            " did not start; its log:\n" + Log() + process_->Stderr());
  }
  return Status();
}

std::string NatsServer::Log() const {
  std::ifstream in(dir_ / "nats.log");
  std::stringstream out;
  out << in.rdbuf();
  return out.str();
}

Status NatsServer::End(int signal) {
  if (!process_) return Status();
  if (Status st = process_->Kill(signal); !st.ok()) return st;
  auto code = process_->Wait(15s);
  if (!code) {
    (void)process_->Kill(SIGKILL);
    code = process_->Wait(10s);
    if (!code) return code.status();
  }
  process_.reset();
  return Status();
}

Status NatsServer::Kill() { return End(SIGKILL); }
Status NatsServer::Stop() { return End(SIGTERM); }

Status NatsServer::Restart() {
  if (Status st = Kill(); !st.ok()) return st;
  return Launch();
}

}  // namespace idem::testing
