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
constexpr bool IsSpecialInString(unsigned char c) { return c == '"' || c == '\\' || c < 0x20 || c >= 0x80; }

const char* ScanStringRun(const char* p, const char* end) {
#if defined(__SSE2__)
  const __m128i quote = _mm_set1_epi8('"');
  const __m128i backslash = _mm_set1_epi8('\\');
  const __m128i space = _mm_set1_epi8(0x20);
  while (end - p >= 16) {
    __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    // Signed: bytes >= 0x80 are negative, so this also catches non-ASCII bytes.
    __m128i special = _mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(v, quote), _mm_cmpeq_epi8(v, backslash)),
                                   _mm_cmplt_epi8(v, space));
    int mask = _mm_movemask_epi8(special);
    if (mask != 0) return p + __builtin_ctz(static_cast<unsigned>(mask));
    p += 16;
  }
#endif
  while (p < end && !IsSpecialInString(static_cast<unsigned char>(*p))) ++p;
  return p;
}

bool IsWhitespace(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }
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

void AppendUtf8(std::uint32_t cp, std::string& out) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    char b[2] = {static_cast<char>(0xC0 | (cp >> 6)), static_cast<char>(0x80 | (cp & 0x3F))};
    out.append(b, 2);
  } else if (cp < 0x10000) {
    char b[3] = {static_cast<char>(0xE0 | (cp >> 12)), static_cast<char>(0x80 | ((cp >> 6) & 0x3F)),
                 static_cast<char>(0x80 | (cp & 0x3F))};
    out.append(b, 3);
  } else {
    char b[4] = {static_cast<char>(0xF0 | (cp >> 18)), static_cast<char>(0x80 | ((cp >> 12) & 0x3F)),
                 static_cast<char>(0x80 | ((cp >> 6) & 0x3F)), static_cast<char>(0x80 | (cp & 0x3F))};
    out.append(b, 4);
  }
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
  if (c >= 0x20 && c < 0x7F) return std::string("'") + static_cast<char>(c) + "'";
  std::string s = "byte 0x";
  s.push_back(kHexDigits[c >> 4]);
  s.push_back(kHexDigits[c & 0xF]);
  return s;
}

}  // namespace

int CompareUtf16(std::string_view a, std::string_view b) {
  std::size_t n = std::min(a.size(), b.size());
  for (std::size_t i = 0; i < n; ++i) {
    auto x = static_cast<unsigned char>(a[i]);
    auto y = static_cast<unsigned char>(b[i]);
    if (x == y) continue;
    // UTF-8 byte order is code point order. UTF-16 differs in one place: characters above
    // U+FFFF (lead bytes F0-F4, surrogate pairs D800-DBFF in UTF-16) sort before
    // U+E000-U+FFFF (lead bytes EE-EF). Both bytes are lead bytes here when they differ in
    // that class, since equal prefixes put both at the same position within a character.
    if (x >= 0xEE && y >= 0xEE && (x >= 0xF0) != (y >= 0xF0)) return x >= 0xF0 ? -1 : 1;
    return x < y ? -1 : 1;
  }
  if (a.size() == b.size()) return 0;
  return a.size() < b.size() ? -1 : 1;
}

// Recursive descent over the input. Each Parse* function appends the values it reads to the
// document and returns false after recording the first error.
class JsonParser {
 public:
  JsonParser(JsonDocument& doc, std::string_view json)
      : doc_(doc), begin_(json.data()), p_(json.data()), end_(json.data() + json.size()) {}

  Status Run() {
    SkipWhitespace();
    if (p_ == end_) return InvalidArgumentError("invalid JSON: empty input");
    if (!ParseValue(0)) return InvalidArgumentError(std::move(error_));
    SkipWhitespace();
    if (p_ != end_) {
      Fail(p_, "unexpected " + ByteName(static_cast<unsigned char>(*p_)) +
                   " after the JSON value (trailing data)");
      return InvalidArgumentError(std::move(error_));
    }
    return OkStatus();
  }

 private:
  bool Fail(const char* at, std::string_view what) {
    error_ = "invalid JSON: ";
    error_.append(what);
    error_.append(" at byte ");
    error_.append(std::to_string(at - begin_));
    return false;
  }

  std::uint32_t Offset(const char* at) const { return static_cast<std::uint32_t>(at - begin_); }

