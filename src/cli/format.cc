#include "cli/format.h"

#include <chrono>
#include <cstdio>

namespace idem::cli {

std::string FormatTime(Timestamp t) {
  using namespace std::chrono;
  const auto day = floor<days>(t);
  const year_month_day ymd(day);
  const hh_mm_ss<milliseconds> hms(t - day);
  char buf[40];
  std::snprintf(buf, sizeof buf, "%04d-%02u-%02uT%02d:%02d:%02d.%03dZ",
                static_cast<int>(ymd.year()), static_cast<unsigned>(ymd.month()),
                static_cast<unsigned>(ymd.day()), static_cast<int>(hms.hours().count()),
                static_cast<int>(hms.minutes().count()), static_cast<int>(hms.seconds().count()),
                static_cast<int>(hms.subseconds().count()));
  return buf;
}

std::string FormatSize(std::uint64_t bytes) {
  if (bytes < 1024) return std::to_string(bytes) + " B";
  static constexpr const char* kUnits[] = {"KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes) / 1024;
  std::size_t u = 0;
  while (v >= 1024 && u + 1 < std::size(kUnits)) {
    v /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f %s", v, kUnits[u]);
  return buf;
}

namespace {

// The length of the valid UTF-8 sequence at bytes[i] (a code point that is not a surrogate),
// and the code point; 0 when the bytes there are not one.
std::size_t Utf8At(std::string_view bytes, std::size_t i, std::uint32_t& cp) {
  const auto c = static_cast<unsigned char>(bytes[i]);
  std::size_t len = 0;
  if (c < 0x80) {
    cp = c;
    return 1;
  }
  if ((c & 0xE0) == 0xC0) {
    len = 2;
    cp = c & 0x1F;
  } else if ((c & 0xF0) == 0xE0) {
    len = 3;
    cp = c & 0x0F;
  } else if ((c & 0xF8) == 0xF0) {
    len = 4;
    cp = c & 0x07;
  } else {
    return 0;
  }
  if (i + len > bytes.size()) return 0;
  for (std::size_t k = 1; k < len; ++k) {
    const auto cc = static_cast<unsigned char>(bytes[i + k]);
    if ((cc & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (cc & 0x3F);
  }
  static constexpr std::uint32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
  if (cp < kMin[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
  return len;
}

}  // namespace

std::string Quote(std::string_view text) {
  bool plain = !text.empty();
  for (char c : text) {
    if (c <= ' ' || c > '~' || c == '"' || c == '\\') plain = false;
  }
  if (plain) return std::string(text);
  std::string out = "\"";
  std::size_t i = 0;
  while (i < text.size()) {
    const char c = text[i];
    std::uint32_t cp = 0;
    const std::size_t len = Utf8At(text, i, cp);
    char buf[12];
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\r') {
      out += "\\r";
    } else if (len == 0) {
      // Not UTF-8: the byte in hex, not raw (a terminal would show it as something else, or
      // take it for part of an escape sequence).
      std::snprintf(buf, sizeof buf, "\\x%02x", static_cast<unsigned char>(c));
      out += buf;
      ++i;
      continue;
    } else if (cp < 0x20 || (cp >= 0x7F && cp < 0xA0)) {  // C0, DEL and C1 controls
      std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(cp));
      out += buf;
    } else {
      out.append(text.substr(i, len));
    }
    i += len;
  }
  out += '"';
  return out;
}

bool IsPrintable(std::string_view bytes) {
  std::size_t i = 0;
  while (i < bytes.size()) {
    std::uint32_t cp = 0;
    const std::size_t len = Utf8At(bytes, i, cp);
    if (len == 0) return false;
    if ((cp < 0x20 && cp != '\t' && cp != '\n' && cp != '\r') || (cp >= 0x7F && cp < 0xA0)) {
      return false;  // C0 (but tab and line ends), DEL and C1 controls
    }
    i += len;
  }
  return true;
}

std::string HexPrefix(std::string_view bytes, std::size_t n) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  for (std::size_t i = 0; i < bytes.size() && i < n; ++i) {
    const auto c = static_cast<unsigned char>(bytes[i]);
    out += kDigits[c >> 4];
    out += kDigits[c & 0xF];
  }
  return out;
}

}  // namespace idem::cli
