// End-to-end tests of idemd (SPEC §6): the ledger (examples/ledger) and idemd run as real
// processes on loopback, and a test client drives them. Each test checks what the client sees
// and what the ledger recorded, so a double execution shows up as a second charge. Answers the
// ledger never gives (interim 1xx, odd framing) come from a raw-TCP FakeUpstream instead.
//
// The store-failure tests run the same server in process (gateway::Server) over a FaultyStore,
// since no real store can be made to fail on demand from outside.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <optional>
#include <random>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "gateway/config.h"
#include "gateway/rules.h"
#include "gateway/server.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "idem/clock.h"
#include "idem/stores/memory.h"
#include "tests/support/faulty_store.h"
#include "tests/support/http_client.h"
#include "tests/support/process.h"

namespace idem::testing {
namespace {

using ::testing::AnyOf;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;
using namespace std::chrono_literals;

constexpr std::string_view kCharge = R"({"account":"acc-1","amount":1250})";

std::filesystem::path MakeTempDir() {
  std::string tmpl = (std::filesystem::temp_directory_path() / "idemd-e2e.XXXXXX").string();
  const char* dir = ::mkdtemp(tmpl.data());
  return dir != nullptr ? std::filesystem::path(dir) : std::filesystem::path();
}

int CountIn(const std::string& body) {  // {"count":N}
  const auto at = body.find("\"count\":");
  return at == std::string::npos ? -1 : std::atoi(body.c_str() + at + 8);
}

HttpHeaders KeyHeaders(std::string_view key) {
  return {{"Idempotency-Key", std::string(key)}, {"Content-Type", "application/json"}};
}

class GatewayTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = MakeTempDir();
    ASSERT_FALSE(dir_.empty());
    ASSERT_NO_FATAL_FAILURE(StartLedger());
  }

  void TearDown() override {
    if (idemd_) {
      EXPECT_TRUE(idemd_->Running()) << "idemd died; stderr:\n" << idemd_->Stderr();
    }
    idemd_.reset();
    ledger_.reset();
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  void StartLedger() {
    auto child =
        ChildProcess::Spawn(IDEM_LEDGER_PATH, {"--listen", "127.0.0.1:0", "--threads", "2"});
    ASSERT_TRUE(child.has_value()) << child.status().ToString();
    ledger_.emplace(std::move(*child));
    auto line = ledger_->WaitForLine("ledger listening on ", 30s);
    ASSERT_TRUE(line.has_value()) << line.status().ToString();
    auto port = ParseListeningPort(*line);
    ASSERT_TRUE(port.has_value());
    ledger_port_ = *port;
  }

  std::vector<std::string> BaseArgs() const {
    return {"--listen",    "127.0.0.1:0", "--admin",
            "127.0.0.1:0", "--upstream",  "http://127.0.0.1:" + std::to_string(ledger_port_),
            "--store",     store_url_,    "--threads",
            "2",           "--log-level", "warn"};
  }

  // Starts idemd with BaseArgs() + extra (later flags win).
  void StartIdemd(const std::vector<std::string>& extra = {}) {
    std::vector<std::string> args = BaseArgs();
    args.insert(args.end(), extra.begin(), extra.end());
    auto child = ChildProcess::Spawn(IDEMD_PATH, args);
    ASSERT_TRUE(child.has_value()) << child.status().ToString();
    idemd_.emplace(std::move(*child));
    auto line = idemd_->WaitForLine("idemd listening on ", 30s);
    ASSERT_TRUE(line.has_value()) << line.status().ToString();
    auto port = ParseListeningPort(*line);
    auto admin = ParsePortAfter(*line, "admin");
    ASSERT_TRUE(port.has_value() && admin.has_value()) << *line;
    port_ = *port;
    admin_port_ = *admin;
  }

  // Writes a principal secret file into the test's directory and returns its path.
  std::string SecretFile(std::string_view name, std::string_view secret) const {
    const auto path = dir_ / name;
    std::ofstream(path) << secret << "\n";
    return path.string();
  }

  // Writes a TOML config into the test's directory and returns its path.
  // An in-process gateway's config: loopback on free ports, in front of the ledger.
  gateway::Config InProcessConfig() const {
    gateway::Config config;
    config.listen = {"127.0.0.1", 0};
    config.admin = {"127.0.0.1", 0};
    config.upstream = "http://127.0.0.1:" + std::to_string(ledger_port_);
    config.threads = 1;
    config.log_level = "error";
    return config;
  }
  std::string WriteConfig(std::string_view toml) {
    const auto path = dir_ / "idemd.toml";
    std::ofstream(path) << toml;
    return path.string();
  }

  HttpResponse Send(std::string_view method, std::string_view target, const HttpHeaders& headers,
                    std::string_view body = {}) {
    auto r = HttpRequest(port_, method, target, headers, body);
    EXPECT_TRUE(r.has_value()) << r.status().ToString() << "\nidemd stderr:\n"
                               << (idemd_ ? idemd_->Stderr() : "");
    return r.has_value() ? *r : HttpResponse{};
  }

  HttpResponse Charge(std::string_view key, std::string_view body = kCharge,
                      HttpHeaders extra = {}) {
    HttpHeaders h = KeyHeaders(key);
    h.insert(h.end(), extra.begin(), extra.end());
    return Send("POST", "/charges", h, body);
  }

  int LedgerCharges() {
    auto r = HttpRequest(ledger_port_, "GET", "/charges/count");
    EXPECT_TRUE(r.has_value()) << r.status().ToString();
    return r.has_value() ? CountIn(r->body) : -1;
  }

  std::filesystem::path dir_;
  std::string store_url_ = "memory:";
  std::optional<ChildProcess> ledger_;
  std::optional<ChildProcess> idemd_;
  std::uint16_t ledger_port_ = 0, port_ = 0, admin_port_ = 0;
};

// The behaviour of SPEC §6 on each store idemd can use without a server: the memory store
// (called inline) and the log store (batches through Store::StartBatch, answers from its
// flusher).
class GatewayStoresTest : public GatewayTest, public ::testing::WithParamInterface<std::string> {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(GatewayTest::SetUp());
    if (GetParam() == "log") store_url_ = "log:" + (dir_ / "store").string() + "?sync=always";
  }
};

// /charges with in_flight = "wait": a retry waits for the first request's answer.
constexpr std::string_view kWaitingChargesRoute = R"(
[[route]]
prefix = "/charges"
methods = ["POST"]
in_flight = "wait"
wait = "10s"
)";

INSTANTIATE_TEST_SUITE_P(Stores, GatewayStoresTest, ::testing::Values("memory", "log"),
                         [](const ::testing::TestParamInfo<std::string>& p) { return p.param; });

TEST_P(GatewayStoresTest, FirstRequestIsForwardedAndARetryReplaysIt) {
  ASSERT_NO_FATAL_FAILURE(StartIdemd());
  const HttpResponse first = Charge("order-1");
  ASSERT_EQ(first.status, 201) << first.body;
  EXPECT_FALSE(first.HasHeader("Idempotent-Replayed"));
  EXPECT_THAT(first.body, HasSubstr("\"idempotency_key\":\"order-1\""));

  const HttpResponse retry = Charge("order-1");
  EXPECT_EQ(retry.status, 201);
  EXPECT_EQ(retry.Header("Idempotent-Replayed"), "true");
  EXPECT_EQ(retry.body, first.body);
  EXPECT_EQ(retry.Header("Content-Type"), first.Header("Content-Type"));
  EXPECT_EQ(LedgerCharges(), 1);

  // Re-serialised JSON is the same request (RFC 8785 fingerprint).
  const HttpResponse reordered = Charge("order-1", R"({ "amount": 1250, "account": "acc-1" })");
  EXPECT_EQ(reordered.Header("Idempotent-Replayed"), "true");
  EXPECT_EQ(LedgerCharges(), 1);
}

TEST_P(GatewayStoresTest, KeyReusedForADifferentRequestIs422) {
  ASSERT_NO_FATAL_FAILURE(StartIdemd());
  ASSERT_EQ(Charge("order-2").status, 201);
  const HttpResponse other_body = Charge("order-2", R"({"account":"acc-1","amount":9999})");
  EXPECT_EQ(other_body.status, 422);
  EXPECT_EQ(other_body.Header("Content-Type"), "application/problem+json");
  EXPECT_THAT(other_body.body, HasSubstr("\"status\":422"));
  const HttpResponse other_path = Send("POST", "/charges?x=1", KeyHeaders("order-2"), kCharge);
  EXPECT_EQ(other_path.status, 422);
  const HttpResponse other_method = Send("PATCH", "/charges", KeyHeaders("order-2"), kCharge);
  EXPECT_EQ(other_method.status, 422);
  EXPECT_EQ(LedgerCharges(), 1);
}

TEST_P(GatewayStoresTest, MissingOrMalformedKeysAre400AndNeverReachTheUpstream) {
  ASSERT_NO_FATAL_FAILURE(StartIdemd({"--max-key-bytes", "16"}));
  const HttpHeaders json = {{"Content-Type", "application/json"}};
  const HttpResponse missing = Send("POST", "/charges", json, kCharge);
  EXPECT_EQ(missing.status, 400);
  EXPECT_EQ(missing.Header("Content-Type"), "application/problem+json");

  for (const std::string& bad :
       {std::string(""), std::string("\"\""), std::string("\"abc"), std::string(17, 'k'),
        std::string("\"a\\b\""), std::string("k\xff\xfe"), std::string("\"caf\xc3\xa9\""),
        std::string("a b"), std::string("\"x\";p=1")}) {
    const HttpResponse r = Charge(bad);
    EXPECT_EQ(r.status, 400) << "key [" << bad << "]: " << r.body;
  }
  HttpHeaders twice = KeyHeaders("k1");
  twice.emplace_back("Idempotency-Key", "k2");
  EXPECT_EQ(Send("POST", "/charges", twice, kCharge).status, 400);
  EXPECT_EQ(Send("POST", "/charges", KeyHeaders("k3"), "{not json").status, 400);

  // Both forms of a good key work: sf-string and bare token name the same key.
  EXPECT_EQ(Charge("\"k-16-bytes-long\"").status, 201);
  EXPECT_EQ(Charge("k-16-bytes-long").Header("Idempotent-Replayed"), "true");
  EXPECT_EQ(LedgerCharges(), 1);
}

TEST_P(GatewayStoresTest, IdempotentMethodsPassThroughUntouched) {
  ASSERT_NO_FATAL_FAILURE(StartIdemd());
  ASSERT_EQ(Charge("order-3").status, 201);
  const HttpResponse list = Send("GET", "/charges", {});
  EXPECT_EQ(list.status, 200);
  EXPECT_THAT(list.body, HasSubstr("order-3"));
  EXPECT_FALSE(list.HasHeader("Idempotent-Replayed"));
  EXPECT_EQ(Send("GET", "/charges/count", {}).body, Send("GET", "/charges/count", {}).body);
}

TEST_P(GatewayStoresTest, RetryWhileTheFirstIsUpstreamIs409) {
  ASSERT_NO_FATAL_FAILURE(StartIdemd());
  std::thread slow([&] {
    const HttpResponse r = Charge("order-4", kCharge, {{"X-Ledger-Delay-Ms", "1500"}});
    EXPECT_EQ(r.status, 201);
  });
  std::this_thread::sleep_for(300ms);
  const HttpResponse busy = Charge("order-4");
  EXPECT_EQ(busy.status, 409) << busy.body;
  EXPECT_EQ(busy.Header("Content-Type"), "application/problem+json");
  slow.join();
  EXPECT_EQ(Charge("order-4").Header("Idempotent-Replayed"), "true");
  EXPECT_EQ(LedgerCharges(), 1);
}

