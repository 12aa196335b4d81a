// Fleets and faults (issue 5): several idemd processes share one store (Redis, a Redis Cluster,
// PostgreSQL) in front of one ledger, and the ledger is the judge: one charge per key, whatever
// the clients retry, through whichever gateway, and whatever happens to the store.
//
// FleetTest runs on the shared servers of scripts/servers.sh, each test under its own key prefix
// or schema. FaultTest starts its own servers so that it can kill and restart them.
#include <signal.h>
#include <stdlib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/http_client.h"
#include "tests/support/process.h"
#include "tests/support/servers.h"

namespace idem::testing {
namespace {

using namespace std::chrono_literals;

constexpr std::string_view kCharge = R"({"account":"acc-fleet","amount":700})";

std::filesystem::path MakeTempDir() {
  std::string tmpl = (std::filesystem::temp_directory_path() / "idem-fleet.XXXXXX").string();
  const char* dir = ::mkdtemp(tmpl.data());
  return dir != nullptr ? std::filesystem::path(dir) : std::filesystem::path();
}

// A name no other test run uses: key prefix or schema of this test.
std::string UniqueName(std::string_view what) {
  static std::atomic<int> counter{0};
  return std::string(what) + "_" + std::to_string(::getpid()) + "_" +
         std::to_string(counter.fetch_add(1)) + "_" +
         std::to_string(std::chrono::steady_clock::now().time_since_epoch().count() % 100000);
}

// Charges per Idempotency-Key in the ledger's GET /charges (a JSON array of charges).
std::map<std::string, int> ChargesByKey(const std::string& body) {
  std::map<std::string, int> out;
  constexpr std::string_view kField = "\"idempotency_key\":\"";
  std::size_t at = 0;
  while ((at = body.find(kField, at)) != std::string::npos) {
    at += kField.size();
    const auto end = body.find('"', at);
    if (end == std::string::npos) break;
    ++out[body.substr(at, end - at)];
    at = end;
  }
  return out;
}

// A ledger and N idemd processes in front of it, all on one store URL.
class Fleet {
 public:
  ~Fleet() { Stop(); }

  void Start(const std::string& store_url, int gateways,
             const std::vector<std::string>& extra = {}) {
    auto ledger =
        ChildProcess::Spawn(IDEM_LEDGER_PATH, {"--listen", "127.0.0.1:0", "--threads", "2"});
    ASSERT_TRUE(ledger.has_value()) << ledger.status().ToString();
    ledger_.emplace(std::move(*ledger));
    auto line = ledger_->WaitForLine("ledger listening on ", 30s);
    ASSERT_TRUE(line.has_value()) << line.status().ToString();
    ledger_port_ = *ParseListeningPort(*line);
    for (int i = 0; i < gateways; ++i) {
      std::vector<std::string> args = {
          "--listen",    "127.0.0.1:0", "--admin",
          "127.0.0.1:0", "--upstream",  "http://127.0.0.1:" + std::to_string(ledger_port_),
          "--store",     store_url,     "--threads",
          "2",           "--log-level", "error"};
      args.insert(args.end(), extra.begin(), extra.end());
      auto child = ChildProcess::Spawn(IDEMD_PATH, args);
      ASSERT_TRUE(child.has_value()) << child.status().ToString();
      gateways_.push_back(std::move(*child));
      auto ready = gateways_.back().WaitForLine("idemd listening on ", 60s);
      ASSERT_TRUE(ready.has_value()) << ready.status().ToString();
      auto port = ParseListeningPort(*ready);
      ASSERT_TRUE(port.has_value()) << *ready;
      ports_.push_back(*port);
    }
  }

  void Stop() {
    gateways_.clear();
    ledger_.reset();
  }

  // Every gateway still runs (a crash would hide behind a 502 or a connection error).
  void ExpectAllRunning() {
    for (ChildProcess& g : gateways_) {
      EXPECT_TRUE(g.Running()) << "idemd died; stderr:\n" << g.Stderr();
    }
  }

  std::string GatewayLogs() {
    std::string out;
    for (ChildProcess& g : gateways_) out += g.Stderr();
    return out.size() > 4000 ? out.substr(out.size() - 4000) : out;
  }

