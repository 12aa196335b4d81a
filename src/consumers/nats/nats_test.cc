// The NATS JetStream adapter against a real nats-server: the shared one (IDEM_TEST_NATS, from
// scripts/servers.sh) for the Broker contract, and servers of its own (tests/support NatsServer)
// for restarts. Every test uses streams and subjects of its own.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <map>
#include <random>
#include <set>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nats/nats.h>

#include "consumers/nats/connection.h"
#include "idem/consumers/nats.h"
#include "tests/support/recycled_deliveries.h"
#include "tests/support/servers.h"

namespace idem::nats {
namespace {

using namespace std::chrono_literals;
using std::chrono::milliseconds;
using ::testing::HasSubstr;
using SteadyClock = std::chrono::steady_clock;

std::string SharedUrl() {
  auto url = testing::RequiredEnv("IDEM_TEST_NATS");
  if (!url) {
    ADD_FAILURE() << url.error().ToString();
    return "nats://127.0.0.1:1";
  }
  return *url;
}

// A name no other test (or earlier run) uses: the test's name, the pid and a random number.
std::string Unique(std::string_view what) {
  static std::mt19937_64 rng(std::random_device{}());
  std::string name = ::testing::UnitTest::GetInstance()->current_test_info()->name();
  std::replace_if(
      name.begin(), name.end(), [](char c) { return !std::isalnum(static_cast<unsigned char>(c)); },
      '_');
  return std::string(what) + "_" + name + "_" + std::to_string(::getpid()) + "_" +
         std::to_string(rng() % 1'000'000);
}

// Names of one test's streams, subjects and durable.
struct Names {
  std::string stream = Unique("S");
  std::string subject_prefix = Unique("s");  // subjects are subject_prefix.<x>
  std::string durable = Unique("D");
  std::string dlq_stream = Unique("DLQ");
  std::string dlq_subject = Unique("dlq");

  std::string Subject(std::string_view x) const { return subject_prefix + "." + std::string(x); }

