// Transactional mode (SPEC §3, exactly-once effect): begin is committed on its own; the handler
// then writes in a transaction of its own, which completes the record under the acquired token
// and commits in the same round trip. A crash before that commit leaves no effect and an
// IN_PROGRESS record whose lease a later delivery takes over; a lost lease makes the completion
// fail, which rolls the handler's writes back. docs/postgres.md has the whole argument.
#include <algorithm>
#include <cctype>
#include <chrono>
#include <exception>
#include <string>
#include <utility>
#include <vector>

#include "core/receiver_parts.h"
#include "idem/fingerprint.h"
#include "idem/stores/postgres.h"
#include "stores/postgres/postgres_store.h"

namespace idem {
namespace {

using core::FingerprintFor;
using core::Stopwatch;
using core::StoreError;

Delivered Answered(const BeginAnswer& a, std::string key) {
  if (const auto* r = std::get_if<Replay>(&a)) {
    return Delivered{.delivery = Delivery::kReplayed,
                     .key = std::move(key),
                     .outcome = r->outcome,
                     .response = r->response,
                     .attempt = r->attempt};
  }
  if (std::holds_alternative<Busy>(a)) return Delivered{.delivery = Delivery::kBusy, .key = key};
  if (std::holds_alternative<Conflict>(a)) {
    return Delivered{.delivery = Delivery::kConflict, .key = std::move(key)};
  }
  return Delivered{.delivery = Delivery::kStale, .key = std::move(key)};
}

// Runs one statement on a pipelined connection outside any group.
Status Simple(pg::Connection& conn, std::string_view sql, std::chrono::milliseconds timeout) {
  pg::Params none;
  auto r = pg::RunQuery(conn, sql, none, nullptr, pg::DeadlineIn(timeout));
  return r ? OkStatus() : r.error();
}

// The statement's first `n` words, upper-cased, past blanks and comments ("-- ..." and
// "/* ... */", nested as PostgreSQL nests them).
std::vector<std::string> LeadingWords(std::string_view sql, std::size_t n) {
  std::vector<std::string> words;
  std::size_t i = 0;
  while (i < sql.size() && words.size() < n) {
    const char c = sql[i];
    if (std::isspace(static_cast<unsigned char>(c)) != 0 || (words.empty() && c == ';')) {
      ++i;  // blanks, and empty statements before the first word (";COMMIT" is a COMMIT)
    } else if (sql.substr(i, 2) == "--") {
      const std::size_t eol = sql.find_first_of("\r\n", i);
      i = eol == std::string_view::npos ? sql.size() : eol + 1;
    } else if (sql.substr(i, 2) == "/*") {
      // PostgreSQL nests block comments.
      int depth = 0;
      while (i < sql.size()) {
        if (sql.substr(i, 2) == "/*") {
          ++depth;
          i += 2;
        } else if (sql.substr(i, 2) == "*/") {
          i += 2;
          if (--depth == 0) break;
        } else {
          ++i;
        }
      }
    } else {
      std::string word;
      while (i < sql.size() &&
             (std::isalnum(static_cast<unsigned char>(sql[i])) != 0 || sql[i] == '_')) {
        word += static_cast<char>(std::toupper(static_cast<unsigned char>(sql[i])));
        ++i;
      }
      if (word.empty()) break;  // a symbol: no keyword statement
      words.push_back(std::move(word));
    }
  }
  return words;
}

// Whether `sql` would end the receiver's transaction: then its writes would commit without the
// record, or a later statement run outside any transaction.
bool EndsTheTransaction(std::string_view sql) {
  const std::vector<std::string> w = LeadingWords(sql, 3);
  if (w.empty()) return false;
  std::string_view second = w.size() > 1 ? std::string_view(w[1]) : std::string_view();
  if (w[0] == "COMMIT" || w[0] == "END" || w[0] == "ABORT") return true;
  if (w[0] == "ROLLBACK") {
    // ROLLBACK [WORK | TRANSACTION] TO [SAVEPOINT] name stays inside the transaction.
    if ((second == "WORK" || second == "TRANSACTION") && w.size() > 2) second = w[2];
    return second != "TO";
  }
  if (w[0] == "PREPARE") return second == "TRANSACTION";
  return false;
}

// The options of the receiver that only extracts and checks keys: it runs no handler.
ReceiverOptions KeysOnly(ReceiverOptions o) {
  o.keep_leases = false;
  return o;
}

}  // namespace

// ---- PgTransaction ----

PGconn* PgTransaction::connection() const { return conn_->get(); }

Result<PgRows> PgTransaction::Exec(std::string_view sql,
                                   std::span<const std::optional<std::string_view>> params) {
  if (const std::vector<std::string> w = LeadingWords(sql, 1); !w.empty() && w[0] == "DEALLOCATE") {
    Status s = InvalidArgumentError(
        "PgTransaction::Exec: DEALLOCATE would drop the receiver's prepared statements, and so "
        "its completion. Not run, and nothing will commit");
    if (failure_.ok()) failure_ = s;
    return s;
  }
  if (EndsTheTransaction(sql)) {
    Status s = InvalidArgumentError(
        "PgTransaction::Exec: \"" + std::string(sql.substr(0, 40)) +
        "\" would end the receiver's transaction; the receiver commits it with the record "
        "(or rolls it back), never the handler. Not run, and nothing will commit");
    if (failure_.ok()) failure_ = s;
    return s;
  }
  auto r = conn_->ExecText(sql, params, pg::DeadlineIn(timeout_));
  if (!r) {
    if (failure_.ok()) failure_ = r.error();
    return r.error();
  }
  const PGresult* res = r->get();
  const ExecStatusType st = PQresultStatus(res);
  if (st != PGRES_TUPLES_OK && st != PGRES_COMMAND_OK) {
    Status s = pg::StatusOfResult(res, "statement failed");
    // The handler's own SQL: its errors are its own (no hint about idem's schema).
    if (s.code() != StatusCode::kUnavailable) {
      s = InvalidArgumentError(pg::ResultErrorText(res, "statement failed"));
    }
    if (failure_.ok()) failure_ = s;
    return s;
  }
  PgRows rows;
  const int fields = PQnfields(res);
  for (int c = 0; c < fields; ++c) rows.columns.emplace_back(PQfname(res, c));
  for (int i = 0; i < PQntuples(res); ++i) {
    auto& row = rows.rows.emplace_back();
    for (int c = 0; c < fields; ++c) {
      if (PQgetisnull(res, i, c)) {
        row.emplace_back();
      } else {
        row.emplace_back(
            std::string(PQgetvalue(res, i, c), static_cast<std::size_t>(PQgetlength(res, i, c))));
      }
    }
  }
  rows.affected = pg::AffectedRows(res);
  return rows;
}

// ---- TransactionalReceiver ----

TransactionalReceiver::TransactionalReceiver(Store& store, ReceiverOptions options)
    : store_(store),
      options_(std::move(options)),
      options_status_(core::CheckReceiverOptions(options_)),
      clock_(options_.clock != nullptr ? *options_.clock : Clock::System()),
      keys_(store, KeysOnly(options_)) {
  if (pg::AsPostgres(store) == nullptr) {
    options_status_ = InvalidArgumentError(
        "TransactionalReceiver needs a store from OpenPostgresStore, not the " +
        std::string(store.Name()) +
        " store: only PostgreSQL commits a handler's writes with "
        "the record");
  }
  if (options_.keep_leases && options_status_.ok()) {
    keeper_ = std::make_unique<core::LeaseKeeper>(options_.lease / 8);
  }
}

TransactionalReceiver::~TransactionalReceiver() = default;

Result<BeginAnswer> TransactionalReceiver::CountedBegin(const BeginRequest& req) {
  return core::TimedBegin(store_, req, options_.metrics,
                          options_.busy_policy != BusyPolicy::kReject);
}

Result<Delivered> TransactionalReceiver::Receive(const Message& message,
                                                 const TransactionalHandler& handler) {
  if (!options_status_.ok()) return options_status_;
  auto fp = FingerprintFor(options_.fingerprint, message.payload);
  if (!fp) return fp.error();
  auto key = keys_.KeyOf(message);
  if (!key) return key.error();
  const BeginRequest req{options_.scope, *key, *fp, options_.lease};
  auto answer = core::BeginWaitingOutBusy(clock_, options_, [&] { return CountedBegin(req); });
  if (!answer) return StoreError(answer.error(), "begin failed; handler not run");
  if (const auto* a = std::get_if<Acquired>(&*answer)) {
    return Execute(std::move(*key), *a, message, handler);
  }
  return Answered(*answer, std::move(*key));
}

Result<Delivered> TransactionalReceiver::Execute(std::string key, const Acquired& acquired,
                                                 const Message& message,
                                                 const TransactionalHandler& handler) {
  pg::PostgresStore& store = *pg::AsPostgres(store_);
  const std::chrono::milliseconds timeout = store.options().statement_timeout;
  Metrics* m = options_.metrics;
  // Each store call is timed under its op, as the receiver times its own.
  const auto timed_release = [&] {
    Stopwatch rsw;
    auto r = store_.Release(options_.scope, key, acquired.token);
    if (m != nullptr) m->store_release_seconds->ObserveDuration(rsw.Elapsed());
    return r;
  };
  const auto timed_complete = [&](const CompleteRequest& req) {
    Stopwatch wsw;
    auto r = store_.Complete(req);
    if (m != nullptr) m->store_complete_seconds->ObserveDuration(wsw.Elapsed());
    return r;
  };
  // Gives the key back after a failure, so that a retry need not wait for the lease: best
  // effort (if it fails too, the lease runs out), but counted like any release.
  const auto release_after_failure = [&] {
    auto r = timed_release();
    if (m == nullptr) return;
    if (!r) {
      m->store_errors->Inc();
    } else if (*r == WriteAnswer::kApplied) {
      m->releases->Inc();
    } else {
      m->lease_lost->Inc();
    }
  };
  // The key is ours but the handler cannot run.
  const auto not_run = [&](const Status& s) -> Result<Delivered> {
    release_after_failure();
    if (m != nullptr) m->store_errors->Inc();
    return StoreError(s, "no transaction for the handler; handler not run");
  };
  auto taken = store.transactions().Take();
  if (!taken) return not_run(taken.error());
  pg::PooledConnection conn(store.transactions(), std::move(*taken));
  // The transaction's id is noted, and checked after the handler: a handler that committed on
  // its own connection and went on in another transaction (COMMIT AND CHAIN, "COMMIT; BEGIN")
  // is caught there, though its connection is inside a transaction. (An id, not a setting: a
  // handler's RESET ALL would clear a setting.)
  const pg::Params none;
  std::string mark;
  if (Status s = Simple(*conn, "BEGIN", timeout); !s.ok()) return not_run(s);
  {
    auto id = pg::RunQuery(*conn, "SELECT pg_current_xact_id()::text", none, nullptr,
                           pg::DeadlineIn(timeout));
    if (!id || PQntuples(id->get()) != 1) {
      (void)conn->Fail("reading the transaction's id failed");
      return not_run(id ? UnavailableError("no transaction id") : id.error());
    }
    mark = PQgetvalue(id->get(), 0, 0);
  }
  if (Status s = conn->LeavePipeline(); !s.ok()) return not_run(s);

  PgTransaction tx(&*conn, timeout);
  const HandlerContext ctx{options_.scope, key, acquired.attempt, acquired.token, message.payload};
  HandlerResult result;
  Stopwatch sw;
  try {
    const core::LeaseHold held(keeper_.get(), store_, clock_, options_, key, acquired.token);
    result = handler(ctx, tx);
  } catch (const std::exception& e) {
    result = {Outcome::kFailure, std::string("handler threw: ") + e.what()};
  } catch (...) {
    result = {Outcome::kFailure, "handler threw a non-standard exception"};
  }
  if (m != nullptr) m->handler_seconds->ObserveDuration(sw.Elapsed());

  Delivered out{.delivery = Delivery::kExecuted,
                .key = key,
                .outcome = result.outcome,
                .response = {},
                .attempt = acquired.attempt};
  // The handler may have left the connection unusable (its own libpq calls): then closing it is
  // the rollback. Whether it ended the transaction itself: out of any transaction (a raw
  // COMMIT), read before the pipeline, or inside another one (COMMIT AND CHAIN), which has not
  // the mark.
  bool ended = PQtransactionStatus(conn->get()) == PQTRANS_IDLE;
  bool usable = conn->ReenterPipeline().ok() && conn->Healthy();
  if (usable && !ended && PQtransactionStatus(conn->get()) == PQTRANS_INTRANS) {
    auto marked = pg::RunQuery(*conn, "SELECT pg_current_xact_id()::text", none, nullptr,
                               pg::DeadlineIn(timeout));
    if (!marked || PQntuples(marked->get()) != 1) {
      usable = false;
    } else {
      ended = PQgetisnull(marked->get(), 0, 0) || PQgetvalue(marked->get(), 0, 0) != mark;
    }
  }
  const bool in_error = !usable || PQtransactionStatus(conn->get()) != PQTRANS_INTRANS;
  const auto rollback = [&] {
    if (usable && !Simple(*conn, "ROLLBACK", timeout).ok()) (void)conn->Fail("rollback failed");
    if (!usable) (void)conn->Fail("the handler left the connection unusable");
  };

  if (ended) {
    // What the handler wrote before its own commit may have committed, without the record.
    // Running it again could apply it twice, so the key is stored as failed (never released),
    // and the caller is told the effect is unknown. What it left open is rolled back, and the
    // connection dropped: it may carry settings the handler made outside the transaction.
    if (usable && PQtransactionStatus(conn->get()) != PQTRANS_IDLE) {
      (void)Simple(*conn, "ROLLBACK", timeout);
    }
    (void)conn->Fail("the handler ended its transaction itself");
    auto stored = timed_complete({options_.scope, key, acquired.token, Outcome::kFailure,
                                  "the handler ended its transaction itself; its writes may "
                                  "have committed",
                                  options_.failure_retention});
    std::string then = "; the key was stored as failed, not released, so it will not run again";
    if (!stored) {
      if (m != nullptr) m->store_errors->Inc();
      then = "; storing the key as failed failed too (" + stored.error().ToString() +
             "): it stays in progress until its lease ends, then runs again";
    } else if (*stored == WriteAnswer::kLeaseLost) {
      if (m != nullptr) m->lease_lost->Inc();
      then = "; its lease was lost to a newer worker meanwhile, which owns the key now";
    } else if (m != nullptr) {
      m->complete_failure->Inc();
    }
    return DataLossError(
        "the handler ended its transaction itself (COMMIT or ROLLBACK on its connection): its "
        "writes may have committed without the record" +
        then);
  }

  if (result.outcome == Outcome::kSuccess && (in_error || !tx.failure().ok())) {
    // It says success, but a statement of its transaction failed: nothing may commit.
    rollback();
    release_after_failure();
    const Status why =
        !tx.failure().ok() ? tx.failure() : UnavailableError("the transaction is not usable");
    return AbortedError("the handler returned success but its transaction failed (" +
                        why.ToString() + "); nothing was committed and the key was released");
  }

  if (result.outcome == Outcome::kFailure) {
    // Its writes go; the failure is then released or remembered like the plain receiver's.
    rollback();
    Result<WriteAnswer> written = WriteAnswer::kApplied;
    if (options_.failure_policy == FailurePolicy::kRelease) {
      written = timed_release();
      out.released = true;
      if (written && *written == WriteAnswer::kApplied && m != nullptr) m->releases->Inc();
    } else {
      written = timed_complete({options_.scope, key, acquired.token, Outcome::kFailure,
                                result.response, options_.failure_retention});
      if (written && *written == WriteAnswer::kApplied && m != nullptr) {
        m->complete_failure->Inc();
      }
    }
    if (!written) {
      if (m != nullptr) m->store_errors->Inc();
      return StoreError(written.error(), "handler failed and its failure could not be stored");
    }
    if (*written == WriteAnswer::kLeaseLost) {
      if (m != nullptr) m->lease_lost->Inc();
      return AbortedError("handler failed and the lease on key was lost to a newer worker");
    }
    out.response = std::move(result.response);
    return out;
  }

  // Success: complete the record inside the handler's transaction and commit, in one round
  // trip. complete_in_transaction raises if the token is no longer the record's, which aborts
  // the transaction, so the COMMIT behind it does not run.
  Stopwatch csw;
  const pg::Deadline deadline = pg::DeadlineIn(timeout);
  pg::Params params;
  params.Bytes(options_.scope);
  params.Bytes(key);
  params.Int8(pg::TokenParam(acquired.token));
  params.Int2(0);
  params.Bytes(result.response);
  params.Int8(pg::Millis(store.clock().Now()));
  params.Int8(pg::Millis(options_.retention));
  const auto unknown = [&](const Status& s) -> Result<Delivered> {
    // The commit may or may not have happened: fail closed. If it did, a retry replays; if not,
    // a retry takes over after the lease and nothing was applied.
    (void)conn->Fail("commit outcome unknown");
    if (m != nullptr) m->store_errors->Inc();
    return UnavailableError("handler ran but its transaction's commit could not be confirmed: " +
                            s.ToString());
  };
  if (Status s = conn->SendPrepared(pg::kCompleteInTransaction, params); !s.ok()) return unknown(s);
  if (Status s = conn->SendQuery("COMMIT", none); !s.ok()) return unknown(s);
  if (Status s = conn->Sync(deadline); !s.ok()) return unknown(s);
  auto completed = conn->NextStatement(deadline);
  if (!completed) return unknown(completed.error());
  auto committed = conn->NextStatement(deadline);
  if (!committed) return unknown(committed.error());
  if (Status s = conn->ReadSync(deadline); !s.ok() && !conn->Healthy()) return unknown(s);
  if (m != nullptr) m->store_complete_seconds->ObserveDuration(csw.Elapsed());

  const PGresult* done = completed->get();
  if (PQresultStatus(done) != PGRES_TUPLES_OK) {
    const bool lost = pg::SqlState(done) == pg::kLeaseLostState;
    const Status why = pg::StatusOfResult(done, "completing the record");
    if (!Simple(*conn, "ROLLBACK", timeout).ok()) (void)conn->Fail("rollback failed");
    if (lost) {
      if (m != nullptr) m->lease_lost->Inc();
      return AbortedError("handler ran but the lease on key was lost to a newer worker (attempt " +
                          std::to_string(acquired.attempt) + "); its transaction was rolled back");
    }
    // Not the lease: the connection itself may be what failed it (a statement the handler
    // left behind), so it is not used again.
    (void)conn->Fail("the completion failed");
    release_after_failure();
    if (m != nullptr) m->store_errors->Inc();
    return StoreError(why, "handler ran but its transaction was rolled back");
  }
  const PGresult* commit = committed->get();
  if (PQresultStatus(commit) != PGRES_COMMAND_OK ||
      std::string_view(PQcmdStatus(const_cast<PGresult*>(commit))) != "COMMIT") {
    // The commit failed (a deferred constraint, a serialisation failure): rolled back.
    const Status why = PQresultStatus(commit) == PGRES_COMMAND_OK
                           ? AbortedError("the transaction was rolled back at commit")
                           : pg::StatusOfResult(commit, "commit");
    if (PQtransactionStatus(conn->get()) != PQTRANS_IDLE) {
      if (!Simple(*conn, "ROLLBACK", timeout).ok()) (void)conn->Fail("rollback failed");
    }
    release_after_failure();
    if (m != nullptr) m->store_errors->Inc();
    return AbortedError("handler ran but its transaction did not commit (" + why.ToString() +
                        "); nothing was applied and the key was released");
  }
  if (m != nullptr) m->complete_success->Inc();
  out.response = std::move(result.response);
  return out;
}

}  // namespace idem
