// CanonicalizeJson: RFC 8785's own examples, the string and sorting rules, and every class of
// input that JCS must reject.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <string_view>

#include "fingerprint/jcs.h"
#include "idem/fingerprint.h"

namespace idem {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

std::string Canonical(std::string_view json) {
  Result<std::string> r = CanonicalizeJson(json);
  EXPECT_TRUE(r.has_value()) << "input: " << json << "\n" << r.status().ToString();
  return r.has_value() ? *r : std::string();
}

std::string AtByte(int offset) { return std::string("at byte ").append(std::to_string(offset)); }

// The error message for `json`, which must be rejected with kInvalidArgument.
std::string Rejection(std::string_view json) {
  Result<std::string> r = CanonicalizeJson(json);
  if (r.has_value()) {
    ADD_FAILURE() << "accepted: " << json << "\nas: " << *r;
    return "";
  }
  EXPECT_EQ(r.error().code(), StatusCode::kInvalidArgument) << r.error().ToString();
  return r.error().message();
}

// RFC 8785 §3.2.2: the sample with numbers, a string with escapes, and literals.
TEST(CanonicalizeJsonTest, Rfc8785Sample) {
  constexpr std::string_view kInput = R"({
  "numbers": [333333333.33333329, 1E30, 4.50,
              2e-3, 0.000000000000000000000000001],
  "string": "\u20ac$\u000F\u000aA'\u0042\u0022\u005c\\\"\/",
  "literals": [null, true, false]
})";
  constexpr std::string_view kExpected =
      "{\"literals\":[null,true,false],"
      "\"numbers\":[333333333.3333333,1e+30,4.5,0.002,1e-27],"
      "\"string\":\"\xE2\x82\xAC$\\u000f\\nA'B\\\"\\\\\\\\\\\"/\"}";
  EXPECT_EQ(Canonical(kInput), kExpected);
}

// RFC 8785 §3.2.3: member names sorted by UTF-16 code units.
TEST(CanonicalizeJsonTest, Rfc8785SortingExample) {
  constexpr std::string_view kInput = R"({
  "\u20ac": "Euro Sign",
  "\r": "Carriage Return",
  "\ufb33": "Hebrew Letter Dalet With Dagesh",
  "1": "One",
  "\ud83d\ude00": "Emoji: Grinning Face",
  "\u0080": "Control",
  "\u00f6": "Latin Small Letter O With Diaeresis"
})";
  constexpr std::string_view kExpected =
      "{\"\\r\":\"Carriage Return\","
      "\"1\":\"One\","
      "\"\xC2\x80\":\"Control\","
      "\"\xC3\xB6\":\"Latin Small Letter O With Diaeresis\","
      "\"\xE2\x82\xAC\":\"Euro Sign\","
      "\"\xF0\x9F\x98\x80\":\"Emoji: Grinning Face\","
      "\"\xEF\xAC\xB3\":\"Hebrew Letter Dalet With Dagesh\"}";
  EXPECT_EQ(Canonical(kInput), kExpected);
}

TEST(CanonicalizeJsonTest, AstralCharactersSortBeforeUpperBmp) {
  // By UTF-8 bytes U+E000 (EE 80 80) and U+FFFF (EF BF BF) sort before U+10000 (F0 90 80 80);
  // by UTF-16 code units U+10000 (D800 DC00) sorts before both.
  EXPECT_EQ(Canonical(R"({"\uffff":3,"\ue000":2,"\ud800\udc00":1,"\ud7ff":0})"),
            "{\"\xED\x9F\xBF\":0,\"\xF0\x90\x80\x80\":1,\"\xEE\x80\x80\":2,\"\xEF\xBF\xBF\":3}");
  // The same with raw UTF-8 names and a shared prefix longer than 8 bytes.
  EXPECT_EQ(Canonical("{\"abcdefgh\xEE\x80\x80\":1,\"abcdefgh\xF0\x9F\x98\x80\":2}"),
            "{\"abcdefgh\xF0\x9F\x98\x80\":2,\"abcdefgh\xEE\x80\x80\":1}");
}

TEST(CanonicalizeJsonTest, SortsRecursivelyAndKeepsArrayOrder) {
  EXPECT_EQ(Canonical(R"({"b":[{"z":1,"y":2},{"d":[3,2,1]}],"a":{"c":{"f":null,"e":true}}})"),
            R"({"a":{"c":{"e":true,"f":null}},"b":[{"y":2,"z":1},{"d":[3,2,1]}]})");
}

