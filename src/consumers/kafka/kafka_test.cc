// The Kafka adapter against librdkafka's mock cluster (idem-kafka-mock, a child process).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "consumers/kafka/kafka_test_cluster.h"
#include "idem/consumers/kafka.h"
#include "tests/support/recycled_deliveries.h"

namespace idem::kafka {
namespace {

using testing::CommittedOffset;
using ::testing::Contains;
using ::testing::HasSubstr;
using testing::MockCluster;
using ::testing::Pair;
using testing::PollAtLeast;
using testing::PublishNumbered;
using testing::TestConfig;
using testing::UniqueName;
using namespace std::chrono_literals;

std::vector<const BrokerMessage*> Pointers(const std::vector<BrokerMessage>& messages,
                                           std::size_t from = 0, std::size_t to = SIZE_MAX) {
  std::vector<const BrokerMessage*> out;
  for (std::size_t i = from; i < std::min(to, messages.size()); ++i) out.push_back(&messages[i]);
  return out;
}

std::vector<std::string> Payloads(const std::vector<BrokerMessage>& messages,
                                  const std::string& partition) {
  std::vector<std::string> out;
  for (const auto& m : messages) {
    if (m.partition == partition) out.push_back(m.payload);
  }
  return out;
}

std::vector<std::string> Numbered(const std::string& prefix, int from, int to) {
  std::vector<std::string> out;
  for (int i = from; i < to; ++i) out.push_back(prefix + "-" + std::to_string(i));
  return out;
}

class KafkaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    topic_ = UniqueName("orders");
    dlq_ = topic_ + ".dlq";
    auto cluster = MockCluster::Start({topic_ + ":4", dlq_ + ":1"});
    ASSERT_TRUE(cluster) << cluster.error().ToString();
    cluster_.emplace(std::move(*cluster));
    auto producer = Producer::Open(cluster_->bootstrap());
    ASSERT_TRUE(producer) << producer.error().ToString();
    producer_.emplace(std::move(*producer));
  }

  std::unique_ptr<Broker> Open(const std::string& group) {
    auto broker = OpenKafkaConsumer(TestConfig(cluster_->bootstrap(), group, {topic_}, dlq_));
    EXPECT_TRUE(broker) << broker.error().ToString();
    return broker ? std::move(*broker) : nullptr;
  }

  std::string topic_;
  std::string dlq_;
  std::optional<MockCluster> cluster_;
  std::optional<Producer> producer_;
};

