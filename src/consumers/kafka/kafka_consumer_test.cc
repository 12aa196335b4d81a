// idem::Consumer over the Kafka adapter, end to end against the mock cluster with the memory
// store: retries in place, dead letters, and a rebalance while messages are in flight.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "consumers/kafka/kafka_test_cluster.h"
#include "idem/consumer.h"
#include "idem/consumers/kafka.h"
#include "idem/stores/memory.h"
#include "tests/support/consumer_helpers.h"

namespace idem::kafka {
namespace {

using idem::testing::HeaderOf;
using idem::testing::RunUntil;
using testing::CommittedOffset;
using ::testing::ElementsAre;
using testing::MockCluster;
using testing::PublishNumbered;
using testing::TestConfig;
using testing::UniqueName;
using namespace std::chrono_literals;
using SteadyClock = std::chrono::steady_clock;

ConsumerOptions FastOptions() {
  ConsumerOptions o;
  o.name = "kafka-test";
  o.scope = "kafka-test";
  o.batch_size = 16;
  o.poll_wait = 50ms;
  o.backoff = 10ms;
  o.max_backoff = 50ms;
  o.max_attempts = 5;
  return o;
}

class KafkaConsumerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    topic_ = UniqueName("events");
    dlq_ = topic_ + ".dlq";
    auto cluster = MockCluster::Start({topic_ + ":4", dlq_ + ":1"});
    ASSERT_TRUE(cluster) << cluster.error().ToString();
    cluster_.emplace(std::move(*cluster));
    auto producer = Producer::Open(cluster_->bootstrap());
    ASSERT_TRUE(producer) << producer.error().ToString();
    producer_.emplace(std::move(*producer));
    store_ = NewMemoryStore();
  }

  std::unique_ptr<Broker> Open(const std::string& group) {
    auto broker = OpenKafkaConsumer(TestConfig(cluster_->bootstrap(), group, {topic_}, dlq_));
    EXPECT_TRUE(broker) << broker.error().ToString();
    return broker ? std::move(*broker) : nullptr;
  }

  // The rebalance scenario, with or without ConsumerOptions::pipeline.
  void Rebalance(bool pipeline);

  std::string topic_;
  std::string dlq_;
  std::optional<MockCluster> cluster_;
  std::optional<Producer> producer_;
  std::unique_ptr<Store> store_;
};

TEST_F(KafkaConsumerTest, AHandlerThatFailsTwiceRunsThreeTimesAndIsAcknowledged) {
  ASSERT_TRUE(producer_->Publish(topic_, 2, "", "pay", {{"Idempotency-Key", "order-1"}}).ok());
  ASSERT_TRUE(producer_->Flush(10s).ok());
  const std::string group = UniqueName("g");
  auto broker = Open(group);
  ASSERT_NE(broker, nullptr);
  std::vector<std::uint32_t> attempts;
  int effects = 0;
  Consumer consumer(
      *store_, *broker,
      [&](const HandlerContext& ctx, const BrokerMessage& m) -> HandlerVerdict {
        EXPECT_EQ(ctx.key, "order-1");
        EXPECT_EQ(m.payload, "pay");
        attempts.push_back(ctx.attempt);
        if (attempts.size() < 3) return {Verdict::kRetryable, "not yet"};
        ++effects;
        return {Verdict::kSuccess, "done"};
      },
      FastOptions());
  ASSERT_TRUE(RunUntil(consumer, 30s, [&] { return consumer.counts().executed == 1; }));
  EXPECT_THAT(attempts, ElementsAre(1u, 2u, 3u));
  EXPECT_EQ(effects, 1);
  const ConsumerCounts counts = consumer.counts();
  EXPECT_EQ(counts.retries, 2u);
  EXPECT_EQ(counts.dead_lettered, 0u);
  ASSERT_TRUE(consumer.Flush().ok());  // the last commit answered
  auto committed = CommittedOffset(cluster_->bootstrap(), group, topic_, 2);
  ASSERT_TRUE(committed) << committed.error().ToString();
  EXPECT_EQ(*committed, 1);
}