// 50 clients at once with one key: the ledger is called once.
TEST_P(GatewayStoresTest, FiftyConcurrentRequestsWithOneKeyCallTheUpstreamOnce) {
  ASSERT_NO_FATAL_FAILURE(StartIdemd());
  std::atomic<int> created{0}, conflicts{0}, other{0};
  std::vector<std::thread> clients;
  for (int i = 0; i < 50; ++i) {
    clients.emplace_back([&] {
      auto r = HttpRequest(port_, "POST", "/charges",
                           {{"Idempotency-Key", "hot"}, {"X-Ledger-Delay-Ms", "200"}}, kCharge);
      if (!r) {
        ++other;
      } else if (r->status == 201) {
        ++created;
      } else if (r->status == 409) {
        ++conflicts;
      } else {
        ++other;
      }
    });
  }
  for (auto& t : clients) t.join();
  EXPECT_EQ(other.load(), 0);
  EXPECT_GE(created.load(), 1);  // the first, and retries that came after it finished
  EXPECT_EQ(created.load() + conflicts.load(), 50);
  EXPECT_EQ(LedgerCharges(), 1);
}

// The same in wait mode: every client gets the one response.
TEST_P(GatewayStoresTest, InWaitModeConcurrentDuplicatesAllGetTheFirstResponse) {
  const std::string config = WriteConfig(kWaitingChargesRoute);
  ASSERT_NO_FATAL_FAILURE(StartIdemd({"--config", config}));
  std::vector<std::string> bodies(50);
  std::vector<int> statuses(50);
  std::vector<std::thread> clients;
  for (int i = 0; i < 50; ++i) {
    clients.emplace_back([&, i] {
      auto r = HttpRequest(port_, "POST", "/charges",
                           {{"Idempotency-Key", "hot"}, {"X-Ledger-Delay-Ms", "300"}}, kCharge);
      if (r) {
        statuses[i] = r->status;
        bodies[i] = r->body;
      }
    });
  }
  for (auto& t : clients) t.join();
  for (int i = 0; i < 50; ++i) {
    EXPECT_EQ(statuses[i], 201) << i;
    EXPECT_EQ(bodies[i], bodies[0]) << i;
  }
  EXPECT_EQ(LedgerCharges(), 1);
  // One begin answer per request, the one it ended with: the polls of a waiting duplicate are
  // not answers, its replay is.
  auto metrics = HttpRequest(admin_port_, "GET", "/metrics");
  ASSERT_TRUE(metrics.has_value());
  EXPECT_THAT(metrics->body,
              HasSubstr("idem_begin_total{scope=\"gateway\",answer=\"acquired\"} 1\n"));
  EXPECT_THAT(metrics->body,
              HasSubstr("idem_begin_total{scope=\"gateway\",answer=\"replay\"} 49\n"));
  EXPECT_THAT(metrics->body, HasSubstr("idem_begin_total{scope=\"gateway\",answer=\"busy\"} 0\n"));
}

TEST_P(GatewayStoresTest, UpstreamFailureReleasesTheKeySoARetryRunsAgain) {
  ASSERT_NO_FATAL_FAILURE(StartIdemd());
  const HttpResponse failed = Charge("order-5", kCharge, {{"X-Ledger-Status", "503"}});
  EXPECT_EQ(failed.status, 503);
  EXPECT_FALSE(failed.HasHeader("Idempotent-Replayed"));
  EXPECT_EQ(LedgerCharges(), 0);
  const HttpResponse retry = Charge("order-5");
  EXPECT_EQ(retry.status, 201);
  EXPECT_FALSE(retry.HasHeader("Idempotent-Replayed"));
  EXPECT_EQ(Charge("order-5").Header("Idempotent-Replayed"), "true");
  EXPECT_EQ(LedgerCharges(), 1);
}

TEST_P(GatewayStoresTest, ClientErrorsFromTheUpstreamAreStoredAndReplayed) {
  ASSERT_NO_FATAL_FAILURE(StartIdemd());
  const HttpResponse rejected = Charge("order-6", kCharge, {{"X-Ledger-Status", "402"}});
  EXPECT_EQ(rejected.status, 402);
  const HttpResponse retry = Charge("order-6");
  EXPECT_EQ(retry.status, 402);
  EXPECT_EQ(retry.Header("Idempotent-Replayed"), "true");
  EXPECT_EQ(LedgerCharges(), 0);
}

TEST_P(GatewayStoresTest, UpstreamTimeoutIs504AndReleasesTheKey) {
  ASSERT_NO_FATAL_FAILURE(StartIdemd({"--upstream-timeout", "300ms"}));
  const HttpResponse slow = Charge("order-7", kCharge, {{"X-Ledger-Delay-Ms", "2000"}});
  EXPECT_EQ(slow.status, 504) << slow.body;
  const HttpResponse retry = Charge("order-7");
  EXPECT_NE(retry.status, 409);  // released, not held until the lease ends
}

TEST_P(GatewayStoresTest, UpstreamDownIs502AndTheKeyIsReleased) {
  ASSERT_NO_FATAL_FAILURE(StartIdemd());
  ASSERT_TRUE(ledger_->Kill(SIGKILL).ok());
  ASSERT_TRUE(ledger_->Wait(10s).has_value());
  const HttpResponse down = Charge("order-8");
  EXPECT_EQ(down.status, 502) << down.body;
  ASSERT_NO_FATAL_FAILURE(StartLedger());
  // idemd still points at the old port; the key must not be stuck in progress either way.
  EXPECT_EQ(Charge("order-8").status, 502);
}

TEST_P(GatewayStoresTest, PrincipalsNeverSeeEachOthersResponses) {
  ASSERT_NO_FATAL_FAILURE(StartIdemd());
  const HttpResponse alice =
      Charge("shared-key", R"({"account":"alice","amount":1})", {{"Authorization", "Bearer a"}});
  const HttpResponse bob =
      Charge("shared-key", R"({"account":"bob","amount":2})", {{"Authorization", "Bearer b"}});
  EXPECT_EQ(alice.status, 201);
  EXPECT_EQ(bob.status, 201);  // not 422: a different principal's key
  EXPECT_FALSE(bob.HasHeader("Idempotent-Replayed"));
  EXPECT_THAT(bob.body, HasSubstr("bob"));
  const HttpResponse alice_again =
      Charge("shared-key", R"({"account":"alice","amount":1})", {{"Authorization", "Bearer a"}});
  EXPECT_EQ(alice_again.body, alice.body);
  EXPECT_EQ(LedgerCharges(), 2);
}

// With principal_secret_file a principal's scope is an HMAC under the secret: the same secret
// finds a key stored before a restart; another secret does not, so the retry runs again (the
// documented price of changing it).
TEST_F(GatewayTest, ThePrincipalSecretKeysTheScopeAcrossRestarts) {
  store_url_ = "log:" + (dir_ / "store").string() + "?sync=always";
  const std::string secret = SecretFile("secret", "first secret, long enough");
  const std::string other = SecretFile("other-secret", "second secret, long enough");
  const HttpHeaders alice{{"Authorization", "Bearer a"}};
  ASSERT_NO_FATAL_FAILURE(StartIdemd({"--principal-secret-file", secret}));
  EXPECT_EQ(Charge("secret-1", kCharge, alice).status, 201);
  idemd_.reset();
  ASSERT_NO_FATAL_FAILURE(StartIdemd({"--principal-secret-file", secret}));
  EXPECT_EQ(Charge("secret-1", kCharge, alice).Header("Idempotent-Replayed"), "true");
  EXPECT_EQ(LedgerCharges(), 1);
  idemd_.reset();
  ASSERT_NO_FATAL_FAILURE(StartIdemd({"--principal-secret-file", other}));
  const HttpResponse again = Charge("secret-1", kCharge, alice);
  EXPECT_EQ(again.status, 201);
  EXPECT_FALSE(again.HasHeader("Idempotent-Replayed"));
  EXPECT_EQ(LedgerCharges(), 2);
}

// Rotating the secret (docs/gateway.md): with the old one as principal_secret_secondary_file, a
// key stored under the old secret's scope is answered from there (replay, 422 for another
// payload) and not run again; new keys are stored under the new secret. The way in from the
// plain hash uses "plain". Only dropping the secondary forgets the old scopes.
TEST_F(GatewayTest, ARotatedSecretStillAnswersKeysStoredUnderThePreviousOne) {
  store_url_ = "log:" + (dir_ / "store").string() + "?sync=always";
  const std::string first = SecretFile("first-secret", "first secret, long enough");
  const std::string second = SecretFile("second-secret", "second secret, long enough");
  const HttpHeaders alice{{"Authorization", "Bearer a"}};
  const std::string other_charge = R"({"account":"alice","amount":2})";

  ASSERT_NO_FATAL_FAILURE(StartIdemd());  // the plain hash
  const HttpResponse plain = Charge("rot-plain", kCharge, alice);
  EXPECT_EQ(plain.status, 201);
  idemd_.reset();
  ASSERT_NO_FATAL_FAILURE(
      StartIdemd({"--principal-secret-file", first, "--principal-secret-secondary-file", "plain"}));
  const HttpResponse from_plain = Charge("rot-plain", kCharge, alice);
  EXPECT_EQ(from_plain.Header("Idempotent-Replayed"), "true");
  EXPECT_EQ(from_plain.body, plain.body);
  EXPECT_EQ(Charge("rot-1", kCharge, alice).status, 201);  // stored under the first secret
  EXPECT_EQ(Charge("rot-2", kCharge, alice).status, 201);
  EXPECT_EQ(LedgerCharges(), 3);

  idemd_.reset();
  ASSERT_NO_FATAL_FAILURE(
      StartIdemd({"--principal-secret-file", second, "--principal-secret-secondary-file", first}));
  EXPECT_EQ(Charge("rot-1", kCharge, alice).Header("Idempotent-Replayed"), "true");
  EXPECT_EQ(Charge("rot-2", other_charge, alice).status, 422);  // another payload: key reuse
  EXPECT_EQ(Charge("rot-3", kCharge, alice).status, 201);       // new: under the second secret
  EXPECT_EQ(Charge("rot-3", kCharge, alice).Header("Idempotent-Replayed"), "true");
  // The replayed key was released under the second secret's scope: it still answers from the
  // first's, and another principal's use of the key is its own.
  EXPECT_EQ(Charge("rot-1", kCharge, alice).Header("Idempotent-Replayed"), "true");
  EXPECT_EQ(Charge("rot-1", kCharge, {{"Authorization", "Bearer b"}}).status, 201);
  EXPECT_EQ(LedgerCharges(), 5);
  // What the lookups found, for deciding when the secondary has stopped mattering.
  auto metrics = HttpRequest(admin_port_, "GET", "/metrics");
  ASSERT_TRUE(metrics.has_value());
  EXPECT_THAT(metrics->body,
              HasSubstr("idemd_secondary_scope_lookups_total{result=\"replayed\"} 2\n"));
  EXPECT_THAT(metrics->body,
              HasSubstr("idemd_secondary_scope_lookups_total{result=\"key_reuse\"} 1\n"));
  EXPECT_THAT(metrics->body,
              HasSubstr("idemd_secondary_scope_lookups_total{result=\"absent\"} 2\n"));
  EXPECT_THAT(metrics->body,
              HasSubstr("idemd_secondary_scope_lookups_total{result=\"in_flight\"} 0\n"));

  idemd_.reset();
  ASSERT_NO_FATAL_FAILURE(StartIdemd({"--principal-secret-file", second}));
  EXPECT_EQ(Charge("rot-3", kCharge, alice).Header("Idempotent-Replayed"), "true");
  const HttpResponse forgotten = Charge("rot-2", kCharge, alice);
  EXPECT_EQ(forgotten.status, 201);  // the first secret's scopes are no longer looked up
  EXPECT_FALSE(forgotten.HasHeader("Idempotent-Replayed"));
  EXPECT_EQ(LedgerCharges(), 6);
  metrics = HttpRequest(admin_port_, "GET", "/metrics");
  ASSERT_TRUE(metrics.has_value());
  EXPECT_THAT(metrics->body,
              HasSubstr("idemd_secondary_scope_lookups_total{result=\"absent\"} 0\n"));
  EXPECT_THAT(metrics->body,
              HasSubstr("idemd_secondary_scope_lookups_total{result=\"replayed\"} 0\n"));
}