  NatsConsumerConfig Config(const std::string& url) const {
    NatsConsumerConfig c;
    c.url = url;
    c.stream = stream;
    c.subjects = {subject_prefix + ".>"};
    c.durable = durable;
    c.dlq_subject = dlq_subject;
    c.dlq_stream = dlq_stream;
    c.connect_timeout = 2s;
    c.request_timeout = 2s;
    return c;
  }
};

std::unique_ptr<Broker> Open(const NatsConsumerConfig& c) {
  auto b = OpenNatsConsumer(c);
  if (!b) {
    ADD_FAILURE() << b.error().ToString();
    return nullptr;
  }
  return std::move(*b);
}

std::unique_ptr<Publisher> OpenPublisher(const std::string& url) {
  auto p = Publisher::Open(url);
  if (!p) {
    ADD_FAILURE() << p.error().ToString();
    return nullptr;
  }
  return std::move(*p);
}

// Polls until `n` messages came or `timeout` passed.
std::vector<BrokerMessage> PollN(Broker& b, std::size_t n, milliseconds timeout) {
  std::vector<BrokerMessage> out;
  const auto deadline = SteadyClock::now() + timeout;
  while (out.size() < n && SteadyClock::now() < deadline) {
    auto batch = b.Poll(n - out.size(), 200ms);
    if (!batch) continue;
    for (auto& m : *batch) out.push_back(std::move(m));
  }
  return out;
}

std::vector<const BrokerMessage*> Ptrs(std::span<const BrokerMessage> ms) {
  std::vector<const BrokerMessage*> out;
  for (const auto& m : ms) out.push_back(&m);
  return out;
}

std::string HeaderOf(const Headers& headers, std::string_view name) {
  for (const auto& [k, v] : headers) {
    if (k == name) return v;
  }
  return "<missing>";
}

TEST(NatsConfigTest, BadConfigIsInvalidArgumentNamingTheOption) {
  Names n;
  const NatsConsumerConfig good = n.Config("nats://127.0.0.1:1");
  auto expect_invalid = [](NatsConsumerConfig c, std::string_view option) {
    auto b = OpenNatsConsumer(c);
    ASSERT_FALSE(b.has_value()) << option;
    EXPECT_EQ(b.error().code(), StatusCode::kInvalidArgument) << b.error().ToString();
    EXPECT_THAT(b.error().message(), HasSubstr(std::string(option)));
  };
  auto c = good;
  c.url = "";
  expect_invalid(c, "url");
  c = good;
  c.stream = "";
  expect_invalid(c, "stream");
  c = good;
  c.stream = "a.b";
  expect_invalid(c, "stream");
  c = good;
  c.durable = "";
  expect_invalid(c, "durable");
  c = good;
  c.durable = "x.y";
  expect_invalid(c, "durable");
  c = good;
  c.subjects = {"ok.>", "bad subject"};
  expect_invalid(c, "subjects");
  c = good;
  c.dlq_subject = "dlq.*";
  expect_invalid(c, "dlq_subject");
  c = good;
  c.dlq_subject = n.Subject("dead");  // inside the consumed stream: a loop
  expect_invalid(c, "dlq_subject");
  c = good;
  c.dlq_stream = "";
  expect_invalid(c, "dlq_stream");
  c = good;
  c.dlq_stream = c.stream;
  expect_invalid(c, "dlq_stream");
  c = good;
  c.ack_wait = 0ms;
  expect_invalid(c, "ack_wait");
  c = good;
  c.max_ack_pending = 0;
  expect_invalid(c, "max_ack_pending");
  c = good;
  c.consumer_check_interval = 0ms;
  expect_invalid(c, "consumer_check_interval");
}

TEST(NatsAckReplyTest, ReadsSequenceAndDeliveriesFromBothForms) {
  auto v1 = ParseAckReply("$JS.ACK.ORDERS.worker.3.1042.77.1700000000000000000.12");
  ASSERT_TRUE(v1.has_value());
  EXPECT_EQ(v1->stream_sequence, "1042");
  EXPECT_EQ(v1->sequence, 1042u);
  EXPECT_EQ(v1->delivered, 3u);
  auto v2 = ParseAckReply("$JS.ACK.hub.ACCHASH.ORDERS.worker.1.7.7.1700000000000000000.0.r4nd0m");
  ASSERT_TRUE(v2.has_value());
  EXPECT_EQ(v2->stream_sequence, "7");
  EXPECT_EQ(v2->sequence, 7u);
  EXPECT_EQ(v2->delivered, 1u);
  auto v2_short = ParseAckReply("$JS.ACK._.ACCHASH.ORDERS.worker.2.9.8.1700000000000000000.0");
  ASSERT_TRUE(v2_short.has_value());
  EXPECT_EQ(v2_short->stream_sequence, "9");
  EXPECT_EQ(v2_short->delivered, 2u);
  EXPECT_FALSE(ParseAckReply("").has_value());
  EXPECT_FALSE(ParseAckReply("_INBOX.abc").has_value());
  EXPECT_FALSE(ParseAckReply("$JS.ACK.ORDERS.worker.3").has_value());
  EXPECT_FALSE(ParseAckReply("$JS.ACK.ORDERS.worker.x.1042.77.1.12").has_value());
  EXPECT_FALSE(ParseAckReply("$JS.ACK.ORDERS.worker.3.-5.77.1.12").has_value());
}

TEST(NatsConfigTest, MessagesHideUrlSecrets) {
  EXPECT_EQ(HideSecrets("nats://127.0.0.1:4222"), "nats://127.0.0.1:4222");
  EXPECT_EQ(HideSecrets("nats://alice:s3cret@h:4222"), "nats://alice:***@h:4222");
  EXPECT_EQ(HideSecrets("nats://t0ken@h:4222, nats://bob:pw@g:1"),
            "nats://***@h:4222,nats://bob:***@g:1");
  auto port = testing::FreePort();
  ASSERT_TRUE(port.has_value());
  Names n;
  auto c = n.Config("nats://alice:s3cret@127.0.0.1:" + std::to_string(*port));
  c.connect_timeout = 200ms;
  auto b = OpenNatsConsumer(c);
  ASSERT_FALSE(b.has_value());
  EXPECT_THAT(b.error().message(), HasSubstr("alice:***@"));
  EXPECT_THAT(b.error().message(), ::testing::Not(HasSubstr("s3cret")));
}

TEST(NatsConfigTest, NoServerIsUnavailable) {
  auto port = testing::FreePort();
  ASSERT_TRUE(port.has_value());
  Names n;
  auto c = n.Config("nats://127.0.0.1:" + std::to_string(*port));
  c.connect_timeout = 300ms;
  auto b = OpenNatsConsumer(c);
  ASSERT_FALSE(b.has_value());
  EXPECT_EQ(b.error().code(), StatusCode::kUnavailable) << b.error().ToString();
}

TEST(NatsBrokerTest, MissingStreamWithoutCreateIsFailedPrecondition) {
  Names n;
  auto c = n.Config(SharedUrl());
  c.create_streams = false;
  auto b = OpenNatsConsumer(c);
  ASSERT_FALSE(b.has_value());
  EXPECT_EQ(b.error().code(), StatusCode::kFailedPrecondition) << b.error().ToString();
  EXPECT_THAT(b.error().message(), HasSubstr(n.stream));
}

TEST(NatsBrokerTest, PollsInOrderPerSubjectWithMetadataAndHeaders) {
  Names n;
  auto b = Open(n.Config(SharedUrl()));
  auto p = OpenPublisher(SharedUrl());
  ASSERT_TRUE(b && p);
  EXPECT_EQ(b->Name(), "nats");
  EXPECT_TRUE(b->Health().ok());
  const std::vector<std::string> subjects = {n.Subject("a"), n.Subject("b"), n.Subject("c")};
  constexpr int kPerSubject = 30;
  for (int i = 0; i < kPerSubject; ++i) {
    for (const auto& s : subjects) {
      ASSERT_TRUE(p->PublishAsync(s, s + "#" + std::to_string(i),
                                  {{"Idempotency-Key", s + "-" + std::to_string(i)}})
                      .ok());
    }
  }
  ASSERT_TRUE(p->WaitPublished(5s).ok());

  const auto got = PollN(*b, subjects.size() * kPerSubject, 10s);
  ASSERT_EQ(got.size(), subjects.size() * kPerSubject);
  std::map<std::string, std::vector<const BrokerMessage*>> by_subject;
  std::set<std::uint64_t> handles;
  for (const auto& m : got) {
    by_subject[m.partition].push_back(&m);
    handles.insert(m.handle);
    EXPECT_EQ(m.deliveries, 1u);
  }
  EXPECT_EQ(handles.size(), got.size()) << "handles are distinct";
  ASSERT_EQ(by_subject.size(), subjects.size());
  for (const auto& s : subjects) {
    const auto& ms = by_subject[s];
    ASSERT_EQ(ms.size(), static_cast<std::size_t>(kPerSubject));
    std::uint64_t last = 0;
    for (int i = 0; i < kPerSubject; ++i) {
      EXPECT_EQ(ms[i]->payload, s + "#" + std::to_string(i));
      EXPECT_EQ(HeaderOf(ms[i]->headers, "Idempotency-Key"), s + "-" + std::to_string(i));
      const std::uint64_t seq = std::stoull(ms[i]->position);
      EXPECT_GT(seq, last) << "stream sequences grow within a subject";
      last = seq;
    }
  }
  EXPECT_TRUE(b->Acknowledge(Ptrs(got)).ok());
}

// Messages handed back with Recycle are filled in with later deliveries: nothing of what they
// held before may show.
TEST(NatsBrokerTest, RecycledMessagesHoldOnlyTheNextDelivery) {
  Names n;
  auto b = Open(n.Config(SharedUrl()));
  auto p = OpenPublisher(SharedUrl());
  ASSERT_TRUE(b && p);
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(
        p->Publish(n.Subject("first"), std::string(500, 'x'),
                   {{"Idempotency-Key", "first-" + std::to_string(i)}, {"A", "1"}, {"B", "2"}})
            .has_value());
  }
  auto first = PollN(*b, 3, 5s);
  ASSERT_EQ(first.size(), 3u);
  ASSERT_TRUE(b->Acknowledge(Ptrs(first)).ok());
  b->Recycle(std::move(first));

