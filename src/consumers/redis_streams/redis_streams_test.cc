// The Redis Streams broker against a real Redis: the shared one (IDEM_TEST_REDIS) and, for
// restarts, servers of its own (IDEM_REDIS_SERVER). Each test uses streams of its own.
#include "idem/consumers/redis_streams.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "consumers/redis_streams/client.h"
#include "consumers/redis_streams/entries.h"
#include "consumers/redis_streams/testing.h"
#include "tests/support/recycled_deliveries.h"
#include "tests/support/servers.h"

namespace idem::redis_streams {
namespace {

using std::chrono::milliseconds;
using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::Pair;
using SteadyClock = std::chrono::steady_clock;
using testing::PendingCount;
using testing::PendingCountSettled;
using testing::SharedUrl;
using testing::Unique;

RedisStreamsConfig Config(const std::string& url, std::vector<std::string> streams,
                          std::string consumer = "c1") {
  RedisStreamsConfig c;
  c.url = url;
  c.streams = std::move(streams);
  c.group = "g";
  c.consumer = std::move(consumer);
  c.dlq_stream = c.streams.front() + ".dlq";
  c.timeout = milliseconds(2000);
  return c;
}

std::unique_ptr<Broker> Open(const RedisStreamsConfig& c) {
  auto b = OpenRedisStreamsConsumer(c);
  EXPECT_TRUE(b.has_value()) << b.error().ToString();
  return b ? std::move(*b) : nullptr;
}

// Publishes n entries "<prefix>0".. with an Idempotency-Key header; their ids.
std::vector<std::string> PublishN(const std::string& url, const std::string& stream, int n,
                                  const std::string& prefix = "m") {
  std::vector<std::string> ids;
  for (int i = 0; i < n; ++i) {
    auto id = Publish(url, stream, prefix + std::to_string(i),
                      {{"Idempotency-Key", prefix + "-key-" + std::to_string(i)}});
    EXPECT_TRUE(id.has_value()) << id.error().ToString();
    if (id) ids.push_back(*id);
  }
  return ids;
}

// Polls until `n` messages came or `timeout` passed.
std::vector<BrokerMessage> PollN(Broker& b, std::size_t n, std::size_t max = 100,
                                 milliseconds timeout = milliseconds(5000)) {
  std::vector<BrokerMessage> all;
  const auto deadline = SteadyClock::now() + timeout;
  while (all.size() < n && SteadyClock::now() < deadline) {
    auto batch = b.Poll(max, milliseconds(50));
    if (!batch) {
      ADD_FAILURE() << batch.error().ToString();
      break;
    }
    EXPECT_LE(batch->size(), max);
    for (auto& m : *batch) all.push_back(std::move(m));
  }
  return all;
}

std::vector<std::string> Positions(const std::vector<BrokerMessage>& ms,
                                   std::string_view partition = {}) {
  std::vector<std::string> out;
  for (const auto& m : ms) {
    if (partition.empty() || m.partition == partition) out.push_back(m.position);
  }
  return out;
}

std::vector<std::uint32_t> Deliveries(const std::vector<BrokerMessage>& ms) {
  std::vector<std::uint32_t> out;
  for (const auto& m : ms) out.push_back(m.deliveries);
  return out;
}

Status AckAll(Broker& b, const std::vector<BrokerMessage>& ms) {
  std::vector<const BrokerMessage*> p;
  for (const auto& m : ms) p.push_back(&m);
  return b.Acknowledge(p);
}

TEST(RedisStreamsConfigTest, RejectsBadOptionsNamingThem) {
  const RedisStreamsConfig good = Config("redis://127.0.0.1:1", {"s"});
  struct Case {
    std::string option;
    std::function<void(RedisStreamsConfig&)> spoil;
  };
  const std::vector<Case> cases = {
      {"url", [](auto& c) { c.url = ""; }},
      {"url", [](auto& c) { c.url = "http://x"; }},
      {"url", [](auto& c) { c.url = "redis+cluster://a:1,b:2"; }},
      {"url", [](auto& c) { c.url = "redis://h:1?prefix=x"; }},
      {"streams", [](auto& c) { c.streams.clear(); }},
      {"streams",
       [](auto& c) {
         c.streams = {"a", ""};
       }},
      {"streams",
       [](auto& c) {
         c.streams = {"a", "a"};
       }},
      {"group", [](auto& c) { c.group = ""; }},
      {"consumer", [](auto& c) { c.consumer = ""; }},
      {"dlq_stream", [](auto& c) { c.dlq_stream = ""; }},
      {"dlq_stream", [](auto& c) { c.dlq_stream = "s"; }},
      {"payload_field", [](auto& c) { c.payload_field = ""; }},
      {"claim_idle", [](auto& c) { c.claim_idle = milliseconds(0); }},
      {"claim_interval", [](auto& c) { c.claim_interval = milliseconds(-1); }},
      {"timeout", [](auto& c) { c.timeout = milliseconds(0); }},
  };
  for (const Case& k : cases) {
    RedisStreamsConfig c = good;
    k.spoil(c);
    auto b = OpenRedisStreamsConsumer(c);
    ASSERT_FALSE(b.has_value()) << k.option;
    EXPECT_EQ(b.error().code(), StatusCode::kInvalidArgument) << k.option;
    EXPECT_THAT(b.error().message(), HasSubstr(k.option)) << b.error().ToString();
  }
}

TEST(RedisStreamsConfigTest, UrlPasswordIsHiddenInMessages) {
  RedisStreamsConfig c = Config("redis://:s3cret@h:1?x=1", {"s"});
  auto b = OpenRedisStreamsConsumer(c);
  ASSERT_FALSE(b.has_value());
  EXPECT_THAT(b.error().message(), Not(HasSubstr("s3cret")));
}

TEST(RedisStreamsConfigTest, EntryIdsOrderAsRedisOrdersThem) {
  EXPECT_LT(*ParseEntryId("9-5"), *ParseEntryId("10-0"));
  EXPECT_LT(*ParseEntryId("10-2"), *ParseEntryId("10-10"));
  EXPECT_EQ(ParseEntryId("1700000000000-3")->ToString(), "1700000000000-3");
  EXPECT_FALSE(ParseEntryId("10").has_value());
  EXPECT_FALSE(ParseEntryId("-1").has_value());
  EXPECT_FALSE(ParseEntryId("1-x").has_value());
}

// Feeds `resp` to a hiredis reader with the parser's functions, `chunk` bytes at a time,
// filling messages taken from `spares` (none: new ones).
Status ParseNew(std::string_view resp, std::size_t chunk, std::vector<BrokerMessage>& a,
                std::vector<BrokerMessage>& b, idem::internal::SpareMessages* spares = nullptr) {
  const std::vector<std::string> streams = {"a", "b"};
  std::vector<std::vector<BrokerMessage>*> targets = {&a, &b};
  idem::internal::SpareMessages none;
  NewEntriesParser parser(streams, targets, "payload", spares != nullptr ? *spares : none);
  redisReader* reader = redisReaderCreateWithFunctions(NewEntriesParser::Functions());
  reader->privdata = &parser;
  void* reply = nullptr;
  for (std::size_t at = 0; at < resp.size() && reply == nullptr; at += chunk) {
    const std::string_view part = resp.substr(at, chunk);
    EXPECT_EQ(redisReaderFeed(reader, part.data(), part.size()), REDIS_OK);
    EXPECT_EQ(redisReaderGetReply(reader, &reply), REDIS_OK);
  }
  EXPECT_NE(reply, nullptr) << "no whole reply";
  redisReaderFree(reader);
  return parser.Finish();
}

// Spare messages whose every field holds something no entry below has.
idem::internal::SpareMessages UsedSpares(std::size_t count) {
  std::vector<BrokerMessage> used(count);
  for (BrokerMessage& m : used) {
    m.partition = "old-partition";
    m.position = "99-99";
    m.payload = std::string(300, 'p');
    for (int h = 0; h < 5; ++h) m.headers.emplace_back("old-" + std::to_string(h), "old-value");
    m.deliveries = 7;
    m.handle = 9;
  }
  idem::internal::SpareMessages spares;
  spares.Keep(std::move(used));
  return spares;
}

TEST(RedisStreamsConfigTest, NewEntriesAreParsedStraightIntoMessages) {
  const std::string resp =
      "*2\r\n"
      "*2\r\n$1\r\nb\r\n*1\r\n"
      "*2\r\n$3\r\n5-0\r\n*4\r\n$1\r\nk\r\n$1\r\nv\r\n$7\r\npayload\r\n$2\r\nhi\r\n"
      "*2\r\n$1\r\na\r\n*2\r\n"
      "*2\r\n$3\r\n1-0\r\n*2\r\n$7\r\npayload\r\n$0\r\n\r\n"
      "*2\r\n$3\r\n1-1\r\n*6\r\n$7\r\npayload\r\n$1\r\nx\r\n$7\r\npayload\r\n$1\r\ny\r\n"
      "$15\r\nIdempotency-Key\r\n$2\r\nk1\r\n";
  // Into new messages, and into recycled ones (Broker::Recycle) that held other entries.
  for (const auto& [recycled, chunk] :
       {std::pair{false, resp.size()}, std::pair{false, 1ul}, std::pair{false, 7ul},
        std::pair{true, resp.size()}, std::pair{true, 1ul}, std::pair{true, 7ul}}) {
    SCOPED_TRACE(recycled ? "recycled" : "new");
    std::vector<BrokerMessage> a, b;
    idem::internal::SpareMessages spares = UsedSpares(recycled ? 3 : 0);
    ASSERT_TRUE(ParseNew(resp, chunk, a, b, &spares).ok()) << chunk;
    EXPECT_EQ(spares.size(), 0u);
    ASSERT_EQ(a.size(), 2u);
    ASSERT_EQ(b.size(), 1u);
    EXPECT_EQ(b[0].partition, "b");
    EXPECT_EQ(b[0].handle, 1u);
    EXPECT_EQ(b[0].position, "5-0");
    EXPECT_EQ(b[0].payload, "hi");
    EXPECT_THAT(b[0].headers, ElementsAre(Pair("k", "v")));
    EXPECT_EQ(a[0].partition, "a");
    EXPECT_EQ(a[0].handle, 0u);
    EXPECT_EQ(a[0].position, "1-0");
    EXPECT_EQ(a[0].payload, "");
    EXPECT_TRUE(a[0].headers.empty());
    EXPECT_EQ(a[1].payload, "x");  // the first payload field; a second one is a header
    EXPECT_THAT(a[1].headers, ElementsAre(Pair("payload", "y"), Pair("Idempotency-Key", "k1")));
    for (const auto* m : {&a[0], &a[1], &b[0]}) EXPECT_EQ(m->deliveries, 1u);
  }
  std::vector<BrokerMessage> a, b;
  EXPECT_TRUE(ParseNew("*-1\r\n", 1, a, b).ok());  // nil: nothing new
  EXPECT_TRUE(a.empty() && b.empty());
  const Status error = ParseNew("-NOGROUP No such key\r\n", 3, a, b);
  EXPECT_EQ(error.code(), StatusCode::kUnavailable);
  EXPECT_THAT(error.message(), HasSubstr("NOGROUP"));
  EXPECT_EQ(ParseNew(":1\r\n", 1, a, b).code(), StatusCode::kInternal);
  // Entries of a stream it does not read are skipped, the rest kept.
  const std::string other =
      "*1\r\n*2\r\n$1\r\nz\r\n*1\r\n*2\r\n$3\r\n1-0\r\n*2\r\n$1\r\nf\r\n$1\r\nv\r\n";
  EXPECT_TRUE(ParseNew(other, 2, a, b).ok());
  EXPECT_TRUE(a.empty() && b.empty());
}

// A reply cut off mid-entry (the connection broke, or the read timed out): Finish drops the
// entry it was reading, half filled into a recycled message; the whole ones before it stay.
TEST(RedisStreamsConfigTest, AnEntryCutOffIsNotAppended) {
  const std::string resp =
      "*1\r\n*2\r\n$1\r\na\r\n*2\r\n"
      "*2\r\n$3\r\n1-0\r\n*2\r\n$7\r\npayload\r\n$2\r\nok\r\n"
      "*2\r\n$3\r\n1-1\r\n*4\r\n$7\r\npayload\r\n$3\r\nnew\r\n";  // one field pair short
  const std::vector<std::string> streams = {"a"};
  std::vector<BrokerMessage> a;
  std::vector<std::vector<BrokerMessage>*> targets = {&a};
  idem::internal::SpareMessages spares = UsedSpares(2);
  NewEntriesParser parser(streams, targets, "payload", spares);
  redisReader* reader = redisReaderCreateWithFunctions(NewEntriesParser::Functions());
  reader->privdata = &parser;
  void* reply = nullptr;
  ASSERT_EQ(redisReaderFeed(reader, resp.data(), resp.size()), REDIS_OK);
  ASSERT_EQ(redisReaderGetReply(reader, &reply), REDIS_OK);
  EXPECT_EQ(reply, nullptr) << "the reply is not whole";
  ASSERT_EQ(a.size(), 2u) << "the cut entry is being read";
  redisReaderFree(reader);
  EXPECT_EQ(parser.Finish().code(), StatusCode::kInternal);
  ASSERT_EQ(a.size(), 1u);
  EXPECT_EQ(a[0].position, "1-0");
  EXPECT_EQ(a[0].payload, "ok");
  EXPECT_TRUE(a[0].headers.empty());
}

// An entry of another shape fails the read (kInternal) and is not handed out, half filled in:
// it stays pending in Redis. The entries before it are whole and kept.
TEST(RedisStreamsConfigTest, AnEntryNotReadWholeIsNotAppended) {
  const std::string first = "*2\r\n$3\r\n1-0\r\n*2\r\n$7\r\npayload\r\n$2\r\nok\r\n";
  const std::vector<std::string> bad_entries = {
      "*1\r\n$3\r\n1-1\r\n",                               // no field list
      "*3\r\n$3\r\n1-1\r\n*0\r\n*0\r\n",                   // three elements
      "*2\r\n$3\r\n1-1\r\n$1\r\nx\r\n",                    // fields as a string
      "*2\r\n$3\r\n1-1\r\n$-1\r\n",                        // fields nil
      "*2\r\n$3\r\n1-1\r\n*2\r\n$7\r\npayload\r\n*0\r\n",  // a value as an array
      "*2\r\n$3\r\n1-1\r\n*2\r\n$7\r\npayload\r\n:5\r\n",  // a value as an integer
  };
  for (const std::string& bad : bad_entries) {
    SCOPED_TRACE(bad);
    const std::string resp = "*1\r\n*2\r\n$1\r\na\r\n*2\r\n" + first + bad;
    std::vector<BrokerMessage> a, b;
    idem::internal::SpareMessages spares = UsedSpares(2);
    const Status s = ParseNew(resp, 5, a, b, &spares);
    EXPECT_EQ(s.code(), StatusCode::kInternal) << s.ToString();
    ASSERT_EQ(a.size(), 1u);
    EXPECT_EQ(a[0].position, "1-0");
    EXPECT_EQ(a[0].payload, "ok");
    EXPECT_TRUE(a[0].headers.empty());
  }
}

TEST(RedisStreamsTest, UnreachableServerIsUnavailable) {
  auto port = idem::testing::FreePort();
  ASSERT_TRUE(port.has_value());
  auto b =
      OpenRedisStreamsConsumer(Config("redis://127.0.0.1:" + std::to_string(*port), {Unique("s")}));
  ASSERT_FALSE(b.has_value());
  EXPECT_EQ(b.error().code(), StatusCode::kUnavailable) << b.error().ToString();
}

TEST(RedisStreamsTest, MissingGroupIsRefusedWhenNotCreating) {
  RedisStreamsConfig c = Config(SharedUrl(), {Unique("s")});
  c.create_group = false;
  auto b = OpenRedisStreamsConsumer(c);
  ASSERT_FALSE(b.has_value());
  EXPECT_EQ(b.error().code(), StatusCode::kFailedPrecondition) << b.error().ToString();
  // Once the group exists, the same config opens.
  c.create_group = true;
  ASSERT_NE(Open(c), nullptr);
  c.create_group = false;
  EXPECT_NE(Open(c), nullptr);
}

TEST(RedisStreamsTest, PollsEveryStreamInEntryOrder) {
  const std::string url = SharedUrl();
  const std::string a = Unique("a"), b = Unique("b");
  auto broker = Open(Config(url, {a, b}));
  ASSERT_NE(broker, nullptr);
  EXPECT_EQ(broker->Name(), "redis");
  auto empty = broker->Poll(10, milliseconds(20));
  ASSERT_TRUE(empty.has_value()) << empty.error().ToString();
  EXPECT_TRUE(empty->empty());

  const auto ids_a = PublishN(url, a, 7, "a");
  const auto ids_b = PublishN(url, b, 5, "b");
  ASSERT_TRUE(Publish(url, a, "with-extra", {{"k", "v"}, {"Idempotency-Key", "x"}}).has_value());
  // COUNT is per stream in XREADGROUP: batches of 4 must still hold at most 4.
  auto got = PollN(*broker, 13, /*max=*/4);
  ASSERT_EQ(got.size(), 13u);
  EXPECT_THAT(Positions(got, b), ElementsAreArray(ids_b));
  const auto pa = Positions(got, a);
  ASSERT_EQ(pa.size(), 8u);
  EXPECT_TRUE(std::equal(ids_a.begin(), ids_a.end(), pa.begin()));
  for (const auto& m : got) {
    EXPECT_EQ(m.deliveries, 1u);
    if (m.payload == "a3") {
      EXPECT_EQ(m.partition, a);
      EXPECT_EQ(m.position, ids_a[3]);
      EXPECT_THAT(m.headers, ElementsAre(Pair("Idempotency-Key", "a-key-3")));
    }
    if (m.payload == "with-extra") {
      EXPECT_THAT(m.headers, ElementsAre(Pair("k", "v"), Pair("Idempotency-Key", "x")));
    }
  }
  EXPECT_TRUE(AckAll(*broker, got).ok());
  EXPECT_EQ(PendingCountSettled(url, a, 0), 0);
  EXPECT_EQ(PendingCountSettled(url, b, 0), 0);
  EXPECT_TRUE(broker->Health().ok());
}

// Messages handed back with Recycle are filled in with later entries: nothing of what they held
// before may show.
TEST(RedisStreamsTest, RecycledMessagesHoldOnlyTheNextEntry) {
  const std::string url = SharedUrl();
  const std::string a = Unique("a"), b = Unique("b");
  auto broker = Open(Config(url, {a, b}));
  ASSERT_NE(broker, nullptr);
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(Publish(url, a, std::string(500, 'x'),
                        {{"Idempotency-Key", "a-" + std::to_string(i)}, {"A", "1"}, {"B", "2"}})
                    .has_value());
  }
  auto first = PollN(*broker, 3);
  ASSERT_EQ(first.size(), 3u);
  ASSERT_TRUE(AckAll(*broker, first).ok());
  broker->Recycle(std::move(first));