// Without a credential every client lands in the route's one anonymous scope (anonymous =
// "shared", the default): a second credential-less client with the same key gets the first's
// answer. anonymous = "refuse" answers such a request 400 without calling the upstream.
TEST_F(GatewayTest, RequestsWithoutAPrincipalShareOneScopeUnlessTheRouteRefusesThem) {
  ASSERT_NO_FATAL_FAILURE(StartIdemd());
  const HttpResponse first = Charge("anon-1");
  EXPECT_EQ(first.status, 201);
  const HttpResponse other = Charge("anon-1", kCharge, {{"Authorization", ""}});
  EXPECT_EQ(other.Header("Idempotent-Replayed"), "true");  // shared: documented, not separated
  EXPECT_EQ(LedgerCharges(), 1);

  const std::string config =
      WriteConfig("[[route]]\nprefix = \"/charges\"\nanonymous = \"refuse\"\n");
  idemd_.reset();
  ASSERT_NO_FATAL_FAILURE(StartIdemd({"--config", config}));
  for (const HttpHeaders& principal : {HttpHeaders{}, HttpHeaders{{"Authorization", ""}}}) {
    const HttpResponse refused = Charge("anon-2", kCharge, principal);
    EXPECT_EQ(refused.status, 400);
    EXPECT_EQ(refused.Header("Content-Type"), "application/problem+json");
    EXPECT_THAT(refused.body, HasSubstr("missing-principal"));
  }
  EXPECT_EQ(LedgerCharges(), 1);  // the upstream was not called
  EXPECT_EQ(Charge("anon-2", kCharge, {{"Authorization", "Bearer a"}}).status, 201);
  EXPECT_EQ(LedgerCharges(), 2);
}

// max_header_bytes (16 KiB by default) bounds the whole header block however it arrives, and
// 414 means the request line alone is over it.
TEST_F(GatewayTest, TheHeaderLimitIsTheWholeBlocksAnd414IsTheRequestLinesAlone) {
  ASSERT_NO_FATAL_FAILURE(StartIdemd({}));
  int n = 0;
  const auto send = [&](std::size_t target_bytes, std::size_t filler_bytes) {
    auto c = HttpConnection::Connect("127.0.0.1", port_, 3s);
    EXPECT_TRUE(c.has_value());
    if (!c) return 0;
    const std::string request =
        "POST /charges?" + std::string(target_bytes, 'q') +
        " HTTP/1.1\r\nHost: x\r\nIdempotency-Key: hl-" + std::to_string(++n) +
        "\r\nX-Filler: " + std::string(filler_bytes, 'f') +
        "\r\nContent-Length: " + std::to_string(kCharge.size()) + "\r\n\r\n" + std::string(kCharge);
    EXPECT_TRUE(c->RawSend(request).ok());
    auto r = c->ReadResponse();
    EXPECT_TRUE(r.has_value()) << r.status().ToString();
    return r ? r->status : 0;
  };
  EXPECT_EQ(send(3000, 4000), 201);   // 7 KiB in all (the example upstream takes 8)
  EXPECT_EQ(send(3000, 14000), 431);  // ~17 KiB: over, though it may arrive in one read
  EXPECT_EQ(send(5000, 12000), 431);  // the line alone is under the limit
  EXPECT_EQ(send(17000, 10), 414);
  EXPECT_EQ(send(40000, 10), 414);
}

TEST_P(GatewayStoresTest, BadRequestsGetTheirStatusAndOthersAreStillServed) {
  ASSERT_NO_FATAL_FAILURE(StartIdemd(
      {"--max-body-bytes", "1024", "--max-header-bytes", "2048", "--client-timeout", "1s"}));
  // A slow client that never finishes its headers holds no thread.
  auto slow = HttpConnection::Connect("127.0.0.1", port_);
  ASSERT_TRUE(slow.has_value());
  ASSERT_TRUE(slow->RawSend("POST /charges HTTP/1.1\r\nHost: x\r\nIdempotency-Key: s").ok());

  EXPECT_EQ(Charge("big", std::string(2000, ' ') + std::string(kCharge)).status, 413);
  EXPECT_EQ(Charge("hdr", kCharge, {{"X-Filler", std::string(4000, 'x')}}).status, 431);
  // A request line longer than the whole header limit: its target is what is too long.
  auto long_target = HttpConnection::Connect("127.0.0.1", port_);
  ASSERT_TRUE(long_target.has_value());
  ASSERT_TRUE(long_target
                  ->RawSend("POST /charges?" + std::string(4000, 'q') +
                            " HTTP/1.1\r\nHost: x\r\nIdempotency-Key: long-target\r\n"
                            "Content-Length: 2\r\n\r\n{}")
                  .ok());
  auto long_target_answer = long_target->ReadResponse();
  ASSERT_TRUE(long_target_answer.has_value()) << long_target_answer.status().ToString();
  EXPECT_EQ(long_target_answer->status, 414);
  auto garbage = HttpConnection::Connect("127.0.0.1", port_);
  ASSERT_TRUE(garbage.has_value());
  ASSERT_TRUE(garbage->RawSend("NOT HTTP AT ALL\r\n\r\n").ok());
  auto garbage_answer = garbage->ReadResponse();
  ASSERT_TRUE(garbage_answer.has_value()) << garbage_answer.status().ToString();
  EXPECT_EQ(garbage_answer->status, 400);
  // Not HTTP is a problem of its own, not one of the body's.
  EXPECT_THAT(garbage_answer->body,
              HasSubstr("\"type\":\"https://idem.dev/problems/malformed-request\""));
  EXPECT_THAT(garbage_answer->body, HasSubstr("\"title\":\"Malformed request\""));

  EXPECT_EQ(Charge("fine").status, 201);  // others are served meanwhile

  auto timed_out = slow->ReadResponse();  // client_timeout: 408, then closed
  ASSERT_TRUE(timed_out.has_value()) << timed_out.status().ToString();
  EXPECT_EQ(timed_out->status, 408);
  auto closed = slow->WaitForClose(5s);
  ASSERT_TRUE(closed.has_value());
  EXPECT_TRUE(*closed);
  EXPECT_EQ(LedgerCharges(), 1);
}

// A second idemd on a port one already listens on exits 1: its I/O threads bind with
// SO_REUSEPORT, and it used to join the first one's port, each with its own store, so that a
// client's retry landing on the other process ran the upstream again.
TEST_F(GatewayTest, ASecondIdemdOnAPortInUseExits1) {
  ASSERT_NO_FATAL_FAILURE(StartIdemd());
  std::vector<std::string> args = BaseArgs();
  args.insert(args.end(), {"--listen", "127.0.0.1:" + std::to_string(port_), "--store", "memory:"});
  auto second = ChildProcess::Spawn(IDEMD_PATH, args);
  ASSERT_TRUE(second.has_value()) << second.status().ToString();
  auto code = second->Wait(20s);
  ASSERT_TRUE(code.has_value()) << code.status().ToString();
  EXPECT_EQ(*code, 1) << second->Stderr();
  EXPECT_THAT(second->Stderr(), HasSubstr("another process listens there"));
  EXPECT_EQ(Charge("k-1").status, 201);  // the first one serves on
}

TEST_F(GatewayTest, AdminServesMetricsHealthAndReadiness) {
  ASSERT_NO_FATAL_FAILURE(StartIdemd());
  ASSERT_EQ(Charge("m-1").status, 201);
  ASSERT_EQ(Charge("m-1").status, 201);
  auto health = HttpRequest(admin_port_, "GET", "/healthz");
  ASSERT_TRUE(health.has_value());
  EXPECT_EQ(health->status, 200);
  auto ready = HttpRequest(admin_port_, "GET", "/readyz");
  ASSERT_TRUE(ready.has_value());
  EXPECT_EQ(ready->status, 200);
  auto metrics = HttpRequest(admin_port_, "GET", "/metrics");
  ASSERT_TRUE(metrics.has_value());
  EXPECT_THAT(metrics->body,
              HasSubstr("idemd_requests_total{route=\"-\",outcome=\"forwarded\"} 1"));
  EXPECT_THAT(metrics->body, HasSubstr("idemd_requests_total{route=\"-\",outcome=\"replayed\"} 1"));
  EXPECT_THAT(metrics->body, HasSubstr("idem_begin_total{scope=\"gateway\",answer=\"replay\"} 1"));
  EXPECT_THAT(metrics->body, HasSubstr("idemd_request_seconds_bucket"));
  // SPEC §7's gauges of the store's contents, read once at start (then every 30 s).
  EXPECT_THAT(metrics->body, HasSubstr("# TYPE idem_records gauge\n"));
  EXPECT_THAT(metrics->body, HasSubstr("idem_records{state=\"completed\"} "));
  EXPECT_THAT(metrics->body, HasSubstr("# TYPE idem_store_bytes gauge\n"));
  EXPECT_THAT(metrics->body, Not(HasSubstr("idem_store_stats_refresh_timestamp_seconds 0\n")));
}

TEST_F(GatewayTest, KillNineAfterTheUpstreamAnsweredThenARetryReplays) {
  store_url_ = "log:" + (dir_ / "store").string() + "?sync=always";
  ASSERT_NO_FATAL_FAILURE(StartIdemd());
  // The client sends and never reads the answer; idemd is killed once the ledger has the
  // charge and has had time to store the outcome.
  auto client = HttpConnection::Connect("127.0.0.1", port_);
  ASSERT_TRUE(client.has_value());
  ASSERT_TRUE(client
                  ->RawSend("POST /charges HTTP/1.1\r\nHost: x\r\nIdempotency-Key: crash-1\r\n"
                            "Content-Type: application/json\r\nContent-Length: " +
                            std::to_string(kCharge.size()) + "\r\n\r\n" + std::string(kCharge))
                  .ok());
  for (int i = 0; i < 500 && LedgerCharges() < 1; ++i) std::this_thread::sleep_for(10ms);
  ASSERT_EQ(LedgerCharges(), 1);
  std::this_thread::sleep_for(200ms);
  ASSERT_TRUE(idemd_->Kill(SIGKILL).ok());
  ASSERT_TRUE(idemd_->Wait(10s).has_value());
  idemd_.reset();

  ASSERT_NO_FATAL_FAILURE(StartIdemd());
  const HttpResponse retry = Charge("crash-1");
  EXPECT_EQ(retry.status, 201) << retry.body;
  EXPECT_EQ(retry.Header("Idempotent-Replayed"), "true");
  EXPECT_EQ(LedgerCharges(), 1);
}