  const std::vector<std::uint16_t>& ports() const { return ports_; }

  std::map<std::string, int> Ledger() {
    auto r = HttpRequest(ledger_port_, "GET", "/charges", {}, {}, 30s);
    EXPECT_TRUE(r.has_value()) << r.status().ToString();
    return r.has_value() ? ChargesByKey(r->body) : std::map<std::string, int>{};
  }

 private:
  std::optional<ChildProcess> ledger_;
  std::vector<ChildProcess> gateways_;
  std::uint16_t ledger_port_ = 0;
  std::vector<std::uint16_t> ports_;
};

HttpHeaders KeyHeaders(const std::string& key) {
  return {{"Idempotency-Key", key}, {"Content-Type", "application/json"}};
}

// One client's keep-alive connections, one per gateway; a connection the gateway closed is
// reopened and the request sent once more (safe: that is what the key is for).
class Gateways {
 public:
  Gateways(std::vector<std::uint16_t> ports, std::chrono::milliseconds timeout = kHttpTimeout)
      : ports_(std::move(ports)), conns_(ports_.size()), timeout_(timeout) {}

  std::size_t size() const { return ports_.size(); }

  Result<HttpResponse> Charge(std::size_t gateway, const std::string& key) {
    Result<HttpResponse> r = UnavailableError("not sent");
    for (int tries = 0; tries < 2; ++tries) {
      std::optional<HttpConnection>& c = conns_[gateway];
      if (!c || !c->open()) {
        auto fresh = HttpConnection::Connect("127.0.0.1", ports_[gateway], timeout_);
        if (!fresh) return fresh.status();
        c.emplace(std::move(*fresh));
      }
      r = c->Send("POST", "/charges", KeyHeaders(key), kCharge);
      if (r.has_value()) return r;
      c.reset();
    }
    return r;
  }