  ASSERT_TRUE(p->Publish(n.Subject("second"), "s0", {{"Idempotency-Key", "second-0"}}).has_value());
  ASSERT_TRUE(p->Publish(n.Subject("second"), "s1").has_value());
  ASSERT_TRUE(p->Publish(n.Subject("second"), "").has_value());
  const auto second = PollN(*b, 3, 5s);
  ASSERT_EQ(second.size(), 3u);
  idem::testing::ExpectOnlyTheNextDeliveries(second, n.Subject("second"), {"s0", "s1", ""},
                                             "second-0");
  EXPECT_LT(std::stoull(second[0].position), std::stoull(second[1].position));
  EXPECT_TRUE(b->Acknowledge(Ptrs(second)).ok());
}

TEST(NatsBrokerTest, NothingToReadIsAnEmptyBatchAfterTheWait) {
  Names n;
  auto b = Open(n.Config(SharedUrl()));
  ASSERT_TRUE(b);
  const auto start = SteadyClock::now();
  auto batch = b->Poll(10, 300ms);
  const auto took = SteadyClock::now() - start;
  ASSERT_TRUE(batch.has_value()) << batch.error().ToString();
  EXPECT_TRUE(batch->empty());
  EXPECT_GE(took, 250ms);
  EXPECT_LT(took, 3s);
  auto none = b->Poll(0, 300ms);
  ASSERT_TRUE(none.has_value());
  EXPECT_TRUE(none->empty());
}

TEST(NatsBrokerTest, AcknowledgedMessagesAreNotDeliveredAgain) {
  Names n;
  auto c = n.Config(SharedUrl());
  c.ack_wait = 1s;
  auto b = Open(c);
  auto p = OpenPublisher(SharedUrl());
  ASSERT_TRUE(b && p);
  for (int i = 0; i < 5; ++i)
    ASSERT_TRUE(p->Publish(n.Subject("x"), std::to_string(i)).has_value());
  const auto got = PollN(*b, 5, 5s);
  ASSERT_EQ(got.size(), 5u);
  ASSERT_TRUE(b->Acknowledge(Ptrs(got)).ok());
  // Acking again (a retried Acknowledge) is harmless.
  EXPECT_TRUE(b->Acknowledge(Ptrs(got)).ok());
  const auto again = PollN(*b, 1, 2500ms);  // past ack_wait
  EXPECT_TRUE(again.empty()) << again.front().payload;

  // A new Broker on the same durable starts after the acknowledged messages.
  b.reset();
  ASSERT_TRUE(p->Publish(n.Subject("x"), "after").has_value());
  auto b2 = Open(c);
  ASSERT_TRUE(b2);
  const auto rest = PollN(*b2, 1, 5s);
  ASSERT_EQ(rest.size(), 1u);
  EXPECT_EQ(rest[0].payload, "after");
}

TEST(NatsBrokerTest, UnacknowledgedMessageIsDeliveredAgainAfterAckWait) {
  Names n;
  auto c = n.Config(SharedUrl());
  c.ack_wait = 1s;
  auto b = Open(c);
  auto p = OpenPublisher(SharedUrl());
  ASSERT_TRUE(b && p);
  ASSERT_TRUE(p->Publish(n.Subject("x"), "m").has_value());
  const auto first = PollN(*b, 1, 5s);
  ASSERT_EQ(first.size(), 1u);
  const auto polled = SteadyClock::now();
  const auto second = PollN(*b, 1, 5s);
  ASSERT_EQ(second.size(), 1u);
  EXPECT_GE(SteadyClock::now() - polled, 900ms);
  EXPECT_EQ(second[0].position, first[0].position);
  EXPECT_EQ(second[0].payload, "m");
  EXPECT_EQ(second[0].deliveries, 2u);
  EXPECT_NE(second[0].handle, first[0].handle);
  ASSERT_TRUE(b->Acknowledge(Ptrs(second)).ok());
}

TEST(NatsBrokerTest, RedeliverComesBackNoSoonerThanTheDelayInOrder) {
  Names n;
  auto b = Open(n.Config(SharedUrl()));  // ack_wait 30 s: only the nak brings them back
  auto p = OpenPublisher(SharedUrl());
  ASSERT_TRUE(b && p);
  for (int i = 0; i < 3; ++i)
    ASSERT_TRUE(p->Publish(n.Subject("x"), std::to_string(i)).has_value());
  const auto first = PollN(*b, 3, 5s);
  ASSERT_EQ(first.size(), 3u);
  const auto naked = SteadyClock::now();
  ASSERT_TRUE(b->Redeliver(Ptrs(first), 700ms).ok());
  const auto second = PollN(*b, 3, 5s);
  const auto took = SteadyClock::now() - naked;
  ASSERT_EQ(second.size(), 3u);
  EXPECT_GE(took, 700ms);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(second[i].payload, std::to_string(i));
    EXPECT_EQ(second[i].position, first[i].position);
    EXPECT_EQ(second[i].deliveries, 2u);
  }
  ASSERT_TRUE(b->Acknowledge(Ptrs(second)).ok());
}

