#include "stores/postgres/testing.h"

#include <arpa/inet.h>
#include <libpq-fe.h>
#include <netinet/in.h>
#include <pwd.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace idem::pg::testing {
namespace {

std::mutex schemas_mu;
std::vector<std::string>& Schemas() {
  static auto* schemas = new std::vector<std::string>();
  return *schemas;
}

// Drops the schemas this program made, after the last test.
class DropSchemas : public ::testing::Environment {
 public:
  void TearDown() override {
    auto conninfo = TestConninfo();
    if (!conninfo) return;
    std::lock_guard<std::mutex> lock(schemas_mu);
    for (const std::string& s : Schemas()) {
      (void)Sql(*conninfo, "DROP SCHEMA IF EXISTS \"" + s + "\" CASCADE");
    }
    Schemas().clear();
  }
};

[[maybe_unused]] const auto* const kDropSchemas =
    ::testing::AddGlobalTestEnvironment(new DropSchemas());

}  // namespace

Result<std::string> TestConninfo() {
  const char* v = std::getenv("IDEM_TEST_POSTGRES");
  if (v == nullptr || *v == '\0') {
    return FailedPreconditionError(
        "IDEM_TEST_POSTGRES is not set: the PostgreSQL tests need the test servers. Run "
        "`scripts/servers.sh start` and then `source /tmp/idem-servers/env`");
  }
  return std::string(v);
}

std::string FreshSchemaName() {
  static std::atomic<int> counter{0};
  std::string name = "idem_t_" + std::to_string(::getpid()) + "_" + std::to_string(counter++);
  std::lock_guard<std::mutex> lock(schemas_mu);
  Schemas().push_back(name);
  return name;
}

Result<PostgresStoreOptions> FreshStoreOptions() {
  auto conninfo = TestConninfo();
  if (!conninfo) return conninfo.error();
  PostgresStoreOptions o;
  o.conninfo = *conninfo;
  o.schema = FreshSchemaName();
  o.reclaim_interval = std::chrono::milliseconds(0);
  IDEM_RETURN_IF_ERROR(InitPostgresSchema(o));
  return o;
}

Result<std::vector<std::vector<std::string>>> Sql(const std::string& conninfo,
                                                  std::string_view sql) {
  PGconn* conn = PQconnectdb(conninfo.c_str());
  if (PQstatus(conn) != CONNECTION_OK) {
    std::string why = PQerrorMessage(conn);
    PQfinish(conn);
    return UnavailableError("cannot connect: " + why);
  }
  PQsetNoticeProcessor(
      conn, [](void*, const char*) {}, nullptr);
  PGresult* r = PQexec(conn, std::string(sql).c_str());
  const ExecStatusType st = PQresultStatus(r);
  if (st != PGRES_TUPLES_OK && st != PGRES_COMMAND_OK) {
    std::string why = PQresultErrorMessage(r);
    PQclear(r);
    PQfinish(conn);
    return InternalError("SQL failed: " + why);
  }
  std::vector<std::vector<std::string>> rows;
  for (int i = 0; i < PQntuples(r); ++i) {
    auto& row = rows.emplace_back();
    for (int c = 0; c < PQnfields(r); ++c) {
      row.push_back(PQgetisnull(r, i, c) ? "<null>" : PQgetvalue(r, i, c));
    }
  }
  PQclear(r);
  PQfinish(conn);
  return rows;
}

Result<std::string> SqlValue(const std::string& conninfo, std::string_view sql) {
  auto rows = Sql(conninfo, sql);
  if (!rows) return rows.error();
  if (rows->size() != 1 || (*rows)[0].size() != 1) {
    return InternalError("expected one value from: " + std::string(sql));
  }
  return (*rows)[0][0];
}

// ---- LocalPostgres ----

namespace {

bool PortFree(std::uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return false;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  ::close(fd);
  return ok;
}

std::string Quote(const std::string& s) { return "'" + s + "'"; }

}  // namespace

Status LocalPostgres::Run(const std::string& command) const {
  const std::string line = command + " >>" + Quote(dir_ + "/commands.log") + " 2>&1";
  const int rc = std::system(line.c_str());
  if (rc != 0) {
    std::ifstream log(dir_ + "/commands.log");
    std::stringstream text;
    text << log.rdbuf();
    std::ifstream server(dir_ + "/server.log");
    std::stringstream server_text;
    server_text << server.rdbuf();
    return InternalError("`" + command + "` failed (" + std::to_string(rc) + "):\n" + text.str() +
                         "\nserver log:\n" + server_text.str());
  }
  return OkStatus();
}