 private:
  std::vector<std::uint16_t> ports_;
  std::vector<std::optional<HttpConnection>> conns_;
  std::chrono::milliseconds timeout_;
};

// ==== FleetTest: three gateways, one shared store ==============================================

struct SharedStore {
  std::string name;
  // The store URL for a test, under its own prefix or schema; may prepare it (idem store init).
  std::function<Result<std::string>()> url;
};

void PrintTo(const SharedStore& s, std::ostream* os) { *os << s.name; }

Result<std::string> InitPostgres(const std::string& url) {
  auto r = RunToEnd(IDEM_CLI_PATH, {"store", "init", url}, 60s);
  if (!r) return r.status();
  if (r->first != 0) return UnavailableError("idem store init " + url + ": " + r->second);
  return url;
}

const SharedStore kRedis{"redis", []() -> Result<std::string> {
                           auto addr = RequiredEnv("IDEM_TEST_REDIS");
                           if (!addr) return addr.status();
                           return "redis://" + *addr + "?prefix=" + UniqueName("fleet") + ":";
                         }};
const SharedStore kRedisCluster{"redis_cluster", []() -> Result<std::string> {
                                  auto addrs = RequiredEnv("IDEM_TEST_REDIS_CLUSTER");
                                  if (!addrs) return addrs.status();
                                  return "redis+cluster://" + *addrs +
                                         "?prefix=" + UniqueName("fleet") + ":";
                                }};
const SharedStore kPostgres{"postgres", []() -> Result<std::string> {
                              auto url = RequiredEnv("IDEM_TEST_POSTGRES");
                              if (!url) return url.status();
                              return InitPostgres(*url + "?schema=" + UniqueName("fleet"));
                            }};

class FleetTest : public ::testing::TestWithParam<SharedStore> {};

// 16 clients retry the same 120 keys through three gateways at random, concurrently: each key
// is charged once and every client gets the same charge back for it.
TEST_P(FleetTest, ThreeGatewaysChargeEachKeyExactlyOnce) {
  auto url = GetParam().url();
  ASSERT_TRUE(url.has_value()) << url.status().ToString();
  Fleet fleet;
  ASSERT_NO_FATAL_FAILURE(fleet.Start(*url, 3));

  constexpr int kClients = 16;
  constexpr int kKeys = 120;
  const std::string run = UniqueName("k");
  std::mutex mu;
  std::map<std::string, std::set<std::string>> bodies;  // key -> distinct 201 bodies seen
  std::map<int, int> statuses;
  std::vector<std::string> problems;
  std::vector<std::thread> clients;
  for (int c = 0; c < kClients; ++c) {
    clients.emplace_back([&, c] {
      std::mt19937 rng(static_cast<unsigned>(c) * 7919u + 1u);
      std::vector<int> order(kKeys);
      for (int i = 0; i < kKeys; ++i) order[static_cast<std::size_t>(i)] = i;
      std::shuffle(order.begin(), order.end(), rng);
      Gateways gateways(fleet.ports());
      for (int i : order) {
        const std::string key = run + "-" + std::to_string(i);
        for (int attempt = 0; attempt < 400; ++attempt) {
          auto r = gateways.Charge(rng() % gateways.size(), key);
          {
            std::lock_guard lock(mu);
            if (!r.has_value()) {
              problems.push_back(key + ": " + r.status().ToString());
              break;
            }
            ++statuses[r->status];
            if (r->status == 201) {
              bodies[key].insert(r->body);
              break;
            }
            if (r->status != 409) {
              problems.push_back(key + ": status " + std::to_string(r->status) + " " + r->body);
              break;
            }
          }
          std::this_thread::sleep_for(5ms);  // 409: the first request is still upstream
        }
      }
    });
  }
  for (std::thread& t : clients) t.join();
  fleet.ExpectAllRunning();
  EXPECT_THAT(problems, ::testing::IsEmpty()) << fleet.GatewayLogs();

  const std::map<std::string, int> ledger = fleet.Ledger();
  int charged = 0;
  for (int i = 0; i < kKeys; ++i) {
    const std::string key = run + "-" + std::to_string(i);
    const auto it = ledger.find(key);
    const int n = it == ledger.end() ? 0 : it->second;
    charged += n;
    EXPECT_EQ(n, 1) << "key " << key << " charged " << n << " times";
    EXPECT_EQ(bodies[key].size(), 1u) << "key " << key << " got different charges back";
  }
  EXPECT_EQ(charged, kKeys);
  EXPECT_GE(statuses[201], kClients * kKeys);
}

INSTANTIATE_TEST_SUITE_P(SharedStores, FleetTest,
                         ::testing::Values(kRedis, kRedisCluster, kPostgres),
                         [](const ::testing::TestParamInfo<SharedStore>& i) {
                           return i.param.name;
                         });

// ==== FaultTest: the store goes away mid-load and comes back ===================================

// Clients charging fresh keys through the fleet and retrying some acknowledged ones, until
// stopped. Records what they saw, so the test can check the invariants afterwards.
class Load {
 public:
  Load(const std::vector<std::uint16_t>& ports, int clients) : ports_(ports) {
    for (int c = 0; c < clients; ++c) {
      threads_.emplace_back([this, c] { Run(c); });
    }
  }
  ~Load() { Stop(); }

  void Stop() {
    stop_.store(true);
    for (std::thread& t : threads_) {
      if (t.joinable()) t.join();
    }
  }

  int Count(int status) {
    std::lock_guard lock(mu_);
    return statuses_[status];
  }
  int Successes() { return successes_.load(); }
  std::vector<std::string> Problems() {
    std::lock_guard lock(mu_);
    return problems_;
  }
  // Keys whose first answer was a 201 from the ledger (not a replay).
  std::set<std::string> Charged() {
    std::lock_guard lock(mu_);
    return charged_;
  }

