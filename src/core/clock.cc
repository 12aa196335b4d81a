#include "idem/clock.h"

#include <time.h>

#include <thread>

namespace idem {
namespace {

class SystemClock final : public Clock {
 public:
  // CLOCK_REALTIME_COARSE: the kernel's last tick (a few ms of resolution), read without the
  // serialising TSC read that CLOCK_REALTIME needs. Leases and retention are seconds, so a tick
  // of error does not matter, and a store's hot path keeps its cache misses overlapping.
  Timestamp Now() const override {
    timespec ts;
    clock_gettime(CLOCK_REALTIME_COARSE, &ts);
    return Timestamp(std::chrono::milliseconds(static_cast<std::int64_t>(ts.tv_sec) * 1000 +
                                               ts.tv_nsec / 1'000'000));
  }
  void SleepFor(std::chrono::milliseconds d) const override { std::this_thread::sleep_for(d); }
};

}  // namespace

Clock& Clock::System() {
  static SystemClock clock;
  return clock;
}

}  // namespace idem
