#include "tests/support/fake_clock.h"

#include <thread>

namespace idem::testing {

void FakeClock::SleepFor(std::chrono::milliseconds d) const {
  now_ms_.fetch_add(d.count(), std::memory_order_acq_rel);
  std::this_thread::yield();
}

}  // namespace idem::testing
