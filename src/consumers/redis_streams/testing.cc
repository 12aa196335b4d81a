#include "consumers/redis_streams/testing.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "consumers/redis_streams/client.h"
#include "tests/support/servers.h"

namespace idem::redis_streams::testing {

std::string SharedUrl() {
  auto address = idem::testing::RequiredEnv("IDEM_TEST_REDIS");
  EXPECT_TRUE(address.has_value()) << address.error().ToString();
  return address ? "redis://" + *address : "redis://127.0.0.1:1";
}

std::string Unique(std::string_view what) {
  static std::atomic<int> n{0};
  return "idem-rs-test:" + std::to_string(::getpid()) + ":" +
         std::to_string(std::chrono::steady_clock::now().time_since_epoch().count()) + ":" +
         std::to_string(n++) + ":" + std::string(what);
}

long long PendingCount(const std::string& url, const std::string& stream,
                       const std::string& group) {
  auto a = ParseAddress(url);
  if (!a) return -1;
  auto c = Client::Open(*a, std::chrono::milliseconds(2000));
  if (!c) return -1;
  auto r = (*c)->Call(Args().Add("XPENDING").Add(stream).Add(group));
  if (!r || (*r)->type != REDIS_REPLY_ARRAY || (*r)->elements < 1 ||
      (*r)->element[0]->type != REDIS_REPLY_INTEGER) {
    return -1;
  }
  return (*r)->element[0]->integer;
}

long long PendingCountSettled(const std::string& url, const std::string& stream, long long expected,
                              const std::string& group) {
  long long n = PendingCount(url, stream, group);
  for (int i = 0; i < 200 && n != expected; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    n = PendingCount(url, stream, group);
  }
  return n;
}

}  // namespace idem::redis_streams::testing
