#include "fingerprint/jcs.h"

#include <algorithm>
#include <cstring>
#include <optional>
#include <string>
#include <utility>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "fingerprint/jcs_number.h"
#include "idem/fingerprint.h"

namespace idem::internal {
namespace {

// Bytes that end a run of string contents that can be copied as they are: the closing quote,
// a backslash, a control character (an error) and the start of a multi-byte UTF-8 sequence
// (validated one by one).
constexpr bool IsSpecialInString(unsigned char c) {
  return c == '"' || c == '\\' || c < 0x20 || c >= 0x80;
}

const char* ScanStringRun(const char* p, const char* end) {
#if defined(__SSE2__)
  const __m128i quote = _mm_set1_epi8('"');
  const __m128i backslash = _mm_set1_epi8('\\');
  const __m128i space = _mm_set1_epi8(0x20);
  while (end - p >= 16) {
    __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    // Signed: bytes >= 0x80 are negative, so this also catches non-ASCII bytes.
    __m128i special =
        _mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(v, quote), _mm_cmpeq_epi8(v, backslash)),
                     _mm_cmplt_epi8(v, space));
    int mask = _mm_movemask_epi8(special);
    if (mask != 0) return p + __builtin_ctz(static_cast<unsigned>(mask));
    p += 16;
  }
#endif
  while (p < end && !IsSpecialInString(static_cast<unsigned char>(*p))) ++p;
  return p;
}

// Space, tab, line feed or carriage return: one compare and one bit test.
bool IsWhitespace(char ch) {
  constexpr std::uint64_t kWhitespace = (std::uint64_t{1} << ' ') | (std::uint64_t{1} << '\t') |
                                        (std::uint64_t{1} << '\n') | (std::uint64_t{1} << '\r');
  auto c = static_cast<unsigned char>(ch);
  return c <= ' ' && ((kWhitespace >> c) & 1) != 0;
}

// The end of a run of whitespace, such as the indentation of pretty-printed JSON.
const char* SkipWhitespaceRun(const char* p, const char* end) {
#if defined(__SSE2__)
  const __m128i space = _mm_set1_epi8(' ');
  const __m128i tab = _mm_set1_epi8('\t');
  const __m128i line_feed = _mm_set1_epi8('\n');
  const __m128i carriage_return = _mm_set1_epi8('\r');
  while (end - p >= 16) {
    __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    __m128i white = _mm_or_si128(
        _mm_or_si128(_mm_cmpeq_epi8(v, space), _mm_cmpeq_epi8(v, tab)),
        _mm_or_si128(_mm_cmpeq_epi8(v, line_feed), _mm_cmpeq_epi8(v, carriage_return)));
    auto other = static_cast<unsigned>(~_mm_movemask_epi8(white)) & 0xFFFF;
    if (other != 0) return p + __builtin_ctz(other);
    p += 16;
  }
#endif
  while (p < end && IsWhitespace(*p)) ++p;
  return p;
}

// memcpy for the short strings JSON is made of, without a library call.
inline char* CopyBytes(const char* from, std::size_t n, char* to) {
  if (n >= 8 && n <= 16) {
    std::uint64_t head;
    std::uint64_t tail;
    std::memcpy(&head, from, 8);
    std::memcpy(&tail, from + n - 8, 8);
    std::memcpy(to, &head, 8);
    std::memcpy(to + n - 8, &tail, 8);
  } else if (n >= 4 && n < 8) {
    std::uint32_t head;
    std::uint32_t tail;
    std::memcpy(&head, from, 4);
    std::memcpy(&tail, from + n - 4, 4);
    std::memcpy(to, &head, 4);
    std::memcpy(to + n - 4, &tail, 4);
  } else if (n < 4) {
    for (std::size_t i = 0; i < n; ++i) to[i] = from[i];
  } else {
    std::memcpy(to, from, n);
  }
  return to + n;
}

bool IsDigit(char c) { return c >= '0' && c <= '9'; }

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// How many bytes longer than the character itself its JCS escape is.
int EscapeGrowth(std::uint32_t c) {
  if (c == '"' || c == '\\' || c == '\b' || c == '\f' || c == '\n' || c == '\r' || c == '\t') {
    return 1;
  }
  return c < 0x20 ? 5 : 0;
}