TEST(CanonicalizeJsonTest, SortsByNamePrefixThenLength) {
  EXPECT_EQ(Canonical(R"({"ab":1,"a":2,"":3,"abc":4,"b":5,"aa":6})"),
            R"({"":3,"a":2,"aa":6,"ab":1,"abc":4,"b":5})");
  // Names that agree on their first 8 bytes.
  EXPECT_EQ(Canonical(R"({"prefix__b":1,"prefix__":2,"prefix__a":3,"prefix_":4})"),
            R"({"prefix_":4,"prefix__":2,"prefix__a":3,"prefix__b":1})");
  // A name holding U+0000 sorts after its prefix and before anything larger.
  EXPECT_EQ(Canonical(R"({"a\u0000":1,"a":2,"a\u0001":3})"), R"({"a":2,"a\u0000":1,"a\u0001":3})");
}

TEST(CanonicalizeJsonTest, SortsLargeObjects) {
  // More members than the insertion sort handles, given in reverse.
  auto member = [](int i) {
    return std::string("\"key") + static_cast<char>('a' + i / 10) +
           static_cast<char>('a' + i % 10) + "\":" + std::to_string(i);
  };
  std::string input = "{";
  std::string expected = "{";
  for (int i = 40; i >= 0; --i) input.append(i == 40 ? "" : ",").append(member(i));
  for (int i = 0; i <= 40; ++i) expected.append(i == 0 ? "" : ",").append(member(i));
  input += "}";
  expected += "}";
  EXPECT_EQ(Canonical(input), expected);
}

TEST(CanonicalizeJsonTest, LiteralsAndWhitespace) {
  EXPECT_EQ(Canonical(" \t\r\n[ true , false,null ] \n"), "[true,false,null]");
  EXPECT_EQ(Canonical("true"), "true");
  EXPECT_EQ(Canonical("null"), "null");
  EXPECT_EQ(Canonical("\"\""), "\"\"");
  EXPECT_EQ(Canonical("{ }"), "{}");
  EXPECT_EQ(Canonical("[ ]"), "[]");
  EXPECT_EQ(Canonical("[[],{},[[]]]"), "[[],{},[[]]]");
  EXPECT_EQ(Canonical(" 42 "), "42");
}