// Handing back a subject's messages frees room in max_ack_pending once the rest of the batch
// is acknowledged, and JetStream then lets the subject's newer messages out before the naked
// ones are due. The adapter holds the subject: the newer ones come back after the naked ones,
// so the subject's order holds; another subject is not held.
TEST(NatsBrokerTest, NewerMessagesOfAHandedBackSubjectWaitForTheHandedBackOnes) {
  Names n;
  auto b = Open(n.Config(SharedUrl()));  // ack_wait 30 s: only the nak brings them back
  auto p = OpenPublisher(SharedUrl());
  ASSERT_TRUE(b && p);
  for (int i = 0; i < 2; ++i)
    ASSERT_TRUE(p->Publish(n.Subject("x"), "x" + std::to_string(i)).has_value());
  const auto first = PollN(*b, 2, 5s);
  ASSERT_EQ(first.size(), 2u);
  for (int i = 2; i < 5; ++i)
    ASSERT_TRUE(p->Publish(n.Subject("x"), "x" + std::to_string(i)).has_value());
  ASSERT_TRUE(p->Publish(n.Subject("y"), "y0").has_value());
  ASSERT_TRUE(b->Acknowledge(Ptrs(std::span(first).first(1))).ok());
  // Before the nak: the server counts its delay from when the nak arrives, inside Redeliver
  // (taken after it returned, x1 came back once at 698.8 ms by this clock).
  const auto naked = SteadyClock::now();
  ASSERT_TRUE(b->Redeliver(Ptrs(std::span(first).subspan(1)), 700ms).ok());  // x1
  std::vector<std::string> order;
  const auto deadline = SteadyClock::now() + 10s;
  while (order.size() < 5 && SteadyClock::now() < deadline) {
    auto batch = b->Poll(10, 200ms);
    ASSERT_TRUE(batch) << batch.error().ToString();
    for (const auto& m : *batch) {
      order.push_back(m.payload);
      if (m.payload == "x1") {
        EXPECT_GE(SteadyClock::now() - naked, 700ms);
      }
      if (m.payload == "y0") {
        EXPECT_LT(SteadyClock::now() - naked, 700ms) << "y is not held";
      }
    }
    ASSERT_TRUE(b->Acknowledge(Ptrs(*batch)).ok());
  }
  std::erase(order, "y0");
  EXPECT_EQ(order, (std::vector<std::string>{"x1", "x2", "x3", "x4"}));
}

// Polls, acknowledging what comes, until `n` messages came or 10 s passed: their payloads.
std::vector<std::string> TakePayloads(Broker& b, std::size_t n) {
  std::vector<std::string> order;
  const auto deadline = SteadyClock::now() + 10s;
  while (order.size() < n && SteadyClock::now() < deadline) {
    auto got = b.Poll(10, 100ms);
    if (!got) {
      ADD_FAILURE() << got.error().ToString();
      break;
    }
    for (const auto& m : *got) order.push_back(m.payload);
    EXPECT_TRUE(b.Acknowledge(Ptrs(*got)).ok());
  }
  return order;
}

// x0..x5 on one subject, and a Broker (ack_wait 1 s, max_ack_pending 4) that polled x0..x3 and
// is to be killed: reset without settling them, as a kill leaves them.
class NatsCrashTest : public ::testing::Test {
 protected:
  void SetUp() override {
    config_ = names_.Config(SharedUrl());
    config_.ack_wait = 1s;
    config_.max_ack_pending = 4;
    publisher_ = OpenPublisher(SharedUrl());
    first_ = Open(config_);
    ASSERT_TRUE(first_ && publisher_);
    for (int i = 0; i < 6; ++i) {
      ASSERT_TRUE(publisher_->Publish(names_.Subject("x"), "x" + std::to_string(i)).has_value());
    }
    batch_ = PollN(*first_, 4, 5s);  // max_ack_pending
    ASSERT_EQ(batch_.size(), 4u);
  }

  Names names_;
  NatsConsumerConfig config_;
  std::unique_ptr<Publisher> publisher_;
  std::unique_ptr<Broker> first_;
  std::vector<BrokerMessage> batch_;  // x0..x3
};

// A consumer killed in the middle of a batch leaves its messages pending with two deadlines:
// those it had settled (not acknowledged yet) are due ack_wait after the poll, those it was still
// working on later (it touched them). The settled ones come back first; once the restarted
// consumer acknowledges them, max_ack_pending has room, and JetStream lets the subject's newer
// messages out before the unsettled ones are due (ConsumeE2eTest/nats once charged 17 before
// 11 this way). The restarted Broker holds what is newer than everything pending at its start
// until all of that is back.
TEST_F(NatsCrashTest, AfterARestartNewerMessagesWaitForWhatWasPendingBefore) {
  std::this_thread::sleep_for(500ms);
  ASSERT_TRUE(first_->Touch(Ptrs(std::span(batch_).subspan(2))).ok());  // x2, x3: still open
  first_.reset();

  auto restarted = Open(config_);
  ASSERT_TRUE(restarted);
  EXPECT_EQ(TakePayloads(*restarted, 6),
            (std::vector<std::string>{"x0", "x1", "x2", "x3", "x4", "x5"}));
}

// A Broker killed during its restart hold leaves the newer messages it NAKed pending too, due
// long before the older ones it was waiting for. The next Broker gathers everything pending
// at its start and hands it out in stream order.
TEST_F(NatsCrashTest, AfterTwoCrashesInARowTheOrderStillHolds) {
  ASSERT_TRUE(first_->Acknowledge(Ptrs(std::span(batch_).first(2))).ok());
  first_.reset();  // x2, x3 pending, due a second after the poll

  auto second = Open(config_);  // gets x4 and x5 (room for two), and NAKs them for 100 ms
  ASSERT_TRUE(second);
  for (int i = 0; i < 3; ++i) {
    auto got = second->Poll(10, 100ms);
    ASSERT_TRUE(got) << got.error().ToString();
    EXPECT_TRUE(got->empty()) << "x2 and x3 are not back yet";
  }
  second.reset();

  auto third = Open(config_);
  ASSERT_TRUE(third);
  EXPECT_EQ(TakePayloads(*third, 4), (std::vector<std::string>{"x2", "x3", "x4", "x5"}));
}

// A restart hold releases what it gathered a batch at a time. When the consumer hands one of
// them back, the rest of its subject still waiting in the Broker waits behind it as a newer
// fetched message would: NAKed, to come after the handed-back one.
TEST_F(NatsCrashTest, WhatARestartHoldReleasedWaitsBehindAHandedBackMessage) {
  first_.reset();  // x0..x3 pending, due a second after the poll
  auto restarted = Open(config_);
  ASSERT_TRUE(restarted);
  std::vector<BrokerMessage> front;
  const auto deadline = SteadyClock::now() + 10s;
  while (front.empty() && SteadyClock::now() < deadline) {
    auto got = restarted->Poll(2, 100ms);
    ASSERT_TRUE(got) << got.error().ToString();
    front = std::move(*got);
  }
  ASSERT_EQ(front.size(), 2u);
  EXPECT_EQ(front[0].payload, "x0");
  EXPECT_EQ(front[1].payload, "x1");
  ASSERT_TRUE(restarted->Acknowledge(Ptrs(std::span(front).first(1))).ok());
  ASSERT_TRUE(restarted->Redeliver(Ptrs(std::span(front).subspan(1)), 100ms).ok());
  EXPECT_EQ(TakePayloads(*restarted, 5), (std::vector<std::string>{"x1", "x2", "x3", "x4", "x5"}));
}