// Writes code point `cp` as UTF-8 (1 to 4 bytes) and returns the end.
char* WriteUtf8(std::uint32_t cp, char* out) {
  if (cp < 0x80) {
    *out++ = static_cast<char>(cp);
  } else if (cp < 0x800) {
    *out++ = static_cast<char>(0xC0 | (cp >> 6));
    *out++ = static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    *out++ = static_cast<char>(0xE0 | (cp >> 12));
    *out++ = static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    *out++ = static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    *out++ = static_cast<char>(0xF0 | (cp >> 18));
    *out++ = static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    *out++ = static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    *out++ = static_cast<char>(0x80 | (cp & 0x3F));
  }
  return out;
}

constexpr char kHexDigits[] = "0123456789abcdef";

// Writes `text` with the minimal escapes of RFC 8785 §3.2.2.2: \" \\ \b \f \n \r \t, other
// control characters as \u00xx, everything else as it is. Needs EscapeGrowth more bytes than text.
char* WriteEscaped(std::string_view text, char* out) {
  for (char ch : text) {
    auto c = static_cast<unsigned char>(ch);
    if (c >= 0x20 && c != '"' && c != '\\') {
      *out++ = ch;
      continue;
    }
    *out++ = '\\';
    switch (c) {
      case '"':
        *out++ = '"';
        break;
      case '\\':
        *out++ = '\\';
        break;
      case '\b':
        *out++ = 'b';
        break;
      case '\f':
        *out++ = 'f';
        break;
      case '\n':
        *out++ = 'n';
        break;
      case '\r':
        *out++ = 'r';
        break;
      case '\t':
        *out++ = 't';
        break;
      default:
        *out++ = 'u';
        *out++ = '0';
        *out++ = '0';
        *out++ = kHexDigits[c >> 4];
        *out++ = kHexDigits[c & 0xF];
    }
  }
  return out;
}

std::string Hex4(std::uint32_t u) {
  std::string s = "\\u";
  for (int shift = 12; shift >= 0; shift -= 4) s.push_back(kHexDigits[(u >> shift) & 0xF]);
  return s;
}

// A short, printable quote of input text for messages.
std::string Quote(std::string_view text) {
  constexpr std::size_t kMax = 40;
  std::string out;
  bool cut = text.size() > kMax;
  if (cut) {
    text = text.substr(0, kMax);
    // Do not cut a UTF-8 sequence in half.
    while (!text.empty() && (static_cast<unsigned char>(text.back()) & 0xC0) == 0x80) {
      text.remove_suffix(1);
    }
    if (!text.empty() && static_cast<unsigned char>(text.back()) >= 0xC0) text.remove_suffix(1);
  }
  AppendJsonString(text, out);
  if (cut) out.insert(out.size() - 1, "...");
  return out;
}

std::string ByteName(unsigned char c) {
  if (c >= 0x20 && c < 0x7F) return {'\'', static_cast<char>(c), '\''};
  std::string s = "byte 0x";
  s.push_back(kHexDigits[c >> 4]);
  s.push_back(kHexDigits[c & 0xF]);
  return s;
}

// UTF-8 byte order is code point order; UTF-16 order differs in one place: characters above
// U+FFFF (lead bytes F0-F4; surrogate pairs D800-DBFF in UTF-16) sort before U+E000-U+FFFF
// (lead bytes EE-EF). Bytes from EE up are only ever lead bytes, so mapping F0-F4 below EE-EF
// gives byte strings whose byte order is UTF-16 order.
// (Bytes F5-FF, never in UTF-8, keep their place, so the mapping stays one to one.)
constexpr std::uint8_t Utf16OrderByte(std::uint8_t c) {
  if (c < 0xEE || c > 0xF4) return c;
  if (c >= 0xF0) return static_cast<std::uint8_t>(c - 2);  // F0-F4 -> EE-F2
  return static_cast<std::uint8_t>(c + 5);                 // EE-EF -> F3-F4
}

}  // namespace

