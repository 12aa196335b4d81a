// The PostgreSQL store beyond the contract suite: its URLs, the schema check, group commit and
// batches, the reaper, and failing closed when the server goes away.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <latch>
#include <map>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <libpq-fe.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "idem/stores/postgres.h"
#include "stores/postgres/schema.h"
#include "stores/postgres/testing.h"
#include "stores/store_contract.h"
#include "tests/support/fake_clock.h"

namespace idem {
namespace {

using namespace std::chrono_literals;
using pg::testing::FreshStoreOptions;
using pg::testing::LocalPostgres;
using pg::testing::SqlValue;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Optional;

// Runs body(0) .. body(threads-1) on their own threads, released together.
void RunConcurrently(int threads, const std::function<void(int)>& body) {
  std::latch start(threads);
  std::vector<std::thread> running;
  for (int t = 0; t < threads; ++t) {
    running.emplace_back([&start, &body, t] {
      start.arrive_and_wait();
      body(t);
    });
  }
  for (std::thread& th : running) th.join();
}

// Polls `done` every few milliseconds for up to `limit` of real time.
bool Eventually(const std::function<bool()>& done, std::chrono::milliseconds limit = 30s) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < end) {
    if (done()) return true;
    std::this_thread::sleep_for(5ms);
  }
  return done();
}

bool IsAcquired(const Result<BeginAnswer>& r) {
  return r.has_value() && std::holds_alternative<Acquired>(*r);
}

std::vector<std::string> Keys(int n, std::string_view prefix = "key-") {
  std::vector<std::string> keys;
  for (int i = 0; i < n; ++i) keys.push_back(std::string(prefix) + std::to_string(i));
  return keys;
}

// ==== URLs ====================================================================================

TEST(PostgresUrlTest, TakesIdemParametersAndLeavesTheRestToLibpq) {
  const auto o = ParsePostgresStoreUrl(
      "postgres://app:secret@db.internal:6432/orders?schema=tenant_a&pool_size=8&"
      "max_transactions=3&sslmode=disable&max_key_bytes=512&abandoned_retention=2h&"
      "connect_timeout=1500ms&statement_timeout=3s&reclaim_interval=0&reclaim_batch=50&"
      "application_name=billing");
  ASSERT_TRUE(o.has_value()) << o.error().ToString();
  EXPECT_EQ(o->conninfo,
            "postgres://app:secret@db.internal:6432/orders?sslmode=disable&application_name="
            "billing");
  EXPECT_EQ(o->schema, "tenant_a");
  EXPECT_EQ(o->pool_size, 8u);
  EXPECT_EQ(o->max_transactions, 3u);
  EXPECT_EQ(o->max_key_bytes, 512u);
  EXPECT_EQ(o->abandoned_retention, 2h);
  EXPECT_EQ(o->connect_timeout, 1500ms);
  EXPECT_EQ(o->statement_timeout, 3s);
  EXPECT_EQ(o->reclaim_interval, 0ms);
  EXPECT_EQ(o->reclaim_batch, 50u);
}

TEST(PostgresUrlTest, DefaultsAndBothSchemes) {
  const auto o = ParsePostgresStoreUrl("postgresql://idem@127.0.0.1:5432/idem");
  ASSERT_TRUE(o.has_value()) << o.error().ToString();
  EXPECT_EQ(o->conninfo, "postgresql://idem@127.0.0.1:5432/idem");
  EXPECT_EQ(o->schema, "idem");
  EXPECT_EQ(o->pool_size, PostgresStoreOptions{}.pool_size);
  EXPECT_EQ(o->statement_timeout, PostgresStoreOptions{}.statement_timeout);
  EXPECT_TRUE(ParsePostgresStoreUrl("postgres:///idem?schema=x1").has_value());
  EXPECT_THAT(ParsePostgresStoreUrl("postgres://h/db?statement_timeout=250"),
              HoldsValue(::testing::Field(&PostgresStoreOptions::statement_timeout, 250ms)));
}

