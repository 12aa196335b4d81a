#include "core/url_text.h"

#include <algorithm>

namespace idem::core {

std::string RedactUrlPassword(std::string_view url) {
  std::string out(url);
  const auto scheme_end = out.find("://");
  if (scheme_end != std::string::npos) {
    const std::size_t start = scheme_end + 3;
    // The user info ends at the URL's last '@', not at the first '/', '?' or '#': a password may
    // hold those (a Redis URL takes "redis://:pa#ss@host" as it is, and one like ":pa/ss@host"
    // is echoed in the error that refuses it). A '@' further on (in a query) makes this hide
    // more than the password, never less.
    const auto at = out.rfind('@');
    if (at != std::string::npos && at > start) {
      const auto colon = out.find(':', start);
      if (colon < at) out.replace(colon + 1, at - colon - 1, "***");
    }
  }
  // A password as a query parameter (libpq takes "?password=...").
  constexpr std::string_view kParameter = "password=";
  for (std::size_t at = out.find(kParameter); at != std::string::npos;
       at = out.find(kParameter, at + 1)) {
    if (at == 0 || (out[at - 1] != '?' && out[at - 1] != '&')) continue;
    const std::size_t value = at + kParameter.size();
    const std::size_t end = std::min(out.find('&', value), out.size());
    out.replace(value, end - value, "***");
  }
  return out;
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