  std::uint32_t Push(JsonKind kind, const char* at) {
    auto index = static_cast<std::uint32_t>(doc_.values_.size());
    JsonValue& v = doc_.values_.emplace_back();
    v.kind = kind;
    v.pos = Offset(at);
    v.end = index + 1;
    return index;
  }

  void SkipWhitespace() {
    while (p_ < end_ && IsWhitespace(*p_)) ++p_;
  }

  bool ParseValue(int depth) {
    SkipWhitespace();
    if (p_ == end_) return Fail(p_, "unexpected end of input, expected a value");
    switch (*p_) {
      case '{':
        return ParseObject(depth + 1);
      case '[':
        return ParseArray(depth + 1);
      case '"':
        return ParseString();
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
        return ParseNumber();
      case 't':
        return ParseLiteral("true", JsonKind::kTrue);
      case 'f':
        return ParseLiteral("false", JsonKind::kFalse);
      case 'n':
        return ParseLiteral("null", JsonKind::kNull);
      case 'N':
        if (StartsWith("NaN")) return Fail(p_, "NaN is not a JSON value (JCS needs finite numbers)");
        break;
      case 'I':
        if (StartsWith("Infinity")) {
          return Fail(p_, "Infinity is not a JSON value (JCS needs finite numbers)");
        }
        break;
      default:
        break;
    }
    return Fail(p_, "unexpected " + ByteName(static_cast<unsigned char>(*p_)) + ", expected a value");
  }

  bool StartsWith(std::string_view word) const {
    return static_cast<std::size_t>(end_ - p_) >= word.size() &&
           std::memcmp(p_, word.data(), word.size()) == 0;
  }

  bool ParseLiteral(std::string_view word, JsonKind kind) {
    if (!StartsWith(word)) return Fail(p_, "invalid literal, expected " + std::string(word));
    Push(kind, p_);
    doc_.out_size_ += word.size();
    p_ += word.size();
    return true;
  }

  bool ParseArray(int depth) {
    if (depth > kMaxJsonDepth) return Fail(p_, "nesting deeper than " + std::to_string(kMaxJsonDepth));
    const char* open = p_++;
    std::uint32_t index = Push(JsonKind::kArray, open);
    std::uint32_t count = 0;
    SkipWhitespace();
    if (p_ < end_ && *p_ == ']') {
      ++p_;
    } else {
      for (;;) {
        if (!ParseValue(depth)) return false;
        ++count;
        SkipWhitespace();
        if (p_ == end_) return Fail(open, "unterminated array");
        if (*p_ == ',') {
          ++p_;
        } else if (*p_ == ']') {
          ++p_;
          break;
        } else {
          return Fail(p_, "unexpected " + ByteName(static_cast<unsigned char>(*p_)) +
                              " in array, expected ',' or ']'");
        }
      }
    }
    JsonValue& v = doc_.values_[index];
    v.size = count;
    v.end = static_cast<std::uint32_t>(doc_.values_.size());
    doc_.out_size_ += 2 + (count > 0 ? count - 1 : 0);
    return true;
  }

  std::string_view Name(std::uint32_t index) const {
    const JsonValue& v = doc_.values_[index];
    const char* base = v.in_scratch ? doc_.scratch_.data() : begin_;
    return {base + v.offset, v.size};
  }

  bool ParseObject(int depth) {
    if (depth > kMaxJsonDepth) return Fail(p_, "nesting deeper than " + std::to_string(kMaxJsonDepth));
    const char* open = p_++;
    std::uint32_t index = Push(JsonKind::kObject, open);
    std::vector<std::uint32_t>& names = doc_.member_stack_;
    const std::size_t first = names.size();
    SkipWhitespace();
    if (p_ < end_ && *p_ == '}') {
      ++p_;
    } else {
      for (;;) {
        SkipWhitespace();
        if (p_ == end_) return Fail(open, "unterminated object");
        if (*p_ != '"') {
          return Fail(p_, "unexpected " + ByteName(static_cast<unsigned char>(*p_)) +
                              " in object, expected a member name");
        }
        names.push_back(static_cast<std::uint32_t>(doc_.values_.size()));
        if (!ParseString()) return false;
        SkipWhitespace();
        if (p_ == end_) return Fail(open, "unterminated object");
        if (*p_ != ':') {
          return Fail(p_, "unexpected " + ByteName(static_cast<unsigned char>(*p_)) +
                              " after member name, expected ':'");
        }
        ++p_;
        if (!ParseValue(depth)) return false;
        SkipWhitespace();
        if (p_ == end_) return Fail(open, "unterminated object");
        if (*p_ == ',') {
          ++p_;
        } else if (*p_ == '}') {
          ++p_;
          break;
        } else {
          return Fail(p_, "unexpected " + ByteName(static_cast<unsigned char>(*p_)) +
                              " in object, expected ',' or '}'");
        }
      }
    }
    auto count = static_cast<std::uint32_t>(names.size() - first);
    if (!SortMembers(names.data() + first, count)) return false;
    JsonValue& v = doc_.values_[index];
    v.offset = static_cast<std::uint32_t>(doc_.member_order_.size());
    v.size = count;
    v.end = static_cast<std::uint32_t>(doc_.values_.size());
    doc_.member_order_.insert(doc_.member_order_.end(), names.begin() + first, names.end());
    names.resize(first);
    doc_.out_size_ += 2 + count + (count > 0 ? count - 1 : 0);
    return true;
  }

