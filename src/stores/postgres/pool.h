// The PostgreSQL store's connections:
//
// GroupCommitter  a few connections, each with a thread, that carry every store call. Calls
//                 waiting when a connection comes free go out together: their statements are
//                 pipelined and run in one transaction, committed at the pipeline's sync, and
//                 each caller is answered after that commit. With synchronous_commit=on that is
//                 one WAL flush for the whole group instead of one per call.
// ConnectionPool  connections handed to one caller at a time: transactional handlers, List,
//                 Stats, Purge and the reaper.
//
// A connection that fails is dropped and a new one made on its next use, so the store recovers
// by itself once the server is back.
#ifndef IDEM_STORES_POSTGRES_POOL_H_
#define IDEM_STORES_POSTGRES_POOL_H_

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string_view>
#include <thread>
#include <vector>

#include "idem/status.h"
#include "stores/postgres/connection.h"

namespace idem::pg {

// Makes a connection ready for use (pipeline mode, statements prepared) by the deadline.
using Connector = std::function<Result<std::unique_ptr<Connection>>(Deadline)>;

// One statement of a call.
struct Op {
  const char* statement = nullptr;  // prepared statement name
  Params params;
  // Statements of a group run sorted by (order_class, order_a, order_b), the rows they lock, so
  // that two groups never wait for each other's rows in opposite orders: no deadlocks. Equal
  // keys keep their order, so a batch naming one key twice is answered in its order.
  int order_class = 0;
  std::string_view order_a;
  std::string_view order_b;
  // The statement locks many rows (a set-based batch), in its own order: its call runs in a
  // transaction of its own, since sorting it among other statements cannot order its rows, and
  // its statements run in the call's order.
  bool alone = false;

  // Answered: exactly one of these.
  ResultPtr result;
  Status status;

  void Order(int cls, std::string_view a, std::string_view b) {
    order_class = cls;
    order_a = a;
    order_b = b;
  }
};

class GroupCommitter {
 public:
  GroupCommitter(Connector connect, std::size_t connections, std::size_t max_group,
                 std::chrono::milliseconds connect_timeout,
                 std::chrono::milliseconds statement_timeout);
  ~GroupCommitter();
  GroupCommitter(const GroupCommitter&) = delete;
  GroupCommitter& operator=(const GroupCommitter&) = delete;

  // Runs `ops` (with other callers' statements, unless one of them is `alone`) and returns when
  // each is answered. They commit together or not at all; when one fails, the others are run
  // again, each on its own.
  void Run(std::span<Op> ops);

 private:
  struct Call;
  void Loop();
  void Execute(std::unique_ptr<Connection>& conn, std::span<Call* const> calls);
  // One transaction for all ops. ok: every op was answered (some perhaps with an error, and
  // then nothing committed); otherwise the connection failed and the outcome is unknown.
  Status RunTogether(Connection& conn, std::span<Op* const> ops, bool& committed);
  Status RunEachAlone(Connection& conn, std::span<Op* const> ops);

  const Connector connect_;
  const std::size_t max_group_;
  const std::chrono::milliseconds connect_timeout_;
  const std::chrono::milliseconds statement_timeout_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Call*> queue_;  // guarded by mu_
  bool stopping_ = false;    // guarded by mu_
  std::vector<std::thread> threads_;
};

class ConnectionPool {
 public:
  ConnectionPool(Connector connect, std::size_t max, std::chrono::milliseconds connect_timeout);
  ~ConnectionPool();
  ConnectionPool(const ConnectionPool&) = delete;
  ConnectionPool& operator=(const ConnectionPool&) = delete;

  // A connection (idle, in pipeline mode) for the caller's sole use; kUnavailable if none can
  // be had within the connect timeout.
  Result<std::unique_ptr<Connection>> Take();
  // Returns it; kept for reuse only if healthy and outside any transaction.
  void Give(std::unique_ptr<Connection> conn);
  // Adds a connection made elsewhere as an idle one (it may exceed the maximum briefly).
  void Add(std::unique_ptr<Connection> conn);

 private:
  const Connector connect_;
  const std::size_t max_;
  const std::chrono::milliseconds connect_timeout_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::unique_ptr<Connection>> idle_;  // guarded by mu_
  std::size_t open_ = 0;                           // idle + taken; guarded by mu_
};

// Runs one statement in its own round trip on a pipelined connection (its own implicit
// transaction, unless the connection is inside BEGIN). A statement error is its Status.
Result<ResultPtr> RunStatement(Connection& conn, const char* name, const Params& params,
                               Deadline deadline);
Result<ResultPtr> RunQuery(Connection& conn, std::string_view sql, const Params& params,
                           const Oid* types, Deadline deadline);

// A connection taken from a pool, given back on destruction.
class PooledConnection {
 public:
  PooledConnection(ConnectionPool& pool, std::unique_ptr<Connection> conn)
      : pool_(&pool), conn_(std::move(conn)) {}
  ~PooledConnection() {
    if (conn_) pool_->Give(std::move(conn_));
  }
  PooledConnection(PooledConnection&&) = default;
  PooledConnection(const PooledConnection&) = delete;
  PooledConnection& operator=(const PooledConnection&) = delete;
  Connection& operator*() const { return *conn_; }
  Connection* operator->() const { return conn_.get(); }

 private:
  ConnectionPool* pool_;
  std::unique_ptr<Connection> conn_;
};

}  // namespace idem::pg

#endif  // IDEM_STORES_POSTGRES_POOL_H_