TEST(CanonicalizeJsonTest, StringEscapes) {
  // The two-character escapes JCS keeps.
  EXPECT_EQ(Canonical(R"("\" \\ \b \f \n \r \t")"), R"("\" \\ \b \f \n \r \t")");
  // Other control characters as \u00xx with lowercase hex.
  EXPECT_EQ(Canonical(R"("\u0000\u0001\u001F\u000B\u001a")"),
            R"("\u0000\u0001\u001f\u000b\u001a")");
  // Escapes of ordinary characters are decoded: \/ and \uXXXX.
  EXPECT_EQ(Canonical(R"("\/\u0041\u00e9\u20AC\ud83d\ude00")"),
            "\"/A\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80\"");
  // \u escapes of characters that must be escaped come back in their short form.
  EXPECT_EQ(Canonical(R"("\u0022\u005c\u000a\u0008\u000c\u000d\u0009")"), R"("\"\\\n\b\f\r\t")");
  // DEL, U+2028/2029 and non-ASCII stay raw.
  EXPECT_EQ(Canonical("\"\x7F\xE2\x80\xA8\xE2\x80\xA9\xC3\xB6\""),
            "\"\x7F\xE2\x80\xA8\xE2\x80\xA9\xC3\xB6\"");
  EXPECT_EQ(Canonical(R"("\u007f\u2028")"), "\"\x7F\xE2\x80\xA8\"");
  // Raw UTF-8 of every length, including the largest code point.
  EXPECT_EQ(
      Canonical("\"\xC2\x80\xDF\xBF\xE0\xA0\x80\xEF\xBF\xBF\xF0\x90\x80\x80\xF4\x8F\xBF\xBF\""),
      "\"\xC2\x80\xDF\xBF\xE0\xA0\x80\xEF\xBF\xBF\xF0\x90\x80\x80\xF4\x8F\xBF\xBF\"");
  EXPECT_EQ(Canonical(R"("\udbff\udfff")"), "\"\xF4\x8F\xBF\xBF\"");
}

TEST(CanonicalizeJsonTest, LongStrings) {
  // Runs longer than the 16-byte scan, with escapes and UTF-8 at every alignment.
  for (int pad = 0; pad < 40; ++pad) {
    std::string filler(static_cast<std::size_t>(pad), 'x');
    EXPECT_EQ(Canonical("\"" + filler + "\\n" + filler + "\xC3\xA9" + filler + "\""),
              "\"" + filler + "\\n" + filler + "\xC3\xA9" + filler + "\"");
    EXPECT_THAT(Rejection("\"" + filler + "\x01\""), HasSubstr(AtByte(pad + 1)));
  }
}

TEST(CanonicalizeJsonTest, NumbersInDocuments) {
  EXPECT_EQ(Canonical("[1E2, 1e-7, 1e21, 1e20, -0, -0.0, 0.0, 1.0, 10, -5, 0.000001, 123e-2]"),
            "[100,1e-7,1e+21,100000000000000000000,0,0,0,1,10,-5,0.000001,1.23]");
  EXPECT_EQ(Canonical("{\"a\":2.0,\"b\":1}"), "{\"a\":2,\"b\":1}");
  // Numbers too small for a double become 0, as JSON.parse makes them.
  EXPECT_EQ(Canonical("[1e-400, -1e-400, 2e-324]"), "[0,0,0]");
}

TEST(CanonicalizeJsonTest, CanonicalFormIsAFixpoint) {
  constexpr std::string_view kInputs[] = {
      R"({"b":[1,2,{"d":1e21,"c":"\u00e9\n"}],"a":null})",
      R"([0.1, 1e-7, "\ud83d\ude00", {"\ue000":1,"\ud800\udc00":2}])",
  };
  for (std::string_view input : kInputs) {
    std::string once = Canonical(input);
    EXPECT_EQ(Canonical(once), once);
  }
}

TEST(CanonicalizeJsonTest, RejectsEmptyInput) {
  EXPECT_THAT(Rejection(""), HasSubstr("empty input"));
  EXPECT_THAT(Rejection(" \n\t "), HasSubstr("empty input"));
}

TEST(CanonicalizeJsonTest, RejectsInvalidUtf8) {
  struct Case {
    std::string_view json;
    std::string_view what;
    int byte;
  };
  const Case kCases[] = {
      {"\"\xC0\xAF\"", "overlong", 1},               // '/' in two bytes
      {"\"\xC1\xBF\"", "overlong", 1},               // U+007F in two bytes
      {"\"ab\xE0\x9F\xBF\"", "overlong", 3},         // U+07FF in three bytes
      {"\"\xF0\x8F\xBF\xBF\"", "overlong", 1},       // U+FFFF in four bytes
      {"\"\xED\xA0\x80\"", "encoded surrogate", 1},  // U+D800
      {"\"\xED\xBF\xBF\"", "encoded surrogate", 1},  // U+DFFF
      {"\"\xF4\x90\x80\x80\"", "above U+10FFFF", 1},
      {"\"\xF5\x80\x80\x80\"", "above U+10FFFF", 1},
      {"\"\xF8\x88\x80\x80\x80\"", "never occurs", 1},
      {"\"\xFF\"", "never occurs", 1},
      {"\"\x80\"", "continuation", 1},
      {"\"x\xBF\"", "continuation", 2},
      {"\"\xE2\x82\"", "truncated", 1},
      {"\"\xE2\x82", "truncated", 1},
      {"\"\xF0\x9F\x98\"", "truncated", 1},
      {"\"\xC3\"", "truncated", 1},
      {"\"\xC3", "truncated", 1},
      {"{\"\xC3\x28\":1}", "truncated", 2},  // In a member name.
  };
  for (const Case& c : kCases) {
    SCOPED_TRACE(testing::PrintToString(std::string(c.json)));
    EXPECT_THAT(Rejection(c.json), AllOf(HasSubstr("invalid UTF-8"), HasSubstr(std::string(c.what)),
                                         HasSubstr(AtByte(c.byte))));
  }
  // Outside strings non-ASCII is simply unexpected (a byte order mark, too).
  EXPECT_THAT(Rejection("\xEF\xBB\xBF{}"), HasSubstr("unexpected byte 0xef"));
  EXPECT_THAT(Rejection("[\xC3\xA9]"), HasSubstr("unexpected byte 0xc3"));
}

TEST(CanonicalizeJsonTest, RejectsLoneSurrogateEscapes) {
  EXPECT_THAT(Rejection(R"("\ud800")"),
              AllOf(HasSubstr("lone high surrogate \\ud800"), HasSubstr("at byte 1")));
  EXPECT_THAT(Rejection(R"("ab\uDBFFx")"),
              AllOf(HasSubstr("lone high surrogate \\udbff"), HasSubstr("at byte 3")));
  EXPECT_THAT(Rejection(R"("\ud800\u0041")"), HasSubstr("lone high surrogate"));
  EXPECT_THAT(Rejection(R"("\ud800\ud800")"), HasSubstr("lone high surrogate"));
  EXPECT_THAT(Rejection(R"("\ud800\n")"), HasSubstr("lone high surrogate"));
  EXPECT_THAT(Rejection(R"("\ud800\u12")"), HasSubstr("lone high surrogate"));
  EXPECT_THAT(Rejection(R"("\udc00")"),
              AllOf(HasSubstr("lone low surrogate \\udc00"), HasSubstr("at byte 1")));
  EXPECT_THAT(Rejection(R"("x\udfff\ud800")"),
              AllOf(HasSubstr("lone low surrogate"), HasSubstr("at byte 2")));
  EXPECT_THAT(Rejection(R"({"\udc00":1})"), HasSubstr("lone low surrogate"));
}

TEST(CanonicalizeJsonTest, RejectsDuplicateMemberNames) {
  EXPECT_THAT(Rejection(R"({"a":1,"a":2})"),
              AllOf(HasSubstr("duplicate member name \"a\""), HasSubstr("at byte 7")));
  // Compared after unescaping.
  EXPECT_THAT(Rejection(R"({"a":1,"\u0061":2})"), HasSubstr("duplicate member name \"a\""));
  EXPECT_THAT(Rejection(R"({"a/b":1,"a\/b":2})"), HasSubstr("duplicate member name \"a/b\""));
  EXPECT_THAT(Rejection(R"({"\ud83d\ude00":1,"\uD83D\uDE00":2})"),
              HasSubstr("duplicate member name"));
  // Long names that share a prefix, in a nested object, not adjacent in the input.
  EXPECT_THAT(
      Rejection(R"({"x":{"a_long_member_name":1,"b":2,"a_long_member_name":3}})"),
      AllOf(HasSubstr("duplicate member name \"a_long_member_name\""), HasSubstr("at byte 35")));
  // Duplicates in a large object (sorted with std::sort).
  std::string big = "{";
  for (int i = 0; i < 30; ++i) big.append("\"k").append(std::to_string(i)).append("\":0,");
  big += "\"k7\":1}";
  EXPECT_THAT(Rejection(big), HasSubstr("duplicate member name \"k7\""));
  // The same name in different objects is fine.
  EXPECT_EQ(Canonical(R"({"a":{"a":1},"b":{"a":2}})"), R"({"a":{"a":1},"b":{"a":2}})");
}

TEST(CanonicalizeJsonTest, RejectsNonFiniteNumberTokens) {
  EXPECT_THAT(Rejection("NaN"), AllOf(HasSubstr("NaN is not a JSON value"), HasSubstr("byte 0")));
  EXPECT_THAT(Rejection("[1, Infinity]"),
              AllOf(HasSubstr("Infinity is not a JSON value"), HasSubstr("at byte 4")));
  EXPECT_THAT(Rejection("{\"x\": -Infinity}"),
              AllOf(HasSubstr("-Infinity is not a JSON value"), HasSubstr("at byte 6")));
  EXPECT_THAT(Rejection("nan"), HasSubstr("invalid literal"));
}

TEST(CanonicalizeJsonTest, RejectsMalformedNumbers) {
  EXPECT_THAT(Rejection("01"), AllOf(HasSubstr("leading zero"), HasSubstr("at byte 0")));
  EXPECT_THAT(Rejection("[-012]"), AllOf(HasSubstr("leading zero"), HasSubstr("at byte 1")));
  EXPECT_THAT(Rejection("00.5"), HasSubstr("leading zero"));
  EXPECT_THAT(Rejection("-"), HasSubstr("'-' must be followed by a digit"));
  EXPECT_THAT(Rejection("-a"), HasSubstr("'-' must be followed by a digit"));
  EXPECT_THAT(Rejection("1."), HasSubstr("'.' must be followed by a digit"));
  EXPECT_THAT(Rejection("1.e5"), HasSubstr("'.' must be followed by a digit"));
  EXPECT_THAT(Rejection("1e"), HasSubstr("exponent must have a digit"));
  EXPECT_THAT(Rejection("1e+"), HasSubstr("exponent must have a digit"));
  EXPECT_THAT(Rejection(".5"), HasSubstr("unexpected '.'"));
  EXPECT_THAT(Rejection("+1"), HasSubstr("unexpected '+'"));
  EXPECT_THAT(Rejection("0x10"), HasSubstr("unexpected 'x'"));
  EXPECT_THAT(Rejection("1.5.3"), HasSubstr("trailing data"));
}

TEST(CanonicalizeJsonTest, RejectsNumbersOutsideDoubleRange) {
  EXPECT_THAT(Rejection("1e400"),
              AllOf(HasSubstr("number \"1e400\" is outside the range of a double"),
                    HasSubstr("at byte 0")));
  EXPECT_THAT(Rejection("[0, -1e400]"), AllOf(HasSubstr("\"-1e400\""), HasSubstr("at byte 4")));
  EXPECT_THAT(Rejection("1.7976931348623159e308"), HasSubstr("outside the range of a double"));
  EXPECT_THAT(Rejection("0.00000001e317"), HasSubstr("outside the range of a double"));
  EXPECT_THAT(Rejection(std::string(400, '9')), HasSubstr("outside the range of a double"));
  EXPECT_EQ(Canonical("1.7976931348623157e308"), "1.7976931348623157e+308");
}

TEST(CanonicalizeJsonTest, RejectsControlCharactersInStrings) {
  EXPECT_THAT(Rejection("\"a\x01z\""),
              AllOf(HasSubstr("control character U+0001"), HasSubstr("at byte 2")));
  EXPECT_THAT(Rejection("\"tab\there\""), HasSubstr("control character U+0009"));
  EXPECT_THAT(Rejection("\"line\nbreak\""), HasSubstr("control character U+000a"));
  EXPECT_THAT(Rejection(std::string("\"nul\0\"", 6)), HasSubstr("control character U+0000"));
  EXPECT_THAT(Rejection("{\"k\x1f\":1}"), HasSubstr("control character U+001f"));
}

TEST(CanonicalizeJsonTest, RejectsTrailingData) {
  EXPECT_THAT(Rejection("{} x"), AllOf(HasSubstr("unexpected 'x'"), HasSubstr("trailing data"),
                                       HasSubstr("at byte 3")));
  EXPECT_THAT(Rejection("1 2"), HasSubstr("trailing data"));
  EXPECT_THAT(Rejection("[1]]"), HasSubstr("trailing data"));
  EXPECT_THAT(Rejection("{}{}"), HasSubstr("trailing data"));
  EXPECT_THAT(Rejection(std::string("null\0", 5)), HasSubstr("byte 0x00"));
}

TEST(CanonicalizeJsonTest, RejectsOtherSyntaxErrors) {
  EXPECT_THAT(Rejection("[1,]"), AllOf(HasSubstr("unexpected ']'"), HasSubstr("at byte 3")));
  EXPECT_THAT(Rejection("[1 2]"), HasSubstr("expected ',' or ']'"));
  EXPECT_THAT(Rejection("[1,"), HasSubstr("unexpected end of input"));
  EXPECT_THAT(Rejection("[1"), AllOf(HasSubstr("unterminated array"), HasSubstr("at byte 0")));
  EXPECT_THAT(Rejection(R"({"a":1,})"), HasSubstr("expected a member name"));
  EXPECT_THAT(Rejection(R"({"a" 1})"), HasSubstr("expected ':'"));
  EXPECT_THAT(Rejection(R"({"a":1 "b":2})"), HasSubstr("expected ',' or '}'"));
  EXPECT_THAT(Rejection("{1:2}"), HasSubstr("expected a member name"));
  EXPECT_THAT(Rejection("{'a':1}"), HasSubstr("expected a member name"));
  EXPECT_THAT(Rejection(R"({"a":)"), HasSubstr("unexpected end of input"));
  EXPECT_THAT(Rejection(R"({"a")"), HasSubstr("unterminated object"));
  EXPECT_THAT(Rejection(R"({"a":1)"), HasSubstr("unterminated object"));
  EXPECT_THAT(Rejection("\"abc"), AllOf(HasSubstr("unterminated string"), HasSubstr("byte 0")));
  EXPECT_THAT(Rejection("\"abc\\"), HasSubstr("unterminated string"));
  EXPECT_THAT(Rejection(R"("\x")"), AllOf(HasSubstr("invalid escape"), HasSubstr("'x'")));
  EXPECT_THAT(Rejection(R"("\U0041")"), HasSubstr("invalid escape"));
  EXPECT_THAT(Rejection(R"("\u12G4")"), HasSubstr("expected 4 hex digits"));
  EXPECT_THAT(Rejection(R"("\u12")"), HasSubstr("expected 4 hex digits"));
  EXPECT_THAT(Rejection("tru"), HasSubstr("invalid literal, expected true"));
  EXPECT_THAT(Rejection("nul"), HasSubstr("invalid literal, expected null"));
  EXPECT_THAT(Rejection("True"), HasSubstr("unexpected 'T'"));
  EXPECT_THAT(Rejection("[\x0b]"), HasSubstr("unexpected byte 0x0b"));
}

TEST(CanonicalizeJsonTest, NestingLimit) {
  auto nested = [](int depth, std::string_view open, std::string_view close) {
    std::string s;
    for (int i = 0; i < depth; ++i) s += open;
    s += "1";
    for (int i = 0; i < depth; ++i) s += close;
    return s;
  };
  EXPECT_EQ(Canonical(nested(kMaxJsonDepth, "[", "]")), nested(kMaxJsonDepth, "[", "]"));
  EXPECT_EQ(Canonical(nested(kMaxJsonDepth, "{\"a\":", "}")),
            nested(kMaxJsonDepth, "{\"a\":", "}"));
  EXPECT_THAT(Rejection(nested(kMaxJsonDepth + 1, "[", "]")),
              AllOf(HasSubstr("nesting deeper than 256"), HasSubstr("at byte 256")));
  EXPECT_THAT(Rejection(nested(kMaxJsonDepth + 1, "{\"a\":", "}")),
              HasSubstr("nesting deeper than 256"));
  EXPECT_THAT(Rejection(nested(100000, "[", "]")), HasSubstr("nesting deeper than 256"));
  EXPECT_THAT(Rejection(nested(200, "[{\"k\":", "}]")), HasSubstr("nesting deeper than 256"));
}

TEST(CanonicalizeJsonTest, MessageQuotesLongNamesShortly) {
  std::string name(100, 'n');
  std::string message = Rejection("{\"" + name + "\":1,\"" + name + "\":2}");
  EXPECT_THAT(message, HasSubstr("duplicate member name \"nnnnnnnnnn"));
  EXPECT_THAT(message, HasSubstr("...\""));
  EXPECT_LT(message.size(), 120u);
}

TEST(CanonicalizeJsonTest, ReusesBuffersAcrossCalls) {
  // A large document, then small ones: the thread's buffers must not leak stale state.
  std::string big = "[";
  for (int i = 0; i < 100000; ++i) big += "{\"k\":\"v\\n\"},";
  big += "0]";
  ASSERT_TRUE(CanonicalizeJson(big).has_value());
  EXPECT_EQ(Canonical(R"({"b":"\n","a":1})"), R"({"a":1,"b":"\n"})");
  EXPECT_FALSE(CanonicalizeJson("{\"a\":1,\"a\":1}").has_value());
  EXPECT_EQ(Canonical("[1]"), "[1]");
}

TEST(CompareUtf16Test, OrdersLikeUtf16CodeUnits) {
  using internal::CompareUtf16;
  EXPECT_EQ(CompareUtf16("", ""), 0);
  EXPECT_LT(CompareUtf16("", "a"), 0);
  EXPECT_LT(CompareUtf16("a", "b"), 0);
  EXPECT_GT(CompareUtf16("b", "a"), 0);
  EXPECT_LT(CompareUtf16("ab", "abc"), 0);
  EXPECT_LT(CompareUtf16("\x7F", "\xC2\x80"), 0);
  EXPECT_LT(CompareUtf16("\xED\x9F\xBF", "\xF0\x90\x80\x80"), 0);  // D7FF < D800 DC00
  EXPECT_LT(CompareUtf16("\xF0\x90\x80\x80", "\xEE\x80\x80"), 0);  // D800 DC00 < E000
  EXPECT_LT(CompareUtf16("\xF4\x8F\xBF\xBF", "\xEF\xBF\xBF"), 0);  // DBFF DFFF < FFFF
  EXPECT_LT(CompareUtf16("\xF0\x9F\x98\x80", "\xF0\x9F\x98\x81"), 0);
  EXPECT_GT(CompareUtf16("\xEF\xAC\xB3", "\xF0\x9F\x98\x80"), 0);
}

}  // namespace
}  // namespace idem