  // Sorts an object's member names by UTF-16 code units and rejects duplicates.
  bool SortMembers(std::uint32_t* names, std::uint32_t count) {
    auto less = [this](std::uint32_t a, std::uint32_t b) { return CompareUtf16(Name(a), Name(b)) < 0; };
    if (count <= 16) {
      // Insertion sort: members are few and often already in order.
      for (std::uint32_t i = 1; i < count; ++i) {
        std::uint32_t x = names[i];
        std::uint32_t j = i;
        while (j > 0 && less(x, names[j - 1])) {
          names[j] = names[j - 1];
          --j;
        }
        names[j] = x;
      }
    } else {
      std::sort(names, names + count, less);
    }
    for (std::uint32_t i = 1; i < count; ++i) {
      if (Name(names[i - 1]) == Name(names[i])) {
        std::uint32_t later = std::max(names[i - 1], names[i]);
        return Fail(begin_ + doc_.values_[later].pos,
                    "duplicate member name " + Quote(Name(later)));
      }
    }
    return true;
  }

  bool ParseNumber() {
    const char* start = p_;
    if (*p_ == '-') ++p_;
    if (p_ == end_) return Fail(start, "invalid number: '-' must be followed by a digit");
    const char* int_begin = p_;
    if (*p_ == '0') {
      ++p_;
      if (p_ < end_ && IsDigit(*p_)) return Fail(start, "invalid number: leading zero");
    } else if (IsDigit(*p_)) {
      while (p_ < end_ && IsDigit(*p_)) ++p_;
    } else if (*p_ == 'I' && StartsWith("Infinity")) {
      return Fail(start, "-Infinity is not a JSON value (JCS needs finite numbers)");
    } else {
      return Fail(start, "invalid number: '-' must be followed by a digit");
    }
    const std::ptrdiff_t int_digits = p_ - int_begin;
    bool plain_integer = true;
    if (p_ < end_ && *p_ == '.') {
      ++p_;
      if (p_ == end_ || !IsDigit(*p_)) return Fail(p_, "invalid number: '.' must be followed by a digit");
      while (p_ < end_ && IsDigit(*p_)) ++p_;
      plain_integer = false;
    }
    if (p_ < end_ && (*p_ == 'e' || *p_ == 'E')) {
      ++p_;
      if (p_ < end_ && (*p_ == '+' || *p_ == '-')) ++p_;
      if (p_ == end_ || !IsDigit(*p_)) {
        return Fail(p_, "invalid number: exponent must have a digit");
      }
      while (p_ < end_ && IsDigit(*p_)) ++p_;
      plain_integer = false;
    }
    std::uint32_t index = Push(JsonKind::kNumber, start);
    JsonValue& v = doc_.values_[index];
    // Up to 15 digits an integer is exact in a double and written as it is; -0 becomes 0.
    if (plain_integer && int_digits <= 15 && !(start != int_begin && *int_begin == '0')) {
      v.offset = Offset(start);
      v.size = static_cast<std::uint32_t>(p_ - start);
    } else {
      std::string_view literal(start, static_cast<std::size_t>(p_ - start));
      std::optional<NumberText> text = CanonicalNumber(literal);
      if (!text) return Fail(start, "number " + Quote(literal) + " is outside the range of a double");
      v.in_scratch = true;
      v.offset = static_cast<std::uint32_t>(doc_.scratch_.size());
      v.size = text->size;
      doc_.scratch_.append(text->view());
    }
    doc_.out_size_ += v.size;
    return true;
  }