// x0 on one subject, polled by `holder_` (ack_wait 1 s): pending at the next Broker's start.
class OnePendingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    config_ = names_.Config(SharedUrl());
    config_.ack_wait = 1s;
    publisher_ = OpenPublisher(SharedUrl());
    holder_ = Open(config_);
    ASSERT_TRUE(holder_ && publisher_);
    ASSERT_TRUE(publisher_->Publish(names_.Subject("x"), "x0").has_value());
    held_ = PollN(*holder_, 1, 5s);
    ASSERT_EQ(held_.size(), 1u);
  }

  Names names_;
  NatsConsumerConfig config_;
  std::unique_ptr<Publisher> publisher_;
  std::unique_ptr<Broker> holder_;
  std::vector<BrokerMessage> held_;  // x0
};

// A delivery of a message pending at the start can go astray (here: to another consumer of the
// durable, which dies with it) and come back only after the hold's deadline. The server still
// counts it pending then, so the hold goes on for another ack_wait, and it comes first.
TEST_F(OnePendingTest, ARestartHoldWaitsOnceMoreForAMessageStillPendingAtItsDeadline) {
  holder_.reset();  // killed: x0 is due a second after its poll
  const auto started = SteadyClock::now();
  auto restarted = Open(config_);  // holds until x0 is back, or 2 s from now
  auto astray = Open(config_);     // takes x0's redelivery instead, and keeps it 2.2 s
  ASSERT_TRUE(restarted && astray);
  const auto taken = PollN(*astray, 1, 5s);
  ASSERT_EQ(taken.size(), 1u);
  ASSERT_EQ(taken[0].payload, "x0");
  ASSERT_TRUE(publisher_->Publish(names_.Subject("x"), "x1").has_value());
  std::vector<std::string> order;
  while (order.size() < 2 && SteadyClock::now() - started < 10s) {
    if (astray && SteadyClock::now() - started < 2200ms) {
      ASSERT_TRUE(astray->Touch(Ptrs(taken)).ok());
    } else {
      astray.reset();  // dies with x0: it is due again a second later
    }
    auto got = restarted->Poll(10, 100ms);
    ASSERT_TRUE(got) << got.error().ToString();
    for (const auto& m : *got) order.push_back(m.payload);
    ASSERT_TRUE(restarted->Acknowledge(Ptrs(*got)).ok());
  }
  EXPECT_EQ(order, (std::vector<std::string>{"x0", "x1"}));
}

// What was pending at the start may never come back to this Broker (another consumer of the
// durable has it, or it left the stream): the hold is given up ack_wait and a second after the
// start, or (the server still counting it pending then) twice that.
TEST_F(OnePendingTest, ARestartHoldEndsWhenWhatWasPendingGoesElsewhere) {
  const auto started = SteadyClock::now();
  auto restarted = Open(config_);
  ASSERT_TRUE(restarted);
  ASSERT_TRUE(publisher_->Publish(names_.Subject("x"), "x1").has_value());
  std::vector<BrokerMessage> got;
  while (got.empty() && SteadyClock::now() - started < 10s) {
    ASSERT_TRUE(holder_->Touch(Ptrs(held_)).ok());  // x0 stays the other consumer's
    auto batch = restarted->Poll(10, 200ms);
    ASSERT_TRUE(batch) << batch.error().ToString();
    for (auto& m : *batch) got.push_back(std::move(m));
  }
  const auto took = SteadyClock::now() - started;
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].payload, "x1");
  EXPECT_GE(took, 4s);  // twice ack_wait + the grace
  EXPECT_LT(took, 7s);
  ASSERT_TRUE(restarted->Acknowledge(Ptrs(got)).ok());
  ASSERT_TRUE(holder_->Acknowledge(Ptrs(held_)).ok());
}

TEST(NatsBrokerTest, TouchKeepsAMessageFromRedeliveryPastAckWait) {
  Names n;
  auto c = n.Config(SharedUrl());
  c.ack_wait = 1s;
  auto b = Open(c);
  auto p = OpenPublisher(SharedUrl());
  ASSERT_TRUE(b && p);
  ASSERT_TRUE(p->Publish(n.Subject("x"), "slow").has_value());
  const auto first = PollN(*b, 1, 5s);
  ASSERT_EQ(first.size(), 1u);
  // 2.5 s of work, touched every 400 ms: never redelivered meanwhile.
  for (int i = 0; i < 6; ++i) {
    ASSERT_TRUE(b->Touch(Ptrs(first)).ok());
    auto batch = b->Poll(1, 400ms);
    ASSERT_TRUE(batch.has_value());
    EXPECT_TRUE(batch->empty()) << "redelivered while touched";
  }
  // Left alone, it comes back.
  const auto again = PollN(*b, 1, 5s);
  ASSERT_EQ(again.size(), 1u);
  EXPECT_EQ(again[0].position, first[0].position);
  ASSERT_TRUE(b->Acknowledge(Ptrs(again)).ok());
}

