#include "stores/redis/redis_test_servers.h"

#include <netinet/in.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <functional>
#include <random>
#include <thread>

namespace idem::redis::testing {
namespace {

using std::chrono::milliseconds;

Result<std::string> ServerPath() {
  const char* path = std::getenv("IDEM_REDIS_SERVER");
  if (path == nullptr || *path == '\0') {
    return FailedPreconditionError(
        "IDEM_REDIS_SERVER is not set: run scripts/servers.sh start and source "
        "/tmp/idem-servers/env");
  }
  return std::string(path);
}

// A port in 28000-28999 that nothing listens on right now.
int FreePort() {
  static std::mt19937 rng(std::random_device{}());
  std::uniform_int_distribution<int> pick(28000, 28999);
  while (true) {
    const int port = pick(rng);
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<std::uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    const bool free = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
    ::close(fd);
    // The cluster bus uses port + 10000 (38000-38999).
    if (free && port + 10000 <= 65535) return port;
  }
}

}  // namespace

bool Eventually(const std::function<bool()>& condition, milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    if (condition()) return true;
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(milliseconds(50));
  }
}

Result<Reply> Cmd(int port, const std::vector<std::string>& args) {
  ConnectionOptions o;
  o.command_timeout = milliseconds(5000);
  Liveness liveness;
  Connection c(Endpoint{"127.0.0.1", port}, o, liveness);
  Command command;
  for (const std::string& a : args) command.Arg(a);
  const std::string out = command.Take();
  Call call;
  call.out = out;
  RunCall(c, call);
  if (!call.status.ok()) return call.status;
  return std::move(call.got[0]);
}

Result<std::string> CmdText(int port, const std::vector<std::string>& args) {
  auto r = Cmd(port, args);
  if (!r.has_value()) return r.error();
  switch ((*r)->type) {
    case REDIS_REPLY_STATUS:
    case REDIS_REPLY_STRING:
      return std::string((*r)->str, (*r)->len);
    case REDIS_REPLY_INTEGER:
      return std::to_string((*r)->integer);
    default:
      return InternalError(args[0] + " answered " + Describe(**r));
  }
}

Result<std::unique_ptr<RedisServer>> RedisServer::Start(std::vector<std::string> extra) {
  std::unique_ptr<RedisServer> s(new RedisServer());
  std::string dir = (std::filesystem::temp_directory_path() / "idem-redis-XXXXXX").string();
  if (::mkdtemp(dir.data()) == nullptr) return InternalError("mkdtemp failed");
  s->dir_ = dir;
  s->extra_ = std::move(extra);
  for (int tries = 0;; ++tries) {
    s->port_ = FreePort();
    Status st = s->Launch();
    if (st.ok()) return s;
    if (tries == 5) return st;
  }
}

RedisServer::~RedisServer() {
  process_.reset();
  std::error_code ec;
  if (!dir_.empty()) std::filesystem::remove_all(dir_, ec);
}

