#include "stores/postgres/pool.h"
#include "core/thread_name.h"

#include <algorithm>
#include <string>
#include <utility>

namespace idem::pg {

// What a caller waits on: its ops, answered by a connection's thread.
struct GroupCommitter::Call {
  std::span<Op> ops;
  bool alone = false;  // an op of it is: no other call joins its transaction
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;  // guarded by mu
};

GroupCommitter::GroupCommitter(Connector connect, std::size_t connections, std::size_t max_group,
                               std::chrono::milliseconds connect_timeout,
                               std::chrono::milliseconds statement_timeout)
    : connect_(std::move(connect)),
      max_group_(std::max<std::size_t>(1, max_group)),
      connect_timeout_(connect_timeout),
      statement_timeout_(statement_timeout) {
  const std::size_t n = std::max<std::size_t>(1, connections);
  threads_.reserve(n);
  for (std::size_t i = 0; i < n; ++i)
    threads_.emplace_back([this] {
      core::NameThisThread("idem-pg-pool");
      Loop();
    });
}

GroupCommitter::~GroupCommitter() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  for (std::thread& t : threads_) t.join();
}

void GroupCommitter::Run(std::span<Op> ops) {
  if (ops.empty()) return;
  Call call;
  call.ops = ops;
  call.alone = std::any_of(ops.begin(), ops.end(), [](const Op& op) { return op.alone; });
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(&call);
  }
  cv_.notify_one();
  std::unique_lock<std::mutex> lock(call.mu);
  call.cv.wait(lock, [&] { return call.done; });
}

void GroupCommitter::Loop() {
  std::unique_ptr<Connection> conn;
  std::vector<Call*> calls;
  for (;;) {
    calls.clear();
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and no caller waits
      // Everyone waiting goes out together, up to max_group_ statements (a call is not split),
      // except that a call with an `alone` op goes out by itself.
      std::size_t n = 0;
      while (!queue_.empty() &&
             (calls.empty() || (n + queue_.front()->ops.size() <= max_group_ &&
                                !calls.front()->alone && !queue_.front()->alone))) {
        n += queue_.front()->ops.size();
        calls.push_back(queue_.front());
        queue_.pop_front();
      }
      // More than one group's worth waits: wake another connection for the rest.
      if (!queue_.empty()) cv_.notify_one();
    }
    Execute(conn, calls);
    for (Call* c : calls) {
      // Notified under the lock: the caller may destroy `c` as soon as it sees `done`.
      std::lock_guard<std::mutex> lock(c->mu);
      c->done = true;
      c->cv.notify_one();
    }
  }
}

void GroupCommitter::Execute(std::unique_ptr<Connection>& conn, std::span<Call* const> calls) {
  std::vector<Op*> ops;
  for (Call* c : calls) {
    for (Op& op : c->ops) {
      op.result.reset();
      op.status = OkStatus();
      ops.push_back(&op);
    }
  }
  // A call that runs alone keeps its own order: its statements wait for no other transaction's
  // rows in an order sorting could fix.
  if (!(calls.size() == 1 && calls.front()->alone)) {
    std::stable_sort(ops.begin(), ops.end(), [](const Op* a, const Op* b) {
      if (a->order_class != b->order_class) return a->order_class < b->order_class;
      if (a->order_a != b->order_a) return a->order_a < b->order_a;
      return a->order_b < b->order_b;
    });
  }
  const auto fail_all = [&](const Status& s) {
    for (Op* op : ops) {
      op->result.reset();
      op->status = s;
    }
  };
  if (conn && !conn->Healthy()) conn.reset();
  if (!conn) {
    auto made = connect_(DeadlineIn(connect_timeout_));
    if (!made) return fail_all(made.error());
    conn = std::move(*made);
  }
  bool committed = false;
  Status s = RunTogether(*conn, ops, committed);
  if (s.ok() && !committed) {
    // One statement failed, so the transaction rolled back and took the others with it. Run
    // each again in its own transaction: only the failing one fails.
    for (Op* op : ops) {
      op->result.reset();
      op->status = OkStatus();
    }
    s = RunEachAlone(*conn, ops);
  }
  if (!s.ok()) {
    // The connection failed mid-way: whether the group committed is unknown, so nobody gets an
    // answer (fail closed).
    conn.reset();
    fail_all(s);
  }
}