TEST(PostgresUrlTest, RejectsWhatIsWrongNamingIt) {
  const auto rejects = [](std::string_view url, std::string_view why) {
    EXPECT_THAT(ParsePostgresStoreUrl(url),
                StatusIs(StatusCode::kInvalidArgument,
                         AllOf(HasSubstr("PostgreSQL store URL"), HasSubstr(std::string(why)))))
        << url;
  };
  rejects("redis://127.0.0.1:6379", "postgres://");
  rejects("postgres://h/db?schema=Tenant-A", "schema name \"Tenant-A\"");
  rejects("postgres://h/db?schema=", "schema name \"\" is empty");
  rejects("postgres://h/db?schema=1abc", "not starting with a digit");
  rejects("postgres://h/db?pool_size=0", "pool_size=0");
  rejects("postgres://h/db?pool_size=many", "pool_size=many");
  rejects("postgres://h/db?max_transactions=-1", "max_transactions=-1");
  rejects("postgres://h/db?statement_timeout=5x", "statement_timeout=5x");
  rejects("postgres://h/db?statement_timeout=0", "statement_timeout=0 must be above 0");
  rejects("postgres://h/db?reclaim_interval=3661d", "is above the longest duration");
  rejects("postgres://h/db?connect_timeout=", "connect_timeout=");
  rejects("postgres://h/db?schema", "\"schema\" has no value");
  rejects("postgres://h/db?no_such_option=1", "no_such_option");
  // Values libpq itself checks only when it connects (they were kUnavailable, exit 1).
  rejects("postgres://h/db?sslmode=bogus", "sslmode=bogus is not one of disable, allow");
  rejects("postgres://h:99999/db", "port 99999 is not a whole number from 1 to 65535");
  rejects("postgres://h/db?port=5432,x", "port x is not");
  rejects("postgres://h/db?target_session_attrs=primry", "target_session_attrs=primry");
  rejects("postgres://h/db?gssencmode=on", "gssencmode=on");
  EXPECT_TRUE(ParsePostgresStoreUrl("postgres://a,b/db?port=5432,5433&sslmode=verify-full"));
}

// ==== the schema ==============================================================================

TEST(PostgresSchemaTest, OpenWithoutSchemaSaysToRunInit) {
  auto conninfo = pg::testing::TestConninfo();
  ASSERT_TRUE(conninfo.has_value()) << conninfo.error().ToString();
  PostgresStoreOptions o;
  o.conninfo = *conninfo;
  o.schema = pg::testing::FreshSchemaName();
  EXPECT_THAT(OpenPostgresStore(o),
              StatusIs(StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("\"" + o.schema + "\""), HasSubstr("idem store init"))));
  EXPECT_THAT(PostgresSchemaVersion(o), HoldsValue(std::optional<int>()));
}

TEST(PostgresSchemaTest, InitCreatesOnceAndIsIdempotent) {
  auto conninfo = pg::testing::TestConninfo();
  ASSERT_TRUE(conninfo.has_value()) << conninfo.error().ToString();
  PostgresStoreOptions o;
  o.conninfo = *conninfo;
  o.schema = pg::testing::FreshSchemaName();
  o.reclaim_interval = 0ms;
  ASSERT_TRUE(InitPostgresSchema(o).ok());
  EXPECT_THAT(PostgresSchemaVersion(o), HoldsValue(Optional(kPostgresSchemaVersion)));
  auto store = OpenPostgresStore(o);
  ASSERT_TRUE(store.has_value()) << store.error().ToString();
  const Acquired a = ExpectAcquired((*store)->Begin({.scope = "s", .key = "k"}));
  // Again, with a store open on it: nothing is lost, and the store goes on working.
  ASSERT_TRUE(InitPostgresSchema(o).ok());
  EXPECT_THAT((*store)->Complete({.scope = "s", .key = "k", .token = a.token, .response = "r"}),
              IsApplied());
  EXPECT_THAT(ExpectReplay((*store)->Begin({.scope = "s", .key = "k"})).response, "r");
}

TEST(PostgresSchemaTest, ConcurrentInitsOfOneSchemaAllSucceed) {
  auto conninfo = pg::testing::TestConninfo();
  ASSERT_TRUE(conninfo.has_value()) << conninfo.error().ToString();
  PostgresStoreOptions o;
  o.conninfo = *conninfo;
  o.schema = pg::testing::FreshSchemaName();
  std::vector<Status> results(4);
  RunConcurrently(4, [&](int t) { results[static_cast<std::size_t>(t)] = InitPostgresSchema(o); });
  for (const Status& s : results) EXPECT_TRUE(s.ok()) << s.ToString();
  EXPECT_THAT(PostgresSchemaVersion(o), HoldsValue(Optional(kPostgresSchemaVersion)));
}

TEST(PostgresSchemaTest, AnotherVersionIsRefusedNamingBoth) {
  auto o = FreshStoreOptions();
  ASSERT_TRUE(o.has_value()) << o.error().ToString();
  ASSERT_TRUE(SqlValue(o->conninfo, "UPDATE \"" + o->schema +
                                        "\".meta SET value = '7' WHERE name = 'schema_version' "
                                        "RETURNING 1")
                  .has_value());
  const auto both =
      AllOf(HasSubstr("version 7"), HasSubstr("version " + std::to_string(kPostgresSchemaVersion)),
            HasSubstr(o->schema));
  EXPECT_THAT(OpenPostgresStore(*o), StatusIs(StatusCode::kFailedPrecondition, both));
  EXPECT_THAT(InitPostgresSchema(*o), StatusIs(StatusCode::kFailedPrecondition, both));
  EXPECT_THAT(PostgresSchemaVersion(*o), HoldsValue(Optional(7)));
}