TEST(KafkaConfigTest, MissingOrRefusedSettingsAreNamed) {
  KafkaConsumerConfig good = TestConfig("127.0.0.1:1", "g", {"t"});
  auto expect_invalid = [](KafkaConsumerConfig config, const std::string& named) {
    auto broker = OpenKafkaConsumer(config);
    ASSERT_FALSE(broker) << named;
    EXPECT_EQ(broker.error().code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(broker.error().message(), HasSubstr(named));
  };
  auto c = good;
  c.brokers.clear();
  expect_invalid(c, "bootstrap.servers");
  c = good;
  c.group.clear();
  expect_invalid(c, "group.id");
  c = good;
  c.topics.clear();
  expect_invalid(c, "topics");
  c = good;
  c.properties.emplace_back("fetch.wait.max.ms", "soon");
  expect_invalid(c, "fetch.wait.max.ms");
  c = good;
  c.properties.emplace_back("no.such.property", "1");
  expect_invalid(c, "no.such.property");
  c = good;
  c.properties.emplace_back("enable.auto.commit", "true");
  expect_invalid(c, "enable.auto.commit");
  c = good;
  c.session_timeout = 0ms;
  expect_invalid(c, "session.timeout.ms");
  c.session_timeout = 999ms;  // a heartbeat every 333 ms at most: below the adapter's minimum
  expect_invalid(c, "session.timeout.ms");
  // A good configuration opens without reaching the brokers.
  EXPECT_TRUE(OpenKafkaConsumer(good));
}

TEST_F(KafkaTest, PollKeepsEachPartitionsOrderAndCopiesHeaders) {
  for (int p = 0; p < 4; ++p) {
    ASSERT_TRUE(PublishNumbered(*producer_, topic_, p, "p" + std::to_string(p), 50).ok());
  }
  auto broker = Open(UniqueName("g"));
  ASSERT_NE(broker, nullptr);
  EXPECT_EQ(broker->Name(), "kafka");
  auto got = PollAtLeast(*broker, 200, 30s);
  ASSERT_TRUE(got) << got.error().ToString();
  ASSERT_EQ(got->size(), 200u);
  for (int p = 0; p < 4; ++p) {
    const std::string partition = topic_ + "/" + std::to_string(p);
    EXPECT_EQ(Payloads(*got, partition), Numbered("p" + std::to_string(p), 0, 50)) << partition;
  }
  std::map<std::string, std::int64_t> next;
  for (const auto& m : *got) {
    EXPECT_EQ(m.position, std::to_string(next[m.partition]++)) << m.partition;
    EXPECT_EQ(m.deliveries, 1u);
    EXPECT_THAT(m.headers, Contains(Pair("Idempotency-Key", m.payload)));
  }
  // Nothing more: an empty batch, not an error.
  auto more = broker->Poll(10, 50ms);
  ASSERT_TRUE(more);
  EXPECT_TRUE(more->empty());
}

// Messages handed back with Recycle are filled in with later deliveries: nothing of what they
// held before may show.
TEST_F(KafkaTest, RecycledMessagesHoldOnlyTheNextDelivery) {
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(
        producer_
            ->Publish(topic_, 0, "", std::string(500, 'x'),
                      {{"Idempotency-Key", "first-" + std::to_string(i)}, {"A", "1"}, {"B", "2"}})
            .ok());
  }
  ASSERT_TRUE(producer_->Flush(10s).ok());
  auto broker = Open(UniqueName("g"));
  ASSERT_NE(broker, nullptr);
  auto first = PollAtLeast(*broker, 3, 30s);
  ASSERT_TRUE(first) << first.error().ToString();
  ASSERT_EQ(first->size(), 3u);
  ASSERT_TRUE(broker->Acknowledge(Pointers(*first)).ok());
  broker->Recycle(std::move(*first));

  ASSERT_TRUE(producer_->Publish(topic_, 1, "", "s0", {{"Idempotency-Key", "second-0"}}).ok());
  ASSERT_TRUE(producer_->Publish(topic_, 1, "", "s1").ok());
  ASSERT_TRUE(producer_->Publish(topic_, 1, "", "").ok());
  ASSERT_TRUE(producer_->Flush(10s).ok());
  auto second = PollAtLeast(*broker, 3, 30s);
  ASSERT_TRUE(second) << second.error().ToString();
  ASSERT_EQ(second->size(), 3u);
  const std::vector<BrokerMessage>& m = *second;
  for (std::size_t i = 0; i < m.size(); ++i) EXPECT_EQ(m[i].position, std::to_string(i));
  idem::testing::ExpectOnlyTheNextDeliveries(m, topic_ + "/1", {"s0", "s1", ""}, "second-0");
  EXPECT_TRUE(broker->Acknowledge(Pointers(m)).ok());
}

TEST_F(KafkaTest, PollReturnsAtMostMaxWithoutWaitingForMore) {
  ASSERT_TRUE(PublishNumbered(*producer_, topic_, 0, "m", 30).ok());
  auto broker = Open(UniqueName("g"));
  ASSERT_NE(broker, nullptr);
  auto first = PollAtLeast(*broker, 1, 20s, /*batch=*/7);
  ASSERT_TRUE(first);
  ASSERT_FALSE(first->empty());
  EXPECT_LE(first->size(), 7u);
  auto rest = PollAtLeast(*broker, 30 - first->size(), 10s, /*batch=*/7);
  ASSERT_TRUE(rest);
  EXPECT_EQ(first->size() + rest->size(), 30u);
}

TEST_F(KafkaTest, AcknowledgeCommitsSoTheGroupResumesAfterIt) {
  ASSERT_TRUE(PublishNumbered(*producer_, topic_, 1, "a", 20).ok());
  const std::string group = UniqueName("g");
  {
    auto broker = Open(group);
    ASSERT_NE(broker, nullptr);
    auto got = PollAtLeast(*broker, 20, 30s);
    ASSERT_TRUE(got);
    ASSERT_EQ(got->size(), 20u);
    ASSERT_TRUE(broker->Acknowledge(Pointers(*got, 0, 12)).ok());
    // Acknowledging again, or an older message, never moves the commit back.
    ASSERT_TRUE(broker->Acknowledge(Pointers(*got, 3, 4)).ok());
    // The broker is closed without Settle(): closing waits for the commit in flight.
  }
  auto committed = CommittedOffset(cluster_->bootstrap(), group, topic_, 1);
  ASSERT_TRUE(committed) << committed.error().ToString();
  EXPECT_EQ(*committed, 12);
  auto broker = Open(group);
  ASSERT_NE(broker, nullptr);
  auto got = PollAtLeast(*broker, 8, 30s);
  ASSERT_TRUE(got);
  EXPECT_EQ(Payloads(*got, topic_ + "/1"), Numbered("a", 12, 20));
}

