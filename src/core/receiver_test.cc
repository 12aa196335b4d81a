#include "idem/receiver.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <barrier>
#include <memory>
#include <stdexcept>
#include <thread>
#include <vector>

#include "idem/stores/memory.h"
#include "tests/support/fake_clock.h"
#include "tests/support/faulty_store.h"

namespace idem {
namespace {

using std::chrono::milliseconds;
using ::testing::AllOf;
using testing::FakeClock;
using testing::FaultyStore;
using ::testing::HasSubstr;

class ReceiverTest : public ::testing::Test {
 protected:
  ReceiverTest() {
    MemoryStoreOptions o;
    o.clock = &clock_;
    o.reclaim_interval = milliseconds(0);
    store_ = NewMemoryStore(o);
  }
  ReceiverOptions Options() {
    ReceiverOptions o;
    o.scope = "payments";
    o.clock = &clock_;
    o.lease = milliseconds(1000);
    // The keeper sleeps in real time and reads the fake clock: left on, it could extend a
    // lease between a test's Advance and its next step. ReceiverKeptLease* test it.
    o.keep_leases = false;
    return o;
  }
  // Options() counted in metrics_.
  ReceiverOptions Counted() {
    ReceiverOptions o = Options();
    o.metrics = &metrics_;
    return o;
  }
  Handler Counting(std::string response = "ok") {
    return [this, response](const HandlerContext& c) {
      runs_.fetch_add(1);
      last_attempt_ = c.attempt;
      last_token_ = c.token;
      return HandlerResult{Outcome::kSuccess, response};
    };
  }

