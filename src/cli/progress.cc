#include "cli/progress.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <utility>

#include "cli/format.h"

namespace idem::cli {

ProgressLine::ProgressLine(std::string label)
    : label_(std::move(label)), enabled_(::isatty(STDERR_FILENO) == 1) {}

ProgressLine::~ProgressLine() { Clear(); }

Progress ProgressLine::callback() {
  if (!enabled_) return {};
  return [this](std::uint64_t done, std::uint64_t total) { Update(done, total); };
}

void ProgressLine::Update(std::uint64_t done, std::uint64_t total) {
  // Progress is the CLI's own display, so it reads the real clock.
  const auto now = std::chrono::steady_clock::now();
  const bool finished = total > 0 && done >= total;
  if (drawn_ && !finished && now - last_draw_ < std::chrono::milliseconds(100)) return;
  last_draw_ = now;
  const unsigned percent = total == 0
                               ? 100u
                               : static_cast<unsigned>(static_cast<double>(std::min(done, total)) *
                                                       100.0 / static_cast<double>(total));
  // "\r\033[K": back to the start of the line and erase it, then draw.
  std::fprintf(stderr, "\r\033[K%s: %u%% (%s of %s)", label_.c_str(), percent,
               FormatSize(done).c_str(), FormatSize(total).c_str());
  std::fflush(stderr);
  drawn_ = true;
}

void ProgressLine::Clear() {
  if (!drawn_) return;
  std::fputs("\r\033[K", stderr);
  std::fflush(stderr);
  drawn_ = false;
}

}  // namespace idem::cli
