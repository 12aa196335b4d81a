// Durations as people write them, in idemd's config and flags, the CLI's and the store URLs'
// options: one syntax and one limit everywhere.
#ifndef IDEM_CORE_DURATION_TEXT_H_
#define IDEM_CORE_DURATION_TEXT_H_

#include <chrono>
#include <string_view>

#include "idem/status.h"

namespace idem::core {

inline constexpr std::string_view kDurationSyntax =
    "write e.g. 250ms, 30s, 5m, 1h, 1h30m or 1d; a bare integer is milliseconds";

// "250ms", "30s", "5m", "1h", "1d", sums such as "1h30m", or a bare integer of milliseconds;
// 0 included. At most kMaxDuration (10 years): the longest lease or retention the stores keep,
// and far below where a deadline of now + d overflows the clocks' nanoseconds (292 years),
// which would end a timeout at once instead of never. kInvalidArgument quoting `text` else.
Result<std::chrono::milliseconds> ParseDuration(std::string_view text);

// Ms of a duration given as a bare integer elsewhere (a TOML integer), under the same limit.
Result<std::chrono::milliseconds> DurationOfMillis(std::uint64_t ms);

}  // namespace idem::core

#endif  // IDEM_CORE_DURATION_TEXT_H_