  const auto b0 = Publish(url, b, "b0", {{"Idempotency-Key", "b-0"}});
  const auto b1 = Publish(url, b, "b1", {});
  const auto b2 = Publish(url, b, "", {});
  ASSERT_TRUE(b0 && b1 && b2);
  const auto second = PollN(*broker, 3);
  ASSERT_EQ(second.size(), 3u);
  EXPECT_THAT(Positions(second), ElementsAre(*b0, *b1, *b2));
  for (const auto& m : second) EXPECT_EQ(m.handle, 1u);
  idem::testing::ExpectOnlyTheNextDeliveries(second, b, {"b0", "b1", ""}, "b-0");
  EXPECT_TRUE(AckAll(*broker, second).ok());
}

TEST(RedisStreamsTest, AcknowledgedEntriesAreNotDeliveredAgain) {
  const std::string url = SharedUrl();
  const std::string s = Unique("s");
  const auto ids = PublishN(url, s, 6);
  {
    auto broker = Open(Config(url, {s}));
    ASSERT_NE(broker, nullptr);
    auto got = PollN(*broker, 6);
    ASSERT_EQ(got.size(), 6u);
    got.resize(3);
    ASSERT_TRUE(AckAll(*broker, got).ok());
  }
  // Same consumer again: only the three it did not acknowledge, delivered a second time.
  auto broker = Open(Config(url, {s}));
  ASSERT_NE(broker, nullptr);
  auto again = PollN(*broker, 3);
  EXPECT_THAT(Positions(again), ElementsAre(ids[3], ids[4], ids[5]));
  EXPECT_THAT(Deliveries(again), ElementsAre(2u, 2u, 2u));
  ASSERT_TRUE(AckAll(*broker, again).ok());
  auto none = broker->Poll(10, milliseconds(50));
  ASSERT_TRUE(none.has_value());
  EXPECT_TRUE(none->empty());
  broker.reset();
  auto third = Open(Config(url, {s}));
  ASSERT_NE(third, nullptr);
  auto nothing = third->Poll(10, milliseconds(50));
  ASSERT_TRUE(nothing.has_value());
  EXPECT_TRUE(nothing->empty());
  EXPECT_EQ(PendingCountSettled(url, s, 0), 0);
}

TEST(RedisStreamsTest, RestartedConsumerGetsItsOwnPendingEntriesFirst) {
  const std::string url = SharedUrl();
  const std::string s = Unique("s");
  const auto first = PublishN(url, s, 4, "old");
  {
    auto broker = Open(Config(url, {s}, "worker-1"));
    ASSERT_NE(broker, nullptr);
    ASSERT_EQ(PollN(*broker, 4).size(), 4u);  // and "crashes": nothing acknowledged
  }
  const auto later = PublishN(url, s, 3, "new");
  auto broker = Open(Config(url, {s}, "worker-1"));
  ASSERT_NE(broker, nullptr);
  auto got = PollN(*broker, 7, /*max=*/3);
  std::vector<std::string> expected = first;
  expected.insert(expected.end(), later.begin(), later.end());
  EXPECT_THAT(Positions(got), ElementsAreArray(expected));
  EXPECT_THAT(Deliveries(got), ElementsAre(2u, 2u, 2u, 2u, 1u, 1u, 1u));
}

// Feeds `resp` to a plain hiredis reader and parses the entry list at `path` (element indexes
// from the root) with ParseEntries.
Status ParseListAt(std::string_view resp, std::vector<std::size_t> path,
                   std::vector<ParsedEntry>& out) {
  redisReader* reader = redisReaderCreate();
  EXPECT_EQ(redisReaderFeed(reader, resp.data(), resp.size()), REDIS_OK);
  void* raw = nullptr;
  EXPECT_EQ(redisReaderGetReply(reader, &raw), REDIS_OK);
  redisReaderFree(reader);
  if (raw == nullptr) return InternalError("no whole reply");
  const redisReply* list = static_cast<redisReply*>(raw);
  for (const std::size_t i : path) list = list->element[i];
  Status s = ParseEntries(*list, "s", "payload", out);
  freeReplyObject(raw);
  return s;
}

TEST(RedisStreamsConfigTest, ClaimedEntriesDeletedWhilePendingAreSkipped) {
  // Redis 6.2's XAUTOCLAIM: [cursor, entries], an entry deleted while pending a bare nil.
  const std::string redis62 =
      "*2\r\n$3\r\n0-0\r\n*3\r\n"
      "*2\r\n$3\r\n1-0\r\n*2\r\n$7\r\npayload\r\n$1\r\na\r\n"
      "*-1\r\n"
      "*2\r\n$3\r\n3-0\r\n*2\r\n$7\r\npayload\r\n$1\r\nc\r\n";
  std::vector<ParsedEntry> got;
  const Status s = ParseListAt(redis62, {1}, got);
  ASSERT_TRUE(s.ok()) << s.ToString();
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].message.position, "1-0");
  EXPECT_EQ(got[0].message.payload, "a");
  EXPECT_EQ(got[1].message.position, "3-0");
  EXPECT_EQ(got[1].message.payload, "c");
  EXPECT_FALSE(got[0].deleted || got[1].deleted);
  // XREADGROUP's pending read: [id, nil] is still an entry, marked deleted.
  got.clear();
  ASSERT_TRUE(ParseListAt("*1\r\n*2\r\n$3\r\n2-0\r\n*-1\r\n", {}, got).ok());
  ASSERT_EQ(got.size(), 1u);
  EXPECT_TRUE(got[0].deleted);
  EXPECT_EQ(got[0].message.position, "2-0");
}

