// Transactional mode (SPEC §3, exactly-once effect): the handler's writes and the record's
// completion commit together or not at all — through success, failure, a throw, a failed
// statement, a lost lease and a kill -9 before the commit.
#include <signal.h>

#include <libpq-fe.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "idem/metrics.h"
#include "idem/stores/memory.h"
#include "idem/stores/postgres.h"
#include "stores/postgres/testing.h"
#include "stores/store_contract.h"
#include "tests/support/fake_clock.h"
#include "tests/support/process.h"

namespace idem {
namespace {

using namespace std::chrono_literals;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::Optional;

MATCHER(IsNone, "is empty") { return !arg.has_value(); }

class TransactionalTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto o = pg::testing::FreshStoreOptions();
    ASSERT_TRUE(o.has_value()) << o.error().ToString();
    options_ = *o;
    options_.clock = &clock_;
    auto store = OpenPostgresStore(options_);
    ASSERT_TRUE(store.has_value()) << store.error().ToString();
    store_ = std::move(*store);
    ASSERT_TRUE(Sql("CREATE TABLE " + Effects() +
                    " (key text PRIMARY KEY, attempt int NOT NULL, note text)"));
  }

  // The user's table, in the test's schema.
  std::string Effects() const { return "\"" + options_.schema + "\".effects"; }

  bool Sql(const std::string& sql) {
    auto r = pg::testing::Sql(options_.conninfo, sql);
    EXPECT_TRUE(r.has_value()) << r.error().ToString();
    return r.has_value();
  }
  int EffectCount() {
    auto v = pg::testing::SqlValue(options_.conninfo, "SELECT count(*) FROM " + Effects());
    EXPECT_TRUE(v.has_value()) << v.error().ToString();
    return v ? std::stoi(*v) : -1;
  }

  ReceiverOptions Options(ReceiverOptions o = {}) {
    o.scope = "tx";
    o.clock = &clock_;
    // The keeper sleeps in real time and reads the fake clock: left on, it could extend a
    // lease between a test's Advance and its next step (AKeptLease... tests it).
    o.keep_leases = false;
    return o;
  }

  // A handler that writes one effect row and answers `result`; counts its runs.
  TransactionalHandler Writes(HandlerResult result) {
    return [this, result](const HandlerContext& c, PgTransaction& tx) {
      ++runs_;
      auto w = tx.Exec("INSERT INTO " + Effects() + " (key, attempt) VALUES ($1, $2)",
                       {c.key, std::to_string(c.attempt)});
      EXPECT_TRUE(w.has_value()) << w.error().ToString();
      return result;
    };
  }

  testing::FakeClock clock_;
  PostgresStoreOptions options_;
  std::unique_ptr<Store> store_;
  std::atomic<int> runs_{0};
};

TEST_F(TransactionalTest, SuccessCommitsTheEffectWithTheRecord) {
  TransactionalReceiver receiver(*store_, Options());
  const auto r = receiver.Receive({.key = "k"}, Writes({Outcome::kSuccess, "done"}));
  ASSERT_TRUE(r.has_value()) << r.error().ToString();
  EXPECT_EQ(r->delivery, Delivery::kExecuted);
  EXPECT_EQ(r->response, "done");
  EXPECT_EQ(r->attempt, 1u);
  EXPECT_EQ(EffectCount(), 1);
  EXPECT_THAT(store_->Get("tx", "k"), HoldsValue(Optional(::testing::AllOf(
                                          ::testing::Field(&Record::state, RecordState::kCompleted),
                                          ::testing::Field(&Record::response, "done")))));

  const auto again = receiver.Receive({.key = "k"}, Writes({Outcome::kSuccess, "again"}));
  ASSERT_TRUE(again.has_value()) << again.error().ToString();
  EXPECT_EQ(again->delivery, Delivery::kReplayed);
  EXPECT_EQ(again->response, "done");
  EXPECT_EQ(runs_.load(), 1);
  EXPECT_EQ(EffectCount(), 1);
}

TEST_F(TransactionalTest, FailureRollsBackTheEffectAndReleasesTheKey) {
  TransactionalReceiver receiver(*store_, Options());
  const auto r = receiver.Receive({.key = "k"}, Writes({Outcome::kFailure, "declined"}));
  ASSERT_TRUE(r.has_value()) << r.error().ToString();
  EXPECT_EQ(r->delivery, Delivery::kExecuted);
  EXPECT_EQ(r->outcome, Outcome::kFailure);
  EXPECT_TRUE(r->released);
  EXPECT_EQ(EffectCount(), 0);
  EXPECT_THAT(store_->Get("tx", "k"), HoldsValue(IsNone()));

  // The next delivery runs again, and this time its effect stays.
  const auto retry = receiver.Receive({.key = "k"}, Writes({Outcome::kSuccess, "ok"}));
  ASSERT_TRUE(retry.has_value()) << retry.error().ToString();
  EXPECT_EQ(retry->delivery, Delivery::kExecuted);
  EXPECT_EQ(EffectCount(), 1);
}

