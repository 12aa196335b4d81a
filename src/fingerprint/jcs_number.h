// Numbers as RFC 8785 writes them: the IEEE-754 double a JSON number denotes, serialised by
// ECMAScript's Number::toString (shortest round-trip digits; plain decimal for
// 1e-7 <= |x| < 1e21, exponent form otherwise; -0 as "0").
#ifndef IDEM_FINGERPRINT_JCS_NUMBER_H_
#define IDEM_FINGERPRINT_JCS_NUMBER_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace idem::internal {

// Text of at most 32 characters, held by value.
struct NumberText {
  std::array<char, 32> chars{};
  std::uint8_t size = 0;

  std::string_view view() const { return {chars.data(), size}; }
};

// ECMAScript Number::toString(value). `value` must be finite.
NumberText EcmaNumberText(double value);

// The canonical text of `literal`, which must already match the RFC 8259 number grammar.
// nullopt when the number overflows a double (|x| rounds to infinity). A number too small
// for a double rounds to 0, as ECMAScript's JSON.parse does.
// Decimals of at most 15 significant digits in the normal range take a fast path that never
// converts to binary: by DBL_DIG such a decimal is the shortest one naming its double.
std::optional<NumberText> CanonicalNumber(std::string_view literal);

// CanonicalNumber without the fast path: from_chars, then EcmaNumberText. For tests.
std::optional<NumberText> CanonicalNumberSlow(std::string_view literal);

}  // namespace idem::internal

#endif  // IDEM_FINGERPRINT_JCS_NUMBER_H_
