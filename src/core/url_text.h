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

// Appends `value` to a log line between double quotes, escaped so that no value can end its
// field early or forge another one (a request path or an error may hold '"' and '\'): '"' and
// '\' get a backslash, and control bytes (which would cut the line) become \xHH.
void AppendLogQuoted(std::string& line, std::string_view value);

}  // namespace idem::core

#endif  // IDEM_CORE_URL_TEXT_H_
