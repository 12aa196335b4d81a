// JsonPointerText: RFC 6901 evaluation on validated documents.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <string_view>

#include "idem/fingerprint.h"

namespace idem {
namespace {

using ::testing::HasSubstr;

// RFC 6901 §5.
constexpr std::string_view kRfcDocument = R"({
  "foo": ["bar", "baz"],
  "": 0,
  "a/b": 1,
  "c%d": 2,
  "e^f": 3,
  "g|h": 4,
  "i\\j": 5,
  "k\"l": 6,
  " ": 7,
  "m~n": 8
})";

std::string Text(std::string_view json, std::string_view pointer) {
  Result<std::string> r = JsonPointerText(json, pointer);
  EXPECT_TRUE(r.has_value()) << pointer << ": " << r.status().ToString();
  return r.has_value() ? *r : std::string();
}

Status Error(std::string_view json, std::string_view pointer) {
  Result<std::string> r = JsonPointerText(json, pointer);
  EXPECT_FALSE(r.has_value()) << pointer << " gave " << (r.has_value() ? *r : "");
  return r.status();
}

TEST(JsonPointerTextTest, Rfc6901Examples) {
  EXPECT_EQ(Text(kRfcDocument, "/foo/0"), "bar");
  EXPECT_EQ(Text(kRfcDocument, "/foo/1"), "baz");
  EXPECT_EQ(Text(kRfcDocument, "/"), "0");
  EXPECT_EQ(Text(kRfcDocument, "/a~1b"), "1");
  EXPECT_EQ(Text(kRfcDocument, "/c%d"), "2");
  EXPECT_EQ(Text(kRfcDocument, "/e^f"), "3");
  EXPECT_EQ(Text(kRfcDocument, "/g|h"), "4");
  EXPECT_EQ(Text(kRfcDocument, "/i\\j"), "5");
  EXPECT_EQ(Text(kRfcDocument, "/k\"l"), "6");
  EXPECT_EQ(Text(kRfcDocument, "/ "), "7");
  EXPECT_EQ(Text(kRfcDocument, "/m~0n"), "8");
}

TEST(JsonPointerTextTest, ContainersAndNullAreInvalidArgument) {
  Status whole = Error(kRfcDocument, "");
  EXPECT_EQ(whole.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(whole.message(), HasSubstr("is an object"));
  Status array = Error(kRfcDocument, "/foo");
  EXPECT_EQ(array.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(array.message(), HasSubstr("\"/foo\" is an array"));
  Status null = Error(R"({"x":null})", "/x");
  EXPECT_EQ(null.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(null.message(), HasSubstr("is null"));
}

TEST(JsonPointerTextTest, ScalarsAsText) {
  constexpr std::string_view kDoc =
      R"({"s":"a\nb\u00e9\ud83d\ude00","n":1.50,"big":1e21,"neg":-0,"t":true,"f":false,)"
      R"("e":"","id":"ord_42"})";
  EXPECT_EQ(Text(kDoc, "/s"), "a\nb\xC3\xA9\xF0\x9F\x98\x80");
  EXPECT_EQ(Text(kDoc, "/n"), "1.5");
  EXPECT_EQ(Text(kDoc, "/big"), "1e+21");
  EXPECT_EQ(Text(kDoc, "/neg"), "0");
  EXPECT_EQ(Text(kDoc, "/t"), "true");
  EXPECT_EQ(Text(kDoc, "/f"), "false");
  EXPECT_EQ(Text(kDoc, "/e"), "");
  EXPECT_EQ(Text(kDoc, "/id"), "ord_42");
  // A whole document that is a scalar.
  EXPECT_EQ(Text(R"("key-1")", ""), "key-1");
  EXPECT_EQ(Text("42", ""), "42");
}

TEST(JsonPointerTextTest, NestedPaths) {
  constexpr std::string_view kDoc =
      R"({"order":{"items":[{"sku":"A"},{"sku":"B","tags":["x","y"]}],"id":7},)"
      R"("a/b":{"~":{"":"deep"}}})";
  EXPECT_EQ(Text(kDoc, "/order/id"), "7");
  EXPECT_EQ(Text(kDoc, "/order/items/0/sku"), "A");
  EXPECT_EQ(Text(kDoc, "/order/items/1/sku"), "B");
  EXPECT_EQ(Text(kDoc, "/order/items/1/tags/1"), "y");
  EXPECT_EQ(Text(kDoc, "/a~1b/~0/"), "deep");
}

TEST(JsonPointerTextTest, MemberNamesAreMatchedDecoded) {
  EXPECT_EQ(Text(R"({"a\u002fb":1,"\u00e9":2})", "/a~1b"), "1");
  EXPECT_EQ(Text(R"({"a\u002fb":1,"\u00e9":2})", "/\xC3\xA9"), "2");
  // In a large object (more than the insertion sort handles).
  std::string big = "{";
  for (int i = 0; i < 40; ++i)
    big.append(i > 0 ? ",\"k" : "\"k")
        .append(std::to_string(i))
        .append("\":")
        .append(std::to_string(i));
  big += "}";
  EXPECT_EQ(Text(big, "/k0"), "0");
  EXPECT_EQ(Text(big, "/k39"), "39");
  EXPECT_EQ(Error(big, "/k40").code(), StatusCode::kNotFound);
}

TEST(JsonPointerTextTest, MissingIsNotFound) {
  const std::string_view kMissing[] = {"/nope",  "/foo/2",   "/foo/-",  "/foo/01",
                                       "/foo/x", "/foo/0/x", "/a~1b/c", "/foo/18446744073709551616",
                                       "/foo/ ", "/foo/+1",  "/m~0n/x"};
  for (std::string_view pointer : kMissing) {
    Status s = Error(kRfcDocument, pointer);
    EXPECT_EQ(s.code(), StatusCode::kNotFound) << pointer << ": " << s.ToString();
  }
  EXPECT_THAT(Error(kRfcDocument, "/nope").message(), HasSubstr("no member \"nope\""));
  EXPECT_THAT(Error(kRfcDocument, "/foo/2").message(), HasSubstr("array of 2"));
  EXPECT_EQ(Error("[]", "/0").code(), StatusCode::kNotFound);
  EXPECT_EQ(Error(kRfcDocument, "/\xFF\xEE").code(), StatusCode::kNotFound);  // Not UTF-8.
  EXPECT_EQ(Error("{}", "/").code(), StatusCode::kNotFound);
}

TEST(JsonPointerTextTest, MalformedPointerIsInvalidArgument) {
  Status no_slash = Error(kRfcDocument, "foo");
  EXPECT_EQ(no_slash.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(no_slash.message(), HasSubstr("start with '/'"));
  EXPECT_EQ(Error(kRfcDocument, "/m~2n").code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Error(kRfcDocument, "/m~").code(), StatusCode::kInvalidArgument);
}

TEST(JsonPointerTextTest, InvalidJsonIsInvalidArgument) {
  Status s = Error(R"({"a":1,"a":2})", "/a");
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("duplicate member name"));
  EXPECT_EQ(Error("", "").code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Error(R"({"a":"\ud800"})", "/a").code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Error(R"({"a":1} x)", "/a").code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace idem
