// idem::Consumer over the NATS adapter, end to end against a real nats-server with the memory
// store: retries in place, dead letters, and a broker killed and restarted while it consumes.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "idem/consumer.h"
#include "idem/consumers/nats.h"
#include "idem/stores/memory.h"
#include "tests/support/consumer_helpers.h"
#include "tests/support/servers.h"

namespace idem::nats {
namespace {

using idem::testing::HeaderOf;
using idem::testing::RunUntil;

using namespace std::chrono_literals;
using std::chrono::milliseconds;
using SteadyClock = std::chrono::steady_clock;

std::string Unique(std::string_view what) {
  static std::mt19937_64 rng(std::random_device{}());
  std::string name = ::testing::UnitTest::GetInstance()->current_test_info()->name();
  std::replace_if(
      name.begin(), name.end(), [](char c) { return !std::isalnum(static_cast<unsigned char>(c)); },
      '_');
  return std::string(what) + "_" + name + "_" + std::to_string(::getpid()) + "_" +
         std::to_string(rng() % 1'000'000);
}

NatsConsumerConfig ConfigFor(const std::string& url) {
  NatsConsumerConfig c;
  c.url = url;
  c.stream = Unique("S");
  c.subjects = {Unique("s") + ".>"};
  c.durable = Unique("D");
  c.dlq_stream = Unique("DLQ");
  c.dlq_subject = Unique("dlq");
  c.ack_wait = 1s;
  c.connect_timeout = 2s;
  c.request_timeout = 2s;
  c.reconnect_wait = 100ms;
  return c;
}

// subjects = {"prefix.>"}: a subject under it.
std::string SubjectOf(const NatsConsumerConfig& c, std::string_view leaf) {
  const std::string& pattern = c.subjects.front();
  return pattern.substr(0, pattern.size() - 1) + std::string(leaf);
}

ConsumerOptions FastOptions() {
  ConsumerOptions o;
  o.name = "nats-test";
  o.scope = "nats-test";
  o.batch_size = 64;
  o.poll_wait = 100ms;
  o.backoff = 10ms;
  o.max_backoff = 100ms;
  o.max_attempts = 5;
  return o;
}

class NatsConsumerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto url = testing::RequiredEnv("IDEM_TEST_NATS");
    ASSERT_TRUE(url.has_value()) << url.error().ToString();
    url_ = *url;
    config_ = ConfigFor(url_);
    auto broker = OpenNatsConsumer(config_);
    ASSERT_TRUE(broker.has_value()) << broker.error().ToString();
    broker_ = std::move(*broker);
    auto publisher = Publisher::Open(url_);
    ASSERT_TRUE(publisher.has_value()) << publisher.error().ToString();
    publisher_ = std::move(*publisher);
    store_ = NewMemoryStore();
  }

  std::string url_;
  NatsConsumerConfig config_;
  std::unique_ptr<Broker> broker_;
  std::unique_ptr<Publisher> publisher_;
  std::unique_ptr<Store> store_;
};

TEST_F(NatsConsumerTest, HandlerFailingTwiceRunsThreeTimesThenIsAcknowledged) {
  ASSERT_TRUE(
      publisher_->Publish(SubjectOf(config_, "a"), "pay 10", {{"Idempotency-Key", "order-1"}})
          .has_value());
  std::vector<std::uint32_t> attempts;
  int effects = 0;
  Consumer consumer(
      *store_, *broker_,
      [&](const HandlerContext& ctx, const BrokerMessage& m) {
        attempts.push_back(ctx.attempt);
        EXPECT_EQ(ctx.key, "order-1");
        EXPECT_EQ(m.payload, "pay 10");
        if (attempts.size() < 3) return HandlerVerdict{Verdict::kRetryable, "not yet"};
        ++effects;
        return HandlerVerdict{Verdict::kSuccess, "paid"};
      },
      FastOptions());
  ASSERT_TRUE(RunUntil(consumer, 10s, [&] { return consumer.counts().executed == 1; }));
  EXPECT_THAT(attempts, ::testing::ElementsAre(1u, 2u, 3u));
  EXPECT_EQ(effects, 1);
  EXPECT_EQ(consumer.counts().retries, 2u);
  EXPECT_EQ(consumer.counts().dead_lettered, 0u);

  // Acknowledged: past ack_wait (1 s) nothing comes back.
  const auto until = SteadyClock::now() + 1800ms;
  while (SteadyClock::now() < until) ASSERT_TRUE(consumer.RunOnce().has_value());
  EXPECT_EQ(consumer.counts().received, 1u);
  EXPECT_EQ(effects, 1);
  auto dlq = ReadStream(url_, config_.dlq_stream);
  ASSERT_TRUE(dlq.has_value()) << dlq.error().ToString();
  EXPECT_TRUE(dlq->empty());
}

