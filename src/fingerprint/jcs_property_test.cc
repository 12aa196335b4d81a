// Property tests over seeded random documents: CanonicalizeJson agrees with a slow, separately
// written reference canonicaliser; its output is a fixpoint and re-parses; member order,
// whitespace, escaping and number spelling do not change the fingerprint.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "fingerprint/jcs.h"
#include "idem/fingerprint.h"

namespace idem {
namespace {

using CodePoints = std::vector<char32_t>;

struct Member;

struct Value {
  enum Kind { kNull, kTrue, kFalse, kNumber, kString, kArray, kObject } kind = kNull;
  double number = 0;
  CodePoints text;
  std::vector<Value> elements;  // kArray
  std::vector<Member> members;  // kObject, names unique
};

struct Member {
  CodePoints name;
  Value value;
};

// ---- The reference canonicaliser: simple and slow, sharing no code with src/fingerprint. ----

std::string Utf8(const CodePoints& cps) {
  std::string out;
  for (char32_t c : cps) {
    auto cp = static_cast<std::uint32_t>(c);
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xC0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xE0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }
  return out;
}

std::u16string Utf16(const CodePoints& cps) {
  std::u16string out;
  for (char32_t c : cps) {
    if (c < 0x10000) {
      out += static_cast<char16_t>(c);
    } else {
      out += static_cast<char16_t>(0xD800 + ((c - 0x10000) >> 10));
      out += static_cast<char16_t>(0xDC00 + ((c - 0x10000) & 0x3FF));
    }
  }
  return out;
}

std::string ReferenceString(const CodePoints& cps) {
  std::string out = "\"";
  for (char32_t c : cps) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
          out += buf;
        } else {
          out += Utf8({c});
        }
    }
  }
  return out + "\"";
}

// ECMAScript Number::toString: the fewest significant digits (found with printf and strtod)
// that read back as `d`, laid out by the rules of ECMA-262 §6.1.6.1.20.
std::string ReferenceNumber(double d) {
  if (d == 0) return "0";
  std::string sign = d < 0 ? "-" : "";
  double m = std::fabs(d);
  char buf[64];
  int precision = 1;
  for (; precision <= 17; ++precision) {
    std::snprintf(buf, sizeof buf, "%.*e", precision - 1, m);
    if (std::strtod(buf, nullptr) == m) break;
  }
  std::string sci = buf;  // d.ddde±xx
  std::size_t e = sci.find('e');
  std::string digits = sci.substr(0, 1) + (e > 1 ? sci.substr(2, e - 2) : "");
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
  int k = static_cast<int>(digits.size());
  int n = std::atoi(sci.c_str() + e + 1) + 1;
  if (k <= n && n <= 21) return sign + digits + std::string(static_cast<std::size_t>(n - k), '0');
  if (0 < n && n <= 21) return sign + digits.substr(0, n) + "." + digits.substr(n);
  if (-6 < n && n <= 0)
    return sign + "0." + std::string(static_cast<std::size_t>(-n), '0') + digits;
  std::string exponent = n - 1 < 0 ? "-" : "+";
  exponent += std::to_string(std::abs(n - 1));
  if (k == 1) return sign + digits + "e" + exponent;
  return sign + digits.substr(0, 1) + "." + digits.substr(1) + "e" + exponent;
}

std::string Reference(const Value& v) {
  switch (v.kind) {
    case Value::kNull:
      return "null";
    case Value::kTrue:
      return "true";
    case Value::kFalse:
      return "false";
    case Value::kNumber:
      return ReferenceNumber(v.number);
    case Value::kString:
      return ReferenceString(v.text);
    case Value::kArray: {
      std::string out = "[";
      for (std::size_t i = 0; i < v.elements.size(); ++i) {
        if (i > 0) out += ",";
        out += Reference(v.elements[i]);
      }
      return out + "]";
    }
    case Value::kObject: {
      std::vector<const Member*> sorted;
      for (const auto& m : v.members) sorted.push_back(&m);
      std::sort(sorted.begin(), sorted.end(),
                [](const Member* a, const Member* b) { return Utf16(a->name) < Utf16(b->name); });
      std::string out = "{";
      for (std::size_t i = 0; i < sorted.size(); ++i) {
        if (i > 0) out += ",";
        out += ReferenceString(sorted[i]->name) + ":" + Reference(sorted[i]->value);
      }
      return out + "}";
    }
  }
  return "";
}

// ---- A seeded generator of documents, and of many ways to write each one. ----

class Generator {
 public:
  explicit Generator(std::uint64_t seed) : rng_(seed) {}

  std::uint64_t Below(std::uint64_t n) { return rng_() % n; }
  bool OneIn(std::uint64_t n) { return Below(n) == 0; }