TEST(NatsBrokerTest, DeadLetterCarriesThePayloadAndHeaders) {
  Names n;
  const std::string url = SharedUrl();
  auto b = Open(n.Config(url));
  auto p = OpenPublisher(url);
  ASSERT_TRUE(b && p);
  ASSERT_TRUE(
      p->Publish(n.Subject("x"), "poison-payload", {{"Idempotency-Key", "k-1"}, {"X-Trace", "t1"}})
          .has_value());
  const auto got = PollN(*b, 1, 5s);
  ASSERT_EQ(got.size(), 1u);
  DeadLetterInfo info;
  info.reason = "attempts_exhausted";
  info.attempts = 3;
  info.last_error = "boom\r\nsecond line";
  info.key = "k-1";
  ASSERT_TRUE(b->DeadLetter(got[0], info).ok());
  // Sent again (a crash before the ack): stored once.
  ASSERT_TRUE(b->DeadLetter(got[0], info).ok());
  ASSERT_TRUE(b->Acknowledge(Ptrs(got)).ok());

  auto dlq = ReadStream(url, n.dlq_stream);
  ASSERT_TRUE(dlq.has_value()) << dlq.error().ToString();
  ASSERT_EQ(dlq->size(), 1u);
  const StoredMessage& d = dlq->front();
  EXPECT_EQ(d.subject, n.dlq_subject);
  EXPECT_EQ(d.payload, "poison-payload");
  EXPECT_EQ(HeaderOf(d.headers, "Idempotency-Key"), "k-1");
  EXPECT_EQ(HeaderOf(d.headers, "X-Trace"), "t1");
  EXPECT_EQ(HeaderOf(d.headers, std::string(kDlqReasonHeader)), "attempts_exhausted");
  EXPECT_EQ(HeaderOf(d.headers, std::string(kDlqAttemptsHeader)), "3");
  EXPECT_EQ(HeaderOf(d.headers, std::string(kDlqErrorHeader)), "boom  second line");
  EXPECT_EQ(HeaderOf(d.headers, std::string(kDlqKeyHeader)), "k-1");
  EXPECT_EQ(HeaderOf(d.headers, std::string(kDlqSourceHeader)),
            got[0].partition + "@" + got[0].position);

  // The source stream still holds the original, untouched.
  auto src = ReadStream(url, n.stream);
  ASSERT_TRUE(src.has_value());
  ASSERT_EQ(src->size(), 1u);
  EXPECT_EQ(src->front().payload, "poison-payload");
}

// Creates stream `name` over `subject` that accepts Nats-Rollup (idem's own streams do not).
void CreateRollupStream(const std::string& url, const std::string& name,
                        const std::string& subject) {
  ConnectOptions co;
  co.url = url;
  auto c = Connect(co);
  ASSERT_TRUE(c.has_value()) << c.error().ToString();
  const char* subjects[] = {subject.c_str()};
  jsStreamConfig cfg;
  jsStreamConfig_Init(&cfg);
  cfg.Name = name.c_str();
  cfg.Subjects = subjects;
  cfg.SubjectsLen = 1;
  cfg.AllowRollup = true;
  jsStreamInfo* si = nullptr;
  jsErrCode jerr = static_cast<jsErrCode>(0);
  ASSERT_EQ(js_AddStream(&si, c->js.get(), &cfg, nullptr, &jerr), NATS_OK) << jerr;
  jsStreamInfo_Destroy(si);
}

TEST(NatsBrokerTest, DeadLetterKeepsTheOriginalsNatsHeadersUnderAnotherName) {
  const std::string url = SharedUrl();
  // Two source streams dead-lettering into one DLQ stream.
  Names a, b;
  b.dlq_stream = a.dlq_stream;
  b.dlq_subject = a.dlq_subject;
  CreateRollupStream(url, a.stream, a.subject_prefix + ".>");
  auto broker_a = Open(a.Config(url));
  auto broker_b = Open(b.Config(url));
  auto p = OpenPublisher(url);
  ASSERT_TRUE(broker_a && broker_b && p);
  // A rollup (and a precondition) that held for the source stream. First: nats-server 2.9
  // moves a consumer past everything before a rollup, whatever its subject.
  ASSERT_TRUE(
      p->Publish(
           a.Subject("r"), "rollup",
           {{"Idempotency-Key", "kr"}, {"Nats-Rollup", "sub"}, {"Nats-Expected-Stream", a.stream}})
          .has_value());
  // Two different messages with the same Nats-Msg-Id (each stored by its own stream).
  ASSERT_TRUE(
      p->Publish(a.Subject("x"), "from-a", {{"Idempotency-Key", "ka"}, {"Nats-Msg-Id", "X"}})
          .has_value());
  ASSERT_TRUE(
      p->Publish(b.Subject("x"), "from-b", {{"Idempotency-Key", "kb"}, {"Nats-Msg-Id", "X"}})
          .has_value());
  const auto got_a = PollN(*broker_a, 2, 5s);
  const auto got_b = PollN(*broker_b, 1, 5s);
  ASSERT_EQ(got_a.size(), 2u);
  ASSERT_EQ(got_b.size(), 1u);
  const DeadLetterInfo info{.reason = "permanent", .attempts = 1};
  for (const BrokerMessage& m : got_a) {
    const Status s = broker_a->DeadLetter(m, info);
    EXPECT_TRUE(s.ok()) << m.payload << ": " << s.ToString();
  }
  ASSERT_TRUE(broker_b->DeadLetter(got_b[0], info).ok());

  auto dlq = ReadStream(url, a.dlq_stream);
  ASSERT_TRUE(dlq.has_value()) << dlq.error().ToString();
  ASSERT_EQ(dlq->size(), 3u);
  std::map<std::string, const StoredMessage*> by_payload;
  for (const StoredMessage& m : *dlq) by_payload[m.payload] = &m;
  ASSERT_EQ(by_payload.size(), 3u);
  // The dead letter's own message id is idem's: <stream>:<sequence>.
  for (const auto& [payload, id] : {std::pair{"from-a", a.stream + ":" + got_a[1].position},
                                    std::pair{"from-b", b.stream + ":" + got_b[0].position}}) {
    ASSERT_TRUE(by_payload.contains(payload)) << payload;
    const Headers& h = by_payload[payload]->headers;
    EXPECT_EQ(HeaderOf(h, "Nats-Msg-Id"), id) << payload;
    EXPECT_EQ(HeaderOf(h, "Idem-Original-Nats-Msg-Id"), "X") << payload;
  }
  ASSERT_TRUE(by_payload.contains("rollup"));
  const Headers& r = by_payload["rollup"]->headers;
  EXPECT_EQ(HeaderOf(r, "Nats-Rollup"), "<missing>");
  EXPECT_EQ(HeaderOf(r, "Idem-Original-Nats-Rollup"), "sub");
  EXPECT_EQ(HeaderOf(r, "Nats-Expected-Stream"), "<missing>");
  EXPECT_EQ(HeaderOf(r, "Idem-Original-Nats-Expected-Stream"), a.stream);
  EXPECT_EQ(HeaderOf(r, "Idempotency-Key"), "kr");
}

