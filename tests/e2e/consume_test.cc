// idemd consume end to end (issue 6), once per broker (Kafka on librdkafka's mock cluster,
// NATS JetStream, Redis Streams): 10 000 messages of which 30 % are duplicates, consumed by
// `idemd consume` whose HTTP handler is the example ledger behind an idemd gateway; the consumer
// is killed with SIGKILL at random moments and restarted, at least 5 times. At the end:
//   - every distinct key was charged exactly once, and nothing else was;
//   - each partition's charges are in publish order;
//   - the DLQ holds exactly the poison messages (no key) and the permanently failing ones
//     (the ledger answers 400), each with its reason;
//   - the consumer itself suppressed the duplicates: the gateway saw at most a few batches of
//     re-runs (the keys in flight when the consumer was killed), not the 3 000 duplicates.
//
// Why a gateway in front of the ledger: a consumer killed after the handler's effect and before
// the key's completion runs it again after the lease with attempt 2 (SPEC §3); the key it passes
// downstream makes that second run harmless. The ledger alone charges every request, so the
// gateway is what a real service would be: idempotent by the key it is given.
#include <signal.h>
#include <stdlib.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "idem/consumer.h"
#include "idem/consumers/kafka.h"
#include "idem/consumers/nats.h"
#include "idem/consumers/redis_streams.h"
#include "tests/support/consumer_helpers.h"
#include "tests/support/http_client.h"
#include "tests/support/process.h"

namespace idem::testing {
namespace {

using namespace std::chrono_literals;
using Headers = std::vector<std::pair<std::string, std::string>>;

constexpr int kPartitions = 4;
constexpr int kMessages = 10'000;
constexpr int kDuplicates = 3'000;  // 30 %
constexpr int kPoison = 40;         // no Idempotency-Key
constexpr int kRejected = 60;       // amount 0: the ledger answers 400 -> permanent -> DLQ
constexpr int kKills = 5;
constexpr int kBatch = 64;

std::filesystem::path MakeTempDir() {
  std::string tmpl = (std::filesystem::temp_directory_path() / "idem-consume.XXXXXX").string();
  const char* dir = ::mkdtemp(tmpl.data());
  return dir != nullptr ? std::filesystem::path(dir) : std::filesystem::path();
}

std::string Unique(std::string_view what) {
  return std::string(what) + std::to_string(::getpid()) + "x" +
         std::to_string(std::chrono::steady_clock::now().time_since_epoch().count() % 1'000'000);
}

// One message to publish.
struct Outgoing {
  int partition = 0;
  std::string payload;
  Headers headers;
};

// A message found in the DLQ.
struct DeadLetter {
  std::string payload;
  Headers headers;
};

// What a test needs from a broker: a place to publish, the [[consumer]] lines that read it, and
// the dead-letter channel's contents.
class BrokerDriver {
 public:
  virtual ~BrokerDriver() = default;
  virtual void SetUp(const std::filesystem::path& dir) = 0;
  virtual void Publish(const std::vector<Outgoing>& messages) = 0;
  virtual std::string ConsumerToml() = 0;
  virtual std::vector<DeadLetter> ReadDlq() = 0;
};

class KafkaDriver : public BrokerDriver {
 public:
  void SetUp(const std::filesystem::path&) override {
    auto mock = ChildProcess::Spawn(
        IDEM_KAFKA_MOCK, {"--brokers", "1", "--topic", topic_ + ":" + std::to_string(kPartitions),
                          "--topic", dlq_ + ":1"});
    ASSERT_TRUE(mock.has_value()) << mock.error().ToString();
    mock_.emplace(std::move(*mock));
    auto line = mock_->WaitForLine("bootstrap ", 30s);
    ASSERT_TRUE(line.has_value()) << line.error().ToString();
    bootstrap_ = line->substr(10);
  }
  void Publish(const std::vector<Outgoing>& messages) override {
    auto producer = kafka::Producer::Open(bootstrap_);
    ASSERT_TRUE(producer.has_value()) << producer.error().ToString();
    for (const Outgoing& m : messages) {
      Status s = producer->Publish(topic_, m.partition, "", m.payload, m.headers);
      if (s.code() == StatusCode::kResourceExhausted) {
        ASSERT_TRUE(producer->Flush(60s).ok());
        s = producer->Publish(topic_, m.partition, "", m.payload, m.headers);
      }
      ASSERT_TRUE(s.ok()) << s.ToString();
    }
    Status s = producer->Flush(60s);
    ASSERT_TRUE(s.ok()) << s.ToString();
  }
  std::string ConsumerToml() override {
    return "broker = \"kafka\"\nurl = \"" + bootstrap_ + "\"\ntopics = [\"" + topic_ +
           "\"]\ngroup = \"billing\"\ndlq = \"" + dlq_ +
           "\"\nsession_timeout = \"3s\"\nproperties = { \"heartbeat.interval.ms\" = \"500\" }\n";
  }
  std::vector<DeadLetter> ReadDlq() override {
    auto all = kafka::ReadTopic(bootstrap_, dlq_, 30s);
    EXPECT_TRUE(all.has_value()) << all.error().ToString();
    std::vector<DeadLetter> out;
    if (all) {
      for (auto& m : *all) out.push_back({std::move(m.payload), std::move(m.headers)});
    }
    return out;
  }

