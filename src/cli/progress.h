// A one-line progress display on stderr for long verify/repair runs.
#ifndef IDEM_CLI_PROGRESS_H_
#define IDEM_CLI_PROGRESS_H_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

#include "idem/stores/log.h"

namespace idem::cli {

// Draws "verifying: 45% (123.0 MiB of 270.0 MiB)" on a single line of stderr, redrawn at most
// about ten times a second, and erases it when done. Does nothing when stderr is not a
// terminal, so pipes and logs get no progress noise. Not thread-safe; must outlive the
// Progress it hands out.
class ProgressLine {
 public:
  explicit ProgressLine(std::string label);
  ~ProgressLine();
  ProgressLine(const ProgressLine&) = delete;
  ProgressLine& operator=(const ProgressLine&) = delete;

  // A callback for VerifyLogStore/RepairLogStore; empty when stderr is not a terminal.
  Progress callback();
  // Erases the line, so what follows starts on a clean line.
  void Clear();

 private:
  void Update(std::uint64_t done, std::uint64_t total);

  const std::string label_;
  const bool enabled_;
  bool drawn_ = false;
  std::chrono::steady_clock::time_point last_draw_{};
};

}  // namespace idem::cli

#endif  // IDEM_CLI_PROGRESS_H_