int CompareUtf16(std::string_view a, std::string_view b) {
  std::size_t n = std::min(a.size(), b.size());
  for (std::size_t i = 0; i < n; ++i) {
    if (a[i] == b[i]) continue;
    return Utf16OrderByte(static_cast<std::uint8_t>(a[i])) <
                   Utf16OrderByte(static_cast<std::uint8_t>(b[i]))
               ? -1
               : 1;
  }
  if (a.size() == b.size()) return 0;
  return a.size() < b.size() ? -1 : 1;
}

// Recursive descent over the input. Each Parse* function takes the position of what it reads,
// appends the values it reads to the document and returns the position after them, or nullptr
// after recording the first error. The position travels in a register, not in a member.
class JsonParser {
 public:
  JsonParser(JsonDocument& doc, std::string_view json)
      : doc_(doc), begin_(json.data()), end_(json.data() + json.size()) {}

  Status Run() {
    const char* p = SkipWhitespace(begin_);
    if (p == end_) return InvalidArgumentError("invalid JSON: empty input");
    p = ParseValue(p, 0);
    if (p == nullptr) return InvalidArgumentError(std::move(error_));
    p = SkipWhitespace(p);
    if (p != end_) {
      FailUnexpected(p, "after the JSON value (trailing data)");
      return InvalidArgumentError(std::move(error_));
    }
    return OkStatus();
  }

 private:
  // Error paths are out of line so that the parsing functions stay small.
  [[gnu::cold, gnu::noinline]] const char* Fail(const char* at, std::string_view what,
                                                std::string_view what2 = {},
                                                std::string_view what3 = {}) {
    error_ = "invalid JSON: ";
    error_.append(what);
    error_.append(what2);
    error_.append(what3);
    error_.append(" at byte ");
    error_.append(std::to_string(at - begin_));
    return nullptr;
  }

  // "unexpected 'x', <context>"
  [[gnu::cold, gnu::noinline]] const char* FailUnexpected(const char* at,
                                                          std::string_view context) {
    if (at == end_) return Fail(at, "unexpected end of input, ", context);
    std::string what = "unexpected ";
    what += ByteName(static_cast<unsigned char>(*at));
    return Fail(at, what, ", ", context);
  }

  [[gnu::cold, gnu::noinline]] const char* FailDepth(const char* at) {
    return Fail(at, "nesting deeper than ", std::to_string(kMaxJsonDepth));
  }

  [[gnu::cold, gnu::noinline]] const char* FailDuplicate(std::uint32_t name) {
    return Fail(begin_ + doc_.values_[name].pos, "duplicate member name ", Quote(Name(name)));
  }

  [[gnu::cold, gnu::noinline]] const char* FailRange(const char* at, std::string_view literal) {
    return Fail(at, "number ", Quote(literal), " is outside the range of a double");
  }

  [[gnu::cold, gnu::noinline]] const char* FailSurrogate(const char* at, std::uint32_t unit) {
    if (unit >= 0xDC00) {
      return Fail(at, "lone low surrogate ", Hex4(unit), " (no high surrogate before it)");
    }
    return Fail(at, "lone high surrogate ", Hex4(unit), " (no low surrogate after it)");
  }

  [[gnu::cold, gnu::noinline]] const char* FailEscape(const char* at) {
    return Fail(at, "invalid escape: backslash followed by ",
                ByteName(static_cast<unsigned char>(at[1])));
  }

  [[gnu::cold, gnu::noinline]] const char* FailControl(const char* at) {
    auto c = static_cast<unsigned char>(*at);
    char code[3] = {kHexDigits[c >> 4], kHexDigits[c & 0xF], '\0'};
    return Fail(at, "control character U+00", code, " in string (must be escaped)");
  }

  std::uint32_t Offset(const char* at) const { return static_cast<std::uint32_t>(at - begin_); }

  std::uint32_t Push(JsonKind kind, const char* at) {
    auto index = static_cast<std::uint32_t>(doc_.values_.size());
    doc_.values_.PushBack({kind, false, 0, 0, index + 1, Offset(at)});
    return index;
  }

  // Compact JSON has no whitespace and pretty-printed JSON has single spaces or runs of
  // indentation: one byte is checked inline, longer runs out of line.
  const char* SkipWhitespace(const char* p) const {
    if (p < end_ && IsWhitespace(*p)) {
      ++p;
      if (p < end_ && IsWhitespace(*p)) p = SkipWhitespaceRun(p, end_);
    }
    return p;
  }