// A schema that already holds a table of idem's name that idem did not make: init refuses and
// changes nothing (it used to report success, keep the foreign table, and leave every open to
// fail with kInternal); an idem table changed by hand is refused at open as a damaged schema.
TEST(PostgresSchemaTest, ForeignTablesAreRefusedNotAdopted) {
  auto conninfo = pg::testing::TestConninfo();
  ASSERT_TRUE(conninfo.has_value()) << conninfo.error().ToString();
  PostgresStoreOptions o;
  o.conninfo = *conninfo;
  o.schema = pg::testing::FreshSchemaName();
  o.reclaim_interval = 0ms;
  ASSERT_TRUE(SqlValue(o.conninfo, "CREATE SCHEMA \"" + o.schema + "\"; CREATE TABLE \"" +
                                       o.schema +
                                       "\".records (id serial PRIMARY KEY, note text); SELECT 1")
                  .has_value());
  EXPECT_THAT(InitPostgresSchema(o),
              StatusIs(StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("records"), HasSubstr("not idem's"), HasSubstr(o.schema))));
  EXPECT_THAT(PostgresSchemaVersion(o), HoldsValue(std::optional<int>()));  // nothing changed

  auto ours = FreshStoreOptions();
  ASSERT_TRUE(ours.has_value()) << ours.error().ToString();
  ASSERT_TRUE(SqlValue(ours->conninfo, "ALTER TABLE \"" + ours->schema +
                                           "\".records RENAME COLUMN scope "
                                           "TO tenant; SELECT 1")
                  .has_value());
  EXPECT_THAT(OpenPostgresStore(*ours),
              StatusIs(StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr(ours->schema), HasSubstr("changed by hand"))));
}

// Keys up to kMaxPostgresKeyBytes fit an index row with the longest scope; longer limits are
// refused when the URL is read and when the store opens (a 3000-byte key used to fail the call
// with kInternal from the index).
TEST(PostgresSchemaTest, TheKeyLimitFitsAnIndexRow) {
  EXPECT_THAT(ParsePostgresStoreUrl("postgres://h/db?max_key_bytes=3000"),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("max_key_bytes")));
  auto o = FreshStoreOptions();
  ASSERT_TRUE(o.has_value()) << o.error().ToString();
  o->max_key_bytes = kMaxPostgresKeyBytes + 1;
  EXPECT_THAT(OpenPostgresStore(*o),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("max_key_bytes")));
  o->max_key_bytes = kMaxPostgresKeyBytes;
  auto store = OpenPostgresStore(*o);
  ASSERT_TRUE(store.has_value()) << store.error().ToString();
  const std::string scope(kMaxScopeBytes, 's');
  // Incompressible bytes, so that the index row is as long as the key.
  std::string key;
  std::mt19937 rng(7);
  for (std::size_t i = 0; i < kMaxPostgresKeyBytes; ++i)
    key.push_back(static_cast<char>('!' + rng() % 90));
  const Acquired a = ExpectAcquired((*store)->Begin({.scope = scope, .key = key}));
  EXPECT_THAT((*store)->Complete({.scope = scope, .key = key, .token = a.token}), IsApplied());
  const std::string entity = key;
  auto v = (*store)->BeginVersioned({.scope = scope, .entity = entity, .version = 1});
  ASSERT_TRUE(v.has_value()) << v.error().ToString();
}

// A database that answers reads and refuses writes (a standby, default_transaction_read_only)
// is not ready: /readyz asked only for a read, and said ready while every request got 503.
TEST(PostgresSchemaTest, ADatabaseThatRefusesWritesIsNotReady) {
  auto o = pg::testing::FreshStoreOptions();
  ASSERT_TRUE(o.has_value()) << o.error().ToString();
  ASSERT_TRUE(InitPostgresSchema(*o).ok());
  auto writable = OpenPostgresStore(*o);
  ASSERT_TRUE(writable.has_value()) << writable.error().ToString();
  EXPECT_TRUE((*writable)->Ready().ok()) << (*writable)->Ready().ToString();

  PostgresStoreOptions read_only = *o;
  read_only.conninfo += read_only.conninfo.find('?') == std::string::npos ? "?" : "&";
  read_only.conninfo += "options=-c%20default_transaction_read_only%3Don";
  auto store = OpenPostgresStore(read_only);
  ASSERT_TRUE(store.has_value()) << store.error().ToString();
  EXPECT_THAT((*store)->Ready(), StatusIs(StatusCode::kUnavailable, HasSubstr("read-only here")));
  EXPECT_FALSE((*store)->Begin({.scope = "s", .key = "k"}).has_value());
  EXPECT_TRUE((*writable)->Ready().ok());
}

TEST(PostgresSchemaTest, NoServerIsUnavailable) {
  PostgresStoreOptions o;
  o.conninfo = "postgres://postgres@127.0.0.1:1/idem";  // nothing listens on port 1
  EXPECT_THAT(OpenPostgresStore(o), StatusIs(StatusCode::kUnavailable, HasSubstr("connect")));
  EXPECT_THAT(InitPostgresSchema(o), StatusIs(StatusCode::kUnavailable, HasSubstr("connect")));
}

