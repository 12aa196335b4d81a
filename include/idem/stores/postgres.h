// The PostgreSQL store: records in tables of one schema of a PostgreSQL (14 or later)
// database, shared by any number of processes and machines. Link idem::postgres (libpq).
//
//   idem::PostgresStoreOptions o = *idem::ParsePostgresStoreUrl(
//       "postgres://idem@db.internal:5432/app?schema=idem");
//   IDEM_CHECK(idem::InitPostgresSchema(o).ok());   // once, or `idem store init URL`
//   auto store = idem::OpenPostgresStore(o).value();  // a Result: check it in real code
//
// Every call is one atomic statement (a PL/pgSQL function where a decision needs the old record)
// on a pooled connection. Calls that arrive together are pipelined on one connection and
// committed in one transaction (group commit): a caller is answered only after the commit that
// holds its statement, so with synchronous_commit=on every answer is durable.
//
// Time ("now") is the store's Clock, sent with every statement; the server's clock is never
// read, so leases are decided by the callers' clocks, which must agree to within a small part
// of a lease (NTP).
//
// Fails closed: a server that refuses, drops the connection or does not answer within
// statement_timeout gives kUnavailable (an answer whose commit cannot be confirmed is never
// given). Connections reconnect on the next call once the server is back; the store need not be
// reopened. A missing or other-version schema is kFailedPrecondition at open.
//
// TransactionalReceiver (below) runs a handler inside a transaction of the same database, so
// that its writes and the record's completion commit together (SPEC §3, exactly-once effect).
// docs/postgres.md has the schema, the crash argument and the measurements.
#ifndef IDEM_STORES_POSTGRES_H_
#define IDEM_STORES_POSTGRES_H_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "idem/clock.h"
#include "idem/key.h"
#include "idem/receiver.h"
#include "idem/status.h"
#include "idem/store.h"

// libpq's connection handle (libpq-fe.h), named here so that this header needs no libpq headers.
typedef struct pg_conn PGconn;

