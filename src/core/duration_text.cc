#include "core/duration_text.h"

#include <charconv>
#include <cstdint>
#include <optional>
#include <string>

#include "core/machine.h"

namespace idem::core {
namespace {

std::string Quote(std::string_view s) { return "\"" + std::string(s) + "\""; }

// Decimal digits only (no sign, no spaces); nullopt on overflow or anything else.
std::optional<std::uint64_t> Digits(std::string_view s) {
  if (s.empty()) return std::nullopt;
  std::uint64_t v = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size() || s.front() < '0' || s.front() > '9') {
    return std::nullopt;
  }
  return v;
}

Result<std::chrono::milliseconds> AtMostTheLongest(std::string_view text, std::uint64_t ms) {
  if (ms > static_cast<std::uint64_t>(kMaxDuration.count())) {
    return InvalidArgumentError(Quote(text) + " is above the longest duration idem accepts, " +
                                std::string(kMaxDurationText));
  }
  return std::chrono::milliseconds(static_cast<std::chrono::milliseconds::rep>(ms));
}

}  // namespace

Result<std::chrono::milliseconds> ParseDuration(std::string_view text) {
  const auto bad = [&] {
    return InvalidArgumentError(Quote(text) + " is not a duration (" +
                                std::string(kDurationSyntax) + ")");
  };
  if (auto bare = Digits(text)) return AtMostTheLongest(text, *bare);
  if (text.empty()) return bad();
  // Each term is checked against the limit before it is added, so the sum cannot overflow.
  constexpr auto kMax = static_cast<std::uint64_t>(kMaxDuration.count());
  std::uint64_t total = 0;
  std::string_view rest = text;
  while (!rest.empty()) {
    std::size_t digits = 0;
    while (digits < rest.size() && rest[digits] >= '0' && rest[digits] <= '9') ++digits;
    std::size_t unit_end = digits;
    while (unit_end < rest.size() && rest[unit_end] >= 'a' && rest[unit_end] <= 'z') ++unit_end;
    const auto number = Digits(rest.substr(0, digits));
    const std::string_view unit = rest.substr(digits, unit_end - digits);
    if (!number) return bad();
    std::uint64_t scale = 0;
    if (unit == "ms") scale = 1;
    if (unit == "s") scale = 1000;
    if (unit == "m") scale = 60'000;
    if (unit == "h") scale = 3'600'000;
    if (unit == "d") scale = 86'400'000;
    if (scale == 0) return bad();
    if (*number > (kMax - total) / scale) return AtMostTheLongest(text, kMax + 1);
    total += *number * scale;
    rest.remove_prefix(unit_end);
  }
  return AtMostTheLongest(text, total);
}

Result<std::chrono::milliseconds> DurationOfMillis(std::uint64_t ms) {
  return AtMostTheLongest(std::to_string(ms), ms);
}

}  // namespace idem::core