// ==== group commit and batches ================================================================

class PostgresStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto o = FreshStoreOptions();
    ASSERT_TRUE(o.has_value()) << o.error().ToString();
    options_ = *o;
    options_.clock = &clock_;
    store_ = Open(options_);
    ASSERT_NE(store_, nullptr);
  }

  std::unique_ptr<Store> Open(const PostgresStoreOptions& o) {
    auto s = OpenPostgresStore(o);
    EXPECT_TRUE(s.has_value()) << s.error().ToString();
    return s.has_value() ? std::move(*s) : nullptr;
  }

  // `"schema".table`
  std::string Table(std::string_view name) const {
    return "\"" + options_.schema + "\"." + std::string(name);
  }
  std::string Value(const std::string& sql) const {
    auto v = SqlValue(options_.conninfo, sql);
    EXPECT_TRUE(v.has_value()) << v.error().ToString();
    return v.value_or("");
  }

  testing::FakeClock clock_;
  PostgresStoreOptions options_;
  std::unique_ptr<Store> store_;
};

TEST_F(PostgresStoreTest, ABatchIsOneTransaction) {
  const std::vector<std::string> keys = Keys(300);
  std::vector<BeginRequest> begins;
  for (const std::string& k : keys) begins.push_back({.scope = "b", .key = k});
  const auto got = store_->BeginBatch(begins);
  ASSERT_EQ(got.size(), keys.size());
  std::vector<CompleteRequest> completes;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    completes.push_back(
        {.scope = "b", .key = keys[i], .token = ExpectAcquired(got[i]).token, .response = "r"});
  }
  // Every row was written by the same transaction (one xmin).
  EXPECT_EQ(Value("SELECT count(DISTINCT xmin::text) FROM " + Table("records")), "1");
  std::vector<ExtendRequest> extends;
  for (const CompleteRequest& c : completes) {
    extends.push_back(
        {.scope = "b", .key = c.key, .token = c.token, .lease = std::chrono::minutes(5)});
  }
  for (const auto& r : store_->ExtendBatch(extends)) EXPECT_THAT(r, IsApplied());
  EXPECT_EQ(Value("SELECT count(DISTINCT xmin::text) FROM " + Table("records")), "1");
  for (const auto& r : store_->CompleteBatch(completes)) EXPECT_THAT(r, IsApplied());
  EXPECT_EQ(Value("SELECT count(DISTINCT xmin::text) FROM " + Table("records")), "1");
  EXPECT_EQ(Value("SELECT count(*) FROM " + Table("records") + " WHERE state = 2"), "300");
}

// A batch's distinct keys go as one set-based statement and its repeats as single statements
// after it, all in one transaction (one round trip): new keys, lapsed ones taken over, repeats.
TEST_F(PostgresStoreTest, ABatchOfNewAndLapsedKeysWithRepeatsIsOneTransaction) {
  constexpr int kDistinct = 40;
  static_assert(kDistinct >= pg::kSetBatchMin, "the batch must take the set-based path");
  const std::vector<std::string> keys = Keys(kDistinct);
  std::vector<Acquired> lapsed;
  for (std::size_t i = 0; i < 20; ++i) {
    lapsed.push_back(ExpectAcquired(store_->Begin({.scope = "m", .key = keys[i], .lease = 500ms})));
  }
  clock_.Advance(1s);
  std::vector<BeginRequest> begins;
  for (const std::string& k : keys) begins.push_back({.scope = "m", .key = k});
  begins.push_back({.scope = "m", .key = keys[0]});
  begins.push_back({.scope = "m", .key = keys[25]});
  const auto got = store_->BeginBatch(begins);
  ASSERT_EQ(got.size(), begins.size());
  for (std::size_t i = 0; i < keys.size(); ++i) {
    const Acquired a = ExpectAcquired(got[i]);
    EXPECT_EQ(a.attempt, i < 20 ? 2u : 1u) << keys[i];
    if (i < 20) {
      EXPECT_GT(a.token, lapsed[i].token) << keys[i];
    }
  }
  EXPECT_TRUE(got[40].has_value() && std::holds_alternative<Busy>(*got[40]));
  EXPECT_TRUE(got[41].has_value() && std::holds_alternative<Busy>(*got[41]));
  EXPECT_EQ(Value("SELECT count(DISTINCT xmin::text) FROM " + Table("records")), "1");
}

TEST_F(PostgresStoreTest, ABatchLargerThanAGroupIsStillOneTransaction) {
  std::vector<std::string> keys = Keys(3000);
  std::vector<BeginRequest> begins;
  for (const std::string& k : keys) begins.push_back({.scope = "b", .key = k});
  for (const auto& r : store_->BeginBatch(begins)) ExpectAcquired(r);
  EXPECT_EQ(Value("SELECT count(DISTINCT xmin::text) FROM " + Table("records")), "1");
}