// kill -9 at random moments around the upstream call: whatever the moment, a retry never
// charges twice while the lease runs (it replays, or is told the first is still in flight).
TEST_F(GatewayTest, KillNineAtRandomMomentsNeverChargesTwice) {
  store_url_ = "log:" + (dir_ / "store").string() + "?sync=always";
  std::mt19937 rng(std::random_device{}());
  for (int round = 0; round < 5; ++round) {
    ASSERT_NO_FATAL_FAILURE(StartIdemd());
    const std::string key = "crash-r" + std::to_string(round);
    const int before = LedgerCharges();
    auto client = HttpConnection::Connect("127.0.0.1", port_);
    ASSERT_TRUE(client.has_value());
    ASSERT_TRUE(client
                    ->RawSend("POST /charges HTTP/1.1\r\nHost: x\r\nIdempotency-Key: " + key +
                              "\r\nContent-Type: application/json\r\nContent-Length: " +
                              std::to_string(kCharge.size()) + "\r\n\r\n" + std::string(kCharge))
                    .ok());
    std::this_thread::sleep_for(std::chrono::microseconds(rng() % 20'000));
    ASSERT_TRUE(idemd_->Kill(SIGKILL).ok());
    ASSERT_TRUE(idemd_->Wait(10s).has_value());
    idemd_.reset();
    const int after_crash = LedgerCharges();
    ASSERT_NO_FATAL_FAILURE(StartIdemd());
    const HttpResponse retry = Charge(key);
    // Killed before the key was taken: the retry runs (201). Killed while the first was in
    // flight: 409 until its lease ends. Killed after it completed: a replay (201 + header).
    EXPECT_THAT(retry.status, AnyOf(201, 409)) << retry.body;
    if (after_crash > before && retry.status == 201) {
      EXPECT_EQ(retry.Header("Idempotent-Replayed"), "true");
    }
    std::this_thread::sleep_for(100ms);
    EXPECT_LE(LedgerCharges(), before + 1) << "round " << round;
    ASSERT_TRUE(idemd_->Kill(SIGTERM).ok());
    ASSERT_TRUE(idemd_->Wait(20s).has_value());
    idemd_.reset();
  }
}

TEST_F(GatewayTest, SigtermFinishesRequestsInFlightAndExitsZero) {
  ASSERT_NO_FATAL_FAILURE(StartIdemd());
  std::thread slow([&] {
    const HttpResponse r = Charge("drain-1", kCharge, {{"X-Ledger-Delay-Ms", "700"}});
    EXPECT_EQ(r.status, 201);
    // Draining began while it was in flight: its keep-alive connection ends with it.
    EXPECT_EQ(r.Header("Connection"), "close");
  });
  std::this_thread::sleep_for(200ms);
  ASSERT_TRUE(idemd_->Kill(SIGTERM).ok());
  slow.join();
  auto status = idemd_->Wait(20s);
  ASSERT_TRUE(status.has_value());
  EXPECT_EQ(*status, 0) << idemd_->Stderr();
  idemd_.reset();
  EXPECT_EQ(LedgerCharges(), 1);
}

TEST_F(GatewayTest, SigtermReleasesKeysWhoseUpstreamDoesNotAnswerInTime) {
  store_url_ = "log:" + (dir_ / "store").string() + "?sync=always";
  ASSERT_NO_FATAL_FAILURE(StartIdemd({"--shutdown-grace", "200ms"}));
  std::thread slow([&] {
    auto r = HttpRequest(port_, "POST", "/charges",
                         {{"Idempotency-Key", "drain-2"}, {"X-Ledger-Delay-Ms", "5000"}}, kCharge);
    if (r) {
      EXPECT_NE(r->status, 201);
    }
  });
  std::this_thread::sleep_for(300ms);
  ASSERT_TRUE(idemd_->Kill(SIGTERM).ok());
  auto status = idemd_->Wait(20s);
  slow.join();
  ASSERT_TRUE(status.has_value());
  EXPECT_EQ(*status, 0);
  idemd_.reset();
  ASSERT_NO_FATAL_FAILURE(StartIdemd());
  // Released: the retry runs (201, attempt 2), it is not held as in flight until the lease ends.
  const HttpResponse retry = Charge("drain-2");
  EXPECT_EQ(retry.status, 201) << retry.body;
  EXPECT_FALSE(retry.HasHeader("Idempotent-Replayed"));
}

TEST_P(GatewayStoresTest, StoredBodyLimitCompletesTheKeyAndReplaysAClearError) {
  ASSERT_NO_FATAL_FAILURE(StartIdemd({"--max-stored-body-bytes", "16"}));
  const HttpResponse first = Charge("big-answer");
  EXPECT_EQ(first.status, 201);  // the client that caused it gets the whole body
  const HttpResponse retry = Charge("big-answer");
  EXPECT_EQ(retry.status, 502);
  EXPECT_EQ(retry.Header("Idempotent-Replayed"), "true");
  EXPECT_EQ(retry.Header("Content-Type"), "application/problem+json");
  EXPECT_EQ(LedgerCharges(), 1);
}

TEST(IdemdCommandLine, BadConfigExitsTwoNamingFileLineAndOption) {
  const auto dir = MakeTempDir();
  const auto path = (dir / "bad.toml").string();
  std::ofstream(path) << "listen = \"127.0.0.1:0\"\nmax_body_bytes = \"lots\"\n";
  auto child = ChildProcess::Spawn(IDEMD_PATH, {"--config", path});
  ASSERT_TRUE(child.has_value());
  auto status = child->Wait(20s);
  ASSERT_TRUE(status.has_value());
  EXPECT_EQ(*status, 2);
  EXPECT_THAT(child->Stderr(), HasSubstr(path + ":2"));
  EXPECT_THAT(child->Stderr(), HasSubstr("max_body_bytes"));
  std::filesystem::remove_all(dir);
}

TEST(IdemdCommandLine, HelpExitsZero) {
  auto child = ChildProcess::Spawn(IDEMD_PATH, {"--help"});
  ASSERT_TRUE(child.has_value());
  auto status = child->Wait(20s);
  ASSERT_TRUE(status.has_value());
  EXPECT_EQ(*status, 0);
  EXPECT_THAT(child->Stdout(), HasSubstr("--upstream"));
  EXPECT_THAT(child->Stdout(), HasSubstr("idemd consume"));
}

// ---- against a raw-TCP upstream, for answers the ledger never gives ----

std::string Lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

// Writes all of `bytes`; errors are ignored (the peer may be gone, which is the test's to see).
void SendAll(int fd, std::string_view bytes) {
  while (!bytes.empty()) {
    const ssize_t n = ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    if (n <= 0) return;
    bytes.remove_prefix(static_cast<std::size_t>(n));
  }
}

std::string Created(std::string_view body) {
  return "HTTP/1.1 201 Created\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n" +
         std::string(body);
}

// An upstream on 127.0.0.1 that reads each request (headers, then a Content-Length body) and
// lets `answer` write whatever bytes it likes on the connection; `answer` returns whether to
// keep the connection for a next request. Requests are kept as received. Its listen backlog is
// 0, and one built with `kHoldAccepts` accepts nothing until AcceptFrom's time, so a test can
// hold a connect back: once one connection is queued, the kernel drops further SYNs and the
// client sends its SYN again a second later.
class FakeUpstream {
 public:
  using Answer = std::function<bool(int fd, const std::string& request)>;
  static constexpr bool kHoldAccepts = true;

  explicit FakeUpstream(Answer answer, bool hold_accepts = false)
      : answer_(std::move(answer)),
        accept_from_(hold_accepts ? std::chrono::steady_clock::time_point::max().time_since_epoch()
                                  : std::chrono::steady_clock::duration::zero()) {
    listener_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof addr;
    auto* sa = reinterpret_cast<sockaddr*>(&addr);
    if (::bind(listener_, sa, len) != 0 || ::listen(listener_, 0) != 0 ||
        ::getsockname(listener_, sa, &len) != 0) {
      ADD_FAILURE() << "fake upstream: cannot listen: " << std::strerror(errno);
    }
    port_ = ntohs(addr.sin_port);
    acceptor_ = std::thread([this] { Accept(); });
  }
  FakeUpstream(const FakeUpstream&) = delete;
  FakeUpstream& operator=(const FakeUpstream&) = delete;
  ~FakeUpstream() {
    stop_ = true;
    acceptor_.join();
    for (std::thread& t : connections_) t.join();
    ::close(listener_);
  }

  std::uint16_t port() const { return port_; }
  // A held upstream starts accepting at `t`.
  void AcceptFrom(std::chrono::steady_clock::time_point t) { accept_from_ = t.time_since_epoch(); }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  std::vector<std::string> requests() const {
    std::lock_guard lock(mu_);
    return requests_;
  }

 private:
  void Accept() {
    while (!stop_) {
      if (std::chrono::steady_clock::now().time_since_epoch() < accept_from_.load()) {
        std::this_thread::sleep_for(5ms);
        continue;
      }
      pollfd p{listener_, POLLIN, 0};
      if (::poll(&p, 1, 20) <= 0) continue;
      const int fd = ::accept(listener_, nullptr, nullptr);
      if (fd >= 0) connections_.emplace_back([this, fd] { Serve(fd); });
    }
  }

  void Serve(int fd) {
    std::string buffer;
    bool open = true;
    while (open && !stop_) {
      if (const std::size_t size = RequestSize(buffer); size > 0) {
        const std::string request = buffer.substr(0, size);
        buffer.erase(0, size);
        {
          std::lock_guard lock(mu_);
          requests_.push_back(request);
        }
        open = answer_(fd, request);
        continue;
      }
      pollfd p{fd, POLLIN, 0};
      if (::poll(&p, 1, 20) <= 0) continue;
      char bytes[4096];
      const ssize_t n = ::recv(fd, bytes, sizeof bytes, 0);
      if (n <= 0) break;
      buffer.append(bytes, static_cast<std::size_t>(n));
    }
    ::close(fd);
  }

  // The size of the first complete request in `buffer`, 0 if it has not all arrived.
  static std::size_t RequestSize(const std::string& buffer) {
    const std::size_t end = buffer.find("\r\n\r\n");
    if (end == std::string::npos) return 0;
    const std::string head = Lower(buffer.substr(0, end + 2));
    const std::size_t length = head.find("\r\ncontent-length:");
    const std::size_t body =
        length == std::string::npos ? 0 : std::strtoul(head.c_str() + length + 17, nullptr, 10);
    return buffer.size() < end + 4 + body ? 0 : end + 4 + body;
  }

  Answer answer_;
  // Steady-clock time (since its epoch) from which connections are accepted.
  std::atomic<std::chrono::steady_clock::duration> accept_from_;
  int listener_ = -1;
  std::uint16_t port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread acceptor_;
  std::vector<std::thread> connections_;  // touched by the acceptor only, until it is joined
  mutable std::mutex mu_;
  std::vector<std::string> requests_;
};

// The value of header `name` (lowercase) in a raw request, "" if absent.
std::string HeaderIn(const std::string& request, std::string_view name) {
  const std::string lower = Lower(request);
  const std::string at = "\r\n" + std::string(name) + ":";
  const std::size_t start = lower.find(at);
  if (start == std::string::npos) return "";
  const std::size_t value = request.find_first_not_of(' ', start + at.size());
  return request.substr(value, request.find("\r\n", value) - value);
}

// One request on a fresh connection, with a timeout short enough that a missing answer fails
// the test quickly.
HttpResponse Post(std::uint16_t port, std::string_view target, const HttpHeaders& headers,
                  std::string_view body = "{}") {
  auto r = HttpRequest(port, "POST", target, headers, body, 3s);
  EXPECT_TRUE(r.has_value()) << r.status().ToString();
  return r.has_value() ? *r : HttpResponse{};
}

// 103 Early Hints, then the final answer 50 ms later: the client and its retries get the final
// one, and the next request on the pooled connection gets its own answer, not a leftover.
TEST_F(GatewayTest, InterimUpstreamAnswersAreDroppedAndTheFinalOneIsStored) {
  FakeUpstream upstream([](int fd, const std::string& request) {
    SendAll(fd, "HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n");
    std::this_thread::sleep_for(50ms);
    SendAll(fd, Created(HeaderIn(request, "idempotency-key")));
    return true;
  });
  ASSERT_NO_FATAL_FAILURE(StartIdemd({"--upstream", upstream.url(), "--threads", "1"}));
  // The whole body is sent at once: idemd has it before it calls the upstream, so the upstream
  // is not asked to say 100 Continue.
  const HttpResponse first =
      Post(port_, "/charges", {{"Idempotency-Key", "k1"}, {"Expect", "100-continue"}});
  EXPECT_EQ(first.status, 201);
  EXPECT_EQ(first.body, "k1");
  const HttpResponse retry = Post(port_, "/charges", {{"Idempotency-Key", "k1"}});
  EXPECT_EQ(retry.status, 201);
  EXPECT_EQ(retry.body, "k1");
  EXPECT_EQ(retry.Header("Idempotent-Replayed"), "true");
  const HttpResponse other = Post(port_, "/charges", {{"Idempotency-Key", "k2"}});
  EXPECT_EQ(other.status, 201);
  EXPECT_EQ(other.body, "k2");
  EXPECT_FALSE(other.HasHeader("Idempotent-Replayed"));

  const std::vector<std::string> seen = upstream.requests();
  ASSERT_EQ(seen.size(), 2u);
  for (const std::string& r : seen) EXPECT_EQ(HeaderIn(r, "expect"), "") << r;
}

// An upstream that closes every connection right after its answer, without saying so: the
// next request finds its pooled connection closed. A GET (idempotent, no key) is sent again on
// a new connection; a keyed POST is not (the upstream might have acted): 502, key released.
TEST_F(GatewayTest, AnIdempotentRequestOnAPooledConnectionTheUpstreamClosedIsSentAgain) {
  FakeUpstream upstream([](int fd, const std::string&) {
    SendAll(fd, Created("ok"));
    return false;  // close, though the answer said keep-alive
  });
  ASSERT_NO_FATAL_FAILURE(StartIdemd({"--upstream", upstream.url(), "--threads", "1"}));
  for (int i = 0; i < 3; ++i) {
    auto got = HttpRequest(port_, "GET", "/charges/1", {}, "", 3s);
    ASSERT_TRUE(got.has_value()) << got.status().ToString();
    EXPECT_EQ(got->status, 201) << i << ": " << got->body;
    std::this_thread::sleep_for(20ms);  // the upstream's close has arrived; well within 200 ms
  }
  EXPECT_EQ(upstream.requests().size(), 3u);

  const HttpResponse keyed = Post(port_, "/charges", {{"Idempotency-Key", "p1"}});
  EXPECT_EQ(keyed.status, 502) << keyed.body;
  EXPECT_EQ(upstream.requests().size(), 3u);  // not sent again
  const HttpResponse retry = Post(port_, "/charges", {{"Idempotency-Key", "p1"}});
  EXPECT_EQ(retry.status, 201) << retry.body;  // released: the client's retry runs
  auto metrics = HttpRequest(admin_port_, "GET", "/metrics");
  ASSERT_TRUE(metrics.has_value());
  EXPECT_THAT(metrics->body, HasSubstr("idemd_upstream_retries_total 2\n"));
}

// 101 hands the connection over to another protocol, which a proxy that stores answers cannot
// relay: an upstream error, so the key is released.
TEST_F(GatewayTest, UpstreamSwitchingProtocolsIs502AndReleasesTheKey) {
  std::atomic<bool> upgrade{true};
  FakeUpstream upstream([&](int fd, const std::string&) {
    if (!upgrade) {
      SendAll(fd, Created("ok"));
      return true;
    }
    SendAll(fd, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: x\r\n\r\n");
    return false;
  });
  ASSERT_NO_FATAL_FAILURE(StartIdemd({"--upstream", upstream.url()}));
  const HttpResponse switched = Post(port_, "/charges", {{"Idempotency-Key", "u1"}});
  EXPECT_EQ(switched.status, 502);
  EXPECT_EQ(switched.Header("Content-Type"), "application/problem+json");
  upgrade = false;
  const HttpResponse retry = Post(port_, "/charges", {{"Idempotency-Key", "u1"}});
  EXPECT_EQ(retry.status, 201);
  EXPECT_FALSE(retry.HasHeader("Idempotent-Replayed"));
}

// "Retry later" answers (429 here; 408, 409, 425 likewise) are not stored by default: a client
// obeying Retry-After reaches the upstream again instead of getting the 429 replayed.
TEST_F(GatewayTest, ARetryAfterAnUpstream429ReachesTheUpstream) {
  std::atomic<int> calls{0};
  FakeUpstream upstream([&](int fd, const std::string&) {
    if (calls++ == 0) {
      SendAll(fd,
              "HTTP/1.1 429 Too Many Requests\r\nRetry-After: 0\r\nContent-Length: 4\r\n\r\n"
              "slow");
    } else {
      SendAll(fd, Created("ok"));
    }
    return true;
  });
  ASSERT_NO_FATAL_FAILURE(StartIdemd({"--upstream", upstream.url()}));
  const HttpResponse first = Post(port_, "/charges", {{"Idempotency-Key", "r1"}});
  EXPECT_EQ(first.status, 429);
  const HttpResponse retry = Post(port_, "/charges", {{"Idempotency-Key", "r1"}});
  EXPECT_EQ(retry.status, 201);
  EXPECT_FALSE(retry.HasHeader("Idempotent-Replayed"));
  EXPECT_EQ(calls.load(), 2);
}

// RFC 9112 §3.2.2: a server must accept absolute-form; it is routed and forwarded as its path.
TEST_F(GatewayTest, AbsoluteFormTargetsAreRoutedAndForwardedAsTheirPath) {
  FakeUpstream upstream([](int fd, const std::string&) {
    SendAll(fd, Created("ok"));
    return true;
  });
  const std::string config = WriteConfig("[[route]]\nprefix = \"/charges\"\n");
  ASSERT_NO_FATAL_FAILURE(StartIdemd({"--config", config, "--upstream", upstream.url()}));
  const std::string url = "http://127.0.0.1:" + std::to_string(port_) + "/charges";
  const auto raw = [&](const std::string& request_line, std::string_view key) {
    auto c = HttpConnection::Connect("127.0.0.1", port_, 3s);
    EXPECT_TRUE(c.has_value());
    if (!c) return HttpResponse{};
    const std::string key_line = key.empty() ? "" : "Idempotency-Key: " + std::string(key) + "\r\n";
    EXPECT_TRUE(
        c->RawSend(request_line + "\r\nHost: a\r\n" + key_line + "Content-Length: 2\r\n\r\n{}")
            .ok());
    auto r = c->ReadResponse();
    EXPECT_TRUE(r.has_value()) << r.status().ToString();
    return r.has_value() ? *r : HttpResponse{};
  };

  const HttpResponse keyless = raw("POST " + url + " HTTP/1.1", "");
  EXPECT_EQ(keyless.status, 400);
  EXPECT_THAT(keyless.body, HasSubstr("missing-key"));
  EXPECT_EQ(raw("POST " + url + " HTTP/1.1", "a1").status, 201);
  const HttpResponse malformed = raw("POST http:///charges HTTP/1.1", "a2");
  EXPECT_EQ(malformed.status, 400);
  EXPECT_EQ(malformed.Header("Content-Type"), "application/problem+json");

  const std::vector<std::string> seen = upstream.requests();
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_THAT(seen[0], StartsWith("POST /charges HTTP/1.1\r\n"));
  // The same request in origin-form is the same request: a replay.
  EXPECT_EQ(Post(port_, "/charges", {{"Idempotency-Key", "a1"}}).Header("Idempotent-Replayed"),
            "true");
}

// The response's Connection headers all name hop-by-hop headers, not only the first one.
TEST_F(GatewayTest, HeadersNamedByAnyConnectionHeaderAreNeitherReturnedNorStored) {
  FakeUpstream upstream([](int fd, const std::string&) {
    SendAll(fd,
            "HTTP/1.1 201 Created\r\nConnection: keep-alive\r\nConnection: X-Internal\r\n"
            "X-Internal: 1\r\nX-Public: 2\r\nContent-Length: 2\r\n\r\nok");
    return true;
  });
  ASSERT_NO_FATAL_FAILURE(StartIdemd({"--upstream", upstream.url()}));
  const HttpResponse first = Post(port_, "/charges", {{"Idempotency-Key", "c1"}});
  EXPECT_EQ(first.status, 201);
  EXPECT_FALSE(first.HasHeader("X-Internal"));
  EXPECT_EQ(first.Header("X-Public"), "2");
  const HttpResponse replay = Post(port_, "/charges", {{"Idempotency-Key", "c1"}});
  EXPECT_EQ(replay.Header("Idempotent-Replayed"), "true");
  EXPECT_FALSE(replay.HasHeader("X-Internal"));
  EXPECT_EQ(replay.Header("X-Public"), "2");
}

// A route may list HEAD: the answer has no body but says how long a GET's would be, and its
// replay says the same, once.
TEST_F(GatewayTest, AHeadReplayKeepsTheUpstreamsContentLength) {
  FakeUpstream upstream([](int fd, const std::string&) {
    SendAll(fd, "HTTP/1.1 200 OK\r\nContent-Length: 42\r\nX-Public: 1\r\n\r\n");
    return true;
  });
  const std::string config =
      WriteConfig("[[route]]\nprefix = \"/charges\"\nmethods = [\"HEAD\"]\n");
  ASSERT_NO_FATAL_FAILURE(StartIdemd({"--config", config, "--upstream", upstream.url()}));
  const auto head = [&] {
    auto c = HttpConnection::Connect("127.0.0.1", port_, 3s);
    EXPECT_TRUE(c.has_value());
    if (!c) return HttpResponse{};
    EXPECT_TRUE(
        c->RawSend("HEAD /charges HTTP/1.1\r\nHost: a\r\nIdempotency-Key: h1\r\n\r\n").ok());
    auto r = c->ReadResponse(/*head_request=*/true);
    EXPECT_TRUE(r.has_value()) << r.status().ToString();
    return r.has_value() ? *r : HttpResponse{};
  };
  const auto lengths = [](const HttpResponse& r) {
    return std::count_if(r.headers.begin(), r.headers.end(),
                         [](const auto& h) { return Lower(h.first) == "content-length"; });
  };
  const HttpResponse first = head();
  EXPECT_EQ(first.status, 200);
  EXPECT_EQ(first.Header("Content-Length"), "42");
  const HttpResponse replay = head();
  EXPECT_EQ(replay.status, 200);
  EXPECT_EQ(replay.Header("Idempotent-Replayed"), "true");
  EXPECT_EQ(replay.Header("Content-Length"), "42");
  EXPECT_EQ(lengths(replay), 1);
  EXPECT_EQ(replay.Header("X-Public"), "1");
  EXPECT_TRUE(replay.body.empty());
  EXPECT_EQ(upstream.requests().size(), 1u);
}

// A body that runs to the close ends its connection: it must not go back to the pool, where
// the next request would be written to a closed connection.
TEST_F(GatewayTest, CloseDelimitedUpstreamAnswersAreNotPooled) {
  FakeUpstream upstream([](int fd, const std::string&) {
    SendAll(fd, "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nhello");
    return false;
  });
  ASSERT_NO_FATAL_FAILURE(StartIdemd({"--upstream", upstream.url(), "--threads", "1"}));
  for (int i = 0; i < 3; ++i) {
    auto r = HttpRequest(port_, "GET", "/things", {}, {}, 3s);
    ASSERT_TRUE(r.has_value()) << r.status().ToString();
    EXPECT_EQ(r->status, 200) << i << ": " << r->body;
    EXPECT_EQ(r->body, "hello") << i;
  }
}

// One deadline covers the connect, the write and the read. The upstream holds the connect back
// for about a second (its backlog is full until it accepts a filler connection 500 ms after
// the request is sent), then answers 1.2 s after the request: 2.2 s in all, over the 1.5 s
// upstream_timeout, though each step alone is within it. (The 500 ms count from the request,
// not from the upstream's start: an idemd slow to start, under ASan on a loaded machine, once
// let the filler be accepted first, and the connect went through at once.)
TEST_F(GatewayTest, UpstreamTimeoutBoundsTheWholeCallConnectIncluded) {
  FakeUpstream upstream(
      [](int fd, const std::string&) {
        std::this_thread::sleep_for(1200ms);
        SendAll(fd, Created("late"));
        return true;
      },
      FakeUpstream::kHoldAccepts);
  auto filler = HttpConnection::Connect("127.0.0.1", upstream.port());
  ASSERT_TRUE(filler.has_value());
  ASSERT_NO_FATAL_FAILURE(
      StartIdemd({"--upstream", upstream.url(), "--upstream-timeout", "1500ms"}));
  const auto t0 = std::chrono::steady_clock::now();
  upstream.AcceptFrom(t0 + 500ms);
  const HttpResponse r = Post(port_, "/charges", {{"Idempotency-Key", "t1"}});
  EXPECT_EQ(r.status, 504) << r.body;
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 2s);
}

// A TRACE request must not have content (RFC 9110 §9.3.8): a 400, not an exception that
// drops the connection and leaves the request counted as in flight, so SIGTERM exits at once.
TEST_F(GatewayTest, TraceWithContentIs400AndSigtermStillExitsPromptly) {
  ASSERT_NO_FATAL_FAILURE(StartIdemd({"--shutdown-grace", "3s"}));
  auto c = HttpConnection::Connect("127.0.0.1", port_, 3s);
  ASSERT_TRUE(c.has_value());
  ASSERT_TRUE(c->RawSend("TRACE /x HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n\r\nabc").ok());
  auto r = c->ReadResponse();
  ASSERT_TRUE(r.has_value()) << r.status().ToString();
  EXPECT_EQ(r->status, 400);
  EXPECT_EQ(r->Header("Content-Type"), "application/problem+json");
  c->Close();

  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(idemd_->Kill(SIGTERM).ok());
  auto status = idemd_->Wait(20s);
  ASSERT_TRUE(status.has_value());
  EXPECT_EQ(*status, 0);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 2s) << idemd_->Stderr();
  idemd_.reset();
}

// A raw connection to 127.0.0.1:port, for exchanges HttpConnection does not expose (reading
// an interim answer before sending the body); -1 on failure.
int ConnectRaw(std::uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(port);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// What arrives on `fd` within `wait`, up to the first time `until` is in it (or the close).
std::string ReadUntil(int fd, std::string_view until, std::chrono::milliseconds wait) {
  std::string got;
  const auto deadline = std::chrono::steady_clock::now() + wait;
  while (got.find(until) == std::string::npos) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left <= 0ms) break;
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) break;
    char buf[4096];
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    got.append(buf, static_cast<std::size_t>(n));
  }
  return got;
}