Status RedisServer::Launch() {
  auto path = ServerPath();
  if (!path) return path.error();
  std::vector<std::string> args = {"--port", std::to_string(port_), "--bind", "127.0.0.1", "--dir",
                                   dir_, "--save", "", "--appendonly", "no", "--daemonize", "no",
                                   // Replicas sync at once instead of after 5 s.
                                   "--repl-diskless-sync-delay", "0"};
  args.insert(args.end(), extra_.begin(), extra_.end());
  auto child = ::idem::testing::ChildProcess::Spawn(*path, args);
  if (!child) return child.error();
  process_.emplace(std::move(*child));
  const bool up = Eventually(
      [this] {
        auto pong = CmdText(port_, {"PING"});
        return (pong.has_value() && *pong == "PONG") || !process_->Running();
      },
      milliseconds(10'000));
  if (!up || !process_->Running()) {
    const std::string out = process_->Stdout();
    process_.reset();
    return UnavailableError("redis-server on port " + std::to_string(port_) +
                            " did not start: " + out);
  }
  return OkStatus();
}

Status RedisServer::Freeze() { return process_->Stop(); }

Status RedisServer::Thaw() { return process_->Kill(SIGCONT); }

Status RedisServer::Kill() {
  IDEM_RETURN_IF_ERROR(process_->Kill(SIGKILL));
  auto done = process_->Wait(milliseconds(10'000));
  return done.has_value() ? OkStatus() : done.error();
}

Status RedisServer::Restart() { return Launch(); }

std::vector<std::string> Cluster::Addresses() const {
  std::vector<std::string> out;
  for (const auto& n : nodes) out.push_back(n->address());
  return out;
}

Result<Cluster> StartCluster(int masters, int replicas, milliseconds node_timeout) {
  Cluster c;
  const int total = masters * (1 + replicas);
  for (int i = 0; i < total; ++i) {
    auto s = RedisServer::Start({"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                                 "--cluster-node-timeout", std::to_string(node_timeout.count())});
    if (!s) return s.error();
    c.nodes.push_back(std::move(*s));
  }
  // Slots: an even share per master.
  for (int m = 0; m < masters; ++m) {
    const int first = 16384 * m / masters;
    const int last = 16384 * (m + 1) / masters - 1;
    auto r = CmdText(c.nodes[static_cast<std::size_t>(m)]->port(),
                     {"CLUSTER", "ADDSLOTSRANGE", std::to_string(first), std::to_string(last)});
    if (!r) return r.error();
  }
  for (std::size_t i = 1; i < c.nodes.size(); ++i) {
    auto r = CmdText(c.nodes[0]->port(),
                     {"CLUSTER", "MEET", "127.0.0.1", std::to_string(c.nodes[i]->port())});
    if (!r) return r.error();
  }
  // Every node knows every other before replicas are attached.
  const bool met = Eventually(
      [&] {
        for (const auto& n : c.nodes) {
          auto known = Cmd(n->port(), {"CLUSTER", "NODES"});
          if (!known || (*known)->type != REDIS_REPLY_STRING) return false;
          const std::string_view text((*known)->str, (*known)->len);
          std::size_t lines = 0;
          for (char ch : text) lines += ch == '\n';
          if (lines < c.nodes.size()) return false;
        }
        return true;
      },
      milliseconds(20'000));
  if (!met) return UnavailableError("the cluster nodes did not all meet");
  for (int m = 0; m < masters; ++m) {
    auto id = CmdText(c.nodes[static_cast<std::size_t>(m)]->port(), {"CLUSTER", "MYID"});
    if (!id) return id.error();
    for (int r = 0; r < replicas; ++r) {
      const std::size_t replica = static_cast<std::size_t>(masters + m * replicas + r);
      auto ok = CmdText(c.nodes[replica]->port(), {"CLUSTER", "REPLICATE", *id});
      if (!ok) return ok.error();
    }
  }
  const bool ready = Eventually(
      [&] {
        for (const auto& n : c.nodes) {
          auto info = Cmd(n->port(), {"CLUSTER", "INFO"});
          if (!info || (*info)->type != REDIS_REPLY_STRING) return false;
          if (std::string_view((*info)->str, (*info)->len).find("cluster_state:ok") ==
              std::string_view::npos) {
            return false;
          }
        }
        for (int m = 0; m < masters && replicas > 0; ++m) {
          auto role = Cmd(c.nodes[static_cast<std::size_t>(m)]->port(), {"INFO", "replication"});
          if (!role || (*role)->type != REDIS_REPLY_STRING) return false;
          // Every replica connected and done with its first sync.
          const std::string_view text((*role)->str, (*role)->len);
          std::size_t online = 0;
          for (std::size_t at = text.find("state=online"); at != std::string_view::npos;
               at = text.find("state=online", at + 1)) {
            ++online;
          }
          if (online < static_cast<std::size_t>(replicas)) return false;
        }
        return true;
      },
      milliseconds(30'000));
  if (!ready) return UnavailableError("the cluster did not reach cluster_state:ok");
  return c;
}

}  // namespace idem::redis::testing