  // Validates the UTF-8 sequence at p_ (a byte >= 0x80) and steps over it.
  bool SkipUtf8Sequence() {
    const auto* s = reinterpret_cast<const unsigned char*>(p_);
    const std::ptrdiff_t left = end_ - p_;
    unsigned char c = s[0];
    int length;
    unsigned char lo = 0x80;  // Allowed range of the second byte.
    unsigned char hi = 0xBF;
    if (c < 0xC0) return Fail(p_, "invalid UTF-8 (unexpected continuation byte)");
    if (c < 0xC2) return Fail(p_, "invalid UTF-8 (overlong encoding)");
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
    } else {
      return Fail(p_, "invalid UTF-8 (code point above U+10FFFF)");
    }
    for (int i = 1; i < length; ++i) {
      if (i >= left || (s[i] & 0xC0) != 0x80) return Fail(p_, "invalid UTF-8 (truncated sequence)");
    }
    if (s[1] < lo) return Fail(p_, "invalid UTF-8 (overlong encoding)");
    if (s[1] > hi) {
      return Fail(p_, c == 0xED ? "invalid UTF-8 (encoded surrogate)"
                                : "invalid UTF-8 (code point above U+10FFFF)");
    }
    p_ += length;
    return true;
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

  // Decodes the escape at p_ (a backslash) into scratch and steps over it.
  bool DecodeEscape(std::string& out, std::size_t& growth) {
    const char* escape = p_;
    if (end_ - p_ < 2) return Fail(escape, "unterminated string");
    char c = p_[1];
    char decoded;
    switch (c) {
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
        std::optional<std::uint32_t> unit = ReadHex4(p_ + 2);
        if (!unit) return Fail(escape, "invalid \\u escape: expected 4 hex digits");
        std::uint32_t cp = *unit;
        p_ += 6;
        if (cp >= 0xDC00 && cp <= 0xDFFF) {
          return Fail(escape, "lone low surrogate " + Hex4(cp) + " (no high surrogate before it)");
        }
        if (cp >= 0xD800 && cp <= 0xDBFF) {
          std::optional<std::uint32_t> low;
          if (end_ - p_ >= 6 && p_[0] == '\\' && p_[1] == 'u') low = ReadHex4(p_ + 2);
          if (!low || *low < 0xDC00 || *low > 0xDFFF) {
            return Fail(escape, "lone high surrogate " + Hex4(cp) + " (no low surrogate after it)");
          }
          cp = 0x10000 + ((cp - 0xD800) << 10) + (*low - 0xDC00);
          p_ += 6;
        }
        growth += static_cast<std::size_t>(EscapeGrowth(cp));
        AppendUtf8(cp, out);
        return true;
      }
      default:
        return Fail(escape, "invalid escape \\" + std::string(1, c));
    }
    growth += static_cast<std::size_t>(EscapeGrowth(static_cast<unsigned char>(decoded)));
    out.push_back(decoded);
    p_ += 2;
    return true;
  }

  // A string (p_ at its opening quote). Contents without escapes stay in the input; others
  // are decoded into scratch.
  bool ParseString() {
    const char* quote = p_++;
    const char* run = p_;  // Start of the contents not yet copied to scratch.
    std::string& scratch = doc_.scratch_;
    std::size_t scratch_start = 0;
    bool escaped = false;
    std::size_t growth = 0;  // Extra bytes the decoded text needs when escaped again.
    for (;;) {
      p_ = ScanStringRun(p_, end_);
      if (p_ == end_) return Fail(quote, "unterminated string");
      auto c = static_cast<unsigned char>(*p_);
      if (c == '"') break;
      if (c >= 0x80) {
        if (!SkipUtf8Sequence()) return false;
      } else if (c == '\\') {
        if (!escaped) {
          escaped = true;
          scratch_start = scratch.size();
        }
        scratch.append(run, p_);
        if (!DecodeEscape(scratch, growth)) return false;
        run = p_;
      } else {
        std::string what = "control character U+00";
        what.push_back(kHexDigits[c >> 4]);
        what.push_back(kHexDigits[c & 0xF]);
        return Fail(p_, what + " in string (must be escaped)");
      }
    }
    std::uint32_t index = Push(JsonKind::kString, quote);
    JsonValue& v = doc_.values_[index];
    if (escaped) {
      scratch.append(run, p_);
      v.in_scratch = true;
      v.offset = static_cast<std::uint32_t>(scratch_start);
      v.size = static_cast<std::uint32_t>(scratch.size() - scratch_start);
    } else {
      v.offset = Offset(run);
      v.size = static_cast<std::uint32_t>(p_ - run);
    }
    doc_.out_size_ += v.size + 2 + growth;
    ++p_;
    return true;
  }

  JsonDocument& doc_;
  const char* begin_;
  const char* p_;
  const char* end_;
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
    return InvalidArgumentError("invalid JSON: input of " + std::to_string(json.size()) +
                                " bytes is larger than the limit of " +
                                std::to_string(kMaxInputBytes));
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
  *out++ = '"';
  std::string_view text = Text(v);
  if (v.in_scratch) {
    out = WriteEscaped(text, out);
  } else {
    // Straight from the input without escapes: already in canonical form.
    std::memcpy(out, text.data(), text.size());
    out += text.size();
  }
  *out++ = '"';
  return out;
}