TEST_F(PostgresStoreTest, ConcurrentCallersShareTransactions) {
  constexpr int kThreads = 32;
  constexpr int kEach = 40;
  std::atomic<int> acquired{0};
  RunConcurrently(kThreads, [&](int t) {
    for (int i = 0; i < kEach; ++i) {
      const std::string key = std::to_string(t) + "/" + std::to_string(i);
      if (IsAcquired(store_->Begin({.scope = "c", .key = key}))) acquired.fetch_add(1);
    }
  });
  EXPECT_EQ(acquired.load(), kThreads * kEach);
  // Fewer transactions than calls: callers waiting together went out together.
  const int transactions =
      std::stoi(Value("SELECT count(DISTINCT xmin::text) FROM " + Table("records")));
  EXPECT_LT(transactions, kThreads * kEach);
}

TEST_F(PostgresStoreTest, OverlappingBatchesInOtherOrdersAcquireEachKeyOnce) {
  // Groups lock rows in one order whatever the callers' order, so these never deadlock.
  constexpr int kThreads = 8;
  const std::vector<std::string> keys = Keys(300);
  std::vector<std::vector<Result<BeginAnswer>>> seen(kThreads);
  std::vector<std::vector<std::size_t>> orders(kThreads);
  RunConcurrently(kThreads, [&](int t) {
    auto& order = orders[static_cast<std::size_t>(t)];
    for (std::size_t i = 0; i < keys.size(); ++i) order.push_back(i);
    std::shuffle(order.begin(), order.end(), std::mt19937(static_cast<unsigned>(t)));
    std::vector<BeginRequest> reqs;
    for (std::size_t i : order) reqs.push_back({.scope = "o", .key = keys[i]});
    seen[static_cast<std::size_t>(t)] = store_->BeginBatch(reqs);
  });
  std::vector<int> count(keys.size(), 0);
  for (int t = 0; t < kThreads; ++t) {
    const auto& answers = seen[static_cast<std::size_t>(t)];
    ASSERT_EQ(answers.size(), keys.size());
    for (std::size_t j = 0; j < answers.size(); ++j) {
      const std::size_t i = orders[static_cast<std::size_t>(t)][j];
      if (IsAcquired(answers[j])) {
        ++count[i];
      } else {
        EXPECT_TRUE(answers[j].has_value() && std::holds_alternative<Busy>(*answers[j]))
            << keys[i] << ": " << ::testing::PrintToString(answers[j]);
      }
    }
  }
  for (std::size_t i = 0; i < keys.size(); ++i) EXPECT_EQ(count[i], 1) << keys[i];
}

// Set-based batches (new keys first, then takeovers of lapsed ones) racing single calls (one
// pass in key order) over the same keys: whatever waits for whom (PostgreSQL ends a deadlock,
// and the group then runs each statement alone), every key is taken once and every other
// answer is Busy, none an error.
TEST_F(PostgresStoreTest, BatchesAndSingleCallsRacingOverNewAndLapsedKeysTakeEachKeyOnce) {
  constexpr int kThreads = 8;
  const std::vector<std::string> keys = Keys(120);
  for (std::size_t i = 0; i < keys.size(); i += 2) {
    ExpectAcquired(store_->Begin({.scope = "r", .key = keys[i], .lease = 500ms}));
  }
  clock_.Advance(1s);
  std::vector<std::atomic<int>> taken(keys.size());
  std::atomic<int> errors{0};
  const auto count = [&](std::size_t i, const Result<BeginAnswer>& r) {
    if (IsAcquired(r)) {
      taken[i].fetch_add(1);
    } else if (!r.has_value() || !std::holds_alternative<Busy>(*r)) {
      errors.fetch_add(1);
      ADD_FAILURE() << keys[i] << ": " << ::testing::PrintToString(r);
    }
  };
  RunConcurrently(kThreads, [&](int t) {
    std::vector<std::size_t> order(keys.size());
    for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
    if (t % 2 == 1) {
      for (std::size_t i : order) count(i, store_->Begin({.scope = "r", .key = keys[i]}));
      return;
    }
    std::shuffle(order.begin(), order.end(), std::mt19937(static_cast<unsigned>(t)));
    std::vector<BeginRequest> reqs;
    for (std::size_t i : order) reqs.push_back({.scope = "r", .key = keys[i]});
    const auto got = store_->BeginBatch(reqs);
    ASSERT_EQ(got.size(), reqs.size());
    for (std::size_t j = 0; j < got.size(); ++j) count(order[j], got[j]);
  });
  EXPECT_EQ(errors.load(), 0);
  for (std::size_t i = 0; i < keys.size(); ++i) EXPECT_EQ(taken[i].load(), 1) << keys[i];
}

