// Numbers: RFC 8785 Appendix B, ECMAScript's layout rules, and the fast path against the
// from_chars/to_chars path.
#include "fingerprint/jcs_number.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <optional>
#include <random>
#include <string>

#include "idem/fingerprint.h"

namespace idem::internal {
namespace {

struct Sample {
  std::uint64_t bits;
  const char* expected;
};

// RFC 8785 Appendix B, all finite entries (NaN and Infinity have no JSON form).
constexpr Sample kAppendixB[] = {
    {0x0000000000000000, "0"},
    {0x8000000000000000, "0"},
    {0x0000000000000001, "5e-324"},
    {0x8000000000000001, "-5e-324"},
    {0x7fefffffffffffff, "1.7976931348623157e+308"},
    {0xffefffffffffffff, "-1.7976931348623157e+308"},
    {0x4340000000000000, "9007199254740992"},
    {0xc340000000000000, "-9007199254740992"},
    {0x4430000000000000, "295147905179352830000"},
    {0x44b52d02c7e14af5, "9.999999999999997e+22"},
    {0x44b52d02c7e14af6, "1e+23"},
    {0x44b52d02c7e14af7, "1.0000000000000001e+23"},
    {0x444b1ae4d6e2ef4e, "999999999999999700000"},
    {0x444b1ae4d6e2ef4f, "999999999999999900000"},
    {0x444b1ae4d6e2ef50, "1e+21"},
    {0x3eb0c6f7a0b5ed8c, "9.999999999999997e-7"},
    {0x3eb0c6f7a0b5ed8d, "0.000001"},
    {0x41b3de4355555553, "333333333.3333332"},
    {0x41b3de4355555554, "333333333.33333325"},
    {0x41b3de4355555555, "333333333.3333333"},
    {0x41b3de4355555556, "333333333.3333334"},
    {0x41b3de4355555557, "333333333.33333343"},
    {0xbecbf647612f3696, "-0.0000033333333333333333"},
    {0x43143ff3c1cb0959, "1424953923781206.2"},
};

std::string Printed17(double d) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.17g", d);
  return buf;
}

TEST(JcsNumberTest, AppendixBThroughCanonicalizeJson) {
  for (const Sample& s : kAppendixB) {
    double d = std::bit_cast<double>(s.bits);
    std::string json = Printed17(d);
    SCOPED_TRACE(json);
    Result<std::string> canonical = CanonicalizeJson(json);
    ASSERT_TRUE(canonical.has_value()) << canonical.status().ToString();
    EXPECT_EQ(*canonical, s.expected);
    // And inside a document.
    Result<std::string> in_array = CanonicalizeJson("[" + json + "]");
    ASSERT_TRUE(in_array.has_value());
    EXPECT_EQ(*in_array, std::string("[").append(s.expected).append("]"));
  }
}

TEST(JcsNumberTest, AppendixBFromDoubles) {
  for (const Sample& s : kAppendixB) {
    EXPECT_EQ(EcmaNumberText(std::bit_cast<double>(s.bits)).view(), s.expected)
        << std::hex << s.bits;
  }
}

TEST(JcsNumberTest, AppendixBExpectedTextIsCanonical) {
  // The expected strings are valid JSON numbers and canonical themselves.
  for (const Sample& s : kAppendixB) {
    std::optional<NumberText> text = CanonicalNumber(s.expected);
    ASSERT_TRUE(text.has_value()) << s.expected;
    EXPECT_EQ(text->view(), s.expected);
  }
}

std::string Canon(std::string_view literal) {
  std::optional<NumberText> text = CanonicalNumber(literal);
  std::optional<NumberText> slow = CanonicalNumberSlow(literal);
  EXPECT_EQ(text.has_value(), slow.has_value()) << literal;
  if (!text || !slow) return "<out of range>";
  EXPECT_EQ(text->view(), slow->view()) << literal;
  return std::string(text->view());
}

TEST(JcsNumberTest, EcmaScriptLayout) {
  // Plain integers up to 21 digits, exponent form from 1e21.
  EXPECT_EQ(Canon("1E2"), "100");
  EXPECT_EQ(Canon("1e20"), "100000000000000000000");
  EXPECT_EQ(Canon("1e21"), "1e+21");
  EXPECT_EQ(Canon("1.5e21"), "1.5e+21");
  EXPECT_EQ(Canon("123456789012345678901"), "123456789012345680000");
  EXPECT_EQ(Canon("1234567890123456789012"), "1.2345678901234568e+21");
  // Plain decimals down to 1e-6, exponent form below 1e-6.
  EXPECT_EQ(Canon("0.000001"), "0.000001");
  EXPECT_EQ(Canon("0.0000015"), "0.0000015");
  EXPECT_EQ(Canon("1e-7"), "1e-7");
  EXPECT_EQ(Canon("0.0000001"), "1e-7");
  EXPECT_EQ(Canon("1.5e-7"), "1.5e-7");
  EXPECT_EQ(Canon("-1.5E-7"), "-1.5e-7");
  EXPECT_EQ(Canon("12.5"), "12.5");
  EXPECT_EQ(Canon("0.5"), "0.5");
  EXPECT_EQ(Canon("-0.5"), "-0.5");
  // Zero in every spelling.
  EXPECT_EQ(Canon("0"), "0");
  EXPECT_EQ(Canon("-0"), "0");
  EXPECT_EQ(Canon("-0.0"), "0");
  EXPECT_EQ(Canon("0e999999999999"), "0");
  EXPECT_EQ(Canon("0.000e-5"), "0");
  // Trailing zeros and redundant exponents.
  EXPECT_EQ(Canon("4.50"), "4.5");
  EXPECT_EQ(Canon("1.0"), "1");
  EXPECT_EQ(Canon("100e-2"), "1");
  EXPECT_EQ(Canon("0.00100e3"), "1");
  EXPECT_EQ(Canon("2e-3"), "0.002");
  EXPECT_EQ(Canon("1E30"), "1e+30");
  EXPECT_EQ(Canon("0.000000000000000000000000001"), "1e-27");
  EXPECT_EQ(Canon("333333333.33333329"), "333333333.3333333");
  // Shortest digits, not the digits written.
  EXPECT_EQ(Canon("0.1000000000000000055511151231257827"), "0.1");
  EXPECT_EQ(Canon("9007199254740993"), "9007199254740992");
  EXPECT_EQ(Canon("12345678901234567890"), "12345678901234567000");
  EXPECT_EQ(Canon("0.30000000000000004"), "0.30000000000000004");
  EXPECT_EQ(Canon("123456789012345.6"), "123456789012345.6");
  EXPECT_EQ(Canon("1234567890123456.7"), "1234567890123456.8");
  // Range ends.
  EXPECT_EQ(Canon("1.7976931348623157e308"), "1.7976931348623157e+308");
  EXPECT_EQ(Canon("2.2250738585072014e-308"), "2.2250738585072014e-308");
  EXPECT_EQ(Canon("4.9406564584124654e-324"), "5e-324");
  EXPECT_EQ(Canon("3e-324"), "5e-324");
  EXPECT_EQ(Canon("1e-400"), "0");
  EXPECT_EQ(Canon("-1e-400"), "0");
  EXPECT_EQ(Canon("1e-290"), "1e-290");
  EXPECT_EQ(Canon("1e290"), "1e+290");
  EXPECT_EQ(Canon("1e-291"), "1e-291");
  EXPECT_EQ(Canon("1e291"), "1e+291");
  EXPECT_EQ(Canon("1e400"), "<out of range>");
  EXPECT_EQ(Canon("-1e400"), "<out of range>");
  EXPECT_EQ(Canon("1.7976931348623159e308"), "<out of range>");
  EXPECT_EQ(Canon("1e99999999999999999999"), "<out of range>");
  EXPECT_EQ(Canon("1e-99999999999999999999"), "0");
}

TEST(JcsNumberTest, EcmaNumberTextOfSpecialDoubles) {
  EXPECT_EQ(EcmaNumberText(0.0).view(), "0");
  EXPECT_EQ(EcmaNumberText(-0.0).view(), "0");
  EXPECT_EQ(EcmaNumberText(1.0).view(), "1");
  EXPECT_EQ(EcmaNumberText(-1.0).view(), "-1");
  EXPECT_EQ(EcmaNumberText(0.1).view(), "0.1");
  EXPECT_EQ(EcmaNumberText(1e21).view(), "1e+21");
  EXPECT_EQ(EcmaNumberText(1e-7).view(), "1e-7");
  EXPECT_EQ(EcmaNumberText(std::numeric_limits<double>::max()).view(), "1.7976931348623157e+308");
  EXPECT_EQ(EcmaNumberText(std::numeric_limits<double>::min()).view(), "2.2250738585072014e-308");
  EXPECT_EQ(EcmaNumberText(std::numeric_limits<double>::denorm_min()).view(), "5e-324");
  EXPECT_EQ(EcmaNumberText(-std::numeric_limits<double>::max()).view(), "-1.7976931348623157e+308");
  EXPECT_EQ(EcmaNumberText(123456789.0).view(), "123456789");
  EXPECT_EQ(EcmaNumberText(-0.0000033333333333333333).view(), "-0.0000033333333333333333");
}

// The fast path (decimals of at most 15 significant digits) agrees with from_chars+to_chars
// on literals written in every way, over the whole range where it applies and beyond.
TEST(JcsNumberTest, FastPathMatchesSlowPath) {
  std::mt19937_64 rng(20240318);
  for (int i = 0; i < 200000; ++i) {
    std::string literal;
    if (rng() % 2) literal += '-';
    int digits = 1 + static_cast<int>(rng() % 17);
    int point = static_cast<int>(rng() % static_cast<std::uint64_t>(digits + 1));
    std::string mantissa;
    for (int d = 0; d < digits; ++d) mantissa += static_cast<char>('0' + rng() % 10);
    // No leading zeros in the integer part.
    std::string int_part = mantissa.substr(0, static_cast<std::size_t>(point));
    std::string frac_part = mantissa.substr(static_cast<std::size_t>(point));
    while (int_part.size() > 1 && int_part[0] == '0') int_part.erase(0, 1);
    if (int_part.empty()) int_part.push_back('0');
    literal += int_part;
    if (!frac_part.empty()) literal.append(".").append(frac_part);
    if (rng() % 3 != 0) {
      int exponent = static_cast<int>(rng() % 640) - 320;
      literal += rng() % 2 ? "e" : "E";
      literal += std::to_string(exponent);
    }
    std::optional<NumberText> fast = CanonicalNumber(literal);
    std::optional<NumberText> slow = CanonicalNumberSlow(literal);
    ASSERT_EQ(fast.has_value(), slow.has_value()) << literal;
    if (fast) {
      ASSERT_EQ(fast->view(), slow->view()) << literal;
    }
  }
}

// Random doubles: their shortest representation, written out, canonicalises to itself, and
// the %.17g form canonicalises to the same text.
TEST(JcsNumberTest, RandomDoublesRoundTrip) {
  std::mt19937_64 rng(7);
  for (int i = 0; i < 100000; ++i) {
    double d = std::bit_cast<double>(rng());
    if (!std::isfinite(d)) continue;
    std::string text(EcmaNumberText(d).view());
    ASSERT_EQ(std::strtod(text.c_str(), nullptr), d == 0 ? 0.0 : d) << text;
    std::optional<NumberText> again = CanonicalNumber(text);
    ASSERT_TRUE(again.has_value()) << text;
    ASSERT_EQ(again->view(), text);
    std::optional<NumberText> from17 = CanonicalNumber(Printed17(d));
    ASSERT_TRUE(from17.has_value());
    ASSERT_EQ(from17->view(), text) << Printed17(d);
  }
}

}  // namespace
}  // namespace idem::internal
