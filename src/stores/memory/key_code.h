// KeyCode: the compact, canonical form a memory-store record keeps its key in.
//
// Every key maps to exactly one KeyCode (so equal keys have equal codes and hashes):
//   form 1..16   raw bytes, form = length, zero-padded.
//   form 17..32  lowercase hex of `form` characters (digits count as lowercase), packed two
//                characters per byte, first character in the high nibble.
//   form 49..64  uppercase hex of `form - 32` characters, packed the same way.
//   kLongForm    anything else: words = {hash of the key, its first 8 bytes}; the record keeps
//                the key itself out of line and equality compares it too.
#ifndef IDEM_STORES_MEMORY_KEY_CODE_H_
#define IDEM_STORES_MEMORY_KEY_CODE_H_

#include <cstdint>
#include <string>
#include <string_view>

namespace idem::memory_internal {

inline constexpr std::uint8_t kLongForm = 255;

struct KeyCode {
  std::uint64_t w[2] = {0, 0};
  std::uint8_t form = 0;

  bool IsLong() const { return form == kLongForm; }
  friend bool operator==(const KeyCode&, const KeyCode&) = default;
};

// `key` must be non-empty.
KeyCode EncodeKey(std::string_view key);

// The key `code` was made from. Not for kLongForm (the record keeps that key out of line).
std::string DecodeKey(const KeyCode& code);
// The same, appended to `out`.
void AppendKey(const KeyCode& code, std::string* out);

}  // namespace idem::memory_internal

#endif  // IDEM_STORES_MEMORY_KEY_CODE_H_