// A client that sends Expect: 100-continue holds its body back until idemd says to go on;
// one whose body is over the limit is refused on its header alone.
TEST_F(GatewayTest, AnExpectContinueClientIsToldToGoOnUnlessItsBodyIsTooLarge) {
  ASSERT_NO_FATAL_FAILURE(StartIdemd({"--max-body-bytes", "1024"}));
  const std::string body(kCharge);
  const int fd = ConnectRaw(port_);
  ASSERT_GE(fd, 0);
  SendAll(fd,
          "POST /charges HTTP/1.1\r\nHost: a\r\nIdempotency-Key: expect-1\r\n"
          "Content-Type: application/json\r\nExpect: 100-continue\r\nContent-Length: " +
              std::to_string(body.size()) + "\r\n\r\n");
  EXPECT_EQ(ReadUntil(fd, "\r\n\r\n", 900ms), "HTTP/1.1 100 Continue\r\n\r\n");
  SendAll(fd, body);
  EXPECT_THAT(ReadUntil(fd, "idempotency_key", 5s), StartsWith("HTTP/1.1 201 "));
  ::close(fd);
  EXPECT_EQ(LedgerCharges(), 1);

  const int big = ConnectRaw(port_);
  ASSERT_GE(big, 0);
  SendAll(big,
          "POST /charges HTTP/1.1\r\nHost: a\r\nIdempotency-Key: expect-2\r\n"
          "Expect: 100-continue\r\nContent-Length: 5000\r\n\r\n");
  EXPECT_THAT(ReadUntil(big, "\r\n\r\n", 900ms), StartsWith("HTTP/1.1 413 "));
  ::close(big);
  EXPECT_EQ(LedgerCharges(), 1);

  // Its headers already fail (no key where the route requires one): the error, not 100.
  const int keyless = ConnectRaw(port_);
  ASSERT_GE(keyless, 0);
  SendAll(keyless,
          "POST /charges HTTP/1.1\r\nHost: a\r\nContent-Type: application/json\r\n"
          "Expect: 100-continue\r\nContent-Length: " +
              std::to_string(body.size()) + "\r\n\r\n");
  const std::string refused = ReadUntil(keyless, "missing-key", 900ms);
  EXPECT_THAT(refused, StartsWith("HTTP/1.1 400 "));
  EXPECT_THAT(refused, HasSubstr("Connection: close\r\n"));
  ::close(keyless);
  EXPECT_EQ(LedgerCharges(), 1);
}