 private:
  std::optional<ChildProcess> mock_;
  std::string bootstrap_;
  std::string topic_ = "payments";
  std::string dlq_ = "payments.dlq";
};

class NatsDriver : public BrokerDriver {
 public:
  void SetUp(const std::filesystem::path&) override {
    const char* url = std::getenv("IDEM_TEST_NATS");
    ASSERT_NE(url, nullptr) << "IDEM_TEST_NATS is not set: run under scripts/test.sh, or start "
                               "the servers with scripts/servers.sh and source its env file";
    url_ = url;
    auto publisher = nats::Publisher::Open(url_);
    ASSERT_TRUE(publisher.has_value()) << publisher.error().ToString();
    publisher_ = std::move(*publisher);
    ASSERT_TRUE(publisher_->EnsureStream(stream_, {prefix_ + ".>"}).ok());
  }
  void Publish(const std::vector<Outgoing>& messages) override {
    for (const Outgoing& m : messages) {
      Status s = publisher_->PublishAsync(prefix_ + ".p" + std::to_string(m.partition), m.payload,
                                          m.headers);
      ASSERT_TRUE(s.ok()) << s.ToString();
    }
    Status s = publisher_->WaitPublished(60s);
    ASSERT_TRUE(s.ok()) << s.ToString();
  }
  std::string ConsumerToml() override {
    return "broker = \"nats\"\nurl = \"" + url_ + "\"\nstream = \"" + stream_ + "\"\ntopics = [\"" +
           prefix_ + ".>\"]\ngroup = \"billing\"\ndlq = \"" + prefix_ + "dlq\"\ndlq_stream = \"" +
           stream_ + "_DLQ\"\nack_wait = \"3s\"\n";
  }
  std::vector<DeadLetter> ReadDlq() override {
    auto all = nats::ReadStream(url_, stream_ + "_DLQ");
    EXPECT_TRUE(all.has_value()) << all.error().ToString();
    std::vector<DeadLetter> out;
    if (all) {
      for (auto& m : *all) out.push_back({std::move(m.payload), std::move(m.headers)});
    }
    return out;
  }
  ~NatsDriver() override {
    if (publisher_) {
      (void)publisher_->DeleteStream(stream_);
      (void)publisher_->DeleteStream(stream_ + "_DLQ");
    }
  }