TEST_F(KafkaConsumerTest, AHandlerThatAlwaysFailsIsDeadLetteredAfterMaxAttempts) {
  ASSERT_TRUE(producer_->Publish(topic_, 0, "kk", "x", {{"Idempotency-Key", "bad-1"}}).ok());
  ASSERT_TRUE(producer_->Publish(topic_, 0, "", "no key here", {}).ok());
  ASSERT_TRUE(producer_->Flush(10s).ok());
  const std::string group = UniqueName("g");
  auto broker = Open(group);
  ASSERT_NE(broker, nullptr);
  std::vector<std::uint32_t> attempts;
  ConsumerOptions options = FastOptions();
  options.max_attempts = 3;
  Consumer consumer(
      *store_, *broker,
      [&](const HandlerContext& ctx, const BrokerMessage&) -> HandlerVerdict {
        attempts.push_back(ctx.attempt);
        return {Verdict::kRetryable, "downstream says no"};
      },
      options);
  ASSERT_TRUE(RunUntil(consumer, 30s, [&] { return consumer.counts().dead_lettered == 2; }));
  EXPECT_THAT(attempts, ElementsAre(1u, 2u, 3u));
  EXPECT_EQ(consumer.counts().poison, 1u);
  ASSERT_TRUE(consumer.Flush().ok());
  auto committed = CommittedOffset(cluster_->bootstrap(), group, topic_, 0);
  ASSERT_TRUE(committed);
  EXPECT_EQ(*committed, 2);

  auto dlq = ReadTopic(cluster_->bootstrap(), dlq_, 10s);
  ASSERT_TRUE(dlq) << dlq.error().ToString();
  ASSERT_EQ(dlq->size(), 2u);
  const TopicMessage& exhausted = (*dlq)[0];
  EXPECT_EQ(exhausted.payload, "x");
  EXPECT_EQ(exhausted.key, "kk");
  EXPECT_EQ(HeaderOf(exhausted.headers, "Idempotency-Key"), "bad-1");
  EXPECT_EQ(HeaderOf(exhausted.headers, kDlqReasonHeader), "attempts_exhausted");
  EXPECT_EQ(HeaderOf(exhausted.headers, kDlqAttemptsHeader), "3");
  EXPECT_EQ(HeaderOf(exhausted.headers, kDlqErrorHeader), "downstream says no");
  EXPECT_EQ(HeaderOf(exhausted.headers, kDlqKeyHeader), "bad-1");
  EXPECT_EQ(HeaderOf(exhausted.headers, kDlqSourceHeader), topic_ + "/0@0");
  const TopicMessage& poison = (*dlq)[1];
  EXPECT_EQ(poison.payload, "no key here");
  EXPECT_EQ(poison.key, std::nullopt);
  EXPECT_EQ(HeaderOf(poison.headers, kDlqReasonHeader), "no_key");
  EXPECT_EQ(HeaderOf(poison.headers, kDlqSourceHeader), topic_ + "/0@1");
}

// Two consumers of one group over 4 partitions; the second joins while the first is in the
// middle of a batch with a slow handler. The cooperative rebalance moves partitions only
// between batches (inside Poll), a commit that fails meanwhile makes the new owner read again
// from the last commit, and the store answers Replay for what was done: every key's effect
// happens once, and each partition's effects in publish order. Pipelined, the batch before the
// Poll that gives a partition up is still completing and is acknowledged after it: the adapter
// ignores those acknowledgements, and the new owner waits (Busy) for the completion to land,
// then gets Replay.
TEST_F(KafkaConsumerTest, ARebalanceWhileMessagesAreInFlightKeepsEffectsOnceAndInOrder) {
  Rebalance(/*pipeline=*/false);
}

TEST_F(KafkaConsumerTest, APipelinedRebalanceWhileMessagesAreInFlightKeepsEffectsOnceAndInOrder) {
  Rebalance(/*pipeline=*/true);
}

void KafkaConsumerTest::Rebalance(bool pipeline) {
  constexpr int kPerPartition = 40;
  ConsumerOptions options = FastOptions();
  options.pipeline = pipeline;
  for (int p = 0; p < 4; ++p) {
    ASSERT_TRUE(
        PublishNumbered(*producer_, topic_, p, "p" + std::to_string(p), kPerPartition).ok());
  }
  const std::string group = UniqueName("g");
  std::mutex mu;
  std::map<std::string, int> effects;              // key -> runs that succeeded
  std::map<std::string, std::vector<int>> order;   // partition -> message numbers
  std::map<std::string, std::string> by_consumer;  // key -> who did it
  std::atomic<int> total{0};
  auto handler_for = [&](std::string who) {
    return [&, who](const HandlerContext& ctx, const BrokerMessage& m) -> HandlerVerdict {
      std::this_thread::sleep_for(20ms);  // slow: batches stay in flight
      std::lock_guard lock(mu);
      ++effects[std::string(ctx.key)];
      by_consumer[std::string(ctx.key)] = who;
      order[m.partition].push_back(std::stoi(m.payload.substr(m.payload.find('-') + 1)));
      ++total;
      return {Verdict::kSuccess, ""};
    };
  };
  // Opening does not join the group: the first Poll does.
  auto first_broker = Open(group);
  auto second_broker = Open(group);
  ASSERT_NE(first_broker, nullptr);
  ASSERT_NE(second_broker, nullptr);
  Consumer first(*store_, *first_broker, handler_for("first"), options);
  std::thread first_thread([&] { first.Run(); });

  // The second joins once the first is working on a batch.
  const auto deadline = SteadyClock::now() + 60s;
  while (total.load() == 0 && SteadyClock::now() < deadline) std::this_thread::sleep_for(5ms);
  Consumer second(*store_, *second_broker, handler_for("second"), options);
  std::thread second_thread([&] { second.Run(); });

  while (total.load() < 4 * kPerPartition && SteadyClock::now() < deadline) {
    std::this_thread::sleep_for(10ms);
  }
  // A little longer, for a late duplicate to show.
  std::this_thread::sleep_for(500ms);
  first.Stop();
  second.Stop();
  first_thread.join();
  second_thread.join();

  std::lock_guard lock(mu);
  EXPECT_EQ(effects.size(), 4u * kPerPartition);
  for (const auto& [key, n] : effects) EXPECT_EQ(n, 1) << key;
  std::vector<int> expected(kPerPartition);
  for (int i = 0; i < kPerPartition; ++i) expected[static_cast<std::size_t>(i)] = i;
  for (int p = 0; p < 4; ++p) {
    EXPECT_EQ(order[topic_ + "/" + std::to_string(p)], expected) << "partition " << p;
  }
  int by_second = 0;
  for (const auto& [key, who] : by_consumer) by_second += who == "second";
  EXPECT_GT(by_second, 0) << "the second consumer never got a partition";
  EXPECT_LT(by_second, 4 * kPerPartition);
}

}  // namespace
}  // namespace idem::kafka
