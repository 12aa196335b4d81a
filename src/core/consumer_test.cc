// The consumer core against an in-memory broker (tests/support/fake_broker.h) and the memory
// store: keys, duplicates, order, retries, the dead-letter channel, Busy, and failing stores
// and brokers. The broker adapters have their own tests against real brokers.
#include "idem/consumer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "core/spare_messages.h"
#include "idem/stores/log.h"
#include "idem/stores/memory.h"
#include "stores/log/log_store_internal.h"
#include "tests/support/consumer_helpers.h"
#include "tests/support/fake_broker.h"
#include "tests/support/fake_clock.h"
#include "tests/support/faulty_file_system.h"
#include "tests/support/faulty_store.h"

namespace idem {
namespace {

using std::chrono::milliseconds;
using testing::FakeBroker;
using testing::FakeClock;
using testing::FaultyStore;
using ::testing::HasSubstr;
using testing::HeaderOf;

class ConsumerTest : public ::testing::TestWithParam<bool> {
 protected:
  ConsumerTest()
      : store_(NewMemoryStore({.clock = &clock_, .reclaim_interval = milliseconds(0)})) {}

  ConsumerOptions Options() {
    ConsumerOptions o;
    o.name = "test";
    o.scope = "payments";
    o.batch_size = 64;
    o.lease = milliseconds(10'000);
    o.max_attempts = 3;
    o.backoff = milliseconds(100);
    o.clock = &clock_;
    o.registry = &registry_;
    o.pipeline = GetParam();
    // The keeper's thread sleeps in real time and reads the fake clock: left on, it could
    // extend a lease between a test's Advance and its next step. KeptLeases* test it.
    o.keep_leases = false;
    return o;
  }

  // A 1 s lease and fixed 400 ms retry delays (no jitter): a handler retried a few times
  // outlasts the lease unless the batch's leases are extended.
  ConsumerOptions RetriesPastTheLease(std::uint32_t max_attempts) {
    ConsumerOptions o = Options();
    o.lease = milliseconds(1'000);
    o.backoff = milliseconds(400);
    o.max_backoff = milliseconds(400);
    o.jitter = 0;
    o.max_attempts = max_attempts;
    return o;
  }

  // One whole round: pipelined, the batch completes and is acknowledged in Flush().
  static Result<std::size_t> Round(Consumer& consumer) {
    auto n = consumer.RunOnce();
    Status flushed = consumer.Flush();
    if (n && !flushed.ok()) return flushed;
    return n;
  }

  // A handler that records every run and succeeds.
  MessageHandler Recording() {
    return [this](const HandlerContext& c, const BrokerMessage& m) -> HandlerVerdict {
      std::lock_guard lock(mu_);
      runs_.push_back({std::string(c.key), m.partition, c.attempt});
      return {Verdict::kSuccess, "ok:" + std::string(c.key)};
    };
  }

  // A fresh directory for a log store, per test process.
  static std::string LogDir(const std::string& name) {
    return ::testing::TempDir() + "idem-consumer-" + name + "-" + std::to_string(::getpid());
  }
  // A log store in `dir` (emptied first) on `fs`, on the test's clock, without a reaper.
  auto OpenLog(testing::FaultyFileSystem& fs, const std::string& dir) {
    std::filesystem::remove_all(dir);
    LogStoreOptions lo;
    lo.dir = dir;
    lo.clock = &clock_;
    lo.reclaim_interval = milliseconds(0);
    return log::OpenLogStoreWith(lo, fs);
  }

  // Polls until the broker has nothing left (at most `rounds` rounds).
  void Drain(Consumer& consumer, int rounds = 100) {
    for (int i = 0; i < rounds && broker_.Queued() > 0; ++i) (void)consumer.RunOnce();
    (void)consumer.Flush();
    for (int i = 0; i < rounds && broker_.Queued() > 0; ++i) (void)Round(consumer);
    ASSERT_EQ(broker_.Queued(), 0u);
  }

  struct Run {
    std::string key;
    std::string partition;
    std::uint32_t attempt;
  };

  FakeClock clock_;
  Registry registry_;
  std::unique_ptr<Store> store_;
  FakeBroker broker_;
  std::mutex mu_;
  std::vector<Run> runs_;
};

TEST_P(ConsumerTest, RunsEachKeyOnceAndAcknowledgesEveryMessage) {
  for (int i = 0; i < 10; ++i) broker_.PublishKeyed("p0", "k" + std::to_string(i));
  Consumer consumer(*store_, broker_, Recording(), Options());
  auto n = Round(consumer);
  ASSERT_TRUE(n.has_value()) << n.error().ToString();
  EXPECT_EQ(*n, 10u);
  ASSERT_EQ(runs_.size(), 10u);
  EXPECT_EQ(broker_.Acknowledged().size(), 10u);
  for (int i = 0; i < 10; ++i) {
    auto r = store_->Get("payments", "k" + std::to_string(i));
    ASSERT_TRUE(r.has_value() && r->has_value());
    EXPECT_EQ((*r)->state, RecordState::kCompleted);
    EXPECT_EQ((*r)->response, "ok:k" + std::to_string(i));
  }
  EXPECT_EQ(consumer.counts().executed, 10u);
}

TEST_P(ConsumerTest, RedeliveredDuplicatesAreAcknowledgedWithoutRunningTheHandler) {
  for (int i = 0; i < 5; ++i) broker_.PublishKeyed("p0", "k" + std::to_string(i));
  Consumer consumer(*store_, broker_, Recording(), Options());
  ASSERT_TRUE(Round(consumer).has_value());
  for (int i = 0; i < 5; ++i) broker_.PublishKeyed("p0", "k" + std::to_string(i));
  ASSERT_TRUE(Round(consumer).has_value());
  EXPECT_EQ(runs_.size(), 5u);
  EXPECT_EQ(broker_.Acknowledged().size(), 10u);
  EXPECT_EQ(consumer.counts().replayed, 5u);
  const std::string metrics = registry_.RenderPrometheus();
  EXPECT_NE(metrics.find("idem_consumer_messages_total{consumer=\"test\",result=\"replayed\"} 5"),
            std::string::npos)
      << metrics;
  EXPECT_NE(metrics.find("idem_begin_total{scope=\"payments\",answer=\"replay\"} 5"),
            std::string::npos)
      << metrics;
}

TEST_P(ConsumerTest, DuplicatesInOneBatchAreBegunOnce) {
  broker_.PublishKeyed("p0", "a");
  broker_.PublishKeyed("p1", "a");
  broker_.PublishKeyed("p0", "a");
  broker_.PublishKeyed("p0", "b");
  Consumer consumer(*store_, broker_, Recording(), Options());
  ASSERT_TRUE(Round(consumer).has_value());
  ASSERT_EQ(runs_.size(), 2u);
  EXPECT_EQ(broker_.Acknowledged().size(), 4u);
  EXPECT_EQ(consumer.counts().replayed, 2u);
}

TEST_P(ConsumerTest, KeepsEachPartitionsOrder) {
  for (int i = 0; i < 30; ++i) {
    broker_.PublishKeyed("p" + std::to_string(i % 3), "k" + std::to_string(i));
  }
  auto options = Options();
  options.batch_size = 7;
  Consumer consumer(*store_, broker_, Recording(), options);
  Drain(consumer);
  std::map<std::string, std::vector<int>> seen;
  for (const Run& r : runs_) seen[r.partition].push_back(std::stoi(r.key.substr(1)));
  ASSERT_EQ(seen.size(), 3u);
  for (const auto& [p, keys] : seen) {
    EXPECT_EQ(keys.size(), 10u);
    EXPECT_TRUE(std::is_sorted(keys.begin(), keys.end())) << p;
  }
}

// A retry keeps the broker's redelivery timers of the batch's unsettled messages in step: if
// only the retried one were touched, a crash would have the broker redeliver it after the
// later messages of its partition (JetStream's ack_wait), and they would run first.
TEST_P(ConsumerTest, ARetryTouchesEveryUnsettledMessageOfTheBatchInOrder) {
  broker_.PublishKeyed("p0", "first");
  broker_.PublishKeyed("p0", "flaky");
  broker_.PublishKeyed("p0", "later");
  broker_.PublishKeyed("p1", "other");
  int flaky_calls = 0;
  Consumer consumer(
      *store_, broker_,
      [&](const HandlerContext& c, const BrokerMessage&) -> HandlerVerdict {
        if (c.key == "flaky" && ++flaky_calls == 1) return {Verdict::kRetryable, "not yet"};
        return {Verdict::kSuccess, "done"};
      },
      Options());
  ASSERT_TRUE(Round(consumer).has_value());
  const std::vector<std::vector<std::string>> calls = broker_.TouchCalls();
  ASSERT_FALSE(calls.empty());
  // At the retry "first" is settled; "flaky", "later" (p0) and "other" (p1) are not, and are
  // touched together, in the batch's order, or "other" is already settled (partitions are
  // independent): either way "flaky" and "later" are both there, in order.
  const std::vector<std::string>& touched = calls.front();
  const auto flaky_at = std::find(touched.begin(), touched.end(), "p0:1");
  const auto later_at = std::find(touched.begin(), touched.end(), "p0:2");
  ASSERT_NE(flaky_at, touched.end());
  ASSERT_NE(later_at, touched.end()) << "the later message of the partition was not touched";
  EXPECT_LT(flaky_at, later_at);
  EXPECT_EQ(std::find(touched.begin(), touched.end(), "p0:0"), touched.end())
      << "a settled message needs no touch";
  EXPECT_EQ(broker_.Acknowledged().size(), 4u);
}

TEST_P(ConsumerTest, HandlerThatFailsTwiceThenSucceedsRunsThreeTimes) {
  broker_.PublishKeyed("p0", "flaky");
  std::vector<std::uint32_t> attempts;
  Consumer consumer(
      *store_, broker_,
      [&](const HandlerContext& c, const BrokerMessage&) -> HandlerVerdict {
        attempts.push_back(c.attempt);
        if (attempts.size() < 3) return {Verdict::kRetryable, "not yet"};
        return {Verdict::kSuccess, "done"};
      },
      Options());
  const Timestamp start = clock_.Now();
  ASSERT_TRUE(Round(consumer).has_value());
  EXPECT_EQ(attempts, (std::vector<std::uint32_t>{1, 2, 3}));
  // Backoff 100 ms then 200 ms, each scaled into [0.5, 1] by the jitter.
  EXPECT_GE(clock_.Now() - start, milliseconds(150));
  EXPECT_LE(clock_.Now() - start, milliseconds(300));
  EXPECT_EQ(broker_.Acknowledged().size(), 1u);
  EXPECT_TRUE(broker_.DeadLetters().empty());
  EXPECT_EQ(consumer.counts().retries, 2u);
  EXPECT_GE(broker_.Touched(), 2u);
  auto r = store_->Get("payments", "flaky");
  ASSERT_TRUE(r.has_value() && r->has_value());
  EXPECT_EQ((*r)->outcome, Outcome::kSuccess);
}

TEST_P(ConsumerTest, HandlerThatAlwaysFailsIsDeadLetteredAfterMaxAttempts) {
  broker_.Publish("p0", R"({"amount":1})", {{"Idempotency-Key", "bad"}, {"trace", "t-1"}});
  int runs = 0;
  Consumer consumer(
      *store_, broker_,
      [&](const HandlerContext&, const BrokerMessage&) -> HandlerVerdict {
        ++runs;
        return {Verdict::kRetryable, "upstream 503"};
      },
      Options());
  ASSERT_TRUE(Round(consumer).has_value());
  EXPECT_EQ(runs, 3);
  auto dlq = broker_.DeadLetters();
  ASSERT_EQ(dlq.size(), 1u);
  EXPECT_EQ(dlq[0].message.payload, R"({"amount":1})");
  EXPECT_EQ(HeaderOf(dlq[0].headers, "trace"), "t-1");
  EXPECT_EQ(HeaderOf(dlq[0].headers, "idem-dlq-reason"), "attempts_exhausted");
  EXPECT_EQ(HeaderOf(dlq[0].headers, "idem-dlq-attempts"), "3");
  EXPECT_EQ(HeaderOf(dlq[0].headers, "idem-dlq-error"), "upstream 503");
  EXPECT_EQ(HeaderOf(dlq[0].headers, "idem-dlq-key"), "bad");
  EXPECT_EQ(HeaderOf(dlq[0].headers, "idem-dlq-source"), "p0@0");
  EXPECT_EQ(broker_.Acknowledged().size(), 1u);
  auto r = store_->Get("payments", "bad");
  ASSERT_TRUE(r.has_value() && r->has_value());
  EXPECT_EQ((*r)->state, RecordState::kCompleted);
  EXPECT_EQ((*r)->outcome, Outcome::kFailure);

  // A redelivery of the dead-lettered message is a replay: no run, no second dead letter.
  broker_.Publish("p0", R"({"amount":1})", {{"Idempotency-Key", "bad"}});
  ASSERT_TRUE(Round(consumer).has_value());
  EXPECT_EQ(runs, 3);
  EXPECT_EQ(broker_.DeadLetters().size(), 1u);
  EXPECT_EQ(broker_.Acknowledged().size(), 2u);
}

TEST_P(ConsumerTest, PermanentFailureAndThrowingHandlers) {
  broker_.PublishKeyed("p0", "perm");
  broker_.PublishKeyed("p0", "throws");
  std::map<std::string, int> runs;
  Consumer consumer(
      *store_, broker_,
      [&](const HandlerContext& c, const BrokerMessage&) -> HandlerVerdict {
        ++runs[std::string(c.key)];
        if (c.key == "throws") throw std::runtime_error("boom");
        return {Verdict::kPermanent, "422 invalid amount"};
      },
      Options());
  ASSERT_TRUE(Round(consumer).has_value());
  EXPECT_EQ(runs["perm"], 1);
  EXPECT_EQ(runs["throws"], 3);  // a throw is retryable
  auto dlq = broker_.DeadLetters();
  ASSERT_EQ(dlq.size(), 2u);
  EXPECT_EQ(dlq[0].reason, "permanent");
  EXPECT_EQ(HeaderOf(dlq[0].headers, "idem-dlq-error"), "422 invalid amount");
  EXPECT_EQ(dlq[1].reason, "attempts_exhausted");
  EXPECT_EQ(HeaderOf(dlq[1].headers, "idem-dlq-error"), "handler threw: boom");
}

TEST_P(ConsumerTest, PoisonMessagesGoStraightToTheDeadLetterChannel) {
  broker_.Publish("p0", "{}", {});                                            // no key header
  broker_.Publish("p0", "{}", {{"Idempotency-Key", ""}});                     // empty key
  broker_.Publish("p0", "{}", {{"Idempotency-Key", std::string(300, 'x')}});  // too long
  broker_.PublishKeyed("p0", "fine");
  Consumer consumer(*store_, broker_, Recording(), Options());
  ASSERT_TRUE(Round(consumer).has_value());
  ASSERT_EQ(runs_.size(), 1u);
  auto dlq = broker_.DeadLetters();
  ASSERT_EQ(dlq.size(), 3u);
  EXPECT_EQ(dlq[0].reason, "no_key");
  EXPECT_NE(HeaderOf(dlq[0].headers, "idem-dlq-error").find("Idempotency-Key"), std::string::npos);
  EXPECT_EQ(dlq[1].reason, "bad_key");
  EXPECT_EQ(dlq[2].reason, "bad_key");
  EXPECT_EQ(broker_.Acknowledged().size(), 4u);
  EXPECT_EQ(consumer.counts().poison, 3u);
}

TEST_P(ConsumerTest, KeysFromAJsonPointerAndUnparseablePayloads) {
  broker_.Publish("p0", R"({"id":"order-7","amount":3})");
  broker_.Publish("p0", R"({"id":"order-7","amount":3})");
  broker_.Publish("p0", R"({"id":"order-7","amount":4})");  // same key, other payload
  broker_.Publish("p0", R"({"id":)");                       // does not parse
  auto options = Options();
  options.key_source = KeySource::JsonPointer("/id");
  options.fingerprint = FingerprintMode::kJson;
  Consumer consumer(*store_, broker_, Recording(), options);
  ASSERT_TRUE(Round(consumer).has_value());
  ASSERT_EQ(runs_.size(), 1u);
  EXPECT_EQ(runs_[0].key, "order-7");
  EXPECT_EQ(consumer.counts().replayed, 1u);  // the copy with the same payload
  // The in-batch copy with another payload is a conflict (SPEC §2), as a later delivery is.
  auto dlq = broker_.DeadLetters();
  ASSERT_EQ(dlq.size(), 2u);
  EXPECT_EQ(dlq[0].reason, "conflict");
  EXPECT_EQ(dlq[0].message.payload, R"({"id":"order-7","amount":4})");
  EXPECT_EQ(dlq[1].reason, "bad_payload");
  broker_.Publish("p0", R"({"id":"order-7","amount":4})");
  ASSERT_TRUE(Round(consumer).has_value());
  dlq = broker_.DeadLetters();
  ASSERT_EQ(dlq.size(), 3u);
  EXPECT_EQ(dlq[2].reason, "conflict");
  EXPECT_EQ(broker_.Acknowledged().size(), 5u);
}

// SPEC §5 through the consumer: a message naming an entity and a version runs only above the
// entity's applied version, in partition order; at or below it, it is Stale: acknowledged
// unrun, and counted. A message naming neither is gated by its key as before.
TEST_P(ConsumerTest, VersionedMessagesRunAboveTheAppliedVersionAndStaleOnesAreDropped) {
  auto versioned = [&](std::string entity, std::string version) {
    broker_.Publish("p0", "{}", {{"Entity-Id", entity}, {"entity-version", version}});
  };
  versioned("a", "1");
  versioned("a", "2");
  versioned("a", "2");  // a redelivery of 2
  versioned("a", "1");  // older than what was applied
  versioned("b", "5");
  broker_.PublishKeyed("p0", "k1");
  auto options = Options();
  options.versions = VersionSources{};  // headers Entity-Id and Entity-Version
  Consumer consumer(*store_, broker_, Recording(), options);
  ASSERT_TRUE(Round(consumer).has_value());
  std::vector<std::string> keys;
  for (const Run& r : runs_) keys.push_back(r.key);
  EXPECT_EQ(keys, (std::vector<std::string>{"a#1", "a#2", "b#5", "k1"}));
  EXPECT_EQ(consumer.counts().stale, 2u);
  EXPECT_EQ(consumer.counts().executed, 4u);
  EXPECT_EQ(broker_.Acknowledged().size(), 6u);
  auto a = store_->GetVersion("payments", "a");
  ASSERT_TRUE(a.has_value() && a->has_value());
  EXPECT_EQ((*a)->applied, 2u);
  EXPECT_FALSE((*a)->in_progress.has_value());
  const std::string metrics = registry_.RenderPrometheus();
  EXPECT_NE(metrics.find("idem_consumer_messages_total{consumer=\"test\",result=\"stale\"} 2"),
            std::string::npos)
      << metrics;
  EXPECT_NE(metrics.find("idem_begin_total{scope=\"payments\",answer=\"stale\"} 2"),
            std::string::npos)
      << metrics;

  versioned("a", "3");
  versioned("a", "2");
  ASSERT_TRUE(Round(consumer).has_value());
  ASSERT_EQ(runs_.size(), 5u);
  EXPECT_EQ(runs_[4].key, "a#3");
  EXPECT_EQ(consumer.counts().stale, 3u);
  EXPECT_EQ(broker_.Acknowledged().size(), 8u);
}

// The entity and version from JSON pointers: a version may be a JSON number or a string of
// digits. A message naming only one of them, or a version that is not a whole number from 1 to
// 2^64 - 1, is dead-lettered as bad_version; a payload that does not parse as bad_payload.
TEST_P(ConsumerTest, MalformedVersionsAreDeadLetteredWithAReason) {
  broker_.Publish("p0", R"({"acct":"a","v":3})");
  broker_.Publish("p0", R"({"acct":"a","v":"4"})");
  broker_.Publish("p0", R"({"acct":"a"})");                             // no version
  broker_.Publish("p0", R"({"v":7})");                                  // no entity
  broker_.Publish("p0", R"({"acct":"a","v":0})");                       // not above 0
  broker_.Publish("p0", R"({"acct":"a","v":1.5})");                     // not whole
  broker_.Publish("p0", R"({"acct":"a","v":"-5"})");                    // signed
  broker_.Publish("p0", R"({"acct":"a","v":"18446744073709551616"})");  // 2^64
  broker_.Publish("p0", R"({"acct":"","v":9})");                        // empty entity
  broker_.Publish("p0", R"({"acct":"a","v":)");                         // does not parse
  broker_.Publish("p0", R"({"acct":"a","v":"18446744073709551615"})");  // 2^64 - 1
  auto options = Options();
  options.versions = VersionSources{.entity = KeySource::JsonPointer("/acct"),
                                    .version = KeySource::JsonPointer("/v")};
  Consumer consumer(*store_, broker_, Recording(), options);
  ASSERT_TRUE(Round(consumer).has_value());
  std::vector<std::string> keys;
  for (const Run& r : runs_) keys.push_back(r.key);
  EXPECT_EQ(keys, (std::vector<std::string>{"a#3", "a#4", "a#18446744073709551615"}));
  auto dlq = broker_.DeadLetters();
  std::vector<std::string> reasons;
  for (const auto& d : dlq) reasons.push_back(d.reason);
  EXPECT_EQ(reasons,
            (std::vector<std::string>{"bad_version", "bad_version", "bad_version", "bad_version",
                                      "bad_version", "bad_version", "bad_version", "bad_payload"}));
  ASSERT_EQ(dlq.size(), 8u);
  EXPECT_NE(HeaderOf(dlq[0].headers, "idem-dlq-error").find("entity but no version"),
            std::string::npos);
  EXPECT_NE(HeaderOf(dlq[2].headers, "idem-dlq-error").find("not a whole number"),
            std::string::npos);
  EXPECT_EQ(consumer.counts().poison, 8u);
  EXPECT_EQ(broker_.Acknowledged().size(), 11u);
}

// A dead-lettered version counts as applied (its redelivery is Stale); one handed back unrun
// because the dead-letter publish failed is released, so the next delivery runs it.
TEST_P(ConsumerTest, ADeadLetteredVersionIsAppliedAndOneHandedBackIsReleased) {
  broker_.Publish("p0", "{}", {{"Entity-Id", "a"}, {"Entity-Version", "1"}});
  auto options = Options();
  options.versions = VersionSources{};
  std::atomic<bool> fail{true};
  Consumer consumer(
      *store_, broker_,
      [&](const HandlerContext& c, const BrokerMessage&) -> HandlerVerdict {
        std::lock_guard lock(mu_);
        runs_.push_back({std::string(c.key), "", c.attempt});
        if (fail) return {Verdict::kPermanent, "declined"};
        return {Verdict::kSuccess, "ok"};
      },
      options);
  broker_.FailDeadLetter(true);
  (void)Round(consumer);
  ASSERT_EQ(runs_.size(), 1u);
  EXPECT_EQ(broker_.Acknowledged().size(), 0u);
  EXPECT_EQ(broker_.Redelivered(), 1u);
  auto a = store_->GetVersion("payments", "a");
  ASSERT_TRUE(a.has_value() && a->has_value());
  EXPECT_EQ((*a)->applied, 0u);
  EXPECT_FALSE((*a)->in_progress.has_value()) << "the version was not released";

  broker_.FailDeadLetter(false);
  ASSERT_TRUE(Round(consumer).has_value());
  ASSERT_EQ(runs_.size(), 2u);
  auto dlq = broker_.DeadLetters();
  ASSERT_EQ(dlq.size(), 1u);
  EXPECT_EQ(dlq[0].reason, "permanent");
  EXPECT_EQ(HeaderOf(dlq[0].headers, "idem-dlq-key"), "a#1");
  a = store_->GetVersion("payments", "a");
  ASSERT_TRUE(a.has_value() && a->has_value());
  EXPECT_EQ((*a)->applied, 1u);

  fail = false;
  broker_.Publish("p0", "{}", {{"Entity-Id", "a"}, {"Entity-Version", "1"}});
  ASSERT_TRUE(Round(consumer).has_value());
  EXPECT_EQ(runs_.size(), 2u);
  EXPECT_EQ(consumer.counts().stale, 1u);
  EXPECT_EQ(broker_.Acknowledged().size(), 2u);
}

// Only one version of an entity is in progress at a time (SPEC §5): one another worker holds is
// waited for up to busy_timeout, then handed back with the rest of its partition, unrun.
TEST_P(ConsumerTest, AVersionAnotherWorkerHoldsIsWaitedForThenHandedBack) {
  auto held = store_->BeginVersioned({"payments", "a", 1, milliseconds(60'000)});
  ASSERT_TRUE(held.has_value() && std::holds_alternative<Acquired>(*held));
  broker_.Publish("p0", "{}", {{"Entity-Id", "a"}, {"Entity-Version", "2"}});
  broker_.PublishKeyed("p0", "after");
  auto options = Options();
  options.versions = VersionSources{};
  options.busy_timeout = milliseconds(2'000);
  Consumer consumer(*store_, broker_, Recording(), options);
  (void)Round(consumer);
  EXPECT_TRUE(runs_.empty());
  EXPECT_EQ(broker_.Redelivered(), 2u);
  EXPECT_EQ(broker_.Acknowledged().size(), 0u);

  ASSERT_TRUE(store_->CompleteVersioned({"payments", "a", std::get<Acquired>(*held).token}));
  Drain(consumer);
  std::vector<std::string> keys;
  for (const Run& r : runs_) keys.push_back(r.key);
  EXPECT_EQ(keys, (std::vector<std::string>{"a#2", "after"}));
}

// A second copy of a key in one batch with another payload is not a replay of the first: it
// would be acknowledged and lost. It is a conflict, dead-lettered like one a later batch meets.
TEST_P(ConsumerTest, ACopyWithAnotherPayloadInTheSameBatchIsAConflict) {
  broker_.Publish("p0", R"({"id":"order-7","amount":3})");
  broker_.Publish("p0", R"({"id":"order-7","amount":4})");
  auto options = Options();
  options.key_source = KeySource::JsonPointer("/id");
  options.fingerprint = FingerprintMode::kJson;
  Consumer consumer(*store_, broker_, Recording(), options);
  ASSERT_TRUE(Round(consumer).has_value());
  ASSERT_EQ(runs_.size(), 1u);
  auto dlq = broker_.DeadLetters();
  ASSERT_EQ(dlq.size(), 1u);
  EXPECT_EQ(dlq[0].reason, "conflict");
  EXPECT_EQ(dlq[0].message.payload, R"({"id":"order-7","amount":4})");
  EXPECT_EQ(HeaderOf(dlq[0].headers, "idem-dlq-key"), "order-7");
  EXPECT_EQ(consumer.counts().replayed, 0u);
  EXPECT_EQ(broker_.Acknowledged().size(), 2u);
}

// Without fingerprints the payload is parsed only for the key; one that does not parse is still
// a bad payload, not a message without a key.
TEST_P(ConsumerTest, AnUnparseablePayloadIsABadPayloadWithoutFingerprintsToo) {
  broker_.Publish("p0", R"({"id":)");        // does not parse
  broker_.Publish("p0", R"({"amount":3})");  // parses, has no /id
  auto options = Options();
  options.key_source = KeySource::JsonPointer("/id");
  options.fingerprint = FingerprintMode::kNone;
  Consumer consumer(*store_, broker_, Recording(), options);
  ASSERT_TRUE(Round(consumer).has_value());
  EXPECT_TRUE(runs_.empty());
  auto dlq = broker_.DeadLetters();
  ASSERT_EQ(dlq.size(), 2u);
  EXPECT_EQ(dlq[0].reason, "bad_payload");
  EXPECT_NE(HeaderOf(dlq[0].headers, "idem-dlq-error").find("invalid JSON"), std::string::npos);
  EXPECT_EQ(dlq[1].reason, "no_key");
  EXPECT_EQ(consumer.counts().poison, 2u);
  EXPECT_EQ(broker_.Acknowledged().size(), 2u);
}

TEST_P(ConsumerTest, StoreFailureAcknowledgesNothingAndRunsNothing) {
  FaultyStore faulty(*store_);
  for (int i = 0; i < 4; ++i)
    broker_.PublishKeyed("p" + std::to_string(i % 2), "k" + std::to_string(i));
  Consumer consumer(faulty, broker_, Recording(), Options());
  faulty.Fail(FaultyStore::kBegin);
  auto r = Round(consumer);
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code(), StatusCode::kUnavailable);
  EXPECT_TRUE(runs_.empty());
  EXPECT_TRUE(broker_.Acknowledged().empty());
  EXPECT_EQ(broker_.Redelivered(), 4u);
  EXPECT_EQ(broker_.Queued(), 4u);
  faulty.Heal();
  Drain(consumer);
  EXPECT_EQ(runs_.size(), 4u);
  EXPECT_EQ(broker_.Acknowledged().size(), 4u);
}

// The log store answers the consumer's begins from its flusher thread, once they are durable
// (Store::StartBatch). A sync that fails fails them: nothing of the batch runs or is
// acknowledged, and all of it goes back to the broker.
TEST_P(ConsumerTest, ALogStoreWhoseSyncFailsRunsNothingAndAcknowledgesNothing) {
  testing::FaultyFileSystem fs;
  const std::string dir = LogDir(GetParam() ? "log-p" : "log-s");
  auto log = OpenLog(fs, dir);
  ASSERT_TRUE(log.has_value()) << log.error().ToString();
  for (int i = 0; i < 6; ++i) {
    broker_.PublishKeyed("p" + std::to_string(i % 2), "k" + std::to_string(i));
  }
  {
    Consumer consumer(**log, broker_, Recording(), Options());
    auto n = Round(consumer);
    ASSERT_TRUE(n.has_value()) << n.error().ToString();
    EXPECT_EQ(runs_.size(), 6u);
    EXPECT_EQ(broker_.Acknowledged().size(), 6u);

    fs.FailSyncs(true);
    for (int i = 6; i < 10; ++i) {
      broker_.PublishKeyed("p" + std::to_string(i % 2), "k" + std::to_string(i));
    }
    auto r = Round(consumer);
    ASSERT_FALSE(r.has_value());
    EXPECT_EQ(r.error().code(), StatusCode::kUnavailable) << r.error().ToString();
    EXPECT_EQ(runs_.size(), 6u);
    EXPECT_EQ(broker_.Acknowledged().size(), 6u);
    EXPECT_EQ(broker_.Redelivered(), 4u);
    EXPECT_EQ(broker_.Queued(), 4u);
    // One per begin the store failed (it counted 2, one per partition, while
    // idem_store_errors_total said 6: each failed answer, then again per partition).
    EXPECT_EQ(consumer.counts().store_errors, 4u);
    EXPECT_EQ(Metrics(registry_, "payments").store_errors->Value(), 4u);
  }
  log->reset();
  std::filesystem::remove_all(dir);
}

TEST_P(ConsumerTest, CompletionThatCannotBeStoredIsNotAcknowledged) {
  FaultyStore faulty(*store_);
  broker_.PublishKeyed("p0", "a");
  broker_.PublishKeyed("p0", "b");
  Consumer consumer(faulty, broker_, Recording(), Options());
  faulty.Fail(FaultyStore::kComplete);
  ASSERT_FALSE(Round(consumer).has_value());
  EXPECT_EQ(runs_.size(), 2u);
  EXPECT_TRUE(broker_.Acknowledged().empty());
  EXPECT_EQ(broker_.Queued(), 2u);
  // The keys stay IN_PROGRESS: the redelivery waits for the lease, then runs again with
  // attempt 2 (SPEC §3: a crash or store failure after the effect).
  auto rec = store_->Get("payments", "a");
  ASSERT_TRUE(rec.has_value() && rec->has_value());
  EXPECT_EQ((*rec)->state, RecordState::kInProgress);
  faulty.Heal();
  Drain(consumer);
  ASSERT_EQ(runs_.size(), 4u);
  EXPECT_EQ(runs_[2].attempt, 2u);
  EXPECT_EQ(broker_.Acknowledged().size(), 2u);
}

// A response the store refuses (over its limit): handing the message back ran the handler
// again after each lease. A failure saying why is stored in its place, and the message is
// acknowledged; a redelivery replays it.
TEST_P(ConsumerTest, AnOutcomeTheStoreRefusesIsStoredAsAFailureNotRunAgain) {
  FaultyStore faulty(*store_);
  faulty.RefuseResponsesOver(300);  // what is stored instead is shorter
  broker_.PublishKeyed("p0", "a");
  broker_.PublishKeyed("p0", "b");
  const MessageHandler recording = Recording();
  Consumer consumer(
      faulty, broker_,
      [&](const HandlerContext& c, const BrokerMessage& m) {
        HandlerVerdict v = recording(c, m);
        v.detail.resize(1000, 'r');
        return v;
      },
      Options());
  ASSERT_TRUE(Round(consumer).has_value());
  EXPECT_EQ(runs_.size(), 2u);
  EXPECT_EQ(broker_.Acknowledged().size(), 2u);
  EXPECT_EQ(consumer.counts().store_errors, 0u);  // as the receiver: a refusal is no outage
  auto rec = store_->Get("payments", "a");
  ASSERT_TRUE(rec.has_value() && rec->has_value());
  EXPECT_EQ((*rec)->state, RecordState::kCompleted);
  EXPECT_EQ((*rec)->outcome, Outcome::kFailure);
  EXPECT_THAT((*rec)->response, HasSubstr("the store refused its outcome (success, a 1000-byte"));
  clock_.Advance(milliseconds(60'000));  // past any lease
  broker_.PublishKeyed("p0", "a");
  Drain(consumer);
  EXPECT_EQ(runs_.size(), 2u);
  EXPECT_EQ(broker_.Acknowledged().size(), 3u);
}

// Options the store would refuse on every completion are refused first, naming the option.
TEST_P(ConsumerTest, OutOfRangeOptionsFailEveryRoundNamingTheOption) {
  broker_.PublishKeyed("p0", "a");
  ConsumerOptions o = Options();
  o.retention = milliseconds(0);
  Consumer zero(*store_, broker_, Recording(), o);
  auto r = zero.RunOnce();
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(r.error().message(), HasSubstr("consumer options: retention must be positive"));
  zero.Run();  // returns at once
  o = Options();
  o.failure_retention = milliseconds(-1);
  Consumer negative(*store_, broker_, Recording(), o);
  r = negative.RunOnce();
  ASSERT_FALSE(r.has_value());
  EXPECT_THAT(r.error().message(), HasSubstr("failure_retention must be positive"));
  EXPECT_TRUE(runs_.empty());
  EXPECT_EQ(broker_.Queued(), 1u);
}

TEST_P(ConsumerTest, BusyKeyIsTakenOverAfterTheOtherWorkersLease) {
  // A dead worker acquired "k" with a 10 s lease.
  auto held = store_->Begin({.scope = "payments", .key = "k", .lease = milliseconds(10'000)});
  ASSERT_TRUE(held.has_value() && std::holds_alternative<Acquired>(*held));
  broker_.PublishKeyed("p0", "k");
  broker_.PublishKeyed("p0", "after");
  Consumer consumer(*store_, broker_, Recording(), Options());
  const Timestamp start = clock_.Now();
  ASSERT_TRUE(Round(consumer).has_value());
  ASSERT_EQ(runs_.size(), 2u);
  EXPECT_EQ(runs_[0].key, "k");
  EXPECT_EQ(runs_[0].attempt, 2u);  // a takeover
  EXPECT_EQ(runs_[1].key, "after");
  EXPECT_GE(clock_.Now() - start, milliseconds(10'000));
  EXPECT_EQ(broker_.Acknowledged().size(), 2u);
}

TEST_P(ConsumerTest, BusyPastTheBoundHandsBackTheRestOfThePartitionOnly) {
  auto held = store_->Begin({.scope = "payments", .key = "k", .lease = milliseconds(60'000)});
  ASSERT_TRUE(held.has_value());
  broker_.PublishKeyed("p0", "k");
  broker_.PublishKeyed("p0", "after-k");
  broker_.PublishKeyed("p1", "other");
  auto options = Options();
  options.busy_timeout = milliseconds(2'000);
  Consumer consumer(*store_, broker_, Recording(), options);
  ASSERT_TRUE(Round(consumer).has_value());
  ASSERT_EQ(runs_.size(), 1u);
  EXPECT_EQ(runs_[0].key, "other");
  EXPECT_EQ(broker_.Acknowledged().size(), 1u);
  EXPECT_EQ(broker_.Redelivered(), 2u);  // k and after-k, in order
  auto again = broker_.Poll(10, milliseconds(0));
  ASSERT_TRUE(again.has_value());
  ASSERT_EQ(again->size(), 2u);
  EXPECT_EQ(HeaderOf((*again)[0].headers, "Idempotency-Key"), "k");
  EXPECT_EQ(HeaderOf((*again)[1].headers, "Idempotency-Key"), "after-k");
  // "after-k" was begun in the batch but not run: it was released, not left to its lease.
  auto rec = store_->Get("payments", "after-k");
  ASSERT_TRUE(rec.has_value());
  EXPECT_FALSE(rec->has_value());
}

// Every delivery the consumer polled goes back to the broker (Broker::Recycle, so an adapter
// may reuse its storage) exactly once, and only after it was acknowledged or handed back:
// pipelined, a batch's messages stay referred to by the batches polled after it until it is
// finished.
TEST_P(ConsumerTest, EveryPolledMessageIsRecycledOnceAfterItWasSettled) {
  auto held = store_->Begin({.scope = "payments", .key = "k", .lease = milliseconds(60'000)});
  ASSERT_TRUE(held.has_value());
  broker_.PublishKeyed("p0", "k");  // busy past the bound: handed back with what follows it
  broker_.PublishKeyed("p0", "after-k");
  for (int i = 0; i < 20; ++i) broker_.PublishKeyed("p1", "m" + std::to_string(i % 15));
  auto options = Options();
  options.batch_size = 4;
  options.busy_timeout = milliseconds(2'000);
  Consumer consumer(*store_, broker_, Recording(), options);
  for (int i = 0; i < 12; ++i) ASSERT_TRUE(consumer.RunOnce().has_value());
  ASSERT_TRUE(consumer.Flush().ok());
  EXPECT_FALSE(broker_.RecycledUnsettled());
  EXPECT_GT(broker_.Redelivered(), 0u);
  std::vector<std::uint64_t> polled = broker_.PolledHandles();
  std::vector<std::uint64_t> recycled = broker_.RecycledHandles();
  EXPECT_GT(polled.size(), 22u);  // k and after-k came more than once
  std::sort(polled.begin(), polled.end());
  std::sort(recycled.begin(), recycled.end());
  EXPECT_EQ(recycled, polled);
  EXPECT_EQ(broker_.Acknowledged().size(), 20u);
}

TEST_P(ConsumerTest, DeadLetterPublishFailureHandsBackAndReleases) {
  broker_.PublishKeyed("p0", "perm");
  broker_.PublishKeyed("p0", "next");
  broker_.FailDeadLetter(true);
  int runs = 0;
  Consumer consumer(
      *store_, broker_,
      [&](const HandlerContext& c, const BrokerMessage&) -> HandlerVerdict {
        ++runs;
        if (c.key == "perm") return {Verdict::kPermanent, "rejected"};
        return {Verdict::kSuccess, ""};
      },
      Options());
  auto r = Round(consumer);
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(runs, 1);  // "next" waits behind "perm": order
  EXPECT_TRUE(broker_.Acknowledged().empty());
  EXPECT_EQ(broker_.Queued(), 2u);
  auto rec = store_->Get("payments", "perm");
  ASSERT_TRUE(rec.has_value());
  EXPECT_FALSE(rec->has_value());  // released: the redelivery decides again
  broker_.FailDeadLetter(false);
  Drain(consumer);
  EXPECT_EQ(runs, 3);
  EXPECT_EQ(broker_.DeadLetters().size(), 1u);
  EXPECT_EQ(broker_.Acknowledged().size(), 2u);
}

TEST_P(ConsumerTest, PollFailureIsReported) {
  broker_.FailPoll(true);
  Consumer consumer(*store_, broker_, Recording(), Options());
  auto r = Round(consumer);
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(consumer.counts().broker_errors, 1u);
}

TEST_P(ConsumerTest, LongRetriesExtendTheBatchsLeases) {
  broker_.PublishKeyed("p0", "slow");
  broker_.PublishKeyed("p0", "waiting");
  const ConsumerOptions options = RetriesPastTheLease(6);
  int slow_runs = 0;
  Consumer consumer(
      *store_, broker_,
      [&](const HandlerContext& c, const BrokerMessage&) -> HandlerVerdict {
        if (c.key == "slow" && ++slow_runs < 6) return {Verdict::kRetryable, "again"};
        return {Verdict::kSuccess, ""};
      },
      options);
  // 5 retries x 400 ms = 2 s, twice the lease: without extensions "waiting" would be lost.
  ASSERT_TRUE(Round(consumer).has_value());
  EXPECT_EQ(broker_.Acknowledged().size(), 2u);
  auto text = registry_.RenderPrometheus();
  EXPECT_NE(text.find("idem_lease_lost_total{scope=\"payments\"} 0"), std::string::npos) << text;
  EXPECT_EQ(consumer.counts().lease_lost, 0u);
  auto rec = store_->Get("payments", "waiting");
  ASSERT_TRUE(rec.has_value() && rec->has_value());
  EXPECT_EQ((*rec)->state, RecordState::kCompleted);
}

// Counts how the consumer extends: one ExtendBatch per due point, never key by key.
class ExtendCountingStore : public testing::FaultyStore {
 public:
  explicit ExtendCountingStore(Store& inner) : FaultyStore(inner), inner_(inner) {}
  Result<WriteAnswer> Extend(std::string_view scope, std::string_view key, Token token,
                             milliseconds lease) override {
    ++single_extends;
    return FaultyStore::Extend(scope, key, token, lease);
  }
  std::vector<Result<WriteAnswer>> ExtendBatch(std::span<const ExtendRequest> reqs) override {
    std::lock_guard lock(mu);
    batch_sizes.push_back(reqs.size());
    return inner_.ExtendBatch(reqs);
  }
  std::atomic<int> single_extends{0};
  std::mutex mu;
  std::vector<std::size_t> batch_sizes;  // guarded by mu

 private:
  Store& inner_;
};

// The leases of a batch are extended with one ExtendBatch call for all its held keys (one
// round trip to Redis or PostgreSQL, one group commit in the log store), not one call a key.
TEST_P(ConsumerTest, ABatchsLeasesAreExtendedInOneCall) {
  for (int i = 0; i < 8; ++i)
    broker_.PublishKeyed("p" + std::to_string(i % 2), "k" + std::to_string(i));
  ExtendCountingStore counting(*store_);
  const ConsumerOptions options = RetriesPastTheLease(5);
  int k0_runs = 0;
  Consumer consumer(
      counting, broker_,
      [&](const HandlerContext& c, const BrokerMessage&) -> HandlerVerdict {
        if (c.key == "k0" && ++k0_runs < 5) return {Verdict::kRetryable, "again"};
        return {Verdict::kSuccess, ""};
      },
      options);
  ASSERT_TRUE(Round(consumer).has_value());
  EXPECT_EQ(broker_.Acknowledged().size(), 8u);
  EXPECT_EQ(consumer.counts().lease_lost, 0u);
  EXPECT_EQ(counting.single_extends.load(), 0);
  std::lock_guard lock(counting.mu);
  // 4 retries x 400 ms against a 1 s lease: extended at least twice, each time every key the
  // batch still held (k0 and the 7 behind it) in one call.
  ASSERT_GE(counting.batch_sizes.size(), 2u);
  for (std::size_t n : counting.batch_sizes) EXPECT_EQ(n, 8u);
  // idem_store_op_seconds{op="extend"}: one observation per ExtendBatch call.
  const Metrics metrics(registry_, "payments");
  EXPECT_EQ(metrics.store_extend_seconds->Count(), counting.batch_sizes.size());
}

// A handler that outlives its lease while another worker takes the key over: the stale token
// must not run the handler again (the new holder runs it), and the message is the new holder's
// to settle: handed back, not acknowledged, nor dead-lettered.
TEST_P(ConsumerTest, ALostLeaseIsNotRunAgainNorAcknowledged) {
  broker_.PublishKeyed("p0", "slow");
  auto options = Options();
  options.lease = milliseconds(1'000);
  options.backoff = milliseconds(100);
  int calls = 0;
  std::optional<Result<BeginAnswer>> takeover;
  Consumer consumer(
      *store_, broker_,
      [&](const HandlerContext&, const BrokerMessage&) -> HandlerVerdict {
        if (++calls == 1) {
          clock_.Advance(milliseconds(2'000));
          takeover =
              store_->Begin({.scope = "payments", .key = "slow", .lease = milliseconds(10'000)});
        }
        return {Verdict::kRetryable, "upstream 503"};
      },
      options);
  auto n = Round(consumer);
  ASSERT_TRUE(n.has_value()) << n.error().ToString();
  ASSERT_TRUE(takeover.has_value() && takeover->has_value());
  ASSERT_TRUE(std::holds_alternative<Acquired>(**takeover));
  EXPECT_EQ(calls, 1);
  EXPECT_TRUE(broker_.Acknowledged().empty());
  EXPECT_TRUE(broker_.DeadLetters().empty());
  EXPECT_EQ(broker_.Redelivered(), 1u);
  const std::string text = registry_.RenderPrometheus();
  EXPECT_NE(text.find("idem_lease_lost_total{scope=\"payments\"} 1"), std::string::npos) << text;
  EXPECT_EQ(consumer.counts().lease_lost, 1u);
  // The new holder's record is untouched.
  auto rec = store_->Get("payments", "slow");
  ASSERT_TRUE(rec.has_value() && rec->has_value());
  EXPECT_EQ((*rec)->state, RecordState::kInProgress);
  EXPECT_EQ((*rec)->token, std::get<Acquired>(**takeover).token);
}

// keep_leases, on the system clock: a handler three times as long as the lease keeps its key
// (another worker's Begin midway is Busy) and its batch's waiting messages; without the keeper
// the same handler loses its key to that worker.
class KeptLeasesTest : public ::testing::TestWithParam<bool> {
 protected:
  struct Probe {
    std::vector<std::string> answers;  // what another worker's Begin of "slow" got, midway
    int runs = 0;
  };

  // One round over "slow" (a handler of 2.5 s) and "next", with 1 s leases.
  Probe RunSlowHandler(bool keep_leases, milliseconds keep_leases_for = milliseconds(0)) {
    broker_.PublishKeyed("p0", "slow");
    broker_.PublishKeyed("p0", "next");
    ConsumerOptions o;
    o.scope = "payments";
    o.lease = milliseconds(1'000);
    o.keep_leases = keep_leases;
    o.keep_leases_for = keep_leases_for;
    o.pipeline = GetParam();
    Probe probe;
    Consumer consumer(
        *store_, broker_,
        [&](const HandlerContext& c, const BrokerMessage&) -> HandlerVerdict {
          if (c.key != "slow") return {Verdict::kSuccess, ""};
          ++probe.runs;
          for (int i = 0; i < 2; ++i) {
            std::this_thread::sleep_for(milliseconds(1'250));
            auto other =
                store_->Begin({.scope = "payments", .key = "slow", .lease = milliseconds(60'000)});
            probe.answers.push_back(other ? std::string(BeginAnswerName(*other)) : "error");
          }
          return {Verdict::kSuccess, "done"};
        },
        o);
    auto n = consumer.RunOnce();
    EXPECT_TRUE(n.has_value()) << n.error().ToString();
    EXPECT_TRUE(consumer.Flush().ok());
    lease_lost_ = consumer.counts().lease_lost;
    return probe;
  }

  std::unique_ptr<Store> store_ = NewMemoryStore({.reclaim_interval = milliseconds(0)});
  FakeBroker broker_;
  std::uint64_t lease_lost_ = 0;
};

TEST_P(KeptLeasesTest, AHandlerLongerThanTheLeaseKeepsItsKeyAndItsBatch) {
  const Probe probe = RunSlowHandler(/*keep_leases=*/true);
  EXPECT_EQ(probe.runs, 1);
  EXPECT_EQ(probe.answers, (std::vector<std::string>{"busy", "busy"}));
  EXPECT_EQ(lease_lost_, 0u);
  EXPECT_EQ(broker_.Acknowledged().size(), 2u);
  EXPECT_EQ(broker_.Redelivered(), 0u);
  EXPECT_GE(broker_.Touched(), 1u);  // "next", waiting behind the handler, was touched
  for (const char* key : {"slow", "next"}) {
    auto rec = store_->Get("payments", key);
    ASSERT_TRUE(rec.has_value() && rec->has_value()) << key;
    EXPECT_EQ((*rec)->state, RecordState::kCompleted) << key;
  }
}

TEST_P(KeptLeasesTest, WithoutTheKeeperTheSameHandlerLosesItsKey) {
  const Probe probe = RunSlowHandler(/*keep_leases=*/false);
  EXPECT_EQ(probe.runs, 1);
  ASSERT_FALSE(probe.answers.empty());
  EXPECT_EQ(probe.answers[0], "acquired");  // taken over: the other worker would run it too
  EXPECT_EQ(lease_lost_, 1u);               // its completion was refused
  auto rec = store_->Get("payments", "slow");
  ASSERT_TRUE(rec.has_value() && rec->has_value());
  EXPECT_EQ((*rec)->state, RecordState::kInProgress);
}

// keep_leases_for bounds a hung handler: extensions stop 1.2 s into the call (the last one
// about 1 s in, good until ~2 s), so the key is still held at 1.25 s and taken over by 2.5 s.
TEST_P(KeptLeasesTest, PastKeepLeasesForAHandlerLosesItsKey) {
  const Probe probe = RunSlowHandler(/*keep_leases=*/true, milliseconds(1'200));
  EXPECT_EQ(probe.runs, 1);
  EXPECT_EQ(probe.answers, (std::vector<std::string>{"busy", "acquired"}));
  EXPECT_EQ(lease_lost_, 1u);  // the hung handler's completion was refused
  auto rec = store_->Get("payments", "slow");
  ASSERT_TRUE(rec.has_value() && rec->has_value());
  EXPECT_EQ((*rec)->state, RecordState::kInProgress);  // the other worker's
}

INSTANTIATE_TEST_SUITE_P(Sequential, KeptLeasesTest, ::testing::Values(false));
INSTANTIATE_TEST_SUITE_P(Pipelined, KeptLeasesTest, ::testing::Values(true));

// Another worker, acting through the store before each begin the consumer makes.
class SharedStore : public FaultyStore {
 public:
  using FaultyStore::FaultyStore;
  std::function<void(const BeginRequest&)> before_begin;
  Result<BeginAnswer> Begin(const BeginRequest& req) override {
    if (before_begin) before_begin(req);
    return FaultyStore::Begin(req);
  }
};

// A Busy wait lasts up to busy_timeout -- by default lease + 1 s, longer than the lease. The
// batch's other keys keep their leases meanwhile (or another worker takes them over while they
// wait their turn), and its messages are touched (or JetStream hands them to another consumer).
TEST_P(ConsumerTest, ABusyWaitKeepsTheBatchsLeasesAndTouchesItsMessages) {
  auto held = store_->Begin({.scope = "payments", .key = "k", .lease = milliseconds(60'000)});
  ASSERT_TRUE(held.has_value() && std::holds_alternative<Acquired>(*held));
  broker_.PublishKeyed("p0", "k");
  broker_.PublishKeyed("p1", "x");
  SharedStore shared(*store_);
  const Timestamp start = clock_.Now();  // when "x" is begun, with a 10 s lease
  std::optional<Result<BeginAnswer>> other;
  shared.before_begin = [&](const BeginRequest& req) {
    if (req.key == "k" && !other && clock_.Now() - start >= milliseconds(10'500)) {
      other = store_->Begin({.scope = "payments", .key = "x", .lease = milliseconds(10'000)});
    }
  };
  Consumer consumer(shared, broker_, Recording(), Options());
  ASSERT_TRUE(Round(consumer).has_value());
  EXPECT_GE(clock_.Now() - start, milliseconds(11'000));  // the wait ran to busy_timeout
  ASSERT_TRUE(other.has_value() && other->has_value());
  EXPECT_TRUE(std::holds_alternative<Busy>(**other)) << "x was taken over during the wait";
  const std::vector<std::vector<std::string>> calls = broker_.TouchCalls();
  ASSERT_FALSE(calls.empty());
  EXPECT_EQ(calls.front(), (std::vector<std::string>{"p0:0", "p1:0"}));
  ASSERT_EQ(runs_.size(), 1u);
  EXPECT_EQ(runs_[0].key, "x");
  EXPECT_EQ(broker_.Acknowledged().size(), 1u);
  EXPECT_EQ(broker_.Redelivered(), 1u);  // k, still held by the other worker
}

// Pipelined, a batch's leases start when its begins are sent, before the previous batch is
// finished (which waits for its completions); extensions are timed from then, not from when
// the handlers start.
// Only a pipelined round finishes a batch after the next one's begins: this suite runs
// pipelined alone.
class PipelinedConsumerTest : public ConsumerTest {};

TEST_P(PipelinedConsumerTest, LeasesAreExtendedFromWhenTheyWereBegun) {
  broker_.PublishKeyed("p0", "a");
  std::optional<Result<BeginAnswer>> other;
  Consumer consumer(
      *store_, broker_,
      [&](const HandlerContext& c, const BrokerMessage&) -> HandlerVerdict {
        if (c.key == "b1") clock_.Advance(milliseconds(3'000));
        if (c.key == "b2") {
          clock_.Advance(milliseconds(2'000));
          other = store_->Begin({.scope = "payments", .key = "b2", .lease = milliseconds(10'000)});
        }
        return {Verdict::kSuccess, ""};
      },
      Options());                               // 10 s leases
  ASSERT_TRUE(consumer.RunOnce().has_value());  // "a" is begun; it runs in the next round
  broker_.PublishKeyed("p0", "b1");
  broker_.PublishKeyed("p0", "b2");
  const Timestamp begun = clock_.Now();
  bool slow = true;  // finishing "a"'s batch takes 6 s while b1's and b2's leases run
  broker_.BeforeAcknowledge([&] {
    if (std::exchange(slow, false)) clock_.Advance(milliseconds(6'000));
  });
  ASSERT_TRUE(Round(consumer).has_value());
  EXPECT_EQ(clock_.Now() - begun, milliseconds(11'000));
  ASSERT_TRUE(other.has_value() && other->has_value());
  EXPECT_TRUE(std::holds_alternative<Busy>(**other)) << "b2's lease ran out before it ran";
  EXPECT_EQ(broker_.Acknowledged().size(), 3u);
}

// Counts the batch calls it forwards to the store behind it.
class BatchCountingStore : public FaultyStore {
 public:
  using FaultyStore::FaultyStore;
  std::vector<Result<BeginAnswer>> BeginBatch(std::span<const BeginRequest> reqs) override {
    ++begin_batches;
    return inner().BeginBatch(reqs);
  }
  std::vector<Result<WriteAnswer>> CompleteBatch(std::span<const CompleteRequest> reqs) override {
    ++complete_batches;
    return inner().CompleteBatch(reqs);
  }
  bool StartBatch(std::span<const BeginRequest> begins, std::span<const CompleteRequest> completes,
                  std::function<void(BatchAnswers)> done) override {
    ++started;
    return inner().StartBatch(begins, completes, std::move(done));
  }
  std::atomic<int> begin_batches{0}, complete_batches{0}, started{0};
};

// Pipelined, a batch's begins and the previous batch's completions go to the store as one
// batch (one group commit of the log store), while the next batch is polled.
TEST_P(PipelinedConsumerTest, TheLogStoreSyncsOncePerBatch) {
  testing::FaultyFileSystem fs;
  const std::string dir = LogDir("syncs");
  auto log = OpenLog(fs, dir);
  ASSERT_TRUE(log.has_value()) << log.error().ToString();
  BatchCountingStore counting(**log);
  constexpr int kBatches = 8;
  auto options = Options();
  options.batch_size = 16;
  for (int i = 0; i < kBatches * 16; ++i) {
    broker_.PublishKeyed("p" + std::to_string(i % 4), "k" + std::to_string(i));
  }
  {
    Consumer consumer(counting, broker_, Recording(), options);
    const std::uint64_t syncs = fs.syncs();
    int rounds = 0;
    while (broker_.Queued() > 0 && rounds++ < 100) ASSERT_TRUE(consumer.RunOnce().has_value());
    EXPECT_EQ(rounds, kBatches);
    EXPECT_TRUE(consumer.Flush().ok());
    // One store batch a polled batch, and one for the last completions; never begins and
    // completions apart.
    EXPECT_EQ(counting.started.load(), kBatches + 1);
    EXPECT_EQ(counting.begin_batches.load(), 0);
    EXPECT_EQ(counting.complete_batches.load(), 0);
    // Each is one group commit, unless the log writer's flusher, awake from a sync, takes a
    // batch's first records before the rest are in and splits it over two (TSan CI runs saw
    // 10 and 14 syncs). So this only bounds them, at two each; the calls above are what show
    // that begins and completions go together.
    EXPECT_LE(fs.syncs() - syncs, static_cast<std::uint64_t>(2 * (kBatches + 1)));
  }
  EXPECT_EQ(runs_.size(), static_cast<std::size_t>(kBatches * 16));
  EXPECT_EQ(broker_.Acknowledged().size(), static_cast<std::size_t>(kBatches * 16));
  std::map<std::string, std::vector<int>> order;
  for (const Run& r : runs_) order[r.partition].push_back(std::stoi(r.key.substr(1)));
  for (const auto& [p, ks] : order) EXPECT_TRUE(std::is_sorted(ks.begin(), ks.end())) << p;
  log->reset();
  std::filesystem::remove_all(dir);
}

// Pipelined, a batch runs only once the completions of the batch before it are stored: when
// they fail, the later messages of their partitions go back unrun, even those of a batch that
// was begun meanwhile.
TEST_P(PipelinedConsumerTest, ABatchRunsOnlyAfterThePreviousBatchsCompletionsAreStored) {
  FaultyStore faulty(*store_);
  for (const char* k : {"a", "b", "c"}) broker_.PublishKeyed("p0", k);
  auto options = Options();
  options.batch_size = 1;  // batches: [a] [b] [c]
  Consumer consumer(faulty, broker_, Recording(), options);
  ASSERT_TRUE(consumer.RunOnce().has_value());  // polls [a], begins it
  EXPECT_TRUE(runs_.empty());
  faulty.Fail(FaultyStore::kComplete);
  ASSERT_TRUE(consumer.RunOnce().has_value());  // polls [b], runs a, sends a's completion
  ASSERT_EQ(runs_.size(), 1u);
  // Polls [c] and takes the failure of a's completion (after its retries): b, begun already,
  // and c, polled, go back with a, and neither runs.
  EXPECT_FALSE(consumer.RunOnce().has_value());
  EXPECT_EQ(runs_.size(), 1u);
  EXPECT_TRUE(broker_.Acknowledged().empty());
  EXPECT_EQ(broker_.Redelivered(), 3u);
  auto b = store_->Get("payments", "b");
  ASSERT_TRUE(b.has_value());
  EXPECT_FALSE(b->has_value()) << "b's key was released, not left held";
  faulty.Heal();
  Drain(consumer);
  std::vector<std::string> keys;
  for (const Run& r : runs_) keys.push_back(r.key);
  EXPECT_EQ(keys, (std::vector<std::string>{"a", "a", "b", "c"}));
  EXPECT_EQ(broker_.Acknowledged().size(), 3u);
}

// Pipelined, the batch polled behind a batch that waits (here for a key another worker holds)
// waits unbegun: its messages are touched too, after the waiting batch's, so the broker does not
// redeliver them (nor another consumer claim them) ahead of the older ones.
TEST_P(PipelinedConsumerTest, ABusyWaitTouchesTheBatchPolledBehindIt) {
  auto held = store_->Begin({.scope = "payments", .key = "k", .lease = milliseconds(60'000)});
  ASSERT_TRUE(held.has_value() && std::holds_alternative<Acquired>(*held));
  broker_.PublishKeyed("p0", "k");
  broker_.PublishKeyed("p0", "y");
  auto options = Options();
  options.batch_size = 1;  // batches: [k] [y]
  Consumer consumer(*store_, broker_, Recording(), options);
  ASSERT_TRUE(consumer.RunOnce().has_value());  // polls [k], begins it: Busy
  ASSERT_TRUE(consumer.RunOnce().has_value());  // polls [y]; k waits until busy_timeout
  const std::vector<std::vector<std::string>> calls = broker_.TouchCalls();
  ASSERT_FALSE(calls.empty());
  EXPECT_EQ(calls.front(), (std::vector<std::string>{"p0:0", "p0:1"}));
  EXPECT_TRUE(consumer.Flush().ok());
  EXPECT_TRUE(runs_.empty()) << "y went back with k, unrun";
  EXPECT_EQ(broker_.Redelivered(), 2u);
}

TEST_P(ConsumerTest, StopEndsRunAndReleasesKeysNotRun) {
  broker_.PublishKeyed("p0", "first");
  broker_.PublishKeyed("p0", "second");
  Consumer* self = nullptr;
  Consumer consumer(
      *store_, broker_,
      [&](const HandlerContext&, const BrokerMessage&) -> HandlerVerdict {
        self->Stop();
        return {Verdict::kSuccess, ""};
      },
      Options());
  self = &consumer;
  consumer.Run();  // returns: the handler stopped it
  EXPECT_EQ(broker_.Acknowledged().size(), 1u);
  EXPECT_EQ(broker_.Queued(), 1u);
  auto rec = store_->Get("payments", "second");
  ASSERT_TRUE(rec.has_value());
  EXPECT_FALSE(rec->has_value());
}

// Stop() during a retry's backoff ends the wait without running the retry: it used to run at
// once, and with no attempts left dead-lettered the message as the consumer stopped.
TEST_P(ConsumerTest, StopDuringABackoffRunsNoRetry) {
  broker_.PublishKeyed("p0", "flaky");
  auto options = Options();
  options.clock = nullptr;  // real waits, which Stop() cuts short
  options.backoff = milliseconds(5'000);
  options.max_backoff = milliseconds(5'000);
  options.jitter = 0;
  options.max_attempts = 2;
  std::atomic<int> calls{0};
  Consumer consumer(
      *store_, broker_,
      [&](const HandlerContext&, const BrokerMessage&) -> HandlerVerdict {
        ++calls;
        return {Verdict::kRetryable, "try later"};
      },
      options);
  const auto started = std::chrono::steady_clock::now();
  std::thread run([&] { consumer.Run(); });
  while (calls.load() == 0 &&
         std::chrono::steady_clock::now() - started < std::chrono::seconds(5)) {
    std::this_thread::sleep_for(milliseconds(5));
  }
  std::this_thread::sleep_for(milliseconds(200));  // well inside the 5 s backoff
  consumer.Stop();
  run.join();
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(4));
  EXPECT_EQ(calls.load(), 1);
  EXPECT_TRUE(broker_.DeadLetters().empty());
  EXPECT_TRUE(broker_.Acknowledged().empty());
  EXPECT_EQ(consumer.counts().retries, 0u);
  auto rec = store_->Get("payments", "flaky");
  ASSERT_TRUE(rec.has_value());
  EXPECT_FALSE(rec->has_value()) << "the key was not released";
}

TEST_P(ConsumerTest, AdjacentBatchesSharingKeysRunEachKeyOnceInOrder) {
  // Copies of a key a few messages later land in the next batch, which (pipelined) is polled
  // while the first copy's completion is still being stored.
  std::vector<std::string> keys;
  for (int i = 0; i < 40; ++i) {
    const int k = (i % 3 == 2) ? i - 2 : i;  // every third message repeats an earlier key
    broker_.PublishKeyed("p" + std::to_string(k % 2), "k" + std::to_string(100 + k));
  }
  auto options = Options();
  options.batch_size = 5;
  Consumer consumer(*store_, broker_, Recording(), options);
  Drain(consumer);
  std::map<std::string, int> per_key;
  std::map<std::string, std::vector<int>> order;
  for (const Run& r : runs_) {
    ++per_key[r.key];
    order[r.partition].push_back(std::stoi(r.key.substr(1)));
  }
  for (const auto& [key, n] : per_key) EXPECT_EQ(n, 1) << key;
  for (const auto& [p, ks] : order) EXPECT_TRUE(std::is_sorted(ks.begin(), ks.end())) << p;
  EXPECT_EQ(broker_.Acknowledged().size(), 40u);
  EXPECT_EQ(consumer.counts().replayed, 40u - per_key.size());
}

TEST_P(ConsumerTest, ACompletionThatFailsKeepsItsPartitionInOrder) {
  FaultyStore faulty(*store_);
  for (const char* k : {"a", "b", "c", "d"}) broker_.PublishKeyed("p0", k);
  for (const char* k : {"x", "y"}) broker_.PublishKeyed("p1", k);
  auto options = Options();
  options.batch_size = 2;  // batches: [a x] [b y] [c d]
  Consumer consumer(faulty, broker_, Recording(), options);
  faulty.Fail(FaultyStore::kComplete);
  (void)consumer.RunOnce();  // sequential: runs a and x; their completions fail
  if (GetParam()) {
    // Pipelined, the first round only begins [a x]; the second polls [b y], runs a and x and
    // sends their completions with b's and y's begins (they fail); the third polls [c d] and
    // takes the failure. b, y, c and d must not run before a and x run again, so they go back
    // with them.
    (void)consumer.RunOnce();
    (void)consumer.RunOnce();
  }
  faulty.Heal();
  Drain(consumer);
  std::map<std::string, std::vector<std::string>> order;
  for (const Run& r : runs_) order[r.partition].push_back(r.key);
  EXPECT_EQ(order["p0"], (std::vector<std::string>{"a", "a", "b", "c", "d"}));
  EXPECT_EQ(order["p1"], (std::vector<std::string>{"x", "x", "y"}));
  EXPECT_EQ(broker_.Acknowledged().size(), 6u);
  for (const char* k : {"a", "b", "c", "d", "x", "y"}) {
    auto rec = store_->Get("payments", k);
    ASSERT_TRUE(rec.has_value() && rec->has_value()) << k;
    EXPECT_EQ((*rec)->state, RecordState::kCompleted) << k;
  }
}

// Many consumers over one store, each message delivered to two of them (a redelivery racing
// the first delivery): every key runs once.
// The standard idem_* metrics of a consumer (SPEC §7), as metrics.h says the front doors count
// them. `registry_` gives back the consumer's own series.
class ConsumerMetricsTest : public ConsumerTest {
 protected:
  Metrics metrics_{registry_, "payments"};
};

// A key another worker holds is begun again until it is decided: the delivery counts the answer
// it ended with, once (it counted a busy for the batch's answer and one for every poll).
TEST_P(ConsumerMetricsTest, ABusyWaitCountsTheAnswerItEndedWithOnce) {
  auto held = store_->Begin({.scope = "payments", .key = "k", .lease = milliseconds(10'000)});
  ASSERT_TRUE(held.has_value() && std::holds_alternative<Acquired>(*held));
  broker_.PublishKeyed("p0", "k");
  Consumer consumer(*store_, broker_, Recording(), Options());
  ASSERT_TRUE(Round(consumer).has_value());
  ASSERT_EQ(runs_.size(), 1u);
  EXPECT_EQ(runs_[0].attempt, 2u);
  EXPECT_EQ(metrics_.begin_busy->Value(), 0u);
  EXPECT_EQ(metrics_.begin_acquired->Value(), 1u);
  EXPECT_EQ(metrics_.takeovers->Value(), 1u);
  EXPECT_GT(metrics_.store_begin_seconds->Count(), 2u);  // it did poll
  EXPECT_EQ(metrics_.complete_success->Value(), 1u);
  EXPECT_EQ(metrics_.handler_seconds->Count(), 1u);
}

// A worker that died holding an entity's version 1: version 2 takes its run over at attempt 1
// (its own first run), which is counted as a takeover all the same.
TEST_P(ConsumerMetricsTest, AVersionTakingOverAnotherVersionsRunCountsATakeover) {
  ASSERT_TRUE(store_->BeginVersioned({"payments", "a", 1, milliseconds(1'000)}).has_value());
  clock_.Advance(milliseconds(1'000));
  broker_.Publish("p0", "{}", {{"Entity-Id", "a"}, {"Entity-Version", "2"}});
  auto options = Options();
  options.versions = VersionSources{};
  Consumer consumer(*store_, broker_, Recording(), options);
  Drain(consumer);
  ASSERT_EQ(runs_.size(), 1u);
  EXPECT_EQ(runs_[0].key, "a#2");
  EXPECT_EQ(runs_[0].attempt, 1u);
  EXPECT_EQ(metrics_.takeovers->Value(), 1u);
  EXPECT_EQ(metrics_.begin_acquired->Value(), 1u);
  EXPECT_EQ(metrics_.complete_success->Value(), 1u);
}

// Past busy_timeout the message goes back: one busy for the delivery, however often it polled.
// The one behind it in its partition was acquired and is released, not run.
TEST_P(ConsumerMetricsTest, ABusyKeyGivenUpOnCountsOneBusy) {
  auto held = store_->Begin({.scope = "payments", .key = "k", .lease = milliseconds(60'000)});
  ASSERT_TRUE(held.has_value());
  broker_.PublishKeyed("p0", "k");
  broker_.PublishKeyed("p0", "after-k");
  auto options = Options();
  options.busy_timeout = milliseconds(2'000);
  Consumer consumer(*store_, broker_, Recording(), options);
  ASSERT_TRUE(Round(consumer).has_value());
  EXPECT_TRUE(runs_.empty());
  EXPECT_EQ(metrics_.begin_busy->Value(), 1u);
  EXPECT_EQ(metrics_.begin_acquired->Value(), 1u);  // after-k
  EXPECT_EQ(metrics_.releases->Value(), 1u);
  EXPECT_EQ(metrics_.store_release_seconds->Count(), 1u);
  EXPECT_EQ(metrics_.complete_success->Value(), 0u);
}

// A begin the store fails is one store error, in counts() and in idem_store_errors_total alike
// (the metric counted it twice: when answered, and again when its message was handed back).
TEST_P(ConsumerMetricsTest, AFailedBeginIsOneStoreError) {
  FaultyStore faulty(*store_);
  broker_.PublishKeyed("p0", "a");
  broker_.Publish("p1", "{}", {{"Entity-Id", "e"}, {"Entity-Version", "1"}});
  auto options = Options();
  options.versions = VersionSources{};
  Consumer consumer(faulty, broker_, Recording(), options);
  faulty.Fail(FaultyStore::kBegin | FaultyStore::kVersion);
  ASSERT_FALSE(Round(consumer).has_value());
  EXPECT_TRUE(runs_.empty());
  EXPECT_EQ(consumer.counts().store_errors, 2u);
  EXPECT_EQ(metrics_.store_errors->Value(), 2u);
  EXPECT_EQ(metrics_.begin_acquired->Value(), 0u);
}

// Each failed completion answer of each try is a store error, as in the receiver (it counted
// one per message after its three tries).
TEST_P(ConsumerMetricsTest, EachFailedCompletionTryIsAStoreError) {
  FaultyStore faulty(*store_);
  broker_.PublishKeyed("p0", "a");
  Consumer consumer(faulty, broker_, Recording(), Options());
  faulty.Fail(FaultyStore::kComplete);
  ASSERT_FALSE(Round(consumer).has_value());
  EXPECT_EQ(runs_.size(), 1u);
  EXPECT_EQ(consumer.counts().store_errors, 3u);
  EXPECT_EQ(metrics_.store_errors->Value(), 3u);
  EXPECT_EQ(metrics_.store_complete_seconds->Count(), 3u);
  EXPECT_EQ(metrics_.complete_success->Value(), 0u);
}

// A key released because its message goes back (a dead-letter publish failed) is counted; a
// release the store fails is a store error (neither was counted).
TEST_P(ConsumerMetricsTest, ReleasesAndFailedReleasesAreCounted) {
  FaultyStore faulty(*store_);
  broker_.PublishKeyed("p0", "perm");
  broker_.PublishKeyed("p0", "next");
  broker_.FailDeadLetter(true);
  Consumer consumer(
      faulty, broker_,
      [&](const HandlerContext& c, const BrokerMessage&) -> HandlerVerdict {
        if (c.key == "perm") return {Verdict::kPermanent, "rejected"};
        return {Verdict::kSuccess, ""};
      },
      Options());
  ASSERT_FALSE(Round(consumer).has_value());
  EXPECT_EQ(metrics_.releases->Value(), 2u);  // perm (not run again here) and next (not run)
  EXPECT_EQ(metrics_.dlq_sends->Value(), 0u);
  EXPECT_EQ(metrics_.store_errors->Value(), 0u);

  faulty.Fail(FaultyStore::kRelease);
  ASSERT_FALSE(Round(consumer).has_value());
  EXPECT_EQ(metrics_.releases->Value(), 2u);
  EXPECT_EQ(metrics_.store_errors->Value(), 2u);
  EXPECT_EQ(consumer.counts().store_errors, 2u);
  EXPECT_EQ(metrics_.store_release_seconds->Count(), 4u);
}

// Copies of a key in one batch are answered without a Begin of their own: the same payload counts
// idem_coalesced_total, another payload a conflict (neither was counted). Poison goes straight to
// the DLQ, counted; the conflict too.
TEST_P(ConsumerMetricsTest, InBatchCopiesPoisonAndConflictsAreCounted) {
  broker_.Publish("p0", R"({"id":"a","n":1})");
  broker_.Publish("p1", R"({"id":"a","n":1})");
  broker_.Publish("p0", R"({"id":"a","n":1})");
  broker_.Publish("p0", R"({"id":"a","n":2})");
  broker_.Publish("p0", R"({"n":3})");  // no key
  broker_.Publish("p1", R"({"id":"b"})");
  auto options = Options();
  options.key_source = KeySource::JsonPointer("/id");
  options.fingerprint = FingerprintMode::kJson;
  Consumer consumer(*store_, broker_, Recording(), options);
  ASSERT_TRUE(Round(consumer).has_value());
  ASSERT_EQ(runs_.size(), 2u);
  EXPECT_EQ(broker_.Acknowledged().size(), 6u);
  EXPECT_EQ(metrics_.begin_acquired->Value(), 2u);
  EXPECT_EQ(metrics_.coalesced->Value(), 2u);
  EXPECT_EQ(metrics_.begin_conflict->Value(), 1u);
  EXPECT_EQ(metrics_.begin_replay->Value(), 0u);
  EXPECT_EQ(metrics_.dlq_sends->Value(), 2u);  // the poison and the conflict
  EXPECT_EQ(consumer.counts().dead_lettered, 2u);
  EXPECT_EQ(metrics_.complete_success->Value(), 2u);
  EXPECT_EQ(metrics_.store_begin_seconds->Count(), 1u);  // one BeginBatch

  // Redelivered, every copy is a replay from the store.
  broker_.Publish("p0", R"({"id":"a","n":1})");
  broker_.Publish("p0", R"({"id":"b"})");
  ASSERT_TRUE(Round(consumer).has_value());
  EXPECT_EQ(metrics_.begin_replay->Value(), 2u);
  EXPECT_EQ(runs_.size(), 2u);
}

// A handler that exhausts its attempts is dead-lettered and its key completed as a failure;
// handler time is observed once per run.
TEST_P(ConsumerMetricsTest, ADeadLetteredKeyCountsAFailedCompletionAndEveryRun) {
  broker_.PublishKeyed("p0", "bad");
  Consumer consumer(
      *store_, broker_,
      [](const HandlerContext&, const BrokerMessage&) -> HandlerVerdict {
        return {Verdict::kRetryable, "down"};
      },
      Options());
  ASSERT_TRUE(Round(consumer).has_value());
  EXPECT_EQ(metrics_.handler_seconds->Count(), 3u);  // max_attempts
  EXPECT_EQ(metrics_.dlq_sends->Value(), 1u);
  EXPECT_EQ(metrics_.complete_failure->Value(), 1u);
  EXPECT_EQ(metrics_.complete_success->Value(), 0u);
  EXPECT_EQ(metrics_.begin_acquired->Value(), 1u);
}

INSTANTIATE_TEST_SUITE_P(Pipeline, ConsumerMetricsTest, ::testing::Bool(),
                         [](const auto& p) { return p.param ? "pipelined" : "sequential"; });

TEST(ConsumerRaceTest, ConcurrentConsumersRunEachKeyOnce) {
  auto store = NewMemoryStore();
  constexpr int kKeys = 2000;
  constexpr int kConsumers = 6;
  std::vector<std::unique_ptr<FakeBroker>> brokers;
  for (int c = 0; c < kConsumers; ++c) brokers.push_back(std::make_unique<FakeBroker>());
  for (int i = 0; i < kKeys; ++i) {
    for (int copy = 0; copy < 2; ++copy) {
      brokers[(i + copy * 3) % kConsumers]->PublishKeyed("p" + std::to_string(i % 4),
                                                         "k" + std::to_string(i));
    }
  }
  std::mutex mu;
  std::map<std::string, int> runs;
  MessageHandler handler = [&](const HandlerContext& c, const BrokerMessage&) -> HandlerVerdict {
    std::lock_guard lock(mu);
    ++runs[std::string(c.key)];
    return {Verdict::kSuccess, ""};
  };
  std::vector<std::thread> threads;
  std::atomic<std::size_t> acknowledged{0};
  for (int c = 0; c < kConsumers; ++c) {
    threads.emplace_back([&, c] {
      ConsumerOptions o;
      o.scope = "race";
      o.batch_size = 50;
      o.lease = milliseconds(30'000);
      o.backoff = milliseconds(1);
      o.pipeline = c % 2 == 0;
      Consumer consumer(*store, *brokers[c], handler, o);
      for (int round = 0; round < 10'000 && brokers[c]->Queued() > 0; ++round) {
        (void)consumer.RunOnce();
      }
      (void)consumer.Flush();
      acknowledged += brokers[c]->Acknowledged().size();
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(acknowledged.load(), 2u * kKeys);
  ASSERT_EQ(runs.size(), static_cast<std::size_t>(kKeys));
  for (const auto& [key, n] : runs) ASSERT_EQ(n, 1) << key;
}

INSTANTIATE_TEST_SUITE_P(Pipeline, ConsumerTest, ::testing::Bool(),
                         [](const auto& p) { return p.param ? "pipelined" : "sequential"; });
INSTANTIATE_TEST_SUITE_P(Pipeline, PipelinedConsumerTest, ::testing::Values(true),
                         [](const auto&) { return "pipelined"; });

// The pool adapters fill recycled messages from (Broker::Recycle): it keeps at most kMaxMessages,
// none holding more than kMaxBytes, and hands back what it kept, last kept first.
TEST(SpareMessagesTest, KeepsAtMostItsBoundAndNoLargeMessage) {
  using internal::SpareMessages;
  SpareMessages spares;
  EXPECT_EQ(spares.size(), 0u);
  EXPECT_TRUE(spares.Take().payload.empty());  // none kept: a new message

  std::vector<BrokerMessage> batch(3);
  batch[0].payload = "small";
  batch[1].payload = std::string(SpareMessages::kMaxBytes + 1, 'x');  // too large: freed
  batch[2].payload = "also small";
  batch[2].headers = {{"Idempotency-Key", "k"}};
  spares.Keep(std::move(batch));
  ASSERT_EQ(spares.size(), 2u);
  const BrokerMessage last = spares.Take();  // blank, but for its header count
  EXPECT_EQ(last.headers.size(), 1u);
  EXPECT_TRUE(spares.Take().headers.empty());
  EXPECT_EQ(spares.size(), 0u);

  // Headers count towards the bound too.
  std::vector<BrokerMessage> heavy(1);
  heavy[0].headers = {{"h", std::string(SpareMessages::kMaxBytes, 'v')}};
  spares.Keep(std::move(heavy));
  EXPECT_EQ(spares.size(), 0u);

  spares.Keep(std::vector<BrokerMessage>(SpareMessages::kMaxMessages + 10));
  EXPECT_EQ(spares.size(), SpareMessages::kMaxMessages);
  spares.Keep(std::vector<BrokerMessage>(5));
  EXPECT_EQ(spares.size(), SpareMessages::kMaxMessages);
}

// A kept message comes back blank but for its storage: nothing of the delivery it held can
// leak into the one an adapter fills in (least of all that delivery's Idempotency-Key).
TEST(SpareMessagesTest, ATakenMessageKeepsItsStorageAndNothingOfItsDelivery) {
  internal::SpareMessages spares;
  std::vector<BrokerMessage> batch(1);
  BrokerMessage& old = batch[0];
  old.partition = "orders/" + std::string(40, 'p');
  old.position = std::string(40, '7');
  old.payload = std::string(200, 'x');
  old.headers = {{"Idempotency-Key", std::string(40, 'k')}, {"trace-id", std::string(40, 't')}};
  old.deliveries = 4;
  old.handle = 99;
  const char* payload_storage = old.payload.data();
  const char* key_storage = old.headers[0].second.data();
  spares.Keep(std::move(batch));

  const BrokerMessage m = spares.Take();
  EXPECT_TRUE(m.partition.empty());
  EXPECT_TRUE(m.position.empty());
  EXPECT_TRUE(m.payload.empty());
  EXPECT_EQ(m.deliveries, 1u);
  EXPECT_EQ(m.handle, 0u);
  ASSERT_EQ(m.headers.size(), 2u);  // the count stays, for SetHeader
  for (const auto& [name, value] : m.headers) {
    EXPECT_TRUE(name.empty());
    EXPECT_TRUE(value.empty());
  }
  EXPECT_EQ(m.payload.data(), payload_storage);
  EXPECT_EQ(m.headers[0].second.data(), key_storage);
}

// SetHeader, then a resize to the count set, fill a header list in place: the strings of the
// entries kept keep their storage.
TEST(SpareMessagesTest, HeadersAreFilledInPlace) {
  std::vector<std::pair<std::string, std::string>> headers = {
      {"old-name-long-enough-for-the-heap", std::string(100, 'v')}, {"b", "2"}, {"c", "3"}};
  const char* storage = headers[0].second.data();
  internal::SetHeader(headers, 0, "k", "v");
  headers.resize(1);
  ASSERT_EQ(headers.size(), 1u);
  EXPECT_EQ(headers[0], (std::pair<std::string, std::string>{"k", "v"}));
  EXPECT_EQ(headers[0].second.data(), storage);
  internal::SetHeader(headers, 1, "new", "");  // one past the end: appended
  headers.resize(2);
  ASSERT_EQ(headers.size(), 2u);
  EXPECT_EQ(headers[1], (std::pair<std::string, std::string>{"new", ""}));
}

}  // namespace
}  // namespace idem
