// The value syntax of idemd's TOML files, shared by the gateway's configuration (config.cc,
// their home) and `idemd consume`'s (src/consume/config.cc): durations, sizes, status ranges,
// store URLs, and errors that name the file, line and option.
#ifndef IDEM_GATEWAY_CONFIG_VALUES_H_
#define IDEM_GATEWAY_CONFIG_VALUES_H_

#include <toml++/toml.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/duration_text.h"
#include "gateway/config.h"
#include "idem/status.h"

namespace idem::gateway::config_detail {

std::string Quote(std::string_view s);  // "\"s\""
using core::ParseDuration;              // "250ms", "30s", "5m", "1h", "1d" or sums ("1h30m")
std::string FormatDuration(std::chrono::milliseconds d);
Result<std::uint64_t> ParseSize(std::string_view text);  // 4096, "16KiB", "1MiB"
// nullopt when fine, else what is wrong with it.
std::optional<std::string> CheckHeaderName(std::string_view name);
std::optional<std::string> CheckStoreUrl(std::string_view url);

std::string_view TypeName(const toml::node& n);  // "a string", "an integer", ...
Status WrongType(const toml::node& n, std::string_view expected);
Result<std::uint64_t> NonNegative(const toml::node& n);                   // an integer node, >= 0
Result<std::chrono::milliseconds> DurationFromNode(const toml::node& n);  // string or ms
Result<std::vector<std::string>> StringsFromNode(const toml::node& n);
Result<StatusRange> ParseStatusRange(const toml::node& n);  // "4xx", "400-404", 422

std::string At(std::string_view file, const toml::source_region& where);  // "FILE:LINE"
// kInvalidArgument "WHERE: OPTION: WHAT".
Status ErrorAt(std::string_view where, std::string_view option, std::string_view what);
// A table's entries in file order, so the first error reported is the first in the file.
std::vector<std::pair<const toml::key*, const toml::node*>> InFileOrder(const toml::table& t);
// The whole file, or kInvalidArgument "PATH: cannot open: ...".
Result<std::string> ReadFile(const std::string& path);
// The parsed document, or kInvalidArgument "FILE:LINE:COLUMN: TOML syntax error: ...".
Result<toml::table> ParseToml(std::string_view text, std::string_view file);

}  // namespace idem::gateway::config_detail

#endif  // IDEM_GATEWAY_CONFIG_VALUES_H_