// Once SIGTERM has cancelled the upstream calls, a waiting duplicate that takes the released
// key must not call the upstream on a connection nothing cancels (idemd would stop with that
// call abandoned and the key in progress until its lease ends): it releases the key too.
TEST_F(GatewayTest, AfterSigtermCancelsUpstreamCallsNoNewOneStarts) {
  store_url_ = "log:" + (dir_ / "store").string() + "?sync=always";
  std::atomic<bool> slow{true};
  FakeUpstream upstream([&](int fd, const std::string&) {
    for (int i = 0; i < 800 && slow; ++i) std::this_thread::sleep_for(10ms);
    SendAll(fd, Created("ok"));
    return true;
  });
  const std::string config = WriteConfig(kWaitingChargesRoute);
  const std::vector<std::string> args = {"--config", config, "--upstream", upstream.url()};
  std::vector<std::string> flags = args;
  flags.insert(flags.end(), {"--shutdown-grace", "200ms"});
  ASSERT_NO_FATAL_FAILURE(StartIdemd(flags));
  const auto charge = [&] {
    auto r = HttpRequest(port_, "POST", "/charges", {{"Idempotency-Key", "drain-3"}}, "{}", 15s);
    if (r) {
      EXPECT_NE(r->status, 201);
    }
  };
  std::thread first(charge);
  std::this_thread::sleep_for(300ms);
  std::thread duplicate(charge);
  std::this_thread::sleep_for(300ms);
  ASSERT_TRUE(idemd_->Kill(SIGTERM).ok());
  auto status = idemd_->Wait(20s);
  first.join();
  duplicate.join();
  ASSERT_TRUE(status.has_value());
  EXPECT_EQ(*status, 0) << idemd_->Stderr();
  idemd_.reset();
  EXPECT_EQ(upstream.requests().size(), 1u);

  slow = false;
  ASSERT_NO_FATAL_FAILURE(StartIdemd(args));
  const HttpResponse retry = Post(port_, "/charges", {{"Idempotency-Key", "drain-3"}});
  EXPECT_EQ(retry.status, 201) << retry.body;
  EXPECT_FALSE(retry.HasHeader("Idempotent-Replayed"));
}

// What idemd answers to `bytes` sent as they are on a fresh connection, and whether it then
// closed the connection.
struct RawAnswer {
  HttpResponse response;
  bool closed = false;
};
RawAnswer SendRaw(std::uint16_t port, std::string_view bytes) {
  RawAnswer out;
  auto c = HttpConnection::Connect("127.0.0.1", port, 3s);
  EXPECT_TRUE(c.has_value());
  if (!c) return out;
  EXPECT_TRUE(c->RawSend(bytes).ok());
  auto r = c->ReadResponse();
  EXPECT_TRUE(r.has_value()) << r.status().ToString() << "\n" << bytes;
  if (r) out.response = *r;
  auto closed = c->WaitForClose(2s);
  out.closed = closed.has_value() && *closed;
  return out;
}

std::string ProblemType(std::string_view name) {
  return "\"type\":\"https://idem.dev/problems/" + std::string(name) + "\"";
}

// Beast frames a body only by a final "chunked" or by Content-Length and ignores other
// transfer codings: such a request's body would be read as a next request (smuggling). They are
// refused before their body is read, and the connection closed (RFC 9112 §6.1, §6.3).
TEST_F(GatewayTest, TransferCodingsIdemdCannotFrameAreRefusedAndTheConnectionClosed) {
  FakeUpstream upstream([](int fd, const std::string&) {
    SendAll(fd, Created("ok"));
    return true;
  });
  ASSERT_NO_FATAL_FAILURE(StartIdemd({"--upstream", upstream.url()}));
  const std::string smuggled =
      "POST /smuggled HTTP/1.1\r\nHost: x\r\nIdempotency-Key: smug2\r\nContent-Length: 0\r\n\r\n";
  const RawAnswer not_chunked =
      SendRaw(port_,
              "POST /echo HTTP/1.1\r\nHost: x\r\nIdempotency-Key: smug1\r\nTransfer-Encoding: "
              "gzip\r\n\r\n" +
                  smuggled);
  EXPECT_EQ(not_chunked.response.status, 400);
  EXPECT_THAT(not_chunked.response.body, HasSubstr(ProblemType("malformed-request")));
  EXPECT_TRUE(not_chunked.closed);
  const RawAnswer with_length =
      SendRaw(port_,
              "POST /echo HTTP/1.1\r\nHost: x\r\nIdempotency-Key: smug3\r\nTransfer-Encoding: "
              "gzip\r\nContent-Length: " +
                  std::to_string(smuggled.size()) + "\r\n\r\n" + smuggled);
  EXPECT_EQ(with_length.response.status, 400);
  EXPECT_TRUE(with_length.closed);

  // A coding before chunked that idemd would not decode: the upstream would get its bytes
  // without it.
  const std::string gzip_body = "5\r\nhello\r\n0\r\n\r\n";
  for (const std::string& codings :
       {std::string("Transfer-Encoding: gzip, chunked\r\n"),
        std::string("Transfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n")}) {
    const RawAnswer gzip =
        SendRaw(port_, "POST /echo HTTP/1.1\r\nHost: x\r\nIdempotency-Key: gz\r\n" + codings +
                           "\r\n" + gzip_body);
    EXPECT_EQ(gzip.response.status, 501) << codings;
    EXPECT_THAT(gzip.response.body, HasSubstr(ProblemType("unsupported-transfer-coding")));
    EXPECT_TRUE(gzip.closed) << codings;
  }
  const RawAnswer twice =
      SendRaw(port_,
              "POST /echo HTTP/1.1\r\nHost: x\r\nIdempotency-Key: c2\r\nTransfer-Encoding: "
              "chunked, chunked\r\n\r\n" +
                  gzip_body);
  EXPECT_EQ(twice.response.status, 400);
  EXPECT_TRUE(twice.closed);
  const RawAnswer http10 =
      SendRaw(port_,
              "POST /echo HTTP/1.0\r\nHost: x\r\nIdempotency-Key: old\r\nTransfer-Encoding: "
              "chunked\r\n\r\n" +
                  gzip_body);
  EXPECT_EQ(http10.response.status, 400);
  EXPECT_TRUE(http10.closed);
  EXPECT_TRUE(upstream.requests().empty());

  // Plain chunked is still fine.
  const RawAnswer chunked =
      SendRaw(port_,
              "POST /echo HTTP/1.1\r\nHost: x\r\nIdempotency-Key: ok1\r\nTransfer-Encoding: "
              "chunked\r\nConnection: close\r\n\r\n" +
                  gzip_body);
  EXPECT_EQ(chunked.response.status, 201);
  ASSERT_EQ(upstream.requests().size(), 1u);
  EXPECT_THAT(upstream.requests()[0], HasSubstr("\r\n\r\nhello"));
}

