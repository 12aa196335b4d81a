// End-to-end tests of examples/ledger, the upstream of the gateway tests: the built binary runs
// as a child process on a free port and is driven over loopback.
#include <signal.h>

#include <chrono>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/http_client.h"
#include "tests/support/process.h"

namespace idem::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;
using namespace std::chrono_literals;

class LedgerTest : public ::testing::Test {
 protected:
  void StartLedger(int threads = 1) {
    Result<ChildProcess> child = ChildProcess::Spawn(
        IDEM_LEDGER_PATH, {"--listen", "127.0.0.1:0", "--threads", std::to_string(threads)});
    ASSERT_TRUE(child.has_value()) << child.status().ToString();
    ledger_.emplace(std::move(*child));
    const Result<std::string> line = ledger_->WaitForLine("ledger listening on ", 30s);
    ASSERT_TRUE(line.has_value()) << line.status().ToString();
    const Result<std::uint16_t> port = ParseListeningPort(*line);
    ASSERT_TRUE(port.has_value()) << port.status().ToString();
    port_ = *port;
  }

  void SetUp() override { ASSERT_NO_FATAL_FAILURE(StartLedger()); }

  void TearDown() override {
    if (!ledger_) return;
    EXPECT_TRUE(ledger_->Running()) << "the ledger died; stderr:\n" << ledger_->Stderr();
  }

  HttpResponse Request(std::string_view method, std::string_view target,
                       const HttpHeaders& headers = {}, std::string_view body = {}) {
    Result<HttpResponse> r = HttpRequest(port_, method, target, headers, body);
    EXPECT_TRUE(r.has_value()) << r.status().ToString() << "\nledger stderr:\n"
                               << ledger_->Stderr();
    return r.has_value() ? *r : HttpResponse{};
  }

  std::string Count() { return Request("GET", "/charges/count").body; }

  std::optional<ChildProcess> ledger_;
  std::uint16_t port_ = 0;
};

TEST_F(LedgerTest, PostsAChargeAndListsIt) {
  const HttpResponse created =
      Request("POST", "/charges", {{"Idempotency-Key", "k-1"}, {"Idempotency-Attempt", "2"}},
              R"({"account":"acc-1","amount":1250})");
  EXPECT_EQ(created.status, 201);
  EXPECT_EQ(created.Header("Content-Type"), "application/json");
  EXPECT_EQ(created.Header("Location"), "/charges/1");
  const std::string charge =
      R"({"id":1,"account":"acc-1","amount":1250,"idempotency_key":"k-1","attempt":"2"})";
  EXPECT_EQ(created.body, charge);

  const HttpResponse list = Request("GET", "/charges");
  EXPECT_EQ(list.status, 200);
  EXPECT_EQ(list.body, "[" + charge + "]");
  EXPECT_EQ(Request("GET", "/charges/1").body, charge);
  EXPECT_EQ(Request("GET", "/charges/2").status, 404);
  EXPECT_EQ(Count(), R"({"count":1})");
}

TEST_F(LedgerTest, KeepAliveConnectionAndIncreasingIds) {
  Result<HttpConnection> c = HttpConnection::Connect("127.0.0.1", port_);
  ASSERT_TRUE(c.has_value()) << c.status().ToString();
  for (int i = 1; i <= 3; ++i) {
    Result<HttpResponse> r = c->Send("POST", "/charges", {},
                                     R"({"amount": 5, "note": {"x": [1, 2.5e1, null]},)"
                                     R"( "account": "acc-\"2\""})");
    ASSERT_TRUE(r.has_value()) << r.status().ToString();
    EXPECT_EQ(r->status, 201);
    EXPECT_EQ(r->body, R"({"id":)" + std::to_string(i) +
                           R"(,"account":"acc-\"2\"","amount":5,"idempotency_key":null,)"
                           R"("attempt":null})");
  }
  EXPECT_EQ(Count(), R"({"count":3})");
}

TEST_F(LedgerTest, MalformedBodiesAre400AndRecordNothing) {
  for (const std::string_view body :
       {"", "[]", "{", R"({"account":"acc-1"})", R"({"amount":1})", R"({"account":"","amount":1})",
        R"({"account":"a","amount":0})", R"({"account":"a","amount":12.5})",
        R"({"account":"a","amount":"1"})", R"({"account":"a","amount":1} x)",
        R"({"account":"a","amount":1,})"}) {
    const HttpResponse r = Request("POST", "/charges", {}, body);
    EXPECT_EQ(r.status, 400) << body;
    EXPECT_THAT(r.body, StartsWith(R"({"error":)")) << body;
  }
  EXPECT_EQ(Count(), R"({"count":0})");
}

TEST_F(LedgerTest, ForcedStatusRecordsNothing) {
  const HttpResponse r = Request("POST", "/charges", {{"X-Ledger-Status", "503"}},
                                 R"({"account":"acc-1","amount":1})");
  EXPECT_EQ(r.status, 503);
  EXPECT_EQ(Request("GET", "/healthz", {{"X-Ledger-Status", "500"}}).status, 500);
  EXPECT_EQ(Request("GET", "/healthz", {{"X-Ledger-Status", "abc"}}).status, 400);
  EXPECT_EQ(Count(), R"({"count":0})");
}