  // p is at the value's first byte (whitespace skipped) or at the end.
  const char* ParseValue(const char* p, int depth) {
    if (p == end_) return FailUnexpected(p, "expected a value");
    switch (*p) {
      case '"':
        return ParseString(p);
      case '{':
        return ParseObject(p, depth + 1);
      case '[':
        return ParseArray(p, depth + 1);
      case '-':
      case '0':
      case '1':
      case '2':
      case '3':
      case '4':
      case '5':
      case '6':
      case '7':
      case '8':
      case '9':
        return ParseNumber(p);
      case 't':
        return ParseLiteral(p, "true", JsonKind::kTrue);
      case 'f':
        return ParseLiteral(p, "false", JsonKind::kFalse);
      case 'n':
        return ParseLiteral(p, "null", JsonKind::kNull);
      case 'N':
        if (StartsWith(p, "NaN")) {
          return Fail(p, "NaN is not a JSON value (JCS needs finite numbers)");
        }
        break;
      case 'I':
        if (StartsWith(p, "Infinity")) {
          return Fail(p, "Infinity is not a JSON value (JCS needs finite numbers)");
        }
        break;
      default:
        break;
    }
    return FailUnexpected(p, "expected a value");
  }

  bool StartsWith(const char* p, std::string_view word) const {
    return static_cast<std::size_t>(end_ - p) >= word.size() &&
           std::memcmp(p, word.data(), word.size()) == 0;
  }

  const char* ParseLiteral(const char* p, std::string_view word, JsonKind kind) {
    if (!StartsWith(p, word)) return Fail(p, "invalid literal, expected ", word);
    Push(kind, p);
    doc_.out_size_ += word.size();
    return p + word.size();
  }

  const char* ParseArray(const char* p, int depth) {
    if (depth > kMaxJsonDepth) return FailDepth(p);
    const char* open = p;
    std::uint32_t index = Push(JsonKind::kArray, open);
    std::uint32_t count = 0;
    p = SkipWhitespace(p + 1);
    if (p < end_ && *p == ']') {
      ++p;
    } else {
      for (;;) {
        p = ParseValue(p, depth);
        if (p == nullptr) return nullptr;
        ++count;
        p = SkipWhitespace(p);
        if (p == end_) return Fail(open, "unterminated array");
        if (*p == ',') {
          p = SkipWhitespace(p + 1);
        } else if (*p == ']') {
          ++p;
          break;
        } else {
          return FailUnexpected(p, "in array, expected ',' or ']'");
        }
      }
    }
    JsonValue& v = doc_.values_[index];
    v.size = count;
    v.end = static_cast<std::uint32_t>(doc_.values_.size());
    doc_.out_size_ += 2 + (count > 0 ? count - 1 : 0);
    return p;
  }

  std::string_view Name(std::uint32_t index) const {
    const JsonValue& v = doc_.values_[index];
    const char* base = v.in_scratch ? doc_.scratch_.data() : begin_;
    return {base + v.offset, v.size};
  }

  const char* ParseObject(const char* p, int depth) {
    if (depth > kMaxJsonDepth) return FailDepth(p);
    const char* open = p;
    std::uint32_t index = Push(JsonKind::kObject, open);
    ScratchArray<std::uint32_t>& names = doc_.member_stack_;
    const std::size_t first = names.size();
    p = SkipWhitespace(p + 1);
    if (p < end_ && *p == '}') {
      ++p;
    } else {
      for (;;) {
        if (p == end_) return Fail(open, "unterminated object");
        if (*p != '"') return FailUnexpected(p, "in object, expected a member name");
        names.PushBack(static_cast<std::uint32_t>(doc_.values_.size()));
        p = ParseString(p);
        if (p == nullptr) return nullptr;
        p = SkipWhitespace(p);
        if (p == end_) return Fail(open, "unterminated object");
        if (*p != ':') return FailUnexpected(p, "after member name, expected ':'");
        p = ParseValue(SkipWhitespace(p + 1), depth);
        if (p == nullptr) return nullptr;
        p = SkipWhitespace(p);
        if (p == end_) return Fail(open, "unterminated object");
        if (*p == ',') {
          p = SkipWhitespace(p + 1);
        } else if (*p == '}') {
          ++p;
          break;
        } else {
          return FailUnexpected(p, "in object, expected ',' or '}'");
        }
      }
    }
    auto count = static_cast<std::uint32_t>(names.size() - first);
    if (!SortMembers(names.data() + first, count)) return nullptr;
    JsonValue& v = doc_.values_[index];
    v.offset = static_cast<std::uint32_t>(doc_.member_order_.size());
    v.size = count;
    v.end = static_cast<std::uint32_t>(doc_.values_.size());
    doc_.member_order_.Append(names.data() + first, count);
    names.Truncate(first);
    doc_.out_size_ += 2 + count + (count > 0 ? count - 1 : 0);
    return p;
  }