 private:
  void Run(int c) {
    std::mt19937 rng(static_cast<unsigned>(c) + 17u);
    Gateways gateways(ports_, 5s);
    std::vector<std::string> acked;
    for (int i = 0; !stop_.load(); ++i) {
      // Two in three requests are fresh keys; the rest retry an acknowledged or failed one.
      std::string key;
      if (!acked.empty() && rng() % 3 == 0) {
        key = acked[rng() % acked.size()];
      } else {
        key = "c" + std::to_string(c) + "-" + std::to_string(i);
      }
      auto r = gateways.Charge(rng() % gateways.size(), key);
      std::lock_guard lock(mu_);
      if (!r.has_value()) {
        problems_.push_back(key + ": " + r.status().ToString());
        continue;
      }
      ++statuses_[r->status];
      if (r->status == 201) {
        if (r->Header("Idempotent-Replayed") != "true") charged_.insert(key);
        acked.push_back(key);
        successes_.fetch_add(1);
      } else if (r->status == 503) {
        if (r->Header("Retry-After").empty())
          problems_.push_back(key + ": 503 without Retry-After");
        acked.push_back(key);  // retry it later: it must run at most once
      } else if (r->status != 409) {
        problems_.push_back(key + ": status " + std::to_string(r->status) + " " + r->body);
      }
    }
  }

  std::vector<std::uint16_t> ports_;
  std::atomic<bool> stop_{false};
  std::atomic<int> successes_{0};
  std::mutex mu_;
  std::map<int, int> statuses_;
  std::vector<std::string> problems_;
  std::set<std::string> charged_;
  std::vector<std::thread> threads_;
};

// Polls until `done` or the timeout; true if done.
bool WaitFor(std::chrono::milliseconds timeout, const std::function<bool()>& done) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!done()) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(20ms);
  }
  return true;
}

// The ledger's verdict after a fault: no key charged twice, and every key a client saw charged
// (a 201 that was not a replay) is in the ledger exactly once.
void ExpectNoDuplicateEffects(Fleet& fleet, Load& load) {
  const std::map<std::string, int> ledger = fleet.Ledger();
  int twice = 0;
  for (const auto& [key, n] : ledger) {
    if (n != 1) {
      ++twice;
      ADD_FAILURE() << "key " << key << " charged " << n << " times";
      if (twice > 10) break;
    }
  }
  for (const std::string& key : load.Charged()) {
    EXPECT_EQ(ledger.count(key), 1u) << "acknowledged key " << key << " not in the ledger";
  }
  EXPECT_THAT(load.Problems(), ::testing::IsEmpty()) << fleet.GatewayLogs();
}

class FaultTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = MakeTempDir();
    ASSERT_FALSE(dir_.empty());
  }
  void TearDown() override {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  std::filesystem::path dir_;
};

// Redis with an AOF fsynced on every write, so a restart forgets nothing acknowledged.
TEST_F(FaultTest, RedisStopsMidLoadRequestsFailClosedAndServiceResumes) {
  auto port = FreePort();
  ASSERT_TRUE(port.has_value());
  auto redis =
      RedisServer::Start(dir_ / "redis", *port, {"--appendonly", "yes", "--appendfsync", "always"});
  ASSERT_TRUE(redis.has_value()) << redis.status().ToString();
  Fleet fleet;
  ASSERT_NO_FATAL_FAILURE(
      fleet.Start("redis://" + redis->address() + "?timeout_ms=500", 2, {"--store-threads", "2"}));
  Load load(fleet.ports(), 6);
  ASSERT_TRUE(WaitFor(20s, [&] { return load.Successes() >= 100; }));

  ASSERT_TRUE(redis->Kill().ok());
  ASSERT_TRUE(WaitFor(20s, [&] { return load.Count(503) >= 20; }))
      << "no 503 while Redis was down; statuses seen: 201=" << load.Count(201);
  ASSERT_TRUE(redis->Restart().ok());
  const int before = load.Successes();
  EXPECT_TRUE(WaitFor(30s, [&] { return load.Successes() >= before + 100; }))
      << "service did not resume after Redis came back\n"
      << fleet.GatewayLogs();
  load.Stop();
  fleet.ExpectAllRunning();
  ExpectNoDuplicateEffects(fleet, load);
}