// RFC 9112 §3.2: an HTTP/1.1 request without Host, or any request with two, is a 400.
TEST_F(GatewayTest, AMissingOrRepeatedHostIs400) {
  FakeUpstream upstream([](int fd, const std::string&) {
    SendAll(fd, Created("ok"));
    return true;
  });
  ASSERT_NO_FATAL_FAILURE(StartIdemd({"--upstream", upstream.url()}));
  const RawAnswer none = SendRaw(port_, "GET /x HTTP/1.1\r\n\r\n");
  EXPECT_EQ(none.response.status, 400);
  EXPECT_THAT(none.response.body, HasSubstr(ProblemType("malformed-request")));
  const RawAnswer two = SendRaw(port_, "GET /x HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n");
  EXPECT_EQ(two.response.status, 400);
  EXPECT_TRUE(upstream.requests().empty());
  // HTTP/1.0 has no Host requirement.
  EXPECT_EQ(SendRaw(port_, "GET /x HTTP/1.0\r\n\r\n").response.status, 201);
  EXPECT_THAT(SendRaw(port_, "G@T /x HTTP/1.1\r\nHost: a\r\n\r\n").response.body,
              HasSubstr(ProblemType("malformed-request")));
}

// Beast merges a chunked body's trailer fields into the header: a request's would act as its
// key or principal, so it is refused; an upstream answer's are neither relayed nor stored.
TEST_F(GatewayTest, TrailerFieldsNeverActAsHeaders) {
  FakeUpstream upstream([](int fd, const std::string&) {
    SendAll(fd,
            "HTTP/1.1 201 Created\r\nTransfer-Encoding: chunked\r\nTrailer: X-T\r\n"
            "X-Public: 1\r\n\r\n2\r\nok\r\n0\r\nX-T: trailer\r\nX-Internal: 1\r\n\r\n");
    return true;
  });
  ASSERT_NO_FATAL_FAILURE(StartIdemd({"--upstream", upstream.url()}));
  const RawAnswer trailed =
      SendRaw(port_,
              "POST /charges HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
              "2\r\n{}\r\n0\r\nIdempotency-Key: from-trailer\r\nAuthorization: Bearer b\r\n\r\n");
  EXPECT_EQ(trailed.response.status, 400);
  EXPECT_THAT(trailed.response.body, HasSubstr("trailer"));
  EXPECT_TRUE(upstream.requests().empty());

  const HttpResponse first = Post(port_, "/charges", {{"Idempotency-Key", "t1"}});
  EXPECT_EQ(first.status, 201);
  EXPECT_EQ(first.body, "ok");
  EXPECT_EQ(first.Header("X-Public"), "1");
  EXPECT_FALSE(first.HasHeader("X-T"));
  EXPECT_FALSE(first.HasHeader("X-Internal"));
  const HttpResponse replay = Post(port_, "/charges", {{"Idempotency-Key", "t1"}});
  EXPECT_EQ(replay.Header("Idempotent-Replayed"), "true");
  EXPECT_EQ(replay.body, "ok");
  EXPECT_FALSE(replay.HasHeader("X-T"));
  EXPECT_FALSE(replay.HasHeader("X-Internal"));
}

// Beast's default header limit is 8 KiB; an upstream's valid answer over it must not become a
// 502 that releases the key (each retry would run the upstream again).
TEST_F(GatewayTest, AnUpstreamAnswerWithALargeHeaderSectionIsRelayedAndStored) {
  const std::string big(20000, 'b');
  FakeUpstream upstream([&](int fd, const std::string&) {
    SendAll(fd, "HTTP/1.1 201 Created\r\nX-Big: " + big + "\r\nContent-Length: 2\r\n\r\nok");
    return true;
  });
  ASSERT_NO_FATAL_FAILURE(StartIdemd({"--upstream", upstream.url()}));
  const HttpResponse first = Post(port_, "/charges", {{"Idempotency-Key", "big-1"}});
  EXPECT_EQ(first.status, 201) << first.body;
  EXPECT_EQ(first.Header("X-Big"), big);
  const HttpResponse retry = Post(port_, "/charges", {{"Idempotency-Key", "big-1"}});
  EXPECT_EQ(retry.status, 201);
  EXPECT_EQ(retry.Header("Idempotent-Replayed"), "true");
  EXPECT_EQ(retry.Header("X-Big"), big);
  EXPECT_EQ(upstream.requests().size(), 1u);
}

std::size_t CountHeader(const HttpResponse& r, std::string_view name) {
  return static_cast<std::size_t>(std::count_if(
      r.headers.begin(), r.headers.end(), [&](const auto& h) { return Lower(h.first) == name; }));
}

// RFC 9110 §8.6: a 204 has no Content-Length; a 304's is the 200's (the upstream's), or none.
// The first answer and its replay say the same; so does a HEAD passed through.
TEST_F(GatewayTest, NoContentAndNotModifiedKeepTheirLengthOnReplayToo) {
  FakeUpstream upstream([](int fd, const std::string& request) {
    if (request.starts_with("POST /none ")) {
      SendAll(fd, "HTTP/1.1 204 No Content\r\nX-N: 1\r\n\r\n");
    } else if (request.starts_with("POST /same ")) {
      SendAll(fd, "HTTP/1.1 304 Not Modified\r\nETag: \"e1\"\r\nContent-Length: 1234\r\n\r\n");
    } else {
      SendAll(fd, "HTTP/1.1 200 OK\r\nContent-Length: 42\r\n\r\n");
    }
    return true;
  });
  ASSERT_NO_FATAL_FAILURE(StartIdemd({"--upstream", upstream.url()}));
  for (int i = 0; i < 2; ++i) {
    const HttpResponse none = Post(port_, "/none", {{"Idempotency-Key", "n1"}}, "");
    EXPECT_EQ(none.status, 204);
    EXPECT_EQ(CountHeader(none, "content-length"), 0u) << i;
    EXPECT_EQ(none.HasHeader("Idempotent-Replayed"), i == 1);
    const HttpResponse same = Post(port_, "/same", {{"Idempotency-Key", "s1"}}, "");
    EXPECT_EQ(same.status, 304);
    EXPECT_EQ(same.Header("Content-Length"), "1234") << i;
    EXPECT_EQ(CountHeader(same, "content-length"), 1u) << i;
    EXPECT_EQ(same.HasHeader("Idempotent-Replayed"), i == 1);
  }
  EXPECT_EQ(upstream.requests().size(), 2u);
  auto head = HttpRequest(port_, "HEAD", "/things", {}, {}, 3s);
  ASSERT_TRUE(head.has_value()) << head.status().ToString();
  EXPECT_EQ(head->Header("Content-Length"), "42");
}

// A status Beast has no phrase for is replayed with its class's, not a placeholder.
TEST_F(GatewayTest, AReplayOfAnUnregisteredStatusHasASensibleReasonPhrase) {
  FakeUpstream upstream([](int fd, const std::string&) {
    SendAll(fd, "HTTP/1.1 299 Whatever\r\nContent-Length: 2\r\n\r\nok");
    return true;
  });
  ASSERT_NO_FATAL_FAILURE(StartIdemd({"--upstream", upstream.url()}));
  EXPECT_EQ(Post(port_, "/charges", {{"Idempotency-Key", "u1"}}).status, 299);
  const HttpResponse replay = Post(port_, "/charges", {{"Idempotency-Key", "u1"}});
  EXPECT_EQ(replay.status, 299);
  EXPECT_EQ(replay.Header("Idempotent-Replayed"), "true");
  EXPECT_EQ(replay.reason, "Success");
}

// SPEC §6: the request is forwarded with its key, whatever the client's Connection header
// names; and only idemd says which attempt a request is.
TEST_F(GatewayTest, TheKeyIsForwardedWhateverConnectionNamesAndClientAttemptsAreNot) {
  FakeUpstream upstream([](int fd, const std::string&) {
    SendAll(fd, Created("ok"));
    return true;
  });
  ASSERT_NO_FATAL_FAILURE(StartIdemd({"--upstream", upstream.url()}));
  EXPECT_EQ(Post(port_, "/charges",
                 {{"Connection", "Idempotency-Key, Authorization, X-Hop"},
                  {"Idempotency-Key", "k1"},
                  {"Authorization", "Bearer a"},
                  {"X-Hop", "1"},
                  {"Idempotency-Attempt", "9"},
                  {"Idempotency-Attempt", "8"}})
                .status,
            201);
  auto passed = HttpRequest(port_, "GET", "/things", {{"Idempotency-Attempt", "9"}}, {}, 3s);
  ASSERT_TRUE(passed.has_value());
  const std::vector<std::string> seen = upstream.requests();
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(HeaderIn(seen[0], "idempotency-key"), "k1");
  EXPECT_EQ(HeaderIn(seen[0], "authorization"), "Bearer a");
  EXPECT_EQ(HeaderIn(seen[0], "x-hop"), "");
  EXPECT_EQ(HeaderIn(seen[0], "idempotency-attempt"), "1");
  EXPECT_THAT(Lower(seen[0]), Not(HasSubstr("idempotency-attempt: 9")));
  EXPECT_THAT(Lower(seen[0]), Not(HasSubstr("idempotency-attempt: 8")));
  EXPECT_EQ(HeaderIn(seen[1], "idempotency-attempt"), "");
}

// Two principal headers: which principal's key is it? (The scope took the first; the upstream
// got both.)
TEST_F(GatewayTest, TwoPrincipalHeadersAre400) {
  ASSERT_NO_FATAL_FAILURE(StartIdemd());
  const HttpResponse two =
      Charge("p-1", kCharge, {{"Authorization", "Bearer a"}, {"Authorization", "Bearer b"}});
  EXPECT_EQ(two.status, 400);
  EXPECT_THAT(two.body, HasSubstr(ProblemType("invalid-principal")));
  EXPECT_EQ(LedgerCharges(), 0);
}

// A request's path is logged between quotes: a '"' or '\' in it cannot end the field and forge
// another one.
TEST_F(GatewayTest, LoggedValuesAreEscaped) {
  ASSERT_NO_FATAL_FAILURE(StartIdemd({"--log-level", "info"}));
  auto r = HttpRequest(port_, "GET", R"(/x"\y"status=999)", {}, {}, 3s);
  ASSERT_TRUE(r.has_value()) << r.status().ToString();
  const std::string want = R"(path="/x\"\\y\"status=999" route=)";
  std::string log;
  for (int i = 0; i < 100 && log.find(want) == std::string::npos; ++i) {
    std::this_thread::sleep_for(20ms);
    log = idemd_->Stderr();
  }
  EXPECT_THAT(log, HasSubstr(want));
}

