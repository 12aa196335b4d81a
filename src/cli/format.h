// How `idem` writes times, sizes and stored bytes for people to read.
#ifndef IDEM_CLI_FORMAT_H_
#define IDEM_CLI_FORMAT_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "idem/clock.h"

namespace idem::cli {

// ISO-8601 UTC with milliseconds: "2023-11-14T22:13:20.000Z".
std::string FormatTime(Timestamp t);

// "512 B", "12.5 KiB", "123.0 MiB".
std::string FormatSize(std::uint64_t bytes);

// `text` as it is when it is non-empty printable ASCII without spaces, quotes or backslashes;
// otherwise in double quotes with JSON escapes (control characters as \u00XX), so an empty scope
// shows as "", and bytes that are not UTF-8 as \xHH.
std::string Quote(std::string_view text);

// Valid UTF-8 without control characters other than tab, newline and carriage return.
bool IsPrintable(std::string_view bytes);

// Lowercase hex of the first `n` bytes.
std::string HexPrefix(std::string_view bytes, std::size_t n);

}  // namespace idem::cli

#endif  // IDEM_CLI_FORMAT_H_
