#include "core/url_text.h"

namespace idem::core {

std::string RedactUrlPassword(std::string_view url) {
  const auto scheme_end = url.find("://");
  if (scheme_end == std::string_view::npos) return std::string(url);
  const std::size_t start = scheme_end + 3;
  // The user info ends at the last '@' of the authority (which a path or query ends).
  const auto authority_end = url.find_first_of("/?#", start);
  const std::string_view authority = url.substr(start, authority_end - start);
  const auto at = authority.rfind('@');
  if (at == std::string_view::npos) return std::string(url);
  const auto colon = authority.substr(0, at).find(':');
  if (colon == std::string_view::npos) return std::string(url);
  std::string out(url.substr(0, start + colon + 1));
  out += "***";
  out += url.substr(start + at);
  return out;
}

}  // namespace idem::core