  // Sorts an object's member names by UTF-16 code units and rejects duplicates.
  bool SortMembers(std::uint32_t* names, std::uint32_t count) {
    using SortKey = JsonDocument::SortKey;
    if (count < 2) return true;
    SortKey* keys = doc_.sort_keys_.Reserve(count);
    for (std::uint32_t i = 0; i < count; ++i) {
      const JsonValue& v = doc_.values_[names[i]];
      keys[i] = {SortPrefix(v), names[i], v.size};
    }
    auto less = [this](const SortKey& a, const SortKey& b) {
      if (a.prefix != b.prefix) return a.prefix < b.prefix;
      // Equal prefixes of names no longer than 8 bytes: one is a prefix of the other.
      if (a.size <= 8 && b.size <= 8) return a.size < b.size;
      return CompareUtf16(Name(a.index), Name(b.index)) < 0;
    };
    if (count <= 16) {
      // Insertion sort: members are few and often already in order.
      for (std::uint32_t i = 1; i < count; ++i) {
        SortKey x = keys[i];
        std::uint32_t j = i;
        for (; j > 0 && less(x, keys[j - 1]); --j) keys[j] = keys[j - 1];
        keys[j] = x;
      }
    } else {
      std::sort(keys, keys + count, less);
    }
    names[0] = keys[0].index;
    for (std::uint32_t i = 1; i < count; ++i) {
      const SortKey& a = keys[i - 1];
      const SortKey& b = keys[i];
      if (a.prefix == b.prefix && a.size == b.size &&
          (a.size <= 8 || Name(a.index) == Name(b.index))) {
        FailDuplicate(std::max(a.index, b.index));
        return false;
      }
      names[i] = b.index;
    }
    return true;
  }

  // The first 8 bytes of a name in UTF-16 order as a big-endian number, zero padded. When two
  // prefixes differ they order their names.
  std::uint64_t SortPrefix(const JsonValue& name) const {
    const char* text = (name.in_scratch ? doc_.scratch_.data() : begin_) + name.offset;
    const char* limit = name.in_scratch ? doc_.scratch_.data() + doc_.scratch_.size() : end_;
    std::uint64_t raw = 0;  // Little-endian: byte i at bits 8i.
    if (limit - text >= 8) {
      // 8 bytes lie inside the buffer even when the name is shorter: load, then mask.
      std::memcpy(&raw, text, 8);
      if (name.size < 8) raw &= (std::uint64_t{1} << (8 * name.size)) - 1;
    } else {
      for (std::uint32_t i = 0; i < name.size && i < 8; ++i) {
        raw |= std::uint64_t{static_cast<std::uint8_t>(text[i])} << (8 * i);
      }
    }
    if ((raw & 0x8080808080808080u) != 0) {
      std::uint64_t mapped = 0;
      for (int i = 0; i < 8; ++i) {
        auto c = static_cast<std::uint8_t>(raw >> (8 * i));
        mapped |= std::uint64_t{Utf16OrderByte(c)} << (8 * i);
      }
      raw = mapped;
    }
    return __builtin_bswap64(raw);
  }

