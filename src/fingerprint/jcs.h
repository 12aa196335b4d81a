// A strict RFC 8259 parser that keeps a document as a flat array of values, and the RFC 8785
// (JCS) serialiser over it. Internal to src/fingerprint.
//
// A JsonDocument is reused from call to call so that, once warm, parsing and canonicalising
// allocate nothing. Not thread-safe: use one per thread (ThreadJsonDocument).
#ifndef IDEM_FINGERPRINT_JCS_H_
#define IDEM_FINGERPRINT_JCS_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>

#include "idem/status.h"

namespace idem::internal {

enum class JsonKind : std::uint8_t { kNull, kFalse, kTrue, kNumber, kString, kArray, kObject };

// One value. Values are stored in document order (a container before its descendants), so
// value i's descendants are [i + 1, end) and an object member's value directly follows its name.
struct JsonValue {
  JsonKind kind = JsonKind::kNull;
  bool in_scratch = false;   // String or number text lives in the document's scratch buffer.
  std::uint32_t offset = 0;  // String/number: where the text starts (input or scratch).
                             // Object: first of its entries in the member order.
  std::uint32_t size = 0;    // String/number: text length. Array/object: element/member count.
  std::uint32_t end = 0;     // One past the last descendant.
  std::uint32_t pos = 0;     // Where the value starts in the input (a string's opening quote).
};

// Orders valid UTF-8 strings by their UTF-16 code units, as RFC 8785 §3.2.3 sorts member
// names (and any bytes in some total order). Negative, zero or positive like memcmp.
int CompareUtf16(std::string_view a, std::string_view b);

// A growable array of trivially copyable values that, unlike std::vector, never
// value-initialises and appends without a library call when there is room. Reused across
// documents, it stops allocating once warm.
template <typename T>
requires std::is_trivially_copyable_v<T>
class ScratchArray {
 public:
  T* data() { return data_.get(); }
  const T* data() const { return data_.get(); }
  std::size_t size() const { return size_; }
  T& operator[](std::size_t i) { return data_[i]; }
  const T& operator[](std::size_t i) const { return data_[i]; }
  void clear() { size_ = 0; }
  void Truncate(std::size_t size) { size_ = size; }

  // Room for `n` more values at the end; Commit says how many were written.
  T* Reserve(std::size_t n) {
    if (capacity_ - size_ < n) Grow(n);
    return data_.get() + size_;
  }
  void Commit(std::size_t n) { size_ += n; }
  void Append(const T* values, std::size_t n) {
    if (n == 0) return;  // memcpy must not see the null pointer of an empty array.
    std::memcpy(Reserve(n), values, n * sizeof(T));
    size_ += n;
  }
  void PushBack(const T& value) {
    if (size_ == capacity_) Grow(1);
    data_[size_++] = value;
  }
  // Frees the memory if it holds more than `keep_bytes`.
  void Trim(std::size_t keep_bytes) {
    if (capacity_ * sizeof(T) <= keep_bytes) return;
    data_.reset();
    size_ = 0;
    capacity_ = 0;
  }

 private:
  [[gnu::noinline]] void Grow(std::size_t n) {
    std::size_t capacity = std::max({size_ + n, 2 * capacity_, 256 / sizeof(T)});
    auto data = std::make_unique_for_overwrite<T[]>(capacity);
    if (size_ > 0) std::memcpy(data.get(), data_.get(), size_ * sizeof(T));
    data_ = std::move(data);
    capacity_ = capacity;
  }

  std::unique_ptr<T[]> data_;
  std::size_t size_ = 0;
  std::size_t capacity_ = 0;
};

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
  friend class JsonParser;  // Fills the arrays below.

  char* EmitValue(std::uint32_t i, char* out) const;
  char* EmitContainer(std::uint32_t i, char* out) const;
  char* EmitString(const JsonValue& v, char* out) const;

  // A member name being sorted: its first 8 bytes as a number that orders like UTF-16.
  struct SortKey {
    std::uint64_t prefix;
    std::uint32_t index;  // Of the name's value.
    std::uint32_t size;
  };

  std::string_view input_;
  ScratchArray<JsonValue> values_;
  ScratchArray<std::uint32_t> member_order_;
  ScratchArray<std::uint32_t> member_stack_;  // Names of the objects being parsed.
  ScratchArray<SortKey> sort_keys_;           // One object's names while they are sorted.
  ScratchArray<char> scratch_;  // Decoded strings that had escapes, and rewritten numbers.
  ScratchArray<char> out_;
  std::size_t out_size_ = 0;  // Exact length of the canonical form, counted while parsing.
};

// This thread's document. Calls must not nest.
JsonDocument& ThreadJsonDocument();

// Appends `text` (valid UTF-8) as a JCS string literal, quotes included.
void AppendJsonString(std::string_view text, std::string& out);

}  // namespace idem::internal

#endif  // IDEM_FINGERPRINT_JCS_H_