TEST_F(TransactionalTest, ThrowingHandlerRollsBackTheEffect) {
  TransactionalReceiver receiver(*store_, Options());
  const auto r = receiver.Receive({.key = "k"}, [this](const HandlerContext& c, PgTransaction& tx) {
    EXPECT_TRUE(tx.Exec("INSERT INTO " + Effects() + " (key, attempt) VALUES ($1, 1)", {c.key}));
    throw std::runtime_error("downstream exploded");
    return HandlerResult{};
  });
  ASSERT_TRUE(r.has_value()) << r.error().ToString();
  EXPECT_EQ(r->outcome, Outcome::kFailure);
  EXPECT_THAT(r->response, HasSubstr("downstream exploded"));
  EXPECT_TRUE(r->released);
  EXPECT_EQ(EffectCount(), 0);
  EXPECT_THAT(store_->Get("tx", "k"), HoldsValue(IsNone()));
}

TEST_F(TransactionalTest, RememberedFailureIsStoredWithoutItsEffect) {
  TransactionalReceiver receiver(*store_, Options({.failure_policy = FailurePolicy::kRemember}));
  const auto r = receiver.Receive({.key = "k"}, Writes({Outcome::kFailure, "declined"}));
  ASSERT_TRUE(r.has_value()) << r.error().ToString();
  EXPECT_FALSE(r->released);
  EXPECT_EQ(EffectCount(), 0);
  const auto again = receiver.Receive({.key = "k"}, Writes({Outcome::kSuccess, "x"}));
  ASSERT_TRUE(again.has_value()) << again.error().ToString();
  EXPECT_EQ(again->delivery, Delivery::kReplayed);
  EXPECT_EQ(again->outcome, Outcome::kFailure);
  EXPECT_EQ(again->response, "declined");
  EXPECT_EQ(runs_.load(), 1);
}

TEST_F(TransactionalTest, FailedStatementWithSuccessCommitsNothing) {
  TransactionalReceiver receiver(*store_, Options());
  const auto r = receiver.Receive({.key = "k"}, [this](const HandlerContext& c, PgTransaction& tx) {
    EXPECT_TRUE(tx.Exec("INSERT INTO " + Effects() + " (key, attempt) VALUES ($1, 1)", {c.key}));
    EXPECT_THAT(tx.Exec("INSERT INTO no_such_table VALUES (1)"),
                StatusIs(StatusCode::kInvalidArgument, HasSubstr("no_such_table")));
    return HandlerResult{Outcome::kSuccess, "claims success"};
  });
  EXPECT_THAT(r, StatusIs(StatusCode::kAborted, HasSubstr("no_such_table")));
  EXPECT_EQ(EffectCount(), 0);
  EXPECT_THAT(store_->Get("tx", "k"), HoldsValue(IsNone()));
}

// Every store call is timed under its op and every release counted: the releases after a
// failure, and after a success whose transaction failed, were neither.
TEST_F(TransactionalTest, ReleasesAndCompletionsAreTimedAndCounted) {
  Registry registry;
  Metrics metrics(registry, "tx");
  ReceiverOptions o = Options();
  o.metrics = &metrics;
  TransactionalReceiver receiver(*store_, o);
  ASSERT_TRUE(receiver.Receive({.key = "f"}, Writes({Outcome::kFailure, "declined"})));
  EXPECT_EQ(metrics.releases->Value(), 1u);
  EXPECT_EQ(metrics.store_release_seconds->Count(), 1u);

  const auto claimed = receiver.Receive({.key = "s"}, [](const HandlerContext&, PgTransaction& tx) {
    EXPECT_FALSE(tx.Exec("INSERT INTO no_such_table VALUES (1)").has_value());
    return HandlerResult{Outcome::kSuccess, "claims success"};
  });
  EXPECT_THAT(claimed, StatusIs(StatusCode::kAborted, HasSubstr("no_such_table")));
  EXPECT_EQ(metrics.releases->Value(), 2u);
  EXPECT_EQ(metrics.store_release_seconds->Count(), 2u);

  TransactionalReceiver remembering(
      *store_, Options({.failure_policy = FailurePolicy::kRemember, .metrics = &metrics}));
  ASSERT_TRUE(remembering.Receive({.key = "r"}, Writes({Outcome::kFailure, "declined"})));
  EXPECT_EQ(metrics.complete_failure->Value(), 1u);
  EXPECT_EQ(metrics.store_complete_seconds->Count(), 1u);
  EXPECT_EQ(metrics.store_errors->Value(), 0u);
  EXPECT_EQ(metrics.store_begin_seconds->Count(), 3u);
}

