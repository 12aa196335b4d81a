#include "core/url_text.h"

#include <algorithm>
#include <utility>
#include <vector>

namespace idem::core {

namespace {

// Where `url` holds a password, as [begin, end) offsets: its user info's (between the first ':'
// after "://" and the URL's last '@') and the values of "password=" query parameters. In
// increasing order, not overlapping.
std::vector<std::pair<std::size_t, std::size_t>> PasswordSpans(std::string_view url) {
  std::vector<std::pair<std::size_t, std::size_t>> spans;
  std::size_t user_info_end = 0;
  const auto scheme_end = url.find("://");
  if (scheme_end != std::string_view::npos) {
    const std::size_t start = scheme_end + 3;
    // The user info ends at the URL's last '@', not at the first '/', '?' or '#': a password may
    // hold those (a Redis URL takes "redis://:pa#ss@host" as it is, and one like ":pa/ss@host"
    // is echoed in the error that refuses it). A '@' further on (in a query) makes this hide
    // more than the password, never less.
    const auto at = url.rfind('@');
    if (at != std::string_view::npos && at > start) {
      const auto colon = url.find(':', start);
      if (colon < at) {
        spans.emplace_back(colon + 1, at);
        user_info_end = at;
      }
    }
  }
  // A password as a query parameter (libpq takes "?password=...").
  constexpr std::string_view kParameter = "password=";
  for (std::size_t at = url.find(kParameter, user_info_end); at != std::string_view::npos;
       at = url.find(kParameter, at + 1)) {
    if (at == 0 || (url[at - 1] != '?' && url[at - 1] != '&')) continue;
    const std::size_t value = at + kParameter.size();
    spans.emplace_back(value, std::min(url.find('&', value), url.size()));
  }
  return spans;
}

}  // namespace

std::string RedactUrlPassword(std::string_view url) {
  std::string out;
  std::size_t copied = 0;
  for (const auto& [begin, end] : PasswordSpans(url)) {
    out.append(url.substr(copied, begin - copied));
    out += "***";
    copied = end;
  }
  out.append(url.substr(copied));
  return out;
}

std::string RedactUrlPasswordIn(std::string_view text, std::string_view url) {
  const auto spans = PasswordSpans(url);
  std::string out(text);
  if (spans.empty()) return out;
  const auto replace_all = [&out](std::string_view what, std::string_view with) {
    if (what.empty()) return;
    for (std::size_t at = out.find(what); at != std::string::npos;
         at = out.find(what, at + with.size())) {
      out.replace(at, what.size(), with);
    }
  };
  // Most messages quote the whole URL; then only the password goes.
  replace_all(url, RedactUrlPassword(url));
  // Others quote a part of it (a token, a parameter) that may be the password itself.
  for (const auto& [begin, end] : spans) replace_all(url.substr(begin, end - begin), "***");
  return out;
}

std::size_t FirstControlByte(std::string_view url) {
  for (std::size_t i = 0; i < url.size(); ++i) {
    const auto u = static_cast<unsigned char>(url[i]);
    if (u < 0x20 || u == 0x7f) return i;
  }
  return std::string_view::npos;
}

std::string ControlByteMessage(std::string_view url, std::size_t at) {
  static constexpr char kHex[] = "0123456789abcdef";
  const auto u = static_cast<unsigned char>(url[at]);
  return std::string("a control byte (0x") + kHex[u >> 4] + kHex[u & 0xf] + ") at offset " +
         std::to_string(at) + "; a URL is printable text";
}

void AppendLogQuoted(std::string& line, std::string_view value) {
  static constexpr char kHex[] = "0123456789abcdef";
  line += '"';
  for (const char c : value) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      line += '\\';
      line += c;
    } else if (u < 0x20 || u == 0x7f) {
      line += "\\x";
      line += kHex[u >> 4];
      line += kHex[u & 0xf];
    } else {
      line += c;
    }
  }
  line += '"';
}

}  // namespace idem::core