TEST_F(PostgresStoreTest, TwoStoresOnOneSchemaAcquireEachKeyOnce) {
  std::unique_ptr<Store> other = Open(options_);
  ASSERT_NE(other, nullptr);
  const std::vector<std::string> keys = Keys(200);
  std::vector<std::atomic<int>> count(keys.size());
  RunConcurrently(8, [&](int t) {
    Store& s = t % 2 == 0 ? *store_ : *other;
    for (std::size_t j = 0; j < keys.size(); ++j) {
      const std::size_t i = (j + static_cast<std::size_t>(t) * 17) % keys.size();
      const auto r = s.Begin({.scope = "two", .key = keys[i]});
      if (IsAcquired(r)) count[i].fetch_add(1);
      EXPECT_TRUE(r.has_value()) << r.error().ToString();
    }
  });
  for (std::size_t i = 0; i < keys.size(); ++i) EXPECT_EQ(count[i].load(), 1) << keys[i];
}

TEST_F(PostgresStoreTest, TokensGrowAcrossStoresSharingTheSchema) {
  std::unique_ptr<Store> other = Open(options_);
  ASSERT_NE(other, nullptr);
  Token last = 0;
  for (int i = 0; i < 10; ++i) {
    Store& s = i % 2 == 0 ? *store_ : *other;
    const Acquired a = ExpectAcquired(s.Begin({.scope = "t", .key = "k"}));
    EXPECT_GT(a.token, last);
    last = a.token;
    ASSERT_THAT(s.Release("t", "k", a.token), IsApplied());
  }
}

TEST_F(PostgresStoreTest, AFailingStatementFailsOnlyItsCall) {
  PostgresStoreOptions o = options_;
  o.statement_timeout = 800ms;
  std::unique_ptr<Store> store = Open(o);
  ASSERT_NE(store, nullptr);
  const Acquired x = ExpectAcquired(store->Begin({.scope = "g", .key = "x"}));
  const Acquired y = ExpectAcquired(store->Begin({.scope = "g", .key = "y"}));
  // Another session holds x's row, so x's completion waits until the server cancels it. It
  // shares a transaction with y's, which rolls back with it and is then run again on its own.
  PGconn* holder = PQconnectdb(options_.conninfo.c_str());
  ASSERT_EQ(PQstatus(holder), CONNECTION_OK) << PQerrorMessage(holder);
  PQclear(PQexec(holder, "BEGIN"));
  PGresult* locked = PQexec(holder, ("SELECT 1 FROM " + Table("records") +
                                     " WHERE key = convert_to('x', 'UTF8') FOR UPDATE")
                                        .c_str());
  EXPECT_EQ(PQntuples(locked), 1) << PQresultErrorMessage(locked);
  PQclear(locked);
  const auto got = store->CompleteBatch(std::vector<CompleteRequest>{
      {.scope = "g", .key = "x", .token = x.token}, {.scope = "g", .key = "y", .token = y.token}});
  ASSERT_EQ(got.size(), 2u);
  EXPECT_THAT(got[0], StatusIs(StatusCode::kUnavailable, HasSubstr("statement timeout")));
  EXPECT_THAT(got[1], IsApplied());
  PQclear(PQexec(holder, "ROLLBACK"));
  PQfinish(holder);
  // The connection survived, and x is still there to complete.
  EXPECT_THAT(store->Complete({.scope = "g", .key = "x", .token = x.token}), IsApplied());
}

TEST_F(PostgresStoreTest, StatsCountBytes) {
  ExpectAcquired(store_->Begin({.scope = "s", .key = "k"}));
  const auto st = store_->Stats();
  ASSERT_TRUE(st.has_value()) << st.error().ToString();
  EXPECT_EQ(st->in_progress, 1u);
  EXPECT_GT(st->bytes, 0u);
}

// ==== reclaiming ==============================================================================

TEST_F(PostgresStoreTest, PurgeWalksTheWholeTableInSteps) {
  // More rows than one step's blocks hold, and a small batch: many short transactions.
  PostgresStoreOptions o = options_;
  o.reclaim_batch = 500;
  std::unique_ptr<Store> store = Open(o);
  ASSERT_NE(store, nullptr);
  constexpr int kRecords = 12'000;
  const std::vector<std::string> keys = Keys(kRecords);
  const std::string response(100, 'x');
  for (int from = 0; from < kRecords; from += 1000) {
    std::vector<BeginRequest> begins;
    for (int i = from; i < from + 1000; ++i) {
      begins.push_back({.scope = "p", .key = keys[static_cast<std::size_t>(i)]});
    }
    std::vector<CompleteRequest> completes;
    const auto got = store->BeginBatch(begins);
    for (std::size_t i = 0; i < got.size(); ++i) {
      completes.push_back({.scope = "p",
                           .key = begins[i].key,
                           .token = ExpectAcquired(got[i]).token,
                           .response = response,
                           .retention = 1s});
    }
    for (const auto& r : store->CompleteBatch(completes)) ASSERT_THAT(r, IsApplied());
  }
  ExpectAcquired(store->Begin({.scope = "p", .key = "kept", .lease = 1h}));
  ASSERT_GT(std::stoll(Value("SELECT pg_relation_size('" + Table("records") +
                             "') / current_setting('block_size')::bigint")),
            64);
  EXPECT_THAT(store->Purge(), HoldsValue(0u));
  clock_.Advance(1s);
  EXPECT_THAT(store->Purge(), HoldsValue(static_cast<std::uint64_t>(kRecords)));
  EXPECT_EQ(Value("SELECT count(*) FROM " + Table("records")), "1");
}

