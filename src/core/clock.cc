#include "idem/clock.h"

#include <thread>

namespace idem {
namespace {

class SystemClock final : public Clock {
 public:
  Timestamp Now() const override {
    return std::chrono::time_point_cast<std::chrono::milliseconds>(
        std::chrono::system_clock::now());
  }
  void SleepFor(std::chrono::milliseconds d) const override { std::this_thread::sleep_for(d); }
};

}  // namespace

Clock& Clock::System() {
  static SystemClock clock;
  return clock;
}

}  // namespace idem
