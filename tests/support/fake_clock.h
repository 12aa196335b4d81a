// FakeClock: time moves only when a test says so. SleepFor advances time instead of sleeping,
// so bounded waits finish at once and deterministically.
#ifndef IDEM_TESTS_SUPPORT_FAKE_CLOCK_H_
#define IDEM_TESTS_SUPPORT_FAKE_CLOCK_H_

#include <atomic>
#include <chrono>
#include <cstdint>

#include "idem/clock.h"

namespace idem::testing {

class FakeClock final : public Clock {
 public:
  // 2023-11-14T22:13:20Z: far from the epoch, so "now - x" never underflows.
  static constexpr Timestamp kStart{std::chrono::milliseconds(1'700'000'000'000)};

  explicit FakeClock(Timestamp start = kStart) : now_ms_(start.time_since_epoch().count()) {}

  Timestamp Now() const override {
    return Timestamp(std::chrono::milliseconds(now_ms_.load(std::memory_order_acquire)));
  }
  // Advances the clock by `d` and yields, so other threads see the new time.
  void SleepFor(std::chrono::milliseconds d) const override;

  void Advance(std::chrono::milliseconds d) {
    now_ms_.fetch_add(d.count(), std::memory_order_acq_rel);
  }
  void Set(Timestamp t) { now_ms_.store(t.time_since_epoch().count(), std::memory_order_release); }

 private:
  mutable std::atomic<std::int64_t> now_ms_;
};

}  // namespace idem::testing

#endif  // IDEM_TESTS_SUPPORT_FAKE_CLOCK_H_
