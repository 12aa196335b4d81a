// The Redis store against servers this test starts for itself: it fails closed when a server
// stops answering, dies or answers nonsense, and recovers by itself; WAIT; the compact form;
// MOVED and ASK while a slot moves between nodes; a failover that loses no acknowledged key.
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "idem/stores/redis.h"
#include "stores/redis/codec.h"
#include "stores/redis/redis_test_servers.h"
#include "stores/redis/slots.h"
#include "tests/support/fake_clock.h"

namespace idem {
namespace {

using namespace std::chrono_literals;
using redis::testing::Cluster;
using redis::testing::CmdText;
using redis::testing::Eventually;
using redis::testing::RedisServer;
using std::chrono::milliseconds;
using ::testing::AllOf;
using ::testing::HasSubstr;

std::unique_ptr<Store> Open(RedisStoreOptions o) {
  auto store = OpenRedisStore(o);
  if (!store.has_value()) {
    ADD_FAILURE() << store.error().ToString();
    return nullptr;
  }
  return std::move(*store);
}

RedisStoreOptions SingleNode(const RedisServer& s) {
  RedisStoreOptions o;
  o.nodes = {s.address()};
  o.connect_timeout = 300ms;
  o.command_timeout = 300ms;
  return o;
}

bool IsAcquired(const Result<BeginAnswer>& r) {
  return r.has_value() && std::holds_alternative<Acquired>(*r);
}
std::string Show(const Result<BeginAnswer>& r) {
  if (!r.has_value()) return r.error().ToString();
  return std::string(BeginAnswerName(*r));
}
::testing::AssertionResult IsReplayOf(const Result<BeginAnswer>& r, std::string_view response) {
  if (r.has_value() && std::holds_alternative<Replay>(*r) &&
      std::get<Replay>(*r).response == response) {
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure() << "got " << Show(r);
}

// Acquires and completes `key` with `response`; success when both were acknowledged.
::testing::AssertionResult Finish(Store& store, std::string_view key, std::string_view response) {
  auto a = store.Begin(BeginRequest{.scope = "s", .key = key});
  if (!IsAcquired(a)) return ::testing::AssertionFailure() << "begin: " << Show(a);
  auto c = store.Complete(CompleteRequest{
      .scope = "s", .key = key, .token = std::get<Acquired>(*a).token, .response = response});
  if (!c.has_value()) return ::testing::AssertionFailure() << "complete: " << c.error().ToString();
  if (*c != WriteAnswer::kApplied) return ::testing::AssertionFailure() << "complete: lease lost";
  return ::testing::AssertionSuccess();
}

// ---- fail closed on one node --------------------------------------------------------------

// What one call of a Hammer saw.
struct Timed {
  std::string key;
  Result<BeginAnswer> answer{Conflict{}};
  milliseconds took{0};
};

// `threads` callers, each beginning `calls` fresh keys one after another.
std::vector<Timed> Hammer(Store& store, int threads, int calls, std::string_view tag) {
  std::vector<Timed> got(static_cast<std::size_t>(threads * calls));
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      for (int i = 0; i < calls; ++i) {
        Timed& g = got[static_cast<std::size_t>(t * calls + i)];
        g.key = std::string(tag) + "-" + std::to_string(t) + "-" + std::to_string(i);
        const auto start = std::chrono::steady_clock::now();
        g.answer = store.Begin(BeginRequest{.scope = "s", .key = g.key});
        g.took = std::chrono::duration_cast<milliseconds>(std::chrono::steady_clock::now() - start);
      }
    });
  }
  for (auto& w : workers) w.join();
  return got;
}