  FakeClock clock_;
  Registry registry_;
  Metrics metrics_{registry_, "payments"};
  std::unique_ptr<Store> store_;
  std::atomic<int> runs_{0};
  std::uint32_t last_attempt_ = 0;
  Token last_token_ = 0;
};

TEST_F(ReceiverTest, RunsOnceAndReplays) {
  Receiver r(*store_, Options());
  auto first = r.Receive({.key = "pay-1", .payload = "{}"}, Counting("charged"));
  ASSERT_TRUE(first) << first.error().ToString();
  EXPECT_EQ(first->delivery, Delivery::kExecuted);
  EXPECT_EQ(first->response, "charged");
  EXPECT_EQ(first->attempt, 1u);
  EXPECT_EQ(last_attempt_, 1u);
  EXPECT_NE(last_token_, 0u);
  for (int i = 0; i < 3; ++i) {
    auto again = r.Receive({.key = "pay-1", .payload = "{}"}, Counting("charged twice"));
    ASSERT_TRUE(again);
    EXPECT_EQ(again->delivery, Delivery::kReplayed);
    EXPECT_EQ(again->response, "charged");
  }
  EXPECT_EQ(runs_.load(), 1);
}

TEST_F(ReceiverTest, HandlerGetsScopeKeyPayload) {
  Receiver r(*store_, Options());
  auto res = r.Receive({.key = "k", .payload = "body"}, [](const HandlerContext& c) {
    EXPECT_EQ(c.scope, "payments");
    EXPECT_EQ(c.key, "k");
    EXPECT_EQ(c.payload, "body");
    return HandlerResult{};
  });
  ASSERT_TRUE(res);
}

TEST_F(ReceiverTest, RejectPolicyAnswersBusyWhileRunning) {
  Receiver r(*store_, Options());
  auto res = r.Receive({.key = "k"}, [&](const HandlerContext&) {
    auto inner = r.Receive({.key = "k"}, Counting());
    EXPECT_TRUE(inner);
    EXPECT_EQ(inner->delivery, Delivery::kBusy);
    return HandlerResult{Outcome::kSuccess, "outer"};
  });
  ASSERT_TRUE(res);
  EXPECT_EQ(res->delivery, Delivery::kExecuted);
  EXPECT_EQ(runs_.load(), 0);
}

TEST_F(ReceiverTest, WaitPolicyTakesOverAfterTheLeaseOfADeadWorker) {
  // Another process acquired the key and died: its lease is 200 ms.
  auto held = store_->Begin({"payments", "k", std::nullopt, milliseconds(200)});
  ASSERT_TRUE(held);
  ASSERT_TRUE(std::holds_alternative<Acquired>(*held));
  ReceiverOptions o = Options();
  o.busy_policy = BusyPolicy::kWait;
  o.busy_wait = milliseconds(5000);
  Receiver r(*store_, o);
  auto res = r.Receive({.key = "k"}, Counting());  // the fake clock advances while waiting
  ASSERT_TRUE(res);
  EXPECT_EQ(res->delivery, Delivery::kExecuted);
  EXPECT_EQ(res->attempt, 2u);
  EXPECT_EQ(runs_.load(), 1);
}

TEST_F(ReceiverTest, WaitPolicyIsBounded) {
  auto held = store_->Begin({"payments", "k", std::nullopt, milliseconds(3'600'000)});
  ASSERT_TRUE(held);
  ReceiverOptions o = Options();
  o.busy_policy = BusyPolicy::kWait;
  o.busy_wait = milliseconds(300);
  Receiver r(*store_, o);
  Timestamp start = clock_.Now();
  auto res = r.Receive({.key = "k"}, Counting());
  ASSERT_TRUE(res);
  EXPECT_EQ(res->delivery, Delivery::kBusy);
  EXPECT_GE(clock_.Now() - start, milliseconds(300));
  EXPECT_LT(clock_.Now() - start, milliseconds(400));
  EXPECT_EQ(runs_.load(), 0);
}

TEST_F(ReceiverTest, WaitPolicyReturnsTheOutcomeWhenTheHolderFinishes) {
  auto held = store_->Begin({"payments", "k", std::nullopt, milliseconds(3'600'000)});
  ASSERT_TRUE(held);
  Token token = std::get<Acquired>(*held).token;
  // A store wrapper that lets the holder finish after the waiter's second look.
  struct FinishingStore : FaultyStore {
    FinishingStore(Store& s, Token t) : FaultyStore(s), inner(s), token(t) {}
    Result<BeginAnswer> Begin(const BeginRequest& req) override {
      if (++begins == 3) {
        EXPECT_TRUE(inner.Complete({req.scope, req.key, token, Outcome::kSuccess, "theirs"}));
      }
      return FaultyStore::Begin(req);
    }
    Store& inner;
    Token token;
    int begins = 0;
  } finishing(*store_, token);
  ReceiverOptions o = Options();
  o.busy_policy = BusyPolicy::kWait;
  Receiver r(finishing, o);
  auto res = r.Receive({.key = "k"}, Counting());
  ASSERT_TRUE(res);
  EXPECT_EQ(res->delivery, Delivery::kReplayed);
  EXPECT_EQ(res->response, "theirs");
  EXPECT_EQ(runs_.load(), 0);
}

// Every delivery counts one answer (metrics.h): the first execution its Begin's, a follower
// that got its outcome idem_coalesced_total (no Begin), one after it finished the store's Replay.
TEST_F(ReceiverTest, CoalesceGivesEveryConcurrentDuplicateTheFirstOutcome) {
  ReceiverOptions o = Counted();
  o.busy_policy = BusyPolicy::kCoalesce;
  o.busy_wait = milliseconds(60'000);
  Receiver r(*store_, o);
  constexpr int kThreads = 16;
  std::atomic<int> arrived{0};
  std::vector<Result<Delivered>> results(kThreads, InternalError("not run"));
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i] {
      arrived.fetch_add(1);
      results[i] = r.Receive({.key = "order-7"}, [&](const HandlerContext&) {
        // Hold the execution until every duplicate has arrived.
        while (arrived.load() < kThreads) std::this_thread::yield();
        runs_.fetch_add(1);
        return HandlerResult{Outcome::kSuccess, "created"};
      });
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(runs_.load(), 1);
  int executed = 0;
  std::uint64_t coalesced = 0;
  std::uint64_t replayed = 0;
  for (auto& res : results) {
    ASSERT_TRUE(res) << res.error().ToString();
    EXPECT_THAT(res->delivery,
                ::testing::AnyOf(Delivery::kExecuted, Delivery::kCoalesced, Delivery::kReplayed));
    EXPECT_EQ(res->response, "created");
    executed += res->delivery == Delivery::kExecuted;
    coalesced += res->delivery == Delivery::kCoalesced;
    replayed += res->delivery == Delivery::kReplayed;
  }
  EXPECT_EQ(executed, 1);
  EXPECT_EQ(metrics_.begin_acquired->Value(), 1u);
  EXPECT_EQ(metrics_.coalesced->Value(), coalesced);
  EXPECT_EQ(metrics_.begin_replay->Value(), replayed);
  EXPECT_EQ(metrics_.begin_busy->Value(), 0u);
  EXPECT_EQ(metrics_.store_begin_seconds->Count(), 1 + replayed);  // followers make no Begin
  EXPECT_EQ(metrics_.handler_seconds->Count(), 1u);
  EXPECT_EQ(metrics_.complete_success->Value(), 1u);
}

// A duplicate with another payload is another request: it is not handed the first one's
// outcome but answered Conflict, as the store answers it (SPEC §2).
TEST_F(ReceiverTest, CoalesceNeverHandsADifferentPayloadTheFirstOutcome) {
  ReceiverOptions o = Options();
  o.busy_policy = BusyPolicy::kCoalesce;
  o.busy_wait = milliseconds(60'000);
  o.fingerprint = FingerprintMode::kBytes;
  Receiver r(*store_, o);
  std::atomic<bool> first_running{false};
  std::atomic<bool> second_done{false};
  std::thread first([&] {
    auto res = r.Receive({.key = "order-8", .payload = "amount=5"}, [&](const HandlerContext&) {
      first_running = true;
      while (!second_done.load()) std::this_thread::yield();
      runs_.fetch_add(1);
      return HandlerResult{Outcome::kSuccess, "charged 5"};
    });
    ASSERT_TRUE(res) << res.error().ToString();
    EXPECT_EQ(res->delivery, Delivery::kExecuted);
  });
  while (!first_running.load()) std::this_thread::yield();
  auto second = r.Receive({.key = "order-8", .payload = "amount=500"}, Counting("charged 500"));
  second_done = true;
  first.join();
  ASSERT_TRUE(second) << second.error().ToString();
  EXPECT_EQ(second->delivery, Delivery::kConflict);
  EXPECT_EQ(second->response, "");
  EXPECT_EQ(runs_.load(), 1);
}

// A store that throws from its first Begin (a user's store, or bad_alloc).
struct ThrowingOnceStore : FaultyStore {
  using FaultyStore::FaultyStore;
  Result<BeginAnswer> Begin(const BeginRequest& req) override {
    if (!thrown.exchange(true)) throw std::runtime_error("store blew up");
    return FaultyStore::Begin(req);
  }
  std::atomic<bool> thrown{false};
};

// The exception reaches the caller, and the key is not left to a first execution that never
// ends (every later caller would wait it out and answer Busy).
TEST_F(ReceiverTest, CoalesceRecoversFromAFirstExecutionThatThrew) {
  ThrowingOnceStore throwing(*store_);
  ReceiverOptions o = Options();
  o.busy_policy = BusyPolicy::kCoalesce;
  o.busy_wait = milliseconds(50);
  Receiver r(throwing, o);
  EXPECT_THROW((void)r.Receive({.key = "order-9"}, Counting()), std::runtime_error);
  auto again = r.Receive({.key = "order-9"}, Counting());
  ASSERT_TRUE(again) << again.error().ToString();
  EXPECT_EQ(again->delivery, Delivery::kExecuted);
  EXPECT_EQ(runs_.load(), 1);
}

// Durations the store would refuse are refused before the handler runs, not after it.
TEST_F(ReceiverTest, OutOfRangeDurationsAreRefusedBeforeAnything) {
  for (auto set : std::vector<void (*)(ReceiverOptions&)>{
           [](ReceiverOptions& o) { o.lease = milliseconds(0); },
           [](ReceiverOptions& o) { o.retention = milliseconds(-1); },
           [](ReceiverOptions& o) { o.failure_retention = milliseconds(0); },
           [](ReceiverOptions& o) { o.failure_retention = std::chrono::hours(24 * 366 * 101); }}) {
    ReceiverOptions o = Options();
    o.failure_policy = FailurePolicy::kRemember;
    set(o);
    Receiver r(*store_, o);
    auto res = r.Receive({.key = "order-10"}, Counting());
    ASSERT_FALSE(res);
    EXPECT_EQ(res.error().code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(res.error().message(), ::testing::HasSubstr("receiver options"));
  }
  EXPECT_EQ(runs_.load(), 0);
  auto record = store_->Get("payments", "order-10");
  ASSERT_TRUE(record);
  EXPECT_EQ(*record, std::nullopt);
}

TEST_F(ReceiverTest, ManyThreadsManyKeysExecuteEachOnce) {
  Receiver r(*store_, Options());
  constexpr int kThreads = 8, kKeys = 500;
  std::vector<std::atomic<int>> per_key(kKeys);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (int k = 0; k < kKeys; ++k) {
        std::string key = "key-" + std::to_string(k);
        auto res = r.Receive({.key = key}, [&](const HandlerContext&) {
          per_key[k].fetch_add(1);
          return HandlerResult{};
        });
        EXPECT_TRUE(res);
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int k = 0; k < kKeys; ++k) EXPECT_EQ(per_key[k].load(), 1) << k;
}

TEST_F(ReceiverTest, FailureIsReleasedByDefaultAndRunsAgain) {
  Receiver r(*store_, Options());
  int calls = 0;
  auto failing = [&](const HandlerContext&) {
    ++calls;
    return HandlerResult{Outcome::kFailure, "card declined"};
  };
  auto first = r.Receive({.key = "k"}, failing);
  ASSERT_TRUE(first);
  EXPECT_EQ(first->delivery, Delivery::kExecuted);
  EXPECT_EQ(first->outcome, Outcome::kFailure);
  EXPECT_TRUE(first->released);
  auto got = store_->Get("payments", "k");
  ASSERT_TRUE(got);
  EXPECT_FALSE(got->has_value());
  auto second = r.Receive({.key = "k"}, Counting());
  ASSERT_TRUE(second);
  EXPECT_EQ(second->delivery, Delivery::kExecuted);
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(runs_.load(), 1);
}

TEST_F(ReceiverTest, RememberedFailureReplaysUntilItsRetention) {
  ReceiverOptions o = Options();
  o.failure_policy = FailurePolicy::kRemember;
  o.failure_retention = milliseconds(10'000);
  Receiver r(*store_, o);
  auto first = r.Receive({.key = "k"}, [](const HandlerContext&) {
    return HandlerResult{Outcome::kFailure, "invalid account"};
  });
  ASSERT_TRUE(first);
  EXPECT_FALSE(first->released);
  auto again = r.Receive({.key = "k"}, Counting());
  ASSERT_TRUE(again);
  EXPECT_EQ(again->delivery, Delivery::kReplayed);
  EXPECT_EQ(again->outcome, Outcome::kFailure);
  EXPECT_EQ(again->response, "invalid account");
  clock_.Advance(milliseconds(10'000));
  auto later = r.Receive({.key = "k"}, Counting());
  ASSERT_TRUE(later);
  EXPECT_EQ(later->delivery, Delivery::kExecuted);
  EXPECT_EQ(runs_.load(), 1);
}

TEST_F(ReceiverTest, ThrowingHandlerIsAFailure) {
  Receiver r(*store_, Options());
  auto res = r.Receive({.key = "k"}, [](const HandlerContext&) -> HandlerResult {
    throw std::runtime_error("db timeout");
  });
  ASSERT_TRUE(res);
  EXPECT_EQ(res->outcome, Outcome::kFailure);
  EXPECT_TRUE(res->released);
  EXPECT_THAT(res->response, HasSubstr("db timeout"));
}

TEST_F(ReceiverTest, StoreDownFailsClosedWithoutRunningTheHandler) {
  FaultyStore faulty(*store_);
  faulty.Fail(FaultyStore::kBegin);
  Receiver r(faulty, Options());
  auto res = r.Receive({.key = "k"}, Counting());
  ASSERT_FALSE(res);
  EXPECT_EQ(res.error().code(), StatusCode::kUnavailable);
  EXPECT_THAT(res.error().message(), HasSubstr("handler not run"));
  EXPECT_EQ(runs_.load(), 0);
}

TEST_F(ReceiverTest, LostCompletionIsRetryableAndRunsAgainAfterTheLease) {
  FaultyStore faulty(*store_);
  faulty.Fail(FaultyStore::kComplete);
  Receiver r(faulty, Options());
  auto res = r.Receive({.key = "k"}, Counting());
  ASSERT_FALSE(res);
  EXPECT_EQ(res.error().code(), StatusCode::kUnavailable);
  EXPECT_EQ(runs_.load(), 1);
  faulty.Heal();
  auto busy = r.Receive({.key = "k"}, Counting());
  ASSERT_TRUE(busy);
  EXPECT_EQ(busy->delivery, Delivery::kBusy);
  clock_.Advance(milliseconds(1000));
  auto retry = r.Receive({.key = "k"}, Counting());
  ASSERT_TRUE(retry);
  EXPECT_EQ(retry->delivery, Delivery::kExecuted);
  EXPECT_EQ(retry->attempt, 2u);
  EXPECT_EQ(last_attempt_, 2u);
}

// A completion (or a release) that fails once or twice is tried again: the handler ran, and
// an outcome left unstored would run it again on the next delivery.
TEST_F(ReceiverTest, AWriteTheStoreFailsTwiceIsTriedAgain) {
  FaultyStore faulty(*store_);
  Registry registry;
  Metrics metrics(registry, "payments");
  ReceiverOptions o = Options();
  o.metrics = &metrics;
  Receiver r(faulty, o);
  faulty.FailTimes(FaultyStore::kComplete, 2);
  auto res = r.Receive({.key = "k"}, Counting());
  ASSERT_TRUE(res) << res.error().ToString();
  EXPECT_EQ(res->delivery, Delivery::kExecuted);
  EXPECT_EQ(faulty.refused(), 2u);
  EXPECT_EQ(metrics.store_errors->Value(), 2u);
  auto again = r.Receive({.key = "k"}, Counting());
  ASSERT_TRUE(again);
  EXPECT_EQ(again->delivery, Delivery::kReplayed);
  EXPECT_EQ(runs_.load(), 1);

  faulty.FailTimes(FaultyStore::kRelease, 1);
  auto failed = r.Receive({.key = "f"}, [](const HandlerContext&) {
    return HandlerResult{.outcome = Outcome::kFailure};
  });
  ASSERT_TRUE(failed) << failed.error().ToString();
  EXPECT_TRUE(failed->released);
  auto rerun = r.Receive({.key = "f"}, Counting());
  ASSERT_TRUE(rerun);
  EXPECT_EQ(rerun->delivery, Delivery::kExecuted);  // released, so run at once: not Busy
}

// A response the store refuses (over its limit) after the handler ran: the key was left
// IN_PROGRESS, and after each lease the next delivery charged again. Now a failure saying why is
// stored in its place, once (the refusal is not retried), and duplicates replay it.
TEST_F(ReceiverTest, AnOutcomeTheStoreRefusesIsStoredAsAFailureNotRunAgain) {
  FaultyStore faulty(*store_);
  faulty.RefuseResponsesOver(300);  // what is stored instead is shorter
  Registry registry;
  Metrics metrics(registry, "payments");
  ReceiverOptions o = Options();
  o.metrics = &metrics;
  Receiver r(faulty, o);
  const auto big = [&](const HandlerContext&) {
    ++runs_;
    return HandlerResult{Outcome::kSuccess, std::string(1000, 'r')};
  };
  auto res = r.Receive({.key = "k"}, big);
  ASSERT_FALSE(res);
  EXPECT_EQ(res.error().code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(res.error().message(),
              AllOf(HasSubstr("handler ran (attempt 1)"), HasSubstr("1000 bytes"),
                    HasSubstr("will not run again")));
  EXPECT_EQ(metrics.complete_failure->Value(), 1u);
  EXPECT_EQ(metrics.store_errors->Value(), 0u);  // the refusal was not retried
  clock_.Advance(milliseconds(5000));            // past any lease
  auto again = r.Receive({.key = "k"}, big);
  ASSERT_TRUE(again) << again.error().ToString();
  EXPECT_EQ(again->delivery, Delivery::kReplayed);
  EXPECT_EQ(again->outcome, Outcome::kFailure);
  EXPECT_THAT(again->response, AllOf(HasSubstr("the handler ran"), HasSubstr("1000-byte response"),
                                     HasSubstr("at most 300")));
  EXPECT_EQ(runs_.load(), 1);
}

// When even the shorter failure is refused, the key stays IN_PROGRESS and the caller hears why;
// a refused input is not a store that failed to answer, so no store error is counted.
TEST_F(ReceiverTest, AnOutcomeRefusedTwiceIsNotAStoreError) {
  FaultyStore faulty(*store_);
  faulty.RefuseResponsesOver(10);  // shorter than the failure text stored in its place
  Registry registry;
  Metrics metrics(registry, "payments");
  ReceiverOptions o = Options();
  o.metrics = &metrics;
  Receiver r(faulty, o);
  auto res = r.Receive({.key = "k"}, [&](const HandlerContext&) {
    ++runs_;
    return HandlerResult{Outcome::kSuccess, std::string(1000, 'r')};
  });
  ASSERT_FALSE(res);
  EXPECT_EQ(res.error().code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(res.error().message(), HasSubstr("stays in progress"));
  EXPECT_EQ(metrics.store_errors->Value(), 0u);
  EXPECT_EQ(metrics.complete_failure->Value(), 0u);
  EXPECT_EQ(runs_.load(), 1);
}

TEST_F(ReceiverTest, LeaseLostToANewerWorkerIsAborted) {
  Receiver r(*store_, Options());
  auto res = r.Receive({.key = "k"}, [&](const HandlerContext&) {
    clock_.Advance(milliseconds(1500));  // this handler overran its lease
    auto other = store_->Begin({"payments", "k", std::nullopt, milliseconds(1000)});
    EXPECT_TRUE(other && std::holds_alternative<Acquired>(*other));
    return HandlerResult{};
  });
  ASSERT_FALSE(res);
  EXPECT_EQ(res.error().code(), StatusCode::kAborted);
}

// keep_leases, on the system clock: a handler three times as long as its 500 ms lease keeps
// the key (another worker's Begin midway is Busy) and completes; without the keeper the other
// worker takes the key over and this one's completion is refused.
std::vector<std::string> RunLongHandler(Store& store, bool keep_leases, Result<Delivered>* out) {
  ReceiverOptions o;
  o.scope = "payments";
  o.lease = milliseconds(500);
  o.keep_leases = keep_leases;
  Receiver r(store, o);
  std::vector<std::string> answers;
  *out = r.Receive({.key = "long"}, [&](const HandlerContext&) {
    for (int i = 0; i < 2; ++i) {
      std::this_thread::sleep_for(milliseconds(700));
      auto other = store.Begin({"payments", "long", std::nullopt, milliseconds(60'000)});
      answers.push_back(other ? std::string(BeginAnswerName(*other)) : "error");
    }
    return HandlerResult{Outcome::kSuccess, "charged"};
  });
  return answers;
}

TEST(ReceiverKeptLeaseTest, AHandlerLongerThanTheLeaseKeepsItsKey) {
  auto store = NewMemoryStore({.reclaim_interval = milliseconds(0)});
  Result<Delivered> res = Delivered{};
  EXPECT_EQ(RunLongHandler(*store, true, &res), (std::vector<std::string>{"busy", "busy"}));
  ASSERT_TRUE(res) << res.error().ToString();
  EXPECT_EQ(res->delivery, Delivery::kExecuted);
  auto rec = store->Get("payments", "long");
  ASSERT_TRUE(rec && rec->has_value());
  EXPECT_EQ((*rec)->state, RecordState::kCompleted);
  EXPECT_EQ((*rec)->response, "charged");
}

TEST(ReceiverKeptLeaseTest, WithoutTheKeeperTheKeyIsTakenOver) {
  auto store = NewMemoryStore({.reclaim_interval = milliseconds(0)});
  Result<Delivered> res = Delivered{};
  const std::vector<std::string> answers = RunLongHandler(*store, false, &res);
  ASSERT_FALSE(answers.empty());
  EXPECT_EQ(answers[0], "acquired");
  ASSERT_FALSE(res);
  EXPECT_EQ(res.error().code(), StatusCode::kAborted);
}

// keep_leases_for bounds a hung handler: with a 400 ms lease, extensions stop 1 s into the
// handler, so another worker's Begin is Busy at 0.9 s and takes the key over at 2 s (the last
// extension, before 1 s, is good until 1.4 s at most); the handler's completion is refused.
TEST(ReceiverKeptLeaseTest, PastKeepLeasesForTheKeyIsTakenOver) {
  auto store = NewMemoryStore({.reclaim_interval = milliseconds(0)});
  ReceiverOptions o;
  o.scope = "payments";
  o.lease = milliseconds(400);
  o.keep_leases_for = milliseconds(1'000);
  Receiver r(*store, o);
  std::vector<std::string> answers;
  auto res = r.Receive({.key = "hung"}, [&](const HandlerContext&) {
    for (const milliseconds wait : {milliseconds(900), milliseconds(1'100)}) {
      std::this_thread::sleep_for(wait);
      auto other = store->Begin({"payments", "hung", std::nullopt, milliseconds(60'000)});
      answers.push_back(other ? std::string(BeginAnswerName(*other)) : "error");
    }
    return HandlerResult{Outcome::kSuccess, "charged"};
  });
  EXPECT_EQ(answers, (std::vector<std::string>{"busy", "acquired"}));
  ASSERT_FALSE(res);
  EXPECT_EQ(res.error().code(), StatusCode::kAborted);

  o.keep_leases_for = milliseconds(-1);
  Receiver bad(*store, o);
  auto refused =
      bad.Receive({.key = "other"}, [](const HandlerContext&) { return HandlerResult{}; });
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(refused.error().message(), "receiver options: keep_leases_for is negative");

  // Each duration names itself (a bad failure_retention was "retention must be positive"), and
  // a negative busy_wait is refused (it waited not at all).
  o.keep_leases_for = milliseconds(0);
  o.failure_retention = milliseconds(-5);
  auto named = Receiver(*store, o).Receive({.key = "x"},
                                           [](const HandlerContext&) { return HandlerResult{}; });
  ASSERT_FALSE(named);
  EXPECT_EQ(named.error().message(),
            "receiver options: failure_retention must be positive, got -5ms");
  o.failure_retention = milliseconds(1000);
  o.busy_wait = milliseconds(-1);
  auto negative = Receiver(*store, o).Receive(
      {.key = "x"}, [](const HandlerContext&) { return HandlerResult{}; });
  ASSERT_FALSE(negative);
  EXPECT_EQ(negative.error().message(), "receiver options: busy_wait is negative, got -1ms");
}

// Many concurrent long handlers share the receiver's one keeper; each keeps its own key.
TEST(ReceiverKeptLeaseTest, ConcurrentHandlersEachKeepTheirKey) {
  auto store = NewMemoryStore({.reclaim_interval = milliseconds(0)});
  ReceiverOptions o;
  o.scope = "payments";
  o.lease = milliseconds(400);
  Receiver r(*store, o);
  constexpr int kThreads = 8;
  std::atomic<int> taken_over{0};
  std::atomic<int> executed{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      const std::string key = "k" + std::to_string(t);
      // Short and long handlers interleave: holds come and go while others are kept.
      for (int round = 0; round < 3; ++round) {
        const std::string k = key + "-" + std::to_string(round);
        auto res = r.Receive({.key = k}, [&](const HandlerContext&) {
          std::this_thread::sleep_for(milliseconds(round == 1 ? 1'000 : 5));
          auto other = store->Begin({"payments", k, std::nullopt, milliseconds(60'000)});
          if (other && std::holds_alternative<Acquired>(*other)) taken_over.fetch_add(1);
          return HandlerResult{};
        });
        if (res && res->delivery == Delivery::kExecuted) executed.fetch_add(1);
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(taken_over.load(), 0);
  EXPECT_EQ(executed.load(), 3 * kThreads);
}

TEST_F(ReceiverTest, KeyFromHeaderJsonPointerOrFingerprint) {
  ReceiverOptions o = Options();
  o.key_source = KeySource::Header("Idempotency-Key");
  Receiver by_header(*store_, o);
  std::vector<Header> headers = {{"content-type", "json"}, {"idempotency-key", "h-1"}};
  auto a = by_header.Receive({.headers = headers}, Counting());
  ASSERT_TRUE(a);
  EXPECT_EQ(a->key, "h-1");
  auto missing = by_header.Receive({.payload = "x"}, Counting());
  ASSERT_FALSE(missing);
  EXPECT_EQ(missing.error().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(missing.error().message(), HasSubstr("header Idempotency-Key is missing"));

  o.key_source = KeySource::JsonPointer("/payment/id");
  Receiver by_field(*store_, o);
  auto b = by_field.Receive({.payload = R"({"payment":{"id":"p-9","amount":5}})"}, Counting());
  ASSERT_TRUE(b) << b.error().ToString();
  EXPECT_EQ(b->key, "p-9");
  auto no_field = by_field.Receive({.payload = R"({"payment":{}})"}, Counting());
  ASSERT_FALSE(no_field);
  EXPECT_EQ(no_field.error().code(), StatusCode::kInvalidArgument);

  o.key_source = KeySource::Fingerprint();
  o.fingerprint = FingerprintMode::kJson;
  Receiver by_fp(*store_, o);
  auto c1 = by_fp.Receive({.payload = R"({"a":1,"b":2})"}, Counting());
  auto c2 = by_fp.Receive({.payload = R"({ "b":2, "a":1.0 })"}, Counting());
  ASSERT_TRUE(c1 && c2);
  EXPECT_EQ(c1->key, c2->key);
  EXPECT_EQ(c1->key.size(), 64u);
  EXPECT_EQ(c2->delivery, Delivery::kReplayed);
}

TEST_F(ReceiverTest, BadKeysAndPayloadsAreSpecificErrors) {
  ReceiverOptions o = Options();
  o.max_key_bytes = 8;
  o.fingerprint = FingerprintMode::kJson;
  Receiver r(*store_, o);
  auto empty = r.Receive({.key = "", .payload = "{}"}, Counting());
  ASSERT_FALSE(empty);
  EXPECT_EQ(empty.error().message(), "key is empty");
  auto too_long = r.Receive({.key = "123456789", .payload = "{}"}, Counting());
  ASSERT_FALSE(too_long);
  EXPECT_EQ(too_long.error().message(), "key is 9 bytes; the limit is 8");
  auto bad_json = r.Receive({.key = "k", .payload = "{\"a\":}"}, Counting());
  ASSERT_FALSE(bad_json);
  EXPECT_EQ(bad_json.error().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(bad_json.error().message(), HasSubstr("payload"));
  EXPECT_EQ(runs_.load(), 0);
}

// KeyOf says which kind of refusal it made, so a consumer can dead-letter with the right
// reason without reading error texts; a header's key is a view into the message.
TEST_F(ReceiverTest, KeyOfNamesTheKindOfRefusal) {
  using Fault = Receiver::KeyFault;
  const auto fault_of = [](const Receiver& r, const Message& m) {
    std::string storage;
    Fault fault = Fault::kBadKey;
    auto key = r.KeyOf(m, storage, &fault);
    EXPECT_FALSE(key.has_value());
    return fault;
  };
  ReceiverOptions o = Options();
  o.max_key_bytes = 8;
  o.key_source = KeySource::Header("Idempotency-Key");
  const Receiver by_header(*store_, o);
  std::vector<Header> headers = {{"Idempotency-Key", "h-1"}};
  std::string storage;
  auto view = by_header.KeyOf({.headers = headers}, storage);
  ASSERT_TRUE(view.has_value());
  EXPECT_EQ(view->data(), headers[0].second.data());
  EXPECT_TRUE(storage.empty());
  EXPECT_EQ(fault_of(by_header, {.payload = "x"}), Fault::kNoKey);
  headers = {{"idempotency-key", "123456789"}};
  EXPECT_EQ(fault_of(by_header, {.headers = headers}), Fault::kBadKey);
  headers = {{"IDEMPOTENCY-KEY", ""}};
  EXPECT_EQ(fault_of(by_header, {.headers = headers}), Fault::kBadKey);

  o.key_source = KeySource::JsonPointer("/id");
  const Receiver by_field(*store_, o);
  EXPECT_EQ(fault_of(by_field, {.payload = R"({"other":1})"}), Fault::kNoKey);
  EXPECT_EQ(fault_of(by_field, {.payload = R"({"id":)"}), Fault::kBadPayload);
  auto made = by_field.KeyOf({.payload = R"({"id":"p-9"})"}, storage);
  ASSERT_TRUE(made.has_value());
  EXPECT_EQ(*made, "p-9");
  EXPECT_EQ(made->data(), storage.data());

  o.key_source = KeySource::Fingerprint();
  o.fingerprint = FingerprintMode::kJson;
  o.max_key_bytes = 255;
  const Receiver by_fp(*store_, o);
  EXPECT_EQ(fault_of(by_fp, {.payload = "[1,"}), Fault::kBadPayload);
}

TEST_F(ReceiverTest, SameKeyDifferentPayloadIsAConflict) {
  ReceiverOptions o = Options();
  o.fingerprint = FingerprintMode::kBytes;
  Receiver r(*store_, o);
  ASSERT_TRUE(r.Receive({.key = "k", .payload = "amount=5"}, Counting()));
  auto other = r.Receive({.key = "k", .payload = "amount=500"}, Counting());
  ASSERT_TRUE(other);
  EXPECT_EQ(other->delivery, Delivery::kConflict);
  EXPECT_EQ(runs_.load(), 1);
}

TEST_F(ReceiverTest, CountsEveryAnswer) {
  Registry registry;
  Metrics metrics(registry, "payments");
  ReceiverOptions o = Options();
  o.metrics = &metrics;
  o.fingerprint = FingerprintMode::kBytes;
  Receiver r(*store_, o);
  ASSERT_TRUE(r.Receive({.key = "a", .payload = "1"}, Counting()));
  ASSERT_TRUE(r.Receive({.key = "a", .payload = "1"}, Counting()));
  ASSERT_TRUE(r.Receive({.key = "a", .payload = "2"}, Counting()));
  ASSERT_TRUE(r.Receive({.key = "b", .payload = "1"}, [](const HandlerContext&) {
    return HandlerResult{Outcome::kFailure, ""};
  }));
  EXPECT_EQ(metrics.begin_acquired->Value(), 2u);
  EXPECT_EQ(metrics.begin_replay->Value(), 1u);
  EXPECT_EQ(metrics.begin_conflict->Value(), 1u);
  EXPECT_EQ(metrics.complete_success->Value(), 1u);
  EXPECT_EQ(metrics.releases->Value(), 1u);
  EXPECT_EQ(metrics.handler_seconds->Count(), 2u);
  EXPECT_THAT(registry.RenderPrometheus(),
              HasSubstr("idem_begin_total{scope=\"payments\",answer=\"replay\"} 1"));
}

// A delivery that waits out a busy key polls the store many times; idem_begin_total counts the
// answer it ended with, once, so that replays / begins stays the duplicate rate.
TEST_F(ReceiverTest, AWaitCountsTheAnswerItEndedWithOnce) {
  Registry registry;
  Metrics metrics(registry, "payments");
  auto held = store_->Begin({"payments", "k", std::nullopt, milliseconds(3'600'000)});
  ASSERT_TRUE(held);
  ReceiverOptions o = Options();
  o.metrics = &metrics;
  o.busy_policy = BusyPolicy::kWait;
  o.busy_wait = milliseconds(300);
  Receiver r(*store_, o);
  auto gave_up = r.Receive({.key = "k"}, Counting());
  ASSERT_TRUE(gave_up);
  EXPECT_EQ(gave_up->delivery, Delivery::kBusy);
  EXPECT_EQ(metrics.begin_busy->Value(), 1u);
  EXPECT_GT(metrics.store_begin_seconds->Count(), 2u);  // it did poll

  ASSERT_TRUE(store_->Complete(
      {"payments", "k", std::get<Acquired>(*held).token, Outcome::kSuccess, "theirs"}));
  auto replayed = r.Receive({.key = "k"}, Counting());
  ASSERT_TRUE(replayed);
  EXPECT_EQ(replayed->delivery, Delivery::kReplayed);
  EXPECT_EQ(metrics.begin_busy->Value(), 1u);
  EXPECT_EQ(metrics.begin_replay->Value(), 1u);
}

// A follower that waits out busy_wait answers Busy: it was not counted at all (a delivery with
// no answer on /metrics).
TEST_F(ReceiverTest, ACoalescedFollowerThatGivesUpCountsBusy) {
  ReceiverOptions o = Counted();
  o.busy_policy = BusyPolicy::kCoalesce;
  o.busy_wait = milliseconds(20);  // real time, for a follower
  Receiver r(*store_, o);
  std::atomic<bool> first_running{false};
  std::atomic<bool> follower_done{false};
  std::thread first([&] {
    auto res = r.Receive({.key = "order-8"}, [&](const HandlerContext&) {
      first_running = true;
      while (!follower_done.load()) std::this_thread::yield();
      return HandlerResult{Outcome::kSuccess, "done"};
    });
    ASSERT_TRUE(res) << res.error().ToString();
    EXPECT_EQ(res->delivery, Delivery::kExecuted);
  });
  while (!first_running.load()) std::this_thread::yield();
  auto follower = r.Receive({.key = "order-8"}, Counting());
  follower_done = true;
  first.join();
  ASSERT_TRUE(follower) << follower.error().ToString();
  EXPECT_EQ(follower->delivery, Delivery::kBusy);
  EXPECT_EQ(metrics_.begin_busy->Value(), 1u);
  EXPECT_EQ(metrics_.begin_acquired->Value(), 1u);
  EXPECT_EQ(metrics_.coalesced->Value(), 0u);
}

// idem_store_op_seconds observes each store call once: every try of a retried completion or
// release (it observed a retried completion once, and releases never).
TEST_F(ReceiverTest, StoreOpTimeIsObservedOncePerStoreCall) {
  FaultyStore faulty(*store_);
  ReceiverOptions o = Counted();
  Receiver r(faulty, o);
  faulty.FailTimes(FaultyStore::kComplete, 2);
  ASSERT_TRUE(r.Receive({.key = "k"}, Counting()));
  EXPECT_EQ(metrics_.store_begin_seconds->Count(), 1u);
  EXPECT_EQ(metrics_.store_complete_seconds->Count(), 3u);
  EXPECT_EQ(metrics_.store_release_seconds->Count(), 0u);
  EXPECT_EQ(metrics_.store_errors->Value(), 2u);
  EXPECT_EQ(metrics_.complete_success->Value(), 1u);

  faulty.FailTimes(FaultyStore::kRelease, 1);
  auto failed = r.Receive({.key = "f"}, [](const HandlerContext&) {
    return HandlerResult{.outcome = Outcome::kFailure};
  });
  ASSERT_TRUE(failed) << failed.error().ToString();
  EXPECT_EQ(metrics_.store_release_seconds->Count(), 2u);
  EXPECT_EQ(metrics_.store_complete_seconds->Count(), 3u);
  EXPECT_EQ(metrics_.releases->Value(), 1u);
  EXPECT_EQ(metrics_.store_errors->Value(), 3u);
  EXPECT_EQ(metrics_.handler_seconds->Count(), 2u);
  const std::string text = registry_.RenderPrometheus();
  EXPECT_THAT(text,
              HasSubstr("idem_store_op_seconds_count{scope=\"payments\",op=\"release\"} 2\n"));
  EXPECT_THAT(text,
              HasSubstr("idem_store_op_seconds_count{scope=\"payments\",op=\"complete\"} 3\n"));
}

// Every fail-closed path counts each store call that failed, and nothing else: begin (the
// handler does not run), a completion whose three tries failed, a release likewise, a
// versioned and a client's begin.
TEST_F(ReceiverTest, EveryFailClosedPathCountsItsStoreErrors) {
  FaultyStore faulty(*store_);
  ReceiverOptions o = Counted();
  Receiver r(faulty, o);
  faulty.Fail(FaultyStore::kBegin | FaultyStore::kVersion | FaultyStore::kSession);
  ASSERT_FALSE(r.Receive({.key = "k"}, Counting()));
  ASSERT_FALSE(r.Receive({.entity = "e", .version = 1}, Counting()));
  ASSERT_FALSE(r.Receive({.client_id = "c", .seq = 1}, Counting()));
  EXPECT_EQ(runs_.load(), 0);
  EXPECT_EQ(metrics_.store_errors->Value(), 3u);
  EXPECT_EQ(metrics_.store_begin_seconds->Count(), 3u);

  faulty.Fail(FaultyStore::kComplete);
  ASSERT_FALSE(r.Receive({.key = "c"}, Counting()));
  EXPECT_EQ(metrics_.store_errors->Value(), 6u);
  faulty.Fail(FaultyStore::kRelease);
  ASSERT_FALSE(r.Receive({.key = "r"}, [](const HandlerContext&) {
    return HandlerResult{.outcome = Outcome::kFailure};
  }));
  EXPECT_EQ(metrics_.store_errors->Value(), 9u);
  EXPECT_EQ(metrics_.begin_acquired->Value(), 2u);
  EXPECT_EQ(metrics_.complete_success->Value() + metrics_.complete_failure->Value(), 0u);
  EXPECT_EQ(metrics_.releases->Value(), 0u);
}

// A takeover is an Acquired over an expired lease (attempt 2): counted once, with its acquire. A
// key released after a failure is absent, so its next run is attempt 1 and no takeover. A
// remembered failure counts a failed completion, and its duplicate a replay. A completion that
// lost the lease counts lease-lost, not a completion.
TEST_F(ReceiverTest, CountsTakeoversRememberedFailuresAndLostLeases) {
  ReceiverOptions o = Counted();
  Receiver r(*store_, o);
  ASSERT_TRUE(store_->Begin({"payments", "dead", std::nullopt, milliseconds(1000)}));
  clock_.Advance(milliseconds(1000));
  auto taken = r.Receive({.key = "dead"}, Counting());
  ASSERT_TRUE(taken);
  EXPECT_EQ(taken->attempt, 2u);
  EXPECT_EQ(metrics_.takeovers->Value(), 1u);
  EXPECT_EQ(metrics_.begin_acquired->Value(), 1u);

  const Handler failing = [](const HandlerContext&) {
    return HandlerResult{Outcome::kFailure, "no"};
  };
  ASSERT_TRUE(r.Receive({.key = "f"}, failing));
  ASSERT_TRUE(r.Receive({.key = "f"}, failing));
  EXPECT_EQ(metrics_.releases->Value(), 2u);
  EXPECT_EQ(metrics_.takeovers->Value(), 1u);

  ReceiverOptions remember = o;
  remember.failure_policy = FailurePolicy::kRemember;
  Receiver rr(*store_, remember);
  ASSERT_TRUE(rr.Receive({.key = "g"}, failing));
  auto replay = rr.Receive({.key = "g"}, failing);
  ASSERT_TRUE(replay);
  EXPECT_EQ(replay->delivery, Delivery::kReplayed);
  EXPECT_EQ(metrics_.complete_failure->Value(), 1u);
  EXPECT_EQ(metrics_.begin_replay->Value(), 1u);

  auto lost = r.Receive({.key = "slow"}, [&](const HandlerContext&) {
    clock_.Advance(milliseconds(1500));
    EXPECT_TRUE(store_->Begin({"payments", "slow", std::nullopt, milliseconds(1000)}));
    return HandlerResult{};
  });
  ASSERT_FALSE(lost);
  EXPECT_EQ(lost.error().code(), StatusCode::kAborted);
  EXPECT_EQ(metrics_.lease_lost->Value(), 1u);
  EXPECT_EQ(metrics_.complete_success->Value(), 1u);  // "dead"'s only
  EXPECT_EQ(metrics_.begin_acquired->Value(), 5u);
}

// A worker that died holding an entity's version 1 is taken over by whatever version comes
// next: version 2 runs at attempt 1 (its own first run), and the takeover is counted all the
// same. A version begun after the previous one was applied is no takeover.
TEST_F(ReceiverTest, CountsAVersionedTakeoverOfAnotherVersion) {
  ReceiverOptions o = Counted();
  Receiver r(*store_, o);
  ASSERT_TRUE(store_->BeginVersioned({"payments", "acct", 1, milliseconds(1000)}));
  clock_.Advance(milliseconds(1000));
  auto two = r.Receive({.entity = "acct", .version = 2}, Counting());
  ASSERT_TRUE(two) << two.error().ToString();
  EXPECT_EQ(two->delivery, Delivery::kExecuted);
  EXPECT_EQ(two->attempt, 1u);
  EXPECT_EQ(metrics_.takeovers->Value(), 1u);
  auto three = r.Receive({.entity = "acct", .version = 3}, Counting());
  ASSERT_TRUE(three);
  EXPECT_EQ(three->delivery, Delivery::kExecuted);
  EXPECT_EQ(metrics_.takeovers->Value(), 1u);
  EXPECT_EQ(metrics_.begin_acquired->Value(), 2u);
}

// A key the receiver accepts but the store refuses (the store's own max_key_bytes is lower) is
// the caller's error: kInvalidArgument, not counted as a store error.
TEST_F(ReceiverTest, AKeyTheStoreRefusesIsNotAStoreError) {
  Registry registry;
  Metrics metrics(registry, "payments");
  ReceiverOptions o = Options();
  o.metrics = &metrics;
  o.max_key_bytes = 300;
  Receiver r(*store_, o);
  auto res = r.Receive({.key = std::string(280, 'k')}, Counting());
  ASSERT_FALSE(res);
  EXPECT_EQ(res.error().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(metrics.store_errors->Value(), 0u);
  EXPECT_EQ(runs_.load(), 0);
}

// SPEC §5 through the receiver: a message naming an entity and a version runs only above the
// highest applied version, and a stale one is dropped and counted.
TEST_F(ReceiverTest, VersionedMessagesRunInOrderAndStaleOnesAreDroppedAndCounted) {
  Registry registry;
  Metrics metrics(registry, "payments");
  ReceiverOptions o = Options();
  o.metrics = &metrics;
  Receiver r(*store_, o);
  const auto deliver = [&](std::uint64_t version) {
    auto d = r.Receive({.payload = "p", .entity = "acct-7", .version = version}, Counting());
    EXPECT_TRUE(d) << d.error().ToString();
    return d ? d->delivery : Delivery::kConflict;
  };
  EXPECT_EQ(deliver(1), Delivery::kExecuted);
  EXPECT_EQ(deliver(1), Delivery::kStale);  // a redelivery
  EXPECT_EQ(deliver(3), Delivery::kExecuted);
  EXPECT_EQ(deliver(2), Delivery::kStale);  // arrived after a newer one was applied
  EXPECT_EQ(runs_.load(), 2);
  // The handler's key names the version: a downstream call made with it is one per version.
  std::string key;
  auto four = r.Receive({.entity = "acct-7", .version = 4}, [&](const HandlerContext& c) {
    key = std::string(c.key);
    return HandlerResult{};
  });
  ASSERT_TRUE(four);
  EXPECT_EQ(key, "acct-7#4");
  EXPECT_EQ(four->key, "acct-7#4");  // the answer's key is the handler's (it was the entity)
  auto stale = r.Receive({.entity = "acct-7", .version = 2}, Counting());
  ASSERT_TRUE(stale);
  EXPECT_EQ(stale->key, "acct-7#2");
  EXPECT_EQ(metrics.begin_stale->Value(), 3u);
  EXPECT_EQ(metrics.begin_acquired->Value(), 3u);
  EXPECT_EQ(metrics.complete_success->Value(), 3u);
  auto v = store_->GetVersion("payments", "acct-7");
  ASSERT_TRUE(v && v->has_value());
  EXPECT_EQ((*v)->applied, 4u);
}

// SPEC §4 through the receiver: a client's numbered requests run once each, duplicates replay
// until acknowledged, acknowledged numbers are Stale, and a number past the window or on an
// unknown session is refused, never run.
TEST_F(ReceiverTest, ClientSessionsRunEachNumberOnceAndRefuseWhatTheyMust) {
  Registry registry;
  Metrics metrics(registry, "payments");
  ReceiverOptions o = Options();
  o.metrics = &metrics;
  o.fingerprint = FingerprintMode::kBytes;
  Receiver r(*store_, o);
  ASSERT_TRUE(store_->OpenSession(
      {.scope = "payments", .client_id = "c1", .ttl = milliseconds(3'600'000), .window = 4}));
  std::string key;
  const Handler handler = [&](const HandlerContext& c) {
    runs_.fetch_add(1);
    key = std::string(c.key);
    return HandlerResult{Outcome::kSuccess, "done " + key};
  };
  auto first = r.Receive({.payload = "a", .client_id = "c1", .seq = 1}, handler);
  ASSERT_TRUE(first) << first.error().ToString();
  EXPECT_EQ(first->delivery, Delivery::kExecuted);
  EXPECT_EQ(key, "c1#1");
  auto again = r.Receive({.payload = "a", .client_id = "c1", .seq = 1}, handler);
  ASSERT_TRUE(again);
  EXPECT_EQ(again->delivery, Delivery::kReplayed);
  EXPECT_EQ(again->response, "done c1#1");
  auto other = r.Receive({.payload = "b", .client_id = "c1", .seq = 1}, handler);
  ASSERT_TRUE(other);
  EXPECT_EQ(other->delivery, Delivery::kConflict);
  auto second = r.Receive({.payload = "b", .client_id = "c1", .seq = 2, .ack = 1}, handler);
  ASSERT_TRUE(second);
  EXPECT_EQ(second->delivery, Delivery::kExecuted);
  auto stale = r.Receive({.payload = "a", .client_id = "c1", .seq = 1}, handler);
  ASSERT_TRUE(stale);
  EXPECT_EQ(stale->delivery, Delivery::kStale);
  EXPECT_EQ(runs_.load(), 2);

  auto past = r.Receive({.payload = "x", .client_id = "c1", .seq = 6}, handler);  // 1 + 4 < 6
  ASSERT_FALSE(past);
  EXPECT_EQ(past.error().code(), StatusCode::kResourceExhausted);
  auto unknown = r.Receive({.payload = "x", .client_id = "c9", .seq = 1}, handler);
  ASSERT_FALSE(unknown);
  EXPECT_EQ(unknown.error().code(), StatusCode::kFailedPrecondition);
  auto both = r.Receive({.entity = "e", .version = 1, .client_id = "c1", .seq = 3}, handler);
  ASSERT_FALSE(both);
  EXPECT_EQ(both.error().code(), StatusCode::kInvalidArgument);
  auto no_number = r.Receive({.client_id = "c1"}, handler);
  ASSERT_FALSE(no_number);
  EXPECT_EQ(no_number.error().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(runs_.load(), 2);
  EXPECT_EQ(metrics.begin_acquired->Value(), 2u);
  EXPECT_EQ(metrics.begin_replay->Value(), 1u);
  EXPECT_EQ(metrics.begin_stale->Value(), 1u);
  EXPECT_EQ(metrics.store_errors->Value(), 0u);  // refusals are not store errors
}

TEST_F(ReceiverTest, AVersionWaitsForTheOneInProgressPerBusyPolicy) {
  auto held = store_->BeginVersioned({"payments", "acct", 1, milliseconds(3'600'000)});
  ASSERT_TRUE(held && std::holds_alternative<Acquired>(*held));
  Registry registry;
  Metrics metrics(registry, "payments");
  ReceiverOptions o = Options();
  o.metrics = &metrics;
  Receiver reject(*store_, o);
  auto d = reject.Receive({.entity = "acct", .version = 2}, Counting());
  ASSERT_TRUE(d);
  EXPECT_EQ(d->delivery, Delivery::kBusy);

  o.busy_policy = BusyPolicy::kWait;
  o.busy_wait = milliseconds(200);
  Receiver wait(*store_, o);
  const Timestamp start = clock_.Now();
  d = wait.Receive({.entity = "acct", .version = 2}, Counting());
  ASSERT_TRUE(d);
  EXPECT_EQ(d->delivery, Delivery::kBusy);
  EXPECT_GE(clock_.Now() - start, milliseconds(200));
  EXPECT_EQ(metrics.begin_busy->Value(), 2u);  // one a delivery, however often it polled

  ASSERT_TRUE(store_->CompleteVersioned({"payments", "acct", std::get<Acquired>(*held).token}));
  d = wait.Receive({.entity = "acct", .version = 2}, Counting());
  ASSERT_TRUE(d);
  EXPECT_EQ(d->delivery, Delivery::kExecuted);
  EXPECT_EQ(runs_.load(), 1);
}

TEST_F(ReceiverTest, AFailedVersionIsReleasedOrRememberedPerPolicy) {
  const Handler failing = [this](const HandlerContext& c) {
    runs_.fetch_add(1);
    last_attempt_ = c.attempt;
    return HandlerResult{Outcome::kFailure, "no"};
  };
  Receiver release(*store_, Options());
  auto d = release.Receive({.entity = "a", .version = 1}, failing);
  ASSERT_TRUE(d);
  EXPECT_TRUE(d->released);
  d = release.Receive({.entity = "a", .version = 1}, Counting());
  ASSERT_TRUE(d);
  EXPECT_EQ(d->delivery, Delivery::kExecuted);  // it ran again
  EXPECT_EQ(runs_.load(), 2);

  ReceiverOptions o = Options();
  o.failure_policy = FailurePolicy::kRemember;
  Receiver remember(*store_, o);
  d = remember.Receive({.entity = "b", .version = 1}, failing);
  ASSERT_TRUE(d);
  EXPECT_EQ(d->outcome, Outcome::kFailure);
  EXPECT_FALSE(d->released);
  d = remember.Receive({.entity = "b", .version = 1}, Counting());
  ASSERT_TRUE(d);
  EXPECT_EQ(d->delivery, Delivery::kStale);  // final: never run again
  EXPECT_EQ(runs_.load(), 3);
}

TEST_F(ReceiverTest, AVersionedMessageNeedsBothAnEntityAndAVersion) {
  Receiver r(*store_, Options());
  for (const Message& m : {Message{.entity = "a"}, Message{.key = "k", .version = 4}}) {
    auto d = r.Receive(m, Counting());
    ASSERT_FALSE(d);
    EXPECT_EQ(d.error().code(), StatusCode::kInvalidArgument);
  }
  EXPECT_EQ(runs_.load(), 0);
}

}  // namespace
}  // namespace idem