 private:
  std::string url_;
  std::string stream_ = Unique("PAY");
  std::string prefix_ = Unique("pay");
  std::unique_ptr<nats::Publisher> publisher_;
};

class RedisDriver : public BrokerDriver {
 public:
  void SetUp(const std::filesystem::path&) override {
    const char* at = std::getenv("IDEM_TEST_REDIS");
    ASSERT_NE(at, nullptr) << "IDEM_TEST_REDIS is not set: run under scripts/test.sh, or start "
                              "the servers with scripts/servers.sh and source its env file";
    url_ = std::string("redis://") + at;
  }
  void Publish(const std::vector<Outgoing>& messages) override {
    std::map<int, std::vector<redis_streams::StreamEntry>> by_stream;
    for (const Outgoing& m : messages) by_stream[m.partition].push_back({m.payload, m.headers});
    // One stream at a time keeps each stream's order; interleaving across streams does not
    // matter to the consumer.
    for (const auto& [p, entries] : by_stream) {
      Status s = redis_streams::Publish(url_, Stream(p), entries);
      ASSERT_TRUE(s.ok()) << s.ToString();
    }
  }
  std::string ConsumerToml() override {
    std::string topics;
    for (int p = 0; p < kPartitions; ++p) {
      topics += (p == 0 ? "\"" : ", \"") + Stream(p) + "\"";
    }
    return "broker = \"redis\"\nurl = \"" + url_ + "\"\ntopics = [" + topics +
           "]\ngroup = \"billing\"\ndlq = \"" + prefix_ +
           ":dlq\"\nconsumer_name = \"consumer-1\"\nclaim_idle = \"3s\"\n";
  }
  std::vector<DeadLetter> ReadDlq() override {
    auto all = redis_streams::ReadStream(url_, prefix_ + ":dlq");
    EXPECT_TRUE(all.has_value()) << all.error().ToString();
    std::vector<DeadLetter> out;
    if (all) {
      for (auto& m : *all) out.push_back({std::move(m.payload), std::move(m.headers)});
    }
    return out;
  }