Result<std::unique_ptr<LocalPostgres>> LocalPostgres::Start() {
  std::unique_ptr<LocalPostgres> pg(new LocalPostgres());
  const char* bin = std::getenv("IDEM_PG_BIN");
  pg->bin_ = bin != nullptr && *bin != '\0' ? bin : "/usr/lib/postgresql/15/bin";
  const passwd* user = ::getpwnam("postgres");
  if (user == nullptr) return FailedPreconditionError("there is no postgres user to run a server");
  char dir[] = "/tmp/idem-pg-XXXXXX";
  if (::mkdtemp(dir) == nullptr) return InternalError("mkdtemp failed");
  pg->dir_ = dir;
  if (::chown(dir, user->pw_uid, user->pw_gid) != 0) {
    return FailedPreconditionError("cannot give " + pg->dir_ +
                                   " to the postgres user (the tests run as root)");
  }
  // A free port in 29000-29999, starting somewhere that depends on the process.
  const std::uint16_t start = static_cast<std::uint16_t>(::getpid() % 1000);
  for (std::uint16_t i = 0; i < 1000 && pg->port_ == 0; ++i) {
    const auto p = static_cast<std::uint16_t>(29000 + (start + i) % 1000);
    if (PortFree(p)) pg->port_ = p;
  }
  if (pg->port_ == 0) return UnavailableError("no free port in 29000-29999");
  IDEM_RETURN_IF_ERROR(pg->Run("runuser -u postgres -- " + pg->bin_ + "/initdb -N -D " +
                               Quote(pg->dir_ + "/data") + " -A trust -U postgres"));
  IDEM_RETURN_IF_ERROR(pg->Restart());
  return pg;
}

Status LocalPostgres::Restart() {
  IDEM_RETURN_IF_ERROR(Run("runuser -u postgres -- " + bin_ + "/pg_ctl -D " +
                           Quote(dir_ + "/data") + " -l " + Quote(dir_ + "/server.log") +
                           " -w -t 60 -o " +
                           Quote("-p " + std::to_string(port_) + " -k " + dir_ +
                                 " -c listen_addresses=127.0.0.1 -c fsync=off"
                                 " -c full_page_writes=off") +
                           " start"));
  running_ = true;
  return OkStatus();
}

Status LocalPostgres::Stop() {
  IDEM_RETURN_IF_ERROR(Run("runuser -u postgres -- " + bin_ + "/pg_ctl -D " +
                           Quote(dir_ + "/data") + " -m immediate -w -t 60 stop"));
  running_ = false;
  return OkStatus();
}

namespace {

// A process's state letter from /proc/PID/stat ('T' = stopped), and its parent. False if gone.
bool ReadStat(const std::filesystem::path& stat_path, char& state, long& ppid) {
  std::ifstream stat(stat_path);
  std::string line;
  std::getline(stat, line);
  // pid (comm) state ppid ...: comm may hold spaces, so read after the last ')'.
  const auto close = line.rfind(')');
  if (close == std::string::npos) return false;
  std::istringstream rest(line.substr(close + 1));
  return static_cast<bool>(rest >> state >> ppid);
}

// Waits until `pid` is stopped or gone.
Status AwaitStopped(long pid) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  for (;;) {
    char state = 0;
    long ppid = 0;
    if (!ReadStat("/proc/" + std::to_string(pid) + "/stat", state, ppid) || state == 'T' ||
        state == 'Z') {
      return OkStatus();
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      return UnavailableError("postgres pid " + std::to_string(pid) + " did not stop");
    }
    ::usleep(1000);
  }
}

// The pids whose parent is `postmaster`.
std::vector<long> Children(long postmaster) {
  std::vector<long> pids;
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    const std::string name = entry.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    char state = 0;
    long ppid = 0;
    if (ReadStat(entry.path() / "stat", state, ppid) && ppid == postmaster) {
      pids.push_back(std::stol(name));
    }
  }
  return pids;
}

}  // namespace

Result<long> LocalPostgres::Postmaster() const {
  std::ifstream pidfile(dir_ + "/data/postmaster.pid");
  long postmaster = 0;
  if (!(pidfile >> postmaster) || postmaster <= 0) return InternalError("no postmaster.pid");
  return postmaster;
}

Status LocalPostgres::Freeze() {
  // The postmaster first, so that it forks no child the scan below would miss; then each one
  // until it has stopped: kill() returns while the process may still answer a query.
  auto postmaster = Postmaster();
  if (!postmaster) return postmaster.error();
  ::kill(static_cast<pid_t>(*postmaster), SIGSTOP);
  IDEM_RETURN_IF_ERROR(AwaitStopped(*postmaster));
  const std::vector<long> children = Children(*postmaster);
  for (long pid : children) ::kill(static_cast<pid_t>(pid), SIGSTOP);
  for (long pid : children) IDEM_RETURN_IF_ERROR(AwaitStopped(pid));
  return OkStatus();
}

Status LocalPostgres::Thaw() {
  auto postmaster = Postmaster();
  if (!postmaster) return postmaster.error();
  for (long pid : Children(*postmaster)) ::kill(static_cast<pid_t>(pid), SIGCONT);
  ::kill(static_cast<pid_t>(*postmaster), SIGCONT);
  return OkStatus();
}

LocalPostgres::~LocalPostgres() {
  (void)Thaw();
  if (running_) (void)Stop();
  std::error_code ec;
  if (!dir_.empty()) std::filesystem::remove_all(dir_, ec);
}

std::string LocalPostgres::conninfo() const {
  return "postgres://postgres@127.0.0.1:" + std::to_string(port_) + "/postgres";
}

}  // namespace idem::pg::testing