TEST_F(TransactionalTest, LostLeaseRollsBackTheEffect) {
  TransactionalReceiver receiver(*store_, Options({.lease = 10s}));
  Acquired takeover;
  const auto r = receiver.Receive({.key = "k"}, [&](const HandlerContext& c, PgTransaction& tx) {
    EXPECT_TRUE(tx.Exec("INSERT INTO " + Effects() + " (key, attempt) VALUES ($1, 1)", {c.key}));
    // Too slow: the lease runs out and another worker takes the key over.
    clock_.Advance(10s);
    takeover = ExpectAcquired(store_->Begin({.scope = "tx", .key = "k"}));
    EXPECT_EQ(takeover.attempt, 2u);
    return HandlerResult{Outcome::kSuccess, "late"};
  });
  EXPECT_THAT(r, StatusIs(StatusCode::kAborted, HasSubstr("lease")));
  EXPECT_EQ(EffectCount(), 0);
  // The new worker still owns the key and completes it.
  EXPECT_THAT(store_->Complete({.scope = "tx", .key = "k", .token = takeover.token}), IsApplied());
}

// keep_leases, on the system clock: a handler three times as long as its 500 ms lease keeps the
// key (another worker's Begin midway is Busy) and commits its effect with the record, once.
TEST_F(TransactionalTest, AKeptLeaseOutlastsALongHandler) {
  PostgresStoreOptions o = options_;
  o.clock = nullptr;
  auto store = OpenPostgresStore(o);
  ASSERT_TRUE(store.has_value()) << store.error().ToString();
  TransactionalReceiver receiver(**store, {.scope = "tx", .lease = 500ms});
  std::vector<bool> busy;
  const auto r = receiver.Receive({.key = "k"}, [&](const HandlerContext& c, PgTransaction& tx) {
    EXPECT_TRUE(tx.Exec("INSERT INTO " + Effects() + " (key, attempt) VALUES ($1, 1)", {c.key}));
    for (int i = 0; i < 2; ++i) {
      std::this_thread::sleep_for(700ms);
      auto other = (*store)->Begin({.scope = "tx", .key = "k", .lease = 60s});
      busy.push_back(other.has_value() && std::holds_alternative<Busy>(*other));
    }
    return HandlerResult{Outcome::kSuccess, "done"};
  });
  ASSERT_TRUE(r.has_value()) << r.error().ToString();
  EXPECT_EQ(r->delivery, Delivery::kExecuted);
  EXPECT_EQ(busy, (std::vector<bool>{true, true}));
  EXPECT_EQ(EffectCount(), 1);
}