Status GroupCommitter::RunTogether(Connection& conn, std::span<Op* const> ops, bool& committed) {
  const Deadline deadline = DeadlineIn(statement_timeout_);
  for (Op* op : ops) IDEM_RETURN_IF_ERROR(conn.SendPrepared(op->statement, op->params));
  IDEM_RETURN_IF_ERROR(conn.Sync(deadline));
  committed = true;
  for (Op* op : ops) {
    Result<ResultPtr> r = conn.NextStatement(deadline);
    if (!r) return r.error();
    const ExecStatusType st = PQresultStatus(r->get());
    if (st == PGRES_TUPLES_OK || st == PGRES_COMMAND_OK) {
      op->result = std::move(*r);
    } else {
      committed = false;
      op->status = st == PGRES_PIPELINE_ABORTED ? UnavailableError("rolled back with its group")
                                                : StatusOfResult(r->get(), op->statement);
    }
  }
  Status sync = conn.ReadSync(deadline);
  if (!sync.ok()) {
    if (!conn.Healthy()) return sync;
    // The commit itself failed (an error before the sync): rolled back; run each alone.
    committed = false;
  }
  return OkStatus();
}

Status GroupCommitter::RunEachAlone(Connection& conn, std::span<Op* const> ops) {
  const Deadline deadline = DeadlineIn(statement_timeout_);
  for (Op* op : ops) {
    IDEM_RETURN_IF_ERROR(conn.SendPrepared(op->statement, op->params));
    if (PQpipelineSync(conn.get()) != 1) return conn.Fail("PostgreSQL pipeline sync failed");
  }
  IDEM_RETURN_IF_ERROR(conn.Sync(deadline));
  for (Op* op : ops) {
    Result<ResultPtr> r = conn.NextStatement(deadline);
    if (!r) return r.error();
    const ExecStatusType st = PQresultStatus(r->get());
    if (st == PGRES_TUPLES_OK || st == PGRES_COMMAND_OK) {
      op->result = std::move(*r);
    } else {
      op->status = StatusOfResult(r->get(), op->statement);
    }
    Status sync = conn.ReadSync(deadline);
    if (!sync.ok()) {
      if (!conn.Healthy()) return sync;
      op->result.reset();
      op->status = sync;
    }
  }
  // The extra sync Sync() added after the last statement's own.
  return conn.ReadSync(deadline);
}

namespace {

Result<ResultPtr> ReadOne(Connection& conn, std::string_view what, Deadline deadline) {
  Result<ResultPtr> r = conn.NextStatement(deadline);
  if (!r) return r;
  Status sync = conn.ReadSync(deadline);
  const ExecStatusType st = PQresultStatus(r->get());
  if (st != PGRES_TUPLES_OK && st != PGRES_COMMAND_OK) return StatusOfResult(r->get(), what);
  if (!sync.ok()) return sync;
  return r;
}

}  // namespace

Result<ResultPtr> RunStatement(Connection& conn, const char* name, const Params& params,
                               Deadline deadline) {
  IDEM_RETURN_IF_ERROR(conn.SendPrepared(name, params));
  IDEM_RETURN_IF_ERROR(conn.Sync(deadline));
  return ReadOne(conn, name, deadline);
}

Result<ResultPtr> RunQuery(Connection& conn, std::string_view sql, const Params& params,
                           const Oid* types, Deadline deadline) {
  IDEM_RETURN_IF_ERROR(conn.SendQuery(sql, params, types));
  IDEM_RETURN_IF_ERROR(conn.Sync(deadline));
  return ReadOne(conn, "query", deadline);
}

// ---- ConnectionPool ----

ConnectionPool::ConnectionPool(Connector connect, std::size_t max,
                               std::chrono::milliseconds connect_timeout)
    : connect_(std::move(connect)),
      max_(std::max<std::size_t>(1, max)),
      connect_timeout_(connect_timeout) {}

ConnectionPool::~ConnectionPool() = default;

Result<std::unique_ptr<Connection>> ConnectionPool::Take() {
  const Deadline deadline = DeadlineIn(connect_timeout_);
  std::unique_ptr<Connection> conn;
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_until(lock, deadline, [&] { return !idle_.empty() || open_ < max_; })) {
      return UnavailableError("all " + std::to_string(max_) +
                              " PostgreSQL transaction connections stayed busy for the connect "
                              "timeout");
    }
    if (!idle_.empty()) {
      conn = std::move(idle_.back());
      idle_.pop_back();
    } else {
      ++open_;
    }
  }
  if (conn && conn->Healthy()) return conn;
  conn.reset();  // a dead idle connection: replace it (it still counts as open)
  auto made = connect_(deadline);
  if (!made) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      --open_;
    }
    cv_.notify_one();
  }
  return made;
}

void ConnectionPool::Give(std::unique_ptr<Connection> conn) {
  const bool keep = conn && conn->Healthy() && PQtransactionStatus(conn->get()) == PQTRANS_IDLE;
  if (!keep) conn.reset();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (keep) {
      idle_.push_back(std::move(conn));
    } else {
      --open_;
    }
  }
  cv_.notify_one();
}

void ConnectionPool::Add(std::unique_ptr<Connection> conn) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++open_;
  }
  Give(std::move(conn));
}

}  // namespace idem::pg