  char32_t CodePoint() {
    switch (Below(10)) {
      case 0:
        return static_cast<char32_t>(Below(0x20));  // Control.
      case 1:
        return U"\"\\/\x7F"[Below(4)];
      case 2:
        return static_cast<char32_t>(0x80 + Below(0x800 - 0x80));  // Two bytes.
      case 3:
        return static_cast<char32_t>(0x800 + Below(0xD800 - 0x800));
      case 4:
        return static_cast<char32_t>(0xE000 + Below(0x2000));  // E000-FFFF.
      case 5:
        return static_cast<char32_t>(0x10000 + Below(0x100000));  // Astral.
      case 6:
        return U"\x2028\x2029\xFEFF\xFFFF\U0010FFFF\U0001F600"[Below(6)];
      default:
        return static_cast<char32_t>(0x20 + Below(0x5F));  // Printable ASCII.
    }
  }

  CodePoints Text(std::size_t max_length) {
    CodePoints out;
    std::size_t length = Below(max_length + 1);
    for (std::size_t i = 0; i < length; ++i) out.push_back(CodePoint());
    return out;
  }

  CodePoints Name() {
    // Mostly short names from a small alphabet, so that names share prefixes (and the 8-byte
    // sort prefix) often; sometimes anything.
    if (OneIn(3)) return Text(12);
    CodePoints out;
    std::size_t length = Below(14);
    static constexpr char32_t kAlphabet[] = {U'a', U'b', U'_', U'\x00e9', U'\xe000', U'\U0001F600'};
    for (std::size_t i = 0; i < length; ++i) out.push_back(kAlphabet[Below(OneIn(4) ? 6 : 3)]);
    return out;
  }

  double Number() {
    switch (Below(8)) {
      case 0: {
        double d;
        do d = std::bit_cast<double>(rng_());
        while (!std::isfinite(d));
        return d;
      }
      case 1: {
        constexpr double kExtremes[] = {0.0,
                                        -0.0,
                                        std::numeric_limits<double>::max(),
                                        -std::numeric_limits<double>::max(),
                                        std::numeric_limits<double>::min(),
                                        std::numeric_limits<double>::denorm_min(),
                                        -std::numeric_limits<double>::denorm_min(),
                                        9007199254740992.0,
                                        9007199254740993.0,
                                        1e21,
                                        999999999999999900000.0,
                                        1e-7,
                                        9.999999999999997e-7,
                                        0.000001};
        return kExtremes[Below(std::size(kExtremes))];
      }
      case 2:
        return std::ldexp(static_cast<double>(Below(1u << 30)), static_cast<int>(Below(140)) - 70);
      case 3:
        return static_cast<double>(Below(100000)) / 100.0 * (OneIn(2) ? 1 : -1);
      case 4:
        return std::pow(10.0, static_cast<double>(Below(60)) - 30.0);
      default:
        return static_cast<double>(static_cast<std::int64_t>(Below(2000000)) - 1000000);
    }
  }

  Value Document(int depth) {
    Value v;
    std::uint64_t pick = depth >= 6 ? Below(5) : Below(9);
    switch (pick) {
      case 0:
        v.kind = Value::kNull;
        break;
      case 1:
        v.kind = OneIn(2) ? Value::kTrue : Value::kFalse;
        break;
      case 2:
      case 3:
        v.kind = Value::kNumber;
        v.number = Number();
        break;
      case 4:
        v.kind = Value::kString;
        v.text = Text(20);
        break;
      case 5:
      case 6: {
        v.kind = Value::kArray;
        std::size_t count = Below(6);
        for (std::size_t i = 0; i < count; ++i) v.elements.push_back(Document(depth + 1));
        break;
      }
      default: {
        v.kind = Value::kObject;
        std::size_t count = OneIn(8) ? Below(40) : Below(7);
        for (std::size_t i = 0; i < count; ++i) {
          CodePoints name = Name();
          bool taken = std::any_of(v.members.begin(), v.members.end(),
                                   [&](const Member& m) { return m.name == name; });
          if (!taken) v.members.push_back(Member{std::move(name), Document(depth + 1)});
        }
      }
    }
    return v;
  }

  // `v` written with random whitespace, member order, escapes and number spelling.
  std::string Write(const Value& v) {
    std::string out;
    Write(v, out);
    Space(out);
    return out;
  }

 private:
  void Space(std::string& out) {
    if (!OneIn(3)) return;
    std::size_t n = 1 + Below(3);
    for (std::size_t i = 0; i < n; ++i) out += " \t\n\r"[Below(4)];
  }