TEST(RedisStreamsTest, PendingEntriesDeletedFromTheStreamAreSkippedAndAcknowledged) {
  const std::string url = SharedUrl();
  const std::string s = Unique("s");
  const auto ids = PublishN(url, s, 3);
  {
    auto broker = Open(Config(url, {s}));
    ASSERT_NE(broker, nullptr);
    ASSERT_EQ(PollN(*broker, 3).size(), 3u);
  }
  auto address = ParseAddress(url);
  ASSERT_TRUE(address.has_value());
  auto client = Client::Open(*address, milliseconds(2000));
  ASSERT_TRUE(client.has_value());
  auto del = (*client)->Call(Args().Add("XDEL").Add(s).Add(ids[1]));
  ASSERT_TRUE(del.has_value());
  ASSERT_EQ((*del)->integer, 1);

  auto broker = Open(Config(url, {s}));
  ASSERT_NE(broker, nullptr);
  auto got = PollN(*broker, 2);
  EXPECT_THAT(Positions(got), ElementsAre(ids[0], ids[2]));
  ASSERT_TRUE(AckAll(*broker, got).ok());
  EXPECT_EQ(PendingCountSettled(url, s, 0), 0);
}

TEST(RedisStreamsTest, EntriesOfAStoppedConsumerAreClaimedAfterClaimIdle) {
  const std::string url = SharedUrl();
  const std::string s = Unique("s");
  const auto ids = PublishN(url, s, 5);
  auto dead_config = Config(url, {s}, "dead");
  // Before the read: Redis stamps the delivery somewhere inside it, so the claim is at least
  // claim_idle after this (less Redis's millisecond rounding). Taken after the read, it made a
  // TSan run see 299.98 ms.
  SteadyClock::time_point read_at;
  {
    auto dead = Open(dead_config);
    ASSERT_NE(dead, nullptr);
    read_at = SteadyClock::now();
    ASSERT_EQ(PollN(*dead, 5).size(), 5u);
  }
  auto config = Config(url, {s}, "alive");
  config.claim_idle = milliseconds(300);
  config.claim_interval = milliseconds(50);
  auto alive = Open(config);
  ASSERT_NE(alive, nullptr);
  auto got = PollN(*alive, 5);
  const auto waited = SteadyClock::now() - read_at;
  EXPECT_THAT(Positions(got), ElementsAreArray(ids));
  EXPECT_THAT(Deliveries(got), ElementsAre(2u, 2u, 2u, 2u, 2u));
  EXPECT_GE(waited, milliseconds(299));
  ASSERT_TRUE(AckAll(*alive, got).ok());
  EXPECT_EQ(PendingCountSettled(url, s, 0), 0);
  // New entries go on as usual after the claimed ones.
  const auto more = PublishN(url, s, 2, "more");
  EXPECT_THAT(Positions(PollN(*alive, 2)), ElementsAreArray(more));
}

