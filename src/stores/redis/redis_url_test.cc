// redis:// and redis+cluster:// URLs: every option, and a clear kInvalidArgument for every
// malformed part.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "core/url_text.h"
#include "idem/stores/redis.h"

namespace idem {
namespace {

using std::chrono::milliseconds;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

TEST(RedisUrlTest, SingleNode) {
  auto o = ParseRedisStoreUrl("redis://127.0.0.1:26379");
  ASSERT_TRUE(o.has_value()) << o.error().ToString();
  EXPECT_THAT(o->nodes, ElementsAre("127.0.0.1:26379"));
  EXPECT_FALSE(o->cluster);
  EXPECT_EQ(o->key_prefix, "i:");
  EXPECT_EQ(o->database, 0);
  EXPECT_TRUE(o->password.empty());

  auto d = ParseRedisStoreUrl("redis://cache.local");
  ASSERT_TRUE(d.has_value());
  EXPECT_THAT(d->nodes, ElementsAre("cache.local:6379"));

  auto v6 = ParseRedisStoreUrl("redis://[::1]:7000/3");
  ASSERT_TRUE(v6.has_value()) << v6.error().ToString();
  EXPECT_THAT(v6->nodes, ElementsAre("[::1]:7000"));
  EXPECT_EQ(v6->database, 3);
}

TEST(RedisUrlTest, Cluster) {
  auto o = ParseRedisStoreUrl("redis+cluster://10.0.0.1:7001,10.0.0.2:7002,10.0.0.3");
  ASSERT_TRUE(o.has_value()) << o.error().ToString();
  EXPECT_TRUE(o->cluster);
  EXPECT_THAT(o->nodes, ElementsAre("10.0.0.1:7001", "10.0.0.2:7002", "10.0.0.3:6379"));
}

TEST(RedisUrlTest, EveryOption) {
  auto o = ParseRedisStoreUrl(
      "redis://app:s%40cret@h:1?prefix=idem%3A&connect_timeout_ms=250&timeout_ms=500"
      "&connections=4&wait_replicas=1&wait_timeout_ms=300&abandoned_retention_ms=60000"
      "&max_key_bytes=64&allow_eviction=1");
  ASSERT_TRUE(o.has_value()) << o.error().ToString();
  EXPECT_EQ(o->user, "app");
  EXPECT_EQ(o->password, "s@cret");
  EXPECT_EQ(o->key_prefix, "idem:");
  EXPECT_EQ(o->connect_timeout, milliseconds(250));
  EXPECT_EQ(o->command_timeout, milliseconds(500));
  EXPECT_EQ(o->connections_per_node, 4u);
  EXPECT_EQ(o->wait_replicas, 1);
  EXPECT_EQ(o->wait_timeout, milliseconds(300));
  EXPECT_EQ(o->abandoned_retention, milliseconds(60000));
  EXPECT_EQ(o->max_key_bytes, 64u);
  EXPECT_TRUE(o->allow_eviction);
  EXPECT_FALSE(ParseRedisStoreUrl("redis://h:1")->allow_eviction);

  auto p = ParseRedisStoreUrl("redis://:pw@h:1");
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->user, "");
  EXPECT_EQ(p->password, "pw");
}

TEST(RedisUrlTest, MalformedPartsAreNamed) {
  const std::pair<const char*, const char*> cases[] = {
      {"http://h:1", "not redis://"},
      {"redis:/h:1", "not redis://"},
      {"rediss://h:1", "TLS"},
      {"redis://", "no host"},
      {"redis://h:", "empty port"},
      {"redis://h:0", "port \"0\""},
      {"redis://h:65536", "port \"65536\""},
      {"redis://h:12x", "port \"12x\""},
      {"redis://:7000", "no host"},
      {"redis://[::1", "without ']'"},
      {"redis://::1:7000", "[addr]:port"},
      {"redis://a:1,b:2", "redis+cluster://"},
      {"redis+cluster://a:1,,b:2", "empty address"},
      {"redis+cluster://a:1/0", "no databases"},
      {"redis://h:1/x", "database=x"},
      {"redis://pw@h:1", ":PASSWORD@"},
      {"redis://:@h:1", "empty password"},
      {"redis://:p%4@h:1", "escape"},
      {"redis://:%-1@h:1", "escape"},        // from_chars would take the sign
      {"redis://:s3cr#t/x@h:1", "no host"},  // a password the echo must not show
      {"redis://h:1?abandoned_retention_ms=3153600000000", "abandoned_retention_ms="},
      {"redis://h:1?allow_eviction=yes", "allow_eviction=yes"},
      {"redis://h:1?", "empty query"},
      {"redis://h:1?timeout_ms", "not NAME=VALUE"},
      {"redis://h:1?=5", "not NAME=VALUE"},
      {"redis://h:1?timeout_ms=0", "timeout_ms=0"},
      {"redis://h:1?timeout_ms=-1", "timeout_ms=-1"},
      {"redis://h:1?connections=lots", "connections=lots"},
      {"redis://h:1?wait_replicas=1001", "wait_replicas=1001"},
      {"redis://h:1?prefix=", "prefix= is empty"},
      {"redis://h:1?colour=blue", "unknown option \"colour\""},
  };
  for (const auto& [url, message] : cases) {
    auto o = ParseRedisStoreUrl(url);
    ASSERT_FALSE(o.has_value()) << url;
    EXPECT_EQ(o.error().code(), StatusCode::kInvalidArgument) << url;
    EXPECT_THAT(o.error().message(), HasSubstr(message)) << url;
    // The URL is named, without its password.
    EXPECT_THAT(o.error().message(), HasSubstr(core::RedactUrlPassword(url))) << url;
    if (core::RedactUrlPassword(url) != url) {
      EXPECT_THAT(o.error().message(), Not(HasSubstr(url))) << url;
    }
  }
}

TEST(RedisUrlTest, OpenNamesTheAddressWhenNothingAnswers) {
  RedisStoreOptions o;
  o.nodes = {"127.0.0.1:1"};
  o.connect_timeout = milliseconds(200);
  auto store = OpenRedisStore(o);
  ASSERT_FALSE(store.has_value());
  EXPECT_EQ(store.error().code(), StatusCode::kUnavailable);
  EXPECT_THAT(store.error().message(), HasSubstr("127.0.0.1:1"));

  o.cluster = true;
  o.nodes = {"127.0.0.1:1", "127.0.0.1:2"};
  store = OpenRedisStore(o);
  ASSERT_FALSE(store.has_value());
  EXPECT_EQ(store.error().code(), StatusCode::kUnavailable);
  EXPECT_THAT(store.error().message(), AllOf(HasSubstr("127.0.0.1:1"), HasSubstr("127.0.0.1:2")));

  o.nodes = {};
  EXPECT_EQ(OpenRedisStore(o).error().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace idem
