#include "core/duration_text.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "core/machine.h"

namespace idem::core {
namespace {

using std::chrono::milliseconds;
using ::testing::HasSubstr;

milliseconds Ok(std::string_view text) {
  auto d = ParseDuration(text);
  EXPECT_TRUE(d) << text << ": " << d.error().ToString();
  return d ? *d : milliseconds(-1);
}

std::string Error(std::string_view text) {
  auto d = ParseDuration(text);
  EXPECT_FALSE(d) << text;
  return d ? std::string() : d.error().message();
}

TEST(ParseDurationTest, UnitsSumsAndBareMilliseconds) {
  EXPECT_EQ(Ok("250ms"), milliseconds(250));
  EXPECT_EQ(Ok("30s"), milliseconds(30'000));
  EXPECT_EQ(Ok("5m"), milliseconds(300'000));
  EXPECT_EQ(Ok("1h30m"), milliseconds(5'400'000));
  EXPECT_EQ(Ok("1d1ms"), milliseconds(86'400'001));
  EXPECT_EQ(Ok("1500"), milliseconds(1500));
  EXPECT_EQ(Ok("0"), milliseconds(0));
  EXPECT_EQ(Ok("0s"), milliseconds(0));
}

TEST(ParseDurationTest, AnythingElseIsRefusedQuotingIt) {
  for (const char* bad :
       {"", "ms", "5x", "5 s", " 5s", "-5s", "+5s", "5S", "1.5s", "s5", "5s ", "1h-30m"}) {
    EXPECT_THAT(Error(bad), HasSubstr("\"" + std::string(bad) + "\" is not a duration (write"));
  }
}

// 10 years, and nothing can wrap around to a short one: each term is checked before the sum.
TEST(ParseDurationTest, AtMostTenYears) {
  EXPECT_EQ(Ok("3660d"), kMaxDuration);
  EXPECT_EQ(Ok(std::to_string(kMaxDuration.count())), kMaxDuration);
  const std::string over = "is above the longest duration idem accepts, 10 years";
  EXPECT_THAT(Error("3661d"), HasSubstr(over));
  EXPECT_THAT(Error("3660d1ms"), HasSubstr(over));
  EXPECT_THAT(Error(std::to_string(kMaxDuration.count() + 1)), HasSubstr(over));
  EXPECT_THAT(Error("18446744073709551615ms"), HasSubstr(over));
  EXPECT_THAT(Error("213503982334601d"), HasSubstr(over));  // * 86400000 wraps a uint64
  EXPECT_THAT(Error("99999999999999999999999s"), HasSubstr("is not a duration"));
  EXPECT_THAT(DurationOfMillis(316'224'000'001).error().message(), HasSubstr(over));
  EXPECT_EQ(*DurationOfMillis(316'224'000'000), kMaxDuration);
}

}  // namespace
}  // namespace idem::core
