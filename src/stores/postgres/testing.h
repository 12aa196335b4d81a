// What the PostgreSQL store's tests share: the shared test server (IDEM_TEST_POSTGRES, started by
// scripts/servers.sh), a fresh schema per store, plain SQL on the side, and a private server a
// test may stop and start (initdb/pg_ctl as the postgres user).
#ifndef IDEM_STORES_POSTGRES_TESTING_H_
#define IDEM_STORES_POSTGRES_TESTING_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "idem/status.h"
#include "idem/stores/postgres.h"

namespace idem::pg::testing {

// IDEM_TEST_POSTGRES, or kFailedPrecondition saying how to start the servers. Tests fail on it;
// they never skip.
Result<std::string> TestConninfo();

// Options for a new schema, created (InitPostgresSchema) on the shared server and dropped when
// the test program exits. The reaper is off; set what else the test needs.
Result<PostgresStoreOptions> FreshStoreOptions();

// A name no other test or run uses: idem_t_<pid>_<n>. Registered to be dropped at exit.
std::string FreshSchemaName();

// Runs `sql` on a connection of its own; the rows as text (NULL as "<null>").
Result<std::vector<std::vector<std::string>>> Sql(const std::string& conninfo,
                                                  std::string_view sql);
// The one value of a one-row, one-column query.
Result<std::string> SqlValue(const std::string& conninfo, std::string_view sql);

// A PostgreSQL 15 server of the test's own, in a temporary directory owned by the postgres user,
// on a free port in 29000-29999, with fsync off. Needs root (runuser) and IDEM_PG_BIN (default
// /usr/lib/postgresql/15/bin). Destroying it stops the server and removes the directory.
class LocalPostgres {
 public:
  static Result<std::unique_ptr<LocalPostgres>> Start();
  ~LocalPostgres();
  LocalPostgres(const LocalPostgres&) = delete;
  LocalPostgres& operator=(const LocalPostgres&) = delete;

  // pg_ctl stop -m immediate: every backend dies at once, as in a crash.
  Status Stop();
  // Starts it again on the same port and data.
  Status Restart();
  // SIGSTOP / SIGCONT to the postmaster and its children: a server that stops answering.
  // Freeze returns once every one of them has stopped.
  Status Freeze();
  Status Thaw();
  // postgres://postgres@127.0.0.1:PORT/postgres
  std::string conninfo() const;
  std::uint16_t port() const { return port_; }

 private:
  LocalPostgres() = default;
  Status Run(const std::string& command) const;
  Result<long> Postmaster() const;
  std::string dir_;
  std::string bin_;
  std::uint16_t port_ = 0;
  bool running_ = false;
};

}  // namespace idem::pg::testing

#endif  // IDEM_STORES_POSTGRES_TESTING_H_