// A server that stops answering: every caller, concurrent ones included, hears kUnavailable,
// and soon. Only the calls in flight when it stopped wait out the timeout: after that nothing
// is sent to it (the others fail at once) while the store PINGs it, and once it answers again
// the same store, not reopened, serves everyone. Without that, each of these 80 calls would
// wait out its 300 ms.
TEST(RedisFailClosedTest, AFrozenServerHoldsOnlyTheCallsInFlightThenRecovers) {
  auto server = RedisServer::Start();
  ASSERT_TRUE(server.has_value()) << server.error().ToString();
  auto store = Open(SingleNode(**server));
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(Finish(*store, "before", "r"));
  ASSERT_TRUE((*server)->Freeze().ok());

  constexpr int kThreads = 8, kCalls = 10;
  int waited = 0, refused = 0;
  for (const Timed& g : Hammer(*store, kThreads, kCalls, "frozen")) {
    EXPECT_EQ(g.answer.status().code(), StatusCode::kUnavailable) << Show(g.answer);
    EXPECT_THAT(g.answer.status().message(), HasSubstr((*server)->address()));
    EXPECT_LT(g.took, 2s) << "a connect and a command timeout at worst; never unbounded";
    if (g.took >= 250ms) ++waited;
    if (g.answer.status().message().find("not answering") != std::string::npos) {
      ++refused;
      EXPECT_LT(g.took, 250ms) << "a refused call waited";
    }
  }
  // At most one call per caller, its first, was in flight when the server stopped answering.
  EXPECT_LE(waited, kThreads) << "of " << kThreads * kCalls;
  EXPECT_GE(refused, kThreads * (kCalls - 1));
  EXPECT_EQ(store->Get("s", "before").status().code(), StatusCode::kUnavailable);

  // Back: within a PING's round trip, everyone is served again.
  ASSERT_TRUE((*server)->Thaw().ok());
  EXPECT_TRUE(Eventually(
      [&] { return IsReplayOf(store->Begin(BeginRequest{.scope = "s", .key = "before"}), "r"); },
      2s));
  for (const Timed& g : Hammer(*store, kThreads, 3, "thawed")) {
    EXPECT_TRUE(IsAcquired(g.answer)) << g.key << ": " << Show(g.answer);
  }
  EXPECT_TRUE(Finish(*store, "after", "r2"));
}

TEST(RedisFailClosedTest, KilledServerIsUnavailableAndARestartIsPickedUp) {
  auto server = RedisServer::Start();
  ASSERT_TRUE(server.has_value()) << server.error().ToString();
  auto store = Open(SingleNode(**server));
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(Finish(*store, "k1", "r"));

  ASSERT_TRUE((*server)->Kill().ok());
  auto dead = store->Begin(BeginRequest{.scope = "s", .key = "k2"});
  EXPECT_EQ(dead.status().code(), StatusCode::kUnavailable) << Show(dead);
  EXPECT_THAT(dead.status().message(), HasSubstr((*server)->address()));
  EXPECT_EQ(store->Stats().status().code(), StatusCode::kUnavailable);

  ASSERT_TRUE((*server)->Restart().ok());
  // Persistence is off: the restarted server knows nothing, and the store works at once.
  EXPECT_TRUE(Finish(*store, "k1", "again"));

  // A restart while the store is idle: its connections are dead, and it notices before use.
  ASSERT_TRUE((*server)->Kill().ok());
  ASSERT_TRUE((*server)->Restart().ok());
  EXPECT_TRUE(Finish(*store, "k3", "r3"));
  EXPECT_TRUE(IsReplayOf(store->Begin(BeginRequest{.scope = "s", .key = "k3"}), "r3"));
}

// A "server" that answers the handshake and then nonsense.
class Impostor {
 public:
  explicit Impostor(std::string answer) : answer_(std::move(answer)) {
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    IDEM_CHECK(::bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    IDEM_CHECK(::listen(listen_fd_, 8) == 0);
    socklen_t len = sizeof a;
    ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this] { Serve(); });
  }
  ~Impostor() {
    ::shutdown(listen_fd_, SHUT_RDWR);
    ::close(listen_fd_);
    thread_.join();
  }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }

 private:
  void Serve() {
    while (true) {
      const int fd = ::accept(listen_fd_, nullptr, nullptr);
      if (fd < 0) return;
      char buf[4096];
      // First command (PING): a proper answer; every later one: the nonsense.
      bool first = true;
      while (true) {
        const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
        if (n <= 0) break;
        const std::string& out = first ? pong_ : answer_;
        first = false;
        if (::send(fd, out.data(), out.size(), MSG_NOSIGNAL) < 0) break;
      }
      ::close(fd);
    }
  }
  const std::string pong_ = "+PONG\r\n";
  std::string answer_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::thread thread_;
};