  const char* ParseNumber(const char* p) {
    const char* start = p;
    if (*p == '-') ++p;
    if (p == end_) return Fail(start, "invalid number: '-' must be followed by a digit");
    const char* int_begin = p;
    if (*p == '0') {
      ++p;
      if (p < end_ && IsDigit(*p)) return Fail(start, "invalid number: leading zero");
    } else if (IsDigit(*p)) {
      while (p < end_ && IsDigit(*p)) ++p;
    } else if (StartsWith(p, "Infinity")) {
      return Fail(start, "-Infinity is not a JSON value (JCS needs finite numbers)");
    } else {
      return Fail(start, "invalid number: '-' must be followed by a digit");
    }
    const std::ptrdiff_t int_digits = p - int_begin;
    bool plain_integer = true;
    if (p < end_ && *p == '.') {
      ++p;
      if (p == end_ || !IsDigit(*p)) {
        return Fail(p, "invalid number: '.' must be followed by a digit");
      }
      while (p < end_ && IsDigit(*p)) ++p;
      plain_integer = false;
    }
    if (p < end_ && (*p == 'e' || *p == 'E')) {
      ++p;
      if (p < end_ && (*p == '+' || *p == '-')) ++p;
      if (p == end_ || !IsDigit(*p)) return Fail(p, "invalid number: exponent must have a digit");
      while (p < end_ && IsDigit(*p)) ++p;
      plain_integer = false;
    }
    std::uint32_t index = Push(JsonKind::kNumber, start);
    JsonValue& v = doc_.values_[index];
    // Up to 15 digits an integer is exact in a double and written as it is; -0 becomes 0.
    if (plain_integer && int_digits <= 15 && !(start != int_begin && *int_begin == '0')) {
      v.offset = Offset(start);
      v.size = static_cast<std::uint32_t>(p - start);
    } else {
      std::string_view literal(start, static_cast<std::size_t>(p - start));
      std::optional<NumberText> text = CanonicalNumber(literal);
      if (!text) return FailRange(start, literal);
      v.in_scratch = true;
      v.offset = static_cast<std::uint32_t>(doc_.scratch_.size());
      v.size = text->size;
      doc_.scratch_.Append(text->chars.data(), text->size);
    }
    doc_.out_size_ += v.size;
    return p;
  }

  // Validates the UTF-8 sequence at p (a byte >= 0x80) and returns the position after it.
  const char* SkipUtf8Sequence(const char* p) {
    const auto* s = reinterpret_cast<const unsigned char*>(p);
    const std::ptrdiff_t left = end_ - p;
    unsigned char c = s[0];
    int length;
    unsigned char lo = 0x80;  // Allowed range of the second byte.
    unsigned char hi = 0xBF;
    if (c < 0xC0) return Fail(p, "invalid UTF-8 (unexpected continuation byte)");
    if (c < 0xC2) return Fail(p, "invalid UTF-8 (overlong encoding)");
    if (c < 0xE0) {
      length = 2;
    } else if (c < 0xF0) {
      length = 3;
      if (c == 0xE0) lo = 0xA0;
      if (c == 0xED) hi = 0x9F;
    } else if (c < 0xF5) {
      length = 4;
      if (c == 0xF0) lo = 0x90;
      if (c == 0xF4) hi = 0x8F;
    } else if (c < 0xF8) {
      return Fail(p, "invalid UTF-8 (code point above U+10FFFF)");
    } else {
      return Fail(p, "invalid UTF-8 (byte that never occurs in UTF-8)");
    }
    for (int i = 1; i < length; ++i) {
      if (i >= left || (s[i] & 0xC0) != 0x80) return Fail(p, "invalid UTF-8 (truncated sequence)");
    }
    if (s[1] < lo) return Fail(p, "invalid UTF-8 (overlong encoding)");
    if (s[1] > hi) {
      return Fail(p, c == 0xED ? "invalid UTF-8 (encoded surrogate)"
                               : "invalid UTF-8 (code point above U+10FFFF)");
    }
    return p + length;
  }

  // Reads 4 hex digits at p.
  std::optional<std::uint32_t> ReadHex4(const char* p) const {
    if (end_ - p < 4) return std::nullopt;
    std::uint32_t u = 0;
    for (int i = 0; i < 4; ++i) {
      int h = HexValue(p[i]);
      if (h < 0) return std::nullopt;
      u = (u << 4) | static_cast<std::uint32_t>(h);
    }
    return u;
  }