TEST_F(KafkaTest, UnacknowledgedMessagesComeBackAfterClose) {
  ASSERT_TRUE(PublishNumbered(*producer_, topic_, 2, "u", 10).ok());
  const std::string group = UniqueName("g");
  {
    auto broker = Open(group);
    ASSERT_NE(broker, nullptr);
    auto got = PollAtLeast(*broker, 10, 30s);
    ASSERT_TRUE(got);
    ASSERT_EQ(got->size(), 10u);
    ASSERT_TRUE(broker->Acknowledge(Pointers(*got, 0, 4)).ok());
  }  // closed with 4..9 unacknowledged
  auto broker = Open(group);
  ASSERT_NE(broker, nullptr);
  auto got = PollAtLeast(*broker, 6, 30s);
  ASSERT_TRUE(got);
  EXPECT_EQ(Payloads(*got, topic_ + "/2"), Numbered("u", 4, 10));
}

TEST_F(KafkaTest, MessagesOfAKilledConsumerProcessComeBackFromItsLastCommit) {
  ASSERT_TRUE(PublishNumbered(*producer_, topic_, 0, "k", 10).ok());
  const std::string group = UniqueName("g");
  auto child = idem::testing::ChildProcess::Spawn(
      IDEM_KAFKA_TEST_CONSUMER, {cluster_->bootstrap(), group, topic_, "10", "3"});
  ASSERT_TRUE(child) << child.error().ToString();
  auto line = child->WaitForLine("polled", 30s);
  ASSERT_TRUE(line) << line.error().ToString();
  ASSERT_TRUE(child->Kill(SIGKILL).ok());
  auto status = child->Wait(5s);
  ASSERT_TRUE(status);
  EXPECT_EQ(*status, 128 + SIGKILL);
  // The dead member holds partition 0 until its session (3 s) times out; then this one gets it
  // from the commit the dead one made.
  auto broker = Open(group);
  ASSERT_NE(broker, nullptr);
  auto got = PollAtLeast(*broker, 7, 30s);
  ASSERT_TRUE(got);
  EXPECT_EQ(Payloads(*got, topic_ + "/0"), Numbered("k", 3, 10));
}

TEST_F(KafkaTest, ASecondConsumerTakesOverPartitionsIncrementally) {
  for (int p = 0; p < 4; ++p) {
    ASSERT_TRUE(PublishNumbered(*producer_, topic_, p, "a" + std::to_string(p), 5).ok());
  }
  const std::string group = UniqueName("g");
  auto first = Open(group);
  ASSERT_NE(first, nullptr);
  auto got = PollAtLeast(*first, 20, 30s);
  ASSERT_TRUE(got);
  ASSERT_EQ(got->size(), 20u);
  ASSERT_TRUE(first->Acknowledge(Pointers(*got)).ok());

  auto second = Open(group);
  ASSERT_NE(second, nullptr);
  for (int p = 0; p < 4; ++p) {
    ASSERT_TRUE(PublishNumbered(*producer_, topic_, p, "b" + std::to_string(p), 5).ok());
  }
  // Both poll and acknowledge until the second has partitions and every new message came. A
  // commit may fail while the group rebalances (those messages may come again); a message whose
  // commit succeeded never comes again.
  std::map<std::string, std::vector<std::string>> by_partition;
  std::set<std::string> seen;
  std::set<std::string> acked;
  std::size_t second_got = 0;
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  while ((seen.size() < 20 || second_got == 0) && std::chrono::steady_clock::now() < deadline) {
    for (Broker* b : {first.get(), second.get()}) {
      auto batch = b->Poll(64, 50ms);
      ASSERT_TRUE(batch) << batch.error().ToString();
      if (b == second.get()) second_got += batch->size();
      for (const auto& m : *batch) {
        EXPECT_FALSE(acked.contains(m.payload)) << m.payload << " came again after its commit";
        seen.insert(m.payload);
        by_partition[(b == first.get() ? "first " : "second ") + m.partition].push_back(m.payload);
      }
      // Settle: the commit's answer, which Acknowledge does not wait for.
      if (b->Acknowledge(Pointers(*batch)).ok() && b->Settle().ok()) {
        for (const auto& m : *batch) acked.insert(m.payload);
      }
    }
  }
  EXPECT_EQ(seen.size(), 20u);
  EXPECT_GT(second_got, 0u);
  // Each consumer saw each partition in order, never skipping one: a message is followed by the
  // next, or by an earlier unacknowledged one when a partition came back (a lost assignment
  // during the rebalance: the mock fails commits of the old generation) and was read again
  // from its last commit.
  for (const auto& [name, payloads] : by_partition) {
    for (std::size_t i = 1; i < payloads.size(); ++i) {
      const int before = std::stoi(payloads[i - 1].substr(payloads[i - 1].find('-') + 1));
      const int now = std::stoi(payloads[i].substr(payloads[i].find('-') + 1));
      EXPECT_LE(now, before + 1) << name << ": " << ::testing::PrintToString(payloads);
    }
  }
}

