#include "fingerprint/jcs_number.h"

#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <system_error>

namespace idem::internal {
namespace {

// Writes the number whose decimal digits are `digits[0..k)` (no leading or trailing zeros)
// and whose value is 0.digits × 10^n, laid out as ECMA-262 Number::toString step 6-10 says.
NumberText Layout(bool negative, const char* digits, int k, int n) {
  NumberText text;
  char* out = text.chars.data();
  if (negative) *out++ = '-';
  if (k <= n && n <= 21) {
    // An integer: the digits, then n-k zeros.
    std::memcpy(out, digits, k);
    out += k;
    std::memset(out, '0', n - k);
    out += n - k;
  } else if (0 < n && n <= 21) {
    std::memcpy(out, digits, n);
    out += n;
    *out++ = '.';
    std::memcpy(out, digits + n, k - n);
    out += k - n;
  } else if (-6 < n && n <= 0) {
    *out++ = '0';
    *out++ = '.';
    std::memset(out, '0', -n);
    out += -n;
    std::memcpy(out, digits, k);
    out += k;
  } else {
    *out++ = digits[0];
    if (k > 1) {
      *out++ = '.';
      std::memcpy(out, digits + 1, k - 1);
      out += k - 1;
    }
    *out++ = 'e';
    int e = n - 1;
    *out++ = e < 0 ? '-' : '+';
    if (e < 0) e = -e;
    out = std::to_chars(out, text.chars.data() + text.chars.size(), e).ptr;
  }
  text.size = static_cast<std::uint8_t>(out - text.chars.data());
  return text;
}

NumberText Zero() {
  NumberText text;
  text.chars[0] = '0';
  text.size = 1;
  return text;
}

bool IsDigit(char c) { return c >= '0' && c <= '9'; }

}  // namespace

NumberText EcmaNumberText(double value) {
  if (value == 0) return Zero();  // Both +0 and -0.
  // The shortest round-trip digits, e.g. "-1.2345e+02" or "5e-324".
  char buf[40];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, value, std::chars_format::scientific);
  const char* p = buf;
  bool negative = *p == '-';
  if (negative) ++p;
  char digits[20];
  int k = 0;
  digits[k++] = *p++;
  if (*p == '.') {
    ++p;
    while (*p != 'e') digits[k++] = *p++;
  }
  ++p;  // 'e'
  bool negative_exponent = *p == '-';
  ++p;  // sign
  int exponent = 0;
  std::from_chars(p, end, exponent);
  if (negative_exponent) exponent = -exponent;
  return Layout(negative, digits, k, exponent + 1);
}

std::optional<NumberText> CanonicalNumberSlow(std::string_view literal) {
  double value = 0;
  const char* first = literal.data();
  const char* last = first + literal.size();
  auto [ptr, ec] = std::from_chars(first, last, value, std::chars_format::general);
  if (ec == std::errc::result_out_of_range) {
    // Too large or too small. The decimal exponent of the first significant digit tells which.
    const char* p = first;
    if (*p == '-') ++p;
    std::int64_t point = 0;  // Position of the decimal point relative to the first digit.
    bool seen_nonzero = false;
    for (; p < last && IsDigit(*p); ++p) {
      if (*p != '0') seen_nonzero = true;
      if (seen_nonzero) ++point;
    }
    if (p < last && *p == '.') {
      for (++p; p < last && IsDigit(*p); ++p) {
        if (seen_nonzero) continue;
        if (*p != '0') {
          seen_nonzero = true;
        } else {
          --point;
        }
      }
    }
    std::int64_t exponent = 0;
    if (p < last && (*p == 'e' || *p == 'E')) {
      ++p;
      bool negative = *p == '-';
      if (*p == '-' || *p == '+') ++p;
      for (; p < last && IsDigit(*p); ++p) {
        if (exponent < 1'000'000'000) exponent = exponent * 10 + (*p - '0');
      }
      if (negative) exponent = -exponent;
    }
    if (point + exponent > 0) return std::nullopt;
    return Zero();
  }
  if (ec != std::errc() || ptr != last || !std::isfinite(value)) return std::nullopt;
  return EcmaNumberText(value);
}

std::optional<NumberText> CanonicalNumber(std::string_view literal) {
  const char* p = literal.data();
  const char* last = p + literal.size();
  bool negative = *p == '-';
  if (negative) ++p;

  // Significant digits: the first 16 are kept, `k` counts all from the first non-zero one,
  // `k_nonzero` up to the last non-zero one. `point` is the decimal exponent n of
  // 0.digits × 10^n before applying the literal's exponent.
  char digits[16];
  int k = 0;
  int k_nonzero = 0;
  std::int64_t point = 0;
  auto take = [&](char c) {
    if (k == 0 && c == '0') return;
    if (k < 16) digits[k] = c;
    ++k;
    if (c != '0') k_nonzero = k;
  };
  for (; p < last && IsDigit(*p); ++p) take(*p);
  point = k;
  if (p < last && *p == '.') {
    for (++p; p < last && IsDigit(*p); ++p) {
      if (k == 0 && *p == '0') --point;
      take(*p);
    }
  }
  std::int64_t exponent = 0;
  if (p < last && (*p == 'e' || *p == 'E')) {
    ++p;
    bool negative_exponent = *p == '-';
    if (*p == '-' || *p == '+') ++p;
    for (; p < last && IsDigit(*p); ++p) {
      if (exponent < 1'000'000'000) exponent = exponent * 10 + (*p - '0');
    }
    if (negative_exponent) exponent = -exponent;
  }
  if (k_nonzero == 0) return Zero();  // 0, -0, 0.000, 0e7 ...
  std::int64_t n = point + exponent;
  // 15 digits between 1e-290 and 1e290: normal doubles, where DBL_DIG applies.
  if (k_nonzero <= 15 && n >= -290 && n <= 290) {
    return Layout(negative, digits, k_nonzero, static_cast<int>(n));
  }
  return CanonicalNumberSlow(literal);
}

}  // namespace idem::internal
