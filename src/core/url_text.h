// Store URLs in messages: a URL may carry a password (redis://:PASSWORD@host,
// postgres://user:PASSWORD@host/db), and error messages and logs must not.
#ifndef IDEM_CORE_URL_TEXT_H_
#define IDEM_CORE_URL_TEXT_H_

#include <string>
#include <string_view>

namespace idem::core {

// `url` with the password of its user info, if any, replaced by "***":
// "postgres://app:s3cret@db/x" -> "postgres://app:***@db/x". Anything else is returned as is.
std::string RedactUrlPassword(std::string_view url);

}  // namespace idem::core

#endif  // IDEM_CORE_URL_TEXT_H_