TEST(RedisFailClosedTest, UnexpectedRepliesAreUnavailable) {
  for (const std::string& answer : {std::string("HTTP/1.1 400 Bad Request\r\n\r\n"),
                                    std::string(":5\r\n"), std::string("*1\r\n:9\r\n")}) {
    SCOPED_TRACE(answer);
    Impostor impostor(answer);
    RedisStoreOptions o;
    o.nodes = {impostor.address()};
    o.connections_per_node = 1;
    auto store = Open(o);
    ASSERT_NE(store, nullptr);
    auto got = store->Begin(BeginRequest{.scope = "s", .key = "k"});
    EXPECT_EQ(got.status().code(), StatusCode::kUnavailable) << Show(got);
  }
}

// ---- WAIT -----------------------------------------------------------------------------------

// Every record has a TTL, so an evicting maxmemory-policy silently forgets completed keys (an
// audit saw 999 of 1000 acquired again after 40 000 more): such a server is refused at open,
// unless the URL accepts it. A database the server refuses is the URL's fault.
TEST(RedisOpenTest, AnEvictingServerIsRefusedUnlessAllowedAndABadDatabaseIsAnArgumentError) {
  auto server = RedisServer::Start({"--maxmemory", "64mb", "--maxmemory-policy", "volatile-lru"});
  ASSERT_TRUE(server.has_value()) << server.error().ToString();
  RedisStoreOptions o = SingleNode(**server);
  auto refused = OpenRedisStore(o);
  ASSERT_FALSE(refused.has_value());
  EXPECT_EQ(refused.error().code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.error().message(), AllOf(HasSubstr("volatile-lru"), HasSubstr("noeviction"),
                                               HasSubstr("allow_eviction")));
  o.allow_eviction = true;
  auto allowed = Open(o);
  ASSERT_NE(allowed, nullptr);
  EXPECT_TRUE(IsAcquired(allowed->Begin({.scope = "s", .key = "k"})));

  auto plain = RedisServer::Start();
  ASSERT_TRUE(plain.has_value()) << plain.error().ToString();
  RedisStoreOptions db = SingleNode(**plain);
  EXPECT_NE(Open(db), nullptr);  // noeviction, Redis's default
  db.database = 99;              // above the 16 databases a server has by default
  auto bad = OpenRedisStore(db);
  ASSERT_FALSE(bad.has_value());
  EXPECT_EQ(bad.error().code(), StatusCode::kInvalidArgument) << bad.error().ToString();
  EXPECT_THAT(bad.error().message(), HasSubstr("DB index"));
}

TEST(RedisWaitTest, AnswersOnlyOnceReplicasHaveTheWrite) {
  auto master = RedisServer::Start();
  ASSERT_TRUE(master.has_value()) << master.error().ToString();
  RedisStoreOptions o = SingleNode(**master);
  o.wait_replicas = 1;
  o.wait_timeout = 100ms;
  auto store = Open(o);
  ASSERT_NE(store, nullptr);
  // No replica: the write happened on the master but is not acknowledged.
  auto lonely = store->Begin(BeginRequest{.scope = "s", .key = "k"});
  EXPECT_EQ(lonely.status().code(), StatusCode::kUnavailable) << Show(lonely);
  EXPECT_THAT(lonely.status().message(), HasSubstr("0 of the 1 replicas"));
  // The same for a batch of new keys (on one node each answers a bare 0 inside the reply).
  const std::vector<BeginRequest> batch = {BeginRequest{.scope = "s", .key = "b1"},
                                           BeginRequest{.scope = "s", .key = "b2"}};
  for (const Result<BeginAnswer>& got : store->BeginBatch(batch)) {
    EXPECT_EQ(got.status().code(), StatusCode::kUnavailable) << Show(got);
  }
  // Reads need no replica.
  EXPECT_TRUE(store->Get("s", "k").has_value());

  auto replica =
      RedisServer::Start({"--replicaof", "127.0.0.1", std::to_string((*master)->port())});
  ASSERT_TRUE(replica.has_value()) << replica.error().ToString();
  ASSERT_TRUE(Eventually(
      [&] {
        auto info = CmdText((*master)->port(), {"INFO", "replication"});
        return info.has_value() && info->find("state=online") != std::string::npos;
      },
      10s));
  // A generous timeout now: WAIT returns as soon as the replica acknowledges.
  o.wait_timeout = 10s;
  store = Open(o);
  ASSERT_NE(store, nullptr);
  EXPECT_TRUE(Finish(*store, "k2", "replicated"));
  EXPECT_TRUE(IsReplayOf(store->Begin(BeginRequest{.scope = "s", .key = "k2"}), "replicated"));
}