// A consumer with entries read ahead takes over a stopped consumer's entries that are newer
// than them, and hands them out in stream order right after its own.
TEST(RedisStreamsTest, ClaimedEntriesNewerThanTheReadAheadComeRightAfterIt) {
  const std::string url = SharedUrl();
  const std::string s = Unique("s");
  const auto ids = PublishN(url, s, 10);
  auto config = Config(url, {s}, "a");
  config.claim_idle = milliseconds(300);
  config.claim_interval = milliseconds(50);
  auto a = Open(config);
  ASSERT_NE(a, nullptr);
  auto first = a->Poll(2, milliseconds(1000));
  ASSERT_TRUE(first.has_value()) << first.error().ToString();
  EXPECT_THAT(Positions(*first), ElementsAre(ids[0], ids[1]));
  ASSERT_TRUE(AckAll(*a, *first).ok());
  // The full batch sent two read-aheads (entries 3-4 and 5-6); once they are pending on `a`,
  // consumer b reads entries 7-8 and stops.
  ASSERT_EQ(PendingCountSettled(url, s, 4), 4);
  auto address = ParseAddress(url);
  ASSERT_TRUE(address.has_value());
  auto b = Client::Open(*address, milliseconds(2000));
  ASSERT_TRUE(b.has_value());
  auto read = (*b)->Call(Args()
                             .Add("XREADGROUP")
                             .Add("GROUP")
                             .Add("g")
                             .Add("b")
                             .Add("COUNT")
                             .Add("2")
                             .Add("STREAMS")
                             .Add(s)
                             .Add(">"));
  ASSERT_TRUE(read.has_value());
  ASSERT_EQ(PendingCount(url, s), 6);
  std::this_thread::sleep_for(milliseconds(400));

  std::vector<BrokerMessage> got;
  for (int i = 0; i < 8 && got.size() < 8; ++i) {
    auto batch = a->Poll(2, milliseconds(50));
    ASSERT_TRUE(batch.has_value()) << batch.error().ToString();
    ASSERT_TRUE(AckAll(*a, *batch).ok());
    for (auto& m : *batch) got.push_back(std::move(m));
  }
  EXPECT_THAT(Positions(got), ElementsAreArray(ids.begin() + 2, ids.end()));
  EXPECT_THAT(Deliveries(got), ElementsAre(1u, 1u, 1u, 1u, 2u, 2u, 1u, 1u));
  EXPECT_EQ(PendingCountSettled(url, s, 0), 0);
}

