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

}  // namespace
}  // namespace idem::gateway