// Options the store would refuse (or that make no sense) fail every Receive before any store
// call, as the plain receiver's do: the handler never runs and no record is made.
TEST_F(TransactionalTest, BadOptionsFailEveryReceiveBeforeTheStore) {
  ReceiverOptions negative = Options();
  negative.keep_leases_for = std::chrono::milliseconds(-1);
  negative.keep_leases = true;
  TransactionalReceiver bad_keep(*store_, negative);
  const auto r = bad_keep.Receive({.key = "bad-1"}, Writes({Outcome::kSuccess, "done"}));
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(r.error().message(), "receiver options: keep_leases_for is negative");

  ReceiverOptions no_lease = Options();
  no_lease.lease = std::chrono::milliseconds(0);
  TransactionalReceiver bad_lease(*store_, no_lease);
  const auto l = bad_lease.Receive({.key = "bad-2"}, Writes({Outcome::kSuccess, "done"}));
  ASSERT_FALSE(l.has_value());
  EXPECT_EQ(l.error().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(l.error().message(), ::testing::StartsWith("receiver options: "));

  EXPECT_EQ(runs_.load(), 0);
  EXPECT_EQ(EffectCount(), 0);
  for (const char* key : {"bad-1", "bad-2"}) {
    EXPECT_THAT(store_->Get("tx", key), HoldsValue(IsNone())) << key;
  }
}

TEST_F(TransactionalTest, DuplicateWhileRunningIsBusyThenReplayed) {
  TransactionalReceiver receiver(*store_, Options());
  std::mutex mu;
  std::condition_variable cv;
  bool started = false, release = false;
  std::thread first([&] {
    const auto r = receiver.Receive({.key = "k"}, [&](const HandlerContext& c, PgTransaction& tx) {
      EXPECT_TRUE(tx.Exec("INSERT INTO " + Effects() + " (key, attempt) VALUES ($1, 1)", {c.key}));
      std::unique_lock<std::mutex> lock(mu);
      started = true;
      cv.notify_all();
      cv.wait(lock, [&] { return release; });
      return HandlerResult{Outcome::kSuccess, "first"};
    });
    EXPECT_TRUE(r.has_value() && r->delivery == Delivery::kExecuted);
  });
  {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return started; });
  }
  // Answered at once, not blocked behind the first handler's transaction.
  const auto busy = receiver.Receive({.key = "k"}, Writes({}));
  ASSERT_TRUE(busy.has_value()) << busy.error().ToString();
  EXPECT_EQ(busy->delivery, Delivery::kBusy);
  {
    std::lock_guard<std::mutex> lock(mu);
    release = true;
  }
  cv.notify_all();
  first.join();
  const auto replay = receiver.Receive({.key = "k"}, Writes({}));
  ASSERT_TRUE(replay.has_value()) << replay.error().ToString();
  EXPECT_EQ(replay->delivery, Delivery::kReplayed);
  EXPECT_EQ(replay->response, "first");
  EXPECT_EQ(runs_.load(), 0);
  EXPECT_EQ(EffectCount(), 1);
}

TEST_F(TransactionalTest, OtherPayloadUnderTheKeyIsAConflict) {
  TransactionalReceiver receiver(*store_, Options({.fingerprint = FingerprintMode::kBytes}));
  ASSERT_TRUE(receiver.Receive({.key = "k", .payload = "pay 10"}, Writes({})).has_value());
  const auto r = receiver.Receive({.key = "k", .payload = "pay 99"}, Writes({}));
  ASSERT_TRUE(r.has_value()) << r.error().ToString();
  EXPECT_EQ(r->delivery, Delivery::kConflict);
  EXPECT_EQ(runs_.load(), 1);
}

TEST_F(TransactionalTest, HandlerMayUseTheConnectionItself) {
  TransactionalReceiver receiver(*store_, Options());
  const auto r = receiver.Receive({.key = "k"}, [this](const HandlerContext& c, PgTransaction& tx) {
    const std::string key(c.key);
    const char* values[] = {key.c_str()};
    const std::string sql = "INSERT INTO " + Effects() + " (key, attempt) VALUES ($1, 1)";
    PGresult* res =
        PQexecParams(tx.connection(), sql.c_str(), 1, nullptr, values, nullptr, nullptr, 0);
    EXPECT_EQ(PQresultStatus(res), PGRES_COMMAND_OK) << PQresultErrorMessage(res);
    PQclear(res);
    auto rows = tx.Exec("SELECT key, attempt, note FROM " + Effects());
    EXPECT_TRUE(rows.has_value());
    if (rows) {
      EXPECT_THAT(rows->columns, ::testing::ElementsAre("key", "attempt", "note"));
      EXPECT_THAT(rows->rows, ::testing::ElementsAre(::testing::ElementsAre(
                                  Optional(std::string("k")), Optional(std::string("1")),
                                  std::optional<std::string>())));
    }
    return HandlerResult{Outcome::kSuccess, "raw"};
  });
  ASSERT_TRUE(r.has_value()) << r.error().ToString();
  EXPECT_EQ(r->delivery, Delivery::kExecuted);
  EXPECT_EQ(EffectCount(), 1);
}