TEST_F(NatsConsumerTest, AlwaysFailingHandlerIsDeadLetteredAfterMaxAttempts) {
  ASSERT_TRUE(publisher_
                  ->Publish(SubjectOf(config_, "a"), "pay 20",
                            {{"Idempotency-Key", "order-2"}, {"X-Trace", "t-2"}})
                  .has_value());
  int runs = 0;
  ConsumerOptions o = FastOptions();
  o.max_attempts = 3;
  Consumer consumer(
      *store_, *broker_,
      [&](const HandlerContext&, const BrokerMessage&) {
        ++runs;
        return HandlerVerdict{Verdict::kRetryable, "card declined"};
      },
      o);
  ASSERT_TRUE(RunUntil(consumer, 10s, [&] { return consumer.counts().dead_lettered == 1; }));
  EXPECT_EQ(runs, 3);
  EXPECT_EQ(consumer.counts().executed, 0u);

  auto dlq = ReadStream(url_, config_.dlq_stream);
  ASSERT_TRUE(dlq.has_value()) << dlq.error().ToString();
  ASSERT_EQ(dlq->size(), 1u);
  const StoredMessage& d = dlq->front();
  EXPECT_EQ(d.subject, config_.dlq_subject);
  EXPECT_EQ(d.payload, "pay 20");
  EXPECT_EQ(HeaderOf(d.headers, kDlqReasonHeader), "attempts_exhausted");
  EXPECT_EQ(HeaderOf(d.headers, kDlqAttemptsHeader), "3");
  EXPECT_EQ(HeaderOf(d.headers, kDlqErrorHeader), "card declined");
  EXPECT_EQ(HeaderOf(d.headers, kDlqKeyHeader), "order-2");
  EXPECT_EQ(HeaderOf(d.headers, "X-Trace"), "t-2");
  EXPECT_EQ(HeaderOf(d.headers, "Idempotency-Key"), "order-2");

  // Settled: neither redelivered past ack_wait nor run again.
  const auto until = SteadyClock::now() + 1800ms;
  while (SteadyClock::now() < until) ASSERT_TRUE(consumer.RunOnce().has_value());
  EXPECT_EQ(consumer.counts().received, 1u);
  EXPECT_EQ(runs, 3);
}

TEST_F(NatsConsumerTest, MessageWithoutKeyIsDeadLetteredAsPoison) {
  ASSERT_TRUE(publisher_->Publish(SubjectOf(config_, "a"), "no key here").has_value());
  int runs = 0;
  Consumer consumer(
      *store_, *broker_,
      [&](const HandlerContext&, const BrokerMessage&) {
        ++runs;
        return HandlerVerdict{};
      },
      FastOptions());
  ASSERT_TRUE(RunUntil(consumer, 10s, [&] { return consumer.counts().dead_lettered == 1; }));
  EXPECT_EQ(runs, 0);
  EXPECT_EQ(consumer.counts().poison, 1u);
  auto dlq = ReadStream(url_, config_.dlq_stream);
  ASSERT_TRUE(dlq.has_value());
  ASSERT_EQ(dlq->size(), 1u);
  EXPECT_EQ(HeaderOf(dlq->front().headers, kDlqReasonHeader), "no_key");
  EXPECT_EQ(HeaderOf(dlq->front().headers, kDlqKeyHeader), "<missing>") << "empty: left out";
  EXPECT_EQ(dlq->front().payload, "no key here");
}