TEST_F(PostgresStoreTest, ReaperReclaimsInTheBackground) {
  PostgresStoreOptions o = options_;
  o.reclaim_interval = 5ms;
  o.reclaim_batch = 7;
  std::unique_ptr<Store> store = Open(o);
  ASSERT_NE(store, nullptr);
  for (const std::string& key : Keys(50)) {
    const Acquired a = ExpectAcquired(store->Begin({.scope = "r", .key = key}));
    ASSERT_THAT(store->Complete({.scope = "r", .key = key, .token = a.token, .retention = 1s}),
                IsApplied());
  }
  const Acquired kept = ExpectAcquired(store->Begin({.scope = "r", .key = "kept", .lease = 1h}));
  ASSERT_TRUE(store->OpenSession({.scope = "r", .client_id = "c", .ttl = 1s}).has_value());
  ExpectAcquired(store->BeginSequenced({.scope = "r", .client_id = "c", .seq = 1}));
  const Acquired v =
      ExpectAcquired(store->BeginVersioned({.scope = "r", .entity = "e", .version = 1}));
  ASSERT_THAT(
      store->CompleteVersioned({.scope = "r", .entity = "e", .token = v.token, .retention = 1s}),
      IsApplied());
  clock_.Advance(1s);
  const auto left = [&](std::string_view table) {
    return Value("SELECT count(*) FROM " + Table(table));
  };
  EXPECT_TRUE(Eventually([&] {
    return left("records") == "1" && left("sessions") == "0" && left("seq_records") == "0" &&
           left("entities") == "0";
  })) << "records "
      << left("records") << ", sessions " << left("sessions") << ", seq_records "
      << left("seq_records") << ", entities " << left("entities");
  EXPECT_THAT(store->Get("r", "kept"),
              HoldsValue(Optional(::testing::Field(&Record::token, kept.token))));
}

// ==== failing closed ==========================================================================

// A store on a server of the test's own, which the test stops, freezes and starts again.
class PostgresFailClosedTest : public ::testing::Test {
 protected:
  static constexpr std::chrono::milliseconds kTimeout = 1500ms;

  void SetUp() override {
    auto server = LocalPostgres::Start();
    ASSERT_TRUE(server.has_value()) << server.error().ToString();
    server_ = std::move(*server);
    options_.conninfo = server_->conninfo();
    options_.connect_timeout = kTimeout;
    options_.statement_timeout = kTimeout;
    options_.pool_size = 2;
    options_.max_transactions = 2;
    options_.reclaim_interval = 0ms;
    ASSERT_TRUE(InitPostgresSchema(options_).ok());
    auto store = OpenPostgresStore(options_);
    ASSERT_TRUE(store.has_value()) << store.error().ToString();
    store_ = std::move(*store);
  }

  // One begin/complete cycle on a new key.
  Status Cycle(const std::string& key) {
    const auto b = store_->Begin({.scope = "f", .key = key});
    if (!b) return b.error();
    if (!std::holds_alternative<Acquired>(*b)) return InternalError("not acquired: " + key);
    const auto c = store_->Complete(
        {.scope = "f", .key = key, .token = std::get<Acquired>(*b).token, .response = "r"});
    if (!c) return c.error();
    return *c == WriteAnswer::kApplied ? OkStatus() : InternalError("lease lost: " + key);
  }

  // Every kind of call answers kUnavailable, each within the timeouts (a call may wait for a
  // connection another call holds, then time out itself). The calls run side by side.
  void ExpectEveryCallUnavailable() {
    const std::vector<std::pair<const char*, std::function<Status()>>> calls = {
        {"Begin", [&] { return store_->Begin({.scope = "f", .key = "down"}).status(); }},
        {"Complete",
         [&] { return store_->Complete({.scope = "f", .key = "down", .token = 1}).status(); }},
        {"Get", [&] { return store_->Get("f", "k").status(); }},
        {"BeginBatch",
         [&] {
           return store_->BeginBatch(std::vector<BeginRequest>{{.scope = "f", .key = "b"}})[0]
               .status();
         }},
        {"List", [&] { return store_->List({}).status(); }},
        {"Stats", [&] { return store_->Stats().status(); }},
        {"Purge", [&] { return store_->Purge().status(); }},
    };
    std::vector<Status> got(calls.size());
    std::vector<std::chrono::steady_clock::duration> took(calls.size());
    RunConcurrently(static_cast<int>(calls.size()), [&](int i) {
      const auto t0 = std::chrono::steady_clock::now();
      got[static_cast<std::size_t>(i)] = calls[static_cast<std::size_t>(i)].second();
      took[static_cast<std::size_t>(i)] = std::chrono::steady_clock::now() - t0;
    });
    for (std::size_t i = 0; i < calls.size(); ++i) {
      EXPECT_EQ(got[i].code(), StatusCode::kUnavailable)
          << calls[i].first << ": " << got[i].ToString();
      EXPECT_LT(took[i], kTimeout * 2 + 1s) << calls[i].first;
    }
  }

