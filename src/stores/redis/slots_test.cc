// Slot placement as the Redis Cluster specification defines it, and CLUSTER SLOTS parsing.
#include "stores/redis/slots.h"

#include <hiredis/hiredis.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace idem::redis {
namespace {

using ::testing::HasSubstr;

TEST(Crc16Test, KnownVectors) {
  // The specification's check value, and values redis-cli's CLUSTER KEYSLOT gives.
  EXPECT_EQ(Crc16("123456789"), 0x31C3);
  EXPECT_EQ(Crc16(""), 0);
  EXPECT_EQ(KeySlot("foo"), 12182);
  EXPECT_EQ(KeySlot("bar"), 5061);
  EXPECT_EQ(KeySlot("hello"), 866);
  EXPECT_EQ(KeySlot(std::string_view("\0\xff", 2)), Crc16(std::string_view("\0\xff", 2)) & 16383);
}

TEST(HashTagTest, RulesOfTheSpecification) {
  EXPECT_EQ(HashTag("{user1000}.following"), "user1000");
  EXPECT_EQ(HashTag("{user1000}.followers"), "user1000");
  EXPECT_EQ(KeySlot("{user1000}.following"), KeySlot("{user1000}.followers"));
  // An empty tag: the whole key.
  EXPECT_EQ(HashTag("foo{}{bar}"), "foo{}{bar}");
  // The first '{' and the first '}' after it.
  EXPECT_EQ(HashTag("foo{{bar}}zap"), "{bar");
  EXPECT_EQ(HashTag("foo{bar}{zap}"), "bar");
  // No '}' after the '{': the whole key.
  EXPECT_EQ(HashTag("foo{bar"), "foo{bar");
  EXPECT_EQ(HashTag("foo}bar{"), "foo}bar{");
  EXPECT_EQ(HashTag("plain"), "plain");
}

// A hand-built reply, as hiredis's reader would make it.
class FakeReply {
 public:
  static FakeReply Int(long long v) {
    FakeReply r;
    r.r_.type = REDIS_REPLY_INTEGER;
    r.r_.integer = v;
    return r;
  }
  static FakeReply Str(std::string s) {
    FakeReply r;
    r.text_ = std::move(s);
    r.r_.type = REDIS_REPLY_STRING;
    return r;
  }
  static FakeReply Array(std::vector<FakeReply> items) {
    FakeReply r;
    r.r_.type = REDIS_REPLY_ARRAY;
    r.items_ = std::move(items);
    return r;
  }
  // Fixes the pointers; call on the outermost reply once it stays put.
  redisReply& Get() {
    r_.str = text_.data();
    r_.len = text_.size();
    pointers_.clear();
    for (FakeReply& i : items_) pointers_.push_back(&i.Get());
    r_.elements = items_.size();
    r_.element = pointers_.data();
    return r_;
  }

 private:
  redisReply r_{};
  std::string text_;
  std::vector<FakeReply> items_;
  std::vector<redisReply*> pointers_;
};

FakeReply Range(int first, int last, std::string host, int port) {
  return FakeReply::Array(
      {FakeReply::Int(first), FakeReply::Int(last),
       FakeReply::Array({FakeReply::Str(std::move(host)), FakeReply::Int(port),
                         FakeReply::Str("0123456789abcdef0123456789abcdef01234567")}),
       FakeReply::Array(
           {FakeReply::Str("10.0.0.9"), FakeReply::Int(7009), FakeReply::Str("replica-id")})});
}

TEST(ParseClusterSlotsTest, ReadsMastersOfEveryRange) {
  FakeReply reply =
      FakeReply::Array({Range(0, 5460, "10.0.0.1", 7001), Range(5461, 10922, "", 7002),
                        Range(10923, 16383, "?", 7003)});
  auto ranges = ParseClusterSlots(reply.Get(), "seed.example");
  ASSERT_TRUE(ranges.has_value()) << ranges.error().ToString();
  ASSERT_EQ(ranges->size(), 3u);
  EXPECT_EQ((*ranges)[0].first, 0);
  EXPECT_EQ((*ranges)[0].last, 5460);
  EXPECT_EQ((*ranges)[0].host, "10.0.0.1");
  EXPECT_EQ((*ranges)[0].port, 7001);
  // An empty or unknown host is the node that was asked.
  EXPECT_EQ((*ranges)[1].host, "seed.example");
  EXPECT_EQ((*ranges)[2].host, "seed.example");
  EXPECT_EQ((*ranges)[2].last, 16383);
}

TEST(ParseClusterSlotsTest, RefusesOtherShapes) {
  FakeReply not_array = FakeReply::Int(3);
  EXPECT_THAT(ParseClusterSlots(not_array.Get(), "h").error().message(), HasSubstr("not an array"));
  FakeReply short_entry = FakeReply::Array({FakeReply::Array({FakeReply::Int(0)})});
  EXPECT_EQ(ParseClusterSlots(short_entry.Get(), "h").error().code(), StatusCode::kUnavailable);
  FakeReply bad_slots = FakeReply::Array({Range(100, 20000, "h", 1)});
  EXPECT_THAT(ParseClusterSlots(bad_slots.Get(), "h").error().message(),
              HasSubstr("slots 100-20000"));
  FakeReply bad_port = FakeReply::Array({Range(0, 1, "h", 70000)});
  EXPECT_THAT(ParseClusterSlots(bad_port.Get(), "h").error().message(), HasSubstr("port 70000"));
  FakeReply empty = FakeReply::Array({});
  auto none = ParseClusterSlots(empty.Get(), "h");
  ASSERT_TRUE(none.has_value());
  EXPECT_TRUE(none->empty());
}

}  // namespace
}  // namespace idem::redis