 private:
  std::string Stream(int p) const { return prefix_ + ":p" + std::to_string(p); }
  std::string url_;
  std::string prefix_ = Unique("pay");
};

// One charge as the ledger lists it.
struct Charge {
  long id = 0;
  std::string account;
  long amount = 0;
  std::string key;
  std::string attempt;  // the Idempotency-Attempt the ledger saw, "" when none
};

std::vector<Charge> ParseCharges(const std::string& body) {
  static const std::regex kCharge(
      R"re(\{"id":(\d+),"account":"([^"]*)","amount":(-?\d+),"idempotency_key":"([^"]*)"(?:,"attempt":"?([^",}]*))?)re");
  std::vector<Charge> out;
  for (auto it = std::sregex_iterator(body.begin(), body.end(), kCharge);
       it != std::sregex_iterator(); ++it) {
    out.push_back({std::stol((*it)[1]), (*it)[2], std::stol((*it)[3]), (*it)[4], (*it)[5]});
  }
  return out;
}

// Sum of a counter family's samples whose labels contain `label`.
double MetricSum(const std::string& text, std::string_view family, std::string_view label) {
  double sum = 0;
  std::size_t at = 0;
  while ((at = text.find(family, at)) != std::string::npos) {
    const auto end = text.find('\n', at);
    const std::string line = text.substr(at, end - at);
    at = end;
    if (line.size() <= family.size() || line[family.size()] != '{') continue;
    if (line.find(label) == std::string::npos) continue;
    sum += std::stod(line.substr(line.rfind(' ') + 1));
  }
  return sum;
}

class ConsumeE2eTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    dir_ = MakeTempDir();
    ASSERT_FALSE(dir_.empty());
    if (GetParam() == "kafka") driver_ = std::make_unique<KafkaDriver>();
    if (GetParam() == "nats") driver_ = std::make_unique<NatsDriver>();
    if (GetParam() == "redis") driver_ = std::make_unique<RedisDriver>();
    ASSERT_NE(driver_, nullptr);
    driver_->SetUp(dir_);
    if (HasFatalFailure()) return;

    auto ledger = ChildProcess::Spawn(IDEM_LEDGER_PATH, {"--listen", "127.0.0.1:0"});
    ASSERT_TRUE(ledger.has_value()) << ledger.error().ToString();
    ledger_.emplace(std::move(*ledger));
    auto line = ledger_->WaitForLine("ledger listening on ", 30s);
    ASSERT_TRUE(line.has_value()) << line.error().ToString();
    ledger_port_ = *ParseListeningPort(*line);
    auto gateway = ChildProcess::Spawn(
        IDEMD_PATH,
        {"--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0", "--upstream",
         "http://127.0.0.1:" + std::to_string(ledger_port_), "--store",
         "log:" + (dir_ / "gateway").string(), "--threads", "2", "--log-level", "error"});
    ASSERT_TRUE(gateway.has_value()) << gateway.error().ToString();
    gateway_.emplace(std::move(*gateway));
    line = gateway_->WaitForLine("idemd listening on ", 60s);
    ASSERT_TRUE(line.has_value()) << line.error().ToString();
    gateway_port_ = *ParseListeningPort(*line);
    gateway_admin_ = *ParsePortAfter(*line, "admin");

    config_ = dir_ / "consume.toml";
    std::ofstream(config_) << "store = \"log:" << (dir_ / "consumer").string()
                           << "\"\nadmin = \"127.0.0.1:0\"\nlog_level = \"warn\"\n\n"
                           << "[[consumer]]\nname = \"payments\"\n"
                           << driver_->ConsumerToml()
                           << "handler = \"http://127.0.0.1:" << gateway_port_
                           << "/charges\"\nhandler_timeout = \"900ms\"\n"
                           << "lease = \"2s\"\nbatch = " << kBatch
                           << "\nmax_attempts = 3\nbackoff = \"20ms\"\nmax_backoff = \"100ms\"\n";
  }

  void TearDown() override {
    consumer_.reset();
    gateway_.reset();
    ledger_.reset();
    driver_.reset();
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }

  void StartConsumer() {
    auto c = ChildProcess::Spawn(IDEMD_PATH, {"consume", "--config", config_.string()});
    ASSERT_TRUE(c.has_value()) << c.error().ToString();
    consumer_.emplace(std::move(*c));
    auto line = consumer_->WaitForLine("idemd consume running", 60s);
    ASSERT_TRUE(line.has_value()) << line.error().ToString();
    consumer_admin_ = *ParsePortAfter(*line, "admin");
  }

  std::vector<Charge> Charges() {
    auto r = HttpRequest(ledger_port_, "GET", "/charges", {}, {}, 30s);
    EXPECT_TRUE(r.has_value()) << r.error().ToString();
    return r.has_value() ? ParseCharges(r->body) : std::vector<Charge>{};
  }

  std::size_t ChargeCount() {
    auto r = HttpRequest(ledger_port_, "GET", "/charges/count", {}, {}, 30s);
    if (!r.has_value()) return 0;
    static const std::regex kCount(R"re("count":(\d+))re");
    std::smatch m;
    return std::regex_search(r->body, m, kCount) ? std::stoul(m[1]) : 0;
  }

  std::filesystem::path dir_;
  std::filesystem::path config_;
  std::unique_ptr<BrokerDriver> driver_;
  std::optional<ChildProcess> ledger_, gateway_, consumer_;
  std::uint16_t ledger_port_ = 0, gateway_port_ = 0, gateway_admin_ = 0, consumer_admin_ = 0;
};

TEST_P(ConsumeE2eTest, KilledConsumerChargesEachKeyOnceInOrderAndDeadLettersExactly) {
  if (HasFatalFailure()) return;
  std::mt19937 rng(static_cast<unsigned>(::getpid()));

  // Distinct messages: keyed charges (amount = their rank in the partition, so order is
  // checkable), keyed charges the ledger rejects (amount 0), and poison without a key.
  struct Distinct {
    int partition;
    std::string key;  // empty: poison
    std::string payload;
    Headers headers;
  };
  std::vector<Distinct> distinct;
  std::set<std::string> charged_keys, rejected_keys, poison_ids;
  std::vector<int> rank(kPartitions, 0);
  const int n_distinct = kMessages - kDuplicates;
  for (int i = 0; i < n_distinct; ++i) {
    const int p = static_cast<int>(rng() % kPartitions);
    const std::string account = "p" + std::to_string(p);
    if (i % (n_distinct / kPoison) == 7 && static_cast<int>(poison_ids.size()) < kPoison) {
      const std::string id = "poison-" + std::to_string(i);
      poison_ids.insert(id);
      distinct.push_back(
          {p, "", R"({"account":")" + account + R"(","amount":1})", {{"X-Test-Id", id}}});
      continue;
    }
    const std::string key = "k-" + std::to_string(i);
    if (i % (n_distinct / kRejected) == 3 && static_cast<int>(rejected_keys.size()) < kRejected) {
      rejected_keys.insert(key);
      distinct.push_back(
          {p, key, R"({"account":")" + account + R"(","amount":0})", {{"Idempotency-Key", key}}});
      continue;
    }
    charged_keys.insert(key);
    distinct.push_back({p,
                        key,
                        R"({"account":")" + account + R"(","amount":)" +
                            std::to_string(++rank[static_cast<std::size_t>(p)]) + "}",
                        {{"Idempotency-Key", key}}});
  }
  // Duplicates: a keyed message published again later in its partition (the publish order
  // below is the original order with each copy inserted after its original).
  std::vector<std::vector<int>> copies_after(distinct.size());
  int duplicates = 0;
  while (duplicates < kDuplicates) {
    const auto i = rng() % distinct.size();
    if (distinct[i].key.empty()) continue;
    const auto j = i + rng() % (distinct.size() - i);  // the copy goes out after message j
    copies_after[j].push_back(static_cast<int>(i));
    ++duplicates;
  }
  std::vector<Outgoing> outgoing;
  for (std::size_t j = 0; j < distinct.size(); ++j) {
    outgoing.push_back({distinct[j].partition, distinct[j].payload, distinct[j].headers});
    for (int i : copies_after[j]) {
      const auto& d = distinct[static_cast<std::size_t>(i)];
      outgoing.push_back({d.partition, d.payload, d.headers});
    }
  }
  ASSERT_EQ(outgoing.size(), static_cast<std::size_t>(kMessages));
  driver_->Publish(outgoing);
  if (HasFatalFailure()) return;

  // Consume, killing the consumer at random moments while it makes progress.
  StartConsumer();
  if (HasFatalFailure()) return;
  int kills = 0;
  std::size_t last = 0;
  std::ostringstream history;  // the kills and the killed consumers' logs, for a failure
  const auto deadline = std::chrono::steady_clock::now() + 300s;
  while (kills < kKills && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50 + rng() % 250));
    const std::size_t now = ChargeCount();
    if (now == last || now >= charged_keys.size()) {
      if (now >= charged_keys.size()) break;
      continue;  // not consuming yet (joining, waiting out a lease): kill when it works
    }
    last = now;
    auto counters = HttpRequest(consumer_admin_, "GET", "/metrics");
    ASSERT_TRUE(consumer_->Kill(SIGKILL).ok());
    (void)consumer_->Wait(10s);
    ++kills;
    history << "killed at " << ChargeCount() << " charges; its log:\n" << consumer_->Stderr();
    if (counters) {  // the consumer's counters just before the kill
      std::istringstream lines(counters->body);
      for (std::string l; std::getline(lines, l);) {
        if (l.starts_with("idem_consumer_") && !l.ends_with(" 0")) history << l << "\n";
      }
    }
    StartConsumer();
    if (HasFatalFailure()) return;
  }
  EXPECT_GE(kills, kKills) << "the run ended before " << kKills << " kills (" << ChargeCount()
                           << " charges)";