// ---- the compact form ------------------------------------------------------------------------

// A completed record without fingerprint or response, written by a caller whose clock agrees
// with the server's, is stored as one integer; it reads back exactly.
// A batch completion from a caller whose clock is behind the beginner's by more than the
// retention: the record's expiry comes before its creation, which the compact form cannot
// hold (it once wrapped into the fields above it: a creation time days off, another token).
TEST(RedisCompactTest, ABatchCompletionWithAnExpiryBeforeTheCreationIsStoredExactly) {
  auto server = RedisServer::Start();
  ASSERT_TRUE(server.has_value()) << server.error().ToString();
  const Timestamp now = Timestamp(std::chrono::duration_cast<milliseconds>(
      std::chrono::system_clock::now().time_since_epoch()));
  testing::FakeClock ahead(now + 900ms);
  testing::FakeClock behind(now - 900ms);
  RedisStoreOptions oa = SingleNode(**server);
  oa.clock = &ahead;
  RedisStoreOptions ob = SingleNode(**server);
  ob.clock = &behind;
  auto a = Open(oa);
  auto b = Open(ob);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);

  const std::string key = "fedcba9876543210fedcba9876543210";
  auto begun = a->Begin(BeginRequest{.scope = "", .key = key});
  ASSERT_TRUE(IsAcquired(begun)) << Show(begun);
  const Acquired acquired = std::get<Acquired>(*begun);
  const CompleteRequest c{.scope = "",
                          .key = key,
                          .token = acquired.token,
                          .outcome = Outcome::kSuccess,
                          .retention = 100ms};
  auto done = b->CompleteBatch(std::span<const CompleteRequest>(&c, 1));
  ASSERT_EQ(done.size(), 1u);
  ASSERT_THAT(done[0], ::testing::Optional(WriteAnswer::kApplied));

  auto got = b->Get("", key);
  ASSERT_TRUE(got.has_value() && got->has_value()) << got.status().ToString();
  EXPECT_EQ((*got)->state, RecordState::kCompleted);
  EXPECT_EQ((*got)->token, acquired.token);
  EXPECT_EQ((*got)->created, now + 900ms);
  EXPECT_EQ((*got)->attempt, 1u);
  auto replay = b->Begin(BeginRequest{.scope = "", .key = key});
  ASSERT_TRUE(replay.has_value() && std::holds_alternative<Replay>(*replay)) << Show(replay);
}