  // Decodes the escape at p (a backslash) into `out` and returns the position after it.
  // `growth` counts how much longer than the decoded text its JCS form is.
  const char* DecodeEscape(const char* p, ScratchArray<char>& out, std::size_t& growth) {
    const char* escape = p;
    if (end_ - p < 2) return Fail(escape, "unterminated string");
    char decoded;
    switch (p[1]) {
      case '"':
        decoded = '"';
        break;
      case '\\':
        decoded = '\\';
        break;
      case '/':
        decoded = '/';
        break;
      case 'b':
        decoded = '\b';
        break;
      case 'f':
        decoded = '\f';
        break;
      case 'n':
        decoded = '\n';
        break;
      case 'r':
        decoded = '\r';
        break;
      case 't':
        decoded = '\t';
        break;
      case 'u': {
        std::optional<std::uint32_t> unit = ReadHex4(p + 2);
        if (!unit) return Fail(escape, "invalid \\u escape: expected 4 hex digits");
        std::uint32_t cp = *unit;
        p += 6;
        if (cp >= 0xDC00 && cp <= 0xDFFF) return FailSurrogate(escape, cp);
        if (cp >= 0xD800 && cp <= 0xDBFF) {
          std::optional<std::uint32_t> low;
          if (end_ - p >= 6 && p[0] == '\\' && p[1] == 'u') low = ReadHex4(p + 2);
          if (!low || *low < 0xDC00 || *low > 0xDFFF) return FailSurrogate(escape, cp);
          cp = 0x10000 + ((cp - 0xD800) << 10) + (*low - 0xDC00);
          p += 6;
        }
        growth += static_cast<std::size_t>(EscapeGrowth(cp));
        char* at = out.Reserve(4);
        out.Commit(static_cast<std::size_t>(WriteUtf8(cp, at) - at));
        return p;
      }
      default:
        return FailEscape(escape);
    }
    growth += static_cast<std::size_t>(EscapeGrowth(static_cast<unsigned char>(decoded)));
    *out.Reserve(1) = decoded;
    out.Commit(1);
    return p + 2;
  }

  // A string, p at its opening quote. Contents without escapes stay in the input; others are
  // decoded into scratch.
  const char* ParseString(const char* p) {
    const char* quote = p++;
    const char* run = p;  // Start of the contents not yet copied to scratch.
    ScratchArray<char>& scratch = doc_.scratch_;
    std::size_t scratch_start = 0;
    bool escaped = false;
    std::size_t growth = 0;  // Extra bytes the decoded text needs when escaped again.
    for (;;) {
      p = ScanStringRun(p, end_);
      if (p == end_) return Fail(quote, "unterminated string");
      auto c = static_cast<unsigned char>(*p);
      if (c == '"') break;
      if (c >= 0x80) {
        p = SkipUtf8Sequence(p);
        if (p == nullptr) return nullptr;
      } else if (c == '\\') {
        if (!escaped) {
          escaped = true;
          scratch_start = scratch.size();
        }
        scratch.Append(run, static_cast<std::size_t>(p - run));
        p = DecodeEscape(p, scratch, growth);
        if (p == nullptr) return nullptr;
        run = p;
      } else {
        return FailControl(p);
      }
    }
    std::uint32_t index = Push(JsonKind::kString, quote);
    JsonValue& v = doc_.values_[index];
    if (escaped) {
      scratch.Append(run, static_cast<std::size_t>(p - run));
      v.in_scratch = true;
      v.offset = static_cast<std::uint32_t>(scratch_start);
      v.size = static_cast<std::uint32_t>(scratch.size() - scratch_start);
    } else {
      v.offset = Offset(run);
      v.size = static_cast<std::uint32_t>(p - run);
    }
    doc_.out_size_ += v.size + 2 + growth;
    return p + 1;
  }

  JsonDocument& doc_;
  const char* const begin_;
  const char* const end_;
  std::string error_;
};