  // Wait for the end: every charge made and every dead letter published.
  const std::size_t dead_expected = poison_ids.size() + rejected_keys.size();
  std::size_t dlq_seen = 0;
  while (std::chrono::steady_clock::now() < deadline) {
    if (ChargeCount() >= charged_keys.size()) {
      dlq_seen = driver_->ReadDlq().size();
      if (dlq_seen >= dead_expected) break;
    }
    std::this_thread::sleep_for(200ms);
  }
  std::this_thread::sleep_for(1s);  // anything still to come would show now

  // Exactly one charge per distinct key, and nothing else.
  const std::vector<Charge> charges = Charges();
  std::map<std::string, int> per_key;
  for (const Charge& c : charges) ++per_key[c.key];
  EXPECT_EQ(charges.size(), charged_keys.size());
  for (const std::string& k : charged_keys) {
    EXPECT_EQ(per_key[k], 1) << "key " << k;
    if (per_key[k] != 1) break;
  }
  for (const auto& [k, n] : per_key) {
    EXPECT_TRUE(charged_keys.count(k) == 1) << "unexpected charge for key " << k;
  }
  // Each partition's charges in publish order: amount is the rank in the partition.
  std::map<std::string, long> last_amount;
  bool in_order = true;
  for (const Charge& c : charges) {
    EXPECT_GT(c.amount, last_amount[c.account])
        << "charge " << c.id << " of " << c.account << " (key " << c.key << ", attempt "
        << c.attempt << ")";
    in_order = in_order && c.amount > last_amount[c.account];
    last_amount[c.account] = c.amount;
  }
  if (!in_order)
    ADD_FAILURE() << history.str() << "the running consumer's log:\n" << consumer_->Stderr();