TEST(RedisCompactTest, CompletedRecordIsOneIntegerAndReadsBackExactly) {
  auto server = RedisServer::Start();
  ASSERT_TRUE(server.has_value()) << server.error().ToString();
  // The caller's clock must agree with the server's for the compact form: start at the
  // system's time (the only test here that reads it).
  testing::FakeClock clock(Timestamp(std::chrono::duration_cast<milliseconds>(
      std::chrono::system_clock::now().time_since_epoch())));
  RedisStoreOptions o = SingleNode(**server);
  o.clock = &clock;
  auto store = Open(o);
  ASSERT_NE(store, nullptr);

  const std::string key = "0123456789abcdef0123456789abcdef";
  const Timestamp t0 = clock.Now();
  auto a = store->Begin(BeginRequest{.scope = "", .key = key});
  ASSERT_TRUE(IsAcquired(a)) << Show(a);
  const Acquired acquired = std::get<Acquired>(*a);
  clock.Advance(250ms);
  ASSERT_THAT(store->Complete(CompleteRequest{.scope = "",
                                              .key = key,
                                              .token = acquired.token,
                                              .outcome = Outcome::kFailure,
                                              .retention = 24h}),
              ::testing::Optional(WriteAnswer::kApplied));
  const std::string redis_key = redis::RecordKey("i:", "", key);
  EXPECT_THAT(CmdText((*server)->port(), {"OBJECT", "ENCODING", redis_key}),
              ::testing::Optional(std::string("int")));

  auto got = store->Get("", key);
  ASSERT_TRUE(got.has_value() && got->has_value()) << got.status().ToString();
  const Record& r = **got;
  EXPECT_EQ(r.state, RecordState::kCompleted);
  EXPECT_EQ(r.outcome, Outcome::kFailure);
  EXPECT_EQ(r.token, acquired.token);
  EXPECT_EQ(r.attempt, 1u);
  EXPECT_EQ(r.created, t0);
  EXPECT_EQ(r.expires, t0 + 250ms + 24h);
  EXPECT_EQ(r.response, "");
  auto replay = store->Begin(BeginRequest{.scope = "", .key = key});
  ASSERT_TRUE(replay.has_value() && std::holds_alternative<Replay>(*replay)) << Show(replay);
  EXPECT_EQ(std::get<Replay>(*replay).outcome, Outcome::kFailure);

  // Expiry is the logical one, and the token stays above the old one afterwards.
  clock.Advance(24h);
  EXPECT_THAT(store->Get("", key), ::testing::Optional(::testing::Eq(std::nullopt)));
  auto again = store->Begin(BeginRequest{.scope = "", .key = key});
  ASSERT_TRUE(IsAcquired(again)) << Show(again);
  EXPECT_GT(std::get<Acquired>(*again).token, acquired.token);
  EXPECT_THAT(store->Purge(), ::testing::Optional(0u));
}

// ---- a cluster of our own: MOVED, ASK -------------------------------------------------------

// A key of `scope` whose Redis key lives in `slot`.
std::string KeyInSlot(std::string_view scope, int slot, std::string_view avoid = {}) {
  for (int i = 0;; ++i) {
    const std::string key = "key-" + std::to_string(i);
    if (key != avoid && redis::KeySlot(redis::RecordKey("i:", scope, key)) == slot) return key;
  }
}

// Options for a store over every node of `cluster`.
RedisStoreOptions OnCluster(const Cluster& cluster, milliseconds command_timeout) {
  RedisStoreOptions o;
  o.cluster = true;
  o.nodes = cluster.Addresses();
  o.connect_timeout = 300ms;
  o.command_timeout = command_timeout;
  return o;
}

std::string NodeId(int port) { return CmdText(port, {"CLUSTER", "MYID"}).value_or(""); }