// With one thread, a delayed answer must not hold up another connection.
TEST_F(LedgerTest, DelayDoesNotBlockOtherConnections) {
  Result<HttpConnection> slow = HttpConnection::Connect("127.0.0.1", port_);
  ASSERT_TRUE(slow.has_value()) << slow.status().ToString();
  const std::string body = R"({"account":"acc-9","amount":7})";
  const auto start = std::chrono::steady_clock::now();
  ASSERT_TRUE(slow->RawSend("POST /charges HTTP/1.1\r\nHost: x\r\nX-Ledger-Delay-Ms: 1000\r\n"
                            "Content-Length: " +
                            std::to_string(body.size()) + "\r\n\r\n" + body)
                  .ok());
  EXPECT_EQ(Request("GET", "/healthz").body, "ok");
  EXPECT_EQ(Count(), R"({"count":0})");  // Recorded only when the delay ends.
  EXPECT_LT(std::chrono::steady_clock::now() - start, 1000ms);

  Result<HttpResponse> r = slow->ReadResponse();
  ASSERT_TRUE(r.has_value()) << r.status().ToString();
  EXPECT_EQ(r->status, 201);
  EXPECT_GE(std::chrono::steady_clock::now() - start, 1000ms);
  EXPECT_EQ(Count(), R"({"count":1})");
}

TEST_F(LedgerTest, PingHealthAndUnknownPaths) {
  for (const char* method : {"GET", "POST"}) {
    const HttpResponse r = Request(method, "/ping");
    EXPECT_EQ(r.status, 200);
    EXPECT_EQ(r.body, R"({"pong":true})");
  }
  const HttpResponse health = Request("GET", "/healthz");
  EXPECT_EQ(health.status, 200);
  EXPECT_EQ(health.body, "ok");
  EXPECT_EQ(Request("GET", "/nope").status, 404);
  EXPECT_EQ(Request("DELETE", "/charges").status, 405);
  EXPECT_EQ(Count(), R"({"count":0})");
}

TEST_F(LedgerTest, SigtermExitsZero) {
  ASSERT_TRUE(ledger_->Kill(SIGTERM).ok());
  const Result<int> status = ledger_->Wait(30s);
  ASSERT_TRUE(status.has_value()) << status.status().ToString();
  EXPECT_EQ(*status, 0) << ledger_->Stderr();
  ledger_.reset();
}

TEST(LedgerMultiThreadTest, ConcurrentChargesAreAllRecorded) {
  Result<ChildProcess> child = ChildProcess::Spawn(
      IDEM_LEDGER_PATH, {"--listen", "127.0.0.1:0", "--threads", "4"}, {{"LEDGER_UNUSED", "1"}});
  ASSERT_TRUE(child.has_value()) << child.status().ToString();
  const Result<std::string> line = child->WaitForLine("ledger listening on ", 30s);
  ASSERT_TRUE(line.has_value()) << line.status().ToString();
  const Result<std::uint16_t> port = ParseListeningPort(*line);
  ASSERT_TRUE(port.has_value());
  std::vector<std::thread> clients;
  for (int t = 0; t < 8; ++t) {
    clients.emplace_back([&] {
      Result<HttpConnection> c = HttpConnection::Connect("127.0.0.1", *port);
      ASSERT_TRUE(c.has_value()) << c.status().ToString();
      for (int i = 0; i < 25; ++i) {
        Result<HttpResponse> r = c->Send("POST", "/charges", {}, R"({"account":"a","amount":1})");
        ASSERT_TRUE(r.has_value()) << r.status().ToString();
        EXPECT_EQ(r->status, 201);
      }
    });
  }
  for (std::thread& t : clients) t.join();
  Result<HttpResponse> count = HttpRequest(*port, "GET", "/charges/count");
  ASSERT_TRUE(count.has_value()) << count.status().ToString();
  EXPECT_EQ(count->body, R"({"count":200})");
  ASSERT_TRUE(child->Kill(SIGINT).ok());
  const Result<int> status = child->Wait(30s);
  ASSERT_TRUE(status.has_value());
  EXPECT_EQ(*status, 0) << child->Stderr();
}

TEST(ChildProcessTest, ReportsAProgramThatCannotStart) {
  const Result<ChildProcess> child = ChildProcess::Spawn("/nonexistent/ledger", {});
  ASSERT_FALSE(child.has_value());
  EXPECT_THAT(child.error().message(), HasSubstr("/nonexistent/ledger"));
}

TEST(ChildProcessTest, ReportsEarlyExitWithStderr) {
  Result<ChildProcess> child = ChildProcess::Spawn(IDEM_LEDGER_PATH, {"--bogus"});
  ASSERT_TRUE(child.has_value()) << child.status().ToString();
  const Result<std::string> line = child->WaitForLine("ledger listening on ", 30s);
  ASSERT_FALSE(line.has_value());
  EXPECT_EQ(line.error().code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(line.error().message(), HasSubstr("unknown argument"));
  const Result<int> status = child->Wait(30s);
  ASSERT_TRUE(status.has_value());
  EXPECT_EQ(*status, 2);
  EXPECT_FALSE(child->Running());
}

}  // namespace
}  // namespace idem::testing
