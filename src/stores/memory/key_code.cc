#include "stores/memory/key_code.h"

#include <array>
#include <cstring>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "absl/hash/hash.h"

namespace idem::memory_internal {
namespace {

constexpr std::uint8_t kMaxHexChars = 32;  // 16 bytes of nibbles
constexpr std::uint8_t kUpperBase = 32;    // form = kUpperBase + length for uppercase hex

enum class HexClass { kLowerHex, kUpperHex, kNoHex };

#if defined(__SSE2__)
// 32 characters -> 16 bytes, first character in the high nibble (meaningful only for hex);
// and whether they are all digits or lowercase (kLowerHex), else all digits or uppercase
// (kUpperHex).
HexClass DecodeHex32(const char* chars, std::uint64_t out[2]) {
  const __m128i zero = _mm_set1_epi8('0' - 1);
  const __m128i nine = _mm_set1_epi8('9' + 1);
  const __m128i lower_a = _mm_set1_epi8('a' - 1);
  const __m128i lower_f = _mm_set1_epi8('f' + 1);
  const __m128i upper_a = _mm_set1_epi8('A' - 1);
  const __m128i upper_f = _mm_set1_epi8('F' + 1);
  int lower_ok = 0;
  int upper_ok = 0;
  for (int half = 0; half < 2; ++half) {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(chars + 16 * half));
    // Signed compares: bytes >= 0x80 are negative and fail every range.
    const __m128i digit = _mm_and_si128(_mm_cmpgt_epi8(v, zero), _mm_cmplt_epi8(v, nine));
    const __m128i lower = _mm_and_si128(_mm_cmpgt_epi8(v, lower_a), _mm_cmplt_epi8(v, lower_f));
    const __m128i upper = _mm_and_si128(_mm_cmpgt_epi8(v, upper_a), _mm_cmplt_epi8(v, upper_f));
    lower_ok |= (_mm_movemask_epi8(_mm_or_si128(digit, lower)) ^ 0xFFFF) << (16 * half);
    upper_ok |= (_mm_movemask_epi8(_mm_or_si128(digit, upper)) ^ 0xFFFF) << (16 * half);
    // Nibbles: c - '0' for digits, (c | 0x20) - 'a' + 10 for letters.
    const __m128i from_digit = _mm_sub_epi8(v, _mm_set1_epi8('0'));
    const __m128i from_letter =
        _mm_sub_epi8(_mm_or_si128(v, _mm_set1_epi8(0x20)), _mm_set1_epi8('a' - 10));
    const __m128i nib =
        _mm_or_si128(_mm_and_si128(digit, from_digit), _mm_andnot_si128(digit, from_letter));
    // Each 16-bit lane holds (even char, odd char): make it (even << 4) | odd.
    const __m128i even = _mm_and_si128(nib, _mm_set1_epi16(0x00FF));
    const __m128i odd = _mm_and_si128(_mm_srli_epi16(nib, 8), _mm_set1_epi16(0x000F));
    const __m128i bytes = _mm_packus_epi16(
        _mm_or_si128(_mm_slli_epi16(_mm_and_si128(even, _mm_set1_epi16(0x0F)), 4), odd),
        _mm_setzero_si128());
    _mm_storel_epi64(reinterpret_cast<__m128i*>(&out[half]), bytes);
  }
  if (lower_ok == 0) return HexClass::kLowerHex;
  if (upper_ok == 0) return HexClass::kUpperHex;
  return HexClass::kNoHex;
}
#else
constexpr std::uint8_t kLower = 0x10;  // a-f
constexpr std::uint8_t kUpper = 0x20;  // A-F
constexpr std::uint8_t kNotHex = 0x40;

// Nibble value in the low 4 bits; the class of the character in the high bits.
constexpr std::array<std::uint8_t, 256> MakeHexTable() {
  std::array<std::uint8_t, 256> t{};
  for (auto& v : t) v = kNotHex;
  for (int c = '0'; c <= '9'; ++c) t[c] = static_cast<std::uint8_t>(c - '0');
  for (int c = 'a'; c <= 'f'; ++c) t[c] = static_cast<std::uint8_t>(kLower | (c - 'a' + 10));
  for (int c = 'A'; c <= 'F'; ++c) t[c] = static_cast<std::uint8_t>(kUpper | (c - 'A' + 10));
  return t;
}
constexpr std::array<std::uint8_t, 256> kHex = MakeHexTable();

HexClass DecodeHex32(const char* chars, std::uint64_t out[2]) {
  unsigned char buf[16];
  std::uint8_t seen = 0;
  for (std::size_t i = 0; i < 16; ++i) {
    const std::uint8_t hi = kHex[static_cast<unsigned char>(chars[2 * i])];
    const std::uint8_t lo = kHex[static_cast<unsigned char>(chars[2 * i + 1])];
    seen |= hi | lo;
    buf[i] = static_cast<unsigned char>(((hi & 0x0F) << 4) | (lo & 0x0F));
  }
  std::memcpy(out, buf, sizeof(buf));
  if ((seen & (kNotHex | kUpper)) == 0) return HexClass::kLowerHex;
  if ((seen & (kNotHex | kLower)) == 0) return HexClass::kUpperHex;
  return HexClass::kNoHex;
}
#endif

void PackBytes(KeyCode& code, const void* bytes, std::size_t n) {
  unsigned char buf[16] = {};
  std::memcpy(buf, bytes, n);
  std::memcpy(code.w, buf, sizeof(buf));
}

}  // namespace

KeyCode EncodeKey(std::string_view key) {
  KeyCode code;
  const std::size_t n = key.size();
  if (n <= 16) {
    code.form = static_cast<std::uint8_t>(n);
    PackBytes(code, key.data(), n);
    return code;
  }
  if (n <= kMaxHexChars) {
    HexClass c;
    if (n == kMaxHexChars) {
      c = DecodeHex32(key.data(), code.w);
    } else {
      // Pad with '0' (a digit: nibble 0, either case), so every length decodes as 32.
      char padded[kMaxHexChars];
      std::memset(padded, '0', sizeof(padded));
      std::memcpy(padded, key.data(), n);
      c = DecodeHex32(padded, code.w);
    }
    if (c != HexClass::kNoHex) {
      code.form = static_cast<std::uint8_t>(c == HexClass::kLowerHex ? n : kUpperBase + n);
      return code;
    }
    code.w[0] = code.w[1] = 0;
  }
  code.form = kLongForm;
  code.w[0] = absl::HashOf(absl::string_view(key.data(), key.size()));
  std::memcpy(&code.w[1], key.data(), sizeof(code.w[1]));
  return code;
}

void AppendKey(const KeyCode& code, std::string* out) {
  unsigned char buf[16];
  std::memcpy(buf, code.w, sizeof(buf));
  if (code.form <= 16) {
    out->append(reinterpret_cast<const char*>(buf), code.form);
    return;
  }
  const bool upper = code.form > kUpperBase;
  const std::size_t n = upper ? code.form - kUpperBase : code.form;
  const char* digits = upper ? "0123456789ABCDEF" : "0123456789abcdef";
  const std::size_t at = out->size();
  out->resize(at + n);
  char* key = out->data() + at;
  for (std::size_t i = 0; i < n; ++i) {
    key[i] = digits[(buf[i / 2] >> (i % 2 == 0 ? 4 : 0)) & 0x0F];
  }
}

std::string DecodeKey(const KeyCode& code) {
  std::string key;
  AppendKey(code, &key);
  return key;
}

}  // namespace idem::memory_internal