  // The DLQ: exactly the poison and the rejected messages. Dead letters are at least once: a
  // kill repeats those published for messages the consumer had not acknowledged yet, which
  // are at most two batches (pipelined) per kill.
  std::set<std::string> dead_keys, dead_poison;
  int repeats = 0;
  for (const DeadLetter& d : driver_->ReadDlq()) {
    const std::string reason = HeaderOf(d.headers, "idem-dlq-reason");
    const std::string key = HeaderOf(d.headers, "idem-dlq-key");
    if (key.empty() || key == "<missing>") {  // NATS leaves an empty header out
      EXPECT_EQ(reason, "no_key");
      repeats += dead_poison.insert(HeaderOf(d.headers, "X-Test-Id")).second ? 0 : 1;
    } else {
      EXPECT_EQ(reason, "permanent") << key;
      EXPECT_NE(HeaderOf(d.headers, "idem-dlq-error").find("400"), std::string::npos);
      repeats += dead_keys.insert(key).second ? 0 : 1;
    }
  }
  EXPECT_EQ(dead_poison, poison_ids);
  EXPECT_EQ(dead_keys, rejected_keys);
  EXPECT_LE(repeats, kills * 2 * kBatch);

  // The consumer suppressed the duplicates itself: the gateway's replays are only the re-runs
  // of keys that were in flight when the consumer was killed.
  auto metrics = HttpRequest(gateway_admin_, "GET", "/metrics");
  ASSERT_TRUE(metrics.has_value());
  const double replays = MetricSum(metrics->body, "idem_begin_total", "answer=\"replay\"");
  EXPECT_LE(replays, static_cast<double>(kills * kBatch + rejected_keys.size()))
      << "the gateway answered " << replays << " replays: duplicates reached the handler";
  auto consumer_metrics = HttpRequest(consumer_admin_, "GET", "/metrics");
  ASSERT_TRUE(consumer_metrics.has_value());
  EXPECT_GT(
      MetricSum(consumer_metrics->body, "idem_consumer_messages_total", "result=\"replayed\""), 0);
  auto ready = HttpRequest(consumer_admin_, "GET", "/readyz");
  ASSERT_TRUE(ready.has_value());
  EXPECT_EQ(ready->status, 200) << ready->body;
  std::cout << "[ consume  ] " << GetParam() << ": " << charges.size() << " charges, " << dlq_seen
            << " dead letters (" << repeats << " repeated), " << kills << " kills, gateway replays "
            << replays << "\n";

  // SIGTERM: a clean stop.
  ASSERT_TRUE(consumer_->Kill(SIGTERM).ok());
  auto code = consumer_->Wait(30s);
  ASSERT_TRUE(code.has_value());
  EXPECT_EQ(*code, 0) << consumer_->Stderr();
}

