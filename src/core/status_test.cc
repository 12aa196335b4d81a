#include "idem/status.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>

namespace idem {
namespace {

TEST(Status, OkAndErrors) {
  EXPECT_TRUE(OkStatus().ok());
  Status s = UnavailableError("redis down");
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kUnavailable);
  EXPECT_EQ(s.ToString(), "UNAVAILABLE: redis down");
}

TEST(Result, HoldsValueOrError) {
  Result<std::string> v = std::string("x");
  ASSERT_TRUE(v.has_value());
  EXPECT_EQ(*v, "x");
  EXPECT_EQ(v->size(), 1u);
  EXPECT_TRUE(v.status().ok());
  Result<std::string> e = InvalidArgumentError("bad");
  EXPECT_FALSE(e);
  EXPECT_EQ(e.error().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(e.value_or("fallback"), "fallback");
  Result<std::unique_ptr<int>> moved = std::make_unique<int>(3);
  std::unique_ptr<int> p = std::move(moved).value();
  EXPECT_EQ(*p, 3);
}

TEST(ResultDeathTest, ValueOfErrorStops) {
  Result<int> e = InternalError("boom");
  EXPECT_DEATH((void)e.value(), "boom");
}

}  // namespace
}  // namespace idem