TEST(RedisClusterTest, FollowsMovedAndAskWhileASlotMoves) {
  auto cluster = redis::testing::StartCluster(3, 0, 2000ms);
  ASSERT_TRUE(cluster.has_value()) << cluster.error().ToString();
  RedisStoreOptions o;
  o.cluster = true;
  o.nodes = {cluster->nodes[0]->address()};
  o.command_timeout = 2000ms;
  auto store = Open(o);
  ASSERT_NE(store, nullptr);

  // A slot of node 0, and three keys in it.
  const std::string first = KeyInSlot("s", 100);
  const int slot = redis::KeySlot(redis::RecordKey("i:", "s", first));
  const std::string second = KeyInSlot("s", slot, first);
  std::string third;
  for (int i = 0; third.empty(); ++i) {
    const std::string k = "other-" + std::to_string(i);
    if (redis::KeySlot(redis::RecordKey("i:", "s", k)) == slot) third = k;
  }
  const int src = cluster->nodes[0]->port();
  const int dst = cluster->nodes[1]->port();
  ASSERT_TRUE(Finish(*store, first, "one"));
  auto held = store->Begin(BeginRequest{.scope = "s", .key = second});
  ASSERT_TRUE(IsAcquired(held)) << Show(held);

  // Start moving the slot to node 1, and move `first` only.
  const std::string src_id = NodeId(src), dst_id = NodeId(dst);
  ASSERT_TRUE(CmdText(dst, {"CLUSTER", "SETSLOT", std::to_string(slot), "IMPORTING", src_id}));
  ASSERT_TRUE(CmdText(src, {"CLUSTER", "SETSLOT", std::to_string(slot), "MIGRATING", dst_id}));
  ASSERT_TRUE(CmdText(src, {"MIGRATE", "127.0.0.1", std::to_string(dst), "", "0", "5000", "KEYS",
                            redis::RecordKey("i:", "s", first)}));

  // `first` now answers from node 1 through ASK; `second` still from node 0; a new key of the
  // slot goes to node 1 (ASK), where the scripts are not loaded yet (NOSCRIPT).
  EXPECT_TRUE(IsReplayOf(store->Begin(BeginRequest{.scope = "s", .key = first}), "one"));
  EXPECT_THAT(store->Complete(CompleteRequest{.scope = "s",
                                              .key = second,
                                              .token = std::get<Acquired>(*held).token,
                                              .response = "two"}),
              ::testing::Optional(WriteAnswer::kApplied));
  EXPECT_TRUE(Finish(*store, third, "three"));
  EXPECT_TRUE(IsReplayOf(store->Begin(BeginRequest{.scope = "s", .key = third}), "three"));

  // Finish the move: `second` too goes to node 1 (`third` is there already, or it would be
  // lost now), and the slot is node 1's (MOVED).
  ASSERT_TRUE(CmdText(src, {"MIGRATE", "127.0.0.1", std::to_string(dst), "", "0", "5000", "KEYS",
                            redis::RecordKey("i:", "s", second)}));
  for (const auto& n : cluster->nodes) {
    ASSERT_TRUE(CmdText(n->port(), {"CLUSTER", "SETSLOT", std::to_string(slot), "NODE", dst_id}));
  }
  EXPECT_TRUE(IsReplayOf(store->Begin(BeginRequest{.scope = "s", .key = first}), "one"));
  EXPECT_TRUE(IsReplayOf(store->Begin(BeginRequest{.scope = "s", .key = second}), "two"));
  EXPECT_TRUE(IsReplayOf(store->Begin(BeginRequest{.scope = "s", .key = third}), "three"));
  // The operator calls see every master.
  EXPECT_THAT(store->List(ListFilter{.scope = "s"}), ::testing::Optional(::testing::SizeIs(3u)));
}

// A frozen master costs the calls for its own slots that were in flight when it stopped, and
// nothing else: its keys are then refused at once (the slot map read from a node that answers
// still names it), and every other master's keys are answered as before.
TEST(RedisClusterTest, AFrozenMasterHoldsOnlyItsCallsInFlightAndNoOtherShard) {
  // A node timeout far longer than the test: the frozen master is never marked failed, so the
  // others keep serving their slots.
  auto cluster = redis::testing::StartCluster(3, 0, 20000ms);
  ASSERT_TRUE(cluster.has_value()) << cluster.error().ToString();
  auto store = Open(OnCluster(*cluster, 300ms));
  ASSERT_NE(store, nullptr);
  const std::string frozen = cluster->nodes[0]->address();  // slots 0-5460
  ASSERT_TRUE(cluster->nodes[0]->Freeze().ok());

  constexpr int kThreads = 8, kCalls = 30;
  int waited = 0, frozen_keys = 0;
  for (const Timed& g : Hammer(*store, kThreads, kCalls, "k")) {
    if (redis::KeySlot(redis::RecordKey("i:", "s", g.key)) <= 5460) {
      ++frozen_keys;
      EXPECT_EQ(g.answer.status().code(), StatusCode::kUnavailable)
          << g.key << ": " << Show(g.answer);
      EXPECT_THAT(g.answer.status().message(), HasSubstr(frozen));
      if (g.took >= 250ms) ++waited;
    } else {
      EXPECT_TRUE(IsAcquired(g.answer)) << g.key << ": " << Show(g.answer);
      EXPECT_LT(g.took, 250ms) << g.key << " waited for the frozen master";
    }
  }
  ASSERT_GT(frozen_keys, kThreads * kCalls / 5);
  EXPECT_LE(waited, kThreads) << "of " << frozen_keys << " calls on the frozen master";

  ASSERT_TRUE(cluster->nodes[0]->Thaw().ok());
  EXPECT_TRUE(Eventually([&] { return Finish(*store, KeyInSlot("s", 7), "r"); }, 5s));
}