// A cluster that stops answering (SIGSTOP: connections stay open, nothing comes back) fails a
// commit within the session timeout (3 s here), and closing the consumer within the session
// timeout and its grace: neither waits as long as librdkafka would.
TEST_F(KafkaTest, ACommitOrCloseTheClusterDoesNotAnswerEndsWithinItsBound) {
  ASSERT_TRUE(PublishNumbered(*producer_, topic_, 0, "s", 5).ok());
  const std::string group = UniqueName("g");
  auto broker = Open(group);
  ASSERT_NE(broker, nullptr);
  auto got = PollAtLeast(*broker, 5, 30s);
  ASSERT_TRUE(got);
  ASSERT_TRUE(broker->Acknowledge(Pointers(*got, 0, 2)).ok());
  ASSERT_TRUE(broker->Settle().ok());

  ASSERT_TRUE(cluster_->process().Stop().ok());
  // The commit is sent without waiting for its answer: Acknowledge returns at once, and the
  // missing answer is the error of the next call that waits for it.
  auto started = std::chrono::steady_clock::now();
  ASSERT_TRUE(broker->Acknowledge(Pointers(*got, 2, 5)).ok());
  EXPECT_LT(std::chrono::steady_clock::now() - started, 1s);
  Status acked = broker->Settle();
  auto took = std::chrono::steady_clock::now() - started;
  EXPECT_EQ(acked.code(), StatusCode::kUnavailable) << acked.ToString();
  EXPECT_THAT(acked.message(), HasSubstr("commit"));
  EXPECT_LT(took, 10s);
  ASSERT_TRUE(cluster_->process().Kill(SIGCONT).ok());
  // Then it goes on: the failed commit goes with a later Poll, or (the member having missed its
  // session meanwhile) the messages come again from the last commit and are acknowledged again.
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  std::int64_t committed = -1;
  while (committed != 5 && std::chrono::steady_clock::now() < deadline) {
    auto batch = broker->Poll(64, 100ms);
    ASSERT_TRUE(batch) << batch.error().ToString();
    (void)broker->Acknowledge(Pointers(*batch));
    auto c = CommittedOffset(cluster_->bootstrap(), group, topic_, 0);
    if (c) committed = *c;
  }
  EXPECT_EQ(committed, 5);

  ASSERT_TRUE(cluster_->process().Stop().ok());
  started = std::chrono::steady_clock::now();
  broker.reset();
  took = std::chrono::steady_clock::now() - started;
  ASSERT_TRUE(cluster_->process().Kill(SIGCONT).ok());
  EXPECT_LT(took, 15s);
}