// Another message already holds the dead letter's message id in the DLQ stream (e.g. one of a
// source stream of the same name, deleted and created again within the duplicate window): the
// dead letter goes under the next id, <id>#2, and a repeat (after a crash) finds it there.
TEST(NatsBrokerTest, DeadLetterWhoseIdIsTakenByAnotherMessageGoesUnderTheNextId) {
  Names n;
  const std::string url = SharedUrl();
  auto b = Open(n.Config(url));
  auto p = OpenPublisher(url);
  ASSERT_TRUE(b && p);
  ASSERT_TRUE(p->Publish(n.Subject("x"), "poison", {{"Idempotency-Key", "k-1"}}).has_value());
  const auto got = PollN(*b, 1, 5s);
  ASSERT_EQ(got.size(), 1u);
  const std::string id = n.stream + ":" + got[0].position;
  ASSERT_TRUE(p->Publish(n.dlq_subject, "someone-else", {{"Nats-Msg-Id", id}}).has_value());
  for (int attempt = 0; attempt < 2; ++attempt) {
    const Status dead = b->DeadLetter(got[0], {.reason = "permanent", .attempts = 1});
    EXPECT_TRUE(dead.ok()) << dead.ToString();
  }
  auto dlq = ReadStream(url, n.dlq_stream);
  ASSERT_TRUE(dlq.has_value()) << dlq.error().ToString();
  ASSERT_EQ(dlq->size(), 2u);
  EXPECT_EQ((*dlq)[0].payload, "someone-else");
  EXPECT_EQ((*dlq)[1].payload, "poison");
  EXPECT_EQ(HeaderOf((*dlq)[1].headers, "Nats-Msg-Id"), id + "#2");

  // Every id taken: refused, nothing stored, the source not to be acknowledged.
  ASSERT_TRUE(p->Publish(n.Subject("x"), "poison-2", {{"Idempotency-Key", "k-2"}}).has_value());
  const auto second = PollN(*b, 1, 5s);
  ASSERT_EQ(second.size(), 1u);
  const std::string second_id = n.stream + ":" + second[0].position;
  for (int i = 1; i <= 16; ++i) {
    const std::string taken = i == 1 ? second_id : second_id + "#" + std::to_string(i);
    ASSERT_TRUE(p->Publish(n.dlq_subject, "other", {{"Nats-Msg-Id", taken}}).has_value());
  }
  const Status refused = b->DeadLetter(second[0], {.reason = "permanent", .attempts = 1});
  EXPECT_EQ(refused.code(), StatusCode::kUnavailable) << refused.ToString();
  EXPECT_THAT(refused.message(), HasSubstr("all taken"));
  dlq = ReadStream(url, n.dlq_stream);
  ASSERT_TRUE(dlq.has_value()) << dlq.error().ToString();
  EXPECT_EQ(dlq->size(), 18u);
}

TEST(NatsBrokerTest, ExistingStreamsAreUsedAsTheyAre) {
  Names n;
  const std::string url = SharedUrl();
  auto p = OpenPublisher(url);
  ASSERT_TRUE(p);
  ASSERT_TRUE(p->EnsureStream(n.stream, {n.Subject("a"), n.Subject("b")}).ok());
  ASSERT_TRUE(p->EnsureStream(n.dlq_stream, {n.dlq_subject}).ok());
  ASSERT_TRUE(p->Publish(n.Subject("a"), "1").has_value());
  ASSERT_TRUE(p->Publish(n.Subject("b"), "2").has_value());
  auto c = n.Config(url);
  c.create_streams = false;
  c.subjects = {};  // the whole stream
  auto b = Open(c);
  ASSERT_TRUE(b);
  const auto got = PollN(*b, 2, 5s);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].payload, "1");
  EXPECT_EQ(got[1].payload, "2");
  ASSERT_TRUE(b->Acknowledge(Ptrs(got)).ok());
  EXPECT_TRUE(p->DeleteStream(n.stream).ok());
  EXPECT_TRUE(p->DeleteStream(n.dlq_stream).ok());
  EXPECT_TRUE(p->DeleteStream(n.dlq_stream).ok()) << "deleting a missing stream is ok";
}

TEST(NatsBrokerTest, EmptyHeaderValuesAreLeftOutSoTheOthersSurvive) {
  Names n;
  const std::string url = SharedUrl();
  auto p = OpenPublisher(url);
  ASSERT_TRUE(p);
  ASSERT_TRUE(p->EnsureStream(n.stream, {n.Subject("a")}).ok());
  ASSERT_TRUE(
      p->Publish(n.Subject("a"), "x", {{"Idempotency-Key", "k"}, {"Empty", ""}}).has_value());
  auto stored = ReadStream(url, n.stream);
  ASSERT_TRUE(stored.has_value());
  ASSERT_EQ(stored->size(), 1u);
  EXPECT_EQ(HeaderOf(stored->front().headers, "Idempotency-Key"), "k");
  EXPECT_EQ(HeaderOf(stored->front().headers, "Empty"), "<missing>");
}

TEST(NatsBrokerTest, OneSubjectOfAWiderStreamIsFiltered) {
  Names n;
  const std::string url = SharedUrl();
  auto p = OpenPublisher(url);
  ASSERT_TRUE(p);
  ASSERT_TRUE(p->EnsureStream(n.stream, {n.Subject("a"), n.Subject("b")}).ok());
  ASSERT_TRUE(p->Publish(n.Subject("b"), "not mine").has_value());
  ASSERT_TRUE(p->Publish(n.Subject("a"), "mine").has_value());
  auto c = n.Config(url);
  c.subjects = {n.Subject("a")};
  auto b = Open(c);
  ASSERT_TRUE(b);
  const auto got = PollN(*b, 2, 1500ms);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].payload, "mine");
  EXPECT_EQ(got[0].partition, n.Subject("a"));
  ASSERT_TRUE(b->Acknowledge(Ptrs(got)).ok());

  // Two subjects of a stream that holds three: 2.9 consumers filter on one subject only.
  ASSERT_TRUE(
      p->EnsureStream(n.stream + "_3", {n.Subject("x"), n.Subject("y"), n.Subject("z")}).ok());
  auto c3 = c;
  c3.stream = n.stream + "_3";
  c3.subjects = {n.Subject("x"), n.Subject("y")};
  auto b3 = OpenNatsConsumer(c3);
  ASSERT_FALSE(b3.has_value());
  EXPECT_EQ(b3.error().code(), StatusCode::kFailedPrecondition) << b3.error().ToString();
  EXPECT_THAT(b3.error().message(), HasSubstr("subjects"));
}