TEST(RedisStreamsTest, ABusyConsumerStillClaimsTheEntriesOfAStoppedOne) {
  const std::string url = SharedUrl();
  const std::string s = Unique("s");
  const auto dead_ids = PublishN(url, s, 5, "dead");
  {
    auto dead = Open(Config(url, {s}, "dead"));
    ASSERT_NE(dead, nullptr);
    ASSERT_EQ(PollN(*dead, 5).size(), 5u);
  }
  // A backlog that keeps every Poll of the other consumer full (and a batch read ahead).
  std::vector<StreamEntry> backlog(3000, StreamEntry{.payload = "later"});
  ASSERT_TRUE(Publish(url, s, backlog).ok());
  auto config = Config(url, {s}, "busy");
  config.claim_idle = milliseconds(300);
  config.claim_interval = milliseconds(50);
  auto busy = Open(config);
  ASSERT_NE(busy, nullptr);
  std::size_t later_before_claimed = 0;
  std::vector<BrokerMessage> claimed;
  const auto deadline = SteadyClock::now() + milliseconds(10'000);
  while (claimed.size() < 5 && SteadyClock::now() < deadline) {
    auto batch = busy->Poll(10, milliseconds(50));
    ASSERT_TRUE(batch.has_value()) << batch.error().ToString();
    ASSERT_FALSE(batch->empty()) << "the backlog ran out before the claim";
    ASSERT_TRUE(AckAll(*busy, *batch).ok());
    for (auto& m : *batch) {
      if (m.payload == "later") {
        ++later_before_claimed;
      } else {
        claimed.push_back(std::move(m));
      }
    }
    std::this_thread::sleep_for(milliseconds(3));  // the batch takes a while
  }
  EXPECT_THAT(Positions(claimed), ElementsAreArray(dead_ids));
  EXPECT_LT(later_before_claimed, 3000u);
}

TEST(RedisStreamsTest, TouchedEntriesAreNotClaimed) {
  const std::string url = SharedUrl();
  const std::string s = Unique("s");
  PublishN(url, s, 2);
  auto config = Config(url, {s}, "slow");
  config.claim_idle = milliseconds(300);
  config.claim_interval = milliseconds(50);
  auto slow = Open(config);
  ASSERT_NE(slow, nullptr);
  auto held = PollN(*slow, 2);
  ASSERT_EQ(held.size(), 2u);
  config.consumer = "other";
  auto other = Open(config);
  ASSERT_NE(other, nullptr);
  const auto until = SteadyClock::now() + milliseconds(700);
  std::vector<const BrokerMessage*> p = {&held[0], &held[1]};
  while (SteadyClock::now() < until) {
    ASSERT_TRUE(slow->Touch(p).ok());
    auto got = other->Poll(10, milliseconds(100));
    ASSERT_TRUE(got.has_value());
    EXPECT_TRUE(got->empty()) << "claimed although touched";
  }
}

TEST(RedisStreamsTest, RedeliverWaitsItsDelayAndKeepsStreamOrder) {
  const std::string url = SharedUrl();
  const std::string a = Unique("a"), b = Unique("b");
  auto broker = Open(Config(url, {a, b}));
  ASSERT_NE(broker, nullptr);
  const auto ids = PublishN(url, a, 6, "a");
  auto got = PollN(*broker, 6);
  ASSERT_EQ(got.size(), 6u);
  ASSERT_TRUE(AckAll(*broker, {got[0], got[1]}).ok());
  std::vector<const BrokerMessage*> back = {&got[2], &got[3], &got[4], &got[5]};
  const auto handed_back = SteadyClock::now();
  ASSERT_TRUE(broker->Redeliver(back, milliseconds(400)).ok());
  const auto later_a = PublishN(url, a, 2, "later");
  const auto ids_b = PublishN(url, b, 2, "b");

  // The other stream goes on; stream a waits: nothing newer comes before the handed-back ones.
  auto first = PollN(*broker, 2);
  EXPECT_THAT(Positions(first), ElementsAreArray(ids_b));
  auto rest = PollN(*broker, 6, /*max=*/3);
  EXPECT_GE(SteadyClock::now() - handed_back, milliseconds(400));
  EXPECT_THAT(Positions(rest), ElementsAre(ids[2], ids[3], ids[4], ids[5], later_a[0], later_a[1]));
  EXPECT_THAT(Deliveries(rest), ElementsAre(2u, 2u, 2u, 2u, 1u, 1u));

  // Handed back twice, partly: the first of them comes again before the rest.
  ASSERT_TRUE(AckAll(*broker, {rest[0], rest[2], rest[3], rest[4], rest[5]}).ok());
  std::vector<const BrokerMessage*> again = {&rest[1]};
  ASSERT_TRUE(broker->Redeliver(again, milliseconds(50)).ok());
  auto third = PollN(*broker, 1);
  EXPECT_THAT(Positions(third), ElementsAre(ids[3]));
  EXPECT_THAT(Deliveries(third), ElementsAre(3u));
}

TEST(RedisStreamsTest, HandedBackEntriesSurviveARestart) {
  const std::string url = SharedUrl();
  const std::string s = Unique("s");
  const auto ids = PublishN(url, s, 3);
  {
    auto broker = Open(Config(url, {s}));
    ASSERT_NE(broker, nullptr);
    auto got = PollN(*broker, 3);
    ASSERT_EQ(got.size(), 3u);
    std::vector<const BrokerMessage*> back = {&got[0], &got[1], &got[2]};
    ASSERT_TRUE(broker->Redeliver(back, std::chrono::hours(1)).ok());
  }
  // A crash forgets the delay; the entries are still pending on this consumer.
  auto broker = Open(Config(url, {s}));
  ASSERT_NE(broker, nullptr);
  EXPECT_THAT(Positions(PollN(*broker, 3)), ElementsAreArray(ids));
}

TEST(RedisStreamsTest, DeadLetterCarriesPayloadHeadersAndReason) {
  const std::string url = SharedUrl();
  const std::string s = Unique("s");
  auto config = Config(url, {s});
  config.dlq_stream = s + ".dead";
  auto broker = Open(config);
  ASSERT_NE(broker, nullptr);
  const auto id = Publish(url, s, "{\"n\":1}", {{"Idempotency-Key", "k-1"}, {"trace", "t9"}});
  ASSERT_TRUE(id.has_value());
  auto got = PollN(*broker, 1);
  ASSERT_EQ(got.size(), 1u);
  ASSERT_TRUE(
      broker
          ->DeadLetter(
              got[0],
              {.reason = "attempts_exhausted", .attempts = 5, .last_error = "boom", .key = "k-1"})
          .ok());
  auto dead = ReadStream(url, config.dlq_stream);
  ASSERT_TRUE(dead.has_value()) << dead.error().ToString();
  ASSERT_EQ(dead->size(), 1u);
  const BrokerMessage& d = dead->front();
  EXPECT_EQ(d.payload, "{\"n\":1}");
  std::map<std::string, std::string> h(d.headers.begin(), d.headers.end());
  EXPECT_EQ(h["Idempotency-Key"], "k-1");
  EXPECT_EQ(h["trace"], "t9");
  EXPECT_EQ(h[std::string(kDlqReasonHeader)], "attempts_exhausted");
  EXPECT_EQ(h[std::string(kDlqAttemptsHeader)], "5");
  EXPECT_EQ(h[std::string(kDlqErrorHeader)], "boom");
  EXPECT_EQ(h[std::string(kDlqKeyHeader)], "k-1");
  EXPECT_EQ(h[std::string(kDlqSourceHeader)], s + "@" + *id);
}

TEST(RedisStreamsTest, DeadLetterThatRedisRefusesIsUnavailable) {
  const std::string url = SharedUrl();
  const std::string s = Unique("s");
  auto config = Config(url, {s});
  config.dlq_stream = s + ".not-a-stream";
  auto address = ParseAddress(url);
  ASSERT_TRUE(address.has_value());
  auto client = Client::Open(*address, milliseconds(2000));
  ASSERT_TRUE(client.has_value());
  ASSERT_TRUE((*client)->Call(Args().Add("SET").Add(config.dlq_stream).Add("x")).has_value());
  auto broker = Open(config);
  ASSERT_NE(broker, nullptr);
  PublishN(url, s, 2);
  auto got = PollN(*broker, 2);
  ASSERT_EQ(got.size(), 2u);
  const Status dead = broker->DeadLetter(got[0], {.reason = "permanent", .attempts = 1});
  EXPECT_EQ(dead.code(), StatusCode::kUnavailable) << dead.ToString();
  EXPECT_THAT(dead.message(), HasSubstr("WRONGTYPE"));
  // The broker goes on after it: nothing of the batch was acknowledged, so a new connection
  // reads both entries back from the pending list.
  auto again = PollN(*broker, 2);
  EXPECT_THAT(Positions(again), ElementsAre(got[0].position, got[1].position));
}

TEST(RedisStreamsTest, BulkPublishKeepsOrder) {
  const std::string url = SharedUrl();
  const std::string s = Unique("s");
  std::vector<StreamEntry> entries;
  for (int i = 0; i < 2000; ++i) {
    entries.push_back(
        {.payload = "p" + std::to_string(i), .headers = {{"Idempotency-Key", std::to_string(i)}}});
  }
  ASSERT_TRUE(Publish(url, s, entries).ok());
  auto all = ReadStream(url, s);
  ASSERT_TRUE(all.has_value());
  ASSERT_EQ(all->size(), 2000u);
  for (int i = 0; i < 2000; ++i) {
    EXPECT_EQ((*all)[i].payload, "p" + std::to_string(i));
  }
}

// ---- A server of its own, killed and restarted. ----

struct OwnServer {
  std::filesystem::path dir;
  std::optional<idem::testing::RedisServer> server;
  std::string url;
};

OwnServer StartOwnServer(std::string_view name) {
  OwnServer o;
  o.dir = std::filesystem::temp_directory_path() / Unique(name);
  auto port = idem::testing::FreePort();
  EXPECT_TRUE(port.has_value());
  if (!port) return o;
  auto s = idem::testing::RedisServer::Start(o.dir, *port,
                                             {"--appendonly", "yes", "--appendfsync", "always"});
  EXPECT_TRUE(s.has_value()) << s.error().ToString();
  if (s) {
    o.url = "redis://" + s->address();
    o.server.emplace(std::move(*s));
  }
  return o;
}

TEST(RedisStreamsTest, ReconnectsByItselfAfterTheServerRestarts) {
  OwnServer own = StartOwnServer("restart");
  ASSERT_TRUE(own.server.has_value());
  const std::string s = "orders";
  auto broker = Open(Config(own.url, {s}));
  ASSERT_NE(broker, nullptr);
  const auto ids = PublishN(own.url, s, 3);
  ASSERT_EQ(PollN(*broker, 3).size(), 3u);

  ASSERT_TRUE(own.server->Kill().ok());
  auto down = broker->Poll(10, milliseconds(10));
  ASSERT_FALSE(down.has_value());
  EXPECT_EQ(down.error().code(), StatusCode::kUnavailable);
  EXPECT_EQ(broker->Health().code(), StatusCode::kUnavailable);
  auto again = broker->Poll(10, milliseconds(10));  // still down: reconnecting fails
  ASSERT_FALSE(again.has_value());
  EXPECT_EQ(again.error().code(), StatusCode::kUnavailable);

  ASSERT_TRUE(own.server->Restart().ok());
  // The unacknowledged entries come back (the pending list survived in the AOF).
  auto got = PollN(*broker, 3);
  EXPECT_THAT(Positions(got), ElementsAreArray(ids));
  EXPECT_THAT(Deliveries(got), ElementsAre(2u, 2u, 2u));
  EXPECT_TRUE(broker->Health().ok());
  ASSERT_TRUE(AckAll(*broker, got).ok());
  std::error_code ec;
  own.server.reset();
  std::filesystem::remove_all(own.dir, ec);
}

}  // namespace
}  // namespace idem::redis_streams