// A commit the cluster answers with an error: Poll takes the answer and sends the offsets
// again; Settle then reports by what is committed, and the next Acknowledge reports the
// failure Poll found, once.
TEST_F(KafkaTest, AFailedCommitGoesAgainAndIsReportedOnce) {
  ASSERT_TRUE(PublishNumbered(*producer_, topic_, 3, "f", 6).ok());
  const std::string group = UniqueName("g");
  auto broker = Open(group);
  ASSERT_NE(broker, nullptr);
  auto got = PollAtLeast(*broker, 6, 30s);
  ASSERT_TRUE(got);
  ASSERT_EQ(got->size(), 6u);
  auto arm = [&] {
    ASSERT_TRUE(cluster_->process().Kill(SIGUSR1).ok());
    auto line = cluster_->process().WaitForLine("commit error armed", 10s);
    ASSERT_TRUE(line) << line.error().ToString();
  };
  auto committed = [&] {
    auto c = CommittedOffset(cluster_->bootstrap(), group, topic_, 3);
    EXPECT_TRUE(c) << c.error().ToString();
    return c ? *c : -1;
  };

  // Poll finds the failure and sends offset 2 again; Settle sees it committed: ok.
  arm();
  ASSERT_TRUE(broker->Acknowledge(Pointers(*got, 0, 2)).ok());
  std::this_thread::sleep_for(500ms);  // the error answer arrives
  ASSERT_TRUE(broker->Poll(64, 0ms));
  Status settled = broker->Settle();
  EXPECT_TRUE(settled.ok()) << settled.ToString();
  EXPECT_EQ(committed(), 2);

  // Without a Settle in between, the next Acknowledge reports what Poll found, and only it.
  arm();
  ASSERT_TRUE(broker->Acknowledge(Pointers(*got, 2, 4)).ok());
  std::this_thread::sleep_for(500ms);
  ASSERT_TRUE(broker->Poll(64, 0ms));
  Status reported = broker->Acknowledge(Pointers(*got, 4, 6));
  EXPECT_EQ(reported.code(), StatusCode::kUnavailable) << reported.ToString();
  EXPECT_THAT(reported.message(), HasSubstr("commit failed"));
  EXPECT_TRUE(broker->Acknowledge({}).ok());
  settled = broker->Settle();
  EXPECT_TRUE(settled.ok()) << settled.ToString();
  EXPECT_EQ(committed(), 6);
}

TEST_F(KafkaTest, RedeliverSeeksBackPausesAndHoldsTheCommit) {
  ASSERT_TRUE(PublishNumbered(*producer_, topic_, 3, "r", 10).ok());
  ASSERT_TRUE(PublishNumbered(*producer_, topic_, 0, "o", 3).ok());
  const std::string group = UniqueName("g");
  auto broker = Open(group);
  ASSERT_NE(broker, nullptr);
  auto got = PollAtLeast(*broker, 13, 30s);
  ASSERT_TRUE(got);
  ASSERT_EQ(got->size(), 13u);
  std::vector<BrokerMessage> p3;
  for (const auto& m : *got) {
    if (m.partition == topic_ + "/3") p3.push_back(m);
  }
  ASSERT_EQ(p3.size(), 10u);
  ASSERT_TRUE(broker->Acknowledge(Pointers(p3, 0, 4)).ok());
  // For partition 0 while partition 3 is held back below.
  ASSERT_TRUE(PublishNumbered(*producer_, topic_, 0, "later", 2).ok());
  const auto handed_back = std::chrono::steady_clock::now();
  // Long enough for partition 0's later messages to be fetched meanwhile, on a loaded machine too.
  constexpr auto kDelay = 3s;
  ASSERT_TRUE(broker->Redeliver(Pointers(p3, 4), kDelay).ok());
  // A (wrong) acknowledgement of a later message does not commit past the handed-back one.
  ASSERT_TRUE(broker->Acknowledge(Pointers(p3, 9)).ok());
  ASSERT_TRUE(broker->Settle().ok());
  auto committed = CommittedOffset(cluster_->bootstrap(), group, topic_, 3);
  ASSERT_TRUE(committed);
  EXPECT_EQ(*committed, 4);

  // Other partitions go on meanwhile; the paused one stays quiet until the delay is over. One
  // Poll may hold messages of both: each goes by its partition (a CI run once took partition 3's
  // into the first set and then waited for them in vain).
  std::vector<BrokerMessage> during;
  std::vector<BrokerMessage> again;
  while ((during.size() < 2 || again.size() < 6) &&
         std::chrono::steady_clock::now() - handed_back < kDelay + 30s) {
    auto batch = broker->Poll(64, 100ms);
    ASSERT_TRUE(batch);
    const auto waited = std::chrono::steady_clock::now() - handed_back;
    for (auto& m : *batch) {
      if (m.partition == topic_ + "/3") {
        EXPECT_GE(waited, kDelay - 10ms) << m.position;
        again.push_back(std::move(m));
      } else {
        EXPECT_LT(waited, kDelay) << m.partition << " " << m.position << " waited for the pause";
        during.push_back(std::move(m));
      }
    }
  }
  EXPECT_EQ(Payloads(during, topic_ + "/0"), Numbered("later", 0, 2));
  EXPECT_EQ(during.size(), 2u);
  ASSERT_EQ(again.size(), 6u);
  EXPECT_EQ(Payloads(again, topic_ + "/3"), Numbered("r", 4, 10));
  for (const auto& m : again) EXPECT_EQ(m.deliveries, 2u) << m.position;
  EXPECT_EQ(again.front().position, "4");

  // Handed back without a delay: at once, counted again.
  ASSERT_TRUE(broker->Redeliver(Pointers(again, 2), 0ms).ok());
  auto third = PollAtLeast(*broker, 4, 10s);
  ASSERT_TRUE(third);
  EXPECT_EQ(Payloads(*third, topic_ + "/3"), Numbered("r", 6, 10));
  ASSERT_FALSE(third->empty());
  EXPECT_EQ(third->front().deliveries, 3u);

  // Acknowledged at last: the commit moves past them.
  ASSERT_TRUE(broker->Acknowledge(Pointers(again, 0, 2)).ok());
  ASSERT_TRUE(broker->Acknowledge(Pointers(*third)).ok());
  ASSERT_TRUE(broker->Settle().ok());
  committed = CommittedOffset(cluster_->bootstrap(), group, topic_, 3);
  ASSERT_TRUE(committed);
  EXPECT_EQ(*committed, 10);
}

