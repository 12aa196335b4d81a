// The store contract suite (src/stores/store_contract_suite.cc) against the shared Redis
// servers that scripts/servers.sh starts: one node (IDEM_TEST_REDIS) and a cluster
// (IDEM_TEST_REDIS_CLUSTER). Each store gets a key prefix of its own, so the counting tests see
// only their own keys. A missing server is a failure, never a skip.
#include <cstdlib>
#include <memory>
#include <random>
#include <string>

#include <gtest/gtest.h>

#include "idem/stores/redis.h"
#include "stores/store_contract.h"

namespace idem {
namespace {

std::vector<std::string> Split(std::string_view list) {
  std::vector<std::string> out;
  while (!list.empty()) {
    const std::string_view one = list.substr(0, list.find(','));
    if (!one.empty()) out.emplace_back(one);
    list.remove_prefix(std::min(list.size(), one.size() + 1));
  }
  return out;
}

std::string FreshPrefix() {
  static std::random_device rd;
  static const std::string run = std::to_string(rd());
  static std::atomic<int> n{0};
  return "t" + run + "." + std::to_string(n++) + ":";
}

StoreUnderTest RedisStore(std::string name, const char* env, bool cluster) {
  auto prefix = std::make_shared<std::string>();
  auto open = [env, cluster, prefix](Clock& clock,
                                     std::size_t max_key_bytes) -> std::unique_ptr<Store> {
    // Read when a test runs, not when the suite is registered.
    const char* nodes = std::getenv(env);
    if (nodes == nullptr || *nodes == '\0') {
      ADD_FAILURE() << env
                    << " is not set: start the test servers with scripts/servers.sh start and "
                       "source /tmp/idem-servers/env";
      return nullptr;
    }
    RedisStoreOptions o;
    o.nodes = Split(nodes);
    o.cluster = cluster;
    o.key_prefix = *prefix;
    o.clock = &clock;
    o.max_key_bytes = max_key_bytes;
    auto store = OpenRedisStore(o);
    if (!store.has_value()) {
      ADD_FAILURE() << "cannot open the Redis store at " << env << "=" << nodes << ": "
                    << store.error().ToString();
      return nullptr;
    }
    return std::move(*store);
  };
  return StoreUnderTest{
      .name = std::move(name),
      .make =
          [open, prefix](Clock& clock, std::size_t max_key_bytes) {
            *prefix = FreshPrefix();
            return open(clock, max_key_bytes);
          },
      .reopen = open,
      .abandoned_retention = RedisStoreOptions{}.abandoned_retention,
  };
}

const StoreUnderTest kRedis = RedisStore("redis", "IDEM_TEST_REDIS", false);
const StoreUnderTest kRedisCluster = RedisStore("redis_cluster", "IDEM_TEST_REDIS_CLUSTER", true);

INSTANTIATE_TEST_SUITE_P(Redis, StoreContractTest, ::testing::Values(kRedis, kRedisCluster),
                         StoreUnderTestName);
INSTANTIATE_TEST_SUITE_P(Redis, StoreCountsTest, ::testing::Values(kRedis, kRedisCluster),
                         StoreUnderTestName);
INSTANTIATE_TEST_SUITE_P(Redis, StoreReopenTest, ::testing::Values(kRedis, kRedisCluster),
                         StoreUnderTestName);

}  // namespace
}  // namespace idem
