#include "idem/fingerprint.h"

#include <algorithm>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "fingerprint/jcs.h"
#include "fingerprint/sha256.h"

namespace idem {
namespace {

using internal::JsonDocument;
using internal::JsonKind;
using internal::JsonValue;

std::string Cat(std::initializer_list<std::string_view> parts) {
  std::string out;
  for (std::string_view part : parts) out.append(part);
  return out;
}

// `text` as a JSON string literal, so that messages stay printable.
std::string Quoted(std::string_view text) {
  std::string out;
  internal::AppendJsonString(text, out);
  return out;
}

// Gives the thread's document back its memory when a call ends, whatever way it ends.
class ScopedDocument {
 public:
  ScopedDocument() : doc_(internal::ThreadJsonDocument()) {}
  ~ScopedDocument() { doc_.ReleaseMemory(); }
  ScopedDocument(const ScopedDocument&) = delete;
  ScopedDocument& operator=(const ScopedDocument&) = delete;

  JsonDocument* operator->() { return &doc_; }
  JsonDocument& operator*() { return doc_; }

 private:
  JsonDocument& doc_;
};

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

std::string_view KindName(JsonKind kind) {
  switch (kind) {
    case JsonKind::kNull:
      return "null";
    case JsonKind::kArray:
      return "an array";
    case JsonKind::kObject:
      return "an object";
    case JsonKind::kString:
      return "a string";
    case JsonKind::kNumber:
      return "a number";
    case JsonKind::kTrue:
    case JsonKind::kFalse:
      return "a boolean";
  }
  return "a value";
}

// An RFC 6901 reference token with ~1 and ~0 decoded; nullopt for another '~' sequence.
std::optional<std::string> DecodeToken(std::string_view token) {
  std::string out;
  out.reserve(token.size());
  for (std::size_t i = 0; i < token.size(); ++i) {
    if (token[i] != '~') {
      out.push_back(token[i]);
    } else if (i + 1 < token.size() && (token[i + 1] == '0' || token[i + 1] == '1')) {
      out.push_back(token[i + 1] == '0' ? '~' : '/');
      ++i;
    } else {
      return std::nullopt;
    }
  }
  return out;
}

// An RFC 6901 array index: "0" or digits without a leading zero, below `size`.
std::optional<std::uint32_t> ArrayIndex(std::string_view token, std::uint32_t size) {
  if (token.empty() || token.size() > 10 || (token.size() > 1 && token[0] == '0')) {
    return std::nullopt;
  }
  std::uint64_t index = 0;
  for (char c : token) {
    if (c < '0' || c > '9') return std::nullopt;
    index = index * 10 + static_cast<std::uint64_t>(c - '0');
  }
  if (index >= size) return std::nullopt;
  return static_cast<std::uint32_t>(index);
}

}  // namespace

std::string Fingerprint::Hex() const {
  constexpr char kDigits[] = "0123456789abcdef";
  std::string hex(bytes.size() * 2, '\0');
  for (std::size_t i = 0; i < bytes.size(); ++i) {
    hex[2 * i] = kDigits[bytes[i] >> 4];
    hex[2 * i + 1] = kDigits[bytes[i] & 0xF];
  }
  return hex;
}

Result<Fingerprint> Fingerprint::FromHex(std::string_view hex) {
  Fingerprint fp;
  if (hex.size() != fp.bytes.size() * 2) {
    return InvalidArgumentError(
        Cat({"fingerprint must be 64 hex characters, got ", std::to_string(hex.size())}));
  }
  for (std::size_t i = 0; i < hex.size(); ++i) {
    if (HexDigit(hex[i]) < 0) {
      return InvalidArgumentError(
          Cat({"fingerprint has a non-hex character at position ", std::to_string(i)}));
    }
  }
  for (std::size_t i = 0; i < fp.bytes.size(); ++i) {
    fp.bytes[i] = static_cast<std::uint8_t>(HexDigit(hex[2 * i]) << 4 | HexDigit(hex[2 * i + 1]));
  }
  return fp;
}

Result<std::string> CanonicalizeJson(std::string_view json) {
  ScopedDocument doc;
  IDEM_RETURN_IF_ERROR(doc->Parse(json));
  return std::string(doc->Canonical());
}

Result<Fingerprint> FingerprintJson(std::string_view json) {
  ScopedDocument doc;
  IDEM_RETURN_IF_ERROR(doc->Parse(json));
  return Fingerprint{internal::Sha256(doc->Canonical())};
}

Fingerprint FingerprintBytes(std::string_view bytes) {
  return Fingerprint{internal::Sha256(bytes)};
}

Fingerprint FingerprintParts(std::initializer_list<std::string_view> parts) {
  internal::Sha256Hasher hasher;
  for (std::string_view part : parts) {
    // The length as 8 bytes, little-endian, then the part.
    char length[8];
    auto size = static_cast<std::uint64_t>(part.size());
    for (int i = 0; i < 8; ++i) length[i] = static_cast<char>((size >> (8 * i)) & 0xFF);
    hasher.Update({length, sizeof length});
    hasher.Update(part);
  }
  return Fingerprint{hasher.Finish()};
}

Result<std::string> JsonPointerText(std::string_view json, std::string_view pointer) {
  ScopedDocument doc;
  IDEM_RETURN_IF_ERROR(doc->Parse(json));
  if (!pointer.empty() && pointer[0] != '/') {
    return InvalidArgumentError("JSON pointer must be empty or start with '/'");
  }
  std::uint32_t at = 0;
  std::size_t next = 0;  // Position of the '/' before the next reference token.
  while (next < pointer.size()) {
    std::size_t slash = pointer.find('/', next + 1);
    if (slash == std::string_view::npos) slash = pointer.size();
    std::string_view where = pointer.substr(0, next);
    std::optional<std::string> token = DecodeToken(pointer.substr(next + 1, slash - next - 1));
    if (!token) {
      return InvalidArgumentError(
          Cat({"JSON pointer has '~' not followed by 0 or 1 after ", Quoted(where)}));
    }
    const JsonValue& v = doc->value(at);
    if (v.kind == JsonKind::kObject) {
      std::span<const std::uint32_t> names = doc->SortedMembers(v);
      auto it = std::lower_bound(
          names.begin(), names.end(), *token, [&](std::uint32_t name, const std::string& t) {
            return internal::CompareUtf16(doc->Text(doc->value(name)), t) < 0;
          });
      if (it == names.end() || doc->Text(doc->value(*it)) != *token) {
        return NotFoundError(
            Cat({"no member ", Quoted(*token), " at JSON pointer ", Quoted(where)}));
      }
      at = *it + 1;
    } else if (v.kind == JsonKind::kArray) {
      std::optional<std::uint32_t> index = ArrayIndex(*token, v.size);
      if (!index) {
        return NotFoundError(Cat({"no element ", Quoted(*token), " in the array of ",
                                  std::to_string(v.size), " at JSON pointer ", Quoted(where)}));
      }
      at += 1;
      for (std::uint32_t k = 0; k < *index; ++k) at = doc->value(at).end;
    } else {
      return NotFoundError(Cat({"JSON pointer ", Quoted(where), " is ", KindName(v.kind),
                                ", which has no member ", Quoted(*token)}));
    }
    next = slash;
  }
  const JsonValue& v = doc->value(at);
  switch (v.kind) {
    case JsonKind::kString:
    case JsonKind::kNumber:
      return std::string(doc->Text(v));
    case JsonKind::kTrue:
      return std::string("true");
    case JsonKind::kFalse:
      return std::string("false");
    default:
      return InvalidArgumentError(Cat({"the value at JSON pointer ", Quoted(pointer), " is ",
                                       KindName(v.kind), ", not a string, number or boolean"}));
  }
}

}  // namespace idem