// A COMMIT or ROLLBACK through Exec ran: the write before it committed on its own, the key was
// then released (or reported "nothing was committed"), and the next delivery wrote again.
TEST_F(TransactionalTest, AStatementThatWouldEndTheTransactionIsNotRun) {
  TransactionalReceiver receiver(*store_, Options());
  const std::string insert =
      "INSERT INTO " + Effects() + " (key, attempt, note) VALUES ($1, 1, $2)";
  auto r = receiver.Receive({.key = "k5"}, [&](const HandlerContext& c, PgTransaction& tx) {
    ++runs_;
    EXPECT_TRUE(tx.Exec(insert, {c.key, "first"}).has_value());
    for (const char* sql :
         {"COMMIT", " end;", "-- note\n/* x */ Rollback", "abort", "PREPARE TRANSACTION 'p1'",
          "commit and chain", ";COMMIT", " ; ;commit", "/* a /* nested */ b */ COMMIT",
          "-- x\rCOMMIT", "ROLLBACK WORK", "rollback transaction", "DEALLOCATE ALL"}) {
      EXPECT_THAT(tx.Exec(sql),
                  StatusIs(StatusCode::kInvalidArgument,
                           ::testing::AnyOf(HasSubstr("would end the receiver's transaction"),
                                            HasSubstr("would drop the receiver's prepared"))))
          << sql;
    }
    // The handler's own missing table is its own mistake, not idem's schema.
    EXPECT_THAT(
        tx.Exec("SELECT 1 FROM no_such_table_of_the_handler"),
        StatusIs(StatusCode::kInvalidArgument, AllOf(HasSubstr("no_such_table_of_the_handler"),
                                                     Not(HasSubstr("idem store init")))));
    return HandlerResult{Outcome::kFailure, "declined"};
  });
  ASSERT_TRUE(r.has_value()) << r.error().ToString();
  EXPECT_EQ(r->outcome, Outcome::kFailure);
  EXPECT_TRUE(r->released);
  EXPECT_EQ(EffectCount(), 0) << "the failure's rollback took the write back";

  // Success after a refused ROLLBACK: the transaction failed, nothing commits.
  r = receiver.Receive({.key = "k6"}, [&](const HandlerContext& c, PgTransaction& tx) {
    EXPECT_TRUE(tx.Exec(insert, {c.key, "before"}).has_value());
    EXPECT_FALSE(tx.Exec("ROLLBACK").has_value());
    return HandlerResult{Outcome::kSuccess, "ok"};
  });
  EXPECT_THAT(r, StatusIs(StatusCode::kAborted, HasSubstr("nothing was committed")));
  EXPECT_EQ(EffectCount(), 0);

  // ROLLBACK TO SAVEPOINT stays inside the transaction: allowed.
  r = receiver.Receive({.key = "k7"}, [&](const HandlerContext& c, PgTransaction& tx) {
    EXPECT_TRUE(tx.Exec("SAVEPOINT a").has_value());
    EXPECT_TRUE(tx.Exec(insert, {c.key, "undone"}).has_value());
    EXPECT_TRUE(tx.Exec("ROLLBACK TO SAVEPOINT a").has_value());
    EXPECT_TRUE(tx.Exec(insert, {std::string(c.key) + "-2", "undone too"}).has_value());
    EXPECT_TRUE(tx.Exec("ROLLBACK WORK TO SAVEPOINT a").has_value());
    EXPECT_TRUE(tx.Exec("RESET ALL").has_value());  // settings go; the transaction stays
    EXPECT_TRUE(tx.Exec(insert, {c.key, "kept"}).has_value());
    return HandlerResult{Outcome::kSuccess, "ok"};
  });
  ASSERT_TRUE(r.has_value()) << r.error().ToString();
  EXPECT_EQ(EffectCount(), 1);
}

// Over another store there is no transaction to give the handler: each Receive says so (it
// aborted the process).
TEST(TransactionalReceiverTest, AnotherStoreIsAnErrorNotACrash) {
  auto memory = NewMemoryStore();
  TransactionalReceiver receiver(*memory, ReceiverOptions{});
  int runs = 0;
  auto r = receiver.Receive({.key = "k"}, [&](const HandlerContext&, PgTransaction&) {
    ++runs;
    return HandlerResult{};
  });
  EXPECT_THAT(r, StatusIs(StatusCode::kInvalidArgument,
                          AllOf(HasSubstr("OpenPostgresStore"), HasSubstr("memory"))));
  EXPECT_EQ(runs, 0);
}