  void WriteString(const CodePoints& cps, std::string& out) {
    out += '"';
    for (char32_t c : cps) {
      bool must_escape = c < 0x20 || c == '"' || c == '\\';
      if (!must_escape && !OneIn(5)) {
        out += Utf8({c});
        continue;
      }
      const char* short_form = nullptr;
      switch (c) {
        case '"':
          short_form = "\\\"";
          break;
        case '\\':
          short_form = "\\\\";
          break;
        case '/':
          short_form = "\\/";
          break;
        case '\b':
          short_form = "\\b";
          break;
        case '\f':
          short_form = "\\f";
          break;
        case '\n':
          short_form = "\\n";
          break;
        case '\r':
          short_form = "\\r";
          break;
        case '\t':
          short_form = "\\t";
          break;
        default:
          break;
      }
      if (short_form != nullptr && OneIn(2)) {
        out += short_form;
        continue;
      }
      for (char16_t unit : Utf16({c})) {
        char buf[8];
        std::snprintf(buf, sizeof buf, OneIn(2) ? "\\u%04x" : "\\u%04X",
                      static_cast<unsigned>(unit));
        out += buf;
      }
    }
    out += '"';
  }

  void WriteNumber(double d, std::string& out) {
    char buf[64];
    switch (Below(4)) {
      case 0:
        out += ReferenceNumber(d);
        return;
      case 1:
        std::snprintf(buf, sizeof buf, "%.17g", d);
        break;
      case 2:
        std::snprintf(buf, sizeof buf, "%.25E", d);
        break;
      default:
        std::snprintf(buf, sizeof buf, "%.17e", d);
        break;
    }
    out += buf;
  }

  void Write(const Value& v, std::string& out) {
    Space(out);
    switch (v.kind) {
      case Value::kNull:
        out += "null";
        break;
      case Value::kTrue:
        out += "true";
        break;
      case Value::kFalse:
        out += "false";
        break;
      case Value::kNumber:
        WriteNumber(v.number, out);
        break;
      case Value::kString:
        WriteString(v.text, out);
        break;
      case Value::kArray:
        out += '[';
        for (std::size_t i = 0; i < v.elements.size(); ++i) {
          if (i > 0) out += ',';
          Write(v.elements[i], out);
          Space(out);
        }
        Space(out);
        out += ']';
        break;
      case Value::kObject: {
        std::vector<std::size_t> order(v.members.size());
        for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
        for (std::size_t i = order.size(); i > 1; --i) std::swap(order[i - 1], order[Below(i)]);
        out += '{';
        for (std::size_t i = 0; i < order.size(); ++i) {
          if (i > 0) out += ',';
          Space(out);
          WriteString(v.members[order[i]].name, out);
          Space(out);
          out += ':';
          Write(v.members[order[i]].value, out);
          Space(out);
        }
        Space(out);
        out += '}';
        break;
      }
    }
  }

  std::mt19937_64 rng_;
};

TEST(JcsPropertyTest, MatchesReferenceAndIsAFixpoint) {
  Generator gen(0x1DE4);
  for (int i = 0; i < 3000; ++i) {
    Value doc = gen.Document(0);
    std::string expected = Reference(doc);
    std::string written = gen.Write(doc);
    Result<std::string> canonical = CanonicalizeJson(written);
    ASSERT_TRUE(canonical.has_value()) << canonical.status().ToString() << "\n" << written;
    ASSERT_EQ(*canonical, expected) << "input: " << written;
    // The canonical form re-parses and is its own canonical form.
    Result<std::string> again = CanonicalizeJson(*canonical);
    ASSERT_TRUE(again.has_value()) << again.status().ToString();
    ASSERT_EQ(*again, *canonical);
  }
}

TEST(JcsPropertyTest, SpellingDoesNotChangeTheFingerprint) {
  Generator gen(42);
  for (int i = 0; i < 2000; ++i) {
    Value doc = gen.Document(0);
    Fingerprint expected = FingerprintBytes(Reference(doc));
    for (int variant = 0; variant < 3; ++variant) {
      std::string written = gen.Write(doc);
      Result<Fingerprint> fp = FingerprintJson(written);
      ASSERT_TRUE(fp.has_value()) << fp.status().ToString() << "\n" << written;
      ASSERT_EQ(*fp, expected) << written;
    }
  }
}

TEST(JcsPropertyTest, DifferentDocumentsDifferentFingerprints) {
  Generator gen(99);
  int compared = 0;
  for (int i = 0; i < 1000; ++i) {
    Value a = gen.Document(0);
    Value b = gen.Document(0);
    std::string ra = Reference(a);
    std::string rb = Reference(b);
    if (ra == rb) continue;
    ++compared;
    ASSERT_NE(*FingerprintJson(gen.Write(a)), *FingerprintJson(gen.Write(b))) << ra << "\n" << rb;
  }
  EXPECT_GT(compared, 500);
}

