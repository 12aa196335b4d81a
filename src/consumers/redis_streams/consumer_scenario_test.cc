// idem::Consumer over the Redis Streams broker and the memory store, end to end: retries,
// the dead-letter stream, and a Redis killed and restarted in the middle of a run.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "consumers/redis_streams/testing.h"
#include "idem/consumer.h"
#include "idem/consumers/redis_streams.h"
#include "idem/stores/memory.h"
#include "tests/support/servers.h"

namespace idem::redis_streams {
namespace {

using std::chrono::milliseconds;
using ::testing::ElementsAre;
using SteadyClock = std::chrono::steady_clock;
using testing::PendingCount;
using testing::PendingCountSettled;
using testing::SharedUrl;
using testing::Unique;

RedisStreamsConfig Config(const std::string& url, const std::string& stream) {
  return {.url = url,
          .streams = {stream},
          .group = "g",
          .consumer = "c1",
          .dlq_stream = stream + ".dlq",
          .timeout = milliseconds(2000)};
}

ConsumerOptions Options(std::uint32_t max_attempts) {
  ConsumerOptions o;
  o.name = "scenario";
  o.scope = "scenario";
  o.batch_size = 64;
  o.poll_wait = milliseconds(20);
  o.max_attempts = max_attempts;
  o.backoff = milliseconds(1);
  o.max_backoff = milliseconds(50);
  o.lease = milliseconds(10'000);
  return o;
}

// Rounds until `done` or `timeout`.
template <typename Done>
void RunUntil(Consumer& consumer, Done done, milliseconds timeout = milliseconds(10'000)) {
  const auto deadline = SteadyClock::now() + timeout;
  while (!done() && SteadyClock::now() < deadline) (void)consumer.RunOnce();
}

std::string HeaderOf(const BrokerMessage& m, std::string_view name) {
  for (const auto& [n, v] : m.headers) {
    if (n == name) return v;
  }
  return "<missing>";
}

TEST(RedisStreamsScenarioTest, HandlerFailingTwiceRunsThreeTimesAndIsAcknowledged) {
  const std::string url = SharedUrl();
  const std::string stream = Unique("retry");
  ASSERT_TRUE(Publish(url, stream, "{\"amount\":5}", {{"Idempotency-Key", "pay-1"}}).has_value());
  ASSERT_TRUE(Publish(url, stream, "{\"amount\":5}", {{"Idempotency-Key", "pay-1"}}).has_value());
  auto broker = OpenRedisStreamsConsumer(Config(url, stream));
  ASSERT_TRUE(broker.has_value()) << broker.error().ToString();
  auto store = NewMemoryStore();
  std::vector<std::uint32_t> attempts;
  int effects = 0;
  Consumer consumer(
      *store, **broker,
      [&](const HandlerContext& c, const BrokerMessage& m) -> HandlerVerdict {
        EXPECT_EQ(c.key, "pay-1");
        EXPECT_EQ(m.payload, "{\"amount\":5}");
        attempts.push_back(c.attempt);
        if (attempts.size() <= 2) return {Verdict::kRetryable, "try later"};
        ++effects;
        return {Verdict::kSuccess, "paid"};
      },
      Options(5));
  RunUntil(consumer, [&] {
    const auto c = consumer.counts();
    return c.executed + c.replayed >= 2;
  });
  EXPECT_THAT(attempts, ElementsAre(1u, 2u, 3u));
  EXPECT_EQ(effects, 1);
  const auto counts = consumer.counts();
  EXPECT_EQ(counts.executed, 1u);
  EXPECT_EQ(counts.replayed, 1u);  // the second entry with the same key
  EXPECT_EQ(counts.dead_lettered, 0u);
  EXPECT_EQ(PendingCountSettled(url, stream, 0), 0);
  auto dlq = ReadStream(url, stream + ".dlq");
  ASSERT_TRUE(dlq.has_value());
  EXPECT_TRUE(dlq->empty());
}

TEST(RedisStreamsScenarioTest, HandlerAlwaysFailingIsDeadLetteredAfterMaxAttempts) {
  const std::string url = SharedUrl();
  const std::string stream = Unique("dlq");
  const auto id = Publish(url, stream, "{\"amount\":7}", {{"Idempotency-Key", "pay-7"}});
  ASSERT_TRUE(id.has_value());
  auto broker = OpenRedisStreamsConsumer(Config(url, stream));
  ASSERT_TRUE(broker.has_value()) << broker.error().ToString();
  auto store = NewMemoryStore();
  int runs = 0;
  Consumer consumer(
      *store, **broker,
      [&](const HandlerContext&, const BrokerMessage&) -> HandlerVerdict {
        ++runs;
        return {Verdict::kRetryable, "downstream is down"};
      },
      Options(3));
  RunUntil(consumer, [&] { return consumer.counts().dead_lettered >= 1; });
  EXPECT_EQ(runs, 3);
  EXPECT_EQ(consumer.counts().dead_lettered, 1u);
  auto dlq = ReadStream(url, stream + ".dlq");
  ASSERT_TRUE(dlq.has_value()) << dlq.error().ToString();
  ASSERT_EQ(dlq->size(), 1u);
  const BrokerMessage& d = dlq->front();
  EXPECT_EQ(d.payload, "{\"amount\":7}");
  EXPECT_EQ(HeaderOf(d, "Idempotency-Key"), "pay-7");
  EXPECT_EQ(HeaderOf(d, kDlqReasonHeader), "attempts_exhausted");
  EXPECT_EQ(HeaderOf(d, kDlqAttemptsHeader), "3");
  EXPECT_EQ(HeaderOf(d, kDlqErrorHeader), "downstream is down");
  EXPECT_EQ(HeaderOf(d, kDlqKeyHeader), "pay-7");
  EXPECT_EQ(HeaderOf(d, kDlqSourceHeader), stream + "@" + *id);
  EXPECT_EQ(PendingCountSettled(url, stream, 0), 0);
  // Settled: more rounds neither run it nor dead-letter it again.
  for (int i = 0; i < 3; ++i) (void)consumer.RunOnce();
  EXPECT_EQ(runs, 3);
  EXPECT_EQ(ReadStream(url, stream + ".dlq")->size(), 1u);
}

TEST(RedisStreamsScenarioTest, BrokerRestartMidRunExecutesEveryKeyExactlyOnce) {
  constexpr int kMessages = 3000;
  const auto dir = std::filesystem::temp_directory_path() / Unique("restart");
  auto port = idem::testing::FreePort();
  ASSERT_TRUE(port.has_value());
  auto server = idem::testing::RedisServer::Start(
      dir, *port, {"--appendonly", "yes", "--appendfsync", "always"});
  ASSERT_TRUE(server.has_value()) << server.error().ToString();
  const std::string url = "redis://" + server->address();
  const std::string stream = "orders";

  std::vector<StreamEntry> entries;
  for (int i = 0; i < kMessages; ++i) {
    entries.push_back({.payload = "{\"order\":" + std::to_string(i) + "}",
                       .headers = {{"Idempotency-Key", "order-" + std::to_string(i)}}});
  }
  ASSERT_TRUE(Publish(url, stream, entries).ok());

  auto broker = OpenRedisStreamsConsumer(Config(url, stream));
  ASSERT_TRUE(broker.has_value()) << broker.error().ToString();
  auto store = NewMemoryStore();
  std::mutex mu;
  std::map<std::string, int> runs;  // guarded by mu
  std::atomic<int> distinct{0};
  auto options = Options(5);
  options.batch_size = 50;
  Consumer consumer(
      *store, **broker,
      [&](const HandlerContext& c, const BrokerMessage&) -> HandlerVerdict {
        std::this_thread::sleep_for(std::chrono::microseconds(200));  // a run takes a while
        std::lock_guard lock(mu);
        if (++runs[std::string(c.key)] == 1) ++distinct;
        return {Verdict::kSuccess, "done"};
      },
      options);
  std::thread worker([&] { consumer.Run(); });

  auto wait_for = [&](auto done, milliseconds timeout) {
    const auto deadline = SteadyClock::now() + timeout;
    while (!done() && SteadyClock::now() < deadline) {
      std::this_thread::sleep_for(milliseconds(5));
    }
    return done();
  };
  ASSERT_TRUE(wait_for([&] { return distinct.load() >= kMessages / 3; }, milliseconds(20'000)));
  ASSERT_TRUE(server->Kill().ok());
  const int at_kill = distinct.load();
  std::this_thread::sleep_for(milliseconds(300));  // the consumer meets a dead broker
  EXPECT_GT(consumer.counts().broker_errors, 0u);
  ASSERT_TRUE(server->Restart().ok());

  const bool all = wait_for([&] { return distinct.load() == kMessages; }, milliseconds(30'000));
  const bool acked = wait_for([&] { return PendingCount(url, stream) == 0; }, milliseconds(10'000));
  consumer.Stop();
  worker.join();

  EXPECT_LT(at_kill, kMessages) << "the run ended before the kill";
  EXPECT_TRUE(all) << distinct.load() << " of " << kMessages << " keys ran";
  EXPECT_TRUE(acked) << PendingCount(url, stream) << " entries still pending";
  std::lock_guard lock(mu);
  ASSERT_EQ(runs.size(), static_cast<std::size_t>(kMessages));
  for (const auto& [key, n] : runs) EXPECT_EQ(n, 1) << key;
  const auto c = consumer.counts();
  EXPECT_EQ(c.executed, static_cast<std::uint64_t>(kMessages));
  EXPECT_EQ(c.dead_lettered, 0u);
  (void)server->Kill();
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}

}  // namespace
}  // namespace idem::redis_streams