TEST_F(FaultTest, PostgresStopsMidLoadRequestsFailClosedAndServiceResumes) {
  auto port = FreePort();
  ASSERT_TRUE(port.has_value());
  auto pg = PostgresServer::Start(dir_ / "pg", *port);
  ASSERT_TRUE(pg.has_value()) << pg.status().ToString();
  auto url = InitPostgres(pg->url() + "?schema=fault&connect_timeout=1s&statement_timeout=2s");
  ASSERT_TRUE(url.has_value()) << url.status().ToString();
  Fleet fleet;
  ASSERT_NO_FATAL_FAILURE(fleet.Start(*url, 2, {"--store-threads", "2"}));
  Load load(fleet.ports(), 6);
  ASSERT_TRUE(WaitFor(30s, [&] { return load.Successes() >= 100; }));

  ASSERT_TRUE(pg->Stop().ok());
  ASSERT_TRUE(WaitFor(30s, [&] { return load.Count(503) >= 20; }))
      << "no 503 while PostgreSQL was down";
  ASSERT_TRUE(pg->Restart().ok());
  const int before = load.Successes();
  EXPECT_TRUE(WaitFor(60s, [&] { return load.Successes() >= before + 100; }))
      << "service did not resume after PostgreSQL came back\n"
      << fleet.GatewayLogs();
  load.Stop();
  fleet.ExpectAllRunning();
  ExpectNoDuplicateEffects(fleet, load);
}

// A master of a 3-master cluster (each with a replica) is killed mid-load. With wait_replicas=1
// every acknowledged answer is on the replica before the client hears it, so after the failover
// every key charged before it still replays. Until the shard has a replica again its writes
// cannot be confirmed and fail closed (503); once the old master is back (as the new master's
// replica), every key is served again.
TEST_F(FaultTest, ClusterMasterFailoverResumesAndKeepsAcknowledgedKeys) {
  auto cluster = RedisCluster::Start(dir_ / "cluster", 3, 1);
  ASSERT_TRUE(cluster.has_value()) << cluster.status().ToString();
  Fleet fleet;
  ASSERT_NO_FATAL_FAILURE(
      fleet.Start("redis+cluster://" + cluster->addresses() + "?wait_replicas=1&timeout_ms=1000", 2,
                  {"--store-threads", "2"}));
  Load load(fleet.ports(), 6);
  ASSERT_TRUE(WaitFor(20s, [&] { return load.Successes() >= 200; }));

  auto victim = cluster->MasterOf(0);
  ASSERT_TRUE(victim.has_value()) << victim.status().ToString();
  const std::set<std::string> before_failover = load.Charged();
  ASSERT_TRUE(cluster->nodes()[*victim].Kill().ok());
  ASSERT_TRUE(cluster->WaitHealthy(0, 30s).ok()) << "no failover";
  ASSERT_TRUE(cluster->nodes()[*victim].Restart().ok());
  ASSERT_TRUE(cluster->WaitReplicas(0, 1, 30s).ok());
  const int before = load.Successes();
  EXPECT_TRUE(WaitFor(30s, [&] { return load.Successes() >= before + 200; }))
      << "service did not resume after the failover\n"
      << fleet.GatewayLogs();
  load.Stop();
  fleet.ExpectAllRunning();
  ExpectNoDuplicateEffects(fleet, load);

  // Every shard serves fresh keys again (60 keys miss the failed-over shard with p < 1e-10).
  Gateways gateways(fleet.ports());
  for (int i = 0; i < 60; ++i) {
    const std::string key = UniqueName("after-failover");
    auto r = gateways.Charge(static_cast<std::size_t>(i) % gateways.size(), key);
    ASSERT_TRUE(r.has_value()) << r.status().ToString();
    EXPECT_EQ(r->status, 201) << key << ": " << r->body;
  }
  // Every key acknowledged before the failover replays, whichever master now holds it.
  int checked = 0;
  for (const std::string& key : before_failover) {
    auto r = gateways.Charge(0, key);
    ASSERT_TRUE(r.has_value()) << r.status().ToString();
    EXPECT_EQ(r->status, 201) << key << ": " << r->body;
    EXPECT_EQ(r->Header("Idempotent-Replayed"), "true") << key;
    if (++checked == 300) break;
  }
  const std::map<std::string, int> ledger = fleet.Ledger();
  for (const auto& [key, n] : ledger) EXPECT_EQ(n, 1) << key;
}