// A handler that commits through its own libpq calls may have applied its writes: the key is
// stored as failed, so a redelivery replays that instead of writing again.
TEST_F(TransactionalTest, AHandlerThatEndsTheTransactionItselfNeverRunsAgain) {
  TransactionalReceiver receiver(*store_, Options());  // the default failure policy: release
  const auto handler = [&](const HandlerContext& c, PgTransaction& tx) {
    ++runs_;
    EXPECT_TRUE(tx.Exec("INSERT INTO " + Effects() + " (key, attempt) VALUES ($1, 1)", {c.key})
                    .has_value());
    PQclear(PQexec(tx.connection(), "COMMIT"));
    return HandlerResult{Outcome::kFailure, "declined"};
  };
  auto r = receiver.Receive({.key = "k"}, handler);
  EXPECT_THAT(r, StatusIs(StatusCode::kDataLoss, HasSubstr("will not run again")));
  EXPECT_EQ(EffectCount(), 1);
  r = receiver.Receive({.key = "k"}, handler);
  ASSERT_TRUE(r.has_value()) << r.error().ToString();
  EXPECT_EQ(r->delivery, Delivery::kReplayed);
  EXPECT_EQ(r->outcome, Outcome::kFailure);
  EXPECT_EQ(runs_.load(), 1);
  EXPECT_EQ(EffectCount(), 1);

  // Committed and went on in a new transaction (COMMIT AND CHAIN): inside a transaction again,
  // but not the receiver's. The first write committed; the chained one is rolled back.
  const auto chains = [&](const HandlerContext& c, PgTransaction& tx) {
    ++runs_;
    const std::string insert = "INSERT INTO " + Effects() + " (key, attempt) VALUES ($1, 1)";
    EXPECT_TRUE(tx.Exec(insert, {c.key}).has_value());
    PQclear(PQexec(tx.connection(), "COMMIT AND CHAIN"));
    EXPECT_TRUE(tx.Exec(insert, {std::string(c.key) + "-chained"}).has_value());
    return HandlerResult{Outcome::kSuccess, "charged"};
  };
  r = receiver.Receive({.key = "c"}, chains);
  EXPECT_THAT(r, StatusIs(StatusCode::kDataLoss, HasSubstr("will not run again")));
  EXPECT_EQ(EffectCount(), 2);  // "k" and "c"; not "c-chained"
  r = receiver.Receive({.key = "c"}, chains);
  ASSERT_TRUE(r.has_value()) << r.error().ToString();
  EXPECT_EQ(r->delivery, Delivery::kReplayed);
  EXPECT_EQ(runs_.load(), 2);
  EXPECT_EQ(EffectCount(), 2);
}

// The proof of SPEC §3's exactly-once effect: a worker killed (-9) after its handler wrote and
// before the commit leaves no effect; the key is taken over after the lease and its effect is
// applied once.
TEST_F(TransactionalTest, KilledBeforeCommitLeavesNoEffectAndTheKeyIsRetryable) {
  const std::string url = options_.conninfo +
                          (options_.conninfo.find('?') == std::string::npos ? "?" : "&") +
                          "schema=" + options_.schema;
  auto child = testing::ChildProcess::Spawn(IDEM_PG_CHILD_PATH, {url, "order-1", Effects()});
  ASSERT_TRUE(child.has_value()) << child.error().ToString();
  auto written = child->WaitForLine("written", 60s);
  ASSERT_TRUE(written.has_value()) << written.error().ToString();
  EXPECT_EQ(*written, "written attempt 1");
  ASSERT_TRUE(child->Kill(SIGKILL).ok());
  EXPECT_THAT(child->Wait(30s), HoldsValue(128 + SIGKILL));

  // Nothing of the handler's: its write died with its transaction.
  EXPECT_EQ(EffectCount(), 0);
  EXPECT_THAT(store_->Get("tx", "order-1"),
              HoldsValue(Optional(
                  ::testing::AllOf(::testing::Field(&Record::state, RecordState::kInProgress),
                                   ::testing::Field(&Record::attempt, 1u)))));

  // A later delivery, once the child's 30 s lease is over (the child used the system clock).
  clock_.Set(Clock::System().Now() + 31s);
  TransactionalReceiver receiver(*store_, Options());
  const auto r = receiver.Receive({.key = "order-1"}, Writes({Outcome::kSuccess, "paid"}));
  ASSERT_TRUE(r.has_value()) << r.error().ToString();
  EXPECT_EQ(r->delivery, Delivery::kExecuted);
  EXPECT_EQ(r->attempt, 2u);
  EXPECT_EQ(EffectCount(), 1);
  EXPECT_EQ(
      pg::testing::SqlValue(options_.conninfo, "SELECT attempt FROM " + Effects()).value_or(""),
      "2");
  const auto replay = receiver.Receive({.key = "order-1"}, Writes({}));
  ASSERT_TRUE(replay.has_value()) << replay.error().ToString();
  EXPECT_EQ(replay->delivery, Delivery::kReplayed);
  EXPECT_EQ(replay->response, "paid");
  EXPECT_EQ(EffectCount(), 1);
}

}  // namespace
}  // namespace idem
