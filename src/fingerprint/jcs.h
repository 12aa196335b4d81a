// A strict RFC 8259 parser that keeps a document as a flat array of values, and the RFC 8785
// (JCS) serialiser over it. Internal to src/fingerprint.
//
// A JsonDocument is reused from call to call so that, once warm, parsing and canonicalising
// allocate nothing. Not thread-safe: use one per thread (ThreadJsonDocument).
#ifndef IDEM_FINGERPRINT_JCS_H_
#define IDEM_FINGERPRINT_JCS_H_

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "idem/status.h"

namespace idem::internal {

enum class JsonKind : std::uint8_t { kNull, kFalse, kTrue, kNumber, kString, kArray, kObject };

// One value. Values are stored in document order (a container before its descendants), so
// value i's descendants are [i + 1, end) and an object member's value directly follows its name.
struct JsonValue {
  JsonKind kind = JsonKind::kNull;
  bool in_scratch = false;  // String or number text lives in the document's scratch buffer.
  std::uint32_t offset = 0;  // String/number: where the text starts (input or scratch).
                             // Object: first of its entries in the member order.
  std::uint32_t size = 0;    // String/number: text length. Array/object: element/member count.
  std::uint32_t end = 0;     // One past the last descendant.
  std::uint32_t pos = 0;     // Byte offset in the input, for messages.
};

// Orders strings by their UTF-16 code units, as RFC 8785 §3.2.3 sorts member names.
// Both must be valid UTF-8. Negative, zero or positive like memcmp.
int CompareUtf16(std::string_view a, std::string_view b);

class JsonDocument {
 public:
  // Largest input accepted; offsets are 32-bit.
  static constexpr std::size_t kMaxInputBytes = std::size_t{1} << 28;

  // Parses and validates `json`, replacing the previous document. On success the document
  // refers to `json`, which must outlive its use. On failure: kInvalidArgument naming what
  // is wrong and its byte offset.
  Status Parse(std::string_view json);

  // The canonical form of the parsed document, in a buffer the document owns; valid until
  // the next Parse or ReleaseMemory.
  std::string_view Canonical();

  const JsonValue& value(std::uint32_t i) const { return values_[i]; }
  // A string's decoded contents or a number's canonical text.
  std::string_view Text(const JsonValue& v) const;
  // An object's member names (indices of the name values), sorted by CompareUtf16.
  std::span<const std::uint32_t> SortedMembers(const JsonValue& object) const;

  // Frees buffers that a large document made large; keeps small ones for reuse.
  void ReleaseMemory();

 private:
  friend class JsonParser;

  char* Emit(std::uint32_t i, char* out) const;
  char* EmitString(const JsonValue& v, char* out) const;

  std::string_view input_;
  std::vector<JsonValue> values_;
  std::vector<std::uint32_t> member_order_;
  std::vector<std::uint32_t> member_stack_;  // Names of the objects being parsed.
  std::string scratch_;  // Decoded strings that had escapes, and rewritten numbers.
  std::vector<char> out_;
  std::size_t out_size_ = 0;  // Exact length of the canonical form, counted while parsing.
};

// This thread's document. Calls must not nest.
JsonDocument& ThreadJsonDocument();

// Appends `text` (valid UTF-8) as a JCS string literal, quotes included.
void AppendJsonString(std::string_view text, std::string& out);

}  // namespace idem::internal

#endif  // IDEM_FINGERPRINT_JCS_H_
