// The admin listener over loopback: a slow readiness check must not hold the other endpoints.
#include "gateway/admin.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <thread>

#include "tests/support/http_client.h"

namespace idem::gateway {
namespace {

using namespace std::chrono_literals;

TEST(AdminServerTest, ASlowReadinessCheckHoldsNeitherHealthzNorMetrics) {
  Registry registry;
  registry.AddCounter("idem_test_total", "a counter").Inc();
  std::atomic<bool> release{false};
  auto admin = AdminServer::Start({"127.0.0.1", 0}, registry, [&]() -> Status {
    for (int i = 0; i < 500 && !release.load(); ++i) std::this_thread::sleep_for(10ms);
    return UnavailableError("store did not answer");
  });
  ASSERT_TRUE(admin) << admin.error().ToString();
  const std::uint16_t port = (*admin)->bound().port;
  auto readyz = std::async(std::launch::async, [&] {
    return testing::HttpRequest(port, "GET", "/readyz", {}, {}, 10s);
  });
  std::this_thread::sleep_for(100ms);  // the check is running

  const auto started = std::chrono::steady_clock::now();
  auto healthz = testing::HttpRequest(port, "GET", "/healthz", {}, {}, 5s);
  auto metrics = testing::HttpRequest(port, "GET", "/metrics", {}, {}, 5s);
  const auto took = std::chrono::steady_clock::now() - started;
  ASSERT_TRUE(healthz) << healthz.error().ToString();
  EXPECT_EQ(healthz->status, 200);
  ASSERT_TRUE(metrics) << metrics.error().ToString();
  EXPECT_NE(metrics->body.find("idem_test_total 1"), std::string::npos) << metrics->body;
  EXPECT_LT(took, 1s);

  release = true;
  auto ready = readyz.get();
  ASSERT_TRUE(ready) << ready.error().ToString();
  EXPECT_EQ(ready->status, 503);
  EXPECT_EQ(ready->body, "store did not answer\n");
  (*admin)->Stop();
}

// A HEAD answer has no body (one would be read as the start of the next answer on the
// connection), a query string does not change the path, and other methods are 405.
TEST(AdminServerTest, HeadHasNoBodyQueriesAreIgnoredAndOtherMethodsAre405) {
  Registry registry;
  registry.AddCounter("idem_test_total", "a counter").Inc();
  auto admin = AdminServer::Start({"127.0.0.1", 0}, registry, [] { return OkStatus(); });
  ASSERT_TRUE(admin) << admin.error().ToString();
  auto c = testing::HttpConnection::Connect("127.0.0.1", (*admin)->bound().port, 5s);
  ASSERT_TRUE(c) << c.error().ToString();
  auto head = c->Send("HEAD", "/healthz");
  ASSERT_TRUE(head) << head.error().ToString();
  EXPECT_EQ(head->status, 200);
  EXPECT_EQ(head->Header("Content-Length"), "3");
  auto metrics = c->Send("GET", "/metrics?x=1");
  ASSERT_TRUE(metrics) << metrics.error().ToString();
  EXPECT_EQ(metrics->status, 200);
  EXPECT_NE(metrics->body.find("idem_test_total 1"), std::string::npos) << metrics->body;
  auto post = c->Send("POST", "/metrics");
  ASSERT_TRUE(post) << post.error().ToString();
  EXPECT_EQ(post->status, 405);
  EXPECT_EQ(post->Header("Allow"), "GET, HEAD");
  auto after = c->Send("GET", "/healthz");
  ASSERT_TRUE(after) << after.error().ToString();
  EXPECT_EQ(after->body, "ok\n");
  (*admin)->Stop();
}

}  // namespace
}  // namespace idem::gateway