namespace idem {

namespace pg {
class Connection;
}  // namespace pg

struct PostgresStoreOptions {
  // A libpq connection string: a postgresql:// URI or "host=... dbname=..." keywords.
  std::string conninfo{};
  // The schema holding idem's tables: [a-z_][a-z0-9_]*, at most 63 bytes.
  std::string schema = "idem";
  // Connections carrying store calls. Concurrent calls share a connection's pipeline and commit
  // together; more connections let more groups wait on the server at once.
  std::size_t pool_size = 8;
  // Further connections, opened on demand, for transactional handlers, List, Stats, Purge and
  // the reaper. A caller that finds all of them busy waits up to connect_timeout.
  std::size_t max_transactions = 16;
  Clock* clock = nullptr;  // nullptr: Clock::System(). Must outlive the store.
  std::size_t max_key_bytes = kDefaultMaxKeyBytes;  // at most kMaxPostgresKeyBytes
  // An IN_PROGRESS record whose lease ran out stays this long (for a takeover with
  // attempt+1) before it is reclaimed as abandoned.
  std::chrono::milliseconds abandoned_retention{24 * 3600 * 1000};
  // Bounds on connecting and on waiting for an answer; past them a call is kUnavailable.
  std::chrono::milliseconds connect_timeout{5'000};
  std::chrono::milliseconds statement_timeout{5'000};
  // How often the background reaper deletes expired records, sessions and entities, each step
  // at most reclaim_batch rows in its own short transaction; 0 disables the thread (Purge() still
  // reclaims on demand).
  std::chrono::milliseconds reclaim_interval{1'000};
  std::size_t reclaim_batch = 1'000;
};

// "postgres://user[:password]@host[:port]/db?schema=idem&pool_size=8" -> options. Also
// postgresql://. idem's own parameters: schema, pool_size, max_transactions, max_key_bytes,
// abandoned_retention, connect_timeout, statement_timeout, reclaim_interval (durations as
// 500ms, 5s, 2m, 1h, 1d or plain milliseconds) and reclaim_batch. Every other parameter goes to
// libpq (sslmode, application_name, ...), which must accept it. kInvalidArgument names the
// problem.
Result<PostgresStoreOptions> ParsePostgresStoreUrl(std::string_view url);

// The schema version this build of idem reads and writes.
inline constexpr int kPostgresSchemaVersion = 1;

// The longest key (and client id, and entity) the PostgreSQL store takes: a btree index row
// holds at most 2704 bytes, and a key's row holds its scope (up to 255 bytes) too.
inline constexpr std::size_t kMaxPostgresKeyBytes = 2048;

// Creates the schema, its tables, the token sequence, the functions and the version row, or
// brings an existing schema of this version up to date (functions are replaced). Idempotent and
// safe to run concurrently. kFailedPrecondition if the schema holds another version.
Status InitPostgresSchema(const PostgresStoreOptions& options);

// The version of the schema in the database, or nullopt when there is none.
Result<std::optional<int>> PostgresSchemaVersion(const PostgresStoreOptions& options);

// Connects and checks the schema: kFailedPrecondition when it is missing ("run `idem store init
// URL`") or of another version; kUnavailable when the server cannot be reached.
Result<std::unique_ptr<Store>> OpenPostgresStore(const PostgresStoreOptions& options);

// ---- transactional mode (SPEC §3, exactly-once effect) ----------------------------------------

// Rows of a statement run by PgTransaction::Exec, as text (NULL is nullopt).
struct PgRows {
  std::vector<std::string> columns{};
  std::vector<std::vector<std::optional<std::string>>> rows{};
  std::uint64_t affected = 0;  // INSERT, UPDATE, DELETE: the rows changed
};

// The open transaction a transactional handler writes in. Valid only during the handler call;
// the receiver commits or rolls it back, never the handler.
class PgTransaction {
 public:
  PgTransaction(const PgTransaction&) = delete;
  PgTransaction& operator=(const PgTransaction&) = delete;

  // The transaction's connection, for libpq calls of the handler's own (blocking calls such as
  // PQexecParams work). Leave the transaction open: no COMMIT, ROLLBACK or pipeline mode. A
  // handler that ends it anyway may have committed writes of its own: the receiver then stores
  // the key as failed (whatever the failure policy), so it never runs again, and answers
  // kDataLoss.
  PGconn* connection() const;

  // Runs one SQL statement with text parameters ($1, $2, ...; nullopt binds NULL). An error
  // (kInvalidArgument for an SQL error, kUnavailable for the connection or a timeout) leaves
  // the transaction failed: nothing the handler wrote will commit. A statement that would end
  // the transaction (COMMIT, END, ROLLBACK but ROLLBACK TO, ABORT, PREPARE TRANSACTION) or drop
  // the receiver's prepared statements (DEALLOCATE) is not run: kInvalidArgument, and the
  // transaction is failed likewise.
  Result<PgRows> Exec(std::string_view sql,
                      std::span<const std::optional<std::string_view>> params = {});
  Result<PgRows> Exec(std::string_view sql,
                      std::initializer_list<std::optional<std::string_view>> params) {
    return Exec(sql,
                std::span<const std::optional<std::string_view>>(params.begin(), params.size()));
  }

  // The first error of Exec (or of the connection), if any.
  const Status& failure() const { return failure_; }

 private:
  friend class TransactionalReceiver;
  PgTransaction(pg::Connection* conn, std::chrono::milliseconds timeout)
      : conn_(conn), timeout_(timeout) {}
  pg::Connection* conn_;
  std::chrono::milliseconds timeout_;
  Status failure_;
};

using TransactionalHandler = std::function<HandlerResult(const HandlerContext&, PgTransaction&)>;

// A receiver whose handler writes in a transaction that also completes the record: the
// handler's writes and the COMPLETED record commit together, or neither does.
//
// `begin` is committed first, on its own (through the store's group commit); then the handler
// runs in a new transaction, at whose end the record is completed under the acquired token and
// the transaction commits. So:
//   - a crash (or kill -9) before that commit leaves no effect and an IN_PROGRESS record, which
//     the next delivery takes over once its lease ran out (attempt+1), as with any store;
//   - a worker whose lease was lost to a newer one cannot commit: the completion finds another
//     token and the handler's writes are rolled back (kAborted);
//   - duplicates meanwhile are answered at once: Busy with the lease deadline, then Replay;
//   - a failed (or throwing) handler's writes are rolled back; the key is then released or the
//     failure stored, per failure_policy.
// Answers are those of Receiver (kCoalesce behaves as kWait). A handler whose statement failed
// but which returns success is not completed: its transaction is rolled back, the key released,
// and Receive returns kAborted.
//
// Thread-safe. The store (from OpenPostgresStore), clock and metrics must outlive it. Over any
// other store every Receive answers kInvalidArgument (a memory store in a unit test, say).
// A handler that commits or rolls back on its own: see PgTransaction::connection().
class TransactionalReceiver {
 public:
  TransactionalReceiver(Store& store, ReceiverOptions options);
  ~TransactionalReceiver();
  TransactionalReceiver(const TransactionalReceiver&) = delete;
  TransactionalReceiver& operator=(const TransactionalReceiver&) = delete;

  Result<Delivered> Receive(const Message& message, const TransactionalHandler& handler);

  const ReceiverOptions& options() const { return options_; }

 private:
  Result<Delivered> Execute(std::string key, const Acquired& acquired, const Message& message,
                            const TransactionalHandler& handler);
  Result<BeginAnswer> CountedBegin(const BeginRequest& req);

  Store& store_;
  ReceiverOptions options_;
  Status options_status_;  // not ok: every Receive fails with it
  Clock& clock_;
  Receiver keys_;  // key extraction and validation, shared with the plain receiver
  std::unique_ptr<core::LeaseKeeper> keeper_;  // keep_leases
};

}  // namespace idem

#endif  // IDEM_STORES_POSTGRES_H_