TEST(NatsBrokerTest, DurableDeletedBehindItsBackIsCreatedAgain) {
  Names n;
  const std::string url = SharedUrl();
  auto c = n.Config(url);
  c.consumer_check_interval = 500ms;
  auto b = Open(c);
  auto p = OpenPublisher(url);
  ASSERT_TRUE(b && p);
  ASSERT_TRUE(p->Publish(n.Subject("x"), "1").has_value());
  ASSERT_EQ(PollN(*b, 1, 5s).size(), 1u);
  {
    // Delete the durable with a plain JetStream context.
    natsConnection* nc = nullptr;
    ASSERT_EQ(natsConnection_ConnectTo(&nc, url.c_str()), NATS_OK);
    jsCtx* js = nullptr;
    ASSERT_EQ(natsConnection_JetStream(&js, nc, nullptr), NATS_OK);
    EXPECT_EQ(js_DeleteConsumer(js, n.stream.c_str(), n.durable.c_str(), nullptr, nullptr),
              NATS_OK);
    jsCtx_Destroy(js);
    natsConnection_Destroy(nc);
  }
  // Idle polls notice within consumer_check_interval and create it again; deliver-all reads
  // from the start.
  std::vector<BrokerMessage> got;
  const auto deleted = SteadyClock::now();
  while (got.empty() && SteadyClock::now() < deleted + 10s) {
    auto r = b->Poll(10, 200ms);
    if (!r) continue;
    for (auto& m : *r) got.push_back(std::move(m));
  }
  EXPECT_LT(SteadyClock::now() - deleted, 3s);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].payload, "1");
  EXPECT_TRUE(b->Acknowledge(Ptrs(got)).ok());
}

TEST(NatsBrokerTest, PublishToNoStreamFails) {
  auto p = OpenPublisher(SharedUrl());
  ASSERT_TRUE(p);
  const std::string subject = Unique("nostream") + ".x";
  auto r = p->Publish(subject, "x");
  EXPECT_FALSE(r.has_value());
  ASSERT_TRUE(p->PublishAsync(subject, "x").ok());
  EXPECT_FALSE(p->WaitPublished(5s).ok());
  EXPECT_EQ(ReadStream(SharedUrl(), Unique("NOSUCH")).error().code(), StatusCode::kNotFound);
}

// ---- a server of its own, restarted -------------------------------------------------------

class NatsRestartTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / Unique("idem-nats");
    auto port = testing::FreePort();
    ASSERT_TRUE(port.has_value());
    auto s = testing::NatsServer::Start(dir_, *port);
    ASSERT_TRUE(s.has_value()) << s.error().ToString();
    server_.emplace(std::move(*s));
  }
  void TearDown() override {
    server_.reset();
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  std::filesystem::path dir_;
  std::optional<testing::NatsServer> server_;
};

TEST_F(NatsRestartTest, BrokerIsUnavailableWhileTheServerIsDownAndRecoversByItself) {
  Names n;
  auto c = n.Config(server_->url());
  c.ack_wait = 2s;
  c.reconnect_wait = 100ms;
  auto b = Open(c);
  ASSERT_TRUE(b);
  {
    auto p = OpenPublisher(server_->url());
    ASSERT_TRUE(p);
    ASSERT_TRUE(p->Publish(n.Subject("x"), "before").has_value());
  }
  auto first = PollN(*b, 1, 5s);
  ASSERT_EQ(first.size(), 1u);
  ASSERT_TRUE(b->Acknowledge(Ptrs(first)).ok());

  ASSERT_TRUE(server_->Kill().ok());
  // Down: Poll and Health say so (libnats notices the closed socket at once).
  bool saw_unavailable = false;
  for (int i = 0; i < 20 && !saw_unavailable; ++i) {
    auto r = b->Poll(10, 100ms);
    saw_unavailable = !r.has_value() && r.error().code() == StatusCode::kUnavailable;
  }
  EXPECT_TRUE(saw_unavailable);
  EXPECT_FALSE(b->Health().ok());
  // Settling and dead-lettering fail at once rather than wait for request_timeout.
  const auto down = SteadyClock::now();
  EXPECT_EQ(b->Acknowledge(Ptrs(first)).code(), StatusCode::kUnavailable);
  EXPECT_EQ(b->DeadLetter(first[0], {.reason = "permanent", .attempts = 1}).code(),
            StatusCode::kUnavailable);
  EXPECT_LT(SteadyClock::now() - down, 1s);

  ASSERT_TRUE(server_->Restart().ok());
  {
    auto p = OpenPublisher(server_->url());
    ASSERT_TRUE(p);
    ASSERT_TRUE(p->Publish(n.Subject("x"), "after").has_value());
  }
  // The same Broker (no new Open) reads what was published after the restart.
  std::vector<BrokerMessage> got;
  const auto deadline = SteadyClock::now() + 15s;
  while (SteadyClock::now() < deadline) {
    auto r = b->Poll(10, 200ms);
    if (!r) continue;
    for (auto& m : *r) {
      if (m.payload == "after") got.push_back(std::move(m));
    }
    if (!got.empty()) break;
  }
  ASSERT_EQ(got.size(), 1u) << server_->Log();
  EXPECT_TRUE(b->Health().ok());
  EXPECT_TRUE(b->Acknowledge(Ptrs(got)).ok());
}

}  // namespace
}  // namespace idem::nats
