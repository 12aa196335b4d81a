// Fingerprints: SHA-256 over a canonical form of what a message asks for (SPEC §1).
//
// JSON is canonicalised by RFC 8785 (JCS): members sorted by UTF-16 code units, numbers
// serialised as ECMAScript serialises IEEE-754 doubles, strings with minimal escapes.
// Input that JCS cannot represent (invalid UTF-8, lone surrogates, duplicate member names,
// numbers outside double range, NaN/Infinity-like tokens, trailing garbage, nesting deeper
// than kMaxJsonDepth) is rejected with kInvalidArgument and a message that says what and where.
//
// All functions are thread-safe and do no I/O.
#ifndef IDEM_FINGERPRINT_H_
#define IDEM_FINGERPRINT_H_

#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>

#include "idem/status.h"

namespace idem {

struct Fingerprint {
  std::array<std::uint8_t, 32> bytes{};

  // 64 lowercase hex characters.
  std::string Hex() const;
  // Parses 64 hex characters (either case).
  static Result<Fingerprint> FromHex(std::string_view hex);

  friend bool operator==(const Fingerprint&, const Fingerprint&) = default;
};

inline constexpr int kMaxJsonDepth = 256;

// The RFC 8785 canonical form of `json`.
Result<std::string> CanonicalizeJson(std::string_view json);

// SHA-256 of the canonical form of `json`.
Result<Fingerprint> FingerprintJson(std::string_view json);

// SHA-256 of the bytes as they are.
Fingerprint FingerprintBytes(std::string_view bytes);

// SHA-256 over several parts, each prefixed by its length, so ("ab","c") != ("a","bc").
// The HTTP gateway uses it for method + path + body.
Fingerprint FingerprintParts(std::initializer_list<std::string_view> parts);

// The value at RFC 6901 JSON pointer `pointer` in `json`, as text: a string's decoded
// contents, or a number/true/false as written canonically. Objects, arrays and null are
// kInvalidArgument; a missing member is kNotFound. Used to take a key from a payload field.
Result<std::string> JsonPointerText(std::string_view json, std::string_view pointer);

}  // namespace idem

#endif  // IDEM_FINGERPRINT_H_