// The broker is killed (SIGKILL) and restarted while the consumer works through a few thousand
// messages: the same Consumer and Broker recover by themselves, and every key is executed
// exactly once (redeliveries of what was done but not acknowledged are replays).
TEST(NatsConsumerRestartTest, BrokerRestartMidRunExecutesEveryKeyOnce) {
  const auto dir = std::filesystem::temp_directory_path() / Unique("idem-nats");
  auto port = testing::FreePort();
  ASSERT_TRUE(port.has_value());
  auto server = testing::NatsServer::Start(dir, *port);
  ASSERT_TRUE(server.has_value()) << server.error().ToString();

  NatsConsumerConfig config = ConfigFor(server->url());
  config.max_ack_pending = 64;
  constexpr int kMessages = 3000;
  {
    auto publisher = Publisher::Open(server->url());
    ASSERT_TRUE(publisher.has_value()) << publisher.error().ToString();
    ASSERT_TRUE((*publisher)->EnsureStream(config.stream, config.subjects).ok());
    for (int i = 0; i < kMessages; ++i) {
      const std::string key = "k-" + std::to_string(i);
      ASSERT_TRUE((*publisher)
                      ->PublishAsync(SubjectOf(config, std::to_string(i % 4)), "payload " + key,
                                     {{"Idempotency-Key", key}})
                      .ok());
    }
    ASSERT_TRUE((*publisher)->WaitPublished(30s).ok());
  }

  auto broker = OpenNatsConsumer(config);
  ASSERT_TRUE(broker.has_value()) << broker.error().ToString();
  auto store = NewMemoryStore();
  std::mutex mu;
  std::map<std::string, int> runs;
  std::atomic<int> distinct{0};
  ConsumerOptions o = FastOptions();
  o.lease = 5s;
  Consumer consumer(
      *store, **broker,
      [&](const HandlerContext& ctx, const BrokerMessage&) {
        std::lock_guard lock(mu);
        if (runs[std::string(ctx.key)]++ == 0) distinct.fetch_add(1);
        return HandlerVerdict{};
      },
      o);
  std::thread runner([&] { consumer.Run(); });

  // Kill it a few hundred keys in, restart it half a second later.
  const auto deadline = SteadyClock::now() + 60s;
  while (distinct.load() < 300 && SteadyClock::now() < deadline) std::this_thread::sleep_for(1ms);
  const int at_kill = distinct.load();
  ASSERT_TRUE(server->Kill().ok());
  std::this_thread::sleep_for(500ms);
  ASSERT_TRUE(server->Restart().ok());
  while (distinct.load() < kMessages && SteadyClock::now() < deadline) {
    std::this_thread::sleep_for(10ms);
  }
  // A little longer: a late duplicate execution would show here.
  std::this_thread::sleep_for(1500ms);
  consumer.Stop();
  runner.join();

  EXPECT_LT(at_kill, kMessages) << "the kill came after the work was done";
  std::lock_guard lock(mu);
  EXPECT_EQ(runs.size(), static_cast<std::size_t>(kMessages));
  int twice = 0;
  for (const auto& [key, n] : runs) {
    if (n != 1) ++twice;
  }
  EXPECT_EQ(twice, 0) << "keys executed more than once";
  const ConsumerCounts counts = consumer.counts();
  EXPECT_EQ(counts.executed, static_cast<std::uint64_t>(kMessages));
  EXPECT_EQ(counts.dead_lettered, 0u);
  EXPECT_GT(counts.broker_errors, 0u) << "the broker was down for a while";
  RecordProperty("received", std::to_string(counts.received));
  RecordProperty("replayed", std::to_string(counts.replayed));
  std::error_code ec;
  server.value().Kill().ok();
  std::filesystem::remove_all(dir, ec);
}

}  // namespace
}  // namespace idem::nats
