// Keys and the stored values as the C++ side reads them. The Lua side writes them; the
// contract suite checks the two agree on a real server.
#include "stores/redis/codec.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "stores/redis/scripts.h"

namespace idem::redis {
namespace {

using ::testing::HasSubstr;

// Little-endian, `bytes` wide (struct.pack's In / in).
void Put(std::string& s, int bytes, std::int64_t v) {
  for (int i = 0; i < bytes; ++i)
    s.push_back(static_cast<char>(static_cast<std::uint64_t>(v) >> (8 * i)));
}
Timestamp Ms(std::int64_t ms) { return Timestamp(std::chrono::milliseconds(ms)); }

TEST(KeyTest, HexKeysArePackedTwoDigitsAByte) {
  const std::string hex = "0123456789abcdef0123456789abcdef";
  const std::string k = RecordKey("i:", "", hex);
  EXPECT_EQ(k.size(), 2u + 2u + 16u);
  EXPECT_EQ(k[2], 'h');
  auto parsed = ParseKey("i:", k);
  ASSERT_TRUE(parsed.has_value());
  EXPECT_EQ(parsed->kind, KeyKind::kRecord);
  EXPECT_EQ(parsed->scope, "");
  EXPECT_EQ(parsed->name, hex);

  const std::string upper = RecordKey("i:", "tenant", "ABCDEF0123");
  EXPECT_EQ(upper[2], 'H');
  EXPECT_EQ(ParseKey("i:", upper)->name, "ABCDEF0123");
  EXPECT_EQ(ParseKey("i:", upper)->scope, "tenant");
}

TEST(KeyTest, OtherKeysAreKeptAsTheyAre) {
  // Odd length, mixed case, non-hex, binary: stored raw.
  for (std::string key : {std::string("abc"), std::string("aBcD"), std::string("order-42"),
                          std::string("\0\xff{x}", 5), std::string("00")}) {
    const std::string k = RecordKey("p", "s", key);
    auto parsed = ParseKey("p", k);
    ASSERT_TRUE(parsed.has_value()) << key;
    EXPECT_EQ(parsed->name, key);
    EXPECT_EQ(parsed->scope, "s");
  }
  EXPECT_EQ(RecordKey("p", "", "order-42")[1], 'r');
  EXPECT_EQ(RecordKey("p", "", "00")[1], 'h');
}

TEST(KeyTest, KindsAndScopesAreKeptApart) {
  EXPECT_NE(RecordKey("i:", "ab", "c"), RecordKey("i:", "a", "bc"));
  EXPECT_NE(SessionKey("i:", "s", "c"), EntityKey("i:", "s", "c"));
  EXPECT_EQ(ParseKey("i:", SessionKey("i:", "s", "client"))->kind, KeyKind::kSession);
  EXPECT_EQ(ParseKey("i:", EntityKey("i:", "s", "order"))->name, "order");
  const std::string long_scope(255, 'x');
  EXPECT_EQ(ParseKey("i:", RecordKey("i:", long_scope, "k"))->scope, long_scope);
  EXPECT_FALSE(ParseKey("i:", "other:key").has_value());
  EXPECT_FALSE(ParseKey("i:", "i:").has_value());
  EXPECT_FALSE(ParseKey("i:", std::string("i:r\x05") + "ab").has_value());  // scope cut short
  EXPECT_FALSE(ParseKey("i:", std::string("i:z\x00", 4)).has_value());
}

TEST(KeyTest, PrefixPatternEscapesGlobCharacters) {
  EXPECT_EQ(PrefixPattern("i:"), "i:*");
  EXPECT_EQ(PrefixPattern("a*b?[c]\\"), "a\\*b\\?\\[c\\]\\\\*");
}

TEST(DecodeRecordTest, WideInProgress) {
  std::string v(1, static_cast<char>(0x80 | 4));
  Put(v, 7, 1'700'000'000'123'456);  // token
  Put(v, 4, 3);                      // attempt
  Put(v, 6, 1'700'000'000'000);      // created
  Put(v, 6, 1'700'000'090'000);      // expires
  Put(v, 6, 1'700'000'030'000);      // lease deadline
  v.append(32, '\x5a');
  auto r = DecodeRecord(v, -1);
  ASSERT_TRUE(r.has_value()) << r.error().ToString();
  EXPECT_EQ(r->head.state, RecordState::kInProgress);
  EXPECT_EQ(r->head.token, 1'700'000'000'123'456u);
  EXPECT_EQ(r->head.attempt, 3u);
  EXPECT_EQ(r->head.created, Ms(1'700'000'000'000));
  EXPECT_EQ(r->head.expires, Ms(1'700'000'090'000));
  EXPECT_EQ(r->head.lease_deadline, Ms(1'700'000'030'000));
  ASSERT_TRUE(r->fingerprint.has_value());
  EXPECT_EQ(r->fingerprint->bytes[31], 0x5a);
  EXPECT_EQ(r->response, "");
}

TEST(DecodeRecordTest, WideCompletedWithResponse) {
  std::string v(1, static_cast<char>(0x80 | 2));
  Put(v, 7, 7);
  Put(v, 4, 1);
  Put(v, 6, -5);  // times before the epoch work too
  Put(v, 6, 5);
  v.append(std::string("\0resp", 5));
  auto r = DecodeRecord(v, -1);
  ASSERT_TRUE(r.has_value()) << r.error().ToString();
  EXPECT_EQ(r->head.state, RecordState::kCompleted);
  EXPECT_EQ(r->head.outcome, Outcome::kFailure);
  EXPECT_EQ(r->head.created, Ms(-5));
  EXPECT_EQ(r->head.expires, Ms(5));
  EXPECT_FALSE(r->fingerprint.has_value());
  EXPECT_EQ(r->response, std::string("\0resp", 5));
}

TEST(DecodeRecordTest, CompactTakesItsExpiryFromTheKey) {
  const std::int64_t created = 1'760'000'000'000;
  const std::int64_t ttl = 86'400'123;
  const std::int64_t dt = -4321;  // token - created * 1000
  const std::uint64_t zt = (static_cast<std::uint64_t>(-dt) << 1) - 1;
  const std::uint64_t top = 1 * 8 + (5 - 1);  // failure, attempt 5
  const std::uint64_t n = (top << 49) | (zt << 28) | static_cast<std::uint64_t>(ttl);
  auto r = DecodeRecord(std::to_string(n), created + ttl + kGraceMs);
  ASSERT_TRUE(r.has_value()) << r.error().ToString();
  EXPECT_EQ(r->head.state, RecordState::kCompleted);
  EXPECT_EQ(r->head.outcome, Outcome::kFailure);
  EXPECT_EQ(r->head.attempt, 5u);
  EXPECT_EQ(r->head.created, Ms(created));
  EXPECT_EQ(r->head.expires, Ms(created + ttl));
  EXPECT_EQ(r->head.token, static_cast<Token>(created * 1000 + dt));
  EXPECT_FALSE(r->fingerprint.has_value());
  EXPECT_EQ(r->response, "");
}

TEST(DecodeRecordTest, DamageIsDataLoss) {
  const auto damaged = [](std::string_view v) {
    auto r = DecodeRecord(v, 1000);
    return !r.has_value() && r.error().code() == StatusCode::kDataLoss;
  };
  EXPECT_TRUE(damaged(""));
  EXPECT_TRUE(damaged("12x"));
  EXPECT_TRUE(damaged("99999999999999999999"));
  EXPECT_TRUE(damaged(std::string(1, static_cast<char>(0x83))));         // kind 3
  EXPECT_TRUE(damaged(std::string("\x80\x01", 2)));                      // cut short
  EXPECT_TRUE(damaged(std::string("\x84\x01\x01\x02\x02\x02\x00", 7)));  // fingerprint cut short
  auto no_expiry = DecodeRecord("123", -1);
  ASSERT_FALSE(no_expiry.has_value());
  EXPECT_THAT(no_expiry.error().message(), HasSubstr("without an expiry"));
}

TEST(DecodeEntityTest, ReadsEveryField) {
  std::string v(1, static_cast<char>(0x80));
  Put(v, 7, 4);     // applied
  Put(v, 7, 5);     // in progress
  Put(v, 7, 99);    // token
  Put(v, 4, 2);     // attempt
  Put(v, 6, 1000);  // lease
  Put(v, 6, 2000);  // expires
  auto e = DecodeEntity(v);
  ASSERT_TRUE(e.has_value()) << e.error().ToString();
  EXPECT_EQ(e->applied, 4u);
  EXPECT_EQ(e->in_progress, 5u);
  EXPECT_EQ(e->token, 99u);
  EXPECT_EQ(e->attempt, 2u);
  EXPECT_EQ(e->lease_deadline, Ms(1000));
  EXPECT_EQ(e->expires, Ms(2000));
  EXPECT_FALSE(DecodeEntity(v.substr(0, 4)).has_value());
  EXPECT_FALSE(DecodeEntity("x").has_value());
}

TEST(DecodeSessionTest, ReadsEveryField) {
  std::string v;
  Put(v, 7, 12);
  Put(v, 4, 1024);
  Put(v, 7, 600'000);
  Put(v, 6, 1'700'000'600'000);
  auto s = DecodeSession(v);
  ASSERT_TRUE(s.has_value()) << s.error().ToString();
  EXPECT_EQ(s->low_water, 12u);
  EXPECT_EQ(s->window, 1024u);
  EXPECT_EQ(s->ttl_ms, 600'000);
  EXPECT_EQ(s->expires, Ms(1'700'000'600'000));
  EXPECT_FALSE(DecodeSession(v + "x").has_value());
}

}  // namespace
}  // namespace idem::redis