Status JsonDocument::Parse(std::string_view json) {
  input_ = json;
  values_.clear();
  member_order_.clear();
  member_stack_.clear();
  scratch_.clear();
  out_size_ = 0;
  if (json.size() > kMaxInputBytes) {
    input_ = {};
    std::string message = "invalid JSON: input of ";
    message += std::to_string(json.size());
    message += " bytes is larger than the limit of ";
    message += std::to_string(kMaxInputBytes);
    return InvalidArgumentError(std::move(message));
  }
  Status status = JsonParser(*this, json).Run();
  if (!status.ok()) {
    input_ = {};
    values_.clear();
  }
  return status;
}

std::string_view JsonDocument::Text(const JsonValue& v) const {
  const char* base = v.in_scratch ? scratch_.data() : input_.data();
  return {base + v.offset, v.size};
}

std::span<const std::uint32_t> JsonDocument::SortedMembers(const JsonValue& object) const {
  return {member_order_.data() + object.offset, object.size};
}

char* JsonDocument::EmitString(const JsonValue& v, char* out) const {
  if (!v.in_scratch) {
    // Straight from the input, quotes included: without escapes it is already canonical.
    return CopyBytes(input_.data() + v.pos, v.size + 2, out);
  }
  *out++ = '"';
  out = WriteEscaped(Text(v), out);
  *out++ = '"';
  return out;
}

// Scalars are written inline; only containers recurse.
inline char* JsonDocument::EmitValue(std::uint32_t i, char* out) const {
  const JsonValue& v = values_[i];
  switch (v.kind) {
    case JsonKind::kString:
      return EmitString(v, out);
    case JsonKind::kNumber: {
      std::string_view text = Text(v);
      return CopyBytes(text.data(), text.size(), out);
    }
    case JsonKind::kNull:
      std::memcpy(out, "null", 4);
      return out + 4;
    case JsonKind::kTrue:
      std::memcpy(out, "true", 4);
      return out + 4;
    case JsonKind::kFalse:
      std::memcpy(out, "false", 5);
      return out + 5;
    case JsonKind::kArray:
    case JsonKind::kObject:
      return EmitContainer(i, out);
  }
  return out;
}

char* JsonDocument::EmitContainer(std::uint32_t i, char* out) const {
  const JsonValue& v = values_[i];
  if (v.kind == JsonKind::kArray) {
    *out++ = '[';
    std::uint32_t child = i + 1;
    for (std::uint32_t k = 0; k < v.size; ++k) {
      if (k > 0) *out++ = ',';
      out = EmitValue(child, out);
      child = values_[child].end;
    }
    *out++ = ']';
    return out;
  }
  *out++ = '{';
  const std::uint32_t* names = member_order_.data() + v.offset;
  for (std::uint32_t k = 0; k < v.size; ++k) {
    if (k > 0) *out++ = ',';
    out = EmitString(values_[names[k]], out);
    *out++ = ':';
    out = EmitValue(names[k] + 1, out);
  }
  *out++ = '}';
  return out;
}

std::string_view JsonDocument::Canonical() {
  IDEM_CHECK_MSG(values_.size() != 0, "JsonDocument::Canonical without a parsed document");
  out_.clear();
  char* end = EmitValue(0, out_.Reserve(out_size_));
  IDEM_CHECK(static_cast<std::size_t>(end - out_.data()) == out_size_);
  out_.Commit(out_size_);
  return {out_.data(), out_size_};
}

void JsonDocument::ReleaseMemory() {
  // Above this a buffer is freed after use rather than kept for the next document.
  constexpr std::size_t kKeepBytes = std::size_t{1} << 20;
  values_.Trim(kKeepBytes);
  member_order_.Trim(kKeepBytes);
  member_stack_.Trim(kKeepBytes);
  sort_keys_.Trim(kKeepBytes);
  scratch_.Trim(kKeepBytes);
  out_.Trim(kKeepBytes);
  input_ = {};
  values_.clear();
}

JsonDocument& ThreadJsonDocument() {
  thread_local JsonDocument doc;
  return doc;
}

void AppendJsonString(std::string_view text, std::string& out) {
  std::size_t length = 2;
  for (char c : text) {
    length += 1 + static_cast<std::size_t>(EscapeGrowth(static_cast<unsigned char>(c)));
  }
  std::size_t at = out.size();
  out.resize(at + length);
  char* p = out.data() + at;
  *p++ = '"';
  p = WriteEscaped(text, p);
  *p = '"';
}

}  // namespace idem::internal