  // Until the server answers again (the store reconnects by itself), then a run of cycles.
  void ExpectRecoveryWithoutReopening(const std::string& prefix) {
    int n = 0;
    EXPECT_TRUE(Eventually([&] { return Cycle(prefix + std::to_string(n++)).ok(); }, 60s));
    for (int i = 0; i < 50; ++i) {
      const Status s = Cycle(prefix + "after-" + std::to_string(i));
      EXPECT_TRUE(s.ok()) << s.ToString();
    }
    EXPECT_THAT(store_->Stats(),
                HoldsValue(::testing::Field(&StoreStats::completed, ::testing::Ge(50u))));
  }

  std::unique_ptr<LocalPostgres> server_;
  PostgresStoreOptions options_;
  std::unique_ptr<Store> store_;
};

TEST_F(PostgresFailClosedTest, StoppedServerIsUnavailableAndRecoveryNeedsNoReopen) {
  // Load from several threads; each thread stops after its first failure.
  std::atomic<int> ok{0};
  std::vector<Status> first_error(4);
  std::vector<std::thread> load;
  for (int t = 0; t < 4; ++t) {
    load.emplace_back([&, t] {
      for (int i = 0;; ++i) {
        const Status s = Cycle("load-" + std::to_string(t) + "-" + std::to_string(i));
        if (!s.ok()) {
          first_error[static_cast<std::size_t>(t)] = s;
          return;
        }
        ok.fetch_add(1);
      }
    });
  }
  ASSERT_TRUE(Eventually([&] { return ok.load() >= 100; }));
  ASSERT_TRUE(server_->Stop().ok());
  for (std::thread& t : load) t.join();
  for (const Status& s : first_error) {
    EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.ToString();
  }
  ExpectEveryCallUnavailable();
  ASSERT_TRUE(server_->Restart().ok());
  ExpectRecoveryWithoutReopening("restarted-");
}

// The pool's idle connections to a server that restarted are all dead: none may be handed to a
// call. They were, once each, since the server's farewell ("FATAL: terminating connection")
// made them look readable and healthy; behind idemd a completion that failed that way left its
// key IN_PROGRESS, and the client's retry after the lease charged a second time.
TEST_F(PostgresFailClosedTest, ARestartedServerIsUsedAgainWithoutAFailedCall) {
  // Fill the pool (and the group committer) with connections.
  RunConcurrently(4, [&](int t) {
    for (int i = 0; i < 20; ++i) {
      const Status s = Cycle("warm-" + std::to_string(t) + "-" + std::to_string(i));
      EXPECT_TRUE(s.ok()) << s.ToString();
    }
  });
  ASSERT_TRUE(server_->Stop().ok());
  ASSERT_TRUE(server_->Restart().ok());  // returns once the server takes connections
  for (int i = 0; i < 20; ++i) {
    const Status s = Cycle("after-restart-" + std::to_string(i));
    EXPECT_TRUE(s.ok()) << "call " << i << ": " << s.ToString();
  }
  RunConcurrently(4, [&](int t) {
    for (int i = 0; i < 5; ++i) {
      const Status s = Cycle("after-" + std::to_string(t) + "-" + std::to_string(i));
      EXPECT_TRUE(s.ok()) << s.ToString();
    }
  });
}

TEST_F(PostgresFailClosedTest, ServerThatStopsAnsweringIsUnavailableWithinTheTimeout) {
  ASSERT_TRUE(Cycle("before").ok());
  ASSERT_TRUE(server_->Freeze().ok());
  ExpectEveryCallUnavailable();
  // `idem store init` and the schema check at open: the connection is not made within
  // connect_timeout, so they fail then (they once waited a minute more, the schema changes'
  // own bound).
  for (const char* what : {"init", "version", "open"}) {
    const auto t0 = std::chrono::steady_clock::now();
    const Status s = what == std::string_view("init") ? InitPostgresSchema(options_)
                     : what == std::string_view("version")
                         ? PostgresSchemaVersion(options_).status()
                         : OpenPostgresStore(options_).status();
    EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.ToString();
    EXPECT_LT(std::chrono::steady_clock::now() - t0, kTimeout + 1s) << what;
  }
  ASSERT_TRUE(server_->Thaw().ok());
  ExpectRecoveryWithoutReopening("thawed-");
}

}  // namespace
}  // namespace idem
