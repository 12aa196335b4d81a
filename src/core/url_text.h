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

// `text` (a message about `url`, e.g. libpq's, which quotes the URL or a part of it) with every
// password `url` holds replaced by "***": `url` itself becomes RedactUrlPassword(url), and any
// other occurrence of a password's text goes too (so a short password may hide more than itself).
std::string RedactUrlPasswordIn(std::string_view text, std::string_view url);

// The offset of `url`'s first control byte (below 0x20, or 0x7f), or npos. The store URL parsers
// refuse one: a NUL would cut the URL short where it is handed on as a C string (to libpq, to
// open()), so that what is used is not what was written; and no URL needs the others.
std::size_t FirstControlByte(std::string_view url);
// "a control byte (0xHH) at offset N; a URL is printable text", for an error message: without
// the URL itself (which the byte would garble, and which may hold a password).
std::string ControlByteMessage(std::string_view url, std::size_t at);

// Appends `value` to a log line between double quotes, escaped so that no value can end its
// field early or forge another one (a request path or an error may hold '"' and '\'): '"' and
// '\' get a backslash, and control bytes (which would cut the line) become \xHH.
void AppendLogQuoted(std::string& line, std::string_view value);

}  // namespace idem::core

#endif  // IDEM_CORE_URL_TEXT_H_
