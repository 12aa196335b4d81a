#include "tests/support/consumer_helpers.h"

namespace idem::testing {

std::string HeaderOf(const std::vector<std::pair<std::string, std::string>>& headers,
                     std::string_view name) {
  for (const auto& [n, v] : headers) {
    if (n == name) return v;
  }
  return "<missing>";
}

bool RunUntil(Consumer& consumer, std::chrono::milliseconds timeout,
              const std::function<bool()>& done) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!done()) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    (void)consumer.RunOnce();
  }
  return true;
}

}  // namespace idem::testing