// Random pointers to scalars read back what was generated.
TEST(JcsPropertyTest, PointersReadScalars) {
  Generator gen(7);
  int checked = 0;
  for (int i = 0; i < 2000; ++i) {
    Value doc = gen.Document(0);
    std::string written = gen.Write(doc);
    // Walk down at random, building the pointer.
    const Value* at = &doc;
    std::string pointer;
    while (at->kind == Value::kArray || at->kind == Value::kObject) {
      if (at->kind == Value::kArray) {
        if (at->elements.empty()) break;
        std::size_t index = gen.Below(at->elements.size());
        pointer += '/';
        pointer += std::to_string(index);
        at = &at->elements[index];
      } else {
        if (at->members.empty()) break;
        const auto& member = at->members[gen.Below(at->members.size())];
        std::string token;
        for (char c : Utf8(member.name)) {
          if (c == '~') {
            token += "~0";
          } else if (c == '/') {
            token += "~1";
          } else {
            token += c;
          }
        }
        pointer += "/" + token;
        at = &member.value;
      }
    }
    Result<std::string> text = JsonPointerText(written, pointer);
    switch (at->kind) {
      case Value::kString:
        ASSERT_TRUE(text.has_value()) << pointer << " " << text.status().ToString();
        EXPECT_EQ(*text, Utf8(at->text));
        ++checked;
        break;
      case Value::kNumber:
        ASSERT_TRUE(text.has_value()) << pointer << " " << text.status().ToString();
        EXPECT_EQ(*text, ReferenceNumber(at->number));
        ++checked;
        break;
      case Value::kTrue:
      case Value::kFalse:
        ASSERT_TRUE(text.has_value());
        EXPECT_EQ(*text, at->kind == Value::kTrue ? "true" : "false");
        break;
      default:
        ASSERT_FALSE(text.has_value()) << pointer;
        EXPECT_EQ(text.error().code(), StatusCode::kInvalidArgument);
    }
  }
  EXPECT_GT(checked, 500);
}

// Damaged documents are rejected with a position inside the input, or, when the damage
// happens to leave valid JSON, canonicalised to a fixpoint. Never anything else.
TEST(JcsPropertyTest, DamagedDocuments) {
  Generator gen(2024);
  constexpr char kBytes[] =
      "{}[],:\"\\/ \n0123456789.eE+-tfnulNaI\x01\x7F\x80\xBF\xC3\xED\xF0\xF4\xFF";
  for (int i = 0; i < 8000; ++i) {
    std::string written = gen.Write(gen.Document(0));
    std::size_t edits = 1 + gen.Below(3);
    for (std::size_t e = 0; e < edits && !written.empty(); ++e) {
      std::size_t at = gen.Below(written.size());
      switch (gen.Below(3)) {
        case 0:
          written[at] = kBytes[gen.Below(sizeof kBytes - 1)];
          break;
        case 1:
          written.erase(at, 1);
          break;
        default:
          written.insert(at, 1, kBytes[gen.Below(sizeof kBytes - 1)]);
      }
    }
    Result<std::string> canonical = CanonicalizeJson(written);
    if (canonical.has_value()) {
      Result<std::string> again = CanonicalizeJson(*canonical);
      ASSERT_TRUE(again.has_value()) << written;
      ASSERT_EQ(*again, *canonical) << written;
    } else {
      ASSERT_EQ(canonical.error().code(), StatusCode::kInvalidArgument);
      const std::string& message = canonical.error().message();
      ASSERT_THAT(message, ::testing::StartsWith("invalid JSON: "));
      std::size_t byte = message.rfind(" at byte ");
      if (byte == std::string::npos) {
        ASSERT_THAT(message, ::testing::HasSubstr("empty input"));
      } else {
        ASSERT_LE(std::stoul(message.substr(byte + 9)), written.size()) << message;
      }
    }
  }
}

TEST(JcsPropertyTest, CompareUtf16MatchesUtf16Order) {
  Generator gen(5);
  for (int i = 0; i < 100000; ++i) {
    CodePoints a = gen.Name();
    CodePoints b = gen.OneIn(3) ? a : gen.Name();
    if (gen.OneIn(2) && !b.empty()) b.back() = gen.CodePoint();
    int got = internal::CompareUtf16(Utf8(a), Utf8(b));
    std::u16string ua = Utf16(a);
    std::u16string ub = Utf16(b);
    int want = ua < ub ? -1 : (ua == ub ? 0 : 1);
    ASSERT_EQ((got > 0) - (got < 0), want) << Utf8(a) << " vs " << Utf8(b);
  }
}

}  // namespace
}  // namespace idem