TEST_F(KafkaTest, DeadLetterCarriesPayloadKeyAndHeaders) {
  ASSERT_TRUE(
      producer_->Publish(topic_, 1, "kafka-key", "body", {{"Idempotency-Key", "k-1"}, {"x", "y"}})
          .ok());
  ASSERT_TRUE(producer_->Flush(10s).ok());
  auto broker = Open(UniqueName("g"));
  ASSERT_NE(broker, nullptr);
  auto got = PollAtLeast(*broker, 1, 30s);
  ASSERT_TRUE(got);
  ASSERT_EQ(got->size(), 1u);
  const BrokerMessage& m = got->front();
  ASSERT_TRUE(
      broker
          ->DeadLetter(
              m,
              {.reason = "attempts_exhausted", .attempts = 5, .last_error = "boom", .key = "k-1"})
          .ok());
  auto dlq = ReadTopic(cluster_->bootstrap(), dlq_, 10s);
  ASSERT_TRUE(dlq) << dlq.error().ToString();
  ASSERT_EQ(dlq->size(), 1u);
  const TopicMessage& d = dlq->front();
  EXPECT_EQ(d.payload, "body");
  EXPECT_EQ(d.key, "kafka-key");
  EXPECT_EQ(d.headers, (Headers{{"Idempotency-Key", "k-1"},
                                {"x", "y"},
                                {"idem-dlq-reason", "attempts_exhausted"},
                                {"idem-dlq-attempts", "5"},
                                {"idem-dlq-error", "boom"},
                                {"idem-dlq-key", "k-1"},
                                {"idem-dlq-source", topic_ + "/1@0"}}));
}

TEST_F(KafkaTest, DeadLetterWithoutATopicIsRefused) {
  auto broker = OpenKafkaConsumer(TestConfig(cluster_->bootstrap(), UniqueName("g"), {topic_}));
  ASSERT_TRUE(broker);
  BrokerMessage m{.partition = topic_ + "/0", .position = "0", .payload = "x"};
  Status s = (*broker)->DeadLetter(m, {.reason = "no_key"});
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
}

TEST_F(KafkaTest, HealthFollowsTheCluster) {
  auto broker = Open(UniqueName("g"));
  ASSERT_NE(broker, nullptr);
  EXPECT_TRUE(broker->Health().ok());
  ASSERT_TRUE(cluster_->process().Kill(SIGKILL).ok());
  ASSERT_TRUE(cluster_->process().Wait(5s));
  Status s = broker->Health();
  EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.ToString();
}

TEST_F(KafkaTest, ReadTopicOfAnEmptyTopicIsEmpty) {
  auto dlq = ReadTopic(cluster_->bootstrap(), dlq_, 10s);
  ASSERT_TRUE(dlq) << dlq.error().ToString();
  EXPECT_TRUE(dlq->empty());
}

}  // namespace
}  // namespace idem::kafka