char* JsonDocument::Emit(std::uint32_t i, char* out) const {
  const JsonValue& v = values_[i];
  switch (v.kind) {
    case JsonKind::kNull:
      std::memcpy(out, "null", 4);
      return out + 4;
    case JsonKind::kTrue:
      std::memcpy(out, "true", 4);
      return out + 4;
    case JsonKind::kFalse:
      std::memcpy(out, "false", 5);
      return out + 5;
    case JsonKind::kNumber: {
      std::string_view text = Text(v);
      std::memcpy(out, text.data(), text.size());
      return out + text.size();
    }
    case JsonKind::kString:
      return EmitString(v, out);
    case JsonKind::kArray: {
      *out++ = '[';
      std::uint32_t child = i + 1;
      for (std::uint32_t k = 0; k < v.size; ++k) {
        if (k > 0) *out++ = ',';
        out = Emit(child, out);
        child = values_[child].end;
      }
      *out++ = ']';
      return out;
    }
    case JsonKind::kObject: {
      *out++ = '{';
      const std::uint32_t* names = member_order_.data() + v.offset;
      for (std::uint32_t k = 0; k < v.size; ++k) {
        if (k > 0) *out++ = ',';
        out = EmitString(values_[names[k]], out);
        *out++ = ':';
        out = Emit(names[k] + 1, out);
      }
      *out++ = '}';
      return out;
    }
  }
  return out;
}

std::string_view JsonDocument::Canonical() {
  IDEM_CHECK_MSG(!values_.empty(), "JsonDocument::Canonical without a parsed document");
  // Grow only: resize() zero-fills, so it is not repeated for a buffer already large enough.
  if (out_.size() < out_size_) out_.resize(out_size_);
  char* end = Emit(0, out_.data());
  IDEM_CHECK(static_cast<std::size_t>(end - out_.data()) == out_size_);
  return {out_.data(), out_size_};
}

void JsonDocument::ReleaseMemory() {
  // Above this a buffer is freed after use rather than kept for the next document.
  constexpr std::size_t kKeepBytes = std::size_t{1} << 20;
  if (values_.capacity() * sizeof(JsonValue) > kKeepBytes) std::vector<JsonValue>().swap(values_);
  if (member_order_.capacity() * sizeof(std::uint32_t) > kKeepBytes) {
    std::vector<std::uint32_t>().swap(member_order_);
  }
  if (member_stack_.capacity() * sizeof(std::uint32_t) > kKeepBytes) {
    std::vector<std::uint32_t>().swap(member_stack_);
  }
  if (scratch_.capacity() > kKeepBytes) std::string().swap(scratch_);
  if (out_.capacity() > kKeepBytes) std::vector<char>().swap(out_);
  input_ = {};
  values_.clear();
}

JsonDocument& ThreadJsonDocument() {
  thread_local JsonDocument doc;
  return doc;
}

void AppendJsonString(std::string_view text, std::string& out) {
  std::size_t length = 2;
  for (char c : text) length += 1 + static_cast<std::size_t>(EscapeGrowth(static_cast<unsigned char>(c)));
  std::size_t at = out.size();
  out.resize(at + length);
  char* p = out.data() + at;
  *p++ = '"';
  p = WriteEscaped(text, p);
  *p = '"';
}

}  // namespace idem::internal