// SPEC §5 end to end: a consumer configured with an entity (a payload field) and a version (a
// header) charges each account's versions above the applied one, once, in order; older versions
// and redeliveries are acknowledged as stale; a malformed version is dead-lettered.
TEST_P(ConsumeE2eTest, VersionedMessagesApplyOnlyNewerVersionsOnce) {
  if (HasFatalFailure()) return;
  std::ofstream(config_, std::ios::app) << "entity = \"json:/account\"\n"
                                        << "version = \"header:Account-Version\"\n";
  // Per partition, in publish order: (account, version); the amount is the version.
  const std::vector<std::vector<std::pair<std::string, std::string>>> streams = {
      {{"a", "1"}, {"a", "2"}, {"a", "1"}, {"a", "3"}, {"a", "2"}, {"a", "3"}, {"b", "1"}},
      {{"b", "5"}, {"b", "4"}, {"c", "1"}, {"c", "x"}, {"c", "2"}, {"b", "5"}},
  };
  std::vector<Outgoing> outgoing;
  for (std::size_t p = 0; p < streams.size(); ++p) {
    for (const auto& [account, version] : streams[p]) {
      outgoing.push_back(
          {static_cast<int>(p),
           R"({"account":")" + account + R"(","amount":)" + (version == "x" ? "1" : version) + "}",
           {{"Account-Version", version}}});
    }
  }
  driver_->Publish(outgoing);
  if (HasFatalFailure()) return;
  // a: 1, 2, 3 (1, 2 and 3 again are stale); b: 1, then 5 (4 and 5 again are stale); c: 1, 2.
  // (b's 1 and 5 are in different partitions: 5 may come first, and 1 is then stale.)
  StartConsumer();
  if (HasFatalFailure()) return;
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  auto settled = [&] {
    auto m = HttpRequest(consumer_admin_, "GET", "/metrics");
    if (!m.has_value()) return 0.0;
    return MetricSum(m->body, "idem_consumer_messages_total", "result=\"executed\"") +
           MetricSum(m->body, "idem_consumer_messages_total", "result=\"stale\"") +
           MetricSum(m->body, "idem_consumer_messages_total", "result=\"dead_lettered\"");
  };
  while (settled() < static_cast<double>(outgoing.size()) &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(100ms);
  }
  ASSERT_EQ(settled(), static_cast<double>(outgoing.size()));

  std::map<std::string, std::vector<long>> applied;  // by account, in charge order
  std::set<std::string> keys;
  for (const Charge& c : Charges()) {
    applied[c.account].push_back(c.amount);
    EXPECT_EQ(c.key, c.account + "#" + std::to_string(c.amount));
    EXPECT_TRUE(keys.insert(c.key).second) << c.key << " charged twice";
  }
  EXPECT_EQ(applied["a"], (std::vector<long>{1, 2, 3}));
  EXPECT_EQ(applied["c"], (std::vector<long>{1, 2}));
  const auto& b = applied["b"];
  EXPECT_TRUE(b == std::vector<long>({1, 5}) || b == std::vector<long>({5})) << b.size();
  auto m = HttpRequest(consumer_admin_, "GET", "/metrics");
  ASSERT_TRUE(m.has_value());
  const double executed = MetricSum(m->body, "idem_consumer_messages_total", "result=\"executed\"");
  EXPECT_EQ(executed, static_cast<double>(keys.size()));
  EXPECT_EQ(MetricSum(m->body, "idem_consumer_messages_total", "result=\"stale\""),
            static_cast<double>(outgoing.size() - 1) - executed);
  const std::vector<DeadLetter> dlq = driver_->ReadDlq();
  ASSERT_EQ(dlq.size(), 1u);
  EXPECT_EQ(HeaderOf(dlq[0].headers, "idem-dlq-reason"), "bad_version");

  ASSERT_TRUE(consumer_->Kill(SIGTERM).ok());
  auto code = consumer_->Wait(30s);
  ASSERT_TRUE(code.has_value());
  EXPECT_EQ(*code, 0) << consumer_->Stderr();
}

INSTANTIATE_TEST_SUITE_P(Brokers, ConsumeE2eTest, ::testing::Values("kafka", "nats", "redis"),
                         [](const auto& p) { return p.param; });

}  // namespace
}  // namespace idem::testing
