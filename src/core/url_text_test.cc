#include "core/url_text.h"

#include <gtest/gtest.h>

#include <string>
#include <string_view>

namespace idem::core {
namespace {

TEST(RedactUrlPasswordTest, HidesThePasswordOnly) {
  EXPECT_EQ(RedactUrlPassword("postgres://app:s3cret@db:5432/x?schema=idem"),
            "postgres://app:***@db:5432/x?schema=idem");
  EXPECT_EQ(RedactUrlPassword("redis://:pw@127.0.0.1:6379"), "redis://:***@127.0.0.1:6379");
  EXPECT_EQ(RedactUrlPassword("redis+cluster://u:p%40ss@h1:1,h2:2?prefix=a:"),
            "redis+cluster://u:***@h1:1,h2:2?prefix=a:");
  // An '@' inside the password: the user info ends at the last '@' of the authority.
  EXPECT_EQ(RedactUrlPassword("postgres://u:a@b@db/x"), "postgres://u:***@db/x");
  // '#', '/' and '?' in a password (a Redis URL takes the first as it is; the others make a URL
  // whose error message echoes it).
  EXPECT_EQ(RedactUrlPassword("redis://:wrong#pass@127.0.0.1:6379"), "redis://:***@127.0.0.1:6379");
  EXPECT_EQ(RedactUrlPassword("redis://:s3cr#t/x@h:1"), "redis://:***@h:1");
  EXPECT_EQ(RedactUrlPassword("redis://:wrong?pass@h:1"), "redis://:***@h:1");
  // A '@' in a query hides more than the password, never less.
  EXPECT_EQ(RedactUrlPassword("redis://h:1/0?prefix=user:pw@x"), "redis://h:***@x");
  // libpq's password parameter.
  EXPECT_EQ(RedactUrlPassword("postgres://app@db/x?password=topsecret&sslmode=require"),
            "postgres://app@db/x?password=***&sslmode=require");
  EXPECT_EQ(RedactUrlPassword("postgres://db/x?sslmode=require&password=p"),
            "postgres://db/x?sslmode=require&password=***");
}

TEST(RedactUrlPasswordTest, LeavesUrlsWithoutAPasswordAlone) {
  for (const char* url :
       {"postgres://app@db/x", "redis://127.0.0.1:6379", "log:/var/lib/idem",
        "memory:", "redis://h:1/0?prefix=pw", "postgres://db/x?old_password=1", ""}) {
    EXPECT_EQ(RedactUrlPassword(url), url);
  }
}

// libpq's messages quote the URI, or only the token they refuse (which may be the password).
TEST(RedactUrlPasswordInTest, HidesThePasswordsWhereverAMessageQuotesThem) {
  const std::string url = "postgres://app:s3cret@[db?password=other";
  EXPECT_EQ(RedactUrlPasswordIn("bad URI: \"" + url + "\"", url),
            "bad URI: \"postgres://app:***@[db?password=***\"");
  EXPECT_EQ(RedactUrlPasswordIn("invalid token: \"s3cret\", \"other\"", url),
            "invalid token: \"***\", \"***\"");
  // Nothing to hide: the message as it is.
  EXPECT_EQ(RedactUrlPasswordIn("no host in \"postgres://app@\"", "postgres://app@"),
            "no host in \"postgres://app@\"");
}

TEST(FirstControlByteTest, FindsTheFirstByteBelowSpaceOrDelete) {
  EXPECT_EQ(FirstControlByte("log:/var/lib/idem dir"), std::string_view::npos);
  EXPECT_EQ(FirstControlByte(std::string_view("log:/a\0b", 8)), 6u);
  EXPECT_EQ(FirstControlByte("redis://h\x7f"), 9u);
  EXPECT_EQ(ControlByteMessage(std::string_view("log:/a\0b", 8), 6),
            "a control byte (0x00) at offset 6; a URL is printable text");
}

TEST(AppendLogQuotedTest, NoValueCanEndItsFieldOrTheLine) {
  std::string line = "error=";
  AppendLogQuoted(line, "say \"hi\" \\ then\r\nforged=1");
  EXPECT_EQ(line, R"(error="say \"hi\" \\ then\x0d\x0aforged=1")");
}

}  // namespace
}  // namespace idem::core