// The access log names a key by a hash of it and its scope (16 hex digits), never by the key
// itself: the same one for a retry, another for another key, "-" for a request without a key.
TEST_F(GatewayTest, AccessLogNamesAKeyByItsHash) {
  ASSERT_NO_FATAL_FAILURE(StartIdemd({"--log-level", "info"}));
  ASSERT_EQ(Charge("secret-key-1").status, 201);
  ASSERT_EQ(Charge("secret-key-1").status, 201);
  ASSERT_EQ(Charge("secret-key-2").status, 201);
  auto plain = HttpRequest(port_, "GET", "/no-key", {}, {}, 3s);
  ASSERT_TRUE(plain.has_value()) << plain.status().ToString();
  const std::regex line(R"re(path="([^"]*)" route=\S+ key=(\S+) outcome=(\w+))re");
  std::vector<std::array<std::string, 3>> seen;  // path, key field, outcome
  for (int i = 0; i < 100 && seen.size() < 4; ++i) {
    std::this_thread::sleep_for(20ms);
    const std::string log = idemd_->Stderr();
    seen.clear();
    for (auto it = std::sregex_iterator(log.begin(), log.end(), line); it != std::sregex_iterator();
         ++it) {
      seen.push_back({(*it)[1].str(), (*it)[2].str(), (*it)[3].str()});
    }
  }
  ASSERT_EQ(seen.size(), 4u) << idemd_->Stderr();
  const std::regex hex16("[0-9a-f]{16}");
  EXPECT_TRUE(std::regex_match(seen[0][1], hex16)) << seen[0][1];
  EXPECT_EQ(seen[0][2], "forwarded");
  EXPECT_EQ(seen[1][1], seen[0][1]);  // the retry
  EXPECT_EQ(seen[1][2], "replayed");
  EXPECT_TRUE(std::regex_match(seen[2][1], hex16)) << seen[2][1];
  EXPECT_NE(seen[2][1], seen[0][1]);
  EXPECT_EQ(seen[3][0], "/no-key");
  EXPECT_EQ(seen[3][1], "-");
  EXPECT_THAT(idemd_->Stderr(), Not(HasSubstr("secret-key")));
}

// ---- in process, over a store that fails on demand ----

class GatewayStoreFailureTest : public GatewayTest {
 protected:
  void StartServer() {
    const gateway::Config config = InProcessConfig();
    auto server = gateway::Server::Start(config, faulty_, registry_);
    ASSERT_TRUE(server.has_value()) << server.status().ToString();
    server_ = std::move(*server);
    port_ = server_->listening().port;
    admin_port_ = server_->admin().port;
  }
  void TearDown() override {
    if (server_) server_->Shutdown();
    GatewayTest::TearDown();
  }

  std::unique_ptr<Store> memory_ = NewMemoryStore();
  FaultyStore faulty_{*memory_};
  Registry registry_;
  std::unique_ptr<gateway::Server> server_;
};

TEST_F(GatewayStoreFailureTest, StoreDownIs503WithRetryAfterAndTheUpstreamIsNotCalled) {
  ASSERT_NO_FATAL_FAILURE(StartServer());
  faulty_.Fail(FaultyStore::kAll);
  const HttpResponse down = Charge("s-1");
  EXPECT_EQ(down.status, 503);
  EXPECT_FALSE(down.Header("Retry-After").empty());
  EXPECT_EQ(down.Header("Content-Type"), "application/problem+json");
  auto ready = HttpRequest(admin_port_, "GET", "/readyz");
  ASSERT_TRUE(ready.has_value());
  EXPECT_EQ(ready->status, 503);
  EXPECT_EQ(LedgerCharges(), 0);

  faulty_.Heal();  // service resumes without operator action
  EXPECT_EQ(Charge("s-1").status, 201);
  EXPECT_EQ(Charge("s-1").Header("Idempotent-Replayed"), "true");
  EXPECT_EQ(LedgerCharges(), 1);
}

// A store down is not a broken process (/healthz 200: it comes back by itself); a store failed
// for good (the log store after a full disk) is: /healthz 503, so that a supervisor restarts
// idemd, which is what reopens the store. /healthz said "ok" while every request was 503.
TEST_F(GatewayStoreFailureTest, HealthzFailsOnlyWhenTheStoreFailedForGood) {
  ASSERT_NO_FATAL_FAILURE(StartServer());
  faulty_.Fail(FaultyStore::kAll);
  auto down = HttpRequest(admin_port_, "GET", "/healthz");
  ASSERT_TRUE(down.has_value());
  EXPECT_EQ(down->status, 200);
  faulty_.SetBroken(UnavailableError("log store failed closed, disk full"));
  auto broken = HttpRequest(admin_port_, "GET", "/healthz");
  ASSERT_TRUE(broken.has_value());
  EXPECT_EQ(broken->status, 503);
  EXPECT_EQ(broken->body, "log store failed closed, disk full\n");
}

TEST_F(GatewayStoreFailureTest, LostCompletionStillAnswersTheClientAndKeepsTheKeyInFlight) {
  ASSERT_NO_FATAL_FAILURE(StartServer());
  faulty_.Fail(FaultyStore::kComplete);
  const HttpResponse first = Charge("s-2");
  EXPECT_EQ(first.status, 201);  // the upstream acted: its answer is the truth
  faulty_.Heal();
  EXPECT_EQ(Charge("s-2").status, 409);  // held until the lease ends, never run twice meanwhile
  EXPECT_EQ(LedgerCharges(), 1);
}

// A completion the store fails to take is tried again: one failure (a pooled connection that
// died under it) no longer leaves the key IN_PROGRESS for the client's retry to run the
// upstream again after the lease.
TEST_F(GatewayStoreFailureTest, ACompletionTheStoreFailsOnceIsTriedAgain) {
  ASSERT_NO_FATAL_FAILURE(StartServer());
  faulty_.FailTimes(FaultyStore::kComplete, 2);
  EXPECT_EQ(Charge("s-3").status, 201);
  EXPECT_EQ(faulty_.refused(), 2u);
  const HttpResponse again = Charge("s-3");
  EXPECT_EQ(again.status, 201);
  EXPECT_EQ(again.Header("Idempotent-Replayed"), "true");
  EXPECT_EQ(LedgerCharges(), 1);
}

// A completion the store refuses (a response over the store's limit) is not tried again: it
// would be refused the same way, three times, each counted a store error. The client still gets
// the upstream's answer; the key stays in flight until its lease ends.
TEST_F(GatewayStoreFailureTest, ACompletionTheStoreRefusesIsNotRetriedNorAStoreError) {
  ASSERT_NO_FATAL_FAILURE(StartServer());
  faulty_.RefuseResponsesOver(1);
  EXPECT_EQ(Charge("s-4").status, 201);
  EXPECT_EQ(Charge("s-4").status, 409);
  EXPECT_EQ(LedgerCharges(), 1);
  const std::string text = registry_.RenderPrometheus();
  EXPECT_THAT(text, HasSubstr("idem_store_errors_total{scope=\"gateway\"} 0\n"));
  EXPECT_THAT(text,
              HasSubstr("idem_store_op_seconds_count{scope=\"gateway\",op=\"complete\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("idem_complete_total{scope=\"gateway\",outcome=\"success\"} 0\n"));
}

// Rotation, in process over a store the test also reaches: a key held under the secondary
// secret's scope with a running lease is 409 (and is not begun under the new scope), also when
// the new scope's attempt was a takeover; one whose lease ran out is run; a store that cannot
// answer the lookup is 503 and the key is released.
TEST_F(GatewayStoreFailureTest, ASecondaryScopesRunningLeaseIs409AndItsLookupFailsClosed) {
  gateway::Config config = InProcessConfig();
  config.principal_secret = "the new secret, long enough";
  config.principal_secret_secondary = "the old secret, long enough";
  auto server = gateway::Server::Start(config, faulty_, registry_);
  ASSERT_TRUE(server.has_value()) << server.status().ToString();
  server_ = std::move(*server);
  port_ = server_->listening().port;
  const std::string credential = "Bearer a";
  const HttpHeaders alice{{"Authorization", credential}};
  const std::string old_scope =
      gateway::PrincipalScope("/", credential, *config.principal_secret_secondary);
  const std::string new_scope = gateway::PrincipalScope("/", credential, config.principal_secret);

  auto held = memory_->Begin({.scope = old_scope, .key = "r-held", .lease = 60s});
  ASSERT_TRUE(held.has_value() && std::holds_alternative<Acquired>(*held));
  EXPECT_EQ(Charge("r-held", kCharge, alice).status, 409);
  auto under_new = memory_->Get(new_scope, "r-held");
  ASSERT_TRUE(under_new.has_value());
  EXPECT_FALSE(under_new->has_value());  // released

  auto abandoned = memory_->Begin({.scope = old_scope, .key = "r-abandoned", .lease = 1ms});
  ASSERT_TRUE(abandoned.has_value() && std::holds_alternative<Acquired>(*abandoned));
  // A takeover under the new scope looks too: an attempt abandoned there while the key went
  // on under the old scope.
  auto dead = memory_->Begin({.scope = new_scope, .key = "r-taken", .lease = 1ms});
  ASSERT_TRUE(dead.has_value() && std::holds_alternative<Acquired>(*dead));
  auto running = memory_->Begin({.scope = old_scope, .key = "r-taken", .lease = 60s});
  ASSERT_TRUE(running.has_value() && std::holds_alternative<Acquired>(*running));
  // Until both 1 ms leases have run out by the clock the store and the gateway read. It is a
  // coarse clock (the kernel's last tick, 4 ms here), which on a loaded machine can stand still
  // for longer than a fixed sleep: CI once saw "r-abandoned" still in flight after 5 ms.
  const Timestamp lapsed = std::max(std::get<Acquired>(*abandoned).lease_deadline,
                                    std::get<Acquired>(*dead).lease_deadline);
  for (int i = 0; i < 5000 && Clock::System().Now() <= lapsed; ++i) {
    std::this_thread::sleep_for(1ms);
  }
  ASSERT_GT(Clock::System().Now(), lapsed);
  EXPECT_EQ(Charge("r-abandoned", kCharge, alice).status, 201);
  EXPECT_EQ(Charge("r-taken", kCharge, alice).status, 409);

  faulty_.Fail(FaultyStore::kOperator);  // Get
  const HttpResponse down = Charge("r-new", kCharge, alice);
  EXPECT_EQ(down.status, 503);
  faulty_.Heal();
  auto released = memory_->Get(new_scope, "r-new");
  ASSERT_TRUE(released.has_value());
  EXPECT_FALSE(released->has_value());
  EXPECT_EQ(Charge("r-new", kCharge, alice).status, 201);
  EXPECT_EQ(LedgerCharges(), 2);
  const std::string text = registry_.RenderPrometheus();
  EXPECT_THAT(text, HasSubstr("idemd_secondary_scope_lookups_total{result=\"in_flight\"} 2\n"));
  EXPECT_THAT(text, HasSubstr("idemd_secondary_scope_lookups_total{result=\"absent\"} 2\n"));
  EXPECT_THAT(text, HasSubstr("idemd_secondary_scope_lookups_total{result=\"error\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("idemd_secondary_scope_lookups_total{result=\"replayed\"} 0\n"));
  EXPECT_THAT(text, HasSubstr("idem_store_errors_total{scope=\"gateway\"} 1\n"));
  // Each request's begin answer is the one it was given: the two 409s are busy, not acquired
  // (it counted 5 acquired and 0 busy), the failed lookup none; the keys acquired under the
  // new scope and given back are releases, each timed.
  EXPECT_THAT(text, HasSubstr("idem_begin_total{scope=\"gateway\",answer=\"acquired\"} 2\n"));
  EXPECT_THAT(text, HasSubstr("idem_begin_total{scope=\"gateway\",answer=\"busy\"} 2\n"));
  EXPECT_THAT(text, HasSubstr("idem_begin_total{scope=\"gateway\",answer=\"replay\"} 0\n"));
  EXPECT_THAT(text, HasSubstr("idem_release_total{scope=\"gateway\"} 3\n"));
  EXPECT_THAT(text, HasSubstr("idem_store_op_seconds_count{scope=\"gateway\",op=\"release\"} 3\n"));
  EXPECT_THAT(text, HasSubstr("idem_complete_total{scope=\"gateway\",outcome=\"success\"} 2\n"));
}

// A store that refuses the request's input (here a key above a store's own max_key_bytes, as
// redis://...?max_key_bytes=N sets) is 400 like any key that is too long: a retry with the same
// key fails the same way, so a retryable 503 would have clients retry forever.
TEST_F(GatewayTest, AKeyTheStoreRefusesIs400NotARetryable503) {
  std::unique_ptr<Store> store = NewMemoryStore({.max_key_bytes = 8});
  const gateway::Config config = InProcessConfig();
  Registry registry;
  auto server = gateway::Server::Start(config, *store, registry);
  ASSERT_TRUE(server.has_value()) << server.status().ToString();
  port_ = (*server)->listening().port;
  const HttpResponse refused = Charge("longer-than-eight");
  EXPECT_EQ(refused.status, 400) << refused.body;
  EXPECT_TRUE(refused.Header("Retry-After").empty());
  EXPECT_EQ(refused.Header("Content-Type"), "application/problem+json");
  EXPECT_EQ(Charge("short").status, 201);
  EXPECT_EQ(LedgerCharges(), 1);
  (*server)->Shutdown();
}

}  // namespace
}  // namespace idem::testing