// A master of a 3-master cluster (no replica, and a node timeout longer than the test, so it is
// never failed over) is frozen with SIGSTOP under load. Requests for its slots fail closed
// (503, the ledger never called); the others are served as before, not queued behind store
// threads waiting on it (an audit saw ~2 s for every request); once it resumes, all are served.
TEST_F(FaultTest, AFrozenClusterMasterCostsOnlyItsOwnKeys) {
  auto cluster = RedisCluster::Start(dir_ / "cluster", 3, 0, 60s);
  ASSERT_TRUE(cluster.has_value()) << cluster.status().ToString();
  Fleet fleet;
  ASSERT_NO_FATAL_FAILURE(fleet.Start(
      "redis+cluster://" + cluster->addresses() + "?timeout_ms=1000", 1, {"--store-threads", "2"}));
  auto victim = cluster->MasterOf(0);
  ASSERT_TRUE(victim.has_value()) << victim.status().ToString();
  ASSERT_TRUE(cluster->nodes()[*victim].Signal(SIGSTOP).ok());

  struct Seen {
    std::string key;
    int status = 0;
    bool retry_after = false;
    std::chrono::milliseconds took{0};
  };
  constexpr int kClients = 6, kRequests = 20;
  std::vector<Seen> seen(kClients * kRequests);
  std::vector<std::thread> clients;
  for (int c = 0; c < kClients; ++c) {
    clients.emplace_back([&, c] {
      Gateways gateways(fleet.ports(), 10s);
      for (int i = 0; i < kRequests; ++i) {
        Seen& s = seen[static_cast<std::size_t>(c * kRequests + i)];
        s.key = UniqueName("frozen");
        const auto start = std::chrono::steady_clock::now();
        auto r = gateways.Charge(0, s.key);
        s.took = std::chrono::duration_cast<std::chrono::milliseconds>(
            std::chrono::steady_clock::now() - start);
        if (r.has_value()) {
          s.status = r->status;
          s.retry_after = !r->Header("Retry-After").empty();
        }
      }
    });
  }
  for (std::thread& t : clients) t.join();
  ASSERT_TRUE(cluster->nodes()[*victim].Signal(SIGCONT).ok());

  int served = 0;
  std::vector<std::chrono::milliseconds> took;
  const std::map<std::string, int> ledger = fleet.Ledger();
  for (const Seen& s : seen) {
    took.push_back(s.took);
    if (s.status == 201) {
      ++served;
      EXPECT_EQ(ledger.count(s.key), 1u) << s.key;
    } else {
      EXPECT_EQ(s.status, 503) << s.key << fleet.GatewayLogs();
      EXPECT_TRUE(s.retry_after) << s.key << ": 503 without Retry-After";
      EXPECT_EQ(ledger.count(s.key), 0u) << s.key << " failed closed yet was charged";
    }
  }
  // About two keys in three live on the masters that answer.
  EXPECT_GE(served, kClients * kRequests / 3);
  // Each client waits a store timeout at most once or twice (requests in flight when the
  // master stopped); the rest are answered without waiting for it.
  std::sort(took.begin(), took.end());
  std::printf("frozen master: %d of %zu served; latency median %lld, p75 %lld, max %lld ms\n",
              served, took.size(), static_cast<long long>(took[took.size() / 2].count()),
              static_cast<long long>(took[took.size() * 3 / 4].count()),
              static_cast<long long>(took.back().count()));
  EXPECT_LT(took[took.size() / 2], 250ms) << "median; slowest " << took.back().count() << " ms";
  EXPECT_LT(took[took.size() * 3 / 4], 500ms) << "75th percentile";

  // Resumed: every shard serves fresh keys again (60 keys miss it with p < 1e-10).
  Gateways gateways(fleet.ports());
  bool all = WaitFor(10s, [&] {
    for (int i = 0; i < 60; ++i) {
      auto r = gateways.Charge(0, UniqueName("thawed"));
      if (!r.has_value() || r->status != 201) return false;
    }
    return true;
  });
  EXPECT_TRUE(all) << fleet.GatewayLogs();
  fleet.ExpectAllRunning();
}

}  // namespace
}  // namespace idem::testing