// ---- failover ----------------------------------------------------------------------------------

TEST(RedisClusterTest, FailoverKeepsEveryAcknowledgedKeyWithWait) {
  auto cluster = redis::testing::StartCluster(3, 1, 1000ms);
  ASSERT_TRUE(cluster.has_value()) << cluster.error().ToString();
  RedisStoreOptions o = OnCluster(*cluster, 1000ms);
  o.wait_replicas = 1;
  o.wait_timeout = 2000ms;
  auto store = Open(o);
  ASSERT_NE(store, nullptr);

  constexpr int kKeys = 300;
  std::vector<std::string> acknowledged;
  for (int i = 0; i < kKeys; ++i) {
    const std::string key = "order-" + std::to_string(i);
    ASSERT_TRUE(Finish(*store, key, "response-" + std::to_string(i))) << key;
    acknowledged.push_back(key);
  }
  // Kill master 0 (slots 0-5460) outright; its replica takes over within a few node
  // timeouts, and the store finds it by itself.
  const int dead = cluster->nodes[0]->port();
  std::string probe;  // an acknowledged key of the dead master
  for (const std::string& key : acknowledged) {
    if (redis::KeySlot(redis::RecordKey("i:", "s", key)) <= 5460) probe = key;
  }
  ASSERT_FALSE(probe.empty());
  ASSERT_TRUE(cluster->nodes[0]->Kill().ok());
  std::string last;
  const bool resumed = Eventually(
      [&] {
        auto r = store->Begin(BeginRequest{.scope = "s", .key = probe});
        last = Show(r);
        return r.has_value();
      },
      30s);
  ASSERT_TRUE(resumed) << "the store did not resume after the failover of 127.0.0.1:" << dead
                       << "; last answer: " << last;
  std::vector<BeginRequest> all;
  for (const std::string& key : acknowledged) all.push_back(BeginRequest{.scope = "s", .key = key});
  const std::vector<Result<BeginAnswer>> replays = store->BeginBatch(all);
  for (int i = 0; i < kKeys; ++i) {
    EXPECT_TRUE(IsReplayOf(replays[static_cast<std::size_t>(i)], "response-" + std::to_string(i)))
        << acknowledged[static_cast<std::size_t>(i)] << ": "
        << Show(replays[static_cast<std::size_t>(i)]);
  }

  // The promoted master has no replica: a new key there cannot be acknowledged (fail closed).
  const std::string fresh = KeyInSlot("s", 2);
  auto unreplicated = store->Begin(BeginRequest{.scope = "s", .key = fresh});
  EXPECT_EQ(unreplicated.status().code(), StatusCode::kUnavailable) << Show(unreplicated);
  EXPECT_THAT(unreplicated.status().message(), HasSubstr("replicas"));
  // The old master comes back as the new one's replica; writes are acknowledged again.
  ASSERT_TRUE(cluster->nodes[0]->Restart().ok());
  int n = 0;
  EXPECT_TRUE(Eventually([&] { return Finish(*store, KeyInSlot("s", 3 + n++), "r"); }, 30s));
}

}  // namespace
}  // namespace idem
